"""The ingest alone, without Spark: the source's ingest thread draining a preloaded queue into a
source log, next to the same protocol's raw client and the peer library users would otherwise reach
for (pika, stomp.py) consuming the same count, in the same run.

Why: ``bench sources`` measures the whole query, where the broker, the reader process, Spark's JVM
and its Python workers share the machine's cores. This separates the ingest's own rate and CPU
from Spark's, and splits the ingest thread's time into its stages, so a change to the ingest can be
judged on its own.

For each row (amqp08 and stomp on RabbitMQ, stomp on ActiveMQ, malamute on the embedded broker), body
size (100 B, 4 KiB) and variant (the source's default options, then each ``--variant``): preload N, time
the raw client (``bench.bench_sources``'s) consuming and acknowledging them, then the peer library where
there is one (``bench.bench_sources``' pika and stomp.py consumers); preload N again, time an
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
    python -m bench ingest --only=stomp-activemq --variant=activemqGroup=100   # ActiveMQ's group size
    python -m bench ingest --memory                      # only the memory run with recurring bodies (~2 min)

The memory run (also at the end of a full run; issue 43, item 11): the ingest drains 100,000 AMQP
messages without message ids (so the identities are content hashes) with ``dedupWindow=2000``,
Spark's commits 1,000 messages behind the log's head until the end (a batch in flight), once
with every body unique and once with ``{}`` as every hundredth body, and reports the dedup
identities held (highest count seen and at the end), the growth of the process's resident set over
the run (peak VmRSS sampled every 10 ms, minus VmRSS before the ingest started) and tracemalloc's
peak, each in a fresh process of its own (tracemalloc in a separate run: it slows the ingest down and
adds its own memory to the resident set), and the recurring run's figures against the unique run's.
A third run reproduces the ``_Dedup.add`` before the fix (a recurring identity kept its first
position, so trimming stopped there) to show what the figures look like when identities leak.

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

from bench.bench_sources import _arg, format_of, only_formats, pairs, peer_table, protocol_table
from bench.common import ProcessCpu, harness, settle, integration_module, timed_drain, write_results

# each raw run about 5 s or more on this machine (2026-11-25: malamute 300,000 x 4 KiB in 2.6-3.0 s
# was the shortest, at 5 to 10 times the start-up's share of a run)
COUNTS = {
    "amqp08": {"100B": 200_000, "4KiB": 150_000},
    "stomp": {"100B": 200_000, "4KiB": 150_000},
    "stomp-activemq": {"100B": 200_000, "4KiB": 150_000},
    "malamute": {"100B": 1_000_000, "4KiB": 300_000},
}
VARIANTS = ("", "fsync=false")  # the source's defaults, then without the log's fsyncs
ROUNDS = 3
DRAIN_TIMEOUT = 300.0


def _variant(text: str) -> dict:
    return dict(item.split("=", 1) for item in text.split(",") if item)


class _GroupOnActiveMQ:
    """The variant ``activemqGroup=N``: the stomp source's group size on ActiveMQ (a constant of
    ``spark_mq.sources.formats.stomp``, not an option) set to N for one run, then restored."""

    def __init__(self, variant: dict) -> None:
        self.size = variant.pop("activemqGroup", None)

    def __enter__(self):
        from spark_mq.sources.formats import stomp
        self.before = stomp.ACTIVEMQ_GROUP
        if self.size is not None:
            stomp.ACTIVEMQ_GROUP = int(self.size)
        return self

    def __exit__(self, *exc):
        from spark_mq.sources.formats import stomp
        stomp.ACTIVEMQ_GROUP = self.before


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
    connect_consumer = importlib.import_module(f"spark_mq.sources.formats.{fmt}").connect_consumer
    stages = _Stages()

    def connect(attempt):
        consumer = connect_consumer(opts, attempt)
        if consumer.builds_batches:  # Malamute: the client's poll; building the batch is "rest"
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


# -- memory with recurring bodies -----------------------------------------------------------------

MEMORY_COUNT = 100_000
MEMORY_WINDOW = 2_000
MEMORY_LAG = 1_000  # messages between the log's durable head and Spark's last commit
#: body kinds of the memory run; "recurring, before the fix" runs the pre-fix ``_Dedup.add``
MEMORY_KINDS = ("unique", "recurring", "recurring, before the fix")


def _memory_body(kind: str, i: int) -> bytes:
    return b"{}" if kind != "unique" and i % 100 == 0 else f"m{i:07d}".encode()


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _memory_child(kind: str, url: str, queue: str, n: int, trace: bool) -> dict:
    """In a fresh process: drain ``queue`` with the ingest alone, committing as it goes; the figures."""
    import tracemalloc

    from spark_mq.options import SOURCE, parse_options
    from spark_mq.sources import ingest as ingest_module
    from spark_mq.sources.formats.amqp08 import connect_consumer

    if kind == "recurring, before the fix":
        # the add before c3c3548 (issue 43, item 11): assigning an existing key keeps its first position in the dict
        from spark_mq.sources.dedup import Dedup
        Dedup.add = lambda self, key, offset: self._ids.__setitem__(key, offset)
    logdir = tempfile.mkdtemp(prefix="bench-ingest-memory-")
    opts = parse_options({"uri": url, "queue": queue, "logLocation": logdir, "dedupWindow": str(MEMORY_WINDOW)},
                         format="amqp08", direction=SOURCE)
    rss_before = _rss_kib()
    if trace:
        tracemalloc.start()
    held_max = rss_peak = 0
    ing = ingest_module.Ingest("amqp08", opts, lambda attempt: connect_consumer(opts, attempt))
    try:
        t0 = time.perf_counter()
        ing.start()
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while ing.log.durable_head < n:
            ing.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"memory run {kind}: {ing.log.durable_head} of {n} after {DRAIN_TIMEOUT:.0f}s")
            # Spark's commits lag the log by a batch or so: a commit that always reached the head at
            # once (as in ingest_run) would let trimming pass a recurring identity's first position
            # between two of its recurrences, and hide the leak the run is there to show
            ing.commit(max(0, ing.log.durable_head - MEMORY_LAG))
            held_max = max(held_max, len(ing._redeliveries.ids))
            rss_peak = max(rss_peak, _rss_kib())
            ing.wait_for(lambda: ing.log.durable_head >= n, 0.01)
        seconds = time.perf_counter() - t0
        ing.commit(ing.log.durable_head)
        ing.wait_for(lambda: False, 0.3)  # a few more turns of the ingest thread: it trims at each
        held_end = len(ing._redeliveries.ids)
        rss_peak = max(rss_peak, _rss_kib())
        traced_peak = tracemalloc.get_traced_memory()[1] if trace else None
        got = ing.log.durable_head
    finally:
        ing.stop()
        if trace:
            tracemalloc.stop()
        shutil.rmtree(logdir, ignore_errors=True)
    return {"messages": got, "seconds": seconds, "identities_max": held_max, "identities_end": held_end,
            "rss_growth_mib": (rss_peak - rss_before) / 1024, "rss_peak_mib": rss_peak / 1024,
            "tracemalloc_peak_mib": None if traced_peak is None else traced_peak / (1 << 20)}


def _memory_preload(url: str, queue: str, kind: str, n: int) -> None:
    from spark_mq.clients.amqp08 import BasicProperties, Connection

    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        props = BasicProperties(delivery_mode=2)  # no message_id: the identities are content hashes
        ch.publish_many(("", queue, _memory_body(kind, i), props) for i in range(n))
        deadline = time.monotonic() + 600
        while ch.queue_declare(queue, passive=True).message_count < n and time.monotonic() < deadline:
            time.sleep(0.2)


def memory_run(url: str, n: int = MEMORY_COUNT) -> dict:
    """Each kind of ``MEMORY_KINDS``, twice (resident set, then tracemalloc), each in a fresh process."""
    import json
    import subprocess
    import uuid

    figures: dict = {"messages": n, "dedupWindow": MEMORY_WINDOW, "commit_lag": MEMORY_LAG,
                     "recurring": "{} as every hundredth body"}
    for kind in MEMORY_KINDS:
        row: dict = {}
        for trace in (False, True):
            queue = f"bench-ingest-memory-{uuid.uuid4().hex[:8]}"
            _memory_preload(url, queue, kind, n)
            settle()
            done = subprocess.run([sys.executable, "-m", "bench.bench_ingest", "--memory-child", kind, url, queue,
                                   str(n), "trace" if trace else "rss"],
                                  capture_output=True, text=True, timeout=DRAIN_TIMEOUT + 120, stdin=subprocess.DEVNULL)
            if done.returncode != 0:
                raise RuntimeError(f"memory run {kind!r} failed:\n{done.stderr[-3000:]}")
            run = json.loads(done.stdout.strip().splitlines()[-1])
            if run["messages"] != n:
                raise RuntimeError(f"memory run {kind!r}: {run['messages']} of {n} logged")
            if trace:
                row["tracemalloc_peak_mib"] = run["tracemalloc_peak_mib"]
                row["seconds_traced"] = run["seconds"]
            else:
                row.update({k: v for k, v in run.items() if k != "tracemalloc_peak_mib"})
        figures[kind] = row
        print(f"memory, {n:,} messages, {kind}: identities held max {row['identities_max']:,} (end "
              f"{row['identities_end']:,}), RSS growth {row['rss_growth_mib']:.1f} MiB, tracemalloc peak "
              f"{row['tracemalloc_peak_mib']:.1f} MiB", flush=True)
    base = figures["unique"]
    for kind in MEMORY_KINDS[1:]:
        figures[kind]["against_unique"] = {
            key: round(figures[kind][key] / base[key], 3) if base[key] else None
            for key in ("identities_max", "rss_growth_mib", "tracemalloc_peak_mib")}
        print(f"memory, {kind} against unique: " + ", ".join(
            f"{k} x{v}" for k, v in figures[kind]["against_unique"].items()), flush=True)
    return figures


def memory_main(argv: list[str]) -> dict:
    brokers = harness()
    rabbit = brokers.start_rabbitmq()
    try:
        figures = memory_run(rabbit.url("amqp"))
    finally:
        rabbit._shutdown()
    write_results("ingest_memory", figures)
    return figures


def main(argv: list[str]) -> dict:
    if "--memory" in argv:
        return memory_main(argv)
    rounds = max(1, _arg(argv, "rounds", ROUNDS))
    extra = [a.split("=", 1)[1] for a in argv if a.startswith("--variant=")]
    variants = list(VARIANTS) + [v for v in extra if v not in VARIANTS]
    only = _arg(argv, "only", None, str)
    brokers = harness()
    BrokerProcess = integration_module("broker_process").BrokerProcess

    rabbit = brokers.start_rabbitmq()
    activemq = None
    if not only or any(format_of(row) == "stomp" for row in only.split(",")):
        activemq = brokers.start_activemq()
    # no mailbox journal: with one (then compacted only at start-up) two runs failed after a few GB
    # of preloads, a preload's PING unanswered for 60 s; without, the run went through
    biggest = max(COUNTS["malamute"].values())
    mlm = BrokerProcess(client_timeout=60.0, args=("--max-queue", str(biggest * 2)))
    mlm.start()
    activemq_url = f"stomp://127.0.0.1:{activemq.stomp_port}" if activemq is not None else None
    protocols = only_formats(protocol_table(rabbit.url("amqp"), rabbit.url("stomp"), mlm.endpoint, activemq_url), only)
    peers = peer_table(rabbit.url("amqp"), rabbit.url("stomp"), activemq_url)
    measured: dict = {}
    try:
        for rnd, fmt, label, size, n, name, (preload, raw, options) in pairs(protocols, COUNTS, rounds, "bench-ingest"):
            raw_s, raw_cpu = timed_drain(preload, raw, name + "-raw", n, size, f"{fmt} {label}: the raw client")
            row = {"n": n, "round": rnd + 1, "raw_seconds": raw_s, "raw_cpu": raw_cpu.seconds, "variants": {}}
            if fmt in peers:
                peer_name, peer = peers[fmt]
                peer_s, peer_cpu = timed_drain(preload, peer, name + "-peer", n, size, f"{fmt} {label}: {peer_name}")
                row.update(peer=peer_name, peer_seconds=peer_s, peer_cpu=peer_cpu.seconds)
            for variant in variants:
                queue = f"{name}-{len(row['variants'])}"
                preload(queue, n, size)
                settle()
                settings = _variant(variant)
                with _GroupOnActiveMQ(settings):
                    run = ingest_run(format_of(fmt), {**options(queue), **settings}, n)
                if run["messages"] != n:
                    raise RuntimeError(f"{fmt} {label} {variant!r}: the ingest logged {run['messages']} of {n}")
                run["ratio"] = raw_s / run["seconds"]
                if "peer_seconds" in row:
                    run["peer_ratio"] = row["peer_seconds"] / run["seconds"]
                row["variants"][variant or "defaults"] = run
                st = run["stages"]
                print(f"round {rnd + 1}: {fmt} {label} {variant or 'defaults'}: raw {raw_s:.2f}s, ingest "
                      f"{run['seconds']:.2f}s, ratio {run['ratio']:.2f}"
                      + (f", {row['peer']} {row['peer_seconds']:.2f}s, ratio {run['peer_ratio']:.2f}" if "peer" in row else "")
                      + f"; ingest thread: poll {st['poll']:.2f}s, "
                      f"append {st['append']:.2f}s, fsync {st['fsync']:.2f}s, rest {st['rest']:.2f}s; "
                      f"CPU s raw {raw_cpu.seconds}, ingest {run['cpu']}", flush=True)
            measured.setdefault((fmt, label), []).append(row)
    finally:
        mlm.stop()
        rabbit._shutdown()
        if activemq is not None:
            activemq._shutdown()
    figures: dict = {"counts": COUNTS, "rounds": rounds, "variants": [v or "defaults" for v in variants]}
    print(f"median of {rounds} round(s) by the defaults' ratio")
    print(f"{'format':9} {'size':5} {'n':>9} {'raw s':>7} " + " ".join(f"{v or 'defaults':>14}" for v in variants))
    for (fmt, label), runs in measured.items():
        median = sorted(runs, key=lambda r: r["variants"]["defaults"]["ratio"])[len(runs) // 2]
        figures[f"{fmt}_{label}"] = {**median, "round_ratios": {
            v: [round(r["variants"][v]["ratio"], 3) for r in runs] for v in median["variants"]}}
        if "peer" in median:
            figures[f"{fmt}_{label}"]["round_peer_ratios"] = {
                v: [round(r["variants"][v]["peer_ratio"], 3) for r in runs] for v in median["variants"]}
        print(f"{fmt:9} {label:5} {median['n']:9,d} {median['raw_seconds']:7.2f} "
              + " ".join(f"{median['variants'][v or 'defaults']['ratio']:14.2f}" for v in variants))
    write_results("ingest", figures, partial=bool(only) or rounds != ROUNDS or bool(extra))
    if not only or "amqp08" in only.split(","):
        memory_main(argv)
    return figures


if __name__ == "__main__":
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    if sys.argv[1:2] == ["--memory-child"]:
        import json

        kind, url, queue, n, mode = sys.argv[2:7]
        print(json.dumps(_memory_child(kind, url, queue, int(n), mode == "trace")))
    else:
        main(sys.argv[1:])
