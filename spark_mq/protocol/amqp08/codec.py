"""AMQP 0-8 primitive types and field tables, and the base classes of generated methods/properties.

Pure functions over bytes: no sockets, threads or clocks. Decoders take ``(buf, offset)`` and return
``(value, new_offset)``; they may raise ``struct.error``/``IndexError``/``UnicodeDecodeError`` on
truncated or malformed input, which the frame layer turns into ``RemoteProtocolError``.

A field-table timestamp past the year 9999 decodes as a ``RawTimestamp`` (its seconds), not an error.

Field tables cover the 0-8 types (S I D T F) and the wider ones RabbitMQ sends (t b B s u i l f d x A V).
"""

from __future__ import annotations

import datetime as _dt
from decimal import Decimal
from struct import Struct

from spark_mq.errors import LocalProtocolError, RemoteProtocolError

_S_B = Struct(">B")
_S_b = Struct(">b")
_S_H = Struct(">H")
_S_h = Struct(">h")
_S_I = Struct(">I")
_S_i = Struct(">i")
_S_Q = Struct(">Q")
_S_q = Struct(">q")
_S_f = Struct(">f")
_S_d = Struct(">d")
_S_BI = Struct(">BI")
_S_Bi = Struct(">Bi")

_unpack_I = _S_I.unpack_from
_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)

SHORTSTR_MAX = 255
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def _str(raw) -> str:
    """Decode a short string: UTF-8, with undecodable bytes kept (surrogateescape) so it round-trips."""
    return str(raw, "utf-8", "surrogateescape")


def encode_shortstr(value) -> bytes:
    raw = value.encode("utf-8", "surrogateescape") if isinstance(value, str) else bytes(value)
    if len(raw) > SHORTSTR_MAX:
        raise LocalProtocolError(f"short string of {len(raw)} bytes exceeds {SHORTSTR_MAX}: {raw[:40]!r}...")
    return _S_B.pack(len(raw)) + raw


def encode_longstr(value) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else bytes(value)
    return _S_I.pack(len(raw)) + raw


# -- field tables ------------------------------------------------------------------------------


def encode_table(table) -> bytes:
    """Encode a mapping as a field table (length-prefixed). ``None`` encodes as an empty table."""
    if not table:
        return b"\x00\x00\x00\x00"
    pieces = []
    for key, value in table.items():
        if not isinstance(key, str):
            raise LocalProtocolError(f"field table keys must be str, got {type(key).__name__} {key!r}")
        pieces.append(encode_shortstr(key))
        pieces.append(_encode_value(key, value))
    body = b"".join(pieces)
    return _S_I.pack(len(body)) + body


def _encode_value(key, value) -> bytes:
    # order matters: bool is an int, datetime before generic objects
    if isinstance(value, bool):
        return b"t\x01" if value else b"t\x00"
    if isinstance(value, RawTimestamp):
        return b"T" + _S_Q.pack(value)
    if isinstance(value, int):
        if INT32_MIN <= value <= INT32_MAX:
            return b"I" + _S_i.pack(value)
        if INT64_MIN <= value <= INT64_MAX:
            return b"l" + _S_q.pack(value)
        raise LocalProtocolError(f"field {key!r}: integer {value} does not fit in 64 bits")
    if isinstance(value, str):
        raw = value.encode("utf-8", "surrogateescape")
        return b"S" + _S_I.pack(len(raw)) + raw
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        return b"x" + _S_I.pack(len(raw)) + raw
    if isinstance(value, float):
        return b"d" + _S_d.pack(value)
    if isinstance(value, Decimal):
        sign, digits, exponent = value.as_tuple()
        if not isinstance(exponent, int):
            raise LocalProtocolError(f"field {key!r}: cannot encode {value} as a decimal")
        scale = max(0, -exponent)
        unscaled = int(value.scaleb(scale))
        if scale > 255 or not INT32_MIN <= unscaled <= INT32_MAX:
            raise LocalProtocolError(f"field {key!r}: decimal {value} does not fit (scale octet, 32-bit value)")
        return b"D" + _S_Bi.pack(scale, unscaled)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=_dt.timezone.utc)
        return b"T" + _S_Q.pack(int((value - _EPOCH).total_seconds()))
    if isinstance(value, dict):
        return b"F" + encode_table(value)
    if isinstance(value, (list, tuple)):
        body = b"".join(_encode_value(key, v) for v in value)
        return b"A" + _S_I.pack(len(body)) + body
    if value is None:
        return b"V"
    raise LocalProtocolError(f"field {key!r}: cannot encode {type(value).__name__} in a field table")


def decode_table(buf, o: int) -> tuple[dict, int]:
    size = _unpack_I(buf, o)[0]
    o += 4
    end = o + size
    if end > len(buf):
        raise RemoteProtocolError(f"field table of {size} bytes runs past the end of its frame")
    table = {}
    while o < end:
        n = buf[o]
        key = _str(buf[o + 1 : o + 1 + n])
        o += 1 + n
        table[key], o = _decode_value(buf, o)
    if o != end:
        raise RemoteProtocolError(f"field table overran its declared size {size} by {o - end} bytes")
    return table, o


def _decode_array(buf, o: int) -> tuple[list, int]:
    size = _unpack_I(buf, o)[0]
    o += 4
    end = o + size
    if end > len(buf):
        raise RemoteProtocolError(f"field array of {size} bytes runs past the end of its frame")
    out = []
    while o < end:
        value, o = _decode_value(buf, o)
        out.append(value)
    if o != end:
        raise RemoteProtocolError(f"field array overran its declared size {size} by {o - end} bytes")
    return out, o


def _decode_longstr_value(buf, o):
    n = _unpack_I(buf, o)[0]
    raw = bytes(buf[o + 4 : o + 4 + n])
    if len(raw) != n:
        raise RemoteProtocolError("long string runs past the end of its frame")
    try:
        return raw.decode("utf-8"), o + 4 + n
    except UnicodeDecodeError:
        return raw, o + 4 + n


def _decode_bytes_value(buf, o):
    n = _unpack_I(buf, o)[0]
    raw = bytes(buf[o + 4 : o + 4 + n])
    if len(raw) != n:
        raise RemoteProtocolError("byte array runs past the end of its frame")
    return raw, o + 4 + n


def _decode_decimal(buf, o):
    scale, unscaled = _S_Bi.unpack_from(buf, o)
    return Decimal(unscaled).scaleb(-scale), o + 5


class RawTimestamp(int):
    """A field-table timestamp past what ``datetime`` holds (years 1-9999), kept as its count of
    seconds since the epoch. Other clients send milliseconds where AMQP means seconds (the year
    58,000 for a date of 2026): failing the decode dropped the connection at every redelivery of
    such a message; kept as the number, the sender's value is there to read, and it encodes back
    as the same timestamp."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"RawTimestamp({int(self)})"

    __str__ = int.__repr__


def _decode_timestamp(buf, o):
    seconds = _S_Q.unpack_from(buf, o)[0]
    try:
        return _EPOCH + _dt.timedelta(seconds=seconds), o + 8
    except OverflowError:
        return RawTimestamp(seconds), o + 8


def _fixed(struct: Struct, convert=None):
    size = struct.size
    unpack = struct.unpack_from
    if convert is None:
        return lambda buf, o: (unpack(buf, o)[0], o + size)
    return lambda buf, o: (convert(unpack(buf, o)[0]), o + size)


_VALUE_DECODERS = {
    ord("t"): _fixed(_S_B, bool),
    ord("b"): _fixed(_S_b),
    ord("B"): _fixed(_S_B),
    ord("s"): _fixed(_S_h),
    ord("u"): _fixed(_S_H),
    ord("I"): _fixed(_S_i),
    ord("i"): _fixed(_S_I),
    ord("l"): _fixed(_S_q),
    ord("L"): _fixed(_S_Q),
    ord("f"): _fixed(_S_f),
    ord("d"): _fixed(_S_d),
    ord("D"): _decode_decimal,
    ord("S"): _decode_longstr_value,
    ord("x"): _decode_bytes_value,
    ord("T"): _decode_timestamp,
    ord("F"): decode_table,
    ord("A"): _decode_array,
    ord("V"): lambda buf, o: (None, o),
}


def _decode_value(buf, o: int):
    kind = buf[o]
    decoder = _VALUE_DECODERS.get(kind)
    if decoder is None:
        raise RemoteProtocolError(f"unknown field table value type {chr(kind)!r} (0x{kind:02X})")
    return decoder(buf, o + 1)


# -- base classes of the generated code ----------------------------------------------------------


class Method:
    """Base of generated method classes. Subclasses define ids, FIELDS, encode and decode."""

    __slots__ = ()
    NAME = ""
    CLASS_ID = 0
    METHOD_ID = 0
    INDEX = 0
    SYNCHRONOUS = False
    HAS_CONTENT = False
    CLIENT_MAY_SEND = False
    SERVER_MAY_SEND = False
    FIELDS: tuple = ()
    RESPONSES: tuple = ()

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and all(getattr(self, f) == getattr(other, f) for f in self.FIELDS)

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS)
        return f"<{self.NAME}({args})>"


class Properties:
    """Base of generated content-header property classes; absent properties are None."""

    __slots__ = ()
    CLASS_ID = 0
    FIELDS: tuple = ()

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and all(getattr(self, f) == getattr(other, f) for f in self.FIELDS)

    def __repr__(self) -> str:
        args = ", ".join(f"{f}={getattr(self, f)!r}" for f in self.FIELDS if getattr(self, f) is not None)
        return f"<{type(self).__name__}({args})>"

