"""The ``amqp08`` source: AMQP 0-8 consumption (basic.consume with qos) for the shared ingest loop.

Responsible for: the AMQP-specific parts only: declaring (none/passive/create, with queue
arguments and an optional exchange binding), consuming with ``prefetch`` (no-ack in ``auto``
mode), turning a delivery into a row (envelope and every basic property), cumulative acks
(``basic.ack multiple``; in ``commit`` mode inside ``tx.select``/``tx.commit``), dead-lettering a
poison message (``basic.reject`` without requeue), and the queue depth (passive declare on a second
channel).

Several queues (``queue`` a comma-separated list) share the one connection and the one consuming
channel: one ``basic.consume`` per queue, each declared as ``declare`` says. ``basic.qos`` is the
channel's, so ``prefetch`` applies to each consumer (RabbitMQ: a per-consumer limit for consumers
made after it). Delivery tags count per channel, across its consumers, so the cumulative ack of the
last tag of a group acknowledges the group whatever queues it came from. A row's ``destination``
is the queue of its consumer tag; the depth is the sum of the queues' depths. While the ingest pauses, the client's own bound (``clientBufferMessages``/``clientBufferBytes``)
holds the broker back in every mode: it stops reading its socket, so a no-ack consumer, which no
prefetch bounds, needs no cancel.

    spark.readStream.format("amqp08").option("uri", "amqp://guest:guest@host:5672/%2F")
        .option("queue", "orders").option("logLocation", "/shared/ckpt/orders-log").load()

Identity for de-duplication: the ``message_id`` property when the publisher sets one (checked for
every message), else a hash of body and headers (checked only for redelivered messages).
"""

from __future__ import annotations

from typing import Optional

from spark_mq.clients.connect import connect_amqp08
from spark_mq.errors import OptionError, PoisonDelivery, SparkMqError
from spark_mq.options import Options
from spark_mq.protocol.amqp08.connection import UndecodableProperties
from spark_mq.sources.base import gather
from spark_mq.sources.consumer import Consumer
from spark_mq.sources.formats.sourcelist import name_list
from spark_mq.sources.ingest import prefetch_of

__all__ = ["Amqp08Consumer", "connect_consumer", "validate"]


#: basic.qos prefetch-count is an AMQP short
_MAX_PREFETCH = 0xFFFF


def queues(opts: Options) -> tuple:
    """The queues of option ``queue`` (a comma-separated list), in the order given."""
    return name_list(opts, "queue", "queue")


def validate(opts: Options) -> None:
    if not queues(opts):
        raise OptionError("the amqp08 source needs option 'queue'")
    if (opts.get("prefetch") or 0) > _MAX_PREFETCH:
        raise OptionError(f"option 'prefetch' is {opts.prefetch}: AMQP 0-8's basic.qos takes at most "
                          f"{_MAX_PREFETCH} unacknowledged messages per consumer")
    if opts.get("routingKey") and not opts.get("exchange"):
        raise OptionError("option 'routingKey' needs option 'exchange' (the binding's exchange) on the amqp08 source")
    if opts.get("poisonMessages") == "deadletter" and opts.get("ackMode") == "auto":
        raise OptionError("option 'poisonMessages' is deadLetter, which rejects the message to the queue's "
                          "dead-letter exchange: that needs ackMode durable or commit (with auto the broker has "
                          "forgotten the message on delivery)")
    if (opts.get("exchange") or opts.get("queueArguments") or opts.get("exchangeType")) and opts.declare != "create":
        raise OptionError("options 'exchange', 'exchangeType' and 'queueArguments' take effect only with "
                          "declare=create on the amqp08 source")


def _text(value) -> str:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        return value
    return str(value)


