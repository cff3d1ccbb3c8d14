"""Deliveries the ingest cannot take: finding them, and the ``poisonMessages`` verdict.

Responsible for: building a group's record batches and, should that fail, naming the first row
no column can hold (``build_batches``: a ``PoisonDelivery``); counting the sessions each poison
delivery failed (``PoisonPolicy``), and deciding what happens at ``maxDeliveryFailures``: fail the
session (the broker redelivers it), fail the query (``DeliveryFailedError``), or dead-letter it.
Not responsible for dead-lettering itself or taking the rest of the group
(``spark_mq.sources.ingest``), nor for the poison deliveries a client finds (a frame above
``maxFrameBytes``: the format's ``Consumer`` raises those).

Used by the ingest thread only.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Callable, Optional

from spark_mq import schema as S
from spark_mq.errors import PoisonDelivery, SparkMqError
from spark_mq.options import Options
from spark_mq.schema import BODY, DESTINATION, HEADERS, MESSAGE_ID
from spark_mq.sources.writebehind import LogWriteError

log = logging.getLogger("spark_mq.sources.ingest")

__all__ = ["DeliveryFailedError", "PoisonCounts", "PoisonPolicy", "build_batches"]

_POISON_MEMORY = 10_000  # deliveries whose failed sessions are counted (oldest forgotten first)


class DeliveryFailedError(SparkMqError):
    """A delivery failed ``maxDeliveryFailures`` sessions and ``poisonMessages`` says fail (or it
    cannot be dead-lettered): the query fails naming it. Nothing of it was acknowledged."""


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def build_batches(fmt: str, rows: list, msgs: list, chunks: Callable, head: int) -> list:
    """The group's record batches, one per run of ``chunks(rows)``. The columns already keep what they
    can (text that is not UTF-8 with U+FFFD, an integer out of range as null: ``spark_mq.arrowcols``);
    should a group fail all the same, the first row that fails alone is a ``PoisonDelivery`` (a value
    no column of the schema can hold); a group whose rows all build alone fails as before
    (``LogWriteError``: a build failure that retrying cannot mend). ``head``: the log's head, named
    in that error."""
    try:
        return [S.build_batch(fmt, chunk) for chunk in chunks(rows)]
    except Exception as exc:  # noqa: BLE001 - sorted out below, per row
        first = exc
    schema = S.source_arrow_schema(fmt)
    for row, msg in zip(rows, msgs):
        for value, field in zip(row, schema):
            try:
                S.column([value], field.type)
            except Exception as exc:  # noqa: BLE001 - this value is the poison
                raise PoisonDelivery(
                    f"column {field.name!r} cannot hold its value {_shown(value)} ({type(exc).__name__}: {exc})",
                    msg=msg, message_id=row[MESSAGE_ID], destination=row[DESTINATION], body=row[BODY],
                    headers=row[HEADERS]) from exc
    # not one message: retrying would take the same deliveries again and fail the same way (a
    # column past Arrow's 2 GiB bound): the query fails, naming it; nothing was acknowledged
    raise LogWriteError(f"{fmt} source: a group of {len(rows)} messages could not be added to the "
                        f"source log at offset {head}: {type(first).__name__}: {first}") from first


class PoisonCounts:
    """Sessions failed per poison delivery, by identity (the last ``_POISON_MEMORY`` of them). One per
    query: with several consumers the broker redelivers a poison message to any lane, and its
    failed sessions count together (``maxDeliveryFailures`` is per message, not per lane)."""

    def __init__(self) -> None:
        self._counts: OrderedDict = OrderedDict()  # identity -> sessions it failed
        self._lock = threading.Lock()

    def one_more(self, key) -> int:
        with self._lock:
            counts = self._counts
            count = counts.pop(key, 0) + 1
            counts[key] = count
            while len(counts) > _POISON_MEMORY:
                counts.pop(next(iter(counts)))
            return count


class PoisonPolicy:
    """What ``maxDeliveryFailures``/``poisonMessages`` make of one more failed session of a poison
    delivery (counted in ``counts``, shared by the lanes of a query)."""

    def __init__(self, fmt: str, opts: Options, identity_of: Callable, counts: Optional[PoisonCounts] = None) -> None:
        self.fmt = fmt
        self.opts = opts
        self._identity_of = identity_of
        self._counts = counts if counts is not None else PoisonCounts()

    def verdict(self, consumer, poison: PoisonDelivery, ack_mode: str) -> tuple:
        """``poison`` failed its session once more. Below ``maxDeliveryFailures`` the session fails
        (``poison`` is re-raised: the ingest reconnects, backing off, and the broker redelivers it);
        at it, the query fails naming the message (``DeliveryFailedError``: ``poisonMessages=fail``,
        and always for a delivery not held); or it is to be dead-lettered: returns ``(count, what)``,
        the sessions it failed and how to name it. Its count stays: should the dead-lettering be
        lost with the connection, its redelivery is dead-lettered at once."""
        body = poison.body if poison.body is not None else b""
        key = self._identity_of(body, poison.message_id, poison.headers)
        if poison.body is None:
            key = ("unheld", poison.size, key)
        count = self._counts.one_more(key)
        opts = self.opts
        limit = opts.maxDeliveryFailures
        where = poison.destination or (opts.get("queue") or opts.get("destination"))
        what = f"message {poison.message_id!r} from {where!r}" if poison.message_id is not None else \
            f"a message without id from {where!r}"
        # ackMode=auto: the broker forgot it at delivery and will not redeliver it, so a failed session
        # would lose it (and what the client held) quietly: the policy applies at once
        if count < limit and ack_mode != "auto":
            log.warning("%s source: %s failed its session (%d of maxDeliveryFailures=%d): %s",
                        self.fmt, what, count, limit, poison.reason)
            raise poison
        policy = opts.poisonMessages
        if policy == "deadletter" and poison.held and consumer.dead_letters:
            return count, what
        if not poison.held:
            how = (f"It cannot be dead-lettered: its body was never held (the bound is what keeps it out of "
                   f"memory). Raise {poison.option or 'the bound'} and restart the query.")
        else:
            how = ("Remove it from the queue, or set poisonMessages=deadLetter to have it dead-lettered, and "
                   "restart the query.")
        if ack_mode == "auto":
            where_now = ("With ackMode=auto the broker forgot it at delivery: it is lost, and named here, "
                         "rather than lost quietly.")
        else:
            where_now = ("It is still in the broker, unacknowledged, as is everything after it that the source "
                         "log does not hold.")
        raise DeliveryFailedError(
            f"{self.fmt} source: {what} failed {count} sessions (maxDeliveryFailures={limit}, "
            f"poisonMessages={policy}): {poison.reason}. {where_now} {how}") from poison
