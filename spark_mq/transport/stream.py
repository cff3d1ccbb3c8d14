"""Blocking TCP/TLS byte-stream driver shared by the AMQP and STOMP clients.

Owns the socket, a reader thread and a periodic tick. It knows nothing of any protocol:
bytes read are handed to ``on_data`` (on the reader thread), ``on_tick(now)`` runs on the
reader thread at least every ``tick_interval`` seconds even when nothing arrives (so a
protocol can send heartbeats while the application is busy or idle), and ``on_closed(exc)``
runs exactly once when the stream ends, with ``None`` for a clean local close. If ``on_data``
or ``on_tick`` raises, the socket is closed and ``on_closed`` gets that exception.

Flow control towards the application: with ``may_read``, the reader asks it before every read;
while it says no (the protocol holds as much as it may of what the application has not taken),
the reader leaves the socket unread, so TCP fills and the peer stops sending, and only ticks.
``resume_reading`` wakes it at once (the protocol calls it when the application takes messages
or starts waiting for a reply); it also looks again every tick.

TLS: an OpenSSL connection must not be read and written by two threads at once, so with TLS
the socket is non-blocking and every SSL read or write happens under one lock, the reader
waiting for readability with ``select`` outside it. Plain TCP sockets need no such lock.

It must not parse frames or hold protocol state.
"""

from __future__ import annotations

import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

from spark_mq.errors import ConnectionClosedError

_READ_SIZE = 256 * 1024
#: with ``gather``: a read smaller than this is followed by a pause of ``_GATHER_WAIT`` before the next.
#: A broker that writes each delivery as it goes (RabbitMQ's STOMP adapter) to a consumer that keeps up
#: gives a read per message or two, and each read wakes the reader and the thread taking the messages:
#: measured with 4 STOMP connections in one process draining RabbitMQ, 1.09 voluntary context switches
#: and 30 us of CPU per message, against 0.24 and 12 us with one connection; with the pause, 0.21 and
#: 15 us (a probe without Spark: bench/HISTORY.md; ``bench lanes``: docs/performance.md, "Lanes"). The pause
#: costs a delivery at most 1 ms.
_GATHER_BELOW = 4096
_GATHER_WAIT = 0.001
_TLS_RETRY = (ssl.SSLWantReadError, ssl.SSLWantWriteError)


@dataclass(frozen=True)
class TlsOptions:
    """TLS settings. ``verify=False`` disables certificate and host name checks."""

    ca_file: Optional[str] = None
    cert_file: Optional[str] = None
    key_file: Optional[str] = None
    verify: bool = True
    server_hostname: Optional[str] = None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        if not self.verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, KEEPALIVE_COUNT = 30, 10, 3


