"""Synchronous Malamute client: a pyzmq DEALER driver around the sans-IO ``ClientConnection``.

The API follows the reference C client (mlm_client): ``MalamuteClient(endpoint, address, timeout)``
connects; ``set_producer`` / ``send`` (streams), ``set_consumer`` / ``remove_consumer``, ``sendto``
(mailboxes), ``set_worker`` / ``sendfor`` (services), ``recv``, ``credit``, ``ping``, ``close``.

One IO thread owns the DEALER socket (ZeroMQ sockets are not thread-safe): it answers the clock
(PINGs every second, server-lost detection, transparent recovery after a broker restart) even
while the application is busy, and puts deliveries on a queue that ``recv`` reads. Application
threads reach the IO thread through an inproc PUSH/PULL pipe, guarded by a lock, so calls are safe
from any thread and keep their order. Requests with replies (``set_*``, ``ping``) wait for them;
sends return at once (the broker never answers them).

``MalamuteReceiver`` is the other driver: no IO thread, driven by the one thread that consumes,
over the repository's own ZMTP 3.0 DEALER (``spark_mq.transport.zmtp``) instead of pyzmq; the
Malamute source's reader uses it.

Received messages are the codec's ``StreamDeliver``, ``MailboxDeliver``, ``ServiceDeliver`` objects:
``sender``, ``address``, ``subject``, ``tracker``, ``content`` (list of bytes). ``MalamuteClient.recv``
also returns a CONFIRM from the server (``Confirm``: ``tracker``, ``code``, ``reason``), which the
reference broker never sends; ``MalamuteReceiver`` hands one to ``on_event`` instead: what it returns
are deliveries only.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from array import array
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Optional, Sequence, Union

import zmq

from spark_mq.errors import ConnectionClosedError, RemoteProtocolError
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.malamute.codec import delivery_fields
from spark_mq.protocol.malamute.client import (
    DEFAULT_HEARTBEAT, DEFAULT_SERVER_TIMEOUT, BrokerNotice, ClientConnection, Recovered, Recovering, Reply,
    ServerBack, ServerLost, State,
)
from spark_mq.protocol.malamute.errors import MalamuteBrokerError
from spark_mq.protocol.zmtp import BodyBuffer
from spark_mq.transport.zmqframes import NOBLOCK, recv_frames
from spark_mq.transport.zmtp import ZmtpDealer

log = logging.getLogger("spark_mq.clients.malamute")

Body = Union[bytes, bytearray, memoryview, str]
_FORWARD = b"F"
_COMMAND = b"C"
_STOP = b"S"
_WAKE = b"W"
_MAX_POLL_MS = 100
_DRAIN = 1024
DEFAULT_READ_BUFFER = 1 << 20  # MalamuteReceiver: bytes read from the socket at a time, at most
_DELIVERIES = (codec.StreamDeliver, codec.MailboxDeliver, codec.ServiceDeliver)
_RECEIVED = (*_DELIVERIES, codec.Confirm)  # what MalamuteClient hands over
# MalamuteReceiver: what a delivery held for ``poll`` takes beyond its content, about (the message
# object, its dict and content list, a bytes object per frame: 220 bytes measured for one frame)
_HELD_OVERHEAD = 256
_pipe_ids = itertools.count()


def _checked(reply: Reply, what: str) -> Reply:
    """``reply`` if it is an OK; else the error it stands for (code 0: failed on our side)."""
    if not reply.ok:
        if reply.code == 0:
            raise ConnectionClosedError(f"{what} failed: {reply.reason}")
        raise MalamuteBrokerError(what, reply.code, reply.reason)
    return reply


def _notify(endpoint: str, event, on_event: Optional[Callable[[object], None]]) -> None:
    """A connection event (server lost or back, recovering, recovered, broker notice): log it and
    hand it to the application's callback."""
    if isinstance(event, (ServerLost, Recovering, ServerBack, Recovered)):
        log.info("malamute %s: %s", endpoint, event)
    if on_event is not None:
        try:
            on_event(event)
        except Exception:
            log.exception("on_event callback failed")


def _frames(content) -> list:
    """Content as frames: one bytes/str body, or a sequence of them."""
    if content is None:
        return []
    if isinstance(content, (bytes, bytearray, memoryview, str)):
        content = [content]
    return [c.encode("utf-8") if isinstance(c, str) else c for c in content]


