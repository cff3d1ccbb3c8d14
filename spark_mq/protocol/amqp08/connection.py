"""Sans-IO AMQP 0-8 and 0-9-1 connection and channel state machine.

Bytes in (``receive_data``), events out; commands in (``open_channel``, ``send_method``,
``send_content``...), bytes out (``data_to_send``). The clock is an argument (``tick(now)``).
No sockets, threads or time calls here. The protocol version is the tables the connection is given
(``protocol``: ``spec`` for 0-8, ``spec091`` for 0-9-1, the same generated names): its header, method
numbering and the methods only one version has (0-8's connection.redirect and channel.alert) are data.

Responsibilities: the handshake (protocol header, start/start-ok with PLAIN or AMQPLAIN,
secure/secure-ok, tune/tune-ok negotiation, open/open-ok or redirect), close in both directions,
channel open/flow/alert/close, content assembly (method + header + body frames) and splitting by
frame-max, heartbeat scheduling and peer-silence detection, and protocol checks: every violation
by the broker raises ``RemoteProtocolError`` naming the frame/method at fault; every misuse by the
caller raises ``LocalProtocolError``. The states and events it hands out are in ``events`` (re-exported
here).

Over 500 lines on purpose: ``Connection`` is one state machine, its receive path (inlined for speed)
and its commands sharing the channel table, the handshake state and the heartbeat clock; split
across modules, one set of transitions could no longer be read in one place.
"""

from __future__ import annotations

from collections import deque
from struct import Struct
from typing import Callable, Optional

from spark_mq.errors import LocalProtocolError, RemoteProtocolError
from spark_mq.protocol.amqp08 import spec, spec091
from spark_mq.protocol.amqp08.codec import Method, Properties, encode_table
from spark_mq.protocol.amqp08.errors import (
    AMQPChannelError,
    AMQPConnectionError,
    AMQPError,
    AuthenticationError,
    ProtocolRefused,
)
from spark_mq.protocol.amqp08.events import (
    Alert,
    ChannelClosed,
    ChannelOpened,
    ChanState,
    ConnectionClosed,
    ConnectionOpened,
    ConnectionRedirected,
    ConnState,
    ContentReceived,
    Event,
    FlowChanged,
    HeartbeatTimeout,
    MethodReceived,
    UndecodableProperties,
)
from spark_mq.protocol.amqp08.frames import (
    CONTENT_HEADER as _CONTENT_HEADER,
    DECODE_ERRORS,
    HEARTBEAT_FRAME,
    content_frames,
    decode_method,
    method_frame,
)

_METHOD, _HEADER, _BODY, _HEARTBEAT = (int(spec.FrameType.METHOD), int(spec.FrameType.HEADER),
                                       int(spec.FrameType.BODY), int(spec.FrameType.HEARTBEAT))
#: the protocol versions a connection speaks: ``protocol`` -> its generated tables
SPECS = {"0-8": spec, "0-9-1": spec091}
_DELIVER_INDEX = spec.BasicDeliver.INDEX
assert _DELIVER_INDEX == spec091.BasicDeliver.INDEX  # basic.deliver is (60, 60) in both
_new_content = tuple.__new__
_FRAME_TYPES = frozenset(int(t) for t in spec.FrameType)  # 0-8's: a superset of 0-9-1's
_FRAME_END = spec.FRAME_END
_FRAME_MIN_SIZE = spec.FRAME_MIN_SIZE
assert (_FRAME_END, _FRAME_MIN_SIZE) == (spec091.FRAME_END, spec091.FRAME_MIN_SIZE)
_unpack_frame_header = Struct(">BHI").unpack_from
_unpack_class = Struct(">H").unpack_from
_unpack_index = Struct(">I").unpack_from
_unpack_body_size = Struct(">Q").unpack_from
_unpack_header_frame = Struct(">BHIHHQ").unpack_from  # frame header + class, weight, body size
#: per protocol: methods that only ever answer a request (queue.declare-ok, channel.flow-ok, basic.get-empty...)
_REPLIES = {name: frozenset(r for m in (*t.METHODS.values(), *t.RABBITMQ_METHODS.values()) for r in m.RESPONSES)
            for name, t in SPECS.items()}


