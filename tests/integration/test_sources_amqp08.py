"""The amqp08 source end to end: a real SparkSession (local[2]) and the real RabbitMQ of the harness.

One SparkSession for the module; every query has a timeout; every wait is bounded.
"""

from __future__ import annotations

import json
import os
import time

import pyarrow as pa
import pytest

from spark_mq.clients.amqp08 import BasicProperties, Connection
from sinktest import run_available_now as run_to_end

pytestmark = pytest.mark.integration

QUERY_TIMEOUT = 180  # seconds any single query may take here



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


def run_available_now(df, name, ckpt):
    """An availableNow query from ``df`` into the memory table ``name``, run to its end."""
    return run_to_end(df.writeStream.format("memory").queryName(name).option("checkpointLocation", str(ckpt)),
                      QUERY_TIMEOUT)


@pytest.mark.quick  # ./dev test --quick
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
    figures = source_figures(q)
    assert figures["logHead"] == 2000 and figures["consumed"] == 2000
    assert figures["brokerQueueDepth"] == 0 and figures["reconnects"] == 0


def test_property_values_a_column_cannot_hold_do_not_stop_the_query(spark, rabbitmq, unique_name, tmp_path):
    """A timestamp of 2**64-1 seconds (no int64 of microseconds holds it) and a type that is not
    UTF-8 arrive as null and U+FFFD: before, the group failed, the query with it, and the broker
    redelivered the message into the same failure after every restart."""
    url = rabbitmq.url("amqp")
    queue = unique_name("odd")

    def props(i):
        if i == 0:
            return BasicProperties(message_id="id0", timestamp=2**64 - 1, type="t\udcff", delivery_mode=2)
        return BasicProperties(message_id=f"id{i}", timestamp=1_700_000_000, delivery_mode=2)

    publish(url, queue, 3, props=props)
    run_available_now(reader(spark, url, queue, tmp_path / "log"), "amqp_odd", tmp_path / "ckpt")
    rows = spark.sql("select body, timestamp, type from amqp_odd order by offset").collect()
    assert [r.body for r in rows] == [b"m0", b"m1", b"m2"]
    assert rows[0].timestamp is None and rows[0].type == "t\ufffd"
    assert rows[1].timestamp.timestamp() == 1_700_000_000 and rows[1].type is None


def wait_rows(spark, table: str, count: int, timeout: float = QUERY_TIMEOUT) -> int:
    deadline = time.monotonic() + timeout
    n = 0
    while time.monotonic() < deadline:
        n = spark.sql(f"select count(*) from {table}").collect()[0][0]
        if n >= count:
            return n
        time.sleep(0.5)
    return n


def test_50k_streaming_exactly_once_ordered_per_partition_with_limits(spark, rabbitmq, unique_name, tmp_path):
    url = rabbitmq.url("amqp")
    queue = unique_name("src")
    publish(url, queue, 50_000)
    seen: dict = {}  # batch id -> each partition's (offset, message id) in the order its task read them

    def collect(batch_df, batch_id):
        seen[batch_id] = batch_df.select("offset", "message_id").rdd.mapPartitions(
            lambda it: [[(r.offset, r.message_id) for r in it]]).collect()

    df = reader(spark, url, queue, tmp_path / "log", numPartitions=2, maxMessagesPerTrigger=12_000)
    q = (df.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT
        while sum(len(p) for parts in list(seen.values()) for p in parts) < 50_000 and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.5)
        time.sleep(1.0)  # a few more triggers: nothing more may arrive
        progress = q.recentProgress
    finally:
        q.stop()
    parts = [p for _, batch in sorted(seen.items()) for p in batch if p]
    rows = [row for p in parts for row in p]
    assert len(rows) == 50_000  # exactly once: nothing lost, nothing twice ...
    assert sorted(o for o, _ in rows) == list(range(50_000))
    assert {m for _, m in rows} == {f"id{i}" for i in range(50_000)}
    for p in parts:  # ... and each partition in the broker's order: contiguous offsets, message i at offset i
        offsets = [o for o, _ in p]
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
        assert [m for _, m in p] == [f"id{o}" for o in offsets]
    assert any(sum(1 for p in batch if p) > 1 for batch in seen.values())  # numPartitions=2 split batches
    per_batch = [p["numInputRows"] for p in progress if p["numInputRows"]]
    assert per_batch and max(per_batch) <= 12_000, per_batch
    assert len(per_batch) >= 5
    assert depth(url, queue) == 0


