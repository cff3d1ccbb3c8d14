"""``MalamuteClient``: the Malamute client over a pyzmq DEALER, with an IO thread of its own.

One IO thread owns the DEALER socket (ZeroMQ sockets are not thread-safe): it answers the clock
(PINGs every second, server-lost detection, transparent recovery after a broker restart) even
while the application is busy, and puts deliveries on a queue that ``recv`` reads. Application
threads reach the IO thread through an inproc PUSH/PULL pipe, guarded by a lock, so calls are safe
from any thread and keep their order. Requests with replies (``set_*``, ``ping``) wait for them;
sends return at once (the broker never answers them). ``recv`` also returns a CONFIRM from the
server (``Confirm``: ``tracker``, ``code``, ``reason``), which the reference broker never sends.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Optional, Sequence, Union

import zmq

from spark_mq.clients.malamute_base import _DRAIN, _DELIVERIES, _MAX_POLL_MS, _checked, _notify, _Status, log
from spark_mq.errors import ConnectionClosedError, RemoteProtocolError
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.malamute.client import (
    DEFAULT_HEARTBEAT, DEFAULT_SERVER_TIMEOUT, ClientConnection, Reply, State,
)
from spark_mq.protocol.malamute.errors import MalamuteBrokerError
from spark_mq.transport.zmqframes import NOBLOCK, recv_frames

Body = Union[bytes, bytearray, memoryview, str]
_FORWARD = b"F"
_COMMAND = b"C"
_STOP = b"S"
_WAKE = b"W"
_RECEIVED = (*_DELIVERIES, codec.Confirm)  # what MalamuteClient hands over
_pipe_ids = itertools.count()


def _frames(content) -> list:
    """Content as frames: one bytes/str body, or a sequence of them."""
    if content is None:
        return []
    if isinstance(content, (bytes, bytearray, memoryview, str)):
        content = [content]
    return [c.encode("utf-8") if isinstance(c, str) else c for c in content]



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

