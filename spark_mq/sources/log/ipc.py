"""Arrow IPC in and out of segment files: encoding appended batches, scanning a segment on open,
reading a slice back on an executor.

Responsible for: a batch's IPC stream message as the parts to write (``IpcMessages``), the
cumulative body sizes of a batch (``body_sizes``), reading every batch of a segment once to rebuild
its index and find a torn tail (``scan_segment``), and the record batches of a ``LogSlice``
(``read_slice``). Not responsible for where or how the bytes are written (``local``, ``remote``).
"""

from __future__ import annotations

from array import array
from typing import Iterator, NamedTuple, Optional

import pyarrow as pa
import pyarrow.fs as pafs

from spark_mq.sources.log.segments import (BODY_COLUMN, OFFSET_COLUMN, Batch, LogCorruptError, LogSlice, Segment,
                                           open_filesystem)

__all__ = ["IpcMessages", "Scan", "body_sizes", "scan_segment", "read_slice"]


def body_sizes(batch: pa.RecordBatch) -> array:
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


class IpcMessages:
    """Record batches as the parts of their Arrow IPC stream message, without copying them.

    ``batch.serialize()`` copies every buffer of the batch into one new buffer, which the log then
    copies again into the file. Arrow's stream writer instead hands its sink each buffer of the
    batch as it is (a ``pa.Buffer`` over the batch's own memory: for Malamute the body column's data
    is the receive path's buffer) between the small pieces it makes (the message's metadata,
    padding), and the log writes those parts with one ``writev``. The parts hold the batch's memory
    until they are written. The bytes are those of ``batch.serialize()`` (a unit test holds them
    to it). Measured: 340 against 400 us of CPU to append and write a 1 MiB group of 4 KiB bodies
    (docs/performance.md). Not thread-safe.
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


class Scan(NamedTuple):
    """What ``scan_segment`` found: the segment's index (None: no complete schema), the byte
    position of a torn tail to cut off (None: none), the running body-byte count after it."""

    segment: Optional[Segment]
    torn_at: Optional[int]
    bytes_after: int


def scan_segment(data: bytes, first: int, path: str, schema: pa.Schema, location: str, *, last: bool,
                 before: int) -> Scan:
    """Read every batch of the segment file ``data`` once: its index (byte position, offsets,
    cumulative body sizes, ``before`` counting on from ``before``) and where a torn tail begins.
    Damage is tolerated in the last segment only (a crash mid-append); elsewhere, or when the
    schema or offsets do not fit, ``LogCorruptError``."""
    reader = pa.BufferReader(pa.py_buffer(data))
    try:
        msg = pa.ipc.read_message(reader)
        found = pa.ipc.read_schema(msg)
    except (EOFError, pa.ArrowInvalid, OSError) as exc:
        if not last:
            raise LogCorruptError(f"log {location}: segment {path} has no readable schema: {exc}") from exc
        return Scan(None, None, before)
    if not found.equals(schema):
        raise LogCorruptError(f"log {location}: segment {path} has another schema; the location must "
                              f"belong to one source of one format")
    seg = Segment(first, path, reader.tell(), reader.tell())
    expected = first
    torn_at = None
    while True:
        pos = reader.tell()
        if pos == len(data):
            break
        try:
            msg = pa.ipc.read_message(reader)
            batch = pa.ipc.read_record_batch(msg, found)
        except EOFError:
            break
        except (pa.ArrowInvalid, OSError) as exc:
            if not last:
                raise LogCorruptError(f"log {location}: segment {path} is damaged at byte {pos}: {exc}") from exc
            torn_at = pos
            break
        offsets = batch.column(batch.schema.get_field_index(OFFSET_COLUMN))
        if batch.num_rows == 0 or offsets[0].as_py() != expected:
            raise LogCorruptError(f"log {location}: segment {path} batch at byte {pos} starts at offset "
                                  f"{offsets[0].as_py() if batch.num_rows else None}, expected {expected}")
        sizes = body_sizes(batch)
        seg.batches.append(Batch(expected, batch.num_rows, pos, reader.tell() - pos, sizes, before))
        before += sizes[-1]
        expected += batch.num_rows
        seg.size = reader.tell()
    return Scan(seg, torn_at, before)


_FS_CACHE: dict = {}


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
