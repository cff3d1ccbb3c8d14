"""Malamute wire codec: the 18 messages of specs/malamute/mlm_proto.bnf as observed on the real broker.

One ZeroMQ multipart message is one Malamute message: a header frame (``AA A8``, a one-byte message
id, then the fields) followed by zero or more content frames for the four messages that carry
content. Strings are a one-byte length plus bytes, numbers are big-endian 2 or 4 bytes. There is
no routing or delimiter frame here: the DEALER/ROUTER envelope belongs to the IO layer.

``encode(message) -> list[bytes]`` and ``decode(frames) -> message`` are pure functions. ``decode``
raises ``RemoteProtocolError`` for anything the grammar does not allow (bad signature, unknown id,
truncated or over-long header, content frames on a message without content); ``encode`` raises
``LocalProtocolError`` for values that cannot be represented (string over 255 bytes, number out of
range). It must not import zmq or do IO.

Strings are Python ``str``; bytes that are not UTF-8 survive a round trip through
``surrogateescape``. Content frames are passed through untouched (bytes-like objects).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar, Optional, Sequence, Union

from spark_mq.errors import LocalProtocolError, RemoteProtocolError

SIGNATURE = b"\xaa\xa8"
PROTOCOL_NAME = "MALAMUTE"
PROTOCOL_VERSION = 1
MAX_STRING = 255
MAX_NUMBER2 = 0xFFFF
MAX_NUMBER4 = 0xFFFFFFFF
HEADER_PREFIX_LEN = 3  # signature + id

_ENCODING = "utf-8"
_ERRORS = "surrogateescape"

_N2 = struct.Struct(">H")
_N4 = struct.Struct(">I")
_SIG_ID = struct.Struct(">HB")
_SIGNATURE_VALUE = 0xAAA8

Frame = Union[bytes, bytearray, memoryview]


class MessageId(IntEnum):
    CONNECTION_OPEN = 1
    CONNECTION_PING = 2
    CONNECTION_PONG = 3
    CONNECTION_CLOSE = 4
    STREAM_WRITE = 5
    STREAM_READ = 6
    STREAM_SEND = 7
    STREAM_DELIVER = 8
    MAILBOX_SEND = 9
    MAILBOX_DELIVER = 10
    SERVICE_SEND = 11
    SERVICE_OFFER = 12
    SERVICE_DELIVER = 13
    OK = 14
    ERROR = 15
    CREDIT = 16
    CONFIRM = 17
    STREAM_CANCEL = 18


class StatusCode(IntEnum):
    """Status codes named in the reference codec. The real broker only ever sends 200, 300 and 500."""

    SUCCESS = 200
    STORED = 201
    DELIVERED = 202
    NOT_DELIVERED = 300
    CONTENT_TOO_LARGE = 301
    TIMEOUT_EXPIRED = 302
    CONNECTION_REFUSED = 303
    RESOURCE_LOCKED = 400
    ACCESS_REFUSED = 401
    NOT_FOUND = 404
    COMMAND_INVALID = 500
    NOT_IMPLEMENTED = 501
    INTERNAL_ERROR = 502


class Field(IntEnum):
    """Field kinds of a header: a string, a 2-byte number, a 4-byte number."""

    STRING = 1
    NUMBER2 = 2
    NUMBER4 = 4


S, N2, N4 = Field.STRING, Field.NUMBER2, Field.NUMBER4


@dataclass(frozen=True)
class Message:
    """Base of every Malamute message. ``ID`` and ``FIELDS`` describe the header layout."""

    ID: ClassVar[MessageId]
    FIELDS: ClassVar[tuple[tuple[str, Field], ...]] = ()
    HAS_CONTENT: ClassVar[bool] = False


def _message(mid: MessageId, fields: tuple = (), content: bool = False):
    def wrap(cls):
        cls.ID = mid
        cls.FIELDS = fields
        cls.HAS_CONTENT = content
        return cls

    return wrap


@_message(MessageId.CONNECTION_OPEN, (("protocol", S), ("version", N2), ("address", S)))
@dataclass(frozen=True)
class ConnectionOpen(Message):
    address: str = ""
    protocol: str = PROTOCOL_NAME
    version: int = PROTOCOL_VERSION


@_message(MessageId.CONNECTION_PING)
@dataclass(frozen=True)
class ConnectionPing(Message):
    pass


@_message(MessageId.CONNECTION_PONG)
@dataclass(frozen=True)
class ConnectionPong(Message):
    pass


@_message(MessageId.CONNECTION_CLOSE)
@dataclass(frozen=True)
class ConnectionClose(Message):
    pass


@_message(MessageId.STREAM_WRITE, (("stream", S),))
@dataclass(frozen=True)
class StreamWrite(Message):
    stream: str


@_message(MessageId.STREAM_READ, (("stream", S), ("pattern", S)))
@dataclass(frozen=True)
class StreamRead(Message):
    stream: str
    pattern: str = ""


@_message(MessageId.STREAM_SEND, (("subject", S),), content=True)
@dataclass(frozen=True)
class StreamSend(Message):
    subject: str
    content: Sequence[Frame] = ()


@_message(MessageId.STREAM_DELIVER, (("address", S), ("sender", S), ("subject", S)), content=True)
@dataclass(frozen=True)
class StreamDeliver(Message):
    address: str
    sender: str
    subject: str
    content: Sequence[Frame] = ()


@_message(
    MessageId.MAILBOX_SEND,
    (("address", S), ("subject", S), ("tracker", S), ("timeout", N4)),
    content=True,
)
@dataclass(frozen=True)
class MailboxSend(Message):
    address: str
    subject: str
    tracker: str = ""
    timeout: int = 0
    content: Sequence[Frame] = ()


@_message(
    MessageId.MAILBOX_DELIVER,
    (("sender", S), ("address", S), ("subject", S), ("tracker", S)),
    content=True,
)
@dataclass(frozen=True)
class MailboxDeliver(Message):
    sender: str
    address: str
    subject: str
    tracker: str = ""
    content: Sequence[Frame] = ()


@_message(
    MessageId.SERVICE_SEND,
    (("address", S), ("subject", S), ("tracker", S), ("timeout", N4)),
    content=True,
)
@dataclass(frozen=True)
class ServiceSend(Message):
    address: str
    subject: str
    tracker: str = ""
    timeout: int = 0
    content: Sequence[Frame] = ()


@_message(MessageId.SERVICE_OFFER, (("address", S), ("pattern", S)))
@dataclass(frozen=True)
class ServiceOffer(Message):
    address: str
    pattern: str = ""


@_message(
    MessageId.SERVICE_DELIVER,
    (("sender", S), ("address", S), ("subject", S), ("tracker", S)),
    content=True,
)
@dataclass(frozen=True)
class ServiceDeliver(Message):
    sender: str
    address: str
    subject: str
    tracker: str = ""
    content: Sequence[Frame] = ()


@_message(MessageId.OK, (("code", N2), ("reason", S)))
@dataclass(frozen=True)
class Ok(Message):
    code: int = StatusCode.SUCCESS
    reason: str = ""


@_message(MessageId.ERROR, (("code", N2), ("reason", S)))
@dataclass(frozen=True)
class Error(Message):
    code: int = StatusCode.COMMAND_INVALID
    reason: str = ""


@_message(MessageId.CREDIT, (("amount", N2),))
@dataclass(frozen=True)
class Credit(Message):
    amount: int


@_message(MessageId.CONFIRM, (("tracker", S), ("code", N2), ("reason", S)))
@dataclass(frozen=True)
class Confirm(Message):
    tracker: str
    code: int = StatusCode.SUCCESS
    reason: str = ""


@_message(MessageId.STREAM_CANCEL, (("stream", S),))
@dataclass(frozen=True)
class StreamCancel(Message):
    stream: str


MESSAGE_TYPES: dict[int, type[Message]] = {
    cls.ID: cls
    for cls in (
        ConnectionOpen, ConnectionPing, ConnectionPong, ConnectionClose, StreamWrite, StreamRead,
        StreamSend, StreamDeliver, MailboxSend, MailboxDeliver, ServiceSend, ServiceOffer,
        ServiceDeliver, Ok, Error, Credit, Confirm, StreamCancel,
    )
}

#: Messages the server never answers (observed): the client must not wait for a reply.
UNANSWERED = frozenset({MessageId.STREAM_SEND, MessageId.MAILBOX_SEND, MessageId.SERVICE_SEND, MessageId.CREDIT})
#: Messages sent by a client / by a server (a server-side decoder may refuse the others).
CLIENT_MESSAGES = frozenset({
    MessageId.CONNECTION_OPEN, MessageId.CONNECTION_PING, MessageId.CONNECTION_CLOSE,
    MessageId.STREAM_WRITE, MessageId.STREAM_READ, MessageId.STREAM_SEND, MessageId.STREAM_CANCEL,
    MessageId.MAILBOX_SEND, MessageId.SERVICE_SEND, MessageId.SERVICE_OFFER, MessageId.CREDIT,
    MessageId.CONFIRM,
})
SERVER_MESSAGES = frozenset({
    MessageId.CONNECTION_PONG, MessageId.STREAM_DELIVER, MessageId.MAILBOX_DELIVER,
    MessageId.SERVICE_DELIVER, MessageId.OK, MessageId.ERROR, MessageId.CONFIRM,
})



def _strings_only_layouts() -> dict:
    """id byte -> (class, id, field count, has content) for messages whose header fields are all
    strings and whose constructor takes them in wire order: ``decode``'s fast path."""
    import dataclasses
    out = {}
    for mid, cls in MESSAGE_TYPES.items():
        names = [name for name, _ in cls.FIELDS]
        init = [f.name for f in dataclasses.fields(cls) if f.name != "content"]
        if all(kind is S for _, kind in cls.FIELDS) and names == init:
            out[int(mid)] = (cls, MessageId(mid), len(names), cls.HAS_CONTENT, tuple(names))
    return out


