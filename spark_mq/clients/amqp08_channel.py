"""The ``Channel`` of the blocking AMQP 0-8 client (``spark_mq.clients.amqp08``), and the ``Message`` it
hands out: one channel's requests and replies, consumers, deliveries queued for the application,
returns, transactions and flow. The connection (reader thread, state machine, flow control towards
the application) is ``spark_mq.clients.amqp08.Connection``; a channel reaches it through its lock
and condition, which guard both.
"""

from __future__ import annotations

import time
from collections import deque
from operator import itemgetter
from typing import Callable, Iterable, Iterator, Optional

from spark_mq.errors import ConnectionClosedError, LocalProtocolError, SparkMqError
from spark_mq.protocol.amqp08 import spec, spec091
from spark_mq.protocol.amqp08.codec import Method
from spark_mq.protocol.amqp08.errors import AMQPChannelError
from spark_mq.protocol.amqp08.events import ContentReceived
from spark_mq.protocol.amqp08.frames import method_frame
from spark_mq.protocol.amqp08.spec import BasicProperties

_DELIVER, _RETURN = spec.BasicDeliver.INDEX, spec.BasicReturn.INDEX  # the same in 0-8 and 0-9-1
_ACK, _NACK = spec.BasicAck.INDEX, spec091.BasicNack.INDEX  # basic.nack: 0-9-1 only

DEFAULT_TIMEOUT = 30.0
_monotonic = time.monotonic


class TimeoutError(SparkMqError, TimeoutError):  # noqa: A001 - also a builtin TimeoutError
    """A reply did not arrive in time."""


class Message(tuple):
    """A delivered, fetched or returned message: ``body``, ``properties`` and the method's fields
    (``delivery_tag``, ``redelivered``, ``exchange``, ``routing_key``, ``consumer_tag``; for get-ok
    ``message_count``; for returns ``reply_code`` and ``reply_text``), and ``channel``.

    A tuple of (decoded event, channel) underneath, reading fields on access: one is made per
    message, so it copies nothing and runs no ``__init__``.
    """

    __slots__ = ()

    def __new__(cls, event: ContentReceived, channel: "Channel"):
        return tuple.__new__(cls, (event, channel))

    channel = property(itemgetter(1), doc="the Channel it arrived on")
    body = property(lambda self: self[0][3], doc="the message body (bytes)")
    properties = property(lambda self: self[0][2], doc="BasicProperties")
    method = property(lambda self: self[0][1], doc="the deliver/get-ok/return method")
    delivery_tag = property(lambda self: getattr(self[0][1], "delivery_tag", None))
    redelivered = property(lambda self: getattr(self[0][1], "redelivered", False))
    exchange = property(lambda self: self[0][1].exchange)
    routing_key = property(lambda self: self[0][1].routing_key)
    consumer_tag = property(lambda self: getattr(self[0][1], "consumer_tag", None))
    message_count = property(lambda self: getattr(self[0][1], "message_count", None))
    reply_code = property(lambda self: getattr(self[0][1], "reply_code", None))
    reply_text = property(lambda self: getattr(self[0][1], "reply_text", None))

    def ack(self, multiple: bool = False) -> None:
        self[1].basic_ack(self[0][1].delivery_tag, multiple)

    def __repr__(self) -> str:
        return (f"<Message tag={self.delivery_tag} exchange={self.exchange!r} routing_key={self.routing_key!r} "
                f"{len(self.body)} bytes {self.properties!r}>")


_new_message = tuple.__new__


class NackedError(SparkMqError):
    """The broker nacked published messages (confirm mode): it did not take responsibility for them."""

    def __init__(self, channel: int, tags: list) -> None:
        self.channel = channel
        self.tags = tags
        shown = ", ".join(map(str, tags[:10])) + (" ..." if len(tags) > 10 else "")
        super().__init__(f"the broker nacked {len(tags)} message(s) published on channel {channel} "
                         f"(confirm sequence numbers {shown})")


