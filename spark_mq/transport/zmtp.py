"""A ZMTP 3.0 DEALER over one plain TCP or Unix socket, driven by the caller's thread.

Responsible for: the socket under a ``spark_mq.protocol.zmtp.ZmtpConnection``: a non-blocking
connect to ``tcp://host:port`` or ``ipc://path``, the handshake's bytes, reads into the
connection's buffer, writes of queued messages, and what a libzmq DEALER does when the peer goes
away: drop the connection, connect again every ``reconnect_interval`` seconds for as long as it
takes, and keep the whole messages not yet written for the next connection. Everything happens
inside the caller's calls (``read``, ``wait``, ``send``): no thread of its own, nothing moves
between calls but the kernel's socket buffers. Not responsible for what the messages mean.

Used by the Malamute client layer's ``MalamuteReceiver`` (the Malamute source's reader), where a
pyzmq socket cost more than twice the CPU per message (see ``spark_mq.protocol.zmtp``).

    >>> wire = ZmtpDealer("tcp://127.0.0.1:9999")        # doctest: +SKIP
    >>> wire.send([b"header", b"body"])
    >>> wire.wait(1.0) and wire.read(100)               # [[b"...", b"..."], ...]
"""

from __future__ import annotations

import errno
import logging
import os
import select
import socket
import time
from collections import deque
from enum import Enum
from typing import Optional, Sequence

from spark_mq.errors import ConnectionClosedError, RemoteProtocolError
from spark_mq.protocol.zmtp import DEFAULT_BUFFER, BodyBuffer, Phase, ZmtpConnection, encode_message

log = logging.getLogger("spark_mq.transport.zmtp")

__all__ = ["ZmtpDealer", "parse_endpoint"]

RECONNECT_INTERVAL = 0.1   # seconds between connection attempts (libzmq's ZMQ_RECONNECT_IVL default)
HANDSHAKE_TIMEOUT = 30.0   # seconds a connected peer has to complete the greeting (ZMQ_HANDSHAKE_IVL)
_IN_PROGRESS = (errno.EINPROGRESS, errno.EALREADY, errno.EWOULDBLOCK)
_POLLIN, _POLLOUT = select.POLLIN, select.POLLOUT
_CLOSED = "closed by the peer"
_POLLERR = select.POLLERR | select.POLLHUP | select.POLLNVAL


class State(Enum):
    WAITING = "waiting"        # no socket: the next attempt is due at ``_next_attempt``
    CONNECTING = "connecting"  # a non-blocking connect is under way
    CONNECTED = "connected"    # the socket is up (greeting and handshake, then messages)
    CLOSED = "closed"