_BASIC = 60


def _properties(cls, buf, start: int, end: int):
    """Decode the properties of a whole content header frame, ``buf[start:end]``; what cannot be
    decoded becomes ``UndecodableProperties`` (class basic), not a protocol error."""
    try:
        props, stop = cls.decode(buf, start)
        if stop == end:
            return props
        error = f"the properties take {stop - start} bytes, the frame has {end - start}"
    except (*DECODE_ERRORS, RemoteProtocolError, RecursionError) as exc:
        if cls.CLASS_ID != _BASIC:
            raise
        error = f"{type(exc).__name__}: {exc}"
    if cls.CLASS_ID != _BASIC:
        raise RemoteProtocolError(f"content header of class {cls.CLASS_ID}: {error}")
    return UndecodableProperties(bytes(buf[start:end]), error)


#: RabbitMQ closes the socket silently on bad credentials unless the client announces this.
CLIENT_CAPABILITIES = {"authentication_failure_close": True}

_OPEN = ChanState.OPEN


# -- authentication ----------------------------------------------------------------------------


def plain_response(username: str, password: str) -> bytes:
    return b"\x00" + username.encode() + b"\x00" + password.encode()


def amqplain_response(username: str, password: str) -> bytes:
    # AMQPLAIN is a field table without its 4-byte length prefix
    return encode_table({"LOGIN": username, "PASSWORD": password})[4:]


MECHANISMS: dict[str, Callable[[str, str], bytes]] = {"PLAIN": plain_response, "AMQPLAIN": amqplain_response}


class _Channel:
    __slots__ = ("number", "state", "pending", "content_method", "content_props", "content_size",
                 "content_parts", "content_received", "flow_active")

    def __init__(self, number: int) -> None:
        self.number = number
        self.state = ChanState.OPENING
        self.pending: deque = deque()  # response classes of the sync requests we sent, oldest first
        self.content_method: Optional[Method] = None
        self.content_props: Optional[Properties] = None
        self.content_size = 0
        self.content_parts: list = []
        self.content_received = 0
        self.flow_active = True


