"""Batch reads (``spark.read``): what a read drains, when the drain ends, and where the data goes.

Responsible for: the drain of a batch read (on the planning side: Spark's Python Data Source
API gives a batch reader ``partitions()``, run once per DataFrame in a Python worker on the
driver, and ``read(partition)`` on executors; no commit and no job-end callback), the rule that
ends a drain of "what is available now" (``DrainEnd``, shared with availableNow where it
applies), the two ways the drained data reaches the executors, and ``commit_batch_read``.
Not responsible for Spark's reader classes (``spark_mq.sources.base``) or the log format
(``spark_mq.sources.log``).

Two ways, chosen by ``logLocation``:

- Without it, the messages travel inside the task descriptions (``MemoryPartition``: Arrow IPC
  bytes), acknowledged once the data is built, before any task runs: a job that fails after
  planning loses them. Each partition is cut so that it stays under ``maxTaskBytes`` (Spark's
  scheduler refuses a task above ``spark.rpc.message.maxSize``, 128 MiB by default, and local
  mode does not enforce it).
- With it, the drain goes into a source log there (fsynced, then acknowledged group by group, as
  the stream source does) and the partitions carry only the byte ranges of the log's segments.
  The log keeps every message a batch read served until ``commit_batch_read`` says the work that
  used them is done; until then each batch read on that log serves them again, before what it
  drains. So a failed job loses nothing, and every action on one DataFrame (Spark plans a
  DataFrame's partitions once and each action reads those same partitions) finds its data.

Why an explicit commit: a reader learns nothing of the job's outcome. A marker written when a
task's ``read`` has returned its last batch says only that the rows were handed to Spark: the same
task can still fail on them (a UDF, a write), a later stage can fail, and an action run later on
the same DataFrame reads the partitions again.

The batch log's state (what was committed, what the last read served) is the file
``batch-read.json`` beside the segments; the log's writer lock is held only while a read plans
or a commit runs.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Callable, Optional

import pyarrow as pa

from spark_mq import schema as S
from spark_mq.schema import BODY, HEADERS, MESSAGE_ID, REDELIVERED
from spark_mq.errors import OptionError, PoisonDelivery, SparkMqError
from spark_mq.options import Options
from spark_mq.sources.log import SourceLog, open_filesystem
from spark_mq.sources.dedup import NO_REDELIVERIES, content_identity
from spark_mq.sources.lanes import check_layout
from spark_mq.sources.partitions import LogPartition, MemoryPartition, partition_count

log = logging.getLogger("spark_mq.sources.batchread")

__all__ = ["DrainEnd", "memory_partitions", "logged_partitions", "commit_batch_read", "STATE_NAME"]

STATE_NAME = "batch-read.json"


class BatchReadError(SparkMqError):
    """A batch read cannot complete; the message says what became of the messages it drained."""


def _batch_ack_mode(opts: Options) -> Options:
    """``ackMode=commit`` means acks inside Spark's commit of a micro-batch, which a batch read has
    not: it acknowledges as ``durable`` does (before this, the AMQP consumer's channel was in tx mode
    and the acks were never committed, so every read returned the same messages again)."""
    return opts.replace(ackMode="durable") if opts.get("ackMode") == "commit" else opts
_LOG_LOCK_WAIT = 10.0        # seconds a read or a commit waits for another holder of the log's lock
_DEPTH_QUIET_FACTOR = 10     # with a queue depth that says more is there, silence ends a drain only after this many quiet periods
_MAX_AMQP_PREFETCH = 0xFFFF  # basic.qos prefetch-count is an AMQP short
_PARTITION_OVERHEAD = 4096   # bytes a pickled MemoryPartition takes beyond its Arrow data (measured: about 200)


class DrainEnd:
    """When a drain of "what is available now" ends, from what the broker can tell:

    - a queue depth (AMQP: ``queue.declare`` passive on the consuming channel): the drain ends once
      it has taken as many messages as were ready (or held by the client) at its start; silence
      ends it only when the broker says the queue is empty (or after ``_DEPTH_QUIET_FACTOR`` quiet
      periods: another consumer may hold what is counted);
    - the broker's timestamps (ActiveMQ stamps a message sent without a ``timestamp`` header with
      its own clock; JMS producers stamp their send time): the drain ends at the first message
      stamped after its start (that message is taken too);
    - heartbeats (Malamute): silence counts only while the broker answers them, so a broker that
      stops (paused, stalled, busy) does not end the drain, only an empty one does;
    - otherwise (STOMP on RabbitMQ) ``quietPeriod`` of silence, with nothing to tell a broker's
      pause from an empty destination; on STOMP silence counts from the last bytes received, so a
      large frame still arriving is not silence.

    ``readTimeout`` bounds every drain (a destination a producer keeps feeding)."""

    def __init__(self, consumer, opts: Options, started_ms: int) -> None:
        self.consumer = consumer
        self.opts = opts
        self.started_ms = started_ms
        self.began = self.last = time.monotonic()
        self.count = 0
        self.reason: Optional[str] = None
        self.target: Optional[int] = None
        try:
            depth = consumer.depth_in_order()
        except Exception as exc:  # noqa: BLE001 - no depth: the other rules apply
            log.info("queue depth unknown (%s): the drain ends at the first quiet period", exc)
            depth = None
        if depth is not None:
            self.target = depth + consumer.buffered()

    def took(self, msgs: list) -> None:
        """A poll returned ``msgs`` (not empty)."""
        self.count += len(msgs)
        self.last = time.monotonic()
        if self.consumer.broker_stamps and self.reason is None:
            for msg in msgs:
                ms = self.consumer.broker_stamp_ms(msg)
                if ms is not None and ms > self.started_ms:
                    self.reason = f"a message the broker stamped {ms - self.started_ms} ms after the start"
                    break

    def silent(self) -> float:
        """Seconds without deliveries that count as silence: where the broker answers heartbeats,
        only up to its last answer."""
        now = time.monotonic()
        heard_at = self.consumer.heard_at()
        if heard_at is not None:
            now = min(now, heard_at)
        last = max(self.last, self.consumer.active_at() or self.last)  # bytes of a frame still arriving are not silence
        return now - last

    def over(self, empty: bool = True) -> bool:
        """Whether the drain is done; ``empty``: the last poll returned nothing (only then can the
        broker be silent)."""
        if self.reason is not None:
            return True
        if self.target is not None and self.count >= self.target:
            self.reason = f"the {self.target} messages of the queue's depth at the start taken"
            return True
        if time.monotonic() - self.began >= self.opts.readTimeout:
            self.reason = f"readTimeout ({self.opts.readTimeout:g} s)"
            return True
        if not empty:
            return False
        quiet = self.opts.quietPeriod
        silent = self.silent()
        if silent < quiet:
            return False
        if self.target is not None and silent < quiet * _DEPTH_QUIET_FACTOR:
            try:
                depth = self.consumer.depth_in_order()
            except Exception:  # noqa: BLE001 - cannot tell: keep waiting, readTimeout bounds it
                return False
            if depth or self.consumer.buffered():
                return False  # the broker says more is there: a pause, not the end
        self.reason = f"quietPeriod ({quiet:g} s) without a delivery"
        return True


def drain(consumer, opts: Options, take: Callable[[list], None], limit: int) -> DrainEnd:
    """Poll ``consumer`` into ``take`` (a group at a time) until ``DrainEnd`` or ``limit`` messages.
    A client that cannot return what it holds to the broker (Malamute: no acks) is emptied after the
    end too, past ``limit`` if need be: closing it would lose what it holds."""
    end = DrainEnd(consumer, opts, int(time.time() * 1000))
    taken = 0
    try:
        while taken < limit:
            msgs = consumer.poll(min(opts.fsyncMessages, limit - taken), max(0.001, min(0.2, opts.quietPeriod)))
            if msgs:
                end.took(msgs)
                take(msgs)
                taken += len(msgs)
                end.last = time.monotonic()  # silence counts while we poll, not while we log a group
            if end.over(empty=not msgs):
                break
    except PoisonDelivery as exc:
        # a batch read has no sessions to fail and retry: poisonMessages / maxDeliveryFailures are the
        # stream source's; the read fails naming the message, and nothing of it is acknowledged
        where = f" from {exc.destination}" if exc.destination else ""
        ident = f" {exc.message_id}" if exc.message_id else ""
        raise BatchReadError(
            f"batch read: message{ident}{where} cannot be taken: {exc.reason}. A batch read fails on such a "
            f"message (poisonMessages applies to stream queries, where it can be dead-lettered)"
            + (f"; option {exc.option!r} would let it through" if exc.option else "")) from exc
    if taken >= limit and end.reason is None:
        end.reason = f"maxMessages ({limit})"
    if not consumer.returns_unacked:
        while True:
            msgs = consumer.poll(opts.fsyncMessages, 0.05)
            if not msgs:
                break
            take(msgs)
    log.info("batch read: drain ended after %d messages: %s", end.count, end.reason)
    return end


# -- without logLocation: the data in the tasks ----------------------------------------------------

def _ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def split_for_tasks(batch: pa.RecordBatch, n: int, max_bytes: int) -> list[bytes]:
    """``batch`` as Arrow IPC streams: ``n`` parts (``partition_count``), each cut in halves until
    it is at most ``max_bytes`` with a partition's pickling overhead. A single message that cannot
    fit raises ``OptionError`` naming ``maxTaskBytes``."""
    rows = batch.num_rows
    bounds = [(rows * i) // n for i in range(n + 1)]
    out: list[bytes] = []
    todo = [(bounds[i], bounds[i + 1]) for i in range(n)][::-1]
    while todo:
        lo, hi = todo.pop()
        data = _ipc(batch.slice(lo, hi - lo))
        if len(data) + _PARTITION_OVERHEAD <= max_bytes:
            out.append(data)
        elif hi - lo > 1:
            mid = (lo + hi) // 2
            todo += [(mid, hi), (lo, mid)]
        else:
            raise OptionError(
                f"a message of {len(data)} bytes (as Arrow data) does not fit a task of 'maxTaskBytes' ({max_bytes}): "
                f"a batch read without logLocation ships its messages inside the tasks. Give the read a "
                f"'logLocation' (the tasks then carry only where to read), or raise maxTaskBytes (and Spark's "
                f"spark.rpc.message.maxSize)")
    return out


def memory_partitions(fmt: str, opts: Options, connector: Callable) -> list:
    """Drain, build the Arrow data, cut it into partitions under ``maxTaskBytes``, then acknowledge
    (the broker forgets the messages before any task runs: see the module docstring)."""
    if fmt != "malamute" and opts.get("prefetch") is None:
        # every delivery stays unacknowledged until the data is built: a prefetch below maxMessages
        # would stop the broker there (the default 1,000 did: a batch read of a longer queue returned
        # 1,000) and the drain would end at a silence that is only the broker waiting for acks
        opts = opts.replace(prefetch=min(opts.maxMessages, _MAX_AMQP_PREFETCH))
    opts = _batch_ack_mode(opts)
    consumer = connector(opts, 0)
    try:
        got: list = []
        rows: list = []
        now_us = int(time.time() * 1_000_000)

        acks = opts.get("ackMode", "durable") != "auto"
        # A broker that holds the rest of a queue back until acks come (ActiveMQ, see StompConsumer)
        # is acknowledged group by group: waiting for the build would end the drain at its page.
        # The cost: a read that fails after that (a message too large for a task, a lost connection,
        # a poison message, the planning process dying) loses what it acknowledged. The error says so.
        early = acks and consumer.acks_release_more
        acked = 0

        def take(msgs: list) -> None:
            nonlocal acked
            new = [consumer.row(msg, len(rows) + i, now_us) for i, msg in enumerate(msgs)]
            if early:
                for row in new:  # before this group's ack: the broker keeps it and what follows
                    if len(row[BODY]) + _PARTITION_OVERHEAD > opts.maxTaskBytes:
                        raise OptionError(
                            f"a message of {len(row[BODY])} bytes does not fit a task of 'maxTaskBytes' "
                            f"({opts.maxTaskBytes}): a batch read without logLocation ships its messages inside "
                            f"the tasks. Give the read a 'logLocation', or raise maxTaskBytes (and Spark's "
                            f"spark.rpc.message.maxSize)")
                consumer.ack(msgs)
                acked += len(msgs)
            else:
                got.extend(msgs)
            rows.extend(new)
        try:
            drain(consumer, opts, take, opts.maxMessages)
            batch = S.build_batch(fmt, rows)
            n = partition_count(len(rows), sum(len(row[BODY]) for row in rows), opts)
            parts = [MemoryPartition(i, data) for i, data in enumerate(split_for_tasks(batch, n, opts.maxTaskBytes))]
        except Exception as exc:
            if acked:
                raise BatchReadError(
                    f"batch read failed after acknowledging {acked} messages it had drained (this broker sends no "
                    f"more until acks come, so a read without logLocation acknowledges as it drains): those "
                    f"{acked} are lost. Give the read a 'logLocation' to keep them. Cause: {exc}") from exc
            raise
        if got and acks:
            consumer.ack(got)  # the data is built: only now may the broker forget it
        return parts
    finally:
        consumer.close()


# -- with logLocation: the data in a source log --------------------------------------------------

def _open_log(fmt: str, opts: Options):
    check_layout(opts.logLocation, 1)  # a stream's log of several lanes is not a batch read's
    return SourceLog(opts.logLocation, S.source_arrow_schema(fmt), fsync=opts.fsync,
                     segment_bytes=opts.segmentBytes, exclusive_wait=_LOG_LOCK_WAIT)


def _state_path(log_) -> str:
    return f"{log_.root.rstrip('/')}/{STATE_NAME}"


def _load_state(log_) -> dict:
    try:
        with log_.fs.open_input_stream(_state_path(log_)) as f:
            return json.loads(f.read().decode())
    except FileNotFoundError:
        return {"committed": 0, "served": 0}


def _save_state(log_, state: dict) -> None:
    """Write the state whole beside the log and move it into place (a torn write leaves the old one)."""
    path = _state_path(log_)
    tmp = path + ".new"
    with log_.fs.open_output_stream(tmp) as f:
        f.write(json.dumps(state).encode())
    log_.fs.move(tmp, path)


def logged_partitions(fmt: str, opts: Options, connector: Callable) -> list:
    """Serve what earlier batch reads on this log served and nobody committed, then drain the
    broker into the log (each group fsynced before it is acknowledged), up to ``maxMessages`` new
    messages; the partitions name byte ranges of the log only."""
    log_ = _open_log(fmt, opts)
    try:
        state = _load_state(log_)
        if not state.get("format") and log_.head > 0:
            # a stream query's log: its offsets are that query's checkpoint's, not ours to serve or commit
            raise OptionError(f"option 'logLocation' ({opts.logLocation}) holds a stream query's source log; a "
                              f"batch read needs a location of its own")
        if not state.get("format"):
            state["format"] = fmt
            _save_state(log_, state)  # before the first append: the log is a batch read's from now on
        if log_.head < state["committed"]:
            log_.fast_forward(state["committed"])  # an emptied log continues after what was committed
        start = max(log_.tail, state["committed"])
        known: set = set()
        if fmt not in NO_REDELIVERIES and log_.head > start:
            # a read that failed between its fsync and its ack: the broker redelivers what the log holds
            for batch in log_.read(start, log_.head):
                cols = batch.select(["body", "message_id", "headers"]).to_pydict()
                for body, mid, headers in zip(cols["body"], cols["message_id"], cols["headers"]):
                    known.add(content_identity(body, headers))
                    if mid is not None:
                        known.add(("id", mid))
        opts = _batch_ack_mode(opts)
        consumer = connector(opts, 0)
        try:
            stable = consumer.stable_ids
            acks = opts.get("ackMode", "durable") != "auto"
            now_us = int(time.time() * 1_000_000)

            def take(msgs: list) -> None:
                rows = []
                for msg in msgs:
                    row = consumer.row(msg, log_.head + len(rows), now_us)
                    if row[REDELIVERED] and known:  # redelivered: already in the log?
                        mid = row[MESSAGE_ID]
                        key = ("id", mid) if (stable and mid is not None) else content_identity(row[BODY], row[HEADERS])
                        if key in known:
                            continue
                    rows.append(row)
                if rows:
                    log_.append(S.build_batch(fmt, rows))
                    log_.sync()
                if acks:
                    consumer.ack(msgs)  # durable in the log: only now may the broker forget them
            drain(consumer, opts, take, opts.maxMessages)
        finally:
            consumer.close()
        head = log_.head
        state["served"] = head
        _save_state(log_, state)
        location = opts.logLocation
        if head <= start:
            return [LogPartition(0, start, start, (), None, location, opts.failOnDataLoss)]
        count = head - start
        n = partition_count(count, log_.body_bytes(start, head), opts)
        bounds = [start + (count * i) // n for i in range(n + 1)]
        return [LogPartition(i, bounds[i], bounds[i + 1], tuple(log_.slices(bounds[i], bounds[i + 1])), None,
                             location, opts.failOnDataLoss) for i in range(n)]
    finally:
        log_.close()


def commit_batch_read(log_location: str, end: Optional[int] = None) -> int:
    """The work that used what batch reads on ``log_location`` served is done: the log forgets it
    (up to offset ``end``, default everything served so far: the ``offset`` column says which
    message is where). Returns the offset the next batch read on that log starts at.

    Call it after the last action on the DataFrames read from that log has succeeded: each action
    reads the log again (Spark plans a DataFrame's partitions once), and what is committed is gone."""
    fs, root, _ = open_filesystem(log_location)
    try:
        with fs.open_input_stream(f"{root.rstrip('/')}/{STATE_NAME}") as f:
            fmt = json.loads(f.read().decode())["format"]
    except FileNotFoundError:
        raise ValueError(f"{log_location} holds no batch read's log ({STATE_NAME} is missing): nothing to commit") \
            from None
    log_ = SourceLog(log_location, S.source_arrow_schema(fmt), exclusive_wait=_LOG_LOCK_WAIT)
    try:
        state = _load_state(log_)
        upto = state.get("served", 0) if end is None else int(end)
        if upto > max(state.get("served", 0), log_.head):
            raise ValueError(f"cannot commit the batch log at {log_location} up to {upto}: it has served only up "
                             f"to {state.get('served', 0)}")
        if upto > state["committed"]:
            log_.commit(upto)
            state["committed"] = upto
            _save_state(log_, state)
        return state["committed"]
    finally:
        log_.close()
