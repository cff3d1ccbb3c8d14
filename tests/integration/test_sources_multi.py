"""Issue 45, item 1: several sources of messages per query over one connection (amqp08 queues, stomp
destinations, malamute streams), on the real brokers.

- the STOMP ACKs with several subscriptions on one connection, at the consumer, on each broker: what
  each broker does with a cumulative ACK (ActiveMQ: of one subscription; RabbitMQ: of the whole
  connection, and an ERROR for an ACK of what it settled so), and that the source's ACKs (the last
  message of each subscription, in delivery order) acknowledge everything and nothing twice, in
  ``durable`` (``ack``) and ``commit`` (``ack_commit``) mode;
- a streaming query over two sources of each format, messages interleaved: every message once, each
  row's ``destination`` the source it came from, no reconnect, and the brokers empty afterwards;
- batch reads over two sources (amqp08, stomp);
- the query SIGKILLed mid-batch and restarted, stomp over two destinations, on both brokers.

Every wait is bounded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from killing import KILLS, kill_group, kill_inside_and_between

from spark_mq.clients.amqp08 import BasicProperties, Connection
from spark_mq.clients.malamute import MalamuteClient
from spark_mq.clients.stomp import StompClient
from spark_mq.errors import ConnectionClosedError
from spark_mq.options import SOURCE, parse_options
from spark_mq.protocol.stomp10 import StompError

pytestmark = pytest.mark.integration

QUERY_TIMEOUT = 240


# -- helpers ----------------------------------------------------------------------------------------------


def publish_amqp(url: str, queues: list, count: int) -> None:
    """``count`` messages per queue, interleaved: q0 m0, q1 m0, q0 m1, ... (body ``<queue>|m<i>``)."""
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        for q in queues:
            ch.queue_declare(q, durable=True)
        ch.publish_many(("", q, f"{q}|m{i}".encode(), BasicProperties(message_id=f"{q}-{i}", delivery_mode=2))
                        for i in range(count) for q in queues)
        for q in queues:
            ch.queue_declare(q, passive=True)  # a round trip: everything before it reached the broker


def publish_stomp(url: str, dests: list, count: int, start: int = 0) -> None:
    with StompClient.from_uri(url) as client:
        for i in range(start, start + count):
            for d in dests:
                client.send(d, f"{d}|m{i}".encode(), headers={"persistent": "true"})
        client.flush()  # leaving the block disconnects with a receipt: every SEND before it reached the broker


def leftovers_stomp(url: str, dests: list, wait: float = 2.0, expect: int = 0) -> list:
    """What the destinations still hold (read with ack:auto, so it is taken out): ``expect`` messages
    that must come back are waited for up to 30 s (a broker requeues what a closed connection held
    when it gets to it), then ``wait`` and 1 s after the last frame for any extra."""
    got = []
    with StompClient.from_uri(url) as client:
        for d in dests:
            client.subscribe(d, ack="auto")
        started = time.monotonic()
        deadline = started + wait
        while time.monotonic() < deadline or (len(got) < expect and time.monotonic() < started + 30):
            frame = client.receive(0.2)
            if frame is not None:
                got.append(frame.body)
                deadline = max(deadline, time.monotonic() + 1.0)
    return got


def depths_amqp(url: str, queues: list) -> list:
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        return [ch.queue_declare(q, passive=True).message_count for q in queues]


def stomp_consumer(url: str, dests: list, tmp_path: Path, **options):
    from spark_mq.sources.formats.stomp import StompConsumer

    opts = parse_options({"uri": url, "destination": ",".join(dests), "logLocation": str(tmp_path / "log"),
                          **options}, format="stomp", direction=SOURCE)
    return StompConsumer(opts)


def poll_all(consumer, count: int, timeout: float = 60.0) -> list:
    got: list = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += consumer.poll(count - len(got), 1.0)
    assert len(got) == count, f"{len(got)} of {count} messages within {timeout}s"
    return got


def round_trip(client: StompClient) -> None:
    """A request with a receipt: an ERROR the broker sent for an earlier frame (an ACK) comes first."""
    client.send("/queue/spark-mq-multi-ping", b"", receipt=True)


def await_broker_error(client: StompClient, timeout: float = 30.0) -> None:
    """Waits for the ERROR the broker sends on its own for an earlier frame, sending nothing: a frame
    sent after a refused ACK races RabbitMQ's closing channel, and may come back as a bare "Processing
    error" instead of the refusal itself."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client.receive_many(1, 0.5)  # raises the broker's ERROR once it has come
    raise AssertionError(f"no ERROR from the broker in {timeout} s")