_STRINGS_ONLY = _strings_only_layouts()

#: header bytes -> (class, id, {field: value}) of strings-only headers decoded lately: a consumer's
#: deliveries mostly repeat one header (the same sender, address or stream, subject and no tracker),
#: so its fields are decoded once per distinct header, not once per message. Emptied when full.
_RECENT_HEADERS: dict = {}
_DELIVERY_IDS = frozenset({MessageId.STREAM_DELIVER, MessageId.MAILBOX_DELIVER, MessageId.SERVICE_DELIVER})
_RECENT_MAX = 4096


def _fast_instance(cls, fields: dict, content):
    """``cls(**fields, content=content)`` without the frozen dataclass's ``__init__`` (which sets each
    field through ``object.__setattr__``: a third of a delivery's decoding): every field is given,
    the values come from the decoder, and no message class has a ``__post_init__``."""
    message = object.__new__(cls)
    state = message.__dict__
    state.update(fields)
    if content is not None:
        state["content"] = content
    return message

# ---------------------------------------------------------------- encoding

def encode_string(value: str | bytes) -> bytes:
    """A length-prefixed string; ``LocalProtocolError`` if longer than 255 bytes."""
    raw = value if isinstance(value, (bytes, bytearray)) else value.encode(_ENCODING, _ERRORS)
    if len(raw) > MAX_STRING:
        raise LocalProtocolError(f"Malamute strings are at most {MAX_STRING} bytes, got {len(raw)}")
    return bytes((len(raw),)) + raw


