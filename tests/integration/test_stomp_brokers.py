"""STOMP 1.0 client against real RabbitMQ (rabbitmq_stomp) and ActiveMQ brokers, every test on both.

Also re-measures each broker difference the client relies on (cumulative client ACK, prefetch
header, open transaction at disconnect), so a broker upgrade that changes one fails here.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import threading
import time
import uuid

import pytest

from spark_mq.clients.stomp import StompClient
from spark_mq.errors import ConnectionClosedError
from spark_mq.protocol.stomp10 import ACTIVEMQ, RABBITMQ, BrokerProfile, StompError

pytestmark = pytest.mark.integration

TEST_TIMEOUT = 240  # seconds; a hung test ends the run with tracebacks instead of hanging CI
RECV = 10.0  # seconds to wait for a message that must come
QUIET = 1.0  # seconds of silence that show a message does not come


@pytest.fixture(autouse=True)
def _bounded():
    faulthandler.dump_traceback_later(TEST_TIMEOUT, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()


class Broker:
    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.port = port

    def client(self, **kw) -> StompClient:
        kw.setdefault("login", "guest")
        kw.setdefault("passcode", "guest")
        kw.setdefault("timeout", 20.0)
        return StompClient("127.0.0.1", self.port, **kw)

    def queue(self, what: str) -> str:
        return f"/queue/spark-mq-{what}-{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="session")
def broker(stomp_broker):
    """Each STOMP broker of the harness in turn (RabbitMQ's STOMP plugin, ActiveMQ)."""
    return Broker(stomp_broker.kind, stomp_broker.stomp_port)


def drain(client: StompClient, count: int, timeout: float = RECV) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        out.extend(client.receive_many(count - len(out), remaining))
    return out


def settle(client: StompClient, expect: int, at_most: int) -> list:
    """What comes when ``expect`` messages must come and no more than ``at_most`` may: waits long
    (``RECV``) for the ones that must, then twice ``QUIET`` for any extra, which the caller's assertion
    catches."""
    out = drain(client, expect)
    return out + drain(client, at_most - len(out), timeout=2 * QUIET)


# -- basics ---------------------------------------------------------------------------------
def test_connect_detects_broker(broker):
    with broker.client() as c:
        assert c.connected
        assert c.session_id
        assert c.broker is {"rabbitmq": RABBITMQ, "activemq": ACTIVEMQ}[broker.name]
    assert not c.connected


def test_receipts_on_frames(broker):
    q = broker.queue("receipt")
    with broker.client() as c:
        sub = c.subscribe(q, ack="client", receipt=True)
        c.send(q, b"one", receipt=True)
        tx = c.begin(receipt=True)
        c.send(q, b"two", transaction=tx, receipt=True)
        c.commit(tx, receipt=True)
        msgs = drain(c, 2)
        assert [m.body for m in msgs] == [b"one", b"two"]
        c.ack(msgs[-1], receipt=True)
        c.unsubscribe(sub, receipt=True)
        c.flush()
        assert c._session.receipts == set()


def test_100k_messages_no_loss(broker):
    n = 100_000
    q = broker.queue("100k")
    with broker.client() as consumer, broker.client() as producer:
        consumer.subscribe(q, ack="client", prefetch=2000)
        errors: list = []

        def produce():
            try:
                producer.send_many(q, (b"%d" % i for i in range(n)), receipt=True)
            except BaseException as exc:  # reported below
                errors.append(exc)

        t = threading.Thread(target=produce)
        t.start()
        seen = bytearray(n)
        got = 0
        deadline = time.monotonic() + 180
        # silence is not an end: a busy machine (or a broker writing its store) can pause deliveries
        # for longer than any fixed gap; the deadline bounds the wait
        while got < n and time.monotonic() < deadline:
            batch = consumer.receive_many(1000, 10)
            if not batch:
                continue
            for m in batch:
                seen[int(m.body)] += 1
            got += len(batch)
            consumer.ack(batch[-1])  # every ~1000th: cumulative on both brokers
        t.join(60)
        assert not errors
        assert got == n, f"received {got} of {n}"
        assert seen.count(1) == n  # each exactly once
        assert consumer.receive(QUIET) is None


def test_binary_bodies_with_nul_bytes(broker):
    q = broker.queue("binary")
    bodies = [bytes(range(256)), b"\x00", b"\x00" * 100, b"a\x00b\x00\x00c", b"\n\n\x00\n", b"", b"end\x00"]
    with broker.client() as c:
        c.subscribe(q)
        for body in bodies:
            c.send(q, body)
        c.send_many(q, bodies)
        got = drain(c, 2 * len(bodies))
        assert [m.body for m in got] == bodies + bodies


def test_ten_megabyte_bodies(broker):
    q = broker.queue("big")
    body = os.urandom(10 * 1024 * 1024 - 7) + b"\x00\x00\x00tail"
    with broker.client() as c:
        c.subscribe(q)
        c.send(q, body, receipt=True)
        c.send(q, body[::-1])
        got = drain(c, 2, timeout=60)
        assert len(got) == 2
        assert got[0].body == body and got[1].body == body[::-1]


def test_custom_headers_and_text_bodies(broker):
    q = broker.queue("headers")
    headers = {"x-colon": "a:b:c", "x-url": "http://h:80/p?q=1", "x-backslash": "C:\\dir\\n", "x-utf": "é€✓"}
    with broker.client() as c:
        c.subscribe(q)
        c.send(q, "text body ✓", headers=headers)
        (m,) = drain(c, 1)
        assert m.body == "text body ✓".encode()
        for k, v in headers.items():
            assert m.headers[k] == v


# -- transactions -----------------------------------------------------------------------------
def test_commit_makes_messages_visible_abort_discards(broker):
    q = broker.queue("tx")
    with broker.client() as consumer, broker.client() as producer:
        consumer.subscribe(q)
        tx = producer.begin()
        for i in range(5):
            producer.send(q, b"c%d" % i, transaction=tx)
        producer.flush()
        assert consumer.receive(QUIET) is None  # nothing before COMMIT
        producer.commit(tx)
        assert [m.body for m in drain(consumer, 5)] == [b"c%d" % i for i in range(5)]

        tx = producer.begin()
        producer.send_many(q, [b"a1", b"a2"], transaction=tx)
        producer.abort(tx)
        producer.send(q, b"after-abort", receipt=True)
        got = drain(consumer, 1)
        assert [m.body for m in got] == [b"after-abort"]
        assert consumer.receive(QUIET) is None


def test_transaction_context_manager(broker):
    q = broker.queue("txcm")
    with broker.client() as c:
        c.subscribe(q)
        with c.transaction() as tx:
            c.send(q, b"kept", transaction=tx)
        with pytest.raises(RuntimeError):
            with c.transaction() as tx:
                c.send(q, b"dropped", transaction=tx)
                raise RuntimeError("boom")
        c.send(q, b"marker", receipt=True)
        assert [m.body for m in drain(c, 2)] == [b"kept", b"marker"]


def test_ack_inside_transaction_commit_and_abort(broker):
    q = broker.queue("txack")
    with broker.client() as p:
        p.send_many(q, [b"m0", b"m1"], receipt=True)
    with broker.client() as c:
        c.subscribe(q, ack="client")
        m0, m1 = drain(c, 2)
        tx = c.begin()
        c.ack(m0, transaction=tx)
        c.commit(tx)  # m0 is gone
        tx = c.begin()
        c.ack(m1, transaction=tx)
        c.abort(tx)  # m1 is not acked: redelivered to the next consumer
    with broker.client() as c:
        c.subscribe(q, ack="client")
        got = drain(c, 1)
        assert [m.body for m in got] == [b"m1"]
        c.ack(got[0])
        assert c.receive(QUIET) is None


# -- acks, redelivery, prefetch ---------------------------------------------------------------
def test_client_ack_redelivery_after_disconnect_without_ack(broker):
    q = broker.queue("redeliver")
    with broker.client() as p:
        p.send_many(q, [b"r%d" % i for i in range(6)], receipt=True)
    with broker.client() as c:
        c.subscribe(q, ack="client")
        got = drain(c, 6)
        assert len(got) == 6
        c.ack(got[1])  # r0, r1 acknowledged; r2..r5 not
    with broker.client() as c:
        c.subscribe(q, ack="client")
        again = drain(c, 4)
        assert [m.body for m in again] == [b"r2", b"r3", b"r4", b"r5"]
        assert all(m.headers.get("redelivered") == "true" for m in again)
        c.ack(again[-1])
        assert c.receive(QUIET) is None


@pytest.mark.parametrize("client_side", ["cumulative", "per-message"])
def test_measure_client_ack_is_cumulative(broker, client_side):
    """One ACK for the 5th of 10 messages: a cumulative broker also settles the first four.
    ``per-message`` runs the client in its safe mode for unknown brokers (one ACK each)."""
    q = broker.queue("cumulative")
    profile = BrokerProfile("probe", client_side == "cumulative", (), "unknown")
    with broker.client() as p:
        p.send_many(q, [b"%d" % i for i in range(10)], receipt=True)
    with broker.client(broker=profile) as c:
        c.subscribe(q, ack="client")
        got = drain(c, 10)
        assert len(got) == 10
        c.ack(got[4], receipt=True)
    with broker.client() as c:
        c.subscribe(q)
        rest = [m.body for m in settle(c, 5, 10)]
    assert rest == [b"%d" % i for i in range(5, 10)]


def test_ack_every_nth_with_small_prefetch_does_not_stall(broker):
    q = broker.queue("everynth")
    n, every, prefetch = 500, 10, 10
    with broker.client() as p:
        p.send_many(q, [b"%d" % i for i in range(n)], receipt=True)
    with broker.client() as c:
        c.subscribe(q, ack="client", prefetch=prefetch)
        got = 0
        while got < n:
            m = c.receive(RECV)
            assert m is not None, f"stalled after {got} messages"
            got += 1
            if got % every == 0:
                c.ack(m)
        assert got == n


@pytest.mark.parametrize("header", ["prefetch-count", "activemq.prefetchSize"])
def test_measure_prefetch_headers(broker, header):
    """Only the broker's own header bounds unacknowledged deliveries; the other is ignored."""
    q = broker.queue("prefetch")
    with broker.client() as p:
        p.send_many(q, [b"%d" % i for i in range(20)], receipt=True)
    with broker.client() as c:
        c.subscribe(q, ack="client", headers={header: "3"})
        own = {"rabbitmq": "prefetch-count", "activemq": "activemq.prefetchSize"}[broker.name]
        got = settle(c, 3 if header == own else 20, 20)
        assert len(got) == (3 if header == own else 20)
        c.ack(got[-1])
        assert len(settle(c, 3 if header == own else 0, 20)) == (3 if header == own else 0)


def test_client_prefetch_option_uses_the_right_header(broker):
    q = broker.queue("prefetchopt")
    with broker.client() as p:
        p.send_many(q, [b"%d" % i for i in range(20)], receipt=True)
    with broker.client() as c:
        c.subscribe(q, ack="client", prefetch=4)
        assert len(settle(c, 4, 20)) == 4


# -- open transaction at disconnect ------------------------------------------------------------
def _raw_connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"CONNECT\nlogin:guest\npasscode:guest\n\n\x00")
    assert s.recv(9) == b"CONNECTED"
    return s