def expected(dests: list, count: int) -> list:
    return sorted(f"{d}|m{i}".encode() for d in dests for i in range(count))


# -- the brokers' ACKs with several subscriptions ---------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_cumulative_ack_spans_subscriptions_on_rabbitmq_and_not_on_activemq(stomp_broker, unique_name, tmp_path):
    """The finding the source's ACKs rest on, shown with the plain client. Two subscriptions, a and b, 5
    messages each; ACK of the last message received only (of whichever subscription: the broker
    interleaves them as it likes, under load one may come wholly before the other):
    - RabbitMQ acknowledges every earlier message of both (basic.ack multiple on the connection's one
      channel), and an ACK of the other subscription's last message after it is an unknown delivery
      tag: an ERROR;
    - ActiveMQ acknowledges that subscription's only: the other's come back once the connection closes."""
    url = stomp_broker.url("stomp")
    dests = ["/queue/" + unique_name("span-a"), "/queue/" + unique_name("span-b")]
    publish_stomp(url, dests, 5)
    client = StompClient.from_uri(url).connect()
    try:
        for d in dests:
            client.subscribe(d, ack="client", prefetch=100)
        frames = []
        deadline = time.monotonic() + 30
        while len(frames) < 10 and time.monotonic() < deadline:
            frames += client.receive_many(10 - len(frames), 1.0)
        assert len(frames) == 10
        acked = frames[-1].headers["destination"]
        other = next(d for d in dests if d != acked)
        last_other = [f for f in frames if f.headers["destination"] == other][-1]
        client.ack(frames[-1])
        round_trip(client)
        if stomp_broker.kind == "rabbitmq":
            client.ack(last_other)
            with pytest.raises((StompError, ConnectionClosedError)) as err:
                await_broker_error(client)
            assert "delivery tag" in str(err.value).lower() or "precondition" in str(err.value).lower(), err
        else:
            client.disconnect()
            back = leftovers_stomp(url, dests, expect=5)
            assert sorted(back) == sorted(f"{other}|m{i}".encode() for i in range(5)), back  # the other's only
    finally:
        client.close()
    if stomp_broker.kind == "rabbitmq":
        assert leftovers_stomp(url, dests) == []  # the one ACK had acknowledged both subscriptions


@pytest.mark.timeout(180)
def test_source_acks_of_several_subscriptions_settle_everything_once(stomp_broker, unique_name, tmp_path):
    """ackMode durable: groups cut anywhere (ending on either subscription, holding one of them
    only) are acknowledged by the consumer's ``ack`` with no ERROR, and nothing comes back."""
    url = stomp_broker.url("stomp")
    dests = ["/queue/" + unique_name("ack-a"), "/queue/" + unique_name("ack-b"), "/queue/" + unique_name("ack-c")]
    publish_stomp(url, dests[:2], 20)
    publish_stomp(url, dests[2:], 3)
    consumer = stomp_consumer(url, dests, tmp_path, prefetch="1000")
    try:
        frames = poll_all(consumer, 43)
        for cut in ((0, 1), (1, 2), (2, 7), (7, 8), (8, 30), (30, 43)):
            consumer.ack(frames[cut[0]:cut[1]])
            round_trip(consumer.client)
        rows = [consumer.row(f, i, 0) for i, f in enumerate(frames)]
        assert {r[0].split(b"|")[0].decode() for r in rows} == set(dests)
        assert all(r[1] == r[0].split(b"|")[0].decode() for r in rows)  # destination: its source
    finally:
        consumer.close()
    assert leftovers_stomp(url, dests) == []


