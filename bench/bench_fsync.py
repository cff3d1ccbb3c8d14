"""Would an fsync in a thread of its own speed up the ingest? The log's write pattern, three ways.

The ingest appends a group (about 1 MiB of Arrow IPC for 4 KiB bodies) to the active log segment,
then fsyncs it before the next group. Moving the fsync to a thread of its own, so that the next
group is gathered and appended while the disk makes the last one durable, pays only if the disk
and the filesystem let writes go on during an fsync. This measures the pattern on the filesystem
of a temporary directory (the benchmarks' logs live there), ``--groups`` groups of 1 MiB, each
preceded by ``--work-ms`` of CPU work standing for receiving and building the group:

- inline: work, append, fsync (the ingest as it is);
- flusher: work, append, hand the fsync to a second thread (at most one group in flight: group
  i's work starts once group i-2 is durable, so group i-1's fsync overlaps group i's work and append);
- no fsync: work, append (``fsync=false``).

    python -m bench fsync [--groups=500] [--work-ms=2] [--rounds=3]

Reports each way's time per group (median of the rounds, alternating) and the flusher's gain over
inline, next to the most any overlap could give (inline over no fsync).
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

from bench.common import write_results

CHUNK = 1 << 20
DEFAULTS = {"groups": 500, "work-ms": 2.0, "rounds": 3}


def _arg(argv, name):
    for a in argv:
        if a.startswith(f"--{name}="):
            return type(DEFAULTS[name])(a.split("=", 1)[1])
    return DEFAULTS[name]


def _work(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def run(directory: str, way: str, groups: int, work: float) -> float:
    """Seconds per group for ``way`` ("inline", "flusher", "no fsync")."""
    buf = os.urandom(CHUNK)
    path = os.path.join(directory, f"segment-{way.replace(' ', '-')}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    wanted, done = [0], [0]
    cond = threading.Condition()
    stop = [False]

    def flusher():
        while True:
            with cond:
                while wanted[0] <= done[0] and not stop[0]:
                    cond.wait()
                if wanted[0] <= done[0]:
                    return
                target = wanted[0]
            os.fsync(fd)
            with cond:
                done[0] = target
                cond.notify_all()

    thread = threading.Thread(target=flusher, daemon=True) if way == "flusher" else None
    if thread is not None:
        thread.start()
    t0 = time.perf_counter()
    try:
        for i in range(1, groups + 1):
            if thread is not None:
                with cond:  # at most one group waits for its fsync while this one is built and appended
                    while done[0] < i - 2:
                        cond.wait()
            _work(work)
            os.write(fd, buf)
            if way == "inline":
                os.fsync(fd)
            elif thread is not None:
                with cond:
                    wanted[0] = i
                    cond.notify_all()
        if thread is not None:
            with cond:
                while done[0] < groups:
                    cond.wait()
        elapsed = time.perf_counter() - t0
    finally:
        if thread is not None:
            with cond:
                stop[0] = True
                cond.notify_all()
            thread.join()
        os.close(fd)
        os.unlink(path)
    return elapsed / groups


def main(argv: list[str]) -> dict:
    groups, work, rounds = _arg(argv, "groups"), _arg(argv, "work-ms") / 1000, _arg(argv, "rounds")
    ways = ("inline", "flusher", "no fsync")
    times: dict = {w: [] for w in ways}
    directory = tempfile.mkdtemp(prefix="bench-fsync-")
    try:
        for _ in range(rounds):
            for way in ways:
                times[way].append(run(directory, way, groups, work))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    ms = {w: statistics.median(t) * 1e3 for w, t in times.items()}
    for w in ways:
        print(f"{w:9}: {ms[w]:.2f} ms per 1 MiB group (rounds: {', '.join(f'{t * 1e3:.2f}' for t in times[w])})")
    figures = {"groups": groups, "work_ms": work * 1e3, "rounds": rounds, "ms_per_group": ms,
               "round_ms": {w: [t * 1e3 for t in times[w]] for w in ways},
               "flusher_gain": ms["inline"] / ms["flusher"], "most_possible_gain": ms["inline"] / ms["no fsync"]}
    print(f"flusher x{figures['flusher_gain']:.2f} the inline rate; no fsync at all x{figures['most_possible_gain']:.2f}")
    write_results("fsync", figures, partial=(groups, work * 1e3, rounds) != tuple(DEFAULTS.values()))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
