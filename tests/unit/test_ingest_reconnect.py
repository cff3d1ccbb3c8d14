"""The ingest across a lost connection, a stop during a connect, and the availableNow count, on fake
consumers (the broker-facing behaviour is in the integration tests; these pin down the bookkeeping)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from spark_mq.errors import ConnectionClosedError
from spark_mq.options import SOURCE, parse_options

from .test_ingest_groups import _ingest, _Stub


class Consumer(_Stub):
    """Malamute-shaped deliveries, once; records pause/resume/close; ``lose`` makes keepalive fail."""

    def __init__(self, bodies):
        self.bodies = list(bodies)
        self.paused = self.closed = self.lose = False

    def poll(self, max_count, timeout):
        out, self.bodies = self.bodies[:max_count], self.bodies[max_count:]
        if not out:
            time.sleep(min(timeout, 0.01))
        return list(enumerate(out))

    def row(self, msg, offset, now_us):
        _, body = msg
        return (body, "m", None, now_us, None, False, offset, "s", "m", "subj", "", None)

    def keepalive(self):
        if self.lose:
            raise ConnectionClosedError("connection reset (test)")

    def pause(self):
        self.paused = True

    def resume(self):
        self.paused = False

    def close(self):
        self.closed = True


def _wait(predicate, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_reconnect_over_the_log_bound_pauses_the_new_consumer(tmp_path):
    """Over the log bound the ingest pauses its consumer. The connection is lost while paused; the
    new consumer must be paused too, or the broker streams the whole queue into memory (auto mode)
    past ``maxUncommittedMessages``. ``paused`` used to survive the reconnect, so the new one never was."""
    ing = _ingest(tmp_path, maxUncommittedMessages="3")
    first, second = Consumer([b"a", b"b", b"c", b"d"]), Consumer([b"e"])
    made = iter([first, second])
    ing._connect = lambda attempt: next(made)
    ing.start()
    try:
        assert _wait(lambda: first.paused), "the first consumer was not paused at the bound"
        first.lose = True  # the next keepalive while paused finds the connection gone
        assert _wait(lambda: ing._consumer is second), "no reconnect"
        assert _wait(lambda: second.paused), "the new consumer was not paused though the log is over its bound"
        assert ing.log.head == 4 and ing.reconnects == 1
    finally:
        ing.stop(timeout=5)


def test_a_stop_during_a_slow_connect_closes_what_the_connect_returns(tmp_path):
    """``stop()`` waits for the ingest thread only so long; a connect that returns after it must
    not leave its connection open (it would hold deliveries nobody logs)."""
    ing = _ingest(tmp_path)
    release, returned = threading.Event(), []

    def slow_connect(attempt):
        release.wait(10)
        c = Consumer([b"x"])
        returned.append(c)
        return c

    ing._connect = slow_connect
    ing.start()
    ing.stop(timeout=0.2)  # gives up on the thread, which is still connecting
    release.set()
    assert _wait(lambda: returned and returned[0].closed), "the late connection was left open"
    ing._thread.join(5)
    assert not ing._thread.is_alive() and ing._consumer is None


def test_available_now_target_does_not_count_dropped_redeliveries(tmp_path):
    """The availableNow target counts what the drain must take: consumed + held + depth when asked.
    Redeliveries dropped as duplicates after a reconnect are not new messages; counted, they ended
    the drain up to a prefetch early."""
    ing = _ingest(tmp_path, fmt="amqp08", ackMode="durable", quietPeriod="60")

    class Depth:
        def depth_in_order(self):
            return 10

        def buffered(self):
            return 0

    ing._an.active = True
    ing.consumed, ing.duplicates = 4, 0
    ing._an.count(Depth())                         # 4 taken, 10 in the queue: 14 to take
    ing.last_message = time.monotonic() - 30       # long silent: a reached count fixes the target
    ing.consumed, ing.duplicates = 14, 5           # 10 more deliveries, 5 of them redeliveries
    ing._an.maybe_fix(None, quiet_ok=False)
    assert ing.target is None                      # 9 new of 14: not there yet
    ing.consumed = 19                              # 5 more new ones
    ing._an.maybe_fix(None, quiet_ok=False)
    ing._an.maybe_fix(None, quiet_ok=False)
    assert ing.target == ing.log.head
    ing.log.close()


def test_sockets_probe_a_silent_peer_within_a_minute():
    """STOMP 1.0 has no heartbeat: TCP keepalive with short timers finds a vanished broker host."""
    from spark_mq.transport.stream import KEEPALIVE_COUNT, KEEPALIVE_IDLE, KEEPALIVE_INTERVAL, open_socket

    if not hasattr(socket, "TCP_KEEPIDLE"):
        pytest.skip("not Linux: the system's keepalive timers apply")
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        sock = open_socket("127.0.0.1", listener.getsockname()[1], timeout=5)
        try:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE == 30
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == KEEPALIVE_INTERVAL
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == KEEPALIVE_COUNT
            assert KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT <= 60
        finally:
            sock.close()
    finally:
        listener.close()


def _stomp_consumer_refused(monkeypatch, error: BaseException, destination: str):
    """Build a ``StompConsumer`` over a client whose SUBSCRIBE raises ``error``; returns (what
    the constructor raised, whether the client was closed)."""
    import spark_mq.sources.formats.stomp as stomp_src

    class Profile:
        cumulative_client_ack, name = True, "rabbitmq"

    class Client:
        broker = Profile()
        closed = False

        def subscribe(self, *args, **kwargs):
            raise error

        def close(self):
            Client.closed = True

    monkeypatch.setattr(stomp_src, "connect_stomp", lambda opts, start=0, **kw: Client())
    opts = parse_options({"uri": "stomp://127.0.0.1:1", "destination": destination, "logLocation": "/nonexistent"},
                         format="stomp", direction=SOURCE)
    with pytest.raises(Exception) as info:
        stomp_src.StompConsumer(opts)
    return info.value, Client.closed


def test_a_failed_stomp_subscribe_closes_its_connection(monkeypatch):
    """SUBSCRIBE refused or unanswered: the ingest connects again, and this connection (with a
    subscription it may hold after all) is closed, not left open per retry until brokerTimeout."""
    raised, closed = _stomp_consumer_refused(
        monkeypatch, ConnectionClosedError("no RECEIPT for SUBSCRIBE within 10 s (test)"), "/queue/q")
    assert type(raised) is ConnectionClosedError and closed


def test_an_error_frame_in_reply_to_subscribe_is_a_refusal(monkeypatch):
    """The broker answers SUBSCRIBE with ERROR (a missing queue, no permission): a refusal of the
    options, which the ingest fails after its short grace instead of retrying it as an outage
    until brokerTimeout; the connection is closed, and the error names the destination and the
    broker's reason."""
    from spark_mq.errors import BrokerRefusedError
    from spark_mq.protocol.stomp10 import StompError
    from spark_mq.clients.connect import refusal

    raised, closed = _stomp_consumer_refused(
        monkeypatch, StompError("not_found", b"NOT_FOUND - no queue 'gone' in vhost '/'"), "/amq/queue/gone")
    assert isinstance(raised, BrokerRefusedError) and refusal(raised) and closed
    assert "/amq/queue/gone" in str(raised) and "NOT_FOUND - no queue 'gone'" in str(raised)


