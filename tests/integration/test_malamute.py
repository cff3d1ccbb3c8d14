"""Malamute client against the embedded broker running as a separate process over real loopback TCP.

Every client feature, two clients on one mailbox address, service round robin, a broker killed
(SIGKILL) and restarted mid-stream while clients recover, persistence across a restart, and
hostile raw frames sent to the broker while a well-behaved client keeps working.
Every wait is bounded (recv timeouts, process timeouts); nothing here can hang.
"""

from __future__ import annotations

import threading
import time

import brokers
import pytest
import zmq

from spark_mq.clients.malamute import MalamuteClient, MalamuteReceiver
from spark_mq.errors import LocalProtocolError
from broker_process import BrokerProcess, free_tcp_port
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.malamute.errors import MalamuteBrokerError

pytestmark = pytest.mark.integration

RECV = 5.0  # seconds: the longest any single delivery may take in these tests


@pytest.fixture
def malamute_broker():
    """The broker as a separate process on a free TCP port; killable and restartable (no mailbox dir)."""
    with brokers.malamute_running(client_timeout=10.0) as broker:
        yield broker


@pytest.fixture
def clients(malamute_broker):
    made: list[MalamuteClient] = []

    def make(address: str = "", **kwargs) -> MalamuteClient:
        client = MalamuteClient(malamute_broker.endpoint, address, timeout=5.0, **kwargs)
        made.append(client)
        return client

    yield make
    for client in made:
        client.close(timeout=0.5)


def recv_all(client: MalamuteClient, count: int, timeout: float = RECV) -> list:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        msg = client.recv(timeout=max(0.01, deadline - time.monotonic()))
        if msg is not None:
            out.append(msg)
    return out


def test_connect_timeout_when_nothing_listens():
    from broker_process import free_tcp_port
    start = time.monotonic()
    with pytest.raises(Exception):
        MalamuteClient(f"tcp://127.0.0.1:{free_tcp_port()}", "x", timeout=0.5)
    assert time.monotonic() - start < 5


def test_streams_patterns_multiframe_and_cancel(clients):
    producer, reader, other = clients("producer"), clients("reader"), clients("other")
    producer.set_producer("weather")
    reader.set_consumer("weather", "^temp\\.")
    other.set_consumer("weather", "")
    producer.send("temp.paris", [b"21", b"C"])
    producer.send("humidity.paris", "40")
    producer.send("temp.rome", b"25")
    got = recv_all(reader, 2)
    assert [(m.address, m.sender, m.subject, m.content) for m in got] == [
        ("weather", "producer", "temp.paris", [b"21", b"C"]), ("weather", "producer", "temp.rome", [b"25"])]
    assert [m.subject for m in recv_all(other, 3)] == ["temp.paris", "humidity.paris", "temp.rome"]
    reader.remove_consumer("weather")
    producer.send("temp.oslo", b"3")
    producer.ping()  # flush barrier: the broker has processed the send
    assert reader.recv(timeout=0.3) is None
    assert other.recv(timeout=RECV).subject == "temp.oslo"


def test_patterns_refused_locally(clients):
    client = clients("c")
    for pattern in ("*", "+", "a**", "(a*)*", "[0-9]"):
        with pytest.raises(LocalProtocolError):
            client.set_consumer("s", pattern)
    client.ping()  # still fine


def test_mailbox_send_receive_tracker_and_offline_storage(clients):
    alice = clients("alice")
    alice.sendto("bob", "hello", [b"one", b"two"], tracker="trk-1", timeout=0)
    alice.sendto("bob", "again", b"three", tracker="trk-2")
    alice.ping()
    bob = clients("bob")
    got = recv_all(bob, 2)
    assert [(m.sender, m.address, m.subject, m.tracker, m.content) for m in got] == [
        ("alice", "bob", "hello", "trk-1", [b"one", b"two"]), ("alice", "bob", "again", "trk-2", [b"three"])]
    bob.sendto("alice", "reply", b"x")
    assert alice.recv(timeout=RECV).subject == "reply"


