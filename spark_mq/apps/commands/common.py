"""What every ``spark-mq`` command shares: the exit statuses, the two errors the command line turns
into them (``UsageError``: status 2, ``Failure``: status 1), the protocol of a URI, ``KEY=VALUE``
flags, messages on stderr, and a clean stop on Ctrl-C / SIGTERM."""

from __future__ import annotations

import signal
import sys
import threading
from typing import Optional

__all__ = ["EXIT_OK", "EXIT_FAILURE", "EXIT_USAGE", "EXIT_INCOMPLETE", "AMQP_PROPERTIES", "UsageError", "Failure",
           "redact", "protocol_of", "pairs", "err", "Stop"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
#: ``tail --max N`` ended by ``--timeout`` before N messages arrived
EXIT_INCOMPLETE = 3
#: the AMQP basic properties ``send --property`` sets and ``tail`` prints
AMQP_PROPERTIES = ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                   "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id")


class UsageError(Exception):
    """A bad flag, flag combination or URI: printed as ``spark-mq <cmd>: error: ...``, exit status 2."""


class Failure(Exception):
    """The broker or the connection failed: printed as ``spark-mq <cmd>: ...``, exit status 1."""


def redact(uri: str) -> str:
    """The URI with its password masked, for messages."""
    from spark_mq.options import redact_uri
    return redact_uri(uri)


def protocol_of(uri: str) -> str:
    """``amqp08``, ``stomp`` or ``malamute`` for a broker URI; ``UsageError`` naming the URI otherwise."""
    from spark_mq.clients.connect import format_of
    from spark_mq.errors import OptionError
    try:
        return format_of(uri)
    except OptionError as exc:
        raise UsageError(str(exc)) from None


def pairs(items: Optional[list], flag: str, error: type = UsageError) -> dict:
    """``["k=v", ...]`` -> dict; ``error`` (a ``UsageError`` unless given) naming the flag for an item
    without ``=``."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise error(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


class Stop:
    """Ctrl-C / SIGTERM ends ``tail`` and ``broker`` cleanly (acks/close still happen)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._old = {}

    def __enter__(self) -> "Stop":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, lambda *_: self.event.set())
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)
