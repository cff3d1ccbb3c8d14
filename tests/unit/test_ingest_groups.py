"""Ingest group sizing: a group holds about ``fsyncBytes`` of bodies, within ``fsyncMessages`` (and,
with acks, half the prefetch). Pure arithmetic on an Ingest that is never started."""

from __future__ import annotations

import time

import pytest

from spark_mq.options import SOURCE, parse_options
from spark_mq.sources.consumer import Consumer
from spark_mq.sources.ingest import Ingest


def _ingest(tmp_path, fmt="malamute", **extra):
    base = {"uri": "tcp://127.0.0.1:1", "mailbox": "m"} if fmt == "malamute" else \
        {"uri": "amqp://guest:guest@127.0.0.1:1/%2F", "queue": "q"}
    opts = parse_options({**base, "logLocation": str(tmp_path / "log"), **extra}, format=fmt, direction=SOURCE)
    return Ingest(fmt, opts, connect=None)


def test_first_group_takes_the_count_limit(tmp_path):
    ing = _ingest(tmp_path)                        # malamute: no acks, so fsyncMessages alone
    assert ing._sizer.count == ing._sizer.limit == 20_000
    ing.log.close()


@pytest.mark.parametrize("body, count, expected", [
    (4096, 20_000, 256),      # 1 MiB of 4 KiB bodies
    (100, 20_000, 10_485),    # 1 MiB of 100 B bodies
    (10, 20_000, 20_000),     # small bodies: the count limit holds
    (4 << 20, 1, 1),          # a body larger than fsyncBytes: one per group, never zero
    (0, 500, 20_000),         # empty bodies count as one byte each
])
def test_groups_follow_the_last_mean_body_size(tmp_path, body, count, expected):
    ing = _ingest(tmp_path)
    ing._sizer.size(body * count, count)
    assert ing._sizer.count == expected
    ing.log.close()


def test_groups_stay_within_half_the_prefetch_with_acks(tmp_path):
    ing = _ingest(tmp_path, fmt="amqp08", prefetch="1000", fsyncBytes="64k")
    assert ing._sizer.limit == 500
    ing._sizer.size(10 * 100, 100)                 # 64 KiB / 10 B would be 6553: capped at 500
    assert ing._sizer.count == 500
    ing._sizer.size(1024 * 100, 100)               # 64 KiB / 1 KiB
    assert ing._sizer.count == 64
    ing.log.close()


class _Stub(Consumer):
    """A stand-in connection: holds nothing, closes at once (the base does the rest)."""

    def buffered(self):
        return 0

    def close(self):
        pass


class _FakeConsumer(_Stub):
    """Hands out the given bodies once as Malamute deliveries (a unit test of the group's append)."""

    def __init__(self, bodies, frames_of=lambda i: None):
        self.bodies, self.frames_of = bodies, frames_of

    def poll(self, max_count, timeout):
        out, self.bodies = self.bodies[:max_count], self.bodies[max_count:]
        return list(enumerate(out))

    def row(self, msg, offset, now_us):
        i, body = msg
        return (body, "m", None, now_us, None, False, offset, "s", "m", "subj", "", self.frames_of(i))


def test_a_group_larger_than_the_append_bound_is_appended_in_runs(tmp_path, monkeypatch):
    """A group whose bodies (and extra frames) pass ``MAX_APPEND_BYTES`` goes to the log as several
    batches with contiguous offsets and one fsync; a single body larger than the bound is a run of its own."""
    import spark_mq.sources.groups as groups_mod

    monkeypatch.setattr(groups_mod, "MAX_APPEND_BYTES", 10_000)
    ing = _ingest(tmp_path)
    bodies = [bytes([i]) * 3000 for i in range(10)] + [b"x" * 25_000] + [b"y" * 10 for _ in range(5)]
    frames = {2: [b"a" * 3000, b"b" * 6000]}  # message 2 carries 9,000 more bytes of frames
    ing._consumer = _FakeConsumer([b"first"])
    ing._step()  # the log's first segment exists (creating it syncs too)
    ing._consumer = _FakeConsumer(list(bodies), lambda i: frames.get(i))
    syncs = []
    real_sync = ing.log.sync
    monkeypatch.setattr(ing.log, "sync", lambda: (syncs.append(1), real_sync()))
    ing._step()
    assert ing.log.head == 1 + len(bodies) and len(syncs) == 1
    batches = list(ing.log.read(1, 1 + len(bodies)))
    sizes = [b.num_rows for b in batches]
    assert sizes == [2, 1, 3, 3, 1, 1, 5], sizes
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(1, 1 + len(bodies)))
    assert [x for b in batches for x in b.column("body").to_pylist()] == bodies
    ing.log.close()


