"""The layout of a source log: segment file names, the in-memory index of what they hold, the errors.

Responsible for: naming segments, opening the filesystem of a location, the index entries
(``Segment``, ``Batch``) the log keeps for every batch it holds, and ``LogSlice``, what an
executor needs to read an offset range back. Not responsible for reading or writing the files
(``ipc``, ``local``, ``remote``).

Layout under the location (a local path, ``file://`` URI, or any pyarrow filesystem URI)::

    seg-00000000000000000000.arrow   first offset 0: the schema message, then batch messages
    seg-00000000000000120000.arrow   first offset 120000 ...

A segment is an Arrow IPC *stream* without end marker: the schema message, then one record batch
message per append. Offsets are contiguous message positions from 0; a segment's name is its
first offset, and it holds the offsets up to the next segment's first.
"""

from __future__ import annotations

import os
import re
from array import array
from dataclasses import dataclass, field

import pyarrow.fs as pafs

from spark_mq.errors import SparkMqError

__all__ = ["SEGMENT_PREFIX", "SEGMENT_SUFFIX", "TEMP_SUFFIX", "SEGMENT_NAME", "OFFSET_COLUMN", "BODY_COLUMN",
           "LogCorruptError", "DataLossError", "LogInUseError", "Batch", "Segment", "LogSlice", "segment_name", "open_filesystem",
           "first_offset"]

SEGMENT_PREFIX = "seg-"
SEGMENT_SUFFIX = ".arrow"
TEMP_SUFFIX = ".tmp"
SEGMENT_NAME = re.compile(r"^seg-(\d{20})\.arrow$")
OFFSET_COLUMN = "offset"
BODY_COLUMN = "body"


class LogCorruptError(SparkMqError):
    """A segment other than the last is damaged, or segments do not follow each other."""


class DataLossError(SparkMqError):
    """Log data needed for a batch is gone (deleted, or the location was changed or wiped)."""


class LogInUseError(SparkMqError):
    """Another source reader writes this log: two queries (or two runs of one) on one ``logLocation``."""


def segment_name(first: int) -> str:
    return f"{SEGMENT_PREFIX}{first:020d}{SEGMENT_SUFFIX}"


def open_filesystem(location: str) -> tuple[pafs.FileSystem, str, bool]:
    """``(filesystem, root path, is_local)`` for a local path or filesystem URI."""
    if "://" not in location:
        return pafs.LocalFileSystem(), os.path.abspath(location), True
    fs, path = pafs.FileSystem.from_uri(location)
    return fs, path, isinstance(fs, pafs.LocalFileSystem)


@dataclass
class Batch:
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
class Segment:
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


def first_offset(batch: Batch) -> int:
    return batch.first
