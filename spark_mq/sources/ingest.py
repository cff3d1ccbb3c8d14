"""The shared ingest loop: a thread that moves messages from a broker into the source log.

Responsible for: the loop (connect, take a group, append it, acknowledge it, pause while the
unprocessed log is over its bounds), the three ack modes (durable: after the fsync; commit: when
Spark commits, as one cumulative ack in a transaction; auto: never, the broker did), and the
progress figures; ``Ingest`` is the facade the stream reader (``spark_mq.sources.base``) uses (its
methods, plus the read-only ``target``, ``available_now`` and ``available_now_began``); its parts'
state is read on the parts. Runs in the driver-side reader process only, started lazily by the
stream reader.

Its parts, each in a module of its own: when to connect again and when to give up
(``spark_mq.sources.reconnect``), recognising redeliveries (``spark_mq.sources.dedup``), group sizing
(``spark_mq.sources.groups``), appends, the write-behind flusher and settling groups once durable
(``spark_mq.sources.writebehind``), poison deliveries (``spark_mq.sources.poison``), and the
availableNow target (``spark_mq.sources.availablenow``).

With several consumers (option ``consumers``) each is one lane of the query (``spark_mq.sources.lanes``):
its own connection, thread, log and acks; only the identities that recognise redeliveries
(``Dedup``), the poison deliveries' counts and the condition that wakes Spark's thread are shared.

Not responsible for protocol details (the per-format ``Consumer`` subclasses; the contract is
``spark_mq.sources.consumer.Consumer``) or for Spark's API (``spark_mq.sources.base``).

Threads: the ingest thread runs ``_run``; the flusher's threads make groups durable (and, in
durable mode on ActiveMQ, acknowledge them); Spark's thread plans (``figures``, ``wait_for``,
availableNow) and commits (``processed``, ``commit``). ``_consumer_lock`` guards the consumer, its
generation and the commit-mode acks; ``_cond`` wakes Spark's thread.

Above 500 lines (about 580): the loop and the three ack modes stay together, as they share the
consumer, its generation and the commit-mode acks under one lock.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable, Optional

from spark_mq import schema as S
from spark_mq.errors import OptionError, PoisonDelivery, SparkMqError
from spark_mq.options import Options
from spark_mq.sources.log import LogInUseError, SourceLog
from spark_mq.sources.availablenow import AvailableNowTarget
from spark_mq.sources.dedup import NO_REDELIVERIES, Dedup, Redeliveries, content_identity
from spark_mq.sources.groups import GroupSizer
from spark_mq.sources.poison import DeliveryFailedError, PoisonCounts, PoisonPolicy, build_batches
from spark_mq.sources.progress import ProgressFigures
from spark_mq.sources.reconnect import BrokerUnavailableError, ReconnectPolicy
from spark_mq.sources.writebehind import LogWriteError, WriteBehind

log = logging.getLogger("spark_mq.sources.ingest")

__all__ = ["Ingest", "content_identity", "prefetch_of", "BrokerUnavailableError", "LogWriteError", "DeliveryFailedError"]

_PAUSE_CHECK = 0.05   # seconds between checks while paused
# seconds a new ingest waits for another writer of its (local) log to go: a restarted query's
# predecessor reader process may take a moment to exit; a second query on the same logLocation
# fails after it, naming the location (its lock is held for as long as that query runs)
_LOG_LOCK_WAIT = 10.0
_UNWATCHED_SLACK = 0.05  # seconds between or past polls that still count as watching for silence

_DEFAULT_PREFETCH = 1000
_DEFAULT_COMMIT_PREFETCH = 10_000


def prefetch_of(opts: Options) -> int:
    """The consumer's prefetch (unacknowledged deliveries the broker may send ahead): option
    ``prefetch``, else 10,000 in ``ackMode=commit`` and 1,000 otherwise."""
    if opts.get("prefetch"):
        return opts.prefetch
    return _DEFAULT_COMMIT_PREFETCH if opts.get("ackMode") == "commit" else _DEFAULT_PREFETCH


class Ingest:
    """One source's ingest thread and the state it shares with the stream reader."""

    def __init__(self, fmt: str, opts: Options, connect: Callable[[int], object], *, lane: int = 0,
                 dedup: Optional[Dedup] = None, cond: Optional[threading.Condition] = None,
                 poison_counts: Optional[PoisonCounts] = None) -> None:
        """``lane``, ``dedup``, ``cond``, ``poison_counts``: one lane of a query with several consumers
        (``spark_mq.sources.lanes``): its index, the query's shared identities, the condition every
        lane notifies (the reader waits on all lanes at once), and the poison deliveries' counts."""
        self.fmt = fmt
        self.opts = opts
        self.lane = lane
        self._connect = connect
        self.ack_mode = opts.get("ackMode") or "auto"
        self.prefetch = prefetch_of(opts)
        self._sizer = GroupSizer(fmt, opts, self.ack_mode, self.prefetch)
        self.log = SourceLog(opts.logLocation, S.source_arrow_schema(fmt), fsync=opts.fsync,
                             segment_bytes=opts.segmentBytes, exclusive_wait=_LOG_LOCK_WAIT)
        self.committed = self.log.tail        # everything below is done (Spark committed it)
        self._cond = cond if cond is not None else threading.Condition()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._consumer = None
        self._consumer_lock = threading.Lock()
        self._generation = 0
        self._pending_acks: deque = deque()   # commit mode: (offset threshold, generation, token)
        self._wb = WriteBehind(self, self.log, opts.fsyncBytes)
        self._redeliveries = Redeliveries(fmt, opts, dedup, lane)
        self._poison = PoisonPolicy(fmt, opts, self._redeliveries.identity_of, poison_counts)
        self._an = AvailableNowTarget(self)
        self._figures = ProgressFigures(self)
        self._resumed = threading.Event()      # clear: take nothing until Spark says where it resumes
        self._resumed.set()
        self.error: Optional[BaseException] = None
        # figures
        self.consumed = 0
        self.redeliveries = 0
        self.duplicates = 0
        self.reconnects = 0
        self.dead_lettered = 0
        self.paused = False
        self.connected = False
        self.last_message = time.monotonic()
        self._polled_at = self.last_message    # when the ingest's last poll returned
        self.first_poll_done = False
        self._progress = False                 # the current session has taken a group (see ReconnectPolicy)
        self.planned_end = 0                   # the highest end offset handed to Spark
        # Spark's planning asks the group being gathered to end now (end_group_for_plan)
        self._cuts = 0                         # asked so far
        self._cuts_at_poll = 0                 # asked when the current poll began
        self._cut_mark = (0, 0)                # (asked before the last group ended, the log's head after it)
        self._gathering = False                # a poll holds deliveries not yet appended
        try:
            self._redeliveries.load(self.log)
        except BaseException:
            self.log.close()  # and with it the log's writer lock: a retry must not wait for ourselves
            raise

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            if self._overlap_fsync():
                self._wb.start_flusher()
            name = f"spark-mq-ingest-{self.fmt}" + (f"-lane-{self.lane}" if self.lane else "")
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def _overlap_fsync(self) -> bool:
        return self._wb.overlaps(self.fmt in NO_REDELIVERIES or self.ack_mode != "durable")

    def _adopt(self, consumer) -> None:
        """A new consumer's wishes about grouping, known only once connected (the broker behind a
        STOMP uri): ``max_group`` caps a group's messages; ``ack_when_durable`` (durable mode, on a
        local fsynced log) moves the fsync into the flusher thread, which acknowledges each group as
        soon as it is durable, while this thread gathers the next. ActiveMQ asks for both: it
        dispatches a page per wake-up and wakes at ACKs (see ``spark_mq.sources.formats.stomp``)."""
        cap = consumer.max_group
        if cap:
            self._sizer.cap(cap)
        if consumer.ack_when_durable and self.ack_mode == "durable":
            self._wb.ack_after_fsync()
        consumer.cut = self._cut_asked

    def hold_until_resumed(self) -> None:
        """Before ``start``: where the log holds no message (new, wiped, or all committed), take
        nothing from the broker until ``resume_at``. Spark may start the ingest before it says where
        the query resumes (availableNow prepares first): a new log for an old checkpoint would get
        its first messages at offsets Spark has already passed."""
        if self.log.head == self.log.tail:
            self._resumed.clear()

    def resume_at(self, offset: Optional[int]) -> None:
        """Spark resumes at ``offset`` (None: it cannot say, Spark < 4.2): an empty log behind it
        continues there, before anything is appended to it; then the ingest takes messages."""
        if self._resumed.is_set():
            return
        if offset is not None and self.log.head < offset:
            self.log.fast_forward(offset)  # the log holds no message: nothing is skipped
            self.committed = max(self.committed, self.log.tail)
        self._resumed.set()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._wb.close(timeout)
        self._close_consumer()
        self.log.close()

    def check(self) -> None:
        """Raise the error that ended the ingest, if any (the query then fails with it)."""
        if self.error is not None:
            raise self.error

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        policy = ReconnectPolicy(self.fmt, self.opts, self._stop)
        try:
            while not self._stop.is_set():
                if self._consumer is None:
                    try:
                        consumer = self._connect(policy.attempt)
                    except OptionError:
                        raise  # options no connection can use (checked at load() too): retrying cannot help
                    except (SparkMqError, OSError) as exc:
                        policy.connect_failed(exc)  # raises when the query must fail; else backs off
                        continue
                    with self._consumer_lock:
                        if self._stop.is_set():
                            # stop() came during a slow connect and has closed what it saw: this
                            # connection would stay open, holding deliveries nobody logs
                            try:
                                consumer.close()
                            except Exception:  # noqa: BLE001 - stopping: nothing to do about it
                                pass
                            break
                        self._consumer = consumer
                        self._generation += 1
                        self._pending_acks.clear()
                    # a new subscription consumes: pausing at the log bound starts over with it
                    # (a pause of the lost one, or one that failed with it, says nothing of this one)
                    self.paused = False
                    self._redeliveries.stable_ids = consumer.stable_ids
                    self._adopt(consumer)
                    # A new session after a lost one, or the first of a restarted query: the broker
                    # may send again messages whose acks it lost, without marking them redelivered
                    # (ActiveMQ after a broker restart). At most a prefetch of them comes first:
                    # those first deliveries are matched by stable id too (see Redeliveries.sort).
                    resending = policy.ever_connected or self.log.head > self.log.tail
                    self._redeliveries.resend_window = self.prefetch if resending else 0
                    if policy.session_began():
                        self.reconnects += 1
                    self.connected = True
                    self.last_message = time.monotonic()
                    self._progress = False
                try:
                    self._step()
                except (SparkMqError, OSError) as exc:
                    if isinstance(exc, (BrokerUnavailableError, LogWriteError, LogInUseError, DeliveryFailedError)) \
                            or self._stop.is_set():
                        raise
                    self.connected = False
                    self._close_consumer()
                    policy.session_failed(exc, self._progress)  # raises at brokerTimeout; else backs off
                    continue
                policy.step_done(self._progress)
            self._settle_on_stop()
        except BaseException as exc:  # noqa: BLE001 - handed to the query through check()
            if not self._stop.is_set():
                log.error("%s source: ingest failed: %s", self.fmt, exc)
                self.error = exc
        finally:
            with self._cond:
                self._cond.notify_all()

    def _settle_on_stop(self) -> None:
        """Stopping: acknowledge what became durable (what does not is redelivered, and recognised)."""
        error = self._wb.settle_on_stop()
        if error is not None and self.error is None:
            self.error = error

    def _close_consumer(self) -> None:
        with self._consumer_lock:
            consumer, self._consumer = self._consumer, None
            self._pending_acks.clear()
        if consumer is not None:
            try:
                consumer.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail any way
                pass

    def over_bound(self) -> bool:
        base = self.committed
        head = self.log.head
        if head - base >= self.opts.maxUncommittedMessages:
            return True
        return self.log.body_bytes(base, head) >= self.opts.maxUncommittedBytes

    def _step(self) -> None:
        consumer = self._consumer
        an = self._an
        if an.want_depth:
            an.count(consumer)
        if not self._resumed.is_set():  # see hold_until_resumed
            consumer.keepalive()
            self._resumed.wait(_PAUSE_CHECK)
            return
        if self.over_bound():
            self._wb.settle(keep=0)
            if not self.paused:
                self.paused = True
                consumer.pause()
            consumer.keepalive()
            self._stop.wait(_PAUSE_CHECK)
            an.maybe_fix(consumer, quiet_ok=False)
            return
        if self.paused:
            self.paused = False
            consumer.resume()
            self.last_message = time.monotonic()  # a pause is not the broker's silence
        # Groups waiting for the flusher's fsync while the next is gathered (see WriteBehind):
        # nothing waits on their durability but Spark's planning (the flusher serves no acks). A wait
        # here is counted: the broker's deliveries queue meanwhile.
        self._wb.settle(keep=self._wb.unsynced_groups, counted=True)
        wait = max(0.001, min(self.opts.fsyncInterval or 0.001, 1.0))
        if consumer.builds_batches:  # the consumer builds the group's batch itself (Malamute: no acks)
            started = time.monotonic()
            self._cuts_at_poll = self._cuts  # as below: a cut asked before this poll does not end its group
            try:
                count, batch = consumer.poll_batch(self._sizer.count, wait, self.log.head)
            finally:
                self._gathering = False
            cuts = self._cuts
            if not count:
                self._group_ended(cuts)
                self._nothing_came(consumer, started, wait)
                return
            self.last_message = self._polled_at = time.monotonic()
            self.consumed += count
            self._wb.durable_later(self._append([batch], count), self._generation, None)
            self._group_ended(cuts)
            self._progress = True
            an.maybe_fix(consumer, quiet_ok=False)
            return
        started = time.monotonic()
        self._cuts_at_poll = self._cuts
        try:
            msgs = consumer.poll(self._sizer.count, wait)
            cuts = self._cuts  # every cut asked so far is served by this group (or had nothing to end)
            if not msgs:
                self._group_ended(cuts)
                self._nothing_came(consumer, started, wait)
                return
            self._gathering = True
            self.last_message = self._polled_at = time.monotonic()
            while msgs:
                try:
                    self._take(consumer, msgs)
                    break
                except PoisonDelivery as poison:
                    msgs = self._poisoned(consumer, msgs, poison)  # raises unless it was dead-lettered
        finally:
            self._gathering = False
        self._group_ended(cuts)
        self._progress = True
        an.maybe_fix(consumer, quiet_ok=False)

    def _cut_asked(self) -> bool:
        """``Consumer.cut``: whether Spark asked, since this poll began, for the group to end now."""
        self._gathering = True
        return self._cuts != self._cuts_at_poll

    def _group_ended(self, cuts: int) -> None:
        """A poll's group is in the log (or the poll had none): the cuts asked before ``cuts`` are served."""
        served = self._cut_mark[0]
        self._cut_mark = (cuts, self.log.head)
        if cuts != served:
            self._notify()

    def end_group_for_plan(self, timeout: float) -> None:
        """Spark plans a batch (a repeating trigger): the group the ingest is gathering ends now, and
        this waits, at most ``timeout``, until it and every group appended before are durable, so
        that the batch takes what was received before the call. An ingest waiting for a first
        delivery holds nothing: then only the groups already appended are waited for."""
        self.wait_for(self.cut_for_plan(), timeout)

    def cut_for_plan(self) -> Callable[[], bool]:
        """``end_group_for_plan``'s request without its wait: the group being gathered ends now; the
        returned predicate says when it (and what came before) is durable. (Several lanes ask every
        lane first, then wait for each.)"""
        head = self.log.head
        with self._cond:
            self._cuts += 1
            asked = self._cuts

        def ready() -> bool:
            served, served_head = self._cut_mark
            if served >= asked:
                return self.log.durable_head >= served_head
            return not self._gathering and self.log.durable_head >= head

        return ready

    def _take(self, consumer, msgs: list) -> None:
        """Log a group of deliveries (dropping redeliveries of what the log holds) and arrange their
        acknowledgement. Raises ``PoisonDelivery`` for a delivery that cannot be taken, before any
        of the group is logged or counted."""
        now_us = int(time.time() * 1_000_000)
        offset = self.log.head
        kept_tokens = []
        group: dict = {}  # this group's identities: recorded once the group is in the log
        row_msgs = msgs
        redeliveries = duplicates = 0
        if self.fmt in NO_REDELIVERIES:
            rows = [consumer.row(msg, offset + i, now_us) for i, msg in enumerate(msgs)]
        else:
            rows, row_msgs, kept_tokens, group, redeliveries, duplicates = \
                self._redeliveries.sort(consumer, msgs, offset, now_us)
        try:
            batches = build_batches(self.fmt, rows, row_msgs, self._sizer.chunks, self.log.head) if rows else None
        except BaseException:
            self._redeliveries.release(group)  # several lanes: these identities are not on their way in
            raise
        # only now, with nothing left to fail for one delivery, does the group count
        self.consumed += len(msgs)
        self.redeliveries += redeliveries
        self.duplicates += duplicates
        if self.fmt not in NO_REDELIVERIES:
            self._redeliveries.taken(len(msgs))
        if batches:
            try:
                new_head = self._append(batches, len(rows))
            except BaseException:
                self._redeliveries.release(group)
                raise
            self._redeliveries.record(group)  # only now: see Redeliveries.record
        else:
            self._redeliveries.release(group)
            new_head = self.log.head
        self._wb.durable_later(new_head, self._generation, msgs if self.ack_mode == "durable" else None)
        if self._an.pending():
            self._an.stamped_end(consumer, kept_tokens)
        if self.ack_mode == "commit":
            with self._consumer_lock:
                gen = self._generation
                for off, msg in kept_tokens:
                    # a kept message is done when Spark commits past it; a dropped duplicate, when
                    # Spark commits past everything before it
                    self._pending_acks.append(((off + 1) if off is not None else new_head, gen, consumer.token(msg)))
                settled = bool(self._pending_acks) and self._pending_acks[0][0] <= self.committed
            if settled:
                # Redeliveries of a batch Spark has committed already (a restart's first offset call
                # commits the last run's final batch before the ingest connects, and the broker then
                # redelivers it): only a later commit would ack them, and with no new data there is
                # none; a full prefetch of them would stall the queue, and a next run take them again.
                self._ack_committed(self.committed)

    def _poisoned(self, consumer, msgs: list, poison: PoisonDelivery) -> list:
        """``poison`` failed its session once more: ``PoisonPolicy.verdict`` raises unless it is to
        be dead-lettered; then the messages before it are logged and made durable, it is
        dead-lettered, and the rest of the group (returned) is taken."""
        count, what = self._poison.verdict(consumer, poison, self.ack_mode)
        i = next(i for i, m in enumerate(msgs) if m is poison.msg)
        if i:
            self._take(consumer, msgs[:i])
        # those before it become durable (and, acked per ackMode, nothing before it waits on an
        # ack the dead-lettering might give cumulatively: STOMP on ActiveMQ)
        self._wb.settle(keep=0)
        reason = f"failed {count} sessions of spark-mq's {self.fmt} source: {poison.reason}"
        with self._consumer_lock:
            later = consumer.dead_letter(poison.msg, reason, count)
            if later is not None:  # commit mode, cumulative acks: with the commit past it
                self._pending_acks.append((self.log.head, self._generation, consumer.token(later)))
        self.dead_lettered += 1
        self.consumed += 1
        log.warning("%s source: %s dead-lettered after %d failed sessions: %s", self.fmt, what, count, poison.reason)
        return msgs[i + 1:]

    def _nothing_came(self, consumer, started: float, wait: float) -> None:
        """A poll that began at ``started`` and could wait ``wait`` seconds returned nothing."""
        now = time.monotonic()
        # Silence counts only while the ingest watched: time since the last poll returned (building
        # and appending a group, waiting for an fsync), and a poll that returns later than its wait
        # allows (stalled with the whole process: a starved CPU, a paused machine, its reader
        # stalled too), say nothing about the broker. Such unwatched time, beyond the loop's own few
        # milliseconds, moves the start of the silence on.
        unwatched = 0.0
        for gap in (started - self._polled_at, now - started - wait):
            if gap > _UNWATCHED_SLACK:
                unwatched += gap
        self._polled_at = now
        if unwatched:
            log.debug("%s source: %.3f s unwatched before an empty poll; silence counts from later", self.fmt, unwatched)
            self.last_message = min(now, self.last_message + unwatched)
        self._wb.settle(keep=0)  # nothing more came: what came before is acknowledged now
        self.first_poll_done = True
        self._an.maybe_fix(consumer, quiet_ok=True)

    def _append(self, batches, count: int) -> int:
        """Append a group's ``count`` messages (``batches``) to the log; size the next group from
        it. Returns the log's head after it."""
        head, new_head = self._wb.append(batches, count)
        self._sizer.size(self.log.body_bytes(head, new_head), count)
        return new_head

    def _keepalive(self) -> None:
        """While the ingest thread waits for the disk: a client it drives keeps its heartbeat."""
        consumer = self._consumer
        if consumer is not None:
            try:
                consumer.keepalive()
            except (SparkMqError, OSError) as exc:
                log.debug("%s source: keepalive while waiting for an fsync failed: %s", self.fmt, exc)

    def _notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # -- Spark's side: availableNow, waiting, commits ---------------------------------------------

    def prepare_available_now(self) -> None:
        """Fix what "available now" means for this run (``AvailableNowTarget.prepare``)."""
        self._an.prepare()

    def end_available_now(self) -> None:
        """Forget the availableNow target: the next batches take whatever comes (Spark < 4.2 fixes one
        for a run's first batch only, see ``MQStreamReader._first_batch_of_one_batch_triggers``)."""
        self._an.end()

    @property
    def available_now(self) -> bool:
        """Whether an availableNow run is being drained (from ``prepare_available_now`` to its end)."""
        return self._an.active

    @property
    def available_now_began(self) -> float:
        """When (``time.monotonic()``) the current availableNow run began; 0.0 before any."""
        return self._an.began

    @property
    def target(self) -> Optional[int]:
        """The availableNow target: the offset the run ends at, None until fixed (or after its end)."""
        return self._an.target

    def starved(self) -> bool:
        """Commit mode: the broker holds back, ``prefetch`` messages wait for Spark's commit."""
        return self.ack_mode == "commit" and len(self._pending_acks) >= self.prefetch

    def waiting_for_commit(self) -> bool:
        """Commit mode: deliveries stopped for half the quiet period while acks wait for Spark's
        commit; the broker may be holding more back until then (ActiveMQ does, before the prefetch
        is full), so the next batch should be planned now, and its planning commits the last."""
        return self.ack_mode == "commit" and bool(self._pending_acks) and \
            time.monotonic() - self.last_message >= self.opts.quietPeriod / 2

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate():
                self.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.1))
        return True

    def quiet(self) -> bool:
        return self.connected and self.first_poll_done and \
            time.monotonic() - self.last_message >= self.opts.quietPeriod

    def processed(self, end: int) -> None:
        """Spark asks for the batch after ``end``: everything below it was processed by the sink,
        though Spark may not have persisted that yet (with asynchronous progress tracking it plans
        ahead of its offset and commit logs, and after a crash replays from the last persisted
        batch, out of this log). So: ack the broker (commit mode; the log keeps the messages for any
        replay) and count them out of the log's bound, but delete nothing."""
        if self.ack_mode == "commit":
            self._ack_committed(end)
        if end > self.committed:
            self.committed = end

    def commit(self, end: int) -> None:
        """Spark's own ``commit(end)``: ``end`` is in its commit log, nothing below it will be read
        again. Ack (commit mode), delete log segments, trim dedup."""
        self.processed(end)
        self.log.commit(end)
        self._redeliveries.trim_later(end)  # the ingest thread trims: it adds to the identities meanwhile

    def _ack_committed(self, end: int) -> None:
        with self._consumer_lock:
            consumer, gen = self._consumer, self._generation
            token = None
            pending = self._pending_acks
            while pending and pending[0][0] <= end:
                threshold, g, tok = pending.popleft()
                if g == gen:
                    token = tok
            if consumer is None or token is None:
                return
            try:
                consumer.ack_commit(token)
                # the broker may have held deliveries back for these acks (prefetch, or ActiveMQ's
                # paging): silence counts from now when deciding whether the queue is drained
                self.last_message = time.monotonic()
            except (SparkMqError, OSError) as exc:
                # the broker redelivers them; the log recognises and drops the duplicates
                log.warning("%s source: commit ack failed (%s); the messages will be redelivered", self.fmt, exc)

    def figures(self) -> dict:
        return self._figures.figures()
