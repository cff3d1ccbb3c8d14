"""Spark's Python processes: keep the cyclic garbage collector cheap in them.

Two kinds: executor-side Python workers (``freeze_worker_heap``) and the driver-side reader process
of a streaming source (``quiet_reader_heap``).

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

__all__ = ["freeze_worker_heap", "quiet_reader_heap", "READER_GC_THRESHOLDS"]

#: the collector's thresholds in the reader process, at least (see ``quiet_reader_heap``)
READER_GC_THRESHOLDS = (50_000, 20, 100)

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


def quiet_reader_heap() -> None:
    """The driver-side reader process, as its ingest starts (Spark runs one such process per query, for
    the stream reader alone): its heap is frozen as a reused worker's is (pyspark, pyarrow and numpy are
    imported there too), and the collector's thresholds are raised to at least ``READER_GC_THRESHOLDS``.

    The ingest makes a few container objects per message (frame, headers, row) that live a group's time,
    and reference counting frees them all; at Python's default thresholds (700, 10, 10) the collector
    still ran every few hundred messages, traversed the groups in flight, and now and then the whole
    heap. Measured on a parse-to-batch pipeline of STOMP groups: 0.5 to 0.9 us of CPU per message, as
    much as with the collector off. Raised, not disabled: a reference cycle (an exception's traceback)
    is still collected, later."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*(max(c, t) for c, t in zip(gc.get_threshold(), READER_GC_THRESHOLDS)))