def test_two_clients_on_one_mailbox_address(clients):
    sender = clients("sender")
    first = clients("shared")
    second = clients("shared")
    sender.sendto("shared", "to-newest", b"1")
    assert second.recv(timeout=RECV).subject == "to-newest"
    assert first.recv(timeout=0.3) is None
    first.ping()  # the older connection is not evicted
    second.close()
    sender.sendto("shared", "to-older", b"2")
    assert first.recv(timeout=RECV).subject == "to-older"


def test_services_round_robin_and_reply(clients):
    requester = clients("requester")
    workers = [clients(f"worker{i}") for i in range(3)]
    for w in workers:
        w.set_worker("calc", "^add")
    for i in range(6):
        requester.sendfor("calc", "add", str(i), tracker=f"t{i}")
    requester.ping()
    seen = {}
    for w in workers:
        reqs = recv_all(w, 2)
        seen[w.address] = [r.content[0] for r in reqs]
        for r in reqs:
            assert r.sender == "requester" and r.address == "calc"
            w.reply(r, "result", [r.content[0], b"done"])
    assert seen == {"worker0": [b"0", b"3"], "worker1": [b"1", b"4"], "worker2": [b"2", b"5"]}
    replies = recv_all(requester, 6)
    assert sorted(m.content[0] for m in replies) == [str(i).encode() for i in range(6)]


def test_service_request_queued_until_worker_offers(clients):
    requester = clients("req")
    requester.sendfor("late", "job", b"payload")
    requester.ping()
    worker = clients("late-worker")
    worker.set_worker("late")
    assert worker.recv(timeout=RECV).content == [b"payload"]


def test_bad_pattern_sent_raw_gets_error_not_a_hang(malamute_broker, clients):
    ctx = zmq.Context.instance()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVTIMEO, 5000)
    raw.connect(malamute_broker.endpoint)
    try:
        raw.send_multipart(codec.encode(codec.ConnectionOpen("raw")))
        assert codec.decode(raw.recv_multipart()) == codec.Ok()
        for pattern in ("*", "a**", "(a*)*"):
            raw.send_multipart(codec.encode(codec.ServiceOffer("svc", pattern)))
            reply = codec.decode(raw.recv_multipart())
            assert isinstance(reply, codec.Error) and reply.code == 300
    finally:
        raw.close(0)
    clients("after").ping()


def test_confirm_refused_locally_and_broker_error_surfaces(clients):
    client = clients("c")
    with pytest.raises(LocalProtocolError):
        client.confirm("t")


def test_hostile_inputs_while_a_client_keeps_working(malamute_broker, clients):
    producer, reader = clients("p"), clients("r")
    producer.set_producer("s")
    reader.set_consumer("s")
    ctx = zmq.Context.instance()
    hostile = ctx.socket(zmq.DEALER)
    hostile.setsockopt(zmq.LINGER, 0)
    hostile.setsockopt(zmq.RCVTIMEO, 5000)
    hostile.connect(malamute_broker.endpoint)
    attacks = [
        [b"\xde\xad\x01"],  # bad signature
        [b"\xaa\xa8\x63"],  # unknown id
        [b"\xaa\xa8"],  # truncated header
        [b"\xaa\xa8\x01\x08MALA"],  # truncated OPEN
        [b"\xaa\xa8\x05\xff" + b"x" * 10],  # string longer than the frame
        [b"\xaa\xa8\x01\x08MALAMUTE\x00\x01\x00", b"extra"],  # extra frame on OPEN
    ]
    try:
        stop = threading.Event()
        sent = []

        def produce():
            i = 0
            while not stop.is_set() and i < 2000:
                producer.send(f"m{i}", b"x")
                sent.append(i)
                i += 1
                time.sleep(0.0005)

        t = threading.Thread(target=produce)
        t.start()
        for frames in attacks * 3:
            hostile.send_multipart(frames)
            reply = codec.decode(hostile.recv_multipart())
            assert isinstance(reply, codec.Error)
        # after OPEN, the same hostile socket also sends malformed messages as a registered client
        hostile.send_multipart(codec.encode(codec.ConnectionOpen("hostile")))
        assert codec.decode(hostile.recv_multipart()) == codec.Ok()
        for frames in ([b"\xaa\xa8\x02", b"extra"], [b"\xaa\xa8\x07\x05ab"], [b"\xaa\xa8\x09\x00"],
                       [b"\xaa\xa8\x11\x00\x01"]):
            hostile.send_multipart(frames)
            assert isinstance(codec.decode(hostile.recv_multipart()), codec.Error)
        # aborts the reference broker (czmq assert): a 2-byte frame after MAILBOX-SEND to an offline address
        hostile.send_multipart(codec.encode(codec.MailboxSend("offline-bob", "s", "", 0, [b"\x01\x02"])))
        hostile.send_multipart(codec.encode(codec.ConnectionPing()))
        assert codec.decode(hostile.recv_multipart()) == codec.ConnectionPong()  # no reply to the send
        t.join(30)
        stop.set()
        producer.ping()
        got = recv_all(reader, len(sent), timeout=15)
        assert [m.subject for m in got] == [f"m{i}" for i in sent]
    finally:
        stop.set()
        hostile.close(0)
    assert malamute_broker.alive


