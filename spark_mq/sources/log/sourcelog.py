"""The durable source log: message batches as Arrow IPC segments on any pyarrow filesystem.

Responsible for: the public ``SourceLog`` of one source: opening and recovering a location (a torn
tail is detected and cut off, leftover temporary files removed), the index of what the segments
hold (which byte ranges of which segment files hold an offset range, so executors replay exactly
the same bytes; message and body-byte counts), appending record batches (each carrying its
``offset`` column), committing what Spark committed, and one writer per location. Not responsible
for brokers, acks or Spark: see ``spark_mq.sources.ingest``.

The file work goes to the modules beside this one: the segment layout and index entries
(``segments``), Arrow IPC encoding, scanning and reading back (``ipc``), appending on a local
filesystem (``local``: the active segment is appended to and fsynced in groups, the directory too
when a segment is created) or on others (``remote``: appending is not portable, so every append
writes a whole new segment file, durable when the stream closes), deleting committed segments
(``deleter``), and one writer per location (``lock`` locally, ``lease`` elsewhere). On open, every
batch of every segment is read back once: this rebuilds the index (byte position, offsets,
cumulative body sizes) and finds a torn tail, which is cut off (local) or rewritten without the
torn part (other filesystems).

The head (next offset) survives a full commit: the active segment is then replaced by an empty one
named after the head, created before the old one is deleted.
"""

from __future__ import annotations

import bisect
import logging
import threading
from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.fs as pafs

from spark_mq.errors import SparkMqError
from spark_mq.sources.log.deleter import Deleter
from spark_mq.sources.log.ipc import IpcMessages, body_sizes, read_slice, scan_segment
from spark_mq.sources.log.lease import WriterLease
from spark_mq.sources.log.local import LocalSegments
from spark_mq.sources.log.lock import WriterLock
from spark_mq.sources.log.remote import RemoteSegments
from spark_mq.sources.log.segments import (OFFSET_COLUMN, SEGMENT_NAME, TEMP_SUFFIX, Batch, DataLossError,
                                           LogCorruptError, LogSlice, Segment, first_offset, open_filesystem)

__all__ = ["SourceLog"]

log = logging.getLogger("spark_mq.sources.log")


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
        self._messages = IpcMessages(schema)  # under ``_lock``
        self._lock = threading.RLock()
        self._segments: list[Segment] = []  # shared with ``_files``, which adds the segments it creates
        self._bytes = 0  # body bytes appended (recovered ones included) since open: see Batch.before
        self._deleter = Deleter(self._delete)
        # the segment files: appended in place and fsynced (local) or written whole (other filesystems)
        self._files: LocalSegments | RemoteSegments = (
            LocalSegments(self.root, self._schema_bytes, fsync, self._lock, self._segments) if self.local
            else RemoteSegments(self.fs, self.root, self._schema_bytes, self._segments, self._delete))
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

    def _open(self) -> None:
        self.fs.create_dir(self.root, recursive=True)
        infos = self.fs.get_file_info(pafs.FileSelector(self.root, allow_not_found=True))
        names = []
        for info in infos:
            base = info.base_name
            if base.endswith(TEMP_SUFFIX):
                self.fs.delete_file(info.path)  # an unfinished segment write: never published
                continue
            m = SEGMENT_NAME.match(base)
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
        self._files.opened(writer=self._writer is not None)

    def _scan(self, first: int, path: str, last: bool) -> Optional[Segment]:
        with self.fs.open_input_file(path) as f:
            data = f.read()
        seg, torn_at, self._bytes = scan_segment(data, first, path, self.schema, self.location, last=last,
                                                 before=self._bytes)
        if seg is None:
            log.warning("source log %s: dropping torn segment %s (no complete schema)", self.location, path)
            self.fs.delete_file(path)
            self.recovered_truncations += 1
        elif torn_at is not None:
            log.warning("source log %s: torn tail in %s: %d bytes after byte %d cut off",
                        self.location, path, len(data) - torn_at, torn_at)
            self.recovered_truncations += 1
            self._files.truncate(seg, torn_at, data)
        return seg

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
            return self._files.durable_head(self.head)

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
                b = batches[bisect.bisect_right(batches, x, key=first_offset) - 1]
                return b.before + b.sizes[x - b.first]
        return self._bytes

    def _batches_between(self, lo: int, hi: int) -> Iterator[Batch]:
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
            sizes = body_sizes(batch)
            seg, pos = self._files.append(head, data, length, self.segment_bytes)
            seg.batches.append(Batch(head, batch.num_rows, pos, length, sizes, self._bytes))
            self._bytes += sizes[-1]
            return head + batch.num_rows

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
            self._files.defer_writes()

    @property
    def unwritten_bytes(self) -> int:
        """Write-behind: bytes appended but not yet written (held in memory, lost with the process)."""
        return self._files.unwritten_bytes

    def write_unwritten(self, keep_bytes: int = 0) -> None:
        """Write the oldest appended, unwritten messages in order (each to the segment it was
        appended to) until at most ``keep_bytes`` of them wait. A writer thread calls it while
        ``sync()`` waits on the disk, so that a slow fsync delays durability, not the write (what
        is written survives a crash of this process). A failed write is final: what follows it in
        the segment could not be read back in order, so every later call raises the same error and
        nothing more becomes durable (the ingest fails with it; a restart recovers the segment up to
        its last whole message)."""
        self._files.write_unwritten(keep_bytes)

    def sync(self) -> None:
        """Make every append so far durable (one fsync for the group). Appends may go on meanwhile
        (from another thread); what they add is made durable by the next ``sync()``."""
        self._files.sync()

    # -- committing -----------------------------------------------------------------------------

    def commit(self, end: int) -> int:
        """Take every segment whose messages all lie below ``end`` out of the log; returns how many.
        When everything is committed, the active segment is replaced by an empty one at the head.
        Their files are deleted on the log's deleter thread, not here (``wait_deleted``; ``close``
        waits for them; ``deleter`` says why)."""
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
                self._files.start(head)  # created (and fsynced) before the old one goes
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
            self._segments.clear()  # the list ``_files`` shares
            self._files.drop_active()  # nothing unwritten: the log holds no batch
            self._files.start(offset)
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
                    self._files.close()
                finally:
                    self._release_writer()

    def _release_writer(self) -> None:
        if self._writer is not None:
            self._writer.release()
            self._writer = None


