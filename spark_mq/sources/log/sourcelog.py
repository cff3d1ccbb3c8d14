"""The durable source log: message batches as Arrow IPC segments on any pyarrow filesystem.

Responsible for: appending record batches (each carrying its ``offset`` column) durably, grouped
fsyncs, recovering after a crash (a torn tail is detected and truncated; leftover temporary files
removed), telling which byte ranges of which segment files hold an offset range (so executors can
replay exactly the same bytes), deleting what Spark committed, and reading those ranges back.
Not responsible for brokers, acks or Spark: see ``spark_mq.sources.ingest``.

Layout under the location (a local path, ``file://`` URI, or any pyarrow filesystem URI)::

    seg-00000000000000000000.arrow   first offset 0: the schema message, then batch messages
    seg-00000000000000120000.arrow   first offset 120000 ...

A segment is an Arrow IPC *stream* without end marker: the schema message, then one record batch
message per append. Offsets are contiguous message positions from 0; a segment's name is its
first offset, and it holds the offsets up to the next segment's first. On a local filesystem the
active segment is appended to and fsynced (the directory too when a segment is created); on other
filesystems, where appending is not portable, every append writes a whole new segment file
(durable when the stream closes). On open, every batch of every segment is read back once: this
rebuilds the index (byte position, offsets, cumulative body sizes) and finds a torn tail, which
is cut off (local) or rewritten without the torn part (other filesystems).

The head (next offset) survives a full commit: the active segment is then replaced by an empty one
named after the head, created before the old one is deleted.
"""

from __future__ import annotations

import bisect
import logging
import os
import re
import threading
from array import array
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.fs as pafs

from spark_mq.errors import SparkMqError
from spark_mq.sources.log.lease import LogInUseError, WriterLease

__all__ = ["SourceLog", "LogSlice", "LogCorruptError", "DataLossError", "LogInUseError", "WriterLock",
           "open_filesystem", "read_slice", "SEGMENT_PREFIX"]

log = logging.getLogger("spark_mq.sources.log")

SEGMENT_PREFIX = "seg-"
SEGMENT_SUFFIX = ".arrow"
TEMP_SUFFIX = ".tmp"
_SEGMENT_NAME = re.compile(r"^seg-(\d{20})\.arrow$")
OFFSET_COLUMN = "offset"
BODY_COLUMN = "body"


class LogCorruptError(SparkMqError):
    """A segment other than the last is damaged, or segments do not follow each other."""


class DataLossError(SparkMqError):
    """Log data needed for a batch is gone (deleted, or the location was changed or wiped)."""


LOCK_NAME = "writer.lock"


