"""availableNow plans batches while the ingest still drains (pure logic on a stub ingest and a fake
clock): once Spark asks and rows have waited at least ``_OVERLAP_MIN`` seconds and a quarter of the
drain so far, they go, so executors (a bridge's sink) write them while the drain goes on."""

from __future__ import annotations

import pytest

from spark_mq import schema as S
from spark_mq.options import SOURCE, parse_options
from spark_mq.sources import base
from spark_mq.sources.lanes import Lanes


class _Log:
    def __init__(self):
        self.head = self.durable_head = 0

    def body_bytes(self, lo, hi):
        return (hi - lo) * 100


class _Draining:
    """An ingest in the middle of an availableNow drain: no target yet, not paused, deliveries flowing."""

    def __init__(self, began):
        self.log = _Log()
        self.target = None
        self.paused = False
        self.available_now_began = began
        self.last_message = began

    def over_bound(self):
        return False

    def starved(self):
        return False

    def waiting_for_commit(self):
        return False


@pytest.fixture
def clock(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(base.time, "monotonic", lambda: now[0])
    return now


def _reader():
    opts = parse_options({"uri": "tcp://127.0.0.1:1", "mailbox": "m", "logLocation": "/nonexistent/log"},
                         format="malamute", direction=SOURCE)
    return base.MQStreamReader("malamute", opts, S.source_schema("malamute"), None)


def _ready_at(reader, ing, clock, t, head):
    clock[0] = 1000.0 + t
    ing.log.head = ing.log.durable_head = head
    ing.last_message = clock[0]  # still draining: the silence rule does not apply
    start = reader._last_end if isinstance(reader._last_end, tuple) else (reader._last_end or 0,)
    return reader._available_now_ready(Lanes([ing]), start, None)


def test_rows_wait_for_the_minimum_then_go_while_the_drain_continues(clock):
    reader, ing = _reader(), _Draining(began=1000.0)
    assert not _ready_at(reader, ing, clock, 0.5, 5_000)   # half a second in: wait for more
    assert _ready_at(reader, ing, clock, 1.0, 10_000)      # a second: plan what is there


def test_the_wait_grows_with_the_drain_so_a_long_drain_makes_few_batches(clock):
    reader, ing = _reader(), _Draining(began=1000.0)
    reader._last_batch_time, reader._last_end = 1000.0 + 40.0, 400_000  # last batch 40 s into the drain
    # 44 s in: 4 s since the last batch, a quarter of the drain is 11 s: not yet
    assert not _ready_at(reader, ing, clock, 44.0, 440_000)
    assert _ready_at(reader, ing, clock, 40.0 + 13.4, 534_000)  # 13.4 s >= 53.4 / 4


def test_a_minute_of_drain_makes_a_dozen_batches_not_one_nor_sixty(clock):
    """Spark always free (it asks every 10 ms), 10,000 messages a second for 60 s: the reader plans
    a batch whenever the rule says so. Without the rule the drain came as one batch at its end."""
    reader, ing = _reader(), _Draining(began=1000.0)
    planned = []
    for step in range(1, 6001):
        t = step / 100
        if _ready_at(reader, ing, clock, t, int(t * 10_000)):
            reader._last_batch_time, reader._last_end = clock[0], ing.log.head
            planned.append(round(t, 2))
    assert 8 <= len(planned) <= 16, planned
    assert planned[0] == 1.0 and planned[-1] >= 45.0, planned  # the first after a second, the last late in the drain
