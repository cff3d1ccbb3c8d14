"""The batch files of ``ingest=executors``, and the identities that recognise a redelivery in them.

Responsible for: their layout under ``logLocation`` (``lane-<i>/batch-<b>.arrow``, the ``executors.json``
marker), writing one so that the first attempt of a task wins (``write_first``: a temporary file,
fsynced, linked to its name), what a file says (its rows, whether a message in it was stamped after an
availableNow run began), and message identities that are the same in every executor process
(``task_identity``, ``RecentIdentities``). Not responsible for consuming (``spark_mq.sources.executors``,
the task) nor for planning (the same module's stream reader): both stand on this one.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from itertools import repeat
from typing import Iterator, Optional

import pyarrow as pa
import pyarrow.compute as pc

from spark_mq import schema as S
from spark_mq.sources.dedup import VOLATILE_HEADERS

__all__ = ["EXECUTORS_FILE", "RECENT_BATCHES", "batch_path", "batch_files", "mark_placement", "task_identity",
           "RecentIdentities", "read_file", "file_summary", "file_rows", "file_stamped_late", "write_first"]

#: the file that marks a logLocation as written by executor-side ingest (JSON: {"ingest": "executors"})
EXECUTORS_FILE = "executors.json"
#: batch files kept behind Spark's commit: a message whose ack was lost is redelivered at once, to the
#: next batch or so; these many batches' identities are checked for it
RECENT_BATCHES = 10
_BATCH = "batch-{:012d}.arrow"
_LATE = b"stamped_after_start"  # file metadata: a message stamped after the availableNow run began


def batch_path(root: str, lane: int, batch: int) -> str:
    return os.path.join(root, f"lane-{lane}", _BATCH.format(batch))


def _batch_of(name: str) -> Optional[int]:
    if name.startswith("batch-") and name.endswith(".arrow"):
        try:
            return int(name[6:-6])
        except ValueError:
            return None
    return None


def batch_files(root: str) -> Iterator[tuple]:
    """``(batch, path)`` of every lane's batch files under ``root`` (none if it does not exist)."""
    if not os.path.isdir(root):
        return
    for lane_dir in os.listdir(root):
        d = os.path.join(root, lane_dir)
        if lane_dir.startswith("lane-") and os.path.isdir(d):
            for name in os.listdir(d):
                b = _batch_of(name)
                if b is not None:
                    yield b, os.path.join(d, name)


def mark_placement(root: str) -> None:
    os.makedirs(root, exist_ok=True)
    path = os.path.join(root, EXECUTORS_FILE)
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump({"ingest": "executors"}, f)


# -- identities -----------------------------------------------------------------------------------

def task_identity(body: bytes, message_id, headers, stable_ids: bool):
    """A message's identity, the same in every process: ``("h", id)`` for a spark-mq sink's id header,
    ``("m", id)`` for a broker's stable message id, else ``("c", digest)`` of body and stable headers."""
    kept = []
    for kv in headers or ():
        name, value = kv[0], kv[1]
        if name in VOLATILE_HEADERS:
            continue
        if name == S.ID_HEADER and value:
            return ("h", value)
        kept.append((name, value))
    if message_id is not None and stable_ids:
        return ("m", message_id)
    h = hashlib.blake2b(digest_size=16)
    h.update(len(body).to_bytes(8, "big"))
    h.update(body)
    h.update(repr(sorted(kept)).encode("utf-8", "surrogatepass"))
    return ("c", h.hexdigest())


def _file_identities(path: str, stable_ids: bool) -> set:
    """The identities of a batch file's messages (``task_identity`` of each). Where ids are stable, taken
    column-wise: a message with a non-empty id header is ``("h", header)``, one without that header and
    with a message id ``("m", id)``; only the others go through ``task_identity`` one by one. Measured on
    ActiveMQ (``python -m bench.task_steps``): a task whose deliveries came redelivered spent 0.28-0.55 s
    loading the identities of 1 to 3 files of 25,000 rows one row at a time (headers made Python maps)."""
    out = set()
    for batch in read_file(path):
        if not stable_ids:
            cols = batch.select(["body", "message_id", "headers"]).to_pydict()
            for body, mid, headers in zip(cols["body"], cols["message_id"], cols["headers"]):
                out.add(task_identity(body, mid, headers, stable_ids))
            continue
        header = pc.map_lookup(batch.column("headers"), S.ID_HEADER, "first")
        mid = batch.column("message_id")
        by_header = pc.fill_null(pc.not_equal(header, ""), False)
        by_id = pc.and_(pc.is_null(header), pc.is_valid(mid))
        out.update(zip(repeat("h"), pc.filter(header, by_header).to_pylist()))
        out.update(zip(repeat("m"), pc.filter(mid, by_id).to_pylist()))
        rest = batch.filter(pc.invert(pc.or_(by_header, by_id)))
        if rest.num_rows:
            cols = rest.select(["body", "message_id", "headers"]).to_pydict()
            for body, m, headers in zip(cols["body"], cols["message_id"], cols["headers"]):
                out.add(task_identity(body, m, headers, stable_ids))
    return out


