"""Row tuples are read by position: the positions are named from the one declaration of the columns
(``schema.SOURCE_COLUMNS``), and each consumer's ``row`` puts every value in its named column."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spark_mq import schema as S

CORE = {"body": S.BODY, "destination": S.DESTINATION, "message_id": S.MESSAGE_ID, "timestamp": S.TIMESTAMP,
        "headers": S.HEADERS, "redelivered": S.REDELIVERED, "offset": S.OFFSET}


@pytest.mark.parametrize("fmt", sorted(S.SOURCE_COLUMNS))
def test_the_index_constants_follow_the_schema_declaration(fmt):
    columns = S.SOURCE_COLUMNS[fmt]
    assert S.COLUMN_INDEX[fmt] == {name: i for i, (name, _) in enumerate(columns)}
    assert list(S.COLUMN_INDEX[fmt]) == S.source_arrow_schema(fmt).names
    for name, index in CORE.items():  # the core columns stand at the same place in every format
        assert columns[index][0] == name
        assert S.COLUMN_INDEX[fmt][name] == index


def test_the_constants_name_every_core_column():
    assert sorted(CORE.values()) == list(range(len(S.CORE_COLUMNS)))


def _named(fmt, row):
    assert len(row) == len(S.SOURCE_COLUMNS[fmt])
    return {name: row[i] for name, i in S.COLUMN_INDEX[fmt].items()}


def test_an_amqp08_row_puts_each_value_in_its_column():
    from spark_mq.sources.formats.amqp08 import Amqp08Consumer

    consumer = object.__new__(Amqp08Consumer)
    consumer.queue, consumer.include_headers, consumer.queue_of = "q", True, None  # one queue
    props = {name: name for name in ("message_id", "content_type", "content_encoding", "correlation_id", "reply_to",
                                     "expiration", "type", "user_id", "app_id", "cluster_id")}
    p = SimpleNamespace(timestamp=7, headers={"h": "v"}, delivery_mode=2, priority=5, **props)
    msg = SimpleNamespace(properties=p, body=b"b", redelivered=True, exchange="ex", routing_key="rk", delivery_tag=9)
    assert _named("amqp08", consumer.row(msg, 3, 1)) == {
        "body": b"b", "destination": "q", "timestamp": 7_000_000, "headers": [("h", "v")], "redelivered": True,
        "offset": 3, "exchange": "ex", "routing_key": "rk", "delivery_tag": 9, "delivery_mode": 2, "priority": 5,
        **props}


def test_a_stomp_row_puts_each_value_in_its_column():
    from spark_mq.sources.formats.stomp import StompConsumer

    consumer = object.__new__(StompConsumer)
    consumer.destination, consumer.include_headers, consumer.destination_of = "/queue/q", False, None
    h = {"destination": "/queue/d", "message-id": "m1", "timestamp": "7", "redelivered": "true",
         "subscription": "s", "content-type": "ct", "correlation-id": "c", "reply-to": "r", "priority": "4",
         "expires": "99"}
    frame = SimpleNamespace(headers=h, body=b"b", oversize=0)
    assert _named("stomp", consumer.row(frame, 3, 1)) == {
        "body": b"b", "destination": "/queue/d", "message_id": "m1", "timestamp": 7000, "headers": None,
        "redelivered": True, "offset": 3, "subscription": "s", "content_type": "ct", "correlation_id": "c",
        "reply_to": "r", "priority": 4, "expires": 99}


def test_a_malamute_row_puts_each_value_in_its_column():
    from spark_mq.sources.formats.malamute import MalamuteConsumer

    consumer = object.__new__(MalamuteConsumer)
    consumer.destination = "stream"
    msg = SimpleNamespace(content=[b"a", b"b"], tracker="t", sender="s", address="ad", subject="su")
    assert _named("malamute", consumer.row(msg, 3, 1)) == {
        "body": b"a", "destination": "stream", "message_id": "t", "timestamp": 1, "headers": None,
        "redelivered": False, "offset": 3, "sender": "s", "address": "ad", "subject": "su", "tracker": "t",
        "frames": [b"a", b"b"]}
