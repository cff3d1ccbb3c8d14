"""STOMP 1.0 session state machine: transitions, books (receipts, transactions, subscriptions,
pending acks) and the broker-specific behaviour chosen from the CONNECTED frame."""

from __future__ import annotations

import pytest

from spark_mq.protocol.stomp10 import (
    ACTIVEMQ,
    RABBITMQ,
    UNKNOWN,
    Command,
    State,
    StompLocalProtocolError,
    StompRemoteProtocolError,
    StompSession,
    client_frame_parser,
    detect_broker,
)

CONNECTED_RABBIT = b"CONNECTED\nserver:RabbitMQ/3.10.8\nsession:s-1\nversion:1.0\n\n\x00\n"
CONNECTED_AMQ = b"CONNECTED\nserver:ActiveMQ/5.17.2\nsession:ID:x:1\n\n\x00\n"
CONNECTED_OTHER = b"CONNECTED\nsession:plain\n\n\x00"


def connected(wire: bytes = CONNECTED_OTHER) -> StompSession:
    s = StompSession()
    s.connect("guest", "guest")
    assert s.state is State.CONNECTING
    s.receive_data(wire)
    assert s.state is State.CONNECTED
    return s


def frames_of(data: bytes) -> list:
    return client_frame_parser().feed(data)


def message(sub: str, mid: str, dest: str = "/queue/a") -> bytes:
    return f"MESSAGE\nsubscription:{sub}\ndestination:{dest}\nmessage-id:{mid}\n\n".encode() + b"x\x00\n"


def test_detect_broker():
    assert connected(CONNECTED_RABBIT).broker is RABBITMQ
    assert connected(CONNECTED_AMQ).broker is ACTIVEMQ
    assert connected(CONNECTED_OTHER).broker is UNKNOWN
    assert detect_broker({}) is UNKNOWN


def test_session_books_from_connected():
    s = connected(CONNECTED_RABBIT)
    assert s.session_id == "s-1" and s.server == "RabbitMQ/3.10.8"


def test_nothing_but_connect_before_connected():
    s = StompSession()
    with pytest.raises(StompLocalProtocolError, match="state idle"):
        s.send("/queue/a", b"x")
    s.connect()
    with pytest.raises(StompLocalProtocolError, match="state connecting"):
        s.subscribe("/queue/a")
    with pytest.raises(StompLocalProtocolError):
        s.connect()


def test_server_frame_out_of_state_is_remote_error():
    s = StompSession()
    s.connect()
    with pytest.raises(StompRemoteProtocolError, match="unexpected MESSAGE"):
        s.receive_data(message("s", "1"))
    s2 = connected()
    with pytest.raises(StompRemoteProtocolError, match="unexpected CONNECTED"):
        s2.receive_data(CONNECTED_OTHER)


def test_error_while_connecting_keeps_state_then_eof_closes():
    s = StompSession()
    s.connect("bad", "creds")
    (frame,) = s.receive_data(b"ERROR\nmessage:Bad CONNECT\n\nAccess refused\x00")
    assert frame.to_error().message == "Bad CONNECT"
    assert s.state is State.CONNECTING
    s.receive_eof()
    assert s.state is State.CLOSED


def test_receipts_tracked_and_unasked_receipt_rejected():
    s = connected()
    s.send("/queue/a", b"x", receipt="r1")
    assert s.receipts == {"r1"}
    with pytest.raises(StompLocalProtocolError, match="already outstanding"):
        s.send("/queue/a", b"x", receipt="r1")
    s.receive_data(b"RECEIPT\nreceipt-id:r1\n\n\x00")
    assert s.receipts == set()
    with pytest.raises(StompRemoteProtocolError, match="not asked for"):
        s.receive_data(b"RECEIPT\nreceipt-id:r9\n\n\x00")


def test_error_with_receipt_id_settles_the_receipt():
    s = connected()
    s.subscribe("/queue/a", receipt="r2")
    s.receive_data(b"ERROR\nreceipt-id:r2\nmessage:nope\n\n\x00")
    assert s.receipts == set()


