"""Protocol-independent machinery of the sinks: one broker transaction per partition per micro-batch.

Responsible for:
- ``write_partition``: the task-side loop. It borrows a ``Session`` from the per-process pool, takes
  the task's identity from ``TaskContext`` (local properties ``sql.streaming.queryId`` and
  ``streaming.sql.batchId``, the partition id), turns each Arrow batch into protocol messages with an
  ``Encoder`` (in slices, so memory stays bounded), publishes them pipelined, and commits once at the
  end. Any failure rolls the transaction back, drops the session and re-raises: nothing half-published
  is reported as written.
- the deterministic message ids: ``<queryId>:<batchId>:<tag>:<partition>:<seq>`` inside a micro-batch
  (a stream sink, or a ``df.write`` inside ``foreachBatch``) and ``<writeId>:<partition>:<seq>`` for a
  plain ``df.write`` (``writeId`` is fixed on the driver when the write starts, so retried tasks reuse
  it); ``seq`` counts rows from 0 within the partition. ``tag`` tells apart the writes of one batch:
  a hash of what the write targets (``SinkPlan.write_key``: format, destination options, column names,
  ``writeName``) and of the partition's first row. A replayed batch gets the same ids as long as its
  partitions hold the same rows in the same order (true for replayable sources without a shuffle
  before the sink): the first row, and so the tag, is part of that.
- the Spark writer classes (Arrow stream writer on pyspark 4.1+, the Row writer otherwise, the Arrow
  batch writer) and the driver-side ``commit``/``abort``, which aggregate the tasks' counts per batch
  and record them idempotently (``spark_mq.sinks.commitlog``).
Not responsible for protocol details (``spark_mq.sinks.<proto>`` supply the Encoder and Session) or
for options and column checks (``options``, ``columns``).
"""

from __future__ import annotations

import hashlib
import logging
import time
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, List, Optional

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter, DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage,
)

from spark_mq.compat import CAPS, DataSourceStreamArrowWriter, arrow_schema_of
from spark_mq.options import Options
from spark_mq.sinks import commitlog, connections
from spark_mq.sinks.columns import ColumnPlan
from spark_mq.workerheap import freeze_worker_heap


log = logging.getLogger("spark_mq.sinks")

__all__ = [
    "QUERY_ID_PROPERTY", "BATCH_ID_PROPERTY", "SinkCommitMessage", "Session", "Encoder", "SinkPlan",
    "write_partition", "make_writer", "make_stream_writer", "rows_to_batches", "HAS_STREAM_ARROW_WRITER", "arrow_schema_of",
]

QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
HAS_STREAM_ARROW_WRITER = CAPS.stream_arrow_writer
#: Rows per Arrow batch when the Row writer (pyspark < 4.1) regroups rows.
ROW_WRITER_BATCH_ROWS = 10_000
#: An Arrow batch is encoded in slices of about this many flushBytes, bounding the Python objects alive.
SLICE_FLUSHES = 4
#: Options that identify a connection: sessions are pooled per distinct set of these values.
CONNECTION_KEYS = ("uri", "host", "port", "username", "password", "virtualHost", "tls", "tlsCaFile",
                   "tlsCertFile", "tlsKeyFile", "tlsVerify", "tlsServerName", "heartbeat", "connectTimeout",
                   "address", "protocol", "publishMode")
#: Options that choose where messages go: part of ``write_key``, so two writes of one micro-batch to
#: different places never share ids. ``writeName`` tells apart writes that go to the same place.
DESTINATION_KEYS = ("exchange", "routingKey", "destination", "stream", "mailbox", "service", "subject",
                    "writeName")


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What one task committed: sent to the driver's ``commit``/``abort``."""

    partition: int
    messages: int
    bytes: int
    attempt: int
    first_id: Optional[str]
    seconds: float


