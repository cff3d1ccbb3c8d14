"""The ZMTP driver's write and failure paths, over a scripted socket (``spark_mq.transport.zmtp``).

What real sockets make rare: a write the socket takes only in part while the peer's PING needs an
answer, and a write that finds the connection gone in the middle of a ``read``. The libzmq
interop tests (tests/integration/test_zmtp_interop.py) cover the rest over real sockets.
"""

from __future__ import annotations

from spark_mq.protocol.zmtp import ZmtpConnection, encode_command, encode_message
from spark_mq.transport.zmtp import State, ZmtpDealer

PEER_GREETING = b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\x00") + b"\x01" + b"\x00" * 31
PEER_READY = encode_command(b"READY", b"\x0bSocket-Type" + (6).to_bytes(4, "big") + b"ROUTER")
OUR_OPENING = ZmtpConnection().data_to_send()  # greeting and READY, as any new connection sends them


def ping(context: bytes) -> bytes:
    return encode_command(b"PING", b"\x00\x0a" + context)


class ScriptedSocket:
    """Serves ``inbound`` to ``recv_into`` (then EAGAIN); ``send`` takes at most ``per_send`` bytes
    and refuses every other call (EAGAIN), or raises ``fail_with`` once ``fail_after`` bytes are out."""

    def __init__(self, per_send: int = 1 << 30, fail_after: int | None = None, fail_with=BrokenPipeError):
        self.inbound = bytearray()
        self.outbound = bytearray()
        self.per_send = per_send
        self.fail_after = fail_after
        self.fail_with = fail_with
        self._turn = 0
        self.closed = False

    def recv_into(self, view) -> int:
        if not self.inbound:
            raise BlockingIOError
        n = min(len(view), len(self.inbound))
        view[:n] = self.inbound[:n]
        del self.inbound[:n]
        return n

    def send(self, data) -> int:
        if self.fail_after is not None and len(self.outbound) >= self.fail_after:
            raise self.fail_with(32, "Broken pipe")
        self._turn += 1
        if self._turn % 2 == 0:
            raise BlockingIOError
        n = min(len(data), self.per_send)
        self.outbound += bytes(data[:n])
        return n

    def setsockopt(self, *args) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class ScriptedDealer(ZmtpDealer):
    """A ZmtpDealer whose connection attempts get the next scripted socket, already connected."""

    def __init__(self, sockets: list) -> None:
        self._scripted = list(sockets)
        super().__init__("tcp://127.0.0.1:1", reconnect_interval=0.0)

    def _attempt(self, now: float) -> None:
        self._drop()
        if not self._scripted:
            self._failed("no more scripted sockets")
            return
        self._sock = self._scripted.pop(0)
        self._connected(now)


def drain_writes(dealer: ZmtpDealer, rounds: int = 200) -> None:
    for _ in range(rounds):
        dealer._flush()


def test_a_pong_never_lands_inside_a_message_the_socket_took_in_part():
    """A 100 KB message goes out 10 KB per write; a PING arrives midway: its PONG follows the whole
    message on the wire, and the stream is exactly greeting, READY, message, PONG."""
    sock = ScriptedSocket(per_send=10_000)
    dealer = ScriptedDealer([sock])
    drain_writes(dealer)
    big = [b"h", bytes(range(256)) * 400]
    assert dealer.send(big)
    sock.inbound += PEER_GREETING + PEER_READY
    assert dealer.read(10) == [] and dealer.ready
    for _ in range(3):  # the socket refuses every other write: one or two turns start the message
        if dealer._written == 0:
            dealer._flush()
    assert 0 < dealer._written < len(encode_message(big))  # cut off mid-message
    sock.inbound += ping(b"ctx") + encode_message([b"m"])
    assert dealer.read(10) == [[b"m"]]
    drain_writes(dealer)
    assert bytes(sock.outbound) == OUR_OPENING + encode_message(big) + encode_command(b"PONG", b"ctx")


def test_a_write_that_finds_the_peer_gone_during_read_keeps_what_was_read():
    """The peer's READY, a PING and two messages arrive together; answering the PING finds the
    connection broken: ``read`` returns both messages, raises nothing, and the dealer connects again."""
    first = ScriptedSocket(fail_after=len(OUR_OPENING))
    second = ScriptedSocket()
    dealer = ScriptedDealer([first, second])
    drain_writes(dealer, 2)
    first.inbound += PEER_GREETING + PEER_READY + ping(b"x") + encode_message([b"a"]) + encode_message([b"b", b"c"])
    assert dealer.read(10) == [[b"a"], [b"b", b"c"]]
    assert dealer.state is State.WAITING and first.closed
    assert "BrokenPipeError" in dealer.last_error
    assert dealer.read(10) == []  # the next attempt: the second socket, greeting sent again
    assert dealer.state is State.CONNECTED
    drain_writes(dealer)
    assert bytes(second.outbound) == OUR_OPENING


def test_a_message_cut_off_by_a_lost_connection_goes_again_whole_and_once():
    """Half a queued message is written, then the connection breaks: the next connection carries
    the whole message once, after its own greeting, and nothing of the first attempt."""
    first = ScriptedSocket(per_send=1000, fail_after=len(OUR_OPENING) + 3000)
    second = ScriptedSocket()
    dealer = ScriptedDealer([first, second])
    msg = [b"x" * 5000]
    assert dealer.send(msg)
    first.inbound += PEER_GREETING + PEER_READY
    dealer.read(1)
    drain_writes(dealer)
    assert dealer.state is State.WAITING
    dealer.read(1)
    second.inbound += PEER_GREETING + PEER_READY
    dealer.read(1)
    drain_writes(dealer)
    assert bytes(second.outbound) == OUR_OPENING + encode_message(msg)
    assert not dealer._queue
