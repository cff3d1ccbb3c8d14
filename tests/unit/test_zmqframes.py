"""Unit tests of spark_mq.transport.zmqframes: one multipart message as recv_multipart gives it."""

from __future__ import annotations

import uuid

import pytest
import zmq

from spark_mq.transport.zmqframes import recv_frames


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
