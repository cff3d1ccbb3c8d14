"""The ingest alone, without Spark: the source's ingest thread draining a preloaded queue into a
source log, next to the same protocol's raw client consuming the same count, in the same run.

Why: ``bench sources`` measures the whole query, where the broker, the reader process, Spark's JVM
and its Python workers share the machine's cores. This separates the ingest's own rate and CPU
from Spark's, and splits the ingest thread's time into its stages, so a change to the ingest can be
judged on its own.

For each format (amqp08 and stomp on RabbitMQ, malamute on the embedded broker), body size (100 B,
4 KiB) and variant (the source's default options, then each ``--variant``): preload N, time the raw
client (``bench.bench_sources``'s) consuming and acknowledging them; preload N again, time an
``Ingest`` built as the stream reader builds it (default source options, a fresh ``logLocation``)
from its start until all N are durable in the log, committing what is durable as it goes (as if
Spark read every batch at once: the log never reaches its bound). The ingest thread's time is split
into ``poll`` (the client handing over deliveries, waiting for them included; for Malamute, its
receiver copying the bodies into the group's buffer), ``append`` (Arrow IPC written to the
segment), ``fsync`` and the rest (rows or columns, Arrow batches, dedup, acks). CPU seconds
are per process, as in ``bench sources``: here the ingest runs in the benchmark's own process
("driver"), beside the client's IO thread.

    python -m bench ingest                               # ~10 minutes: COUNTS, variants "" and fsync=false
    python -m bench ingest --only=amqp08 --rounds=1 --variant=prefetch=4000

Rounds: every pair ``--rounds`` times (3), each format and size once per round; the median round
by ratio is reported with every round's ratio.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections import Counter

from bench.bench_sources import _arg, only_formats, pairs, protocol_table
from bench.common import ProcessCpu, harness, settle, write_results

# each raw run about 5 s or more on this machine (2026-11-25: malamute 300,000 x 4 KiB in 2.6-3.0 s
# was the shortest, at 5 to 10 times the start-up's share of a run)
COUNTS = {
    "amqp08": {"100B": 200_000, "4KiB": 150_000},
    "stomp": {"100B": 200_000, "4KiB": 150_000},
    "malamute": {"100B": 1_000_000, "4KiB": 300_000},
}
VARIANTS = ("", "fsync=false")  # the source's defaults, then without the log's fsyncs
ROUNDS = 3
DRAIN_TIMEOUT = 300.0


def _variant(text: str) -> dict:
    return dict(item.split("=", 1) for item in text.split(",") if item)


class _Stages:
    """Wall time per stage of the ingest thread, by wrapping the instance's own callables."""

    def __init__(self) -> None:
        self.seconds: Counter = Counter()

    def wrap(self, obj, name: str, stage: str) -> None:
        inner = getattr(obj, name)
        seconds = self.seconds
        clock = time.perf_counter

        def timed(*args, **kwargs):
            t = clock()
            try:
                return inner(*args, **kwargs)
            finally:
                seconds[stage] += clock() - t

        setattr(obj, name, timed)

    def split(self) -> dict:
        s = self.seconds
        rest = s["step"] - s["poll"] - s["append"] - s["fsync"]
        return {"poll": s["poll"], "append": s["append"], "fsync": s["fsync"], "rest": max(0.0, rest),
                "step": s["step"]}


def ingest_run(fmt: str, options: dict, n: int) -> dict:
    """Drain ``n`` messages with the source's ingest alone; time, CPU and the stage split."""
    import importlib

    from spark_mq.options import SOURCE, parse_options
    from spark_mq.sources.ingest import Ingest

    logdir = tempfile.mkdtemp(prefix="bench-ingest-")
    opts = parse_options({**options, "logLocation": logdir}, format=fmt, direction=SOURCE)
    connect_consumer = importlib.import_module(f"spark_mq.sources.{fmt}").connect_consumer
    stages = _Stages()

    def connect(attempt):
        consumer = connect_consumer(opts, attempt)
        if hasattr(consumer, "poll_batch"):  # Malamute: the client's poll; building the batch is "rest"
            stages.wrap(consumer.client, "poll", "poll")
        else:
            stages.wrap(consumer, "poll", "poll")
        return consumer

    ing = None
    try:
        with ProcessCpu() as cpu:
            t0 = time.perf_counter()
            ing = Ingest(fmt, opts, connect)
            stages.wrap(ing, "_step", "step")
            stages.wrap(ing.log, "append", "append")
            stages.wrap(ing.log, "sync", "fsync")
            ing.start()
            deadline = time.monotonic() + DRAIN_TIMEOUT
            while ing.log.durable_head < n:
                ing.check()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{fmt} ingest: {ing.log.durable_head} of {n} messages after "
                                       f"{DRAIN_TIMEOUT:.0f}s")
                ing.commit(ing.log.durable_head)  # Spark, instantly: the log stays far from its bound
                ing.wait_for(lambda: ing.log.durable_head >= n, 0.01)
            seconds = time.perf_counter() - t0
        got = ing.log.durable_head
    finally:
        if ing is not None:
            ing.stop()
        shutil.rmtree(logdir, ignore_errors=True)
    return {"messages": got, "seconds": seconds, "cpu": cpu.seconds, "stages": stages.split()}


