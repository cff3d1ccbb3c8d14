"""The executor-side heap freeze (``spark_mq.workerheap``): once per process, before the first task
of ours, so that PySpark's collection after each task walks only what was made since. Each check
runs in a fresh interpreter: freezing the test process's own heap would outlive the test."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def _run(code: str, reuse: bool = True) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SPARK_REUSE_WORKER"}
    if reuse:
        env["SPARK_REUSE_WORKER"] = "1"  # as Spark's JVM sets it for a reused worker (the default)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_first_call_freezes_what_the_process_holds_and_later_calls_do_nothing():
    out = _run("""
        import gc
        import pyarrow, spark_mq.sources.base  # a worker's modules: thousands of tracked objects
        from spark_mq.workerheap import freeze_worker_heap
        assert gc.get_freeze_count() == 0
        tracked = len(gc.get_objects())
        assert freeze_worker_heap() is True
        frozen = gc.get_freeze_count()
        assert frozen >= tracked * 0.9, (frozen, tracked)   # nearly all: garbage was collected first
        assert len(gc.get_objects(generation=2)) < tracked * 0.1  # a full collection walks these only
        made_since = [[i] for i in range(1000)]  # new objects: a second call must not freeze them
        assert freeze_worker_heap() is False               # once per process
        assert gc.get_freeze_count() == frozen
        del made_since  # alive until the count above was taken
        print("ok")
    """)
    assert out == "ok"


def test_a_forked_process_freezes_its_own_heap_again():
    out = _run("""
        import os
        from spark_mq.workerheap import freeze_worker_heap
        assert freeze_worker_heap() is True
        pid = os.fork()
        if pid == 0:
            os._exit(0 if freeze_worker_heap() is True else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), freeze_worker_heap())
    """)
    assert out == "0 False"


def test_the_executor_read_path_freezes_before_its_first_batch():
    out = _run("""
        import gc
        import pyarrow as pa
        from spark_mq import schema as S
        from spark_mq.sources.partitions import MemoryPartition, read_partition
        rows = [(b"x", "m", None, 0, None, False, 0, "s", "m", "subj", "", None)]
        batch = S.build_batch("malamute", rows)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as w:
            w.write_batch(batch)
        part = MemoryPartition(0, sink.getvalue().to_pybytes())
        assert gc.get_freeze_count() == 0
        got = list(read_partition(part, batch.schema))
        print(sum(b.num_rows for b in got), gc.get_freeze_count() > 0)
    """)
    assert out == "1 True"


def test_a_worker_that_is_not_reused_freezes_nothing():
    """Without worker reuse the daemon does not collect after the task: nothing to save."""
    out = _run("""
        import gc
        from spark_mq.workerheap import freeze_worker_heap
        print(freeze_worker_heap(), gc.get_freeze_count())
    """, reuse=False)
    assert out == "False 0"
