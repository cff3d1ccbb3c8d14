"""The ``stomp`` source: STOMP 1.0 subscription for the shared ingest loop.

Responsible for: the STOMP-specific parts only: SUBSCRIBE with ``ack:client`` (``ack:auto`` in
``auto`` mode) and the broker's prefetch header, a MESSAGE frame as a row (every header in the
``headers`` map), cumulative ACKs (per message on a broker not known to ack cumulatively), in
``commit`` mode inside BEGIN/ACK/COMMIT. While the ingest pauses, the client's own bound
(``clientBufferMessages``/``clientBufferBytes``) holds the broker back in every mode: it stops
reading its socket, so an ack:auto subscription, which no prefetch bounds, needs no UNSUBSCRIBE.

    spark.readStream.format("stomp").option("uri", "stomp://guest:guest@host:61613")
        .option("destination", "/queue/orders").option("logLocation", "/shared/orders-log").load()

Identity for de-duplication: ``message-id`` where the broker keeps it across redeliveries
(ActiveMQ); RabbitMQ makes a new one per session, so there a hash of body and user headers is
used, checked only for redelivered messages (``redelivered:true``). The queue depth is unknown in
STOMP: availableNow ends after ``quietPeriod`` without messages.
"""

from __future__ import annotations

from typing import Optional

from spark_mq.errors import BrokerRefusedError, OptionError
from spark_mq.options import Options
from spark_mq.sources.base import MQDataSource, gather, prefetch_of
from spark_mq.sources.connect import connect_stomp

__all__ = ["StompDataSource", "StompConsumer", "connect_consumer", "validate"]

def validate(opts: Options) -> None:
    if not opts.get("destination"):
        raise OptionError("the stomp source needs option 'destination' (e.g. /queue/orders)")


def _int(value):
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class StompConsumer:
    def __init__(self, opts: Options, attempt: int = 0) -> None:
        self.opts = opts
        self.destination = opts.destination
        self.auto = opts.get("ackMode") == "auto"
        self.commit_mode = opts.get("ackMode") == "commit"
        self.include_headers = opts.includeHeaders
        self.client = connect_stomp(opts, start=attempt)
        profile = self.client.broker
        self.cumulative = profile.cumulative_client_ack
        self.stable_ids = profile.name != "rabbitmq"
        try:
            self._subscribe()
        except BaseException as exc:
            # a refused or unanswered SUBSCRIBE: the ingest connects again, and this connection (and
            # a subscription it may hold after all, with deliveries nobody logs) must not stay open
            self.client.close()
            from spark_mq.protocol.stomp10 import StompError
            if isinstance(exc, StompError):
                # an ERROR frame in reply: the broker refused the destination (missing, forbidden),
                # which retrying cannot mend: a refusal, so the ingest fails after its short grace,
                # not after brokerTimeout
                raise BrokerRefusedError(f"the stomp broker refused SUBSCRIBE to {self.destination!r}: {exc}") from exc
            raise
        self._lost: Optional[BaseException] = None

    def _subscribe(self) -> None:
        self.sub = self.client.subscribe(self.destination, ack="auto" if self.auto else "client",
                                         prefetch=None if self.auto else prefetch_of(self.opts))

    def poll(self, max_count: int, timeout: float) -> list:
        if self._lost is not None:
            raise self._lost
        out = self.client.receive_many(max_count, timeout)
        if out:
            self._lost = gather(out, self.client.receive_many, max_count, timeout)
        return out

    def row(self, frame, offset: int, now_us: int) -> tuple:
        h = frame.headers
        redelivered = h.get("redelivered") == "true"
        headers = None
        if self.include_headers:
            headers = [(k, v) for k, v in h.items() if k != "content-length"]
        ts = _int(h.get("timestamp"))
        ts = ts * 1000 if ts is not None else now_us
        mid = h.get("message-id")
        return (frame.body, h.get("destination", self.destination), mid, ts, headers, redelivered, offset,
                h.get("subscription"), h.get("content-type"), h.get("correlation-id"), h.get("reply-to"),
                _int(h.get("priority")), _int(h.get("expires")))

    def ack(self, frames: list) -> None:
        if self.auto or not frames:
            return
        if self.cumulative:
            self.client.ack(frames[-1])
        else:
            for frame in frames:
                self.client.ack(frame)

    def token(self, frame):
        return frame

    def ack_commit(self, frame) -> None:
        tx = self.client.begin()
        self.client.ack(frame, transaction=tx)
        self.client.commit(tx)

    def pause(self) -> None:
        # Nothing to send: the client stops reading at its bound and TCP holds the broker back, in
        # every mode. (auto mode unsubscribed here until 2026-11-28: the RECEIPT queues behind whatever
        # the broker has already written, so the UNSUBSCRIBE pulled all of that into memory.)
        return None

    def resume(self) -> None:
        return None

    def keepalive(self) -> None:
        return None  # the client's reader thread keeps the heartbeat

    def depth(self):
        return None

    def depth_in_order(self):
        return None

    def buffered(self) -> int:
        return self.client.pending_messages

    def close(self) -> None:
        try:
            self.client.disconnect(timeout=2.0)
        except Exception:  # noqa: BLE001 - a broken connection cannot say goodbye
            self.client.close()


def connect_consumer(opts: Options, attempt: int = 0) -> StompConsumer:
    return StompConsumer(opts, attempt)


class StompDataSource(MQDataSource):
    """``format("stomp")``: STOMP 1.0 source (RabbitMQ, ActiveMQ); the sink is ``spark_mq.sinks.stomp``."""

    FORMAT = "stomp"
    CONNECTOR_MODULE = "spark_mq.sources.stomp"