def test_broker_killed_and_restarted_mid_stream_clients_recover(malamute_broker, clients):
    events = []
    producer = clients("producer", on_event=events.append)
    reader = clients("reader")
    worker = clients("worker")
    producer.set_producer("ticks")
    reader.set_consumer("ticks", "^tick")
    worker.set_worker("svc")
    for i in range(20):
        producer.send("tick", str(i))
    assert len(recv_all(reader, 20)) == 20

    malamute_broker.kill()
    time.sleep(0.3)
    malamute_broker.start()  # same port, empty state: it knows nobody

    # The clients find out on their next PING (ERROR 500), re-OPEN and replay WRITE/READ/OFFER.
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not (producer.recoveries and reader.recoveries and worker.recoveries):
        time.sleep(0.1)
    assert producer.recoveries >= 1 and reader.recoveries >= 1 and worker.recoveries >= 1
    for c in (producer, reader, worker):
        c.ping(timeout=RECV)  # answered: registered again
    for i in range(20, 40):
        producer.send("tick", str(i))
    got = recv_all(reader, 20)
    assert [m.content[0] for m in got] == [str(i).encode() for i in range(20, 40)]
    reader.sendfor("svc", "after-restart", b"q")
    assert worker.recv(timeout=RECV).subject == "after-restart"
    assert any(type(e).__name__ == "Recovered" for e in events)


def test_mailbox_survives_broker_restart_with_persistence(tmp_path):
    broker = BrokerProcess(mailbox_dir=str(tmp_path / "mail"))
    try:
        broker.start()
    except RuntimeError as exc:
        pytest.fail(f"cannot start the embedded Malamute broker: {exc}")
    try:
        with MalamuteClient(broker.endpoint, "sender", timeout=5) as sender:
            for i in range(5):
                sender.sendto("offline", f"m{i}", [str(i).encode(), b"tail"], tracker=f"t{i}")
            sender.ping()
        broker.kill()
        broker.start()
        with MalamuteClient(broker.endpoint, "offline", timeout=5) as receiver:
            got = recv_all(receiver, 5)
        assert [(m.subject, m.tracker, m.content) for m in got] == [
            (f"m{i}", f"t{i}", [str(i).encode(), b"tail"]) for i in range(5)]
        broker.kill()
        broker.start()  # delivered mail is not delivered twice
        with MalamuteClient(broker.endpoint, "offline", timeout=5) as receiver:
            assert receiver.recv(timeout=0.5) is None
    finally:
        broker.stop()