def test_rows_within_a_partition_keep_broker_order(spark, rabbitmq, unique_name, tmp_path):
    url = rabbitmq.url("amqp")
    queue = unique_name("src")
    publish(url, queue, 3000)
    seen = []

    def collect(batch_df, batch_id):
        parts = batch_df.rdd.mapPartitions(lambda it: [[(r.offset, r.body) for r in it]]).collect()
        seen.append(parts)

    df = reader(spark, url, queue, tmp_path / "log", numPartitions=3)
    q = (df.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(availableNow=True).start())
    assert q.awaitTermination(QUERY_TIMEOUT)
    assert q.exception() is None
    parts = [p for batch in seen for p in batch if p]
    assert sum(len(p) for p in parts) == 3000
    assert any(sum(1 for p in batch if p) > 1 for batch in seen)  # numPartitions > 1 really split a batch
    for p in parts:
        offsets = [o for o, _ in p]
        assert offsets == sorted(offsets) and offsets == list(range(offsets[0], offsets[0] + len(offsets)))
        assert [b for _, b in p] == [f"m{o}".encode() for o in offsets]


def source_figures(q) -> dict:
    """The backlog figures reportLatestOffset published (shown in lastProgress as JSON text)."""
    value = q.lastProgress["sources"][0]["latestOffset"]
    return json.loads(value) if isinstance(value, str) else value


def run_to_parquet(df, out, ckpt, once=False):
    trigger = {"once": True} if once else {"availableNow": True}
    q = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(ckpt))
         .trigger(**trigger).start())
    if not q.awaitTermination(QUERY_TIMEOUT):
        q.stop()
        pytest.fail(f"query did not finish within {QUERY_TIMEOUT}s")
    if q.exception() is not None:
        raise AssertionError(f"query failed: {q.exception()}")
    return q


def test_commit_mode_restart_redeliveries_are_dropped(spark, rabbitmq, unique_name, tmp_path):
    """ackMode=commit acks a batch once Spark has committed it. A ``once`` run ends right after its
    single batch, before anything is acked: the next run gets every delivery of the first run again
    and drops those the log already holds. An availableNow run asks once more after its last batch,
    which acks that batch too: the run after it gets no redeliveries."""
    url = rabbitmq.url("amqp")
    queue = unique_name("src")
    publish(url, queue, 3000)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    opts = dict(ackMode="commit", prefetch=2000)
    run_to_parquet(reader(spark, url, queue, tmp_path / "log", **opts), out, ckpt, once=True)
    first = spark.read.parquet(str(out)).collect()
    assert 0 < len(first) <= 2000  # at most the prefetch: nothing is acked before Spark commits
    publish(url, queue, 500, start=3000)
    q = run_to_parquet(reader(spark, url, queue, tmp_path / "log", **opts), out, ckpt)
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.body for r in rows) == sorted(f"m{i}".encode() for i in range(3500))
    figures = source_figures(q)
    assert figures["duplicatesDropped"] > 0 and figures["redeliveries"] > 0, figures
    q = run_to_parquet(reader(spark, url, queue, tmp_path / "log", **opts), out, ckpt)
    assert spark.read.parquet(str(out)).count() == 3500
    figures = source_figures(q)
    assert figures["consumed"] == 0, figures  # nothing came back: the run before acked its last batch
    assert depth(url, queue) == 0