def test_a_log_write_failure_stops_the_ingest_before_any_ack(tmp_path, monkeypatch):
    """Disk full while appending: the ingest fails (the query with it) naming the log, acks nothing,
    and does not treat it as a broker loss to reconnect from."""
    import errno

    from spark_mq.sources.ingest import LogWriteError

    acked, connects = [], []

    class Consumer(_FakeConsumer):
        def ack(self, msgs):
            acked.extend(msgs)

        def close(self):
            pass

    def connect(attempt):
        connects.append(attempt)
        return Consumer([b"a", b"b", b"c"])

    ing = _ingest(tmp_path)
    ing._connect = connect

    def full(batch):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ing.log, "append", full)
    ing.start()
    ing._thread.join(10)
    assert isinstance(ing.error, LogWriteError), ing.error
    assert str(tmp_path / "log") in str(ing.error) and "No space left" in str(ing.error)
    assert acked == [] and connects == [0]
    ing.log.close()


def _slow_sync(ing, monkeypatch):
    """The log's fsync waits until released: (entered, release) events."""
    import threading

    real_sync, entered, release = ing.log.sync, threading.Event(), threading.Event()

    def slow_sync():
        entered.set()
        assert release.wait(10)
        real_sync()

    monkeypatch.setattr(ing.log, "sync", slow_sync)
    return entered, release


@pytest.mark.parametrize("fmt, extra, overlap", [
    ("malamute", {}, True),                          # no acks at all
    ("amqp08", {}, False),                           # ackMode=durable: the acks wait for the fsync
    ("amqp08", {"ackMode": "commit"}, True),         # acks wait for Spark's commit, not the fsync
    ("amqp08", {"ackMode": "auto"}, True),
    ("malamute", {"fsync": "false"}, False),         # nothing to overlap
])
def test_the_fsync_overlaps_the_next_group_only_where_no_ack_waits_for_it(tmp_path, fmt, extra, overlap):
    ing = _ingest(tmp_path, fmt=fmt, **extra)
    assert ing._overlap_fsync() is overlap
    ing.log.close()


def test_a_group_is_acked_and_offered_to_spark_only_once_fsynced(tmp_path, monkeypatch):
    """A group is appended, then fsynced: until that fsync returns, the group is not acked (durable
    mode) and Spark's view of the log (``durable_head``) stays before it, though it is appended."""
    import threading

    acked = []

    class Consumer(_FakeConsumer):
        def ack(self, msgs):
            acked.append([body for _, body in msgs])

    ing = _ingest(tmp_path)
    ing.ack_mode = "durable"  # as amqp08 and stomp have it; Malamute's rows suit the fake consumer
    ing._consumer = Consumer([b"a", b"b"])
    ing._step()
    assert acked == [[b"a", b"b"]] and ing.log.durable_head == 2
    entered, release = _slow_sync(ing, monkeypatch)
    ing._consumer = Consumer([b"c", b"d", b"e"])
    step = threading.Thread(target=ing._step)
    step.start()
    assert entered.wait(10)
    assert acked == [[b"a", b"b"]] and ing.log.head == 5 and ing.log.durable_head == 2
    release.set()
    step.join(10)
    assert acked == [[b"a", b"b"], [b"c", b"d", b"e"]] and ing.log.durable_head == 5
    assert [x for b in ing.log.read(0, 5) for x in b.column("body").to_pylist()] == [b"a", b"b", b"c", b"d", b"e"]
    ing.stop()


def test_an_fsync_failure_fails_the_ingest_and_acks_nothing(tmp_path, monkeypatch):
    import errno

    from spark_mq.sources.ingest import LogWriteError

    acked = []

    class Consumer(_FakeConsumer):
        def ack(self, msgs):
            acked.extend(msgs)

        def close(self):
            pass

    ing = _ingest(tmp_path)
    ing.ack_mode = "durable"
    ing._connect = lambda attempt: Consumer([b"a", b"b", b"c"])

    def broken():
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ing.log, "sync", broken)
    ing.start()
    ing._thread.join(10)
    assert isinstance(ing.error, LogWriteError) and "Input/output error" in str(ing.error), ing.error
    assert acked == [] and ing.log.durable_head == 0
    monkeypatch.undo()  # the disk is back: closing the log fsyncs it
    ing.stop()


