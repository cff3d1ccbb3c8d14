"""The contract between the ingest (stream reads, ``spark_mq.sources.ingest``; batch reads,
``spark_mq.sources.batchread``) and a format's connection to its broker.

Responsible for: what a ``Consumer`` must provide (abstract methods), what it may (methods with a
default that does nothing or cannot tell), and what it can do (capabilities, declared as class
attributes with a default; a subclass overrides them on the class or, where the broker decides, on
the instance). Not responsible for any protocol (the per-format modules implement it).

A ``Consumer`` is one live connection with a subscription; it raises ``SparkMqError``/``OSError``
when the connection fails, and the ingest replaces it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, Optional

__all__ = ["Consumer"]


class Consumer(ABC):
    """One connection consuming for the ingest. Capabilities (class attributes) and their defaults:"""

    #: message ids identify a message across sessions (else: its content does)
    stable_ids: bool = True
    #: closing the connection returns what the client holds, unacknowledged, to the broker (else a
    #: batch read empties the client before it closes: Malamute)
    returns_unacked: bool = True
    #: the broker sends no more until acks come, so a batch read without a log acks as it drains (ActiveMQ)
    acks_release_more: bool = False
    #: ``poll_batch`` builds a group's record batch; the ingest uses it instead of ``poll`` and ``row``
    builds_batches: bool = False
    #: ``dead_letter`` can move a poison message aside
    dead_letters: bool = False
    #: ``broker_stamp_ms`` tells when the broker took a message in
    broker_stamps: bool = False
    #: at most this many messages per group (None: the ingest's own sizing); set per connection where
    #: the broker decides (ActiveMQ dispatches a page per wake-up: see ``spark_mq.sources.formats.stomp``)
    max_group: Optional[int] = None
    #: in durable mode on a local fsynced log, the flusher thread fsyncs each group and acks it as soon
    #: as it is durable, while the ingest gathers the next (the broker wakes at acks: ActiveMQ)
    ack_when_durable: bool = False
    #: ``stop_deliveries`` ends the deliveries and leaves what was delivered acknowledgeable (AMQP basic.cancel)
    stops_deliveries: bool = False
    #: a message delivered before a broker restart and never acknowledged comes back marked redelivered
    #: (RabbitMQ). ActiveMQ does not keep that flag across a restart (``persistJMSRedelivered`` is off by
    #: default): there the executor-side ingest looks up first deliveries with a stable id too
    marks_redelivered_after_restart: bool = True
    #: set by the ingest: true when the group being gathered should end now (Spark is planning a
    #: batch); a ``poll`` that gathers checks it between receives (``spark_mq.sources.base.gather``)
    cut: Optional[Callable[[], bool]] = None

    @abstractmethod
    def poll(self, max_count: int, timeout: float) -> list:
        """Raw messages: waits up to ``timeout`` for the first, then gathers for up to ``timeout`` in total."""

    @abstractmethod
    def row(self, msg, offset: int, now_us: int) -> tuple:
        """The message as a tuple in ``schema.SOURCE_COLUMNS`` order, at ``offset``; ``PoisonDelivery``
        for one that cannot be taken."""

    @abstractmethod
    def buffered(self) -> int:
        """Messages the client received and ``poll`` has not returned yet (figure ``clientBuffered``)."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection."""

    def poll_batch(self, max_count: int, timeout: float, offset: int):
        """With ``builds_batches``: ``poll`` as ``(count, RecordBatch)`` with offsets from ``offset``,
        or ``(0, None)``."""
        raise NotImplementedError(f"{type(self).__name__} does not build batches")

    def ack(self, msgs: list) -> None:
        """ackMode durable: acknowledge ``msgs`` (after their fsync). Default: no acks."""

    def token(self, msg):
        """What ``ack_commit`` needs to acknowledge ``msg`` and all before it."""
        return None

    def ack_commit(self, token) -> None:
        """ackMode commit: the cumulative ack of ``token`` inside a transaction."""

    def dead_letter(self, msg, reason: str, failures: int):
        """With ``dead_letters``: move ``msg`` aside; returns a message to acknowledge at Spark's next
        commit, or None."""
        raise NotImplementedError(f"{type(self).__name__} cannot dead-letter")

    def pause(self) -> None:
        """Stop deliveries where the client's own bound does not (each client here stops at its bound)."""

    def resume(self) -> None:
        """Undo ``pause``."""

    def stop_deliveries(self) -> bool:
        """Executor-side ingest, before acknowledging a task's deliveries: ask the broker to send no more
        on this connection and wait until it confirms, where what was delivered stays acknowledgeable
        (AMQP basic.cancel; not STOMP, whose brokers refuse an ACK after UNSUBSCRIBE). What arrived
        before the confirmation is still returned by ``poll``. Default: nothing (the broker
        keeps sending up to its prefetch; what the connection holds unacknowledged at its close comes
        back redelivered). Returns whether deliveries stopped."""
        return False

    def keepalive(self) -> None:
        """Called while the ingest pauses: a client driven by the ingest's calls keeps its heartbeat."""

    def depth(self) -> Optional[int]:
        """Messages ready in the broker (None: cannot tell)."""
        return None

    def depth_in_order(self) -> Optional[int]:
        """``depth``, answered after every delivery sent before it."""
        return None

    def broker_stamp_ms(self, msg) -> Optional[int]:
        """With ``broker_stamps``: when the broker took ``msg`` in (ms since the epoch), or None."""
        return None

    def heard_at(self) -> Optional[float]:
        """When (``time.monotonic``) the broker last answered a heartbeat (None: not heard)."""
        return None

    def active_at(self) -> Optional[float]:
        """When (``time.monotonic``) bytes last came from the broker (None: cannot tell)."""
        return None
