"""``MalamuteReceiver`` (``spark_mq.clients.malamute``) and the source's use of it, over a scripted
socket: the real ZMTP dealer and Malamute protocol, the broker's bytes written by the test.

What a broker makes hard to arrange: a CONFIRM from the server among the deliveries, and a request's
answer queued behind more deliveries than the receiver holds.
"""

from __future__ import annotations

import logging

import pytest

import spark_mq.clients.malamute as M
from spark_mq import schema as S
from spark_mq.clients.malamute import DEFAULT_READ_BUFFER, MalamuteReceiver
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.malamute.client import BrokerNotice
from spark_mq.protocol.zmtp import BodyBuffer, encode_message
from spark_mq.sources.malamute import MalamuteConsumer

from .test_zmtp_driver import PEER_GREETING, PEER_READY, ScriptedDealer, ScriptedSocket


def wire(*messages) -> bytes:
    """The broker's messages as they come off the socket."""
    return b"".join(encode_message(codec.encode(m)) for m in messages)


@pytest.fixture
def sock(monkeypatch) -> ScriptedSocket:
    """The socket the next receiver gets, its handshake and the OK to its CONNECTION-OPEN waiting."""
    scripted = ScriptedSocket()
    scripted.inbound += PEER_GREETING + PEER_READY + wire(codec.Ok())
    monkeypatch.setattr(M, "ZmtpDealer", lambda endpoint, buffer_size: ScriptedDealer([scripted]))
    return scripted


def take_all(rx: MalamuteReceiver) -> list:
    out: list = []
    while batch := rx.poll(1000, 0.0):
        out.extend(batch)
    return out


def source_of(rx: MalamuteReceiver) -> MalamuteConsumer:
    consumer = MalamuteConsumer.__new__(MalamuteConsumer)  # the source's consumer over this receiver
    consumer.client, consumer.destination, consumer._body, consumer._give_up = rx, "rx", None, 10.0
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
    assert [bytes(body.data[c[1][0]:c[1][1]])[:1] for _, c in got] == [bytes([i]) for i in range(5)]


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