def test_the_next_group_is_gathered_while_the_last_one_is_fsynced(tmp_path, monkeypatch):
    """With the fsync in its own thread (a started ingest on a local, fsynced log): a step returns
    while its group's fsync still waits on the disk, and the next group is polled and appended
    meanwhile; neither is acknowledged nor offered to Spark until that fsync returns, and a step
    whose poll brings nothing waits for it (what came before is acknowledged then)."""
    import threading

    from spark_mq.sources.writebehind import Flusher as _Flusher

    acked = []

    class Consumer(_FakeConsumer):
        def ack(self, msgs):
            acked.append([body for _, body in msgs])

    ing = _ingest(tmp_path)
    ing.ack_mode = "durable"
    ing._consumer = Consumer([b"a", b"b"])
    ing._step()                                     # inline fsync (no flusher yet): the log's first segment
    assert acked == [[b"a", b"b"]] and ing.log.durable_head == 2
    entered, release = _slow_sync(ing, monkeypatch)
    ing._wb.flusher = _Flusher(ing.log, "test-fsync", ing._notify)
    ing._consumer = Consumer([b"c", b"d", b"e"])
    ing._step()                                     # appended; its fsync is requested, not awaited
    assert entered.wait(10)
    assert ing.log.head == 5 and ing.log.durable_head == 2 and acked == [[b"a", b"b"]]
    ing._consumer.bodies = [b"f"]
    ing._step()                                     # one group in flight: the next one is gathered
    assert ing.log.head == 6 and ing.log.durable_head == 2 and acked == [[b"a", b"b"]]
    step = threading.Thread(target=ing._step)       # two in flight: this step waits for the first
    step.start()
    step.join(0.3)
    assert step.is_alive() and acked == [[b"a", b"b"]]
    release.set()
    step.join(10)
    assert not step.is_alive()
    assert acked == [[b"a", b"b"], [b"c", b"d", b"e"], [b"f"]] and ing.log.durable_head == 6
    assert [x for b in ing.log.read(0, 6) for x in b.column("body").to_pylist()] == [b"a", b"b", b"c", b"d", b"e", b"f"]
    ing._wb.flusher.close()
    ing.stop()


def test_a_slow_fsync_keeps_the_consumers_heartbeat(tmp_path, monkeypatch):
    """While the ingest thread waits for the fsync thread (a slow disk), it calls the consumer's
    ``keepalive`` (a Malamute client driven by this thread has no other thread to ping the broker)."""
    import threading

    from spark_mq.sources.writebehind import Flusher as _Flusher

    beats = []

    class Consumer(_FakeConsumer):
        def keepalive(self):
            beats.append(1)

    ing = _ingest(tmp_path)
    ing._consumer = Consumer([b"a"])
    ing._step()                                     # the log's first segment, fsynced in line
    entered, release = _slow_sync(ing, monkeypatch)
    ing._wb.flusher = _Flusher(ing.log, "test-fsync", ing._notify)
    ing._consumer = Consumer([b"b", b"c"])
    ing._step()                                     # its fsync is held on the "disk"
    assert entered.wait(10)
    waiting = threading.Thread(target=ing._wb.settle, args=(0,))
    waiting.start()
    deadline = time.monotonic() + 10
    while len(beats) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waiting.is_alive() and len(beats) >= 2, beats  # about every 0.1 s while it waits
    release.set()
    waiting.join(10)
    assert not waiting.is_alive() and ing.log.durable_head == 3
    ing._wb.flusher.close()
    ing.stop()


def test_a_fsync_thread_that_dies_fails_the_ingest(tmp_path, monkeypatch):
    """Any failure of the fsync thread, not only an OSError, ends durability: the next wait for it
    fails the ingest (naming the log) instead of waiting forever with nothing becoming durable."""
    from spark_mq.sources.ingest import LogWriteError
    from spark_mq.sources.writebehind import Flusher as _Flusher

    ing = _ingest(tmp_path)
    ing._consumer = _FakeConsumer([b"a"])
    ing._step()

    def broken():
        raise RuntimeError("not an OSError")

    monkeypatch.setattr(ing.log, "sync", broken)
    ing._wb.flusher = _Flusher(ing.log, "test-fsync", ing._notify)
    ing._consumer = _FakeConsumer([b"b"])
    ing._step()
    with pytest.raises(LogWriteError, match="not an OSError") as info:
        ing._wb.settle(keep=0)
    assert str(tmp_path / "log") in str(info.value) and ing.log.durable_head == 1
    monkeypatch.undo()
    ing._wb.flusher.close()
    ing.stop()