def test_send_frames():
    s = connected()
    (f,) = frames_of(s.send("/queue/a", b"\x00bin\x00"))
    assert f.headers == {"destination": "/queue/a", "content-length": "5"} and f.body == b"\x00bin\x00"
    (f,) = frames_of(s.send("/queue/a", "text"))
    assert "content-length" not in f.headers and f.body == b"text"
    (f,) = frames_of(s.send("/queue/a", "nul\x00inside"))
    assert f.headers["content-length"] == "10" and f.body == b"nul\x00inside"
    (f,) = frames_of(s.send("/queue/a", b"b", headers={"x-k": "a:b", "content-type": "application/octet-stream"}))
    assert f.headers["x-k"] == "a:b" and f.headers["content-length"] == "1"


def test_send_many_is_one_buffer_of_frames():
    s = connected()
    bodies = [b"a", b"\x00\x00", b"", b"x" * 1000]
    frames = frames_of(s.send_many("/queue/m", bodies))
    assert [f.body for f in frames] == bodies
    assert all(f.headers["destination"] == "/queue/m" for f in frames)


def test_transactions():
    s = connected()
    tx, data = s.begin()
    assert frames_of(data)[0].headers == {"transaction": tx}
    with pytest.raises(StompLocalProtocolError, match="already open"):
        s.begin(tx)
    (f,) = frames_of(s.send("/queue/a", b"x", transaction=tx))
    assert f.headers["transaction"] == tx
    (f,) = frames_of(s.send_many("/queue/a", [b"y"], transaction=tx))
    assert f.headers["transaction"] == tx
    s.commit(tx)
    assert s.transactions == set()
    for op in (lambda: s.commit(tx), lambda: s.abort(tx), lambda: s.send("/queue/a", b"x", transaction=tx)):
        with pytest.raises(StompLocalProtocolError, match="not open") as info:
            op()
        assert info.value.header == "transaction"


def test_subscribe_prefetch_header_per_broker():
    for wire, expected in (
        (CONNECTED_RABBIT, {"prefetch-count"}),
        (CONNECTED_AMQ, {"activemq.prefetchSize"}),
        (CONNECTED_OTHER, {"prefetch-count", "activemq.prefetchSize"}),
    ):
        s = connected(wire)
        sub_id, data = s.subscribe("/queue/a", ack="client", prefetch=7, selector="x = 1")
        (f,) = frames_of(data)
        assert f.headers["id"] == sub_id and f.headers["ack"] == "client" and f.headers["selector"] == "x = 1"
        assert {k for k, v in f.headers.items() if v == "7"} == expected


def test_unsubscribe_by_id_and_destination():
    s = connected()
    a, _ = s.subscribe("/queue/a")
    b, _ = s.subscribe("/queue/a", id="mine")
    c, _ = s.subscribe("/queue/c")
    (f,) = frames_of(s.unsubscribe(id=c))
    assert f.headers["id"] == c
    frames = frames_of(s.unsubscribe(destination="/queue/a", receipt="u"))
    assert [f.headers["id"] for f in frames] == [a, b]
    assert "receipt" in frames[-1].headers and "receipt" not in frames[0].headers
    assert s.subscriptions == {}
    with pytest.raises(StompLocalProtocolError):
        s.unsubscribe(id=a)
    with pytest.raises(StompLocalProtocolError):
        s.unsubscribe(destination="/queue/zzz")


def _acks(data: bytes) -> list:
    return [f.headers["message-id"] for f in frames_of(data)]


def test_ack_is_one_frame_on_cumulative_brokers():
    s = connected(CONNECTED_RABBIT)
    sub, _ = s.subscribe("/queue/a", ack="client")
    s.receive_data(b"".join(message(sub, f"m{i}") for i in range(5)))
    assert _acks(s.ack("m2", subscription=sub)) == ["m2"]
    assert s.subscriptions[sub].pending == ["m3", "m4"]
    with pytest.raises(StompLocalProtocolError, match="not awaiting"):
        s.ack("m1", subscription=sub)


