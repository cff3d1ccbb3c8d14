"""Unit tests of the source log: append/read/commit/delete, fsync grouping, crash recovery (torn tail),
byte-identical replay, byte limits, and the same behaviour on a non-appending ("generic") filesystem."""

from __future__ import annotations

import os
import threading

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spark_mq import schema as S
from spark_mq.sources.log import DataLossError, LogCorruptError, SourceLog, read_slice

FMT = "malamute"
SCHEMA = S.source_arrow_schema(FMT)


def rows(first: int, count: int, size: int = 10) -> pa.RecordBatch:
    return S.build_batch(FMT, [
        (bytes([i % 251]) * size, "s", f"id{i}", 1_700_000_000_000_000 + i, [("k", str(i))], False, i,
         "sender", "addr", f"subj{i}", "", [bytes([i % 251]) * size])
        for i in range(first, first + count)])


def offsets(batches) -> list[int]:
    return [o for b in batches for o in b.column("offset").to_pylist()]


@pytest.fixture(params=["local", "generic"])
def make_log(request, tmp_path):
    local = request.param == "local"

    def make(**kw) -> SourceLog:
        return SourceLog(str(tmp_path / "log"), SCHEMA, local=local, **kw)

    make.local = local
    return make


def test_append_read_and_head_survive_reopen(make_log):
    log = make_log()
    assert (log.head, log.tail) == (0, 0)
    assert log.append(rows(0, 5)) == 5
    assert log.append(rows(5, 3)) == 8
    log.sync()
    assert offsets(log.read(0, 8)) == list(range(8))
    assert offsets(log.read(2, 6)) == [2, 3, 4, 5]
    log.close()
    again = make_log()
    assert (again.head, again.tail) == (8, 0)
    assert offsets(again.read(0, 8)) == list(range(8))
    assert again.stats(3) == (5, 50)


def test_append_must_continue_at_the_head(make_log):
    log = make_log()
    log.append(rows(0, 2))
    with pytest.raises(Exception, match="head is 2"):
        log.append(rows(5, 1))


def test_replay_is_byte_identical(make_log):
    log = make_log(segment_bytes=2000)
    for first in range(0, 100, 10):
        log.append(rows(first, 10))
    log.sync()
    first_read = [b for s in log.slices(15, 77) for b in read_slice(s)]
    log.close()
    reopened = make_log(segment_bytes=2000)
    second_read = [b for s in reopened.slices(15, 77) for b in read_slice(s)]
    assert offsets(first_read) == list(range(15, 77))
    assert [b.to_pydict() for b in first_read] == [b.to_pydict() for b in second_read]
    assert pa.Table.from_batches(first_read).equals(pa.Table.from_batches(second_read))
    for b in first_read:
        assert b.schema.equals(SCHEMA)


def test_commit_deletes_segments_wholly_below_end_and_keeps_the_head(make_log, tmp_path):
    log = make_log(segment_bytes=1)  # a new segment for every append (local), as generic does anyway
    for first in range(0, 30, 10):
        log.append(rows(first, 10))
    log.sync()
    assert len(log.segment_paths()) == 3
    assert log.commit(15) == 1  # [0,10) goes; [10,20) holds 15..19 still
    assert log.tail == 10
    assert offsets(log.read(15, 30)) == list(range(15, 30))
    log.commit(30)  # everything: only an empty marker at the head remains
    assert log.head == 30 and log.tail == 30
    assert log.wait_deleted(10)
    files = os.listdir(tmp_path / "log")
    assert files == ["seg-00000000000000000030.arrow"]
    log.close()
    again = make_log()
    assert (again.head, again.tail) == (30, 30)
    again.append(rows(30, 2))
    assert offsets(again.read(30, 32)) == [30, 31]


def test_fsync_is_grouped(tmp_path, monkeypatch):
    calls = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    log = SourceLog(str(tmp_path / "log"), SCHEMA)
    log.append(rows(0, 1))  # creates the segment: one fsync of the file, one of the directory
    calls.clear()
    for i in range(1, 11):
        log.append(rows(i, 1))
    assert calls == []  # appends alone never fsync
    log.sync()
    assert len(calls) == 1
    log.sync()
    assert len(calls) == 1  # nothing new: no second fsync


