"""The STOMP client's inbox (``spark_mq.clients.stomp_inbox``): frames handed over a read at a time
come out in order, whole hand-overs or parts of them, with their count and body bytes held against
the bound exactly."""

from __future__ import annotations

import threading

from spark_mq.clients.stomp_inbox import Inbox
from spark_mq.protocol.stomp10 import Command, Frame


def _frames(first: int, count: int) -> list:
    return [Frame(Command.MESSAGE, {"message-id": str(i)}, b"x" * (i % 7)) for i in range(first, first + count)]


def _ids(frames) -> list:
    return [int(f.headers["message-id"]) for f in frames]


def _nothing_ended() -> None:
    pass


def test_frames_come_out_in_order_across_and_within_hand_overs_with_exact_counts():
    inbox = Inbox(max_messages=100, max_bytes=None)
    inbox.put(_frames(0, 5))
    inbox.put(_frames(5, 3))
    inbox.put(_frames(8, 10))
    assert len(inbox) == 18 and inbox.buffered_bytes == sum(i % 7 for i in range(18))
    got = inbox.take_many(2, 0, _nothing_ended)           # part of the first
    got += inbox.take_many(4, 0, _nothing_ended)          # its rest, then part of the second
    assert _ids(got) == list(range(6))
    assert len(inbox) == 12 and inbox.buffered_bytes == sum(i % 7 for i in range(6, 18))
    one = inbox.take(0, _nothing_ended)
    assert _ids([one]) == [6]
    rest = inbox.take_many(100, 0, _nothing_ended)
    assert _ids(rest) == list(range(7, 18))
    assert len(inbox) == 0 and inbox.buffered_bytes == 0 and inbox.has_room()
    assert inbox.take_many(10, 0.01, _nothing_ended) == [] and inbox.take(0.01, _nothing_ended) is None


def test_the_bound_counts_what_is_held_and_frees_as_frames_are_taken():
    inbox = Inbox(max_messages=10, max_bytes=None)
    inbox.put(_frames(0, 12))
    assert not inbox.has_room()
    inbox.take_many(3, 0, _nothing_ended)
    assert inbox.has_room() and len(inbox) == 9


def test_a_waiting_taker_gets_what_the_reader_hands_over_and_concurrent_takers_share_without_loss():
    inbox = Inbox(max_messages=None, max_bytes=None)
    got: list = []
    lock = threading.Lock()

    def taker():
        while True:
            frames = inbox.take_many(7, 0.5, _nothing_ended)
            if not frames:
                return
            with lock:
                got.extend(frames)

    threads = [threading.Thread(target=taker) for _ in range(3)]
    for t in threads:
        t.start()
    for first in range(0, 3000, 30):
        inbox.put(_frames(first, 30))
    for t in threads:
        t.join(10)
    assert sorted(_ids(got)) == list(range(3000))
    assert len(inbox) == 0 and inbox.buffered_bytes == 0