class Connection:
    """One AMQP 0-8 connection as a pure state machine.

    Typical use by a driver::

        conn = Connection(username, password, virtual_host="/")
        sock.sendall(conn.initiate())
        while True:
            for event in conn.receive_data(sock.recv(65536)):
                ...
            sock.sendall(conn.data_to_send())
    """

    def __init__(
        self,
        username: str = "guest",
        password: str = "guest",
        virtual_host: str = "/",
        *,
        mechanism: str = "PLAIN",
        locale: str = "en_US",
        channel_max: int = 0,
        frame_max: int = 131072,
        heartbeat: Optional[int] = 60,
        client_properties: Optional[dict] = None,
        insist: bool = False,
        secure_handler: Optional[Callable[[bytes], bytes]] = None,
        protocol: str = "0-8",
    ) -> None:
        if protocol not in SPECS:
            raise LocalProtocolError(f"unknown AMQP protocol {protocol!r}; use one of {sorted(SPECS)}")
        self.protocol = protocol
        self.spec = spec = SPECS[protocol]
        self._methods = spec.METHODS
        self._properties_of = spec.PROPERTIES  # every content method's class has a properties class
        self._basic_properties = spec.BasicProperties
        self._decode_deliver = spec.BasicDeliver.decode
        self._replies = _REPLIES[protocol]
        # the methods only one version has: None where this one has not
        self._redirect = getattr(spec, "ConnectionRedirect", None)
        self._alert = getattr(spec, "ChannelAlert", None)
        if mechanism not in MECHANISMS:
            raise LocalProtocolError(f"unsupported SASL mechanism {mechanism!r}; use one of {sorted(MECHANISMS)}")
        if frame_max and frame_max < _FRAME_MIN_SIZE:
            raise LocalProtocolError(f"frame_max {frame_max} is below the protocol minimum {_FRAME_MIN_SIZE}")
        self._username = username
        self._password = password
        self.virtual_host = virtual_host
        self.mechanism = mechanism
        self.locale = locale
        self._want_channel_max = channel_max
        self._want_frame_max = frame_max
        self._want_heartbeat = heartbeat
        props = {"product": "spark-mq", "platform": "Python", "capabilities": dict(CLIENT_CAPABILITIES)}
        props.update(client_properties or {})
        self.client_properties = props
        self.insist = insist
        self._secure_handler = secure_handler

        self.state = ConnState.AWAIT_START
        self.server_properties: dict = {}
        self.server_mechanisms: list[str] = []
        self.channel_max = 0
        self.frame_max = 0
        self.heartbeat = 0
        self.close_error: Optional[BaseException] = None
        self._buf = bytearray()  # received bytes not yet cut into frames, trimmed once per call
        self._out: list = []
        self._channels: dict[int, _Channel] = {}
        self._next_channel = 1
        self._last_recv = None
        self._last_send = None
        self._header_checked = False

    def __repr__(self) -> str:  # never shows the password
        return f"<amqp08.Connection user={self._username!r} vhost={self.virtual_host!r} state={self.state.value}>"

    # -- output -------------------------------------------------------------------------------

    def initiate(self) -> bytes:
        """The protocol header; the first bytes to send."""
        if self.state is not ConnState.AWAIT_START or self._out:
            raise LocalProtocolError("initiate() must be the first call on a new connection")
        return self.spec.PROTOCOL_HEADER

    def data_to_send(self) -> bytes:
        """Everything queued for the wire since the last call, as one bytes object."""
        if not self._out:
            return b""
        out = b"".join(self._out)
        self._out.clear()
        return out

    def _send_method(self, channel: int, method: Method) -> None:
        self._out.append(method_frame(channel, method.encode()))

    # -- input --------------------------------------------------------------------------------

    def receive_data(self, data, now: Optional[float] = None) -> list[Event]:
        """Feed bytes from the broker; return the events they complete."""
        if now is not None:
            self._last_recv = now
        if self.state is ConnState.CLOSED:
            return []
        if not self._header_checked:
            if not data:
                return []
            if data[:1] == b"A":
                # a server that does not speak the version offered answers with the header it does
                # speak (no frame type starts with "A", so one byte is enough to tell)
                raise ProtocolRefused(self.protocol, bytes(data[:8]))
            self._header_checked = True
        events: list[Event] = []
        buf = self._buf
        buf += data
        n = len(buf)
        o = 0
        limit = self.frame_max or _FRAME_MIN_SIZE
        channels = self._channels
        view = memoryview(buf)
        try:
            while n - o >= 7:
                ftype, channel, size = _unpack_frame_header(buf, o)
                start = o + 7
                end = start + size
                if size + 8 > limit:
                    raise RemoteProtocolError(
                        f"frame of {size + 8} bytes (type {ftype}, channel {channel}) "
                        f"exceeds the negotiated frame-max {limit}"
                    )
                if end >= n:
                    if ftype not in _FRAME_TYPES:
                        raise RemoteProtocolError(f"unknown frame type {ftype} on channel {channel}")
                    break
                if buf[end] != _FRAME_END:
                    raise RemoteProtocolError(
                        f"frame (type {ftype}, channel {channel}, size {size}) ends with 0x{buf[end]:02X}, "
                        f"not the frame-end octet 0x{_FRAME_END:02X}"
                    )
                o = end + 1
                # Fast paths for a consumer's steady state (basic.deliver, header, one body frame),
                # decoding in place from the receive buffer. Anything unusual takes the general path,
                # which checks everything.
                ch = channels.get(channel)
                if ftype == _BODY:
                    if (ch is not None and ch.content_props is not None and not ch.content_parts
                            and ch.content_size == size):
                        events.append(_new_content(ContentReceived, (channel, ch.content_method,
                                                                     ch.content_props, bytes(view[start:end]))))
                        ch.content_method = ch.content_props = None
                        ch.content_size = 0
                    else:
                        self._on_body(channel, bytes(view[start:end]), events)
                elif ftype == _METHOD:
                    if (ch is not None and _unpack_index(buf, start)[0] == _DELIVER_INDEX and ch.content_method is None
                            and ch.state is _OPEN):
                        method, stop = self._decode_deliver(buf, start + 4)
                        if stop != end:
                            raise RemoteProtocolError(
                                f"basic.deliver on channel {channel}: arguments take {stop - start - 4} bytes "
                                f"but the frame has {size - 4}"
                            )
                        # Whole message in the buffer (header frame, then one body frame on this
                        # channel)? Then decode it here in one step; otherwise frame by frame.
                        h = o
                        if n - h >= 22:
                            htype, hchannel, hsize, class_id, _weight, body_size = _unpack_header_frame(buf, h)
                            hend = h + 7 + hsize
                            if (htype == _HEADER and hchannel == channel and class_id == 60 and hend < n
                                    and hsize + 8 <= limit and buf[hend] == _FRAME_END):
                                props = _properties(self._basic_properties, buf, h + 19, hend)
                                if body_size == 0:
                                    events.append(_new_content(ContentReceived, (channel, method, props, b"")))
                                    o = hend + 1
                                    continue
                                b = hend + 1
                                if n - b >= 8:
                                    btype, bchannel, bsize = _unpack_frame_header(buf, b)
                                    bend = b + 7 + bsize
                                    if (btype == _BODY and bchannel == channel and bsize == body_size
                                            and bend < n and bsize + 8 <= limit and buf[bend] == _FRAME_END):
                                        events.append(_new_content(ContentReceived, (
                                            channel, method, props, bytes(view[b + 7:bend]))))
                                        o = bend + 1
                                        continue
                        ch.content_method = method
                    else:
                        self._on_method_frame(channel, bytes(view[start:end]), events)
                elif ftype == _HEADER:
                    if (ch is not None and ch.content_method is not None and ch.content_props is None
                            and size >= 14 and _unpack_class(buf, start)[0] == ch.content_method.CLASS_ID):
                        ch.content_props = _properties(self._properties_of[ch.content_method.CLASS_ID], buf, start + 12, end)
                        ch.content_size = _unpack_body_size(buf, start + 4)[0]
                        if ch.content_size == 0:
                            self._content_done(ch, b"", events)
                    else:
                        self._on_header(channel, bytes(view[start:end]), events)
                elif ftype == _HEARTBEAT:
                    if channel != 0:
                        raise RemoteProtocolError(f"heartbeat frame on channel {channel}; must be channel 0")
                else:
                    raise RemoteProtocolError(f"unexpected frame type {ftype} on channel {channel}")
                if self.state is ConnState.CLOSED:
                    break
        except DECODE_ERRORS as exc:
            raise RemoteProtocolError(f"malformed frame from the broker: {exc}") from exc
        finally:
            view.release()
            if o:
                del buf[:o]
        return events

    def _on_method_frame(self, channel: int, payload, events: list) -> None:
        method = decode_method(payload, channel, self._methods)
        if not method.SERVER_MAY_SEND:
            raise RemoteProtocolError(f"broker sent {method.NAME}, which only a client may send")
        if channel == 0:
            if method.CLASS_ID != 10:
                raise RemoteProtocolError(f"{method.NAME} arrived on channel 0, which carries connection methods only")
            self._on_connection_method(method, events)
            return
        if method.CLASS_ID == 10:
            raise RemoteProtocolError(f"{method.NAME} arrived on channel {channel}; connection methods use channel 0")
        if self.state is not ConnState.OPEN and self.state is not ConnState.CLOSING:
            raise RemoteProtocolError(f"{method.NAME} on channel {channel} before the connection is open")
        ch = self._channels.get(channel)
        if ch is None:
            raise RemoteProtocolError(f"{method.NAME} on channel {channel}, which is not open")
        if ch.content_method is not None:
            raise RemoteProtocolError(
                f"{method.NAME} on channel {channel} while the content of {ch.content_method.NAME} is incomplete"
            )
        self._on_channel_method(ch, method, events)

    # -- connection class -----------------------------------------------------------------------

    def _expect(self, method: Method, *classes) -> None:
        if not isinstance(method, classes):
            names = " or ".join(c.NAME for c in classes)
            raise RemoteProtocolError(f"expected {names} in state {self.state.value}, got {method.NAME}")

    def _on_connection_method(self, method: Method, events: list) -> None:
        if isinstance(method, self.spec.ConnectionClose):
            self._send_method(0, self.spec.ConnectionCloseOk())
            error = self._make_error(method, 0)
            if self.state is ConnState.AWAIT_TUNE and method.reply_code == self.spec.ReplyCode.ACCESS_REFUSED:
                error = AuthenticationError(method.reply_code, method.reply_text, method.class_id,
                                            method.method_id, error.method_name)
            self._closed(error, events)
            return
        state = self.state
        if state is ConnState.AWAIT_START:
            self._expect(method, self.spec.ConnectionStart)
            self._on_start(method)
        elif state is ConnState.AWAIT_TUNE:
            self._expect(method, self.spec.ConnectionSecure, self.spec.ConnectionTune)
            if isinstance(method, self.spec.ConnectionSecure):
                handler = self._secure_handler
                response = handler(method.challenge) if handler else MECHANISMS[self.mechanism](
                    self._username, self._password)
                self._send_method(0, self.spec.ConnectionSecureOk(response=response))
            else:
                self._on_tune(method)
        elif state is ConnState.AWAIT_OPEN_OK:
            self._expect(method, self.spec.ConnectionOpenOk, *filter(None, (self._redirect,)))
            if self._redirect is not None and isinstance(method, self._redirect):
                self.state = ConnState.CLOSED
                events.append(ConnectionRedirected(method.host, method.known_hosts))
            else:
                self.state = ConnState.OPEN
                events.append(ConnectionOpened(method.known_hosts, self.server_properties,
                                               self.channel_max, self.frame_max, self.heartbeat))
        elif state is ConnState.CLOSING:
            if isinstance(method, self.spec.ConnectionCloseOk):
                self._closed(self.close_error, events)
            # anything else is discarded while closing, as the spec requires
        else:
            raise RemoteProtocolError(f"unexpected {method.NAME} in connection state {state.value}")

    def _on_start(self, method) -> None:
        if (method.version_major, method.version_minor) != (self.spec.VERSION_MAJOR, self.spec.VERSION_MINOR):
            raise RemoteProtocolError(
                f"broker's connection.start names AMQP version {method.version_major}-{method.version_minor}, "
                f"not the {self.protocol} it was offered ({self.spec.VERSION_MAJOR}-{self.spec.VERSION_MINOR})"
            )
        self.server_properties = method.server_properties or {}
        self.server_mechanisms = method.mechanisms.decode("utf-8", "replace").split()
        if self.mechanism not in self.server_mechanisms:
            raise AuthenticationError(
                0, f"broker does not offer SASL mechanism {self.mechanism}; it offers {self.server_mechanisms}"
            )
        locales = method.locales.decode("utf-8", "replace").split()
        locale = self.locale if self.locale in locales or not locales else locales[0]
        response = MECHANISMS[self.mechanism](self._username, self._password)
        self._send_method(0, self.spec.ConnectionStartOk(client_properties=self.client_properties,
                                                     mechanism=self.mechanism, response=response, locale=locale))
        self.state = ConnState.AWAIT_TUNE

    def _on_tune(self, method) -> None:
        self.channel_max = _negotiate(self._want_channel_max, method.channel_max)
        self.frame_max = _negotiate(self._want_frame_max, method.frame_max)
        if self.frame_max and self.frame_max < _FRAME_MIN_SIZE:
            raise RemoteProtocolError(f"broker proposed frame-max {method.frame_max}, below {_FRAME_MIN_SIZE}")
        if self._want_heartbeat is None:
            self.heartbeat = method.heartbeat
        elif self._want_heartbeat == 0:
            self.heartbeat = 0
        else:
            self.heartbeat = _negotiate(self._want_heartbeat, method.heartbeat)
        self._send_method(0, self.spec.ConnectionTuneOk(channel_max=self.channel_max, frame_max=self.frame_max,
                                                   heartbeat=self.heartbeat))
        self._send_method(0, self.spec.ConnectionOpen(virtual_host=self.virtual_host, capabilities="",
                                                 insist=self.insist))
        self.state = ConnState.AWAIT_OPEN_OK

    def _closed(self, error: Optional[BaseException], events: list) -> None:
        self.state = ConnState.CLOSED
        self.close_error = error
        for ch in self._channels.values():
            ch.state = ChanState.CLOSED
        events.append(ConnectionClosed(error))

    def _make_error(self, method, channel: int) -> AMQPError:
        code = method.reply_code
        cls = self.spec.ERRORS.get(code)
        if cls is None:
            cls = AMQPConnectionError if channel == 0 else AMQPChannelError
        target = self._methods.get((method.class_id << 16) | method.method_id)
        return cls(code, method.reply_text, method.class_id, method.method_id,
                   target.NAME if target else None, channel)

    # -- channels ---------------------------------------------------------------------------

    def _on_channel_method(self, ch: _Channel, method: Method, events: list) -> None:
        if isinstance(method, self.spec.ChannelClose):
            self._send_method(ch.number, self.spec.ChannelCloseOk())
            error = self._make_error(method, ch.number)
            if not isinstance(error, AMQPChannelError):
                # a hard code on channel.close: still a channel close, keep the code and text
                error = AMQPChannelError(error.reply_code, error.reply_text, error.class_id,
                                         error.method_id, error.method_name, ch.number)
            del self._channels[ch.number]
            ch.state = ChanState.CLOSED
            events.append(ChannelClosed(ch.number, error))
            return
        if ch.state is ChanState.CLOSING:
            if isinstance(method, self.spec.ChannelCloseOk):
                del self._channels[ch.number]
                ch.state = ChanState.CLOSED
                events.append(ChannelClosed(ch.number, None))
            elif method.HAS_CONTENT:
                # a delivery the broker sent before it read our close: its header and body follow,
                # and a no-ack one exists nowhere else any more, so it is decoded and handed up
                ch.content_method = method
            return  # the spec says to discard everything else while closing
        if isinstance(method, self.spec.ChannelFlow):
            ch.flow_active = method.active
            self._send_method(ch.number, self.spec.ChannelFlowOk(active=method.active))
            events.append(FlowChanged(ch.number, method.active))
            return
        if self._alert is not None and isinstance(method, self._alert):
            events.append(Alert(ch.number, method.reply_code, method.reply_text, method.details))
            return
        if ch.state is ChanState.OPENING:
            self._expect(method, self.spec.ChannelOpenOk)
            ch.pending.popleft()
            ch.state = ChanState.OPEN
            events.append(ChannelOpened(ch.number))
            return
        if type(method) in self._replies:
            self._pop_pending(ch.pending, method, ch.number)
        if method.HAS_CONTENT:
            ch.content_method = method
            return
        events.append(MethodReceived(ch.number, method))

    def _pop_pending(self, pending: deque, method: Method, channel: int) -> None:
        if not pending or type(method) not in pending[0]:
            wanted = " or ".join(c.NAME for c in pending[0]) if pending else "no reply"
            raise RemoteProtocolError(f"broker sent {method.NAME} on channel {channel}; expected {wanted}")
        pending.popleft()

    def _on_header(self, channel: int, payload, events: list) -> None:
        ch = self._channels.get(channel)
        if ch is None or ch.content_method is None or ch.content_props is not None:
            raise RemoteProtocolError(f"content header frame on channel {channel} without a content method")
        if len(payload) < 14:
            raise RemoteProtocolError(f"content header frame of {len(payload)} bytes is too short")
        class_id, _weight, size = _CONTENT_HEADER.unpack_from(payload, 0)
        if class_id != ch.content_method.CLASS_ID:
            raise RemoteProtocolError(
                f"content header of class {class_id} after {ch.content_method.NAME} on channel {channel}"
            )
        ch.content_props = _properties(self._properties_of[class_id], payload, 12, len(payload))
        ch.content_size = size
        if size == 0:
            self._content_done(ch, b"", events)

    def _on_body(self, channel: int, payload, events: list) -> None:
        ch = self._channels.get(channel)
        if ch is None or ch.content_props is None:
            raise RemoteProtocolError(f"content body frame on channel {channel} without a content header")
        received = ch.content_received + len(payload)
        if received > ch.content_size:
            raise RemoteProtocolError(
                f"content body on channel {channel} is {received} bytes, more than the {ch.content_size} announced"
            )
        if received == ch.content_size:
            if ch.content_parts:
                ch.content_parts.append(payload)
                payload = b"".join(ch.content_parts)
                ch.content_parts = []
            self._content_done(ch, payload, events)
        else:
            ch.content_parts.append(payload)
            ch.content_received = received

    def _content_done(self, ch: _Channel, body: bytes, events: list) -> None:
        events.append(ContentReceived(ch.number, ch.content_method, ch.content_props, body))
        ch.content_method = None
        ch.content_props = None
        ch.content_received = 0
        ch.content_size = 0

    # -- commands -----------------------------------------------------------------------------

    def open_channel(self, number: Optional[int] = None) -> int:
        """Queue channel.open; returns the channel number. ``ChannelOpened`` follows."""
        self._require_open()
        if number is None:
            number = self._allocate_channel()
        elif number in self._channels:
            raise LocalProtocolError(f"channel {number} is already in use")
        if number < 1 or (self.channel_max and number > self.channel_max) or number > 0xFFFF:
            raise LocalProtocolError(f"channel number {number} outside 1..{self.channel_max or 65535}")
        ch = _Channel(number)
        self._channels[number] = ch
        ch.pending.append(self.spec.ChannelOpen.RESPONSES)
        self._send_method(number, self.spec.ChannelOpen(out_of_band=""))
        return number

    def _allocate_channel(self) -> int:
        limit = self.channel_max or 0xFFFF
        for _ in range(limit):
            number = self._next_channel
            self._next_channel = 1 if number >= limit else number + 1
            if number not in self._channels:
                return number
        raise LocalProtocolError(f"all {limit} channels are in use")

    def close_channel(self, channel: int, reply_code: int = 200, reply_text: str = "bye") -> None:
        ch = self._channel(channel)
        if ch.state is ChanState.CLOSING:
            return
        ch.state = ChanState.CLOSING
        self._send_method(channel, self.spec.ChannelClose(reply_code=reply_code, reply_text=reply_text))

    def send_method(self, channel: int, method: Method) -> None:
        """Queue a method without content. Synchronous requests expect their response next."""
        if not method.CLIENT_MAY_SEND:
            raise LocalProtocolError(f"{method.NAME} is sent by the server, not a client")
        if method.HAS_CONTENT:
            raise LocalProtocolError(f"{method.NAME} carries content: use send_content()")
        if method.CLASS_ID == 10 or channel == 0:
            raise LocalProtocolError(
                f"{method.NAME} on channel {channel}: connection methods are the state machine's own, "
                "everything else needs an open channel"
            )
        ch = self._channel(channel)
        if ch.state is not ChanState.OPEN:
            raise LocalProtocolError(f"channel {channel} is {ch.state.value}, cannot send {method.NAME}")
        if method.RESPONSES and not getattr(method, "nowait", False):
            ch.pending.append(method.RESPONSES)
        self._out.append(method_frame(channel, method.encode()))

    def send_content(self, channel: int, method: Method, properties: Optional[Properties], body,
                     encoded: Optional[bytes] = None) -> None:
        """Queue a content method (basic.publish...) with its header and body frames. ``encoded``:
        ``method_frame(channel, method.encode())`` already made by the caller, who sends the same
        method for many messages (``publish_many``: one per exchange and routing key, not per message)."""
        ch = self._channel(channel)
        if ch.state is not ChanState.OPEN:
            raise LocalProtocolError(f"channel {channel} is {ch.state.value}, cannot send {method.NAME}")
        if not method.HAS_CONTENT or not method.CLIENT_MAY_SEND:
            raise LocalProtocolError(f"{method.NAME} is not a content method a client may send")
        if properties is None:
            properties = self.spec.PROPERTIES[method.CLASS_ID]()
        elif properties.CLASS_ID != method.CLASS_ID:
            raise LocalProtocolError(f"{type(properties).__name__} cannot go with {method.NAME}")
        if method.RESPONSES:
            ch.pending.append(method.RESPONSES)
        out = self._out
        out.append(encoded if encoded is not None else method_frame(channel, method.encode()))
        out += content_frames(channel, method.CLASS_ID, properties.encode(), body, self.frame_max)

    def close(self, reply_code: int = 200, reply_text: str = "normal shutdown") -> None:
        """Queue connection.close; ``ConnectionClosed(None)`` follows close-ok."""
        if self.state in (ConnState.CLOSING, ConnState.CLOSED):
            return
        self.state = ConnState.CLOSING
        self._send_method(0, self.spec.ConnectionClose(reply_code=reply_code, reply_text=reply_text))

    def protocol_error(self, exc: RemoteProtocolError) -> None:
        """Queue connection.close telling the broker which rule it broke (501 FRAME_ERROR for
        framing faults, 503 COMMAND_INVALID otherwise); the connection is then finished."""
        if self.state is ConnState.CLOSED:
            return
        text = str(exc)
        code = self.spec.ReplyCode.FRAME_ERROR if "frame" in text else self.spec.ReplyCode.COMMAND_INVALID
        raw = text.encode("utf-8", "replace")[:255]
        self._send_method(0, self.spec.ConnectionClose(reply_code=code, reply_text=raw.decode("utf-8", "ignore")))
        self.state = ConnState.CLOSED
        self.close_error = exc

    def channel_state(self, channel: int) -> ChanState:
        ch = self._channels.get(channel)
        return ch.state if ch else ChanState.CLOSED

    def flow_active(self, channel: int) -> bool:
        return self._channel(channel).flow_active

    def _channel(self, channel: int) -> _Channel:
        ch = self._channels.get(channel)
        if ch is None:
            raise LocalProtocolError(f"channel {channel} is not open")
        return ch

    def _require_open(self) -> None:
        if self.state is not ConnState.OPEN:
            raise LocalProtocolError(f"connection is {self.state.value}, not open")

    # -- heartbeats ---------------------------------------------------------------------------

    def note_sent(self, now: float) -> None:
        self._last_send = now

    def note_received(self, now: float) -> None:
        """Count the broker as heard from at ``now``: the client chose not to read (its frames wait
        unread in the socket), so its silence is ours, not the broker's."""
        self._last_recv = now

    def tick(self, now: float) -> None:
        """Queue a heartbeat when we have been silent for an interval; raise ``HeartbeatTimeout``
        when the broker has been silent for two intervals."""
        hb = self.heartbeat
        if not hb or self.state is ConnState.CLOSED:
            return
        if self._last_recv is None:
            self._last_recv = now
        if self._last_send is None:
            self._last_send = now
        silent = now - self._last_recv
        if silent > 2 * hb:
            raise HeartbeatTimeout(silent, hb)
        if now - self._last_send >= hb / 2:
            self._out.append(HEARTBEAT_FRAME)
            self._last_send = now


def _negotiate(ours: int, theirs: int) -> int:
    """The smaller of two limits where 0 means 'no limit'."""
    if not ours:
        return theirs
    if not theirs:
        return ours
    return min(ours, theirs)