def test_credit_flow_control_when_enabled():
    broker = BrokerProcess(args=["--credit"])
    try:
        broker.start()
    except RuntimeError as exc:
        pytest.fail(f"cannot start the embedded Malamute broker: {exc}")
    try:
        with MalamuteClient(broker.endpoint, "p", timeout=5) as p, MalamuteClient(broker.endpoint, "r", timeout=5) as r:
            p.set_producer("s")
            r.set_consumer("s")
            for i in range(5):
                p.send(str(i), b"")
            p.ping()
            assert r.recv(timeout=0.3) is None  # no credit yet
            r.credit(3)
            assert [m.subject for m in recv_all(r, 3)] == ["0", "1", "2"]
            assert r.recv(timeout=0.3) is None
            r.credit(10)
            assert [m.subject for m in recv_all(r, 2)] == ["3", "4"]
    finally:
        broker.stop()


def test_in_process_broker_api_and_ipc(tmp_path):
    from spark_mq.malamute_broker import Broker
    ipc = f"ipc://{tmp_path}/mlm.sock"
    with Broker(["tcp://127.0.0.1:0", ipc]) as broker:
        assert broker.endpoints[0].startswith("tcp://127.0.0.1:") and not broker.endpoints[0].endswith(":0")
        with MalamuteClient(broker.endpoints[1], "a", timeout=5) as a, MalamuteClient(broker.endpoints[0], "b",
                                                                                       timeout=5) as b:
            a.sendto("b", "over-ipc", b"1")
            assert b.recv(timeout=RECV).content == [b"1"]
        assert broker.stats["malformed"] == 0


def test_broker_refused_request_raises_broker_error(malamute_broker):
    # The client validates patterns locally, so provoke a broker ERROR another way: a second OPEN on
    # the same connection (refused by the broker, as by the reference one) surfaces as MalamuteBrokerError.
    with MalamuteClient(malamute_broker.endpoint, "x", timeout=5) as client:
        with pytest.raises(MalamuteBrokerError):
            client._request(lambda p, now: p._request(codec.ConnectionOpen("x")), "CONNECTION-OPEN")


def test_mailbox_larger_than_both_high_water_marks_arrives_whole_and_in_order(tmp_path):
    """5,000 stored mails of 0 to 3 content frames for a client whose ZeroMQ queues hold a few
    hundred (broker SNDHWM 200, the reader a raw DEALER with RCVHWM 200 that does not read at
    first): the broker must neither drop what does not fit nor leave it until a reconnect; every
    mail arrives whole (each frame, none run into the next), in order; and the mailbox journal then
    books every one delivered (a broker restarted on it has nothing to send)."""
    from spark_mq.malamute_broker.server import serve
    from spark_mq.malamute_broker.store import MailboxStore

    port = free_tcp_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    broker = serve([endpoint], hwm=200, client_timeout=30.0, mailbox_dir=str(tmp_path / "boxes"))
    raw = zmq.Context.instance().socket(zmq.DEALER)
    contents = [[f"m{i}-{k}".encode() * (k + 1) for k in range(i % 4)] for i in range(5000)]
    try:
        with MalamuteClient(endpoint, "", timeout=5) as sender:
            for i, content in enumerate(contents):
                sender.sendto("big", f"s{i}", content)
            sender.ping()
        raw.setsockopt(zmq.LINGER, 0)
        raw.setsockopt(zmq.RCVHWM, 200)
        raw.setsockopt(zmq.RCVTIMEO, 10_000)
        raw.connect(endpoint)
        raw.send_multipart(codec.encode(codec.ConnectionOpen("big")))
        time.sleep(1.0)  # not reading: both queues fill, the broker meets EAGAIN
        assert broker.stats["unroutable"] > 0
        assert codec.decode(raw.recv_multipart()) == codec.Ok()
        got = [codec.decode(raw.recv_multipart()) for _ in range(5000)]
        assert [m.subject for m in got] == [f"s{i}" for i in range(5000)]
        assert [list(m.content) for m in got] == contents
        raw.setsockopt(zmq.RCVTIMEO, 300)
        with pytest.raises(zmq.Again):
            raw.recv_multipart()
    finally:
        raw.close(0)
        broker.stop()
    assert MailboxStore(tmp_path / "boxes").load() == []


