"""amqp08 on RabbitMQ 4 (AMQP 0-9-1), next to pika in the same run, on a quorum queue (4.x's normal case)
with persistent messages (issue 57).

Sink: N rows of ``--size`` bytes written by ``df.write.format("amqp08")`` with ``protocol=0-9-1`` in two
partitions, once with publisher confirms (``publishMode=confirm``, the default on 0-9-1) and once in
transactions (``publishMode=tx``); next to pika publishing the same bodies on one connection, once with
publisher confirms (``confirm_delivery``: pika's BlockingChannel then waits for each message's confirm, the
way pika's documentation shows it) and once in one transaction (``tx_select``, the bodies, ``tx_commit``).
Every phase checks that the queue holds N messages, then purges it.

Source: ``--source_n`` persistent messages preloaded (100,000: a query's start-up, about 2 s, is not what is
measured); pika drains them (prefetch 1000, a multiple ack every 100, as in
bench_sources); then an availableNow query of the amqp08 source with ``protocol=0-9-1`` into the noop sink
drains the same count (start to termination, Spark's planning included). Ratio: source / pika.

    python -m bench rabbitmq4 [--n=20000] [--source_n=100000] [--size=100] [--rounds=3]

Each round runs every phase once; the round with the median ratio of each pair is reported, every round's
figures are kept. The broker: the harness's private RabbitMQ 4 (tests/integration/broker_rabbitmq4.py) or
SPARK_MQ_RABBITMQ4_AMQP_URL.
"""

from __future__ import annotations

import statistics
import tempfile
import time
import uuid

from bench.common import flag_options, integration_module, measured, numbered_bodies, write_results

DEFAULTS = {"n": 20000, "source_n": 100000, "size": 100, "rounds": 3}
QUERY_TIMEOUT = 600.0


def _args(argv):
    return flag_options(argv, DEFAULTS)


def _bodies(n: int, size: int) -> list:
    return numbered_bodies(n, size)


def _channel(url: str):
    from spark_mq.clients.amqp08 import Connection

    conn = Connection.from_url(url, protocol="0-9-1")
    return conn, conn.channel()


def _declare(url: str, queue: str) -> None:
    conn, ch = _channel(url)
    with conn:
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})


def _depth_then_purge(url: str, queue: str, expected: int, settle: float = 30.0) -> int:
    conn, ch = _channel(url)
    with conn:
        depth, deadline = -1, time.monotonic() + settle
        while depth < expected and time.monotonic() < deadline:
            depth = ch.queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"}).message_count
            if depth < expected:
                time.sleep(0.2)
        ch.queue_purge(queue)
    return depth


# -- pika, the peer --------------------------------------------------------------------------------

def pika_publish(url: str, queue: str, bodies: list, mode: str) -> float:
    import pika

    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        props = pika.BasicProperties(delivery_mode=2)
        with measured() as m:
            if mode == "confirm":
                ch.confirm_delivery()
                for body in bodies:
                    ch.basic_publish("", queue, body, props)  # waits for this message's confirm
            else:
                ch.tx_select()
                for body in bodies:
                    ch.basic_publish("", queue, body, props)
                ch.tx_commit()
    finally:
        conn.close()
    return m.wall


def pika_drain(url: str, queue: str, n: int) -> tuple[int, float]:
    from bench.bench_sources import pika_peer

    return pika_peer(url, queue, n)


def preload(url: str, queue: str, bodies: list) -> None:
    from spark_mq.clients.amqp08 import BasicProperties

    conn, ch = _channel(url)
    with conn:
        ch.confirm_select()
        props = BasicProperties(delivery_mode=2)
        ch.publish_many(("", queue, body, props) for body in bodies)
        ch.wait_for_confirms(QUERY_TIMEOUT)


# -- the connector -----------------------------------------------------------------------------------

def sink_write(df, url: str, queue: str, mode: str) -> float:
    with measured() as m:
        (df.write.format("amqp08").option("uri", url).option("protocol", "0-9-1").option("publishMode", mode)
         .option("exchange", "").option("routingKey", queue).option("deliveryMode", 2).mode("append").save())
    return m.wall


def source_drain(spark, url: str, queue: str) -> tuple[int, float]:
    work = tempfile.mkdtemp(prefix="bench-r4-")
    with measured() as m:
        q = (spark.readStream.format("amqp08").option("uri", url).option("queue", queue).option("protocol", "0-9-1")
             .option("logLocation", f"{work}/log").option("quietPeriod", "0.5").load()
             .writeStream.format("noop").option("checkpointLocation", f"{work}/ckpt")
             .trigger(availableNow=True).start())
        q.awaitTermination(QUERY_TIMEOUT)
    if q.exception() is not None:
        raise RuntimeError(f"amqp08 source on RabbitMQ 4 failed: {q.exception()}")
    return sum(p["numInputRows"] for p in q.recentProgress), m.wall


def _median_round(rounds: list, key: str) -> dict:
    ratios = sorted(r[key] for r in rounds)
    median = statistics.median_low(ratios)
    return next(r for r in rounds if r[key] == median)


def _flag(ratio: float, target: float) -> str:
    return "" if ratio >= target else f" (below the target of {target})"


