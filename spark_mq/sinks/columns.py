"""Input columns of the sinks: which names each format reads, which Spark types they may have, and the
check at query start.

Responsible for: the column tables of the three sinks (``ColumnSpec``), ``validate`` (a missing
required column, a wrong type or an unknown column fails with ``SinkSchemaError`` naming the column
and what it accepts) and the resulting ``ColumnPlan``: where each known column sits in the input, so
the writers can take Arrow columns by position. Column names match case-insensitively, as in Spark.
Not responsible for converting values (the protocol modules do) or for options.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Optional

from pyspark.sql.types import (
    ArrayType, BinaryType, ByteType, DataType, IntegerType, LongType, MapType, ShortType, StringType,
    StructType, TimestampNTZType, TimestampType,
)

from spark_mq.errors import SparkMqError

__all__ = ["Kind", "ColumnSpec", "ColumnPlan", "SinkSchemaError", "validate"]


class SinkSchemaError(SparkMqError, ValueError):
    """The DataFrame written to a sink lacks a required column or has a column of the wrong type."""


class Kind(enum.Enum):
    """What a column holds, and so which Spark types it accepts."""

    BODY = "binary or string"
    STRING = "string"
    STRING_MAP = "map<string,string>"
    INTEGER = "integer (tinyint, smallint, int or bigint)"
    TIMESTAMP = "timestamp, or bigint seconds since the epoch"
    FRAMES = "array<binary> or array<string>"


_INTEGERS = (ByteType, ShortType, IntegerType, LongType)


def _accepts(kind: Kind, dtype: DataType) -> bool:
    if kind is Kind.BODY:
        return isinstance(dtype, (BinaryType, StringType))
    if kind is Kind.STRING:
        return isinstance(dtype, StringType)
    if kind is Kind.STRING_MAP:
        return (isinstance(dtype, MapType) and isinstance(dtype.keyType, StringType)
                and isinstance(dtype.valueType, StringType))
    if kind is Kind.INTEGER:
        return isinstance(dtype, _INTEGERS)
    if kind is Kind.TIMESTAMP:
        return isinstance(dtype, (TimestampType, TimestampNTZType, LongType))
    if kind is Kind.FRAMES:
        return isinstance(dtype, ArrayType) and isinstance(dtype.elementType, (BinaryType, StringType))
    raise ValueError(f"unknown column kind {kind}")  # pragma: no cover - the enum is closed


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    kind: Kind
    required: bool = False
    doc: str = ""


@dataclass(frozen=True)
class ColumnPlan:
    """Positions (in the input schema) of the known columns that are present; picklable."""

    format: str
    positions: tuple  # ((name, index, spark type simpleString), ...)

    def index(self, name: str) -> Optional[int]:
        for col, idx, _ in self.positions:
            if col == name:
                return idx
        return None

    def type_of(self, name: str) -> Optional[str]:
        for col, _, simple in self.positions:
            if col == name:
                return simple
        return None

    def __contains__(self, name: str) -> bool:
        return self.index(name) is not None

    @property
    def names(self) -> tuple:
        return tuple(col for col, _, _ in self.positions)


def validate(schema: StructType, specs: Iterable[ColumnSpec], fmt: str, *,
             ignore_extra: bool = False) -> ColumnPlan:
    """Check ``schema`` against the sink's columns; return where each known column is."""
    table = {spec.name.lower(): spec for spec in specs}
    accepted = ", ".join(f"{s.name} ({s.kind.value})" for s in table.values())
    errors: list[str] = []
    positions = []
    seen: dict[str, str] = {}
    for index, field in enumerate(schema.fields):
        key = field.name.lower()
        spec = table.get(key)
        if spec is None:
            if not ignore_extra:
                errors.append(f"column {field.name!r} is not a {fmt} sink column "
                              f"(set ignoreExtraColumns=true to ignore it)")
            continue
        if key in seen:
            errors.append(f"column {field.name!r} appears twice (also as {seen[key]!r})")
            continue
        seen[key] = field.name
        if not _accepts(spec.kind, field.dataType):
            errors.append(f"column {field.name!r} has type {field.dataType.simpleString()}, "
                          f"but the {fmt} sink needs {spec.kind.value}")
            continue
        positions.append((spec.name, index, field.dataType.simpleString()))
    for spec in table.values():
        if spec.required and spec.name.lower() not in seen:
            errors.append(f"required column {spec.name!r} ({spec.kind.value}) is missing")
    if errors:
        raise SinkSchemaError(f"the DataFrame cannot be written to the {fmt} sink: " + "; ".join(errors)
                              + f". Accepted columns: {accepted}.")
    return ColumnPlan(fmt, tuple(positions))
