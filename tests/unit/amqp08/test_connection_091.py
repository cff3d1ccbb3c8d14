"""The sans-IO connection speaking AMQP 0-9-1 (``protocol="0-9-1"``): the same state machine over the 0-9-1
tables, and the error when a broker answers the protocol header with another (issue 57)."""

import pytest

from spark_mq.protocol.amqp08 import spec091
from spark_mq.protocol.amqp08.connection import Connection
from spark_mq.protocol.amqp08.errors import ProtocolRefused
from spark_mq.protocol.amqp08.events import ChannelOpened, ConnectionOpened, ConnState, ContentReceived
from spark_mq.protocol.amqp08.frames import FrameReader, decode_method

from .helpers import server_content, server_frame

START = spec091.ConnectionStart(version_major=0, version_minor=9, server_properties={"product": "RabbitMQ"},
                                mechanisms=b"PLAIN AMQPLAIN", locales=b"en_US")


def _sent(conn):
    return [(channel, decode_method(payload, channel, spec091.METHODS))
            for ftype, channel, payload in FrameReader(1 << 20).feed(conn.data_to_send()) if ftype == 1]


def _open():
    conn = Connection("guest", "guest", "/", protocol="0-9-1")
    assert conn.initiate() == b"AMQP\x00\x00\x09\x01"
    events = conn.receive_data(server_frame(0, START))
    events += conn.receive_data(server_frame(0, spec091.ConnectionTune(channel_max=16, frame_max=131072,
                                                                       heartbeat=10)))
    events += conn.receive_data(server_frame(0, spec091.ConnectionOpenOk(known_hosts="")))
    return conn, events


def test_handshake_channel_and_a_delivery_in_091():
    conn, events = _open()
    assert [type(e) for e in events] == [ConnectionOpened] and conn.state is ConnState.OPEN
    sent = [type(m) for _, m in _sent(conn)]
    assert sent == [spec091.ConnectionStartOk, spec091.ConnectionTuneOk, spec091.ConnectionOpen]
    n = conn.open_channel()
    (_, channel_open), = _sent(conn)
    assert isinstance(channel_open, spec091.ChannelOpen)
    # 0-9-1's channel.open-ok carries a (reserved) long string, 0-8's nothing
    (opened,) = conn.receive_data(server_frame(n, spec091.ChannelOpenOk(channel_id=b"")))
    assert isinstance(opened, ChannelOpened)
    deliver = spec091.BasicDeliver(consumer_tag="c", delivery_tag=1, redelivered=False, exchange="", routing_key="q")
    (got,) = conn.receive_data(server_content(n, deliver, spec091.BasicProperties(message_id="m1"), b"hi"))
    assert isinstance(got, ContentReceived) and got.body == b"hi" and got.properties.message_id == "m1"
    # a publisher confirm (basic.ack from the broker) and basic.nack are methods a 0-9-1 channel takes
    conn.send_method(n, spec091.ConfirmSelect(nowait=False))
    (_, select), = _sent(conn)
    assert isinstance(select, spec091.ConfirmSelect)
    events = conn.receive_data(server_frame(n, spec091.ConfirmSelectOk()))
    events += conn.receive_data(server_frame(n, spec091.BasicNack(delivery_tag=3, multiple=False, requeue=False)))
    assert [type(e.method) for e in events] == [spec091.ConfirmSelectOk, spec091.BasicNack]
    conn.close()
    (_, close), = _sent(conn)
    assert isinstance(close, spec091.ConnectionClose) and close.METHOD_ID == 50  # 0-8's is 60


@pytest.mark.parametrize("protocol,answer,speaks,fits", [
    ("0-8", b"AMQP\x03\x01\x00\x00", "AMQP 1.0 (SASL)", "0-9-1"),  # RabbitMQ 4 to a 0-8 header
    ("0-9-1", b"AMQP\x03\x01\x00\x00", "AMQP 1.0 (SASL)", None),  # a 1.0-only broker
    ("0-8", b"AMQP\x00\x00\x09\x01", "AMQP 0-9-1", "0-9-1"),
    ("0-9-1", b"AMQP\x01\x01\x08\x00", "AMQP 0-8", "0-8"),
    ("0-9-1", b"AMQP\x09\x09\x09\x09", "protocol header b'AMQP\\t\\t\\t\\t'", None),
])
def test_a_refused_header_names_what_was_offered_what_the_broker_speaks_and_the_fix(protocol, answer, speaks, fits):
    conn = Connection(protocol=protocol)
    conn.initiate()
    with pytest.raises(ProtocolRefused) as info:
        conn.receive_data(answer)
    err = info.value
    assert (err.offered, err.speaks, err.fits) == (protocol, speaks, fits)
    text = str(err)
    assert f"refused AMQP {protocol}" in text and speaks in text
    assert (f"protocol={fits}" in text) if fits else ("no protocol=... setting fits" in text)


def test_a_refused_header_is_a_refusal_to_the_sources_not_an_outage():
    from spark_mq.clients.connect import refusal

    assert refusal(ProtocolRefused("0-8", b"AMQP\x03\x01\x00\x00"))


def test_an_unknown_protocol_is_refused_naming_the_choices():
    from spark_mq.errors import LocalProtocolError

    with pytest.raises(LocalProtocolError, match=r"unknown AMQP protocol '0-10'.*0-8.*0-9-1"):
        Connection(protocol="0-10")


def test_both_versions_share_the_basic_property_list():
    from spark_mq.protocol.amqp08 import spec

    assert spec.BasicProperties.FIELDS == spec091.BasicProperties.FIELDS
    props = spec.BasicProperties(message_id="x", delivery_mode=2, headers={"a": 1})
    assert spec091.BasicProperties.decode(props.encode(), 0)[0].message_id == "x"
