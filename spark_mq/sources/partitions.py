"""Spark's partitions of a source read, and their executor side: what a task is given, and how it reads it.

Responsible for: the picklable partitions (``LogPartition``: byte ranges of source log segments;
``MemoryPartition``: a batch read's messages as Arrow IPC bytes), how many partitions a range is
split into (``partition_count``), and ``read_partition``, which runs on executors and knows only
the partition and the target schema. Not responsible for planning which offsets a batch holds
(``spark_mq.sources.base``, ``spark_mq.sources.batchread``) or the log format (``spark_mq.sources.log``).
"""

from __future__ import annotations

import logging
import math
from typing import Iterator, Optional

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from spark_mq import schema as S
from spark_mq.options import Options
from spark_mq.sources.log import DataLossError, read_slice
from spark_mq.workerheap import freeze_worker_heap

log = logging.getLogger("spark_mq.sources")

__all__ = ["LogPartition", "MemoryPartition", "partition_count", "read_partition"]


def _batch_id() -> str:
    try:
        from pyspark import TaskContext
        ctx = TaskContext.get()
        if ctx is not None:
            return ctx.getLocalProperty("streaming.sql.batchId") or "?"
    except Exception:  # noqa: BLE001 - only for the error message
        pass
    return "?"


class LogPartition(InputPartition):
    """Offsets ``[lo, hi)`` of the log: the segment byte ranges to read (picklable, no handles)."""

    def __init__(self, index: int, lo: int, hi: int, slices: tuple, missing: Optional[tuple],
                 location: str, fail_on_data_loss: bool) -> None:
        super().__init__(index)
        self.index = index
        self.lo, self.hi = lo, hi
        self.slices = slices
        self.missing = missing
        self.location = location
        self.fail_on_data_loss = fail_on_data_loss


class MemoryPartition(InputPartition):
    """A batch read's messages, already drained and acked, as Arrow IPC bytes."""

    def __init__(self, index: int, data: bytes) -> None:
        super().__init__(index)
        self.index = index
        self.data = data


def _data_loss(lo: int, hi: int, location: str, why: str) -> DataLossError:
    return DataLossError(
        f"micro-batch {_batch_id()}: offsets [{lo}, {hi}) are no longer in the source log at {location} ({why}). "
        f"They were deleted, or logLocation changed or was wiped. Set failOnDataLoss=false to skip them.")


def partition_count(count: int, body_bytes: int, opts: Options) -> int:
    """How many partitions a batch of ``count`` messages (``body_bytes`` of bodies) is split into:
    ``numPartitions`` if given, else enough that none holds more than ``maxPartitionBytes`` of bodies
    or ``maxPartitionMessages`` messages (as Spark's file sources split by size, and Kafka's by
    ``maxRecordsPerPartition``); never more than one per message. Spark converts rows one by one,
    so a large batch of small bodies split by bytes alone (a backlog, a batch read) would be one
    task on one core while the other cores idle."""
    n = opts.get("numPartitions")
    if n is None:
        n = max(math.ceil(body_bytes / opts.maxPartitionBytes), math.ceil(count / opts.maxPartitionMessages))
    return max(1, min(n, count))


def read_partition(partition, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Executor side of a stream read: the log's bytes for the partition, projected to ``target``."""
    freeze_worker_heap()  # PySpark collects the worker's whole heap after each task: see workerheap
    if isinstance(partition, MemoryPartition):
        for batch in pa.ipc.open_stream(pa.py_buffer(partition.data)):
            yield S.project(batch, target)
        return
    if partition.missing is not None:
        lo, hi = partition.missing
        if partition.fail_on_data_loss:
            raise _data_loss(lo, hi, partition.location, "segments deleted")
        log.warning("skipping offsets [%d, %d): gone from the source log at %s", lo, hi, partition.location)
    for s in partition.slices:
        try:
            for batch in read_slice(s):
                yield S.project(batch, target)
        except FileNotFoundError as exc:
            if partition.fail_on_data_loss:
                raise _data_loss(s.lo, s.hi, partition.location, f"missing file {s.path}") from exc
            log.warning("skipping offsets [%d, %d): %s is gone", s.lo, s.hi, s.path)