@pytest.mark.parametrize("asked, sent", [(0, 0), (0.4, 1), (1, 1), (1.5, 2), (30, 30)])
def test_an_amqp_heartbeat_is_whole_seconds_rounded_up(monkeypatch, asked, sent):
    """AMQP 0-8 counts the heartbeat in whole seconds: 0.4 s asks for 1 s, never 0 (which turns
    heartbeats off, as rounding to the nearest did)."""
    import spark_mq.clients.amqp08 as client_mod
    from spark_mq.clients.connect import connect_amqp08

    seen = []

    class Connection:
        def __init__(self, host, port, **kwargs):
            seen.append(kwargs["heartbeat"])

    monkeypatch.setattr(client_mod, "Connection", Connection)
    opts = parse_options({"uri": "amqp://127.0.0.1:1/", "queue": "q", "logLocation": "/nonexistent",
                          "heartbeat": str(asked)}, format="amqp08", direction=SOURCE)
    connect_amqp08(opts)
    assert seen == [sent]


def test_options_the_connect_cannot_use_end_the_ingest_at_once(tmp_path):
    """An ``OptionError`` from connecting (a URI of another format's scheme) is no outage: the
    ingest ends with it at the first attempt, where it used to retry it until ``brokerTimeout``.
    (``load()`` checks the endpoints first: ``test_a_uri_of_another_format_fails_at_load``.)"""
    from spark_mq.errors import OptionError

    ing = _ingest(tmp_path, brokerTimeout="300")
    attempts = []

    def connect(attempt):
        attempts.append(attempt)
        raise OptionError("option 'uri': scheme 'amqp' is not one of inproc, ipc, tcp (test)")

    ing._connect = connect
    ing.start()
    try:
        assert _wait(lambda: ing.error is not None, 5), "the ingest kept retrying an unusable option"
        with pytest.raises(OptionError, match="option 'uri'"):
            ing.check()
        assert attempts == [0]
    finally:
        ing.stop(timeout=5)


