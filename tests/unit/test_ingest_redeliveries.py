"""Which redeliveries of messages without a stable id the ingest drops. ``contentDedup=window`` (the
default): any equal to a message in the log or the last ``dedupWindow`` committed ones.
``contentDedup=inflight``: only those that may be copies of a delivery the broker never had
acknowledged (``_Redeliverable``), each such delivery once. The broker-facing behaviour (a connection
cut on RabbitMQ with identical bodies in flight) is
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


def test_matches_and_the_bound_take_from_different_ends_without_losing_live_copies():
    """A match uses up the identity's oldest carried delivery; the bound drops the overall oldest.
    Found in review: a matched delivery left in the bound's queue was dropped again later, taking a
    live copy of the same identity with it, so a fifth cycle of cut-and-redeliver kept 4 copies."""
    r = _Redeliverable(span=4, limit=16)
    for _ in range(4):
        r.delivered(_key(b"x"), False)
    r.connection_lost(0)
    for cycle in range(8):
        dropped = sum(r.delivered(_key(b"x"), True) for _ in range(4))
        assert dropped == 4, (cycle, dropped)
        r.connection_lost(0)                      # the dropped copies' acks may be lost with it
        assert r.carried == 4
    assert len(r._order) <= 2 * r.carried + r.span


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
def test_after_a_restart_every_message_in_the_log_matches_once(tmp_path, ack_mode):
    """A new process knows nothing of the last one's deliveries nor its prefetch: every message in
    the log may come back, and each matches one redelivery (found in review: carrying only the last
    ``prefetch`` of them kept the redeliveries beyond it when the prefetch had been larger)."""
    opts = dict(fmt="amqp08", prefetch="4", ackMode=ack_mode, contentDedup="inflight")
    ing = _ingest(tmp_path, **opts)
    ing._consumer = _Consumer([(b"old", False)] + [(b"m%d" % i, False) for i in range(6)] + [(b"tail", False)])
    while ing._consumer.deliveries:
        ing._step()
    ing._settle(keep=0)
    ing.log.close()

    again = _ingest(tmp_path, **{**opts, "prefetch": "2"})
    try:
        assert again._redeliverable.carried == 8
        again._consumer = _Consumer([(b"tail", True), (b"m4", True), (b"old", True), (b"tail", True)])
        while again._consumer.deliveries:
            again._step()
        again._settle(keep=0)
        assert again.duplicates == 3 and again.redeliveries == 4
        assert _bodies(again)[-1:] == [b"tail"] and again.log.head == 9   # the second "tail" is another message
    finally:
        again.log.close()


@pytest.mark.parametrize("mode", ["window", "inflight"])
def test_a_redelivery_equal_to_an_acknowledged_message(tmp_path, mode):
    """A lost connection's last delivery, never logged, has the body of a message logged and acked
    long before. window matches it against that message and drops it (lost, the price of catching
    copies a crashed broker hands out again); inflight keeps it."""
    ing = _ingest(tmp_path, fmt="amqp08", prefetch="2", contentDedup=mode)
    try:
        ing._consumer = _Consumer([(b"reading=20", False)] + [(b"other%d" % i, False) for i in range(4)])
        while ing._consumer.deliveries:
            ing._step()
        if mode == "inflight":
            ing._redeliverable.connection_lost(0)   # as the ingest's reconnect does
        ing._consumer = _Consumer([(b"reading=20", True)])  # sent, not logged, when the connection went
        while ing._consumer.deliveries:
            ing._step()
        ing._settle(keep=0)
        assert ing.duplicates == (1 if mode == "window" else 0)
        assert _bodies(ing).count(b"reading=20") == (1 if mode == "window" else 2)
    finally:
        ing.log.close()


class _DyingChannel:
    """Hands out ``ready`` deliveries, then the connection is gone."""

    def __init__(self, ready):
        self._deliveries = list(ready)

    def next_message(self, timeout):
        from spark_mq.errors import ConnectionClosedError

        if self._deliveries:
            return self._deliveries.pop(0)
        raise ConnectionClosedError("connection reset (test)")

    def drain(self, n):
        out, self._deliveries = self._deliveries[:0], self._deliveries
        return out


def test_a_poll_whose_connection_goes_while_gathering_hands_over_what_it_gathered():
    """Found in review: the AMQP and STOMP polls raised as the connection went while they gathered a
    group, and the deliveries already gathered were neither logged nor counted: the broker sent them
    again, and with contentDedup=inflight they matched older, acknowledged messages by body."""
    from spark_mq.errors import ConnectionClosedError
    from spark_mq.sources.amqp08 import Amqp08Consumer
    from spark_mq.sources.stomp import StompConsumer

    amqp = object.__new__(Amqp08Consumer)
    amqp.ch, amqp._lost = _DyingChannel(["a", "b", "c"]), None
    assert amqp.poll(10, 1.0) == ["a", "b", "c"]
    with pytest.raises(ConnectionClosedError):
        amqp.poll(10, 1.0)

    class DyingClient:
        def __init__(self):
            self.calls = 0

        def receive_many(self, n, timeout):
            self.calls += 1
            if self.calls == 1:
                return ["a", "b"]
            raise ConnectionClosedError("connection reset (test)")

    stomp = object.__new__(StompConsumer)
    stomp.client, stomp._lost = DyingClient(), None
    assert stomp.poll(10, 1.0) == ["a", "b"]
    with pytest.raises(ConnectionClosedError):
        stomp.poll(10, 1.0)
