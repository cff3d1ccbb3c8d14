"""Lanes: one stream source draining one preloaded queue with ``consumers`` = 1, 2 and 4, with the ingest on
the driver and on the executors, in the same run.

Why (issue 45, item 5): with N consumers a query has N lanes. With ``ingest=driver`` (the default) every
lane is an ingest thread in the driver-side reader process: the lanes' waits (the broker, the fsyncs)
overlap and their Python does not, as one process holds one interpreter lock. With ``ingest=executors``
each lane of each batch is a Spark task in a Python worker: a process of its own, so a lane costs what it
costs alone and lanes add up with the executors' cores. This measures, per placement, the throughput and
the CPU per message of the lanes' processes (the reader process; the Python workers), which should stay
flat from 1 to 4 lanes where the lanes are separate processes. On this 2-core machine the throughput is
bounded by the cores either way; docs/performance.md models throughput against executors from these costs.

For each row (amqp08 and stomp on RabbitMQ, stomp on ActiveMQ) and round: the peer library a user
would otherwise reach for (pika, stomp.py: one consumer, acking every 100) drains N messages of
100 B, then the source in each variant (``consumers`` 1, 2, 4 x ``ingest`` driver, executors; the order
turned by one each round, so a noisy minute of this shared machine does not always land on the same
variant) drains N more each, ``trigger(availableNow=True)`` into Spark's ``noop`` sink in ``local[2]``,
default options otherwise (executors: ``taskIngestTime=1s``, so the run's last batch, which finds
nothing, lasts a second). Each run's CPU seconds by process kind (``bench.common.ProcessCpu``: reader,
jvm, pyworkers, broker) are divided by N. The ActiveMQ row runs on a broker whose queues page in
``ACTIVEMQ_PAGE`` messages (``maxPageSize``; ActiveMQ's default of 200 also bounds what a consumer holds
unacknowledged, and an executor task acknowledges only at its end: docs/sources.md). stomp on RabbitMQ has no
executor rows: ``ingest=executors`` refuses it.

    python -m bench lanes                       # ~25 minutes: 3 rows x (peer + 6 variants) x 2 rounds
    python -m bench lanes --only=amqp08 --rounds=1 --n=20000 --placement=executors   # a quick check (writes nothing)

Malamute is left out: its lanes compete only for a ``service`` (mailbox lists are refused), the
benchmark's preload and peer speak to mailboxes, and ``ingest=executors`` is refused for it.
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


#: (key, consumers, placement, the process kind whose CPU is the lanes'): the driver-side lanes run in the
#: reader process; on the executors each lane's task runs in a Python worker
VARIANTS = (("1", 1, "driver", "reader"), ("2", 2, "driver", "reader"), ("4", 4, "driver", "reader"),
            ("e1", 1, "executors", "pyworkers"), ("e2", 2, "executors", "pyworkers"),
            ("e4", 4, "executors", "pyworkers"))
PLACEMENTS = {"driver": ("1", "2", "4"), "executors": ("e1", "e2", "e4")}
#: executor-side options: a task drains for at most a second (the run's last, empty batch lasts that long)
EXECUTOR_OPTIONS = {"ingest": "executors", "taskIngestTime": "1s"}
#: ActiveMQ's maxPageSize for this benchmark: the default taskMaxMessages, what one task may take
ACTIVEMQ_PAGE = 50_000


def summary(measured: dict) -> dict:
    """Per row: the peer's median rate, and per variant the median round by rate, with its rate and
    its lanes' CPU per message (the reader process's, or the Python workers') over those of 1 lane of
    the same placement (``rate_vs_1``, ``lane_cpu_vs_1``)."""
    out: dict = {}
    for row, runs in measured.items():
        fig = {"peer": runs[0]["peer"], "peer_msgs_per_s": sorted(r["peer_msgs_per_s"] for r in runs)[len(runs) // 2],
               "rounds": runs}
        for key, _, _, _ in VARIANTS:
            if all(key in r for r in runs):
                by_rate = sorted((r[key] for r in runs), key=lambda x: x["msgs_per_s"])
                fig[key] = dict(by_rate[len(by_rate) // 2])
        for keys in PLACEMENTS.values():
            if keys[0] not in fig:
                continue
            kind = next(v[3] for v in VARIANTS if v[0] == keys[0])
            one = fig[keys[0]]
            for key in keys:
                m = fig[key]
                m["lane_cpu_us_per_msg"] = m["cpu_us_per_msg"].get(kind, 0.0)
                m["rate_vs_1"] = m["msgs_per_s"] / one["msgs_per_s"]
                m["lane_cpu_vs_1"] = m["lane_cpu_us_per_msg"] / max(one["cpu_us_per_msg"].get(kind, 0.0), 1e-9)
        out[row] = fig
    return out


def readme_rows(rows: dict, n: int, rounds: int) -> list:
    out = []
    for row, fig in rows.items():
        for placement, keys in PLACEMENTS.items():
            if keys[0] not in fig:
                continue
            where = "reader" if placement == "driver" else "task"
            out.append((f"{row} source, consumers 1 / 2 / 4, ingest={placement}",
                        f"{n:,} x {BODY} B, availableNow, median of {rounds}",
                        " / ".join(f"{fig[k]['msgs_per_s']:,.0f}" for k in keys) + " msg/s",
                        "x" + " / x".join(f"{fig[k]['rate_vs_1']:.2f}" for k in keys) + f" rate, {where} CPU/msg x"
                        + " / x".join(f"{fig[k]['lane_cpu_vs_1']:.2f}" for k in keys) + " of 1 lane; 1 lane x"
                        + f"{fig[keys[0]]['msgs_per_s'] / fig['peer_msgs_per_s']:.2f} of {fig['peer']}",
                        "CPU/msg flat"))
    return out


def main(argv: list[str]) -> dict:
    rounds = max(1, _arg(argv, "rounds", ROUNDS))
    n = _arg(argv, "n", N)
    only = _arg(argv, "only", None, str)
    placements = tuple((_arg(argv, "placement", None, str) or "driver,executors").split(","))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    brokers = harness()
    rabbit = brokers.start_rabbitmq()
    activemq = None
    if not only or any(format_of(row) == "stomp" for row in only.split(",")):
        # a consumer gets at most a page (maxPageSize, 200 by default) unacknowledged from an ActiveMQ queue;
        # a task acknowledges at its end, so ingest=executors needs the page raised to a task's cap
        # (docs/sources.md, "Ingest on the executors"): the whole row, peer included, runs on that broker
        activemq = brokers.start_activemq(max_page_size=ACTIVEMQ_PAGE)
    from pyspark.sql import SparkSession

    from spark_mq.datasources import Amqp08DataSource, StompDataSource

    # recentProgress keeps the last 100 batches by default, and the rows are counted from it: an executor-side
    # run on ActiveMQ had over 500 (the cause of "read 43,800 of 200,000" in the run of 2026-11-29 11:05)
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.python.authenticate.socketTimeout", "120s")
             .config("spark.sql.streaming.numRecentProgressUpdates", "100000").getOrCreate())
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
            variants = [v for v in VARIANTS if v[2] in placements]
            order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
            for row, (preload, _raw, options) in protocols.items():
                name = f"bench-lanes-{row}-{uuid.uuid4().hex[:6]}"
                peer_name, peer = peers[row]
                peer_s, peer_cpu = timed_drain(preload, peer, name + "-peer", n, BODY, f"{row}: {peer_name}")
                runs = {"peer": peer_name, "peer_msgs_per_s": n / peer_s, "peer_cpu_us_per_msg": _per_msg(peer_cpu.seconds, n)}
                print(f"round {rnd + 1}: {row} {peer_name} {n / peer_s:,.0f} msg/s", flush=True)
                for key, lanes, placement, _ in order:
                    if placement == "executors" and row == "stomp":
                        continue  # refused: RabbitMQ's STOMP adapter (spark_mq.sources.executors)
                    queue = f"{name}-{key}"
                    preload(queue, n, BODY)
                    warm_workers(spark, row, preload, options)
                    settle()
                    extra = EXECUTOR_OPTIONS if placement == "executors" else {}
                    with ProcessCpu() as cpu:
                        got, seconds, _q, in_batches, *_ = run_source(
                            spark, format_of(row), {**options(queue), **extra, "consumers": str(lanes)},
                            tempfile.mkdtemp(prefix="bench-lanes-log-"))
                    if got != n:
                        raise RuntimeError(f"{row} consumers={lanes} ingest={placement}: the source read {got} of {n}")
                    per = _per_msg(cpu.seconds, n)
                    runs[key] = {"msgs_per_s": n / seconds, "seconds": seconds, "in_batches_seconds": in_batches,
                                 "cpu_us_per_msg": per, "peer_ratio": (n / seconds) / (n / peer_s)}
                    print(f"round {rnd + 1}: {row} consumers={lanes} ingest={placement}: {n / seconds:,.0f} msg/s "
                          f"(x{peer_s / seconds:.2f} of {peer_name}); CPU us/msg {per}", flush=True)
                measured.setdefault(row, []).append(runs)
    finally:
        spark.stop()
        rabbit._shutdown()
        if activemq is not None:
            activemq._shutdown()
    figures: dict = {"n": n, "body_bytes": BODY, "rounds": rounds, "lanes": list(LANES), "cpus": os.cpu_count(),
                     "placements": list(placements),
                     "rows": summary(measured)}
    print(f"median of {rounds} round(s) by rate, per lane count and placement (lane CPU: the reader "
          f"process's with ingest=driver, the Python workers' with ingest=executors)")
    print(f"{'row':15} {'ingest':>9} {'lanes':>5} {'msg/s':>9} {'x 1 lane':>8} {'lane us/msg':>11} {'x 1 lane':>8} "
          f"{'all us/msg':>10}")
    for row, out in figures["rows"].items():
        for key, lanes, placement, _ in VARIANTS:
            if key not in out:
                continue
            m = out[key]
            print(f"{row:15} {placement:>9} {lanes:5d} {m['msgs_per_s']:9,.0f} {m['rate_vs_1']:8.2f} "
                  f"{m['lane_cpu_us_per_msg']:11.1f} {m['lane_cpu_vs_1']:8.2f} {sum(m['cpu_us_per_msg'].values()):10.1f}")
    figures["readme_rows"] = readme_rows(figures["rows"], n, rounds)
    write_results("lanes", figures, partial=bool(only) or n != N or rounds != ROUNDS or len(placements) < 2)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
