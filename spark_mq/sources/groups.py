"""How many deliveries the ingest takes at a time: group sizing.

Responsible for: a group's message count (one Arrow append, one fsync, one ack per group): about
``fsyncBytes`` of bodies at the last group's mean body size, within ``fsyncMessages``, half the
prefetch where the broker waits for acks, and a consumer's own cap; and cutting a group into
appends of at most ``MAX_APPEND_BYTES``. Not responsible for taking, appending or syncing a group
(``spark_mq.sources.ingest``, ``spark_mq.sources.writebehind``).

Used by the ingest thread only.
"""

from __future__ import annotations

from operator import itemgetter

from spark_mq import schema as S
from spark_mq.options import Options

__all__ = ["GroupSizer", "MAX_APPEND_BYTES"]

MAX_APPEND_BYTES = 256 << 20  # bodies per appended batch: far below Arrow's 2 GiB per binary column


class GroupSizer:
    """The next group's message count (``count``) and its upper bound (``limit``)."""

    def __init__(self, fmt: str, opts: Options, ack_mode: str, prefetch: int) -> None:
        self._fsync_bytes = opts.fsyncBytes
        # A group takes at most half the prefetch where the broker waits for acks: the broker
        # streams the other half while this group is written, and a poll never waits for
        # deliveries the broker will not send before the ack.
        self.limit = opts.fsyncMessages if ack_mode == "auto" else max(1, min(opts.fsyncMessages, prefetch // 2))
        # ... and about ``fsyncBytes`` of bodies: a group that fits the CPU caches is copied from
        # cache (join, IPC serialization, write), large fresh buffers page-fault (about 2.5x the
        # CPU per message in 80 MB groups as in 1 MiB ones).
        self.count = self.limit
        self._row_bytes = S.row_bytes_function(fmt)
        # where a row's bytes are its body's: a group's total in C (``chunks``' usual case, one run)
        self._body = itemgetter(S.BODY) if "frames" not in S.COLUMN_INDEX[fmt] else None

    def cap(self, most: int) -> None:
        """A consumer takes at most ``most`` messages per group (``Consumer.max_group``)."""
        self.limit = max(1, min(self.limit, most))
        self.count = min(self.count, self.limit)

    def size(self, body_bytes: int, count: int) -> None:
        """The next group's message count: about ``fsyncBytes`` of bodies at the last group's mean size."""
        mean = max(1, body_bytes // count)
        self.count = max(1, min(self.limit, self._fsync_bytes // mean))

    def chunks(self, rows: list):
        """``rows`` in runs of at most ``MAX_APPEND_BYTES`` of bodies (and frames), at least one row
        each: a group is sized by the last group's mean body, so a jump in body size could make it
        larger than an Arrow binary column holds (2 GiB) or than a batch a task should read whole."""
        bound = MAX_APPEND_BYTES
        if self._body is not None and sum(map(len, map(self._body, rows))) <= bound:
            yield rows
            return
        row_bytes = self._row_bytes
        start, size = 0, 0
        for i, row in enumerate(rows):
            n = row_bytes(row)
            if size + n > bound and i > start:
                yield rows[start:i]
                start, size = i, 0
            size += n
        yield rows[start:]