def encode_header(message: Message) -> bytes:
    parts = [SIGNATURE, bytes((message.ID,))]
    for name, kind in message.FIELDS:
        value = getattr(message, name)
        if kind is S:
            parts.append(encode_string(value))
        else:
            limit = MAX_NUMBER2 if kind is N2 else MAX_NUMBER4
            if not isinstance(value, int) or not 0 <= value <= limit:
                raise LocalProtocolError(f"{type(message).__name__}.{name} must be an integer 0..{limit}, got {value!r}")
            parts.append((_N2 if kind is N2 else _N4).pack(value))
    return b"".join(parts)


def encode(message: Message) -> list:
    """Frames of one message: the header, then the content frames (if the message has content)."""
    header = encode_header(message)
    if message.HAS_CONTENT:
        return [header, *message.content]
    return [header]


# ---------------------------------------------------------------- decoding

def _string(buf: bytes, offset: int, what: str) -> tuple[str, int]:
    if offset >= len(buf):
        raise RemoteProtocolError(f"truncated header: missing {what}")
    size = buf[offset]
    end = offset + 1 + size
    if end > len(buf):
        raise RemoteProtocolError(f"truncated header: {what} claims {size} bytes, {len(buf) - offset - 1} left")
    return buf[offset + 1:end].decode(_ENCODING, _ERRORS), end


