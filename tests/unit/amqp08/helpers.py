"""Script a broker's side of the AMQP 0-8 conversation for sans-IO tests."""

from spark_mq.protocol.amqp08 import spec
from spark_mq.protocol.amqp08.connection import Connection
from spark_mq.protocol.amqp08.frames import FrameReader, content_frames, method_frame


def server_frame(channel, method):
    return method_frame(channel, method.encode())


def server_content(channel, method, props, body, frame_max=131072):
    return server_frame(channel, method) + b"".join(
        bytes(p) for p in content_frames(channel, method.CLASS_ID, props.encode(), body, frame_max))


START = spec.ConnectionStart(version_major=8, version_minor=0, server_properties={"product": "TestBroker"},
                             mechanisms=b"PLAIN AMQPLAIN", locales=b"en_US")
TUNE = spec.ConnectionTune(channel_max=16, frame_max=4096, heartbeat=10)


def sent_methods(conn):
    """Decode what the client queued for the wire (after the protocol header)."""
    from spark_mq.protocol.amqp08.frames import decode_method

    out = []
    for ftype, channel, payload in FrameReader(1 << 20).feed(conn.data_to_send()):
        out.append((ftype, channel, decode_method(payload) if ftype == 1 else payload))
    return out


def open_connection(**kwargs):
    conn = Connection("guest", "guest", "/", **kwargs)
    conn.initiate()
    events = conn.receive_data(server_frame(0, START))
    events += conn.receive_data(server_frame(0, TUNE))
    events += conn.receive_data(server_frame(0, spec.ConnectionOpenOk(known_hosts="")))
    conn.data_to_send()
    return conn, events


def open_channel(conn, number=None):
    n = conn.open_channel(number)
    conn.data_to_send()
    conn.receive_data(server_frame(n, spec.ChannelOpenOk()))
    return n
