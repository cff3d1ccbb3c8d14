"""The sans-IO connection: handshake, negotiation, channels, content, closes, heartbeats, violations."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_mq.errors import LocalProtocolError, RemoteProtocolError
from spark_mq.protocol.amqp08 import spec
from spark_mq.protocol.amqp08.codec import decode_table
from spark_mq.protocol.amqp08.connection import (
    Alert,
    ChannelClosed,
    ChannelOpened,
    ChanState,
    Connection,
    ConnectionClosed,
    ConnectionOpened,
    ConnectionRedirected,
    ConnState,
    ContentReceived,
    FlowChanged,
    HeartbeatTimeout,
    MethodReceived,
)
from spark_mq.protocol.amqp08.errors import AMQPChannelError, AuthenticationError

from .helpers import START, TUNE, open_channel, open_connection, sent_methods, server_content, server_frame


def test_handshake_plain():
    conn = Connection("user", "secret", "/vh")
    assert conn.initiate() == b"AMQP\x01\x01\x08\x00"
    assert conn.receive_data(server_frame(0, START)) == []
    (ftype, ch, start_ok), = sent_methods(conn)
    assert isinstance(start_ok, spec.ConnectionStartOk)
    assert start_ok.mechanism == "PLAIN" and start_ok.response == b"\x00user\x00secret"
    assert start_ok.client_properties["capabilities"] == {"authentication_failure_close": True}
    assert conn.receive_data(server_frame(0, TUNE)) == []
    (_, _, tune_ok), (_, _, open_) = sent_methods(conn)
    assert (tune_ok.channel_max, tune_ok.frame_max, tune_ok.heartbeat) == (16, 4096, 10)
    assert open_.virtual_host == "/vh"
    (ev,) = conn.receive_data(server_frame(0, spec.ConnectionOpenOk(known_hosts="h1")))
    assert isinstance(ev, ConnectionOpened) and ev.known_hosts == "h1" and conn.state is ConnState.OPEN
    assert "secret" not in repr(conn)


def test_handshake_amqplain():
    conn = Connection("u", "p", mechanism="AMQPLAIN")
    conn.initiate()
    conn.receive_data(server_frame(0, START))
    (_, _, start_ok), = sent_methods(conn)
    assert start_ok.mechanism == "AMQPLAIN"
    # AMQPLAIN: a field table without its length prefix
    table, _ = decode_table(len(start_ok.response).to_bytes(4, "big") + start_ok.response, 0)
    assert table == {"LOGIN": "u", "PASSWORD": "p"}


def test_secure_challenge_is_answered():
    conn = Connection("u", "p", secure_handler=lambda challenge: b"answer:" + challenge)
    conn.initiate()
    conn.receive_data(server_frame(0, START))
    conn.data_to_send()
    conn.receive_data(server_frame(0, spec.ConnectionSecure(challenge=b"nonce")))
    (_, _, secure_ok), = sent_methods(conn)
    assert isinstance(secure_ok, spec.ConnectionSecureOk) and secure_ok.response == b"answer:nonce"


@pytest.mark.parametrize("ours,theirs,expected", [
    ((0, 131072, 60), (2047, 131072, 60), (2047, 131072, 60)),
    ((10, 8192, 5), (2047, 131072, 60), (10, 8192, 5)),
    ((0, 0, None), (0, 65536, 30), (0, 65536, 30)),
    ((0, 131072, 0), (0, 131072, 60), (0, 131072, 0)),
])
def test_tune_negotiation(ours, theirs, expected):
    conn = Connection(channel_max=ours[0], frame_max=ours[1], heartbeat=ours[2])
    conn.initiate()
    conn.receive_data(server_frame(0, START))
    conn.receive_data(server_frame(0, spec.ConnectionTune(channel_max=theirs[0], frame_max=theirs[1],
                                                          heartbeat=theirs[2])))
    assert (conn.channel_max, conn.frame_max, conn.heartbeat) == expected


def test_redirect():
    conn = Connection()
    conn.initiate()
    conn.receive_data(server_frame(0, START))
    conn.receive_data(server_frame(0, TUNE))
    (ev,) = conn.receive_data(server_frame(0, spec.ConnectionRedirect(host="other:5672", known_hosts="x")))
    assert isinstance(ev, ConnectionRedirected) and ev.host == "other:5672"


def test_auth_failure_close_during_start_ok_is_authentication_error():
    conn = Connection("u", "bad")
    conn.initiate()
    conn.receive_data(server_frame(0, START))
    conn.data_to_send()
    (ev,) = conn.receive_data(server_frame(0, spec.ConnectionClose(reply_code=403, reply_text="ACCESS_REFUSED",
                                                                     class_id=0, method_id=0)))
    assert isinstance(ev, ConnectionClosed) and isinstance(ev.error, AuthenticationError)
    (_, _, close_ok), = sent_methods(conn)
    assert isinstance(close_ok, spec.ConnectionCloseOk)


def test_wrong_version_and_missing_mechanism():
    conn = Connection()
    conn.initiate()
    with pytest.raises(RemoteProtocolError, match="names AMQP version 0-9, not the 0-8"):
        conn.receive_data(server_frame(0, spec.ConnectionStart(version_major=0, version_minor=9,
                                                               mechanisms=b"PLAIN", locales=b"en_US")))
    conn = Connection()
    conn.initiate()
    with pytest.raises(AuthenticationError, match="does not offer SASL mechanism PLAIN"):
        conn.receive_data(server_frame(0, spec.ConnectionStart(version_major=8, version_minor=0,
                                                               mechanisms=b"EXTERNAL", locales=b"en_US")))


def test_protocol_header_reply_means_version_refused():
    conn = Connection()
    conn.initiate()
    with pytest.raises(RemoteProtocolError, match="refused AMQP 0-8"):
        conn.receive_data(b"AMQP\x00\x00\x09\x01")


def test_unexpected_method_in_handshake():
    conn = Connection()
    conn.initiate()
    with pytest.raises(RemoteProtocolError, match="expected connection.start"):
        conn.receive_data(server_frame(0, TUNE))


def test_channel_open_close_and_broker_close():
    conn, _ = open_connection()
    n = conn.open_channel()
    assert conn.channel_state(n) is ChanState.OPENING
    (_, ch, m), = sent_methods(conn)
    assert ch == n and isinstance(m, spec.ChannelOpen)
    (ev,) = conn.receive_data(server_frame(n, spec.ChannelOpenOk()))
    assert isinstance(ev, ChannelOpened) and conn.channel_state(n) is ChanState.OPEN
    conn.send_method(n, spec.QueueDeclare(queue="missing", passive=True))
    conn.data_to_send()
    (ev,) = conn.receive_data(server_frame(n, spec.ChannelClose(reply_code=404, reply_text="NOT_FOUND - no queue",
                                                                  class_id=50, method_id=10)))
    assert isinstance(ev, ChannelClosed) and isinstance(ev.error, spec.NotFoundError)
    assert ev.error.reply_code == 404 and ev.error.method_name == "queue.declare" and ev.error.channel == n
    assert isinstance(ev.error, AMQPChannelError)
    (_, _, close_ok), = sent_methods(conn)
    assert isinstance(close_ok, spec.ChannelCloseOk)
    assert conn.state is ConnState.OPEN  # a channel error leaves the connection usable
    m = open_channel(conn)
    conn.close_channel(m)
    (_, _, close), = sent_methods(conn)
    assert isinstance(close, spec.ChannelClose)
    (ev,) = conn.receive_data(server_frame(m, spec.ChannelCloseOk()))
    assert isinstance(ev, ChannelClosed) and ev.error is None


def test_flow_and_alert():
    conn, _ = open_connection()
    n = open_channel(conn)
    (ev,) = conn.receive_data(server_frame(n, spec.ChannelFlow(active=False)))
    assert isinstance(ev, FlowChanged) and ev.active is False and conn.flow_active(n) is False
    (_, _, flow_ok), = sent_methods(conn)
    assert isinstance(flow_ok, spec.ChannelFlowOk) and flow_ok.active is False
    (ev,) = conn.receive_data(server_frame(n, spec.ChannelAlert(reply_code=310, reply_text="slow", details={"a": 1})))
    assert isinstance(ev, Alert) and ev.details == {"a": 1}


def test_sync_reply_matching():
    conn, _ = open_connection()
    n = open_channel(conn)
    conn.send_method(n, spec.QueueDeclare(queue="q"))
    (ev,) = conn.receive_data(server_frame(n, spec.QueueDeclareOk(queue="q", message_count=3, consumer_count=0)))
    assert isinstance(ev, MethodReceived) and ev.method.message_count == 3
    with pytest.raises(RemoteProtocolError, match="expected no reply"):
        conn.receive_data(server_frame(n, spec.QueuePurgeOk(message_count=1)))


def test_content_assembly_across_frames_and_get():
    conn, _ = open_connection()
    n = open_channel(conn)
    body = bytes(range(256)) * 50  # 12800 bytes over 4096-byte frames
    props = spec.BasicProperties(headers={"k": "v"}, delivery_mode=2)
    data = server_content(n, spec.BasicDeliver(consumer_tag="c", delivery_tag=9, exchange="", routing_key="q"),
                          props, body, frame_max=4096)
    events = []
    for i in range(0, len(data), 100):
        events += conn.receive_data(data[i:i + 100])
    (ev,) = events
    assert isinstance(ev, ContentReceived) and ev.body == body and ev.properties == props
    assert ev.method.delivery_tag == 9
    conn.send_method(n, spec.BasicGet(queue="q"))
    conn.data_to_send()
    (ev,) = conn.receive_data(server_content(n, spec.BasicGetOk(delivery_tag=10, message_count=0), props, b""))
    assert isinstance(ev, ContentReceived) and ev.body == b""
    conn.send_method(n, spec.BasicGet(queue="q"))
    (ev,) = conn.receive_data(server_frame(n, spec.BasicGetEmpty()))
    assert isinstance(ev.method, spec.BasicGetEmpty)


def test_publish_splits_by_frame_max():
    conn, _ = open_connection()
    n = open_channel(conn)
    conn.send_content(n, spec.BasicPublish(exchange="", routing_key="q"), None, b"z" * 10000)
    frames = sent_methods(conn)
    assert [f[0] for f in frames] == [1, 2, 3, 3, 3]
    assert all(len(f[2]) <= conn.frame_max - 8 for f in frames if f[0] == 3)
    assert b"".join(f[2] for f in frames if f[0] == 3) == b"z" * 10000


def test_duplicate_open_ok_is_rejected():
    # channel.open-ok twice: the second answers no request
    conn, _ = open_connection()
    open_channel(conn, 1)
    with pytest.raises(RemoteProtocolError, match="expected no reply"):
        conn.receive_data(server_frame(1, spec.ChannelOpenOk()))


def test_publish_with_its_method_frame_encoded_once_writes_the_same_bytes():
    """``send_content(..., encoded=)``: what ``publish_many`` does for a run of messages to one exchange and
    routing key (the method frame made once) is what a frame made per message would be."""
    from spark_mq.protocol.amqp08.frames import method_frame

    conn, _ = open_connection()
    n = open_channel(conn)
    method = spec.BasicPublish(exchange="ex", routing_key="rk")
    props = [spec.BasicProperties(message_id=f"m{i}", headers={"k": i}) for i in range(3)]
    for i, p in enumerate(props):
        conn.send_content(n, method, p, b"body %d" % i)
    each = conn.data_to_send()
    encoded = method_frame(n, method.encode())
    for i, p in enumerate(props):
        conn.send_content(n, method, p, b"body %d" % i, encoded)
    assert conn.data_to_send() == each


def test_content_violations():
    conn, _ = open_connection()
    n = open_channel(conn)
    with pytest.raises(RemoteProtocolError, match="content header frame on channel 1 without a content method"):
        conn.receive_data(bytes.fromhex("02 0001 0000000e") + bytes.fromhex("003c 0000 0000000000000001 0000") + b"\xce")
    conn, _ = open_connection()
    n = open_channel(conn)
    with pytest.raises(RemoteProtocolError, match="more than the 2 announced"):
        conn.receive_data(server_content(n, spec.BasicDeliver(consumer_tag="c", delivery_tag=1), spec.BasicProperties(),
                                         b"ab")[:-10] + bytes.fromhex("03 0001 00000005") + b"abcde\xce")
    conn, _ = open_connection()
    with pytest.raises(RemoteProtocolError, match="channel 5, which is not open"):
        conn.receive_data(server_frame(5, spec.BasicQosOk()))
    conn, _ = open_connection()
    with pytest.raises(RemoteProtocolError, match="which only a client may send"):
        conn.receive_data(server_frame(0, spec.ConnectionStartOk()))
    conn, _ = open_connection()
    n = open_channel(conn)
    with pytest.raises(RemoteProtocolError, match="while the content of basic.deliver is incomplete"):
        conn.receive_data(server_frame(n, spec.BasicDeliver()) + server_frame(n, spec.BasicQosOk()))


def test_local_misuse():
    conn = Connection()
    with pytest.raises(LocalProtocolError, match="not open"):
        conn.open_channel()
    conn, _ = open_connection()
    with pytest.raises(LocalProtocolError, match="channel 3 is not open"):
        conn.send_method(3, spec.TxSelect())
    n = open_channel(conn)
    with pytest.raises(LocalProtocolError, match="sent by the server"):
        conn.send_method(n, spec.BasicDeliver())
    with pytest.raises(LocalProtocolError, match="use send_content"):
        conn.send_method(n, spec.BasicPublish())
    with pytest.raises(LocalProtocolError, match="outside 1..16"):
        conn.open_channel(17)
    with pytest.raises(LocalProtocolError, match="unsupported SASL mechanism"):
        Connection(mechanism="CRAM-MD5")


def test_connection_close_both_directions():
    conn, _ = open_connection()
    conn.close()
    (_, _, close), = sent_methods(conn)
    assert isinstance(close, spec.ConnectionClose) and close.reply_code == 200
    (ev,) = conn.receive_data(server_frame(0, spec.ConnectionCloseOk()))
    assert isinstance(ev, ConnectionClosed) and ev.error is None and conn.state is ConnState.CLOSED
    conn, _ = open_connection()
    (ev,) = conn.receive_data(server_frame(0, spec.ConnectionClose(reply_code=320, reply_text="CONNECTION_FORCED",
                                                                     class_id=0, method_id=0)))
    assert isinstance(ev.error, spec.ConnectionForcedError) and ev.error.reply_code == 320
    (_, _, close_ok), = sent_methods(conn)
    assert isinstance(close_ok, spec.ConnectionCloseOk)


def test_heartbeats_with_injected_clock():
    conn, _ = open_connection()  # heartbeat negotiated to 10 s
    conn.receive_data(b"", now=100.0)
    conn.note_sent(100.0)
    conn.tick(103.0)
    assert conn.data_to_send() == b""
    conn.tick(105.0)  # silent for half an interval: send a heartbeat
    assert conn.data_to_send() == bytes.fromhex("08 0000 00000000 ce")
    conn.receive_data(bytes.fromhex("08 0000 00000000 ce"), now=110.0)
    conn.tick(125.0)
    with pytest.raises(HeartbeatTimeout, match="no frame from the broker for 20.5s"):
        conn.tick(130.5)


@settings(max_examples=1000, deadline=None)
@given(st.binary(max_size=300))
def test_fuzz_open_connection(raw):
    conn, _ = open_connection()
    open_channel(conn, 1)
    try:
        conn.receive_data(raw)
    except RemoteProtocolError:
        pass


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(spec.METHODS.values(), key=lambda c: c.INDEX)), st.binary(max_size=40))
def test_fuzz_method_frames_with_valid_ids(cls, tail):
    conn, _ = open_connection()
    open_channel(conn, 1)
    payload = cls._PREFIX + tail
    frame = bytes([1]) + (1).to_bytes(2, "big") + len(payload).to_bytes(4, "big") + payload + b"\xce"
    try:
        conn.receive_data(frame)
    except RemoteProtocolError:
        pass


def test_whole_messages_in_one_read_take_the_fast_path_and_match_the_slow_one():
    """Many complete deliveries in one read are decoded in one step each; the result must be the
    same as feeding the same bytes one at a time (the general, frame-by-frame path)."""
    bodies = [b"", b"a", bytes(range(256)) * 40, b"z" * 100]  # empty, tiny, multi-frame (4096), plain
    props = [spec.BasicProperties(), spec.BasicProperties(message_id="m", headers={"h": 1}),
             spec.BasicProperties(delivery_mode=2), spec.BasicProperties(content_type="x")]
    data = b"".join(
        server_content(1, spec.BasicDeliver(consumer_tag="c", delivery_tag=i + 1, redelivered=i % 2 == 1,
                                            exchange="ex", routing_key="rk"), p, b, frame_max=4096)
        for i, (p, b) in enumerate(zip(props, bodies)))
    fast, _ = open_connection()
    open_channel(fast, 1)
    fast_events = fast.receive_data(data)
    slow, _ = open_connection()
    open_channel(slow, 1)
    slow_events = []
    for i in range(len(data)):
        slow_events += slow.receive_data(data[i:i + 1])
    assert [(e.method, e.properties, e.body) for e in fast_events] == \
        [(e.method, e.properties, e.body) for e in slow_events]
    assert [e.body for e in fast_events] == bodies and [e.properties for e in fast_events] == props


def test_fast_path_still_checks_frame_end_and_sizes():
    good = server_content(1, spec.BasicDeliver(consumer_tag="c", delivery_tag=1), spec.BasicProperties(), b"abc")
    bad = bytearray(good)
    bad[-1] = 0  # body frame's frame-end octet
    conn, _ = open_connection()
    open_channel(conn, 1)
    with pytest.raises(RemoteProtocolError, match="frame-end"):
        conn.receive_data(bytes(bad))


def test_protocol_error_queues_a_close_naming_the_fault():
    conn, _ = open_connection()
    with pytest.raises(RemoteProtocolError) as info:
        conn.receive_data(bytes.fromhex("09 0000 00000000 ce"))
    conn.protocol_error(info.value)
    (_, _, close), = sent_methods(conn)
    assert isinstance(close, spec.ConnectionClose) and close.reply_code == 501
    assert "frame type 9" in close.reply_text
    assert conn.state is ConnState.CLOSED


class _RawProps(spec.BasicProperties):
    """Basic properties written as given bytes (what no encoder of ours writes)."""

    __slots__ = ("raw",)

    def encode(self):
        return self.raw


def _overrunning_headers():
    """A headers table that says it is longer than its frame (the frame itself is whole)."""
    import struct
    return struct.pack(">H", 0x2000) + struct.pack(">I", 1000) + b"\x01kt\x01"


def test_properties_that_cannot_be_decoded_deliver_the_message_with_undecodable_properties():
    """Issue 43, item 7: RabbitMQ delivers a headers table nested 2,000 deep; decoding it raised
    RecursionError in the reader, and the connection died at every redelivery (integration test:
    test_sources_poison.py). Any properties that fail to decode in a whole frame are the message's
    problem, not the connection's: the message is delivered with the raw properties and the error,
    on both decoding paths, and the connection goes on to the next delivery."""
    from spark_mq.protocol.amqp08.connection import UndecodableProperties

    poison = _RawProps()
    poison.raw = _overrunning_headers()
    data = server_content(1, spec.BasicDeliver(consumer_tag="c", delivery_tag=1), poison, b"poison") + \
        server_content(1, spec.BasicDeliver(consumer_tag="c", delivery_tag=2), spec.BasicProperties(message_id="m2"),
                       b"after")
    fast, _ = open_connection()
    open_channel(fast, 1)
    slow, _ = open_connection()
    open_channel(slow, 1)
    slow_events = []
    for i in range(0, len(data), 7):  # frame by frame: the general path
        slow_events += slow.receive_data(data[i:i + 7])
    for events in (fast.receive_data(data), slow_events):
        first, second = events
        assert type(first.properties) is UndecodableProperties and first.body == b"poison"
        assert first.properties.raw == poison.raw and "runs past the end of its frame" in first.properties.error
        assert first.properties.message_id is None and first.method.delivery_tag == 1
        assert second.properties.message_id == "m2" and second.body == b"after"


def test_field_table_timestamps_past_year_9999_decode_as_raw_seconds():
    import datetime as dt
    import struct

    from spark_mq.protocol.amqp08.codec import RawTimestamp, encode_table

    for seconds in (1_795_873_185_900, 2 ** 64 - 1):  # milliseconds sent as seconds; the largest
        raw = b"\x04sentT" + struct.pack(">Q", seconds)
        table, end = decode_table(struct.pack(">I", len(raw)) + raw, 0)
        assert table == {"sent": seconds} and type(table["sent"]) is RawTimestamp and end == 4 + len(raw)
        assert str(table["sent"]) == str(seconds)
        assert encode_table(table) == struct.pack(">I", len(raw)) + raw  # back as the same timestamp
    ok = b"\x01tT" + struct.pack(">Q", 1_795_873_185)
    assert decode_table(struct.pack(">I", len(ok)) + ok, 0)[0]["t"] == \
        dt.datetime(2026, 11, 28, 13, 39, 45, tzinfo=dt.timezone.utc)


def test_deliveries_in_flight_while_a_channel_closes_are_kept():
    """The broker sends deliveries until it reads our channel.close: each is a method frame, a
    header and a body. A no-ack delivery is already forgotten by the broker, so it is decoded and
    handed up (not discarded, and no 'header without a content method' error); other methods are
    discarded as the spec says, and close-ok closes the channel."""
    conn, _ = open_connection()
    n = open_channel(conn)
    conn.close_channel(n)
    sent_methods(conn)
    deliver = spec.BasicDeliver(consumer_tag="c", delivery_tag=7, exchange="", routing_key="q")
    events = conn.receive_data(server_content(n, deliver, spec.BasicProperties(), b"in flight")
                               + server_frame(n, spec.BasicQosOk())
                               + server_frame(n, spec.ChannelCloseOk()))
    content, closed = events
    assert isinstance(content, ContentReceived) and content[3] == b"in flight" and content[1].delivery_tag == 7
    assert isinstance(closed, ChannelClosed) and closed.error is None
