"""Which redeliveries of messages without a stable id the ingest drops: only those that may be copies
of a delivery the broker never had acknowledged (``_Redeliverable``), each such delivery once. The
broker-facing behaviour (a connection cut on RabbitMQ with identical bodies in flight) is
``tests/integration/test_sources_common.py::test_identical_bodies_in_flight_at_a_connection_cut_are_kept``."""

from __future__ import annotations

import pytest

from spark_mq.sources.ingest import _Redeliverable, content_identity

from .test_ingest_groups import _ingest


def _key(body: bytes):
    return content_identity(body, None)


def test_a_redelivery_matches_a_lost_connections_last_deliveries():
    r = _Redeliverable(span=4, limit=16)
    for body in (b"a", b"b", b"c"):
        assert not r.delivered(_key(body), False)
    r.connection_lost(0)
    assert r.delivered(_key(b"b"), True)          # delivered, maybe never acked: a copy
    assert not r.delivered(_key(b"d"), True)      # never delivered here: another consumer's, new to us
    assert not r.delivered(_key(b"b"), False)     # not marked redelivered: a second message, kept


def test_a_delivery_followed_by_a_span_of_others_was_acknowledged_and_matches_nothing():
    """The broker sent ``span`` more after it: its ack was taken, it cannot come back. A redelivered
    message with the same body is another message (one this consumer had not logged) and is kept."""
    r = _Redeliverable(span=4, limit=16)
    r.delivered(_key(b"same"), False)
    for body in (b"1", b"2", b"3", b"4"):
        r.delivered(_key(body), False)
    r.connection_lost(0)
    assert not r.delivered(_key(b"same"), True)
    assert r.delivered(_key(b"4"), True)


def test_deliveries_received_but_never_taken_settle_those_taken_before():
    """At the loss the client held ``unread`` deliveries the ingest never took: the broker's latest.
    Of those taken, only the last ``span - unread`` can still be unacknowledged."""
    r = _Redeliverable(span=4, limit=16)
    for body in (b"a", b"b", b"c"):
        r.delivered(_key(body), False)
    r.connection_lost(2)
    assert r.carried == 2
    assert not r.delivered(_key(b"a"), True)
    assert r.delivered(_key(b"c"), True)
    r.delivered(_key(b"d"), False)
    r.connection_lost(4)                          # a whole prefetch unread: all taken were acked
    assert r.carried == 1                         # b, still carried from the first loss
    assert not r.delivered(_key(b"d"), True) and not r.delivered(_key(b"c"), True)


def test_each_carried_delivery_matches_one_redelivery():
    r = _Redeliverable(span=8, limit=32)
    r.delivered(_key(b"x"), False)
    r.delivered(_key(b"x"), False)                # two messages with one body, both logged
    r.connection_lost(0)
    assert r.delivered(_key(b"x"), True)
    assert r.delivered(_key(b"x"), True)
    assert not r.delivered(_key(b"x"), True)      # a third: the one in flight when the connection went
    assert r.carried == 0


def test_a_dropped_copy_may_come_back_again_after_the_next_loss():
    """A dropped duplicate is acknowledged like any delivery; if that ack is lost with the next
    connection, the broker sends it once more: it must still match."""
    r = _Redeliverable(span=4, limit=16)
    r.delivered(_key(b"x"), False)
    r.connection_lost(0)
    assert r.delivered(_key(b"x"), True)
    r.connection_lost(0)
    assert r.delivered(_key(b"x"), True)


def test_carried_identities_are_bounded_oldest_first():
    r = _Redeliverable(span=4, limit=6)
    r.carry([_key(b"old1"), _key(b"old2")])
    r.carry([_key(b"n1"), _key(b"n2"), _key(b"n3"), _key(b"n4"), _key(b"n5")])
    assert r.carried == 6
    assert not r.delivered(_key(b"old1"), True)   # dropped at the bound
    assert r.delivered(_key(b"old2"), True)
    assert r.delivered(_key(b"n5"), True)


class _Consumer:
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

    def ack(self, msgs):
        pass

    def token(self, msg):
        return msg

    def ack_commit(self, token):
        pass

    def keepalive(self):
        pass


def _bodies(ing):
    return [b for batch in ing.log.read(ing.log.tail, ing.log.head) for b in batch.column("body").to_pylist()]


@pytest.mark.parametrize("ack_mode", ["durable", "commit"])
def test_after_a_restart_only_the_logs_last_messages_match(tmp_path, ack_mode):
    """A new process knows nothing of the last one's deliveries: redeliveries are matched against
    the last ``span`` (the prefetch) messages in the log. A redelivered message with the body
    of an older one, which the broker had long been told it may forget, is a new message."""
    ing = _ingest(tmp_path, fmt="amqp08", prefetch="4", ackMode=ack_mode)
    ing._consumer = _Consumer([(b"old", False)] + [(b"m%d" % i, False) for i in range(6)] + [(b"tail", False)])
    while ing._consumer.deliveries:
        ing._step()
    ing._settle(keep=0)
    ing.log.close()
    assert ing._redeliverable.span == 4

    again = _ingest(tmp_path, fmt="amqp08", prefetch="4", ackMode=ack_mode)
    try:
        assert again._redeliverable.carried == 4       # m3, m4, m5, tail
        again._consumer = _Consumer([(b"tail", True), (b"m4", True), (b"old", True), (b"tail", True)])
        while again._consumer.deliveries:
            again._step()
        again._settle(keep=0)
        assert again.duplicates == 2 and again.redeliveries == 4
        assert _bodies(again)[-2:] == [b"old", b"tail"]   # the second "tail" is a second message
        assert again.log.head == 10
    finally:
        again.log.close()


def test_the_content_of_a_committed_message_no_longer_drops_a_redelivery(tmp_path):
    """Until 2026-11-27 every identity in the log and ``dedupWindow`` more was matched: the last
    delivery of a lost connection whose body equalled any of them was dropped, and lost."""
    ing = _ingest(tmp_path, fmt="amqp08", prefetch="2")
    try:
        ing._consumer = _Consumer([(b"reading=20", False)] + [(b"other%d" % i, False) for i in range(4)])
        while ing._consumer.deliveries:
            ing._step()
        ing._redeliverable.connection_lost(0)       # as the ingest's reconnect does
        ing._consumer = _Consumer([(b"reading=20", True)])  # sent, not logged, when the connection went
        while ing._consumer.deliveries:
            ing._step()
        ing._settle(keep=0)
        assert ing.duplicates == 0
        assert _bodies(ing).count(b"reading=20") == 2
    finally:
        ing.log.close()
