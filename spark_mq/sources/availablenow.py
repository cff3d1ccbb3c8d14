"""What "available now" means for one run of a stream: the ingest's availableNow target.

Responsible for: counting what was there when the run began (messages consumed + held by the
client + the broker's queue depth), fixing the target offset once that count is reached, the
broker falls quiet, a broker's own stamps say a message came later (ActiveMQ), or
``availableNowTimeout`` passes; and forgetting it for the batches after. Not responsible for
planning batches up to the target (``spark_mq.sources.base``), nor for taking messages
(``spark_mq.sources.ingest``).

State and threads: the ingest thread counts and fixes (``count``, ``stamped_end``, ``maybe_fix``);
Spark's thread prepares and ends a run (``prepare``, ``end``) and reads ``target``; the two meet
under the ingest's condition, which is notified whenever the target is fixed.
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from spark_mq.errors import SparkMqError

log = logging.getLogger("spark_mq.sources.ingest")

__all__ = ["AvailableNowTarget"]

_DEPTH_QUIET_FACTOR = 10  # with a known queue depth, silence ends availableNow only after this many quiet periods
_STRAGGLER_WAIT = 0.1  # seconds of silence after the counted depth is reached before availableNow ends


class AvailableNowTarget:
    """The availableNow target of one ingest (``target``: None until fixed).

    A part of the ``Ingest`` it is given: it reads the ingest's figures (``consumed``,
    ``duplicates``, ``last_message``, ``planned_end``, ``committed``, the log's head), its ack mode,
    and settles its groups before fixing a target (Spark plans up to it: it must be durable)."""

    def __init__(self, ingest) -> None:
        self._ing = ingest
        self.target: Optional[int] = None
        self.active = False        # a run with availableNow is being drained
        self.want_depth = False    # the ingest thread is to count the target (``count``)
        self.target_consumed: Optional[int] = None  # messages taken as new at which the drain is done
        self.reached_at: Optional[float] = None
        self.began = 0.0     # when (monotonic) and ...
        self.began_ms = 0    # ... when (ms since the epoch, for the broker's stamps) the run began

    def prepare(self) -> None:
        """Fix what "available now" means. The ingest thread counts, between two polls (when every
        message it took is counted as consumed): consumed + held by the client + the broker's depth,
        asked on the consuming channel so that every delivery sent before the answer is already held
        (AMQP orders a channel's frames). Protocols without a depth end the drain after a quiet period."""
        ing = self._ing
        ing.last_message = self.began = time.monotonic()
        self.began_ms = int(time.time() * 1000)
        self.want_depth = True
        self.active = True
        ing.wait_for(lambda: not self.want_depth or not ing.connected, ing.opts.connectTimeout + 5.0)

    def end(self) -> None:
        """Forget the target: the next batches take whatever comes."""
        self.active = False
        self.want_depth = False
        self.target = None
        self.target_consumed = None
        self.reached_at = None

    def pending(self) -> bool:
        """A run is being drained, its target not yet fixed, and its count taken."""
        return self.active and self.target is None and not self.want_depth

    def count(self, consumer) -> None:
        ing = self._ing
        try:
            with ing._consumer_lock:  # commit-mode acks use the same channel from another thread
                depth = consumer.depth_in_order()
                held = consumer.buffered()
        except (SparkMqError, OSError) as exc:
            log.warning("%s source: queue depth unknown (%s); availableNow ends after a quiet period", ing.fmt, exc)
            depth = None
        if depth is not None:
            # counted in messages taken as new: redeliveries dropped as duplicates (after a reconnect
            # in the middle of the drain, up to a prefetch of them) must not count towards the target
            self.target_consumed = ing.consumed - ing.duplicates + held + depth
        with ing._cond:
            self.want_depth = False  # only now: prepare waits for the figure
            ing._cond.notify_all()

    def stamped_end(self, consumer, kept: list) -> None:
        """availableNow on a broker that stamps each message when it takes it in (ActiveMQ): the
        first message stamped after the run began was not available at its start, and neither is
        anything after it (a queue delivers in order). The target is fixed just below it; it and
        what follows stay in the log for the next run."""
        if not consumer.broker_stamps:
            return
        ing = self._ing
        stamp = consumer.broker_stamp_ms
        began = self.began_ms
        for offset, msg in kept:
            if offset is None:
                continue
            ms = stamp(msg)
            if ms is not None and ms > began:
                ing._wb.settle(keep=0)  # Spark plans up to the target: it must be durable
                self.target = max(offset, ing.planned_end)
                log.info("%s source: availableNow target fixed at offset %d (a message the broker stamped %d ms "
                         "after the run began)", ing.fmt, self.target, ms - began)
                with ing._cond:
                    ing._cond.notify_all()
                return

    def silent_for(self, consumer, now: float) -> float:
        """Seconds without deliveries that count as the broker's silence: where the client hears the
        broker's heartbeats (Malamute), only up to the last time it heard them, so a broker that
        stopped (paused, stalled) is not taken for an empty one; where the client tells when bytes
        last came (STOMP), from then: a large frame still arriving is not silence."""
        last = self._ing.last_message
        try:
            heard_at = consumer.heard_at()
            if heard_at is not None:
                now = min(now, heard_at)
            last = max(last, consumer.active_at() or last)  # bytes of a frame still arriving are not silence
        except Exception:  # noqa: BLE001 - a closed client: plain silence
            pass
        return now - last

    def maybe_fix(self, consumer, quiet_ok: bool) -> None:
        if not self.active or self.target is not None or self.want_depth:
            return
        ing = self._ing
        opts = ing.opts
        now = time.monotonic()
        silent = self.silent_for(consumer, now)
        reached = self.target_consumed is not None and ing.consumed - ing.duplicates >= self.target_consumed
        if reached:
            # RabbitMQ counts deliveries still inside the broker (between queue and channel) as
            # neither ready nor held: wait for those stragglers, briefly, before fixing the end
            if self.reached_at is None:
                self.reached_at = now
            reached = silent >= _STRAGGLER_WAIT or now - self.reached_at >= opts.quietPeriod
        # silence means "drained" only when the broker is free to send: in commit mode it holds back
        # once ``prefetch`` messages wait for Spark's commit. Where the broker can tell its queue
        # depth, a quiet period ends the drain only when that depth is 0 too (the count taken at the
        # start can be off by deliveries in flight inside the broker); silence with messages still
        # ready (another consumer holds them, or they expire) ends it after a longer fallback.
        starved = ing.starved()
        # commit mode: while messages wait for acks, silence may only mean the broker holds the rest
        # back (prefetch; ActiveMQ also before the prefetch is full). The acks come when Spark asks
        # for the batch after a planned one: not quiet while the log holds unplanned messages (a
        # batch will be planned) or a planned batch is not committed yet.
        commit_due = ing.ack_mode == "commit" and (ing.log.head > ing.planned_end or
                                                   ing.committed < ing.planned_end)
        quiet = False
        if quiet_ok and not starved and not commit_due and silent >= opts.quietPeriod:
            if self.target_consumed is None or silent >= opts.quietPeriod * _DEPTH_QUIET_FACTOR:
                quiet = True
            else:
                quiet = self.depth_now(consumer) == 0 and consumer.buffered() == 0
        # Where no depth says what was there at the start, a destination a producer keeps feeding
        # never falls quiet: the run ends at availableNowTimeout. ActiveMQ's stamps end it sooner
        # (stamped_end), unless producers set the ``timestamp`` header themselves (ActiveMQ keeps theirs)
        timeout = opts.availableNowTimeout
        capped = (not reached and not quiet and timeout and self.target_consumed is None and self.began
                  and now - self.began >= timeout)
        if reached or quiet or capped:
            ing._wb.settle(keep=0)  # Spark plans up to the target: it must be durable
            self.target = ing.log.head
            if capped:
                log.warning("%s source: availableNow target fixed at offset %d: availableNowTimeout (%g s) passed "
                            "while messages kept arriving; the next run reads the rest", ing.fmt, self.target,
                            timeout)
            else:
                log.info("%s source: availableNow target fixed at offset %d (%s)", ing.fmt, self.target,
                         "queue depth reached" if reached else "quiet period")
            with ing._cond:
                ing._cond.notify_all()

    def depth_now(self, consumer) -> Optional[int]:
        try:
            with self._ing._consumer_lock:
                return consumer.depth_in_order()
        except (SparkMqError, OSError):
            return None
