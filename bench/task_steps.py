"""Where an ``ingest=executors`` task's time goes on ActiveMQ. (Not a benchmark: a probe for
``docs/performance.md``, which explains why ActiveMQ is slow with the ingest on the executors.)

    python -m bench.task_steps [--messages=100000] [--page=50000] [--cap=50000] [--drop | --tx=1000]

Starts a private ActiveMQ (the test harness) with the queues' ``maxPageSize`` at ``--page``, preloads
``--messages`` 100-byte messages, and runs the stomp source's executor tasks in this process, one
after another (batch 0, 1, ...) until one finds nothing: the task code of
``spark_mq.sources.executors`` (drain, batch file, ACK, close), without Spark. Per task it prints the
rows, how many came marked redelivered, and the seconds spent connecting (CONNECT and SUBSCRIBE),
draining, writing the batch file, acknowledging and closing (DISCONNECT, whose receipt the close waits
for up to 2 s).

Two variants, tried and not kept (docs/performance.md, "Lanes and where ingest runs"):

- ``--drop``: the task's ACK asks for a RECEIPT, and the close then drops the socket without DISCONNECT;
- ``--tx=W``: a prefetch of ``W``, a transaction begun at the first poll, each poll's last message
  acknowledged in it (ActiveMQ takes a transacted ACK as "delivered" and widens the window by what it
  names), and the task's ACK is the COMMIT.
"""

from __future__ import annotations

import sys
import tempfile
import time

from bench.bench_sources import _arg, stomp_preload
from bench.common import harness


def _timed(times: dict, name: str, fn):
    def wrapper(*args, **kwargs):
        began = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            times[name] = times.get(name, 0.0) + time.monotonic() - began
    return wrapper


def _ack_with_receipt(consumer, frames) -> None:
    """--drop: the ACK asks for a RECEIPT (and waits for it)."""
    if frames:
        consumer.client.ack(frames[-1], receipt=True)


def _drop(consumer) -> None:
    """--drop: the socket closes without DISCONNECT."""
    consumer.client.close()


def _transacted_polls(window: int):
    """--tx: a poll that begins the task's transaction, and acknowledges in it what it returns."""
    from spark_mq.sources.formats import stomp as F

    F.prefetch_of = lambda opts: window
    plain_poll = F.StompConsumer.poll

    def poll(consumer, max_count, timeout):
        if getattr(consumer, "_tx", None) is None:
            consumer._tx = consumer.client.begin()
        frames = plain_poll(consumer, max_count, timeout)
        if frames:
            consumer.client.ack(frames[-1], transaction=consumer._tx)
        return frames
    return poll


def _commit(consumer, frames) -> None:
    """--tx: the task's acknowledgement is the COMMIT."""
    if getattr(consumer, "_tx", None) is not None:
        consumer.client.commit(consumer._tx)


def instrument(times: dict, redelivered: list, drop: bool, window: int = 0) -> None:
    """Time the task's steps (``times``: step -> seconds), count redelivered rows (``redelivered[0]``)."""
    from spark_mq import schema as S
    from spark_mq.sources import executors as X
    from spark_mq.sources.formats.stomp import StompConsumer

    X._drain = _timed(times, "drain", X._drain)
    X.write_first = _timed(times, "file", X.write_first)
    StompConsumer.__init__ = _timed(times, "connect", StompConsumer.__init__)
    ack, close, row = StompConsumer.ack, StompConsumer.close, StompConsumer.row
    if drop:
        ack, close = _ack_with_receipt, _drop
    if window:
        StompConsumer.poll = _transacted_polls(window)
        ack = _commit
    StompConsumer.ack = _timed(times, "ack", ack)
    StompConsumer.close = _timed(times, "close", close)

    def counted_row(self, *args):
        values = row(self, *args)
        redelivered[0] += bool(values[S.REDELIVERED])
        return values
    StompConsumer.row = counted_row


def main(argv: list[str]) -> None:
    from spark_mq import schema as S
    from spark_mq.sources import executors as X
    from spark_mq.sources.base import source_options
    from spark_mq.sources.formats import stomp as F

    n, page = _arg(argv, "messages", 100_000), _arg(argv, "page", 50_000)
    cap = _arg(argv, "cap", 50_000)
    times: dict = {}
    redelivered = [0]
    instrument(times, redelivered, "--drop" in argv, _arg(argv, "tx", 0))
    broker = harness().start_activemq(max_page_size=page)
    try:
        url = f"stomp://127.0.0.1:{broker.stomp_port}"
        stomp_preload(url, "/queue/steps", n, 100)
        raw = {"uri": url, "destination": "/queue/steps", "logLocation": tempfile.mkdtemp(prefix="task-steps-"),
               "ingest": "executors", "taskMaxMessages": str(cap)}
        reader = X.ExecutorStreamReader("stomp", source_options("stomp", raw, F.validate, True),
                                        S.source_schema("stomp"), F.connect_consumer)
        batch = reader._decode(reader.initialOffset())[0]
        total, began = 0, time.monotonic()
        print(f"ActiveMQ, maxPageSize {page}, {n} preloaded, taskMaxMessages {cap}"
              f"{', ACK with receipt and dropped socket' if '--drop' in argv else ''}")
        while True:
            times.clear()
            redelivered[0] = 0
            part = reader.partitions(reader._encode(batch), reader._encode(batch + 1))[0]
            t0 = time.monotonic()
            rows = sum(b.num_rows for b in X.run_task(part, reader.target_schema))
            total += rows
            print(f"batch {batch}: {rows:6d} rows, {redelivered[0]:6d} redelivered, task {time.monotonic() - t0:5.2f} s: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in times.items()), flush=True)
            batch += 1
            if rows == 0:
                break
        print(f"{total} of {n} in {time.monotonic() - began:.1f} s (the last task found nothing: taskIngestTime)")
    finally:
        broker._shutdown()


if __name__ == "__main__":
    main(sys.argv[1:])
