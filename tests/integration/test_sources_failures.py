"""Failure tests of the amqp08 source: the query process SIGKILLed inside a batch and between two
batches during a 14,000-message run, with one consumer and with four (restarted from its checkpoint each
time; more kills: ./dev soak), and the broker SIGKILLed and restarted mid-stream. The sink must hold
every message exactly once.

The killed query runs in a child process (its own process group: Python driver, JVM, Python workers),
so a kill is a real crash, not a stop. Every wait is bounded.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest

from spark_mq.clients.amqp08 import BasicProperties, Connection
from spark_mq.clients.stomp import StompClient

from killing import KILLS, committed_batches, kill_group, kill_inside_and_between, last_batch, start_child

pytestmark = pytest.mark.integration

# One driver runs two queries, each on a queue of its own: ``one`` with a single consumer (two read
# partitions) and ``lanes`` with four consumers (lanes, four read partitions). One kill of the driver kills
# both, so one run of kills serves both (tests/integration/killing.py).
QUERIES = {"one": {"consumers": "1", "numPartitions": "2"},
           "lanes": {"consumers": "4", "prefetch": "200", "numPartitions": "4"}}
CHILD = textwrap.dedent("""
    import json, os, sys
    from pyspark.sql import SparkSession
    from spark_mq.datasources import Amqp08DataSource
    url, work, mode, queries = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.python.authenticate.socketTimeout", "120s").getOrCreate())
    spark.dataSource.register(Amqp08DataSource)
    running = {}
    for name, options in queries.items():
        df = (spark.readStream.format("amqp08").option("uri", url).options(**options)
              .option("logLocation", f"{work}/{name}-log").option("maxMessagesPerTrigger", "700")
              .option("quietPeriod", "1").load())
        w = (df.select("offset", "body", "message_id").writeStream.format("parquet")
             .option("path", f"{work}/{name}-out").option("checkpointLocation", f"{work}/{name}-ckpt"))
        if mode == "final":
            running[name] = w.trigger(availableNow=True).start()
        else:
            running[name] = w.trigger(processingTime="100 milliseconds").start()
    if mode == "final":
        result = {}
        for name, q in running.items():
            q.awaitTermination(300)
            rows = spark.read.parquet(f"{work}/{name}-out").select("body").collect()
            result[name] = sorted(r.body.decode() for r in rows)
        with open(f"{work}/result.json", "w") as f:
            json.dump(result, f)
    else:
        spark.streams.awaitAnyTermination(600)
