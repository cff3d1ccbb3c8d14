"""Sans-IO Malamute client: replies by id, heartbeats, server lost, recovery replay, local refusals."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_mq.errors import LocalProtocolError, RemoteProtocolError
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.malamute.client import (
    BrokerNotice, ClientConnection, Recovered, Recovering, Reply, ServerBack, ServerLost, State,
)
from spark_mq.protocol.malamute.codec import MessageId

OK = codec.encode(codec.Ok())
STALE_OK = codec.encode(codec.Ok(300, "stale reason from an earlier reply"))
ERR500 = codec.encode(codec.Error(500, "command invalid"))
PONG = codec.encode(codec.ConnectionPong())


def sent(conn) -> list:
    return [codec.decode(f) for f in conn.data_to_send()]


def opened(address="me", now=0.0) -> ClientConnection:
    conn = ClientConnection()
    token = conn.open(address, now, timeout=5)
    assert sent(conn) == [codec.ConnectionOpen(address)]
    assert conn.receive(OK, now) == [Reply(token, MessageId.CONNECTION_OPEN, True, 200, "")]
    assert conn.state is State.CONNECTED
    return conn


def test_open_timeout_fails_the_open():
    conn = ClientConnection()
    token = conn.open("me", 0.0, timeout=2)
    assert conn.tick(1.9) == []
    events = conn.tick(2.0)
    assert events[0].token == token and not events[0].ok
    assert conn.state is State.CLOSED


def test_ok_with_stale_code_is_success_judged_by_id():
    conn = opened()
    token = conn.set_consumer("s", "^a")
    assert sent(conn) == [codec.StreamRead("s", "^a")]
    (reply,) = conn.receive(STALE_OK, 1.0)
    assert reply.ok and reply.token == token and reply.code == 300


def test_replies_are_fifo_and_error_goes_to_its_request():
    conn = opened()
    t1 = conn.set_producer("s")
    t2 = conn.set_worker("svc")
    events = conn.receive(OK, 1) + conn.receive(codec.encode(codec.Error(300, "nope")), 1)
    assert [(e.token, e.ok) for e in events] == [(t1, True), (t2, False)]


def test_fire_and_forget_sends_have_no_pending_reply():
    conn = opened()
    frames = conn.stream_send("subj", [b"a", b"b"])
    assert codec.decode(frames) == codec.StreamSend("subj", [b"a", b"b"])
    codec.decode(conn.mailbox_send("bob", "s", [b"x"], "t", 10))
    codec.decode(conn.service_send("svc", "s", [], "", 0))
    codec.decode(conn.credit(5))
    assert conn.pending == 0 and conn.data_to_send() == []


def test_local_refusals():
    conn = opened()
    with pytest.raises(LocalProtocolError):
        conn.set_consumer("s", "a**")  # hangs the real broker
    with pytest.raises(LocalProtocolError):
        conn.set_worker("svc", "*")
    with pytest.raises(LocalProtocolError):
        conn.stream_send("a\x00b")  # the real broker truncates at NUL
    with pytest.raises(LocalProtocolError):
        conn.mailbox_send("x" * 256, "s")
    with pytest.raises(LocalProtocolError, match="CONFIRM"):
        conn.confirm("t")
    assert ClientConnection(confirm_supported=True).confirm("t")[0] == bytes.fromhex("aaa8 11 01 74 00c8 00")
    with pytest.raises(LocalProtocolError):
        ClientConnection().set_producer("s")  # not open


def test_heartbeat_pings_each_second_and_pongs_are_consumed():
    conn = opened(now=0.0)
    assert conn.tick(0.5) == [] and sent(conn) == []
    conn.tick(1.0)
    assert sent(conn) == [codec.ConnectionPing()]
    assert conn.receive(PONG, 1.1) == []
    assert conn.pending == 0


def test_server_lost_after_silence_then_back():
    conn = opened(now=0.0)
    token = conn.set_producer("s")
    conn.data_to_send()
    events = conn.tick(4.5)
    assert Reply(token, MessageId.STREAM_WRITE, False, 0, "server lost: no answer within the server timeout") in events
    assert ServerLost() in events and conn.state is State.LOST
    assert sent(conn) == [codec.ConnectionPing()]  # keeps pinging while lost
    assert conn.receive(PONG, 5.0) == [ServerBack()]
    assert conn.state is State.CONNECTED


def test_unread_data_from_the_server_is_not_silence():
    """``heard``: the transport holds unread messages (the application is behind); no ServerLost."""
    conn = opened(now=0.0)
    for t in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
        conn.heard(t)
        assert ServerLost() not in conn.tick(t)
    assert conn.state is State.CONNECTED
    assert ServerLost() in conn.tick(10.5)  # really silent since 6.0


def test_error_to_ping_triggers_reopen_and_replay():
    conn = opened("me", 0.0)
    for token_call in (lambda: conn.set_producer("out"), lambda: conn.set_consumer("in", "^a"),
                       lambda: conn.set_consumer("in2"), lambda: conn.set_worker("svc", "x")):
        token_call()
        conn.receive(OK, 0.1)
    conn.remove_consumer("in2")
    conn.receive(OK, 0.2)
    conn.data_to_send()
    conn.tick(1.0)  # PING
    assert sent(conn) == [codec.ConnectionPing()]
    events = conn.receive(ERR500, 1.1)
    assert events == [Recovering(500, "command invalid")]
    assert sent(conn) == [codec.ConnectionOpen("me"), codec.StreamWrite("out"), codec.StreamRead("in", "^a"),
                          codec.ServiceOffer("svc", "x")]
    assert conn.state is State.RECOVERING
    # stale ERRORs for messages that reached the new broker before the OPEN are ignored
    assert conn.receive(ERR500, 1.2) == []
    assert conn.receive(OK, 1.3) == []  # OPEN
    # a delivery between replay answers passes through
    deliver = codec.encode(codec.MailboxDeliver("x", "me", "s", "", [b"m"]))
    assert conn.receive(deliver, 1.35) == [codec.decode(deliver)]
    assert conn.receive(OK, 1.4) == [] and conn.receive(OK, 1.5) == []
    assert conn.receive(OK, 1.6) == [Recovered()]
    assert conn.state is State.CONNECTED and conn.recoveries == 1


def test_unsolicited_error_triggers_recovery_and_carried_requests_complete():
    conn = opened("me", 0.0)
    events = conn.receive(ERR500, 0.5)  # e.g. a STREAM-SEND reached a restarted broker
    assert isinstance(events[0], Recovering)
    assert sent(conn) == [codec.ConnectionOpen("me")]
    token = conn.set_producer("out")  # the user carries on during recovery: queued after the OPEN
    assert conn.receive(OK, 0.6) == [Recovered()]  # OPEN answered, nothing to replay
    assert conn.receive(OK, 0.7) == [Reply(token, MessageId.STREAM_WRITE, True, 200, "")]


def test_request_in_flight_when_broker_restarts_completes_by_replay():
    conn = opened("me", 0.0)
    conn.tick(1.0)
    token = conn.set_consumer("in")
    conn.data_to_send()
    conn.receive(ERR500, 1.1)  # answers the PING
    replay = sent(conn)
    assert replay == [codec.ConnectionOpen("me"), codec.StreamRead("in", "")]
    conn.receive(ERR500, 1.2)  # stale answer to the STREAM-READ sent before recovery
    conn.receive(OK, 1.3)
    events = conn.receive(OK, 1.4)
    assert events[0].token == token and events[0].ok and events[-1] == Recovered()


def test_unsolicited_error_while_opening_closes():
    conn = ClientConnection()
    token = conn.open("me", 0, 5)
    (reply,) = conn.receive(ERR500, 0.1)
    assert reply.token == token and not reply.ok and conn.state is State.CLOSED


def test_close():
    conn = opened()
    token = conn.close()
    assert sent(conn) == [codec.ConnectionClose()]
    assert conn.receive(OK, 1) == [Reply(token, MessageId.CONNECTION_CLOSE, True, 200, "")]
    assert conn.state is State.CLOSED


def test_error_with_nothing_pending_while_closing_is_a_notice():
    conn = opened()
    conn.close()
    conn.receive(OK, 1)
    assert conn.receive(ERR500, 2) == [BrokerNotice(500, "command invalid")]


def test_client_refuses_client_only_messages_from_server():
    conn = opened()
    with pytest.raises(RemoteProtocolError):
        conn.receive(codec.encode(codec.StreamSend("x")), 1)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=20), min_size=1, max_size=3), max_size=6))
def test_fuzz_receive_raises_only_remote_protocol_error(messages):
    conn = opened()
    conn.set_consumer("s")
    for frames in messages:
        try:
            conn.receive(frames, 1.0)
        except RemoteProtocolError:
            pass


def test_flush_barrier_answered_by_error_fails():
    """Issue 43, item 1: sends to a broker that forgot us are each answered with ERROR and dropped; the
    application's PING after them must fail, not complete when the recovery does."""
    conn = opened("me", 0.0)
    token = conn.ping()
    conn.data_to_send()
    events = conn.receive(ERR500, 0.5)  # the first ERROR (for a dropped send) is taken as the PING's answer
    assert events[0] == Reply(token, MessageId.CONNECTION_PING, False, 0, events[0].reason)
    assert "may have been dropped" in events[0].reason and isinstance(events[1], Recovering)
    assert conn.recoveries == 1


def test_flush_barrier_carried_across_a_recovery_fails_while_registrations_complete():
    conn = opened("me", 0.0)
    conn.tick(1.0)  # heartbeat PING in flight
    reg = conn.set_consumer("in")
    barrier = conn.ping()
    conn.data_to_send()
    conn.receive(ERR500, 1.1)  # answers the heartbeat: recovery, the two requests are carried
    conn.receive(OK, 1.3)      # OPEN
    events = conn.receive(OK, 1.4)  # replayed STREAM-READ
    replies = {e.token: e for e in events if isinstance(e, Reply)}
    assert replies[reg].ok and not replies[barrier].ok and events[-1] == Recovered()