def test_reconnect_waits_start_at_reconnectDelay_and_double_up_to_the_max(tmp_path, monkeypatch):
    """Full jitter: each wait is drawn from [0, bound], the first bound ``reconnectDelay`` (it was
    twice that), then doubling, capped at ``reconnectMaxDelay``."""
    from spark_mq.sources import reconnect as reconnect_mod

    bounds = []
    monkeypatch.setattr(reconnect_mod.random, "uniform", lambda lo, hi: bounds.append((lo, hi)) or 0.0)
    ing = _ingest(tmp_path, reconnectDelay="0.5", reconnectMaxDelay="1.5")
    failures = iter(range(4))
    connected = Consumer([b"x"])

    def connect(attempt):
        if next(failures, None) is not None:
            raise OSError("connection refused (test)")
        return connected

    ing._connect = connect
    ing.start()
    try:
        assert _wait(lambda: ing._consumer is connected), "no connection after the failures"
        assert bounds == [(0, 0.5), (0, 1.0), (0, 1.5), (0, 1.5)]
    finally:
        ing.stop(timeout=5)


class _FailsAtOnce(Consumer):
    """A session that connects and fails at its first poll: a delivery the client cannot decode."""

    def poll(self, max_count, timeout):
        raise ConnectionClosedError("malformed frame from the broker (test)")


def test_sessions_that_fail_at_once_back_off_and_broker_timeout_fires(tmp_path):
    """Issue 43, item 7: a consumer failing right after connect made 238,478 connections in 4 s;
    only a failed connect counted as a failed attempt, and brokerTimeout never fired. A session that
    ends without progress is a failed attempt now (the delay doubles, with full jitter), and
    brokerTimeout counts from the last progress, naming the last error."""
    ing = _ingest(tmp_path, reconnectDelay="0.1", reconnectMaxDelay="0.4", brokerTimeout="3")
    made = []

    def connect(attempt):
        c = _FailsAtOnce([])
        made.append(c)
        return c

    ing._connect = connect
    ing.start()
    try:
        assert _wait(lambda: ing.error is not None, timeout=30), f"brokerTimeout never fired ({len(made)} connections)"
        # 3 s of delays of at most 0.1, 0.2, 0.4, 0.4 ... s (full jitter: 0.1 s apart on average at
        # worst): some tens of sessions; without backoff, tens of thousands
        assert len(made) < 200, len(made)
        text = str(ing.error)
        assert "brokerTimeout" in text and "malformed frame from the broker (test)" in text, text
        assert all(c.closed for c in made)
    finally:
        ing.stop(timeout=5)


class _FailsAfterGroups(Consumer):
    def poll(self, max_count, timeout):
        if not self.bodies:
            raise ConnectionClosedError("lost (test)")
        return super().poll(1, timeout)


def test_a_session_that_made_progress_reconnects_at_once(tmp_path):
    """A session that took messages before it was lost is an outage, not a poison: the next connect
    starts the backoff over (its first delay comes only if that one fails too)."""
    ing = _ingest(tmp_path, reconnectDelay="5", brokerTimeout="60")
    made = []

    def connect(attempt):
        c = _FailsAfterGroups([b"x"] if len(made) < 3 else [b"x"] * 1000)
        made.append(c)
        return c

    ing._connect = connect
    ing.start()
    try:
        assert _wait(lambda: len(made) >= 4, timeout=10), f"progressing sessions waited between connects: {len(made)}"
        assert ing.error is None
    finally:
        ing.stop(timeout=5)