def test_commit_mode_acks_redeliveries_of_a_committed_batch_without_new_data(spark, rabbitmq, unique_name, tmp_path):
    """A ``once`` run ends before its batch is acked; the next run's first offset call commits that
    batch (Spark has it in its commit log) and starts the ingest, which connects after that, and
    then the broker redelivers the batch. With no new data no later commit comes: the dropped
    redeliveries must be acked at once, or they stay unacked (a full prefetch of them stalls the
    queue), and once the log is committed a third run would take them again as new messages. (A
    second run with availableNow starts its ingest earlier, in prepareForTriggerAvailableNow, so the
    redeliveries usually come before that commit, which then acks them: ``once`` shows the case.)"""
    url = rabbitmq.url("amqp")
    queue = unique_name("src")
    publish(url, queue, 500)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    opts = dict(ackMode="commit")
    run_to_parquet(reader(spark, url, queue, tmp_path / "log", **opts), out, ckpt, once=True)
    assert spark.read.parquet(str(out)).count() == 500
    assert depth(url, queue) == 500  # the once run acked nothing: all back in the queue
    q = run_to_parquet(reader(spark, url, queue, tmp_path / "log", **opts), out, ckpt, once=True)
    figures = source_figures(q)
    assert figures["duplicatesDropped"] == 500, figures
    assert depth(url, queue) == 0, "the redeliveries of a committed batch were not acknowledged"
    q = run_to_parquet(reader(spark, url, queue, tmp_path / "log", **opts), out, ckpt)
    assert source_figures(q)["consumed"] == 0
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.body for r in rows) == sorted(f"m{i}".encode() for i in range(500))


def test_auto_mode_and_read_limit_by_bytes(spark, rabbitmq, unique_name, tmp_path):
    url = rabbitmq.url("amqp")
    queue = unique_name("src")
    publish(url, queue, 2000, size=1000)
    df = reader(spark, url, queue, tmp_path / "log", ackMode="auto", maxBytesPerTrigger="200k")
    q = run_available_now(df, "amqp_auto", tmp_path / "ckpt")
    rows = spark.sql("select offset, body from amqp_auto").collect()
    assert sorted(r.offset for r in rows) == list(range(2000))  # each once: no duplicate rows either
    assert sorted(r.body for r in rows) == sorted(f"m{i}".encode() + b"x" * 1000 for i in range(2000))
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    # bodies are 1002..1005 bytes ("m0".."m1999" + 1000): 200 KiB holds at most 204 of them, at least 203
    assert max(sizes) <= (200 << 10) // 1002 and min(sizes[:-1]) >= (200 << 10) // 1005 and len(sizes) >= 9, sizes
    assert depth(url, queue) == 0


def test_batch_read_drains_up_to_a_limit_and_acks(spark, rabbitmq, unique_name):
    url = rabbitmq.url("amqp")
    queue = unique_name("src")
    publish(url, queue, 500)
    df = (spark.read.format("amqp08").option("uri", url).option("queue", queue).option("maxMessages", "300")
          .option("quietPeriod", "0.5").load())
    assert df.count() == 300
    assert df.count() == 300  # the DataFrame holds its data: a second action reads the same
    assert sorted(r.body for r in df.collect()) == sorted(f"m{i}".encode() for i in range(300))
    assert depth(url, queue) == 200


def test_bad_options_fail_at_load_naming_them(spark, rabbitmq):
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JJavaError

    url = rabbitmq.url("amqp", password="pw-7c1e")
    with pytest.raises((PySparkException, Py4JJavaError, Exception)) as info:
        spark.readStream.format("amqp08").option("uri", url).option("queue", "q").option("ackmod", "auto") \
            .option("logLocation", "/tmp/x").load()
    text = str(info.value)
    assert "ackmod" in text and "ackMode" in text
    assert "pw-7c1e" not in text
    with pytest.raises(Exception, match="needs option 'queue'"):
        spark.readStream.format("amqp08").option("uri", url).option("logLocation", "/tmp/x").load()


def test_log_is_cleaned_up_after_the_next_commit(spark, rabbitmq, unique_name, tmp_path):
    url = rabbitmq.url("amqp")
    queue = unique_name("src")
    publish(url, queue, 1000)
    log = tmp_path / "log"
    df = reader(spark, url, queue, log, segmentBytes="20k")
    q = (df.writeStream.format("memory").queryName("amqp_clean").option("checkpointLocation", str(tmp_path / "ckpt"))
         .trigger(processingTime="200 milliseconds").start())
    try:
        assert wait_rows(spark, "amqp_clean", 1000) == 1000
        publish(url, queue, 1, start=1000)  # one more batch: its planning commits the previous one
        assert wait_rows(spark, "amqp_clean", 1001) == 1001
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            held = [f for f in os.listdir(log) if f.endswith(".arrow")]
            # only the segment(s) holding offset 1000 (not committed yet) may remain
            starts = sorted(int(f[4:24]) for f in held)
            if starts and starts[0] >= 1000 or (len(starts) == 1):
                break
            time.sleep(0.3)
    finally:
        q.stop()
    held = sorted(f for f in os.listdir(log) if f.endswith(".arrow"))
    assert len(held) == 1, held  # the 1000 committed messages' segments are gone
    table = pa.ipc.open_stream(pa.OSFile(str(log / held[0]))).read_all()
    assert table.column("offset").to_pylist() in ([1000], [])


