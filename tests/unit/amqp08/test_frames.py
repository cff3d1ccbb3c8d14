"""Frame reader: whole input, one byte at a time, with trailing data; and its errors."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_mq.errors import RemoteProtocolError
from spark_mq.protocol.amqp08 import spec
from spark_mq.protocol.amqp08.frames import (
    HEARTBEAT_FRAME,
    FrameReader,
    content_frames,
    decode_content_header,
    method_frame,
)

METHOD = spec.BasicDeliver(consumer_tag="c", delivery_tag=1, redelivered=False, exchange="", routing_key="q")
STREAM = (method_frame(1, METHOD.encode())
          + b"".join(bytes(p) for p in content_frames(1, 60, spec.BasicProperties(message_id="m").encode(),
                                                       b"x" * 10000, 4096))
          + HEARTBEAT_FRAME)


def expected_frames():
    return FrameReader(4096).feed_all(STREAM)


def test_golden_heartbeat_and_method_frame():
    assert HEARTBEAT_FRAME == bytes.fromhex("08 0000 00000000 ce")
    assert method_frame(3, spec.TxSelect().encode()) == bytes.fromhex("01 0003 00000004 005a000a ce")


def test_whole_stream():
    frames = expected_frames()
    # method, header, 3 body frames (4088-byte chunks), heartbeat
    assert [f[0] for f in frames] == [1, 2, 3, 3, 3, 8]
    assert sum(len(f[2]) for f in frames if f[0] == 3) == 10000
    assert max(len(f[2]) for f in frames) <= 4096 - 8
    class_id, size, _ = decode_content_header(frames[1][2])
    assert (class_id, size) == (60, 10000)


def test_one_byte_at_a_time():
    reader = FrameReader(4096)
    out = []
    for i in range(len(STREAM)):
        out += reader.feed_all(STREAM[i:i + 1])
    assert out == expected_frames()
    assert reader.buffered == 0


def test_trailing_bytes_are_kept_for_the_next_feed():
    reader = FrameReader(4096)
    partial = STREAM[:5]
    out = reader.feed_all(STREAM + partial)
    assert out == expected_frames()
    assert reader.buffered == 5
    assert reader.feed_all(STREAM[5:]) == expected_frames()


def test_bad_frame_end():
    bad = bytearray(HEARTBEAT_FRAME)
    bad[-1] = 0
    with pytest.raises(RemoteProtocolError, match="not the frame-end octet"):
        FrameReader().feed_all(bad)


def test_oversized_frame_names_frame_max():
    big = method_frame(1, b"\x00" * 5000)
    with pytest.raises(RemoteProtocolError, match="exceeds the negotiated frame-max 4096"):
        FrameReader(4096).feed_all(big)


def test_unknown_frame_type():
    with pytest.raises(RemoteProtocolError, match="unknown frame type 9"):
        FrameReader().feed_all(bytes.fromhex("09 0000 00000000 ce"))


@settings(max_examples=1500, deadline=None)
@given(st.binary(max_size=100))
def test_fuzz_frame_reader(raw):
    try:
        FrameReader(4096).feed_all(raw)
    except RemoteProtocolError:
        pass
