"""The sinks' driver-side commit log: one small JSON file per committed batch, idempotent by batch id.

Responsible for: writing ``<location>/<batchId>.json`` atomically (temporary file, fsync, rename),
leaving an identical record untouched and replacing a different one (a replayed batch is recorded
with the counts of the run that committed it, never added to the earlier ones), and reading the log
back (``read``, ``totals``). Local paths only: the driver writes it. Not responsible for deciding
what is committed (``spark_mq.sinks.writer``).
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from typing import Union

__all__ = ["record", "read", "totals"]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _path(location: str, batch_id: Union[int, str]) -> str:
    return os.path.join(location, _SAFE.sub("_", str(batch_id)) + ".json")


def record(location: str, batch_id: Union[int, str], summary: dict) -> bool:
    """Record ``summary`` for ``batch_id``; False when an identical record was already there."""
    os.makedirs(location, exist_ok=True)
    path = _path(location, batch_id)
    text = json.dumps(summary, sort_keys=True)
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return False
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(prefix=".commit-", dir=location)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return True


def read(location: str) -> dict:
    """Every record: ``{batch id (str): summary}``."""
    out = {}
    if not os.path.isdir(location):
        return out
    for name in sorted(os.listdir(location)):
        if name.endswith(".json") and not name.startswith("."):
            with open(os.path.join(location, name), encoding="utf-8") as f:
                out[name[:-5]] = json.load(f)
    return out


def totals(location: str) -> dict:
    """``{"batches", "messages", "bytes"}`` summed over the log."""
    records = read(location).values()
    return {"batches": len(records), "messages": sum(r["messages"] for r in records),
            "bytes": sum(r["bytes"] for r in records)}