def _readme_rows(n: int, source_n: int, size: int, count: int, summary: dict) -> list:
    """The README's rows, from the median round of each pair."""
    median = {k: summary[k][k] for k in summary}
    sink_c, sink_t, src = summary["sink_confirm_vs_pika_confirm"], summary["sink_tx_vs_pika_tx"], summary["source_vs_pika"]
    what = "B persistent, quorum queue, AMQP 0-9-1"
    return [
        ("amqp08 sink on RabbitMQ 4 vs pika", f"{n:,} x {size} {what}, df.write: confirms / tx",
         f"{sink_c['sink_confirm_rows_per_s']:,.0f} / {sink_t['sink_tx_rows_per_s']:,.0f} rows/s",
         f"x{median['sink_confirm_vs_pika_confirm']:.2f} of pika with confirms / x{median['sink_tx_vs_pika_tx']:.2f} "
         f"of pika in a tx (median of {count} rounds; confirms x{median['sink_confirm_vs_sink_tx']:.2f} of tx)"
         + _flag(min(median["sink_confirm_vs_pika_confirm"], median["sink_tx_vs_pika_tx"]), 1.0), ">= 1.0"),
        ("amqp08 source on RabbitMQ 4 vs pika", f"{source_n:,} x {size} {what}, availableNow drain",
         f"{src['source_drain_rows_per_s']:,.0f} rows/s",
         f"x{median['source_vs_pika']:.2f} rate (median of {count} rounds)" + _flag(median["source_vs_pika"], 1.0),
         ">= 1.0"),
    ]


def run(opts) -> dict:
    from pyspark.sql import functions as F

    sinktest = integration_module("sinktest")
    broker = integration_module("broker_rabbitmq4")
    n, size, source_n = opts["n"], opts["size"], opts["source_n"]
    rabbit = broker.start_rabbitmq4()
    spark = sinktest.local_spark("bench_rabbitmq4")
    url = rabbit.url("amqp")
    rounds = []
    try:
        bodies = _bodies(n, size)
        source_bodies = _bodies(source_n, size)
        df = spark.range(0, n, numPartitions=2).select(
            F.rpad(F.concat(F.lpad(F.col("id").cast("string"), 8, "0"), F.lit("-")), size, "x")
            .cast("binary").alias("body")).cache()
        df.count()
        queue = f"bench.r4.{uuid.uuid4().hex[:8]}"
        _declare(url, queue)
        # warm-up: Python workers, modules, pooled connections, the streaming machinery's first query
        sink_write(df.limit(200), url, queue, "confirm")
        sink_write(df.limit(200), url, queue, "tx")
        source_drain(spark, url, queue)
        for rnd in range(opts["rounds"]):
            row = {"round": rnd}
            for who, mode in (("pika", "confirm"), ("pika", "tx"), ("sink", "confirm"), ("sink", "tx")):
                seconds = (pika_publish(url, queue, bodies, mode) if who == "pika"
                           else sink_write(df, url, queue, mode))
                depth = _depth_then_purge(url, queue, n)
                if depth != n:
                    raise AssertionError(f"{who} {mode}: {depth} of {n} messages in the queue")
                row[f"{who}_{mode}_rows_per_s"] = n / seconds
            preload(url, queue, source_bodies)
            got, seconds = pika_drain(url, queue, source_n)
            assert got == source_n, f"pika drained {got} of {source_n}"
            row["pika_drain_rows_per_s"] = source_n / seconds
            preload(url, queue, source_bodies)
            got, seconds = source_drain(spark, url, queue)
            assert got == source_n, f"the source drained {got} of {source_n}"
            row["source_drain_rows_per_s"] = source_n / seconds
            row["sink_confirm_vs_pika_confirm"] = row["sink_confirm_rows_per_s"] / row["pika_confirm_rows_per_s"]
            row["sink_tx_vs_pika_tx"] = row["sink_tx_rows_per_s"] / row["pika_tx_rows_per_s"]
            row["sink_confirm_vs_sink_tx"] = row["sink_confirm_rows_per_s"] / row["sink_tx_rows_per_s"]
            row["source_vs_pika"] = row["source_drain_rows_per_s"] / row["pika_drain_rows_per_s"]
            print(f"round {rnd}: " + ", ".join(f"{k} {v:,.2f}" for k, v in row.items() if k != "round"), flush=True)
            rounds.append(row)
    finally:
        spark.stop()
        if getattr(rabbit, "managed", False):
            rabbit.stop()
    keys = ("sink_confirm_vs_pika_confirm", "sink_tx_vs_pika_tx", "sink_confirm_vs_sink_tx", "source_vs_pika")
    summary = {k: _median_round(rounds, k) for k in keys}
    median = {k: summary[k][k] for k in keys}
    readme_rows = _readme_rows(n, source_n, size, len(rounds), summary)
    return {"n": n, "source_n": source_n, "size": size, "broker": "RabbitMQ 4.0.5 (quorum queue, persistent messages)",
            "median": median, "median_rounds": summary, "rounds": rounds, "readme_rows": readme_rows}


def main(argv):
    opts = _args(argv)
    results = run(opts)
    for k, v in results["median"].items():
        print(f"{k}: x{v:.2f}")
    write_results("rabbitmq4", results, partial=opts != DEFAULTS)
    return results
