"""RabbitMQ 4 (the harness's node in a Debian 13 root, broker_rabbitmq4.py): it refuses AMQP 0-8, and the
client says so at once with the fix; it speaks 0-9-1, which the client speaks end to end, on a quorum queue
(4.x's normal case) and a classic one (issue 57)."""

from __future__ import annotations

import time

import pytest

from sinktest import finish

from spark_mq.clients.amqp08 import BasicProperties, Connection
from spark_mq.protocol.amqp08.errors import ProtocolRefused

pytestmark = pytest.mark.integration


def test_rabbitmq4_refuses_0_8_and_the_error_names_the_fix(rabbitmq4):
    t0 = time.monotonic()
    with pytest.raises(ProtocolRefused) as info:
        Connection.from_url(rabbitmq4.url("amqp"), protocol="0-8", connect_timeout=10)
    assert time.monotonic() - t0 < 10  # at once, not at the connect timeout
    err = info.value
    assert (err.offered, err.speaks, err.fits) == ("0-8", "AMQP 1.0 (SASL)", "0-9-1")
    assert "refused AMQP 0-8" in str(err) and "set protocol=0-9-1" in str(err)


@pytest.mark.parametrize("queue_type", ["quorum", "classic"])
@pytest.mark.parametrize("protocol", ["0-9-1", "auto"])
def test_0_9_1_publish_consume_ack_on_rabbitmq4(rabbitmq4, unique_name, protocol, queue_type):
    queue = unique_name(f"r4-{queue_type}")
    with Connection.from_url(rabbitmq4.url("amqp"), protocol=protocol) as conn:
        assert conn.protocol == "0-9-1"
        version = conn.server_properties["version"]
        assert (version.decode() if isinstance(version, bytes) else version).startswith("4."), version
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments={"x-queue-type": queue_type})
        ch.publish_many(("", queue, b"m%d" % i, BasicProperties(message_id=f"id{i}", delivery_mode=2))
                        for i in range(1000))
        ch.basic_qos(prefetch_count=200)  # per consumer: 4.3 refuses global qos
        ch.basic_consume(queue)
        got = []
        while len(got) < 1000:
            msg = ch.next_message(timeout=15)
            got.append((msg.body, msg.properties.message_id))
            ch.basic_ack(msg.delivery_tag)
        assert got == [(b"m%d" % i, f"id{i}") for i in range(1000)]
        ch.queue_delete(queue)


def _finish(q, timeout: float = 240):
    return finish(q, timeout)


def test_the_format_reads_and_writes_rabbitmq4_in_0_9_1_and_says_why_it_cannot_in_0_8(spark, rabbitmq4, unique_name,
                                                                                        tmp_path):
    """Through Spark, on a quorum queue: a batch write of 1,000 rows and an availableNow stream read of them
    with protocol=0-9-1, every row once; the same read with protocol=0-8 fails the query at once, naming
    the option (before: 0 rows and no error for brokerTimeout, 300 s)."""
    url, queue = rabbitmq4.url("amqp"), unique_name("r4-format")
    with Connection.from_url(url, protocol="0-9-1") as conn:
        conn.channel().queue_declare(queue, durable=True, arguments={"x-queue-type": "quorum"})
    rows = [(f"r{i}",) for i in range(1000)]
    (spark.createDataFrame(rows, "body string").write.format("amqp08").option("uri", url)
     .option("protocol", "0-9-1").option("exchange", "").option("routingKey", queue).mode("append").save())
    got = []
    q = _finish(spark.readStream.format("amqp08").option("uri", url).option("queue", queue)
                .option("protocol", "0-9-1").option("logLocation", str(tmp_path / "log")).load()
                .writeStream.foreachBatch(lambda df, _id: got.extend(r.body for r in df.select("body").collect()))
                .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    assert q.exception() is None, q.exception()
    assert sorted(got) == sorted(f"r{i}".encode() for i in range(1000))

    t0 = time.monotonic()
    q = _finish(spark.readStream.format("amqp08").option("uri", url).option("queue", queue)
                .option("protocol", "0-8").option("logLocation", str(tmp_path / "log08")).load()
                .writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt08")).start(), 120)
    error = str(q.exception())
    assert time.monotonic() - t0 < 60, "retried as an outage?"
    assert "refused AMQP 0-8" in error and "protocol=0-9-1" in error and "option protocol" in error, error


def _queue_length(url: str, queue: str) -> int:
    with Connection.from_url(url, protocol="0-9-1") as conn:
        return conn.channel().queue_declare(queue, passive=True).message_count


def test_the_sink_commits_with_publisher_confirms_on_0_9_1_and_a_nack_fails_the_write(spark, rabbitmq4, unique_name):
    """publishMode=confirm on a 0-9-1 connection: publisher confirms as the task's commit. 2,000 persistent rows into a
    quorum queue, every one there; into a queue that rejects what is over its length limit (x-overflow
    reject-publish), the broker nacks the excess and the write fails naming the nacked messages. In a
    transaction (publishMode=tx) RabbitMQ 4 fails the commit ("partial tx completion") after it enqueued
    the part that fitted: not atomic either, which docs/guarantees.md says (issue 57)."""
    from pyspark.errors import PySparkException
    from py4j.protocol import Py4JJavaError

    url = rabbitmq4.url("amqp")
    ok_queue, full_queue = unique_name("r4-confirm"), unique_name("r4-bounded")
    with Connection.from_url(url, protocol="0-9-1") as conn:
        ch = conn.channel()
        ch.queue_declare(ok_queue, durable=True, arguments={"x-queue-type": "quorum"})
        # a classic queue: its length limit is exact (a quorum queue's lags, and let 24 of 50 in here)
        ch.queue_declare(full_queue, durable=True, arguments={"x-queue-type": "classic", "x-max-length": 10,
                                                               "x-overflow": "reject-publish"})

    def write(queue: str, n: int, mode: str = "confirm"):
        w = (spark.createDataFrame([(f"c{i}",) for i in range(n)], "body string").repartition(2).write
             .format("amqp08").option("uri", url).option("protocol", "0-9-1").option("exchange", "")
             .option("routingKey", queue).option("deliveryMode", 2).option("publishMode", mode).mode("append"))
        w.save()

    write(ok_queue, 2000)
    assert _queue_length(url, ok_queue) == 2000
    with Connection.from_url(url, protocol="0-9-1") as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=500)
        ch.basic_consume(ok_queue, no_ack=True)
        got = sorted(ch.next_message(timeout=15).body for _ in range(2000))
    assert got == sorted(f"c{i}".encode() for i in range(2000))

    with pytest.raises((PySparkException, Py4JJavaError)) as info:
        write(full_queue, 50)
    assert "nacked" in str(info.value), str(info.value)[-3000:]
    assert _queue_length(url, full_queue) == 10
    with Connection.from_url(url, protocol="0-9-1") as conn:
        conn.channel().queue_purge(full_queue)
    with pytest.raises((PySparkException, Py4JJavaError)) as info:
        write(full_queue, 50, "tx")
    assert "partial tx completion" in str(info.value), str(info.value)[-3000:]
    assert _queue_length(url, full_queue) == 10  # what fitted stayed, although the transaction failed
