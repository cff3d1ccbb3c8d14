"""The ingest's progress figures, as Spark's ``latestOffset`` reports them.

Responsible for: the figures of one ingest as a dict (log head, what the log holds uncommitted,
the broker's queue depth, asked at most every ``_DEPTH_EVERY`` seconds, the counters the ingest
keeps, what the client holds). Not responsible for keeping the counters (``spark_mq.sources.ingest``
does, on its own thread) nor for reporting them to Spark (``spark_mq.sources.base``).

Read on Spark's thread; the counters it reads are plain ints the ingest thread assigns.
"""

from __future__ import annotations

import time
from typing import Optional

from spark_mq.errors import SparkMqError

__all__ = ["ProgressFigures"]

_DEPTH_EVERY = 1.0    # seconds between queue-depth questions for the progress figures


class ProgressFigures:
    """The figures of the ``Ingest`` it is given, and the last queue depth it asked for."""

    def __init__(self, ingest) -> None:
        self._ing = ingest
        self.queue_depth: Optional[int] = None
        self._depth_asked = 0.0

    @staticmethod
    def _client_buffered(consumer) -> int:
        """Deliveries the client holds, received and not yet taken (bounded by clientBufferMessages)."""
        if consumer is None:
            return 0
        try:
            return consumer.buffered()
        except Exception:  # noqa: BLE001 - a figure; a broken consumer reports itself elsewhere
            return 0

    def figures(self) -> dict:
        ing = self._ing
        head = ing.log.head
        messages, nbytes = ing.log.stats(ing.committed)
        consumer = ing._consumer
        now = time.monotonic()
        if consumer is not None and now - self._depth_asked >= _DEPTH_EVERY:
            self._depth_asked = now
            try:
                self.queue_depth = consumer.depth()
            except (SparkMqError, OSError):
                pass
        return {
            "logHead": head,
            "uncommittedMessages": messages,
            "uncommittedBytes": nbytes,
            "brokerQueueDepth": self.queue_depth,
            "consumed": ing.consumed,
            "redeliveries": ing.redeliveries,
            "duplicatesDropped": ing.duplicates,
            "reconnects": ing.reconnects,
            "deadLettered": ing.dead_lettered,
            "logWaits": ing._wb.waits,
            "logWaitSeconds": round(ing._wb.wait_seconds, 3),
            "paused": ing.paused,
            "clientBuffered": self._client_buffered(consumer),
            "connected": ing.connected,
            "availableNowTarget": ing._an.target,
        }