class WriterLock:
    """One writer per local log: an exclusive ``flock`` on ``<log>/writer.lock``, taken before the
    log is opened (opening recovers a torn tail, which would cut into another writer's appends).

    The kernel drops the lock when its holder exits, however it exits (a killed query's reader
    process included), so a restart waits at most until its predecessor is gone (``wait``
    seconds, then ``LogInUseError`` naming the location and the holder). The holder's pid, host
    and start time are written into the file for that message only; the lock is the ``flock``.
    Other filesystems have no such lock: there a ``WriterLease`` (``spark_mq.sources.log.lease``) does
    what a renewed file can.
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


def segment_name(first: int) -> str:
    return f"{SEGMENT_PREFIX}{first:020d}{SEGMENT_SUFFIX}"


def open_filesystem(location: str) -> tuple[pafs.FileSystem, str, bool]:
    """``(filesystem, root path, is_local)`` for a local path or filesystem URI."""
    if "://" not in location:
        return pafs.LocalFileSystem(), os.path.abspath(location), True
    fs, path = pafs.FileSystem.from_uri(location)
    return fs, path, isinstance(fs, pafs.LocalFileSystem)


@dataclass
class _Batch:
    first: int          # offset of its first message
    count: int
    pos: int            # byte position of the message in the segment file
    length: int         # bytes of the message (metadata + body)
    sizes: array        # cumulative body sizes, len count+1, sizes[0] == 0
    before: int = 0     # body bytes appended to the log before this batch (a running count since open)

    @property
    def end(self) -> int:
        return self.first + self.count


@dataclass
class _Segment:
    first: int
    path: str
    schema_len: int
    size: int                      # bytes written (valid prefix)
    batches: list = field(default_factory=list)

    @property
    def end(self) -> int:
        return self.batches[-1].end if self.batches else self.first


@dataclass(frozen=True)
class LogSlice:
    """What an executor needs to read ``[lo, hi)``: one segment's schema length and batch byte ranges.
    Picklable; holds no handles."""

    location: str
    path: str
    schema_len: int
    pieces: tuple  # ((pos, length, first_offset, count), ...)
    lo: int
    hi: int


def _first_offset(batch: _Batch) -> int:
    return batch.first


def _body_sizes(batch: pa.RecordBatch) -> array:
    body = batch.column(batch.schema.get_field_index(BODY_COLUMN))
    sizes = array("i")
    buf = body.buffers()[1]  # int32 value offsets, n+1 of them from the array's own offset
    start = body.offset * 4
    sizes.frombytes(memoryview(buf)[start:start + 4 * (len(body) + 1)])
    base = sizes[0] if sizes else 0
    if base:
        sizes = array("i", (s - base for s in sizes))
    if not sizes:
        sizes = array("i", [0])
    return sizes


class _Deleter:
    """Deletes files on a thread of its own, oldest first; the thread ends whenever none is left.

    Oldest first, and nothing more after a failure: whatever a crash or an error leaves behind is
    then the oldest end of the log, which a reopened log takes as committed messages still held,
    never a gap (``_open`` refuses gaps). The failure is raised by ``check`` (at the log's next
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


class SourceLog:
    """The log of one source (one query). Thread-safe: one appender, any number of other callers."""

    def __init__(self, location: str, schema: pa.Schema, *, fsync: bool = True,
                 segment_bytes: int = 64 << 20, local: Optional[bool] = None,
                 exclusive_wait: Optional[float] = None) -> None:
        """``exclusive_wait``: take the ``WriterLock`` (local logs) or ``WriterLease`` (other
        filesystems), waiting up to that many seconds for another writer to go; ``None`` (readers,
        tests): neither."""
        self.location = location
        self.schema = schema
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self.fs, self.root, is_local = open_filesystem(location)
        self.local = is_local if local is None else (local and is_local)
        self._schema_bytes = schema.serialize().to_pybytes()
        self._messages = _IpcMessages(schema)  # under ``_lock``
        self._lock = threading.RLock()
        self._segments: list[_Segment] = []
        self._bytes = 0  # body bytes appended (recovered ones included) since open: see _Batch.before
        self._fd: Optional[int] = None     # local: the active segment, open for append
        self._dirty = False
        # local, fsync: the head the last finished fsync covered (what Spark may plan); fsyncs take
        # ``_sync_lock`` first and hold ``_lock`` only around their bookkeeping, so Spark's calls
        # (slices, byte counts, commits) and appends go on while one waits on the disk
        self._sync_lock = threading.Lock()
        self._durable = 0
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
        self._deleter = _Deleter(self._delete)
        self.recovered_truncations = 0
        self._writer: Optional[WriterLock | WriterLease] = None
        if exclusive_wait is not None:
            self.fs.create_dir(self.root, recursive=True)
            if self.local:
                self._writer = WriterLock(self.root, location, exclusive_wait)
            else:
                self._writer = WriterLease(self.fs, self.root, location, exclusive_wait)
        try:
            self._open()
        except BaseException:
            self._release_writer()
            raise

    # -- opening and recovery ------------------------------------------------------------------

    def _path(self, name: str) -> str:
        return f"{self.root.rstrip('/')}/{name}"

    def _open(self) -> None:
        self.fs.create_dir(self.root, recursive=True)
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        names = []
        for info in infos:
            base = info.base_name
            if base.endswith(TEMP_SUFFIX):
                self.fs.delete_file(info.path)  # an unfinished segment write: never published
                continue
            m = _SEGMENT_NAME.match(base)
            if m and info.type == pafs.FileType.File:
                names.append((int(m.group(1)), info.path))
        names.sort()
        for i, (first, path) in enumerate(names):
            seg = self._scan(first, path, last=(i == len(names) - 1))
            if seg is None:
                continue
            if self._segments and self._segments[-1].end != seg.first:
                prev = self._segments[-1]
                if prev.end > seg.first:
                    raise LogCorruptError(f"log {self.location}: segment {path} starts at {seg.first} but the "
                                          f"previous one ends at {prev.end}")
                # a gap: messages deleted in the middle cannot happen; tolerate only an empty prev
                if prev.batches:
                    raise LogCorruptError(f"log {self.location}: offsets {prev.end}..{seg.first} are missing "
                                          f"between segments")
            self._segments.append(seg)
        if self.local and self._segments:
            self._fd = os.open(self._segments[-1].path, os.O_WRONLY | os.O_APPEND)
            if self.fsync and self._writer is not None:  # the writer's open, not a reader's or a test's
                os.fsync(self._fd)  # what a crashed writer appended but never fsynced: durable now
        self._durable = self.head

    def _scan(self, first: int, path: str, last: bool) -> Optional[_Segment]:
        with self.fs.open_input_file(path) as f:
            data = f.read()
        reader = pa.BufferReader(pa.py_buffer(data))
        try:
            msg = pa.ipc.read_message(reader)
            schema = pa.ipc.read_schema(msg)
        except (EOFError, pa.ArrowInvalid, OSError) as exc:
            if not last:
                raise LogCorruptError(f"log {self.location}: segment {path} has no readable schema: {exc}") from exc
            log.warning("source log %s: dropping torn segment %s (no complete schema)", self.location, path)
            self.fs.delete_file(path)
            self.recovered_truncations += 1
            return None
        if not schema.equals(self.schema):
            raise LogCorruptError(f"log {self.location}: segment {path} has another schema; the location must "
                                  f"belong to one source of one format")
        seg = _Segment(first, path, reader.tell(), reader.tell())
        expected = first
        while True:
            pos = reader.tell()
            if pos == len(data):
                break
            try:
                msg = pa.ipc.read_message(reader)
                batch = pa.ipc.read_record_batch(msg, schema)
            except EOFError:
                break
            except (pa.ArrowInvalid, OSError) as exc:
                if not last:
                    raise LogCorruptError(f"log {self.location}: segment {path} is damaged at byte {pos}: {exc}") \
                        from exc
                self._truncate(seg, pos, len(data), data)
                break
            offsets = batch.column(batch.schema.get_field_index(OFFSET_COLUMN))
            if batch.num_rows == 0 or offsets[0].as_py() != expected:
                raise LogCorruptError(f"log {self.location}: segment {path} batch at byte {pos} starts at offset "
                                      f"{offsets[0].as_py() if batch.num_rows else None}, expected {expected}")
            sizes = _body_sizes(batch)
            seg.batches.append(_Batch(expected, batch.num_rows, pos, reader.tell() - pos, sizes, self._bytes))
            self._bytes += sizes[-1]
            expected += batch.num_rows
            seg.size = reader.tell()
        return seg

    def _truncate(self, seg: _Segment, good: int, size: int, data: bytes) -> None:
        log.warning("source log %s: torn tail in %s: %d bytes after byte %d cut off",
                    self.location, seg.path, size - good, good)
        self.recovered_truncations += 1
        if self.local:
            os.truncate(seg.path, good)
            fd = os.open(seg.path, os.O_WRONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            self._write_whole(seg.path, data[:good])

    def _write_whole(self, path: str, data: bytes) -> None:
        tmp = path + TEMP_SUFFIX
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        self.fs.move(tmp, path)

    # -- state ----------------------------------------------------------------------------------

    @property
    def head(self) -> int:
        """The next offset to be appended."""
        with self._lock:
            return self._segments[-1].end if self._segments else 0

    @property
    def durable_head(self) -> int:
        """The offset below which every message is durable: ``head`` once ``sync()`` has returned;
        ``head`` at once where appends are durable when written (other filesystems, fsync off)."""
        with self._lock:
            return self._durable if self.local and self.fsync else self.head

    @property
    def tail(self) -> int:
        """The first offset still held (== head when the log holds nothing)."""
        with self._lock:
            for seg in self._segments:
                if seg.batches:
                    return seg.batches[0].first
            return self.head

    def segment_paths(self) -> list[str]:
        with self._lock:
            return [s.path for s in self._segments]

    def stats(self, start: int) -> tuple[int, int]:
        """(messages, body bytes) held at or after ``start``."""
        with self._lock:
            head = self.head
            start = max(start, self.tail)
            if start >= head:
                return 0, 0
            return head - start, self.body_bytes(start, head)

    def body_bytes(self, lo: int, hi: int) -> int:
        """Body bytes of the messages held in ``[lo, hi)``. Asked at every group (the log bound) and
        every availableNow check, so it costs a search, not a walk over every batch held."""
        if hi <= lo:
            return 0
        with self._lock:
            return self._bytes_before(hi) - self._bytes_before(lo)

    def _bytes_before(self, x: int) -> int:
        """The running body-byte count at offset ``x`` (clamped to the messages held)."""
        for seg in self._segments:  # a few: each holds up to segment_bytes
            if seg.batches and x < seg.end:
                batches = seg.batches
                if x <= batches[0].first:
                    return batches[0].before
                b = batches[bisect.bisect_right(batches, x, key=_first_offset) - 1]
                return b.before + b.sizes[x - b.first]
        return self._bytes

    def _batches_between(self, lo: int, hi: int) -> Iterator[_Batch]:
        for seg in self._segments:
            if seg.end <= lo or seg.first >= hi:
                continue
            for b in seg.batches:
                if b.end > lo and b.first < hi:
                    yield b

    def limit_bytes(self, start: int, end: int, max_bytes: int) -> int:
        """The largest ``e`` in (start, end] whose bodies from ``start`` fit ``max_bytes`` (at least start+1)."""
        with self._lock:
            budget = max_bytes
            for b in self._batches_between(start, end):
                a = max(start, b.first) - b.first
                z = min(end, b.end) - b.first
                used = b.sizes[z] - b.sizes[a]
                if used <= budget:
                    budget -= used
                    continue
                # the first k in (a, z] with sizes[k] - sizes[a] > budget
                k = bisect.bisect_right(b.sizes, b.sizes[a] + budget, a, z + 1)
                return max(start + 1, b.first + k - 1)
            return end

    # -- appending ------------------------------------------------------------------------------

    def append(self, batch: pa.RecordBatch) -> int:
        """Append a batch whose ``offset`` column starts at ``head`` (checked); returns the new head.
        Durable after ``sync()`` (local) or at once (other filesystems)."""
        if batch.num_rows == 0:
            return self.head
        if self._writer is not None:
            self._writer.check()  # another reader took the log over: write nothing more
        with self._lock:
            head = self.head
            first = batch.column(batch.schema.get_field_index(OFFSET_COLUMN))[0].as_py()
            if first != head:
                raise SparkMqError(f"append at offset {first} but the log head is {head}")
            if not batch.schema.equals(self.schema):
                raise SparkMqError("append with a schema other than the log's")
            data, length = self._messages.message(batch)  # the batch's own buffers, not a copy
            sizes = _body_sizes(batch)
            if self.local:
                seg = self._segments[-1] if self._segments else None
                if seg is None or seg.size >= self.segment_bytes:
                    seg = self._new_segment(head)
                if self._write_behind:
                    self._unwritten.append((self._fd, data, length))
                    self._queued_bytes += length
                else:
                    _write_all(self._fd, data)
                    self._dirty = True
                pos = seg.size
                seg.size += length
            else:
                name = segment_name(head)
                seg = _Segment(head, self._path(name), len(self._schema_bytes), len(self._schema_bytes))
                pos = seg.size
                self._drop_empty_tail(seg.path)
                self._write_whole(seg.path, b"".join((self._schema_bytes, *data)))
                seg.size += length
                self._segments.append(seg)
            seg.batches.append(_Batch(head, batch.num_rows, pos, length, sizes, self._bytes))
            self._bytes += sizes[-1]
            return head + batch.num_rows

    def _drop_empty_tail(self, new_path: str) -> None:
        """Other filesystems: an empty head-marker segment is superseded by the next append (which
        usually has the same name and overwrites it)."""
        if self._segments and not self._segments[-1].batches:
            old = self._segments.pop()
            if old.path != new_path:
                self._delete(old.path)

    def _new_segment(self, first: int) -> _Segment:
        """Local: close the active segment (fsynced), create and fsync a new one. Under ``_lock``:
        the active segment is fsynced here, not through ``sync()`` (which takes ``_sync_lock`` first)."""
        if self._fd is not None:
            self.write_unwritten()  # what was appended to this segment goes in before it is closed
            if self.fsync:
                # always, not only when ``_dirty``: a ``sync()`` on another thread clears ``_dirty``
                # before its fsync returns, and ``_durable`` moves past this segment below; an fsync
                # of a clean file returns at once, one waits for the other's writeback
                os.fsync(self._fd)
            self._dirty = False
            os.close(self._fd)
            self._fd = None
        path = self._path(segment_name(first))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o644)
        _write_all(fd, (self._schema_bytes,))
        if self.fsync:
            os.fsync(fd)
            self._fsync_dir()
        self._fd = fd
        seg = _Segment(first, path, len(self._schema_bytes), len(self._schema_bytes))
        self._segments.append(seg)
        self._durable = max(self._durable, first)  # all before ``first`` is in fsynced, closed segments
        return seg

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

    def defer_writes(self) -> None:
        """Write-behind, for a local fsynced log whose ``sync()`` runs in a thread of its own (the
        ingest's flusher): ``append`` only books the batch (its IPC message's parts), and ``sync()`` writes
        what was appended before its fsync. The appending thread then goes on with the next group
        while the flusher's thread spends the kernel's copy into the page cache (``os.write`` of
        1 MiB groups of 4 KiB bodies: about a sixth of the ingest thread's busy time, ``py-spy``).
        Another thread (the ingest flusher's writer) may write them as they come
        (``write_unwritten``) while a ``sync()`` waits on the disk. What is appended but not yet
        written is never planned: ``durable_head`` moves only after the fsync of a ``sync()`` that
        began after it was appended."""
        with self._lock:
            self._write_behind = self.local and self.fsync

    @property
    def unwritten_bytes(self) -> int:
        """Write-behind: bytes appended but not yet written (held in memory, lost with the process)."""
        return self._queued_bytes - self._written_bytes

    def write_unwritten(self, keep_bytes: int = 0) -> None:
        """Write the oldest appended, unwritten messages in order (each to the segment it was
        appended to) until at most ``keep_bytes`` of them wait. A writer thread calls it while
        ``sync()`` waits on the disk, so that a slow fsync delays durability, not the write (what
        is written survives a crash of this process). A failed write is final: what follows it in
        the segment could not be read back in order, so every later call raises the same error and
        nothing more becomes durable (the ingest fails with it; a restart recovers the segment up to
        its last whole message)."""
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
                head = self.head
            # write-behind: everything appended up to ``head`` is written (here, or by a rotation,
            # which fsyncs and closes its segment and moves ``_durable`` past it itself)
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
                self._durable = max(self._durable, head)

    # -- committing -----------------------------------------------------------------------------

    def commit(self, end: int) -> int:
        """Take every segment whose messages all lie below ``end`` out of the log; returns how many.
        When everything is committed, the active segment is replaced by an empty one at the head.
        Their files are deleted on the log's deleter thread, not here (``wait_deleted``; ``close``
        waits for them): Spark commits from its planning path (``latestOffset``), and deleting 512
        MiB of fsynced 64 MiB segments on ext4 blocked for 0.13-0.22 s (measured, 22-30 ms of it
        CPU), with Spark and the ingest both waiting on it at every micro-batch."""
        doomed = []
        with self._lock:
            if self._writer is not None:
                self._writer.check()  # what is below ``end`` is another reader's business now
            self._deleter.check()
            head = self.head
            while len(self._segments) > 1 and self._segments[0].end <= end and self._segments[1].first <= end:
                doomed.append(self._segments.pop(0).path)
            if len(self._segments) == 1 and self._segments[0].batches and end >= head:
                old = self._segments[0]
                if self.local:
                    self._new_segment(head)  # created (and fsynced) before the old one goes
                else:
                    marker = _Segment(head, self._path(segment_name(head)), len(self._schema_bytes),
                                      len(self._schema_bytes))
                    self._write_whole(marker.path, self._schema_bytes)
                    self._segments.append(marker)
                self._segments.remove(old)
                doomed.append(old.path)
            # Under the lock, so that two commits hand their segments over in the log's order. Every
            # name here belonged to a segment that held messages, and a new segment is named by its
            # first offset, which is past them all: no file created later can be one of these.
            self._deleter.put(doomed)
        return len(doomed)

    def wait_deleted(self, timeout: Optional[float] = None) -> bool:
        """Wait until the files of every segment committed so far are deleted (False: timed out)."""
        return self._deleter.wait(timeout)

    def fast_forward(self, offset: int) -> None:
        """An empty log (wiped, or a new location for an old checkpoint) continues at ``offset``."""
        with self._lock:
            if self.head >= offset:
                return
            if self._writer is not None:
                self._writer.check()
            if any(s.batches for s in self._segments):
                raise DataLossError(f"log {self.location} ends at {self.head} but Spark resumes at {offset}")
            old = list(self._segments)
            self._segments = []
            if self.local:
                if self._fd is not None:
                    os.close(self._fd)  # nothing unwritten: the log holds no batch
                    self._fd = None
                self._new_segment(offset)
            else:
                marker = _Segment(offset, self._path(segment_name(offset)), len(self._schema_bytes),
                                  len(self._schema_bytes))
                self._write_whole(marker.path, self._schema_bytes)
                self._segments.append(marker)
            for seg in old:
                self._delete(seg.path)

    def _delete(self, path: str) -> None:
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass

    # -- reading --------------------------------------------------------------------------------

    def slices(self, lo: int, hi: int) -> list[LogSlice]:
        """Per-segment byte ranges holding ``[lo, hi)`` (only what the log still has)."""
        out = []
        with self._lock:
            for seg in self._segments:
                if seg.end <= lo or seg.first >= hi:
                    continue
                pieces = tuple((b.pos, b.length, b.first, b.count) for b in seg.batches if b.end > lo and b.first < hi)
                if pieces:
                    out.append(LogSlice(self.location, seg.path, seg.schema_len, pieces,
                                        max(lo, pieces[0][2]), min(hi, pieces[-1][2] + pieces[-1][3])))
        return out

    def read(self, lo: int, hi: int) -> Iterator[pa.RecordBatch]:
        for s in self.slices(lo, hi):
            yield from read_slice(s, fs=self.fs)

    def close(self) -> None:
        try:
            self.sync()
        finally:
            self._deleter.wait()  # a log opened after this one sees no committed segment
            with self._lock:
                try:
                    if self._fd is not None:
                        os.close(self._fd)
                        self._fd = None
                finally:
                    self._release_writer()

    def _release_writer(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None


_FS_CACHE: dict = {}


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


class _IpcMessages:
    """Record batches as the parts of their Arrow IPC stream message, without copying them.

    ``batch.serialize()`` copies every buffer of the batch into one new buffer, which the log then
    copies again into the file. Arrow's stream writer instead hands its sink each buffer of the
    batch as it is (a ``pa.Buffer`` over the batch's own memory: for Malamute the body column's data
    is the receive path's buffer) between the small pieces it makes (the message's metadata,
    padding), and the log writes those parts with one ``writev``. The parts hold the batch's memory
    until they are written. The bytes are those of ``batch.serialize()`` (a unit test holds them
    to it). Measured (docs/performance.md): 1 MiB groups of 4 KiB bodies took 340 us of CPU per group
    to append and write against 400 with the copy (whole source runs: within the machine's
    noise). Not thread-safe.
    """

    closed = False  # the file-object protocol Arrow's ``PythonFile`` asks for

    def __init__(self, schema: pa.Schema) -> None:
        self._parts: list = []
        self._writer = pa.ipc.new_stream(pa.PythonFile(self, mode="w"), schema)
        # the stream's schema message goes out with its first batch: an empty one, dropped with it
        self._writer.write_batch(pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema))
        self._parts = []

    def write(self, data) -> int:
        self._parts.append(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def message(self, batch: pa.RecordBatch) -> tuple[list, int]:
        """``batch``'s IPC message as ``(parts, length in bytes)``."""
        self._writer.write_batch(batch)
        parts, self._parts = self._parts, []
        return parts, sum(map(len, parts))


def read_slice(s: LogSlice, fs: Optional[pafs.FileSystem] = None) -> Iterator[pa.RecordBatch]:
    """The record batches of ``s``, cut to ``[s.lo, s.hi)``: the bytes the log wrote, read back.
    Raises ``FileNotFoundError`` when the segment is gone.

    One read per batch message, decoded in place: a batch's buffers are slices of the bytes read
    (no copy into Python bytes, no joining of the slice into one buffer), and only the batch being
    handed over is held, not the whole slice (up to ``segmentBytes``)."""
    if fs is None:
        fs = _FS_CACHE.get(s.location)
        if fs is None:
            fs = _FS_CACHE[s.location] = open_filesystem(s.location)[0]
    with fs.open_input_file(s.path) as f:
        schema = pa.ipc.read_schema(pa.ipc.read_message(f.read_at(s.schema_len, 0)))
        for pos, length, first, count in s.pieces:
            batch = pa.ipc.read_record_batch(pa.ipc.read_message(f.read_at(length, pos)), schema)
            a = max(s.lo, first) - first
            z = min(s.hi, first + count) - first
            if a == 0 and z == count:
                yield batch
            elif z > a:
                yield batch.slice(a, z - a)
