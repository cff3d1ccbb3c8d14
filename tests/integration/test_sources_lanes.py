"""Several consumers (option ``consumers``): lanes competing for one queue, against real brokers.

amqp08 on RabbitMQ with 4 consumers on one queue (every message read exactly once, every lane got
some, order kept within each lane's partitions); a redelivery that lands on another lane (one
lane's connection cut with messages logged and not acknowledged) is dropped there; availableNow
over lanes; stomp with 2 consumers on RabbitMQ and ActiveMQ; a restart with another ``consumers``
fails naming it. Every query and wait is bounded. The query with four lanes SIGKILLed inside a batch and
between two batches is in test_sources_failures.py (``test_query_killed_inside_and_between_batches...``:
one driver, a query of one consumer and one of four).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from sinktest import finish

from spark_mq.clients.amqp08 import BasicProperties, Connection
from spark_mq.clients.stomp import StompClient


pytestmark = pytest.mark.integration

QUERY_TIMEOUT = 240


def _publish_amqp(url: str, queue: str, start: int, count: int, ids: bool = True) -> None:
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.publish_many(("", queue, f"m{i}".encode(),
                         BasicProperties(message_id=f"id{i}" if ids else None, delivery_mode=2))
                        for i in range(start, start + count))
        ch.queue_declare(queue, passive=True)  # a round trip: everything before it reached the broker


def _queue_depth(url: str, queue: str) -> int:
    with Connection.from_url(url) as conn:
        return conn.channel().queue_declare(queue, passive=True).message_count


def _last_source_offset(ckpt: Path) -> dict:
    d = ckpt / "offsets"
    last = max(int(f.name) for f in d.iterdir() if f.name.isdigit())
    return json.loads((d / str(last)).read_text().strip().splitlines()[-1])


def _finish(q, name: str):
    return finish(q, QUERY_TIMEOUT, f"query {name}")


def _stream(spark, fmt: str, options: dict, log: Path):
    r = spark.readStream.format(fmt).option("logLocation", str(log))
    for k, v in {"quietPeriod": 0.5, **options}.items():
        r = r.option(k, str(v))
    return r.load()


def _collector():
    """A foreachBatch function keeping, per batch, each partition's (offset, body) rows in order."""
    batches: dict = {}

    def collect(batch_df, batch_id):
        batches[batch_id] = batch_df.select("offset", "body").rdd.mapPartitions(
            lambda it: [[(r.offset, r.body) for r in it]]).collect()

    return batches, collect


def _check_lanes_order(batches: dict) -> list:
    """Every partition reads one lane in order: contiguous offsets, and (one producer, a queue
    delivers in order) rising message numbers. Returns all bodies."""
    bodies = []
    for parts in batches.values():
        for part in parts:
            if not part:
                continue
            offsets = [o for o, _ in part]
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
            numbers = [int(b[1:]) for _, b in part]
            assert numbers == sorted(numbers)
            bodies += [b for _, b in part]
    return bodies


@pytest.mark.timeout(400)
def test_four_consumers_on_one_queue_read_every_message_once(spark, rabbitmq, unique_name, tmp_path):
    url, queue, total = rabbitmq.url("amqp"), unique_name("lanes"), 10_000
    _publish_amqp(url, queue, 0, total)
    batches, collect = _collector()
    df = _stream(spark, "amqp08", {"uri": url, "queue": queue, "consumers": 4, "prefetch": 200,
                                   "maxMessagesPerTrigger": 3000}, tmp_path / "log")
    q = _finish(df.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt"))
                .trigger(availableNow=True).start(), "four consumers")
    assert q.exception() is None, q.exception()
    bodies = _check_lanes_order(batches)
    assert Counter(bodies) == Counter(f"m{i}".encode() for i in range(total))  # each exactly once
    lanes = _last_source_offset(tmp_path / "ckpt")["lanes"]
    assert len(lanes) == 4 and sum(lanes) == total and all(n > 0 for n in lanes), lanes
    sizes = [sum(len(p) for p in parts) for parts in batches.values()]
    assert max(sizes) <= 3000, sizes  # the limit holds for the batch as a whole
    assert json.loads((tmp_path / "log" / "lanes.json").read_text()) == {"consumers": 4}
    assert _queue_depth(url, queue) == 0