@pytest.mark.timeout(180)
def test_source_commit_acks_of_several_subscriptions_settle_everything_once(stomp_broker, unique_name, tmp_path):
    """ackMode commit: tokens taken in delivery order, acknowledged in several transactions, one of
    them with nothing new for a subscription (it gets no ACK, which both brokers would refuse), one
    with nothing new at all (no transaction); then nothing comes back, and what was not committed
    does."""
    url = stomp_broker.url("stomp")
    dests = ["/queue/" + unique_name("cmt-a"), "/queue/" + unique_name("cmt-b")]
    publish_stomp(url, dests, 10)
    consumer = stomp_consumer(url, dests, tmp_path, ackMode="commit", prefetch="1000")
    try:
        frames = poll_all(consumer, 20)
        tokens = [consumer.token(f) for f in frames]
        # the first frame of the other subscription after one of the first: its token adds that one only
        switch = next(i for i in range(1, 20) if frames[i].headers["subscription"] != frames[0].headers["subscription"])
        consumer.ack_commit(tokens[switch - 1])   # the first subscription's frames so far
        round_trip(consumer.client)
        consumer.ack_commit(tokens[switch])       # the other one only: the first has nothing new
        round_trip(consumer.client)
        consumer.ack_commit(tokens[switch])       # nothing new at all
        round_trip(consumer.client)
        consumer.ack_commit(tokens[15])
        round_trip(consumer.client)
    finally:
        consumer.close()
    back = leftovers_stomp(url, dests, expect=len(frames[16:]))
    assert sorted(back) == sorted(f.body for f in frames[16:]), back  # the uncommitted, once


# -- streaming queries over two sources -------------------------------------------------------------------


def _figures(q) -> dict:
    progress = q.lastProgress
    return json.loads(progress["sources"][0]["latestOffset"]) if progress else {}


def _available_now(spark, fmt, options: dict, tmp_path: Path, name: str):
    r = spark.readStream.format(fmt).option("logLocation", str(tmp_path / "log")).option("quietPeriod", "1")
    for k, v in options.items():
        r = r.option(k, str(v))
    q = (r.load().select("body", "destination", "offset").writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
    from pyspark.errors import StreamingQueryException
    try:
        done = q.awaitTermination(QUERY_TIMEOUT)
    except StreamingQueryException:
        done = True
    if not done:
        q.stop()
        pytest.fail(f"query {name} did not finish within {QUERY_TIMEOUT}s")
    assert q.exception() is None, q.exception()
    return spark.sql(f"select body, destination, offset from {name}").collect(), _figures(q)


def _check_rows(rows, dests: list, count: int) -> None:
    assert sorted(r.body for r in rows) == expected(dests, count)  # every message, once
    assert sorted(r.offset for r in rows) == list(range(len(dests) * count))
    for r in rows:
        assert r.destination == r.body.split(b"|")[0].decode(), (r.destination, r.body)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("ack_mode", ["durable", "commit", "auto"])
def test_amqp08_stream_over_two_queues(spark, rabbitmq, unique_name, tmp_path, ack_mode):
    url = rabbitmq.url("amqp")
    queues = [unique_name("multi-a"), unique_name("multi-b")]
    publish_amqp(url, queues, 1500)
    rows, figures = _available_now(spark, "amqp08", {"uri": url, "queue": ",".join(queues), "ackMode": ack_mode,
                                                     "maxMessagesPerTrigger": 700, "prefetch": 400},
                                   tmp_path, f"multi_amqp_{ack_mode}")
    _check_rows(rows, queues, 1500)
    assert figures.get("reconnects") == 0, figures
    assert depths_amqp(url, queues) == [0, 0]


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["rabbitmq", "activemq"])
@pytest.mark.parametrize("ack_mode", ["durable", "commit", "auto"])
def test_stomp_stream_over_two_destinations(spark, request, unique_name, tmp_path, kind, ack_mode):
    url = request.getfixturevalue(kind).url("stomp")
    dests = ["/queue/" + unique_name("multi-a"), "/queue/" + unique_name("multi-b")]
    publish_stomp(url, dests, 800)
    rows, figures = _available_now(spark, "stomp", {"uri": url, "destination": ",".join(dests), "ackMode": ack_mode,
                                                    "maxMessagesPerTrigger": 500, "prefetch": 300},
                                   tmp_path, f"multi_stomp_{kind}_{ack_mode}")
    _check_rows(rows, dests, 800)
    assert figures.get("reconnects") == 0, figures  # an ERROR frame for an ACK would have cost a reconnect
    assert leftovers_stomp(url, dests) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("consumers", [1, 2])
