"""Optional on-disk mailbox store: messages for offline clients survive a broker restart.

An append-only journal (``mailboxes.journal`` in the configured directory) of two record kinds,
each framed as ``length u32 | crc32 u32 | body``:

- ``S`` seq u64, address (1-byte length string), header (u32 length + bytes), frame count u32,
  then each frame (u32 length + bytes): a message was stored;
- ``D`` seq u64: that message was delivered (or expired).

At start-up the journal is read up to the first torn or corrupt record, the still-undelivered
messages are returned in order, and the journal is rewritten with only those (compaction), so
it never grows without bound across restarts. Records are buffered and written out by
``flush()``, which the broker calls before it answers any command and at the end of each turn
of its loop: a killed broker process loses at most the records of the turn it was in, which
are messages it had taken from ZeroMQ's queue but not acknowledged in any way, as it would
lose those still in the queue (one write per turn instead of one per record was 35% of the
broker's time delivering a stored mailbox). ``fsync=True`` also syncs on each flush (slow,
survives power loss).
This module does file IO only; it knows nothing of sockets or routing.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path
from typing import Sequence

_RECORD = struct.Struct(">II")  # length, crc32 of body
_SEQ = struct.Struct(">BQ")  # kind, seq
_U32 = struct.Struct(">I")
_STORED = ord("S")
_DELIVERED = ord("D")
JOURNAL = "mailboxes.journal"
_BUFFER = 1 << 20


class MailboxStore:
    def __init__(self, directory: str | os.PathLike, *, fsync: bool = False) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / JOURNAL
        self.fsync = fsync
        self._next_seq = 1
        self._file = None
        self._unflushed = False

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
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "wb") as out:
            for seq, address, header, content in messages:
                out.write(self._record(self._stored_body(seq, address, header, content)))
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.path)
        self._file = open(self.path, "ab", buffering=_BUFFER)
        return messages

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

    def _write(self, body: bytes) -> None:
        if self._file is None:
            self.load()
        self._file.write(self._record(body))
        self._unflushed = True

    def flush(self) -> None:
        """Write the buffered records out to the OS (and sync them with ``fsync=True``)."""
        if self._unflushed:
            self._unflushed = False
            self._file.flush()
            if self.fsync:
                os.fsync(self._file.fileno())

    def append(self, address: str, header: bytes, content: Sequence[bytes]) -> int:
        seq = self._next_seq
        self._next_seq += 1
        self._write(self._stored_body(seq, address, header, content))
        return seq

    def delivered(self, seq: int) -> None:
        self._write(_SEQ.pack(_DELIVERED, seq))

    def close(self) -> None:
        if self._file is not None:
            self.flush()
            self._file.close()
            self._file = None