def _shut_socket(consumer) -> None:
    """Cut one consumer's connection under it (as a network cut would): the broker requeues what the
    connection had not acknowledged."""
    seen, todo = set(), [consumer]
    while todo:  # the socket somewhere inside the client: no test hook in the product for this
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, socket.socket):
            obj.shutdown(socket.SHUT_RDWR)
            return
        todo.extend(v for v in getattr(obj, "__dict__", {}).values()
                    if isinstance(v, socket.socket) or hasattr(v, "__dict__"))
    raise AssertionError(f"no socket found in {consumer!r}")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", ["amqp08", "stomp"])
def test_a_redelivery_landing_on_another_lane_is_dropped(fmt, rabbitmq, unique_name, tmp_path):
    """ackMode=commit: lane 0 logs messages that wait for Spark's commit (unacknowledged); its
    connection is cut, the broker requeues them and, while lane 0 is held from reconnecting, gives
    them to lane 1, marked redelivered. Lane 1 must recognise them in lane 0's log (one dedup for
    the query) and drop them: every message reaches the lanes' logs once. No message ids (amqp08)
    or RabbitMQ's per-session STOMP ids: recognised by content."""
    import importlib

    from spark_mq.options import SOURCE, parse_options
    from spark_mq.sources.lanes import Lanes

    total = 600
    body = [f"m{i}".encode() for i in range(total)]
    queue = unique_name("cross")
    if fmt == "amqp08":
        _publish_amqp(rabbitmq.url("amqp"), queue, 0, total, ids=False)
        options = {"uri": rabbitmq.url("amqp"), "queue": queue}
    else:
        with Connection.from_url(rabbitmq.url("amqp")) as conn:
            conn.channel().queue_declare(queue, durable=True)
        with StompClient.from_uri(rabbitmq.url("stomp")) as client:
            for b in body:
                client.send("/queue/" + queue, b, headers={"persistent": "true"})
            client.flush()
        options = {"uri": rabbitmq.url("stomp"), "destination": "/queue/" + queue}
    opts = parse_options({**options, "logLocation": str(tmp_path / "log"), "consumers": "2", "ackMode": "commit",
                          "prefetch": "100", "fsyncMessages": "20", "reconnectDelay": "0.2"},
                         format=fmt, direction=SOURCE)
    connect = importlib.import_module(f"spark_mq.sources.formats.{fmt}").connect_consumer
    release_lane0 = threading.Event()
    calls = Counter()

    def connector(o, attempt):
        lane = int(o.logLocation.rsplit("-", 1)[1])
        calls[lane] += 1
        if lane == 0 and calls[lane] > 1:
            release_lane0.wait(120)  # lane 0 stays away while lane 1 takes its redeliveries
        return connect(o, attempt)

    lanes = Lanes.open(fmt, opts, connector)
    lane0, lane1 = lanes.ingests
    lanes.start()
    lanes.resume_at(lanes.tail())
    try:
        # both lanes hold messages logged and waiting for the commit (the broker sends no more)
        assert lanes.wait_for(lambda: lane0.log.durable_head >= 40 and lane1.log.durable_head >= 40, 60), \
            lanes.durable_head()
        time.sleep(0.5)
        logged0 = lane0.log.durable_head
        _shut_socket(lane0._consumer)
        committed = (0, 0)
        bodies = []
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (len(bodies) < total or lane1.duplicates < logged0):
            lanes.check()
            head = lanes.durable_head()
            if head != committed:  # as Spark would: read the batch, then commit it
                for ing, lo, hi in zip(lanes.ingests, committed, head):
                    if hi > lo:
                        bodies += [b for batch in ing.log.read(lo, hi) for b in batch.column("body").to_pylist()]
                lanes.catch_up(head)
                lanes.commit(head)
                committed = head
            time.sleep(0.05)
        release_lane0.set()
        time.sleep(1.0)  # anything more now would be a duplicate
        head = lanes.durable_head()
        for ing, lo, hi in zip(lanes.ingests, committed, head):
            if hi > lo:
                bodies += [b for batch in ing.log.read(lo, hi) for b in batch.column("body").to_pylist()]
        lanes.commit(head)
        assert lane1.duplicates >= logged0 > 0, (lane1.duplicates, logged0, lane1.redeliveries)
        assert Counter(bodies) == Counter(body), (len(bodies), lane1.duplicates)
    finally:
        release_lane0.set()
        lanes.stop()
    assert _queue_depth(rabbitmq.url("amqp"), queue) == 0


