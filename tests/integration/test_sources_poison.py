"""Issue 43, item 7: poison messages. A delivery the client cannot decode, or the source cannot
store, must neither drop the connection in a loop (the query RUNNING with no batches, reconnecting
without backoff) nor be lost: a value that can be kept raw or replaced is kept so and the message
is delivered; a delivery that keeps failing fails the query naming it, or is dead-lettered by option.

Poison messages are produced as each broker lets them through (found out with raw frames,
2026-11-28): RabbitMQ passes AMQP field-table timestamps of any 64-bit value, headers tables nested
2,000 deep (it refuses unknown field types: 541), STOMP header bytes that are not UTF-8 and STOMP
``timestamp`` headers of any size; ActiveMQ replaces bytes that are not UTF-8 by U+FFFD, turns a
header line without a colon into an empty value and refuses a huge timestamp itself, so no broker
delivers a colon-less header line (that case is unit-tested in tests/unit/test_stomp_codec.py).
Values out of a column's range were already stored as null (spark_mq.arrowcols). Every query is
bounded: a livelock fails the test, never hangs it.
"""

from __future__ import annotations

import socket
import struct
import time

import pytest

from sinktest import finish

from spark_mq.clients.amqp08 import BasicProperties, Connection
from spark_mq.clients.stomp import StompClient

pytestmark = pytest.mark.integration

QUERY_TIMEOUT = 120
_MS_TIMESTAMP = 1_795_873_185_900  # 2026-11-28 in milliseconds: as seconds, the year 58,878


class _RawHeaders(BasicProperties):
    """Basic properties whose headers table is given as bytes: our encoder (like pika's) cannot
    write a timestamp past the year 9999, which other clients send (milliseconds where AMQP means
    seconds)."""

    __slots__ = ("raw",)

    def encode(self) -> bytes:
        return struct.pack(">H", 0x2000) + struct.pack(">I", len(self.raw)) + self.raw


def _shortstr(text: str) -> bytes:
    raw = text.encode()
    return bytes([len(raw)]) + raw


def _poison_table(n: int) -> bytes:
    return (_shortstr("sent") + b"T" + struct.pack(">Q", _MS_TIMESTAMP)
            + _shortstr("n") + b"S" + struct.pack(">I", len(str(n))) + str(n).encode())


def _finish(q, name: str):
    return finish(q, QUERY_TIMEOUT, f"query {name} (livelock?)")


def _read_all(spark, fmt: str, opts: dict, tmp_path, name: str):
    """Drain with availableNow into a list of rows; returns (rows, query)."""
    got = []
    r = spark.readStream.format(fmt).option("logLocation", str(tmp_path / f"log-{name}")) \
        .option("quietPeriod", "1").option("brokerTimeout", "60")
    for k, v in opts.items():
        r = r.option(k, str(v))
    q = r.load().writeStream.foreachBatch(lambda df, _id: got.extend(df.collect())) \
        .option("checkpointLocation", str(tmp_path / f"ckpt-{name}")).trigger(availableNow=True).start()
    return got, _finish(q, name)