def test_recv_and_recv_many_take_every_delivery_once_in_order(clients):
    """Deliveries cross from the client's IO thread in lists: recv() and recv_many() mixed must
    still hand out each message once, in order, and recv_many must respect its count."""
    reader = clients("lists")
    sender = clients()
    n = 20_000
    for i in range(n):
        sender.sendto("lists", "s", f"m{i}".encode())
    sender.ping()
    got: list = []
    deadline = time.monotonic() + 60
    turn = 0
    while len(got) < n and time.monotonic() < deadline:
        turn += 1
        if turn % 3 == 0:
            msg = reader.recv(timeout=1.0)
            got.extend([msg] if msg is not None else [])
        else:
            many = reader.recv_many(turn % 700 + 1, timeout=1.0)
            assert len(many) <= turn % 700 + 1
            got.extend(many)
    assert [bytes(m.content[0]) for m in got] == [f"m{i}".encode() for i in range(n)]
    assert reader.recv_many(10, timeout=0.3) == [] and reader.recv(timeout=0.1) is None


def test_max_buffered_holds_back_reading_and_loses_nothing():
    """A client with ``max_buffered`` stops reading its socket while that many deliveries wait for
    the application: the rest stays in ZeroMQ (``hwm``), TCP and the broker's mailbox, and every
    message still arrives once, in order, when the application takes them."""
    from spark_mq.malamute_broker.server import serve

    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    broker = serve([endpoint], hwm=100, client_timeout=30.0)
    try:
        n, bound = 5000, 50
        with MalamuteClient(endpoint, "", timeout=5) as sender:
            for i in range(n):
                sender.sendto("held", "s", f"m{i}".encode())
            sender.ping()
        with MalamuteClient(endpoint, "held", timeout=5, hwm=bound, max_buffered=bound) as reader:
            time.sleep(1.0)  # not taking anything: the IO thread must stop at the bound
            assert reader.buffered == bound
            assert broker.stats["unroutable"] > 0  # the broker met a full queue and kept the mail
            got: list = []
            deadline = time.monotonic() + 60
            while len(got) < n and time.monotonic() < deadline:
                got.extend(reader.recv_many(30, timeout=1.0))
                assert reader.buffered <= bound
            assert [bytes(m.content[0]) for m in got] == [f"m{i}".encode() for i in range(n)]
            assert reader.buffered == 0 and reader.recv(timeout=0.2) is None
    finally:
        broker.stop()


def test_held_back_reader_is_not_declared_lost_and_answers_requests():
    """While deliveries wait unread (the application is behind), the broker's answers queue behind
    them: the client must not conclude from its own unread socket that the server is silent, and
    a request made meanwhile is answered once the application catches up."""
    events: list = []
    with brokers.malamute_running(client_timeout=10.0) as broker:
        with MalamuteClient(broker.endpoint, "", timeout=5) as sender:
            for i in range(300):
                sender.sendto("slow", "s", f"m{i}".encode())
            sender.ping()
        with MalamuteClient(broker.endpoint, "slow", timeout=5, heartbeat=0.2, server_timeout=0.8,
                            hwm=10, max_buffered=10, on_event=events.append) as reader:
            time.sleep(2.5)  # three server timeouts without taking anything
            assert reader.buffered == 10
            assert reader.connected
            done = threading.Event()
            threading.Thread(target=lambda: (reader.ping(timeout=20), done.set()), daemon=True).start()
            got = recv_all(reader, 300, timeout=30)
            assert [bytes(m.content[0]) for m in got] == [f"m{i}".encode() for i in range(300)]
            assert done.wait(10), "the PING made while deliveries were held back was never answered"
    assert not any(type(e).__name__ == "ServerLost" for e in events), events


def test_held_back_reader_closes_promptly():
    """Closing a client held back at its bound reads again, so CONNECTION-CLOSE is answered at once
    (not after the close timeout behind deliveries nobody will take)."""
    with brokers.malamute_running(client_timeout=10.0) as broker:
        with MalamuteClient(broker.endpoint, "", timeout=5) as sender:
            for i in range(500):
                sender.sendto("closing", "s", f"m{i}".encode())
            sender.ping()
        reader = MalamuteClient(broker.endpoint, "closing", timeout=5, hwm=5, max_buffered=5)
        deadline = time.monotonic() + 5
        while reader.buffered < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reader.buffered == 5
        t0 = time.monotonic()
        reader.close(timeout=3.0)
        assert time.monotonic() - t0 < 1.5