def test_an_fsync_failure_at_stop_is_an_error_not_a_redelivery(tmp_path, monkeypatch, caplog):
    """Stopping with a group whose fsync failed: Malamute has no redelivery, so it is logged as an
    error and kept as the ingest's error (not the "the broker redelivers them" note of a failed ack)."""
    import errno
    import logging

    from spark_mq.sources.writebehind import Flusher as _Flusher

    ing = _ingest(tmp_path)
    ing._consumer = _FakeConsumer([b"a"])
    ing._step()

    def broken():
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(ing.log, "sync", broken)
    ing._wb.flusher = _Flusher(ing.log, "test-fsync", ing._notify)
    ing._consumer = _FakeConsumer([b"b"])
    ing._step()
    ing._wb.flusher._thread.join(10)                # the fsync failed
    ing._stop.set()
    with caplog.at_level(logging.INFO, logger="spark_mq.sources.ingest"):
        ing._settle_on_stop()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and "fsync failed" in errors[0].getMessage() and "Input/output error" in errors[0].getMessage()
    assert not any("redelivers" in r.getMessage() for r in caplog.records)
    assert ing.error is not None
    monkeypatch.undo()
    ing._wb.flusher.close()
    ing.stop()


def test_a_consumer_that_builds_its_batch_is_appended_whole_from_the_log_head(tmp_path):
    """``poll_batch`` (Malamute's columnar groups): the ingest asks for the group at the log's head
    and appends the batch as built, counts it, and sizes the next group from it; ``poll`` and
    ``row`` are not used."""
    from spark_mq import schema as S

    asked = []

    class Columnar(_FakeConsumer):
        builds_batches = True

        def __init__(self, groups):
            super().__init__([])
            self.groups = groups

        def poll(self, max_count, timeout):
            raise AssertionError("poll is not used when poll_batch exists")

        def poll_batch(self, max_count, timeout, offset):
            asked.append((max_count, offset))
            if not self.groups:
                return 0, None
            bodies = self.groups.pop(0)
            return len(bodies), S.build_batch("malamute", [
                (b, "m", None, 0, None, False, offset + i, "s", "m", "", "", None) for i, b in enumerate(bodies)])

    ing = _ingest(tmp_path, fsync="false")
    ing._consumer = Columnar([[b"a" * 4096] * 3, [b"b" * 4096] * 2])
    ing._step()
    ing._step()
    ing._step()  # nothing more: first_poll_done
    assert [offset for _, offset in asked] == [0, 3, 5]
    assert asked[0][0] == 20_000 and asked[1][0] == 256  # the second group sized from the first's bodies
    assert ing.consumed == 5 and ing.log.head == 5 and ing.first_poll_done
    assert [x for b in ing.log.read(0, 5) for x in b.column("body").to_pylist()] == [b"a" * 4096] * 3 + [b"b" * 4096] * 2
    ing.log.close()


def test_an_fsync_slower_than_the_quiet_period_does_not_end_available_now(tmp_path, monkeypatch):
    """Durable mode without a queue depth (STOMP): while a group waits for its fsync, its messages
    hold the broker's prefetch, so the broker is silent because of us. Silence counts from the acks
    that follow the fsync, not from the last delivery: a slow disk must not end the drain early."""
    # a 1 s quiet period, so that a stall of the test machine between two steps cannot pass for it
    ing = _ingest(tmp_path, quietPeriod="1s")
    ing.ack_mode = "durable"  # as stomp has it; Malamute's rows suit the fake consumer
    ing._an.active, ing._an.want_depth, ing._an.target_consumed = True, False, None
    real_sync = ing.log.sync
    monkeypatch.setattr(ing.log, "sync", lambda: (time.sleep(1.5), real_sync()))
    ing._consumer = _FakeConsumer([b"a", b"b"])
    ing._step()                                    # the group, its 1.5 s fsync, then its acks
    assert ing.log.durable_head == 2
    ing._step()                                    # the broker had no time to send more yet
    assert ing.target is None, "the drain ended on silence the fsync caused"
    _watch(ing, 10)                                # a quiet period of polls after the acks: drained
    assert ing.target == 2
    ing.log.close()


