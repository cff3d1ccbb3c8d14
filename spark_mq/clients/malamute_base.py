"""What both Malamute drivers share: the status they read off their ``ClientConnection``, the check of
a reply, the logging and hand-over of connection events. ``spark_mq.clients.malamute`` is the facade."""

from __future__ import annotations

import logging
import time
from typing import Callable, Optional

from spark_mq.errors import ConnectionClosedError
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.malamute.client import (
    ClientConnection, Recovered, Recovering, Reply, ServerBack, ServerLost, State,
)
from spark_mq.protocol.malamute.errors import MalamuteBrokerError

log = logging.getLogger("spark_mq.clients.malamute")  # one logger for both drivers, named after the facade

_MAX_POLL_MS = 100
_DRAIN = 1024
_DELIVERIES = (codec.StreamDeliver, codec.MailboxDeliver, codec.ServiceDeliver)


def _checked(reply: Reply, what: str) -> Reply:
    """``reply`` if it is an OK; else the error it stands for (code 0: failed on our side)."""
    if not reply.ok:
        if reply.code == 0:
            raise ConnectionClosedError(f"{what} failed: {reply.reason}")
        raise MalamuteBrokerError(what, reply.code, reply.reason)
    return reply


def _notify(endpoint: str, event, on_event: Optional[Callable[[object], None]]) -> None:
    """A connection event (server lost or back, recovering, recovered, broker notice): log it and
    hand it to the application's callback."""
    if isinstance(event, (ServerLost, Recovering, ServerBack, Recovered)):
        log.info("malamute %s: %s", endpoint, event)
    if on_event is not None:
        try:
            on_event(event)
        except Exception:
            log.exception("on_event callback failed")



class _Status:
    """What both drivers tell of their ``ClientConnection`` (``_proto``) and ``_closed``."""

    _proto: ClientConnection
    _closed: bool

    @property
    def address(self) -> str:
        return self._proto.address

    @property
    def connected(self) -> bool:
        return self._proto.state in (State.CONNECTED, State.RECOVERING) and not self._closed

    @property
    def lost_for(self) -> float:
        """Seconds since the server was declared lost (silent for ``server_timeout``); else 0."""
        return self._proto.lost_for(time.monotonic())

    @property
    def heard_at(self) -> float:
        """``time.monotonic()`` when the server was last heard from (any message, a PONG included)."""
        return self._proto.last_heard

    @property
    def recoveries(self) -> int:
        return self._proto.recoveries

