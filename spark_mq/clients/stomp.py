"""Blocking STOMP 1.0 client: the sans-IO ``StompSession`` driven over ``StreamDriver`` (TCP/TLS,
reader thread), with a small synchronous API.

    with StompClient("127.0.0.1", 61613, login="guest", passcode="guest") as c:
        c.subscribe("/queue/a", ack="client", prefetch=100)
        c.send("/queue/a", b"\\x00binary\\x00")
        msg = c.receive(timeout=5)
        c.ack(msg)

Threads: the reader thread parses frames and queues MESSAGE frames for ``receive``; calls from
the application serialise on a write lock.  The session lock is never held while writing to the
socket, so a broker that blocks on a full socket cannot deadlock us against our own reader.

Loses nothing: ``disconnect`` first settles open transactions (abort by default, what RabbitMQ
and ActiveMQ do anyway, made explicit), then sends DISCONNECT with a receipt and waits
for it, so every frame sent before was processed; messages already received stay readable with
``receive`` after the disconnect.  An ERROR frame is raised as ``StompError`` to the call waiting
for the receipt it names, or (no receipt-id) to every waiter and the next call.

Bounded: MESSAGE frames queued for ``receive`` are held up to ``max_buffered_messages`` and
``max_buffered_bytes`` (of bodies); past that the reader leaves the socket unread, so TCP fills and
the broker stops sending (the only bound on an ack:auto subscription, which has no prefetch), until
the application takes some.  While a call waits for its RECEIPT (which may be queued behind those
messages) the reader reads on past the bound.  The inbox and its bound are ``stomp_inbox.Inbox``.

It must not parse frames itself or know socket details beyond ``spark_mq.transport.stream``.

Over 500 lines on purpose: what stays here is one connection's frames out (coalesced writes, receipts,
transactions) and in (dispatch, errors, close), all ordered by the session lock and the write lock;
split, that lock discipline, which keeps the client from deadlocking against its own reader, could
no longer be read in one place.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, List, Optional, Union
from urllib.parse import unquote, urlsplit

from spark_mq.clients.stomp_inbox import Inbox
from spark_mq.errors import ConnectionClosedError, OptionError
from spark_mq.protocol.stomp10 import (
    DEFAULT_MAX_FRAME_SIZE,
    AckMode,
    BrokerProfile,
    Command,
    Frame,
    Header,
    IncompleteFrameError,
    StompError,
    StompLocalProtocolError,
    StompRemoteProtocolError,
    StompSession,
)
from spark_mq.protocol.stomp10._session import Body, State
from spark_mq.transport.stream import StreamDriver, TlsOptions, open_socket

DEFAULT_PORT = 61613
DEFAULT_TIMEOUT = 30.0
#: Seconds a plain ``send`` may wait in the write buffer for more frames to share its write.
DEFAULT_LINGER = 0.002
#: Buffered SEND bytes that trigger a write at once.
WRITE_BATCH_BYTES = 256 * 1024
#: MESSAGE frames the client holds for ``receive`` (not yet taken) before it stops reading.
DEFAULT_MAX_BUFFERED_MESSAGES = 10_000
#: Body bytes of those frames before it stops reading.
DEFAULT_MAX_BUFFERED_BYTES = 16 << 20

#: What ``disconnect`` does with transactions still open.
ON_OPEN_TRANSACTION = ("abort", "commit", "error")

_URI_SCHEMES = {"stomp": False, "stomp+ssl": True, "stomp+tls": True}


class _Waiter:
    __slots__ = ("event", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.error: Optional[BaseException] = None


class StompClient:
    """A STOMP 1.0 connection.  Call ``connect()`` (or use ``with``) before anything else."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        login: Optional[str] = None,
        passcode: Optional[str] = None,
        tls: Optional[TlsOptions] = None,
        timeout: float = DEFAULT_TIMEOUT,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        broker: Optional[BrokerProfile] = None,
        connect_headers: Optional[dict] = None,
        virtual_host: Optional[str] = None,
        on_open_transaction: str = "abort",
        linger: float = DEFAULT_LINGER,
        max_buffered_messages: Optional[int] = DEFAULT_MAX_BUFFERED_MESSAGES,
        max_buffered_bytes: Optional[int] = DEFAULT_MAX_BUFFERED_BYTES,
    ) -> None:
        """``max_buffered_messages``/``max_buffered_bytes``: what the client holds of MESSAGE frames
        not yet taken before its reader stops reading the socket (None: no bound); the reader may
        pass them by one socket read (256 KiB), or by what arrives while a call waits for a receipt."""
        for name, bound in (("max_buffered_messages", max_buffered_messages),
                            ("max_buffered_bytes", max_buffered_bytes)):
            if bound is not None and bound < 1:
                raise OptionError(f"{name} must be at least 1 (or None for no bound), not {bound!r}")
        if on_open_transaction not in ON_OPEN_TRANSACTION:
            raise OptionError(f"on_open_transaction must be one of {ON_OPEN_TRANSACTION}, not {on_open_transaction!r}")
        self.host = host
        self.port = port
        self._login = login
        self._passcode = passcode
        self._tls = tls
        self.timeout = timeout
        if virtual_host and virtual_host != "/":
            # RabbitMQ's STOMP adapter takes the virtual host from CONNECT's host header (stomp://host/vhost);
            # without it the default vhost is used, silently
            connect_headers = {"host": virtual_host, **(connect_headers or {})}
        self._connect_headers = connect_headers
        self._on_open_tx = on_open_transaction
        self._session = StompSession(max_frame_size=max_frame_size, broker=broker)
        self._lock = threading.Lock()  # guards the session
        self._write_lock = threading.Lock()  # orders frames from application threads
        self._driver: Optional[StreamDriver] = None
        # MESSAGE frames held for receive, against max_buffered_messages/max_buffered_bytes
        self._inbox = Inbox(max_buffered_messages, max_buffered_bytes)
        self._waiters: dict = {}  # receipt id -> _Waiter
        self._connected = _Waiter()
        self._error: Optional[BaseException] = None  # an ERROR frame nobody waited for
        self._closed: Optional[BaseException] = None  # why the stream ended
        self._callbacks: dict = {}  # subscription id -> on_message callback
        self._awaiting = 0  # calls waiting for a receipt (under _lock): read past the bound meanwhile
        self._messages_came = False  # the last read held a MESSAGE frame (see _gather)
        # Write coalescing: plain sends go to _wbuf (under _write_lock); any other frame, a full
        # buffer, or the flusher thread after ``linger`` seconds writes the buffer out, in order.
        self._linger = linger
        self._wbuf: list = []
        self._wsize = 0
        self._flush_due = threading.Event()
        self._flusher: Optional[threading.Thread] = None

    @classmethod
    def from_uri(cls, uri: str, **kwargs) -> "StompClient":
        """``stomp://user:pass@host:61613`` or ``stomp+ssl://...`` (TLS with default checks)."""
        parts = urlsplit(uri)
        if parts.scheme not in _URI_SCHEMES:
            raise OptionError(f"uri scheme must be one of {sorted(_URI_SCHEMES)}, not {parts.scheme!r}")
        if _URI_SCHEMES[parts.scheme] and "tls" not in kwargs:
            kwargs["tls"] = TlsOptions()
        if parts.username is not None:
            kwargs.setdefault("login", unquote(parts.username))
        if parts.password is not None:
            kwargs.setdefault("passcode", unquote(parts.password))
        kwargs.setdefault("virtual_host", unquote(parts.path[1:] if parts.path.startswith("/") else parts.path))
        return cls(parts.hostname or "127.0.0.1", parts.port or DEFAULT_PORT, **kwargs)

    def __repr__(self) -> str:
        return f"StompClient({self.host}:{self.port}, login={self._login!r}, state={self._session.state.value})"

    # -- connection --------------------------------------------------------------------------
    def connect(self) -> "StompClient":
        sock = open_socket(self.host, self.port, timeout=self.timeout, tls=self._tls)
        self._driver = StreamDriver(sock, on_data=self._on_data, on_closed=self._on_closed, name=f"stomp-reader-{self.port}",
                                    may_read=self._may_read if self._inbox.bounded else None, gather=self._gather)
        self._inbox.driver = self._driver
        with self._lock:
            data = self._session.connect(self._login, self._passcode, self._connect_headers)
        # CONNECT goes out before the reader thread starts, so a TLS socket is not read and
        # written by two threads at once during the first exchange.
        self._driver.send(data)
        self._driver.start()
        if not self._connected.event.wait(self.timeout):
            self._driver.abort(ConnectionClosedError("no CONNECTED frame"))
            raise ConnectionClosedError(f"no CONNECTED from {self.host}:{self.port} within {self.timeout}s")
        if self._connected.error is not None:
            self._driver.close()
            raise self._connected.error
        if self._linger > 0:
            self._flusher = threading.Thread(target=self._flush_loop, name=f"stomp-flusher-{self.port}", daemon=True)
            self._flusher.start()
        return self

    def __enter__(self) -> "StompClient":
        return self.connect()

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._driver is None or not self._driver.alive:
            return
        if exc_type is None:
            self.disconnect()
        else:
            self.close()

    @property
    def session_id(self) -> Optional[str]:
        return self._session.session_id

    @property
    def server(self) -> Optional[str]:
        return self._session.server

    @property
    def broker(self) -> BrokerProfile:
        return self._session.broker

    @property
    def connected(self) -> bool:
        return self._session.state is State.CONNECTED and self._closed is None

    @property
    def open_transactions(self) -> frozenset:
        return frozenset(self._session.transactions)

    def disconnect(self, timeout: Optional[float] = None) -> None:
        """Settle open transactions, DISCONNECT with a receipt, wait for it, close the socket."""
        timeout = self.timeout if timeout is None else timeout
        try:
            for tx in sorted(self._session.transactions):
                if self._on_open_tx == "error":
                    raise StompLocalProtocolError(f"transaction {tx!r} is still open at disconnect", command=Command.DISCONNECT.value)
                if self._on_open_tx == "commit":
                    self.commit(tx, receipt=False)
                else:
                    self.abort(tx, receipt=False)
            self._call(lambda s, r: s.disconnect(receipt=r), receipt=True, timeout=timeout)
        finally:
            self.close()

    def close(self) -> None:
        """Close the socket at once (no DISCONNECT; buffered sends are written first if the
        connection still stands)."""
        if self._driver is not None:
            with self._write_lock:
                if self._wbuf and self._driver.alive:
                    try:
                        self._write_locked(b"")
                    except ConnectionClosedError:
                        pass
            self._driver.close()
        self._flush_due.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join(5)

    # -- operations --------------------------------------------------------------------------
    def send(
        self,
        destination: str,
        body: Body = b"",
        *,
        headers: Optional[dict] = None,
        transaction: Optional[str] = None,
        receipt: bool = False,
        content_length: Optional[bool] = None,
    ) -> None:
        """SEND one message.  ``receipt=True`` waits until the broker has taken it, except in a
        transaction on a broker that answers such receipts only at COMMIT (RabbitMQ): there the
        COMMIT's receipt is the confirmation, and none is asked for the SEND."""
        if receipt and self._session.receipt_waits_for_commit(transaction):
            receipt = False
        if not receipt and headers is None and transaction is None and content_length is None and not isinstance(body, str):
            if self._error is not None or self._closed is not None or self._driver is None:
                self._raise_pending()
            with self._write_lock:
                with self._lock:
                    pieces = self._session.send_pieces(destination, body)
                self._wbuf.extend(pieces)
                self._wsize += len(body) + 64
                if self._wsize >= WRITE_BATCH_BYTES or self._linger <= 0:
                    self._write_locked(b"")
                elif not self._flush_due.is_set():
                    self._flush_due.set()
            return
        self._call(
            lambda s, r: s.send(destination, body, headers=headers, transaction=transaction, receipt=r, content_length=content_length),
            receipt=receipt,
        )

    def send_many(
        self,
        destination: str,
        bodies: Iterable[Union[bytes, bytearray, memoryview]],
        *,
        transaction: Optional[str] = None,
        receipt: bool = False,
        batch_bytes: int = 256 * 1024,
    ) -> int:
        """SEND many bytes bodies, coalesced into writes of about ``batch_bytes``; returns the
        count.  ``receipt=True`` ends with a receipt round trip (a flush barrier)."""
        self._raise_pending()
        count = 0
        batch: List = []
        size = 0
        for body in bodies:
            batch.append(body)
            size += len(body) + 64
            if size >= batch_bytes:
                self._write_batch(destination, batch, transaction)
                count += len(batch)
                batch = []
                size = 0
        if batch:
            self._write_batch(destination, batch, transaction)
            count += len(batch)
        if receipt:
            self.flush()
        return count

    def _write_batch(self, destination: str, batch: list, transaction: Optional[str]) -> None:
        with self._write_lock:
            with self._lock:
                data = self._session.send_many(destination, batch, transaction=transaction)
            self._write_locked(data)

    def _write_locked(self, data: bytes) -> None:
        """Write buffered sends and then ``data``, in one write.  Hold ``_write_lock``."""
        if self._wbuf:
            self._wbuf.append(data)
            data = b"".join(self._wbuf)
            self._wbuf = []
            self._wsize = 0
        if data:
            self._driver.send(data)

    def _flush_loop(self) -> None:
        """Flusher thread: after a buffered send, wait ``linger`` and write what is buffered."""
        due = self._flush_due
        while True:
            due.wait()
            if self._closed is not None or self._driver is None or not self._driver.alive:
                return
            time.sleep(self._linger)
            due.clear()
            with self._write_lock:
                try:
                    self._write_locked(b"")
                except ConnectionClosedError:
                    return

    def flush(self, timeout: Optional[float] = None) -> None:
        """Wait until the broker has processed every frame sent so far (an empty BEGIN/ABORT
        pair with a receipt: STOMP 1.0 has no other frame without side effects)."""
        with self._write_lock:
            with self._lock:
                tx, data = self._session.begin()
            self._write_locked(data)
        self.abort(tx, receipt=True, timeout=timeout)

    def subscribe(
        self,
        destination: str,
        *,
        ack: Union[AckMode, str] = AckMode.AUTO,
        id: Optional[str] = None,
        selector: Optional[str] = None,
        prefetch: Optional[int] = None,
        headers: Optional[dict] = None,
        receipt: bool = True,
        on_message: Optional[Callable[[Frame], None]] = None,
    ) -> str:
        """SUBSCRIBE; returns the subscription id.  With ``receipt`` (default) a refusal raises
        here rather than later.  Messages go to ``receive`` or, with ``on_message``, to that
        callback on the reader thread (no hand-over between threads; it must not block on this
        client's receive, and an exception from it ends the connection with that error)."""
        out: list = []

        def op(s: StompSession, r: Optional[str]) -> bytes:
            sub_id, data = s.subscribe(destination, id=id, ack=ack, selector=selector, prefetch=prefetch, headers=headers, receipt=r)
            out.append(sub_id)
            if on_message is not None:
                self._callbacks[sub_id] = on_message
            return data

        self._call(op, receipt=receipt)
        return out[0]

    def unsubscribe(self, id: Optional[str] = None, *, destination: Optional[str] = None, receipt: bool = True) -> None:
        self._call(lambda s, r: s.unsubscribe(id=id, destination=destination, receipt=r), receipt=receipt)

    def begin(self, transaction: Optional[str] = None, *, receipt: bool = False) -> str:
        out: list = []

        def op(s: StompSession, r: Optional[str]) -> bytes:
            tx, data = s.begin(transaction, receipt=r)
            out.append(tx)
            return data

        self._call(op, receipt=receipt)
        return out[0]

    def commit(self, transaction: str, *, receipt: bool = True, timeout: Optional[float] = None) -> None:
        self._call(lambda s, r: s.commit(transaction, receipt=r), receipt=receipt, timeout=timeout)

    def send_and_commit(self, transaction: str, destination: str, body, *, headers: Optional[dict] = None,
                        timeout: Optional[float] = None) -> None:
        """SEND ``body`` as the last message of ``transaction``, then COMMIT, and return once the
        broker has the transaction on disk. RabbitMQ answers a COMMIT's receipt before its messages
        are on disk (a broker SIGKILL right after it can lose them all), but a receipt asked on a SEND
        of the transaction comes only once the broker has confirmed that SEND, after the COMMIT, and
        one queue's messages are confirmed in order: so there the last SEND carries a receipt too and
        both are waited for. Elsewhere (ActiveMQ commits to its store first) a SEND and a COMMIT's receipt."""
        if not self._session.receipt_waits_for_commit(transaction):
            self.send(destination, body, headers=headers, transaction=transaction)
            self.commit(transaction, receipt=True, timeout=timeout)
            return
        last = self._call(lambda s, r: s.send(destination, body, headers=headers, transaction=transaction, receipt=r),
                          receipt=True, wait=False)
        try:
            self.commit(transaction, receipt=True, timeout=timeout)
        except BaseException:
            self._waiters.pop(last[0], None)  # no receipt will come for it now
            self._done_awaiting()
            raise
        self._await(*last, timeout)

    def abort(self, transaction: str, *, receipt: bool = True, timeout: Optional[float] = None) -> None:
        self._call(lambda s, r: s.abort(transaction, receipt=r), receipt=receipt, timeout=timeout)

    @contextmanager
    def transaction(self) -> Iterator[str]:
        """BEGIN ... COMMIT (with a receipt); ABORT if the block raises."""
        tx = self.begin()
        try:
            yield tx
        except BaseException:
            if self.connected and tx in self._session.transactions:
                self.abort(tx)
            raise
        self.commit(tx)

    def ack(self, message: Union[Frame, str], *, subscription: Optional[str] = None, transaction: Optional[str] = None, receipt: bool = False) -> None:
        """Acknowledge ``message`` and every earlier unacknowledged message of its subscription
        (on RabbitMQ: of every subscription of the connection; acknowledging one of those again is
        an error there, see ``spark_mq.protocol.stomp10._brokers``). Pass the MESSAGE frame, or its
        message-id (then ``subscription`` helps find it)."""
        if isinstance(message, Frame):
            message_id = message.headers[Header.MESSAGE_ID]
            subscription = subscription or message.headers.get(Header.SUBSCRIPTION)
        else:
            message_id = message
        if receipt and self._session.receipt_waits_for_commit(transaction):
            receipt = False  # see send()
        self._call(lambda s, r: s.ack(message_id, subscription=subscription, transaction=transaction, receipt=r), receipt=receipt)

    def receive(self, timeout: Optional[float] = None) -> Optional[Frame]:
        """The next MESSAGE frame, or ``None`` after ``timeout`` seconds.  Raises the ERROR or
        connection loss that ended the stream once every message before it is taken."""
        return self._inbox.take(timeout, self._raise_pending)

    def receive_many(self, max_count: int, timeout: Optional[float] = None) -> List[Frame]:
        """Up to ``max_count`` messages: waits (up to ``timeout``) for the first, then takes
        whatever else is already here."""
        return self._inbox.take_many(max_count, timeout, self._raise_pending)

    @property
    def received_at(self) -> Optional[float]:
        """``time.monotonic()`` when bytes last came from the broker (part of a frame included)."""
        driver = getattr(self, "_driver", None)
        return getattr(driver, "last_recv", None)

    @property
    def pending_messages(self) -> int:
        """MESSAGE frames received and not yet taken by ``receive``."""
        return len(self._inbox)

    @property
    def buffered_bytes(self) -> int:
        """Body bytes of those frames."""
        return self._inbox.buffered_bytes

    @property
    def max_buffered_messages(self) -> Optional[int]:
        return self._inbox.max_messages

    @max_buffered_messages.setter
    def max_buffered_messages(self, bound: Optional[int]) -> None:
        self._inbox.max_messages = bound

    @property
    def max_buffered_bytes(self) -> Optional[int]:
        return self._inbox.max_bytes

    @max_buffered_bytes.setter
    def max_buffered_bytes(self, bound: Optional[int]) -> None:
        self._inbox.max_bytes = bound

    def _gather(self) -> bool:
        """Asked by the reader after a small read: pause a moment to let more messages arrive, when the
        last read brought messages and no call waits for a receipt (``_call`` wakes a pausing reader)."""
        return self._messages_came and not self._awaiting and self._closed is None

    def _may_read(self) -> bool:
        """Asked by the reader before each read: room for more messages, or a receipt awaited (it
        may be queued behind messages nobody takes yet), or the connection is ending."""
        if self._awaiting or self._closed is not None:
            return True
        return self._inbox.has_room()

    # -- machinery ---------------------------------------------------------------------------
    def _raise_pending(self) -> None:
        if self._error is not None:
            raise self._error
        if self._closed is not None:
            raise self._closed
        if self._driver is None:
            raise StompLocalProtocolError("not connected: call connect() first")

    def _call(self, op, *, receipt: bool, timeout: Optional[float] = None, wait: bool = True):
        """Run ``op(session, receipt_id)`` for its bytes, write them, and with ``receipt`` wait (or,
        with ``wait=False``, return what ``_await`` takes to wait later)."""
        self._raise_pending()
        waiter = None
        with self._write_lock:
            with self._lock:
                rid = self._session.next_id("r") if receipt else None
                data = op(self._session, rid)
                if rid is not None:
                    waiter = self._waiters[rid] = _Waiter()
                    self._awaiting += 1
            try:
                self._write_locked(data)
            except BaseException:
                if waiter is not None:
                    self._done_awaiting()
                raise
        if waiter is None:
            return None
        # a reader pausing (to gather messages, or with the inbox full: _may_read is true from now on)
        # reads the RECEIPT at once: it may be queued behind messages nobody takes yet
        self._driver.resume_reading()
        if not wait:
            return rid, waiter
        self._await(rid, waiter, timeout)
        return None

    def _await(self, rid: str, waiter: _Waiter, timeout: Optional[float]) -> None:
        try:
            timeout = self.timeout if timeout is None else timeout
            if not waiter.event.wait(timeout):
                self._waiters.pop(rid, None)
                self._raise_pending()
                raise ConnectionClosedError(f"no RECEIPT {rid!r} within {timeout}s")
        finally:
            self._done_awaiting()
        if waiter.error is not None:
            raise waiter.error

    def _done_awaiting(self) -> None:
        with self._lock:
            self._awaiting -= 1

    def _on_data(self, data: bytes) -> None:
        error = None
        with self._lock:
            try:
                frames = self._session.receive_data(data)
            except StompRemoteProtocolError as exc:
                frames = self._session.take_parsed()
                error = exc
        self._dispatch(frames)
        if error is not None:
            raise error  # the driver ends the stream with it; _on_closed tells everyone

    def _dispatch(self, frames: List[Frame]) -> None:
        messages = []
        append = messages.append
        message = Command.MESSAGE
        callbacks = self._callbacks
        for frame in frames:
            command = frame.command
            if command is message:
                if callbacks:
                    callback = callbacks.get(frame.headers.get(Header.SUBSCRIPTION))
                    if callback is not None:
                        callback(frame)
                        continue
                append(frame)
            elif command is Command.RECEIPT:
                waiter = self._waiters.pop(frame.headers[Header.RECEIPT_ID], None)
                if waiter is not None:
                    waiter.event.set()
            elif command is Command.ERROR:
                self._on_error(frame)
            else:  # CONNECTED
                self._connected.event.set()
        self._messages_came = bool(messages)
        if messages:
            self._inbox.put(messages)

    def _on_error(self, frame: Frame) -> None:
        error = frame.to_error()
        if self._session.state is State.CONNECTING:
            self._connected.error = error
            self._connected.event.set()
            return
        rid = frame.headers.get(Header.RECEIPT_ID)
        waiter = self._waiters.pop(rid, None) if rid is not None else None
        if waiter is not None:
            waiter.error = error
            waiter.event.set()
            return
        # An ERROR naming no receipt we wait for: it concerns some earlier frame, and brokers
        # usually close next.  Everyone waiting, and the next call, gets it.
        self._error = error
        self._wake_all(error)

    def _on_closed(self, exc: Optional[BaseException]) -> None:
        with self._lock:
            disconnecting = self._session.state is State.DISCONNECTING
            try:
                self._session.receive_eof()
            except IncompleteFrameError as incomplete:
                if exc is None or isinstance(exc, ConnectionClosedError):
                    exc = incomplete
        if exc is None or (disconnecting and isinstance(exc, ConnectionClosedError)):
            closed: BaseException = ConnectionClosedError("connection closed")
        elif isinstance(exc, ConnectionClosedError):
            closed = exc
        else:
            closed = ConnectionClosedError(f"connection dropped: {exc}")
            closed.__cause__ = exc
        self._closed = closed
        if self._driver is not None and exc is not None:
            self._driver.abort(closed)  # close the socket if the driver has not (protocol error)
        if not self._connected.event.is_set():  # ended before CONNECTED: connect() raises
            self._connected.error = self._connected.error or self._error or closed
            self._connected.event.set()
        self._wake_all(self._error or closed)

    def _wake_all(self, error: BaseException) -> None:
        waiters, self._waiters = self._waiters, {}
        for waiter in waiters.values():
            waiter.error = error
            waiter.event.set()
        self._inbox.wake()


__all__ = ["StompClient", "StompError", "TlsOptions", "AckMode", "Frame", "DEFAULT_MAX_FRAME_SIZE"]
