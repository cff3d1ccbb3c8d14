"""Source schemas of the three formats and their Arrow twins.

Responsible for: the columns every source produces (the core columns shared by all formats, then
each protocol's own), the exact Arrow schema Spark expects for them (``to_arrow_schema``: what
pyspark's converter gives with timezone UTC, built here without a SparkSession so the ingest thread
and the tests can use it anywhere), building Arrow record batches from rows, and projecting stored
batches onto a user-given subset schema. Not responsible for reading messages or files.

Core columns (same names, types and order in every format)::

    body binary, destination string, message_id string, timestamp timestamp,
    headers map<string,string>, redelivered boolean, offset long

``timestamp`` is the message's own timestamp when the protocol carries one (AMQP ``timestamp``
property, seconds; STOMP ``timestamp`` header, ms, as ActiveMQ sends it) and otherwise the time the
source received it. ``offset`` is the message's position in the source log.

Malamute's ``frames`` is null when the message has exactly one frame (that frame is ``body``),
and otherwise holds all of its frames, ``body`` included: the sinks read it the same way ("when not
null, the whole content"). A ``[body]`` list for every single-frame message would ship each body
twice to Spark (measured: 12-15% of a 4 KiB read's time). The source log stores batches in the
source schema.

At the package root, not under ``sources``, because the sinks use it too (a bridge's columns are
the source's: ``SOURCE_COLUMNS``, ``struct_of``; ``ID_HEADER``), and sources and sinks share a
layer with no imports between them.
"""

from __future__ import annotations

from typing import Sequence

import pyarrow as pa

from spark_mq.arrowcols import column
from spark_mq.errors import SparkMqError

__all__ = [
    "CORE_COLUMNS", "SOURCE_COLUMNS", "COLUMN_INDEX", "BODY", "DESTINATION", "MESSAGE_ID", "TIMESTAMP", "HEADERS",
    "REDELIVERED", "OFFSET", "ID_HEADER", "struct_of", "SchemaError", "source_schema", "source_ddl",
    "source_arrow_schema", "to_arrow_schema", "build_batch", "project", "check_user_schema", "frames_value", "row_bytes_function",
]


#: The header in which the STOMP sink carries a message's deterministic id (brokers replace ``message-id``
#: on delivery). Sources take it as the message's stable id: it is the same on every broker and in every
#: replay of the batch that sent it, where the broker's ids are not.
ID_HEADER = "spark-mq-message-id"


class SchemaError(SparkMqError, ValueError):
    """A user schema asks for columns the source cannot give, or with other types."""


# Spark DDL type -> Arrow type, for the types the sources use (as pyspark converts them, tz UTC).
_MAP_SS = pa.map_(pa.string(), pa.string())
ARROW_TYPES = {
    "binary": pa.binary(),
    "string": pa.string(),
    "timestamp": pa.timestamp("us", tz="UTC"),
    "map<string,string>": _MAP_SS,
    "boolean": pa.bool_(),
    "bigint": pa.int64(),
    "int": pa.int32(),
    "array<binary>": pa.list_(pa.field("element", pa.binary())),
}

CORE_COLUMNS: tuple = (
    ("body", "binary"),
    ("destination", "string"),
    ("message_id", "string"),
    ("timestamp", "timestamp"),
    ("headers", "map<string,string>"),
    ("redelivered", "boolean"),
    ("offset", "bigint"),
)

_OWN_COLUMNS = {
    "amqp08": (
        ("exchange", "string"),
        ("routing_key", "string"),
        ("delivery_tag", "bigint"),
        ("content_type", "string"),
        ("content_encoding", "string"),
        ("delivery_mode", "int"),
        ("priority", "int"),
        ("correlation_id", "string"),
        ("reply_to", "string"),
        ("expiration", "string"),
        ("type", "string"),
        ("user_id", "string"),
        ("app_id", "string"),
        ("cluster_id", "string"),
    ),
    "stomp": (
        ("subscription", "string"),
        ("content_type", "string"),
        ("correlation_id", "string"),
        ("reply_to", "string"),
        ("priority", "int"),
        ("expires", "bigint"),
    ),
    "malamute": (
        ("sender", "string"),
        ("address", "string"),
        ("subject", "string"),
        ("tracker", "string"),
        ("frames", "array<binary>"),
    ),
}

SOURCE_COLUMNS = {fmt: CORE_COLUMNS + own for fmt, own in _OWN_COLUMNS.items()}

#: a column's position in a format's row tuple: ``COLUMN_INDEX[fmt][name]``
COLUMN_INDEX = {fmt: {name: i for i, (name, _) in enumerate(cols)} for fmt, cols in SOURCE_COLUMNS.items()}
_CORE_INDEX = {name: i for i, (name, _) in enumerate(CORE_COLUMNS)}
#: positions of the core columns, the same in every format's row tuple
BODY, DESTINATION, MESSAGE_ID, TIMESTAMP, HEADERS, REDELIVERED, OFFSET = (
    _CORE_INDEX[name]
    for name in ("body", "destination", "message_id", "timestamp", "headers", "redelivered", "offset"))