def test_measure_open_transaction_at_disconnect_is_rolled_back(broker):
    """Raw bytes (no client policy): SEND and ACK in a transaction never committed, DISCONNECT."""
    q = broker.queue("opentx")
    with broker.client() as p:
        p.send(q, b"to-ack", receipt=True)
    s = _raw_connect(broker.port)
    try:
        s.sendall(b"SUBSCRIBE\ndestination:%s\nid:s\nack:client\n\n\x00" % q.encode())
        data = b""
        while b"to-ack" not in data:
            chunk = s.recv(4096)
            assert chunk
            data += chunk
        mid = data.split(b"message-id:")[1].split(b"\n")[0]
        s.sendall(b"BEGIN\ntransaction:t\n\n\x00")
        s.sendall(b"SEND\ndestination:%s\ntransaction:t\n\nin-tx\x00" % q.encode())
        s.sendall(b"ACK\nmessage-id:%s\ntransaction:t\n\n\x00" % mid)
        s.sendall(b"DISCONNECT\nreceipt:bye\n\n\x00")
        while b"receipt-id:bye" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    finally:
        s.close()
    with broker.client() as c:
        c.subscribe(q)
        got = settle(c, 1, 2)
    assert [m.body for m in got] == [b"to-ack"]  # ACK undone, SEND dropped
    assert broker.name in ("rabbitmq", "activemq") and c.broker.open_transaction_at_disconnect == "rolled back"


