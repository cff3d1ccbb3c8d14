"""The amqp08 source in ackMode=auto against a backlog bigger than its log bound: while the ingest
pauses, the client's buffer stays at its bound (figure ``clientBuffered``) and the query still reads
every message (issue 43 item 12). A real SparkSession (local[2]) and the harness's RabbitMQ."""

from __future__ import annotations

import faulthandler
import json
import sys
import time

import pytest

from spark_mq.clients.amqp08 import BasicProperties, Connection

pytestmark = pytest.mark.integration

BACKLOG = 30_000
BODY = 1024
ONE_READ = 256 * 1024  # the client reader's largest single socket read
DEADLINE = 240  # seconds for the whole query
TEST_TIMEOUT = 600  # a hung test ends the run with tracebacks instead of hanging it


@pytest.fixture(autouse=True)
def _bounded():
    faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _publish(url: str, queue: str) -> None:
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        pad = b"x" * (BODY - 8)
        ch.publish_many(("", queue, b"%08d" % i + pad, BasicProperties(message_id=f"id{i}"))
                        for i in range(BACKLOG))
        ch.queue_declare(queue, passive=True)  # a round trip: everything before it reached the broker


def _figures(progress: dict) -> dict:
    value = progress["sources"][0]["latestOffset"]
    return json.loads(value) if isinstance(value, str) else (value or {})


@pytest.mark.parametrize("bound", [None, 1000], ids=["default-bound", "bound-1000"])
def test_auto_mode_paused_ingest_keeps_the_client_buffer_bounded(spark, rabbitmq, unique_name, tmp_path, bound):
    url = rabbitmq.url("amqp")
    queue = unique_name("src")
    _publish(url, queue)
    limit = bound or 10_000  # clientBufferMessages' default
    r = (spark.readStream.format("amqp08").option("uri", url).option("queue", queue)
         .option("logLocation", str(tmp_path / "log")).option("ackMode", "auto")
         .option("maxUncommittedMessages", "2000").option("maxMessagesPerTrigger", "2000"))
    if bound is not None:
        r = r.option("clientBufferMessages", str(bound))
    # rows go to Parquet files, counted from the progress reports: a memory sink queried every second
    # made the driver's 1 GiB heap run out in a full-suite run (each count shipped the whole table)
    out = str(tmp_path / "out")
    q = (r.load().select("body").writeStream.format("parquet").option("path", out)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds").start())
    seen: list = []
    try:
        deadline = time.monotonic() + DEADLINE
        rows = 0
        while time.monotonic() < deadline:
            if q.exception() is not None:
                raise AssertionError(f"query failed: {q.exception()}")
            rows = sum(p["numInputRows"] for p in q.recentProgress)
            last = q.lastProgress
            print(f"rows {rows}, figures {_figures(last) if last else None}", file=sys.stderr, flush=True)
            if rows >= BACKLOG:
                break
            time.sleep(0.25)
        seen = [_figures(p) for p in q.recentProgress]
    finally:
        q.stop()
    buffered = [f["clientBuffered"] for f in seen if "clientBuffered" in f]
    assert any(f.get("paused") for f in seen), "the ingest never paused: the test shows nothing"
    assert buffered and max(buffered) <= limit + ONE_READ // BODY, \
        f"the client held up to {max(buffered)} deliveries, bound {limit}: {buffered}"
    bodies = [r.body for r in spark.read.parquet(out).collect()]
    assert len(bodies) == BACKLOG, f"read {len(bodies)} of {BACKLOG}"
    assert sorted(int(b[:8]) for b in bodies) == list(range(BACKLOG))  # each once, none lost
