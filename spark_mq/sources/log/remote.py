"""Segment files on filesystems without a portable append (object stores, HDFS through pyarrow).

Responsible for: writing every append as a whole new segment file (the schema message and the
batch), published under its name by a move from a temporary file, so a reader never sees half of
one; an append is durable once its file is. Also the empty head-marker segments and rewriting a
torn segment without its torn part on open. The same interface as ``local``, whose write-behind
and fsync calls are no-ops here. Every method runs under the log's lock.
"""

from __future__ import annotations

from typing import Callable

import pyarrow.fs as pafs

from spark_mq.sources.log.segments import TEMP_SUFFIX, Segment, segment_name

__all__ = ["RemoteSegments"]


class RemoteSegments:
    """The segment files of one log on a filesystem other than the local one (see the module docstring)."""

    unwritten_bytes = 0

    def __init__(self, fs: pafs.FileSystem, root: str, schema_bytes: bytes, segments: list,
                 delete: Callable[[str], None]) -> None:
        self.fs = fs
        self.root = root
        self._schema_bytes = schema_bytes
        self._segments = segments
        self._delete = delete

    def _path(self, first: int) -> str:
        return f"{self.root.rstrip('/')}/{segment_name(first)}"

    def _write_whole(self, path: str, data: bytes) -> None:
        tmp = path + TEMP_SUFFIX
        with self.fs.open_output_stream(tmp) as out:
            out.write(data)
        self.fs.move(tmp, path)

    def opened(self, writer: bool) -> None:
        pass

    def truncate(self, seg: Segment, good: int, data: bytes) -> None:
        """Rewrite ``seg`` without its torn tail (from byte ``good``)."""
        self._write_whole(seg.path, data[:good])

    def append(self, head: int, data: list, length: int, segment_bytes: int) -> tuple[Segment, int]:
        """Write the IPC message ``data`` (``length`` bytes) for offset ``head`` as a segment of its
        own: ``(segment, byte position)``. Durable when this returns."""
        seg = Segment(head, self._path(head), len(self._schema_bytes), len(self._schema_bytes))
        pos = seg.size
        self._drop_empty_tail(seg.path)
        self._write_whole(seg.path, b"".join((self._schema_bytes, *data)))
        seg.size += length
        self._segments.append(seg)
        return seg, pos

    def _drop_empty_tail(self, new_path: str) -> None:
        """An empty head-marker segment is superseded by the next append (which usually has the same
        name and overwrites it)."""
        if self._segments and not self._segments[-1].batches:
            old = self._segments.pop()
            if old.path != new_path:
                self._delete(old.path)

    def start(self, first: int) -> Segment:
        """An empty segment (the schema only) that marks ``first`` as the head."""
        marker = Segment(first, self._path(first), len(self._schema_bytes), len(self._schema_bytes))
        self._write_whole(marker.path, self._schema_bytes)
        self._segments.append(marker)
        return marker

    def drop_active(self) -> None:
        pass

    def defer_writes(self) -> None:
        pass

    def write_unwritten(self, keep_bytes: int = 0) -> None:
        pass

    def sync(self) -> None:
        pass

    def durable_head(self, head: int) -> int:
        return head

    def close(self) -> None:
        pass