def _watch(ing, seconds):
    """Step the ingest until the drain ends, for ``seconds`` at most (its polls of an empty consumer
    return at once). Generous: silence counts only watched time, and a loaded machine's stalls between
    steps move its start on."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and ing.target is None:
        ing._step()
        time.sleep(0.005)


class _StallingConsumer(_FakeConsumer):
    """Deliveries in two parts, and between them one empty poll after the process stalled: in the
    ingest thread while it built the first part's rows (the process descheduled, holding the GIL),
    or inside that poll (the whole process stalled while the poll waited). Either way
    the client's reader did not run: the second part was sent, but not read yet."""

    def __init__(self, first, second, stall, where):
        super().__init__(first)
        self.second, self.stall, self.where = second, stall, where
        self.polls = 0

    def poll(self, max_count, timeout):
        self.polls += 1
        if self.polls == 2:                        # the empty poll right after the stall
            if self.where == "poll":
                time.sleep(self.stall)
            return []
        if self.polls == 3:
            self.bodies = self.second
        return super().poll(max_count, timeout)

    def row(self, msg, offset, now_us):
        if self.where == "rows" and self.polls == 1 and msg[0] == 0:
            time.sleep(self.stall)
        return super().row(msg, offset, now_us)


@pytest.mark.parametrize("ack_mode", ["auto", "durable"])
@pytest.mark.parametrize("where", ["rows", "poll"])
def test_a_stalled_process_does_not_pass_for_the_brokers_silence(tmp_path, where, ack_mode):
    """A stall of the reader process longer than the quiet period (between two polls, or inside
    one), followed by an empty poll, is not the broker's silence: the drain goes on and takes the
    rest. Before silence counted only watched time, this ended the drain after the first part, but
    for a stall between polls in durable mode (the acks of the first part restarted the count)."""
    ing = _ingest(tmp_path, quietPeriod="0.3s", fsync="false")
    ing.ack_mode = ack_mode
    ing._an.active, ing._an.want_depth, ing._an.target_consumed = True, False, None
    ing._consumer = _StallingConsumer([b"a", b"b"], [b"c"], stall=0.6, where=where)
    ing._step()                                    # the first part (and a stall building its rows)
    ing._step()                                    # an empty poll (after, or with, the stall)
    assert ing.target is None, f"a stall ({where}) ended the drain"
    ing._step()                                    # the second part
    assert ing.log.head == 3
    _watch(ing, 10)                                # then true silence: drained
    assert ing.target == 3
    ing.log.close()


@pytest.mark.parametrize("fsync_bytes, waiting", [
    (None, 64),     # 64 MiB of the default 1 MiB groups
    ("8m", 8),
    ("64m", 4),     # never fewer than 4 groups
])
def test_the_ingest_gathers_about_64_mib_of_groups_while_an_fsync_is_slow(tmp_path, monkeypatch, fsync_bytes, waiting):
    """While the disk holds one fsync, the ingest goes on appending groups until about 64 MiB of
    them (``fsyncBytes`` each, at least 4 groups) wait for the flusher; the next step waits for the
    disk, and none of them is offered to Spark before its fsync returns."""
    import threading

    from spark_mq.sources.writebehind import Flusher as _Flusher

    ing = _ingest(tmp_path, **({"fsyncBytes": fsync_bytes} if fsync_bytes else {}))
    assert ing._wb.unsynced_groups == waiting
    ing._consumer = _FakeConsumer([b"first"])
    ing._step()                                     # the log's first segment, fsynced in line
    entered, release = _slow_sync(ing, monkeypatch)
    ing._wb.flusher = _Flusher(ing.log, "test-fsync", ing._notify)
    for i in range(waiting + 1):                    # the first group's fsync is held on the "disk"
        ing._consumer.bodies = [b"g%d" % i]
        step = threading.Thread(target=ing._step)
        step.start()
        step.join(10)
        assert not step.is_alive(), f"step {i} waited for the disk with {len(ing._wb.unsynced)} groups unsynced"
        assert entered.wait(10)
    assert len(ing._wb.unsynced) == waiting + 1 and ing.log.head == waiting + 2 and ing.log.durable_head == 1
    assert ing._wb.waits == 0
    ing._consumer.bodies = [b"last"]
    step = threading.Thread(target=ing._step)       # one group more than may wait: this step waits
    step.start()
    step.join(0.6)                                  # it waits from soon after its start: >= 0.25 s by the release
    assert step.is_alive() and ing.log.head == waiting + 2
    release.set()
    step.join(10)
    assert not step.is_alive() and ing.log.head == waiting + 3
    assert ing._wb.waits == 1 and ing._wb.wait_seconds >= 0.25   # the wait shows in the figures
    ing._consumer = None
    figures = ing.figures()
    assert figures["logWaits"] == 1 and figures["logWaitSeconds"] >= 0.25, figures
    ing._wb.settle(keep=0)
    assert ing.log.durable_head == waiting + 3
    bodies = [x for b in ing.log.read(0, waiting + 3) for x in b.column("body").to_pylist()]
    assert bodies == [b"first"] + [b"g%d" % i for i in range(waiting + 1)] + [b"last"]
    ing._wb.flusher.close()
    ing.stop()


