"""``MalamuteReceiver`` (``spark_mq.clients.malamute``) and the source's use of it, over a scripted
socket: the real ZMTP dealer and Malamute protocol, the broker's bytes written by the test.

What a broker makes hard to arrange: a CONFIRM from the server among the deliveries, and a request's
answer queued behind more deliveries than the receiver holds.
"""

from __future__ import annotations

import logging
import random

import pyarrow as pa
import pytest

import spark_mq.clients.malamute_receiver as R
from spark_mq import schema as S
from spark_mq.clients.malamute import DEFAULT_READ_BUFFER, MalamuteReceiver
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.malamute.client import BrokerNotice, ServerBack, State
from spark_mq.protocol.zmtp import BodyBuffer, encode_command, encode_message
from spark_mq.sources.formats.malamute import MalamuteConsumer

from .test_zmtp_driver import PEER_GREETING, PEER_READY, ScriptedDealer, ScriptedSocket


def wire(*messages) -> bytes:
    """The broker's messages as they come off the socket."""
    return b"".join(encode_message(codec.encode(m)) for m in messages)


@pytest.fixture
def sock(monkeypatch) -> ScriptedSocket:
    """The socket the next receiver gets, its handshake and the OK to its CONNECTION-OPEN waiting."""
    scripted = ScriptedSocket()
    scripted.inbound += PEER_GREETING + PEER_READY + wire(codec.Ok())
    monkeypatch.setattr(R, "ZmtpDealer", lambda endpoint, buffer_size: ScriptedDealer([scripted]))
    return scripted


def take_all(rx: MalamuteReceiver) -> list:
    out: list = []
    while batch := rx.poll(1000, 0.0):
        out.extend(batch)
    return out


def source_of(rx: MalamuteReceiver) -> MalamuteConsumer:
    consumer = MalamuteConsumer.__new__(MalamuteConsumer)  # the source's consumer over this receiver
    consumer.client, consumer.destination, consumer._bodies, consumer._give_up = rx, "rx", [], 10.0
    return consumer


@pytest.mark.parametrize("lane", ["rows", "columns"])
def test_a_confirm_from_the_broker_is_not_a_delivery(sock, lane):
    """A server CONFIRM among the deliveries (the grammar allows one; the reference broker never
    sends it) goes to ``on_event``, not into the group: the group's batch is exactly the
    deliveries, by either path of the source (before: the columns path failed with a KeyError on
    the CONFIRM's missing ``sender``, the rows path with an AttributeError on its ``content``)."""
    events: list = []
    rx = MalamuteReceiver("tcp://127.0.0.1:1", "rx", on_event=events.append)
    deliveries = [codec.MailboxDeliver(f"s{i % 2}", "rx", f"subj{i}", f"t{i}", [b"m%d" % i]) for i in range(4)]
    confirm = codec.Confirm("t1", codec.StatusCode.SUCCESS, "")
    sock.inbound += wire(*deliveries[:2], confirm, *deliveries[2:])
    consumer = source_of(rx)
    if lane == "rows":
        msgs = consumer.poll(10, 0.0)
        assert msgs == deliveries
        got = S.build_batch("malamute", [consumer.row(m, 100 + i, 0) for i, m in enumerate(msgs)])
    else:
        count, got = consumer.poll_batch(10, 0.0, 100)
        assert count == 4
    want = S.build_batch("malamute", [consumer.row(d, 100 + i, 0) for i, d in enumerate(deliveries)])
    assert got.drop_columns(["timestamp"]).equals(want.drop_columns(["timestamp"]))
    assert events == [confirm]
    assert rx.poll(10, 0.0) == []


def test_a_registration_answered_behind_a_backlog_holds_at_most_the_read_buffer(sock):
    """STREAM-READ's OK queued behind 3 MB of mail: ``set_consumer`` holds the mail it reads for
    ``poll`` only up to the read buffer (1 MiB), then returns and reads no more (before: it held all
    3,000). ``poll`` reads through to the OK (matched, nothing pending) and returns every delivery
    once, in order, then the stream's."""
    rx = MalamuteReceiver("tcp://127.0.0.1:1", "rx")
    backlog = [codec.MailboxDeliver("s", "rx", "", "", [bytes([i % 256]) * 1000]) for i in range(3000)]
    after = codec.StreamDeliver("weather", "p", "temp", [b"21.5"])
    sock.inbound += wire(*backlog, codec.Ok(), after)
    rx.set_consumer("weather")
    assert 0 < rx.buffered and rx.buffered * 1000 <= DEFAULT_READ_BUFFER
    assert sock.inbound  # the rest waits in the socket
    assert take_all(rx) == backlog + [after]
    assert rx._proto.pending == 0 and rx.buffered == 0


