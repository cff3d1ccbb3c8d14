"""Our ZMTP 3.0 DEALER (``spark_mq.transport.zmtp``) against libzmq itself, over real sockets.

libzmq (through pyzmq) is the peer every Malamute broker is built on: its ROUTER must see our
DEALER as one of its own, both ways, on TCP and IPC, across its going away and coming back, and
must be refused with a clear reason when it asks for what we do not speak (PLAIN or CURVE
security, a socket type a DEALER cannot talk to). Every wait is bounded.
"""

from __future__ import annotations

import os
import tempfile
import time

import pytest
import zmq

from broker_process import free_tcp_port
from spark_mq.transport.zmtp import State, ZmtpDealer

pytestmark = pytest.mark.integration

WAIT = 10.0  # seconds any single expected event may take


@pytest.fixture
def ctx():
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def _router(ctx, endpoint: str, **options) -> zmq.Socket:
    sock = ctx.socket(zmq.ROUTER)
    sock.linger = 0
    for name, value in options.items():
        setattr(sock, name, value)
    sock.bind(endpoint)
    return sock


def _read(dealer: ZmtpDealer, count: int, max_count: int = 1000, timeout: float = WAIT) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < count and time.monotonic() < deadline:
        got = dealer.read(min(max_count, count - len(out)))
        assert len(got) <= max_count
        out.extend(got)
        if not got:
            dealer.wait(0.05)
    return out


def _router_recv(router: zmq.Socket, timeout: float = WAIT) -> list:
    assert router.poll(int(timeout * 1000)), "the ROUTER received nothing"
    return router.recv_multipart()


def _connected(dealer: ZmtpDealer, router: zmq.Socket) -> bytes:
    """Complete the handshake: a hello from the dealer gives the ROUTER its routing id."""
    assert dealer.send([b"hello"])
    deadline = time.monotonic() + WAIT
    while not router.poll(10) and time.monotonic() < deadline:
        dealer.read(1)
        dealer.wait(0.02)
    ident, hello = _router_recv(router)
    assert hello == b"hello"
    return ident


def test_messages_cross_both_ways_exactly_on_tcp(ctx):
    """Multipart messages with empty, 255- and 256-byte and 3 MiB frames, and 20,000 small ones in
    order, from a libzmq ROUTER to our DEALER; our messages reach the ROUTER whole."""
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    router = _router(ctx, endpoint, sndhwm=0)  # a ROUTER drops what exceeds its high-water mark
    dealer = ZmtpDealer(endpoint)
    try:
        ident = _connected(dealer, router)
        assert dealer.ready and dealer.connections == 1
        big = os.urandom(3 << 20)
        shapes = [[b""], [b"a", b"", b"c"], [b"x" * 255, b"y" * 256], [b"h", big], [b"after"]]
        for frames in shapes:
            router.send_multipart([ident, *frames])
        assert _read(dealer, len(shapes), max_count=2) == shapes
        for i in range(20_000):
            router.send_multipart([ident, b"n", str(i).encode()])
        got = _read(dealer, 20_000, max_count=777)
        assert got == [[b"n", str(i).encode()] for i in range(20_000)]
        sent = [[b"one"], [b"", b"two", b""], [b"z" * 70_000, b"tail"]]
        for frames in sent:
            assert dealer.send(frames)
        deadline = time.monotonic() + WAIT
        received = []
        while len(received) < len(sent) and time.monotonic() < deadline:
            dealer.wait(0.01)  # writes what the socket did not take at once
            if router.poll(10):
                received.append(router.recv_multipart()[1:])
        assert received == sent
    finally:
        dealer.close()


def test_ipc_endpoint(ctx):
    """``ipc://path``: the same DEALER over a Unix socket."""
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = f"ipc://{tmp}/zmtp.sock"
        router = _router(ctx, endpoint)
        dealer = ZmtpDealer(endpoint)
        try:
            ident = _connected(dealer, router)
            router.send_multipart([ident, b"over", b"ipc"])
            assert _read(dealer, 1) == [[b"over", b"ipc"]]
        finally:
            dealer.close()


