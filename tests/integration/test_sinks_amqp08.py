"""The amqp08 sink against a private RabbitMQ with a real SparkSession; messages read back with pika.

- a 50,000-row stream (Arrow stream writer): bodies, headers and properties intact, deterministic
  unique message ids, commit log counts;
- a task failure injected mid-partition: the partial transaction is invisible, the restarted query
  replays the batch, and the ids let the consumer drop the duplicates of the partition that had committed;
- df.write (batch) and the Row stream writer (what pyspark < 4.1 uses).
"""

from __future__ import annotations

import re
import threading
import time
from collections import Counter

import pika
import pytest

from pyspark.sql import functions as F

from spark_mq.clients.amqp08 import Connection
from spark_mq.sinks import commitlog
from spark_mq.sinks.plan import COMMIT_LOG_DIR
from sinktest import run_available_now

QUERY_TIMEOUT = 240.0
READ_IDLE = 10.0  # seconds without a delivery that end a read-back
SETTLE = 1.5  # quiet seconds after the expected count that end it
PAD = "x" * 64


def declare(rabbitmq, queue: str) -> None:
    with Connection.from_url(rabbitmq.url("amqp")) as conn:
        conn.channel().queue_declare(queue)


def read_back(rabbitmq, queue: str, expected: int) -> list:
    """Every message in ``queue`` (pika, auto-ack): waits up to READ_IDLE quiet seconds for ``expected``
    messages, then keeps reading until SETTLE quiet seconds pass, so duplicates beyond it are seen too."""
    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq.url("amqp")))
    try:
        ch = conn.channel()
        out = []
        last = time.monotonic()
        for method, props, body in ch.consume(queue, auto_ack=True, inactivity_timeout=0.5):
            now = time.monotonic()
            if method is not None:
                out.append((props, body))
                last = now
            elif now - last > (SETTLE if len(out) >= expected else READ_IDLE):
                break
        ch.cancel()
        return out
    finally:
        conn.close()


def make_input(spark, path: str, n: int, files: int = 2) -> None:
    (spark.range(0, n, numPartitions=files).select(
        F.col("id"),
        F.concat(F.lit("body-"), F.col("id").cast("string"), F.lit("-" + PAD)).cast("binary").alias("body"),
        F.create_map(F.lit("seq"), F.col("id").cast("string"), F.lit("kind"), F.lit("test")).alias("headers"),
        (F.col("id") % 10).cast("int").alias("priority"),
        F.concat(F.lit("corr-"), F.col("id").cast("string")).alias("correlation_id"),
        F.lit("application/octet-stream").alias("content_type"),
        F.lit("spark-mq-test").alias("app_id"),
        F.timestamp_seconds(F.lit(1_700_000_000) + F.col("id")).alias("timestamp"),
    ).write.parquet(path))


def row_id(body: bytes) -> int:
    return int(body.split(b"-")[1])


def check_message(props, body: bytes) -> int:
    i = row_id(body)
    assert body == f"body-{i}-{PAD}".encode()
    assert props.headers == {"seq": str(i), "kind": "test"}
    assert props.priority == i % 10
    assert props.correlation_id == f"corr-{i}"
    assert props.content_type == "application/octet-stream"
    assert props.app_id == "spark-mq-test"
    assert props.timestamp == 1_700_000_000 + i
    return i


@pytest.mark.timeout(420)
def test_stream_of_50000_rows_read_back_by_pika(spark, rabbitmq, unique_name, tmp_path):
    n = 50_000
    queue = unique_name("sink")
    declare(rabbitmq, queue)
    make_input(spark, str(tmp_path / "in"), n)
    checkpoint = str(tmp_path / "ck")
    stream = spark.readStream.schema(spark.read.parquet(str(tmp_path / "in")).schema).parquet(str(tmp_path / "in"))
    query = run_available_now(
        stream.drop("id").writeStream.format("amqp08").option("uri", rabbitmq.url("amqp"))
        .option("routingKey", queue).option("checkpointLocation", checkpoint), QUERY_TIMEOUT)
    got = read_back(rabbitmq, queue, n)
    assert len(got) == n
    ids = [check_message(props, body) for props, body in got]
    assert sorted(ids) == list(range(n))
    message_ids = [props.message_id for props, _ in got]
    assert len(set(message_ids)) == n
    pattern = re.compile(rf"^{re.escape(str(query.id))}:0:[0-9a-f]{{8}}:([01]):(\d+)$")
    parts = Counter(pattern.match(m).group(1) for m in message_ids)
    assert set(parts) == {"0", "1"} and sum(parts.values()) == n
    # within a partition, the sequence numbers are 0..count-1 in publish order
    for p in ("0", "1"):
        seqs = [int(pattern.match(m).group(2)) for m in message_ids if pattern.match(m).group(1) == p]
        assert seqs == list(range(len(seqs)))
    log = commitlog.read(f"{checkpoint}/{COMMIT_LOG_DIR}")
    assert log["0"]["messages"] == n and len(log["0"]["partitions"]) == 2


