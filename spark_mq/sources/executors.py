"""Ingest on the executors (option ``ingest=executors``): each micro-batch's tasks consume, one task per lane.

Responsible for: the stream reader of that placement (``ExecutorStreamReader``: offsets, planning,
availableNow, trimming old batch files), the task that consumes (``run_task``: drain, drop
redeliveries, write the batch file, acknowledge) and the options it refuses. The batch files (their
layout under ``logLocation``, the first-wins write) and the identities that recognise redeliveries
across processes are ``spark_mq.sources.batchfiles``. Not responsible for protocols (the format's ``Consumer``, the same as the driver-side ingest's) nor for the driver-side
ingest (``spark_mq.sources.ingest``, the default placement).

How it keeps the guarantees of docs/guarantees.md (exactly once into an idempotent sink):

- An offset is a batch number, ``{"batch": b, "consumers": N}``: batch ``b`` is one task per lane
  ``i < N``. Nothing is consumed when the driver plans; the tasks consume when they run.
- A lane's task of batch ``b`` first looks for its file ``lane-<i>/batch-<b>.arrow``. If it exists
  (a replay: a restarted query, a retried stage, the other attempt of a speculative pair won), the
  task reads it and consumes nothing. Else it connects, drains (up to ``taskIngestTime``, its share
  of ``maxMessagesPerTrigger`` or ``taskMaxMessages``, and ``taskMaxBytes``), writes the drained
  messages to a temporary file, fsyncs it, and links it to the batch file's name: the first attempt
  to link wins (``os.link`` fails if the name exists), atomically on a local or mounted filesystem.
- The winner acknowledges the broker only after the link, then closes. A losing attempt (speculation)
  closes without acknowledging: the broker redelivers what it drained, to a later batch, and reads
  the winner's file, so both attempts return the same rows.
- STOMP on RabbitMQ is refused when a task connects: it can neither stop a subscription and still
  acknowledge nor name a message the same way twice (its ids change per session), so what the broker
  sends between a task's ACK and its close, redelivered, could be told from an equal message only by
  content. amqp08 cancels its consumers before acknowledging; ActiveMQ's ids are stable.
- Killed before the link (executor SIGKILL, broker gone): nothing was acknowledged, the broker
  redelivers everything to a later task. Killed between link and ack: the batch file holds the
  messages and the broker redelivers them too. So a task checks every delivery the broker marks
  redelivered (and, where the broker drops that flag in a restart, ActiveMQ, every delivery with a
  stable id: a restart between link and ack sends the file's messages again unmarked) against the
  identities of the last ``RECENT_BATCHES`` batches' files of every lane
  (and of this batch's other lanes, re-listed when one is not found) and drops those already in a
  file. Identities are a stable id where the broker keeps one, else a BLAKE2 hash of body and
  stable headers: the same in every executor process (Python's ``hash`` is keyed per process).
- The driver deletes batch files older than ``RECENT_BATCHES`` behind Spark's commit.

What it gives up against the driver-side ingest: latency (a batch is at least its tasks' connect and
drain), order across batches' lanes (order is kept within a task's file only), ackMode commit (the
connection ends with the task) and dead-lettering (a poison delivery fails the task; Spark retries
it, then the query fails naming it). Malamute has no acknowledgements, so a consumer that closes
between batches would lose what arrives meanwhile: the option is refused there.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Callable, Iterator, Optional

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from spark_mq import schema as S
from spark_mq.compat import CAPS, ReadAllAvailable, SupportsTriggerAvailableNow
from spark_mq.errors import OptionError, PoisonDelivery, SparkMqError
from spark_mq.options import Options
from spark_mq.sources.batchfiles import (EXECUTORS_FILE, RECENT_BATCHES, RecentIdentities, batch_files, batch_path,
                                         file_summary, mark_placement, read_file, task_identity,
                                         write_first)
from spark_mq.sources.formats.sourcelist import name_list
from spark_mq.sources.lanes import LANES_FILE
from spark_mq.sources.log import SEGMENT_PREFIX, open_filesystem
from spark_mq.sources.reconnect import ReconnectPolicy
from spark_mq.workerheap import freeze_worker_heap

log = logging.getLogger("spark_mq.sources.executors")

__all__ = ["ExecutorStreamReader", "TaskPartition", "run_task", "check_placement", "OFFSET_STRIDE", "MAX_LANES",
           "EXECUTOR_STREAM_READER"]

#: a row's ``offset`` is ``(batch * MAX_LANES + lane) * OFFSET_STRIDE + position in its file``: unique in the
#: query, the same when a batch is replayed (a key for an idempotent sink), increasing within a lane
OFFSET_STRIDE = 1 << 24
MAX_LANES = 256
_POLL = 0.05          # seconds per poll while draining
_QUIET_END = 0.2      # after the first message, this long without one ends a task's drain (the queue is empty)


def check_placement(opts: Options, fmt: str) -> str:
    """The local root of ``logLocation`` for executor-side ingest, after refusing what cannot work:
    Malamute (no acks), ackMode commit or dead-lettering, a location that is not a local or mounted
    path (the first-wins link needs one), and a location the driver-side ingest wrote."""
    if (opts.get("consumers") or 1) > MAX_LANES:
        raise OptionError(f"option 'consumers' is {opts.consumers}: with ingest=executors at most {MAX_LANES}")
    if fmt == "malamute":
        raise OptionError("option 'ingest' is executors, but the malamute source cannot ingest on executors: "
                          "Malamute has no acknowledgements, so a consumer that closes between batches loses "
                          "what is sent meanwhile. Use ingest=driver (the default) with consumers=N")
    if opts.get("ackMode") == "commit":
        raise OptionError("option 'ingest' is executors, which acknowledges each batch's messages once its "
                          "batch file is written (as ackMode=durable); ackMode=commit needs the connection to "
                          "live until Spark's commit. Use ackMode=durable (the default) or ingest=driver")
    if opts.get("poisonMessages") == "deadletter":
        raise OptionError("option 'ingest' is executors, which cannot dead-letter (poisonMessages=deadLetter): "
                          "a poison delivery fails its task, and the query after Spark's task retries. Use "
                          "poisonMessages=fail or ingest=driver")
    fs, root, local = open_filesystem(opts.logLocation)
    if not local:
        raise OptionError(f"option 'logLocation' is {opts.logLocation!r}: with ingest=executors it must be a "
                          f"local or mounted path every executor shares (NFS, /dbfs/..., /Volumes/...): a batch "
                          f"file's first attempt wins by an atomic link, which object stores do not have")
    if os.path.isdir(root):
        names = set(os.listdir(root))
        if names and EXECUTORS_FILE not in names and (LANES_FILE in names or any(n.startswith(SEGMENT_PREFIX) for n in names)):
            raise OptionError(f"option 'ingest' is executors, but the source log at {opts.logLocation} was written "
                              f"by the driver-side ingest: use a new logLocation and checkpointLocation, or ingest=driver")
    return root


# -- the task -------------------------------------------------------------------------------------

class TaskPartition(InputPartition):
    """Lane ``lane`` of batch ``batch``: what its task needs to consume (picklable)."""

    def __init__(self, index: int, fmt: str, opts: Options, connector: Callable, batch: int, lane: int,
                 consumers: int, root: str, run_began_ms: Optional[int] = None) -> None:
        super().__init__(index)
        self.index = index
        self.fmt, self.opts, self.connector = fmt, opts, connector
        self.batch, self.lane, self.consumers, self.root = batch, lane, consumers, root
        #: planned in an availableNow run begun then (ms since the epoch): the task notes a message its
        #: broker stamped later (``file_stamped_late``), which ends the run
        self.run_began_ms = run_began_ms


def _task_caps(opts: Options, consumers: int) -> tuple:
    """``(messages, body bytes)`` one task drains at most: ``taskMaxMessages``, its share of
    ``maxMessagesPerTrigger``, and ``prefetch`` if given (the broker sends no more unacknowledged)."""
    count = opts.taskMaxMessages
    per_trigger = opts.get("maxMessagesPerTrigger")
    if per_trigger is not None:
        count = min(count, max(1, -(-per_trigger // consumers)))
    if opts.get("prefetch"):
        count = min(count, opts.prefetch)
    return count, opts.taskMaxBytes


def task_options(opts: Options, consumers: int) -> Options:
    """A task's options: without a ``prefetch`` option, the prefetch is the task's cap (a task acknowledges
    only at its end, so the broker must be free to send all it may take), shared out over the queues or
    destinations it reads: both brokers bound each consumer (subscription) by the prefetch, so a task
    reading two queues could otherwise hold twice its cap."""
    if opts.get("prefetch"):
        return opts
    sources = max(1, len(name_list(opts, "queue", "queue") if opts.get("queue") else
                         name_list(opts, "destination", "destination") if opts.get("destination") else ()))
    return opts.replace(prefetch=max(1, -(-_task_caps(opts, consumers)[0] // sources)))


def _drain(consumer, part: TaskPartition) -> list:
    """Deliveries for this task: until the caps, ``taskIngestTime``, or a quiet moment after the first."""
    max_count, max_bytes = _task_caps(part.opts, part.consumers)
    msgs: list = []
    size = 0
    began = time.monotonic()
    deadline = began + part.opts.taskIngestTime
    last = None
    while len(msgs) < max_count and size < max_bytes:
        now = time.monotonic()
        if now >= deadline or (last is not None and now - last >= _QUIET_END):
            break
        got = consumer.poll(max_count - len(msgs), min(_POLL, deadline - now))
        if got:
            msgs.extend(got)
            size += sum(len(getattr(m, "body", b"") or b"") for m in got)
            last = time.monotonic()
    return msgs


class TaskDeliveryError(SparkMqError):
    """A delivery this task cannot take (a poison message), or a batch file it cannot write: the task fails
    (Spark retries it), as connecting again cannot mend it."""


def _consume(part: TaskPartition, path: str) -> None:
    """Drain this lane's share of the batch into its file (first attempt wins), then acknowledge. A
    connection lost before the link (a broker restart) is connected again, with the driver-side
    ingest's policy (backoff, a refusal fails after a short grace, ``brokerTimeout``): what the lost
    session held was not acknowledged, and the broker delivers it again."""
    policy = ReconnectPolicy(part.fmt, part.opts, threading.Event())
    while not os.path.exists(path):  # another attempt may link the file while this one reconnects
        try:
            consumer = part.connector(part.opts, policy.attempt)
        except OptionError:
            raise
        except (SparkMqError, OSError) as exc:
            policy.connect_failed(exc)  # raises when the task must fail; else backs off
            continue
        policy.session_began()
        if not consumer.stable_ids and not consumer.stops_deliveries:
            consumer.close()
            raise OptionError(
                f"option 'ingest' is executors, which this {part.fmt} broker cannot keep exactly once: a task "
                f"cannot stop its subscription before acknowledging (the broker refuses an ACK after "
                f"UNSUBSCRIBE), so what the broker sends between a task's ACK and its close comes back "
                f"redelivered, and its message ids change per session, so those redeliveries are known only by "
                f"content: two equal messages would look like one, and one would be lost. On RabbitMQ read the "
                f"queue with format('amqp08') and ingest=executors, or keep ingest=driver (the default)")
        try:
            _session(consumer, part, path)
            return
        except TaskDeliveryError:
            raise
        except (SparkMqError, OSError) as exc:
            log.warning("%s source, batch %d lane %d: connection lost before the batch file was written (%s); "
                        "connecting again", part.fmt, part.batch, part.lane, exc)
            policy.session_failed(exc, False)
        finally:
            # the loser (and a failed session) closes without acknowledging: the broker redelivers
            try:
                consumer.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
                pass


def _stamped_late(consumer, msgs: list, run_began_ms: Optional[int]) -> bool:
    """Whether the broker stamped one of ``msgs`` after the availableNow run began (None: not in a run)."""
    return run_began_ms is not None and consumer.broker_stamps and any(
        (consumer.broker_stamp_ms(msg) or 0) > run_began_ms for msg in msgs)


def _session(consumer, part: TaskPartition, path: str) -> None:
    """One connection's try: drain, drop redeliveries of what a recent batch file holds, link, ack."""
    msgs = _drain(consumer, part)
    # no more deliveries: what arrived meanwhile is taken too, so the ack below leaves nothing in flight
    # to come back redelivered at the close (a redelivery is looked up by content where the broker's ids
    # change per session, and two messages of equal content would look like one)
    if consumer.stop_deliveries():
        while True:
            more = consumer.poll(65535, 0.001)
            if not more:
                break
            msgs.extend(more)
    now_us = int(time.time() * 1_000_000)
    recent = None
    rows = []
    first = (part.batch * MAX_LANES + part.lane) * OFFSET_STRIDE
    duplicates = 0
    # a broker that forgets the redelivered flag in a restart (ActiveMQ) may send a linked file's messages
    # again unmarked, if the restart came between the link and the ack
    first_too = not consumer.marks_redelivered_after_restart
    for msg in msgs:
        try:
            row = consumer.row(msg, first + len(rows), now_us)
        except PoisonDelivery as poison:
            raise TaskDeliveryError(f"{part.fmt} source (ingest=executors), batch {part.batch} lane {part.lane}: "
                                    f"a delivery cannot be taken: {poison.reason}; it stays in the broker, "
                                    f"unacknowledged") from poison
        if row[S.REDELIVERED] or first_too:
            key = task_identity(row[S.BODY], row[S.MESSAGE_ID], row[S.HEADERS], consumer.stable_ids)
            # a first delivery is looked up only by a stable id: by content, an equal message would look like it
            if row[S.REDELIVERED] or key[0] != "c":
                if recent is None:
                    recent = RecentIdentities(part.root, part.batch, consumer.stable_ids)
                if key in recent:
                    duplicates += 1
                    continue
        rows.append(row)
    late = _stamped_late(consumer, msgs, part.run_began_ms)
    schema = S.source_arrow_schema(part.fmt)
    try:
        batches = [S.build_batch(part.fmt, rows)] if rows else []
        won = write_first(path, schema, batches, len(rows), late)
    except Exception as exc:  # noqa: BLE001 - a full disk, a value no column holds: not the connection's fault
        raise TaskDeliveryError(f"{part.fmt} source (ingest=executors), batch {part.batch} lane {part.lane}: "
                                f"could not write the batch file {path}: {type(exc).__name__}: {exc}; nothing "
                                f"was acknowledged") from exc
    if not won:
        log.warning("%s source, batch %d lane %d: another attempt wrote the batch first; %d deliveries go back "
                    "to the broker", part.fmt, part.batch, part.lane, len(msgs))
        return
    try:
        consumer.ack(msgs)  # only now: the batch file holds them (and the duplicates were in one)
    except (SparkMqError, OSError) as exc:
        # the file holds them: the broker redelivers them, and the next batches drop them
        log.warning("%s source, batch %d lane %d: the ack after the batch file failed (%s); the redeliveries "
                    "will be recognised", part.fmt, part.batch, part.lane, exc)
    log.info("%s source, batch %d lane %d: %d messages (%d duplicates dropped)", part.fmt, part.batch,
             part.lane, len(rows), duplicates)


