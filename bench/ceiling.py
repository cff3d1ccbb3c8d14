"""Spark's own ceiling for a source's rows: the same query with no broker, no ingest and no log.

``bench sources`` compares each source with the same protocol's raw client. Part of every source
run is Spark's: the reader process, planning, the executor Python workers handing Arrow batches to
the JVM, the JVM turning them into rows for the sink. This measures that part alone: a streaming
Python data source (``format("bench-ceiling")``) whose ``availableNow`` run plans all ``count``
rows of a format's source schema in one micro-batch, split into partitions as the sources split a
batch (``partition_count`` with default options), where each task yields one prebuilt Arrow batch
of the log's group size over and over (no file read, no copy). The rows carry the body, destination,
timestamp and offset and leave every other column null, less than a real source's rows carry, so
the ceiling is, if anything, optimistic.

A source cannot beat this on the same machine: where the ceiling's rate is below 0.7 of the raw
client's, no source of that format reaches the target in that run, whatever its ingest does.
"""

from __future__ import annotations

import time
from typing import Iterator, Optional

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from spark_mq import schema as S

try:
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # Spark < 4.2: Spark's own wrapper runs availableNow on latestOffset
    SupportsTriggerAvailableNow = None

__all__ = ["CeilingDataSource", "register"]

NAME = "bench-ceiling"
_GROUP_BYTES = 1 << 20   # rows per yielded batch: as the ingest's default groups (fsyncBytes 1 MiB) ...
_GROUP_MAX = 20_000      # ... within fsyncMessages


class _Range(InputPartition):
    def __init__(self, index: int, lo: int, hi: int) -> None:
        self.index, self.lo, self.hi = index, lo, hi


class CeilingStreamReader(DataSourceStreamReader):
    def __init__(self, fmt: str, count: int, size: int) -> None:
        self.fmt, self.count, self.size = fmt, count, size

    def initialOffset(self) -> dict:
        return {"offset": 0}

    def latestOffset(self, start: Optional[dict] = None, limit=None) -> dict:
        return {"offset": self.count}

    def prepareForTriggerAvailableNow(self) -> None:
        return None

    def partitions(self, start: dict, end: dict):
        from spark_mq.options import SOURCE, parse_options
        from spark_mq.sources.partitions import partition_count

        lo, hi = int(start["offset"]), int(end["offset"])
        if hi <= lo:
            return []
        # the sources' default split (by body bytes and by count) for the same rows
        opts = parse_options({"uri": "tcp://127.0.0.1:1", "mailbox": "m", "logLocation": "/unused"},
                             format="malamute", direction=SOURCE)
        n = partition_count(hi - lo, (hi - lo) * self.size, opts)
        bounds = [lo + ((hi - lo) * i) // n for i in range(n + 1)]
        return [_Range(i, bounds[i], bounds[i + 1]) for i in range(n)]

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        group = max(1, min(_GROUP_MAX, _GROUP_BYTES // max(1, self.size)))
        batch = _group_batch(self.fmt, self.size, min(group, partition.hi - partition.lo))
        left = partition.hi - partition.lo
        while left > 0:
            take = min(left, batch.num_rows)
            yield batch if take == batch.num_rows else batch.slice(0, take)
            left -= take

    def commit(self, end: dict) -> None:
        return None


if SupportsTriggerAvailableNow is not None:
    class _Reader(CeilingStreamReader, SupportsTriggerAvailableNow):
        pass
else:  # pragma: no cover - older pyspark
    _Reader = CeilingStreamReader


def _group_batch(fmt: str, size: int, rows: int) -> pa.RecordBatch:
    """``rows`` rows of ``fmt``'s source schema: a ``size``-byte body, destination, timestamp,
    redelivered, offset; every other column null."""
    filled = {"body": b"x" * size, "destination": "bench", "timestamp": int(time.time() * 1_000_000),
              "redelivered": False}
    row = [filled.get(name) for name, _ in S.SOURCE_COLUMNS[fmt]]
    at = [name for name, _ in S.SOURCE_COLUMNS[fmt]].index("offset")
    return S.build_batch(fmt, [tuple(row[:at] + [i] + row[at + 1:]) for i in range(rows)])


class CeilingDataSource(DataSource):
    """``format("bench-ceiling")`` with options ``format`` (whose schema), ``count``, ``size``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return S.source_ddl(self.options.get("format", "malamute"))

    def streamReader(self, schema):
        return _Reader(self.options.get("format", "malamute"), int(self.options["count"]),
                       int(self.options["size"]))


def register(spark) -> None:
    """Register the ceiling source; its classes travel to Spark's Python processes by value (this
    module is not on their path)."""
    import sys

    from pyspark import cloudpickle
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(CeilingDataSource)


def run(spark, fmt: str, count: int, size: int) -> tuple[int, float]:
    """(rows, seconds from start() to termination) of an availableNow query to the noop sink."""
    import shutil
    import tempfile

    checkpoint = tempfile.mkdtemp(prefix="bench-ceiling-")
    try:
        t0 = time.perf_counter()
        q = (spark.readStream.format(NAME).option("format", fmt).option("count", str(count))
             .option("size", str(size)).load()
             .writeStream.format("noop").option("checkpointLocation", checkpoint)
             .trigger(availableNow=True).start())
        q.awaitTermination(600)
        seconds = time.perf_counter() - t0
    finally:
        shutil.rmtree(checkpoint, ignore_errors=True)
    if q.exception() is not None:
        raise RuntimeError(f"ceiling query failed: {q.exception()}")
    return sum(p["numInputRows"] for p in q.recentProgress), seconds
