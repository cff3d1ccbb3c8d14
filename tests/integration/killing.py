"""Kill-test helpers shared by the failure, lanes, multi-source, bridge and cluster tests: where a query's
checkpoint stands (batches committed, a batch planned and not committed), child processes started in a
session of their own and SIGKILLed as a group, and the suite's kill sequence (``kill_inside_and_between``).

The suite kills each case twice: once inside a batch (planned in the checkpoint's offsets log, not in its
commits log: the replay path) and once between two batches (every planned batch committed: the resume
path). Repeated kills, their statistics and broker restarts on top are ``./dev soak``'s (scripts/soak.py)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

__all__ = ["committed_batches", "last_batch", "mid_batch", "start_child", "kill_group", "KILLS",
           "kill_inside_and_between"]

# Where the suite's kills of one case land, in order (see the module docstring).
KILLS = ("inside", "between")


def committed_batches(ckpt: Path) -> int:
    commits = Path(ckpt) / "commits"
    return len([f for f in os.listdir(commits) if f.isdigit()]) if commits.exists() else 0


def last_batch(ckpt: Path, log: str) -> int:
    """The highest batch id in the checkpoint's ``offsets`` (planned) or ``commits`` (done) log; -1: none."""
    d = Path(ckpt) / log
    return max((int(f) for f in os.listdir(d) if f.isdigit()), default=-1) if d.exists() else -1


def mid_batch(ckpt: Path) -> bool:
    """A batch is planned and not committed: a kill now lands inside it."""
    return last_batch(ckpt, "offsets") > last_batch(ckpt, "commits")


def start_child(script: Path, args: list, log_file) -> subprocess.Popen:
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    return subprocess.Popen([sys.executable, str(script), *args], stdout=log_file, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


def kill_inside_and_between(start: Callable[[], subprocess.Popen], ckpt, log_hint: str, *,
                            seed: int = 0, wheres: tuple[str, ...] = KILLS, max_attempts: int = 8,
                            commit_timeout: float = 180.0):
    """Run the query (``start()``: a child in a process group of its own) and SIGKILL it once per entry of
    ``wheres``, each time once it has committed a batch of its own run: "inside" a batch (planned and not
    committed), or "between" two (every planned batch committed). A kill that landed elsewhere is made
    again, ``max_attempts`` runs in all. Returns where each kill landed, in order; fails the test when a
    child exits by itself or commits nothing within ``commit_timeout`` seconds.

    ``ckpt`` may also be a list of checkpoints: the child runs one query per checkpoint, and one kill of
    it kills them all. Each run then aims at the first query still missing a place of ``wheres`` and
    records, for every query that committed a batch in that run, where the kill landed for it; it ends
    when each query has had a kill at every place. Returns one list of landings per checkpoint (several
    queries in one driver: fewer driver starts for the same kills)."""
    several = isinstance(ckpt, (list, tuple))
    ckpts = [Path(c) for c in ckpt] if several else [Path(ckpt)]
    import pytest

    rng = random.Random(seed)
    landed: list[list[str]] = [[] for _ in ckpts]
    missing = [list(wheres) for _ in ckpts]
    attempts = 0
    while any(missing):
        aim = next(i for i, m in enumerate(missing) if m)
        where = missing[aim][0]
        attempts += 1
        if attempts > max_attempts:
            pytest.fail(f"kills landed {landed} in {max_attempts} runs; none {where} a batch of "
                        f"{ckpts[aim].name} ({log_hint})")
        before = [last_batch(c, "commits") for c in ckpts]
        proc = start()
        try:
            deadline = time.monotonic() + commit_timeout
            # between two batches the window is the time from a commit to the next plan: watch closely
            poll = 0.002 if where == "between" else 0.1
            while last_batch(ckpts[aim], "commits") <= before[aim]:
                if proc.poll() is not None:
                    pytest.fail(f"child query exited early ({proc.returncode}); see {log_hint}")
                if time.monotonic() > deadline:
                    pytest.fail(f"no batch committed within {commit_timeout:.0f}s; see {log_hint}")
                time.sleep(poll)
            if where == "inside":
                deadline = time.monotonic() + 60
                while not mid_batch(ckpts[aim]) and time.monotonic() < deadline:
                    time.sleep(0.01)  # batches run back to back: the next one is planned at once
                time.sleep(rng.uniform(0.0, 0.2))
        finally:
            kill_group(proc)
        for i, c in enumerate(ckpts):
            if last_batch(c, "commits") > before[i]:  # this query ran in this run: the kill hit it
                now = "inside" if mid_batch(c) else "between"
                if now in missing[i]:
                    missing[i].remove(now)
                    landed[i].append(now)
    return landed if several else landed[0]