def test_durable_head_follows_the_fsyncs(tmp_path, monkeypatch):
    """Spark plans up to ``durable_head``: appends move it only once a ``sync()`` (or a segment's
    rotation, which fsyncs the closed segment) has covered them; an fsync running on another thread
    does not cover what is appended meanwhile, and does not hold appends up."""
    import threading

    log = SourceLog(str(tmp_path / "log"), SCHEMA, segment_bytes=1 << 20)
    log.append(rows(0, 3))
    assert (log.head, log.durable_head) == (3, 0)
    log.sync()
    assert log.durable_head == 3
    real, entered, release = os.fsync, threading.Event(), threading.Event()

    def slow_fsync(fd):
        entered.set()
        assert release.wait(10)
        real(fd)

    log.append(rows(3, 2))
    monkeypatch.setattr(os, "fsync", slow_fsync)
    syncing = threading.Thread(target=log.sync)
    syncing.start()
    assert entered.wait(10)
    log.append(rows(5, 4))  # while that fsync runs: not blocked by it, not covered by it
    assert (log.head, log.durable_head) == (9, 3)
    release.set()
    syncing.join(10)
    monkeypatch.setattr(os, "fsync", real)
    assert log.durable_head == 5
    log.sync()
    assert log.durable_head == 9
    log.append(rows(9, 1, size=2 << 20))  # past segment_bytes: the next append rotates
    log.append(rows(10, 1))
    assert (log.head, log.durable_head) == (11, 10)  # the closed segment was fsynced on rotation
    log.close()
    again = SourceLog(str(tmp_path / "log"), SCHEMA)
    assert again.durable_head == again.head == 11  # what a log holds when opened is durable
    again.close()


def test_a_rotation_during_an_fsync_does_not_count_its_data_durable_early(tmp_path, monkeypatch):
    """The fsync thread's ``sync()`` is still on the disk when the ingest's next append rotates the
    segment: the closed segment counts as durable only once an fsync of it has returned, so
    ``durable_head`` must not pass it before (Spark plans up to it; a power loss would leave Spark's
    checkpoint ahead of the log). The rotation fsyncs the closed segment itself."""
    import threading

    log = SourceLog(str(tmp_path / "log"), SCHEMA, segment_bytes=1 << 20)
    log.append(rows(0, 1, size=2 << 20))  # the segment is full: the next append rotates
    (first_segment,) = log.segment_paths()
    real, entered, release = os.fsync, threading.Event(), threading.Event()
    synced = []  # the file each fsync was for, in call order

    def slow_fsync(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        if len(synced) == 1:  # the sync() below: held on the disk
            entered.set()
            assert release.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    syncing = threading.Thread(target=log.sync)
    syncing.start()
    assert entered.wait(10)
    log.append(rows(1, 1))  # rotates while that fsync is held
    assert log.head == 2
    # the rotation fsyncs the closed segment itself, in the appending thread, before the append returns
    assert synced[1:].count(first_segment) >= 1, "the rotation did not fsync the segment it closed"
    release.set()
    syncing.join(10)
    assert log.durable_head == 1
    monkeypatch.setattr(os, "fsync", real)
    log.close()


def test_a_failed_fsync_leaves_the_appends_to_the_next_sync(tmp_path, monkeypatch):
    """An fsync that fails (EIO) makes nothing durable, and the next ``sync()`` (``close()`` included)
    tries again instead of finding the log clean."""
    import errno

    log = SourceLog(str(tmp_path / "log"), SCHEMA)
    log.sync()
    log.append(rows(0, 3))
    real = os.fsync

    def failing(fd):
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError):
        log.sync()
    assert log.durable_head == 0
    with pytest.raises(OSError):
        log.sync()  # tried again: the data is still not known durable
    calls = []
    monkeypatch.setattr(os, "fsync", lambda fd: (calls.append(fd), real(fd)))
    log.sync()
    assert calls and log.durable_head == 3
    monkeypatch.setattr(os, "fsync", real)
    log.close()