@pytest.mark.timeout(420)
def test_failure_mid_partition_rolls_back_and_replay_is_deduplicable(spark, rabbitmq, unique_name, tmp_path):
    n = 12_000
    queue = unique_name("sinkfault")
    declare(rabbitmq, queue)
    make_input(spark, str(tmp_path / "in"), n)
    checkpoint = str(tmp_path / "ck")
    marker = str(tmp_path / "failed-once")
    schema = spark.read.parquet(str(tmp_path / "in")).schema

    def start():
        stream = spark.readStream.schema(schema).parquet(str(tmp_path / "in")).drop("id")
        return run_available_now(
            stream.writeStream.format("sinktest_faulty").option("fault.format", "amqp08")
            .option("fault.partition", "1").option("fault.afterRows", "4000").option("fault.marker", marker)
            .option("uri", rabbitmq.url("amqp")).option("routingKey", queue)
            .option("checkpointLocation", checkpoint), QUERY_TIMEOUT)

    with pytest.raises(Exception, match="injected task failure"):
        start()
    with open(marker, encoding="utf-8") as f:
        assert "4000" in f.read()  # the fault really fired, after 4000 rows had been published in the tx
    query = start()  # restart: batch 0 is replayed with the same batch id
    got = read_back(rabbitmq, queue, n)
    by_id = Counter(props.message_id for props, _ in got)
    pattern = re.compile(rf"^{re.escape(str(query.id))}:0:[0-9a-f]{{8}}:([01]):(\d+)$")
    assert all(pattern.match(m) for m in by_id)
    faulty = {m: c for m, c in by_id.items() if pattern.match(m).group(1) == "1"}
    other = {m: c for m, c in by_id.items() if pattern.match(m).group(1) == "0"}
    # the failed attempt's 4000 messages were rolled back: every id of partition 1 arrives exactly once
    assert set(faulty.values()) == {1}
    # partition 0 committed whole or not at all in the failed run: each of its ids arrives equally often
    assert len(set(other.values())) == 1
    # dropping duplicates by id leaves every row exactly once, with its body
    first = {}
    for props, body in got:
        first.setdefault(props.message_id, body)
    assert sorted(row_id(b) for b in first.values()) == list(range(n))
    assert commitlog.read(f"{checkpoint}/{COMMIT_LOG_DIR}")["0"]["messages"] == n


@pytest.mark.quick  # ./dev test --quick
@pytest.mark.timeout(300)
def test_batch_write_and_row_stream_writer(spark, rabbitmq, unique_name, tmp_path):
    n = 5_000
    queue = unique_name("sinkbatch")
    declare(rabbitmq, queue)
    df = spark.range(0, n, numPartitions=3).select(
        F.concat(F.lit("body-"), F.col("id").cast("string"), F.lit("-" + PAD)).alias("body"),  # string body
        F.lit(queue).alias("routing_key"), F.lit(2).alias("delivery_mode"))
    df.write.format("amqp08").mode("append").option("uri", rabbitmq.url("amqp")).save()
    got = read_back(rabbitmq, queue, n)
    assert sorted(row_id(body) for _, body in got) == list(range(n))
    assert all(props.delivery_mode == 2 for props, _ in got)
    write_ids = {props.message_id.split(":")[0] for props, _ in got}
    assert len(write_ids) == 1 and re.fullmatch(r"[0-9a-f]{32}", write_ids.pop())
    assert len({props.message_id for props, _ in got}) == n

    make_input(spark, str(tmp_path / "in"), n)
    stream = spark.readStream.schema(spark.read.parquet(str(tmp_path / "in")).schema).parquet(str(tmp_path / "in"))
    run_available_now(stream.drop("id").writeStream.format("sinktest_amqp08_rows")
                      .option("uri", rabbitmq.url("amqp")).option("routingKey", queue)
                      .option("checkpointLocation", str(tmp_path / "ck")), QUERY_TIMEOUT)
    got = read_back(rabbitmq, queue, n)
    assert sorted(check_message(props, body) for props, body in got) == list(range(n))


