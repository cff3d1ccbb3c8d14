"""Ingest on the executors (option ``ingest=executors``), against real brokers.

A query reading two queues (destinations) with four consumers reads every message once, on amqp08
(RabbitMQ) and stomp (ActiveMQ; RabbitMQ's STOMP adapter is refused, naming why). The two failure windows of a task, each against a real
broker with the task run in this process: a losing speculative attempt (its link fails) gives its
deliveries back, and both attempts return the winner's rows; a task that dies between linking its
batch file and acknowledging leaves redeliveries that the next batch recognises and drops. The
standalone-cluster runs (worker SIGKILL, driver SIGKILL, speculation) are in ``test_cluster.py``.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter

import pytest

from spark_mq.clients.amqp08 import BasicProperties, Connection
from spark_mq.clients.stomp import StompClient

pytestmark = pytest.mark.integration

QUERY_TIMEOUT = 240


def _publish(fmt: str, url: str, dest: str, start: int, count: int) -> None:
    if fmt == "amqp08":
        with Connection.from_url(url) as conn:
            ch = conn.channel()
            ch.queue_declare(dest, durable=True)
            ch.publish_many(("", dest, f"{dest}:{i}".encode(), BasicProperties(delivery_mode=2))
                            for i in range(start, start + count))
            ch.queue_declare(dest, passive=True)  # a round trip: everything before it reached the broker
        return
    with StompClient.from_uri(url) as client:
        for i in range(start, start + count):
            client.send(dest, f"{dest}:{i}".encode(), headers={"persistent": "true"})
        client.flush()


def _case(request, case: str, unique_name):
    """(fmt, broker, url, two destinations) of a parameter ``amqp08`` / ``stomp-rabbitmq`` / ``stomp-activemq``."""
    fmt, _, kind = case.partition("-")
    broker = request.getfixturevalue(kind or "rabbitmq")
    if fmt == "amqp08":
        return fmt, broker, broker.url("amqp"), [unique_name("xa"), unique_name("xb")]
    return fmt, broker, broker.url("stomp"), ["/queue/" + unique_name("xa"), "/queue/" + unique_name("xb")]


def _options(fmt: str, url: str, dests: list) -> dict:
    key = "queue" if fmt == "amqp08" else "destination"
    return {"uri": url, key: ",".join(dests)}


@pytest.mark.timeout(500)
@pytest.mark.parametrize("case", ["amqp08", "stomp-activemq"])
def test_two_queues_four_consumers_on_executors_read_every_message_once(spark, request, case, unique_name,
                                                                          tmp_path):
    fmt, _, url, dests = _case(request, case, unique_name)
    per_queue = 1500
    for d in dests:
        _publish(fmt, url, d, 0, per_queue)
    expected = Counter(f"{d}:{i}".encode() for d in dests for i in range(per_queue))
    seen: dict = {}

    def collect(batch_df, batch_id):  # idempotent: a replayed batch replaces its rows
        seen[batch_id] = [(r.offset, r.body, r.destination) for r in batch_df.select("offset", "body", "destination")
                          .collect()]

    r = spark.readStream.format(fmt).option("logLocation", str(tmp_path / "log"))
    for k, v in {**_options(fmt, url, dests), "ingest": "executors", "consumers": 4,
                 "taskIngestTime": "1s", "taskMaxMessages": 400}.items():
        r = r.option(k, str(v))
    q = r.load().writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt")) \
        .trigger(processingTime="100 milliseconds").start()
    try:
        deadline = time.monotonic() + QUERY_TIMEOUT
        while sum(len(rows) for rows in list(seen.values())) < sum(expected.values()):
            assert q.exception() is None, q.exception()
            assert time.monotonic() < deadline, f"{sum(len(v) for v in seen.values())} of {sum(expected.values())}"
            time.sleep(0.2)
        batches_then = len(seen)
        while len(seen) < batches_then + 2:  # two more batches: a duplicate taken by now would show below
            assert q.exception() is None, q.exception()
            assert time.monotonic() < deadline, "no further batches"
            time.sleep(0.2)
    finally:
        q.stop()
    rows = [row for batch in seen.values() for row in batch]
    assert Counter(body for _, body, _ in rows) == expected
    assert {dest for _, _, dest in rows} == set(dests)  # the destination column names the queue, for both
    # offsets: unique in the query (batch, lane, position in its file), every lane's file took messages
    assert len({o for o, _, _ in rows}) == len(rows)
    from spark_mq.sources.executors import MAX_LANES, OFFSET_STRIDE
    assert {(o // OFFSET_STRIDE) % MAX_LANES for o, _, _ in rows} == {0, 1, 2, 3}
    lanes = set(os.listdir(tmp_path / "log")) - {"executors.json"}
    assert len(lanes) == 4, lanes
    assert (tmp_path / "log" / "executors.json").exists()


def _task(fmt: str, url: str, dests: list, root, batch: int, lane: int = 0, connector=None):
    import importlib

    from spark_mq.options import SOURCE, parse_options
    from spark_mq.sources.executors import TaskPartition

    opts = parse_options({**_options(fmt, url, dests), "logLocation": str(root), "ingest": "executors",
                          "prefetch": "100", "taskMaxMessages": "100", "taskIngestTime": "2s"},
                         format=fmt, direction=SOURCE)
    connect = connector or importlib.import_module(f"spark_mq.sources.formats.{fmt}").connect_consumer
    return TaskPartition(0, fmt, opts, connect, batch, lane, 1, str(root))


def _bodies(part) -> list:
    import pyarrow as pa

    from spark_mq import schema as S
    from spark_mq.sources.executors import run_task
    target = S.source_arrow_schema(part.fmt)
    return [b for batch in run_task(part, target) for b in pa.Table.from_batches([batch]).column("body").to_pylist()]


def _remaining(fmt, broker, dests) -> int:
    with Connection.from_url(broker.url("amqp")) as conn:
        return sum(conn.channel().queue_declare(d.rsplit("/", 1)[-1], passive=True).message_count for d in dests)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", ["amqp08", "stomp-activemq"])
def test_a_losing_speculative_attempt_gives_its_deliveries_back(request, case, unique_name, tmp_path):
    """Two attempts of one task (speculation): both consume, the first to link its file wins. The
    loser's link fails, it closes without acknowledging, and returns the winner's rows; what it had
    drained comes back redelivered and the next batch takes it as new (it is in no file)."""
    from spark_mq.sources.batchfiles import batch_path
    from spark_mq.sources.executors import _consume, _session
    fmt, broker, url, dests = _case(request, case, unique_name)
    dests = dests[:1]
    _publish(fmt, url, dests[0], 0, 300)
    first, second = _task(fmt, url, dests, tmp_path, 0), _task(fmt, url, dests, tmp_path, 0)
    path = batch_path(str(tmp_path), 0, 0)
    consumer = second.connector(second.opts, 0)  # attempt 2 found no file and connected ...
    try:
        _consume(first, path)                    # ... attempt 1 drains and links batch 0 ...
        _session(consumer, second, path)         # ... attempt 2 drains other messages, and loses the link
    finally:
        consumer.close()
    assert _bodies(second) == _bodies(first) and len(_bodies(first)) == 100
    later = []
    for batch in range(1, 6):
        later += _bodies(_task(fmt, url, dests, tmp_path, batch))
        if len(later) >= 200:
            break
    every = _bodies(first) + later
    assert Counter(every) == Counter(f"{dests[0]}:{i}".encode() for i in range(300)), len(every)
    if broker.kind == "rabbitmq":
        assert _remaining(fmt, broker, dests) == 0


def _the_rest(fmt: str, url: str, dests: list, root, left: int, within: float = 90.0) -> list:
    """The bodies of batches 1, 2, ... until ``left`` more were read (or ``within`` seconds passed: a broker
    just restarted on a busy machine may take longer than one task's ingest time to send them again),
    then of one more batch after a moment: anything still coming back then would be a duplicate."""
    bodies: list = []
    batch = 1
    deadline = time.monotonic() + within
    while len(bodies) < left and time.monotonic() < deadline:
        bodies += _bodies(_task(fmt, url, dests, root, batch))
        batch += 1
    time.sleep(0.5)
    return bodies + _bodies(_task(fmt, url, dests, root, batch))


class _DiesAfterLink:
    """A connector whose consumers die (their connection closed, no ack sent) where the task acks:
    a task SIGKILLed between linking its batch file and acknowledging."""

    def __init__(self, connect) -> None:
        self.connect = connect

    def __call__(self, opts, attempt):
        consumer = self.connect(opts, attempt)
        consumer.ack = lambda msgs: consumer.close()
        return consumer


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", ["amqp08", "stomp-activemq"])
def test_a_task_dead_between_link_and_ack_duplicates_nothing(request, case, unique_name, tmp_path):
    """The broker redelivers the batch-0 messages whose ack never came; the next batches recognise
    them in batch 0's file and drop them, so every message is in exactly one batch file."""
    import importlib

    fmt, broker, url, dests = _case(request, case, unique_name)
    dests = dests[:1]
    _publish(fmt, url, dests[0], 0, 250)
    dying = _DiesAfterLink(importlib.import_module(f"spark_mq.sources.formats.{fmt}").connect_consumer)
    every = _bodies(_task(fmt, url, dests, tmp_path, 0, connector=dying))
    assert len(every) == 100
    every += _the_rest(fmt, url, dests, tmp_path, 250 - len(every))
    assert Counter(every) == Counter(f"{dests[0]}:{i}".encode() for i in range(250)), len(every)
    if broker.kind == "rabbitmq":
        assert _remaining(fmt, broker, dests) == 0


class _BrokerDiesAtAck:
    """A connector whose consumers' ack SIGKILLs the broker instead: the broker dies after a task linked
    its batch file and before its ACK reached it (a broker restart in that window)."""

    def __init__(self, connect, broker) -> None:
        self.connect, self.broker = connect, broker

    def __call__(self, opts, attempt):
        consumer = self.connect(opts, attempt)

        def ack(msgs):
            self.broker.kill()
            raise OSError("the broker died before the ACK")
        consumer.ack = ack
        return consumer


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt,kind", [("amqp08", "rabbitmq"), ("stomp", "activemq")])
def test_a_broker_restarted_between_a_tasks_link_and_ack_duplicates_nothing(request, unique_name, tmp_path, fmt,
                                                                           kind):
    """After the restart the broker sends batch 0's messages again, and ActiveMQ does not mark them
    redelivered (it keeps no such flag across a restart): the next batches still recognise them in batch
    0's file, so every message is in exactly one batch file (seen failing: 100 read twice)."""
    import importlib

    broker = request.getfixturevalue(f"{kind}_isolated")()
    url = broker.url("amqp" if fmt == "amqp08" else "stomp")
    dests = [unique_name("xk") if fmt == "amqp08" else "/queue/" + unique_name("xk")]
    _publish(fmt, url, dests[0], 0, 250)
    if hasattr(broker, "sync"):
        broker.sync()  # RabbitMQ: the queue and its messages on disk before the kill
    dying = _BrokerDiesAtAck(importlib.import_module(f"spark_mq.sources.formats.{fmt}").connect_consumer, broker)
    every = _bodies(_task(fmt, url, dests, tmp_path, 0, connector=dying))
    assert len(every) == 100
    broker.restart()
    every += _the_rest(fmt, url, dests, tmp_path, 250 - len(every))
    assert Counter(every) == Counter(f"{dests[0]}:{i}".encode() for i in range(250)), \
        sorted((b, n) for b, n in Counter(every).items() if n > 1)[:5]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("fmt,kind", [("amqp08", "rabbitmq"), ("stomp", "activemq")])
def test_executor_ingest_rides_out_a_broker_restart(spark, request, unique_name, tmp_path, fmt, kind):
    """The broker is SIGKILLed mid-stream and restarted: tasks that lose their connection (or cannot
    connect) before linking their batch file connect again and drain anew (what they held comes back
    from the broker), within brokerTimeout; the query does not fail and every message is read once."""
    broker = request.getfixturevalue(f"{kind}_isolated")()
    url = broker.url("amqp" if fmt == "amqp08" else "stomp")
    dest = unique_name("xr") if fmt == "amqp08" else "/queue/" + unique_name("xr")
    total = 6000
    _publish(fmt, url, dest, 0, total)
    if hasattr(broker, "sync"):
        broker.sync()  # RabbitMQ: the queue's declaration on disk before the kill
    r = spark.readStream.format(fmt).option("logLocation", str(tmp_path / "log"))
    for k, v in {**_options(fmt, url, [dest]), "ingest": "executors", "consumers": 2, "prefetch": 100,
                 "taskMaxMessages": 150, "taskIngestTime": "1s", "reconnectDelay": "0.2",
                 "reconnectMaxDelay": "1"}.items():
        r = r.option(k, str(v))
    name = f"executors_broker_kill_{fmt}_{kind}"
    q = (r.load().select("body").writeStream.format("memory").queryName(name)
         .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(processingTime="100 milliseconds").start())

    def count() -> int:
        return spark.sql(f"select count(*) from {name}").collect()[0][0]

    try:
        deadline = time.monotonic() + 120
        while count() < 600 and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.1)
        assert 600 <= count() < total // 2, count()
        broker.kill()
        time.sleep(2.0)
        broker.restart()
        deadline = time.monotonic() + 240
        while count() < total and time.monotonic() < deadline:
            assert q.exception() is None, q.exception()
            time.sleep(0.5)
        batches = q.lastProgress["batchId"]
        while q.lastProgress["batchId"] < batches + 2 and time.monotonic() < deadline:  # duplicates would show
            time.sleep(0.2)
        assert q.exception() is None, q.exception()
    finally:
        q.stop()
    rows = spark.sql(f"select body from {name}").collect()
    assert Counter(r.body for r in rows) == Counter(f"{dest}:{i}".encode() for i in range(total))