@pytest.mark.timeout(600)
def test_available_now_over_lanes_then_a_changed_consumers_fails(spark, rabbitmq, unique_name, tmp_path):
    """Each run of availableNow ends when every lane reached its target: the backlog present at the
    start, all of it, once; a second run reads what came since. A restart with another number of
    consumers fails at start, naming the option, the old and new values."""
    url, queue = rabbitmq.url("amqp"), unique_name("an")
    log, ckpt = tmp_path / "log", str(tmp_path / "ckpt")

    def run(consumers: int):
        batches, collect = _collector()
        df = _stream(spark, "amqp08", {"uri": url, "queue": queue, "consumers": consumers}, log)
        q = _finish(df.writeStream.foreachBatch(collect).option("checkpointLocation", ckpt)
                    .trigger(availableNow=True).start(), f"availableNow consumers={consumers}")
        return q, batches

    _publish_amqp(url, queue, 0, 3000)
    q, batches = run(3)
    assert q.exception() is None, q.exception()
    assert Counter(_check_lanes_order(batches)) == Counter(f"m{i}".encode() for i in range(3000))
    _publish_amqp(url, queue, 3000, 500)
    q, batches = run(3)
    assert q.exception() is None, q.exception()
    assert Counter(_check_lanes_order(batches)) == Counter(f"m{i}".encode() for i in range(3000, 3500))
    for other in (2, 1):
        q, batches = run(other)
        assert q.exception() is not None and not any(batches.values())
        text = str(q.exception())
        assert f"option 'consumers' is {other}" in text and "consumers=3" in text, text


@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["rabbitmq", "activemq"])
def test_stomp_with_two_consumers(spark, request, unique_name, tmp_path, kind):
    broker = request.getfixturevalue(kind)
    url, dest, total = broker.url("stomp"), "/queue/" + unique_name("lanes"), 2000
    with StompClient.from_uri(url) as client:
        for i in range(total):
            client.send(dest, f"m{i}".encode(), headers={"persistent": "true"})
        client.flush()
    batches, collect = _collector()
    df = _stream(spark, "stomp", {"uri": url, "destination": dest, "consumers": 2, "prefetch": 100,
                                  "quietPeriod": 1.0}, tmp_path / "log")
    # a processing-time trigger, polled until every message is in: RabbitMQ's STOMP adapter pauses up to
    # half a second within a drain (docs/sources.md), which an availableNow run's quiet period must outlast
    q = df.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt")) \
        .trigger(processingTime="200 milliseconds").start()
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT
        while sum(len(p) for parts in list(batches.values()) for p in parts) < total:
            assert q.exception() is None, q.exception()
            assert time.monotonic() < deadline, f"not all {total} messages read within {QUERY_TIMEOUT}s"
            time.sleep(0.2)
        q.processAllAvailable()  # one more round: a duplicate logged by now would show below
    finally:
        q.stop()
    assert Counter(_check_lanes_order(batches)) == Counter(f"m{i}".encode() for i in range(total))
    lanes = _last_source_offset(tmp_path / "ckpt")["lanes"]
    assert len(lanes) == 2 and sum(lanes) == total and all(n > 0 for n in lanes), lanes