def test_malamute_stream_over_two_streams(spark, malamute_broker, unique_name, tmp_path, consumers):
    """One client reading both streams, or (consumers=2) one lane per stream."""
    streams = [unique_name("weather"), unique_name("alerts")]
    df = (spark.readStream.format("malamute").option("uri", malamute_broker.endpoint)
          .option("streams", json.dumps({streams[0]: "^temp", streams[1]: ""})).option("consumers", consumers)
          .option("logLocation", str(tmp_path / "log")).load())
    q = (df.select("body", "destination", "offset", "subject").writeStream.format("memory").queryName("multi_mlm")
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="200 milliseconds").start())
    want = [f"{streams[0]}|w{i}".encode() for i in range(0, 600, 2)] + [f"{streams[1]}|w{i}".encode()
                                                                     for i in range(600)]
    try:
        deadline = time.monotonic() + 120
        while not _figures(q).get("connected"):  # a stream keeps nothing for absent readers
            assert q.exception() is None, q.exception()
            assert time.monotonic() < deadline, "the source did not report itself connected within 120 s"
            time.sleep(0.2)
        time.sleep(0.5)  # slack: the STREAM-READs are sent before connected is set; their answers may lag
        with MalamuteClient(malamute_broker.endpoint, "", timeout=5) as p0, \
                MalamuteClient(malamute_broker.endpoint, "", timeout=5) as p1:
            p0.set_producer(streams[0])
            p1.set_producer(streams[1])
            for i in range(600):
                p0.send("temp.x" if i % 2 == 0 else "rain.x", f"{streams[0]}|w{i}".encode())
                p1.send("any", f"{streams[1]}|w{i}".encode())
            p0.ping()
            p1.ping()
        deadline = time.monotonic() + 120
        while spark.sql("select count(*) from multi_mlm").collect()[0][0] < len(want):
            assert q.exception() is None, q.exception()
            assert time.monotonic() < deadline, "not every message arrived within 120 s"
            time.sleep(0.3)
        time.sleep(1.0)  # more triggers: a duplicate would show now
    finally:
        q.stop()
    rows = spark.sql("select body, destination, offset from multi_mlm").collect()
    spark.catalog.dropTempView("multi_mlm")
    assert sorted(r.body for r in rows) == sorted(want)
    if consumers == 1:
        assert sorted(r.offset for r in rows) == list(range(len(want)))
    else:  # offsets are positions in each lane's log, and each lane reads one stream
        for stream in streams:
            mine = [r.offset for r in rows if r.destination == stream]
            assert sorted(mine) == list(range(len(mine))), stream
    for r in rows:
        assert r.destination == r.body.split(b"|")[0].decode(), (r.destination, r.body)


# -- batch reads ---------------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt,kind", [("amqp08", "rabbitmq"), ("stomp", "rabbitmq"), ("stomp", "activemq")])
@pytest.mark.parametrize("logged", [False, True], ids=["in-tasks", "logLocation"])
def test_batch_read_over_two_sources(spark, request, unique_name, tmp_path, fmt, kind, logged):
    broker = request.getfixturevalue(kind)
    if fmt == "amqp08":
        url, names = broker.url("amqp"), [unique_name("batch-a"), unique_name("batch-b")]
        publish_amqp(url, names, 700)
        option = "queue"
    else:
        url, names = broker.url("stomp"), ["/queue/" + unique_name("batch-a"), "/queue/" + unique_name("batch-b")]
        publish_stomp(url, names, 700)
        option = "destination"
    r = spark.read.format(fmt).option("uri", url).option(option, ",".join(names)).option("quietPeriod", "1")
    if logged:
        r = r.option("logLocation", str(tmp_path / "batchlog"))
    rows = r.load().select("body", "destination", "offset").collect()
    _check_rows(rows, names, 700)
    if fmt == "amqp08":
        assert depths_amqp(url, names) == [0, 0]
    else:
        assert leftovers_stomp(url, names) == []


