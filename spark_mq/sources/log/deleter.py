"""Deleting committed segment files off the caller's thread.

Responsible for: deleting the files of committed segments oldest first on a thread of its own,
stopping at the first failure and reporting it at the next commit. Not responsible for deciding
what is committed (``SourceLog.commit``).

Why a thread: Spark commits from its planning path (``latestOffset``), and deleting fsynced
segments blocks (512 MiB of 64 MiB segments on ext4: 0.13-0.22 s), with Spark and the ingest both
waiting on it at every micro-batch.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Optional

__all__ = ["Deleter"]


class Deleter:
    """Deletes files on a thread of its own, oldest first; the thread ends whenever none is left.

    Oldest first, and nothing more after a failure: whatever a crash or an error leaves behind is
    then the oldest end of the log, which a reopened log takes as committed messages still held,
    never a gap (opening refuses gaps). The failure is raised by ``check`` (at the log's next
    commit), as a synchronous delete would have raised it."""

    def __init__(self, delete) -> None:
        self._delete = delete
        self._cond = threading.Condition()
        self._paths: deque = deque()   # a path stays here until it is deleted: ``wait`` sees it
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[OSError] = None

    def check(self) -> None:
        """Raise the failure that stopped the deletes, if one did."""
        with self._cond:
            if self.error is not None:
                raise self.error

    def put(self, paths: list) -> None:
        with self._cond:
            if not paths or self.error is not None:
                return  # after a failure nothing more goes: what is left stays contiguous
            self._paths.extend(paths)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="spark-mq-log-delete", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._paths:
                    self._thread = None
                    self._cond.notify_all()
                    return
                path = self._paths[0]
            try:
                self._delete(path)
            except Exception as exc:  # noqa: BLE001 - any (an fsspec-backed filesystem's own errors):
                # a thread ended by one would leave ``_thread`` set, and ``close`` waiting for ever
                with self._cond:
                    self.error = OSError(f"could not delete the committed log segment {path}: {exc}")
                    self._paths.clear()
                continue
            with self._cond:
                self._paths.popleft()

    def wait(self, timeout: Optional[float] = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._thread is None, timeout)
