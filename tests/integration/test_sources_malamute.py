"""The malamute source end to end: a real SparkSession (local[2]) and the embedded broker as a process."""

from __future__ import annotations

import json
import time

import pytest

from spark_mq.clients.malamute import MalamuteClient
from sinktest import run_available_now as run_to_end

pytestmark = pytest.mark.integration

QUERY_TIMEOUT = 240


def run(spark, df, name, ckpt, **trigger):
    q = (df.writeStream.format("memory").queryName(name).option("checkpointLocation", str(ckpt))
         .trigger(**trigger).start())
    return q


def drain_now(spark, endpoint, mailbox, tmp_path, name, **options):
    """An availableNow query from ``mailbox`` into the memory table ``name``, run to its end."""
    reader = (spark.readStream.format("malamute").option("uri", endpoint).option("mailbox", mailbox)
              .option("logLocation", str(tmp_path / "log")))
    for key, value in options.items():
        reader = reader.option(key, value)
    return run_to_end(reader.load().writeStream.format("memory").queryName(name)
                      .option("checkpointLocation", str(tmp_path / "ckpt")), QUERY_TIMEOUT)


def test_50k_from_a_mailbox_exactly_once_with_frames(spark, malamute_broker, tmp_path):
    with MalamuteClient(malamute_broker.endpoint, "producer", timeout=5) as producer:
        for i in range(50_000):
            producer.sendto("spark-in", f"subj{i % 7}", [f"m{i}".encode(), b"second"], tracker=f"t{i}")
        producer.ping()  # everything before it reached the broker
    q = drain_now(spark, malamute_broker.endpoint, "spark-in", tmp_path, "mlm50k", quietPeriod="1", numPartitions="2",
                  maxMessagesPerTrigger="20000")
    rows = spark.sql("select body, offset, frames, sender, address, subject, tracker, destination from mlm50k").collect()
    assert len(rows) == 50_000
    assert sorted(r.offset for r in rows) == list(range(50_000))
    assert sorted(r.body for r in rows) == sorted(f"m{i}".encode() for i in range(50_000))
    for r in rows:  # one producer: the mailbox keeps its order, so message i is at offset i
        i = int(r.body[1:])
        assert i == r.offset and r.frames == [r.body, b"second"] and r.tracker == f"t{i}"
        assert r.subject == f"subj{i % 7}" and r.sender == "producer" and r.address == "spark-in"
        assert r.destination == "spark-in"
    sizes = [p["numInputRows"] for p in q.recentProgress if p["numInputRows"]]
    assert max(sizes) <= 20_000, sizes


@pytest.mark.quick  # ./dev test --quick
def test_available_now_reads_the_backlog_while_its_quiet_period_runs(spark, malamute_broker, tmp_path):
    """Malamute tells no queue depth: availableNow ends its drain after ``quietPeriod`` of silence.
    Spark reads what came meanwhile (planned after 0.1 s without deliveries), not after it."""
    with MalamuteClient(malamute_broker.endpoint, "producer-quiet", timeout=5) as producer:
        for i in range(3000):
            producer.sendto("spark-quiet", "s", [f"q{i}".encode()])
        producer.ping()
    q = drain_now(spark, malamute_broker.endpoint, "spark-quiet", tmp_path, "mlm_quiet", quietPeriod="6")
    assert sorted(r.body for r in spark.sql("select body from mlm_quiet").collect()) == \
        sorted(f"q{i}".encode() for i in range(3000))
    planned = [(p["numInputRows"], p["durationMs"]["latestOffset"]) for p in q.recentProgress if p["numInputRows"]]
    assert planned and all(ms < 3000 for _, ms in planned), planned  # none waited the 6 s out