@pytest.mark.timeout(200)
@pytest.mark.parametrize("case", ["amqp08"])
def test_equal_messages_are_all_read_across_batches(request, case, unique_name, tmp_path):
    """amqp08 (STOMP cannot stop a subscription and still acknowledge: see StompConsumer). 600 messages of the same body and no id (a heartbeat, a fixed status event), drained 200 per
    task with a prefetch of 300. A task that acknowledged while its subscription still ran would get
    more deliveries before its close, which would come back redelivered; looked up by content (these
    brokers' ids are not stable) they match the batch file's equal messages and would be dropped as
    duplicates: lost. The task stops deliveries first and takes what came meanwhile."""
    fmt, broker, url, dests = _case(request, case, unique_name)
    dest = dests[0]
    if fmt == "amqp08":
        with Connection.from_url(url) as conn:
            ch = conn.channel()
            ch.queue_declare(dest, durable=True)
            ch.publish_many(("", dest, b"same", BasicProperties(delivery_mode=2)) for _ in range(600))
            ch.queue_declare(dest, passive=True)
    else:
        with StompClient.from_uri(url) as client:
            for _ in range(600):
                client.send(dest, b"same", headers={"persistent": "true"})
            client.flush()
    import importlib

    from spark_mq.options import SOURCE, parse_options
    from spark_mq.sources.executors import TaskPartition
    opts = parse_options({**_options(fmt, url, [dest]), "logLocation": str(tmp_path), "ingest": "executors",
                          "prefetch": "300", "taskIngestTime": "2s"}, format=fmt, direction=SOURCE)
    connect = importlib.import_module(f"spark_mq.sources.formats.{fmt}").connect_consumer
    got = []
    for batch in range(8):
        # a task that takes at most 200 (its share of maxMessagesPerTrigger) while the broker may send 300
        part = TaskPartition(0, fmt, opts.replace(maxMessagesPerTrigger=200), connect, batch, 0, 1, str(tmp_path))
        got += _bodies(part)
        if _remaining(fmt, broker, [dest]) == 0 and len(got) >= 600:
            break
    assert len(got) == 600 and set(got) == {b"same"}, len(got)