@pytest.mark.parametrize("policy,visible", [("abort", False), ("commit", True)])
def test_client_settles_open_transactions_at_disconnect(broker, policy, visible):
    q = broker.queue("settle")
    with broker.client(on_open_transaction=policy) as c:
        tx = c.begin()
        c.send(q, b"pending", transaction=tx)
    assert not c.open_transactions
    with broker.client() as c2:
        c2.subscribe(q)
        got = settle(c2, 1 if visible else 0, 1)
    assert [m.body for m in got] == ([b"pending"] if visible else [])


# -- subscriptions and errors ----------------------------------------------------------------------
def test_unsubscribe_by_id_and_by_destination(broker):
    qa, qb = broker.queue("unsub-a"), broker.queue("unsub-b")
    with broker.client() as c:
        sa = c.subscribe(qa)
        c.subscribe(qb)
        c.unsubscribe(sa)
        c.unsubscribe(destination=qb)
        c.send(qa, b"x")
        c.send(qb, b"y", receipt=True)
        assert c.receive(QUIET) is None
    with broker.client() as c:  # the messages wait in the queues
        c.subscribe(qa)
        c.subscribe(qb)
        assert sorted(m.body for m in drain(c, 2)) == [b"x", b"y"]


def test_selector(broker):
    """ActiveMQ filters by selector; RabbitMQ's STOMP adapter ignores the header (measured)."""
    q = broker.queue("selector")
    with broker.client() as c:
        c.subscribe(q, selector="colour = 'red'")
        c.send(q, b"blue", headers={"colour": "blue"})
        c.send(q, b"red", headers={"colour": "red"}, receipt=True)
        expected = [b"red"] if broker.name == "activemq" else [b"blue", b"red"]
        assert [m.body for m in drain(c, len(expected))] == expected
        assert c.receive(QUIET) is None


