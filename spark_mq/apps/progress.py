"""Reading Spark's streaming progress reports (``query.lastProgress``), for the demo's live line and the
bridge's progress line: the figures a spark-mq source puts in its offsets, and the source's backlog."""

from __future__ import annotations

import json
from typing import Optional

__all__ = ["offset_dict", "backlog_of"]


def offset_dict(value) -> dict:
    """A source's offset in a progress report (a JSON string, or already a dict) as a dict; {} otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, dict) else {}


def backlog_of(progress: Optional[dict]) -> Optional[int]:
    """Messages the source holds that Spark has not planned yet (log head - batch end), plus the broker
    queue depth where the protocol reports one; None before the first progress report."""
    if not progress or not progress.get("sources"):
        return None
    src = progress["sources"][0]
    latest = offset_dict(src.get("latestOffset"))
    end = offset_dict(src.get("endOffset"))
    if "logHead" not in latest or "offset" not in end:
        return None
    backlog = max(0, int(latest["logHead"]) - int(end["offset"]))
    depth = latest.get("brokerQueueDepth")
    return backlog + (int(depth) if isinstance(depth, (int, float)) else 0)