def test_declare_create_binds_with_queue_arguments_and_a_dead_first_host_is_skipped(
        spark, rabbitmq, unique_name, tmp_path):
    """``declare=create``: the source declares its queue durable with ``queueArguments``, declares the
    exchange (``exchangeType``) and binds them with ``routingKey``; the ``uri`` list's first host
    refuses connections (nothing listens there), so the source connects through the second."""
    from broker_process import free_tcp_port

    url = rabbitmq.url("amqp")
    dead = f"amqp://guest:guest@127.0.0.1:{free_tcp_port()}/%2F"
    queue, exchange = unique_name("declared"), unique_name("ex")
    df = reader(spark, f"{dead},{url}", queue, tmp_path / "log", declare="create", exchange=exchange,
                exchangeType="topic", routingKey="orders.#", queueArguments=json.dumps({"x-max-length": 5}))
    first = run_available_now(df, "amqp_declared_empty", tmp_path / "ckpt")  # declares, finds nothing yet
    first.stop()
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, passive=True)       # the source declared it...
        for i in range(10):                         # ... bound to the exchange by the pattern; x-max-length
            ch.basic_publish(exchange, f"orders.eu.{i}", f"m{i}".encode())  # keeps the newest 5
        ch.basic_publish(exchange, "other.key", b"not routed")
        ch.queue_declare(queue, passive=True)       # a round trip: the publishes reached the broker
    df = reader(spark, f"{dead},{url}", queue, tmp_path / "log", declare="create", exchange=exchange,
                exchangeType="topic", routingKey="orders.#", queueArguments=json.dumps({"x-max-length": 5}))
    run_available_now(df, "amqp_declared", tmp_path / "ckpt2")  # a memory sink starts afresh
    rows = spark.sql("select body, exchange, routing_key from amqp_declared").collect()
    assert sorted(bytes(r.body) for r in rows) == [f"m{i}".encode() for i in range(5, 10)]
    assert {r.exchange for r in rows} == {exchange}
    assert sorted(r.routing_key for r in rows) == [f"orders.eu.{i}" for i in range(5, 10)]


@pytest.mark.parametrize("dedup_by_id,expected", [(None, ["m0", "m1", "m2", "other"]), ("true", ["m0", "other"])])
def test_first_deliveries_sharing_a_message_id_are_kept_unless_dedup_by_id(spark, rabbitmq, unique_name, tmp_path,
                                                                            dedup_by_id, expected):
    """Issue 43, item 5: business keys used as message ids (three events of one order) are three
    messages: a delivery the broker makes for the first time is never dropped by default. Producers
    that resend with the same id ask for id deduplication with dedupById=true."""
    url = rabbitmq.url("amqp")
    queue = unique_name("ids")
    publish(url, queue, 3, props=lambda i: BasicProperties(message_id="order-7", delivery_mode=2))
    with Connection.from_url(url) as conn:  # bodies m0, m1, m2 above; and one with an id of its own
        ch = conn.channel()
        ch.basic_publish("", queue, b"other", BasicProperties(message_id="order-8", delivery_mode=2))
        ch.queue_declare(queue, passive=True)  # a round trip: the publish reached the broker
    opts = {} if dedup_by_id is None else {"dedupById": dedup_by_id}
    name = f"ids_{dedup_by_id}"
    df = reader(spark, url, queue, tmp_path / "log", **opts).selectExpr("cast(body as string) as b")
    run_available_now(df, name, tmp_path / "ckpt")
    got = sorted(r.b for r in spark.table(name).collect())
    assert got == sorted(expected)
    assert depth(url, queue) == 0  # every delivery was acknowledged, the dropped ones too