@pytest.mark.timeout(200)
def test_stomp_on_rabbitmq_is_refused_naming_why(spark, rabbitmq, unique_name, tmp_path):
    """RabbitMQ's STOMP adapter refuses an ACK after UNSUBSCRIBE and changes message ids per session: a
    task could tell what comes back after its ACK from an equal message only by content (measured: a
    bench queue of equal bodies lost two thirds). The query fails at its first batch, naming the option
    and the way out; nothing is acknowledged, the queue keeps its messages."""
    url, dest = rabbitmq.url("stomp"), "/queue/" + unique_name("xs")
    _publish("stomp", url, dest, 0, 50)
    r = spark.readStream.format("stomp").option("logLocation", str(tmp_path / "log"))
    for k, v in {"uri": url, "destination": dest, "ingest": "executors", "taskIngestTime": "0.5s"}.items():
        r = r.option(k, v)
    q = r.load().writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt")).start()
    from pyspark.errors import StreamingQueryException
    try:
        with pytest.raises(StreamingQueryException) as failed:
            q.awaitTermination(120)
    finally:
        q.stop()
    text = str(failed.value)
    assert "option 'ingest' is executors" in text and "format('amqp08')" in text, text[:2000]
    assert _remaining("stomp", rabbitmq, [dest]) == 50


