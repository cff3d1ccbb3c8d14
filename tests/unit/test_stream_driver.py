"""StreamDriver's read gate (``may_read``/``resume_reading``) on a real socket pair: while the
protocol says no, nothing is read (the bytes stay in the socket), ticks go on, a wake or the next
tick reads again, and a close while the reader waits ends it at once."""

from __future__ import annotations

import socket
import threading
import time

from spark_mq.transport.stream import StreamDriver


def _wait(cond, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Gate:
    def __init__(self) -> None:
        self.open = True
        self.got = bytearray()
        self.ticks = 0
        self.closed = threading.Event()

    def may_read(self) -> bool:
        return self.open

    def on_data(self, data: bytes) -> None:
        self.got += data

    def on_tick(self, now: float) -> None:
        self.ticks += 1

    def on_closed(self, exc) -> None:
        self.closed.set()


def _driver(tick: float = 0.05):
    ours, peer = socket.socketpair()
    gate = Gate()
    driver = StreamDriver(ours, on_data=gate.on_data, on_closed=gate.on_closed, on_tick=gate.on_tick,
                          tick_interval=tick, may_read=gate.may_read)
    driver.start()
    return driver, peer, gate


def test_nothing_is_read_while_the_gate_is_shut_and_ticks_go_on():
    driver, peer, gate = _driver()
    try:
        peer.sendall(b"a")
        assert _wait(lambda: gate.got == b"a")
        gate.open = False
        assert _wait(lambda: driver.reading_paused)
        peer.sendall(b"bcd")
        ticks = gate.ticks
        time.sleep(0.5)
        assert gate.got == b"a"                 # left in the socket
        assert gate.ticks >= ticks + 3          # heartbeats can still be sent
        gate.open = True
        driver.resume_reading()
        assert _wait(lambda: gate.got == b"abcd", 2.0)
        assert _wait(lambda: not driver.reading_paused)
    finally:
        driver.close()
        peer.close()


def test_the_reader_looks_again_every_tick_without_a_wake():
    driver, peer, gate = _driver(tick=0.1)
    try:
        gate.open = False
        assert _wait(lambda: driver.reading_paused)
        peer.sendall(b"x")
        time.sleep(0.3)
        assert gate.got == b""
        gate.open = True                        # no resume_reading: the tick finds it
        assert _wait(lambda: gate.got == b"x", 2.0)
    finally:
        driver.close()
        peer.close()


def test_a_full_socket_holds_the_peer_back():
    driver, peer, gate = _driver()
    try:
        gate.open = False
        assert _wait(lambda: driver.reading_paused)
        peer.setblocking(False)
        sent = 0
        try:
            while sent < 64 << 20:
                sent += peer.send(b"y" * 65536)
        except BlockingIOError:
            pass
        assert sent < 64 << 20, "the peer could send 64 MiB to a reader that does not read"
        assert gate.got == b""
        gate.open = True
        driver.resume_reading()
        assert _wait(lambda: len(gate.got) == sent, 10.0)
    finally:
        driver.close()
        peer.close()


def test_close_while_the_reader_waits_ends_it_at_once():
    driver, peer, gate = _driver(tick=5.0)      # a long tick: only the wake can end the wait early
    try:
        gate.open = False
        assert _wait(lambda: driver.reading_paused)
        started = time.monotonic()
        driver.close()
        assert time.monotonic() - started < 2.0
        assert gate.closed.is_set() and not driver._thread.is_alive()
    finally:
        peer.close()


def test_the_reader_asks_gather_after_a_small_read_only():
    """``gather`` (STOMP: the last read brought messages, no receipt awaited) is asked after a read
    smaller than 4 KiB, to pause a moment so that more arrives per read; a large read goes straight on."""
    ours, peer = socket.socketpair()
    gate, reads, asked = Gate(), [], []

    def on_data(data: bytes) -> None:
        reads.append(len(data))
        gate.on_data(data)

    def gather() -> bool:
        asked.append(reads[-1])  # the size of the read it was asked after
        return True
    driver = StreamDriver(ours, on_data=on_data, on_closed=gate.on_closed, gather=gather)
    driver.start()
    try:
        peer.sendall(b"a")
        assert _wait(lambda: gate.got == b"a" and len(asked) == 2)  # asked before and after clearing the wake
        peer.sendall(b"b" * 200_000)
        assert _wait(lambda: len(gate.got) == 200_001)
        # the reader asks after on_data returns: wait for its asks, not a fixed time
        assert _wait(lambda: len(asked) == 2 * sum(1 for n in reads if n < 4096), 5.0), (asked, reads)
        assert any(n >= 4096 for n in reads), reads
        assert asked and all(n < 4096 for n in asked), (asked, reads)
    finally:
        driver.close()
        peer.close()
