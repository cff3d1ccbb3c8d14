"""The ``malamute`` source: a Malamute stream reader, mailbox or service worker for the ingest loop.

Responsible for: the Malamute-specific parts only: ``stream`` + ``pattern`` (STREAM-READ),
``mailbox`` (the client connects with that address and reads its mailbox) or ``service`` +
``pattern`` (SERVICE-OFFER as a worker), and a delivery as a row (``body`` is the first frame,
``frames`` all of them; ``sender``, ``address``, ``subject``, ``tracker``).

    spark.readStream.format("malamute").option("uri", "tcp://host:9999").option("stream", "weather")
        .option("pattern", "^temp").option("logLocation", "/shared/weather-log").load()

Malamute has no acknowledgements: once the client holds a message the broker forgets it, so only
the source log protects it (appended and fsynced in groups, as in every mode). There is no queue
depth either: availableNow ends after ``quietPeriod`` without messages. There is no pause message
either: while the log is over its bound the ingest stops reading deliveries (it keeps the
connection's heartbeat going), ZeroMQ holds up to ``prefetch`` of them, and the rest waits in TCP
and the broker (a mailbox or service queue keeps it; a stream drops what its client's queue cannot
take, as Malamute streams do).
"""

from __future__ import annotations

import uuid

from spark_mq import schema as S
from spark_mq.errors import ConnectionClosedError, OptionError
from spark_mq.options import Options
from spark_mq.sources.base import MQDataSource
from spark_mq.sources.connect import connect_malamute

__all__ = ["MalamuteDataSource", "MalamuteConsumer", "connect_consumer", "validate"]

_DRAIN_WAIT = 0.001  # seconds without a delivery that end the gathering of a group


def validate(opts: Options) -> None:
    given = [k for k in ("stream", "mailbox", "service") if opts.get(k)]
    if len(given) != 1:
        raise OptionError("the malamute source needs exactly one of the options 'stream', 'mailbox', 'service'"
                          + (f" (got {', '.join(given)})" if given else ""))
    if opts.get("mailbox") and opts.get("address") and opts.address != opts.mailbox:
        raise OptionError("options 'mailbox' and 'address' contradict each other: a mailbox is read as its address")


class MalamuteConsumer:
    stable_ids = False  # no redeliveries in Malamute; trackers are not unique
    returns_unacked = False  # closing loses what the client holds: batch reads take it all

    def __init__(self, opts: Options, attempt: int = 0) -> None:
        self.opts = opts
        if opts.get("mailbox"):
            address, self.destination = opts.mailbox, opts.mailbox
        else:
            address = opts.get("address") or f"spark-mq-{uuid.uuid4().hex[:12]}"
            self.destination = opts.get("stream") or opts.get("service")
        # The ingest thread drives the client itself (``MalamuteReceiver``: no IO thread, and the TCP
        # stream read and cut up in Python instead of through pyzmq, whose hand-offs cost more than
        # receiving; see ``spark_mq.protocol.zmtp``). What the reader holds ahead of the ingest is
        # bounded by the receiver's read buffer (1 MiB); the rest waits in TCP and the broker, which
        # keeps the reader's memory independent of the broker's backlog.
        from spark_mq.clients.malamute import MalamuteReceiver
        # A broker declared lost (silent for the client's server timeout) gets ``connectTimeout``
        # more to answer on this connection (the client re-opens by itself when it does: a broker
        # restart costs nothing) before the connection is given up and the next endpoint tried.
        self._give_up = opts.get("connectTimeout") or 10.0
        self.client = connect_malamute(opts, address, start=attempt, client_class=MalamuteReceiver)
        try:
            if opts.get("stream"):
                self.client.set_consumer(opts.stream, opts.pattern)
            elif opts.get("service"):
                self.client.set_worker(opts.service, opts.pattern)
        except BaseException:
            self.client.close()
            raise

    def poll(self, max_count: int, timeout: float) -> list:
        msgs = self.client.poll(max_count, timeout, _DRAIN_WAIT)
        if not msgs:
            lost = self.client.lost_for
            if lost > self._give_up:
                # the client would wait for this broker forever (ZeroMQ reconnects by itself); the
                # ingest's reconnect loop tries the other endpoints and fails the query after
                # ``brokerTimeout``. Nothing is unread: this poll found the socket empty.
                raise ConnectionClosedError(
                    f"malamute broker at {self.client.endpoint} lost: still silent {lost:.0f}s after the client "
                    f"declared it lost")
        return msgs

    def row(self, msg, offset: int, now_us: int) -> tuple:
        frames = msg.content  # a list of bytes (the client receives every frame as bytes)
        tracker = getattr(msg, "tracker", "") or ""
        return (frames[0] if frames else b"", self.destination, tracker or None, now_us, None, False, offset,
                msg.sender, msg.address, msg.subject, tracker, S.frames_value(frames))

    def ack(self, msgs: list) -> None:
        return None

    def token(self, msg):
        return None

    def ack_commit(self, token) -> None:
        return None

    def pause(self) -> None:
        return None

    def resume(self) -> None:
        return None

    def keepalive(self) -> None:
        self.client.keepalive()

    def depth(self):
        return None

    def depth_in_order(self):
        return None

    def buffered(self) -> int:
        return self.client.buffered

    def close(self) -> None:
        self.client.close(timeout=1.0)


def connect_consumer(opts: Options, attempt: int = 0) -> MalamuteConsumer:
    return MalamuteConsumer(opts, attempt)


class MalamuteDataSource(MQDataSource):
    """``format("malamute")``: Malamute source; the sink is ``spark_mq.sinks.malamute``."""

    FORMAT = "malamute"
    CONNECTOR_MODULE = "spark_mq.sources.malamute"