def run_task(part: TaskPartition, target: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Executor side: this lane's rows of the batch, consumed now or read from the batch file."""
    freeze_worker_heap()
    path = batch_path(part.root, part.lane, part.batch)
    if not os.path.exists(path):
        _consume(part, path)
    for batch in read_file(path):
        yield S.project(batch, target)


# -- the driver ---------------------------------------------------------------------------------

class ExecutorStreamReader(DataSourceStreamReader):
    """The stream reader for ``ingest=executors``: plans batch numbers, trims old batch files."""

    def __init__(self, fmt: str, opts: Options, schema, connector: Callable,
                 queue_depth: Optional[Callable] = None) -> None:
        self.fmt = fmt
        self.opts = opts
        self.target_schema = S.to_arrow_schema(schema)
        S.check_user_schema(fmt, self.target_schema)
        self._connector = connector
        self._queue_depth = queue_depth  # options -> ready messages (AMQP), or None where the broker tells none
        self.root = check_placement(opts, fmt)
        self.consumers = opts.get("consumers") or 1
        self._last_end: Optional[int] = None
        # an availableNow run: when it began (monotonic; ms since the epoch, for the brokers' stamps), its
        # first batch, the rows of its batches so far, and the queue depth counted at its start
        self._available_now: Optional[float] = None
        self._run_began_ms: Optional[int] = None
        self._run_first: Optional[int] = None
        self._run_rows: dict = {}
        self._run_target: Optional[int] = None

    def _decode(self, offset: dict) -> tuple:
        if "batch" not in offset:
            raise OptionError(f"the checkpoint's offset {json.dumps(offset)} is of the driver-side ingest, but "
                              f"option 'ingest' is executors: use a new checkpointLocation and logLocation, or "
                              f"ingest=driver")
        return int(offset["batch"]), int(offset.get("consumers", self.consumers))

    def _encode(self, batch: int) -> dict:
        return {"batch": batch, "consumers": self.consumers}

    def _highest_batch(self) -> Optional[int]:
        return max((b for b, _ in batch_files(self.root)), default=None)

    def initialOffset(self) -> dict:
        mark_placement(self.root)
        high = self._highest_batch()
        # a new query on a location with batch files: those were served already; never replay them
        start = 0 if high is None else high + 1
        self._last_end = start
        return self._encode(start)

    def _run_over(self, s: int) -> Optional[str]:
        """Why the availableNow run ends before batch ``s`` (None: batch ``s`` is planned). It ends after a
        batch in which no lane found anything; once its batches hold the queue depth counted at its start
        (AMQP); after a batch with a message the broker stamped after its start (ActiveMQ, one destination:
        a queue delivers in order, so what was there at the start came before); or at availableNowTimeout.
        A producer that keeps sending never lets a batch come back empty, hence the other rules."""
        if time.monotonic() - self._available_now >= self.opts.availableNowTimeout:
            return f"availableNowTimeout ({self.opts.availableNowTimeout:g} s) passed"
        last = s - 1
        if self._run_first is None or last < self._run_first:
            return None
        lanes = [file_summary(batch_path(self.root, lane, last)) for lane in range(self.consumers)]
        self._run_rows[last] = sum(rows or 0 for rows, _ in lanes)
        if self._run_rows[last] == 0:
            return "a batch in which no lane found anything"
        if self._run_target is not None and sum(self._run_rows.values()) >= self._run_target:
            return f"its batches hold the {self._run_target} messages the queues held at its start"
        if any(late for _, late in lanes):
            return "a message the broker stamped after its start"
        return None

    def latestOffset(self, start: Optional[dict] = None, limit=None) -> dict:
        if start is not None:
            s = self._decode(start)[0]
        elif self._last_end is not None:
            s = self._last_end
        else:  # Spark < 4.2 after a restart with its last batch committed: the batch after the newest file
            high = self._highest_batch()
            s = 0 if high is None else high + 1
        end = s + 1
        if self._available_now is not None:
            if self._run_first is None:
                self._run_first = s
            else:
                why = self._run_over(s)
                if why is not None:
                    end = s
                    log.info("%s source (ingest=executors): the availableNow run ends at batch %d: %s", self.fmt,
                             s, why)
        self._last_end = end
        return self._encode(end)

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = time.monotonic()
        self._run_began_ms = int(time.time() * 1000)
        self._run_first = None
        self._run_rows = {}
        self._run_target = None
        if self._queue_depth is not None:
            try:
                self._run_target = self._queue_depth(self.opts)
            except (SparkMqError, OSError) as exc:
                log.warning("%s source (ingest=executors): queue depth unknown (%s); the availableNow run ends "
                            "after a batch that finds nothing", self.fmt, exc)

    def getDefaultReadLimit(self):
        return ReadAllAvailable() if CAPS.read_limits else None

    def reportLatestOffset(self):
        return None

    def partitions(self, start: dict, end: dict):
        s, _ = self._decode(start)
        e, consumers = self._decode(end)
        self._last_end = e
        parts = []
        for b in range(s, e):
            for lane in range(consumers):
                parts.append(TaskPartition(len(parts), self.fmt, task_options(self.opts, consumers), self._connector,
                                           b, lane, consumers, self.root, self._run_began_ms))
        return parts

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        return run_task(partition, self.target_schema)

    def commit(self, end: dict) -> None:
        e, _ = self._decode(end)
        keep_from = e - RECENT_BATCHES
        for b, path in batch_files(self.root):
            if b < keep_from:
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass

    def stop(self) -> None:
        pass


if CAPS.available_now:
    class ExecutorStreamReaderAvailableNow(ExecutorStreamReader, SupportsTriggerAvailableNow):
        """The executor-side stream reader with Trigger.AvailableNow support (Spark 4.2+)."""
    EXECUTOR_STREAM_READER = ExecutorStreamReaderAvailableNow
else:  # pragma: no cover - older pyspark
    EXECUTOR_STREAM_READER = ExecutorStreamReader
