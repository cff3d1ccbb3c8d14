"""Unit tests of spark_mq.transport.zmqframes: one multipart message as recv_multipart gives it, and
sent as send_multipart sends it."""

from __future__ import annotations

import uuid

import pytest
import zmq

from spark_mq.transport.zmqframes import NOBLOCK, recv_frames, send_frames


@pytest.fixture()
def pair():
    ctx = zmq.Context.instance()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    url = f"inproc://frames-{uuid.uuid4().hex}"
    a.bind(url)
    b.connect(url)
    yield a, b
    a.close(0)
    b.close(0)


def test_messages_come_whole_and_in_order_like_recv_multipart(pair):
    a, b = pair
    sent = [[b"one"], [b"h", b""], [b"h", b"x" * 70_000, b"tail"], [b""]]  # 70 KB: above pyzmq's 64 KiB copy threshold
    for parts in sent:
        a.send_multipart(parts)
    for parts in sent:
        b.poll(2000)
        got = recv_frames(b)
        assert got == parts and all(type(p) is bytes for p in got)
    for parts in sent:
        a.send_multipart(parts)
    b.poll(2000)
    assert [b.recv_multipart() for _ in sent] == sent  # the reference it must equal


def test_nothing_waiting_raises_again(pair):
    _, b = pair
    with pytest.raises(zmq.Again):
        recv_frames(b)


def test_send_frames_sends_what_send_multipart_sends(pair):
    a, b = pair
    sent = [[b"one"], [b"h", b""], [b"h", b"x" * 70_000, b"tail"], [b""], (b"t", bytearray(b"ba"), memoryview(b"mv"))]
    for parts in sent:
        send_frames(a, parts)
    got = []
    for _ in sent:
        assert b.poll(2000)
        got.append(b.recv_multipart())
    assert got == [[bytes(p) for p in parts] for parts in sent]
    assert not b.poll(50)  # nothing more, nothing split


def test_send_frames_blocked_queues_nothing_of_the_message():
    """NOBLOCK with nowhere to send: zmq.Again from the first frame, and no part of the message
    is left queued to reach a peer that connects later (the broker retries the whole message)."""
    ctx = zmq.Context.instance()
    url = f"inproc://frames-{uuid.uuid4().hex}"
    d = ctx.socket(zmq.DEALER)
    d.bind(url)
    try:
        with pytest.raises(zmq.Again):
            send_frames(d, [b"h", b"body"], NOBLOCK)
        peer = ctx.socket(zmq.DEALER)
        peer.connect(url)
        try:
            assert d.poll(2000, zmq.POLLOUT)  # the bound side has taken the new peer's pipe
            send_frames(d, [b"h2", b"body2"], NOBLOCK)
            assert peer.poll(2000)
            assert peer.recv_multipart() == [b"h2", b"body2"]
            assert not peer.poll(50)
        finally:
            peer.close(0)
    finally:
        d.close(0)
