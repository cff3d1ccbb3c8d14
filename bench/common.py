"""Helpers shared by the benchmarks: CPU/wall timing and result files."""

from __future__ import annotations

import json
import os
import resource
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass
class Measure:
    wall: float = 0.0
    cpu: float = 0.0
    extra: dict = field(default_factory=dict)


def flag_options(argv, defaults: dict) -> dict:
    """``defaults`` with every ``--name=value`` of ``argv`` whose name it has, typed like the default."""
    opts = dict(defaults)
    for a in argv:
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            if k in opts:
                opts[k] = type(defaults[k])(v)
    return opts


def numbered_bodies(n: int, size: int) -> list:
    """``n`` bodies of ``size`` bytes, each starting with its zero-padded index."""
    return [(b"%08d-" % i).ljust(size, b"x") for i in range(n)]


@contextmanager
def measured():
    """Wall time and this process's CPU time (user+system, all threads) of the block."""
    m = Measure()
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    try:
        yield m
    finally:
        m.wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        m.cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def write_results(name: str, figures: dict, partial: bool = False) -> Path | None:
    """Write ``bench/results/<name>.json``, which the README table and docs/benchmarks.md are
    generated from; a partial run (``--quick``, other counts, a subset of formats) writes nothing, so
    those always show a full run (the number of rounds or repeats is recorded in the file instead)."""
    if partial:
        print(f"(a partial run: bench/results/{name}.json not written)")
        return None
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    figures = dict(figures, when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), cpus=os.cpu_count())
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return path


def integration_module(name: str):
    """A module of tests/integration (not part of the package): ``brokers`` (the broker harness),
    ``broker_process`` (the Malamute broker as a process), ``sinktest`` (local_spark and friends)."""
    import importlib
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parent.parent / "tests" / "integration")
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module(name)


def harness():
    """The integration-test broker harness (tests/integration/brokers.py), for benchmarks that
    start their own private brokers."""
    return integration_module("brokers")


# -- CPU by process kind, from /proc ------------------------------------------------------------

_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _kind_of(pid: int, cmdline: bytes, me: int) -> str | None:
    """Which part of a benchmark run a process is (None: not ours to count)."""
    if pid == me:
        return "driver"
    if b"--produce" in cmdline and b"bench.bench_latency" in cmdline:
        return "producer"        # bench latency's paced producer
    if b"python_streaming_source_runner" in cmdline:
        return "reader"          # the driver-side reader process: the ingest thread and the client
    if b"malamute_broker" in cmdline or b"beam.smp" in cmdline or b"activemq" in cmdline:
        return "broker"          # before the JVM test: ActiveMQ is a JVM too
    if cmdline.startswith(b"java") or b"/java\0" in cmdline or b"bin/java" in cmdline:
        return "jvm"             # Spark's driver and executors (local mode: one JVM)
    if b"pyspark.daemon" in cmdline or b"pyspark.worker" in cmdline or b"pyspark/daemon" in cmdline:
        return "pyworkers"       # executor Python workers (they read the log's segments)
    return None


_kinds: dict = {}  # pid -> (comm, kind, first seen); kind None: not counted
_EXEC_WINDOW = 2.0  # seconds: a new process's command line may still change (fork, then exec)


def _split_stat(stat: str) -> tuple[str, list[str]]:
    """A /proc ``stat`` line: (comm, the fields after it); CPU seconds are ``_stat_cpu(fields)``."""
    return stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()


