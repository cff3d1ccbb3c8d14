"""AMQP 0-8 framing: encode method/header/body/heartbeat frames and cut a byte stream into frames.

``FrameReader`` is incremental: feed it any chunks (whole stream, one byte at a time, or a frame
followed by the start of the next) and it yields ``(frame_type, channel, payload)`` for each
complete frame, keeping the remainder. It checks the frame-end octet, the negotiated frame-max and
the frame type, raising ``RemoteProtocolError`` that names the fault. No sockets, no clocks.
"""

from __future__ import annotations

from struct import Struct
from struct import error as StructError
from typing import Iterator

from spark_mq.errors import RemoteProtocolError
from spark_mq.protocol.amqp08.codec import Method
from spark_mq.protocol.amqp08.spec import FRAME_END, FRAME_MIN_SIZE, METHODS, FrameType

#: what a decoder over a truncated or malformed payload can raise before we translate it
DECODE_ERRORS = (StructError, IndexError, UnicodeDecodeError, ValueError, OverflowError)

_HEADER = Struct(">BHI")
HEADER_SIZE = _HEADER.size  # 7
FRAME_OVERHEAD = HEADER_SIZE + 1  # header + frame-end octet
_END = bytes([FRAME_END])
CONTENT_HEADER = Struct(">HHQ")  # class id, weight, body size
_CONTENT_HEADER = CONTENT_HEADER
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from

_METHOD = FrameType.METHOD
_HEADER_T = FrameType.HEADER
_BODY = FrameType.BODY
_HEARTBEAT = FrameType.HEARTBEAT
_KNOWN_TYPES = frozenset(int(t) for t in FrameType)

HEARTBEAT_FRAME = _pack_header(_HEARTBEAT, 0, 0) + _END


def method_frame(channel: int, payload: bytes) -> bytes:
    return b"".join((_pack_header(_METHOD, channel, len(payload)), payload, _END))


def content_frames(channel: int, class_id: int, properties: bytes, body, frame_max: int) -> list:
    """Header frame and body frames (split so no frame exceeds ``frame_max``), as a list of pieces."""
    size = len(body)
    header = _CONTENT_HEADER.pack(class_id, 0, size) + properties
    pieces = [_pack_header(_HEADER_T, channel, len(header)), header, _END]
    if size:
        chunk = frame_max - FRAME_OVERHEAD
        if size <= chunk:
            pieces += (_pack_header(_BODY, channel, size), body, _END)
        else:
            view = memoryview(body)
            for start in range(0, size, chunk):
                part = view[start : start + chunk]
                pieces += (_pack_header(_BODY, channel, len(part)), part, _END)
    return pieces


def decode_method(payload, channel: int = 0, methods: dict = METHODS) -> Method:
    """Decode a whole method frame payload (ids + arguments) with ``methods`` (a spec's ``METHODS``; 0-8's
    by default). Any fault is a ``RemoteProtocolError``."""
    if len(payload) < 4:
        raise RemoteProtocolError(f"method frame on channel {channel} is {len(payload)} bytes, too short")
    index = (payload[0] << 24) | (payload[1] << 16) | (payload[2] << 8) | payload[3]
    cls = methods.get(index)
    if cls is None:
        raise RemoteProtocolError(f"unknown method ({index >> 16}, {index & 0xFFFF}) on channel {channel}")
    try:
        method, end = cls.decode(payload, 4)
    except DECODE_ERRORS as exc:
        raise RemoteProtocolError(f"{cls.NAME} on channel {channel} is malformed: {exc}") from exc
    if end != len(payload):
        raise RemoteProtocolError(
            f"{cls.NAME} on channel {channel}: arguments take {end - 4} bytes but the frame has {len(payload) - 4}"
        )
    return method


def decode_content_header(payload) -> tuple[int, int, int]:
    """(class id, body size, offset of the property flags) of a content header frame payload."""
    if len(payload) < _CONTENT_HEADER.size + 2:
        raise RemoteProtocolError(f"content header frame of {len(payload)} bytes is too short")
    class_id, _weight, size = _CONTENT_HEADER.unpack_from(payload, 0)
    return class_id, size, _CONTENT_HEADER.size


class FrameReader:
    """Incremental frame splitter over a bytearray buffer trimmed once per ``feed``."""

    __slots__ = ("_buf", "frame_max")

    def __init__(self, frame_max: int = 0) -> None:
        self._buf = bytearray()
        #: 0 means "not negotiated yet": frames up to FRAME_MIN_SIZE are accepted then
        self.frame_max = frame_max

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed_all(self, data) -> list[tuple[int, int, bytes]]:
        """Append ``data``; return every frame now complete as (type, channel, payload)."""
        buf = self._buf
        buf += data
        limit = self.frame_max or FRAME_MIN_SIZE
        n = len(buf)
        o = 0
        out = []
        append = out.append
        try:
            while n - o >= HEADER_SIZE:
                ftype, channel, size = _unpack_header(buf, o)
                end = o + HEADER_SIZE + size
                if size + FRAME_OVERHEAD > limit:
                    raise RemoteProtocolError(
                        f"frame of {size + FRAME_OVERHEAD} bytes (type {ftype}, channel {channel}) "
                        f"exceeds the negotiated frame-max {limit}"
                    )
                if ftype not in _KNOWN_TYPES:
                    raise RemoteProtocolError(f"unknown frame type {ftype} on channel {channel}")
                if end >= n:
                    break
                if buf[end] != FRAME_END:
                    raise RemoteProtocolError(
                        f"frame (type {ftype}, channel {channel}, size {size}) ends with 0x{buf[end]:02X}, "
                        f"not the frame-end octet 0x{FRAME_END:02X}"
                    )
                append((ftype, channel, bytes(buf[o + HEADER_SIZE : end])))
                o = end + 1
        finally:
            if o:
                del buf[:o]
        return out

    def feed(self, data) -> Iterator[tuple[int, int, bytes]]:
        return iter(self.feed_all(data))
