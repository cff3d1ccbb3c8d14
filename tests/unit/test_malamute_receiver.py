"""``MalamuteReceiver`` (``spark_mq.clients.malamute``) and the source's use of it, over a scripted
socket: the real ZMTP dealer and Malamute protocol, the broker's bytes written by the test.

What a broker makes hard to arrange: a CONFIRM from the server among the deliveries.
"""

from __future__ import annotations

import pytest

import spark_mq.clients.malamute as M
from spark_mq import schema as S
from spark_mq.clients.malamute import MalamuteReceiver
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.zmtp import encode_message
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