@pytest.mark.timeout(420)
def test_broker_memory_alarm_pauses_the_writer_instead_of_failing_it(spark, rabbitmq_isolated, tmp_path):
    """RabbitMQ's memory alarm stops reading from publishers (TCP back-pressure): the write waits, then
    completes once the alarm clears."""
    broker = rabbitmq_isolated()
    queue = "alarm.q"
    declare(broker, queue)
    n = 5_000
    df = spark.range(0, n, numPartitions=2).select(
        F.concat(F.lit("body-"), F.col("id").cast("string"), F.lit("-" + PAD)).cast("binary").alias("body"))
    paused = 15.0
    seen = {}

    def clear_alarm_later():
        time.sleep(paused)
        try:
            with Connection.from_url(broker.url("amqp")) as conn:  # declare-ok is answered during an alarm
                seen["depth"] = conn.channel().queue_declare(queue, passive=True).message_count
        finally:
            broker.ctl("set_vm_memory_high_watermark", "0.4")

    broker.ctl("set_vm_memory_high_watermark", "0")  # alarm: the broker stops reading from publishers
    helper = threading.Thread(target=clear_alarm_later, daemon=True)
    started = time.monotonic()
    helper.start()
    try:
        df.write.format("amqp08").mode("append").option("uri", broker.url("amqp")).option("routingKey", queue).save()
    finally:
        helper.join(60)
    took = time.monotonic() - started
    assert took >= paused  # the write waited for the alarm to clear...
    assert seen.get("depth") == 0  # ...with nothing committed while it lasted
    got = read_back(broker, queue, n)  # ...and then delivered everything
    assert sorted(row_id(body) for _, body in got) == list(range(n))


@pytest.mark.timeout(420)
def test_two_writes_of_one_foreach_batch_get_distinct_ids_that_a_replay_repeats(spark, rabbitmq, unique_name,
                                                                                 tmp_path):
    """Issue 43 item 6: two ``df.write`` of one micro-batch inside ``foreachBatch`` (even rows, then odd
    rows, to the same queue) both ran under the batch's ``queryId:batchId`` and took the same ids, so a
    consumer dropping repeated ids dropped the second write. Ids now differ between the writes and stay
    the same when the batch is replayed (the first run fails after both writes; the restart replays it)."""
    from pyspark.errors import StreamingQueryException

    n = 2_000
    queue = unique_name("sinkfb")
    declare(rabbitmq, queue)
    make_input(spark, str(tmp_path / "in"), n)
    stream = spark.readStream.schema(spark.read.parquet(str(tmp_path / "in")).schema).parquet(str(tmp_path / "in"))
    failed_once = tmp_path / "failed-once"
    url = rabbitmq.url("amqp")

    def both(df, batch_id):
        for parity in (0, 1):
            (df.filter(F.col("id") % 2 == parity).select("body", "headers")
             .write.format("amqp08").mode("append").option("uri", url).option("routingKey", queue).save())
        if not failed_once.exists():
            failed_once.touch()
            raise RuntimeError("injected failure after both writes of the batch")

    writer = stream.writeStream.foreachBatch(both).option("checkpointLocation", str(tmp_path / "ck"))
    with pytest.raises(StreamingQueryException, match="injected failure"):
        run_available_now(writer, QUERY_TIMEOUT)
    run_available_now(writer, QUERY_TIMEOUT)  # replays batch 0: both writes again

    got = read_back(rabbitmq, queue, 2 * n)
    assert len(got) == 2 * n
    bodies_by_id: dict = {}
    for props, body in got:
        bodies_by_id.setdefault(props.message_id, []).append(body)
    # every row has an id of its own: the two writes did not collide ...
    assert len(bodies_by_id) == n
    # ... and the replay sent each row again under the same id
    assert all(len(bodies) == 2 and bodies[0] == bodies[1] for bodies in bodies_by_id.values())
    assert sorted(row_id(bodies[0]) for bodies in bodies_by_id.values()) == list(range(n))
