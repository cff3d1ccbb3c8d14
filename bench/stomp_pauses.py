"""Does RabbitMQ's STOMP adapter pause its deliveries during a drain? (Not a benchmark: a probe for
``docs/performance.md``, which explains why an availableNow drain over STOMP needs a quiet period longer
than 0.5 s.)

    python -m bench.stomp_pauses [--messages=500000] [--rounds=4] [--gap=0.2]

Starts a private RabbitMQ (the test harness), and per round preloads ``--messages`` 100-byte
messages to a fresh queue, waits until the machine is idle after it (``bench.common.settle``), then
drains the queue the way the STOMP source does in ``durable`` mode, without Spark: client
acknowledgements, prefetch 1000, groups of up to 500 written to a file and fsynced before the group's
one cumulative ACK. It prints every silence longer than ``--gap`` seconds, measured from the end of
the last ACK (or, before any, from the SUBSCRIBE) to the next delivery, with the count of messages
taken before it: a silence measured so is the broker's, as nothing of ours was pending.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid

from bench.bench_sources import _arg, stomp_preload
from bench.common import harness, settle


def drain(url: str, dest: str, n: int, gap: float) -> tuple[int, float, list]:
    """Drain ``n`` messages from ``dest``; returns (taken, seconds, [(taken before, silence s)])."""
    from spark_mq.clients.stomp import StompClient

    fd, path = tempfile.mkstemp(prefix="stomp-pauses-")
    got, pauses = 0, []
    t0 = time.perf_counter()
    try:
        with StompClient.from_uri(url) as c:
            c.subscribe(dest, ack="client", prefetch=1000)
            last = time.perf_counter()
            while got < n:
                frames = c.receive_many(500, timeout=5)
                now = time.perf_counter()
                if not frames:
                    pauses.append((got, round(now - last, 3)))
                    break  # 5 s without a delivery: reported as the last silence, and the round ends
                if now - last > gap:
                    pauses.append((got, round(now - last, 3)))
                got += len(frames)
                os.write(fd, b"".join(f.body for f in frames))
                os.fsync(fd)
                c.ack(frames[-1])
                last = time.perf_counter()
    finally:
        os.close(fd)
        os.unlink(path)
    return got, time.perf_counter() - t0, pauses


def main(argv: list[str]) -> int:
    n = _arg(argv, "messages", 500_000)
    rounds = _arg(argv, "rounds", 4)
    gap = _arg(argv, "gap", 0.2, float)
    rabbit = harness().start_rabbitmq()
    try:
        url = rabbit.url("stomp")
        for rnd in range(rounds):
            dest = f"/queue/stomp-pauses-{uuid.uuid4().hex[:6]}"
            stomp_preload(url, dest, n, 100)
            settle()
            got, seconds, pauses = drain(url, dest, n, gap)
            longest = max((p for _, p in pauses), default=0.0)
            print(f"round {rnd + 1}: {got} of {n} in {seconds:.1f}s; silences over {gap}s (messages taken "
                  f"before, seconds): {pauses}; longest {longest:.2f}s", flush=True)
    finally:
        rabbit.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
