"""The lanes of a stream source: one ``Ingest`` per consumer, and offsets that cover them all.

Responsible for: option ``consumers`` as the stream reader sees it. A query with N consumers has N
*lanes*; lane i is an independent ``Ingest`` (its own connection, ingest thread, flusher, acks and
``SourceLog``, at ``<logLocation>/lane-<i>``); the lanes compete for one queue or destination (the
broker spreads the messages over them). This module holds the lanes' layout on disk (``lanes.json``
in the log location records N; a location's N never changes), the offsets (``{"offset": n}`` for
one lane, exactly as before lanes existed; ``{"lanes": [n0, n1, ...]}`` for several), the
arithmetic over positions (a position is a tuple, one offset per lane; a batch ``[start, end)`` is
the union of the lanes' ranges), the fair split of a read limit over the lanes (``split_fairly``),
and the facade (``Lanes``) through which the stream reader asks every lane at once: heads, waits,
availableNow, commits, figures. The identities that recognise redeliveries are one ``Dedup`` for
all lanes (a message one lane did not acknowledge comes back on any lane), and so are the counts of
a poison delivery's failed sessions (``PoisonCounts``).

Not responsible for planning batches (``spark_mq.sources.base``), for what a lane does (``Ingest``)
nor for the log format (``spark_mq.sources.log``).

With one consumer nothing of this shows: one lane at ``logLocation`` itself, no ``lanes.json``,
offsets ``{"offset": n}``; checkpoints and logs written before lanes existed keep working.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from typing import Callable, Optional, Sequence

import pyarrow.fs as pafs

from spark_mq.errors import OptionError
from spark_mq.options import Options
from spark_mq.sources.dedup import Dedup
from spark_mq.sources.batchfiles import EXECUTORS_FILE
from spark_mq.sources.ingest import Ingest
from spark_mq.sources.log import open_filesystem
from spark_mq.sources.log.segments import SEGMENT_NAME
from spark_mq.sources.poison import PoisonCounts

log = logging.getLogger("spark_mq.sources")

__all__ = ["Lanes", "LANES_FILE", "lane_location", "check_layout", "split_fairly", "lane_options"]

#: the file in a log location of several lanes that records how many (JSON: {"consumers": N})
LANES_FILE = "lanes.json"
_LANE_DIR = "lane-{}"

Position = tuple  # one offset per lane


def lane_location(location: str, lane: int) -> str:
    """Where lane ``lane`` of a query with several consumers keeps its log."""
    return location.rstrip("/") + "/" + _LANE_DIR.format(lane)


def _changed(location: str, old: int, new: int) -> OptionError:
    return OptionError(
        f"option 'consumers' is {new}, but the source log at {location} was written with consumers={old}: the "
        f"number of consumers (lanes) of a logLocation is fixed once written, and the checkpoint's offsets "
        f"name {old} lane{'s' if old != 1 else ''}. Start with consumers={old} again, or, to change it, let the "
        f"query finish its backlog (a run with trigger(availableNow=True)) and start the new one with a new "
        f"logLocation and a new checkpointLocation")


def check_layout(location: str, consumers: int) -> None:
    """Refuse a log location written with another number of consumers; record the number of a new
    location of several lanes (``LANES_FILE``, written before any lane's log)."""
    fs, root, _ = open_filesystem(location)
    if fs.get_file_info(root + "/" + EXECUTORS_FILE).type == pafs.FileType.File:
        raise OptionError(f"the source log at {location} was written with option ingest=executors (batch files per "
                          f"lane); the driver-side ingest cannot continue it. Set ingest=executors again, or use a "
                          f"new logLocation and checkpointLocation")
    info = fs.get_file_info(root + "/" + LANES_FILE)
    recorded = None
    if info.type == pafs.FileType.File:
        with fs.open_input_stream(info.path) as f:
            try:
                recorded = int(json.loads(f.read().decode())["consumers"])
            except (ValueError, KeyError, TypeError) as exc:
                raise OptionError(f"the source log at {location} has an unreadable {LANES_FILE} ({exc}); it "
                                  f"records the option 'consumers' the log was written with") from exc
    if recorded is not None:
        if recorded != consumers:
            raise _changed(location, recorded, consumers)
        return
    if consumers == 1:
        return
    listed = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    if any(SEGMENT_NAME.match(i.base_name) for i in listed if i.type == pafs.FileType.File):
        raise _changed(location, 1, consumers)
    fs.create_dir(root, recursive=True)
    with fs.open_output_stream(root + "/" + LANES_FILE) as f:
        f.write(json.dumps({"consumers": consumers}).encode())


def lane_options(opts: Options, lane: int, consumers: int) -> Options:
    """A lane's options: its log location, its share of the log's bounds (back-pressure holds for the
    query as a whole: the lanes together hold at most ``maxUncommittedMessages``/``Bytes``), and its
    own Malamute address where one is given (two clients cannot share one), and of Malamute
    ``streams``, its own share (stream ``i`` to lane ``i mod N``: a stream gives each reader every message)."""
    if consumers == 1:
        return opts
    changes = {"logLocation": lane_location(opts.logLocation, lane),
               "maxUncommittedMessages": max(1, math.ceil(opts.maxUncommittedMessages / consumers)),
               "maxUncommittedBytes": max(1, math.ceil(opts.maxUncommittedBytes / consumers))}
    if opts.get("address"):
        changes["address"] = f"{opts.address}-lane-{lane}"
    if opts.get("streams"):
        # a Malamute stream delivers every message to each reader: each lane reads streams of its own
        changes["streams"] = dict(list(opts.streams.items())[lane::consumers])
    return opts.replace(**changes)


def split_fairly(available: Sequence[int], total: int, first: int = 0) -> list[int]:
    """Shares of ``total`` for lanes that have ``available[i]`` each: water-filling, so every lane gets
    an equal share or all it has, and what one lane cannot use goes to the others. What does not
    divide evenly goes one each to the lanes from ``first`` on (rotate it, and no lane is left
    out when ``total`` is below the number of lanes)."""
    n = len(available)
    share = [0] * n
    left = max(0, total)
    open_ = [i for i in range(n) if available[i] > 0]
    while left > 0 and open_:
        each = left // len(open_)
        if each == 0:
            order = sorted(open_, key=lambda i: (i - first) % n)
            for i in order[:left]:
                share[i] += 1
            break
        for i in open_:
            give = min(each, available[i] - share[i])
            share[i] += give
            left -= give
        open_ = [i for i in open_ if share[i] < available[i]]
    return share


class Lanes:
    """The lanes of one stream reader (driver-side process only). The reader's view of them: positions
    as tuples, and questions answered over every lane."""

    def __init__(self, ingests: list, location: str = "") -> None:
        self.ingests = ingests
        self.n = len(ingests)
        self.location = location

    @classmethod
    def open(cls, fmt: str, opts: Options, connector: Callable) -> "Lanes":
        """Open (not start) the lanes of ``opts``: ``opts.consumers`` ingests, one shared ``Dedup`` and
        one condition every lane notifies."""
        n = opts.get("consumers") or 1
        check_layout(opts.logLocation, n)
        dedup = Dedup(opts.dedupWindow, n) if n > 1 else None
        cond = threading.Condition() if n > 1 else None
        poison = PoisonCounts() if n > 1 else None
        ingests: list = []
        try:
            for i in range(n):
                lane_opts = lane_options(opts, i, n)
                ingests.append(Ingest(fmt, lane_opts, (lambda o: lambda attempt: connector(o, attempt))(lane_opts),
                                      lane=i, dedup=dedup, cond=cond, poison_counts=poison))
        except BaseException:
            for ing in ingests:
                ing.stop()
            raise
        return cls(ingests, opts.logLocation)

    # -- offsets ----------------------------------------------------------------------------------

    def decode(self, offset: dict) -> Position:
        """A position from Spark's offset JSON (a dict), checked against the number of lanes."""
        if self.n == 1:
            if "offset" in offset:
                return (int(offset["offset"]),)
            lanes = offset.get("lanes")
            raise OptionError(
                f"the checkpoint's offset {json.dumps(offset)} is of a source with consumers="
                f"{len(lanes) if isinstance(lanes, list) else '?'}, but option 'consumers' is 1. Start with the "
                f"consumers the checkpoint was written with, or a new checkpointLocation and logLocation")
        lanes = offset.get("lanes")
        if not isinstance(lanes, list):
            raise OptionError(
                f"the checkpoint's offset {json.dumps(offset)} is of a source with consumers=1, but option "
                f"'consumers' is {self.n}. Start with consumers=1, or a new checkpointLocation and logLocation")
        if len(lanes) != self.n:
            raise OptionError(
                f"the checkpoint's offset {json.dumps(offset)} has {len(lanes)} lanes, but option 'consumers' is "
                f"{self.n}. Start with consumers={len(lanes)}, or a new checkpointLocation and logLocation")
        return tuple(int(x) for x in lanes)

    def encode(self, pos: Position) -> dict:
        return {"offset": pos[0]} if self.n == 1 else {"lanes": list(pos)}

    # -- positions ----------------------------------------------------------------------------------

    def tail(self) -> Position:
        return tuple(ing.log.tail for ing in self.ingests)

    def head(self) -> Position:
        return tuple(ing.log.head for ing in self.ingests)

    def durable_head(self) -> Position:
        return tuple(ing.log.durable_head for ing in self.ingests)

    @staticmethod
    def count(lo: Position, hi: Position) -> int:
        """Messages in ``[lo, hi)``, every lane's range together."""
        return sum(max(0, h - l) for l, h in zip(lo, hi))

    def body_bytes(self, lo: Position, hi: Position) -> int:
        return sum(ing.log.body_bytes(l, h) for ing, l, h in zip(self.ingests, lo, hi) if h > l)

    @staticmethod
    def highest(a: Position, b: Position) -> Position:
        return tuple(max(x, y) for x, y in zip(a, b))

    # -- the lanes' state ----------------------------------------------------------------------------

    def all(self, predicate: Callable) -> bool:
        return all(predicate(ing) for ing in self.ingests)

    def any(self, predicate: Callable) -> bool:
        return any(predicate(ing) for ing in self.ingests)

    def check(self) -> None:
        for ing in self.ingests:
            ing.check()

    def start(self) -> None:
        for ing in self.ingests:
            ing.hold_until_resumed()  # the offset calls say where Spark resumes
            ing.start()

    def stop(self) -> None:
        for ing in self.ingests:
            ing.stop()

    def end_group_for_plan(self, timeout: float) -> None:
        """``Ingest.end_group_for_plan`` over every lane: each lane's group ends now, then this waits
        (``timeout`` in all) until all of them are durable."""
        if self.n == 1:
            return self.ingests[0].end_group_for_plan(timeout)
        readies = [ing.cut_for_plan() for ing in self.ingests]
        def durable() -> bool:
            return all(ready() for ready in readies)

        if not durable():
            self.wait_for(durable, timeout)

    def wait_for(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` (over any lanes), raising any lane's error. The lanes share one
        condition, so any lane's news wakes this."""
        if self.n == 1:
            return self.ingests[0].wait_for(predicate, timeout)
        deadline = time.monotonic() + timeout
        cond = self.ingests[0]._cond
        with cond:
            while not predicate():
                self.check()
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                cond.wait(min(left, 0.1))
        return True

    def resume_at(self, pos: Optional[Position]) -> None:
        for i, ing in enumerate(self.ingests):
            ing.resume_at(None if pos is None else pos[i])

    def catch_up(self, pos: Position) -> None:
        """Spark asks for the batch after ``pos``: a lane's log that ends below it continues there;
        what every lane holds below it was processed by the sink (``Ingest.processed``)."""
        for ing, s in zip(self.ingests, pos):
            if ing.log.head < s:
                ing.log.fast_forward(s)  # a log that ends below Spark's position: data in it is an error
            if s > ing.committed:
                ing.processed(s)

    def planned(self, end: Position) -> None:
        for ing, e in zip(self.ingests, end):
            ing.planned_end = max(ing.planned_end, e)

    def commit(self, end: Position) -> None:
        for ing, e in zip(self.ingests, end):
            ing.commit(e)

    # -- availableNow ------------------------------------------------------------------------------

    def prepare_available_now(self) -> None:
        for ing in self.ingests:
            ing.prepare_available_now()

    def end_available_now(self) -> None:
        for ing in self.ingests:
            ing.end_available_now()

    @property
    def available_now(self) -> bool:
        return self.any(lambda ing: ing.available_now)

    @property
    def available_now_began(self) -> float:
        return min(ing.available_now_began for ing in self.ingests)

    @property
    def last_message(self) -> float:
        return max(ing.last_message for ing in self.ingests)

    def targets(self) -> tuple:
        """Each lane's availableNow target (None where not fixed)."""
        return tuple(ing.target for ing in self.ingests)

    def all_targets_fixed(self) -> bool:
        return self.all(lambda ing: ing.target is not None)

    @staticmethod
    def held_back(ing) -> bool:
        """A lane that takes nothing more until Spark commits: paused at its log bound, or (commit
        mode) waiting for Spark's commit."""
        return ing.paused or ing.over_bound() or ing.starved() or ing.waiting_for_commit()

    # -- figures -----------------------------------------------------------------------------------

    def report(self) -> dict:
        """``reportLatestOffset``: the durable heads as an offset, then the figures. Several lanes:
        totals over the lanes (counts summed; ``paused`` when any lane is, ``connected`` when all are),
        and each lane's own figures under ``perLane``."""
        heads = self.durable_head()
        if self.n == 1:
            return {"offset": heads[0], **self.ingests[0].figures()}
        lanes = [ing.figures() for ing in self.ingests]
        total: dict = {}
        for key, value in lanes[0].items():
            values = [f[key] for f in lanes]
            if key == "paused":
                total[key] = any(values)
            elif key == "connected":
                total[key] = all(values)
            elif key == "availableNowTarget":
                total[key] = None if any(v is None for v in values) else values
            elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
                total[key] = round(sum(values), 3) if isinstance(values[0], float) else sum(values)
            elif all(v is None for v in values):
                total[key] = None
            else:
                total[key] = sum(v for v in values if v is not None)
        # the queue depth is the one queue's, asked by every lane: not a sum
        depths = [f["brokerQueueDepth"] for f in lanes if f.get("brokerQueueDepth") is not None]
        if "brokerQueueDepth" in total:
            total["brokerQueueDepth"] = max(depths) if depths else None
        return {"lanes": list(heads), **total, "perLane": lanes}