def test_error_from_bad_destination(broker):
    c = broker.client().connect()
    try:
        if broker.name == "rabbitmq":
            with pytest.raises(StompError) as info:
                c.subscribe("/nonsense/place")
            assert info.value.message == "Unknown destination"
            assert b"/nonsense/place" in info.value.body
        else:
            # ActiveMQ 5.17 drops the connection on an invalid destination, without an ERROR frame
            with pytest.raises(ConnectionClosedError):
                c.subscribe("/queue/")
        with pytest.raises((StompError, ConnectionClosedError)):
            c.send("/queue/after", b"x", receipt=True)
    finally:
        c.close()


def test_error_frame_for_bad_selector(broker):
    with broker.client() as c:
        if broker.name == "activemq":
            with pytest.raises(StompError) as info:
                c.subscribe(broker.queue("sel"), selector="a ===")
            assert "a ===" in info.value.message
            assert b"InvalidSelectorException" in info.value.body
        else:
            c.subscribe(broker.queue("sel"), selector="a ===")  # ignored by RabbitMQ
        c.send(broker.queue("still-usable"), b"x", receipt=True)  # the connection stays usable


def test_bad_login(broker):
    c = broker.client(login="nobody", passcode="wrong")
    if broker.name == "rabbitmq":
        with pytest.raises(StompError) as info:
            c.connect()
        assert "CONNECT" in info.value.message
    else:
        c.connect()  # ActiveMQ without an authentication plugin accepts anyone
        c.disconnect()


