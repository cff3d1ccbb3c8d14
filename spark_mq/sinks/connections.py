"""Per-process pool of broker sessions for the sink tasks of an executor's Python worker.

Responsible for: lending a task an open session (connection plus whatever per-connection state the
protocol needs, e.g. an AMQP channel in transaction mode) keyed by the connection options, taking it
back when the task ended cleanly, and closing it when it did not. A session is used by ONE task at a
time (it is removed from the pool while lent), a session made in another process (after a fork) is
never reused, and idle sessions are closed politely when the process exits.
Not responsible for what a session does: see ``spark_mq.sinks.writer.Session``.

Spark reuses Python workers between tasks and micro-batches by default (spark.python.worker.reuse),
so a pooled session saves a TCP + protocol handshake per partition per batch; nothing guarantees the
reuse, and nothing here depends on it.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Callable, Hashable

log = logging.getLogger("spark_mq.sinks")

#: Idle sessions kept per key (more only when tasks of one process run concurrently).
MAX_IDLE_PER_KEY = 4
#: Seconds a polite close at process exit may take per session.
EXIT_CLOSE_TIMEOUT = 2.0

_lock = threading.Lock()
_idle: dict = {}  # key -> list of (pid, session)


def acquire(key: Hashable, factory: Callable[[], object]):
    """An idle healthy session for ``key`` from this process, or a new one from ``factory()``."""
    pid = os.getpid()
    while True:
        with _lock:
            stack = _idle.get(key)
            entry = stack.pop() if stack else None
        if entry is None:
            return factory()
        owner, session = entry
        if owner != pid:
            continue  # inherited through fork: the socket is shared with the parent; never touch it
        if session.healthy():
            return session
        _close_quietly(session)


def release(key: Hashable, session, *, reusable: bool) -> None:
    """Give ``session`` back after a task: pooled if ``reusable`` and healthy, else closed."""
    if reusable and session.healthy():
        with _lock:
            stack = _idle.setdefault(key, [])
            if len(stack) < MAX_IDLE_PER_KEY:
                stack.append((os.getpid(), session))
                return
    _close_quietly(session)


def idle_count(key: Hashable) -> int:
    with _lock:
        return len(_idle.get(key, ()))


def close_all() -> None:
    """Close every idle session of this process (also run at exit)."""
    pid = os.getpid()
    with _lock:
        entries = [entry for stack in _idle.values() for entry in stack]
        _idle.clear()
    for owner, session in entries:
        if owner == pid:
            _close_quietly(session, EXIT_CLOSE_TIMEOUT)


def _close_quietly(session, timeout: float = EXIT_CLOSE_TIMEOUT) -> None:
    try:
        session.close(timeout)
    except Exception as exc:  # noqa: BLE001 - closing a broken session: nothing left to save
        log.debug("closing a sink session failed: %r", exc)


atexit.register(close_all)
