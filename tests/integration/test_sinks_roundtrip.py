"""Round trip through all three formats, end to end with the real DataSources:
amqp08 source -> transform -> stomp sink -> stomp source -> malamute sink, then a plain Malamute client.

Messages are published to a RabbitMQ queue with pika (with headers), read by the amqp08 source,
transformed (body prefixed, a header added), written to a STOMP queue on the same RabbitMQ, read by
the stomp source, written to a Malamute mailbox with the row's header as subject, and read back by a
plain MalamuteClient: every message arrives once, transformed, with its header carried through.
"""

from __future__ import annotations

import re
import time

import pika
import brokers
import pytest
from pyspark.sql import functions as F

from spark_mq.clients.malamute import MalamuteClient
from spark_mq.sinks.options import MESSAGE_ID_HEADER
from sinktest import run_available_now

N = 3_000
QUERY_TIMEOUT = 240.0

pytestmark = pytest.mark.xdist_group("test_sinks_roundtrip")  # one xdist worker: shared state (tests/conftest.py)


@pytest.fixture(scope="module")
def malamute_broker():
    with brokers.malamute_running(client_timeout=30.0) as proc:
        yield proc


@pytest.mark.quick  # ./dev test --quick
@pytest.mark.timeout(600)
def test_amqp08_to_stomp_to_malamute(spark, rabbitmq, malamute_broker, unique_name, tmp_path):
    queue = unique_name("rt-in")
    destination = "/queue/" + unique_name("rt-mid")
    mailbox = unique_name("rt-out")

    conn = pika.BlockingConnection(pika.URLParameters(rabbitmq.url("amqp")))
    try:
        ch = conn.channel()
        ch.queue_declare(queue)
        for i in range(N):
            ch.basic_publish("", queue, f"msg-{i}".encode(),
                             pika.BasicProperties(headers={"n": str(i)}, content_type="text/plain"))
    finally:
        conn.close()

    # amqp08 source -> transform -> stomp sink
    first = (spark.readStream.format("amqp08").option("uri", rabbitmq.url("amqp")).option("queue", queue)
             .option("logLocation", str(tmp_path / "log1")).option("quietPeriod", "1").load())
    transformed = first.select(
        F.concat(F.lit(b"t:"), F.col("body")).alias("body"),
        F.map_concat(F.col("headers"), F.create_map(F.lit("via"), F.lit("amqp08"))).alias("headers"))
    run_available_now(transformed.writeStream.format("stomp").option("uri", rabbitmq.url("stomp"))
                      .option("destination", destination).option("checkpointLocation", str(tmp_path / "ck1")),
                      QUERY_TIMEOUT)

    with MalamuteClient(malamute_broker.endpoint, mailbox, timeout=5.0) as reader:
        # stomp source -> malamute sink (mailbox), the header "n" as subject
        second = (spark.readStream.format("stomp").option("uri", rabbitmq.url("stomp"))
                  .option("destination", destination).option("logLocation", str(tmp_path / "log2"))
                  .option("quietPeriod", "1").load())
        out = second.select(F.col("body"), F.concat(F.col("headers")["via"], F.lit("."), F.col("headers")["n"])
                            .alias("subject"), F.col("headers")[MESSAGE_ID_HEADER].alias("tracker"))
        run_available_now(out.writeStream.format("malamute").option("uri", malamute_broker.endpoint)
                          .option("mailbox", mailbox).option("checkpointLocation", str(tmp_path / "ck2")),
                          QUERY_TIMEOUT)
        got = []
        deadline = time.monotonic() + 60
        while len(got) < N and time.monotonic() < deadline:
            msg = reader.recv(timeout=1.0)
            if msg is not None:
                got.append(msg)
        extra = reader.recv(timeout=1.0)
    assert extra is None, "more messages than were published"
    assert len(got) == N
    seen = set()
    for msg in got:
        body = bytes(msg.content[0])
        assert body.startswith(b"t:msg-")
        i = int(body[len(b"t:msg-"):])
        assert msg.subject == f"amqp08.{i}"
        # the stomp sink's deterministic id (<queryId>:<batchId>:<tag>:<partition>:<seq>), carried by the
        # stomp source's headers, is the tracker
        assert re.fullmatch(r"[0-9a-f-]{36}:\d+:[0-9a-f]{8}:\d+:\d+", msg.tracker), msg.tracker
        seen.add(i)
    assert seen == set(range(N))