@pytest.mark.timeout(400)
@pytest.mark.parametrize("case", ["amqp08", "stomp-activemq"])
def test_available_now_ends_on_a_queue_a_producer_keeps_feeding(spark, request, case, unique_name, tmp_path):
    """availableNow reads what the queue held when the run began and ends, though a producer keeps sending
    (about 100 messages a second, so no batch ever comes back empty): amqp08 at the queue depth the driver
    counts at the start, ActiveMQ at the first message it stamped after the start. Before, such a run went
    on to availableNowTimeout."""
    fmt, _, url, dests = _case(request, case, unique_name)
    dest, preload = dests[0], 3000  # one destination: ActiveMQ's stamps end a run of one queue only
    _publish(fmt, url, dest, 0, preload)
    stop = threading.Event()

    def feed():
        i = preload
        while not stop.is_set():
            _publish(fmt, url, dest, i, 10)
            i += 10
            stop.wait(0.1)

    seen: dict = {}

    def collect(batch_df, batch_id):
        seen[batch_id] = [r.body for r in batch_df.select("body").collect()]

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        r = spark.readStream.format(fmt).option("logLocation", str(tmp_path / "log"))
        for k, v in {**_options(fmt, url, [dest]), "ingest": "executors", "taskIngestTime": "1s",
                     "taskMaxMessages": 500, "availableNowTimeout": "200s"}.items():
            r = r.option(k, str(v))
        began = time.monotonic()
        q = r.load().writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt")) \
            .trigger(availableNow=True).start()
        ended = q.awaitTermination(QUERY_TIMEOUT)
        took = time.monotonic() - began
    finally:
        stop.set()
        feeder.join(30)
    if not ended:
        q.stop()
    assert ended, f"the availableNow run did not end within {QUERY_TIMEOUT}s"
    assert q.exception() is None, q.exception()
    bodies = Counter(b for rows in seen.values() for b in rows)
    assert [b for b, n in bodies.items() if n > 1] == []
    missing = [i for i in range(preload) if f"{dest}:{i}".encode() not in bodies]
    assert missing == [], f"{len(missing)} of the {preload} messages there at the start were not read"
    print(f"{case}: the availableNow run took {took:.1f}s and read {sum(bodies.values())} messages")
    # the run's end: well before availableNowTimeout (200 s, far from a run's time on a busy machine);
    # before the end rules of the depth and the stamps it ran on to it (to a 90 s timeout: 93 s, 99 s)
    assert took < 150, f"the run took {took:.0f}s: it went on to availableNowTimeout while the producer sent"
