"""When the ingest connects again, and when it gives up: its reconnect policy.

Responsible for: exponential backoff with full jitter (``reconnectDelay``, doubling up to
``reconnectMaxDelay``), failing a first connection the broker keeps refusing (credentials, a missing
queue) after ``_REFUSAL_GRACE`` instead of ``brokerTimeout``, counting a session that fails before
any progress as a failed attempt, and ``brokerTimeout`` (``BrokerUnavailableError``). Not responsible
for connecting or for what a session does (``spark_mq.sources.ingest``), nor for which endpoint a
connect tries (the format's ``connect``, which is given the attempt number).

One ``ReconnectPolicy`` lives in the ingest thread for as long as it runs; nothing else touches it.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Optional

from spark_mq.clients.connect import refusal
from spark_mq.errors import BrokerRefusedError, SparkMqError
from spark_mq.options import Options

log = logging.getLogger("spark_mq.sources.ingest")

__all__ = ["BrokerUnavailableError", "ReconnectPolicy"]

_REFUSAL_GRACE = 10.0  # seconds a first connection must stay refused before the query fails
_REFUSALS = 3  # ... over at least this many attempts
# A session counts as progress once it has taken a group of deliveries, or stayed up this long (a
# broker that is idle, then lost, was working): one that fails sooner, having taken nothing, is a
# failed attempt like a refused connect (backoff, brokerTimeout), or a delivery that fails every
# session would make the ingest reconnect in a tight loop and brokerTimeout would never fire.
_STEADY_SESSION = 10.0


class BrokerUnavailableError(SparkMqError):
    """The broker stayed unreachable longer than ``brokerTimeout``."""


class ReconnectPolicy:
    """The ingest thread's connect attempts: how long to wait before the next, and when to fail.

    ``attempt`` (the number handed to ``connect``) counts failed attempts since the last progress;
    ``down_since`` is when the broker was last lost, None while sessions make progress."""

    def __init__(self, fmt: str, opts: Options, stop: threading.Event) -> None:
        self.fmt = fmt
        self.opts = opts
        self._stop = stop
        self.attempt = 0
        self.down_since: Optional[float] = None
        self.ever_connected = False  # after a first success, a refusal may be passing (a queue re-declared)
        self._refused_since: Optional[float] = None
        self._refusals = 0
        self._session_started = time.monotonic()

    def connect_failed(self, exc: BaseException) -> None:
        """A connect failed with ``exc``: raise if the query must fail, else wait out the backoff
        (a stop cuts the wait short)."""
        now = time.monotonic()
        if not self.ever_connected and _protocol_refused(exc):
            # the broker answered our AMQP version's header with another: no retry speaks it better
            raise BrokerRefusedError(f"{self.fmt} source: {exc} (option protocol)") from exc
        # A wrong password or queue name is not an outage: fail after a short grace, not after
        # brokerTimeout. The grace (and a few attempts) because a refusal can be passing too: a
        # connection dropped during the handshake reads as 403, a broker starting up or at its
        # connection limit answers 530, a queue may be about to be declared by its producer.
        if not self.ever_connected and refusal(exc):
            self._refused_since = self._refused_since or now
            self._refusals += 1
            if self._refusals >= _REFUSALS and now - self._refused_since >= _REFUSAL_GRACE:
                raise BrokerRefusedError(
                    f"{self.fmt} source: {exc}. Not retried after {self._refusals} refusals in "
                    f"{now - self._refused_since:.0f}s: the broker refused what the options ask for "
                    f"(credentials, permissions, virtual host, queue, declare); fix them and "
                    f"restart the query") from exc
        else:
            self._refused_since, self._refusals = None, 0
        self.down_since = self.down_since or now
        limit = self.opts.brokerTimeout
        if limit and now - self.down_since > limit:
            raise BrokerUnavailableError(
                f"{self.fmt} source: broker unreachable for {now - self.down_since:.0f}s "
                f"(brokerTimeout {limit:.0f}s): {exc}") from exc
        sleep = self._backoff()
        log.warning("%s source: connect attempt %d failed (%s); retrying in %.2fs", self.fmt, self.attempt, exc, sleep)
        self._stop.wait(sleep)

    def session_began(self) -> bool:
        """A connect succeeded; True if it is a reconnect (after failed attempts or a lost session).
        The connect alone is no progress: a session that fails before it takes a group (a delivery
        the client cannot decode, redelivered first each time) stays a failed attempt."""
        again = self.down_since is not None or bool(self.attempt)
        self.ever_connected = True
        self._session_started = time.monotonic()
        return again

    def progressed(self, took: bool) -> bool:
        """Whether the current session counts as progress: it took a group (``took``), or it has been
        up for ``_STEADY_SESSION``."""
        return took or time.monotonic() - self._session_started >= _STEADY_SESSION

    def session_failed(self, exc: BaseException, took: bool) -> None:
        """The session failed with ``exc``. After progress: reconnect at once, the backoff starts
        over. Without: a failed attempt (backoff; ``brokerTimeout`` from the last progress)."""
        if self.progressed(took):
            log.warning("%s source: connection lost (%s); reconnecting", self.fmt, exc)
            self.attempt, self.down_since = 0, time.monotonic()
            return
        now = time.monotonic()
        self.down_since = self.down_since or self._session_started
        limit = self.opts.brokerTimeout
        if limit and now - self.down_since > limit:
            raise BrokerUnavailableError(
                f"{self.fmt} source: no session made progress for {now - self.down_since:.0f}s "
                f"(brokerTimeout {limit:.0f}s); each connected and failed before taking a "
                f"message. Last error: {exc}") from exc
        sleep = self._backoff()
        log.warning("%s source: session failed before any progress (%s); attempt %d, reconnecting "
                    "in %.2fs", self.fmt, exc, self.attempt, sleep)
        self._stop.wait(sleep)

    def step_done(self, took: bool) -> None:
        """A step of the session went well: once the session counts as progress, the backoff
        starts over."""
        if (self.attempt or self.down_since is not None) and self.progressed(took):
            self.attempt, self.down_since = 0, None

    def _backoff(self) -> float:
        """The next wait: full jitter over ``reconnectDelay``, then twice that, ... up to
        ``reconnectMaxDelay``; counts the attempt."""
        bound = min(self.opts.reconnectMaxDelay, self.opts.reconnectDelay * (2 ** min(self.attempt, 20)))
        sleep = random.uniform(0, bound)
        self.attempt += 1
        return sleep


def _protocol_refused(exc: BaseException) -> bool:
    """An AMQP connect refused for its protocol version: the client's ``ProtocolRefused``, or the endpoint
    loop's error when every endpoint's was one (``clients.connect.connect_amqp08`` keeps it as the cause)."""
    from spark_mq.protocol.amqp08.errors import ProtocolRefused

    return isinstance(exc, ProtocolRefused) or isinstance(exc.__cause__, ProtocolRefused)
