"""Spark's side of the sources: the stream reader, the batch reader, and a source's options at ``load()``.

Responsible for: options validation at ``load()`` (``source_options``; the ``DataSource`` classes that
call it live in ``spark_mq.datasources``), offsets (``{"offset": N}``, positions in the
source log; with option ``consumers`` > 1, ``{"lanes": [n0, n1, ...]}``, one position per
lane: the lanes, their layout and their offsets' arithmetic are ``spark_mq.sources.lanes``), read
limits (Spark 4.2+ ``ReadLimit`` objects where present, the same limits from options otherwise;
split fairly over the lanes), availableNow, splitting a range into partitions, ``commit`` and the backlog
figures of ``reportLatestOffset``. Not responsible for brokers (``ingest`` + per-format ``Consumer``),
the partitions and their executor reads (``partitions``) or the log format (``log``).

Where things run (see pyspark-4.3-facts.md): every method but ``read`` runs in one long-lived
driver-side process on one reader instance, which owns the ingest thread (started at the first
offset call, never in ``__init__``); ``read`` runs on executors on an unpickled copy that only
knows options and schema, and reads segment files by path.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Callable, Iterator, Optional

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader

from spark_mq import schema as S
from spark_mq.clients.connect import endpoints
from spark_mq.compat import CAPS, ReadAllAvailable, ReadMaxBytes, ReadMaxRows, ReadMinRows, SupportsTriggerAvailableNow
from spark_mq.errors import OptionError, SparkMqError
from spark_mq.options import SOURCE, Options, parse_options
from spark_mq.sources import batchread
from spark_mq.sources.ingest import prefetch_of
from spark_mq.sources.lanes import Lanes, split_fairly
from spark_mq.sources.partitions import LogPartition, partition_count, read_partition
from spark_mq.workerheap import quiet_reader_heap

log = logging.getLogger("spark_mq.sources")

# Spark 4.2+ (or a vendor's backport): read limits and the availableNow mixin; otherwise limits come
# from the options only and availableNow is one batch (see spark_mq.compat)
HAS_READ_LIMITS = CAPS.read_limits

__all__ = ["MQStreamReader", "MQBatchReader", "STREAM_READER", "HAS_READ_LIMITS", "source_options",
           "check_trigger_limits", "gather"]

_FIRST_CALL_EXTRA = 5.0        # seconds the first offset call may wait beyond the quiet period
_AVAILABLE_NOW_WAIT = 120.0    # longest an availableNow latestOffset waits for data or the target
_SILENT_PLAN = 0.1             # seconds without deliveries after which availableNow plans what it has
_OVERLAP_MIN = 1.0             # availableNow mid-drain: a batch at least this many seconds after the last ...
_OVERLAP_SHARE = 0.25          # ... and after this share of the drain so far (see _available_now_ready)
_CUT_SLICE = 0.005             # seconds: how often a group being gathered checks whether Spark plans (gather)
_PLAN_WAIT = 0.5               # longest a repeating trigger's latestOffset waits for the group being gathered
# ``dbfs:/path``, ``s3:/bucket``: a scheme and one slash. Not a filesystem URI for pyarrow (which needs
# ``scheme://``), and as a local path it would be a directory named ``dbfs:`` under the driver's working
# directory, which executors cannot read.
_ONE_SLASH_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/(?!/)")



def check_trigger_limits(fmt: str, opts: Options) -> None:
    """Refuse read limits that can never be met: every batch would wait ``maxTriggerDelay`` for a
    minimum the source can never reach (a batch is cut at ``maxMessagesPerTrigger``; in commit mode
    at half the prefetch; the ingest pauses at ``maxUncommittedMessages``)."""
    minimum = opts.get("minMessagesPerTrigger")
    if minimum is None:
        return
    # (bound, what it is, the option to raise, why a batch never holds more)
    bounds = [(opts.get("maxMessagesPerTrigger"), "'maxMessagesPerTrigger'", "maxMessagesPerTrigger",
               "a batch never holds more")]
    if opts.get("ackMode") == "commit" and fmt != "malamute":
        prefetch, lanes = prefetch_of(opts), opts.get("consumers") or 1
        bounds.append((max(1, prefetch // 2) * lanes,
                       f"half of 'prefetch' ({prefetch})" + (f" times 'consumers' ({lanes})" if lanes > 1 else ""),
                       "prefetch", "in ackMode=commit a batch is cut there, so that the acks of the last one can come"))
    bounds.append((opts.maxUncommittedMessages, "'maxUncommittedMessages'", "maxUncommittedMessages",
                   "the ingest pauses there until Spark commits"))
    for bound, what, option, why in bounds:
        if bound is not None and minimum > bound:
            raise OptionError(
                f"option 'minMessagesPerTrigger' ({minimum}) is above {what} ({bound}): {why}, so every batch "
                f"would wait maxTriggerDelay ({opts.maxTriggerDelay:g} s) for it. Lower minMessagesPerTrigger "
                f"or raise {option}")


def gather(out: list, receive: Callable[[int, float], list], max_count: int,
           timeout: float, cut: Optional[Callable[[], bool]] = None) -> Optional[BaseException]:
    """Extend a poll's first deliveries ``out`` with ``receive(count, seconds)`` until ``max_count``,
    ``timeout`` or an empty receive. A connection lost meanwhile is returned, not raised: what was
    gathered is the ingest's to take (unacked, the broker redelivers it; in auto mode the broker has
    already forgotten it), and the consumer raises the error at its next poll.

    With ``cut`` (``Consumer.cut``, set by the ingest) the gathering also ends as soon as ``cut()``
    is true (Spark is planning a batch: the group goes to the log now, and into that batch); it is
    checked between receives, which then wait at most ``_CUT_SLICE`` each (an empty one goes on
    waiting until ``timeout``, as one long receive would)."""
    deadline = time.monotonic() + timeout
    try:
        while len(out) < max_count:
            if cut is not None and cut():
                break
            left = deadline - time.monotonic()
            if left <= 0:
                break
            more = receive(max_count - len(out), left if cut is None else min(left, _CUT_SLICE))
            if not more:
                if cut is None:
                    break
                continue
            out.extend(more)
    except (SparkMqError, OSError) as exc:
        return exc
    return None


class MQStreamReader(DataSourceStreamReader):
    """The stream reader of every format; per-format modules give it a ``connect(attempt)`` factory.

    Positions are tuples, one offset per lane (``spark_mq.sources.lanes``): one lane unless option
    ``consumers`` asks for several; Spark sees ``{"offset": n}`` for one lane, as always."""

    def __init__(self, fmt: str, opts: Options, schema, connector: Callable) -> None:
        self.fmt = fmt
        self.opts = opts
        self.target_schema = S.to_arrow_schema(schema)
        S.check_user_schema(fmt, self.target_schema)
        self._connector = connector       # picklable: a module-level function (opts, attempt) -> Consumer
        self._lanes: Optional[Lanes] = None
        self._last_end: Optional[tuple] = None
        self._answered = False            # latestOffset has answered in this run
        self._one_batch_end: Optional[tuple] = None  # Spark < 4.2: the first batch's end (the backlog at start)
        self._last_batch_time: Optional[float] = None
        self._started_at: Optional[float] = None
        self._batches = 0                 # batches planned in this run: rotates the lanes a limit favours

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_lanes"] = None  # never ship a live ingest (threads, sockets) anywhere
        return state

    # -- the ingest (driver-side process only) ---------------------------------------------------

    def _engine(self) -> Lanes:
        if self._lanes is None:
            # No SIGTERM handler to run stop() at the end: measured, a reader process that takes its
            # time to exit on SIGTERM makes Spark's start of the NEXT query's reader time out ("Python
            # worker failed to connect back"). Nothing needs it: every group is fsynced before its ack.
            quiet_reader_heap()  # the collector's passes cost 0.5-0.9 us per message here: see workerheap
            self._lanes = Lanes.open(self.fmt, self.opts, self._connector)
            self._lanes.start()  # each lane holds until the offset calls below say where Spark resumes
            self._started_at = time.monotonic()
        self._lanes.check()
        return self._lanes

    def _wait_first(self, lanes: Lanes) -> None:
        """The first offset call of a run waits until every lane has had a look at the broker, so a
        ``once`` trigger or the first batch sees what is already queued."""
        quiet = self.opts.quietPeriod
        started = self._started_at
        lanes.wait_for(lambda: lanes.all(lambda ing: ing.quiet() or ing.paused or
                                         (ing.first_poll_done and time.monotonic() - started >= quiet)),
                       quiet + self.opts.connectTimeout + _FIRST_CALL_EXTRA)

    # -- offsets ---------------------------------------------------------------------------------

    def initialOffset(self) -> dict:
        lanes = self._engine()
        tail = lanes.tail()
        lanes.resume_at(tail)  # a new query: it starts where the log does
        if self._last_end is None:
            # Spark < 4.2 calls latestOffset() without a start: a new query's first batch starts
            # here, so its read limits apply from this offset
            self._last_end = tail
        return lanes.encode(tail)

    def latestOffset(self, start: Optional[dict] = None, limit=None) -> dict:
        first_call = not self._answered
        lanes = self._engine()
        limited = True
        if start is not None:
            s = lanes.decode(start)
        elif self._last_end is not None:  # Spark < 4.2 calls latestOffset() without a start
            s = self._last_end
        else:
            # ... and its first call after a restart comes before anything says where the
            # checkpoint's last batch ended (E). The log's tail may lie far below E (a segment goes
            # only once all of it is committed): a read limit counted from the tail could answer an
            # end below E, and Spark would run [E, end) empty and then read [end, E) again. All that
            # is durable is never below E (E was planned from it, and the log keeps what is
            # durable), so this one call answers that, without limits (found in review).
            s = lanes.tail()
            limited = False
        lanes.resume_at(s if start is not None else None)  # an empty log continues where Spark does
        # Spark asks for the batch after ``s`` only once the sink has processed the batch ending
        # at ``s``; its own ``commit(s)`` comes only after it has planned a next batch, which
        # needs new data: in commit mode a broker that holds deliveries back until the acks
        # (prefetch; ActiveMQ earlier) would never send it. So the broker is acked now. The log's
        # segments go only at Spark's ``commit``: with asynchronous progress tracking ``s`` may
        # not be persisted yet, and a driver crash replays batches below it from the log.
        lanes.catch_up(s)
        one_batch = first_call and not CAPS.available_now
        if one_batch:
            self._first_batch_of_one_batch_triggers(lanes, s)
            limited = False  # the whole backlog present at start, as a once/availableNow batch needs
        elif not first_call and not lanes.available_now and self.opts.endGroupAtPlan:
            # A repeating trigger: what the ingest has received by now goes into this batch. The
            # group being gathered (up to fsyncInterval) ends now and is made durable, and the
            # answer waits for that (an append and an fsync), not for the rest of the interval:
            # without it a delivery missed the batch planned during its group's gathering and
            # waited for the next one (docs/performance.md, "Latency").
            lanes.end_group_for_plan(_PLAN_WAIT)
        elif first_call:
            if not lanes.available_now:
                # availableNow plans by its own rule below; this wait would hold its first batch
                # until no group is unsynced, which in a long drain is when the log bound pauses the
                # ingest: measured (1,000,000 x 4 KiB Malamute mails), the first batch then came at
                # 1 GiB, not half that, and broker and ingest stood still while Spark read it
                self._wait_first(lanes)
            self._last_batch_time = time.monotonic()
        if lanes.available_now:
            lanes.wait_for(lambda: self._available_now_ready(lanes, s, limit), _AVAILABLE_NOW_WAIT)
        end = lanes.durable_head()
        # each lane stops at its availableNow target (or, Spark < 4.2, the first batch's end)
        stops = lanes.targets() if lanes.available_now else self._one_batch_end
        self._one_batch_end = None
        if stops is not None:
            end = tuple(e if t is None else min(e, max(t, lo)) for e, t, lo in zip(end, stops, s))
        if limited and not (HAS_READ_LIMITS and isinstance(limit, ReadAllAvailable)):
            end = self._apply_limits(lanes, s, end)
        elif one_batch and self.opts.get("ackMode") == "commit" and lanes.count(s, end):
            # commit mode's acks come when Spark plans the next batch: even an unlimited batch leaves
            # room in the prefetch for the deliveries whose planning commits it
            end = self._split(s, end, self._max_messages(lanes.n))
        end = Lanes.highest(end, s)
        if lanes.count(s, end):
            self._last_batch_time = time.monotonic()
            self._batches += 1
        self._answered = True
        self._last_end = end
        lanes.planned(end)
        return lanes.encode(end)

    def _first_batch_of_one_batch_triggers(self, lanes: Lanes, s: tuple) -> None:
        """Spark without ``SupportsTriggerAvailableNow`` (Apache 4.0, 4.1) runs ``trigger(once=True)``
        and ``trigger(availableNow=True)`` as one batch (SPARK-45178), planned by the run's first
        ``latestOffset()``, and the source cannot tell those triggers from a repeating one. So on
        such a Spark the first batch of every run holds what was available when the run started, as
        Spark 4.2's ``once`` does (read limits do not apply to it): each lane fixes its availableNow
        target (the queue depth where the broker tells it, else a quiet period) and this call waits
        until every lane has, or is held back by the log's bounds (``maxUncommittedMessages``/``Bytes``)
        or commit mode's prefetch. ``maxMessagesPerTrigger`` and the other limits apply from the
        run's second batch. docs/getting-started.md, "Spark versions"."""
        self._wait_first(lanes)  # connected and a first look at the broker (a refused login fails here)
        if any(self.opts.get(k) is not None for k in ("maxMessagesPerTrigger", "maxBytesPerTrigger",
                                                      "minMessagesPerTrigger")):
            log.warning("%s source: this pyspark (%s) has no availableNow support for Python sources, so the "
                        "first batch of a run takes everything available at its start; the read limits "
                        "(maxMessagesPerTrigger, maxBytesPerTrigger, minMessagesPerTrigger) apply from the "
                        "second batch", self.fmt, CAPS.pyspark_version)
        lanes.prepare_available_now()

        def ready() -> bool:
            return lanes.all(lambda ing: ing.target is not None or Lanes.held_back(ing))

        try:
            lanes.wait_for(ready, _AVAILABLE_NOW_WAIT)
            self._one_batch_end = lanes.targets()
        finally:
            lanes.end_available_now()  # later batches of a repeating trigger take what comes

    def _available_now_ready(self, lanes: Lanes, s: tuple, limit) -> bool:
        """availableNow plans full batches: all up to the targets in one batch, as Kafka's source does,
        or a batch as large as the read limit allows. A batch is planned early when a lane is
        held back (paused at its log bound, or in commit mode waiting for Spark's commit: then what
        its log holds is all there will be until Spark commits), or when the unplanned log holds
        half the log's byte bound (``maxUncommittedBytes`` / 2) in bodies: executors then read while
        the ingest drains, and the ingest never pauses for it; or when nothing came for
        ``_SILENT_PLAN``: the drain is most likely over, and Spark reads the rest while the quiet
        period that fixes the target runs; or when Spark asks and rows have waited a second and a
        quarter of the drain so far (``_OVERLAP_MIN``, ``_OVERLAP_SHARE``): a sink as slow as the
        drain (a bridge) then writes while the ingest drains, and a long drain still makes only a
        dozen or so batches a minute, growing. Planning many small batches while the
        ingest is still draining would spend the machine on per-batch overhead instead of on the
        drain: planned at an eighth of the bound, Spark no longer waits in here, but the runs take as
        long, the JVM spending the time saved on 3 times the batches (docs/performance.md, "Batch
        planning and Spark's waits"; the runs: bench/HISTORY.md). The run is over when every lane
        has fixed its target."""
        if lanes.all_targets_fixed():
            return True
        head = lanes.durable_head()
        pending = lanes.count(s, head)
        if not pending:
            return False
        if lanes.any(Lanes.held_back):
            return True
        if lanes.body_bytes(s, head) >= self.opts.maxUncommittedBytes // 2:
            return True  # a large backlog: executors read this batch while the ingest drains the rest
        now = time.monotonic()
        began = lanes.available_now_began
        since = max(self._last_batch_time or 0.0, began)
        if now - since >= max(_OVERLAP_MIN, _OVERLAP_SHARE * (now - began)):
            # Overlap: Spark is free (it asks) and rows have waited a while: they go now, and the
            # executors write them (to a sink that may be as slow as the drain: a bridge) while the
            # ingest drains the rest. Without this a drain that fits the byte rule above came as one
            # batch after the drain's end, and a bridge took the source's time plus the sink's
            # (measured: stomp->amqp08 at 0.52 of its slower end). The wait grows with the drain,
            # so a long drain still makes a few large batches (log-many), not many small ones.
            return True
        if time.monotonic() - lanes.last_message >= _SILENT_PLAN:
            # Deliveries stopped (on every lane): most likely the backlog is all here, and the quiet
            # period that fixes the target has begun. Spark reads what the log holds meanwhile,
            # instead of waiting the quiet period out with the last batch (then, most likely, an
            # empty one).
            return True
        if HAS_READ_LIMITS and isinstance(limit, ReadAllAvailable):
            return False
        cap = self._max_messages(lanes.n)
        if cap is not None and pending >= cap:
            return True
        max_bytes = self.opts.get("maxBytesPerTrigger")
        return max_bytes is not None and lanes.body_bytes(s, head) >= max_bytes

    def _lane_cap(self) -> Optional[int]:
        """Commit mode: a lane's batch holds at most half its prefetch. Acks wait for Spark's late
        commit; keeping each batch to half the prefetch leaves room for the next batch's messages,
        whose planning is what triggers that commit."""
        if self.opts.get("ackMode") == "commit":
            return max(1, prefetch_of(self.opts) // 2)
        return None

    def _max_messages(self, n_lanes: int = 1) -> Optional[int]:
        """The most messages a batch holds, all lanes together: ``maxMessagesPerTrigger``, and in
        commit mode half the prefetch of each lane."""
        cap = self.opts.get("maxMessagesPerTrigger")
        lane_cap = self._lane_cap()
        if lane_cap is not None:
            cap = lane_cap * n_lanes if cap is None else min(cap, lane_cap * n_lanes)
        return cap

    def _split(self, s: tuple, end: tuple, cap: Optional[int]) -> tuple:
        """``end`` cut so that the batch holds at most ``cap`` messages (and each lane at most its
        commit-mode cap), split fairly over the lanes (``split_fairly``)."""
        available = [max(0, e - lo) for lo, e in zip(s, end)]
        lane_cap = self._lane_cap()
        if lane_cap is not None:
            available = [min(a, lane_cap) for a in available]
        if cap is not None and sum(available) > cap:
            available = split_fairly(available, cap, self._batches % len(s))
        return tuple(lo + a for lo, a in zip(s, available))

    def _apply_limits(self, lanes: Lanes, s: tuple, end: tuple) -> tuple:
        if not lanes.count(s, end):
            return s
        end = self._split(s, end, self._max_messages(lanes.n))
        max_bytes = self.opts.get("maxBytesPerTrigger")
        if max_bytes is not None:
            if lanes.n == 1:
                end = (lanes.ingests[0].log.limit_bytes(s[0], end[0], max_bytes),)
            else:
                # each lane's share of the bytes (water-filling over what each lane holds), at least
                # one message where a lane's share is not zero
                sizes = [ing.log.body_bytes(lo, e) if e > lo else 0 for ing, lo, e in zip(lanes.ingests, s, end)]
                budgets = split_fairly(sizes, max_bytes, self._batches % lanes.n)
                end = tuple(ing.log.limit_bytes(lo, e, b) if b > 0 and e > lo else lo
                            for ing, lo, e, b in zip(lanes.ingests, s, end, budgets))
        minimum = self.opts.get("minMessagesPerTrigger")
        if minimum is not None and lanes.count(s, end) < minimum:
            waited = time.monotonic() - (self._last_batch_time or 0)
            if waited < self.opts.maxTriggerDelay:
                return s
        return end

    def getDefaultReadLimit(self):
        if not HAS_READ_LIMITS:
            return None
        cap = self._max_messages(self.opts.get("consumers") or 1)
        if cap is not None:
            return ReadMaxRows(cap)
        if self.opts.get("maxBytesPerTrigger") is not None:
            return ReadMaxBytes(self.opts.maxBytesPerTrigger)
        if self.opts.get("minMessagesPerTrigger") is not None:
            return ReadMinRows(self.opts.minMessagesPerTrigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict:
        return self._engine().report()

    def prepareForTriggerAvailableNow(self) -> None:
        lanes = self._engine()
        lanes.wait_for(lambda: lanes.all(lambda ing: ing.connected or ing.error is not None),
                       self.opts.connectTimeout + _FIRST_CALL_EXTRA)
        lanes.prepare_available_now()

    # -- planning and reading ----------------------------------------------------------------------

    def partitions(self, start: dict, end: dict):
        lanes = self._engine()
        los, his = lanes.decode(start), lanes.decode(end)
        # a restart replays its last batch before any offset call: an empty log (wiped) continues
        # after it, and the batch's messages are reported missing below
        lanes.resume_at(his)
        # partitions per lane (a lane's log is read in order within each); numPartitions, if given,
        # is divided over the lanes that have messages in the batch
        with_data = [i for i in range(lanes.n) if his[i] > los[i]]
        parts: list = []
        for i, ing in enumerate(lanes.ingests):
            lo, hi = los[i], his[i]
            if hi <= lo and (lanes.n > 1 or parts):
                continue
            share = None
            if self.opts.get("numPartitions") is not None and lanes.n > 1:
                k, rank = len(with_data), with_data.index(i)
                share = max(1, self.opts.numPartitions // k + (1 if rank < self.opts.numPartitions % k else 0))
            parts.extend(self._lane_partitions(ing, lo, hi, len(parts), share))
        if not parts:  # several lanes, an empty batch: one empty partition
            parts.append(LogPartition(0, 0, 0, (), None, self.opts.logLocation, self.opts.failOnDataLoss))
        return parts

    def _lane_partitions(self, ing, lo: int, hi: int, first_index: int, share: Optional[int]) -> list:
        """One lane's range ``[lo, hi)``: the byte ranges of its log, split into partitions."""
        location = ing.opts.logLocation
        fail = self.opts.failOnDataLoss
        tail, head = ing.log.tail, ing.log.head
        missing = None
        have_lo, have_hi = max(lo, tail), min(hi, head)
        if lo < tail or hi > head:
            missing = (lo, hi) if have_lo >= have_hi else ((lo, tail) if lo < tail else (head, hi))
        if have_lo >= have_hi:
            return [LogPartition(first_index, lo, hi, (), missing, location, fail)]
        count = have_hi - have_lo
        opts = self.opts if share is None else self.opts.replace(numPartitions=share)
        n = partition_count(count, ing.log.body_bytes(have_lo, have_hi), opts)
        bounds = [have_lo + (count * i) // n for i in range(n + 1)]
        parts = []
        for i in range(n):
            a, b = bounds[i], bounds[i + 1]
            parts.append(LogPartition(first_index + i, a, b, tuple(ing.log.slices(a, b)), missing if i == 0 else None,
                                      location, fail))
        return parts

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.target_schema)

    def commit(self, end: dict) -> None:
        lanes = self._engine()
        lanes.commit(lanes.decode(end))

    def stop(self) -> None:
        if self._lanes is not None:
            self._lanes.stop()
            self._lanes = None


if CAPS.available_now:
    class MQStreamReaderAvailableNow(MQStreamReader, SupportsTriggerAvailableNow):
        """The stream reader with Trigger.AvailableNow support (Spark 4.2+)."""
    STREAM_READER = MQStreamReaderAvailableNow
else:  # pragma: no cover - older pyspark
    STREAM_READER = MQStreamReader


class MQBatchReader(DataSourceReader):
    """``spark.read``: drain what the broker has now while planning (``partitions``, once per
    DataFrame), then executors read it: from the tasks themselves, or with ``logLocation`` from a
    source log kept until ``commit_batch_read`` (see ``spark_mq.sources.batchread``)."""

    def __init__(self, fmt: str, opts: Options, schema, connector: Callable) -> None:
        if opts.get("ingest") == "executors":
            raise OptionError(f"option 'ingest' is executors: the {fmt} batch read (spark.read) drains while Spark "
                              f"plans it, on the driver; ingest=executors is for stream reads (spark.readStream)")
        if (opts.get("consumers") or 1) > 1:  # here: load() cannot tell a batch read from a stream
            raise OptionError(f"option 'consumers' is {opts.consumers}: the {fmt} batch read (spark.read) takes "
                              f"one consumer only; several consumers (lanes) are for stream reads (spark.readStream)")
        self.fmt = fmt
        self.opts = opts
        self.target_schema = S.to_arrow_schema(schema)
        S.check_user_schema(fmt, self.target_schema)
        self._connector = connector

    def partitions(self):
        if self.opts.get("logLocation"):
            return batchread.logged_partitions(self.fmt, self.opts, self._connector)
        return batchread.memory_partitions(self.fmt, self.opts, self._connector)

    def read(self, partition) -> Iterator[pa.RecordBatch]:
        return read_partition(partition, self.target_schema)


def source_options(fmt: str, options, validate: Callable[[Options], None], streaming: bool) -> Options:
    """A source's options at ``load()``: parsed, checked by the format's ``validate`` and against each
    other, so that unknown or contradictory options fail there and not in the ingest's reconnects."""
    opts = parse_options(options, format=fmt, direction=SOURCE)
    validate(opts)
    check_trigger_limits(fmt, opts)
    endpoints(opts)  # a URI of another format's scheme, an unparsable port: here, not in reconnects
    location = opts.get("logLocation")
    if streaming and not location:
        raise OptionError(f"the {fmt} stream source needs option 'logLocation' (a directory or "
                          f"filesystem URI for its source log, one per query, reachable from executors)")
    if location and _ONE_SLASH_URI.match(location):
        scheme = location.split(":", 1)[0]
        raise OptionError(
            f"option 'logLocation' is {location!r}: a filesystem URI needs '{scheme}://', and as a local "
            f"path it would be a directory named '{scheme}:' on the driver only. Give a full URI "
            f"(s3://bucket/path, hdfs://...), a local or mounted path (on Databricks /dbfs/... or "
            f"/Volumes/...), or './{location}' if a local directory of that name is meant")
    return opts