class _Status:
    """What both drivers tell of their ``ClientConnection`` (``_proto``) and ``_closed``."""

    _proto: ClientConnection
    _closed: bool

    @property
    def address(self) -> str:
        return self._proto.address

    @property
    def connected(self) -> bool:
        return self._proto.state in (State.CONNECTED, State.RECOVERING) and not self._closed

    @property
    def lost_for(self) -> float:
        """Seconds since the server was declared lost (silent for ``server_timeout``); else 0."""
        return self._proto.lost_for(time.monotonic())

    @property
    def heard_at(self) -> float:
        """``time.monotonic()`` when the server was last heard from (any message, a PONG included)."""
        return self._proto.last_heard

    @property
    def recoveries(self) -> int:
        return self._proto.recoveries


class MalamuteClient(_Status):
    """A connected Malamute client.

    >>> with MalamuteClient("tcp://127.0.0.1:9999", "reader") as c:   # doctest: +SKIP
    ...     c.set_consumer("weather", "^temp")
    ...     msg = c.recv(timeout=5)
    """

    def __init__(
        self,
        endpoint: str,
        address: str = "",
        timeout: float = 5.0,
        *,
        heartbeat: float = DEFAULT_HEARTBEAT,
        server_timeout: float = DEFAULT_SERVER_TIMEOUT,
        confirm_supported: bool = False,
        request_timeout: float = 10.0,
        hwm: int = 100_000,
        max_buffered: Optional[int] = None,
        context: Optional[zmq.Context] = None,
        on_event: Optional[Callable[[object], None]] = None,
    ) -> None:
        self.endpoint = endpoint
        self.request_timeout = request_timeout
        self.on_event = on_event
        self._proto = ClientConnection(heartbeat=heartbeat, server_timeout=server_timeout,
                                       confirm_supported=confirm_supported)
        self._context = context or zmq.Context.instance()
        # deliveries cross from the IO thread in lists (one per pass of its loop), not one by one:
        # a queue hand-off per message cost more than decoding it
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._ready: deque = deque()
        # Flow control towards the application: with ``max_buffered``, the IO thread stops reading
        # the socket while that many deliveries are handed over and not yet taken; the rest waits
        # in ZeroMQ (up to ``hwm``), then in TCP, then in the broker. Each counter has one writer.
        self.max_buffered = max_buffered
        self._given = 0   # deliveries handed over (IO thread)
        self._taken = 0   # deliveries taken by recv/recv_many (application)
        self._blocked = False  # the IO thread waits for the application to take some
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._futures: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._dead: Optional[BaseException] = None
        pipe = f"inproc://spark-mq-malamute-client-{next(_pipe_ids)}-{id(self):x}"
        self._dealer = self._context.socket(zmq.DEALER)
        self._dealer.setsockopt(zmq.LINGER, 0)
        self._dealer.setsockopt(zmq.SNDHWM, hwm)
        self._dealer.setsockopt(zmq.RCVHWM, hwm)
        self._pull = self._context.socket(zmq.PULL)
        self._pull.setsockopt(zmq.LINGER, 0)
        self._pull.bind(pipe)
        self._push = self._context.socket(zmq.PUSH)
        self._push.setsockopt(zmq.LINGER, 0)
        self._push.setsockopt(zmq.SNDHWM, 0)
        self._push.connect(pipe)
        try:
            self._dealer.connect(endpoint)
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise ConnectionClosedError(f"bad Malamute endpoint {endpoint!r}: {exc}") from exc
        self._thread = threading.Thread(target=self._io_loop, name=f"malamute-client-{address or 'anon'}",
                                        daemon=True)
        self._thread.start()
        future = self._call(lambda proto, now: proto.open(address, now, timeout))
        try:
            self._wait(future, "CONNECTION-OPEN", timeout + 1.0)
        except BaseException:
            self._shutdown()
            raise

    # ------------------------------------------------------------ public API

    def set_producer(self, stream: str) -> None:
        """Publish to ``stream`` from now on (one stream at a time)."""
        self._request(lambda p, now: p.set_producer(stream), "STREAM-WRITE")

    def set_consumer(self, stream: str, pattern: str = "") -> None:
        """Receive ``stream`` messages whose subject matches the zrex ``pattern`` ("" = all)."""
        from spark_mq.protocol.malamute.patterns import validate_pattern
        validate_pattern(pattern)  # raise LocalProtocolError in the caller's thread
        self._request(lambda p, now: p.set_consumer(stream, pattern), "STREAM-READ")

    def remove_consumer(self, stream: str) -> None:
        self._request(lambda p, now: p.remove_consumer(stream), "STREAM-CANCEL")

    def set_worker(self, service: str, pattern: str = "") -> None:
        """Offer ``service`` for requests whose subject matches ``pattern``."""
        from spark_mq.protocol.malamute.patterns import validate_pattern
        validate_pattern(pattern)
        self._request(lambda p, now: p.set_worker(service, pattern), "SERVICE-OFFER")

    def send(self, subject: str, content: Union[Body, Sequence[Body], None] = None) -> None:
        """STREAM-SEND to the producer stream (no reply from the broker)."""
        self._forward(ClientConnection.stream_send(subject, _frames(content)))

    def sendto(self, address: str, subject: str, content: Union[Body, Sequence[Body], None] = None,
               tracker: str = "", timeout: int = 0) -> None:
        """MAILBOX-SEND to ``address`` (no reply; ``timeout`` in ms, 0 = none)."""
        self._forward(ClientConnection.mailbox_send(address, subject, _frames(content), tracker, timeout))

    def sendfor(self, service: str, subject: str, content: Union[Body, Sequence[Body], None] = None,
                tracker: str = "", timeout: int = 0) -> None:
        """SERVICE-SEND to ``service`` (no reply; the worker answers in our mailbox)."""
        self._forward(ClientConnection.service_send(service, subject, _frames(content), tracker, timeout))

    def reply(self, request: codec.ServiceDeliver, subject: str,
              content: Union[Body, Sequence[Body], None] = None, tracker: str = "") -> None:
        """Answer a service request in the requester's mailbox."""
        self.sendto(request.sender, subject, content, tracker)

    def credit(self, amount: int) -> None:
        self._forward(ClientConnection.credit(amount))

    def confirm(self, tracker: str, code: int = codec.StatusCode.SUCCESS, reason: str = "") -> None:
        self._forward(self._proto.confirm(tracker, code, reason))

    def ping(self, timeout: Optional[float] = None) -> None:
        """Round trip to the broker: everything sent before it has been processed when it returns."""
        self._request(lambda p, now: p.ping(), "CONNECTION-PING", timeout)

    def recv(self, timeout: Optional[float] = None):
        """The next delivery, or ``None`` after ``timeout`` seconds (``None`` = wait forever)."""
        ready = self._ready
        if ready or self._fill(timeout):
            try:
                msg = ready.popleft()
            except IndexError:  # another thread took it
                return None
            self._took(1)
            return msg
        return None

    def recv_many(self, max_count: int, timeout: Optional[float] = None) -> list:
        """Up to ``max_count`` deliveries that have arrived, waiting up to ``timeout`` seconds for the
        first (``None`` = forever); ``[]`` if none came."""
        ready = self._ready
        if not ready and not self._fill(timeout):
            return []
        self._fill(0)  # whatever else the IO thread has handed over meanwhile
        out = []
        pop = ready.popleft
        try:
            while len(out) < max_count:
                out.append(pop())
        except IndexError:
            pass
        self._took(len(out))
        return out

    @property
    def buffered(self) -> int:
        """Deliveries received and handed over by the IO thread, not yet taken by ``recv``."""
        return max(0, self._given - self._taken)

    def _took(self, count: int) -> None:
        self._taken += count
        # wake a blocked IO thread once half the bound is free (it sets _blocked before its last
        # look at the counters, so a wake is never missed for longer than one poll timeout)
        if self._blocked and self._given - self._taken <= (self.max_buffered or 0) // 2:
            self._blocked = False
            try:
                self._pipe([_WAKE])
            except ConnectionClosedError:
                pass

    def _fill(self, timeout: Optional[float]) -> bool:
        """Move handed-over deliveries to ``_ready``, waiting up to ``timeout`` for some; True if any."""
        inbox, ready = self._inbox, self._ready
        while True:  # what is there already, without waiting
            try:
                ready.extend(inbox.get_nowait())
            except queue.Empty:
                break
        if ready or timeout == 0:
            return bool(ready)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closed and inbox.empty():
                raise ConnectionClosedError("client is closed")
            wait = 0.5 if deadline is None else min(0.5, deadline - time.monotonic())
            if wait <= 0:
                return False
            try:
                ready.extend(inbox.get(timeout=wait))
                return True
            except queue.Empty:
                if self._dead is not None:
                    raise ConnectionClosedError(f"client IO thread failed: {self._dead}") from self._dead

    def close(self, timeout: float = 1.0) -> None:
        """Polite CONNECTION-CLOSE (bounded wait), then stop the IO thread. Idempotent."""
        if self._closed:
            return
        if self._thread.is_alive() and self._proto.state in (State.CONNECTED, State.RECOVERING, State.LOST):
            try:
                self._wait(self._call(lambda p, now: p.close()), "CONNECTION-CLOSE", timeout)
            except (MalamuteBrokerError, ConnectionClosedError, TimeoutError):
                pass  # closing is polite, not mandatory: the broker expires us anyway
        self._shutdown()

    def __enter__(self) -> "MalamuteClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ application side of the pipe

    def _pipe(self, frames: list) -> None:
        if self._closed:
            raise ConnectionClosedError("client is closed")
        with self._lock:
            self._push.send_multipart(frames, copy=False)

    def _forward(self, frames: list) -> None:
        self._pipe([_FORWARD, *frames])

    def _call(self, fn) -> Future:
        future: Future = Future()
        self._commands.put((fn, future))
        self._pipe([_COMMAND])
        return future

    def _request(self, fn, what: str, timeout: Optional[float] = None) -> None:
        self._wait(self._call(fn), what, self.request_timeout if timeout is None else timeout)

    def _wait(self, future: Future, what: str, timeout: float) -> Reply:
        try:
            reply = future.result(timeout)
        except FutureTimeout:
            raise TimeoutError(f"no answer to {what} within {timeout} s") from None
        return _checked(reply, what)

    # ------------------------------------------------------------ IO thread

    def _io_loop(self) -> None:
        try:
            self._io_loop_inner()
        except BaseException as exc:
            self._dead = exc
            log.exception("malamute client IO thread failed")
        finally:
            for future in self._futures.values():
                if not future.done():
                    future.set_exception(ConnectionClosedError("client IO thread stopped"))
            self._futures.clear()

    def _io_loop_inner(self) -> None:
        dealer, pull, proto = self._dealer, self._pull, self._proto
        poller = zmq.Poller()
        poller.register(dealer, zmq.POLLIN)
        poller.register(pull, zmq.POLLIN)
        backlog: deque = deque()
        clock = time.monotonic
        noblock = NOBLOCK
        while True:
            now = clock()
            wait_ms = max(0, min(_MAX_POLL_MS, int((proto.next_deadline() - now) * 1000) + 1))
            room = self._room(proto)
            if not room:
                self._blocked = True
                room = self._room(proto)  # taken meanwhile: no wake will come
                if room:
                    self._blocked = False
            mask = (zmq.POLLIN if room else 0) | (zmq.POLLOUT if backlog else 0)
            if mask != zmq.POLLIN:
                poller.modify(dealer, mask)
            poller.poll(wait_ms)
            now = clock()
            if mask != zmq.POLLIN:
                poller.modify(dealer, zmq.POLLIN)
                if not room and dealer.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    proto.heard(now)  # replies wait behind deliveries we do not read yet
            # application -> broker
            for _ in range(_DRAIN):
                try:
                    frames = pull.recv_multipart(noblock, copy=False)
                except zmq.Again:
                    break
                kind = frames[0].bytes
                if kind == _FORWARD:
                    backlog.append(frames[1:])
                elif kind == _COMMAND:
                    fn, future = self._commands.get_nowait()
                    try:
                        token = fn(proto, now)
                    except Exception as exc:
                        future.set_exception(exc)
                    else:
                        if token is None:
                            future.set_result(Reply(0, codec.MessageId.CONNECTION_CLOSE, True))
                        else:
                            self._futures[token] = future
                elif kind == _STOP:
                    return
                # _WAKE: the application took deliveries; this pass reads the socket again
            # broker -> application (as much as the application has room for)
            deliveries: list = []
            for _ in range(_DRAIN):
                if not self._room(proto, len(deliveries)):  # checked per message: an answer may come first
                    break
                try:
                    frames = recv_frames(dealer, noblock)
                except zmq.Again:
                    break
                try:
                    events = proto.receive(frames, now)
                except RemoteProtocolError as exc:
                    log.warning("dropping malformed message from the broker: %s", exc)
                    continue
                self._dispatch(events, deliveries)
            if deliveries:
                self._given += len(deliveries)
                self._inbox.put(deliveries)
            self._dispatch(proto.tick(now))
            backlog.extend(proto.data_to_send())
            while backlog:
                try:
                    dealer.send_multipart(backlog[0], noblock)
                except zmq.Again:
                    break  # HWM reached (broker away): keep it and wait for POLLOUT
                backlog.popleft()

    def _room(self, proto: ClientConnection, unhanded: int = 0) -> bool:
        """May the IO thread read the socket: fewer than ``max_buffered`` deliveries handed over (or
        about to be: ``unhanded``) and not taken, or a request waits for its answer (set_consumer,
        ping, a recovery's replay, close), which may be queued behind deliveries nobody has room for."""
        bound = self.max_buffered
        return bound is None or self._given + unhanded - self._taken < bound or \
            proto.state is State.CLOSING or proto.awaiting_reply

    def _dispatch(self, events: list, deliveries: Optional[list] = None) -> None:
        """Act on protocol events; deliveries go to ``deliveries`` (handed over by the caller) or,
        without one, straight to the inbox."""
        for event in events:
            if isinstance(event, Reply):
                future = self._futures.pop(event.token, None)
                if future is not None and not future.done():
                    future.set_result(event)
            elif isinstance(event, _RECEIVED):
                if deliveries is None:
                    self._given += 1
                    self._inbox.put([event])
                else:
                    deliveries.append(event)
            else:
                _notify(self.endpoint, event, self.on_event)

    # ------------------------------------------------------------ teardown

    def _shutdown(self) -> None:
        if self._closed:
            return
        if self._thread.is_alive():
            with self._lock:
                self._push.send_multipart([_STOP])
            self._thread.join(5.0)
        self._closed = True
        if not self._thread.is_alive():
            self._close_sockets()

    def _close_sockets(self) -> None:
        for sock in (self._dealer, self._pull, self._push):
            sock.close(0)


