"""Optional on-disk mailbox store: messages for offline clients survive a broker restart.

An append-only journal (``mailboxes.journal`` in the configured directory) of two record kinds,
each framed as ``length u32 | crc32 u32 | body``:

- ``S`` seq u64, address (1-byte length string), header (u32 length + bytes), frame count u32,
  then each frame (u32 length + bytes): a message was stored;
- ``D`` seq u64: that message was delivered (or expired).

At start-up the journal is read up to the first torn or corrupt record, the still-undelivered
messages are returned in order, and the journal is rewritten with only those (compaction). While
the broker runs, ``flush()`` compacts the same way once the journal holds at least
``compact_bytes`` (64 MiB) and at most a quarter of it is still undelivered: emptied when nothing
is, else rewritten from the undelivered records (read back from the journal itself), written to a
temporary file, fsynced and renamed over the journal, so a crash leaves the old journal or the new
one. Without it the journal of a long-running broker grew by every message ever stored. (Seen
before it: ``bench ingest`` with a journaling broker failed twice after a few GB of preloaded
mailbox mail, a preload's PING unanswered for 60 s; without the journal it ran through. That the
journal's growth was the cause is likely, not proven.) Records are buffered and written out by
``flush()``, which the broker calls before it answers any command and at the end of each turn
of its loop: a killed broker process loses at most the records of the turn it was in, which
are messages it had taken from ZeroMQ's queue but not acknowledged in any way, as it would
lose those still in the queue (one write per turn instead of one per record was 35% of the
broker's time delivering a stored mailbox). ``fsync=True`` also syncs on each flush (slow,
survives power loss).
This module does file IO only; it knows nothing of sockets or routing.
"""

from __future__ import annotations

import logging
import os
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
JOURNAL = "mailboxes.journal"
_BUFFER = 1 << 20
COMPACT_BYTES = 64 << 20  # a running journal is compacted once at least this large ...
_GARBAGE = 4  # ... and at most 1/_GARBAGE of it is undelivered records


class MailboxStore:
    def __init__(self, directory: str | os.PathLike, *, fsync: bool = False, compact_bytes: int = COMPACT_BYTES) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / JOURNAL
        self.fsync = fsync
        self.compact_bytes = compact_bytes
        self._next_seq = 1
        self._file = None
        self._unflushed = False
        self._live: dict[int, int] = {}  # seq -> record size, of stored and undelivered messages
        self._live_bytes = 0
        self._journal_bytes = 0  # the journal's size, records still buffered included
        self.compactions = 0

    # ------------------------------------------------------------ loading

    def load(self) -> list[tuple[int, str, bytes, list[bytes]]]:
        """Undelivered messages as (seq, address, header, content), oldest first; compacts the journal."""
        live: dict[int, tuple[str, bytes, list[bytes]]] = {}
        if self.path.exists():
            data = self.path.read_bytes()
            offset = 0
            while offset + _RECORD.size <= len(data):
                length, crc = _RECORD.unpack_from(data, offset)
                start = offset + _RECORD.size
                body = data[start:start + length]
                if len(body) != length or zlib.crc32(body) != crc or length < _SEQ.size:
                    break  # torn write at the tail: everything before it is good
                kind, seq = _SEQ.unpack_from(body, 0)
                if kind == _STORED:
                    live[seq] = self._parse_stored(body)
                elif kind == _DELIVERED:
                    live.pop(seq, None)
                self._next_seq = max(self._next_seq, seq + 1)
                offset = start + length
        messages = [(seq, *live[seq]) for seq in sorted(live)]
        self._replace((seq, self._record(self._stored_body(seq, address, header, content)))
                      for seq, address, header, content in messages)
        return messages

    def _replace(self, records, complete=lambda: True) -> bool:
        """Make the journal ``records`` ((seq, record) pairs, in order): written to a temporary file,
        fsynced and renamed over the journal, unless ``complete()`` then says otherwise (the
        journal is kept); then append to the journal."""
        tmp = self.path.with_suffix(".tmp")
        live: dict[int, int] = {}
        size = 0
        with open(tmp, "wb") as out:
            for seq, record in records:
                out.write(record)
                live[seq] = len(record)
                size += len(record)
            out.flush()
            os.fsync(out.fileno())
        if not complete():
            os.unlink(tmp)
            self._file = open(self.path, "ab", buffering=_BUFFER)
            return False
        os.replace(tmp, self.path)
        self._fsync_dir()
        self._file = open(self.path, "ab", buffering=_BUFFER)
        self._live, self._live_bytes, self._journal_bytes = live, size, size
        return True

    def _fsync_dir(self) -> None:
        """The rename is durable only once the directory is (a crash may otherwise bring the old
        journal back, which is still right, only larger)."""
        if not self.fsync:
            return
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _compact(self) -> None:
        """Rewrite the (flushed) journal with the undelivered records only, read back from it."""
        self._file.close()
        self._file = None
        live = dict(self._live)

        def records():
            with open(self.path, "rb") as f:
                while live:
                    head = f.read(_RECORD.size)
                    if len(head) < _RECORD.size:
                        return
                    length, _crc = _RECORD.unpack(head)
                    body = f.read(length)
                    if len(body) < length:
                        return
                    if body[0] == _STORED:
                        _kind, seq = _SEQ.unpack_from(body, 0)
                        if live.pop(seq, None) is not None:
                            yield seq, head + body

        # every undelivered record is in the journal, unless it was damaged: then keep it all
        if self._replace(records(), complete=lambda: not live):
            self.compactions += 1
            return
        self.compact_bytes = max(self.compact_bytes, self._journal_bytes * 2)  # not again at every flush
        log.warning("mailbox journal %s: %d undelivered record(s) not found in it; not compacted",
                    self.path, len(live))

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

    def _write(self, body: bytes) -> int:
        if self._file is None:
            self.load()
        record = self._record(body)
        self._file.write(record)
        self._unflushed = True
        self._journal_bytes += len(record)
        return len(record)

    def flush(self) -> None:
        """Write the buffered records out to the OS (and sync them with ``fsync=True``); compact the
        journal when it is large and mostly delivered."""
        if self._unflushed:
            self._unflushed = False
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())
            if self._journal_bytes >= self.compact_bytes and self._live_bytes * _GARBAGE <= self._journal_bytes:
                self._compact()

    def append(self, address: str, header: bytes, content: Sequence[bytes]) -> int:
        seq = self._next_seq
        self._next_seq += 1
        size = self._write(self._stored_body(seq, address, header, content))
        self._live[seq] = size
        self._live_bytes += size
        return seq

    def delivered(self, seq: int) -> None:
        self._write(_SEQ.pack(_DELIVERED, seq))
        self._live_bytes -= self._live.pop(seq, 0)

    @property
    def journal_bytes(self) -> int:
        return self._journal_bytes

    def close(self) -> None:
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = None
