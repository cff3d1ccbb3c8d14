"""Arrow column -> Python values for the sink encoders, a whole column at a time.

Responsible for: the conversions every sink shares (bodies to bytes, nulls to defaults, maps to
dicts, integer and timestamp columns checked for range, deterministic ids filled in where a row
has none), done with pyarrow kernels and list comprehensions rather than per-value Python calls.
A value the protocol cannot carry raises ``SinkDataError`` naming the column. Not responsible for
which columns exist (``columns``) or for building protocol messages (the protocol modules).
"""

from __future__ import annotations

from itertools import repeat
from typing import Any, Optional

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq.errors import SparkMqError

__all__ = ["SinkDataError", "bodies", "strings", "constant", "octets", "epoch_seconds", "string_maps",
           "frames", "message_ids"]

_MICROS = 1_000_000
_UTF8 = "utf-8"


class SinkDataError(SparkMqError, ValueError):
    """A row holds a value the broker protocol cannot carry (the task fails; its transaction rolls back)."""


def bodies(array: pa.Array) -> list:
    """Bytes bodies; strings are UTF-8 encoded and nulls become empty bodies."""
    values = array.to_pylist()
    if pa.types.is_string(array.type) or pa.types.is_large_string(array.type):
        return [b"" if v is None else v.encode(_UTF8) for v in values]
    if array.null_count:
        return [b"" if v is None else v for v in values]
    return values


def constant(value: Any, n: int):
    return repeat(value, n)


def strings(array: Optional[pa.Array], default: Optional[str], n: int):
    """Per-row strings: the column's value, or ``default`` where the column is null or absent."""
    if array is None:
        return repeat(default, n)
    values = array.to_pylist()
    if default is None or not array.null_count:
        return values
    return [default if v is None else v for v in values]


def octets(array: Optional[pa.Array], default: Optional[int], n: int, name: str, lo: int = 0, hi: int = 255):
    """Small integers checked against ``lo..hi`` (AMQP octets); nulls take ``default``."""
    if array is None:
        return repeat(default, n)
    if len(array) > array.null_count:
        smallest, largest = pc.min_max(array).values()
        if smallest.as_py() < lo or largest.as_py() > hi:
            raise SinkDataError(f"column {name!r} holds {smallest.as_py()}..{largest.as_py()}, "
                                f"outside the protocol's range {lo}..{hi}")
    values = array.to_pylist()
    if default is None or not array.null_count:
        return values
    return [default if v is None else v for v in values]


def epoch_seconds(array: Optional[pa.Array], n: int, name: str):
    """Timestamps (or bigint seconds) as non-negative whole seconds since the epoch; nulls stay None."""
    if array is None:
        return repeat(None, n)
    if pa.types.is_timestamp(array.type):
        unit = array.type.unit
        per_second = {"s": 1, "ms": 1000, "us": _MICROS, "ns": 1000 * _MICROS}[unit]
        array = pc.divide(array.cast(pa.int64()), per_second)
    if len(array) > array.null_count and pc.min(array).as_py() < 0:
        raise SinkDataError(f"column {name!r} holds a time before 1970, which the protocol cannot carry")
    return array.to_pylist()


def string_maps(array: Optional[pa.Array], n: int):
    """map<string,string> as dicts (None for null rows)."""
    if array is None:
        return repeat(None, n)
    return [None if v is None else dict(v) for v in array.to_pylist()]


def frames(array: Optional[pa.Array], n: int):
    """array<binary|string> as lists of bytes (None for null rows; null elements become empty frames)."""
    if array is None:
        return repeat(None, n)
    out = []
    for v in array.to_pylist():
        if v is None:
            out.append(None)
        else:
            out.append([b"" if f is None else (f.encode(_UTF8) if isinstance(f, str) else f) for f in v])
    return out


def message_ids(array: Optional[pa.Array], prefix: str, first_seq: int, n: int) -> list:
    """The row's own id where it has one, else ``prefix + str(seq)`` with seq from ``first_seq``."""
    generated = [f"{prefix}{seq}" for seq in range(first_seq, first_seq + n)]
    if array is None or array.null_count == len(array):
        return generated
    return [g if v is None else v for v, g in zip(array.to_pylist(), generated)]
