"""Kill-test helpers shared by the failure, lanes and cluster tests: where a query's checkpoint
stands (batches committed, a batch planned and not committed), and child processes started in a
session of their own and SIGKILLed as a group."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

__all__ = ["committed_batches", "last_batch", "mid_batch", "start_child", "kill_group"]


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