def test_held_back_reader_keeps_request_answers_in_step():
    """Held back behind a full broker queue (broker HWM 50, client bound 10) while heartbeats go
    out: the broker holds its answers instead of dropping them, and the client reads through to a
    request's answer, so after the drain every request still gets its own answer."""
    from spark_mq.malamute_broker.server import serve

    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    broker = serve([endpoint], hwm=50, client_timeout=30.0)
    try:
        with MalamuteClient(endpoint, "", timeout=5) as sender:
            for i in range(2000):
                sender.sendto("step", "s", f"m{i}".encode())
            sender.ping()
        with MalamuteClient(endpoint, "step", timeout=5, heartbeat=0.1, server_timeout=5.0,
                            hwm=10, max_buffered=10) as reader:
            time.sleep(2.0)  # ~20 PINGs while the broker's queue to us is full
            reader.set_consumer("other-stream")  # a request answered while deliveries are held back
            got = recv_all(reader, 2000, timeout=30)
            assert [bytes(m.content[0]) for m in got] == [f"m{i}".encode() for i in range(2000)]
            reader.ping(timeout=5)
            reader.set_consumer("yet-another")
    finally:
        broker.stop()


# -- MalamuteReceiver: the same protocol driven by the caller's thread (no IO thread) ------------

def _mail(endpoint: str, address: str, n: int, prefix: str = "m") -> None:
    with MalamuteClient(endpoint, f"mailer-{prefix}", timeout=5) as sender:
        for i in range(n):
            sender.sendto(address, "s", f"{prefix}{i}".encode())
        sender.ping()


def _poll_all(receiver: MalamuteReceiver, count: int, timeout: float = 30.0, max_count: int = 1000) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        out.extend(receiver.poll(max_count, 0.5))
    return out


def test_receiver_takes_every_delivery_once_in_order_within_its_count_and_timeout(malamute_broker):
    """20,000 stored mails polled with counts from 1 to 700, through the smallest read buffer (128
    KiB: compacted often, mails cut at its end): each once, in order, never more than asked; an
    empty poll returns [] after its timeout, not before and not much later."""
    n = 20_000
    _mail(malamute_broker.endpoint, "rx", n)
    got: list = []
    with MalamuteReceiver(malamute_broker.endpoint, "rx", timeout=5, read_buffer=1) as rx:
        deadline = time.monotonic() + 60
        turn = 0
        while len(got) < n and time.monotonic() < deadline:
            turn += 1
            batch = rx.poll(turn % 700 + 1, 1.0)
            assert len(batch) <= turn % 700 + 1
            got.extend(batch)
        assert [m.content[0] for m in got] == [f"m{i}".encode() for i in range(n)]
        assert {(m.sender, m.address, m.subject) for m in got} == {("mailer-m", "rx", "s")}
        t0 = time.monotonic()
        assert rx.poll(10, 0.3) == []
        assert 0.25 <= time.monotonic() - t0 < 2.0


def test_receiver_stream_reply_behind_mail_keeps_the_mail_for_poll(malamute_broker):
    """A request's answer can queue behind deliveries (stored mail arrives right after the OPEN):
    ``set_consumer`` reads through to its answer and keeps the mail for ``poll``, in order, before
    the stream's own messages."""
    _mail(malamute_broker.endpoint, "both", 3000)
    with MalamuteReceiver(malamute_broker.endpoint, "both", timeout=5) as rx, \
            MalamuteClient(malamute_broker.endpoint, "pub", timeout=5) as pub:
        time.sleep(0.3)  # the mail is on its way before the request
        rx.set_consumer("weather", "^temp")
        assert rx.buffered > 0
        pub.set_producer("weather")
        for i in range(10):
            pub.send("temp.x" if i % 2 == 0 else "wind.x", f"w{i}")
        got = _poll_all(rx, 3005)
        assert [m.content[0] for m in got] == [f"m{i}".encode() for i in range(3000)] + \
            [f"w{i}".encode() for i in range(0, 10, 2)]
        assert type(got[-1]).__name__ == "StreamDeliver" and got[-1].address == "weather"
        assert rx.buffered == 0


