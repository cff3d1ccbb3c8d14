"""The writer lease of non-local source logs (``spark_mq.sources.log.lease``), driven through ``SourceLog``
with ``local=False``: the code path of object stores, on a local directory."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from spark_mq import schema as S
from spark_mq.sources.log import lease as writerlease
from spark_mq.sources.log import LogInUseError, SourceLog

SCHEMA = S.source_arrow_schema("malamute")


def rows(first: int, count: int):
    return S.build_batch("malamute", [(b"x", "s", None, 0, None, False, i, None, None, None, None, None)
                                      for i in range(first, first + count)])


@pytest.fixture(autouse=True)
def fast_lease(monkeypatch):
    monkeypatch.setattr(writerlease, "RENEW", 0.1)
    monkeypatch.setattr(writerlease, "SETTLE", 0.05)
    monkeypatch.setattr(writerlease, "TTL", 2.0)


def lease_of(where: str) -> dict:
    with open(os.path.join(where, writerlease.LEASE_NAME)) as f:
        return json.load(f)


def open_log(where: str, wait: float) -> SourceLog:
    return SourceLog(where, SCHEMA, local=False, exclusive_wait=wait)


def test_a_second_writer_fails_naming_the_holder_and_close_frees_the_log(tmp_path):
    where = str(tmp_path / "log")
    first = open_log(where, 0.0)
    first.append(rows(0, 3))
    t0 = time.monotonic()
    with pytest.raises(LogInUseError, match=rf"logLocation {where} is in use by another source reader "
                                            rf"\(pid {os.getpid()} on "):
        open_log(where, 0.5)
    assert time.monotonic() - t0 >= 0.5
    assert SourceLog(where, SCHEMA, local=False).head == 3  # readers take no lease
    first.close()
    assert not os.path.exists(os.path.join(where, writerlease.LEASE_NAME))
    t0 = time.monotonic()
    second = open_log(where, 0.0)
    assert time.monotonic() - t0 < 1.0  # no holder: only the settle time
    assert second.head == 3 and lease_of(where)["token"] == second._writer.token
    second.close()


def test_a_killed_holder_on_this_machine_is_taken_over_at_once(tmp_path):
    """Spark kills the reader process without a clean-up: its lease stays in the file, but the same
    host and boot id with a dead pid mean it is gone, without waiting for the TTL (30 s there)."""
    where = str(tmp_path / "log")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import time; from spark_mq import schema as S; from spark_mq.sources.log import SourceLog, lease as writerlease\n"
         "writerlease.RENEW = 0.1\n"
         f"log = SourceLog({where!r}, S.source_arrow_schema('malamute'), local=False, exclusive_wait=0.0)\n"
         "print('leased', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == b"leased"
        assert lease_of(where)["pid"] == holder.pid
        with pytest.raises(LogInUseError, match=f"pid {holder.pid} "):
            open_log(where, 0.3)  # alive: it renews
        holder.send_signal(signal.SIGKILL)
        holder.wait(10)
        t0 = time.monotonic()
        log = open_log(where, 0.0)
        assert time.monotonic() - t0 < writerlease.TTL
        assert lease_of(where)["pid"] == os.getpid()
        log.close()
    finally:
        holder.kill()
        holder.wait(10)


def test_a_holder_elsewhere_that_stops_renewing_lapses_after_the_ttl(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(writerlease, "TTL", 0.6)
    where = tmp_path / "log"
    where.mkdir()
    (where / writerlease.LEASE_NAME).write_text(json.dumps(
        {"token": "t-elsewhere", "host": "another-host", "boot": "b", "pid": 1, "started": None, "seq": 7}))
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="spark_mq.sources.log"):
        log = open_log(str(where), 0.1)
    assert time.monotonic() - t0 >= 0.6
    assert "taking over the lease of pid 1 on another-host" in caplog.text
    assert lease_of(str(where))["token"] == log._writer.token
    log.close()


def test_a_writer_whose_lease_was_taken_writes_and_deletes_nothing(tmp_path):
    where = str(tmp_path / "log")
    log = open_log(where, 0.0)
    log.append(rows(0, 2))
    with open(os.path.join(where, writerlease.LEASE_NAME), "w") as f:  # as a reader that took over would
        json.dump({"token": "t-other", "host": "h2", "boot": "b", "pid": 1, "seq": 1}, f)
    deadline = time.monotonic() + 5
    while log._writer._lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(LogInUseError, match="was taken by another source reader"):
        log.append(rows(2, 2))
    with pytest.raises(LogInUseError):
        log.commit(2)
    assert SourceLog(where, SCHEMA, local=False).head == 2
    log.close()
    assert lease_of(where)["token"] == "t-other"  # close leaves the new holder's lease alone


def test_of_two_writers_starting_together_one_fails(tmp_path, monkeypatch):
    """Both find no lease and both write theirs: reading it back after the settle time, the one
    whose write came first sees the other's and fails."""
    monkeypatch.setattr(writerlease, "SETTLE", 0.3)
    where = str(tmp_path / "log")
    opened, failed = [], []
    both_decided = threading.Barrier(2, timeout=10)
    write = writerlease.WriterLease._write

    def write_together(self):
        if self._seq == 0:  # the first write: both readers have seen no lease by now
            both_decided.wait()
        write(self)

    monkeypatch.setattr(writerlease.WriterLease, "_write", write_together)

    def start():
        try:
            opened.append(open_log(where, 0.5))
        except LogInUseError as exc:
            failed.append(exc)

    threads = [threading.Thread(target=start) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(opened) == 1 and len(failed) == 1, (opened, failed)
    assert lease_of(where)["token"] == opened[0]._writer.token
    opened[0].close()