class RecentIdentities:
    """The identities in the batch files of the last ``RECENT_BATCHES`` batches of every lane (up to
    and including ``batch``), loaded the first time a redelivery is looked up, and files that appeared
    since (another lane of this batch linked its file) added when a lookup misses."""

    def __init__(self, root: str, batch: int, stable_ids: bool) -> None:
        self.root, self.batch, self.stable_ids = root, batch, stable_ids
        self._loaded: set = set()
        self._ids: set = set()
        self._lane_dirs: list = []
        self._listed: Optional[tuple] = None  # the directories' modification times at the last listing

    def _dirs_changed(self) -> bool:
        """Whether a file was linked (or a lane directory made) since the last listing: a miss re-lists only
        then. A redelivery that is not a duplicate is a miss, and a task on a STOMP broker, which cannot stop
        its subscription before acknowledging, may hold thousands of them."""
        try:
            if tuple(os.stat(d).st_mtime_ns for d in (self.root, *self._lane_dirs)) == self._listed:
                return False
            # taken before the listing that follows, so that a file linked meanwhile changes them again
            root = os.stat(self.root).st_mtime_ns  # before the scan: a lane made after it changes it
            self._lane_dirs = [e.path for e in os.scandir(self.root) if e.name.startswith("lane-") and e.is_dir()]
            self._listed = (root, *(os.stat(d).st_mtime_ns for d in self._lane_dirs))
        except FileNotFoundError:
            self._listed = None  # no location yet, or a lane going: list every time
        return True

    def _refresh(self) -> None:
        if not self._dirs_changed():
            return
        for b, path in batch_files(self.root):
            if b < self.batch - RECENT_BATCHES or b > self.batch or path in self._loaded:
                continue
            try:
                self._ids |= _file_identities(path, self.stable_ids)
            except FileNotFoundError:
                continue  # trimmed meanwhile: older than the window
            self._loaded.add(path)

    def __contains__(self, key) -> bool:
        if key in self._ids:
            return True
        self._refresh()
        return key in self._ids


# -- the batch files ------------------------------------------------------------------------------

def read_file(path: str) -> Iterator[pa.RecordBatch]:
    with pa.memory_map(path) as source:
        reader = pa.ipc.open_stream(source)
        for batch in reader:
            yield batch


def _file_meta(path: str) -> Optional[dict]:
    """A batch file's schema metadata (the first message only), or None if the file is absent."""
    try:
        with pa.memory_map(path) as source:
            return pa.ipc.open_stream(source).schema.metadata or {}
    except FileNotFoundError:
        return None


def file_summary(path: str) -> tuple:
    """``(rows, late)`` of a batch file, from one read of its metadata: rows None if the file is absent; late
    whether its task took a message the broker stamped after the availableNow run began
    (``TaskPartition.run_began_ms``; ActiveMQ)."""
    meta = _file_meta(path)
    if meta is None:
        return None, False
    return int(meta.get(b"rows", b"0")), meta.get(_LATE) == b"1"


def file_rows(path: str) -> Optional[int]:
    """Rows in a batch file, or None if absent."""
    return file_summary(path)[0]


def file_stamped_late(path: str) -> bool:
    """Whether the task that wrote this batch file took a message stamped after the availableNow run began."""
    return file_summary(path)[1]


def write_first(path: str, schema: pa.Schema, batches: list, rows: int, late: bool = False) -> bool:
    """Write ``batches`` durably to ``path`` unless another attempt did first; True if this one did.
    ``late``: a message in them was stamped after the availableNow run began (``file_stamped_late``)."""
    d = os.path.dirname(path)
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    schema = schema.with_metadata({"rows": str(rows), **({_LATE: "1"} if late else {})})
    try:
        with open(tmp, "wb") as f:
            with pa.ipc.new_stream(f, schema) as writer:
                for batch in batches:
                    writer.write_batch(batch.replace_schema_metadata(schema.metadata))
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return True
    finally:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass

