"""Arrow columns from Python values, built from buffers (numpy) instead of ``pa.array``.

Responsible for: turning one column of Python values (bytes, str, int, bool, None, a list of
(key, value) pairs for a map, a list of bytes for a list column) into an Arrow array of the given
type, for the types the source schemas use. Not responsible for schemas (``spark_mq.schema``).

Why not ``pa.array``: its first call in a process imports pandas (pyarrow checks every sequence for
pandas objects), which costs 0.4 s on an idle machine and seconds on a busy one, inside the
ingest's first group: every query's reader process paid it, in Spark's Python workers too. Built
from buffers, a column costs one ``join`` of its values and a few numpy calls, with no per-value
Arrow conversion. ``pa.array`` stays the fallback for types this module does not build.

At the package root beside ``schema``, not under ``sources``: ``schema.build_batch`` builds its
columns here, and ``schema`` stays at the root for the sinks (see there).
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import pyarrow as pa

from spark_mq.errors import SparkMqError

__all__ = ["column", "offsets_array", "binary_ends", "repeated"]

log = logging.getLogger("spark_mq.arrowcols")

_INT32_MAX = 2**31 - 1


def offsets_array(offsets: np.ndarray) -> pa.Array:
    """An int32 Arrow array over ``offsets`` (no copy when already int32)."""
    data = np.ascontiguousarray(offsets, dtype=np.int32)
    return pa.Array.from_buffers(pa.int32(), len(data), [None, pa.py_buffer(data)])


def _validity(values: Sequence, n: int):
    """(validity bitmap, null count): bit i set when values[i] is not None; no bitmap when no value
    or every value is null (callers build ``pa.nulls`` then)."""
    count = getattr(values, "count", None)  # tuple/list: counted in C, the common no-null case
    nulls = count(None) if count is not None else sum(v is None for v in values)
    if nulls == 0 or nulls == n:
        return None, nulls
    present = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    return pa.py_buffer(np.packbits(present, bitorder="little")), nulls


def _utf8(text: str) -> bytes:
    """Valid UTF-8 for an Arrow string: the protocol decoders keep undecodable bytes as lone
    surrogates (``surrogateescape``, so they round-trip through the clients); here the original
    bytes' undecodable parts become U+FFFD, as any UTF-8 reader would show them."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no decoder of ours makes: "?"
        raw = text.encode("utf-8", "replace")
    return raw.decode("utf-8", "replace").encode()


def _binary(values: Sequence, type_: pa.DataType, n: int) -> pa.Array:
    if pa.types.is_string(type_):
        return _strings(values, type_, n)
    validity, nulls = _validity(values, n)
    if nulls == n:
        return pa.nulls(n, type_)
    items = [v if v is not None else b"" for v in values] if nulls else values
    return _from_items(items, type_, n, validity, nulls, b"".join(items))


def _from_items(items: Sequence, type_: pa.DataType, n: int, validity, nulls: int, data: bytes) -> pa.Array:
    """A binary/string array over ``data``, the concatenation of ``items`` (whose ``len`` is their
    size in ``data``)."""
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, items), dtype=np.int64, count=n), out=offsets[1:])
    if offsets[-1] > _INT32_MAX:
        raise SparkMqError(f"a group of {n} messages holds {offsets[-1]} bytes in one column, more than an Arrow "
                           f"binary column can (2 GiB): lower 'fsyncMessages'")
    return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)],
                                 null_count=nulls)


def _encode(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # undecodable bytes kept as lone surrogates by the protocol decoders
        return _utf8(text)


def _strings(values: Sequence, type_: pa.DataType, n: int) -> pa.Array:
    """A string column. Most string columns of a group hold one value in every row (the queue, the
    exchange, the sender's address): encoded once. Otherwise the values are joined and encoded in one
    call when they are ASCII (the usual ids and names: a character is then a byte), else one by one."""
    first = values[0] if n else None
    count = getattr(values, "count", None)
    if first is not None and count is not None and count(first) == n:  # an identity test per row, in C
        raw = _encode(first)
        if len(raw) * n > _INT32_MAX:
            raise SparkMqError(f"a group of {n} messages holds {len(raw) * n} bytes in one column, more than an "
                               f"Arrow string column can (2 GiB): lower 'fsyncMessages'")
        offsets = np.arange(n + 1, dtype=np.int32) * np.int32(len(raw))
        return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)], null_count=0)
    validity, nulls = _validity(values, n)
    if nulls == n:
        return pa.nulls(n, type_)
    texts = [v if v is not None else "" for v in values] if nulls else values
    joined = "".join(texts)
    if joined.isascii():
        return _from_items(texts, type_, n, validity, nulls, joined.encode("ascii"))
    items = [_encode(v) for v in texts]
    return _from_items(items, type_, n, validity, nulls, b"".join(items))


def _integers(values: Sequence, type_: pa.DataType, n: int) -> pa.Array:
    validity, nulls = _validity(values, n)
    if nulls == n:
        return pa.nulls(n, type_)
    dtype = np.int32 if type_.bit_width == 32 else np.int64
    try:
        data = np.fromiter((v if v is not None else 0 for v in values) if nulls else values, dtype=dtype, count=n)
    except OverflowError:
        # a value from the wire the column cannot hold (a STOMP priority of 3e9, an AMQP timestamp
        # near 2**64): null, rather than a message that fails every group it is in, forever
        info = np.iinfo(dtype)
        kept = [v if v is not None and info.min <= v <= info.max else None for v in values]
        log.warning("%d value(s) out of the range of a %s column stored as null", kept.count(None) - nulls, type_)
        return _integers(kept, type_, n)
    return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(data)], null_count=nulls)


def _booleans(values: Sequence, type_: pa.DataType, n: int) -> pa.Array:
    validity, nulls = _validity(values, n)
    if nulls == n:
        return pa.nulls(n, type_)
    if not any(values):  # the usual column: no redelivery in the group
        bits = np.zeros((n + 7) // 8, dtype=np.uint8)
    else:
        bits = np.packbits(np.fromiter(map(bool, values), dtype=bool, count=n), bitorder="little")
    return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(bits)], null_count=nulls)


def _list_offsets(values: Sequence, n: int) -> pa.Array:
    """int32 offsets of a list-like column (a null entry is empty)."""
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter((len(v) if v is not None else 0 for v in values), dtype=np.int64, count=n),
              out=offsets[1:])
    return offsets_array(offsets)


def _map(values: Sequence, type_: pa.MapType, n: int) -> pa.Array:
    """map<string,string> from lists of (key, value) pairs (or None)."""
    validity, nulls = _validity(values, n)
    if nulls == n:
        return pa.nulls(n, type_)
    off = _list_offsets(values, n)
    pairs = [kv for v in values if v for kv in v]
    keys = column([k for k, _ in pairs], type_.key_type)
    items = column([v for _, v in pairs], type_.item_type)
    if keys.null_count:
        raise SparkMqError("a header without a name cannot be a map key")
    arr = pa.MapArray.from_arrays(off, keys, items, type=type_)
    if nulls:  # from_arrays takes nulls from the offsets only: rebuild with the validity bitmap
        arr = pa.Array.from_buffers(type_, n, [validity, off.buffers()[1]], null_count=nulls,
                                    children=[arr.values])
    return arr


def _list(values: Sequence, type_: pa.ListType, n: int) -> pa.Array:
    validity, nulls = _validity(values, n)
    if nulls == n:
        return pa.nulls(n, type_)
    flat = column([x for v in values if v for x in v], type_.value_type)
    return pa.Array.from_buffers(type_, n, [validity, _list_offsets(values, n).buffers()[1]], null_count=nulls,
                                 children=[flat])


def binary_ends(data, ends, start: int = 0, type_: pa.DataType = pa.binary()) -> pa.Array:
    """A binary column over ``data`` itself (any bytes-like object: a ``memoryview`` of a
    ``bytearray``), no copy: value i is ``data[ends[i - 1] - start:ends[i] - start]``, the first
    from 0, as a receive path that copied each value in turn after ``start`` records them
    (``ends``: an ``array('q')`` or a sequence of ints). ``data`` can no longer be resized while
    the column lives. ``ValueError`` if ``ends`` go back or past ``data``: Arrow would read out of
    bounds."""
    n = len(ends)
    if n == 0:
        return pa.array([], type=type_)
    stops = np.asarray(ends, dtype=np.int64) - start
    last = int(stops[-1])
    if stops[0] < 0 or last > len(memoryview(data)) or (n > 1 and bool((stops[1:] < stops[:-1]).any())):
        raise ValueError(f"value ends {stops[:4].tolist()}..{last} do not lie in order within {len(data)} bytes")
    if last > _INT32_MAX:
        raise SparkMqError(f"a group of {n} messages holds {last} bytes in one column, more than an Arrow "
                           f"binary column can (2 GiB): lower 'fsyncMessages'")
    offsets = np.empty(n + 1, dtype=np.int32)
    offsets[0] = 0
    offsets[1:] = stops
    return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=0)


def repeated(value, n: int, type_: pa.DataType) -> pa.Array:
    """``value`` (None included) in each of ``n`` rows of a column of ``type_``."""
    if value is None:
        return pa.nulls(n, type_)
    if pa.types.is_integer(type_) or pa.types.is_timestamp(type_):
        data = np.full(n, value, dtype=np.int32 if type_.bit_width == 32 else np.int64)
        return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(data)], null_count=0)
    return column([value] * n, type_)


def column(values: Sequence, type_: pa.DataType) -> pa.Array:
    """``values`` (a sequence of Python values or None) as an Arrow array of ``type_``."""
    n = len(values)
    if pa.types.is_binary(type_) or pa.types.is_string(type_):
        return _binary(values, type_, n)
    if pa.types.is_int64(type_) or pa.types.is_int32(type_) or \
            (pa.types.is_timestamp(type_) and type_.unit == "us"):
        return _integers(values, type_, n)
    if pa.types.is_boolean(type_):
        return _booleans(values, type_, n)
    if pa.types.is_map(type_):
        return _map(values, type_, n)
    if pa.types.is_list(type_):
        return _list(values, type_, n)
    return pa.array(values, type=type_)
