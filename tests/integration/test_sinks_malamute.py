"""The malamute sink against the project's Malamute broker (a separate process on loopback TCP) with a
real SparkSession; messages read back by a plain MalamuteClient.

- a 50,000-row stream to a Malamute stream: subjects and multi-frame contents intact;
- mailbox mode with a task failure injected mid-partition: Malamute has no transactions, so what the
  failed attempt sent stays visible, but the trackers (the deterministic ids) let the consumer drop
  every duplicate after the replay, and every row arrives.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import brokers
import pytest
from pyspark.sql import functions as F

from spark_mq.clients.malamute import MalamuteClient
from spark_mq.sinks import commitlog
from spark_mq.sinks.plan import COMMIT_LOG_DIR
from sinktest import run_available_now

QUERY_TIMEOUT = 240.0
READ_IDLE = 10.0
SETTLE = 1.5

pytestmark = pytest.mark.xdist_group("test_sinks_malamute")  # one xdist worker: shared state (tests/conftest.py)


@pytest.fixture(scope="module")
def broker():
    with brokers.malamute_running(client_timeout=30.0) as proc:
        yield proc


def read_all(client: MalamuteClient, expected: int) -> list:
    out = []
    last = time.monotonic()
    while True:
        msg = client.recv(timeout=0.5)
        now = time.monotonic()
        if msg is not None:
            out.append(msg)
            last = now
        elif now - last > (SETTLE if len(out) >= expected else READ_IDLE):
            return out


def make_input(spark, path: str, n: int, files: int = 2) -> None:
    (spark.range(0, n, numPartitions=files).select(
        F.concat(F.lit("body-"), F.col("id").cast("string")).cast("binary").alias("body"),
        F.concat(F.lit("subj."), F.col("id").cast("string")).alias("subject"),
        # every third row carries three frames, which replace the body
        F.when(F.col("id") % 3 == 0, F.array(F.concat(F.lit("body-"), F.col("id").cast("string")).cast("binary"),
                                             F.lit(b"\x00frame-2"), F.lit(b""))).alias("frames"),
    ).write.parquet(path))


def stream_to(spark, broker, path: str, checkpoint: str, fmt: str = "malamute", **options):
    schema = spark.read.parquet(path).schema
    writer = (spark.readStream.schema(schema).parquet(path).writeStream.format(fmt)
              .option("uri", broker.endpoint).option("checkpointLocation", checkpoint))
    for key, value in options.items():
        writer = writer.option(key, value)
    return run_available_now(writer, QUERY_TIMEOUT)


def row_id(content) -> int:
    return int(bytes(content[0]).split(b"-")[1])


def check(msg) -> int:
    i = row_id(msg.content)
    assert msg.subject == f"subj.{i}"
    frames = [bytes(f) for f in msg.content]
    if i % 3 == 0:
        assert frames == [f"body-{i}".encode(), b"\x00frame-2", b""]
    else:
        assert frames == [f"body-{i}".encode()]
    return i


@pytest.mark.timeout(420)
def test_stream_of_50000_rows_read_back_by_a_plain_client(spark, broker, unique_name, tmp_path):
    n = 50_000
    stream = unique_name("sink")
    make_input(spark, str(tmp_path / "in"), n)
    with MalamuteClient(broker.endpoint, unique_name("reader"), timeout=5.0) as reader:
        reader.set_consumer(stream, "")
        checkpoint = str(tmp_path / "ck")
        stream_to(spark, broker, str(tmp_path / "in"), checkpoint, stream=stream)
        got = read_all(reader, n)
    assert len(got) == n
    assert sorted(check(m) for m in got) == list(range(n))
    assert {m.address for m in got} == {stream}
    assert commitlog.read(f"{checkpoint}/{COMMIT_LOG_DIR}")["0"]["messages"] == n


@pytest.mark.timeout(420)
def test_mailbox_failure_mid_partition_replay_is_deduplicable_by_tracker(spark, broker, unique_name, tmp_path):
    n = 12_000
    mailbox = unique_name("box")
    make_input(spark, str(tmp_path / "in"), n)
    checkpoint = str(tmp_path / "ck")
    marker = str(tmp_path / "failed-once")
    options = {"fault.format": "malamute", "fault.partition": "1", "fault.afterRows": "4000", "fault.marker": marker,
               "mailbox": mailbox}
    with MalamuteClient(broker.endpoint, mailbox, timeout=5.0) as reader:
        with pytest.raises(Exception, match="injected task failure"):
            stream_to(spark, broker, str(tmp_path / "in"), checkpoint, "sinktest_faulty", **options)
        query = stream_to(spark, broker, str(tmp_path / "in"), checkpoint, "sinktest_faulty", **options)
        got = read_all(reader, n)
    pattern = re.compile(rf"^{re.escape(str(query.id))}:0:[0-9a-f]{{8}}:([01]):(\d+)$")
    counts = Counter(m.tracker for m in got)
    assert all(pattern.match(t) for t in counts)
    assert max(counts.values()) <= 2
    # what the failed attempt had sent of partition 1 shows up twice: no transactions in Malamute
    assert any(c == 2 for t, c in counts.items() if pattern.match(t).group(1) == "1")
    first = {}
    for m in got:
        first.setdefault(m.tracker, m)
    assert len(first) == n
    assert sorted(check(m) for m in first.values()) == list(range(n))



def test_writes_across_broker_restarts_fail_or_deliver_every_row(spark, tmp_path):
    """Issue 43, item 1: batch writes to a mailbox, the broker SIGKILLed and restarted (same port,
    journal fsynced) right before some of them. A write that returns without an error has every row
    in the mailbox; a write a restart hits fails instead of losing its rows in silence (the broker,
    which no longer knew the pooled client, answered each send with ERROR and dropped it)."""
    rows, writes, restart_before = 3_000, 6, (1, 3, 4)
    mailbox = "restart-target"
    outcome = {}
    with brokers.malamute_running(client_timeout=30.0, mailbox_dir=str(tmp_path / "mb"), args=["--fsync"]) as broker:
        for w in range(writes):
            if w in restart_before:
                broker.kill()
                broker.restart()
            df = spark.range(rows, numPartitions=2).select(
                F.concat(F.lit(f"w{w}-"), F.col("id").cast("string")).alias("body"))
            try:
                df.write.format("malamute").option("uri", broker.endpoint).option("mailbox", mailbox) \
                    .mode("append").save()
                outcome[w] = "ok"
            except Exception as exc:  # noqa: BLE001 - failing is the right outcome for a write a restart hits
                outcome[w] = str(exc)[-300:]
        with MalamuteClient(broker.endpoint, mailbox) as client:
            bodies = {bytes(m.content[0]).decode() for m in read_all(client, rows * writes)}
    delivered = Counter(b.split("-")[0] for b in bodies)
    print("outcome:", {w: ("ok" if o == "ok" else "failed") for w, o in outcome.items()}, "delivered:", dict(delivered))
    for w, result in outcome.items():
        if result == "ok":
            assert delivered[f"w{w}"] == rows, f"write {w} returned without an error but delivered " \
                                               f"{delivered[f'w{w}']} of {rows} rows"
    assert outcome[0] == "ok" and delivered["w0"] == rows  # no restart before the first
    failed = [w for w, o in outcome.items() if o != "ok"]
    for w in failed:
        assert "restart" in outcome[w] or "forgot" in outcome[w], outcome[w]
