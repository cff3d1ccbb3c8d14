"""The amqp08 source end to end: a real SparkSession (local[2]) and the real RabbitMQ of the harness.

One SparkSession for the module; every query has a timeout; every wait is bounded.
"""

from __future__ import annotations

import os
import sys
import time

import pyarrow as pa
import pytest

from spark_mq.clients.amqp08 import BasicProperties, Connection
from spark_mq.sources.amqp08 import Amqp08DataSource

pytestmark = pytest.mark.integration

QUERY_TIMEOUT = 180  # seconds any single query may take here


@pytest.fixture(scope="module")
def spark():
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("spark-mq-test-sources-amqp08")
               .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
               .config("spark.sql.streaming.stopTimeout", "30s").getOrCreate())
    session.dataSource.register(Amqp08DataSource)
    yield session
    session.stop()


def publish(url: str, queue: str, count: int, *, start: int = 0, size: int = 0, props=None) -> None:
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        pad = b"x" * size
        ch.publish_many(("", queue, f"m{i}".encode() + pad,
                         props(i) if props else BasicProperties(message_id=f"id{i}", delivery_mode=2))
                        for i in range(start, start + count))
        ch.queue_declare(queue, passive=True)  # a round trip: everything before it reached the broker


def depth(url: str, queue: str) -> int:
    with Connection.from_url(url) as conn:
        return conn.channel().queue_declare(queue, passive=True).message_count


def reader(spark, url, queue, log, **opts):
    r = (spark.readStream.format("amqp08").option("uri", url).option("queue", queue)
         .option("logLocation", str(log)).option("quietPeriod", "0.5"))
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def run_available_now(df, name, ckpt, **writer_opts):
    q = (df.writeStream.format("memory").queryName(name).option("checkpointLocation", str(ckpt))
         .trigger(availableNow=True).start())
    finished = q.awaitTermination(QUERY_TIMEOUT)
    if not finished:
        q.stop()
        pytest.fail(f"query {name} did not finish within {QUERY_TIMEOUT}s")
    if q.exception() is not None:
        raise AssertionError(f"query {name} failed: {q.exception()}")
    return q


def test_available_now_exactly_once_with_properties(spark, rabbitmq, unique_name, tmp_path):
    url = rabbitmq.url("amqp")
    queue = unique_name("src")

    def props(i):
        return BasicProperties(message_id=f"id{i}", timestamp=1_700_000_000 + i, content_type="text/plain",
                               headers={"n": i, "s": "v", "b": b"raw"}, priority=i % 10, correlation_id=f"c{i}",
                               reply_to="r", type="t", app_id="app", delivery_mode=2)

    publish(url, queue, 2000, props=props)
    df = reader(spark, url, queue, tmp_path / "log", numPartitions=3)
    q = run_available_now(df, "amqp_once", tmp_path / "ckpt")
    rows = spark.sql("select * from amqp_once order by offset").collect()
    assert [r.body for r in rows] == [f"m{i}".encode() for i in range(2000)]
    assert [r.offset for r in rows] == list(range(2000))
    r = rows[7]
    assert r.message_id == "id7" and r.destination == queue and r.redelivered is False
    assert dict(r.headers) == {"n": "7", "s": "v", "b": "raw"}
    assert r.timestamp.timestamp() == 1_700_000_007
    assert (r.content_type, r.priority, r.correlation_id, r.reply_to, r.type, r.app_id, r.delivery_mode) == \
        ("text/plain", 7, "c7", "r", "t", "app", 2)
    assert r.exchange == "" and r.routing_key == queue and r.delivery_tag > 0
    assert depth(url, queue) == 0  # durable mode acked everything
    progress = q.lastProgress
    assert progress is not None and "logHead" in progress["sources"][0]["latestOffset"]
