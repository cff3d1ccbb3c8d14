"""Run every benchmark module (``bench/bench_*.py``) or those named on the command line."""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys

import bench


def main(argv: list[str]) -> int:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # Spark's driver stays on loopback
    names = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))
    known = set(names) | {n.removeprefix("bench_") for n in names}
    wanted = [a for a in argv if a in known]
    rest = [a for a in argv if a not in known]  # flags and their values go to every benchmark
    if wanted:
        names = [n for n in names if n in wanted or n.removeprefix("bench_") in wanted]
    for name in names:
        print(f"== {name} ==", flush=True)
        importlib.import_module(f"bench.{name}").main(rest)
    # the README's table, docs/benchmarks.md and its plots follow the result files just written
    from bench import plots, report
    report.main([])
    return plots.main([])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