def open_socket(host: str, port: int, *, timeout: float, tls: Optional[TlsOptions] = None) -> socket.socket:
    """Connect (and TLS-handshake) within ``timeout`` seconds or raise ``ConnectionClosedError``."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise ConnectionClosedError(f"cannot connect to {host}:{port}: {exc}") from exc
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        # STOMP 1.0 has no heartbeat: a broker host that vanished without a reset (power, a network
        # partition) would keep a consumer "connected" to silence for the kernel's default 2 h 11 min
        # before the first probe fails. Probes after 30 s idle, every 10 s, 3 lost: gone in about 60 s.
        for name, value in (("TCP_KEEPIDLE", KEEPALIVE_IDLE), ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
                            ("TCP_KEEPCNT", KEEPALIVE_COUNT)):
            if hasattr(socket, name):  # Linux; other systems keep their defaults
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
        if tls is not None:
            sock = tls.context().wrap_socket(sock, server_hostname=tls.server_hostname or host)
    except (OSError, ssl.SSLError) as exc:
        sock.close()
        raise ConnectionClosedError(f"TLS handshake with {host}:{port} failed: {exc}") from exc
    return sock


class StreamDriver:
    """A connected socket plus a reader thread that feeds bytes to a protocol.

    ``send`` is thread-safe and writes all bytes or raises ``ConnectionClosedError``.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        on_data: Callable[[bytes], None],
        on_closed: Callable[[Optional[BaseException]], None],
        on_tick: Optional[Callable[[float], None]] = None,
        tick_interval: float = 1.0,
        name: str = "spark-mq-reader",
        may_read: Optional[Callable[[], bool]] = None,
        gather: Optional[Callable[[], bool]] = None,
    ) -> None:
        self._sock = sock
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._ssl_lock = threading.Lock()  # TLS only: one SSL call at a time
        self._on_data = on_data
        self._on_closed = on_closed
        self._on_tick = on_tick
        self._tick_interval = tick_interval
        self._send_lock = threading.Lock()
        self._closing = False
        self._closed_once = threading.Lock()
        self._closed = False
        self._may_read = may_read
        self._gather = gather  # asked after a small read: whether to let more bytes arrive before the next
        self._wake = threading.Event()
        #: the reader leaves the socket unread because ``may_read`` said no (read by the protocol:
        #: whoever frees room wakes it, and missed heartbeats are not the peer's while it is set)
        self.reading_paused = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.last_send = time.monotonic()
        self.last_recv = time.monotonic()

    def start(self) -> None:
        if self._tls:
            self._sock.setblocking(False)
        else:
            self._sock.settimeout(self._tick_interval)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return not self._closed

    def send(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise ConnectionClosedError("connection is closed")
        try:
            with self._send_lock:
                if self._tls:
                    self._send_tls(memoryview(data))
                else:
                    self._send_plain(memoryview(data))
                self.last_send = time.monotonic()
        except OSError as exc:
            self._finish(ConnectionClosedError(f"send failed: {exc}"))
            raise ConnectionClosedError(f"send failed: {exc}") from exc

    def _send_plain(self, view: memoryview) -> None:
        # the socket timeout is the reader's tick: a peer that stops reading for longer than
        # that makes send raise socket.timeout, so keep trying until the connection closes
        while view:
            try:
                sent = self._sock.send(view)
            except socket.timeout:
                if self._closed:
                    raise ConnectionClosedError("connection closed while sending") from None
                continue
            view = view[sent:]

    def _send_tls(self, view: memoryview) -> None:
        sock = self._sock
        while view:
            with self._ssl_lock:
                try:
                    sent = sock.send(view[:65536])
                except _TLS_RETRY:
                    sent = 0
            if sent:
                view = view[sent:]
                continue
            if self._closed:
                raise ConnectionClosedError("connection closed while sending")
            select.select([], [sock], [], self._tick_interval)

    def resume_reading(self) -> None:
        """Wake a reader that waits for ``may_read`` or ``gather`` (harmless when it does not)."""
        self._wake.set()

    def close(self) -> None:
        """Close the socket locally; ``on_closed(None)`` runs once."""
        self._closing = True
        self._close_socket()
        self._finish(None)
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def abort(self, exc: BaseException) -> None:
        """Drop the connection because of ``exc`` (for example a missed heartbeat)."""
        self._closing = True
        self._close_socket()
        self._finish(exc)
        self._wake.set()

    def _close_socket(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _finish(self, exc: Optional[BaseException]) -> None:
        with self._closed_once:
            if self._closed:
                return
            self._closed = True
        self._on_closed(exc)

    def _recv_tls(self):
        """One read: bytes, b"" at end of stream, or None when nothing arrived within the tick."""
        sock = self._sock
        with self._ssl_lock:
            try:
                return sock.recv(_READ_SIZE)
            except _TLS_RETRY:
                pass
        readable, _, _ = select.select([sock], [], [], self._tick_interval)
        if not readable:
            return None
        with self._ssl_lock:
            try:
                return sock.recv(_READ_SIZE)
            except _TLS_RETRY:
                return None

    def _run(self) -> None:
        recv = self._recv_tls if self._tls else self._recv_plain
        may_read = self._may_read
        gather = self._gather
        on_tick = self._on_tick
        wake = self._wake
        next_tick = time.monotonic() + self._tick_interval
        try:
            while not self._closed:
                if may_read is not None and not may_read():
                    # Announce the pause before looking again, so whoever frees room after our
                    # look sees the flag and wakes us (a missed wake costs one tick at most).
                    self.reading_paused = True
                    wake.clear()
                    if not may_read():
                        wake.wait(self._tick_interval)
                        data = None
                    else:
                        self.reading_paused = False
                        data = recv()
                else:
                    self.reading_paused = False
                    data = recv()
                if data is not None:
                    if not data:
                        self._closing_done(None if self._closing else ConnectionClosedError("connection closed by peer"))
                        return
                    self.last_recv = time.monotonic()
                    self._on_data(data)
                    if gather is not None and len(data) < _GATHER_BELOW and gather():
                        wake.clear()  # set by resume_reading: a caller that needs the next bytes now
                        if gather():
                            wake.wait(_GATHER_WAIT)
                if on_tick is not None:
                    now = time.monotonic()
                    if now >= next_tick:
                        next_tick = now + self._tick_interval
                        on_tick(now)
        except OSError as exc:
            self._closing_done(None if self._closing else ConnectionClosedError(f"connection lost: {exc}"))
        except BaseException as exc:  # a protocol error raised by on_data/on_tick ends the connection
            self._closing_done(exc)

    def _recv_plain(self):
        try:
            return self._sock.recv(_READ_SIZE)
        except socket.timeout:
            return None

    def _closing_done(self, exc: Optional[BaseException]) -> None:
        self._closing = True
        self._close_socket()
        self._finish(exc)