def test_a_new_log_for_an_old_checkpoint_continues_at_the_checkpoint(spark, malamute_broker, tmp_path):
    """The log's directory is wiped (or ``logLocation`` changed) and the query restarts from its
    checkpoint, which resumes at offset 300. availableNow starts the ingest before Spark says where
    it resumes: what it took must not be appended at offsets 0.. of the new log (Spark would then
    find a log ending below where it resumes and fail, or skip what lies below) but at 300.."""
    import shutil

    def send(start, count):
        with MalamuteClient(malamute_broker.endpoint, f"producer-wipe-{start}", timeout=5) as producer:
            for i in range(start, start + count):
                producer.sendto("spark-wipe", "s", [f"w{i}".encode()])
            producer.ping()

    def drain():
        df = (spark.readStream.format("malamute").option("uri", malamute_broker.endpoint)
              .option("mailbox", "spark-wipe").option("logLocation", str(tmp_path / "log"))
              .option("quietPeriod", "0.5").load())
        run_to_end(df.select("body", "offset").writeStream.format("parquet").option("path", str(tmp_path / "out"))
                   .option("checkpointLocation", str(tmp_path / "ckpt")), QUERY_TIMEOUT)
        return spark.read.parquet(str(tmp_path / "out")).collect()

    send(0, 300)
    assert len(drain()) == 300
    shutil.rmtree(tmp_path / "log")
    send(300, 200)
    rows = drain()
    assert sorted(r.body for r in rows) == sorted(f"w{i}".encode() for i in range(500))
    assert sorted(r.offset for r in rows) == list(range(500))


def test_stream_with_pattern_while_running(spark, malamute_broker, tmp_path):
    df = (spark.readStream.format("malamute").option("uri", malamute_broker.endpoint).option("stream", "weather")
          .option("pattern", "^temp").option("logLocation", str(tmp_path / "log")).load())
    q = run(spark, df, "mlm_stream", tmp_path / "ckpt", processingTime="200 milliseconds")
    try:
        # a stream keeps nothing for absent readers: publish once the source says it is connected
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            progress = q.lastProgress
            if progress and json.loads(progress["sources"][0]["latestOffset"]).get("connected"):
                break
            assert q.exception() is None, q.exception()
            time.sleep(0.2)
        else:
            pytest.fail("the stream source did not report itself connected within 120 s")
        time.sleep(0.5)  # slack: the STREAM-READ is sent before connected is set; its answer may lag
        deadline = time.monotonic() + 60
        with MalamuteClient(malamute_broker.endpoint, "", timeout=5) as producer:
            producer.set_producer("weather")
            for i in range(1000):
                producer.send("temp.x" if i % 2 == 0 else "rain.x", f"w{i}".encode())
            producer.ping()
        n = 0
        while time.monotonic() < deadline:
            n = spark.sql("select count(*) from mlm_stream").collect()[0][0]
            if n >= 500:
                break
            time.sleep(0.3)
    finally:
        q.stop()
    rows = spark.sql("select body, subject, frames from mlm_stream").collect()
    assert len(rows) == 500
    assert all(r.subject == "temp.x" for r in rows)
    assert all(r.frames is None for r in rows)  # single-frame messages: the frame is body
    assert sorted(r.body for r in rows) == sorted(f"w{i}".encode() for i in range(0, 1000, 2))


def test_service_worker_takes_queued_and_live_requests(spark, malamute_broker, tmp_path):
    """option service: the source offers itself as a worker (SERVICE-OFFER with a pattern); requests
    queued at the broker before it came, and those sent while it runs, all arrive once."""
    with MalamuteClient(malamute_broker.endpoint, "requester", timeout=5) as requester:
        for i in range(300):
            requester.sendfor("resize", "job.small" if i % 3 else "other.big", f"r{i}".encode(), tracker=f"t{i}")
        requester.ping()
        df = (spark.readStream.format("malamute").option("uri", malamute_broker.endpoint)
              .option("service", "resize").option("pattern", "^job\\.").option("logLocation", str(tmp_path / "log"))
              .option("quietPeriod", "0.5").load())
        q = run(spark, df, "mlm_service", tmp_path / "ckpt", processingTime="200 milliseconds")
        try:
            expected = [f"r{i}".encode() for i in range(300) if i % 3]
            deadline = time.monotonic() + QUERY_TIMEOUT
            while time.monotonic() < deadline:
                assert q.exception() is None, q.exception()
                if spark.sql("select count(*) from mlm_service").collect()[0][0] >= len(expected):
                    break
                time.sleep(0.3)
            for i in range(300, 400):
                requester.sendfor("resize", "job.live", f"r{i}".encode())
            requester.ping()
            expected += [f"r{i}".encode() for i in range(300, 400)]
            while time.monotonic() < deadline:
                if spark.sql("select count(*) from mlm_service").collect()[0][0] >= len(expected):
                    break
                time.sleep(0.3)
            time.sleep(1.0)  # nothing more (e.g. duplicates) arrives
        finally:
            q.stop()
    rows = spark.sql("select body, subject, sender, address, destination from mlm_service").collect()
    assert sorted(r.body for r in rows) == sorted(expected)
    assert all(r.subject.startswith("job.") and r.sender == "requester" and r.destination == "resize" for r in rows)


