"""Segment files on a local filesystem: appended to in place, fsynced in groups, written behind.

Responsible for: the active segment's descriptor, appending IPC messages to it (at once, or queued
and written by ``write_unwritten``/``sync`` under write-behind), grouped fsyncs and the durable
head they cover, rotating to a new segment (the old one fsynced and closed, the new one and its
directory fsynced), and cutting a torn tail off on open. Not responsible for the index of what the
segments hold or for what is committed (``SourceLog``). ``remote`` is the same interface for other
filesystems.

Every method but ``sync``, ``write_unwritten`` and ``unwritten_bytes`` runs under the log's lock
(``lock``, shared with ``SourceLog``); ``segments`` is the log's list of segments, shared too.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from typing import Optional

from spark_mq.sources.log.segments import Segment, segment_name

__all__ = ["LocalSegments"]

_IOV_MAX = 1024  # Linux's limit on the buffers of one writev


def _write_all(fd: int, parts) -> None:
    """``os.writev`` until all of ``parts`` (bytes-like objects, written in order, end to end) is
    written: a regular file may take less at once."""
    parts = list(parts)
    i = 0
    while i < len(parts):
        n = os.writev(fd, parts[i:i + _IOV_MAX])
        while i < len(parts) and n >= len(parts[i]):
            n -= len(parts[i])
            i += 1
        if n:  # a part written in part: its rest goes first next time
            parts[i] = memoryview(parts[i])[n:]


class LocalSegments:
    """The segment files of one local log (see the module docstring)."""

    def __init__(self, root: str, schema_bytes: bytes, fsync: bool, lock: threading.RLock, segments: list) -> None:
        self.root = root
        self.fsync = fsync
        self._schema_bytes = schema_bytes
        self._lock = lock
        self._segments = segments
        self._fd: Optional[int] = None     # the active segment, open for append
        self._dirty = False
        # fsync: the head the last finished fsync covered (what Spark may plan); fsyncs take
        # ``_sync_lock`` first and hold ``_lock`` only around their bookkeeping, so Spark's calls
        # (slices, byte counts, commits) and appends go on while one waits on the disk
        self._sync_lock = threading.Lock()
        self.durable = 0
        # write-behind (``defer_writes``): appended IPC messages not yet written, (descriptor, data)
        # oldest first; written by ``sync()`` or, before the active segment is closed, by a rotation
        self._write_behind = False
        self._unwritten: deque = deque()
        self._write_lock = threading.Lock()
        # bytes ever queued (under ``_lock``) and written (under ``_write_lock``): each counter has
        # one lock, so their difference is what waits unwritten (``unwritten_bytes``)
        self._queued_bytes = 0
        self._written_bytes = 0
        # ``_written_bytes`` when a ``sync()`` last decided on its fsync: queued writes happen on
        # other threads too (the ingest flusher's writer), outside ``_lock``, so they are not told
        # by ``_dirty`` (a flag set between a sync's read and its reset would be lost) but by this
        self._decided_written = 0
        self._write_failed: Optional[OSError] = None

    def _head(self) -> int:
        return self._segments[-1].end if self._segments else 0

    # -- opening --------------------------------------------------------------------------------

    def opened(self, writer: bool) -> None:
        """The log is open (``segments`` recovered): open its last segment for appending. ``writer``:
        the writer's open, not a reader's or a test's."""
        if self._segments:
            self._fd = os.open(self._segments[-1].path, os.O_WRONLY | os.O_APPEND)
            if self.fsync and writer:
                os.fsync(self._fd)  # what a crashed writer appended but never fsynced: durable now
        self.durable = self._head()

    def truncate(self, seg: Segment, good: int, data: bytes) -> None:
        """Cut the torn tail of ``seg`` off at byte ``good``."""
        os.truncate(seg.path, good)
        fd = os.open(seg.path, os.O_WRONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- appending ------------------------------------------------------------------------------

    def append(self, head: int, data: list, length: int, segment_bytes: int) -> tuple[Segment, int]:
        """Append the IPC message ``data`` (parts, ``length`` bytes) for offset ``head``:
        ``(segment, byte position)``. Durable after ``sync()``."""
        seg = self._segments[-1] if self._segments else None
        if seg is None or seg.size >= segment_bytes:
            seg = self.start(head)
        if self._write_behind:
            self._unwritten.append((self._fd, data, length))
            self._queued_bytes += length
        else:
            _write_all(self._fd, data)
            self._dirty = True
        pos = seg.size
        seg.size += length
        return seg, pos

    def start(self, first: int) -> Segment:
        """Close the active segment (fsynced), create and fsync a new one at ``first``. Under
        ``_lock``: the active segment is fsynced here, not through ``sync()`` (which takes
        ``_sync_lock`` first)."""
        if self._fd is not None:
            self.write_unwritten()  # what was appended to this segment goes in before it is closed
            if self.fsync:
                # always, not only when ``_dirty``: a ``sync()`` on another thread clears ``_dirty``
                # before its fsync returns, and ``durable`` moves past this segment below; an fsync
                # of a clean file returns at once, one waits for the other's writeback
                os.fsync(self._fd)
            self._dirty = False
            os.close(self._fd)
            self._fd = None
        path = f"{self.root.rstrip('/')}/{segment_name(first)}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o644)
        _write_all(fd, (self._schema_bytes,))
        if self.fsync:
            os.fsync(fd)
            self._fsync_dir()
        self._fd = fd
        seg = Segment(first, path, len(self._schema_bytes), len(self._schema_bytes))
        self._segments.append(seg)
        self.durable = max(self.durable, first)  # all before ``first`` is in fsynced, closed segments
        return seg

    def drop_active(self) -> None:
        """Close the active segment without writing or fsyncing it: the log holds no batch."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _fsync_dir(self) -> None:
        try:
            dfd = os.open(self.root, os.O_RDONLY)
        except OSError:
            return
        try:
            os.fsync(dfd)
        except OSError:
            pass
        finally:
            os.close(dfd)

    # -- write-behind and durability ------------------------------------------------------------

    def defer_writes(self) -> None:
        """Write-behind (see ``SourceLog.defer_writes``); only where there is an fsync to wait for."""
        self._write_behind = self.fsync

    @property
    def unwritten_bytes(self) -> int:
        return self._queued_bytes - self._written_bytes

    def write_unwritten(self, keep_bytes: int = 0) -> None:
        """See ``SourceLog.write_unwritten``."""
        with self._write_lock:
            if self._write_failed is not None:
                raise self._write_failed
            queue = self._unwritten
            while queue and self._queued_bytes - self._written_bytes > keep_bytes:
                fd, data, length = queue[0]
                try:
                    _write_all(fd, data)
                except OSError as exc:
                    self._write_failed = exc
                    queue.clear()
                    raise
                queue.popleft()
                self._written_bytes += length  # after the write: a sync() that sees it fsyncs it

    def sync(self) -> None:
        """Make every append so far durable (one fsync for the group). Appends may go on meanwhile
        (from another thread); what they add is made durable by the next ``sync()``."""
        with self._sync_lock:
            with self._lock:
                head = self._head()
            # write-behind: everything appended up to ``head`` is written (here, or by a rotation,
            # which fsyncs and closes its segment and moves ``durable`` past it itself)
            self.write_unwritten()
            with self._lock:
                written = self._written_bytes
                dirty = self._dirty or written != self._decided_written
                fd = os.dup(self._fd) if (dirty and self._fd is not None and self.fsync) else None
                self._dirty = False
                self._decided_written = written
            if fd is not None:
                try:
                    os.fsync(fd)  # a duplicate: a rotation may close the active segment's descriptor meanwhile
                except OSError:
                    with self._lock:
                        self._dirty = True  # nothing became durable: the next sync() (close() too) tries again
                    raise
                finally:
                    os.close(fd)
            with self._lock:
                self.durable = max(self.durable, head)

    def durable_head(self, head: int) -> int:
        """Under ``_lock``: the offset below which every message is durable (``head`` without fsync)."""
        return self.durable if self.fsync else head

    def close(self) -> None:
        """Under ``_lock``, after a ``sync()``."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
