"""The bounded inbox of the blocking STOMP client (``spark_mq.clients.stomp``): MESSAGE frames the
reader thread hands over for ``receive``, and the bound that stops the reader.

Frames are held up to ``max_messages`` and ``max_bytes`` (of bodies); past that ``has_room`` is
false and the client's reader leaves the socket unread, so TCP fills and the broker stops sending,
until the application takes some (``took`` resumes the reader once half the bound is free).
Counted in by the reader thread, out (under a lock of its own) by the threads that take.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, List, Optional

from spark_mq.protocol.stomp10 import Frame


class Inbox:
    """MESSAGE frames received and not yet taken, with their count and body bytes against the bound."""

    def __init__(self, max_messages: Optional[int], max_bytes: Optional[int]) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.driver = None  # the client's StreamDriver, once connected: resumed by ``took``
        self._frames: collections.deque = collections.deque()
        self._cond = threading.Condition(threading.Lock())
        self._waiting = 0  # threads waiting in ``take``
        self._in_msgs = self._in_bytes = 0
        self._out_msgs = self._out_bytes = 0
        self._take_lock = threading.Lock()

    @property
    def bounded(self) -> bool:
        return self.max_messages is not None or self.max_bytes is not None

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def buffered_bytes(self) -> int:
        return max(0, self._in_bytes - self._out_bytes)

    # -- the reader thread -----------------------------------------------------------------------
    def put(self, messages: List[Frame]) -> None:
        """Hand ``messages`` over (reader thread) and wake the threads waiting in ``take``."""
        self._in_bytes += sum(len(m.body) for m in messages)
        self._in_msgs += len(messages)
        self._frames.extend(messages)
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
        frames = self._frames
        try:
            frame = frames.popleft()
        except IndexError:
            pass
        else:
            self.took(1, len(frame.body))
            return frame
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            # Count ourselves as waiting *before* looking, so the reader's unlocked check of
            # the count after adding messages cannot miss us.
            self._waiting += 1
            try:
                while not frames:
                    check()
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return None
                    self._cond.wait(remaining)
                frame = frames.popleft()
            finally:
                self._waiting -= 1
        self.took(1, len(frame.body))
        return frame

    def take_more(self, out: List[Frame], max_count: int) -> None:
        """Add to ``out`` the frames already here, up to ``max_count`` in all, without waiting."""
        popleft = self._frames.popleft
        taken = len(out)
        nbytes = 0
        try:
            while len(out) < max_count:
                frame = popleft()
                out.append(frame)
                nbytes += len(frame.body)
        except IndexError:
            pass
        if len(out) > taken:
            self.took(len(out) - taken, nbytes)

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