class Channel:
    """One AMQP channel. Methods block until the broker's reply (with a timeout)."""

    def __init__(self, connection, number: int) -> None:
        """``connection``: the ``spark_mq.clients.amqp08.Connection`` that opened it (not imported
        here: that module imports this one)."""
        self.connection = connection
        self.number = number
        self._opened = False
        self._error: Optional[BaseException] = None
        self._replies: deque = deque()
        self._deliveries: deque = deque()
        self._returns: deque = deque()
        self.flow_active = True
        self.on_return: Optional[Callable[[Message], None]] = None
        self._consumers: set[str] = set()
        self._callbacks: dict[str, Callable[[Message], None]] = {}
        self._pending_callback: Optional[Callable[[Message], None]] = None
        self.ticket = 0
        # publisher confirms (0-9-1's confirm.select): the sequence number of the last message published,
        # every number up to ``_confirmed`` answered by the broker, and the numbers it nacked
        self.confirming = False
        self._published = 0
        self._confirmed = 0
        self._answered: set[int] = set()  # answered out of order (beyond _confirmed)
        self._nacked: list[int] = []

    def __repr__(self) -> str:
        return f"<amqp08.Channel {self.number} {'open' if self.is_open else 'closed'}>"

    def __enter__(self) -> "Channel":
        return self

    def __exit__(self, *exc) -> None:
        if self.is_open:
            self.close()

    @property
    def is_open(self) -> bool:
        return self._error is None and self.connection._error is None and not self.connection._closed

    # called by the connection with its lock held; True when it queued a delivery to be taken
    def _on_content(self, ev: ContentReceived) -> bool:
        method = ev[1]
        kind = type(method)
        if kind.INDEX == _DELIVER:
            callback = self._callbacks.get(method.consumer_tag) if self._callbacks else None
            if callback is None:
                self._deliveries.append(Message(ev, self))
                return True
            callback(Message(ev, self))
        elif kind.INDEX == _RETURN:
            msg = Message(ev, self)
            if self.on_return is not None:
                self.on_return(msg)
            else:
                self._returns.append(msg)
        else:  # get-ok and other content replies
            self._replies.append(Message(ev, self))
        return False

    def _closed_by(self, error: Optional[BaseException]) -> None:
        if error is None and self._error is not None:
            return  # our own close (after a timeout, see _abandon) keeps the reason it gave
        self._error = error or ConnectionClosedError(f"channel {self.number} is closed")

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        self.connection._check()

    # -- generic request/response -------------------------------------------------------------

    def call(self, method: Method, timeout: float = DEFAULT_TIMEOUT, *, barrier: bool = False):
        """Send any client method; wait for and return its reply (None for asynchronous methods).

        Also the way to reach the 0-8 classes RabbitMQ does not implement (file, stream, dtx,
        tunnel, test): the broker answers with a close, raised here as its exception. With
        ``barrier=True`` an asynchronous method is followed by a harmless synchronous round trip
        (channel.flow active=true), so a broker's rejection is raised here rather than later.
        """
        conn = self.connection
        with conn._cv:
            self._check()
            conn._proto.send_method(self.number, method)
            conn._flush()
            if not method.RESPONSES or getattr(method, "nowait", False):
                if barrier:
                    self.call(self.connection.methods.ChannelFlow(active=True), timeout)
                return None
            return self._await_reply(method.RESPONSES, timeout, method.NAME)

    def _await_reply(self, responses: tuple, timeout: float, name: str):
        conn = self.connection
        deadline = _monotonic() + timeout
        while not self._replies:
            self._check()
            try:
                conn._wait(deadline, f"reply to {name} on channel {self.number}")
            except TimeoutError:
                self._abandon(name, timeout)
                raise
            if self._error is not None:
                raise self._error
        reply = self._replies.popleft()
        rtype = self.connection.methods.BasicGetOk if isinstance(reply, Message) else type(reply)
        if rtype not in responses:  # the state machine checked the order; this guards the facade
            raise LocalProtocolError(f"reply {rtype.NAME} does not answer {name}")
        return reply

    def _abandon(self, name: str, timeout: float) -> None:
        """A request went unanswered within its timeout. The broker answers a channel's requests in
        order, so its late reply would be taken as the answer to the next call here (a stale
        tx.commit-ok answering a later commit): the channel is closed instead, and every later call
        on it fails naming why. The connection and its other channels go on."""
        self._error = ConnectionClosedError(
            f"channel {self.number} was closed: no reply to {name} within {timeout:g} s, and a late reply "
            f"would have answered a later call (open a new channel)")
        try:
            self.connection._proto.close_channel(self.number)
            self.connection._flush()
        except Exception:  # noqa: BLE001 - the channel is unusable either way; the connection reports its own errors
            pass

    def call_content(self, method: Method, properties, body, timeout: float = DEFAULT_TIMEOUT, *,
                     barrier: bool = False):
        """Send a content-bearing method (e.g. test.content) and wait for its reply, if any."""
        conn = self.connection
        with conn._cv:
            self._check()
            conn._proto.send_content(self.number, method, properties, body)
            conn._flush()
            if not method.RESPONSES:
                if barrier:
                    self.call(self.connection.methods.ChannelFlow(active=True), timeout)
                return None
            return self._await_reply(method.RESPONSES, timeout, method.NAME)

    # -- access, exchange, queue --------------------------------------------------------------

    def access_request(self, realm: str = "/data", *, exclusive: bool = False, passive: bool = True,
                       active: bool = True, write: bool = True, read: bool = True) -> int:
        ok = self.call(self.connection.methods.AccessRequest(realm=realm, exclusive=exclusive, passive=passive, active=active,
                                          write=write, read=read))
        self.ticket = ok.ticket
        return ok.ticket

    def exchange_declare(self, exchange: str, type: str = "direct", *, passive: bool = False,  # noqa: A002
                         durable: bool = False, auto_delete: bool = False, internal: bool = False,
                         nowait: bool = False, arguments: Optional[dict] = None) -> None:
        self.call(self.connection.methods.ExchangeDeclare(ticket=self.ticket, exchange=exchange, type=type, passive=passive,
                                       durable=durable, auto_delete=auto_delete, internal=internal,
                                       nowait=nowait, arguments=arguments))

    def exchange_delete(self, exchange: str, *, if_unused: bool = False, nowait: bool = False) -> None:
        self.call(self.connection.methods.ExchangeDelete(ticket=self.ticket, exchange=exchange, if_unused=if_unused, nowait=nowait))

    def queue_declare(self, queue: str = "", *, passive: bool = False, durable: bool = False,
                      exclusive: bool = False, auto_delete: bool = False, nowait: bool = False,
                      arguments: Optional[dict] = None) -> Optional[spec.QueueDeclareOk]:
        """Declare a queue; returns declare-ok with ``queue``, ``message_count``, ``consumer_count``."""
        return self.call(self.connection.methods.QueueDeclare(ticket=self.ticket, queue=queue, passive=passive, durable=durable,
                                           exclusive=exclusive, auto_delete=auto_delete, nowait=nowait,
                                           arguments=arguments))

    def queue_bind(self, queue: str, exchange: str, routing_key: str = "", *, nowait: bool = False,
                   arguments: Optional[dict] = None) -> None:
        self.call(self.connection.methods.QueueBind(ticket=self.ticket, queue=queue, exchange=exchange, routing_key=routing_key,
                                 nowait=nowait, arguments=arguments))

    def queue_unbind(self, queue: str, exchange: str, routing_key: str = "", *,
                     arguments: Optional[dict] = None) -> None:
        """Remove a binding (0-9-1's queue.unbind; in 0-8 a RabbitMQ extension, the spec has none)."""
        unbind = getattr(self.connection.methods, "QueueUnbind", None)
        if unbind is None:
            raise LocalProtocolError("queue.unbind is a RabbitMQ extension, not part of AMQP 0-8")
        self.call(unbind(ticket=self.ticket, queue=queue, exchange=exchange,
                                         routing_key=routing_key, arguments=arguments))

    def queue_purge(self, queue: str, *, nowait: bool = False) -> Optional[int]:
        ok = self.call(self.connection.methods.QueuePurge(ticket=self.ticket, queue=queue, nowait=nowait))
        return ok.message_count if ok is not None else None

    def queue_delete(self, queue: str, *, if_unused: bool = False, if_empty: bool = False,
                     nowait: bool = False) -> Optional[int]:
        ok = self.call(self.connection.methods.QueueDelete(ticket=self.ticket, queue=queue, if_unused=if_unused,
                                        if_empty=if_empty, nowait=nowait))
        return ok.message_count if ok is not None else None

    # -- basic --------------------------------------------------------------------------------

    def basic_qos(self, prefetch_count: int = 0, prefetch_size: int = 0, global_: bool = False) -> None:
        self.call(self.connection.methods.BasicQos(prefetch_size=prefetch_size, prefetch_count=prefetch_count, global_=global_))

    def basic_consume(self, queue: str, consumer_tag: str = "", *, no_ack: bool = False, no_local: bool = False,
                      exclusive: bool = False, arguments: Optional[dict] = None,
                      on_message: Optional[Callable[[Message], None]] = None) -> str:
        """Start a consumer and return its tag.

        Deliveries are read with ``next_message``/``consume``/``drain``, or, with ``on_message``, handed
        to that callback on the connection's reader thread as they are decoded (no thread hand-off:
        the fastest path). The callback must return quickly and must not wait for broker replies
        (``basic_ack`` is fine: it has none); an exception it raises ends the connection.
        """
        consume = self.connection.methods.BasicConsume
        if "arguments" not in consume.FIELDS:
            if arguments:
                raise LocalProtocolError("RabbitMQ's AMQP 0-8 basic.consume has no arguments table")
            method = consume(ticket=self.ticket, queue=queue, consumer_tag=consumer_tag,
                             no_local=no_local, no_ack=no_ack, exclusive=exclusive)
        else:
            method = consume(ticket=self.ticket, queue=queue, consumer_tag=consumer_tag,
                             no_local=no_local, no_ack=no_ack, exclusive=exclusive, arguments=arguments)
        conn = self.connection
        with conn._cv:
            # The broker sends consume-ok before the consumer's first delivery; the reader thread
            # registers the callback when it decodes consume-ok, so no delivery slips past it.
            self._pending_callback = on_message
            try:
                ok = self.call(method)
            finally:
                self._pending_callback = None
            self._consumers.add(ok.consumer_tag)
        return ok.consumer_tag

    def basic_cancel(self, consumer_tag: str) -> None:
        self.call(self.connection.methods.BasicCancel(consumer_tag=consumer_tag))
        self._consumers.discard(consumer_tag)
        self._callbacks.pop(consumer_tag, None)

    def basic_publish(self, exchange: str, routing_key: str, body, properties: Optional[BasicProperties] = None,
                      *, mandatory: bool = False, immediate: bool = False, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Publish one message (no round trip). Waits while the broker has paused us with channel.flow."""
        conn = self.connection
        with conn._cv:
            self._wait_flow(timeout)
            conn._proto.send_content(self.number, conn.methods.BasicPublish(
                ticket=self.ticket, exchange=exchange, routing_key=routing_key, mandatory=mandatory,
                immediate=immediate), properties, body)
            if self.confirming:
                self._published += 1
            conn._flush()

    def publish_many(self, messages: Iterable, *, batch_bytes: int = 1 << 20,
                     timeout: float = DEFAULT_TIMEOUT) -> int:
        """Pipeline ``(exchange, routing_key, body, properties)`` tuples: frames for many messages are
        written in one socket call per ``batch_bytes``. Returns the number published."""
        conn = self.connection
        proto = conn._proto
        send_content = proto.send_content
        publish = conn.methods.BasicPublish
        number = self.number
        ticket = self.ticket
        count = 0
        pending = 0
        key = method = encoded = None  # the last exchange and routing key, their method and its frame
        with conn._cv:
            self._wait_flow(timeout)
            for exchange, routing_key, body, properties in messages:
                if key is None or key[0] != exchange or key[1] != routing_key:
                    key = (exchange, routing_key)
                    method = publish(ticket, exchange, routing_key)
                    encoded = method_frame(number, method.encode())
                send_content(number, method, properties, body, encoded)
                count += 1
                if self.confirming:
                    self._published += 1
                pending += len(body) + 64
                if pending >= batch_bytes:
                    conn._flush()
                    pending = 0
                    if not self.flow_active:
                        self._wait_flow(timeout)
            conn._flush()
        return count

    def _wait_flow(self, timeout: float) -> None:
        self._check()
        if self.flow_active:
            return
        deadline = _monotonic() + timeout
        while not self.flow_active:
            self.connection._wait(deadline, f"channel.flow active=true on channel {self.number}")
            self._check()

    def basic_get(self, queue: str, *, no_ack: bool = False, timeout: float = DEFAULT_TIMEOUT) -> Optional[Message]:
        """Fetch one message, or None when the queue is empty."""
        reply = self.call(self.connection.methods.BasicGet(ticket=self.ticket, queue=queue, no_ack=no_ack), timeout)
        return reply if isinstance(reply, Message) else None

    def basic_ack(self, delivery_tag: int, multiple: bool = False) -> None:
        self.call(self.connection.methods.BasicAck(delivery_tag=delivery_tag, multiple=multiple))

    def basic_reject(self, delivery_tag: int, requeue: bool = True) -> None:
        self.call(self.connection.methods.BasicReject(delivery_tag=delivery_tag, requeue=requeue))

    def basic_recover(self, requeue: bool = True, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Redeliver unacknowledged messages (requeue=True: possibly to other consumers) and wait
        for recover-ok (RabbitMQ's synchronous 110/111 in its dialect, the spec's 100/101 otherwise)."""
        self.call(self.connection.methods.BasicRecover(requeue=requeue), timeout)

    @property
    def pending_messages(self) -> int:
        """Deliveries received on this channel and not yet taken."""
        return len(self._deliveries)

    def next_message(self, timeout: Optional[float] = DEFAULT_TIMEOUT) -> Optional[Message]:
        """The next delivery from any consumer on this channel, or None after ``timeout`` seconds."""
        deliveries = self._deliveries
        conn = self.connection
        if deliveries:
            try:
                msg = deliveries.popleft()
            except IndexError:  # another thread took it
                pass
            else:
                conn._took(1, len(msg[0][3]))
                return msg
        with conn._cv:
            deadline = _monotonic() + (timeout or 0)
            while not deliveries:
                self._check()
                left = deadline - _monotonic()
                if left <= 0:
                    return None
                conn._cv.wait(left)
            msg = deliveries.popleft()
        conn._took(1, len(msg[0][3]))
        return msg

    def drain(self, max_messages: int = 1 << 30) -> list[Message]:
        """Every delivery already received (up to ``max_messages``), without waiting."""
        out = []
        deliveries = self._deliveries
        pop = deliveries.popleft
        nbytes = 0
        try:
            while deliveries and len(out) < max_messages:
                msg = pop()
                out.append(msg)
                nbytes += len(msg[0][3])
        except IndexError:  # another thread took the last
            pass
        if out:
            self.connection._took(len(out), nbytes)
        return out

    def consume(self, timeout: Optional[float] = None) -> Iterator[Message]:
        """Yield deliveries until ``timeout`` seconds pass without one (forever when None)."""
        while True:
            msg = self.next_message(timeout if timeout is not None else 3600.0)
            if msg is None:
                if timeout is not None:
                    return
                continue
            yield msg

    def next_return(self, timeout: float = DEFAULT_TIMEOUT) -> Optional[Message]:
        """The next message the broker returned (mandatory/immediate), or None after ``timeout``."""
        conn = self.connection
        with conn._cv:
            deadline = _monotonic() + timeout
            while not self._returns:
                self._check()
                left = deadline - _monotonic()
                if left <= 0:
                    return None
                conn._wait_reply(left)  # a return may be queued behind unread deliveries
            return self._returns.popleft()

    # -- tx, flow, close ----------------------------------------------------------------------

    def tx_select(self) -> None:
        self.call(self.connection.methods.TxSelect())

    # -- publisher confirms (0-9-1) ---------------------------------------------------------------

    def confirm_select(self) -> None:
        """Put the channel in confirm mode (AMQP 0-9-1, RabbitMQ's extension): the broker then answers every
        message published on it with basic.ack (it has taken responsibility for it: persistent messages
        to durable queues are on disk) or basic.nack. ``wait_for_confirms`` waits for the answers."""
        methods = self.connection.methods
        if not hasattr(methods, "ConfirmSelect"):
            raise LocalProtocolError(f"publisher confirms need AMQP 0-9-1; this connection speaks "
                                     f"{self.connection.protocol} (option protocol)")
        self.call(methods.ConfirmSelect(nowait=False))
        with self.connection._cv:
            self.confirming = True
            self._published = self._confirmed = 0
            self._answered.clear()
            self._nacked.clear()

    @property
    def unconfirmed(self) -> int:
        """Messages published in confirm mode the broker has not answered yet."""
        return self._published - self._confirmed - len(self._answered)

    def wait_for_confirms(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        """Wait until the broker has answered every message published so far; raise ``NackedError`` when
        it nacked any since the last call (then forgotten), ``TimeoutError`` after ``timeout``."""
        conn = self.connection
        deadline = _monotonic() + timeout
        with conn._cv:
            if not self.confirming:
                raise LocalProtocolError(f"channel {self.number} is not in confirm mode: call confirm_select()")
            while self._confirmed < self._published:
                self._check()
                conn._wait(deadline, f"publisher confirms of {self.unconfirmed} message(s) on channel {self.number}")
            if self._nacked:
                nacked, self._nacked = sorted(self._nacked), []
                raise NackedError(self.number, nacked)

    def _on_confirm(self, method) -> None:
        """basic.ack or basic.nack from the broker, in confirm mode (the connection's lock held)."""
        tag = method.delivery_tag
        done = range(self._confirmed + 1, tag + 1) if method.multiple else (tag,)
        if method.INDEX == _NACK:
            self._nacked.extend(t for t in done if t > self._confirmed and t not in self._answered)
        if method.multiple:
            self._confirmed = max(self._confirmed, tag)
            self._answered = {t for t in self._answered if t > tag}
        elif tag == self._confirmed + 1:
            self._confirmed = tag
        else:
            self._answered.add(tag)
        while self._confirmed + 1 in self._answered:
            self._confirmed += 1
            self._answered.discard(self._confirmed)

    def tx_commit(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.call(self.connection.methods.TxCommit(), timeout)

    def tx_rollback(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.call(self.connection.methods.TxRollback(), timeout)

    def flow(self, active: bool) -> bool:
        """Ask the broker to pause (False) or resume (True) deliveries; returns the broker's answer."""
        return self.call(self.connection.methods.ChannelFlow(active=active)).active

    def close(self, timeout: float = DEFAULT_TIMEOUT) -> None:
        conn = self.connection
        with conn._cv:
            if self._error is not None or conn._closed:
                return
            conn._proto.close_channel(self.number)
            conn._flush()
            deadline = _monotonic() + timeout
            while self._error is None:
                conn._wait(deadline, f"channel.close-ok on channel {self.number}")
            if isinstance(self._error, AMQPChannelError):
                raise self._error