def _footprint(delivery) -> int:
    """What a delivery held for ``poll`` takes in memory, about."""
    return _HELD_OVERHEAD + sum(map(len, delivery.content))


class Deliveries:
    """Deliveries as ``MalamuteReceiver.poll(..., body)`` returns them: by columns, over a body buffer.

    Delivery ``i`` has the header fields ``fields[i]`` (``sender``, ``address``, ``subject``, and
    ``tracker`` but for a stream; one dict shared by every delivery with the same header: read it,
    do not change it) and its first content frame in ``body.data[ends[i - 1]:ends[i]]`` (the
    first delivery's begins at ``start``, what ``body`` held before). ``frames`` holds, by index,
    the content frames (``bytes``) of the deliveries with other than exactly one (none: an empty
    first frame). A source builds its columns from that: no ``bytes`` per body, no object per
    delivery."""

    __slots__ = ("body", "start", "fields", "ends", "frames")

    def __init__(self, body: BodyBuffer) -> None:
        self.body = body
        self.start = body.fill
        self.fields: list = []
        self.ends = array("q")
        self.frames: dict = {}

    def __len__(self) -> int:
        return len(self.fields)

    def add(self, fields: dict, content: Sequence) -> None:
        """One more delivery, its content frames as ``bytes`` (one read the general way, or held)."""
        if content:
            self.body.append(content[0])
        if len(content) != 1:
            self.frames[len(self.fields)] = list(content)
        self.fields.append(fields)
        self.ends.append(self.body.fill)

    def add_delivery(self, delivery) -> None:
        """One more delivery object (held, or decoded by ``receive``)."""
        self.add(vars(delivery), delivery.content)

    def cut(self, index: int) -> list:
        """Take the deliveries from ``index`` on out again: their ``(fields, content)``, the content
        as ``bytes`` (``body`` goes back to where they began)."""
        ends, data = self.ends, self.body.data
        begin = origin = ends[index - 1] if index else self.start
        taken = []
        for i in range(index, len(self.fields)):
            frames = self.frames.pop(i, None)
            taken.append((self.fields[i], frames if frames is not None else [bytes(data[begin:ends[i]])]))
            begin = ends[i]
        self.body.fill = origin
        del self.fields[index:], self.ends[index:]
        return taken


