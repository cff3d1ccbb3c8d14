"""The bounded inbox of the blocking STOMP client (``spark_mq.clients.stomp``): MESSAGE frames the
reader thread hands over for ``receive``, and the bound that stops the reader.

Frames are held up to ``max_messages`` and ``max_bytes`` (of bodies); past that ``has_room`` is
false and the client's reader leaves the socket unread, so TCP fills and the broker stops sending,
until the application takes some (``took`` resumes the reader once half the bound is free).
Counted in by the reader thread, out (under a lock of its own) by the threads that take.

Frames are held as the reader handed them over, one list per read of the socket, with their body
bytes: taking a whole list is one ``extend`` and its bytes already counted, where moving and
counting frame by frame was a per-message cost of the reader process (measured with
bench/bench_ingest-style drains).
"""

from __future__ import annotations

import collections
import threading
import time
from operator import attrgetter
from typing import Callable, List, Optional

from spark_mq.protocol.stomp10 import Frame


_BODY = attrgetter("body")


def _body_bytes(frames: List[Frame]) -> int:
    return sum(map(len, map(_BODY, frames)))


class Inbox:
    """MESSAGE frames received and not yet taken, with their count and body bytes against the bound."""

    def __init__(self, max_messages: Optional[int], max_bytes: Optional[int]) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.driver = None  # the client's StreamDriver, once connected: resumed by ``took``
        # [frames, body bytes not yet taken] per hand-over; of the first, ``_first`` frames are taken
        self._chunks: collections.deque = collections.deque()
        self._first = 0
        self._cond = threading.Condition(threading.Lock())
        self._waiting = 0  # threads waiting in ``take``
        self._in_msgs = self._in_bytes = 0
        self._out_msgs = self._out_bytes = 0
        self._take_lock = threading.Lock()  # orders the threads that take (the first chunk's state)

    @property
    def bounded(self) -> bool:
        return self.max_messages is not None or self.max_bytes is not None

    def __len__(self) -> int:
        return max(0, self._in_msgs - self._out_msgs)

    @property
    def buffered_bytes(self) -> int:
        return max(0, self._in_bytes - self._out_bytes)

    # -- the reader thread -----------------------------------------------------------------------
    def put(self, messages: List[Frame]) -> None:
        """Hand ``messages`` over (reader thread; the list becomes the inbox's) and wake the threads
        waiting in ``take``."""
        nbytes = _body_bytes(messages)
        self._in_bytes += nbytes
        self._in_msgs += len(messages)
        self._chunks.append([messages, nbytes])
        if self._waiting:
            with self._cond:
                self._cond.notify_all()

    def wake(self) -> None:
        """Wake every thread waiting in ``take`` (it looks again, and raises what ended the stream)."""
        with self._cond:
            self._cond.notify_all()

    def has_room(self) -> bool:
        """Fewer than the bound held, in messages and in body bytes."""
        bound = self.max_messages
        if bound is not None and self._in_msgs - self._out_msgs >= bound:
            return False
        bound = self.max_bytes
        return bound is None or self._in_bytes - self._out_bytes < bound

    # -- the application's threads ---------------------------------------------------------------
    def take(self, timeout: Optional[float], check: Callable[[], None]) -> Optional[Frame]:
        """The next frame, or ``None`` after ``timeout`` seconds; ``check()`` raises what ended the
        stream, called only once no frame is left."""
        out = self.take_many(1, timeout, check)
        return out[0] if out else None

    def take_many(self, max_count: int, timeout: Optional[float], check: Callable[[], None]) -> List[Frame]:
        """Up to ``max_count`` frames: waits (up to ``timeout``) for the first, then takes whatever
        else is already here; ``[]`` after ``timeout``. ``check()`` as in ``take``."""
        out: List[Frame] = []
        if self._chunks:
            self.take_more(out, max_count)
            if out:
                return out
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._cond:
                # Count ourselves as waiting *before* looking, so the reader's unlocked check of
                # the count after adding messages cannot miss us.
                self._waiting += 1
                try:
                    while not self._chunks:
                        check()
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            return out
                        self._cond.wait(remaining)
                finally:
                    self._waiting -= 1
            self.take_more(out, max_count)
            if out:  # (else another thread took them first: wait on)
                return out

    def take_more(self, out: List[Frame], max_count: int) -> None:
        """Add to ``out`` the frames already here, up to ``max_count`` in all, without waiting."""
        count = nbytes = 0
        with self._take_lock:
            chunks = self._chunks
            while chunks and len(out) < max_count:
                chunk = chunks[0]
                frames, start = chunk[0], self._first
                end = start + max_count - len(out)
                if end >= len(frames):  # the rest of this hand-over
                    part = frames[start:] if start else frames
                    nbytes += chunk[1]
                    chunks.popleft()
                    self._first = 0
                else:
                    part = frames[start:end]
                    taken = _body_bytes(part)
                    chunk[1] -= taken
                    nbytes += taken
                    self._first = end
                out.extend(part)
                count += len(part)
        if count:
            self.took(count, nbytes)

    def took(self, count: int, nbytes: int) -> None:
        with self._take_lock:
            self._out_msgs += count
            self._out_bytes += nbytes
        driver = self.driver
        if driver is not None and driver.reading_paused:
            # wake the reader once half the bound is free: it then reads in large pieces again
            m, b = self.max_messages, self.max_bytes
            if (m is None or self._in_msgs - self._out_msgs <= m // 2) and \
                    (b is None or self._in_bytes - self._out_bytes <= b // 2):
                driver.resume_reading()
