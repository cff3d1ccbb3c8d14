"""A bridge's rate against the slower of its two ends, measured in the same run (issue 46).

For each pair (amqp08 -> amqp08 on RabbitMQ, stomp on RabbitMQ's STOMP plugin -> amqp08, malamute on
the embedded broker -> amqp08) and each round, three ``trigger(availableNow=True)`` queries over the
same ``N`` messages (100 B bodies by default):

- the source alone: the source's format into Spark's ``noop`` sink (drain, log, micro-batches);
- the sink alone: the same rows (the source's own schema, saved to Parquet once, not timed) from a
  Parquet stream into the sink: what the sink costs with the bridge mapping, without a broker to read;
- the bridge: the source's format straight into the sink.

Each rate is messages / wall seconds from ``start()`` to termination. The ratio is the bridge's rate
over the lower of the two others; the target is ``TARGET``. Each run's CPU seconds by process kind
(broker, jvm, reader, pyworkers, driver) are kept too: per message, they say whether the bridge costs
more than its two ends together, and ``cpu_bound_ratio`` is the ratio this machine's cores would allow
if the bridge cost exactly the sum of its ends (cores / (source + sink CPU per message), over the slower
end's rate): where that is below the target, both ends already use the cores, and only cheaper ends
can meet it. The round with the median ratio is
reported, every round kept in bench/results/bridges.json.

    python -m bench bridges                       # 3 rounds x 3 pairs x 100,000 messages
    python -m bench bridges --n=20000 --rounds=1  # a quick look (partial: no results file)
    python -m bench bridges --pairs=stomp         # the pairs whose name starts so (partial)
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

from bench.bench_sources import _arg, amqp_preload, mlm_preload, stomp_preload
from bench.common import ProcessCpu, harness, settle, integration_module, write_results

TARGET = 0.7
N = 100_000
ROUNDS = 3
BODY = 100


def _purge(url: str, queue: str) -> int:
    from spark_mq.clients.amqp08 import Connection
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        return ch.queue_purge(queue) or 0


def _depth(url: str, queue: str) -> int:
    from spark_mq.clients.amqp08 import Connection
    with Connection.from_url(url) as conn:
        return conn.channel().queue_declare(queue, passive=True).message_count


def _timed(writer) -> tuple:
    t0 = time.perf_counter()
    q = writer.trigger(availableNow=True).start()
    q.awaitTermination(1200)
    seconds = time.perf_counter() - t0
    if q.exception() is not None:
        raise RuntimeError(f"query failed: {q.exception()}")
    return sum(p["numInputRows"] for p in q.recentProgress), seconds


def _read(spark, fmt: str, options: dict, scratch: str):
    r = spark.readStream.format(fmt).option("logLocation", os.path.join(scratch, f"log-{uuid.uuid4().hex[:6]}"))
    return r.option("quietPeriod", "0.5").options(**options).load()


def _ckpt(scratch: str) -> str:
    return os.path.join(scratch, f"ckpt-{uuid.uuid4().hex[:6]}")


def run_pair(spark, name: str, preload, source_fmt: str, source_options, amqp_url: str, n: int) -> dict:
    scratch = tempfile.mkdtemp(prefix="bench-bridge-")
    out_queue = f"bench-bridge-out-{uuid.uuid4().hex[:6]}"
    sink_options = {"uri": amqp_url, "routingKey": out_queue}
    try:
        _purge(amqp_url, out_queue)
        # the rows the sink-alone run writes: the source's own rows, saved once (not timed)
        dest = f"{name}-rows-{uuid.uuid4().hex[:6]}"
        preload(dest, n, BODY)
        parquet = os.path.join(scratch, "rows")
        got, _ = _timed(_read(spark, source_fmt, source_options(dest), scratch).writeStream.format("parquet")
                        .option("path", parquet).option("checkpointLocation", _ckpt(scratch)))
        assert got == n, f"{name}: saved {got} of {n} rows"
        schema = spark.read.parquet(parquet).schema

        dest = f"{name}-src-{uuid.uuid4().hex[:6]}"
        preload(dest, n, BODY)
        settle()
        with ProcessCpu() as src_cpu:
            got_src, src_s = _timed(_read(spark, source_fmt, source_options(dest), scratch).writeStream
                                    .format("noop").option("checkpointLocation", _ckpt(scratch)))

        settle()
        with ProcessCpu() as sink_cpu:
            got_sink, sink_s = _timed(spark.readStream.schema(schema).parquet(parquet).writeStream.format("amqp08")
                                      .options(**sink_options).option("checkpointLocation", _ckpt(scratch)))
        delivered_sink = _depth(amqp_url, out_queue)
        _purge(amqp_url, out_queue)

        dest = f"{name}-bridge-{uuid.uuid4().hex[:6]}"
        preload(dest, n, BODY)
        settle()
        with ProcessCpu() as bridge_cpu:
            got_bridge, bridge_s = _timed(_read(spark, source_fmt, source_options(dest), scratch).writeStream
                                          .format("amqp08").options(**sink_options)
                                          .option("checkpointLocation", _ckpt(scratch)))
        delivered_bridge = _depth(amqp_url, out_queue)
        _purge(amqp_url, out_queue)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not (got_src == got_sink == got_bridge == n == delivered_sink == delivered_bridge):
        raise RuntimeError(f"{name}: source {got_src}, sink {got_sink} (delivered {delivered_sink}), bridge "
                           f"{got_bridge} (delivered {delivered_bridge}) of {n}: not the same work")
    src_rate, sink_rate, bridge_rate = n / src_s, n / sink_s, n / bridge_s
    return {"n": n, "source_msgs_per_s": src_rate, "sink_msgs_per_s": sink_rate, "bridge_msgs_per_s": bridge_rate,
            "ratio": bridge_rate / min(src_rate, sink_rate),
            **cpu_figures(n, src_cpu.seconds, sink_cpu.seconds, bridge_cpu.seconds, min(src_rate, sink_rate),
                          os.cpu_count() or 1)}


def cpu_figures(n: int, src: dict, sink: dict, bridge: dict, slower_rate: float, cores: int) -> dict:
    """CPU microseconds per message of each run, by process kind and in total, and the ratio the cores
    would allow a bridge that cost its two ends together (see the module docstring)."""
    def per_msg(cpu: dict) -> dict:
        return {kind: round(seconds * 1e6 / n, 1) for kind, seconds in cpu.items()}
    src_us, sink_us, bridge_us = (sum(c.values()) * 1e6 / n for c in (src, sink, bridge))
    return {"source_cpu_us_per_msg": per_msg(src), "sink_cpu_us_per_msg": per_msg(sink),
            "bridge_cpu_us_per_msg": per_msg(bridge),
            "cpu_us_per_msg": {"source": round(src_us, 1), "sink": round(sink_us, 1), "bridge": round(bridge_us, 1)},
            "cpu_bound_ratio": round(cores / ((src_us + sink_us) / 1e6) / slower_rate, 3) if src_us + sink_us else None}


def main(argv: list[str]) -> dict:
    n = _arg(argv, "n", N)
    rounds = max(1, _arg(argv, "rounds", ROUNDS))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    brokers = harness()
    BrokerProcess = integration_module("broker_process").BrokerProcess

    rabbit = brokers.start_rabbitmq()
    mlm = BrokerProcess(client_timeout=60.0, args=("--max-queue", str(max(4 * n, 100_000))))
    mlm.start()
    from pyspark.sql import SparkSession

    import spark_mq
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.python.authenticate.socketTimeout", "120s")
             .config("spark.sql.streaming.numRecentProgressUpdates", "100000").getOrCreate())  # rows come from it
    spark.sparkContext.setLogLevel("ERROR")
    spark_mq.register(spark)
    amqp_url, stomp_url = rabbit.url("amqp"), rabbit.url("stomp")
    pairs = {
        "amqp08->amqp08": (lambda d, k, s: amqp_preload(amqp_url, d, k, s), "amqp08",
                           lambda d: {"uri": amqp_url, "queue": d}),
        "stomp->amqp08": (lambda d, k, s: stomp_preload(stomp_url, "/queue/" + d, k, s), "stomp",
                          lambda d: {"uri": stomp_url, "destination": "/queue/" + d}),
        "malamute->amqp08": (lambda d, k, s: mlm_preload(mlm.endpoint, d, k, s), "malamute",
                             lambda d: {"uri": mlm.endpoint, "mailbox": d}),
    }
    only = _arg(argv, "pairs", None, str)
    if only:
        pairs = {k: v for k, v in pairs.items() if any(k.startswith(w) for w in only.split(","))}
    figures: dict = {"n": n, "body_bytes": BODY, "rounds": rounds, "target_ratio": TARGET, "pairs": {}}
    try:
        # one unmeasured small bridge per pair: Python workers started, first-query costs paid
        for pair, (preload, fmt, options) in pairs.items():
            run_pair(spark, "warm", preload, fmt, options, amqp_url, 2_000)
        for pair, (preload, fmt, options) in pairs.items():
            runs = []
            for rnd in range(rounds):
                row = run_pair(spark, f"bench-{fmt}", preload, fmt, options, amqp_url, n)
                runs.append(row)
                print(f"{pair} round {rnd + 1}: source {row['source_msgs_per_s']:,.0f}/s, sink "
                      f"{row['sink_msgs_per_s']:,.0f}/s, bridge {row['bridge_msgs_per_s']:,.0f}/s, ratio to the "
                      f"slower end {row['ratio']:.2f} (target {TARGET}); CPU us/msg {row['cpu_us_per_msg']} "
                      f"(bridge by process {row['bridge_cpu_us_per_msg']}), the cores allow at most "
                      f"{row['cpu_bound_ratio']}", flush=True)
            median = statistics.median_low([r["ratio"] for r in runs])
            chosen = next(r for r in runs if r["ratio"] == median)
            figures["pairs"][pair] = {**chosen, "rounds": runs}
            print(f"{pair}: median ratio {median:.2f} ({'meets' if median >= TARGET else 'below'} the target {TARGET})",
                  flush=True)
    finally:
        spark.stop()
        mlm.stop()
        rabbit.stop()
    figures["readme_rows"] = [
        (f"bridge {pair}", f"{n:,} x {BODY} B, availableNow, median of {rounds}",
         f"{row['bridge_msgs_per_s']:,.0f} msg/s", f"x{row['ratio']:.2f} of the slower end "
         f"(source {row['source_msgs_per_s']:,.0f}, sink {row['sink_msgs_per_s']:,.0f} msg/s)", f">= {TARGET}")
        for pair, row in figures["pairs"].items()]
    write_results("bridges", figures, partial=(n != N or rounds != ROUNDS or bool(only)))
    return figures
