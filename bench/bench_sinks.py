"""Sinks: rows per second written by each spark-mq sink from a generated DataFrame, next to the same
protocol's raw client publishing the same rows, in the same run, against the same broker.

Phases per format (amqp08 and stomp on RabbitMQ, malamute on the project's broker):
- raw: the client facade alone (one connection) publishes the N bodies with the same per-message id
  the sink adds (AMQP message-id property, STOMP id header; Malamute stream sends carry none), inside
  one transaction (AMQP tx, STOMP BEGIN/COMMIT with receipt; Malamute: sends then PING);
- batch: ``df.write.format(...)`` of a DataFrame with the same N bodies (2 partitions);
- stream: one micro-batch (trigger availableNow) reading the same rows from parquet files.
Each sink phase is timed from the action's start to its end (Spark planning and task scheduling
included; SparkSession start-up and a small warm-up write per format excluded). Every phase checks
that N messages arrived (AMQP/STOMP: queue depth; Malamute: the sink's commit record). Target: each
sink at least 0.7 of its raw client's rate.

    python -m bench sinks [--n=30000] [--size=100] [--formats=amqp08,stomp,malamute] [--rounds=1]

With --rounds=R each phase runs R times and the fastest round counts (the machine may be shared).

Brokers: SPARK_MQ_RABBITMQ_AMQP_URL / SPARK_MQ_RABBITMQ_STOMP_URL when set, else a private RabbitMQ
(tests/integration/brokers.py); the Malamute broker always runs as a private process.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from bench.common import flag_options, harness, measured, integration_module, numbered_bodies, write_results

DEFAULTS = {"n": 30000, "size": 100, "formats": "amqp08,stomp,malamute", "rounds": 1}
QUERY_TIMEOUT = 300.0
TARGET = 0.7
WARM_ROWS = 100


def _args(argv):
    return flag_options(argv, DEFAULTS)


def _bodies(n: int, size: int) -> list:
    return numbered_bodies(n, size)


# -- raw clients ---------------------------------------------------------------------------------

def raw_amqp08(url: str, queue: str, bodies: list, prefix: str) -> float:
    from spark_mq.clients.amqp08 import BasicProperties, Connection

    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.tx_select()
        with measured() as m:
            ch.publish_many(("", queue, body, BasicProperties(message_id=f"{prefix}{i}"))
                            for i, body in enumerate(bodies))
            ch.tx_commit()
    return m.wall


def raw_stomp(url: str, destination: str, bodies: list, prefix: str) -> float:
    from spark_mq.clients.stomp import StompClient
    from spark_mq.sinks.options import MESSAGE_ID_HEADER

    client = StompClient.from_uri(url).connect()
    try:
        with measured() as m:
            tx = client.begin()
            send = client.send
            for i, body in enumerate(bodies):
                send(destination, body, headers={MESSAGE_ID_HEADER: f"{prefix}{i}"}, transaction=tx)
            client.commit(tx, receipt=True, timeout=QUERY_TIMEOUT)
    finally:
        client.disconnect()
    return m.wall


def raw_malamute(endpoint: str, stream: str, bodies: list) -> float:
    from spark_mq.clients.malamute import MalamuteClient

    with MalamuteClient(endpoint, "", timeout=10.0) as client:
        client.set_producer(stream)
        with measured() as m:
            send = client.send
            for body in bodies:
                send("", body)
            client.ping(QUERY_TIMEOUT)
    return m.wall


# -- checks --------------------------------------------------------------------------------------

def _queue_depth_then_purge(amqp_url: str, queue: str, expected: int, settle: float = 30.0) -> int:
    """The queue's depth once it reaches ``expected`` or stops growing (RabbitMQ's STOMP plugin may
    answer a COMMIT receipt before every message is in the queue), then empty the queue."""
    from spark_mq.clients.amqp08 import Connection

    with Connection.from_url(amqp_url) as conn:
        ch = conn.channel()
        depth, last, deadline = -1, -2, time.monotonic() + settle
        while depth < expected and depth != last and time.monotonic() < deadline:
            last = depth
            time.sleep(0.0 if last < 0 else 0.5)
            depth = ch.queue_declare(queue, passive=True).message_count
        ch.queue_purge(queue)
    return depth


def _declare(amqp_url: str, queue: str, durable: bool = False) -> None:
    from spark_mq.clients.amqp08 import Connection

    with Connection.from_url(amqp_url) as conn:
        conn.channel().queue_declare(queue, durable=durable)


def _best(row: dict, phase: str, n: int, seconds: float, delivered) -> None:
    """Keep the fastest round of ``phase``; every round must have delivered all ``n`` messages."""
    if delivered is not None and delivered != n:
        raise AssertionError(f"{phase}: {delivered} of {n} messages arrived")
    if phase not in row or seconds < row[phase]["seconds"]:
        row[phase] = {"seconds": seconds, "rows_per_s": n / seconds, "delivered": delivered}


# -- the run -------------------------------------------------------------------------------------

def run(opts) -> dict:
    from pyspark.sql import functions as F

    from spark_mq.sinks import commitlog

    BrokerProcess = integration_module("broker_process").BrokerProcess
    sinktest = integration_module("sinktest")
    local_spark, run_available_now = sinktest.local_spark, sinktest.run_available_now

    n, size = opts["n"], opts["size"]
    formats = opts["formats"].split(",")
    work = Path(tempfile.mkdtemp(prefix="bench-sinks-"))
    rabbit = harness().rabbitmq_from_environment_or_start() if {"amqp08", "stomp"} & set(formats) else None
    malamute = BrokerProcess(client_timeout=30.0).start() if "malamute" in formats else None
    spark = local_spark("bench_sinks")
    results = {}
    try:
        bodies = _bodies(n, size)
        df = spark.range(0, n, numPartitions=2).select(
            F.rpad(F.concat(F.lpad(F.col("id").cast("string"), 8, "0"), F.lit("-")), size, "x")
            .cast("binary").alias("body"))
        inputs = str(work / "in")
        df.write.parquet(inputs)
        warm_inputs = str(work / "warm")
        df.limit(WARM_ROWS).repartition(2).write.parquet(warm_inputs)
        schema = spark.read.parquet(inputs).schema
        for fmt in formats:
            queue = f"bench.sinks.{fmt}.{uuid.uuid4().hex[:8]}"
            if fmt == "amqp08":
                target = {"uri": rabbit.url("amqp"), "routingKey": queue}
                _declare(rabbit.url("amqp"), queue)
                raw = lambda: raw_amqp08(rabbit.url("amqp"), queue, bodies, "raw:0:0:")  # noqa: E731
                check = lambda: _queue_depth_then_purge(rabbit.url("amqp"), queue, n)  # noqa: E731
            elif fmt == "stomp":
                target = {"uri": rabbit.url("stomp"), "destination": f"/queue/{queue}"}
                # /queue/<name> is the durable AMQP queue <name> on RabbitMQ
                _declare(rabbit.url("amqp"), queue, durable=True)
                raw = lambda: raw_stomp(rabbit.url("stomp"), f"/queue/{queue}", bodies, "raw:0:0:")  # noqa: E731
                check = lambda: _queue_depth_then_purge(rabbit.url("amqp"), queue, n)  # noqa: E731
            else:
                target = {"uri": malamute.endpoint, "stream": queue}
                raw = lambda: raw_malamute(malamute.endpoint, queue, bodies)  # noqa: E731
                check = None
            sink = f"sinktest_{fmt}"
            # warm-up: Python workers started, modules imported, a connection pooled per worker
            # warm-up, batch and stream: Python workers started, modules imported, a connection
            # pooled per worker, the streaming machinery's first-query costs paid
            spark.read.parquet(warm_inputs).write.format(sink).mode("append").options(**target).save()
            run_available_now(spark.readStream.schema(schema).parquet(warm_inputs).writeStream.format(sink)
                              .options(**target).option("checkpointLocation", str(work / f"warm-{fmt}")),
                              QUERY_TIMEOUT)
            if check is not None:
                check_warm = _queue_depth_then_purge(rabbit.url("amqp"), queue, 2 * WARM_ROWS)
                assert check_warm == 2 * WARM_ROWS, f"{fmt} warm-up: {check_warm} of {2 * WARM_ROWS} arrived"
            row = {}
            for rnd in range(opts["rounds"]):
                wall = raw()
                _best(row, "raw", n, wall, check() if check else None)
                with measured() as m:
                    df.write.format(sink).mode("append").options(**target).save()
                _best(row, "batch", n, m.wall, check() if check else None)
                ck = str(work / f"ck-{fmt}-{rnd}")
                with measured() as m:
                    run_available_now(spark.readStream.schema(schema).parquet(inputs).writeStream.format(sink)
                                      .options(**target).option("checkpointLocation", ck), QUERY_TIMEOUT)
                committed = commitlog.totals(str(Path(ck) / "spark-mq-sink-commits"))["messages"]
                _best(row, "stream", n, m.wall, check() if check else committed)
            row["batch_ratio"] = row["batch"]["rows_per_s"] / row["raw"]["rows_per_s"]
            row["stream_ratio"] = row["stream"]["rows_per_s"] / row["raw"]["rows_per_s"]
            results[fmt] = row
    finally:
        spark.stop()
        if malamute is not None:
            malamute.stop()
        if rabbit is not None and getattr(rabbit, "managed", False):
            rabbit.stop()
        shutil.rmtree(work, ignore_errors=True)
    return results


def main(argv):
    opts = _args(argv)
    started = time.monotonic()
    results = run(opts)
    figures = {"n": opts["n"], "size": opts["size"], "target_ratio": TARGET, "sinks": results,
               "seconds": time.monotonic() - started}
    print(f"Sinks, {opts['n']} rows of {opts['size']} bytes; rows/s (ratio = sink / raw client, target >= {TARGET})")
    print(f"{'format':9} {'raw':>10} {'batch':>10} {'ratio':>6} {'stream':>10} {'ratio':>6}")
    for fmt, row in results.items():
        print(f"{fmt:9} {row['raw']['rows_per_s']:10.0f} {row['batch']['rows_per_s']:10.0f} {row['batch_ratio']:6.2f} "
              f"{row['stream']['rows_per_s']:10.0f} {row['stream_ratio']:6.2f}")
    path = write_results("sinks", figures, partial=opts != DEFAULTS)
    if path:
        print(f"results: {path}")
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