def test_durable_head_is_the_head_where_appends_are_durable_when_written(tmp_path):
    for log in (SourceLog(str(tmp_path / "generic"), SCHEMA, local=False),
                SourceLog(str(tmp_path / "nofsync"), SCHEMA, fsync=False)):
        log.append(rows(0, 4))
        assert log.durable_head == log.head == 4
        log.close()


def test_torn_tail_is_detected_and_truncated(tmp_path):
    log = SourceLog(str(tmp_path / "log"), SCHEMA)
    log.append(rows(0, 4))
    log.append(rows(4, 4))
    log.sync()
    (path,) = log.segment_paths()
    good = os.path.getsize(path)
    log.close()
    # a crash in the middle of writing a third batch: only part of its bytes reached the file
    torn = rows(8, 4).serialize().to_pybytes()
    for cut in (3, 40, len(torn) - 1):
        with open(path, "ab") as f:
            f.write(torn[:cut])
        again = SourceLog(str(tmp_path / "log"), SCHEMA)
        assert again.recovered_truncations == 1
        assert again.head == 8
        assert os.path.getsize(path) == good
        assert offsets(again.read(0, 8)) == list(range(8))
        again.close()
    again = SourceLog(str(tmp_path / "log"), SCHEMA)
    assert again.recovered_truncations == 0
    again.append(rows(8, 2))
    assert offsets(again.read(0, 10)) == list(range(10))


def test_torn_new_segment_and_temp_files_are_dropped(tmp_path):
    log = SourceLog(str(tmp_path / "log"), SCHEMA)
    log.append(rows(0, 3))
    log.close()
    with open(tmp_path / "log" / "seg-00000000000000000003.arrow", "wb") as f:
        f.write(SCHEMA.serialize().to_pybytes()[:10])  # crash while creating the next segment
    (tmp_path / "log" / "seg-00000000000000000003.arrow.tmp").write_bytes(b"junk")
    again = SourceLog(str(tmp_path / "log"), SCHEMA)
    assert again.head == 3 and again.recovered_truncations == 1
    assert sorted(os.listdir(tmp_path / "log")) == ["seg-00000000000000000000.arrow"]


def test_damage_before_the_tail_is_an_error_not_a_silent_loss(tmp_path):
    log = SourceLog(str(tmp_path / "log"), SCHEMA, segment_bytes=1)
    log.append(rows(0, 3))
    log.append(rows(3, 3))
    log.close()
    first = sorted(os.listdir(tmp_path / "log"))[0]
    path = tmp_path / "log" / first
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(LogCorruptError, match="damaged"):
        SourceLog(str(tmp_path / "log"), SCHEMA)


def test_limit_bytes_and_body_bytes(make_log):
    log = make_log()
    log.append(rows(0, 10, size=100))
    log.append(rows(10, 10, size=100))
    assert log.body_bytes(0, 20) == 2000
    assert log.body_bytes(5, 12) == 700
    assert log.limit_bytes(0, 20, 350) == 3
    assert log.limit_bytes(8, 20, 500) == 13
    assert log.limit_bytes(0, 20, 10) == 1  # always at least one message
    assert log.limit_bytes(0, 20, 10**9) == 20


def test_fast_forward_only_when_empty(make_log):
    log = make_log()
    log.fast_forward(100)
    assert log.head == 100
    log.append(rows(100, 2))
    with pytest.raises(DataLossError):
        log.fast_forward(500)


def segment_files(where) -> list[str]:
    return sorted(f for f in os.listdir(where) if f.startswith("seg-"))


