"""Making the ingest's groups durable: appends, the write-behind flusher, and settling.

Responsible for: appending a group to the source log (and fsyncing it inline where no thread
does), the ``Flusher`` (a thread that fsyncs, and one that writes each group as it comes, so the
ingest thread gathers the next groups meanwhile), the groups appended but not yet durable
(``WriteBehind.unsynced``), waiting for them (``settle``) and acknowledging each once durable in
``ackMode=durable`` (``ack_durable``, one cumulative ACK per group, in order, never before the
fsync covering it has returned). Not responsible for the log's format or its fsync
(``spark_mq.sources.log``), for commit-mode acks (``spark_mq.sources.ingest``), nor for sizing groups
(``spark_mq.sources.groups``).

Threads: the ingest thread appends, waits and settles; the flusher's threads write and fsync, and
call back (``on_synced``), which in durable mode with ``acks_on_sync`` acknowledges from there.
Popping a group from ``unsynced`` and sending its ACK happen under one lock (``_ack_lock``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Callable, Optional

from spark_mq.errors import SparkMqError
from spark_mq.sources.log import SourceLog

log = logging.getLogger("spark_mq.sources.ingest")

__all__ = ["Flusher", "LogWriteError", "WriteBehind"]

# Appended groups that may wait for the flusher's fsync while the ingest gathers the next: about
# _UNSYNCED_BYTES of groups of ``fsyncBytes``, never fewer than _UNSYNCED_GROUPS: an fsync may take
# as long as gathering many groups (up to 50 ms for 1 MiB), and the ingest thread should hardly
# ever wait for the disk while the broker's deliveries queue (see docs/performance.md). Of the
# waiting groups, at most _UNSYNCED_GROUPS are also unwritten (held in memory, lost with the
# process): a thread of the flusher writes each group as it comes, whatever the fsync is doing,
# and the ingest writes the oldest itself should it fall behind.
_UNSYNCED_GROUPS = 4
_UNSYNCED_BYTES = 64 << 20


class LogWriteError(SparkMqError):
    """Appending to or syncing the source log failed (disk full, storage gone): the ingest stops and
    the query fails. Nothing unlogged was acknowledged; a restart recovers the log's tail and the
    broker redelivers the rest."""


class Flusher:
    """Writes and fsyncs the source log in a thread of its own (group commit, write-behind), so that
    the ingest thread receives, builds and appends the next groups while this one's bytes go to the
    page cache and the disk makes them durable (the fsync costs no CPU of ours, but the ingest
    thread would otherwise spend much of its time waiting in it and in ``os.write``).

    ``request(head)`` asks for everything appended up to ``head`` (one ``sync()`` writes and fsyncs
    all appends made before it starts); ``log.durable_head`` says how far it got; ``on_synced`` is
    called after each. Any failure of a write or an fsync is kept in ``error`` and ends the thread:
    nothing after it becomes durable, so nothing after it is acknowledged or planned.

    A second thread writes each group as soon as it is appended, while the first waits in an fsync:
    a slow fsync then delays durability, not the write, so a crash of the process loses only what
    was appended in the last moment (the written bytes are in the page cache). Writing them from the
    ingest thread instead would make it wait for this thread's writes."""

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


