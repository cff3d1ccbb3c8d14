"""Recognising redeliveries of what the source log already holds: the ingest's dedup.

Responsible for: a message's identity (a stable id where there is one, else ``content_identity``),
the identities of the log plus the last ``dedupWindow`` committed messages (``Dedup``), rebuilding
them from the log when an ingest starts, and sorting a group of deliveries into rows to log and
duplicates to drop (``Redeliveries``). Not responsible for acknowledging the duplicates or counting
them (``spark_mq.sources.ingest``), nor for building rows (the format's ``Consumer``).

One thread owns the identities, the ingest thread; Spark's thread only says how far trimming may go.
With several consumers (``consumers`` > 1, ``spark_mq.sources.lanes``) one ``Dedup`` serves every lane
of the query, since a message one lane took and did not acknowledge is redelivered to any lane: its
identities are kept per lane (each lane's offsets, trimmed by that lane's commits), looked up across
all lanes, and guarded by its ``cond``; a group's new identities are claimed (``pending``) while the
lane appends it, so that another lane holding a redelivery of one of them waits for the outcome
instead of logging it a second time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional

from spark_mq import schema as S
from spark_mq.options import Options
from spark_mq.schema import BODY, HEADERS, MESSAGE_ID, REDELIVERED
from spark_mq.sources.log import SourceLog

__all__ = ["NO_REDELIVERIES", "VOLATILE_HEADERS", "content_identity", "identity", "Dedup", "Redeliveries"]

#: headers that differ between deliveries of one message, left out of the content identity: STOMP's
#: per-delivery headers, and the delivery count RabbitMQ's quorum queues add to every redelivery
#: (AMQP application header and STOMP header alike)
_VOLATILE_HEADERS = frozenset({"message-id", "subscription", "redelivered", "redeliveries", "ack", "content-length",
                               "x-delivery-count"})

VOLATILE_HEADERS = _VOLATILE_HEADERS  # (public: executor-side ingest computes the same identities)

#: protocols without acknowledgements: the broker never delivers a message twice, nothing to recognise
NO_REDELIVERIES = frozenset({"malamute"})


def content_identity(body: bytes, headers) -> int:
    """Identity of a message without a stable id: a hash of body, its length and (stable) headers.

    Python's 64-bit SipHash, keyed by the process's hash seed (Spark may fix ``PYTHONHASHSEED`` for
    its Python workers; identities are rebuilt from the log when an ingest starts and never leave
    the process, so no seed needs to match another). A redelivery is looked up among at most the log plus
    ``dedupWindow`` identities, so a chance collision is of the order of 1e5 / 2**64. A
    cryptographic hash costs about 5x more and releases the GIL for every body, which next to the
    client's receiver thread makes it the ingest's largest cost."""
    stable = tuple(sorted([kv for kv in headers if kv[0] not in _VOLATILE_HEADERS])) if headers else ()
    return hash((len(body), body, stable))


def identity(body: bytes, message_id, headers, stable_ids: bool) -> tuple:
    """``(key, stable)``: the message's identity and whether it is a stable id (``Redeliveries.stable_id``)
    rather than its ``content_identity``, the same values those give, in one pass over the headers (the
    ingest's cost per message: two passes and a generator cost it twice as much, measured)."""
    kept = []
    if headers:
        id_header = S.ID_HEADER
        volatile = _VOLATILE_HEADERS
        for kv in headers:
            name = kv[0]
            if name in volatile:
                continue
            if name == id_header and kv[1]:
                return (id_header, kv[1]), True
            kept.append(kv)
    if message_id is not None and stable_ids:
        return message_id, True
    kept.sort()
    return hash((len(body), body, tuple(kept))), False


class Dedup:
    """Identities of messages in the log, plus the last ``window`` committed ones, per lane (one lane
    unless the query has several consumers; each lane keeps ``window`` / lanes of its committed ones).

    One lane's thread owns a lane's identities: it adds, looks up and trims. Spark's thread
    (``commit``) only says how far trimming may go (``trim_later``, one assignment): trimming there
    would iterate the dict while the ingest adds to it (``RuntimeError: OrderedDict mutated during
    iteration``; ``test_dedup_trims_on_its_own_thread_while_another_commits``). With several lanes
    (``shared``) the lanes' threads look up, add and trim under ``cond``."""

    def __init__(self, window: int, lanes: int = 1) -> None:
        self.window = window
        self._lanes = [OrderedDict() for _ in range(lanes)]  # per lane: identity -> offset, in offset order
        self._ids: OrderedDict = self._lanes[0]
        self._lane_window = -(-window // lanes)
        self._trim_to = [0] * lanes             # set by any thread; trimming is the owner's
        self.shared = lanes > 1
        self.cond = threading.Condition()       # several lanes: held while sorting and recording
        self.pending: dict = {}                 # several lanes: identity -> lane appending it now

    def __contains__(self, key) -> bool:
        if not self.shared:
            return key in self._ids
        for ids in self._lanes:
            if key in ids:
                return True
        return False

    def add(self, key, offset: int, lane: int = 0) -> None:
        """Record ``key`` at ``offset`` of ``lane``. A key seen before (a body that recurs: ``{}``, a
        fixed status event) moves to the end with its new offset: left at its first position with a
        later offset it would stop ``trim`` there, and the identities would grow with the whole history."""
        ids = self._lanes[lane]
        if key in ids:
            ids.move_to_end(key)
        ids[key] = offset

    def add_many(self, items, lane: int = 0) -> None:
        """``add`` for each ``(key, offset)`` of ``items`` (a group's: one call, not one per message)."""
        ids = self._lanes[lane]
        move_to_end = ids.move_to_end
        for key, offset in items:
            if key in ids:
                move_to_end(key)
            ids[key] = offset

    def trim_later(self, committed: int, lane: int = 0) -> None:
        """Any thread: identities of ``lane`` below ``committed`` may go, beyond the window (see ``trim``)."""
        if committed > self._trim_to[lane]:
            self._trim_to[lane] = committed

    def trim(self) -> None:
        """The owner's thread only (several lanes: under ``cond``): drop each lane's oldest identities
        below what ``trim_later`` allowed while it holds more than its share of ``window``."""
        for lane, ids in enumerate(self._lanes):
            committed = self._trim_to[lane]
            excess = len(ids) - self._lane_window
            while excess > 0:
                key, offset = next(iter(ids.items()))
                if offset >= committed:
                    break
                ids.popitem(last=False)
                excess -= 1

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._lanes)


class Redeliveries:
    """The dedup of one ingest: its identities (``ids``), whether the broker's message ids are stable
    (``stable_ids``, known once connected: STOMP on RabbitMQ changes them per session), and how many
    first deliveries of the session are still matched by stable id (``resend_window``, set at each
    connect: the broker may resend, unmarked, what it lost the acks of). With several lanes, ``ids``
    is the query's one ``Dedup``, shared by every lane's ``Redeliveries``, and ``lane`` says whose."""

    def __init__(self, fmt: str, opts: Options, ids: Optional[Dedup] = None, lane: int = 0) -> None:
        self.fmt = fmt
        self.opts = opts
        self.ids = Dedup(opts.dedupWindow) if ids is None else ids
        self.lane = lane
        self.stable_ids = True
        self.resend_window = 0

    def load(self, log_: SourceLog) -> None:
        """Identities of every message still in the log (a restart must recognise their redeliveries).
        Whether the broker's message ids are stable is known only once connected (STOMP on RabbitMQ:
        they change per session), so both the id and the content identity are kept."""
        head, tail = log_.head, log_.tail
        if head == tail or self.fmt in NO_REDELIVERIES:
            return
        ids, lane = self.ids, self.lane
        for batch in log_.read(tail, head):
            cols = batch.select(["body", "message_id", "headers", "offset"]).to_pydict()
            for body, mid, headers, offset in zip(cols["body"], cols["message_id"], cols["headers"], cols["offset"]):
                if mid is not None:
                    ids.add(mid, offset, lane)
                for key, value in headers or ():
                    if key == S.ID_HEADER and value:
                        ids.add((S.ID_HEADER, value), offset, lane)
                ids.add(content_identity(body, headers), offset, lane)

    def stable_id(self, message_id, headers):
        """The id that names this message across sessions and sends, or None: the header in which
        spark-mq sinks carry their ids (STOMP; the same on every broker and in a replayed batch,
        whose copies get new broker message-ids), else the broker's id where it is stable."""
        if headers:
            for key, value in headers:
                if key == S.ID_HEADER and value:
                    return (S.ID_HEADER, value)
        return message_id if (message_id is not None and self.stable_ids) else None

    def identity_of(self, body, message_id, headers):
        return identity(body, message_id, headers, self.stable_ids)[0]

    def sort(self, consumer, msgs: list, offset: int, now_us: int):
        """Rows for ``msgs`` from ``offset`` on, without the redeliveries of what the log holds.

        Returns ``(rows, row_msgs, kept, group, redeliveries, duplicates)``: the rows to log and their
        deliveries; ``kept``, every delivery as ``(offset, msg)``, offset None for a dropped duplicate;
        ``group``, the new identities (for ``record`` once the group is in the log, or ``release`` if it
        never gets there); and the counts.

        Several lanes: sorted under the shared ``cond``. An identity another lane is appending right
        now (``pending``) may be the same message, redelivered here after that lane's connection
        dropped: the sort waits until that lane recorded (or released) it and sorts again, holding no
        claim of its own while it waits (so two lanes never wait for each other); then the group's new
        identities are claimed as this lane's until ``record``."""
        ids = self.ids
        if not ids.shared:
            return self._sort(consumer, msgs, offset, now_us, None)
        lane = self.lane
        with ids.cond:
            while True:
                conflicts: list = []
                result = self._sort(consumer, msgs, offset, now_us, conflicts)
                if not conflicts:
                    break
                ids.cond.wait(0.05)
            pending = ids.pending
            for key in result[3]:
                pending[key] = lane
        return result

    def _sort(self, consumer, msgs: list, offset: int, now_us: int, conflicts: Optional[list]):
        """``sort``'s work; ``conflicts`` (several lanes) collects the looked-up identities another
        lane is appending now."""
        rows, row_msgs, kept = [], [], []
        group: dict = {}
        redeliveries = duplicates = 0
        dedup = self.ids
        dedup.trim()  # as far as Spark's commits allowed (this thread owns the identities)
        # ids that identify a message across sessions are matched for first deliveries too only
        # where asked for (dedupById) or where the broker may be resending (the first prefetch of
        # deliveries of a session after a lost one or of a restarted query): otherwise a message
        # the broker delivers for the first time is never dropped
        check_all = self.opts.dedupById or self.resend_window > 0
        row_of = consumer.row
        stable_ids = self.stable_ids
        for msg in msgs:
            row = row_of(msg, offset, now_us)
            redelivered = row[REDELIVERED]
            if redelivered:
                redeliveries += 1
            key, stable = identity(row[BODY], row[MESSAGE_ID], row[HEADERS], stable_ids)
            # redeliveries are matched by stable id or content hash; first deliveries only by
            # stable id, and only where check_all says so (two sends of one body are two messages)
            looked_up = redelivered or (check_all and stable)
            if conflicts is not None and looked_up and dedup.pending.get(key, self.lane) != self.lane:
                conflicts.append(key)
            if looked_up and (key in dedup or key in group):
                duplicates += 1
                kept.append((None, msg))
                continue
            group[key] = offset
            rows.append(row)
            row_msgs.append(msg)
            kept.append((offset, msg))
            offset += 1
        return rows, row_msgs, kept, group, redeliveries, duplicates

    def taken(self, count: int) -> None:
        """``count`` deliveries were taken: fewer of the session's first ones are left to match."""
        self.resend_window = max(0, self.resend_window - count)

    def record(self, group: dict) -> None:
        """A group's identities, once it is in the log: the redeliveries of a group that never
        reached the log must not be taken for duplicates."""
        ids, lane = self.ids, self.lane
        if not ids.shared:
            ids.add_many(group.items(), lane)
            return
        with ids.cond:
            pending = ids.pending
            for key, off in group.items():
                ids.add(key, off, lane)
                if pending.get(key) == lane:
                    del pending[key]
            ids.cond.notify_all()

    def release(self, group: dict) -> None:
        """A sorted group that will not reach the log (a poison delivery in it): several lanes, its
        claims go (its messages come back redelivered, and are new again)."""
        ids = self.ids
        if not ids.shared or not group:
            return
        with ids.cond:
            pending, lane = ids.pending, self.lane
            for key in group:
                if pending.get(key) == lane:
                    del pending[key]
            ids.cond.notify_all()

    def trim_later(self, committed: int) -> None:
        """Spark committed this lane up to ``committed``: its identities below may go (beyond the window)."""
        self.ids.trim_later(committed, self.lane)