def _number(buf: bytes, offset: int, st: struct.Struct, what: str) -> tuple[int, int]:
    if offset + st.size > len(buf):
        raise RemoteProtocolError(f"truncated header: missing {what}")
    return st.unpack_from(buf, offset)[0], offset + st.size


def peek_id(header: Frame) -> MessageId:
    """The message id of a header frame, checking only the signature and the id."""
    if len(header) < HEADER_PREFIX_LEN:
        raise RemoteProtocolError(f"header frame of {len(header)} bytes is shorter than signature + id")
    sig, mid = _SIG_ID.unpack_from(header, 0)
    if sig != _SIGNATURE_VALUE:
        raise RemoteProtocolError(f"bad signature {bytes(header[:2]).hex()}, expected aaa8")
    try:
        return MessageId(mid)
    except ValueError:
        raise RemoteProtocolError(f"unknown message id {mid}") from None


def decode(frames: Sequence[Frame], allowed: frozenset | None = None) -> Message:
    """Decode one multipart message. ``allowed`` restricts the acceptable ids (e.g. ``SERVER_MESSAGES``).

    Messages whose header holds only strings (the deliveries among them: every received message
    but the replies) take a fast path; anything it does not accept goes through the general decoder,
    which raises the precise error."""
    if frames:
        header = frames[0]
        if not isinstance(header, bytes):
            header = bytes(header)
        known = _known_header(header)
        if known is not None:
            cls, mid, fields = known
            if allowed is None or mid in allowed:
                if cls.HAS_CONTENT:
                    return _fast_instance(cls, fields, list(frames[1:]))
                if len(frames) == 1:
                    return _fast_instance(cls, fields, None)
        return _decode_general([header, *frames[1:]], allowed)
    return _decode_general(frames, allowed)


def delivery_fields(header: bytes) -> Optional[dict]:
    """The fields of a delivery's header frame (STREAM-, MAILBOX- or SERVICE-DELIVER; decoded once
    per distinct header, then shared: do not change the dict), or None for any other header,
    malformed ones included (``decode`` names what is wrong with those). A receiver can take a
    delivery's content frames as they are, without a message object per delivery."""
    known = _known_header(header)
    return known[2] if known is not None and known[1] in _DELIVERY_IDS else None


def _known_header(header: bytes):
    """``(class, id, fields)`` of a header frame that holds only strings and is well formed, from
    the cache of recent headers (a stream of deliveries repeats a few); None otherwise."""
    known = _RECENT_HEADERS.get(header)
    if known is not None:
        return known
    n = len(header)
    fast = _STRINGS_ONLY.get(header[2]) if n >= HEADER_PREFIX_LEN and header[0] == 0xAA and \
        header[1] == 0xA8 else None
    if fast is None:
        return None
    cls, mid, count, has_content, names = fast
    values = []
    offset = HEADER_PREFIX_LEN
    for _ in range(count):
        if offset >= n:
            return None
        end = offset + 1 + header[offset]
        if end > n:
            return None
        values.append(header[offset + 1:end].decode(_ENCODING, _ERRORS))
        offset = end
    if offset != n:
        return None
    if len(_RECENT_HEADERS) >= _RECENT_MAX:
        _RECENT_HEADERS.clear()
    known = _RECENT_HEADERS[header] = (cls, mid, dict(zip(names, values)))
    return known


def _decode_general(frames: Sequence[Frame], allowed: frozenset | None) -> Message:
    if not frames:
        raise RemoteProtocolError("empty message: no header frame")
    header = frames[0]
    if not isinstance(header, bytes):
        header = bytes(header)
    mid = peek_id(header)
    if allowed is not None and mid not in allowed:
        raise RemoteProtocolError(f"{mid.name} is not allowed in this direction")
    cls = MESSAGE_TYPES[mid]
    kwargs = {}
    offset = HEADER_PREFIX_LEN
    for name, kind in cls.FIELDS:
        if kind is S:
            kwargs[name], offset = _string(header, offset, name)
        else:
            kwargs[name], offset = _number(header, offset, _N2 if kind is N2 else _N4, name)
    if offset != len(header):
        raise RemoteProtocolError(f"{mid.name} header has {len(header) - offset} trailing bytes")
    if cls.HAS_CONTENT:
        kwargs["content"] = list(frames[1:])
    elif len(frames) > 1:
        raise RemoteProtocolError(f"{mid.name} carries no content but came with {len(frames) - 1} extra frames")
    return cls(**kwargs)


