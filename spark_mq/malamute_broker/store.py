"""Optional on-disk mailbox store: messages for offline clients survive a broker restart.

An append-only journal in the configured directory, in segment files ``mailboxes.<n>.journal``
(n rising), of two record kinds, each framed as ``length u32 | crc32 u32 | body``:

- ``S`` seq u64, address (1-byte length string), header (u32 length + bytes), frame count u32,
  then each frame (u32 length + bytes): a message was stored;
- ``D`` seq u64: that message was delivered (or expired).

At start-up every segment is read in order, each up to its first torn or corrupt record; the
still-undelivered messages are returned in order and written to new segments of ``segment_bytes``
(each through a temporary file, fsynced and renamed), and the old segments are deleted; an older
segment found damaged (only the newest can end in a torn write) is logged and kept as
``*.damaged``. While the broker runs,
``flush()`` starts a new segment once the active one holds ``segment_bytes`` (16 MiB), and
deletes the oldest closed segments once nothing in them is undelivered; the undelivered records
of an oldest segment that is at most a quarter undelivered (or of any oldest segment while the
whole journal is) are first copied to the active segment, at most one segment per flush. A flush
never rereads more than one segment, so the broker never stalls for long on its journal: the
journal stays bounded by what is undelivered, not by what was ever stored, and a drained mailbox
costs deletions, not rewrites.

Before the segments (one file, compacted by rewriting it from its undelivered records once 64 MiB
and mostly delivered): draining 2,000,000 stored 100 B mails, that rewrite reread a few hundred MB
in Python and held the broker silent for longer than the source's 0.5 s quiet period in
``bench sources``, which ended the availableNow drain at 1,499,990 of 2,000,000 (and the close lost
what was in flight; see docs/malamute.md). A journal from that version (``mailboxes.journal``)
is read at start-up like the oldest segment.

Records are buffered and written out by ``flush()``, which the broker calls before it answers any
command and at the end of each turn of its loop: a killed broker process loses at most the
records of the turn it was in, which are messages it had taken from ZeroMQ's queue but not
acknowledged in any way, as it would lose those still in the queue (one write per turn instead
of one per record was 35% of the broker's time delivering a stored mailbox). ``fsync=True``
also syncs on each flush (slow, survives power loss). A crash between a copy and the deletion of
the segment it came from leaves two copies of a record: a restart keeps one.
This module does file IO only; it knows nothing of sockets or routing.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import zlib
from pathlib import Path
from typing import Sequence

log = logging.getLogger("spark_mq.malamute_broker.store")

_RECORD = struct.Struct(">II")  # length, crc32 of body
_SEQ = struct.Struct(">BQ")  # kind, seq
_U32 = struct.Struct(">I")
_STORED = ord("S")
_DELIVERED = ord("D")
_DAMAGED = ".damaged"  # a segment found damaged at start-up is kept under its name plus this
LEGACY_JOURNAL = "mailboxes.journal"  # the single-file journal of earlier versions, read as the oldest segment
_SEGMENT = re.compile(r"^mailboxes\.(\d{12})\.journal$")
_BUFFER = 1 << 20
SEGMENT_BYTES = 16 << 20  # a new segment once the active one holds this much
_GARBAGE = 4  # an oldest segment at most 1/_GARBAGE undelivered has its undelivered records moved on


class _Segment:
    __slots__ = ("number", "path", "size", "live", "live_bytes", "stuck")

    def __init__(self, number: int, path: Path, size: int = 0) -> None:
        self.number = number
        self.path = path
        self.size = size                      # bytes, records still buffered included
        self.live: dict[int, tuple[int, int]] = {}  # seq -> (position, size) of undelivered records
        self.live_bytes = 0
        self.stuck = False                    # an undelivered record could not be read back: kept


class MailboxStore:
    def __init__(self, directory: str | os.PathLike, *, fsync: bool = False,
                 segment_bytes: int = SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fsync = fsync
        self.segment_bytes = segment_bytes
        self._next_seq = 1
        self._file = None
        self._unflushed = False
        self._segments: list[_Segment] = []  # oldest first; the last one is written to
        self._where: dict[int, _Segment] = {}  # seq of an undelivered message -> its segment
        self.relocations = 0  # segments whose undelivered records were moved on
        self.deleted = 0      # segments deleted while running

    # ------------------------------------------------------------ files

    def _path(self, number: int) -> Path:
        return self.directory / f"mailboxes.{number:012d}.journal"

    def _files(self) -> list[tuple[int, Path]]:
        """Journal files, oldest first (the legacy single file before every segment)."""
        out = []
        for entry in self.directory.iterdir():
            m = _SEGMENT.match(entry.name)
            if m:
                out.append((int(m.group(1)), entry))
            elif entry.name == LEGACY_JOURNAL:
                out.append((-1, entry))
        return sorted(out)

    @property
    def paths(self) -> list[Path]:
        """The segment files, oldest first."""
        return [seg.path for seg in self._segments]

    @property
    def journal_bytes(self) -> int:
        return sum(seg.size for seg in self._segments)

    # ------------------------------------------------------------ loading

    def load(self) -> list[tuple[int, str, bytes, list[bytes]]]:
        """Undelivered messages as (seq, address, header, content), oldest first; the journal is
        rewritten as segments of ``segment_bytes`` holding only those."""
        if self._file is not None:
            self._file.close()
            self._file = None
        self._where = {}
        for leftover in self.directory.glob("mailboxes.*.tmp"):
            leftover.unlink()
        files = self._files()
        live: dict[int, tuple[str, bytes, list[bytes]]] = {}
        damaged = []
        for i, (_, path) in enumerate(files):
            data = path.read_bytes()
            good = self._read(data, live)
            if good < len(data) and i < len(files) - 1:
                # only the newest segment can end in a torn write: an older one was whole (flushed,
                # fsynced) before the next began, so this is damage, and what follows it is unread
                log.warning("mailbox journal %s is damaged at byte %d of %d: its records after that are "
                            "lost; the file is kept as %s", path, good, len(data), path.name + _DAMAGED)
                damaged.append(path)
        messages = [(seq, *live[seq]) for seq in sorted(live)]
        number = max([n for n, _ in files] + [0]) + 1
        # the undelivered records, in segments of ``segment_bytes`` like a running journal's (one
        # segment of a whole backlog would be reread whole once mostly delivered: a broker stall);
        # each written to a temporary file, then all renamed in order: a crash before the old files
        # are gone reads them again (records merge by seq), never a half-written segment
        segments = [_Segment(number, self._path(number))]
        out = open(segments[0].path.with_suffix(".tmp"), "wb")
        try:
            for seq, address, header, content in messages:
                seg = segments[-1]
                if seg.size >= self.segment_bytes:
                    self._close_fsynced(out)
                    seg = _Segment(seg.number + 1, self._path(seg.number + 1))
                    segments.append(seg)
                    out = open(seg.path.with_suffix(".tmp"), "wb")
                record = self._record(self._stored_body(seq, address, header, content))
                out.write(record)
                self._keep(seg, seq, seg.size, len(record))
                seg.size += len(record)
        finally:
            self._close_fsynced(out)
        for seg in segments:
            os.replace(seg.path.with_suffix(".tmp"), seg.path)
        self._fsync_dir()
        for _, path in files:  # all older than the new segment: a crash before this reads them first
            if path in damaged:
                path.rename(path.with_name(path.name + _DAMAGED))  # for whoever can mend it; never read again
            else:
                path.unlink()
        self._segments = segments
        self._file = open(segments[-1].path, "ab", buffering=_BUFFER)
        return messages

    @staticmethod
    def _close_fsynced(out) -> None:
        try:
            out.flush()
            os.fsync(out.fileno())
        finally:
            out.close()

    def _read(self, data: bytes, live: dict) -> int:
        """Apply the records of ``data`` to ``live``; returns the byte offset where reading stopped
        (``len(data)`` when every record was whole)."""
        offset = 0
        while offset + _RECORD.size <= len(data):
            length, crc = _RECORD.unpack_from(data, offset)
            start = offset + _RECORD.size
            body = data[start:start + length]
            if len(body) != length or zlib.crc32(body) != crc or length < _SEQ.size:
                return offset  # torn write at the tail (or damage): everything before it is good
            kind, seq = _SEQ.unpack_from(body, 0)
            if kind == _STORED:
                live[seq] = self._parse_stored(body)
            elif kind == _DELIVERED:
                live.pop(seq, None)
            self._next_seq = max(self._next_seq, seq + 1)
            offset = start + length
        return offset

    def _fsync_dir(self) -> None:
        """A new or renamed segment is durable only once the directory is."""
        if not self.fsync:
            return
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    @staticmethod
    def _parse_stored(body: bytes) -> tuple[str, bytes, list[bytes]]:
        offset = _SEQ.size
        size = body[offset]
        address = body[offset + 1:offset + 1 + size].decode("utf-8", "surrogateescape")
        offset += 1 + size
        (hlen,) = _U32.unpack_from(body, offset)
        offset += 4
        header = body[offset:offset + hlen]
        offset += hlen
        (count,) = _U32.unpack_from(body, offset)
        offset += 4
        content = []
        for _ in range(count):
            (flen,) = _U32.unpack_from(body, offset)
            offset += 4
            content.append(body[offset:offset + flen])
            offset += flen
        return address, header, content

    # ------------------------------------------------------------ writing

    @staticmethod
    def _record(body: bytes) -> bytes:
        return _RECORD.pack(len(body), zlib.crc32(body)) + body

    @staticmethod
    def _stored_body(seq: int, address: str, header: bytes, content: Sequence[bytes]) -> bytes:
        raw = address.encode("utf-8", "surrogateescape")
        parts = [_SEQ.pack(_STORED, seq), bytes((len(raw),)), raw, _U32.pack(len(header)), bytes(header),
                 _U32.pack(len(content))]
        for frame in content:
            frame = bytes(frame)
            parts.append(_U32.pack(len(frame)))
            parts.append(frame)
        return b"".join(parts)

    def _keep(self, seg: _Segment, seq: int, pos: int, size: int) -> None:
        seg.live[seq] = (pos, size)
        seg.live_bytes += size
        self._where[seq] = seg

    def _write(self, record: bytes) -> int:
        """Append ``record`` to the active segment (buffered); returns its position there."""
        if self._file is None:
            self.load()
        seg = self._segments[-1]
        pos = seg.size
        self._file.write(record)
        seg.size += len(record)
        self._unflushed = True
        return pos

    def append(self, address: str, header: bytes, content: Sequence[bytes]) -> int:
        seq = self._next_seq
        self._next_seq += 1
        record = self._record(self._stored_body(seq, address, header, content))
        pos = self._write(record)
        self._keep(self._segments[-1], seq, pos, len(record))
        return seq

    def delivered(self, seq: int) -> None:
        self._write(self._record(_SEQ.pack(_DELIVERED, seq)))
        seg = self._where.pop(seq, None)
        if seg is not None:
            _, size = seg.live.pop(seq)
            seg.live_bytes -= size

    def flush(self) -> None:
        """Write the buffered records out to the OS (and sync them with ``fsync=True``); start a new
        segment when the active one is full; delete what is all delivered (see the module)."""
        if not self._unflushed:
            return
        self._sync()
        if self._segments[-1].size >= self.segment_bytes:
            self._roll()
        self._collect()

    def _sync(self) -> None:
        self._unflushed = False
        self._file.flush()
        if self.fsync:
            os.fsync(self._file.fileno())

    def _roll(self) -> None:
        self._file.close()
        number = self._segments[-1].number + 1
        seg = _Segment(number, self._path(number))
        self._file = open(seg.path, "ab", buffering=_BUFFER)
        self._fsync_dir()
        self._segments.append(seg)

    def _collect(self) -> None:
        """Delete the oldest closed segments while nothing in them is undelivered, in order (a
        segment's ``D`` records may name messages of older ones, never of newer ones). An oldest
        segment still holding undelivered records has them copied to the active segment first
        when it is mostly delivered, or the journal as a whole is: once per flush."""
        segs = self._segments
        moved = False
        while len(segs) > 1:
            oldest = segs[0]
            if oldest.live:
                if moved or oldest.stuck:
                    return
                total = self.journal_bytes
                live = sum(seg.live_bytes for seg in segs)
                if oldest.live_bytes * _GARBAGE > oldest.size and live * _GARBAGE > total:
                    return
                if not self._relocate(oldest):
                    return
                moved = True
            try:
                oldest.path.unlink()
            except FileNotFoundError:
                pass
            segs.pop(0)
            self.deleted += 1

    def _relocate(self, seg: _Segment) -> bool:
        """Copy ``seg``'s undelivered records, read back by position and checked, to the active
        segment, and make the copies durable as the journal is. False (and ``seg`` kept as it is
        from now on, with a warning) if one cannot be read back."""
        records: list[tuple[int, bytes]] = []
        try:
            with open(seg.path, "rb") as f:
                for seq, (pos, size) in sorted(seg.live.items()):
                    f.seek(pos)
                    record = f.read(size)
                    if not self._is_stored(record, seq):
                        raise ValueError(f"the record of message {seq} at byte {pos} is damaged")
                    records.append((seq, record))
        except (OSError, ValueError) as exc:
            seg.stuck = True
            log.warning("mailbox journal %s: %s; the segment is kept as it is", seg.path, exc)
            return False
        active = self._segments[-1]
        for seq, record in records:
            self._keep(active, seq, self._write(record), len(record))
        seg.live.clear()
        seg.live_bytes = 0
        self._sync()  # the copies are in the journal before the segment they come from goes
        self.relocations += 1
        return True

    @staticmethod
    def _is_stored(record: bytes, seq: int) -> bool:
        if len(record) < _RECORD.size + _SEQ.size:
            return False
        length, crc = _RECORD.unpack_from(record, 0)
        body = record[_RECORD.size:]
        return length == len(body) and zlib.crc32(body) == crc and _SEQ.unpack_from(body, 0) == (_STORED, seq)

    def close(self) -> None:
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = None