def parse_endpoint(endpoint: str) -> tuple:
    """``tcp://host:port`` (``[v6]`` in brackets) or ``ipc://path`` -> (kind, host or path, port)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or not rest:
        raise ConnectionClosedError(f"bad ZeroMQ endpoint {endpoint!r}: expected tcp://host:port or ipc://path")
    if scheme == "ipc":
        # libzmq on Linux: a leading "@" names a socket in the abstract namespace
        return "ipc", "\0" + rest[1:] if rest.startswith("@") else rest, 0
    if scheme != "tcp":
        raise ConnectionClosedError(f"bad ZeroMQ endpoint {endpoint!r}: transport {scheme!r} is not supported "
                                    "here (tcp or ipc)")
    host, sep, port = rest.rpartition(":")
    kind = "tcp"
    if host.startswith("[") and host.endswith("]"):
        host, kind = host[1:-1], "tcp6"
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or host == "*":
        raise ConnectionClosedError(f"bad ZeroMQ endpoint {endpoint!r}: expected tcp://host:port")
    return kind, host, int(port)


class ZmtpDealer:
    """One DEALER connection that reconnects by itself; not thread-safe (one thread drives it)."""

    def __init__(self, endpoint: str, *, reconnect_interval: float = RECONNECT_INTERVAL,
                 handshake_timeout: float = HANDSHAKE_TIMEOUT, buffer_size: int = DEFAULT_BUFFER,
                 max_queued: int = 1000) -> None:
        self.endpoint = endpoint
        self._kind, self._host, self._port = parse_endpoint(endpoint)
        self.reconnect_interval = reconnect_interval
        self.handshake_timeout = handshake_timeout
        self.buffer_size = buffer_size
        self.max_queued = max_queued
        self.state = State.WAITING
        self.connections = 0          # connections that completed the handshake
        self.last_error: Optional[str] = None  # why the last connection (attempt) ended
        self._sock: Optional[socket.socket] = None
        self._poller = None
        self._mask = 0
        self._conn: Optional[ZmtpConnection] = None
        self._control = b""           # the connection's own bytes not yet written (greeting, PONG)
        self._queue: deque = deque()  # encoded messages not yet written whole, kept across connections
        self._written = 0             # bytes of _queue[0] written on this connection
        self._since = 0.0             # when the current state began
        self._next_attempt = 0.0
        self._attempt(time.monotonic())

    # ------------------------------------------------------------ public

    @property
    def ready(self) -> bool:
        """The handshake is done: messages flow."""
        return self._conn is not None and self._conn.phase is Phase.READY

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken out as messages."""
        return self._conn.buffered if self._conn is not None else 0

    def pending(self) -> bool:
        """Data from the peer waits to be read: bytes in the buffer, or in the socket (a zero-time
        poll; an error or hang-up is not data)."""
        if self._conn is not None and self._conn.buffered:
            return True
        return self.state is State.CONNECTED and bool(self._poll(0, _POLLIN, raw=True) & _POLLIN)

    def describe(self) -> str:
        """Where the connection stands, for error messages: the last failure, else the state."""
        if self.last_error:
            return self.last_error
        if self.state is State.CONNECTING:
            return "connect still in progress (no answer from the host)"
        if self.state is State.CONNECTED and not self.ready:
            return "connected, ZMTP handshake not completed"
        return self.state.value

    def send(self, frames: Sequence) -> bool:
        """Queue one message (written now if the socket takes it); False if ``max_queued`` messages
        wait already (the peer is away or slow), and then nothing is queued."""
        if self.state is State.CLOSED:
            raise ConnectionClosedError(f"ZMTP connection to {self.endpoint} is closed")
        if len(self._queue) >= self.max_queued:
            return False
        self._queue.append(encode_message(frames))
        if self.state is State.CONNECTED:
            self._flush()
        return True

    def read(self, max_count: int) -> list:
        """Up to ``max_count`` whole messages that have arrived (lists of ``bytes``), without waiting."""
        out: list = []

        def take(conn: ZmtpConnection) -> bool:
            conn.messages(out, max_count - len(out))
            return len(out) >= max_count

        self._pump(take)
        return out

    def read_columns(self, heads: list, ends, body: BodyBuffer, max_count: int,
                     max_bytes: int = 1 << 62) -> Optional[list]:
        """As ``read``, taking two-frame messages by columns (``ZmtpConnection.columns``: first frames
        to ``heads``, second ones copied into ``body``, where each ends to ``ends``), up to
        ``max_count`` of them, without waiting; reading stops once ``body`` holds ``max_bytes`` (past
        it by at most what one read parsed). Returns the first message of another shape (nothing
        after it taken), else None."""
        other: list = []
        goal = len(heads) + max_count

        def take(conn: ZmtpConnection) -> bool:
            message = conn.columns(heads, ends, body, goal - len(heads))
            if message is not None:
                other.append(message)
                return True
            return len(heads) >= goal or body.fill >= max_bytes

        self._pump(take)
        return other[0] if other else None

    def _pump(self, take) -> None:
        """``take(connection)`` what the buffer holds, then receive and take again until it says it
        has enough (True) or the socket has nothing more, connecting and answering on the way."""
        if self.state is not State.CONNECTED:
            self._progress(time.monotonic())
            if self.state is not State.CONNECTED:
                return
        conn = self._conn
        try:
            was_ready = conn.phase is Phase.READY
            done = take(conn)
            while True:
                if not was_ready and conn.phase is Phase.READY:
                    self.connections += 1
                    self.last_error = None
                if not was_ready or conn.wants_to_send:
                    self._flush()  # greeting answered (queued messages may go now), or a PONG
                    if self.state is not State.CONNECTED:
                        break  # the write found the connection gone: what was parsed is kept
                if done:
                    break
                view = conn.buffer()
                try:
                    got = self._sock.recv_into(view)
                except (BlockingIOError, InterruptedError):
                    break
                finally:
                    view.release()
                if not got:
                    self._lost(_CLOSED, closed=True)
                    break
                conn.received(got)
                was_ready = conn.phase is Phase.READY
                done = take(conn)
            if self.state is State.CONNECTED and not self.ready and \
                    time.monotonic() - self._since > self.handshake_timeout:
                self._lost(f"no ZMTP handshake within {self.handshake_timeout:.0f} s")
        except RemoteProtocolError as exc:
            # once per distinct reason: a peer that refuses us does so on every attempt (10 a second)
            level = logging.DEBUG if str(exc) in (self.last_error or "") else logging.WARNING
            log.log(level, "ZMTP peer at %s broke the protocol, connecting again: %s", self.endpoint, exc)
            self._lost(str(exc))
        except OSError as exc:
            self._lost(f"{type(exc).__name__}: {exc}", closed=isinstance(exc, (ConnectionResetError, BrokenPipeError)))

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for something to read (True) while connecting, handshaking
        and writing as needed; returns early at a state change worth a ``read``."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            now = time.monotonic()
            if self.state is State.CLOSED:
                raise ConnectionClosedError(f"ZMTP connection to {self.endpoint} is closed")
            left = deadline - now
            if self.state is State.WAITING:
                due = self._next_attempt - now
                if due > 0:
                    if due >= left:
                        time.sleep(max(0.0, left))
                        return False
                    time.sleep(due)
                self._attempt(time.monotonic())
                continue
            if left <= 0 and timeout > 0:
                return False
            want = _POLLOUT if self.state is State.CONNECTING or self._control or (self.ready and self._queue) \
                else 0
            if self.state is State.CONNECTED:
                want |= _POLLIN
            events = self._poll(max(0.0, left), want, raw=True)
            if not events:
                return False
            if self.state is State.CONNECTING:
                self._progress(time.monotonic())
                continue
            if events & _POLLOUT:
                self._flush()
            if events & (_POLLIN | _POLLERR):
                return True
            if timeout <= 0:
                return False

    def close(self) -> None:
        """Close the socket; what is queued and not yet written is dropped. Idempotent."""
        self._drop()
        self._queue.clear()
        self.state = State.CLOSED

    # ------------------------------------------------------------ connecting

    def _progress(self, now: float) -> None:
        if self.state is State.WAITING and now >= self._next_attempt:
            self._attempt(now)
        if self.state is State.CONNECTING:
            if self._poll(0, _POLLOUT):  # connected, or refused (POLLERR with SO_ERROR set)
                err = self._sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._failed(f"connect: {_strerror(err)}")
                else:
                    self._connected(now)
            elif now - self._since > self.handshake_timeout:
                self._failed(f"connect: no answer within {self.handshake_timeout:.0f} s")

    def _attempt(self, now: float) -> None:
        """Start one non-blocking connect."""
        self._drop()
        try:
            if self._kind == "ipc":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                address = self._host
            else:
                # IPv4 unless the endpoint is an IPv6 literal, as libzmq (ZMQ_IPV6 off): "localhost"
                # may resolve to ::1 first while the broker listens on 0.0.0.0 or 127.0.0.1
                family = socket.AF_INET6 if self._kind == "tcp6" else socket.AF_INET
                address = socket.getaddrinfo(self._host, self._port, family, socket.SOCK_STREAM)[0][4]
                sock = socket.socket(family, socket.SOCK_STREAM)
        except OSError as exc:
            self._failed(f"{type(exc).__name__}: {exc}")
            return
        sock.setblocking(False)
        self._sock = sock
        self._poller = select.poll()
        self._mask = 0
        err = sock.connect_ex(address)
        self._since = now
        if err == 0:
            self._connected(now)
        elif err in _IN_PROGRESS:
            self.state = State.CONNECTING
        else:
            self._failed(f"connect: {_strerror(err)}")

    def _connected(self, now: float) -> None:
        if self._kind != "ipc":
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.state = State.CONNECTED
        self._since = now
        self._conn = ZmtpConnection(buffer_size=self.buffer_size)
        self._written = 0
        self._flush()  # takes the connection's greeting and READY first

    def _failed(self, why: str) -> None:
        """A connection attempt failed: try again after the interval."""
        self.last_error = why
        self._drop()
        self.state = State.WAITING
        self._next_attempt = time.monotonic() + self.reconnect_interval

    def _lost(self, why: str, closed: bool = False) -> None:
        if self.ready:
            log.info("ZMTP connection to %s lost (%s); connecting again", self.endpoint, why)
        elif self._conn is not None:
            # libzmq drops a peer whose mechanism or socket type it refuses, often before it has
            # sent what would tell us which
            seen = "its READY" if self._conn.phase is Phase.HANDSHAKE else "its greeting"
            why = (f"ZMTP handshake failed before {seen}: {why} (a peer that wants PLAIN or CURVE security, "
                   f"or no DEALER, closes like this)" if closed else f"ZMTP handshake failed: {why}")
        self._failed(why)

    def _drop(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = self._poller = self._conn = None
        self._control = b""
        self._written = 0  # a message cut off mid-write goes again, whole, on the next connection

    # ------------------------------------------------------------ writing and polling

    def _flush(self) -> None:
        """Write what the socket takes: the connection's own bytes (greeting, READY, PONGs) between
        messages only, never inside one cut off by a full socket buffer; queued messages once the
        handshake is done."""
        sock, queue = self._sock, self._queue
        try:
            while sock is not None:
                if self._written == 0:
                    conn = self._conn
                    if conn is not None and conn.wants_to_send:
                        self._control += conn.data_to_send()
                    if self._control:
                        sent = sock.send(self._control)
                        self._control = self._control[sent:]
                        continue
                if not queue or not self.ready:
                    return
                head = queue[0]
                self._written += sock.send(memoryview(head)[self._written:])
                if self._written == len(head):
                    queue.popleft()
                    self._written = 0
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            self._lost(f"{type(exc).__name__}: {exc}", closed=isinstance(exc, (ConnectionResetError, BrokenPipeError)))

    def _poll(self, timeout: float, want: int, raw: bool = False):
        """poll(2) on the socket for ``want`` (seconds; 0 = look only). ``raw``: the event mask."""
        if self._sock is None or not want:
            if timeout > 0:
                time.sleep(timeout)
            return 0 if raw else False
        if want != self._mask:
            if self._mask:
                self._poller.modify(self._sock, want)
            else:
                self._poller.register(self._sock, want)
            self._mask = want
        try:
            events = self._poller.poll(int(timeout * 1000 + 0.999) if timeout > 0 else 0)
        except InterruptedError:
            events = []
        mask = 0
        for _, ev in events:
            mask |= ev
        return mask if raw else bool(mask & (want | _POLLERR))


def _strerror(err: int) -> str:
    return f"{errno.errorcode.get(err, str(err))} ({os.strerror(err)})"
