"""The shared ingest loop: a thread that moves messages from a broker into the source log.

Responsible for: (re)connecting with exponential backoff and full jitter across the endpoint
list (a first connection the broker keeps refusing, for credentials or a missing queue, fails
after ``_REFUSAL_GRACE`` instead), consuming in groups (one Arrow batch, one append, one fsync
per group; where no acknowledgement waits for it, the fsync runs in a thread of its own while
the next group is gathered, see ``_Flusher``), acknowledging per ``ackMode`` (durable: after the
fsync; commit: when Spark commits, as one cumulative ack in a transaction; auto: never, the
broker did), dropping redeliveries
already in the log, pausing while the unprocessed log is over its bounds, the availableNow target,
and the backlog figures. Runs in the driver-side reader process only, started lazily by the stream
reader.
Not responsible for protocol details (the per-format ``Consumer`` subclasses; the contract is
``spark_mq.sources.consumer.Consumer``) or for Spark's API (``spark_mq.sources.base``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import OrderedDict, deque
from typing import Callable, Optional

from spark_mq import schema as S
from spark_mq.clients.connect import refusal
from spark_mq.schema import BODY, DESTINATION, HEADERS, MESSAGE_ID, REDELIVERED
from spark_mq.errors import BrokerRefusedError, OptionError, PoisonDelivery, SparkMqError
from spark_mq.options import Options
from spark_mq.sources.log import LogInUseError, SourceLog

log = logging.getLogger("spark_mq.sources.ingest")

__all__ = ["Ingest", "content_identity", "prefetch_of", "BrokerUnavailableError", "LogWriteError", "DeliveryFailedError"]

_PAUSE_CHECK = 0.05   # seconds between checks while paused
_DEPTH_QUIET_FACTOR = 10  # with a known queue depth, silence ends availableNow only after this many quiet periods
_STRAGGLER_WAIT = 0.1  # seconds of silence after the counted depth is reached before availableNow ends
_DEPTH_EVERY = 1.0    # seconds between queue-depth questions for the progress figures
# seconds a new ingest waits for another writer of its (local) log to go: a restarted query's
# predecessor reader process may take a moment to exit; a second query on the same logLocation
# fails after it, naming the location (its lock is held for as long as that query runs)
_LOG_LOCK_WAIT = 10.0
_REFUSAL_GRACE = 10.0  # seconds a first connection must stay refused before the query fails
_REFUSALS = 3  # ... over at least this many attempts
# A session counts as progress once it has taken a group of deliveries, or stayed up this long (a
# broker that is idle, then lost, was working): one that fails sooner, having taken nothing, is a
# failed attempt like a refused connect (backoff, brokerTimeout). Before, a delivery that failed
# every session made a fake consumer reconnect 238,478 times in 4 s, and brokerTimeout never fired.
_STEADY_SESSION = 10.0
_POISON_MEMORY = 10_000  # deliveries whose failed sessions are counted (oldest forgotten first)
_MAX_APPEND_BYTES = 256 << 20  # bodies per appended batch: far below Arrow's 2 GiB per binary column
_UNWATCHED_SLACK = 0.05  # seconds between or past polls that still count as watching for silence
# Appended groups that may wait for the flusher's fsync while the ingest gathers the next: about
# _UNSYNCED_BYTES of groups of ``fsyncBytes``, never fewer than _UNSYNCED_GROUPS. The fsync of a 1 MiB
# group takes 2-3 ms at the median on this machine's disk but 7-14 ms at p90-p99 and up to 50 ms,
# while the ingest gathers 1 MiB of 4 KiB mails in about 3 ms. At 4 groups (the bound until
# 2026-11-27) the ingest thread waited for the disk about 800 times per 1,000,000 x 4 KiB Malamute
# drain, 2.7-3.6 s in all, while the broker's deliveries queued; at 32 groups 24-30 times (0.3-0.5 s),
# at 64 a handful (0.02 s). The query's time gained less and not in every run (the machine's 2 cores
# are the other bound): see docs/performance.md. Of the waiting groups, at most _UNSYNCED_GROUPS are
# also unwritten (held in memory, lost with the process): a thread of the flusher writes each group
# as it comes, whatever the fsync is doing, and the ingest waits for it should it fall behind.
_UNSYNCED_GROUPS = 4
_UNSYNCED_BYTES = 64 << 20


class BrokerUnavailableError(SparkMqError):
    """The broker stayed unreachable longer than ``brokerTimeout``."""


class DeliveryFailedError(SparkMqError):
    """A delivery failed ``maxDeliveryFailures`` sessions and ``poisonMessages`` says fail (or it
    cannot be dead-lettered): the query fails naming it. Nothing of it was acknowledged."""


class LogWriteError(SparkMqError):
    """Appending to or syncing the source log failed (disk full, storage gone): the ingest stops and
    the query fails. Nothing unlogged was acknowledged; a restart recovers the log's tail and the
    broker redelivers the rest."""


#: headers that differ between deliveries of one message, left out of the content identity: STOMP's
#: per-delivery headers, and the delivery count RabbitMQ's quorum queues add to every redelivery
#: (AMQP application header and STOMP header alike)
_VOLATILE_HEADERS = frozenset({"message-id", "subscription", "redelivered", "redeliveries", "ack", "content-length",
                               "x-delivery-count"})


_DEFAULT_PREFETCH = 1000
_DEFAULT_COMMIT_PREFETCH = 10_000


def prefetch_of(opts: Options) -> int:
    """The consumer's prefetch (unacknowledged deliveries the broker may send ahead): option
    ``prefetch``, else 10,000 in ``ackMode=commit`` and 1,000 otherwise."""
    if opts.get("prefetch"):
        return opts.prefetch
    return _DEFAULT_COMMIT_PREFETCH if opts.get("ackMode") == "commit" else _DEFAULT_PREFETCH


#: protocols without acknowledgements: the broker never delivers a message twice, nothing to recognise
_NO_REDELIVERIES = frozenset({"malamute"})


def content_identity(body: bytes, headers) -> int:
    """Identity of a message without a stable id: a hash of body, its length and (stable) headers.

    Python's 64-bit SipHash, keyed by the process's hash seed (Spark may fix ``PYTHONHASHSEED`` for
    its Python workers; identities are rebuilt from the log when an ingest starts and never leave
    the process, so no seed needs to match another). A redelivery is looked up among at most the log plus
    ``dedupWindow`` identities, so a chance collision is of the order of 1e5 / 2**64. A
    cryptographic hash cost 5x more (measured, 4 KiB: 7.7 us blake2b, 1.5 us here) and released the
    GIL for every body, which next to the client's receiver thread made it the ingest's largest cost."""
    stable = tuple(sorted(kv for kv in headers if kv[0] not in _VOLATILE_HEADERS)) if headers else ()
    return hash((len(body), body, stable))


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Dedup:
    """Identities of messages in the log, plus the last ``window`` committed ones.

    One thread owns it: the ingest thread adds, looks up and trims. Spark's thread (``commit``) only
    says how far trimming may go (``trim_later``, one int assignment). Trimming on Spark's thread
    iterated the dict while the ingest added to it: ``RuntimeError: OrderedDict mutated during
    iteration`` failed the query's commit under load once the window was full (found in review;
    ``test_dedup_trims_on_its_own_thread_while_another_commits`` reproduced it)."""

    def __init__(self, window: int) -> None:
        self.window = window
        self._ids: OrderedDict = OrderedDict()  # identity -> offset, in offset order
        self._trim_to = 0                       # set by any thread; trimming is the owner's

    def __contains__(self, key) -> bool:
        return key in self._ids

    def add(self, key, offset: int) -> None:
        """Record ``key`` at ``offset``. A key seen before (a body that recurs: ``{}``, a fixed status
        event) moves to the end with its new offset: left at its first position with a later offset
        it stopped ``trim`` there, and the identities grew with the whole history (98,902 held
        instead of about 2,500 after 100,000 messages with ``{}`` as every hundredth body)."""
        ids = self._ids
        if key in ids:
            ids.move_to_end(key)
        ids[key] = offset

    def trim_later(self, committed: int) -> None:
        """Any thread: identities below ``committed`` may go, beyond the window (see ``trim``)."""
        if committed > self._trim_to:
            self._trim_to = committed

    def trim(self) -> None:
        """The owner's thread only: drop the oldest identities below what ``trim_later`` allowed
        while more than ``window`` are held."""
        committed = self._trim_to
        ids = self._ids
        excess = len(ids) - self.window
        while excess > 0:
            key, offset = next(iter(ids.items()))
            if offset >= committed:
                break
            ids.popitem(last=False)
            excess -= 1

    def __len__(self) -> int:
        return len(self._ids)


class _Flusher:
    """Writes and fsyncs the source log in a thread of its own (group commit, write-behind), so that
    the ingest thread receives, builds and appends the next groups while this one's bytes go to the
    page cache and the disk makes them durable.

    Measured before it (``./dev bench sources`` scratch runs, 300,000 x 4 KiB Malamute mails, the
    ingest alone): the ingest thread spent 1.8-2.0 s of its 4.5-4.9 s waiting in fsync, while the
    fsync of 1 MiB costs no CPU of ours; and, with the fsync here, about a sixth of its busy time
    in ``os.write`` (``py-spy``), which the log's write-behind (``SourceLog.defer_writes``) moves
    here too. ``request(head)`` asks for everything appended up to ``head`` (one ``sync()`` writes
    and fsyncs all appends made before it starts); ``log.durable_head`` says how far it got;
    ``on_synced`` is called after each. Any failure of a write or an fsync is kept in ``error`` and
    ends the thread: nothing after it becomes durable, so nothing after it is acknowledged or
    planned.

    A second thread writes each group as soon as it is appended, while the first waits in an fsync:
    a slow fsync then delays durability, not the write, so a crash of the process loses only what
    was appended in the last moment (the written bytes are in the page cache). Writing before each
    fsync alone, the groups appended during a slow fsync waited in memory; writing them from the
    ingest thread instead made it wait for this thread's writes (``py-spy``, 1,000,000 x 4 KiB
    Malamute: 1.5 s blocked on the write lock and 0.6 s writing, 2026-11-27)."""

    def __init__(self, log_: SourceLog, name: str, on_synced: Callable[[], None]) -> None:
        self.log = log_
        self.error: Optional[BaseException] = None
        self._on_synced = on_synced
        self._cond = threading.Condition()
        self._wanted = 0
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._writer = threading.Thread(target=self._write, name=name + "-write", daemon=True)
        self._thread.start()
        self._writer.start()

    def request(self, head: int) -> None:
        with self._cond:
            if head > self._wanted:
                self._wanted = head
                self._cond.notify_all()

    def wait(self, head: int, stop: threading.Event, tick: Optional[Callable[[], None]] = None) -> bool:
        """Block until ``head`` is durable (True), the flusher failed or ended, or ``stop`` is set
        (False). ``tick`` runs about every 0.1 s meanwhile (the consumer's keepalive: a slow disk
        must not cost a client driven by this thread its heartbeat)."""
        while True:
            with self._cond:
                if self.log.durable_head >= head:
                    return True
                if self.error is not None or stop.is_set() or not self._thread.is_alive():
                    return False
                self._cond.wait(0.1)
            if tick is not None and self.log.durable_head < head:
                tick()

    def close(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout)
        self._writer.join(timeout)

    def _write(self) -> None:
        log_ = self.log
        while True:
            with self._cond:
                while not log_.unwritten_bytes and not self._closing and self.error is None:
                    self._cond.wait()
                if self._closing or self.error is not None:
                    return  # what is left, the fsync thread's last sync() writes
            try:
                log_.write_unwritten()
            except BaseException as exc:  # noqa: BLE001 - the log keeps it: every later sync() raises it
                with self._cond:
                    if self.error is None:
                        self.error = exc
                    self._cond.notify_all()
                self._on_synced()
                return

    def _run(self) -> None:
        log_ = self.log
        while True:
            with self._cond:
                while self._wanted <= log_.durable_head and not self._closing:
                    self._cond.wait()
                if self._wanted <= log_.durable_head:
                    return
            try:
                log_.sync()
            except BaseException as exc:  # noqa: BLE001 - any failure ends durability: kept, never lost
                with self._cond:
                    self.error = exc
                    self._cond.notify_all()
                self._on_synced()
                return
            with self._cond:
                self._cond.notify_all()
            self._on_synced()


class Ingest:
    """One source's ingest thread and the state it shares with the stream reader."""

    def __init__(self, fmt: str, opts: Options, connect: Callable[[int], object]) -> None:
        self.fmt = fmt
        self.opts = opts
        self._connect = connect
        self.ack_mode = opts.get("ackMode") or "auto"
        self.prefetch = prefetch_of(opts)
        # A group (one append, one fsync, one ack) takes at most half the prefetch where the broker
        # waits for acks: the broker streams the other half while this group is written, and a poll
        # never waits for deliveries the broker will not send before the ack.
        self._group_limit = opts.fsyncMessages if self.ack_mode == "auto" else \
            max(1, min(opts.fsyncMessages, self.prefetch // 2))
        # ... and about ``fsyncBytes`` of bodies: the count follows the last group's mean body size.
        # ``./dev bench sourcelog`` (4 KiB bodies, build + append + fsync): 3.3 us of CPU per message
        # in 1 MiB groups, 8.1 us in 20,000-message groups (80 MB), 6.9 us at 256 KiB: a group that fits
        # the CPU caches is copied from cache (join, IPC serialization, write); large fresh buffers page-fault.
        self._group_count = self._group_limit
        self._unsynced_groups = max(_UNSYNCED_GROUPS, _UNSYNCED_BYTES // opts.fsyncBytes)
        # unwritten bytes past which the ingest waits for the flusher's writer thread
        self._unwritten_keep = _UNSYNCED_GROUPS * opts.fsyncBytes
        self._row_bytes = S.row_bytes_function(fmt)
        self.log = SourceLog(opts.logLocation, S.source_arrow_schema(fmt), fsync=opts.fsync,
                             segment_bytes=opts.segmentBytes, exclusive_wait=_LOG_LOCK_WAIT)
        self.committed = self.log.tail        # everything below is done (Spark committed it)
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._consumer = None
        self._consumer_lock = threading.Lock()
        self._generation = 0
        self._pending_acks: deque = deque()   # commit mode: (offset threshold, generation, token)
        # groups appended whose fsync has not returned yet: (head after the group, generation,
        # the messages to ack once durable in durable mode, else None), oldest first
        self._unsynced: deque = deque()
        self._flusher: Optional[_Flusher] = None
        # durable mode with the fsync in the flusher thread (see _adopt): that thread acknowledges
        # each group once it is durable; popping a group and sending its ACK happen under _ack_lock
        # (cumulative ACKs must go out in order, each once)
        self._acks_on_sync = False
        self._ack_lock = threading.Lock()
        self._dedup = _Dedup(opts.dedupWindow)
        self._resumed = threading.Event()      # clear: take nothing until Spark says where it resumes
        self._resumed.set()
        self.error: Optional[BaseException] = None
        # figures
        self.consumed = 0
        self.redeliveries = 0
        self.duplicates = 0
        self.reconnects = 0
        self.dead_lettered = 0
        self._poison_counts: OrderedDict = OrderedDict()  # identity -> sessions it failed
        self.log_waits = 0          # times the ingest stopped taking deliveries to wait for the log's fsync
        self.log_wait_seconds = 0.0
        self.paused = False
        self.connected = False
        self.queue_depth: Optional[int] = None
        self._depth_asked = 0.0
        self.last_message = time.monotonic()
        self._polled_at = self.last_message    # when the ingest's last poll returned
        self.first_poll_done = False
        self._target_consumed: Optional[int] = None
        self._reached_at: Optional[float] = None
        self.planned_end = 0                   # the highest end offset handed to Spark
        self.target: Optional[int] = None
        self._available_now = False
        self._want_depth = False
        self._an_began = 0.0     # availableNow: when (monotonic) and ...
        self._an_began_ms = 0    # ... when (ms since the epoch, for the broker's stamps) the run began
        try:
            self._load_identities()
        except BaseException:
            self.log.close()  # and with it the log's writer lock: a retry must not wait for ourselves
            raise

    # -- life cycle -----------------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            if self._overlap_fsync():
                self._start_flusher()
            self._thread = threading.Thread(target=self._run, name=f"spark-mq-ingest-{self.fmt}", daemon=True)
            self._thread.start()

    def _start_flusher(self) -> None:
        self.log.defer_writes()  # the flusher writes each group too, then fsyncs it
        self._flusher = _Flusher(self.log, f"spark-mq-fsync-{self.fmt}", self._on_synced)

    def _adopt(self, consumer) -> None:
        """A new consumer's wishes about grouping, known only once connected (the broker behind a
        STOMP uri): ``max_group`` caps a group's messages; ``ack_when_durable`` (durable mode, on a
        local fsynced log) moves the fsync into the flusher thread, which acknowledges each group as
        soon as it is durable (``_ack_durable``), while this thread gathers the next. ActiveMQ asks
        for both: it dispatches a page per wake-up and wakes at ACKs (see ``spark_mq.sources.stomp``).
        The flusher is started at most once, before anything waits for an fsync."""
        cap = consumer.max_group
        if cap:
            self._group_limit = max(1, min(self._group_limit, cap))
            self._group_count = min(self._group_count, self._group_limit)
        if (consumer.ack_when_durable and self.ack_mode == "durable" and self._flusher is None
                and not self._unsynced and self.log.local and self.log.fsync):
            self._acks_on_sync = True
            self._start_flusher()

    def _on_synced(self) -> None:
        """The flusher made more of the log durable (or failed): acknowledge where it does so, tell
        the waiters."""
        if self._acks_on_sync and self._flusher is not None and self._flusher.error is None:
            try:
                self._ack_durable()
            except (SparkMqError, OSError) as exc:
                # the connection failed: the ingest thread finds out at its next poll and connects
                # again; the broker redelivers these, and the log drops them as duplicates
                log.debug("%s source: an ack after an fsync failed: %s", self.fmt, exc)
            except Exception:  # noqa: BLE001 - the flusher thread must go on making the log durable
                log.exception("%s source: an ack after an fsync failed", self.fmt)
        self._notify()

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

    def _overlap_fsync(self) -> bool:
        """fsync in a thread of its own (``_Flusher``) where no acknowledgement waits for it: Malamute
        (no acks) and ``ackMode`` commit or auto; and only on a local, fsynced log (elsewhere an
        append is durable when written). With acks after the fsync (``ackMode=durable`` on AMQP and
        STOMP) the group waiting for its fsync holds half the prefetch unacknowledged and the broker
        stops sooner: measured slower there (``bench ingest``, amqp08 100 B: 0.75 against 0.84 of
        the raw client), so the fsync stays inline; except where the consumer asks otherwise once
        connected (``_adopt``: STOMP on ActiveMQ, whose queue sends a page per wake-up, not a prefetch)."""
        no_acks = self.fmt in _NO_REDELIVERIES or self.ack_mode != "durable"
        return no_acks and self.log.local and self.log.fsync

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._flusher is not None:
            self._flusher.close(timeout)
        self._close_consumer()
        self.log.close()

    def check(self) -> None:
        """Raise the error that ended the ingest, if any (the query then fails with it)."""
        if self.error is not None:
            raise self.error

    def _load_identities(self) -> None:
        """Identities of every message still in the log (a restart must recognise their redeliveries).
        Whether the broker's message ids are stable is known only once connected (STOMP on RabbitMQ:
        they change per session), so both the id and the content identity are kept."""
        head, tail = self.log.head, self.log.tail
        if head == tail or self.fmt in _NO_REDELIVERIES:
            return
        add = self._dedup.add
        for batch in self.log.read(tail, head):
            cols = batch.select(["body", "message_id", "headers", "offset"]).to_pydict()
            for body, mid, headers, offset in zip(cols["body"], cols["message_id"], cols["headers"], cols["offset"]):
                if mid is not None:
                    add(mid, offset)
                for key, value in headers or ():
                    if key == S.ID_HEADER and value:
                        add((S.ID_HEADER, value), offset)
                add(content_identity(body, headers), offset)

    def _stable_id(self, message_id, headers):
        """The id that names this message across sessions and sends, or None: the header in which
        spark-mq sinks carry their ids (STOMP; the same on every broker and in a replayed batch,
        whose copies get new broker message-ids), else the broker's id where it is stable."""
        if headers:
            for key, value in headers:
                if key == S.ID_HEADER and value:
                    return (S.ID_HEADER, value)
        return message_id if (message_id is not None and self._stable_ids) else None

    def _identity_of(self, body, message_id, headers):
        stable = self._stable_id(message_id, headers)
        return stable if stable is not None else content_identity(body, headers)

    _progress = False   # the current session has taken a group (see _STEADY_SESSION)
    _stable_ids = True  # refined by the consumer once connected (STOMP on RabbitMQ: ids change per session)
    _resend_window = 0  # first deliveries still to be matched by stable id (set at each connect)

    # -- the thread -----------------------------------------------------------------------------

    def _run(self) -> None:
        delay = self.opts.reconnectDelay
        attempt = 0
        down_since: Optional[float] = None
        ever_connected = False  # after a first success, a refusal may be passing (a queue re-declared)
        refused_since: Optional[float] = None
        refusals = 0
        session_started = time.monotonic()
        try:
            while not self._stop.is_set():
                if self._consumer is None:
                    try:
                        consumer = self._connect(attempt)
                    except OptionError:
                        raise  # options no connection can use (checked at load() too): retrying cannot help
                    except (SparkMqError, OSError) as exc:
                        now = time.monotonic()
                        # A wrong password or queue name is not an outage: fail after a short grace, not
                        # after brokerTimeout. The grace (and a few attempts) because a refusal can be
                        # passing too: a connection dropped during the handshake reads as 403, a broker
                        # starting up or at its connection limit answers 530, a queue may be about to be
                        # declared by its producer.
                        if not ever_connected and refusal(exc):
                            refused_since = refused_since or now
                            refusals += 1
                            if refusals >= _REFUSALS and now - refused_since >= _REFUSAL_GRACE:
                                raise BrokerRefusedError(
                                    f"{self.fmt} source: {exc}. Not retried after {refusals} refusals in "
                                    f"{now - refused_since:.0f}s: the broker refused what the options ask for "
                                    f"(credentials, permissions, virtual host, queue, declare); fix them and "
                                    f"restart the query") from exc
                        else:
                            refused_since, refusals = None, 0
                        down_since = down_since or now
                        limit = self.opts.brokerTimeout
                        if limit and now - down_since > limit:
                            raise BrokerUnavailableError(
                                f"{self.fmt} source: broker unreachable for {now - down_since:.0f}s "
                                f"(brokerTimeout {limit:.0f}s): {exc}") from exc
                        # full jitter over reconnectDelay, then twice that, ... up to reconnectMaxDelay
                        sleep = random.uniform(0, min(self.opts.reconnectMaxDelay, delay * (2 ** min(attempt, 20))))
                        attempt += 1
                        log.warning("%s source: connect attempt %d failed (%s); retrying in %.2fs",
                                    self.fmt, attempt, exc, sleep)
                        self._stop.wait(sleep)
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
                    self._stable_ids = consumer.stable_ids
                    self._adopt(consumer)
                    # A new session after a lost one, or the first of a restarted query: the broker
                    # may send again messages whose acks it lost, without marking them redelivered
                    # (ActiveMQ after a broker restart). At most a prefetch of them comes first:
                    # those first deliveries are matched by stable id too (see _step).
                    self._resend_window = self.prefetch if (ever_connected or self.log.head > self.log.tail) else 0
                    if down_since is not None or attempt:
                        self.reconnects += 1
                    # the connect alone is no progress: a session that fails before it takes a
                    # group (a delivery the client cannot decode, redelivered first each time)
                    # stays a failed attempt, backing off, under brokerTimeout (see below)
                    ever_connected = True
                    self.connected = True
                    self.last_message = time.monotonic()
                    session_started = time.monotonic()
                    self._progress = False
                try:
                    self._step()
                except (SparkMqError, OSError) as exc:
                    if isinstance(exc, (BrokerUnavailableError, LogWriteError, LogInUseError, DeliveryFailedError)) \
                            or self._stop.is_set():
                        raise
                    self.connected = False
                    self._close_consumer()
                    progressed = self._progress or time.monotonic() - session_started >= _STEADY_SESSION
                    if progressed:
                        # an outage after work done: reconnect at once, the backoff starts over
                        log.warning("%s source: connection lost (%s); reconnecting", self.fmt, exc)
                        attempt, down_since = 0, time.monotonic()
                        continue
                    now = time.monotonic()
                    down_since = down_since or session_started
                    limit = self.opts.brokerTimeout
                    if limit and now - down_since > limit:
                        raise BrokerUnavailableError(
                            f"{self.fmt} source: no session made progress for {now - down_since:.0f}s "
                            f"(brokerTimeout {limit:.0f}s); each connected and failed before taking a "
                            f"message. Last error: {exc}") from exc
                    sleep = random.uniform(0, min(self.opts.reconnectMaxDelay, delay * (2 ** min(attempt, 20))))
                    attempt += 1
                    log.warning("%s source: session failed before any progress (%s); attempt %d, reconnecting "
                                "in %.2fs", self.fmt, exc, attempt, sleep)
                    self._stop.wait(sleep)
                    continue
                if (attempt or down_since is not None) and \
                        (self._progress or time.monotonic() - session_started >= _STEADY_SESSION):
                    attempt, down_since = 0, None
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
        if self._flusher is not None and self._unsynced:
            self._flusher.request(self.log.head)
            deadline = time.monotonic() + 5.0
            while self._unsynced and self.log.durable_head < self._unsynced[-1][0] and \
                    self._flusher.error is None and time.monotonic() < deadline:
                time.sleep(0.005)
        try:
            self._settle(keep=len(self._unsynced))
        except (SparkMqError, OSError) as exc:
            if self._flusher is not None and self._flusher.error is not None:
                # the log's last groups may not be durable: not a matter of acks (Malamute has none
                # to redeliver them), so not quiet; close() fsyncs once more
                log.error("%s source: the source log's fsync failed at stop: %s", self.fmt, exc)
                if self.error is None:
                    self.error = exc
            else:
                log.info("%s source: acknowledgements at stop failed (%s); the broker redelivers them",
                         self.fmt, exc)

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
        if self._want_depth:
            self._count_target(consumer)
        if not self._resumed.is_set():  # see hold_until_resumed
            consumer.keepalive()
            self._resumed.wait(_PAUSE_CHECK)
            return
        if self.over_bound():
            self._settle(keep=0)
            if not self.paused:
                self.paused = True
                consumer.pause()
            consumer.keepalive()
            self._stop.wait(_PAUSE_CHECK)
            self._maybe_fix_target(consumer, quiet_ok=False)
            return
        if self.paused:
            self.paused = False
            consumer.resume()
            self.last_message = time.monotonic()  # a pause is not the broker's silence
        # Groups waiting for the flusher's fsync while the next is gathered: enough that the ingest
        # does not stop whenever one fsync takes longer than a few groups take to gather (see
        # _UNSYNCED_BYTES); nothing waits on their durability but Spark's planning (the flusher
        # serves no acks). A wait here is counted: the broker's deliveries queue meanwhile.
        self._settle(keep=self._unsynced_groups, counted=True)
        wait = max(0.001, min(self.opts.fsyncInterval or 0.001, 1.0))
        if consumer.builds_batches:  # the consumer builds the group's batch itself (Malamute: no acks)
            started = time.monotonic()
            count, batch = consumer.poll_batch(self._group_count, wait, self.log.head)
            if not count:
                self._nothing_came(consumer, started, wait)
                return
            self.last_message = self._polled_at = time.monotonic()
            self.consumed += count
            self._durable_later(self._append([batch], count), None)
            self._progress = True
            self._maybe_fix_target(consumer, quiet_ok=False)
            return
        started = time.monotonic()
        msgs = consumer.poll(self._group_count, wait)
        if not msgs:
            self._nothing_came(consumer, started, wait)
            return
        self.last_message = self._polled_at = time.monotonic()
        while msgs:
            try:
                self._take(consumer, msgs)
                break
            except PoisonDelivery as poison:
                msgs = self._poisoned(consumer, msgs, poison)  # raises unless it was dead-lettered
        self._progress = True
        self._maybe_fix_target(consumer, quiet_ok=False)

    def _take(self, consumer, msgs: list) -> None:
        """Log a group of deliveries (dropping redeliveries of what the log holds) and arrange their
        acknowledgement. Raises ``PoisonDelivery`` for a delivery that cannot be taken, before any
        of the group is logged or counted."""
        now_us = int(time.time() * 1_000_000)
        offset = self.log.head
        kept_tokens = []
        group: dict = {}  # this group's identities: recorded in ``dedup`` once the group is in the log
        row_msgs = msgs
        redeliveries = duplicates = 0
        if self.fmt in _NO_REDELIVERIES:
            rows = [consumer.row(msg, offset + i, now_us) for i, msg in enumerate(msgs)]
            offset += len(rows)
        else:
            rows, row_msgs = [], []
            dedup = self._dedup
            dedup.trim()  # as far as Spark's commits allowed (this thread owns the identities)
            # ids that identify a message across sessions are matched for first deliveries too only
            # where asked for (dedupById) or where the broker may be resending (the first prefetch of
            # deliveries of a session after a lost one or of a restarted query): otherwise a message
            # the broker delivers for the first time is never dropped
            check_all = self.opts.dedupById or self._resend_window > 0
            for msg in msgs:
                row = consumer.row(msg, offset, now_us)
                redelivered = row[REDELIVERED]
                if redelivered:
                    redeliveries += 1
                stable = self._stable_id(row[MESSAGE_ID], row[HEADERS])
                key = stable if stable is not None else content_identity(row[BODY], row[HEADERS])
                # redeliveries are matched by stable id or content hash; first deliveries only by
                # stable id, and only where check_all says so (two sends of one body are two messages)
                if (redelivered or (check_all and stable is not None)) and (key in dedup or key in group):
                    duplicates += 1
                    kept_tokens.append((None, msg))
                    continue
                group[key] = offset
                rows.append(row)
                row_msgs.append(msg)
                kept_tokens.append((offset, msg))
                offset += 1
        batches = self._build(rows, row_msgs) if rows else None
        # only now, with nothing left to fail for one delivery, does the group count
        self.consumed += len(msgs)
        self.redeliveries += redeliveries
        self.duplicates += duplicates
        if self.fmt not in _NO_REDELIVERIES:
            self._resend_window = max(0, self._resend_window - len(msgs))
        if batches:
            new_head = self._append(batches, len(rows))
            for key, off in group.items():  # only now: the redeliveries of a group that never
                self._dedup.add(key, off)    # reached the log must not be taken for duplicates
        else:
            new_head = self.log.head
        self._durable_later(new_head, msgs if self.ack_mode == "durable" else None)
        if self._available_now and self.target is None and not self._want_depth:
            self._stamped_end(consumer, kept_tokens)
        if self.ack_mode == "commit":
            with self._consumer_lock:
                gen = self._generation
                for off, msg in kept_tokens:
                    # a kept message is done when Spark commits past it; a dropped duplicate, when
                    # Spark commits past everything before it
                    self._pending_acks.append(((off + 1) if off is not None else new_head, gen, consumer.token(msg)))
                settled = bool(self._pending_acks) and self._pending_acks[0][0] <= self.committed
            if settled:
                # Redeliveries of a batch Spark has committed already: a restart's first offset call
                # commits the last run's final batch before the ingest connects, and the broker then
                # redelivers it. Only a later commit would ack them; with no new data there is none,
                # a full prefetch of them stalls the queue, and once the log is committed a next run
                # no longer knows them and takes them again (found in review; tested by
                # test_commit_mode_acks_redeliveries_of_a_committed_batch_without_new_data).
                self._ack_committed(self.committed)

    def _build(self, rows: list, msgs: list) -> list:
        """The group's record batches. The columns already keep what they can (text that is not UTF-8
        with U+FFFD, an integer out of range as null: ``spark_mq.arrowcols``); should a group fail
        all the same, the first row that fails alone is a ``PoisonDelivery`` (a value no column of the
        schema can hold); a group whose rows all build alone fails as before (``LogWriteError``: a
        build failure that retrying cannot mend)."""
        fmt = self.fmt
        try:
            return [S.build_batch(fmt, chunk) for chunk in self._chunks(rows)]
        except Exception as exc:  # noqa: BLE001 - sorted out below, per row
            first = exc
        schema = S.source_arrow_schema(fmt)
        for row, msg in zip(rows, msgs):
            for value, field in zip(row, schema):
                try:
                    S.column([value], field.type)
                except Exception as exc:  # noqa: BLE001 - this value is the poison
                    raise PoisonDelivery(
                        f"column {field.name!r} cannot hold its value {_shown(value)} ({type(exc).__name__}: {exc})",
                        msg=msg, message_id=row[MESSAGE_ID], destination=row[DESTINATION], body=row[BODY],
                        headers=row[HEADERS]) from exc
        # not one message: retrying would take the same deliveries again and fail the same way (a
        # column past Arrow's 2 GiB bound): the query fails, naming it; nothing was acknowledged
        raise LogWriteError(f"{self.fmt} source: a group of {len(rows)} messages could not be added to the "
                            f"source log at offset {self.log.head}: {type(first).__name__}: {first}") from first

    def _poisoned(self, consumer, msgs: list, poison: PoisonDelivery) -> list:
        """``poison`` failed its session once more. Below ``maxDeliveryFailures`` the session fails
        (re-raised: the ingest reconnects, backing off, and the broker redelivers it); at it, the
        query fails naming the message (``poisonMessages=fail``, and always for a delivery not held),
        or the messages before it are logged and made durable, it is dead-lettered, and the rest of
        the group (returned) is taken."""
        body = poison.body if poison.body is not None else b""
        key = self._identity_of(body, poison.message_id, poison.headers)
        if poison.body is None:
            key = ("unheld", poison.size, key)
        counts = self._poison_counts
        count = counts.pop(key, 0) + 1
        counts[key] = count
        while len(counts) > _POISON_MEMORY:
            counts.pop(next(iter(counts)))
        limit = self.opts.maxDeliveryFailures
        where = poison.destination or (self.opts.get("queue") or self.opts.get("destination"))
        what = f"message {poison.message_id!r} from {where!r}" if poison.message_id is not None else \
            f"a message without id from {where!r}"
        # ackMode=auto: the broker forgot it at delivery and will not redeliver it, so a failed session
        # would lose it (and what the client held) quietly: the policy applies at once
        if count < limit and self.ack_mode != "auto":
            log.warning("%s source: %s failed its session (%d of maxDeliveryFailures=%d): %s",
                        self.fmt, what, count, limit, poison.reason)
            raise poison
        policy = self.opts.poisonMessages
        if policy == "deadletter" and poison.held and consumer.dead_letters:
            i = next(i for i, m in enumerate(msgs) if m is poison.msg)
            if i:
                self._take(consumer, msgs[:i])
            # those before it become durable (and, acked per ackMode, nothing before it waits on an
            # ack the dead-lettering might give cumulatively: STOMP on ActiveMQ)
            self._settle(keep=0)
            reason = f"failed {count} sessions of spark-mq's {self.fmt} source: {poison.reason}"
            with self._consumer_lock:
                later = consumer.dead_letter(poison.msg, reason, count)
                if later is not None:  # commit mode, cumulative acks: with the commit past it
                    self._pending_acks.append((self.log.head, self._generation, consumer.token(later)))
            # its count stays: should the reject or ACK be lost with the connection, its redelivery
            # is dead-lettered at once
            self.dead_lettered += 1
            self.consumed += 1
            log.warning("%s source: %s dead-lettered after %d failed sessions: %s", self.fmt, what, count, poison.reason)
            return msgs[i + 1:]
        if not poison.held:
            how = (f"It cannot be dead-lettered: its body was never held (the bound is what keeps it out of "
                   f"memory). Raise {poison.option or 'the bound'} and restart the query.")
        else:
            how = ("Remove it from the queue, or set poisonMessages=deadLetter to have it dead-lettered, and "
                   "restart the query.")
        if self.ack_mode == "auto":
            where_now = ("With ackMode=auto the broker forgot it at delivery: it is lost, and named here, "
                         "rather than lost quietly.")
        else:
            where_now = ("It is still in the broker, unacknowledged, as is everything after it that the source "
                         "log does not hold.")
        raise DeliveryFailedError(
            f"{self.fmt} source: {what} failed {count} sessions (maxDeliveryFailures={limit}, "
            f"poisonMessages={policy}): {poison.reason}. {where_now} {how}") from poison

    def _nothing_came(self, consumer, started: float, wait: float) -> None:
        """A poll that began at ``started`` and could wait ``wait`` seconds returned nothing."""
        now = time.monotonic()
        # Silence counts only while the ingest watched. Before this poll it was busy elsewhere since
        # the last one returned (building and appending a group, waiting for an fsync), and a poll
        # that returns later than its wait allows was stalled with the whole process (a starved CPU,
        # a paused machine): the client's reader stalled too, so deliveries may wait unread
        # in the socket, and an empty poll right after a stall says nothing about the broker.
        # Such unwatched time, beyond the loop's own few milliseconds, moves the start of the silence on.
        unwatched = 0.0
        for gap in (started - self._polled_at, now - started - wait):
            if gap > _UNWATCHED_SLACK:
                unwatched += gap
        self._polled_at = now
        if unwatched:
            log.debug("%s source: %.3f s unwatched before an empty poll; silence counts from later", self.fmt, unwatched)
            self.last_message = min(now, self.last_message + unwatched)
        self._settle(keep=0)  # nothing more came: what came before is acknowledged now
        self.first_poll_done = True
        self._maybe_fix_target(consumer, quiet_ok=True)

    def _append(self, batches, count: int) -> int:
        """Append a group's ``count`` messages (``batches``) to the log (and fsync it here when no
        thread does); size the next group from it. Returns the log's head after it."""
        head = new_head = self.log.head
        try:
            for batch in batches:
                new_head = self.log.append(batch)
            if self._flusher is None:
                self.log.sync()
        except OSError as exc:
            raise self._write_error(exc) from exc
        except Exception as exc:  # noqa: BLE001 - building the group's Arrow data failed: not an outage
            # Retrying would take the same deliveries again and fail the same way (a column past
            # Arrow's 2 GiB bound, a value the schema cannot hold): the query fails, naming it.
            # Nothing of the group was acknowledged; the broker keeps it.
            raise LogWriteError(f"{self.fmt} source: a group of {count} messages could not be added to the "
                                f"source log at offset {head}: {type(exc).__name__}: {exc}") from exc
        self._size_groups(self.log.body_bytes(head, new_head), count)
        return new_head

    def _durable_later(self, new_head: int, msgs) -> None:
        """The group up to ``new_head`` waits for its fsync; ``msgs`` are acknowledged once it is
        durable (None: nothing to acknowledge)."""
        self._unsynced.append((new_head, self._generation, msgs))
        if self._flusher is not None:
            self._flusher.request(new_head)
            # The flusher's writer thread writes each group as it comes; should it fall behind, this
            # thread writes the oldest groups itself (after the writer's current write, if one is
            # under way), so that no more than _UNSYNCED_GROUPS groups' bytes are only in memory (a
            # crash of the process loses those; written ones are in the page cache, lost only with
            # the machine).
            if self.log.unwritten_bytes > self._unwritten_keep:
                try:
                    self.log.write_unwritten(self._unwritten_keep)
                except OSError as exc:
                    raise self._write_error(exc) from exc
        else:
            self._settle(keep=0)

    def _ack_durable(self) -> None:
        """Drop the groups that are durable from ``_unsynced``, oldest first, acknowledging each
        (durable mode) with one cumulative ACK: the ingest thread (``_settle``) and, with
        ``_acks_on_sync``, the flusher thread after each fsync. Nothing is acknowledged before the
        fsync covering it has returned (``durable_head``)."""
        unsynced = self._unsynced
        acked = False
        with self._ack_lock:
            durable = self.log.durable_head
            consumer, gen = self._consumer, self._generation
            while unsynced and unsynced[0][0] <= durable:
                _, group_gen, msgs = unsynced[0]
                # a group taken by a connection since lost is redelivered by the broker (and dropped as a
                # duplicate of what the log holds): its acks have nowhere to go
                if msgs is not None and group_gen == gen and consumer is not None:
                    consumer.ack(msgs)
                    acked = True
                unsynced.popleft()
                if not unsynced:
                    self.first_poll_done = True  # every poll's messages are durable (see _settle)
        if acked:
            # the broker held the rest back while these waited for the disk (prefetch): its silence
            # counts from now, or an fsync slower than quietPeriod would end an availableNow drain
            self.last_message = time.monotonic()

    def _write_error(self, exc: BaseException) -> LogWriteError:
        # not a broker problem: reconnecting would take the same messages again, and the identities
        # just remembered would drop them as duplicates of what never reached the log
        return LogWriteError(f"{self.fmt} source: writing the source log at {self.opts.logLocation} failed: {exc}")

    def _settle(self, keep: int, counted: bool = False) -> None:
        """Wait until at most ``keep`` appended groups are not yet durable, then acknowledge (durable
        mode) every group that is, oldest first. Once none is left, what every poll took is durable
        in the log: ``first_poll_done`` (a ``once`` batch sees it) and Spark is told. ``counted``: a
        wait (one the flusher had not yet made unnecessary) adds to ``logWaits``/``logWaitSeconds``."""
        unsynced = self._unsynced
        if not unsynced:
            return
        flusher = self._flusher
        if flusher is not None and len(unsynced) > keep:
            target = unsynced[-1 - keep][0]
            waits = counted and self.log.durable_head < target
            started = time.monotonic() if waits else 0.0
            if not flusher.wait(target, self._stop, self._keepalive) and not self._stop.is_set():
                error = flusher.error or OSError("the log's fsync thread ended")
                raise self._write_error(error) from flusher.error
            if waits:
                self.log_waits += 1
                self.log_wait_seconds += time.monotonic() - started
        self._ack_durable()
        if flusher is not None and flusher.error is not None and unsynced:
            raise self._write_error(flusher.error) from flusher.error
        if not unsynced:
            self.first_poll_done = True  # what the first poll took is durable in the log: a ``once`` batch sees it
        self._notify()

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

    def _chunks(self, rows: list):
        """``rows`` in runs of at most ``_MAX_APPEND_BYTES`` of bodies (and frames), at least one row
        each: a group is sized by the last group's mean body, so a jump in body size could make it
        larger than an Arrow binary column holds (2 GiB) or than a batch a task should read whole."""
        row_bytes = self._row_bytes
        start, size = 0, 0
        for i, row in enumerate(rows):
            n = row_bytes(row)
            if size + n > _MAX_APPEND_BYTES and i > start:
                yield rows[start:i]
                start, size = i, 0
            size += n
        yield rows[start:]

    def _size_groups(self, body_bytes: int, count: int) -> None:
        """The next group's message count: about ``fsyncBytes`` of bodies at the last group's mean size."""
        mean = max(1, body_bytes // count)
        self._group_count = max(1, min(self._group_limit, self.opts.fsyncBytes // mean))

    # -- availableNow -----------------------------------------------------------------------------

    def prepare_available_now(self) -> None:
        """Fix what "available now" means. The ingest thread counts, between two polls (when every
        message it took is counted as consumed): consumed + held by the client + the broker's depth,
        asked on the consuming channel so that every delivery sent before the answer is already held
        (AMQP orders a channel's frames). Protocols without a depth end the drain after a quiet period."""
        self.last_message = self._an_began = time.monotonic()
        self._an_began_ms = int(time.time() * 1000)
        self._want_depth = True
        self._available_now = True
        self.wait_for(lambda: not self._want_depth or not self.connected, self.opts.connectTimeout + 5.0)

    def end_available_now(self) -> None:
        """Forget the availableNow target: the next batches take whatever comes (Spark < 4.2 fixes one
        for a run's first batch only, see ``MQStreamReader._first_batch_of_one_batch_triggers``)."""
        self._available_now = False
        self._want_depth = False
        self.target = None
        self._target_consumed = None
        self._reached_at = None

    def _count_target(self, consumer) -> None:
        try:
            with self._consumer_lock:  # commit-mode acks use the same channel from another thread
                depth = consumer.depth_in_order()
                held = consumer.buffered()
        except (SparkMqError, OSError) as exc:
            log.warning("%s source: queue depth unknown (%s); availableNow ends after a quiet period", self.fmt, exc)
            depth = None
        if depth is not None:
            # counted in messages taken as new: redeliveries dropped as duplicates (after a reconnect
            # in the middle of the drain, up to a prefetch of them) must not count towards the target
            self._target_consumed = self.consumed - self.duplicates + held + depth
        with self._cond:
            self._want_depth = False  # only now: prepare_available_now waits for the figure
            self._cond.notify_all()

    def _stamped_end(self, consumer, kept: list) -> None:
        """availableNow on a broker that stamps each message when it takes it in (ActiveMQ): the
        first message stamped after the run began was not available at its start, and neither is
        anything after it (a queue delivers in order). The target is fixed just below it; it and
        what follows stay in the log for the next run."""
        if not consumer.broker_stamps:
            return
        stamp = consumer.broker_stamp_ms
        began = self._an_began_ms
        for offset, msg in kept:
            if offset is None:
                continue
            ms = stamp(msg)
            if ms is not None and ms > began:
                self._settle(keep=0)  # Spark plans up to the target: it must be durable
                self.target = max(offset, self.planned_end)
                log.info("%s source: availableNow target fixed at offset %d (a message the broker stamped %d ms "
                         "after the run began)", self.fmt, self.target, ms - began)
                with self._cond:
                    self._cond.notify_all()
                return

    def _silent_for(self, consumer, now: float) -> float:
        """Seconds without deliveries that count as the broker's silence: where the client hears the
        broker's heartbeats (Malamute), only up to the last time it heard them, so a broker that
        stopped (paused, stalled) is not taken for an empty one; where the client tells when bytes
        last came (STOMP), from then: a large frame still arriving is not silence."""
        last = self.last_message
        try:
            heard_at = consumer.heard_at()
            if heard_at is not None:
                now = min(now, heard_at)
            last = max(last, consumer.active_at() or last)  # bytes of a frame still arriving are not silence
        except Exception:  # noqa: BLE001 - a closed client: plain silence
            pass
        return now - last

    def _maybe_fix_target(self, consumer, quiet_ok: bool) -> None:
        if not self._available_now or self.target is not None or self._want_depth:
            return
        now = time.monotonic()
        silent = self._silent_for(consumer, now)
        reached = self._target_consumed is not None and self.consumed - self.duplicates >= self._target_consumed
        if reached:
            # RabbitMQ counts deliveries still inside the broker (between queue and channel) as
            # neither ready nor held: wait for those stragglers, briefly, before fixing the end
            if self._reached_at is None:
                self._reached_at = now
            reached = silent >= _STRAGGLER_WAIT or now - self._reached_at >= self.opts.quietPeriod
        # silence means "drained" only when the broker is free to send: in commit mode it holds back
        # once ``prefetch`` messages wait for Spark's commit. Where the broker can tell its queue
        # depth, a quiet period ends the drain only when that depth is 0 too (the count taken at the
        # start can be off by deliveries in flight inside the broker); silence with messages still
        # ready (another consumer holds them, or they expire) ends it after a longer fallback.
        starved = self.starved()
        # commit mode: while messages wait for acks, silence may only mean the broker holds the rest
        # back (prefetch; ActiveMQ also before the prefetch is full). The acks come when Spark asks
        # for the batch after a planned one: not quiet while the log holds unplanned messages (a
        # batch will be planned) or a planned batch is not committed yet.
        commit_due = self.ack_mode == "commit" and (self.log.head > self.planned_end or
                                                    self.committed < self.planned_end)
        quiet = False
        if quiet_ok and not starved and not commit_due and silent >= self.opts.quietPeriod:
            if self._target_consumed is None or silent >= self.opts.quietPeriod * _DEPTH_QUIET_FACTOR:
                quiet = True
            else:
                quiet = self._depth_now(consumer) == 0 and consumer.buffered() == 0
        # Where no depth says what was there at the start, a destination a producer keeps feeding
        # never falls quiet: the run ends at availableNowTimeout. ActiveMQ's stamps end it sooner
        # (_stamped_end), unless producers set the ``timestamp`` header themselves (ActiveMQ keeps theirs)
        timeout = self.opts.availableNowTimeout
        capped = (not reached and not quiet and timeout and self._target_consumed is None and self._an_began
                  and now - self._an_began >= timeout)
        if reached or quiet or capped:
            self._settle(keep=0)  # Spark plans up to the target: it must be durable
            self.target = self.log.head
            if capped:
                log.warning("%s source: availableNow target fixed at offset %d: availableNowTimeout (%g s) passed "
                            "while messages kept arriving; the next run reads the rest", self.fmt, self.target,
                            timeout)
            else:
                log.info("%s source: availableNow target fixed at offset %d (%s)", self.fmt, self.target,
                         "queue depth reached" if reached else "quiet period")
            with self._cond:
                self._cond.notify_all()

    def starved(self) -> bool:
        """Commit mode: the broker holds back, ``prefetch`` messages wait for Spark's commit."""
        return self.ack_mode == "commit" and len(self._pending_acks) >= self.prefetch

    def waiting_for_commit(self) -> bool:
        """Commit mode: deliveries stopped for half the quiet period while acks wait for Spark's
        commit; the broker may be holding more back until then (ActiveMQ does, before the prefetch
        is full), so the next batch should be planned now, and its planning commits the last."""
        return self.ack_mode == "commit" and bool(self._pending_acks) and \
            time.monotonic() - self.last_message >= self.opts.quietPeriod / 2

    def _depth_now(self, consumer) -> Optional[int]:
        try:
            with self._consumer_lock:
                return consumer.depth_in_order()
        except (SparkMqError, OSError):
            return None

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

    # -- commit -----------------------------------------------------------------------------------

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
        self._dedup.trim_later(end)  # the ingest thread trims: it adds to the identities meanwhile

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

    # -- figures ----------------------------------------------------------------------------------

    @staticmethod
    def _client_buffered(consumer) -> int:
        """Deliveries the client holds, received and not yet taken (bounded by clientBufferMessages)."""
        if consumer is None:
            return 0
        try:
            return consumer.buffered()
        except Exception:  # noqa: BLE001 - a figure; a broken consumer reports itself elsewhere
            return 0

    def figures(self) -> dict:
        head = self.log.head
        messages, nbytes = self.log.stats(self.committed)
        consumer = self._consumer
        now = time.monotonic()
        if consumer is not None and now - self._depth_asked >= _DEPTH_EVERY:
            self._depth_asked = now
            try:
                self.queue_depth = consumer.depth()
            except (SparkMqError, OSError):
                pass
        return {
            "logHead": head,
            "uncommittedMessages": messages,
            "uncommittedBytes": nbytes,
            "brokerQueueDepth": self.queue_depth,
            "consumed": self.consumed,
            "redeliveries": self.redeliveries,
            "duplicatesDropped": self.duplicates,
            "reconnects": self.reconnects,
            "deadLettered": self.dead_lettered,
            "logWaits": self.log_waits,
            "logWaitSeconds": round(self.log_wait_seconds, 3),
            "paused": self.paused,
            "clientBuffered": self._client_buffered(consumer),
            "connected": self.connected,
            "availableNowTarget": self.target,
        }
