"""The source log's own costs, no broker and no Spark: the figures docs/sources.md quotes.

1. Group size: CPU per message to build, append and fsync 200,000 x 4 KiB messages in groups of
   256 KiB to 80 MB of bodies (80 MB: 20,000 messages, the count limit alone), every size once per
   round, the rounds interleaved (the machine's disk and page cache drift between runs); the median
   round per size is printed. ``fsyncBytes`` is chosen from it.
2. Reading back: ``read_slice`` (one read and one in-place decode per batch message) against
   pyarrow's own stream reader over the same segment bytes read whole, same run: CPU and peak RSS.

    python -m bench sourcelog

Prints its figures; writes no result file (the README's table is for peer comparisons).
"""

from __future__ import annotations

import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

N, BODY = 200_000, 4096
GROUPS = (64, 256, 512, 1024, 2048, 4096, 20_000)  # messages per group: 256 KiB .. 80 MB of bodies
ROUNDS = 3


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _write(group: int) -> tuple[float, str]:
    from spark_mq import schema as S
    from spark_mq.sourcelog import SourceLog
    body = b"x" * BODY
    where = tempfile.mkdtemp(prefix="bench-sourcelog-")
    log = SourceLog(where, S.source_arrow_schema("malamute"))
    c0 = _cpu()
    for first in range(0, N, group):
        rows = [(bytes(body), "m", None, 1, None, False, first + j, "s", "m", "subject", None, None)
                for j in range(min(group, N - first))]
        log.append(S.build_batch("malamute", rows))
        log.sync()
    spent = _cpu() - c0
    log.close()
    return spent / N * 1e6, where


def _read(pickled: str, whole: bool) -> None:
    """In a fresh process, so the peak RSS is the read's own (the slices come pickled, as executors
    get them: opening the log would scan it)."""
    import pickle
    import pyarrow as pa
    from spark_mq.sourcelog import read_slice
    with open(pickled, "rb") as f:
        slices = pickle.load(f)
    c0, rows = _cpu(), 0
    for s in slices:
        if whole:
            with open(s.path, "rb") as f:
                data = f.read()
            rows += sum(b.num_rows for b in pa.ipc.open_stream(pa.py_buffer(data)))
        else:
            rows += sum(b.num_rows for b in read_slice(s))
    assert rows == N, rows
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's at fork
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    print(f"{_cpu() - c0:.3f} {hwm / 1024:.0f}")


def main(argv: list[str]) -> dict:
    if argv[:1] == ["--read"]:
        _read(argv[1], argv[2] == "whole")
        return {}
    import pickle
    from spark_mq import schema as S
    from spark_mq.sourcelog import SourceLog
    spent: dict = {g: [] for g in GROUPS}
    for _ in range(ROUNDS):
        for g in GROUPS:
            us, where = _write(g)
            spent[g].append(us)
            shutil.rmtree(where, ignore_errors=True)
    median = {g: statistics.median(v) for g, v in spent.items()}
    print(f"append+fsync, {N:,} x {BODY} B, CPU per message by group (median of {ROUNDS} rounds):")
    best = min(median.values())
    for g in GROUPS:
        print(f"  groups of {g:6,} ({g * BODY / (1 << 20):6.2f} MiB): {median[g]:5.1f} us/msg (x{median[g] / best:.2f} "
              f"the best; rounds {', '.join(f'{x:.1f}' for x in spent[g])})")
    _, where = _write(256)
    log = SourceLog(where, S.source_arrow_schema("malamute"))
    pickled = where + ".slices"
    with open(pickled, "wb") as f:
        pickle.dump(log.slices(0, log.head), f)
    log.close()
    t0 = time.perf_counter()
    out = {}
    for how in ("whole", "per-batch"):
        res = subprocess.run([sys.executable, "-m", "bench.bench_sourcelog", "--read", pickled, how],
                             capture_output=True, text=True, check=True)
        out[how] = [float(x) for x in res.stdout.split()]
    shutil.rmtree(where, ignore_errors=True)
    os.remove(pickled)
    print(f"read back {N:,} x {BODY} B: read_slice {out['per-batch'][0]:.3f} s CPU, peak RSS "
          f"{out['per-batch'][1]:.0f} MiB; whole segments through pyarrow's stream reader "
          f"{out['whole'][0]:.3f} s, {out['whole'][1]:.0f} MiB ({time.perf_counter() - t0:.1f} s)")
    return {"append_us_per_msg": {str(g): median[g] for g in GROUPS}, "read": out}


if __name__ == "__main__":
    main(sys.argv[1:])
