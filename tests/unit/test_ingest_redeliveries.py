"""Redeliveries of messages without a stable id, and the polls' part in them: a redelivered copy of a
logged message is dropped by its content, a second message with equal content that is not marked
redelivered is kept, and a poll whose connection goes while it gathers a group hands over what it
gathered. The broker-facing case (a connection cut on RabbitMQ with a prefetch in flight) is
``tests/integration/test_sources_common.py::test_a_connection_cut_with_a_prefetch_in_flight_loses_and_duplicates_nothing``."""

from __future__ import annotations

import pytest

from spark_mq.errors import ConnectionClosedError

from .test_ingest_groups import _ingest, _Stub


class _Consumer(_Stub):
    """AMQP-shaped deliveries without message ids: (body, redelivered) once each."""

    stable_ids = True

    def __init__(self, deliveries):
        self.deliveries = list(deliveries)

    def poll(self, max_count, timeout):
        out, self.deliveries = self.deliveries[:max_count], self.deliveries[max_count:]
        return out

    def row(self, msg, offset, now_us):
        body, redelivered = msg
        return (body, "q", None, now_us, None, redelivered, offset, "", "q", 1) + (None,) * 11


def test_content_identity_drops_redelivered_copies_and_keeps_new_equal_messages(tmp_path):
    ing = _ingest(tmp_path, fmt="amqp08", prefetch="4")
    try:
        ing._consumer = _Consumer([(b"a", False), (b"b", False), (b"a", False),   # two messages "a"
                                   (b"b", True), (b"c", True)])                   # a copy of "b"; "c" is new
        while ing._consumer.deliveries:
            ing._step()
        ing._wb.settle(keep=0)
        bodies = [b for batch in ing.log.read(0, ing.log.head) for b in batch.column("body").to_pylist()]
        assert bodies == [b"a", b"b", b"a", b"c"]
        assert ing.duplicates == 1 and ing.redeliveries == 2
    finally:
        ing.log.close()


@pytest.mark.parametrize("stable_ids", [False, True])
@pytest.mark.parametrize("message_id", [None, "m-1"])
@pytest.mark.parametrize("headers", [
    None, [],
    [("subscription", "0"), ("destination", "/queue/a"), ("message-id", "T_1"), ("redelivered", "true")],
    [("x", "2"), ("destination", "/queue/a"), ("a", None), ("x-delivery-count", "3")],
    [("destination", "/queue/a"), ("spark-mq-message-id", ""), ("spark-mq-message-id", "id-7")],
    [("spark-mq-message-id", "id-7"), ("destination", "/queue/b")],
])
def test_identity_in_one_pass_is_the_stable_id_or_the_content_identity(headers, message_id, stable_ids):
    """``dedup.identity`` (the ingest's one pass per message) gives what ``Redeliveries.stable_id`` and
    ``content_identity`` give: the identities rebuilt from the log at a restart use the latter."""
    from spark_mq.options import SOURCE, parse_options
    from spark_mq.sources.dedup import Redeliveries, content_identity, identity

    red = Redeliveries("stomp", parse_options({"uri": "stomp://h", "destination": "/queue/a", "logLocation": "/l"},
                                              format="stomp", direction=SOURCE))
    red.stable_ids = stable_ids
    stable = red.stable_id(message_id, headers)
    expected = (stable, True) if stable is not None else (content_identity(b"body", headers), False)
    assert identity(b"body", message_id, headers, stable_ids) == expected
    assert red.identity_of(b"body", message_id, headers) == expected[0]


class _DyingChannel:
    """Hands out ``ready`` deliveries one by one, then the connection is gone."""

    def __init__(self, ready):
        self._deliveries = list(ready)

    def next_message(self, timeout):
        if self._deliveries:
            return self._deliveries.pop(0)
        raise ConnectionClosedError("connection reset (test)")

    def drain(self, n):
        return []


