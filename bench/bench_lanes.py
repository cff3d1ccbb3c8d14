"""Lanes: one stream source draining one preloaded queue with ``consumers`` = 1, 2 and 4, in the same run.

Why (issue 45, item 5): with N consumers a query has N lanes, each its own connection, ingest thread,
flusher and log (``spark_mq.sources.lanes``). Today every lane runs in the driver-side reader
process, so the lanes' waits (the broker, the fsyncs) overlap and their Python does not: one
process holds one interpreter lock. This measures what that gives, and the figure a model of more
processes needs: the CPU per message of the reader process (all its lanes together), which should
stay flat from 1 to 4 lanes (a lane costs what a single consumer costs; more lanes only add
threads), against the throughput, which the cores and the interpreter lock bound.

For each row (amqp08 and stomp on RabbitMQ, stomp on ActiveMQ) and round: the peer library a user
would otherwise reach for (pika, stomp.py: one consumer, acking every 100) drains N messages of
100 B, then the source with ``consumers`` = 1, 2, 4 (the order turned by one each round, so a noisy
minute of this shared machine does not always land on the same count) drains N more each,
``trigger(availableNow=True)`` into Spark's ``noop`` sink, default options otherwise. Each run's
CPU seconds by process kind (``bench.common.ProcessCpu``: reader, jvm, pyworkers, broker) are
divided by N.

    python -m bench lanes                       # ~12 minutes: 3 rows x (peer + 3 lane counts) x 2 rounds
    python -m bench lanes --only=amqp08 --rounds=1 --n=20000   # a quick check (writes nothing)

Malamute is left out: its lanes compete only for a ``service`` (mailbox lists are refused) and the
benchmark's preload and peer speak to mailboxes.
"""

from __future__ import annotations

import os
import sys
import tempfile
import uuid

from bench.bench_sources import (_arg, format_of, only_formats, peer_table, protocol_table, run_source,
                                 warm_workers)
from bench.common import ProcessCpu, harness, settle, timed_drain, write_results

ROWS = ("amqp08", "stomp", "stomp-activemq")
LANES = (1, 2, 4)
N = 200_000
BODY = 100
ROUNDS = 2


def _per_msg(cpu: dict, n: int) -> dict:
    return {kind: round(seconds / n * 1e6, 1) for kind, seconds in cpu.items()}