def test_commit_returns_before_the_files_are_deleted_and_close_waits_for_them(make_log, tmp_path):
    log = make_log(segment_bytes=1)  # one segment per append
    for first in range(0, 12, 3):
        log.append(rows(first, 3))
    log.sync()
    release = threading.Event()
    deleting = []
    real = log._delete

    def slow_delete(path):
        deleting.append(os.path.basename(path))
        assert release.wait(10)
        real(path)

    log._deleter._delete = slow_delete
    assert log.commit(6) == 2  # returns with the first unlink still blocked
    assert log.tail == 6 and offsets(log.read(6, 12)) == list(range(6, 12))
    assert log.wait_deleted(0.2) is False
    assert len(segment_files(tmp_path / "log")) == 4
    closer = threading.Thread(target=log.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # close waits for the deletes
    release.set()
    closer.join(10)
    assert not closer.is_alive()
    assert deleting == ["seg-00000000000000000000.arrow", "seg-00000000000000000003.arrow"]
    assert segment_files(tmp_path / "log") == ["seg-00000000000000000006.arrow", "seg-00000000000000000009.arrow"]
    again = make_log()
    assert (again.tail, again.head) == (6, 12)
    again.close()


@pytest.mark.parametrize("failure", [PermissionError(13, "Permission denied"), RuntimeError("Permission denied")])
def test_a_failed_delete_stops_the_deletes_and_fails_the_next_commit(make_log, tmp_path, failure):
    """Also an error that is not an OSError (a filesystem's own): it must not end the deleter
    thread unannounced, which would leave ``close`` waiting for ever."""
    log = make_log(segment_bytes=1)
    for first in range(0, 15, 3):
        log.append(rows(first, 3))
    log.sync()
    real = log._delete

    def delete(path):
        if path.endswith("seg-00000000000000000003.arrow"):
            raise failure
        real(path)

    log._deleter._delete = delete
    assert log.commit(9) == 3
    assert log.wait_deleted(10)
    # the oldest went; the failed one and every one after it stay, so the log has no gap
    assert segment_files(tmp_path / "log")[:3] == ["seg-00000000000000000003.arrow",
                                                   "seg-00000000000000000006.arrow",
                                                   "seg-00000000000000000009.arrow"]
    with pytest.raises(OSError, match="seg-00000000000000000003.arrow.*Permission denied"):
        log.commit(12)
    assert log.tail == 9  # the failed commit took nothing out of the log
    kept = str(tmp_path / "log" / "seg-00000000000000000009.arrow")
    log._deleter.put([kept])  # as a commit racing the failure would: nothing more is deleted
    assert log.wait_deleted(10) and os.path.exists(kept)
    log.close()
    again = make_log()
    assert (again.tail, again.head) == (3, 15)  # committed messages still held, readable
    assert offsets(again.read(3, 15)) == list(range(3, 15))


def test_missing_segment_is_file_not_found_for_readers(make_log):
    log = make_log(segment_bytes=1)
    log.append(rows(0, 3))
    log.append(rows(3, 3))
    slices = log.slices(0, 6)
    log.commit(3)
    assert log.wait_deleted(10)
    with pytest.raises(FileNotFoundError):
        list(read_slice(slices[0]))
    assert offsets(read_slice(slices[1])) == [3, 4, 5]


def test_writer_lock_one_writer_per_local_log(tmp_path):
    """A second writer of one log fails after its wait, naming the location and the holder; the
    lock goes with close(). Readers (no exclusive_wait) never take it."""
    import time

    from spark_mq.sources.log import LogInUseError

    where = str(tmp_path / "log")
    first = SourceLog(where, SCHEMA, exclusive_wait=0.0)
    first.append(rows(0, 3))
    t0 = time.monotonic()
    with pytest.raises(LogInUseError, match=rf"logLocation {where} is in use.*pid {os.getpid()} on "):
        SourceLog(where, SCHEMA, exclusive_wait=0.3)
    assert time.monotonic() - t0 >= 0.3
    reader = SourceLog(where, SCHEMA)  # no lock for readers
    assert reader.head == 3
    first.close()
    second = SourceLog(where, SCHEMA, exclusive_wait=0.0)
    assert second.head == 3 and offsets(second.read(0, 3)) == [0, 1, 2]
    second.close()


def test_writer_lock_goes_with_a_killed_holder(tmp_path):
    """The kernel drops the lock of a process killed with SIGKILL: a restart takes over at once."""
    import signal
    import subprocess
    import sys

    from spark_mq.sources.log import LogInUseError

    where = str(tmp_path / "log")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from spark_mq import schema as S; from spark_mq.sources.log import SourceLog\n"
         f"log = SourceLog({where!r}, S.source_arrow_schema('malamute'), exclusive_wait=0.0)\n"
         "print('locked', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"locked"
        with pytest.raises(LogInUseError, match=f"pid {holder.pid} "):
            SourceLog(where, SCHEMA, exclusive_wait=0.2)
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        SourceLog(where, SCHEMA, exclusive_wait=2.0).close()
    finally:
        holder.kill()
        holder.wait(10)


def _sized(first: int, sizes: list[int]) -> pa.RecordBatch:
    return S.build_batch(FMT, [
        (b"b" * size, "s", None, 0, None, False, first + i, None, None, None, None, None)
        for i, size in enumerate(sizes)])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(groups=st.lists(st.lists(st.integers(0, 300), min_size=1, max_size=6), min_size=1, max_size=8),
       commits=st.lists(st.integers(0, 48), max_size=3), data=st.data())
def test_body_bytes_is_the_sum_over_the_messages_held(tmp_path_factory, groups, commits, data):
    """body_bytes answers from running counts; it must equal the plain sum of the held bodies for
    any range, across segments (tiny segment_bytes), commits that delete some, and a reopen."""
    where = str(tmp_path_factory.mktemp("log") / "log")
    log = SourceLog(where, SCHEMA, segment_bytes=600)
    body = []
    for sizes in groups:
        log.append(_sized(len(body), sizes))
        body.extend(sizes)
    for end in sorted(commits):
        log.commit(min(end, len(body)))
    for reopened in (False, True):
        if reopened:
            log.close()
            log = SourceLog(where, SCHEMA, segment_bytes=600)
        tail, head = log.tail, log.head
        for _ in range(10):
            lo = data.draw(st.integers(0, head + 2))
            hi = data.draw(st.integers(0, head + 2))
            held = body[max(lo, tail):min(hi, head)]
            assert log.body_bytes(lo, hi) == sum(held), (lo, hi, tail, head, reopened)
    log.close()


# -- write-behind (``defer_writes``: the ingest's flusher writes each group, then fsyncs it) ----------


def _segment_bytes(log: SourceLog) -> list[bytes]:
    out = []
    for path in log.segment_paths():
        with open(path, "rb") as f:
            out.append(f.read())
    return out


def _reopened_offsets(path, truncations: int = 0) -> list[int]:
    """The offsets a log at ``path`` holds when opened again (as a restarted query opens it)."""
    again = SourceLog(str(path), SCHEMA)
    try:
        assert again.recovered_truncations == truncations
        return offsets(again.read(again.tail, again.head))
    finally:
        again.close()


def test_write_behind_writes_at_sync_and_leaves_the_same_segments(tmp_path):
    """``append`` books a deferred batch (the head moves) but writes nothing; ``sync()`` writes it
    before its fsync. The segments end up byte for byte as a log writing at once leaves them,
    rotations included, and a reopened log reads every message back."""
    direct = SourceLog(str(tmp_path / "direct"), SCHEMA, segment_bytes=3000)
    behind = SourceLog(str(tmp_path / "behind"), SCHEMA, segment_bytes=3000)
    behind.defer_writes()
    for first in range(0, 60, 6):
        direct.append(rows(first, 6, size=40))
        behind.append(rows(first, 6, size=40))
        if first == 0:
            (path,) = behind.segment_paths()
            assert os.path.getsize(path) == len(SCHEMA.serialize())  # the schema only: the batch waits
            assert (behind.head, behind.durable_head) == (6, 0)
        if first == 30:
            behind.sync()
            assert behind.durable_head == 36
    assert len(behind.segment_paths()) > 2  # rotations happened with batches still unwritten
    direct.sync()
    behind.sync()
    assert behind.durable_head == behind.head == 60
    assert _segment_bytes(behind) == _segment_bytes(direct)
    behind.close()
    direct.close()
    assert _reopened_offsets(tmp_path / "behind") == list(range(60))


def test_write_behind_rotation_writes_the_closed_segment_before_its_fsync(tmp_path, monkeypatch):
    """A rotation closes the active segment: what was appended to it and not yet written goes in
    first, and the fsync that makes it durable comes after that write."""
    events = []
    real_write, real_fsync = os.writev, os.fsync
    monkeypatch.setattr(os, "writev", lambda fd, data: (events.append(("write", os.readlink(f"/proc/self/fd/{fd}"))),
                                                        real_write(fd, data))[1])
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    log = SourceLog(str(tmp_path / "log"), SCHEMA, segment_bytes=1000)
    log.defer_writes()
    log.append(rows(0, 3, size=400))  # past segment_bytes: the next append rotates
    (first,) = log.segment_paths()
    events.clear()
    log.append(rows(3, 1))  # rotates: the unwritten batch of the first segment is written, then fsynced
    assert events[:2] == [("write", first), ("fsync", first)]
    assert log.durable_head == 3
    log.sync()
    assert log.durable_head == 4
    monkeypatch.setattr(os, "writev", real_write)
    monkeypatch.setattr(os, "fsync", real_fsync)
    log.close()
    assert _reopened_offsets(tmp_path / "log") == [0, 1, 2, 3]


def test_write_behind_sync_covers_only_what_was_appended_before_it(tmp_path, monkeypatch):
    """A ``sync()`` on the flusher's thread is held in its write while the ingest appends: what is
    appended meanwhile is not counted durable by that sync (it may not be written before its fsync),
    and the next sync covers it."""
    import threading

    log = SourceLog(str(tmp_path / "log"), SCHEMA)
    log.defer_writes()
    log.append(rows(0, 2))
    real_write, entered, release = os.writev, threading.Event(), threading.Event()

    def slow_write(fd, data):
        entered.set()
        assert release.wait(10)
        return real_write(fd, data)

    monkeypatch.setattr(os, "writev", slow_write)
    syncing = threading.Thread(target=log.sync)
    syncing.start()
    assert entered.wait(10)
    log.append(rows(2, 5))  # while the sync writes: booked, not blocked
    assert (log.head, log.durable_head) == (7, 0)
    release.set()
    syncing.join(10)
    monkeypatch.setattr(os, "writev", real_write)
    assert log.durable_head == 2  # the held sync may have written the second batch too, but never counts it
    log.sync()
    assert log.durable_head == 7
    log.close()
    assert _reopened_offsets(tmp_path / "log") == list(range(7))


def _short_writev(real_writev, most: int):
    """``os.writev`` that writes at most ``most`` bytes, as a regular file may."""
    def writev(fd, parts):
        out, left = [], most
        for p in parts:
            view = memoryview(p)[:left]
            out.append(view)
            left -= len(view)
            if not left:
                break
        return real_writev(fd, out)
    return writev


@pytest.mark.parametrize("most", [1, 97, 4096])
def test_short_writes_are_completed(tmp_path, monkeypatch, most):
    """A write that takes less than asked (ends inside a part, or between two) goes on where it
    stopped, with and without write-behind; the segment reads back whole."""
    for behind in (True, False):
        path = tmp_path / f"log-{behind}"
        real_write = os.writev
        monkeypatch.setattr(os, "writev", _short_writev(real_write, most))
        log = SourceLog(str(path), SCHEMA)
        if behind:
            log.defer_writes()
        log.append(rows(0, 5, size=300))
        log.append(rows(5, 2, size=10))
        log.sync()
        monkeypatch.setattr(os, "writev", real_write)
        log.close()
        assert _reopened_offsets(path) == list(range(7))
        assert offsets(SourceLog(str(path), SCHEMA).read(0, 7)) == list(range(7))


def test_an_append_writes_the_bytes_of_the_batch_serialized(tmp_path):
    """The log writes a batch's own buffers (no ``serialize()`` copy), and the segment holds
    exactly ``serialize()``'s bytes after the schema message: sliced batches, nulls, lists, maps and
    empty bodies included."""
    batches = [rows(0, 5, size=300), rows(5, 3, size=0)]
    sliced = rows(0, 10, size=7).slice(4, 3)  # offsets 4-6, moved to 10-12 to follow the others
    import pyarrow.compute as pc
    sliced = sliced.set_column(6, "offset", pc.add(sliced.column(6), 6))
    batches.append(S.build_batch(FMT, [(b"", "s", None, 0, None, True, 8 + i, "x", "y", "", "", None)
                                       for i in range(2)]))
    log = SourceLog(str(tmp_path / "log"), SCHEMA)
    for b in batches:
        log.append(b)
    log.append(sliced)
    log.sync()
    (path,) = log.segment_paths()
    log.close()
    expected = SCHEMA.serialize().to_pybytes() + b"".join(b.serialize().to_pybytes() for b in batches)
    with open(path, "rb") as f:
        data = f.read()
    assert data[:len(expected)] == expected
    assert data[len(expected):] == sliced.serialize().to_pybytes()


def test_write_behind_a_failed_write_is_final(tmp_path, monkeypatch):
    """A write that fails (a full disk) leaves part of a message in the segment: nothing after it
    could be read back in order, so every later ``sync()`` fails the same way and nothing more
    becomes durable; the reopened log keeps what was durable before and cuts the torn tail."""
    import errno

    log = SourceLog(str(tmp_path / "log"), SCHEMA)
    log.defer_writes()
    log.append(rows(0, 3))
    log.sync()
    real_write = os.writev
    calls = []

    def full(fd, parts):
        calls.append(len(parts))
        if len(calls) == 1:
            return _short_writev(real_write, 50)(fd, parts)  # part of the message, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "writev", full)
    log.append(rows(3, 2))
    with pytest.raises(OSError, match="No space"):
        log.sync()
    assert log.durable_head == 3
    log.append(rows(5, 1))
    monkeypatch.setattr(os, "writev", real_write)  # space again: still nothing is written after the tear
    with pytest.raises(OSError, match="No space"):
        log.sync()
    assert log.durable_head == 3
    with pytest.raises(OSError, match="No space"):
        log.close()
    assert _reopened_offsets(tmp_path / "log", truncations=1) == [0, 1, 2]


def test_write_behind_is_only_for_local_fsynced_logs(tmp_path):
    for log in (SourceLog(str(tmp_path / "generic"), SCHEMA, local=False),
                SourceLog(str(tmp_path / "nofsync"), SCHEMA, fsync=False)):
        log.defer_writes()
        log.append(rows(0, 4))
        assert log.durable_head == log.head == 4  # durable when written: written at once
        assert offsets(log.read(0, 4)) == [0, 1, 2, 3]
        log.close()


def test_write_behind_a_write_on_another_thread_during_a_sync_is_fsynced_before_it_counts(tmp_path, monkeypatch):
    """The flusher's writer thread (or the ingest) writes queued batches outside the log's lock. One
    that lands while a ``sync()`` decides whether to fsync (between reading what is dirty and
    resetting it) must still be fsynced before a later ``sync()`` counts it durable. Before the
    written-bytes counter, the dirty flag it set was reset unseen, and the next sync moved
    ``durable_head`` past a batch no fsync had covered."""
    import spark_mq.sources.log.local as local_mod
    import spark_mq.sources.log.sourcelog as sourcelog_mod

    fsynced_at = []  # the log's written bytes when each fsync began
    real_fsync = os.fsync

    class Racy(local_mod.LocalSegments):
        inject = None

        @property
        def _dirty(self):
            value = self.__dict__.get("_dirty_flag", False)  # read, and then ...
            hook, Racy.inject = Racy.inject, None
            if hook is not None:
                hook()  # ... another thread: the ingest appends, the writer writes it, right now
            return value

        @_dirty.setter
        def _dirty(self, value):
            self.__dict__["_dirty_flag"] = value

    monkeypatch.setattr(sourcelog_mod, "LocalSegments", Racy)
    log = SourceLog(str(tmp_path / "log"), SCHEMA)
    monkeypatch.setattr(local_mod.os, "fsync",
                        lambda fd: (fsynced_at.append(log._files._written_bytes), real_fsync(fd))[1])
    log.defer_writes()
    log.append(rows(0, 2))
    log.sync()
    assert log.durable_head == 2 and log.unwritten_bytes == 0
    fired = []
    Racy.inject = lambda: (fired.append(1), log.append(rows(2, 1)), log.write_unwritten())
    log.sync()                       # nothing of its own to write; the batch at 2 is written meanwhile
    assert fired and log.head == 3 and log.durable_head == 2 and log.unwritten_bytes == 0
    written = log._files._written_bytes
    log.sync()                       # counts the batch at 2 durable: only after an fsync that covers it
    assert log.durable_head == 3
    assert fsynced_at and max(fsynced_at) == written, (fsynced_at, written)
    monkeypatch.setattr(local_mod.os, "fsync", real_fsync)
    log.close()
    assert _reopened_offsets(tmp_path / "log") == [0, 1, 2]