def _stomp_raw_send(port: int, frames: list[bytes], login: bool) -> None:
    """SEND frames byte for byte (our client, like stomp.py, writes only valid UTF-8 headers)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"CONNECT\n" + (b"login:guest\npasscode:guest\n" if login else b"") + b"\n\x00")
        _recv_until(s, b"\x00")
        for frame in frames:
            s.sendall(frame)
        s.sendall(b"DISCONNECT\nreceipt:bye\n\n\x00")
        got = _recv_until(s, b"RECEIPT")
        assert b"RECEIPT" in got, got  # the broker took every SEND before it


def _recv_until(s: socket.socket, marker: bytes, timeout: float = 10.0) -> bytes:
    deadline = time.monotonic() + timeout
    out = b""
    while marker not in out and time.monotonic() < deadline:
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            data = s.recv(65536)
        except socket.timeout:
            break
        if not data:
            break
        out += data
    return out


def _send_frame(dest: str, body: bytes, headers: bytes = b"") -> bytes:
    return b"SEND\ndestination:" + dest.encode() + b"\n" + headers + \
        b"content-length:" + str(len(body)).encode() + b"\n\n" + body + b"\x00"


# -- 1. tolerant decoding ---------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_amqp_field_table_timestamp_past_year_9999_is_delivered(spark, rabbitmq, unique_name, tmp_path):
    """A header timestamp in milliseconds dropped the connection at every delivery (OverflowError in
    the decoder); the broker redelivered it first, and the query stayed RUNNING with no batch."""
    url, queue = rabbitmq.url("amqp"), unique_name("poison-ts")
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        ch.basic_publish("", queue, b"before", BasicProperties(message_id="m0", delivery_mode=2))
        poison = _RawHeaders()
        poison.raw = _poison_table(1)
        ch.basic_publish("", queue, b"poison", poison)
        ch.basic_publish("", queue, b"after", BasicProperties(message_id="m2", delivery_mode=2))
        ch.queue_declare(queue, passive=True)
    rows, q = _read_all(spark, "amqp08", {"uri": url, "queue": queue}, tmp_path, "ts")
    assert q.exception() is None, q.exception()
    by_body = {r.body: r for r in rows}
    assert sorted(by_body) == [b"after", b"before", b"poison"], rows
    headers = dict(by_body[b"poison"].headers)
    # kept as its count of seconds (here: the milliseconds the sender meant), not dropped or shifted
    assert headers == {"sent": str(_MS_TIMESTAMP), "n": "1"}, headers


@pytest.mark.timeout(300)
def test_stomp_header_bytes_not_utf8_are_delivered(spark, stomp_broker, unique_name, tmp_path):
    """RabbitMQ passes header bytes that are not UTF-8 through to consumers (ActiveMQ replaces them by
    U+FFFD itself); the parser failed the connection on them, at every redelivery."""
    dest = "/queue/" + unique_name("poison-utf8")
    frames = [_send_frame(dest, b"before"), _send_frame(dest, b"poison", b"x-bad:ab\xff\xfecd\n"),
              _send_frame(dest, b"after")]
    _stomp_raw_send(stomp_broker.stomp_port, frames, login=stomp_broker.kind == "rabbitmq")
    rows, q = _read_all(spark, "stomp", {"uri": stomp_broker.url("stomp"), "destination": dest}, tmp_path, "utf8")
    assert q.exception() is None, q.exception()
    by_body = {r.body: r for r in rows}
    assert sorted(by_body) == [b"after", b"before", b"poison"], rows
    # each byte that is not UTF-8 shows as U+FFFD (the map holds strings); ActiveMQ sends the same
    assert dict(by_body[b"poison"].headers)["x-bad"] == "ab\ufffd\ufffdcd"


# -- 3. a delivery that keeps failing -----------------------------------------------------------------------


def _nested_table(depth: int) -> bytes:
    """A headers table holding a table ... ``depth`` deep: RabbitMQ takes and delivers it (2,000
    deep, measured 2026-11-28); decoding it passes Python's recursion limit."""
    table = b""
    for _ in range(depth):
        table = _shortstr("k") + b"F" + struct.pack(">I", len(table)) + table
    return table


def _publish_undecodable_amqp(url: str, queue: str, arguments=None) -> None:
    """m0, then a message whose properties no client of ours decodes, then m2."""
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True, arguments=arguments)
        ch.basic_publish("", queue, b"before", BasicProperties(message_id="m0", delivery_mode=2))
        poison = _RawHeaders()
        poison.raw = _nested_table(2000)
        ch.basic_publish("", queue, b"poison", poison)
        ch.basic_publish("", queue, b"after", BasicProperties(message_id="m2", delivery_mode=2))
        ch.queue_declare(queue, passive=True)


@pytest.mark.timeout(300)
def test_a_delivery_that_keeps_failing_fails_the_query_naming_it(spark, rabbitmq, unique_name, tmp_path):
    """Before: the reader thread died with RecursionError, the connection with it, at every redelivery."""
    url, queue = rabbitmq.url("amqp"), unique_name("poison-fail")
    _publish_undecodable_amqp(url, queue)
    t0 = time.monotonic()
    rows, q = _read_all(spark, "amqp08", {"uri": url, "queue": queue, "maxDeliveryFailures": 3}, tmp_path, "fail")
    error = str(q.exception())
    assert "failed 3 sessions" in error and queue in error and "RecursionError" in error, error[-3000:]
    assert "maxDeliveryFailures=3" in error and "poisonMessages=fail" in error, error[-3000:]
    assert time.monotonic() - t0 < 60, "three sessions took longer than brokerTimeout's share of backoff"
    # nothing of it or after it was acknowledged: both wait in the queue (the one before may be logged)
    with Connection.from_url(url) as conn:
        left = conn.channel().queue_declare(queue, passive=True).message_count
    assert left in (2, 3), left
    assert [r.body for r in rows] in ([], [b"before"]), rows