def main(argv: list[str]) -> dict:
    rounds = max(1, _arg(argv, "rounds", ROUNDS))
    extra = [a.split("=", 1)[1] for a in argv if a.startswith("--variant=")]
    variants = list(VARIANTS) + [v for v in extra if v not in VARIANTS]
    only = _arg(argv, "only", None, str)
    brokers = harness()
    from spark_mq.malamute_broker.testing import BrokerProcess

    rabbit = brokers.start_rabbitmq()
    # no mailbox journal: with one (then compacted only at start-up) two runs failed after a few GB
    # of preloads, a preload's PING unanswered for 60 s; without, the run went through
    biggest = max(COUNTS["malamute"].values())
    mlm = BrokerProcess(client_timeout=60.0, args=("--max-queue", str(biggest * 2)))
    mlm.start()
    protocols = only_formats(protocol_table(rabbit.url("amqp"), rabbit.url("stomp"), mlm.endpoint), only)
    measured: dict = {}
    try:
        for rnd, fmt, label, size, n, name, (preload, raw, options) in pairs(protocols, COUNTS, rounds, "bench-ingest"):
            preload(name + "-raw", n, size)
            settle()
            with ProcessCpu() as raw_cpu:
                got_raw, raw_s = raw(name + "-raw", n)
            if got_raw != n:
                raise RuntimeError(f"{fmt} {label}: the raw client got {got_raw} of {n}")
            row = {"n": n, "round": rnd + 1, "raw_seconds": raw_s, "raw_cpu": raw_cpu.seconds, "variants": {}}
            for variant in variants:
                queue = f"{name}-{len(row['variants'])}"
                preload(queue, n, size)
                settle()
                run = ingest_run(fmt, {**options(queue), **_variant(variant)}, n)
                if run["messages"] != n:
                    raise RuntimeError(f"{fmt} {label} {variant!r}: the ingest logged {run['messages']} of {n}")
                run["ratio"] = raw_s / run["seconds"]
                row["variants"][variant or "defaults"] = run
                st = run["stages"]
                print(f"round {rnd + 1}: {fmt} {label} {variant or 'defaults'}: raw {raw_s:.2f}s, ingest "
                      f"{run['seconds']:.2f}s, ratio {run['ratio']:.2f}; ingest thread: poll {st['poll']:.2f}s, "
                      f"append {st['append']:.2f}s, fsync {st['fsync']:.2f}s, rest {st['rest']:.2f}s; "
                      f"CPU s raw {raw_cpu.seconds}, ingest {run['cpu']}", flush=True)
            measured.setdefault((fmt, label), []).append(row)
    finally:
        mlm.stop()
        rabbit._shutdown()
    figures: dict = {"counts": COUNTS, "rounds": rounds, "variants": [v or "defaults" for v in variants]}
    print(f"median of {rounds} round(s) by the defaults' ratio")
    print(f"{'format':9} {'size':5} {'n':>9} {'raw s':>7} " + " ".join(f"{v or 'defaults':>14}" for v in variants))
    for (fmt, label), runs in measured.items():
        median = sorted(runs, key=lambda r: r["variants"]["defaults"]["ratio"])[len(runs) // 2]
        figures[f"{fmt}_{label}"] = {**median, "round_ratios": {
            v: [round(r["variants"][v]["ratio"], 3) for r in runs] for v in median["variants"]}}
        print(f"{fmt:9} {label:5} {median['n']:9,d} {median['raw_seconds']:7.2f} "
              + " ".join(f"{median['variants'][v or 'defaults']['ratio']:14.2f}" for v in variants))
    write_results("ingest", figures, partial=bool(only) or rounds != ROUNDS or bool(extra))
    return figures


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    main(sys.argv[1:])