def test_deliveries_held_from_a_request_stop_at_the_byte_bound_too(sock):
    """Deliveries read while waiting for a reply (held) count toward ``max_bytes`` like those read
    in the poll: a backlog at start-up cannot make one group larger than the bound (found in review:
    only the count bounded them)."""
    rx = MalamuteReceiver("tcp://127.0.0.1:1", "rx")
    sock.inbound += wire(*(codec.MailboxDeliver("s", "rx", "", "", [bytes([i]) * 1000]) for i in range(100)),
                         codec.Ok())
    rx.set_consumer("weather")
    assert rx.buffered == 100
    body = BodyBuffer()
    got = rx.poll(100, 0.0, 0.001, body, max_bytes=4096)
    assert len(got) == 5 and body.fill == 5000  # stops once past the bound, as a read does
    assert rx.buffered == 95  # the rest waits for the next group
    assert [bytes(body.data[e - 1000:e - 999]) for e in got.ends] == [bytes([i]) for i in range(5)]


def test_a_registration_refused_after_the_receiver_stopped_waiting_is_logged_and_notified(sock, caplog):
    """The answer left for ``poll`` is an ERROR: logged as a warning and handed to ``on_event``."""
    events: list = []
    rx = MalamuteReceiver("tcp://127.0.0.1:1", "rx", read_buffer=1, on_event=events.append)
    mail = codec.MailboxDeliver("s", "rx", "", "", [b"x"])
    sock.inbound += wire(mail, codec.Error(codec.StatusCode.COMMAND_INVALID, "no"))
    rx.set_worker("jobs")
    with caplog.at_level(logging.WARNING, "spark_mq.clients.malamute"):
        assert take_all(rx) == [mail]
    assert "SERVICE-OFFER" in caplog.text and "500 no" in caplog.text
    assert [type(e) for e in events] == [BrokerNotice]


def test_a_ping_answered_behind_a_backlog_fails_at_the_bound_and_loses_nothing(sock):
    """A PONG behind 3 MB of mail: ``ping`` stops at the read buffer and raises at once (before: it
    held all 3,000); what it read waits for ``poll``, in order, and the late PONG is dropped: the
    next ping gets its own."""
    rx = MalamuteReceiver("tcp://127.0.0.1:1", "rx")
    backlog = [codec.MailboxDeliver("s", "rx", "", "", [bytes([i % 256]) * 1000]) for i in range(3000)]
    sock.inbound += wire(*backlog, codec.ConnectionPong())
    with pytest.raises(TimeoutError, match="CONNECTION-PING"):
        rx.ping(timeout=60)
    assert 0 < rx.buffered and rx.buffered * 1000 <= DEFAULT_READ_BUFFER
    assert take_all(rx) == backlog
    sock.inbound += wire(codec.ConnectionPong())
    rx.ping(timeout=60)
    assert rx._proto.pending == 0


def trickle(sock: ScriptedSocket, sizes) -> None:
    """``sock`` serves at most the next of ``sizes`` bytes per read (a stream cut anywhere)."""
    serve = sock.recv_into
    sizes = iter(sizes)
    sock.recv_into = lambda view: serve(view[:next(sizes)])


MIXED = [codec.MailboxDeliver("a", "rx", "s", "", [b"a%d" % i]) for i in range(3)] + \
    [codec.MailboxDeliver("b", "rx", "s", "t%d" % i, [b"b" * (i * 500)]) for i in range(3)] + \
    [codec.MailboxDeliver("a", "rx", "s", "", [b"one", b"two"]), codec.MailboxDeliver("a", "rx", "s", "", []),
     codec.StreamDeliver("weather", "p", "temp", [b"x" * 70_000])] + \
    [codec.MailboxDeliver("a", "rx", "s", "", [b"a%d" % i]) for i in range(3, 300)]