def _stat_cpu(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / _HZ  # utime + stime


def _process_cpu() -> dict:
    """(kind, pid, start time) -> CPU seconds so far (user + system, all threads) of every process we count."""
    me = os.getpid()
    now = time.monotonic()
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        known = _kinds.get(pid)
        if known is not None and known[1] is None and now - known[2] > _EXEC_WINDOW:
            continue  # settled and not ours: not read again
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            comm, fields = _split_stat(stat)
            if known is None or known[0] != comm:  # new, or exec'd since
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    known = _kinds[pid] = (comm, _kind_of(pid, f.read(), me), known[2] if known else now)
        except (OSError, ValueError):
            continue
        if known[1] is None:
            continue
        out[(known[1], pid, fields[19])] = _stat_cpu(fields)
    return out


def _jit_cpu() -> float:
    """CPU seconds so far of the JIT compiler threads (HotSpot's "C1/C2 CompilerThread<n>") of the
    JVMs counted as "jvm": the part of a JVM's CPU that is compiling, not running, Spark's code."""
    total = 0.0
    for pid, known in list(_kinds.items()):
        if known[1] != "jvm":
            continue
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            comm, fields = _split_stat(stat)
            if "CompilerThre" in comm:
                total += _stat_cpu(fields)
    return total


class ProcessCpu:
    """CPU seconds spent by each kind of process (reader, jvm, pyworkers, broker, driver) during a
    block, sampled from /proc every ``interval`` so that processes which exit inside the block (the
    reader process ends with its query) are counted up to their last sample.

        with ProcessCpu() as cpu:
            run()
        cpu.seconds  # {"jvm": 5.2, "reader": 4.1, ...}
        cpu.jit      # of "jvm": its JIT compiler threads (at least: HotSpot may end such a thread)
    """

    def __init__(self, interval: float = 0.1) -> None:
        import threading

        self.interval = interval
        self.seconds: dict = {}
        self.jit = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="bench-cpu-sampler", daemon=True)
        self._last: dict = {}

    def __enter__(self) -> "ProcessCpu":
        self._base = _process_cpu()
        self._jit_base = _jit_cpu()
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._last.update(_process_cpu())
            self._stop.wait(self.interval)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self._last.update(_process_cpu())
        totals: dict = {}
        for key, cpu in self._last.items():
            totals[key[0]] = totals.get(key[0], 0.0) + cpu - self._base.get(key, 0.0)
        self.seconds = {k: round(v, 2) for k, v in sorted(totals.items())}
        self.jit = round(max(0.0, _jit_cpu() - self._jit_base), 2)


# -- a quiet machine before each timed run ------------------------------------------------------

SETTLE_IDLE = 0.05     # broker CPU (cores) under which the broker counts as done with a preload
SETTLE_WINDOW = 0.5    # seconds over which that is measured
SETTLE_MAX = 60.0      # the longest a run waits for it


def settle(max_wait: float = SETTLE_MAX) -> dict:
    """Wait until a preload is over for the machine, not only for its client: the kernel's dirty
    pages written back (``os.sync()``) and the brokers' CPU below ``SETTLE_IDLE`` of a core over
    ``SETTLE_WINDOW`` (bounded by ``max_wait``), so that a timed run does not pay for the setup before
    it: a preload of a few GB can leave GBs of dirty pages (1.5-1.8 GB after 500,000 x 4 KiB Malamute
    mails in a scratch run) for the kernel to write back, and on ext4 an fsync waits for the journal,
    which waits for that writeback. Both the raw client's run and the source's run start after it.
    Returns what it waited for."""
    t0 = time.monotonic()
    os.sync()
    synced = time.monotonic() - t0
    idle = False
    while time.monotonic() - t0 < max_wait:
        before = _broker_cpu()
        time.sleep(SETTLE_WINDOW)
        if _broker_cpu() - before < SETTLE_IDLE * SETTLE_WINDOW:
            idle = True
            break
    return {"sync_seconds": round(synced, 2), "settle_seconds": round(time.monotonic() - t0, 2), "broker_idle": idle}


def timed_drain(preload, consume, name: str, n: int, size: int, who: str):
    """Preload ``n`` messages of ``size`` bytes into ``name``, ``settle``, then time ``consume(name, n)``
    (a client draining them: ``(received, seconds)``) with its CPU by process. Returns
    ``(seconds, ProcessCpu)``; a client that got fewer than ``n`` fails the run, naming ``who``."""
    preload(name, n, size)
    settle()
    with ProcessCpu() as cpu:
        got, seconds = consume(name, n)
    if got != n:
        raise RuntimeError(f"{who} got {got} of {n}: the rates would not compare the same work")
    return seconds, cpu


def _broker_cpu() -> float:
    return sum(cpu for (kind, _, _), cpu in _process_cpu().items() if kind == "broker")
