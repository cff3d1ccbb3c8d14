"""The source log's own costs, no broker and no Spark: the figures docs/performance.md quotes.

1. Group size: CPU per message to build, append and fsync 200,000 x 4 KiB messages in groups of
   256 KiB to 80 MB of bodies (80 MB: 20,000 messages, the count limit alone), every size once per
   round, the rounds interleaved (the machine's disk and page cache drift between runs); the median
   round per size is printed. ``fsyncBytes`` is chosen from it.
2. Reading back as an executor does, each batch written as an Arrow IPC stream into a pipe that
   another process drains (as PySpark's worker writes to the JVM's socket), so every byte is read:
   ``read_slice`` (one ``read_at`` per batch message, decoded in place), the same messages from
   the segment memory-mapped (tried on 2026-11-27 so that nothing is copied out of the page cache:
   no less CPU, a higher peak RSS, not kept; docs/performance.md), and pyarrow's own stream reader over
   the segment bytes read whole; same run, ``ROUNDS`` rounds interleaved: CPU and peak RSS.

    python -m bench sourcelog
    python -m bench sourcelog --reads      # the read-back comparison alone

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
    from spark_mq.sources.log import SourceLog
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


READS = ("read_slice", "mapped", "whole")


def _read(pickled: str, how: str) -> None:
    """In a fresh process, so the peak RSS is the read's own (the slices come pickled, as executors
    get them: opening the log would scan it). Every batch goes into a pipe drained by ``cat``."""
    import fcntl
    import pickle
    import pyarrow as pa
    from spark_mq.sources.log import read_slice
    with open(pickled, "rb") as f:
        slices = pickle.load(f)
    r, w = os.pipe()
    fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ: a socket-sized buffer
    drain = subprocess.Popen(["cat"], stdin=r, stdout=subprocess.DEVNULL)
    os.close(r)
    sink = os.fdopen(w, "wb", buffering=65536)  # as PySpark's worker wraps its socket
    c0, rows, writer = _cpu(), 0, None

    def put(batch):
        nonlocal writer
        if writer is None:
            writer = pa.ipc.new_stream(sink, batch.schema)
        writer.write_batch(batch)
        return batch.num_rows

    for s in slices:
        if how == "whole":
            with open(s.path, "rb") as f:
                data = f.read()
            rows += sum(put(b) for b in pa.ipc.open_stream(pa.py_buffer(data)))
        elif how == "mapped":  # the slices cover whole batches here: no cut to [lo, hi)
            with pa.memory_map(s.path, "r") as f:
                schema = pa.ipc.read_schema(pa.ipc.read_message(f.read_at(s.schema_len, 0)))
                for pos, length, _, _ in s.pieces:
                    rows += put(pa.ipc.read_record_batch(pa.ipc.read_message(f.read_at(length, pos)), schema))
        else:
            rows += sum(put(b) for b in read_slice(s))
    writer.close()
    sink.close()
    drain.wait()
    assert rows == N, rows
    # VmHWM, not ru_maxrss: a child's ru_maxrss starts from its parent's at fork
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    print(f"{_cpu() - c0:.3f} {hwm / 1024:.0f}")


def main(argv: list[str]) -> dict:
    if argv[:1] == ["--read"]:
        _read(argv[1], argv[2])
        return {}
    import pickle
    from spark_mq import schema as S
    from spark_mq.sources.log import SourceLog
    spent: dict = {g: [] for g in GROUPS}
    for _ in range(0 if "--reads" in argv else ROUNDS):
        for g in GROUPS:
            us, where = _write(g)
            spent[g].append(us)
            shutil.rmtree(where, ignore_errors=True)
    median = {g: statistics.median(v) for g, v in spent.items() if v}
    if median:
        print(f"append+fsync, {N:,} x {BODY} B, CPU per message by group (median of {ROUNDS} rounds):")
        best = min(median.values())
        for g in GROUPS:
            print(f"  groups of {g:6,} ({g * BODY / (1 << 20):6.2f} MiB): {median[g]:5.1f} us/msg "
                  f"(x{median[g] / best:.2f} the best; rounds {', '.join(f'{x:.1f}' for x in spent[g])})")
    _, where = _write(256)
    log = SourceLog(where, S.source_arrow_schema("malamute"))
    pickled = where + ".slices"
    with open(pickled, "wb") as f:
        pickle.dump(log.slices(0, log.head), f)
    log.close()
    t0 = time.perf_counter()
    out: dict = {how: [] for how in READS}
    for _ in range(ROUNDS):
        for how in READS:
            res = subprocess.run([sys.executable, "-m", "bench.bench_sourcelog", "--read", pickled, how],
                                 capture_output=True, text=True, check=True)
            out[how].append([float(x) for x in res.stdout.split()])
    shutil.rmtree(where, ignore_errors=True)
    os.remove(pickled)
    print(f"read back {N:,} x {BODY} B into a drained pipe, CPU s (median of {ROUNDS} rounds; rounds) and peak RSS "
          f"({time.perf_counter() - t0:.1f} s):")
    for how in READS:
        cpu = [x[0] for x in out[how]]
        print(f"  {how:8}: {statistics.median(cpu):.3f} s ({', '.join(f'{x:.3f}' for x in cpu)}), "
              f"{max(x[1] for x in out[how]):.0f} MiB")
    return {"append_us_per_msg": {str(g): us for g, us in median.items()}, "read": out}


if __name__ == "__main__":
    main(sys.argv[1:])