def _unwritten_drains(log_, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while log_.unwritten_bytes and time.monotonic() < deadline:
        time.sleep(0.01)
    return not log_.unwritten_bytes


def test_while_an_fsync_is_slow_every_group_is_written_at_once(tmp_path, monkeypatch):
    """Groups may wait long for their fsync (``_UNSYNCED_BYTES``), but not for their write: while
    the flusher's fsync thread is held, its writer thread puts every appended group into the segment
    file (a crash of the process would not lose it), and none of them is offered to Spark before
    the fsync returns."""
    import os
    import threading

    from spark_mq.sources.writebehind import Flusher as _Flusher

    ing = _ingest(tmp_path, fsyncBytes="16k")       # 4,096 groups may wait for the fsync, 4 unwritten
    assert ing._wb.unsynced_groups == 4096 and ing._wb.unwritten_keep == 4 * 16384
    ing._consumer = _FakeConsumer([b"first"])
    ing._step()
    entered, release = _slow_sync(ing, monkeypatch)
    ing.log.defer_writes()
    ing._wb.flusher = _Flusher(ing.log, "test-fsync", ing._notify)
    segment = ing.log._segments[-1].path
    bodies = [bytes([65 + i]) * 20_000 for i in range(12)]  # a group each, larger than fsyncBytes
    for i, body in enumerate(bodies):
        ing._consumer.bodies = [body]
        step = threading.Thread(target=ing._step)
        step.start()
        step.join(10)
        assert not step.is_alive(), f"step {i} waited"
        assert entered.wait(10)
        assert _unwritten_drains(ing.log), f"step {i}: {ing.log.unwritten_bytes} bytes never written"
        assert os.path.getsize(segment) == ing.log._segments[-1].size   # in the file, not in memory
    assert ing.log.durable_head == 1 and ing._wb.waits == 0 and len(ing._wb.unsynced) == 12
    release.set()
    ing._wb.settle(keep=0)
    assert ing.log.durable_head == 13 and ing.log.unwritten_bytes == 0
    assert [x for b in ing.log.read(0, 13) for x in b.column("body").to_pylist()] == [b"first"] + bodies
    ing._wb.flusher.close()
    ing.stop()


def test_the_ingest_waits_for_a_writer_more_than_4_groups_behind(tmp_path, monkeypatch):
    """Should the writer fall behind (a write stuck in the kernel), the ingest stops appending once
    more than 4 groups of ``fsyncBytes`` would be only in memory, and goes on when the writes do."""
    import threading

    import spark_mq.sources.log.local as local_mod
    from spark_mq.sources.writebehind import Flusher as _Flusher

    ing = _ingest(tmp_path, fsyncBytes="16k")
    ing._consumer = _FakeConsumer([b"first"])
    ing._step()
    _, release = _slow_sync(ing, monkeypatch)       # the fsync is held too: only the writes matter
    real_write, stuck, unstick = local_mod._write_all, threading.Event(), threading.Event()

    def stuck_write(fd, data):
        stuck.set()
        assert unstick.wait(10)
        real_write(fd, data)

    monkeypatch.setattr(local_mod, "_write_all", stuck_write)
    ing.log.defer_writes()
    ing._wb.flusher = _Flusher(ing.log, "test-fsync", ing._notify)
    bodies = [bytes([65 + i]) * 20_000 for i in range(5)]
    for i, body in enumerate(bodies[:3]):           # 3 groups in memory: under 4 x 16 KiB
        ing._consumer.bodies = [body]
        ing._step()
        assert stuck.wait(10)
    assert ing.log.unwritten_bytes > 3 * 20_000
    ing._consumer.bodies = [bodies[3]]              # a 4th: 80 KB would be only in memory
    step = threading.Thread(target=ing._step)
    step.start()
    deadline = time.monotonic() + 10
    while ing.log.head < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert ing.log.head == 5                        # appended ...
    step.join(0.5)
    assert step.is_alive()                          # ... and then waiting for the writer
    unstick.set()
    step.join(10)
    assert not step.is_alive() and ing.log.unwritten_bytes <= 4 * 16384
    ing._consumer.bodies = [bodies[4]]
    ing._step()
    assert _unwritten_drains(ing.log)
    release.set()
    ing._wb.settle(keep=0)
    assert ing.log.durable_head == 6
    ing._wb.flusher.close()
    assert [x for b in ing.log.read(0, 6) for x in b.column("body").to_pylist()] == [b"first"] + bodies
    ing.stop()


def test_dedup_trims_on_its_own_thread_while_another_commits(tmp_path):
    """Spark's thread commits while the ingest thread adds identities and trims. Trimming inside
    ``commit`` iterated the identities while the ingest added to them, and the commit failed with
    ``RuntimeError: OrderedDict mutated during iteration`` (within a second here); now ``commit``
    only says how far trimming may go, and the ingest's trim honours it."""
    import threading

    ing = _ingest(tmp_path, fmt="amqp08", dedupWindow="100")
    dedup = ing._redeliveries.ids
    stop, errors, added = threading.Event(), [], [0]

    def ingest_thread():
        try:
            while not stop.is_set():
                for _ in range(50):
                    dedup.add(("id", added[0]), added[0])
                    added[0] += 1
                dedup.trim()
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            errors.append(exc)

    t = threading.Thread(target=ingest_thread)
    t.start()
    started, commits = time.monotonic(), 0
    try:  # the old code failed within a second of this; a busy machine gets more time, not a pass
        while not errors and time.monotonic() - started < 30 and \
                (time.monotonic() - started < 2 or added[0] < 50_000 or commits < 500):
            ing.commit(max(0, added[0] - 10))  # everything but the newest few is committed
            commits += 1
    except BaseException as exc:  # noqa: BLE001
        errors.append(exc)
    finally:
        stop.set()
        t.join()
    assert not errors, errors
    assert added[0] >= 50_000 and commits >= 500, (added, commits)  # both threads ran side by side
    ing.commit(added[0])                           # all committed: the owner's trim keeps the window
    dedup.trim()
    assert len(dedup) == 100
    ing.log.close()


def test_dedup_identities_stay_bounded_when_a_body_recurs(tmp_path):
    """Issue 43, item 11: a body that recurs (``{}`` as every hundredth message) was re-added at its
    first position with a later offset, trimming stopped there, and the identities grew with the whole
    history (98,902 held after 100,000 messages instead of about the window)."""
    from spark_mq.sources.ingest import content_identity

    ing = _ingest(tmp_path, fmt="amqp08", dedupWindow="2500")
    dedup = ing._redeliveries.ids
    held = []
    for offset in range(100_000):
        body = b"{}" if offset % 100 == 0 else f"m{offset}".encode()
        dedup.add(content_identity(body, None), offset)
        if offset % 1000 == 999:  # Spark commits all but the newest 500 now and then
            ing.commit(offset - 500)
            dedup.trim()
            held.append(len(dedup))
    assert max(held) <= 2500 + 500 + 1, max(held)
    assert content_identity(b"{}", None) in dedup  # the recurring body is still known, at its last offset
    assert dedup._ids[content_identity(b"{}", None)] == 99_900
    ing.log.close()


class _FakeAmqpConsumer(_Stub):
    """AMQP-like deliveries with message ids, redelivered the second time they are handed out."""

    def __init__(self, ids):
        self.ids, self.rounds = list(ids), 0

    def poll(self, max_count, timeout):
        self.rounds += 1
        return [(i, self.rounds > 1) for i in self.ids[:max_count]]

    def row(self, msg, offset, now_us):
        from spark_mq import schema as S
        mid, redelivered = msg
        row = [None] * len(S.SOURCE_COLUMNS["amqp08"])
        row[0], row[2], row[4], row[5], row[6] = f"body-{mid}".encode(), mid, None, redelivered, offset
        return tuple(row)


def test_a_group_that_cannot_be_built_fails_the_ingest_and_records_no_identity(tmp_path, monkeypatch):
    """Issue 43, item 4: building a group failed for a reason other than I/O (Arrow's 2 GiB column
    bound, which headers can reach); the ingest took it for a lost connection, and the redeliveries
    matched the identities recorded for messages that never reached the log: dropped, and acked."""
    import spark_mq.sources.ingest as ingest_mod
    from spark_mq.sources.ingest import LogWriteError

    from spark_mq.errors import SparkMqError

    def too_large(fmt, rows):  # what spark_mq.arrowcols raises at the bound
        raise SparkMqError("a group of 3 messages holds 2147483650 bytes in one column, more than an Arrow "
                           "binary column can (2 GiB): lower 'fsyncMessages'")

    monkeypatch.setattr(ingest_mod.S, "build_batch", too_large)
    ing = _ingest(tmp_path, fmt="amqp08")
    ing._consumer = _FakeAmqpConsumer(["a", "b", "c"])
    ing._resumed.set()
    with pytest.raises(LogWriteError, match="could not be added to the source log.*SparkMqError.*2 GiB"):
        ing._step()
    assert len(ing._redeliveries.ids) == 0 and ing.log.head == 0
    ing.log.close()


def test_identities_of_a_group_are_recorded_once_it_is_in_the_log(tmp_path):
    ing = _ingest(tmp_path, fmt="amqp08")
    ing._consumer = _FakeAmqpConsumer(["a", "b", "c"])
    ing._resumed.set()
    ing._step()
    assert ing.log.head == 3 and ing.duplicates == 0
    assert all(k in ing._redeliveries.ids for k in "abc")
    ing._step()  # the same ids redelivered: all dropped as duplicates
    assert ing.log.head == 3 and ing.duplicates == 3
    ing.log.close()


class _PoisonConsumer(_FakeAmqpConsumer):
    """Deliveries 'a', 'bad', 'c' each session; 'bad' cannot be taken. Records what happens, in order."""

    dead_letters = True

    def __init__(self, events, log_):
        super().__init__(["a", "bad", "c"])
        self.events, self.log_ = events, log_

    def row(self, msg, offset, now_us):
        from spark_mq.errors import PoisonDelivery
        if msg[0] == "bad":
            raise PoisonDelivery("column 'x' cannot hold it (test)", msg=msg, message_id="bad", destination="q",
                                 body=b"body-bad")
        return super().row(msg, offset, now_us)

    def ack(self, msgs):
        self.events.append(("ack", [m[0] for m in msgs], self.log_.durable_head))

    def dead_letter(self, msg, reason, failures):
        self.events.append(("dead-letter", msg[0], failures, self.log_.durable_head, reason))


def test_a_poison_delivery_fails_its_sessions_then_is_dead_lettered_after_those_before_it_are_durable(tmp_path):
    from spark_mq.errors import PoisonDelivery
    ing = _ingest(tmp_path, fmt="amqp08", maxDeliveryFailures="2", poisonMessages="deadLetter")
    events = []
    ing._consumer = _PoisonConsumer(events, ing.log)
    ing._resumed.set()
    with pytest.raises(PoisonDelivery):       # first failure: the session fails, nothing of the group taken
        ing._step()
    assert ing.log.head == 0 and events == [] and ing.consumed == 0 and len(ing._redeliveries.ids) == 0
    ing._step()                              # the broker redelivered it: the second failure dead-letters it
    assert ing.log.head == 2 and ing.dead_lettered == 1
    # 'a' durable and acked before the dead-lettering; 'c' taken after it
    assert [e[:2] for e in events] == [("ack", ["a"]), ("dead-letter", "bad"), ("ack", ["c"])], events
    assert events[1][2] == 2 and events[1][3] >= 1 and "column 'x' cannot hold it (test)" in events[1][4]
    ing.log.close()


def test_a_poison_delivery_fails_the_query_naming_it_by_default(tmp_path):
    from spark_mq.errors import PoisonDelivery
    from spark_mq.sources.ingest import DeliveryFailedError
    ing = _ingest(tmp_path, fmt="amqp08", maxDeliveryFailures="3")
    events = []
    ing._consumer = _PoisonConsumer(events, ing.log)
    ing._resumed.set()
    for _ in range(2):
        with pytest.raises(PoisonDelivery):
            ing._step()
    with pytest.raises(DeliveryFailedError, match=r"message 'bad' from 'q' failed 3 sessions \(maxDeliveryFailures=3, "
                                                  r"poisonMessages=fail\): column 'x' cannot hold it"):
        ing._step()
    assert ing.log.head == 0 and events == []  # nothing logged, nothing acknowledged
    ing.log.close()


def test_a_value_no_column_holds_is_a_poison_delivery_naming_the_column(tmp_path, monkeypatch):
    """The columns keep what they can (spark_mq.arrowcols); a value that fails all the same is the
    delivery's, not the group's: the row that fails alone is named."""
    from spark_mq.errors import PoisonDelivery
    ing = _ingest(tmp_path, fmt="amqp08")
    ing._consumer = _FakeAmqpConsumer(["a", "b"])
    real_row = ing._consumer.row

    def row(msg, offset, now_us):
        r = list(real_row(msg, offset, now_us))
        if msg[0] == "b":
            r[4] = [(None, "v")]  # a header without a name: no map key can be null
        return tuple(r)

    ing._consumer.row = row
    ing._resumed.set()
    with pytest.raises(PoisonDelivery, match="column 'headers' cannot hold its value") as info:
        ing._step()
    assert info.value.message_id == "b" and ing.log.head == 0
    ing.log.close()