_ARROW_CACHE: dict = {}


def _check_format(fmt: str) -> None:
    if fmt not in SOURCE_COLUMNS:
        raise SchemaError(f"no source schema for format {fmt!r}; known: {', '.join(sorted(SOURCE_COLUMNS))}")


def source_ddl(fmt: str) -> str:
    """The source schema as a DDL string (what ``DataSource.schema()`` returns)."""
    _check_format(fmt)
    return ", ".join(f"{name} {typ}" for name, typ in SOURCE_COLUMNS[fmt])


def struct_of(fields) -> "object":
    """``(name, DDL type)`` pairs, in the types the sources use, as a pyspark ``StructType``."""
    from pyspark.sql.types import (
        ArrayType, BinaryType, BooleanType, IntegerType, LongType, MapType, StringType, StructField, StructType,
        TimestampType,
    )
    spark_types = {
        "binary": BinaryType(), "string": StringType(), "timestamp": TimestampType(),
        "map<string,string>": MapType(StringType(), StringType()), "boolean": BooleanType(),
        "bigint": LongType(), "int": IntegerType(), "array<binary>": ArrayType(BinaryType()),
    }
    return StructType([StructField(name, spark_types[typ]) for name, typ in fields])


def source_schema(fmt: str):
    """The source schema as a pyspark ``StructType`` (imports pyspark)."""
    _check_format(fmt)
    return struct_of(SOURCE_COLUMNS[fmt])


def source_arrow_schema(fmt: str) -> pa.Schema:
    """The Arrow schema of stored and produced batches (equal to pyspark's conversion, tz UTC)."""
    schema = _ARROW_CACHE.get(fmt)
    if schema is None:
        _check_format(fmt)
        schema = _ARROW_CACHE[fmt] = pa.schema([pa.field(name, ARROW_TYPES[typ]) for name, typ in SOURCE_COLUMNS[fmt]])
    return schema


def row_bytes_function(fmt: str):
    """A function giving the bytes a row tuple (``SOURCE_COLUMNS[fmt]`` order) puts into binary
    columns: its body, plus for Malamute the ``frames`` list (it repeats a multi-frame message's
    body). What bounds one appended batch below Arrow's 2 GiB per column."""
    _check_format(fmt)
    body, frames = BODY, COLUMN_INDEX[fmt].get("frames")
    if frames is not None:
        return lambda row: len(row[body]) + (sum(map(len, row[frames])) if row[frames] else 0)
    return lambda row: len(row[body])


def frames_value(frames: list):
    """The ``frames`` column's value for a Malamute message's frames: None for exactly one frame."""
    return None if len(frames) == 1 else frames


def _arrow_type_of(data_type) -> pa.DataType:
    """Arrow type of a pyspark DataType (the subset the sources use)."""
    name = data_type.simpleString()
    try:
        return ARROW_TYPES[name]
    except KeyError:
        raise SchemaError(f"type {name} is not produced by spark-mq sources") from None


def to_arrow_schema(struct) -> pa.Schema:
    """Arrow schema for a pyspark ``StructType`` made of source column types (exactly as Spark wants it)."""
    return pa.schema([pa.field(f.name, _arrow_type_of(f.dataType), nullable=f.nullable) for f in struct.fields])


def build_batch(fmt: str, rows: Sequence[tuple]) -> pa.RecordBatch:
    """A record batch in the stored form from row tuples in ``SOURCE_COLUMNS[fmt]`` order.

    Values: bytes, str, ints (timestamp as microseconds since the epoch, UTC), bool, a list of
    (key, value) pairs or None for ``headers``, ``frames_value(frames)`` for ``frames``.
    """
    schema = source_arrow_schema(fmt)
    if not rows:
        return _empty_batch(schema)
    columns = list(zip(*rows))
    arrays = [column(col, field.type) for col, field in zip(columns, schema)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _empty_batch(schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def project(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` with the columns of ``target`` in its order; raise ``SchemaError`` if one is missing or
    has another type. A no-op when the schemas are equal."""
    if batch.schema.equals(target):
        return batch
    names = batch.schema.names
    arrays = []
    for field in target:
        if field.name not in names:
            raise SchemaError(f"column {field.name!r} is not a source column; available: {', '.join(names)}")
        column = batch.column(names.index(field.name))
        if not column.type.equals(field.type):
            raise SchemaError(f"column {field.name!r} is {column.type} in the source, not {field.type}")
        arrays.append(column)
    return pa.RecordBatch.from_arrays(arrays, schema=target)


def check_user_schema(fmt: str, target: pa.Schema) -> None:
    """Fail at planning time, naming the column, when a user schema cannot be served."""
    project(_empty_batch(source_arrow_schema(fmt)), target)