""")


def publish(url: str, queue: str, count: int) -> None:
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.publish_many(("", queue, f"m{i}".encode(), BasicProperties(message_id=f"id{i}", delivery_mode=2))
                        for i in range(count))
        ch.queue_declare(queue, passive=True)


@pytest.mark.timeout(900)
def test_query_killed_inside_and_between_batches_loses_and_duplicates_nothing(rabbitmq, unique_name, tmp_path):
    """The driver of two queries, one consumer and four consumers (lanes), SIGKILLed (driver, JVM, Python
    workers) until each query has been killed inside a batch and between two batches, restarted from the
    checkpoints each time, then run to the end: each parquet sink holds every message of its queue once.
    With lanes, Spark replays the batch's per-lane ranges from the lanes' logs and the broker redelivers
    what was not acknowledged (to any lane)."""
    url = rabbitmq.url("amqp")
    total = 14_000
    queues = {name: unique_name(f"kill-{name}") for name in QUERIES}
    for queue in queues.values():
        publish(url, queue, total)
    queries = {name: {**options, "queue": queues[name]} for name, options in QUERIES.items()}
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    ckpts = [tmp_path / f"{name}-ckpt" for name in QUERIES]
    with open(tmp_path / "children.log", "w") as child_log:
        def start(mode: str):
            return start_child(script, [url, str(tmp_path), mode, json.dumps(queries)], child_log)

        landed = kill_inside_and_between(lambda: start("stream"), ckpts, f"{tmp_path}/children.log", seed=5)
        assert [sorted(x) for x in landed] == [sorted(KILLS)] * len(QUERIES), landed
        for ckpt in ckpts:
            assert committed_batches(ckpt) < total // 700, f"{ckpt.name}: the run finished before the last kill"
        proc = start("final")
        try:
            proc.wait(400)
        finally:
            kill_group(proc)
    result = json.loads((tmp_path / "result.json").read_text())
    for name in QUERIES:
        bodies = result[name]
        assert len(bodies) == total, f"{name}: {len(bodies)} rows for {total} messages"
        assert bodies == sorted(f"m{i}" for i in range(total)), name
    last = tmp_path / "lanes-ckpt" / "offsets" / str(last_batch(tmp_path / "lanes-ckpt", "offsets"))
    assert len(json.loads(last.read_text().strip().splitlines()[-1])["lanes"]) == 4


def _publish_persistent(broker, fmt: str, dest: str, total: int) -> None:
    if fmt == "amqp08":
        publish(broker.url("amqp"), dest, total)
    else:
        with StompClient.from_uri(broker.url("stomp")) as client:
            for i in range(total):
                client.send(dest, f"m{i}".encode(), headers={"persistent": "true"})
            client.flush()
    if hasattr(broker, "sync"):
        broker.sync()  # RabbitMQ: the queue's declaration on disk before the kill


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fmt,kind", [("amqp08", "rabbitmq"), ("stomp", "rabbitmq"), ("stomp", "activemq")])
def test_broker_killed_and_restarted_mid_stream(spark, request, unique_name, tmp_path, fmt, kind):
    broker = request.getfixturevalue(f"{kind}_isolated")()
    dest = unique_name("src") if fmt == "amqp08" else "/queue/" + unique_name("src")
    total = 10_000
    _publish_persistent(broker, fmt, dest, total)
    r = (spark.readStream.format(fmt).option("uri", broker.url("amqp" if fmt == "amqp08" else "stomp"))
         .option("queue" if fmt == "amqp08" else "destination", dest)
         .option("logLocation", str(tmp_path / "log")).option("maxMessagesPerTrigger", "400")
         # the log bound holds the ingest back, so most messages are still in the broker at the kill
         .option("maxUncommittedMessages", "500")
         .option("reconnectDelay", "0.2").option("reconnectMaxDelay", "1"))
    name = f"broker_kill_{fmt}_{kind}"
    q = (r.load().select("offset", "body").writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="100 milliseconds").start())

    def count() -> int:
        return spark.sql(f"select count(*) from {name}").collect()[0][0]

    try:
        deadline = time.monotonic() + 120
        while count() < 1000 and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.2)
        assert count() >= 1000
        before = json.loads(q.lastProgress["sources"][0]["latestOffset"])
        assert before["consumed"] < total // 2, f"the ingest took {before['consumed']} of {total} before the kill"
        broker.kill()
        time.sleep(2.0)
        broker.restart()
        deadline = time.monotonic() + 240
        while count() < total and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.5)
        time.sleep(2.0)  # a few more triggers: duplicates would show now
        # An idle query reports progress only every few seconds: wait for the published figures to
        # show the reconnect.
        deadline = time.monotonic() + 90
        while True:
            figures = json.loads(q.lastProgress["sources"][0]["latestOffset"])
            if figures["reconnects"] >= 1 or time.monotonic() > deadline:
                break
            time.sleep(1.0)
    finally:
        q.stop()
    rows = spark.sql(f"select body from {name}").collect()
    assert sorted(r.body for r in rows) == sorted(f"m{i}".encode() for i in range(total))
    assert figures["reconnects"] >= 1



ASYNC_CHILD = textwrap.dedent("""
    import os, sys, uuid
    from pyspark.sql import SparkSession
    from spark_mq.datasources import Amqp08DataSource
    url, queue, log, out_dir, ckpt = sys.argv[1:6]
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.python.authenticate.socketTimeout", "120s").getOrCreate())
    spark.dataSource.register(Amqp08DataSource)

    class Files:  # foreach sink: one file per partition and attempt
        def open(self, partition_id, epoch_id):
            self.f = open(os.path.join(out_dir, f"{epoch_id}-{partition_id}-{uuid.uuid4().hex}.txt"), "w")
            return True
        def process(self, row):
            self.f.write(row.body.decode() + "\\n")
        def close(self, error):
            self.f.close()

    df = (spark.readStream.format("amqp08").option("uri", url).option("queue", queue).option("logLocation", log)
          .option("segmentBytes", "2k").option("maxMessagesPerTrigger", "300").load())
    q = (df.select("body").writeStream.foreach(Files()).option("checkpointLocation", ckpt)
         .option("asyncProgressTrackingEnabled", "true")
         .option("asyncProgressTrackingCheckpointIntervalMs", "4000")
         .trigger(processingTime="0 seconds").start())
    q.awaitTermination(600)
""")


def _bodies_written(out: Path) -> set:
    found = set()
    for f in out.iterdir():
        found.update(line for line in f.read_text().splitlines() if line)
    return found


@pytest.mark.timeout(900)
def test_driver_killed_under_async_progress_tracking_restarts_and_loses_nothing(rabbitmq, unique_name, tmp_path):
    """Issue 43, item 2: with asyncProgressTrackingEnabled Spark plans batch N+1 before batch N is in
    its offset and commit logs, and after a driver crash replays from the last persisted batch. The
    source used to delete log segments for the batch ending at ``start`` inside latestOffset(start):
    the restart failed at once with DataLossError (or skipped them with failOnDataLoss=false)."""
    url = rabbitmq.url("amqp")
    queue = unique_name("async")
    total = 40_000
    publish(url, queue, total)
    script = tmp_path / "child.py"
    script.write_text(ASYNC_CHILD)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    out.mkdir()
    args = [url, queue, str(tmp_path / "log"), str(out), str(ckpt)]
    with open(tmp_path / "children.log", "w") as child_log:
        proc = start_child(script, args, child_log)
        try:
            # killed once the offset log has been persisted at least once and many batches ran after it
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    pytest.fail(f"the query exited early ({proc.returncode}); see {tmp_path}/children.log")
                done = len(_bodies_written(out))
                if last_batch(ckpt, "offsets") >= 0 and done >= 6_000:
                    break
                time.sleep(0.2)
            done = len(_bodies_written(out))
            assert 6_000 <= done < total, f"{done} of {total} written before the kill"
        finally:
            kill_group(proc)
        persisted = last_batch(ckpt, "offsets")
        proc = start_child(script, args, child_log)
        try:
            # bounded by progress, not a total: fails once nothing more is written for 90 s
            written, deadline = 0, time.monotonic() + 90
            while written < total and time.monotonic() < deadline:
                if proc.poll() is not None:
                    break
                time.sleep(0.5)
                now_written = len(_bodies_written(out))
                if now_written > written:
                    written, deadline = now_written, time.monotonic() + 90
        finally:
            kill_group(proc)
    text = (tmp_path / "children.log").read_text(errors="replace")
    assert "DataLossError" not in text and "no longer in the source log" not in text, \
        f"the restart found segments deleted (offset log persisted up to batch {persisted})"
    assert _bodies_written(out) == {f"m{i}" for i in range(total)}