# -- the query killed and restarted -------------------------------------------------------------------------

# One driver, one query per ack mode (two destinations each): a kill of the driver kills both queries, so
# one run of kills serves both modes (tests/integration/killing.py)
ACK_MODES = ("durable", "commit")
CHILD = textwrap.dedent("""
    import json, sys
    from pyspark.sql import SparkSession
    from spark_mq.datasources import StompDataSource
    url, work, mode = sys.argv[1:4]
    dests = {m: d.split(",") for m, d in zip(("durable", "commit"), sys.argv[4:6])}
    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.python.authenticate.socketTimeout", "120s").getOrCreate())
    spark.dataSource.register(StompDataSource)
    queries = {}
    for ack_mode, ds in dests.items():
        df = (spark.readStream.format("stomp").option("uri", url).option("destination", ",".join(ds))
              .option("ackMode", ack_mode).option("logLocation", f"{work}/{ack_mode}-log")
              .option("maxMessagesPerTrigger", "300").option("prefetch", "400").option("quietPeriod", "1").load())
        w = (df.select("body", "destination").writeStream.format("parquet").option("path", f"{work}/{ack_mode}-out")
             .option("checkpointLocation", f"{work}/{ack_mode}-ckpt"))
        if mode == "final":
            queries[ack_mode] = w.trigger(availableNow=True).start()
        else:
            queries[ack_mode] = w.trigger(processingTime="100 milliseconds").start()
    if mode == "final":
        result = {}
        for ack_mode, q in queries.items():
            q.awaitTermination(300)
            rows = spark.read.parquet(f"{work}/{ack_mode}-out").collect()
            result[ack_mode] = {"rows": sorted([r.body.decode(), r.destination] for r in rows),
                                "error": str(q.exception()) if q.exception() else None}
        with open(f"{work}/result.json", "w") as f:
            json.dump(result, f)
    else:
        spark.streams.awaitAnyTermination(600)
""")


@pytest.mark.timeout(900)
@pytest.mark.parametrize("kind", ["rabbitmq", "activemq"])
def test_stomp_two_destinations_query_killed_inside_and_between_batches_loses_and_duplicates_nothing(
        request, unique_name, tmp_path, kind):
    """Two queries in one driver, ackMode durable and ackMode commit, each over two destinations; the
    driver SIGKILLed until each query has been killed inside a batch and between two batches (restarted
    from its checkpoint each time), then run to the end: every message of each query's destinations
    exactly once, each row's destination its own; the broker has nothing left."""
    url = request.getfixturevalue(kind).url("stomp")
    dests = {m: ["/queue/" + unique_name(f"kill-{m}-a"), "/queue/" + unique_name(f"kill-{m}-b")] for m in ACK_MODES}
    count = 2500
    for ds in dests.values():
        publish_stomp(url, ds, count)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)

    def start(mode: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(script), url, str(tmp_path), mode,
                                 *(",".join(dests[m]) for m in ACK_MODES)],
                                stdout=child_log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    with open(tmp_path / "children.log", "w") as child_log:
        landed = kill_inside_and_between(lambda: start("stream"), [tmp_path / f"{m}-ckpt" for m in ACK_MODES],
                                         f"{tmp_path}/children.log")
        assert [sorted(x) for x in landed] == [sorted(KILLS)] * len(ACK_MODES), landed
        proc = start("final")
        try:
            proc.wait(400)
        finally:
            kill_group(proc)
    result = json.loads((tmp_path / "result.json").read_text())
    for ack_mode, ds in dests.items():
        got = result[ack_mode]
        assert got["error"] is None, (ack_mode, got["error"])
        bodies = [b for b, _ in got["rows"]]
        assert len(bodies) == 2 * count, f"{ack_mode}: {len(bodies)} rows for {2 * count} messages"
        assert sorted(bodies) == sorted(b.decode() for b in expected(ds, count)), ack_mode
        assert all(d == b.split("|")[0] for b, d in got["rows"]), ack_mode
    assert leftovers_stomp(url, [d for ds in dests.values() for d in ds]) == []
