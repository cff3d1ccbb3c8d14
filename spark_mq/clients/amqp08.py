"""Blocking AMQP 0-8 client: a connection facade over the sans-IO state machine and StreamDriver.

The reader thread (``spark_mq.transport.stream``) feeds the state machine, answers heartbeats,
channel.flow and broker closes on its own, so a connection stays healthy while the application
does nothing (for example while Spark leaves a generator suspended). Application threads call the
``Channel`` methods, which queue frames, write them, and wait (always with a timeout) for the reply.

Flow control towards the application: deliveries queued for ``next_message``/``drain`` are held
up to ``max_buffered_messages`` and ``max_buffered_bytes`` (of bodies) per connection; past that
the reader leaves the socket unread, so TCP fills and the broker stops sending (this bounds a
no-ack consumer, which no prefetch does), until the application takes some. While a call waits
for its reply (which may be queued behind those deliveries) the reader reads on past the bound.

Broker errors surface as the generated exception classes (``NotFoundError``...): a soft error
closes only its channel and leaves the connection usable; a hard one closes the connection and
every waiter gets it. Nothing here blocks forever: every wait has a deadline and is woken when the
connection dies.

This module holds the ``Connection`` (reader-thread callbacks, dispatch of the state machine's events,
flow control towards the application) and is the client's facade; ``Channel``, ``Message`` and
``TimeoutError`` live in ``spark_mq.clients.amqp08_channel`` and are importable from here.

Example::

    with Connection.from_url("amqp://guest:guest@127.0.0.1:5672/%2F") as conn:
        ch = conn.channel()
        ch.queue_declare("jobs", durable=True)
        ch.basic_publish("", "jobs", b"hello", BasicProperties(delivery_mode=2))
        msg = ch.basic_get("jobs")
        ch.basic_ack(msg.delivery_tag)
"""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Optional
from urllib.parse import unquote, urlsplit

from spark_mq.clients.amqp08_channel import (
    _ACK, _NACK, DEFAULT_TIMEOUT, Channel, Message, TimeoutError, _monotonic, _new_message,
)
from spark_mq.errors import ConnectionClosedError, LocalProtocolError, RemoteProtocolError, SparkMqError
from spark_mq.protocol.amqp08 import spec
from spark_mq.protocol.amqp08.connection import Connection as ProtocolConnection
from spark_mq.protocol.amqp08.errors import AuthenticationError, ConnectionRedirect, ProtocolRefused
from spark_mq.protocol.amqp08.events import (
    ChannelClosed,
    ChannelOpened,
    ConnectionClosed,
    ConnectionOpened,
    ConnectionRedirected,
    ConnState,
    ContentReceived,
    FlowChanged,
    MethodReceived,
)
from spark_mq.protocol.amqp08.spec import BasicProperties
from spark_mq.transport.stream import StreamDriver, TlsOptions, open_socket

__all__ = ["Connection", "Channel", "Message", "BasicProperties", "TimeoutError", "parse_url", "DEFAULT_TIMEOUT"]

#: Deliveries a connection holds for the application (not yet taken) before it stops reading.
DEFAULT_MAX_BUFFERED_MESSAGES = 10_000
#: Body bytes of those deliveries before it stops reading.
DEFAULT_MAX_BUFFERED_BYTES = 16 << 20
#: basic.ack and basic.nack (0-9-1) from the broker: publisher confirms
_CONFIRMS = frozenset((_ACK, _NACK))


def parse_url(url: str) -> dict:
    """``amqp[s]://user:pass@host:port/vhost`` -> keyword arguments for ``Connection``."""
    parts = urlsplit(url)
    if parts.scheme not in ("amqp", "amqps"):
        raise LocalProtocolError(f"AMQP URL must start with amqp:// or amqps://, got scheme {parts.scheme!r}")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    kwargs = {
        "host": parts.hostname or "localhost",
        "port": parts.port or (5671 if parts.scheme == "amqps" else spec.DEFAULT_PORT),
        "username": unquote(parts.username) if parts.username else "guest",
        "password": unquote(parts.password) if parts.password else "guest",
        "virtual_host": unquote(path) if path else "/",
    }
    if parts.scheme == "amqps":
        kwargs["tls"] = TlsOptions()
    return kwargs