# -- cross-checks with stomp.py ---------------------------------------------------------------------
CROSS_HEADERS = {"x-plain": "value", "x-colon": "a:b", "x-utf": "é€", "x-num": "42"}
CROSS_BODIES = [b"plain", bytes(range(256)), b"\x00lead\x00and\x00trail\x00", os.urandom(70_000)]


def _stomppy(broker: Broker, listener=None):
    import stomp

    conn = stomp.Connection10([("127.0.0.1", broker.port)], auto_decode=False)
    if listener is not None:
        conn.set_listener("test", listener)
    conn.connect("guest", "guest", wait=True)
    return conn


def test_we_read_what_stomppy_sends(broker):
    q = broker.queue("from-stomppy")
    with broker.client() as c:
        c.subscribe(q)
        conn = _stomppy(broker)
        try:
            for body in CROSS_BODIES:
                conn.send(q, body, headers=dict(CROSS_HEADERS))
        finally:
            conn.disconnect()
        got = drain(c, len(CROSS_BODIES))
    assert [m.body for m in got] == CROSS_BODIES
    for m in got:
        assert {k: m.headers.get(k) for k in CROSS_HEADERS} == CROSS_HEADERS


def test_stomppy_reads_what_we_send(broker):
    import stomp

    q = broker.queue("to-stomppy")
    received: list = []
    done = threading.Event()

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            received.append(frame)
            if len(received) == len(CROSS_BODIES):
                done.set()

    conn = _stomppy(broker, Listener())
    try:
        conn.subscribe(q, id="1", ack="auto")
        time.sleep(0.5)  # stomp.py's SUBSCRIBE has no receipt here; let it land
        with broker.client() as c:
            for body in CROSS_BODIES:
                c.send(q, body, headers=dict(CROSS_HEADERS))
        assert done.wait(RECV)
    finally:
        conn.disconnect()
    assert [f.body for f in received] == CROSS_BODIES
    for f in received:
        seen = {k: f.headers.get(k) for k in CROSS_HEADERS}
        if broker.name == "rabbitmq":
            # RabbitMQ escapes ':' as '\c' even for a 1.0 session, and stomp.py's 1.0 protocol may
            # pass that on verbatim (spark-mq undoes it: see test_we_read_what_stomppy_sends).
            seen = {k: v.replace("\\c", ":") for k, v in seen.items()}
        assert seen == CROSS_HEADERS


def test_tls_against_rabbitmq_stomp_listener(rabbitmq):
    """STOMP over TLS to RabbitMQ's own TLS listener (self-signed certificate from the harness):
    binary bodies both ways while the reader thread and the sender share the TLS connection."""
    from spark_mq.transport.stream import TlsOptions

    tls = TlsOptions(ca_file=str(rabbitmq.tls_ca_file))
    dest = f"/queue/spark-mq-tls-{uuid.uuid4().hex[:10]}"
    body = bytes(range(256)) * 2000
    with StompClient("127.0.0.1", rabbitmq.stomps_port, login="guest", passcode="guest", tls=tls,
                     timeout=20) as c:
        c.subscribe(dest, ack="auto")
        for _ in range(20):
            c.send(dest, body)
        got = drain(c, 20)
    assert [m.body for m in got] == [body] * 20