@pytest.mark.parametrize("cut", ["whole", "random"])
def test_the_columns_lane_takes_any_mix_of_messages_in_order(sock, cut, caplog):
    """Deliveries under changing headers, with several content frames or none, a large one, and
    among them a malformed two-frame message, a CONFIRM and a ZMTP PING: the columns lane's batch
    equals the rows of the deliveries, in order; the malformed message is logged and dropped, the
    CONFIRM goes to ``on_event`` and the PING is answered."""
    events: list = []
    rx = MalamuteReceiver("tcp://127.0.0.1:1", "rx", on_event=events.append)
    bad = encode_message([b"\xaa\xa8" + bytes((codec.MessageId.MAILBOX_DELIVER,)) + b"\x05ab", b"content"])
    ping = encode_command(b"PING", b"\x00\x0actx")
    confirm = codec.Confirm("t1", codec.StatusCode.SUCCESS, "")
    sock.inbound += wire(*MIXED[:4]) + bad + wire(*MIXED[4:7]) + ping + wire(confirm, *MIXED[7:])
    if cut == "random":
        rng = random.Random(7)
        trickle(sock, iter(lambda: rng.randint(1, 3000), None))
    consumer = source_of(rx)
    offset, batches = 0, []
    with caplog.at_level(logging.WARNING, "spark_mq.clients.malamute"):
        while (got := consumer.poll_batch(1000, 0.0, offset))[0]:
            offset += got[0]
            batches.append(got[1])
    assert offset == len(MIXED)
    got = pa.Table.from_batches(batches).drop_columns(["timestamp"])
    want = S.build_batch("malamute", [consumer.row(d, i, 0) for i, d in enumerate(MIXED)]).drop_columns(["timestamp"])
    assert got.equals(pa.Table.from_batches([want]))
    assert "dropping malformed message" in caplog.text
    assert events == [confirm]
    assert b"PONG" in bytes(sock.outbound) + rx._wire._control  # sent, or waiting for the socket to take it


def test_deliveries_after_a_lost_server_go_through_the_protocol_by_columns_too(sock):
    """The server declared lost (silent past its timeout): the deliveries that end the silence go
    through ``receive`` (which says the server is back), not straight into the columns; the batch
    is the same."""
    events: list = []
    rx = MalamuteReceiver("tcp://127.0.0.1:1", "rx", on_event=events.append)
    rx.poll(10, 0.0)  # the OPEN's answer
    rx._proto.state = State.LOST
    deliveries = [codec.MailboxDeliver("s", "rx", "", "", [b"m%d" % i]) for i in range(5)]
    sock.inbound += wire(*deliveries)
    consumer = source_of(rx)
    count, got = consumer.poll_batch(10, 0.0, 0)
    assert count == 5 and rx._proto.state is State.CONNECTED
    want = S.build_batch("malamute", [consumer.row(d, i, 0) for i, d in enumerate(deliveries)])
    assert got.drop_columns(["timestamp"]).equals(want.drop_columns(["timestamp"]))
    assert [type(e) for e in events] == [ServerBack]


@pytest.mark.parametrize("lane", ["rows", "columns"])
def test_spark_planning_ends_the_group_being_gathered(sock, lane):
    """A poll asks ``stop`` (the source passes ``Consumer.cut``: Spark is planning a batch) once it has
    taken something, between reads, and ends the group when it says so: the deliveries after stay
    for the next group. Without it the group takes all that comes within the gap."""
    rx = MalamuteReceiver("tcp://127.0.0.1:1", "rx")
    rx.poll(10, 0.0)  # the OPEN's answer
    rx._wait = lambda seconds: True  # the scripted socket has no poller; the bytes are all there
    deliveries = [codec.MailboxDeliver("s", "rx", "", "", [b"m%03d" % i]) for i in range(40)]
    sock.inbound += wire(*deliveries)
    serve, size, reads = sock.recv_into, len(wire(deliveries[0])), [0]

    def one_per_read(view):  # one delivery, then EAGAIN twice: each of the receiver's reads takes one
        reads[0] += 1
        if reads[0] % 3 != 1:
            raise BlockingIOError
        return serve(view[:size])
    sock.recv_into = one_per_read
    asked: list = []
    consumer = source_of(rx)
    consumer.cut = lambda: asked.append(1) or len(asked) >= 3

    def group():
        if lane == "rows":
            return [d.content[0] for d in consumer.poll(1000, 5.0)]
        count, batch = consumer.poll_batch(1000, 5.0, 0)
        return batch.column("body").to_pylist() if count else []
    first = group()
    assert len(first) == len(asked) == 3  # asked after each read, and ended at the third
    consumer.cut = None
    rest = group()
    assert first + rest == [b"m%03d" % i for i in range(40)]
