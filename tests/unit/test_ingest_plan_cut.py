"""A repeating trigger's planning ends the group being gathered (issue 45, latency): ``latestOffset``
asks the ingest to append and make durable what it holds, and the batch takes it, instead of the
deliveries waiting out ``fsyncInterval`` and missing the batch. Nothing is offered before it is durable."""

from __future__ import annotations

import threading
import time

from spark_mq import schema as S
from spark_mq.options import SOURCE, parse_options
from spark_mq.sources.base import gather
from spark_mq.sources.consumer import Consumer
from spark_mq.sources.ingest import Ingest


def _drip(every=0.002):
    """``receive(count, timeout)``: one item every ``every`` seconds, forever."""
    n = [0]

    def receive(count, timeout):
        time.sleep(min(every, timeout))
        if timeout < every:
            return []
        n[0] += 1
        return [n[0]]
    return receive


def test_gather_without_a_cut_is_unchanged():
    out = [0]
    assert gather(out, lambda c, t: [1] * c, 5, 1.0) is None and out == [0, 1, 1, 1, 1]
    out, t0 = [0], time.monotonic()
    gather(out, lambda c, t: [], 5, 1.0)  # an empty receive ends it
    assert out == [0] and time.monotonic() - t0 < 0.5


def test_gather_ends_when_cut_and_waits_in_slices():
    out, asked = [0], threading.Event()
    threading.Timer(0.05, asked.set).start()
    t0 = time.monotonic()
    gather(out, _drip(), 10_000, 5.0, cut=asked.is_set)
    assert time.monotonic() - t0 < 1.0 and 1 < len(out) < 10_000
    # an empty slice goes on waiting, until the timeout (as one long receive would)
    out, t0 = [0], time.monotonic()
    gather(out, lambda c, t: (time.sleep(t), [])[1], 5, 0.1, cut=lambda: False)
    assert out == [0] and 0.09 <= time.monotonic() - t0 < 1.0


class _Dripping(Consumer):
    """Malamute-shaped deliveries, one every 2 ms, gathered as the AMQP and STOMP consumers do."""

    def __init__(self):
        self.receive = _drip()

    def poll(self, max_count, timeout):
        first = self.receive(1, timeout)
        if first:
            gather(first, self.receive, max_count, timeout, self.cut)
        return first

    def row(self, msg, offset, now_us):
        return (b"x", "m", None, now_us, None, False, offset, "s", None, None, None, None, None)

    def buffered(self):
        return 0

    def close(self):
        pass


def _ingest(tmp_path, **extra):
    opts = parse_options({"uri": "tcp://127.0.0.1:1", "mailbox": "m", "logLocation": str(tmp_path / "log"),
                          "fsyncInterval": "5", **extra}, format="malamute", direction=SOURCE)
    ing = Ingest("malamute", opts, connect=None)
    consumer = _Dripping()
    ing._adopt(consumer)
    ing._consumer = consumer
    return ing


def test_planning_ends_the_group_being_gathered_and_waits_until_it_is_durable(tmp_path):
    ing = _ingest(tmp_path)                    # a group would gather for 5 s
    drip, dripped = ing._consumer.receive, [0]

    def counted(count, timeout):
        got = drip(count, timeout)
        dripped[0] += len(got)
        return got
    ing._consumer.receive = counted
    step = threading.Thread(target=ing._step)
    step.start()
    deadline = time.monotonic() + 4.0           # at least 10 gathered: no fixed sleep on a busy machine
    while not (ing._gathering and dripped[0] >= 10) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ing.log.head == 0 and ing._gathering and dripped[0] >= 10
    t0 = time.monotonic()
    ing.end_group_for_plan(2.0)
    assert time.monotonic() - t0 < 1.0
    assert ing.log.durable_head == ing.log.head >= 10   # what was gathered is durable: the batch takes it
    step.join(5)
    assert not step.is_alive() and not ing._gathering
    ing.stop()


def test_planning_does_not_wait_when_nothing_is_held(tmp_path):
    ing = _ingest(tmp_path)
    t0 = time.monotonic()
    ing.end_group_for_plan(2.0)                 # no poll under way, nothing appended
    assert time.monotonic() - t0 < 1.0          # a wait would take the 2 s
    ing.stop()


class _DrippingBatches(_Dripping):
    """The same deliveries through ``poll_batch`` (``builds_batches``), as the Malamute consumer takes them."""

    builds_batches = True

    def poll_batch(self, max_count, timeout, offset):
        got = self.poll(max_count, timeout)
        if not got:
            return 0, None
        return len(got), S.build_batch("malamute", [self.row(m, offset + i, 0) for i, m in enumerate(got)])


def test_a_plan_ends_only_the_group_it_found_on_the_batch_path(tmp_path):
    """``builds_batches`` (Malamute): a plan ends the group being gathered, and the next group gathers
    for its whole time again (before: a cut, once asked, looked asked for every later poll, so every
    group ended at its first delivery: at 1,000 msg/s the reader's CPU went from 0.13 to 0.58 cores)."""
    ing = _ingest(tmp_path, fsyncInterval="0.3")  # a group gathers for 0.3 s
    ing._consumer = consumer = _DrippingBatches()
    ing._adopt(consumer)
    step = threading.Thread(target=ing._step)
    step.start()
    time.sleep(0.05)
    ing.end_group_for_plan(2.0)
    step.join(5)
    first = ing.log.head
    assert first >= 1 and not ing._gathering
    ing._step()                                   # no plan meanwhile: a whole group
    assert ing.log.head - first > 5
    ing.stop()
