"""Executor-side Python workers: keep PySpark's collection after every task cheap.

A reused PySpark worker runs a full ``gc.collect()`` after every task (``pyspark/daemon.py``,
``manager``). A full collection walks every container object the worker tracks: with pyspark,
pyarrow, numpy and pandas imported, about 78,000 objects, 37-44 ms per collection on the
benchmark machine, once per task. A 1,000,000 x 4 KiB Malamute source run reads 72 partitions, and
a sampling profile of its Python workers put a third of their CPU in that collection.

The first of our tasks in a worker process moves what the worker holds at that point (modules,
classes, functions, caches: nearly all of it lives as long as the process) into the permanent
generation with ``gc.freeze()``, which collections skip; after it, a collection walks only what
was made since (a few microseconds between our tasks). Garbage is collected first, so only live
objects are frozen. A frozen object that later becomes garbage is still freed by its reference
count; only one caught in a reference cycle stays. Once per process (a forked process freezes
again, in its own heap), and only in a reused worker (``spark.python.worker.reuse``, on by
default): the daemon collects after each task only when ``SPARK_REUSE_WORKER`` is set, and a worker
that runs one task would pay a full collection for nothing.
"""

from __future__ import annotations

import gc
import os
from typing import Optional

__all__ = ["freeze_worker_heap"]

_frozen_in: Optional[int] = None  # the pid whose heap was frozen


def freeze_worker_heap() -> bool:
    """Freeze this process's heap the first time it is called in it; True when it did."""
    global _frozen_in
    if not os.environ.get("SPARK_REUSE_WORKER"):  # pyspark/daemon.py's own test
        return False
    pid = os.getpid()
    if _frozen_in == pid:
        return False
    _frozen_in = pid
    gc.collect()
    gc.freeze()
    return True
