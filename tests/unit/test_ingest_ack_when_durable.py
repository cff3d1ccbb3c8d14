"""ActiveMQ's STOMP consumer asks for small groups acknowledged by the fsync thread as each becomes
durable (issue 48): the broker dispatches a page (200 messages) per wake-up and an ACK wakes it. The
guarantee stays: nothing is acknowledged before the fsync covering it has returned."""

from __future__ import annotations

import threading
import time

import pytest

from spark_mq.options import SOURCE, parse_options
from spark_mq.sources.consumer import Consumer
from spark_mq.sources.ingest import Ingest


def _ingest(tmp_path, **extra):
    opts = parse_options({"uri": "tcp://127.0.0.1:1", "mailbox": "m", "logLocation": str(tmp_path / "log"), **extra},
                         format="malamute", direction=SOURCE)
    ing = Ingest("malamute", opts, connect=None)
    ing.ack_mode = "durable"  # as stomp has it; Malamute's rows suit the fake consumer
    return ing


class _Consumer(Consumer):
    """Malamute-shaped deliveries handed out once; acks recorded with the log's durable head at the time."""

    def __init__(self, ing, bodies, max_group=None, ack_when_durable=False):
        self.ing, self.bodies = ing, list(bodies)
        self.max_group, self.ack_when_durable = max_group, ack_when_durable
        self.acked: list = []
        self.threads: set = set()

    def poll(self, max_count, timeout):
        out, self.bodies = self.bodies[:max_count], self.bodies[max_count:]
        return list(enumerate(out))

    def row(self, msg, offset, now_us):
        return (msg[1], "m", None, now_us, None, False, offset, "s", None, None, None, None, None)

    def ack(self, msgs):
        # the guarantee: every message acknowledged is durable in the log when its ACK goes out
        assert self.ing.log.durable_head >= self.ing._wb.unsynced[0][0]
        self.acked.append([body for _, body in msgs])
        self.threads.add(threading.current_thread().name)

    def buffered(self):
        return 0

    def close(self):
        pass


def test_max_group_caps_the_groups(tmp_path):
    ing = _ingest(tmp_path)
    ing._sizer.limit = ing._sizer.count = 500  # as the stomp source's with prefetch 1000
    ing._adopt(_Consumer(ing, [], max_group=100))
    assert ing._sizer.limit == ing._sizer.count == 100
    ing._sizer.size(10 * 100, 100)  # 1 MiB of 10 B bodies would be 104,857
    assert ing._sizer.count == 100
    assert ing._wb.flusher is None  # no ack_when_durable: the fsync stays inline
    ing.log.close()


@pytest.mark.parametrize("extra, started", [
    ({}, True),                      # durable, local fsynced log: the flusher acknowledges
    ({"fsync": "false"}, False),     # nothing to wait for: acks follow the append inline
])
def test_ack_when_durable_starts_the_flusher_in_durable_mode(tmp_path, extra, started):
    ing = _ingest(tmp_path, **extra)
    ing._adopt(_Consumer(ing, [], ack_when_durable=True))
    assert (ing._wb.flusher is not None) is started and ing._wb.acks_on_sync is started
    ing.stop()


@pytest.mark.parametrize("mode", ["auto", "commit"])
def test_ack_when_durable_means_nothing_without_durable_acks(tmp_path, mode):
    ing = _ingest(tmp_path)
    ing.ack_mode = mode
    ing._adopt(_Consumer(ing, [], ack_when_durable=True))
    assert not ing._wb.acks_on_sync
    ing.stop()


def _slow_sync(ing, monkeypatch):
    real_sync, entered, release = ing.log.sync, threading.Event(), threading.Event()

    def slow_sync():
        entered.set()
        assert release.wait(10)
        real_sync()

    monkeypatch.setattr(ing.log, "sync", slow_sync)
    return entered, release


def test_the_fsync_thread_acks_each_group_once_durable_while_the_next_is_gathered(tmp_path, monkeypatch):
    ing = _ingest(tmp_path)
    consumer = _Consumer(ing, [bytes([i]) * 10 for i in range(7)], max_group=3, ack_when_durable=True)
    ing._adopt(consumer)
    ing._consumer = consumer
    entered, release = _slow_sync(ing, monkeypatch)
    ing._step()                       # group 1 appended; its fsync waits in the flusher
    assert entered.wait(10)
    ing._step()                       # group 2 gathered and appended meanwhile
    assert ing.log.head == 6 and ing.log.durable_head == 0 and consumer.acked == []
    release.set()                     # the flusher's fsyncs return: it acks each group, in order
    deadline = time.monotonic() + 10
    while len(consumer.acked) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert consumer.acked == [[b"\0" * 10, b"\1" * 10, b"\2" * 10], [b"\3" * 10, b"\4" * 10, b"\5" * 10]]
    assert consumer.threads == {"spark-mq-fsync-malamute"}  # not the ingest thread: no poll delays an ACK
    ing._step()
    ing._wb.settle(keep=0)
    assert consumer.acked[-1] == [b"\6" * 10] and ing.log.durable_head == 7 and not ing._wb.unsynced
    ing.stop()


def test_acks_of_a_lost_connection_are_not_sent_on_the_next(tmp_path, monkeypatch):
    ing = _ingest(tmp_path)
    first = _Consumer(ing, [b"a", b"b"], ack_when_durable=True)
    ing._adopt(first)
    ing._consumer = first
    entered, release = _slow_sync(ing, monkeypatch)
    ing._step()
    assert entered.wait(10)
    second = _Consumer(ing, [b"c"], ack_when_durable=True)
    ing._consumer, ing._generation = second, ing._generation + 1   # reconnected meanwhile
    release.set()
    ing._wb.settle(keep=0)
    assert first.acked == [] and second.acked == [] and not ing._wb.unsynced
    ing.stop()