class MalamuteReceiver(_Status):
    """A Malamute client for one consuming thread, driven by that thread: no IO thread, no pyzmq.

    ``MalamuteClient`` hands every delivery from its IO thread to the application's thread, and
    pyzmq hands every frame from libzmq's IO thread to Python; in a process whose other threads
    share the interpreter lock (the source's reader: the ingest builds Arrow batches and writes the
    log), those hand-offs cost more than the rest of receiving. Here the caller's ``poll`` reads
    the TCP stream itself through a ``spark_mq.transport.zmtp.ZmtpDealer`` (ZMTP 3.0, as a libzmq
    DEALER: the broker sees no difference), feeds the same sans-IO ``ClientConnection``
    (heartbeats, server-lost detection, recovery after a broker restart) and returns the
    deliveries. Between calls nothing is read: the kernel's socket buffer holds what arrives, then
    the broker keeps the rest. Inside a request (``set_consumer``, ``set_worker``, ``ping``), the
    deliveries read on the way to its answer are held for ``poll``, at most ``read_buffer`` bytes of
    them (``_await`` says what happens then). A CONFIRM from the server is no delivery: it goes to
    ``on_event`` only.

    The price: the clock runs only inside calls. Call ``poll`` or ``keepalive`` at least every
    ``heartbeat`` seconds (the broker drops a client silent for its ``server/timeout``, 5-60 s in
    the reference configurations; a dropped client is re-opened, and a stream's messages sent
    meanwhile are missed). Not thread-safe beyond that: one thread polls; ``close`` may come from
    another (it waits for a running ``poll``).

    >>> with MalamuteReceiver("tcp://127.0.0.1:9999", "jobs") as r:   # doctest: +SKIP
    ...     batch = r.poll(1000, timeout=1.0)      # mailbox "jobs": up to 1000 deliveries
    """

    def __init__(
        self,
        endpoint: str,
        address: str = "",
        timeout: float = 5.0,
        *,
        heartbeat: float = DEFAULT_HEARTBEAT,
        server_timeout: float = DEFAULT_SERVER_TIMEOUT,
        request_timeout: float = 10.0,
        read_buffer: int = DEFAULT_READ_BUFFER,
        on_event: Optional[Callable[[object], None]] = None,
    ) -> None:
        self.endpoint = endpoint
        self.request_timeout = request_timeout
        self.on_event = on_event
        self._proto = ClientConnection(heartbeat=heartbeat, server_timeout=server_timeout)
        self._held: deque = deque()       # deliveries read while waiting for a reply
        self._held_size = 0               # what they take (``_footprint`` of each)
        self._held_max = read_buffer      # ... at most (past it by one delivery at most)
        self._deferred: dict[int, str] = {}  # registrations whose answer is left to ``poll``: token -> name
        self._backlog: deque = deque()    # messages the transport's queue did not take yet (broker away)
        self._replies: dict[int, Reply] = {}
        self._awaited: set[int] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._wire = ZmtpDealer(endpoint, buffer_size=read_buffer)  # raises ConnectionClosedError on a bad endpoint
        try:
            self._request(self._proto.open(address, time.monotonic(), timeout), "CONNECTION-OPEN", timeout + 1.0)
        except (TimeoutError, ConnectionClosedError) as exc:
            self._closed = True
            why = self._wire.describe()  # why the last connection attempt failed, or where it stands
            self._wire.close()
            raise type(exc)(f"{exc} ({endpoint}: {why})") from None
        except BaseException:
            self._closed = True
            self._wire.close()
            raise

    # ------------------------------------------------------------ public API

    @property
    def buffered(self) -> int:
        """Deliveries read while waiting for a reply and not yet returned by ``poll`` (what ZeroMQ
        holds is not counted: it cannot be seen without reading it)."""
        return len(self._held)

    def set_consumer(self, stream: str, pattern: str = "") -> None:
        """Receive ``stream`` messages whose subject matches the zrex ``pattern`` ("" = all). Returns
        without the broker's answer when it is queued behind more deliveries than the receiver holds
        (``_await``): ``poll`` then reads through to it, and a failure is logged."""
        self._request(self._proto.set_consumer(stream, pattern), "STREAM-READ", defer=True)

    def set_worker(self, service: str, pattern: str = "") -> None:
        """Offer ``service`` for requests whose subject matches ``pattern`` (answer as ``set_consumer``)."""
        self._request(self._proto.set_worker(service, pattern), "SERVICE-OFFER", defer=True)

    def ping(self, timeout: Optional[float] = None) -> None:
        """Round trip to the broker (deliveries read meanwhile are kept for ``poll``). ``TimeoutError``
        without waiting out ``timeout`` when the PONG is queued behind more deliveries than the
        receiver holds (``_await``): ``poll`` them, then ping again."""
        self._request(self._proto.ping(), "CONNECTION-PING", timeout)

    def poll(self, max_count: int, timeout: float, gap: float = 0.001, body: Optional[BodyBuffer] = None,
             max_bytes: int = 1 << 62):
        """Up to ``max_count`` deliveries: waits up to ``timeout`` seconds for the first, then takes
        what follows until ``gap`` seconds pass without one (or ``timeout`` in total); empty if none.

        A list of delivery objects; with ``body`` (a ``BodyBuffer``), ``Deliveries`` instead: the
        deliveries by columns, their first content frames copied into ``body`` as they come off the
        socket, after what it holds. No more deliveries are taken once ``body`` holds ``max_bytes``
        (the last read may pass that by what it parsed). Empty ``body`` (``fill = 0``) for the next
        call only once nothing built over its bytes is alive: writes that do not resize it are not
        refused."""
        with self._lock:
            if self._closed:
                raise ConnectionClosedError("client is closed")
            out = [] if body is None else Deliveries(body)
            held = self._held
            while held and len(out) < max_count and (body is None or body.fill < max_bytes):
                delivery = held.popleft()
                self._held_size -= _footprint(delivery)
                if body is None:
                    out.append(delivery)
                else:
                    out.add_delivery(delivery)
            clock = time.monotonic
            deadline = clock() + timeout
            waited = False
            while True:
                got = self._read(out, max_count) if body is None else self._read_columns(out, max_count, max_bytes)
                if len(out) >= max_count or (body is not None and body.fill >= max_bytes):
                    return out
                now = clock()
                if now >= deadline or (out and waited and not got):
                    return out
                self._wait(min(deadline - now, gap) if out else deadline - now)
                waited = True

    def keepalive(self) -> None:
        """Run the clock without taking deliveries (the caller holds back): PINGs go out, and
        deliveries waiting unread count as hearing from the server."""
        with self._lock:
            if self._closed:
                return
            if not self._wire.ready:  # connecting or handshaking: move it on (at most one delivery kept)
                self._hold_one()
            now = time.monotonic()
            if self._wire.pending():
                self._proto.heard(now)
            self._tick(now)

    def close(self, timeout: float = 1.0) -> None:
        """Polite CONNECTION-CLOSE (bounded wait; deliveries that arrive meanwhile are dropped: the
        broker has forgotten them already), then close the socket. Idempotent."""
        with self._lock:
            if self._closed:
                return
            try:
                if self._proto.state in (State.CONNECTED, State.RECOVERING, State.LOST):
                    token = self._proto.close()
                    if token is not None:
                        self._await(token, "CONNECTION-CLOSE", timeout, keep=False)
            except (MalamuteBrokerError, ConnectionClosedError, TimeoutError):
                pass  # closing is polite, not mandatory: the broker expires us anyway
            finally:
                self._closed = True
                self._held.clear()
                self._held_size = 0
                self._deferred.clear()
                self._wire.close()

    def __enter__(self) -> "MalamuteReceiver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------ driving the socket

    def _request(self, token: int, what: str, timeout: Optional[float] = None,
                 defer: bool = False) -> Optional[Reply]:
        with self._lock:
            if self._closed:
                raise ConnectionClosedError("client is closed")
            return self._await(token, what, self.request_timeout if timeout is None else timeout, defer=defer)

    def _await(self, token: int, what: str, timeout: float, keep: bool = True,
               defer: bool = False) -> Optional[Reply]:
        """Read until ``token``'s reply; deliveries read on the way are held for ``poll`` (``keep``),
        or else dropped ``_DRAIN`` at a time (``close``: the broker has forgotten them already).

        The broker answers on the one ordered stream that carries the deliveries, so an answer may
        sit behind any number of them: whatever the broker had queued for this client before it
        read the request (mail stored for the address, a service's waiting requests, a stream in
        full flow), which only the broker's own queue bounds (its ZeroMQ high-water mark: 100,000
        messages on the embedded broker, whatever their size). None of them may be skipped (Malamute
        never delivers twice), and reaching the answer means holding every one. So this reads one
        delivery at a time and holds at most ``read_buffer`` bytes of them (content plus
        ``_HELD_OVERHEAD`` each, past it by the last one at most: the source's promise that the
        reader holds about its 1 MiB read buffer ahead of the ingest holds here too), then reads no
        more; what follows waits in the socket and the broker, as between two polls. Then:

        - a registration (``defer``: STREAM-READ, SERVICE-OFFER) returns ``None`` without its
          answer. The protocol keeps the request pending and matches the answer when ``poll``
          reaches it, in order (``_event``: a failure is logged and handed to ``on_event``). For
          the client it is in force already: it is recorded and replayed after any recovery,
          whatever the answer (the reference broker answers both with OK, always).
        - any other request (``ping``; CONNECTION-OPEN, which no delivery can precede) raises
          ``TimeoutError`` at once rather than wait out ``timeout`` for an answer it will not read.
          Nothing is lost: what it read is held for ``poll``, and the late answer is dropped there.
        """
        self._awaited.add(token)
        replies = self._replies
        try:
            deadline = time.monotonic() + timeout
            while token not in replies:
                if not keep:
                    got = self._read([], _DRAIN)
                elif self._held_size < self._held_max:
                    got = self._hold_one()
                elif defer:
                    self._deferred[token] = what
                    log.info("malamute %s: the answer to %s is behind more deliveries than the receiver holds "
                             "(%d, %d bytes): left for poll", self.endpoint, what, len(self._held), self._held_size)
                    return None
                else:
                    raise TimeoutError(f"no answer to {what}: it is behind more deliveries than the receiver holds "
                                       f"({len(self._held)}, {self._held_size} bytes); poll them, then ask again")
                if token in replies:
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no answer to {what} within {timeout} s")
                if not got:
                    self._wait(left)
            return _checked(replies.pop(token), what)
        finally:
            self._awaited.discard(token)

    def _hold_one(self) -> int:
        """Read up to one more delivery into ``_held`` (acting on the other messages); how many."""
        held = self._held
        got = self._read(held, len(held) + 1)
        if got:
            self._held_size += _footprint(held[-1])
        return got

    def _read(self, out: list, max_count: int) -> int:
        """Take the messages waiting in the socket, up to ``max_count`` deliveries in ``out``; act on
        the rest; run the clock. Returns how many deliveries it added."""
        now = time.monotonic()
        before = len(out)
        while len(out) < max_count:
            batch = self._wire.read(max_count - len(out))
            if not batch:
                break
            for frames in batch:
                self._receive(frames, now, out.append)
        self._tick(now)
        return len(out) - before

    def _read_columns(self, out: Deliveries, max_count: int, max_bytes: int) -> int:
        """``_read`` into ``out``'s columns, up to about ``max_bytes`` in its body buffer: the usual
        delivery (a header, one content frame) goes from the transport's columns to ``out`` as it
        is (``_resolve``); any other message through ``receive``."""
        wire, body = self._wire, out.body
        now = time.monotonic()
        before = len(out)
        while len(out) < max_count and body.fill < max_bytes:
            mark = len(out)
            other = wire.read_columns(out.fields, out.ends, body, max_count - mark, max_bytes)
            if len(out) > mark:
                self._resolve(out, mark, now)
            if other is not None:
                self._receive(other, now, out.add_delivery)
            elif len(out) == mark:
                break
        self._tick(now)
        return len(out) - before

    def _resolve(self, out: Deliveries, mark: int, now: float) -> None:
        """The header frames the transport put in ``out.fields[mark:]`` replaced by their fields (looked
        up once per distinct header: the transport hands a header that repeats as the same object).
        What ``receive`` does with a delivery, but for the state after a lost server (which ``tick``
        alone sets, never ``receive``): then, or if any header is not a delivery's, the messages
        from ``mark`` on go through ``receive`` instead, in order."""
        fields = out.fields
        heads = fields[mark:]
        first = heads[0]
        resolved = None
        if self._proto.state is not State.LOST:
            if heads.count(first) == len(heads):  # one header for all (an identity test each, in C)
                one = delivery_fields(first)
                if one is not None:
                    resolved = [one] * len(heads)
            else:
                resolved, known, one = [], None, None
                for header in heads:
                    if header is not known:
                        known, one = header, delivery_fields(header)
                        if one is None:
                            resolved = None
                            break
                    resolved.append(one)
        if resolved is not None:
            fields[mark:] = resolved
            self._proto.heard(now)
            return
        for header, content in out.cut(mark):
            self._receive([header, *content], now, out.add_delivery)

    def _receive(self, frames: list, now: float, deliver) -> None:
        """One message through the protocol: ``deliver(delivery)`` for a delivery, ``_event`` for the rest."""
        try:
            events = self._proto.receive(frames, now)
        except RemoteProtocolError as exc:
            log.warning("dropping malformed message from the broker: %s", exc)
            return
        for event in events:
            if isinstance(event, _DELIVERIES):
                deliver(event)
            else:
                self._event(event)

    def _wait(self, seconds: float) -> bool:
        """Wait up to ``seconds`` (cut short at the clock's next deadline) for something to read."""
        until_tick = self._proto.next_deadline() - time.monotonic()
        return self._wire.wait(max(0.0, min(seconds, until_tick, _MAX_POLL_MS / 1000)))

    def _tick(self, now: float) -> None:
        proto = self._proto
        if now >= proto.next_deadline():
            for event in proto.tick(now):
                self._event(event)
        backlog = self._backlog
        backlog.extend(proto.data_to_send())
        while backlog:
            if not self._wire.send(backlog[0]):
                return  # the transport's queue is full (broker away): sent by a later call
            backlog.popleft()

    def _event(self, event) -> None:
        if isinstance(event, Reply):
            token = event.token
            if token in self._awaited:
                self._replies[token] = event
                return
            what = self._deferred.pop(token, None)
            if what is None or event.ok:
                return  # an answer nobody waits for (a ping that gave up), or a registration in force
            log.warning("malamute %s: %s failed after the receiver stopped waiting for its answer: %s %s",
                        self.endpoint, what, event.code, event.reason)
            event = BrokerNotice(event.code, f"{what} failed: {event.reason}")
        elif isinstance(event, codec.Confirm):
            log.debug("malamute %s: CONFIRM from the broker (tracker %r, %s %s): not a delivery",
                      self.endpoint, event.tracker, event.code, event.reason)
        _notify(self.endpoint, event, self.on_event)