def test_undecodable_subject_bytes_arrive_as_replacement_characters(spark, malamute_broker, tmp_path):
    """A subject with bytes that are not UTF-8 (the broker passes any bytes) must not stop the
    ingest: the string column shows them as U+FFFD, the body is untouched."""
    bad = b"temp\xff\xfe".decode("utf-8", "surrogateescape")
    with MalamuteClient(malamute_broker.endpoint, "producer", timeout=5) as producer:
        producer.sendto("odd-subjects", bad, b"\x00\xff body")
        producer.sendto("odd-subjects", "fine", b"next")
        producer.ping()
    drain_now(spark, malamute_broker.endpoint, "odd-subjects", tmp_path, "mlm_odd", quietPeriod="1")
    rows = spark.sql("select subject, body from mlm_odd order by offset").collect()
    assert [(r.subject, bytes(r.body)) for r in rows] == [("temp\ufffd\ufffd", b"\x00\xff body"), ("fine", b"next")]


def test_a_lost_broker_fails_over_to_the_next_endpoint_then_times_out(tmp_path):
    """The Malamute client waits for a silent broker forever (ZeroMQ reconnects by itself); the source
    gives a lost broker ``connectTimeout`` more, then its ingest tries the next endpoint of ``uri``,
    and once none answers for ``brokerTimeout`` it fails naming the outage. The ingest alone, against
    two real broker processes: kill the first, mail reaches the log through the second; kill that."""
    from broker_process import BrokerProcess
    from spark_mq.options import SOURCE, parse_options
    from spark_mq.sources.ingest import BrokerUnavailableError, Ingest
    from spark_mq.sources.formats.malamute import connect_consumer

    first, second = BrokerProcess(client_timeout=10.0).start(), BrokerProcess(client_timeout=10.0).start()
    opts = parse_options({"uri": f"{first.endpoint},{second.endpoint}", "mailbox": "orders",
                          "logLocation": str(tmp_path / "log"), "connectTimeout": "1", "brokerTimeout": "4",
                          "reconnectMaxDelay": "0.5"}, format="malamute", direction=SOURCE)
    ing = Ingest("malamute", opts, lambda attempt: connect_consumer(opts, attempt))

    def mail(broker, first_n, count):
        with MalamuteClient(broker.endpoint, f"p-{time.monotonic_ns()}", timeout=5) as c:
            for i in range(first_n, first_n + count):
                c.sendto("orders", "s", f"m{i}".encode())
            c.ping(timeout=5)

    def bodies():
        return [b for batch in ing.log.read(ing.log.tail, ing.log.durable_head)
                for b in batch.column("body").to_pylist()]

    try:
        ing.start()
        assert ing.wait_for(lambda: ing.connected, 10)
        mail(first, 0, 10)
        assert ing.wait_for(lambda: ing.log.durable_head == 10, 10), ing.log.durable_head
        first.kill()
        # the client counts its server timeout from when it last heard the broker (a delivery, a
        # PONG), a moment before the kill: the bounds below count from there too
        lost_at = ing._consumer.heard_at()
        # lost after the client's server timeout (4 s) plus connectTimeout, then the second broker
        assert ing.wait_for(lambda: ing.reconnects >= 1 and ing.connected, 20), ing.figures()
        assert time.monotonic() - lost_at >= 4.0 + 1.0  # declared lost (4 s), then connectTimeout more
        mail(second, 10, 10)
        assert ing.wait_for(lambda: ing.log.durable_head == 20, 10), ing.log.durable_head
        assert bodies() == [f"m{i}".encode() for i in range(20)]
        second.kill()
        lost_at = ing._consumer.heard_at()
        deadline = time.monotonic() + 30
        while ing.error is None and time.monotonic() < deadline:
            time.sleep(0.1)
        failed_after = time.monotonic() - lost_at
    finally:
        ing.stop()
        first.stop()
        second.stop()
    assert isinstance(ing.error, BrokerUnavailableError), ing.error
    assert "brokerTimeout" in str(ing.error)
    assert 4.0 + 1.0 + 4.0 <= failed_after < 30.0  # lost (4 s), connectTimeout, then brokerTimeout
