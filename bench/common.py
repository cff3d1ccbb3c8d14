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


def write_results(name: str, figures: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    figures = dict(figures, when=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), cpus=os.cpu_count())
    path.write_text(json.dumps(figures, indent=2, sort_keys=True) + "\n")
    return path


def harness():
    """The integration-test broker harness (tests/integration/brokers.py), for benchmarks that
    start their own private brokers."""
    import importlib
    import sys
    from pathlib import Path

    here = str(Path(__file__).resolve().parent.parent / "tests" / "integration")
    if here not in sys.path:
        sys.path.insert(0, here)
    return importlib.import_module("brokers")
