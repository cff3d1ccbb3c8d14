"""One writer per local source log: an ``flock`` on ``<log>/writer.lock``.

Responsible for: taking the lock (waiting for a holder that goes), naming the holder when it does
not, and dropping the lock on release. Other filesystems have no such lock: there a
``WriterLease`` (``spark_mq.sources.log.lease``) does what a renewed file can.
"""

from __future__ import annotations

import os
from typing import Optional

from spark_mq.sources.log.segments import LogInUseError

__all__ = ["LOCK_NAME", "WriterLock"]

LOCK_NAME = "writer.lock"


class WriterLock:
    """One writer per local log: an exclusive ``flock`` on ``<log>/writer.lock``, taken before the
    log is opened (opening recovers a torn tail, which would cut into another writer's appends).

    The kernel drops the lock when its holder exits, however it exits (a killed query's reader
    process included), so a restart waits at most until its predecessor is gone (``wait``
    seconds, then ``LogInUseError`` naming the location and the holder). The holder's pid, host
    and start time are written into the file for that message only; the lock is the ``flock``.
    """

    def __init__(self, root: str, location: str, wait: float) -> None:
        import fcntl
        import socket
        import time

        self.path = os.path.join(root, LOCK_NAME)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "unknown"
                        raise LogInUseError(
                            f"logLocation {location} is in use by another source reader ({holder}); waited "
                            f"{wait:.0f}s. Each query needs its own logLocation; if that reader belongs to a "
                            f"query that was stopped or killed, its lock goes with its process.") from None
                    time.sleep(0.1)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                          f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd: Optional[int] = fd

    def check(self) -> None:
        """Nothing to do: an ``flock`` cannot be taken from its holder (``WriterLease.check`` can fail)."""

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None