def test_receiver_keepalive_holds_the_connection_while_nothing_is_taken():
    """The caller holds back (the source's ingest at its log bound) for three of the broker's
    client timeouts, calling only ``keepalive``: PINGs keep the broker from expiring it, unread
    deliveries count as hearing from the server, and nothing is lost. Without keepalive the broker
    forgets the client: the next poll finds out and re-opens (a recovery)."""
    events: list = []
    with brokers.malamute_running(client_timeout=1.0) as broker:
        _mail(broker.endpoint, "held", 500)
        with MalamuteReceiver(broker.endpoint, "held", timeout=5, heartbeat=0.2, server_timeout=0.8,
                              on_event=events.append) as rx:
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                rx.keepalive()
                time.sleep(0.05)
            assert rx.connected and rx.recoveries == 0
            got = _poll_all(rx, 500)
            assert [m.content[0] for m in got] == [f"m{i}".encode() for i in range(500)]
            rx.ping(timeout=5)
            assert rx.recoveries == 0
            assert not any(type(e).__name__ in ("ServerLost", "Recovering") for e in events), events
            # neither poll nor keepalive: silent past the broker's client timeout (1 s), which it checks
            # on a 1 s tick: expired at most ~2.3 s after our last PING, with room for a slow broker
            time.sleep(4.0)
            _mail(broker.endpoint, "held", 3, prefix="late")
            got = _poll_all(rx, 3, timeout=10)
            assert rx.recoveries >= 1  # the broker answered our next PING with ERROR: re-opened
            assert [m.content[0] for m in got] == [b"late0", b"late1", b"late2"]


def test_receiver_recovers_after_a_broker_restart(malamute_broker):
    """Broker killed and restarted (it forgets everyone): the receiver's polls run the clock, re-OPEN
    and replay STREAM-READ, and the stream's messages flow again."""
    with MalamuteReceiver(malamute_broker.endpoint, "", timeout=5, heartbeat=0.2) as rx:
        rx.set_consumer("ticks")
        with MalamuteClient(malamute_broker.endpoint, "p1", timeout=5) as pub:
            pub.set_producer("ticks")
            for i in range(20):
                pub.send("t", str(i))
            assert len(_poll_all(rx, 20)) == 20
        malamute_broker.kill()
        time.sleep(0.3)
        malamute_broker.start()
        deadline = time.monotonic() + 15
        while rx.recoveries == 0 and time.monotonic() < deadline:
            rx.poll(100, 0.1)
        assert rx.recoveries >= 1
        rx.ping(timeout=5)  # answered after the replay: registered again
        with MalamuteClient(malamute_broker.endpoint, "p2", timeout=5) as pub:
            pub.set_producer("ticks")
            for i in range(20, 40):
                pub.send("t", str(i))
            got = _poll_all(rx, 20)
        assert [m.content[0] for m in got] == [str(i).encode() for i in range(20, 40)]


def test_receiver_close_from_another_thread_waits_for_a_running_poll(malamute_broker):
    """``close`` while another thread is inside ``poll``: the socket is closed only once that poll
    returns (the socket is not driven from two threads); a later poll says the client is closed."""
    from spark_mq.errors import ConnectionClosedError

    rx = MalamuteReceiver(malamute_broker.endpoint, "idle", timeout=5)
    result: list = []
    poller = threading.Thread(target=lambda: result.append(rx.poll(10, 3.0)))
    poller.start()
    time.sleep(0.5)
    t0 = time.monotonic()
    rx.close(timeout=0.5)
    waited = time.monotonic() - t0
    poller.join(10)
    assert result == [[]] and 1.0 <= waited < 6.0  # the poll had ~2.5 s to go (room for a late wake)
    with pytest.raises(ConnectionClosedError):
        rx.poll(1, 0.1)