def test_connects_once_the_peer_binds_and_keeps_what_was_sent_meanwhile(ctx):
    """Nothing listens at first: attempts repeat every reconnect interval; messages sent meanwhile
    are queued and reach the ROUTER, in order, once it binds."""
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    dealer = ZmtpDealer(endpoint, reconnect_interval=0.05)
    try:
        for i in range(5):
            assert dealer.send([b"early", str(i).encode()])
        dealer.wait(0.3)
        assert not dealer.ready and dealer.state is not State.CONNECTED
        assert "ECONNREFUSED" in (dealer.last_error or "")
        router = _router(ctx, endpoint)
        got = []
        deadline = time.monotonic() + WAIT
        while len(got) < 5 and time.monotonic() < deadline:
            dealer.read(1)
            dealer.wait(0.02)
            while router.poll(0):
                got.append(router.recv_multipart()[1:])
        assert got == [[b"early", str(i).encode()] for i in range(5)]
    finally:
        dealer.close()


def test_peer_gone_and_back_the_dealer_reconnects(ctx):
    """The ROUTER closes (as a broker killed would) and another binds the same port: the DEALER
    notices, connects again by itself and messages flow both ways on the new connection."""
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    router = _router(ctx, endpoint)
    dealer = ZmtpDealer(endpoint, reconnect_interval=0.05)
    try:
        _connected(dealer, router)
        router.close(0)
        deadline = time.monotonic() + WAIT
        while dealer.ready and time.monotonic() < deadline:
            dealer.read(10)
            dealer.wait(0.02)
        assert not dealer.ready
        assert dealer.send([b"while", b"away"])
        router = _router(ctx, endpoint)
        ident, *frames = _router_recv_driving(dealer, router)
        assert frames == [b"while", b"away"]
        assert dealer.connections == 2
        router.send_multipart([ident, b"back"])
        assert _read(dealer, 1) == [[b"back"]]
    finally:
        dealer.close()


def _router_recv_driving(dealer: ZmtpDealer, router: zmq.Socket) -> list:
    deadline = time.monotonic() + WAIT
    while not router.poll(10) and time.monotonic() < deadline:
        dealer.read(10)
        dealer.wait(0.02)
    return _router_recv(router, 0.1)


def test_libzmq_heartbeats_keep_the_connection(ctx):
    """A ROUTER with ZMTP heartbeats (100 ms interval, 1.5 s timeout): the DEALER, read now and
    then, keeps its one connection for four seconds (many PINGs, and more than twice the timeout: a
    dealer that never answered would be dropped) and still receives. The timeout leaves room for a
    test thread descheduled a few hundred ms on a busy machine; the dealer answers PINGs in ``read``."""
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    router = _router(ctx, endpoint, heartbeat_ivl=100, heartbeat_timeout=1500, heartbeat_ttl=1500)
    dealer = ZmtpDealer(endpoint)
    try:
        ident = _connected(dealer, router)
        end = time.monotonic() + 4.0
        while time.monotonic() < end:
            assert dealer.read(10) == []
            dealer.wait(0.05)
        router.send_multipart([ident, b"still", b"here"])
        assert _read(dealer, 1) == [[b"still", b"here"]]
        assert dealer.connections == 1 and dealer.ready
    finally:
        dealer.close()


