"""``MalamuteReceiver``: the Malamute client for one consuming thread, over the repository's own ZMTP 3.0
DEALER (``spark_mq.transport.zmtp``) instead of pyzmq, with no IO thread; and ``Deliveries``, what its
``poll`` returns by columns. The Malamute source's reader uses it.

What it returns are deliveries only (``StreamDeliver``, ``MailboxDeliver``, ``ServiceDeliver``); a
CONFIRM from the server goes to ``on_event``.
"""

from __future__ import annotations

import threading
import time
from array import array
from collections import deque
from typing import Callable, Optional, Sequence

from spark_mq.clients.malamute_base import _DRAIN, _DELIVERIES, _MAX_POLL_MS, _checked, _notify, _Status, log
from spark_mq.errors import ConnectionClosedError, RemoteProtocolError
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.malamute.codec import delivery_fields
from spark_mq.protocol.malamute.client import (
    DEFAULT_HEARTBEAT, DEFAULT_SERVER_TIMEOUT, BrokerNotice, ClientConnection, Reply, State,
)
from spark_mq.protocol.malamute.errors import MalamuteBrokerError
from spark_mq.protocol.zmtp import BodyBuffer
from spark_mq.transport.zmtp import ZmtpDealer

DEFAULT_READ_BUFFER = 1 << 20  # bytes read from the socket at a time, at most
# what a delivery held for ``poll`` takes beyond its content, about (the message
# object, its dict and content list, a bytes object per frame: 220 bytes measured for one frame)
_HELD_OVERHEAD = 256


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
             max_bytes: int = 1 << 62, stop: Optional[Callable[[], bool]] = None):
        """Up to ``max_count`` deliveries: waits up to ``timeout`` seconds for the first, then takes
        what follows until ``gap`` seconds pass without one (or ``timeout`` in total), or ``stop()``,
        asked once something is taken, between reads, says to end; empty if none.

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
                if now >= deadline or (out and ((waited and not got) or (stop is not None and stop()))):
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