def summary(measured: dict) -> dict:
    """Per row: the peer's median rate, and per lane count the median round by rate, with its rate
    and its reader process's CPU per message over those of 1 lane (``rate_vs_1``, ``reader_cpu_vs_1``)."""
    out: dict = {}
    for row, runs in measured.items():
        fig = {"peer": runs[0]["peer"], "peer_msgs_per_s": sorted(r["peer_msgs_per_s"] for r in runs)[len(runs) // 2],
               "rounds": runs}
        for lanes in LANES:
            by_rate = sorted((r[str(lanes)] for r in runs), key=lambda x: x["msgs_per_s"])
            fig[str(lanes)] = dict(by_rate[len(by_rate) // 2])
        one = fig["1"]
        for lanes in LANES:
            m = fig[str(lanes)]
            m["rate_vs_1"] = m["msgs_per_s"] / one["msgs_per_s"]
            m["reader_cpu_vs_1"] = m["cpu_us_per_msg"].get("reader", 0.0) / max(one["cpu_us_per_msg"].get("reader", 0.0), 1e-9)
        out[row] = fig
    return out


def readme_rows(rows: dict, n: int, rounds: int) -> list:
    return [(f"{row} source, consumers 1 / 2 / 4", f"{n:,} x {BODY} B, availableNow, median of {rounds}",
             " / ".join(f"{out[str(k)]['msgs_per_s']:,.0f}" for k in LANES) + " msg/s",
             "x" + " / x".join(f"{out[str(k)]['rate_vs_1']:.2f}" for k in LANES) + " rate, reader CPU/msg x"
             + " / x".join(f"{out[str(k)]['reader_cpu_vs_1']:.2f}" for k in LANES) + " of 1 lane; 1 lane x"
             + f"{out['1']['msgs_per_s'] / out['peer_msgs_per_s']:.2f} of {out['peer']}",
             "CPU/msg flat")
            for row, out in rows.items()]


def main(argv: list[str]) -> dict:
    rounds = max(1, _arg(argv, "rounds", ROUNDS))
    n = _arg(argv, "n", N)
    only = _arg(argv, "only", None, str)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    brokers = harness()
    rabbit = brokers.start_rabbitmq()
    activemq = None
    if not only or any(format_of(row) == "stomp" for row in only.split(",")):
        activemq = brokers.start_activemq()
    from pyspark.sql import SparkSession

    from spark_mq.datasources import Amqp08DataSource, StompDataSource

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.python.authenticate.socketTimeout", "120s").getOrCreate())
    for ds in (Amqp08DataSource, StompDataSource):
        spark.dataSource.register(ds)
    measured: dict = {}
    try:
        amqp_url, stomp_url = rabbit.url("amqp"), rabbit.url("stomp")
        activemq_url = f"stomp://127.0.0.1:{activemq.stomp_port}" if activemq is not None else None
        table = protocol_table(amqp_url, stomp_url, "tcp://127.0.0.1:1", activemq_url)
        protocols = only_formats({row: table[row] for row in ROWS if row in table}, only)
        peers = peer_table(amqp_url, stomp_url, activemq_url)
        for row, (preload, _raw, options) in protocols.items():
            warm_workers(spark, row, preload, options)
        for rnd in range(rounds):
            order = LANES[rnd % len(LANES):] + LANES[:rnd % len(LANES)]
            for row, (preload, _raw, options) in protocols.items():
                name = f"bench-lanes-{row}-{uuid.uuid4().hex[:6]}"
                peer_name, peer = peers[row]
                peer_s, peer_cpu = timed_drain(preload, peer, name + "-peer", n, BODY, f"{row}: {peer_name}")
                runs = {"peer": peer_name, "peer_msgs_per_s": n / peer_s, "peer_cpu_us_per_msg": _per_msg(peer_cpu.seconds, n)}
                print(f"round {rnd + 1}: {row} {peer_name} {n / peer_s:,.0f} msg/s", flush=True)
                for lanes in order:
                    queue = f"{name}-{lanes}"
                    preload(queue, n, BODY)
                    warm_workers(spark, row, preload, options)
                    settle()
                    with ProcessCpu() as cpu:
                        got, seconds, _q, in_batches, *_ = run_source(
                            spark, format_of(row), {**options(queue), "consumers": str(lanes)},
                            tempfile.mkdtemp(prefix="bench-lanes-log-"))
                    if got != n:
                        raise RuntimeError(f"{row} consumers={lanes}: the source read {got} of {n}")
                    per = _per_msg(cpu.seconds, n)
                    runs[str(lanes)] = {"msgs_per_s": n / seconds, "seconds": seconds, "in_batches_seconds": in_batches,
                                        "cpu_us_per_msg": per, "peer_ratio": (n / seconds) / (n / peer_s)}
                    print(f"round {rnd + 1}: {row} consumers={lanes}: {n / seconds:,.0f} msg/s "
                          f"(x{peer_s / seconds:.2f} of {peer_name}); CPU us/msg {per}", flush=True)
                measured.setdefault(row, []).append(runs)
    finally:
        spark.stop()
        rabbit._shutdown()
        if activemq is not None:
            activemq._shutdown()
    figures: dict = {"n": n, "body_bytes": BODY, "rounds": rounds, "lanes": list(LANES), "cpus": os.cpu_count(),
                     "rows": summary(measured)}
    print(f"median of {rounds} round(s) by rate, per lane count")
    print(f"{'row':15} {'lanes':>5} {'msg/s':>9} {'x 1 lane':>8} {'reader us/msg':>13} {'x 1 lane':>8} {'all us/msg':>10}")
    for row, out in figures["rows"].items():
        for lanes in LANES:
            m = out[str(lanes)]
            print(f"{row:15} {lanes:5d} {m['msgs_per_s']:9,.0f} {m['rate_vs_1']:8.2f} "
                  f"{m['cpu_us_per_msg'].get('reader', 0.0):13.1f} {m['reader_cpu_vs_1']:8.2f} "
                  f"{sum(m['cpu_us_per_msg'].values()):10.1f}")
    figures["readme_rows"] = readme_rows(figures["rows"], n, rounds)
    write_results("lanes", figures, partial=bool(only) or n != N or rounds != ROUNDS)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