def test_ack_is_per_message_in_order_on_unknown_brokers():
    s = connected(CONNECTED_OTHER)
    sub, _ = s.subscribe("/queue/a", ack="client")
    s.receive_data(b"".join(message(sub, f"m{i}") for i in range(5)))
    frames = frames_of(s.ack("m3", receipt="last"))  # subscription found from the message id
    assert [f.headers["message-id"] for f in frames] == ["m0", "m1", "m2", "m3"]
    assert [("receipt" in f.headers) for f in frames] == [False, False, False, True]
    assert s.subscriptions[sub].pending == ["m4"]


def test_ack_in_transaction_and_on_auto_subscription():
    s = connected(CONNECTED_AMQ)
    sub, _ = s.subscribe("/queue/a", ack="client")
    auto, _ = s.subscribe("/queue/b")
    s.receive_data(message(sub, "m0") + message(auto, "n0", "/queue/b"))
    assert s.subscriptions[auto].pending == []
    tx, _ = s.begin()
    (f,) = frames_of(s.ack("m0", subscription=sub, transaction=tx))
    assert f.headers == {"message-id": "m0", "transaction": tx}
    with pytest.raises(StompLocalProtocolError, match="ack:auto"):
        s.ack("n0", subscription=auto)


def test_message_without_subscription_header_matched_by_destination():
    s = connected()
    sub, _ = s.subscribe("/queue/d", ack="client")
    s.receive_data(b"MESSAGE\ndestination:/queue/d\nmessage-id:q1\n\nx\x00")
    assert s.subscriptions[sub].pending == ["q1"]


def test_rabbitmq_header_escaping_both_ways():
    s = connected(CONNECTED_RABBIT)
    (f,) = client_frame_parser().feed(s.send("/queue/a\\b", b"x", headers={"k": "a\\b:c"}))
    assert f.headers["destination"] == "/queue/a\\\\b" and f.headers["k"] == "a\\\\b:c"
    fast = client_frame_parser().feed(s.send("/queue/a\\b", b"x"))[0]
    assert fast.headers["destination"] == "/queue/a\\\\b"
    sub, _ = s.subscribe("/queue/e")
    (m,) = s.receive_data(f"MESSAGE\nsubscription:{sub}\ndestination:/queue/e\nmessage-id:1\nk:v\\cw\\\\x\n\n\x00".encode())
    assert m.headers["k"] == "v:w\\x"


def test_activemq_escapes_sent_not_received():
    s = connected(CONNECTED_AMQ)
    (f,) = client_frame_parser().feed(s.send("/queue/a", b"x", headers={"k": "a\\b"}))
    assert f.headers["k"] == "a\\\\b"
    sub, _ = s.subscribe("/queue/e")
    (m,) = s.receive_data(f"MESSAGE\nsubscription:{sub}\ndestination:/queue/e\nmessage-id:1\nk:v\\cw\n\n\x00".encode())
    assert m.headers["k"] == "v\\cw"


def test_disconnect_then_frames_in_flight_then_eof():
    s = connected()
    sub, _ = s.subscribe("/queue/a")
    s.disconnect(receipt="bye")
    assert s.state is State.DISCONNECTING
    with pytest.raises(StompLocalProtocolError):
        s.send("/queue/a", b"late")
    frames = s.receive_data(message(sub, "1") + b"RECEIPT\nreceipt-id:bye\n\n\x00")
    assert [f.command for f in frames] == [Command.MESSAGE, Command.RECEIPT]
    s.receive_eof()
    assert s.state is State.CLOSED


def test_salvaged_frames_after_remote_error():
    s = connected()
    s.send("/queue/a", b"x", receipt="r1")
    with pytest.raises(StompRemoteProtocolError):
        s.receive_data(b"RECEIPT\nreceipt-id:r1\n\n\x00WHAT\n\n\x00")
    assert [f.command for f in s.take_parsed()] == [Command.RECEIPT]
    assert s.receipts == set()