#: the values of ``Connection(protocol=...)`` and of the amqp08 format's option ``protocol``
PROTOCOLS = ("0-8", "0-9-1", "auto")


def _methods_for(tables, dialect: str) -> SimpleNamespace:
    """``methods.BasicConsume`` and the like: the class to send for each method name of ``tables``;
    RabbitMQ's 0-8 classes (``RabbitBasicConsume``...) under the names of the spec's they replace."""
    names = {cls.__name__: cls for cls in tables.METHODS_BY_NAME.values()}
    if dialect == "rabbitmq":
        names.update({cls.__name__[len("Rabbit"):]: cls for cls in tables.RABBITMQ_METHODS.values()})
    return SimpleNamespace(**names)


class Connection:
    """A blocking AMQP 0-8 or 0-9-1 connection. Thread-safe; channels may be used from different threads."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = spec.DEFAULT_PORT,
        *,
        username: str = "guest",
        password: str = "guest",
        virtual_host: str = "/",
        heartbeat: Optional[int] = 60,
        frame_max: int = 131072,
        channel_max: int = 0,
        mechanism: str = "PLAIN",
        tls: Optional[TlsOptions] = None,
        connect_timeout: float = 10.0,
        client_properties: Optional[dict] = None,
        insist: bool = False,
        dialect: str = "auto",
        max_buffered_messages: Optional[int] = DEFAULT_MAX_BUFFERED_MESSAGES,
        max_buffered_bytes: Optional[int] = DEFAULT_MAX_BUFFERED_BYTES,
        protocol: str = "0-8",
    ) -> None:
        """``max_buffered_messages``/``max_buffered_bytes``: what the connection holds of deliveries
        not yet taken before its reader stops reading the socket (None: no bound); the reader may
        pass them by one socket read (256 KiB), or by what arrives while a call waits for a reply.
        ``protocol``: "0-8", "0-9-1", or "auto" (offer 0-9-1; offer 0-8 on a new socket only when the
        broker answers 0-9-1's header with 0-8's). A broker that speaks neither fails with
        ``ProtocolRefused``, naming what it speaks."""
        if dialect not in ("auto", "spec", "rabbitmq"):
            raise LocalProtocolError(f"dialect must be auto, spec or rabbitmq, not {dialect!r}")
        if protocol not in PROTOCOLS:
            raise LocalProtocolError(f"protocol must be one of {', '.join(PROTOCOLS)}, not {protocol!r}")
        try:
            self._open(host, port, username, password, virtual_host, heartbeat, frame_max, channel_max,
                       mechanism, tls, connect_timeout, client_properties, insist, dialect, max_buffered_messages,
                       max_buffered_bytes, "0-9-1" if protocol == "auto" else protocol)
        except ProtocolRefused as exc:
            if protocol != "auto" or exc.fits != "0-8":
                raise
            self._open(host, port, username, password, virtual_host, heartbeat, frame_max, channel_max,
                       mechanism, tls, connect_timeout, client_properties, insist, dialect, max_buffered_messages,
                       max_buffered_bytes, "0-8")

    def _open(self, host, port, username, password, virtual_host, heartbeat, frame_max, channel_max, mechanism,
              tls, connect_timeout, client_properties, insist, dialect, max_buffered_messages, max_buffered_bytes,
              protocol: str) -> None:
        self.host = host
        self.port = port
        self.virtual_host = virtual_host
        self._proto = ProtocolConnection(
            username, password, virtual_host, mechanism=mechanism, heartbeat=heartbeat, frame_max=frame_max,
            channel_max=channel_max, client_properties=client_properties, insist=insist, protocol=protocol,
        )
        #: the protocol version spoken ("0-8" or "0-9-1") and its generated tables
        self.protocol = protocol
        self.spec = self._proto.spec
        self._deliver_cls = self.spec.BasicDeliver
        self._lock = threading.RLock()
        self._cv = threading.Condition(self._lock)
        self._channels: dict[int, Channel] = {}
        self._error: Optional[BaseException] = None
        self._closed = False
        self._redirect: Optional[ConnectionRedirected] = None
        self.server_properties: dict = {}
        # Deliveries held for the application: counted in by the reader (under the lock), out by
        # whoever takes them (under _take_lock); each counter has one kind of writer.
        for name, bound in (("max_buffered_messages", max_buffered_messages),
                            ("max_buffered_bytes", max_buffered_bytes)):
            if bound is not None and bound < 1:
                raise LocalProtocolError(f"{name} must be at least 1 (or None for no bound), not {bound!r}")
        self.max_buffered_messages = max_buffered_messages
        self.max_buffered_bytes = max_buffered_bytes
        self._in_msgs = self._in_bytes = 0
        self._out_msgs = self._out_bytes = 0
        self._take_lock = threading.Lock()
        self._awaiting = 0  # calls waiting for a reply: the reader reads past the bound meanwhile
        bounded = max_buffered_messages is not None or max_buffered_bytes is not None
        sock = open_socket(host, port, timeout=connect_timeout, tls=tls)
        self._driver = StreamDriver(sock, on_data=self._on_data, on_closed=self._on_closed,
                                    on_tick=self._on_tick, tick_interval=_tick_for(heartbeat),
                                    name=f"amqp08-reader-{host}:{port}",
                                    may_read=self._may_read if bounded else None)
        with self._lock:
            self._driver.send(self._proto.initiate())
            self._proto.note_sent(_monotonic())
        self._driver.start()
        deadline = _monotonic() + connect_timeout
        with self._cv:
            while self._proto.state is not ConnState.OPEN and self._error is None and self._redirect is None:
                left = deadline - _monotonic()
                if left <= 0:
                    self._driver.abort(TimeoutError("handshake timed out"))
                    raise TimeoutError(
                        f"AMQP handshake with {host}:{port} did not finish in {connect_timeout}s "
                        f"(state {self._proto.state.value})"
                    )
                self._cv.wait(left)
        if self._redirect is not None:
            self._driver.close()
            raise ConnectionRedirect(self._redirect.host, self._redirect.known_hosts)
        if self._error is not None:
            self._driver.close()
            raise self._error
        if dialect == "auto":
            dialect = "rabbitmq" if self.server_properties.get("product") == "RabbitMQ" else "spec"
        #: "rabbitmq": speak RabbitMQ's 0-8 (specs/amqp0-8-rabbitmq.xml) where it differs from the spec
        #: (0-9-1's tables are RabbitMQ's own already)
        self.dialect = dialect
        #: the method classes this connection sends, by the spec's names: 0-8's RabbitMQ dialect where it
        #: applies (basic.consume without arguments, the synchronous basic.recover, queue.unbind)
        self.methods = _methods_for(self.spec, dialect)

    @classmethod
    def from_url(cls, url: str, **kwargs) -> "Connection":
        params = parse_url(url)
        params.update(kwargs)
        return cls(**params)

    def __repr__(self) -> str:
        return f"<amqp08.Connection {self.host}:{self.port} vhost={self.virtual_host!r} {self._proto.state.value}>"

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def is_open(self) -> bool:
        return self._proto.state is ConnState.OPEN and self._error is None

    @property
    def frame_max(self) -> int:
        return self._proto.frame_max

    @property
    def heartbeat(self) -> int:
        return self._proto.heartbeat

    @property
    def channel_max(self) -> int:
        return self._proto.channel_max

    @property
    def buffered_messages(self) -> int:
        """Deliveries received on every channel and not yet taken (``next_message``, ``drain``)."""
        return max(0, self._in_msgs - self._out_msgs)

    @property
    def buffered_bytes(self) -> int:
        """Body bytes of those deliveries."""
        return max(0, self._in_bytes - self._out_bytes)

    @property
    def reading_paused(self) -> bool:
        """The reader leaves the socket unread: the application holds the bound untaken."""
        return self._driver.reading_paused

    # -- flow control towards the application ----------------------------------------------------

    def _may_read(self) -> bool:
        """Asked by the reader before each read: room for more deliveries, or a reply awaited (it
        may be queued behind deliveries nobody takes yet), or the connection is ending."""
        if self._awaiting or self._closed:
            return True
        bound = self.max_buffered_messages
        if bound is not None and self._in_msgs - self._out_msgs >= bound:
            return False
        bound = self.max_buffered_bytes
        return bound is None or self._in_bytes - self._out_bytes < bound

    def _took(self, count: int, nbytes: int) -> None:
        with self._take_lock:
            self._out_msgs += count
            self._out_bytes += nbytes
        driver = self._driver
        if driver.reading_paused:
            # wake the reader once half the bound is free: it then reads in large pieces again
            m, b = self.max_buffered_messages, self.max_buffered_bytes
            if (m is None or self._in_msgs - self._out_msgs <= m // 2) and \
                    (b is None or self._in_bytes - self._out_bytes <= b // 2):
                driver.resume_reading()

    def _wait_reply(self, timeout: float) -> None:
        """``_cv.wait`` for a reply from the broker (caller holds the lock): the reader reads on
        past the bound meanwhile, since the reply may be queued behind unread deliveries."""
        self._awaiting += 1
        try:
            if self._driver.reading_paused:
                self._driver.resume_reading()
            self._cv.wait(timeout)
        finally:
            self._awaiting -= 1

    # -- reader-thread callbacks ------------------------------------------------------------------

    def _flush(self) -> None:
        """Write what the state machine queued. Caller holds the lock."""
        data = self._proto.data_to_send()
        if data:
            self._driver.send(data)
            self._proto.note_sent(_monotonic())

    def _on_data(self, data: bytes) -> None:
        with self._lock:
            try:
                events = self._proto.receive_data(data, _monotonic())
            except ProtocolRefused:
                raise  # the broker speaks another protocol: nothing of ours to tell it (and it hung up)
            except RemoteProtocolError as exc:
                # tell the broker why before the driver drops the socket (best effort)
                try:
                    self._proto.protocol_error(exc)
                    self._flush()
                except (ConnectionClosedError, LocalProtocolError):
                    pass
                raise
            self._flush()
            if events:
                self._dispatch(events)
                self._cv.notify_all()

    def _dispatch(self, events) -> None:
        channels = self._channels
        deliver_cls = self._deliver_cls
        held = nbytes = 0  # deliveries queued for the application by this read
        for ev in events:
            kind = type(ev)
            if kind is ContentReceived:
                ch = channels.get(ev[0])
                if ch is not None:
                    method = ev[1]
                    if type(method) is deliver_cls:  # the common case, inline
                        callbacks = ch._callbacks
                        callback = callbacks.get(method.consumer_tag) if callbacks else None
                        if callback is None:
                            ch._deliveries.append(_new_message(Message, (ev, ch)))
                            held += 1
                            nbytes += len(ev[3])
                        else:
                            callback(_new_message(Message, (ev, ch)))
                    elif ch._on_content(ev):
                        held += 1
                        nbytes += len(ev[3])
            elif kind is MethodReceived:
                ch = channels.get(ev.channel)
                if ch is not None:
                    if ch._pending_callback is not None and type(ev.method) is self.spec.BasicConsumeOk:
                        # register before any later event of this batch: the consumer's first
                        # deliveries may follow consume-ok in the same read
                        ch._callbacks[ev.method.consumer_tag] = ch._pending_callback
                        ch._pending_callback = None
                    if ch.confirming and ev.method.INDEX in _CONFIRMS:
                        ch._on_confirm(ev.method)  # a publisher confirm, not a reply to a call
                        continue
                    ch._replies.append(ev.method)
            elif kind is ChannelOpened:
                ch = channels.get(ev.channel)
                if ch is not None:
                    ch._opened = True
            elif kind is ChannelClosed:
                ch = channels.pop(ev.channel, None)
                if ch is not None:
                    ch._closed_by(ev.error)
            elif kind is FlowChanged:
                ch = channels.get(ev.channel)
                if ch is not None:
                    ch.flow_active = ev.active
            elif kind is ConnectionOpened:
                self.server_properties = ev.server_properties
            elif kind is ConnectionRedirected:
                self._redirect = ev
            elif kind is ConnectionClosed:
                if ev.error is not None:
                    self._error = ev.error
                self._closed = True
                self._driver.close()
        if held:
            self._in_msgs += held
            self._in_bytes += nbytes

    def _on_tick(self, now: float) -> None:
        with self._lock:
            if self._driver.reading_paused:
                # we are not reading, by choice: the broker's frames wait in the socket unread, so
                # its silence says nothing about it (our heartbeats still go out, below)
                self._proto.note_received(now)
            self._proto.tick(now)  # raises HeartbeatTimeout: the driver then ends the connection
            self._flush()

    def _on_closed(self, exc: Optional[BaseException]) -> None:
        with self._cv:
            if exc is not None and self._error is None:
                if self._proto.state is ConnState.AWAIT_TUNE:
                    exc = AuthenticationError(
                        403, f"broker closed the connection after start-ok: check username/password ({exc})")
                elif not isinstance(exc, SparkMqError):
                    exc = ConnectionClosedError(f"connection to {self.host}:{self.port} failed: {exc!r}")
                self._error = exc
            elif self._error is None and not self._closed and self._proto.state is not ConnState.CLOSED:
                self._error = ConnectionClosedError(f"connection to {self.host}:{self.port} was closed")
            self._closed = True
            for ch in list(self._channels.values()):
                ch._closed_by(self._error or ConnectionClosedError("connection closed"))
            self._cv.notify_all()

    # -- application API ---------------------------------------------------------------------

    def _check(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed:
            raise ConnectionClosedError("connection is closed")

    def channel(self, number: Optional[int] = None, timeout: float = DEFAULT_TIMEOUT) -> "Channel":
        """Open a channel and wait for channel.open-ok."""
        with self._cv:
            self._check()
            n = self._proto.open_channel(number)
            ch = Channel(self, n)
            self._channels[n] = ch
            self._flush()
            deadline = _monotonic() + timeout
            while not ch._opened:
                if ch._error is not None:
                    raise ch._error
                self._wait(deadline, "channel.open-ok")
        return ch

    def _wait(self, deadline: float, what: str) -> None:
        """Wait on the condition once; raise if the connection died or the deadline passed."""
        self._check()
        left = deadline - _monotonic()
        if left <= 0:
            raise TimeoutError(f"no {what} from the broker within the timeout")
        self._wait_reply(left)
        self._check()

    def close(self, timeout: float = 10.0) -> None:
        """Close politely (connection.close, wait for close-ok), then the socket."""
        with self._cv:
            if not self._closed and self._error is None and self._proto.state is ConnState.OPEN:
                try:
                    self._proto.close()
                    self._flush()
                    deadline = _monotonic() + timeout
                    while not self._closed and self._error is None and _monotonic() < deadline:
                        self._wait_reply(deadline - _monotonic())
                except ConnectionClosedError:
                    pass
            self._closed = True
        self._driver.close()


def _tick_for(heartbeat: Optional[int]) -> float:
    """The reader's tick: often enough to send heartbeats on time (a quarter interval), at most 1 s."""
    if not heartbeat:
        return 1.0
    return max(0.05, min(1.0, heartbeat / 4))