class WriteBehind:
    """One ingest's appended groups on their way to durability.

    A part of the ``Ingest`` it is given, not a stand-alone object: it reads the ingest's current
    consumer and generation (to acknowledge a group only on the connection that took it), its stop
    event and keepalive (while waiting for the disk), and sets two of its figures
    (``first_poll_done`` once nothing waits, ``last_message`` after an ACK); everything else here
    is its own."""

    def __init__(self, ingest, log_: SourceLog, fsync_bytes: int) -> None:
        self._ing = ingest
        self.log = log_
        # groups appended whose fsync has not returned yet: (head after the group, generation,
        # the messages to ack once durable in durable mode, else None), oldest first
        self.unsynced: deque = deque()
        self.flusher: Optional[Flusher] = None
        # durable mode with the fsync in the flusher thread (``ack_after_fsync``): that thread
        # acknowledges each group once it is durable
        self.acks_on_sync = False
        self._ack_lock = threading.Lock()  # popping a group and sending its ACK: in order, each once
        self.unsynced_groups = max(_UNSYNCED_GROUPS, _UNSYNCED_BYTES // fsync_bytes)
        # unwritten bytes past which the ingest waits for the flusher's writer thread
        self.unwritten_keep = _UNSYNCED_GROUPS * fsync_bytes
        self.waits = 0           # times the ingest stopped taking deliveries to wait for the log's fsync
        self.wait_seconds = 0.0

    def overlaps(self, no_acks: bool) -> bool:
        """Whether the fsync runs in the ``Flusher`` from the start: where no acknowledgement waits
        for it (``no_acks``: Malamute, and ``ackMode`` commit or auto), and only on a local, fsynced
        log (elsewhere an append is durable when written). With acks after the fsync
        (``ackMode=durable`` on AMQP and STOMP) the group waiting for its fsync holds half the
        prefetch unacknowledged and the broker stops sooner, which measured slower, so the fsync
        stays inline; except where the consumer asks otherwise once connected (``ack_after_fsync``)."""
        return no_acks and self.log.local and self.log.fsync

    def start_flusher(self) -> None:
        self.log.defer_writes()  # the flusher writes each group too, then fsyncs it
        self.flusher = Flusher(self.log, f"spark-mq-fsync-{self._ing.fmt}", self.on_synced)

    def ack_after_fsync(self) -> None:
        """Durable mode, asked for by the consumer: the fsync moves into the flusher thread, which
        acknowledges each group as soon as it is durable. Only on a local fsynced log, and only
        before anything waits for an fsync (the flusher is started at most once)."""
        if self.flusher is None and not self.unsynced and self.log.local and self.log.fsync:
            self.acks_on_sync = True
            self.start_flusher()

    def on_synced(self) -> None:
        """The flusher made more of the log durable (or failed): acknowledge where it does so, tell
        the waiters."""
        if self.acks_on_sync and self.flusher is not None and self.flusher.error is None:
            try:
                self.ack_durable()
            except (SparkMqError, OSError) as exc:
                # the connection failed: the ingest thread finds out at its next poll and connects
                # again; the broker redelivers these, and the log drops them as duplicates
                log.debug("%s source: an ack after an fsync failed: %s", self._ing.fmt, exc)
            except Exception:  # noqa: BLE001 - the flusher thread must go on making the log durable
                log.exception("%s source: an ack after an fsync failed", self._ing.fmt)
        self._ing._notify()

    def append(self, batches, count: int) -> tuple:
        """Append a group's ``count`` messages (``batches``) to the log, and fsync it here when no
        thread does. Returns the log's head before and after it."""
        head = new_head = self.log.head
        try:
            for batch in batches:
                new_head = self.log.append(batch)
            if self.flusher is None:
                self.log.sync()
        except OSError as exc:
            raise self.write_error(exc) from exc
        except Exception as exc:  # noqa: BLE001 - building the group's Arrow data failed: not an outage
            # Retrying would take the same deliveries again and fail the same way (a column past
            # Arrow's 2 GiB bound, a value the schema cannot hold): the query fails, naming it.
            # Nothing of the group was acknowledged; the broker keeps it.
            raise LogWriteError(f"{self._ing.fmt} source: a group of {count} messages could not be added to the "
                                f"source log at offset {head}: {type(exc).__name__}: {exc}") from exc
        return head, new_head

    def durable_later(self, new_head: int, generation: int, msgs) -> None:
        """The group up to ``new_head``, taken on connection ``generation``, waits for its fsync;
        ``msgs`` are acknowledged once it is durable (None: nothing to acknowledge)."""
        self.unsynced.append((new_head, generation, msgs))
        if self.flusher is not None:
            self.flusher.request(new_head)
            # The flusher's writer thread writes each group as it comes; should it fall behind, this
            # thread writes the oldest groups itself (after the writer's current write, if one is
            # under way), so that no more than _UNSYNCED_GROUPS groups' bytes are only in memory (a
            # crash of the process loses those; written ones are in the page cache, lost only with
            # the machine).
            if self.log.unwritten_bytes > self.unwritten_keep:
                try:
                    self.log.write_unwritten(self.unwritten_keep)
                except OSError as exc:
                    raise self.write_error(exc) from exc
        else:
            self.settle(keep=0)

    def ack_durable(self) -> None:
        """Drop the groups that are durable from ``unsynced``, oldest first, acknowledging each
        (durable mode) with one cumulative ACK: the ingest thread (``settle``) and, with
        ``acks_on_sync``, the flusher thread after each fsync. Nothing is acknowledged before the
        fsync covering it has returned (``durable_head``)."""
        ing = self._ing
        unsynced = self.unsynced
        acked = False
        with self._ack_lock:
            durable = self.log.durable_head
            consumer, gen = ing._consumer, ing._generation
            while unsynced and unsynced[0][0] <= durable:
                _, group_gen, msgs = unsynced[0]
                # a group taken by a connection since lost is redelivered by the broker (and dropped as a
                # duplicate of what the log holds): its acks have nowhere to go
                if msgs is not None and group_gen == gen and consumer is not None:
                    consumer.ack(msgs)
                    acked = True
                unsynced.popleft()
                if not unsynced:
                    ing.first_poll_done = True  # every poll's messages are durable (see settle)
        if acked:
            # the broker held the rest back while these waited for the disk (prefetch): its silence
            # counts from now, or an fsync slower than quietPeriod would end an availableNow drain
            ing.last_message = time.monotonic()

    def write_error(self, exc: BaseException) -> LogWriteError:
        # not a broker problem: reconnecting would take the same messages again, and the identities
        # just remembered would drop them as duplicates of what never reached the log
        return LogWriteError(f"{self._ing.fmt} source: writing the source log at {self._ing.opts.logLocation} "
                             f"failed: {exc}")

    def settle(self, keep: int, counted: bool = False) -> None:
        """Wait until at most ``keep`` appended groups are not yet durable, then acknowledge (durable
        mode) every group that is, oldest first. Once none is left, what every poll took is durable
        in the log: ``first_poll_done`` (a ``once`` batch sees it) and Spark is told. ``counted``: a
        wait (one the flusher had not yet made unnecessary) adds to ``waits``/``wait_seconds``."""
        ing = self._ing
        unsynced = self.unsynced
        if not unsynced:
            return
        flusher = self.flusher
        if flusher is not None and len(unsynced) > keep:
            target = unsynced[-1 - keep][0]
            waits = counted and self.log.durable_head < target
            started = time.monotonic() if waits else 0.0
            if not flusher.wait(target, ing._stop, ing._keepalive) and not ing._stop.is_set():
                error = flusher.error or OSError("the log's fsync thread ended")
                raise self.write_error(error) from flusher.error
            if waits:
                self.waits += 1
                self.wait_seconds += time.monotonic() - started
        self.ack_durable()
        if flusher is not None and flusher.error is not None and unsynced:
            raise self.write_error(flusher.error) from flusher.error
        if not unsynced:
            ing.first_poll_done = True  # what the first poll took is durable in the log: a ``once`` batch sees it
        ing._notify()

    def settle_on_stop(self) -> Optional[BaseException]:
        """Stopping: acknowledge what became durable (what does not is redelivered, and recognised).
        Returns the error that ends the query should the log's last groups not be durable."""
        flusher = self.flusher
        if flusher is not None and self.unsynced:
            flusher.request(self.log.head)
            deadline = time.monotonic() + 5.0
            while self.unsynced and self.log.durable_head < self.unsynced[-1][0] and \
                    flusher.error is None and time.monotonic() < deadline:
                time.sleep(0.005)
        try:
            self.settle(keep=len(self.unsynced))
        except (SparkMqError, OSError) as exc:
            if self.flusher is not None and self.flusher.error is not None:
                # the log's last groups may not be durable: not a matter of acks (Malamute has none
                # to redeliver them), so not quiet; close() fsyncs once more
                log.error("%s source: the source log's fsync failed at stop: %s", self._ing.fmt, exc)
                return exc
            log.info("%s source: acknowledgements at stop failed (%s); the broker redelivers them",
                     self._ing.fmt, exc)
        return None

    def close(self, timeout: float) -> None:
        if self.flusher is not None:
            self.flusher.close(timeout)