@pytest.mark.timeout(300)
def test_sessions_failing_on_a_poison_back_off_and_broker_timeout_names_the_error(spark, rabbitmq, unique_name,
                                                                                  tmp_path):
    """Issue 43, item 7: brokerTimeout never fired while every session connected and failed at once.
    With a failure count out of reach, brokerTimeout (5 s) ends it, naming the last error."""
    url, queue = rabbitmq.url("amqp"), unique_name("poison-timeout")
    _publish_undecodable_amqp(url, queue)
    t0 = time.monotonic()
    rows, q = _read_all(spark, "amqp08", {"uri": url, "queue": queue, "maxDeliveryFailures": 100000,
                                          "brokerTimeout": "5", "reconnectMaxDelay": "1"}, tmp_path, "timeout")
    took = time.monotonic() - t0
    error = str(q.exception())
    assert "no session made progress for" in error and "brokerTimeout 5s" in error, error[-3000:]
    assert "RecursionError" in error, error[-3000:]
    assert took < 90, took
    assert rows == [], rows


@pytest.mark.timeout(300)
@pytest.mark.parametrize("ack_mode", ["durable", "commit"])
def test_amqp_poison_delivery_is_dead_lettered_by_option(spark, rabbitmq, unique_name, tmp_path, ack_mode):
    """In commit mode the channel is transactional: the reject takes effect only with a tx.commit
    (review finding: without one the message stayed in the queue, counted as dead-lettered)."""
    from spark_mq.protocol.amqp08.connection import UndecodableProperties

    url, queue, dlq = rabbitmq.url("amqp"), unique_name("poison-dl"), unique_name("poison-dlq")
    with Connection.from_url(url) as conn:
        conn.channel().queue_declare(dlq, durable=True)
    _publish_undecodable_amqp(url, queue, {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq})
    rows, q = _read_all(spark, "amqp08", {"uri": url, "queue": queue, "maxDeliveryFailures": 2, "ackMode": ack_mode,
                                          "poisonMessages": "deadLetter"}, tmp_path, "dl")
    assert q.exception() is None, q.exception()
    assert sorted(r.body for r in rows) == [b"after", b"before"], rows
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        dead = ch.basic_get(dlq, no_ack=True)
        # RabbitMQ adds its x-death header to the same table: still undecodable, still delivered whole
        assert dead is not None and dead.body == b"poison", dead
        assert type(dead.properties) is UndecodableProperties and "RecursionError" in dead.properties.error
        assert ch.basic_get(dlq, no_ack=True) is None
        assert ch.queue_declare(queue, passive=True).message_count == 0


@pytest.mark.timeout(120)
def test_stomp_dead_letter_sends_the_message_with_why_then_acks_it(stomp_broker, unique_name, tmp_path):
    """What ``poisonMessages=deadLetter`` does on STOMP, through the source's consumer on each broker.
    No broker here delivers a STOMP message that the source holds and cannot take (the values are
    kept: see above), so the dead-lettering is driven at the consumer; the ingest's part (the
    messages before it durable first, the rest taken after) is unit-tested in test_ingest_groups.py."""
    from spark_mq.options import SOURCE, parse_options
    from spark_mq.sources.formats.stomp import StompConsumer

    dest, dlq = "/queue/" + unique_name("poison-sdl"), "/queue/" + unique_name("poison-sdlq")
    url = stomp_broker.url("stomp")
    with StompClient.from_uri(url) as client:
        client.send(dest, b"poison", headers={"k": "v", "persistent": "true"})
        client.send(dest, b"after", headers={"persistent": "true"})
        client.flush()
    opts = parse_options({"uri": url, "destination": dest, "logLocation": str(tmp_path / "log"),
                          "poisonMessages": "deadLetter", "deadLetterDestination": dlq}, format="stomp",
                         direction=SOURCE)
    consumer = StompConsumer(opts)
    try:
        deadline = time.monotonic() + 30
        got = []
        while len(got) < 2 and time.monotonic() < deadline:
            got += consumer.poll(2, 1.0)
        assert [f.body for f in got] == [b"poison", b"after"], got
        consumer.dead_letter(got[0], "column 'x' cannot hold its value", 2)
    finally:
        consumer.close()  # 'after' was not acked: the broker keeps it
    with StompClient.from_uri(url) as client:
        client.subscribe(dlq, ack="auto")
        dead = client.receive(30)
        assert dead is not None and dead.body == b"poison", dead
        h = dead.headers
        assert h.get("k") == "v" and h.get("x-spark-mq-dead-letter-from") == dest, h
        assert h.get("x-spark-mq-dead-letter-reason") == "column 'x' cannot hold its value", h
        assert h.get("x-spark-mq-dead-letter-failures") == "2" and h.get("x-spark-mq-dead-letter-message-id"), h
        assert client.receive(1) is None  # once
        client.subscribe(dest, ack="auto")
        again = client.receive(30)
        assert again is not None and again.body == b"after", again  # the poison was acked, 'after' was not
        assert client.receive(2) is None