class Amqp08Consumer(Consumer):
    dead_letters = True
    stops_deliveries = True

    def __init__(self, opts: Options, attempt: int = 0) -> None:
        self.opts = opts
        self.queues = queues(opts)
        self.queue = self.queues[0]
        #: consumer tag -> its queue, where there are several (a row's destination)
        self.queue_of: Optional[dict] = None
        self.auto = opts.get("ackMode") == "auto"
        self.commit_mode = opts.get("ackMode") == "commit"
        self.include_headers = opts.includeHeaders
        self.conn = connect_amqp08(opts, start=attempt)
        try:
            self.control = self.conn.channel()
            self._declare(self.control)
            self.ch = self.conn.channel()
            if self.commit_mode:
                self.ch.tx_select()
            if not self.auto:
                self.ch.basic_qos(prefetch_count=prefetch_of(opts))
            tags = {self.ch.basic_consume(queue, no_ack=self.auto): queue for queue in self.queues}
            self._tags = list(tags)
            if len(tags) > 1:
                self.queue_of = tags
        except BaseException:
            self.conn.close()
            raise
        self._lost: Optional[BaseException] = None
        self._figures = None  # auto mode: (connection, channel) that asks the depth for the figures

    def _declare(self, ch) -> None:
        mode = self.opts.declare
        if mode == "none":
            return
        exchange = self.opts.get("exchange")
        if mode == "create" and exchange and self.opts.get("exchangeType"):
            ch.exchange_declare(exchange, self.opts.exchangeType, durable=True)
        for queue in self.queues:
            if mode == "passive":
                ch.queue_declare(queue, passive=True)
            elif mode == "create":
                ch.queue_declare(queue, durable=True, arguments=self.opts.get("queueArguments"))
                if exchange:
                    ch.queue_bind(queue, exchange, self.opts.get("routingKey") or queue)

    def poll(self, max_count: int, timeout: float) -> list:
        if self._lost is not None:
            raise self._lost
        ch = self.ch
        first = ch.next_message(timeout)
        if first is None:
            return []
        out = [first]
        out.extend(ch.drain(max_count - 1))
        self._lost = gather(out, self._receive, max_count, timeout, self.cut)
        return out

    def _receive(self, count: int, timeout: float) -> list:
        msg = self.ch.next_message(timeout)
        return [] if msg is None else [msg, *self.ch.drain(count - 1)]

    def row(self, msg, offset: int, now_us: int) -> tuple:
        p = msg.properties
        if type(p) is UndecodableProperties:
            raise self._undecodable(msg, p)
        headers = None
        if self.include_headers and p is not None and p.headers:
            headers = [(str(k), None if v is None else _text(v)) for k, v in p.headers.items()]
        queue = self.queue if self.queue_of is None else self._queue(msg)
        if p is None:
            return (msg.body, queue, None, now_us, headers, msg.redelivered, offset, msg.exchange,
                    msg.routing_key, msg.delivery_tag, None, None, None, None, None, None, None, None, None,
                    None, None)
        ts = p.timestamp * 1_000_000 if p.timestamp is not None else now_us
        return (msg.body, queue, p.message_id, ts, headers, msg.redelivered, offset, msg.exchange,
                msg.routing_key, msg.delivery_tag, p.content_type, p.content_encoding, p.delivery_mode,
                p.priority, p.correlation_id, p.reply_to, p.expiration, p.type, p.user_id, p.app_id, p.cluster_id)

    def _queue(self, msg) -> str:
        """The queue ``msg`` came from."""
        return self.queue if self.queue_of is None else self.queue_of.get(msg.consumer_tag, self.queue)

    def _undecodable(self, msg, p) -> PoisonDelivery:
        # no message id to name it by: its body and the raw properties identify it across sessions
        return PoisonDelivery(
            f"its properties ({len(p.raw)} bytes) cannot be decoded: {p.error} (exchange {msg.exchange!r}, "
            f"routing key {msg.routing_key!r}, {len(msg.body)} bytes of body)",
            msg=msg, destination=self._queue(msg), body=msg.body, headers=[("properties", p.raw.hex())])

    def stop_deliveries(self) -> bool:
        """basic.cancel of each consumer (waits for cancel-ok): deliveries already sent stay
        acknowledgeable on the channel, and nothing more comes."""
        for tag in self._tags:
            self.ch.basic_cancel(tag)
        self._tags = []
        return True

    def ack(self, msgs: list) -> None:
        if not self.auto and msgs:
            self.ch.basic_ack(msgs[-1].delivery_tag, multiple=True)

    def dead_letter(self, msg, reason: str, failures: int) -> None:
        """basic.reject without requeue: the queue's dead-letter exchange gets it (RabbitMQ adds
        x-death headers saying from where; without a dead-letter exchange RabbitMQ drops it)."""
        self.ch.basic_reject(msg.delivery_tag, requeue=False)
        if self.commit_mode:  # the channel is transactional: the reject takes effect at its commit
            self.ch.tx_commit()

    def token(self, msg):
        return msg.delivery_tag

    def ack_commit(self, token) -> None:
        self.ch.basic_ack(token, multiple=True)
        self.ch.tx_commit()

    # pause/resume: nothing to send (the base's no-ops). The client stops reading at its bound and
    # TCP holds the broker back, in every mode. (Not a basic.cancel: cancel-ok queues behind whatever
    # the broker has already written, so a cancel would pull all of that into memory.) keepalive: the
    # client's reader thread keeps the heartbeat.

    def depth(self):
        """The queue's depth for the figures. In ``auto`` mode it is asked on a connection of its own:
        without a prefetch the broker writes deliveries as fast as TCP takes them, and a declare-ok on
        the consuming connection queues behind all of that, which the client must then read past its
        buffer bound to find the reply (seen: 10,561 held against a bound of 10,000)."""
        if not self.auto:
            return self._depth_on(self.control)
        try:
            if self._figures is None:
                conn = connect_amqp08(self.opts)  # takes no deliveries
                self._figures = (conn, conn.channel())
            return self._depth_on(self._figures[1])
        except BaseException:
            self._close_figures()  # a broker restart: the next figure connects again
            raise

    def _depth_on(self, ch) -> Optional[int]:
        """The sum of the queues' depths, asked on ``ch`` (None if any cannot tell). With several
        queues, a delivery of a queue counted first that arrives before the later answers is
        counted twice (in its queue's depth and as held): availableNow and batch reads then end at
        a quiet period with the depth at 0, a little later; never too soon."""
        return _depths(ch, self.queues)

    def _close_figures(self) -> None:
        figures, self._figures = self._figures, None
        if figures is not None:
            try:
                figures[0].close(timeout=2.0)
            except (SparkMqError, OSError):
                pass

    def depth_in_order(self):
        # on the consuming channel: deliveries sent before declare-ok are already in the client
        return self._depth_on(self.ch)

    def buffered(self) -> int:
        # deliveries the client holds but we have not polled (prefetched; not counted in the depth)
        return self.ch.pending_messages

    def close(self) -> None:
        self._close_figures()
        self.conn.close(timeout=2.0)


def _depths(ch, names) -> Optional[int]:
    """The sum of the ready messages of queues ``names``, asked on ``ch`` (None if any cannot tell)."""
    total = 0
    for queue in names:
        ok = ch.queue_declare(queue, passive=True)
        if ok is None:
            return None
        total += ok.message_count
    return total


def connect_consumer(opts: Options, attempt: int = 0) -> Amqp08Consumer:
    return Amqp08Consumer(opts, attempt)


def queue_depth(opts: Options) -> Optional[int]:
    """The ready messages of the queues read, on a connection of its own that takes no deliveries: what an
    availableNow run with ``ingest=executors`` reads before it ends (counted by the driver at its start)."""
    conn = connect_amqp08(opts)
    try:
        return _depths(conn.channel(), queues(opts))
    finally:
        conn.close(timeout=2.0)