class Session(ABC):
    """One open broker connection able to run one transaction at a time (used by one task at a time)."""

    #: a rollback undoes what the task published (False: publisher confirms, where nothing can be undone)
    atomic = True

    @abstractmethod
    def begin(self, options: Options) -> None:
        """Start a transaction (a no-op where the protocol starts one implicitly). ``options`` are the
        task's (timeouts, flush size): a pooled session may serve queries with different settings."""

    @abstractmethod
    def publish(self, messages: list) -> None:
        """Send the encoded messages, pipelined: no round trip per message."""

    @abstractmethod
    def commit(self) -> None:
        """End the transaction and wait until the broker confirms it (the task's only round trip)."""

    @abstractmethod
    def rollback(self) -> None:
        """Undo the open transaction (best effort: a broken connection is rolled back by the broker)."""

    @abstractmethod
    def healthy(self) -> bool:
        """True when the session can serve another task."""

    @abstractmethod
    def close(self, timeout: float) -> None:
        """Close politely within ``timeout`` seconds."""


class Encoder(ABC):
    """Turns Arrow record batches into protocol messages. Built on the executor from the plan."""

    @abstractmethod
    def encode(self, batch: pa.RecordBatch, id_prefix: str, first_seq: int) -> tuple[list, int]:
        """``(messages, body bytes)`` for the rows of ``batch``; row i gets id ``id_prefix + str(first_seq + i)``
        unless the row supplies its own."""


@dataclass(frozen=True)
class SinkPlan:
    """Everything a task needs, fixed on the driver at query start; pickled to the executors."""

    fmt: str
    options: Options
    columns: ColumnPlan
    arrow_schema: pa.Schema
    write_id: str
    #: What this write targets (see ``write_key``); with the partition's first row it tells apart the ids
    #: of two writes of one micro-batch.
    write_key: bytes
    open_session: Callable[[Options], Session]
    make_encoder: Callable[["SinkPlan"], Encoder]
    #: Converts a source's rows into this sink's columns in the task (``spark_mq.sinks.bridge``); None
    #: when the input holds the sink's own columns.
    bridge: Optional[object] = None

    def session_key(self) -> tuple:
        opts = self.options
        return (self.fmt,) + tuple((name, opts.get(name)) for name in CONNECTION_KEYS)

    def __repr__(self) -> str:  # never the options' secrets: Options masks them
        return f"SinkPlan({self.fmt}, columns={self.columns.names}, {self.options!r})"


def new_write_id() -> str:
    return uuid.uuid4().hex


# -- task side ------------------------------------------------------------------------------------

def _task_identity(plan: SinkPlan) -> tuple[Optional[str], int, int]:
    """``(batch id prefix or None, partition, attempt)`` for the running task: the prefix
    ``<queryId>:<batchId>:`` inside a micro-batch, None for a plain ``df.write``."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:  # outside Spark (unit tests): behave like partition 0 of a batch write
        return None, 0, 0
    query_id = ctx.getLocalProperty(QUERY_ID_PROPERTY)
    batch_id = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    batch = f"{query_id}:{batch_id}:" if query_id and batch_id is not None else None
    return batch, ctx.partitionId(), ctx.attemptNumber()


def write_key(fmt: str, options: Options, columns: Iterable[str]) -> bytes:
    """What a write targets, as bytes to hash into its message ids: the format, the options that
    choose the destination, the input's column names (sorted) and ``writeName``. Tuning, endpoint and
    credential options are left out: changing them before a replay must not change the ids."""
    parts = [fmt] + [f"{name}={options.get(name)!r}" for name in DESTINATION_KEYS]
    parts += sorted(c.lower() for c in columns)
    return "\x00".join(parts).encode()


def id_prefix(plan: SinkPlan, batch: Optional[str], partition: int, first: pa.RecordBatch) -> str:
    """The ids' prefix for a partition whose first non-empty Arrow batch is ``first`` (see the module
    docstring). Inside a micro-batch, two writes of one batch differ by ``plan.write_key`` or by the
    partition's first row; a replay of the batch has both the same."""
    if batch is None:
        return f"{plan.write_id}:{partition}:"
    h = hashlib.blake2b(plan.write_key, digest_size=4)
    for column in first.slice(0, 1).columns:
        h.update(b"\x00")
        h.update(_canonical(column))
    return f"{batch}{h.hexdigest()}:{partition}:"


