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


def kill_inside_and_between(start: Callable[[], subprocess.Popen], ckpt: Path, log_hint: str, *,
                            seed: int = 0, wheres: tuple[str, ...] = KILLS, max_attempts: int = 8,
                            commit_timeout: float = 180.0) -> list[str]:
    """Run the query (``start()``: a child in a process group of its own) and SIGKILL it once per entry of
    ``wheres``, each time once it has committed a batch of its own run: "inside" a batch (planned and not
    committed), or "between" two (every planned batch committed). A kill that landed elsewhere is made
    again, ``max_attempts`` runs in all. Returns where each kill landed, in order; fails the test when a
    child exits by itself or commits nothing within ``commit_timeout`` seconds."""
    import pytest

    rng = random.Random(seed)
    ckpt = Path(ckpt)
    landed: list[str] = []
    attempts = 0
    for where in wheres:
        while True:
            attempts += 1
            if attempts > max_attempts:
                pytest.fail(f"kills landed {landed} in {max_attempts} runs; none {where} a batch ({log_hint})")
            before = last_batch(ckpt, "commits")
            proc = start()
            try:
                deadline = time.monotonic() + commit_timeout
                # between two batches the window is the time from a commit to the next plan: watch closely
                poll = 0.002 if where == "between" else 0.1
                while last_batch(ckpt, "commits") <= before:
                    if proc.poll() is not None:
                        pytest.fail(f"child query exited early ({proc.returncode}); see {log_hint}")
                    if time.monotonic() > deadline:
                        pytest.fail(f"no batch committed within {commit_timeout:.0f}s; see {log_hint}")
                    time.sleep(poll)
                if where == "inside":
                    deadline = time.monotonic() + 60
                    while not mid_batch(ckpt) and time.monotonic() < deadline:
                        time.sleep(0.01)  # batches run back to back: the next one is planned at once
                    time.sleep(rng.uniform(0.0, 0.2))
            finally:
                kill_group(proc)
            now = "inside" if mid_batch(ckpt) else "between"
            if now == where:
                landed.append(now)
                break
    return landed
