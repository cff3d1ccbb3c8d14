"""Test helpers for the sinks: write-only DataSources over the sink entry points, and fault injection.

Responsible for: ``SinkOnlyAmqp08`` / ``SinkOnlyStomp`` / ``SinkOnlyMalamute`` (formats
``sinktest_amqp08``...), which call ``spark_mq.sinks.<proto>.create_writer`` and
``create_stream_writer`` exactly as the real DataSources do, so the sinks can be tested on their own;
and ``FaultySink`` (format ``sinktest_faulty``), which wraps a real sink writer and makes the input
of one partition fail after a number of rows, once per marker file: a task failure in the middle of
a partition, after part of it was published inside the open transaction.
Not for production use; nothing in the package imports this module.

FaultySink options: ``fault.format`` (amqp08, stomp or malamute), ``fault.partition`` (default 0),
``fault.afterRows`` (rows handed to the sink before the failure), ``fault.marker`` (a file path:
the failure happens only while it does not exist, and creates it); every other option goes to the
wrapped sink.
"""

from __future__ import annotations

import importlib
import os
from typing import Iterator

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter

from spark_mq.sinks.writer import HAS_STREAM_ARROW_WRITER, StreamArrowWriter

__all__ = ["SinkOnlyAmqp08", "SinkOnlyStomp", "SinkOnlyMalamute", "FaultySink", "InjectedFault", "register_all"]


class InjectedFault(RuntimeError):
    """The failure FaultySink injects."""


def _sinks(fmt: str):
    return importlib.import_module(f"spark_mq.sinks.{fmt}")


class _SinkOnly(DataSource):
    FORMAT = ""

    @classmethod
    def name(cls) -> str:
        return f"sinktest_{cls.FORMAT}"

    def writer(self, schema, overwrite):
        return _sinks(self.FORMAT).create_writer(self.options, schema, overwrite)

    def streamWriter(self, schema, overwrite):  # noqa: N802 - Spark's name
        return _sinks(self.FORMAT).create_stream_writer(self.options, schema, overwrite)


class SinkOnlyAmqp08(_SinkOnly):
    FORMAT = "amqp08"


class SinkOnlyStomp(_SinkOnly):
    FORMAT = "stomp"


class SinkOnlyMalamute(_SinkOnly):
    FORMAT = "malamute"


def _fail_after(batches: Iterator[pa.RecordBatch], rows: int, marker: str) -> Iterator[pa.RecordBatch]:
    seen = 0
    for batch in batches:
        if seen + batch.num_rows > rows:
            head = rows - seen
            if head > 0:
                yield batch.slice(0, head)
            with open(marker, "w", encoding="utf-8") as f:
                f.write(f"failed after {rows} rows\n")
            raise InjectedFault(f"injected task failure after {rows} rows")
        seen += batch.num_rows
        yield batch


_Base = StreamArrowWriter if HAS_STREAM_ARROW_WRITER else object


class _FaultyStreamWriter(_Base):  # type: ignore[misc, valid-type]
    def __init__(self, inner, partition: int, rows: int, marker: str) -> None:
        self.inner = inner
        self.plan = inner.plan
        self.fault = (partition, rows, marker)

    def write(self, iterator):
        from pyspark import TaskContext

        partition, rows, marker = self.fault
        ctx = TaskContext.get()
        if ctx is not None and ctx.partitionId() == partition and not os.path.exists(marker):
            iterator = _fail_after(iterator, rows, marker)
        return self.inner.write(iterator)


class FaultySink(DataSource):
    @classmethod
    def name(cls) -> str:
        return "sinktest_faulty"

    def streamWriter(self, schema, overwrite) -> DataSourceStreamWriter:  # noqa: N802 - Spark's name
        if not HAS_STREAM_ARROW_WRITER:  # pragma: no cover - pyspark 4.0
            raise RuntimeError("FaultySink needs pyspark 4.1+ (Arrow stream writer)")
        opts = {k: v for k, v in self.options.items() if not k.lower().startswith("fault.")}
        fmt = self.options["fault.format"]
        inner = _sinks(fmt).create_stream_writer(opts, schema, overwrite)
        return _FaultyStreamWriter(inner, int(self.options.get("fault.partition", "0")),
                                   int(self.options["fault.afterRows"]), self.options["fault.marker"])


def register_all(spark) -> None:
    for cls in (SinkOnlyAmqp08, SinkOnlyStomp, SinkOnlyMalamute, FaultySink):
        spark.dataSource.register(cls)