def _canonical(value: pa.Array) -> bytes:
    """A one-row column as bytes that do not depend on the session's time zone or on how Python
    prints values: binary and text as their bytes, timestamps as epoch microseconds, the rest
    (numbers, maps, lists) by ``repr`` of plain Python values."""
    if pa.types.is_timestamp(value.type):
        value = value.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    item = value[0].as_py()
    if item is None:
        return b"\xff"
    if isinstance(item, bytes):
        return b"b" + item
    if isinstance(item, str):
        return b"s" + item.encode("utf-8", "surrogatepass")
    return b"r" + repr(item).encode()


def _slices(batch: pa.RecordBatch, max_bytes: int) -> Iterator[pa.RecordBatch]:
    rows = batch.num_rows
    size = batch.nbytes
    if size <= max_bytes or rows <= 1:
        yield batch
        return
    step = max(1, rows * max_bytes // size)
    for start in range(0, rows, step):
        yield batch.slice(start, step)


def write_partition(plan: SinkPlan, batches: Iterable[pa.RecordBatch]) -> SinkCommitMessage:
    """Publish one partition in one transaction (see the module docstring)."""
    freeze_worker_heap()  # PySpark collects the worker's whole heap after each task: see workerheap
    started = time.monotonic()
    batch_prefix, partition, attempt = _task_identity(plan)
    prefix = None  # from the first non-empty batch (see id_prefix)
    opts = plan.options
    encoder = plan.make_encoder(plan)
    key = plan.session_key()
    pooled = opts.get("cacheConnections", True)
    session = connections.acquire(key, lambda: plan.open_session(opts)) if pooled else plan.open_session(opts)
    slice_bytes = max(1, opts.get("flushBytes") or (1 << 20)) * SLICE_FLUSHES
    seq = 0
    size = 0
    ok = False
    try:
        session.begin(opts)
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if plan.bridge is not None:
                batch = plan.bridge.convert(batch)
            if prefix is None:
                prefix = id_prefix(plan, batch_prefix, partition, batch)
            for part in _slices(batch, slice_bytes):
                messages, nbytes = encoder.encode(part, prefix, seq)
                session.publish(messages)
                seq += part.num_rows
                size += nbytes
                del messages
        session.commit()
        ok = True
    except BaseException as exc:
        _rollback(session, plan, prefix or "", seq, exc)
        raise
    finally:
        if pooled:
            connections.release(key, session, reusable=ok)
        else:
            connections.release(key, session, reusable=False)  # closes it
    seconds = time.monotonic() - started
    log.info("%s sink: partition %d committed %d messages (%d bytes) in %.3fs, ids %s0..%d",
             plan.fmt, partition, seq, size, seconds, prefix, seq - 1)
    return SinkCommitMessage(partition, seq, size, attempt, f"{prefix}0" if seq else None, seconds)


def _rollback(session: Session, plan: SinkPlan, prefix: str, seq: int, exc: BaseException) -> None:
    try:
        session.rollback()
        if session.atomic:
            log.warning("%s sink: task failed after %d messages (ids %s...); transaction rolled back: %r",
                        plan.fmt, seq, prefix, exc)
        else:
            log.warning("%s sink: task failed after %d messages (ids %s...): they cannot be taken back (publisher "
                        "confirms) and may be delivered; a retry publishes them again under the same ids: %r",
                        plan.fmt, seq, prefix, exc)
    except Exception as rollback_exc:  # noqa: BLE001 - the original failure is what the task raises
        log.warning("%s sink: task failed after %d messages (%r); rollback failed too (%r); the session is "
                    "dropped and the broker discards the open transaction with the connection",
                    plan.fmt, seq, exc, rollback_exc)
        try:
            session.close(0.5)
        except Exception:  # noqa: BLE001 - best effort on an already broken session
            pass


def rows_to_batches(rows: Iterable, schema: pa.Schema, batch_rows: int = ROW_WRITER_BATCH_ROWS
                    ) -> Iterator[pa.RecordBatch]:
    """Regroup Spark ``Row``s (the pyspark < 4.1 stream writer's input) into Arrow record batches."""
    chunk: list = []
    for row in rows:
        chunk.append(tuple(row))
        if len(chunk) >= batch_rows:
            yield _to_batch(chunk, schema)
            chunk = []
    if chunk:
        yield _to_batch(chunk, schema)


def _to_batch(chunk: list, schema: pa.Schema) -> pa.RecordBatch:
    columns = list(zip(*chunk))
    arrays = [pa.array(list(col), type=field.type) for col, field in zip(columns, schema)]
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


# -- driver side ----------------------------------------------------------------------------------

def _summary(plan: SinkPlan, messages: List[Optional[SinkCommitMessage]], batch_id) -> dict:
    parts = sorted((m for m in messages if isinstance(m, SinkCommitMessage)), key=lambda m: m.partition)
    return {
        "format": plan.fmt,
        "batchId": batch_id,
        "messages": sum(m.messages for m in parts),
        "bytes": sum(m.bytes for m in parts),
        "partitions": [{"partition": m.partition, "messages": m.messages, "bytes": m.bytes,
                        "attempt": m.attempt, "firstId": m.first_id,
                        "seconds": round(m.seconds, 3)} for m in parts],
        "failedTasks": sum(1 for m in messages if m is None),
    }


def commit_batch(plan: SinkPlan, messages: List[Optional[SinkCommitMessage]], batch_id) -> dict:
    """Driver side: aggregate the tasks' counts for ``batch_id``; record them idempotently."""
    summary = _summary(plan, messages, batch_id)
    location = plan.options.get("commitLogLocation")
    if location:
        written = commitlog.record(location, batch_id, summary)
        if not written:
            log.info("%s sink: batch %s was already committed with the same counts", plan.fmt, batch_id)
    log.info("%s sink: batch %s committed: %d messages, %d bytes, %d partitions", plan.fmt, batch_id,
             summary["messages"], summary["bytes"], len(summary["partitions"]))
    return summary


def abort_batch(plan: SinkPlan, messages: List[Optional[SinkCommitMessage]], batch_id) -> dict:
    summary = _summary(plan, messages, batch_id)
    log.warning("%s sink: batch %s aborted; %d partitions had already committed %d messages to the broker: a "
                "replay sends them again with the same ids", plan.fmt, batch_id, len(summary["partitions"]),
                summary["messages"])
    return summary


# -- Spark writer classes -------------------------------------------------------------------------

class BatchWriter(DataSourceArrowWriter):
    """``df.write.format(...)``: Arrow batches in, one transaction per partition."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return write_partition(self.plan, iterator)

    def commit(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        commit_batch(self.plan, messages, f"write-{self.plan.write_id}")

    def abort(self, messages: List[Optional[WriterCommitMessage]]) -> None:
        abort_batch(self.plan, messages, f"write-{self.plan.write_id}")


class _StreamCommits:
    plan: SinkPlan

    def commit(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:  # noqa: N803
        commit_batch(self.plan, messages, batchId)

    def abort(self, messages: List[Optional[WriterCommitMessage]], batchId: int) -> None:  # noqa: N803
        abort_batch(self.plan, messages, batchId)


class StreamRowWriter(_StreamCommits, DataSourceStreamWriter):
    """Streaming writer for pyspark < 4.1: Rows regrouped into Arrow batches."""

    def __init__(self, plan: SinkPlan) -> None:
        self.plan = plan

    def write(self, iterator) -> SinkCommitMessage:
        return write_partition(self.plan, rows_to_batches(iterator, self.plan.arrow_schema))


if HAS_STREAM_ARROW_WRITER:
    class StreamArrowWriter(_StreamCommits, DataSourceStreamArrowWriter):
        """Streaming writer for pyspark 4.1+: Arrow record batches straight from the JVM."""

        def __init__(self, plan: SinkPlan) -> None:
            self.plan = plan

        def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
            return write_partition(self.plan, iterator)
else:  # pragma: no cover - pyspark 4.0
    StreamArrowWriter = None


def make_writer(plan: SinkPlan) -> DataSourceWriter:
    return BatchWriter(plan)


def make_stream_writer(plan: SinkPlan, *, arrow: Optional[bool] = None) -> DataSourceStreamWriter:
    """The Arrow stream writer where pyspark has it (unless ``arrow=False``), else the Row writer."""
    if arrow is None:
        arrow = HAS_STREAM_ARROW_WRITER
    if arrow and StreamArrowWriter is not None:
        return StreamArrowWriter(plan)
    return StreamRowWriter(plan)

