"""The stomp sink against RabbitMQ's STOMP plugin and ActiveMQ with a real SparkSession; messages read
back with stomp.py (an independent client).

- a 50,000-row stream: bodies and headers intact, the deterministic id header unique per message;
- a task failure injected mid-partition: ABORT leaves nothing of the partial transaction, the restarted
  query replays the batch and the id header lets the consumer drop the duplicates.
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from urllib.parse import urlsplit

import pytest
import stomp as stomppy
from pyspark.sql import functions as F

from spark_mq.sinks import commitlog
from spark_mq.sinks.options import MESSAGE_ID_HEADER
from spark_mq.sinks.plan import COMMIT_LOG_DIR
from sinktest import run_available_now

QUERY_TIMEOUT = 240.0
READ_IDLE = 10.0
SETTLE = 1.5
PAD = "y" * 64


class Collector(stomppy.ConnectionListener):
    def __init__(self) -> None:
        self.frames: list = []
        self.errors: list = []
        self.changed = threading.Condition()

    def on_message(self, frame) -> None:
        with self.changed:
            self.frames.append((frame.headers, frame.body))
            self.changed.notify_all()

    def on_error(self, frame) -> None:
        self.errors.append(frame.body)


def read_back(broker, destination: str, expected: int) -> list:
    """Every message on ``destination`` (stomp.py, ack auto), as (headers, body bytes)."""
    url = urlsplit(broker.url("stomp"))
    conn = stomppy.Connection([(url.hostname, url.port)], auto_decode=False, heartbeats=(0, 0))
    listener = Collector()
    conn.set_listener("collector", listener)
    conn.connect(broker.user, broker.password, wait=True)
    try:
        conn.subscribe(destination, id="1", ack="auto")
        last_count, last_change = 0, time.monotonic()
        while True:
            with listener.changed:
                listener.changed.wait(0.5)
                count = len(listener.frames)
            now = time.monotonic()
            if count != last_count:
                last_count, last_change = count, now
            elif now - last_change > (SETTLE if count >= expected else READ_IDLE):
                break
        assert not listener.errors, listener.errors
        return list(listener.frames)
    finally:
        conn.disconnect()


def make_input(spark, path: str, n: int, files: int = 2) -> None:
    (spark.range(0, n, numPartitions=files).select(
        F.concat(F.lit("body-"), F.col("id").cast("string"), F.lit("-" + PAD)).cast("binary").alias("body"),
        F.create_map(F.lit("seq"), F.col("id").cast("string"), F.lit("kind"), F.lit("test")).alias("headers"),
    ).write.parquet(path))


def row_id(body: bytes) -> int:
    return int(body.split(b"-")[1])


def stream_to(spark, broker, path: str, destination: str, checkpoint: str, fmt: str = "stomp", **options):
    schema = spark.read.parquet(path).schema
    writer = (spark.readStream.schema(schema).parquet(path).writeStream.format(fmt)
              .option("uri", broker.url("stomp")).option("destination", destination)
              .option("checkpointLocation", checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    return run_available_now(writer, QUERY_TIMEOUT)


@pytest.mark.timeout(420)
def test_stream_of_50000_rows_read_back_by_stomp_py(spark, stomp_broker, unique_name, tmp_path):
    n = 50_000
    destination = "/queue/" + unique_name("sink")
    # 4 partitions: at most two transactions of 12,500 messages open at once (local[2]), which a broker
    # holds in memory until COMMIT (ActiveMQ's 512 MB test heap is not generous)
    make_input(spark, str(tmp_path / "in"), n, files=4)
    checkpoint = str(tmp_path / "ck")
    query = stream_to(spark, stomp_broker, str(tmp_path / "in"), destination, checkpoint)
    got = read_back(stomp_broker, destination, n)
    assert len(got) == n
    pattern = re.compile(rf"^{re.escape(str(query.id))}:0:[0-9a-f]{{8}}:([0-3]):(\d+)$")
    ids = []
    for headers, body in got:
        i = row_id(body)
        assert body == f"body-{i}-{PAD}".encode()
        assert headers["seq"] == str(i) and headers["kind"] == "test"
        assert pattern.match(headers[MESSAGE_ID_HEADER]), headers
        ids.append(i)
    assert sorted(ids) == list(range(n))
    assert len({h[MESSAGE_ID_HEADER] for h, _ in got}) == n
    assert commitlog.read(f"{checkpoint}/{COMMIT_LOG_DIR}")["0"]["messages"] == n


@pytest.mark.timeout(420)
def test_failure_mid_partition_is_aborted_and_replay_is_deduplicable(spark, stomp_broker, unique_name, tmp_path):
    n = 12_000
    destination = "/queue/" + unique_name("sinkfault")
    make_input(spark, str(tmp_path / "in"), n)
    checkpoint = str(tmp_path / "ck")
    marker = str(tmp_path / "failed-once")
    fault = {"fault.format": "stomp", "fault.partition": "1", "fault.afterRows": "4000", "fault.marker": marker}
    with pytest.raises(Exception, match="injected task failure"):
        stream_to(spark, stomp_broker, str(tmp_path / "in"), destination, checkpoint, "sinktest_faulty", **fault)
    with open(marker, encoding="utf-8") as f:
        assert "4000" in f.read()  # the fault fired after 4000 rows were sent inside the open transaction
    query = stream_to(spark, stomp_broker, str(tmp_path / "in"), destination, checkpoint, "sinktest_faulty", **fault)
    got = read_back(stomp_broker, destination, n)
    by_id = Counter(h[MESSAGE_ID_HEADER] for h, _ in got)
    pattern = re.compile(rf"^{re.escape(str(query.id))}:0:[0-9a-f]{{8}}:([01]):(\d+)$")
    assert all(pattern.match(m) for m in by_id)
    faulty = [c for m, c in by_id.items() if pattern.match(m).group(1) == "1"]
    other = [c for m, c in by_id.items() if pattern.match(m).group(1) == "0"]
    assert len(faulty) == n // 2 and set(faulty) == {1}  # the aborted 4000 never showed up
    assert len(other) == n // 2 and len(set(other)) == 1  # the other partition: whole or not at all
    first = {}
    for headers, body in got:
        first.setdefault(headers[MESSAGE_ID_HEADER], body)
    assert sorted(row_id(b) for b in first.values()) == list(range(n))


@pytest.mark.parametrize("how", ["batch", "stream"])
def test_rows_written_to_rabbitmq_survive_a_broker_crash_right_after(spark, rabbitmq_isolated, unique_name, tmp_path, how):
    """A write that returned is on disk: RabbitMQ is SIGKILLed the moment ``df.write`` (or a streaming
    batch) returns, started again, and still holds every row. Its STOMP adapter answers a COMMIT's
    receipt before the messages are on disk; the sink also waits for a receipt on the transaction's
    last SEND, which comes once the broker has confirmed it. This test passed before that too: Spark
    takes longer from a task's COMMIT to returning than RabbitMQ takes to write (the gap is a fraction
    of a second); the client test below kills the broker inside it."""
    from spark_mq.clients.amqp08 import Connection

    broker = rabbitmq_isolated()
    n = 20_000
    queue = unique_name("crash")
    with Connection.from_url(broker.url("amqp")) as conn:
        conn.channel().queue_declare(queue, durable=True)
    df = spark.range(n).select(F.format_string("m%d", "id").alias("body"))
    options = {"uri": broker.url("stomp"), "destination": "/queue/" + queue, "persistent": "true"}
    if how == "batch":
        df.coalesce(2).write.format("stomp").options(**options).mode("append").save()
    else:
        src = str(tmp_path / "in")
        df.coalesce(2).write.parquet(src)
        run_available_now(spark.readStream.schema(df.schema).parquet(src).writeStream.format("stomp")
                          .options(**options).option("checkpointLocation", str(tmp_path / "ckpt")), 300)
    broker.kill()
    broker.restart()
    with Connection.from_url(broker.url("amqp")) as conn:
        depth = conn.channel().queue_declare(queue, durable=True).message_count
    assert depth == n, f"{n - depth} of {n} rows written before the crash are gone"


def test_send_and_commit_returns_once_rabbitmq_has_the_transaction_on_disk(rabbitmq_isolated, unique_name):
    """What the sink's commit rests on, at the moment that matters: RabbitMQ SIGKILLed the instant
    ``send_and_commit`` returns keeps all 20,000 persistent messages of the transaction. With a plain
    ``commit`` (the COMMIT's receipt only) a probe kept 0 of 20,000, twice."""
    from spark_mq.clients.amqp08 import Connection
    from spark_mq.clients.stomp import StompClient

    broker = rabbitmq_isolated()
    n = 20_000
    queue = unique_name("tx-disk")
    with Connection.from_url(broker.url("amqp")) as conn:
        conn.channel().queue_declare(queue, durable=True)
    client = StompClient.from_uri(broker.url("stomp"), timeout=60).connect()
    tx = client.begin()
    persistent = {"persistent": "true"}
    for i in range(n - 1):
        client.send("/queue/" + queue, b"m%d" % i, headers=persistent, transaction=tx)
    client.send_and_commit(tx, "/queue/" + queue, b"m%d" % (n - 1), headers=persistent, timeout=60)
    broker.kill()
    broker.restart()
    with Connection.from_url(broker.url("amqp")) as conn:
        depth = conn.channel().queue_declare(queue, durable=True).message_count
    assert depth == n, f"{n - depth} of {n} committed messages are gone after the crash"