def test_stomp_dead_letter_policy_needs_a_destination(spark, rabbitmq, tmp_path):
    r = (spark.readStream.format("stomp").option("uri", rabbitmq.url("stomp")).option("destination", "/queue/x")
         .option("logLocation", str(tmp_path / "log")).option("poisonMessages", "deadLetter"))
    with pytest.raises(Exception) as info:
        r.load()
    assert "OptionError" in str(info.value) and "deadLetterDestination" in str(info.value), str(info.value)[-2000:]


# -- 4. the STOMP frame bound -------------------------------------------------------------------------------


@pytest.mark.timeout(400)
def test_stomp_frame_above_max_frame_bytes_fails_naming_the_option_then_reads_with_it_raised(
        spark, activemq, unique_name, tmp_path):
    """ActiveMQ accepts a 100 MB frame; the client's bound was a fixed 64 MiB, and a frame above it
    dropped the connection at every redelivery. Here 3 MB against a 2 MiB bound, to stay fast."""
    dest = "/queue/" + unique_name("poison-big")
    big = b"x" * (3 * 1000 * 1000)
    with StompClient.from_uri(activemq.url("stomp")) as client:
        client.send(dest, b"before")
        client.send(dest, big, headers={"persistent": "true"})
        client.send(dest, b"after")
        client.flush()
    opts = {"uri": activemq.url("stomp"), "destination": dest, "maxDeliveryFailures": 2}
    first, q = _read_all(spark, "stomp", {**opts, "maxFrameBytes": "2MiB"}, tmp_path, "big")
    error = str(q.exception())
    assert "maxFrameBytes" in error and str(len(big)) in error and "message-id" in error, error[-3000:]
    # the user raises the bound and restarts the query from its checkpoint: nothing was lost
    then, q = _read_all(spark, "stomp", {**opts, "maxFrameBytes": "4MiB"}, tmp_path, "big")
    assert q.exception() is None, q.exception()
    assert sorted(len(r.body) for r in first + then) == [5, 6, len(big)], [len(r.body) for r in first + then]


def test_stomp_dead_letter_in_commit_mode_leaves_the_ack_to_sparks_commit(stomp_broker, unique_name, tmp_path):
    """Review finding: in ackMode=commit the dead-lettering ACK (cumulative on both brokers) also
    acknowledged the messages before the poison that wait for Spark's commit. Now the consumer hands
    the frame back, to be acknowledged with them at the commit past it: until then the broker keeps
    the message before it."""
    from spark_mq.options import SOURCE, parse_options
    from spark_mq.sources.formats.stomp import StompConsumer

    dest, dlq = "/queue/" + unique_name("poison-cdl"), "/queue/" + unique_name("poison-cdlq")
    url = stomp_broker.url("stomp")
    with StompClient.from_uri(url) as client:
        for body in (b"before", b"poison"):
            client.send(dest, body, headers={"persistent": "true"})
        client.flush()
    opts = parse_options({"uri": url, "destination": dest, "logLocation": str(tmp_path / "log"), "ackMode": "commit",
                          "poisonMessages": "deadLetter", "deadLetterDestination": dlq}, format="stomp",
                         direction=SOURCE)
    consumer = StompConsumer(opts)
    try:
        deadline = time.monotonic() + 30
        got = []
        while len(got) < 2 and time.monotonic() < deadline:
            got += consumer.poll(2, 1.0)
        assert [f.body for f in got] == [b"before", b"poison"], got
        assert consumer.dead_letter(got[1], "undecodable", 5) is got[1]
    finally:
        consumer.close()  # no commit came: nothing was acknowledged
    with StompClient.from_uri(url) as client:
        client.subscribe(dlq, ack="auto")
        dead = client.receive(30)
        assert dead is not None and dead.body == b"poison", dead
        client.subscribe(dest, ack="auto")
        first = client.receive(30)
        assert first is not None and first.body == b"before", first  # still in the broker