class _DyingClient:
    """A STOMP client whose first receive gives two frames, and whose connection is then gone."""

    def __init__(self):
        self.calls = 0

    def receive_many(self, n, timeout):
        self.calls += 1
        if self.calls == 1:
            return ["a", "b"]
        raise ConnectionClosedError("connection reset (test)")


def test_a_poll_whose_connection_goes_while_gathering_hands_over_what_it_gathered():
    """Found in review (2026-11-27): the AMQP and STOMP polls raised as the connection went while
    they gathered a group, and the deliveries already gathered were neither logged nor acked: in
    ``auto`` mode, where the broker forgets a message once sent, they were lost; with acks the
    broker sent them again, as redeliveries. Now they are handed over and the next poll raises."""
    from spark_mq.sources.formats.amqp08 import Amqp08Consumer
    from spark_mq.sources.formats.stomp import StompConsumer

    amqp = object.__new__(Amqp08Consumer)
    amqp.ch, amqp._lost = _DyingChannel(["a", "b", "c"]), None
    assert amqp.poll(10, 1.0) == ["a", "b", "c"]
    with pytest.raises(ConnectionClosedError):
        amqp.poll(10, 1.0)

    stomp = object.__new__(StompConsumer)
    stomp.client, stomp._lost = _DyingClient(), None
    assert stomp.poll(10, 1.0) == ["a", "b"]
    with pytest.raises(ConnectionClosedError):
        stomp.poll(10, 1.0)


class _StompConsumer(_Stub):
    """STOMP-shaped deliveries on a broker whose message-ids change per session (RabbitMQ):
    (body, broker message-id, spark-mq-message-id header or None, redelivered)."""

    stable_ids = False

    def __init__(self, deliveries):
        self.deliveries = list(deliveries)

    def poll(self, max_count, timeout):
        out, self.deliveries = self.deliveries[:max_count], self.deliveries[max_count:]
        return out

    def row(self, msg, offset, now_us):
        body, mid, sid, redelivered = msg
        headers = [("message-id", mid)] + ([("spark-mq-message-id", sid)] if sid else [])
        return (body, "/queue/q", mid, now_us, headers, redelivered, offset) + (None,) * 6

    def token(self, msg):
        return msg


def _stomp_ingest(tmp_path, **extra):
    from spark_mq.options import SOURCE, parse_options
    from spark_mq.sources.ingest import Ingest

    opts = parse_options({"uri": "stomp://127.0.0.1:1", "destination": "/queue/q",
                          "logLocation": str(tmp_path / "log"), **extra}, format="stomp", direction=SOURCE)
    return Ingest("stomp", opts, connect=None)


@pytest.mark.parametrize("dedup_by_id, expected", [("false", [b"a", b"b", b"a2"]), ("true", [b"a", b"b"])])
def test_a_spark_mq_message_id_header_is_a_stable_id_on_any_stomp_broker(tmp_path, dedup_by_id, expected):
    """Issue 46: a bridge's replayed batch is published again with the same spark-mq-message-id but
    new broker message-ids (RabbitMQ's change per session anyway). The header identifies the
    message: a redelivered copy is dropped by it, and with dedupById a second send of the same id
    (the replay) is dropped too; by default a first delivery is never dropped."""
    ing = _stomp_ingest(tmp_path, dedupById=dedup_by_id)
    try:
        ing._consumer = _StompConsumer([
            (b"a", "T_1@@s1@@1", "q:0:t:0:0", False),
            (b"b", "T_1@@s1@@2", "q:0:t:0:1", False),
            (b"a", "T_1@@s2@@1", "q:0:t:0:0", True),     # the broker's redelivery: another message-id
            (b"a2", "T_1@@s2@@2", "q:0:t:0:0", False),   # the sink's replay of the same id
        ])
        ing._redeliveries.stable_ids = False  # what connecting to this consumer sets
        while ing._consumer.deliveries:
            ing._step()
        ing._wb.settle(keep=0)
        bodies = [b for batch in ing.log.read(0, ing.log.head) for b in batch.column("body").to_pylist()]
        assert bodies == expected
    finally:
        ing.log.close()