@pytest.mark.parametrize("kind, options", [("PLAIN", {"plain_server": True}), ("PUB", {})])
def test_a_peer_we_cannot_speak_to_is_named(ctx, kind, options):
    """A ROUTER that wants PLAIN security, or a PUB socket: never ready, and ``last_error`` says the
    handshake failed (libzmq closes the connection, sometimes before the bytes that say why)."""
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    sock = ctx.socket(zmq.PUB if kind == "PUB" else zmq.ROUTER)
    sock.linger = 0
    for name, value in options.items():
        setattr(sock, name, value)
    sock.bind(endpoint)
    dealer = ZmtpDealer(endpoint, reconnect_interval=0.05)
    try:
        deadline = time.monotonic() + 2.0
        errors = set()
        while time.monotonic() < deadline:
            assert dealer.read(10) == []
            dealer.wait(0.02)
            errors.add(dealer.last_error)
        assert errors and all(e is None or e.startswith("ZMTP handshake failed") for e in errors), errors
        assert any(e and ("PLAIN" in e if kind == "PLAIN" else "DEALER" in e) for e in errors), errors
        assert not dealer.ready and dealer.connections == 0
    finally:
        dealer.close()


@pytest.mark.parametrize("endpoint", ["tcp://127.0.0.1", "tcp://*:5555", "inproc://x", "udp://1.2.3.4:5", "nonsense"])
def test_bad_endpoints_are_named(endpoint):
    from spark_mq.errors import ConnectionClosedError

    with pytest.raises(ConnectionClosedError, match="bad ZeroMQ endpoint"):
        ZmtpDealer(endpoint)


def test_the_malamute_receiver_names_why_it_could_not_connect(ctx):
    """``MalamuteReceiver`` (the source's client) on a dead port and on a PUB socket: the connect
    error carries the transport's reason, so the query's error says what is at that endpoint."""
    from spark_mq.clients.malamute import MalamuteReceiver
    from spark_mq.errors import ConnectionClosedError

    dead = f"tcp://127.0.0.1:{free_tcp_port()}"
    with pytest.raises((ConnectionClosedError, TimeoutError), match=r"ECONNREFUSED"):
        MalamuteReceiver(dead, "x", timeout=1.0)
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    pub = ctx.socket(zmq.PUB)
    pub.linger = 0
    pub.bind(endpoint)
    with pytest.raises((ConnectionClosedError, TimeoutError), match=r"ZMTP handshake failed"):
        MalamuteReceiver(endpoint, "x", timeout=1.0)


def test_libzmq_heartbeats_during_multipart_traffic(ctx):
    """ZMTP heartbeats every 10 ms while the ROUTER streams 3-frame messages of several KiB for about
    a second: a PING may come between two frames of a message (libzmq writes it when its timer fires);
    every message arrives whole, in order, on the one connection."""
    endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    router = _router(ctx, endpoint, sndhwm=0, heartbeat_ivl=10, heartbeat_timeout=1000, heartbeat_ttl=1000)
    dealer = ZmtpDealer(endpoint)
    try:
        ident = _connected(dealer, router)
        got: list = []
        sent = 0
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            for _ in range(50):
                router.send_multipart([ident, b"h%d" % sent, b"x" * 6000, b"t"])
                sent += 1
            got.extend(dealer.read(1000))
        got.extend(_read(dealer, sent - len(got)))
        assert got == [[b"h%d" % i, b"x" * 6000, b"t"] for i in range(sent)]
        assert dealer.connections == 1
    finally:
        dealer.close()


def test_localhost_and_abstract_ipc_endpoints_reach_ipv4_and_abstract_sockets(ctx):
    """``tcp://localhost:port`` reaches a ROUTER bound on 127.0.0.1 (IPv4, as libzmq resolves it,
    whatever order the resolver gives), and ``ipc://@name`` a socket in Linux's abstract namespace."""
    port = free_tcp_port()
    abstract = f"ipc://@spark-mq-test-{os.getpid()}-{port}"
    for bound, connect in ((f"tcp://127.0.0.1:{port}", f"tcp://localhost:{port}"), (abstract, abstract)):
        router = _router(ctx, bound)
        dealer = ZmtpDealer(connect)
        try:
            ident = _connected(dealer, router)
            router.send_multipart([ident, b"reached", connect.encode()])
            assert _read(dealer, 1) == [[b"reached", connect.encode()]]
        finally:
            dealer.close()
            router.close(0)
