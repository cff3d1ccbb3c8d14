"""Test helpers for the sinks: write-only DataSources over the sink entry points, and fault injection.

Responsible for: ``SinkOnlyAmqp08`` / ``SinkOnlyStomp`` / ``SinkOnlyMalamute`` (formats
``sinktest_amqp08``...), which call ``spark_mq.sinks.<proto>.create_writer`` and
``create_stream_writer`` exactly as the real DataSources do, so the sinks can be tested on their own;
and ``FaultySink`` (format ``sinktest_faulty``), which wraps a real sink writer and makes the input
of one partition fail after a number of rows, once per marker file: a task failure in the middle of
a partition, after part of it was published inside the open transaction.
Not part of the package (it lives with the integration tests, which import it as ``sinktest``; the
benchmarks put tests/integration on sys.path for it). Its classes reach Spark's Python processes by
value (``register_all``), so those need not be able to import it.

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

__all__ = ["SinkOnlyAmqp08", "SinkOnlyStomp", "SinkOnlyMalamute", "SinkOnlyAmqp08Rows", "FaultySink", "InjectedFault",
           "register_all", "local_spark", "run_available_now"]


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


class SinkOnlyAmqp08Rows(_SinkOnly):
    """The Row stream writer (what pyspark < 4.1 gets) on a pyspark that has the Arrow one."""

    FORMAT = "amqp08"

    @classmethod
    def name(cls) -> str:
        return "sinktest_amqp08_rows"

    def streamWriter(self, schema, overwrite):  # noqa: N802 - Spark's name
        from spark_mq.sinks.writer import StreamRowWriter

        return StreamRowWriter(_sinks(self.FORMAT).create_stream_writer(self.options, schema, overwrite).plan)


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
    """The real formats (amqp08, stomp, malamute) and the test-only ones (fault injection, Row writer).

    The test-only classes travel to Spark's Python processes by value: this module is not on their path."""
    import sys

    from pyspark import cloudpickle

    import spark_mq

    spark_mq.register(spark)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    for cls in (SinkOnlyAmqp08, SinkOnlyStomp, SinkOnlyMalamute, SinkOnlyAmqp08Rows, FaultySink):
        spark.dataSource.register(cls)


# -- SparkSession and input helpers for the sink tests and benchmark ------------------------------

def local_spark(app: str, cores: int = 2):
    """A small local SparkSession whose Python workers run this interpreter (so they import spark_mq).

    One partition per input file (``openCostInBytes`` 1 GiB): a file source then gives the same
    partitions in the same order on replay, which the deterministic message ids rely on."""
    import sys

    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master(f"local[{cores}]").appName(app)
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", str(cores))
             .config("spark.sql.files.openCostInBytes", str(1 << 30))
             .config("spark.sql.streaming.stopTimeout", "30s")
             # a loaded 2-core machine can take longer than the 15 s default to start a Python worker
             .config("spark.python.authenticate.socketTimeout", "120s")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register_all(spark)
    return spark


def run_available_now(writer, timeout: float):
    """Start ``df.writeStream...`` with trigger(availableNow=True); wait up to ``timeout`` seconds.

    Returns the query once it has ended; raises the query's exception if it failed and TimeoutError
    (after stopping it) if it is still running."""
    query = writer.trigger(availableNow=True).start()
    if not query.awaitTermination(timeout):  # a failed query raises its StreamingQueryException here
        query.stop()
        raise TimeoutError(f"streaming query did not finish within {timeout}s")
    return query


def finish(query, timeout: float, name: str = "the query"):
    """Wait up to ``timeout`` seconds for ``query`` to end by itself (availableNow, once, or a failure, which
    the caller reads from ``query.exception()``); returns it. A query still running then is stopped and
    fails the test, with its last progress (a livelock shows there)."""
    import pytest
    from pyspark.errors import StreamingQueryException

    try:
        done = query.awaitTermination(timeout)
    except StreamingQueryException:
        done = True
    if not done:
        progress = query.lastProgress
        query.stop()
        pytest.fail(f"{name} did not finish within {timeout}s; last progress: {progress and progress.get('sources')}")
    return query
