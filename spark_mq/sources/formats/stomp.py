"""The ``stomp`` source: STOMP 1.0 subscription for the shared ingest loop.

Responsible for: the STOMP-specific parts only: SUBSCRIBE with ``ack:client`` (``ack:auto`` in
``auto`` mode) and the broker's prefetch header, a MESSAGE frame as a row (every header in the
``headers`` map), cumulative ACKs (per message on a broker not known to ack cumulatively), in
``commit`` mode inside BEGIN/ACK/COMMIT, a frame above ``maxFrameBytes`` as a poison delivery, and
dead-lettering (SEND to ``deadLetterDestination``, then ACK). While the ingest pauses, the client's own
bound (``clientBufferMessages``/``clientBufferBytes``) holds the broker back in every mode: it stops
reading its socket, so an ack:auto subscription, which no prefetch bounds, needs no UNSUBSCRIBE.

    spark.readStream.format("stomp").option("uri", "stomp://guest:guest@host:61613")
        .option("destination", "/queue/orders").option("logLocation", "/shared/orders-log").load()

Several destinations (``destination`` a comma-separated list) share the one connection: one
SUBSCRIBE each, with its own id (and its own prefetch: both brokers bound each subscription). A
row's ``destination`` is then the destination as given, by the MESSAGE's ``subscription`` (the
broker's ``destination`` header stays in ``headers``). Acknowledging with several subscriptions:
a STOMP 1.0 ``ack:client`` ACK is cumulative, but not over the same set on both brokers.
ActiveMQ acknowledges the named message and the earlier ones *of its subscription*
(``StompSubscription.onStompMessageAck``) and answers an ACK of a message no longer awaiting one
with an ERROR ("Unexpected ACK received"); RabbitMQ turns the ACK into ``basic.ack multiple=true``
on the connection's one AMQP channel, whose delivery tags run across its consumers, so it
acknowledges every earlier delivery *of every subscription* (``rabbit_stomp_processor``), and an
ACK of a delivery already settled that way is an unknown delivery tag (an ERROR, and on RabbitMQ
3.x the connection closes). So a group (and a commit) sends one ACK per subscription, for that
subscription's last message, in the order the messages came: correct on both (each ACK names a
message later than everything an earlier ACK settled), and a subscription with nothing new gets
no ACK. docs/stomp.md has the references and the tests.

Identity for de-duplication: ``message-id`` where the broker keeps it across redeliveries
(ActiveMQ); RabbitMQ makes a new one per session, so there a hash of body and user headers is
used, checked only for redelivered messages (``redelivered:true``). The queue depth is unknown in
STOMP: on ActiveMQ with one destination, availableNow and batch reads end at the first message the
broker stamped after their start (``broker_stamp_ms``), else after ``quietPeriod`` without messages; availableNow on
RabbitMQ ends after ``availableNowTimeout`` at the latest.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Optional

from spark_mq.clients.connect import connect_stomp
from spark_mq.errors import BrokerRefusedError, OptionError, PoisonDelivery
from spark_mq.options import Options
from spark_mq.sources.base import gather
from spark_mq.sources.consumer import Consumer
from spark_mq.sources.formats.sourcelist import name_list
from spark_mq.sources.ingest import prefetch_of

__all__ = ["StompConsumer", "connect_consumer", "last_of_each_subscription", "not_yet_acked", "validate"]

def destinations(opts: Options) -> tuple:
    """The destinations of option ``destination`` (a comma-separated list), in the order given."""
    return name_list(opts, "destination", "destination")


def validate(opts: Options) -> None:
    if not destinations(opts):
        raise OptionError("the stomp source needs option 'destination' (e.g. /queue/orders)")
    dlq = opts.get("deadLetterDestination")
    if opts.get("poisonMessages") == "deadletter" and not dlq:
        raise OptionError("option 'poisonMessages' is deadLetter: the stomp source needs option "
                          "'deadLetterDestination' (where poison messages are sent, e.g. /queue/orders.dlq)")
    if dlq and dlq in destinations(opts):
        raise OptionError(f"option 'deadLetterDestination' is {dlq!r}, the destination read: a poison message "
                          f"would come back to fail again")


#: headers of one delivery, not of the message: left out of a dead-lettered copy (the broker sets its own)
_DELIVERY_HEADERS = frozenset({"message-id", "destination", "subscription", "content-length", "redelivered",
                               "ack", "receipt", "transaction"})


#: messages per group (one fsync, one ACK) on ActiveMQ: the 200 a queue pages in per dispatch round (its
#: default ``maxPageSize``), so a group ends as its page does, without waiting out ``fsyncInterval``, and its
#: ACK wakes the queue for the next pages. Measured against half a page (100): as fast or faster at 100 B and
#: 4 KiB, with less CPU per message (fewer fsyncs and ACKs): bench/HISTORY.md, "a page per wake-up"
ACTIVEMQ_GROUP = 200


def _int(value):
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


class StompConsumer(Consumer):
    dead_letters = True

    def __init__(self, opts: Options, attempt: int = 0) -> None:
        self.opts = opts
        self.destinations = destinations(opts)
        self.destination = self.destinations[0]
        #: subscription id -> its destination as given, where there are several (else None)
        self.destination_of: Optional[dict] = None
        self._latest: dict = {}    # commit mode, several subscriptions: id -> (seq, frame) last given to token
        self._acked: dict = {}     # ... id -> seq of the last frame acknowledged
        self._seq = 0
        self.auto = opts.get("ackMode") == "auto"
        self.commit_mode = opts.get("ackMode") == "commit"
        self.include_headers = opts.includeHeaders
        self.client = connect_stomp(opts, start=attempt, max_frame_size=opts.maxFrameBytes)
        profile = self.client.broker
        self.cumulative = profile.cumulative_client_ack
        self.stable_ids = profile.name != "rabbitmq"
        # seen on ActiveMQ: a message whose ACK the broker's SIGKILL lost came back without the flag
        # (test_sources_executors.py::test_a_broker_restarted_between_a_tasks_link_and_ack_duplicates_nothing)
        self.marks_redelivered_after_restart = profile.name == "rabbitmq"
        # see broker_stamp_ms. One destination only: a queue delivers in order, so its first message
        # stamped after a run began means the rest came later too; with several, another queue may
        # still hold older messages, so the drain ends as on RabbitMQ (quietPeriod, availableNowTimeout)
        self.broker_stamps = profile.name == "activemq" and len(self.destinations) == 1
        # ActiveMQ stops sending a queue to a consumer that fell behind (its socket full for a
        # moment) after the page it holds (200 messages) until acknowledgements come
        self.acks_release_more = profile.name == "activemq"
        # ... and it does so at every ack too: a queue pages in at most ``maxPageSize`` (200 by default)
        # messages per dispatch round, and a round runs when something wakes the queue (a send, a
        # subscription, an ack), never because the consumer has prefetch left: on a preloaded queue
        # about 200 messages past the last ACK are the window, whatever the prefetch. Groups of up to
        # prefetch/2 (one fsync, one ACK each) would each wait out fsyncInterval at 200 messages
        # (measured: a third of stomp.py's rate). So on ActiveMQ a group is at most a page
        # (``max_group``), and its fsync runs in the ingest's flusher thread, which acknowledges each
        # group as soon as it is durable (``ack_when_durable``): an ACK per page (stomp.py's bench
        # peer ACKs every 100), with the fsync off the receiving thread. The probes: bench/HISTORY.md.
        # (durable mode only: ack:auto needs no ACK, and in commit mode the ACKs wait for Spark's commit)
        durable = profile.name == "activemq" and not self.auto and not self.commit_mode
        self.max_group = ACTIVEMQ_GROUP if durable else None
        self.ack_when_durable = durable
        self._subscribing = self.destination  # the destination of the SUBSCRIBE under way (for a refusal)
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
                raise BrokerRefusedError(f"the stomp broker refused SUBSCRIBE to {self._subscribing!r}: {exc}") from exc
            raise
        self._lost: Optional[BaseException] = None

    def _subscribe(self) -> None:
        subs = {}
        for destination in self.destinations:
            self._subscribing = destination
            subs[self.client.subscribe(destination, ack="auto" if self.auto else "client",
                                       prefetch=None if self.auto else prefetch_of(self.opts))] = destination
        self.sub = next(iter(subs))
        if len(subs) > 1:
            self.destination_of = subs

    def poll(self, max_count: int, timeout: float) -> list:
        if self._lost is not None:
            raise self._lost
        out = self.client.receive_many(max_count, timeout)
        if out:
            self._lost = gather(out, self.client.receive_many, max_count, timeout, self.cut)
        return out

    def row(self, frame, offset: int, now_us: int) -> tuple:
        # once per message: headers absent from most messages are not converted (no call for a None)
        if frame.oversize:
            raise self._too_large(frame)
        h = frame.headers
        get = h.get
        headers = [kv for kv in h.items() if kv[0] != "content-length"] if self.include_headers else None
        ts = get("timestamp")
        if ts is not None:
            ts = _int(ts)
        priority, expires = get("priority"), get("expires")
        return (frame.body, self._destination(h), get("message-id"),
                ts * 1000 if ts is not None else now_us, headers, get("redelivered") == "true", offset,
                get("subscription"), get("content-type"), get("correlation-id"), get("reply-to"),
                _int(priority) if priority is not None else None, _int(expires) if expires is not None else None)

    def _destination(self, headers) -> str:
        """The row's destination: the MESSAGE's header; with several subscriptions, the destination
        as given of the frame's subscription."""
        if self.destination_of is None:
            return headers.get("destination", self.destination)
        return self.destination_of.get(headers.get("subscription"), headers.get("destination", self.destination))

    def _too_large(self, frame) -> PoisonDelivery:
        h = frame.headers
        length = h.get("content-length")
        size = f"{frame.oversize} bytes" + (f" (content-length {length})" if length else "")
        return PoisonDelivery(
            f"its MESSAGE frame of {size} is above maxFrameBytes={self.opts.maxFrameBytes} (message-id "
            f"{h.get('message-id')!r}); its body was skipped as it arrived",
            msg=frame, message_id=h.get("message-id"), destination=self._destination(h),
            headers=[(k, v) for k, v in h.items() if k != "content-length"], size=frame.oversize, held=False,
            option="maxFrameBytes")

    def dead_letter(self, frame, reason: str, failures: int):
        """SEND a poison message to ``deadLetterDestination`` (its headers, and why), wait for the
        broker's receipt, then ACK it: never acknowledged unless the copy was taken. In commit mode the
        frame is returned instead, to be acknowledged at Spark's commit past it."""
        h = frame.headers
        headers = {k: v for k, v in h.items() if v is not None and k and k not in _DELIVERY_HEADERS}
        headers.update({
            "persistent": "true",
            "x-spark-mq-dead-letter-from": self._destination(h),
            "x-spark-mq-dead-letter-message-id": h.get("message-id", ""),
            "x-spark-mq-dead-letter-failures": str(failures),
            "x-spark-mq-dead-letter-reason": " ".join(reason.split())[:1000],  # one line: STOMP 1.0 cannot escape
        })
        self.client.send(self.opts.deadLetterDestination, frame.body, headers=headers, receipt=True)
        if self.commit_mode:
            # an ACK is cumulative on both brokers: now it would also acknowledge the messages before
            # it that wait for Spark's commit. It is acknowledged with them, at the commit past it.
            return frame
        if not self.auto:
            self.client.ack(frame)
        return None

    # stop_deliveries: none (the base's no-op). An UNSUBSCRIBE would end the deliveries, but both brokers
    # refuse the ACK that must follow it (RabbitMQ: "Subscription not found"; ActiveMQ gives a removed
    # subscription's unacknowledged messages to other consumers). So with ingest=executors what the broker
    # sends between a task's ACK and its DISCONNECT comes back redelivered: recognised exactly by id on
    # ActiveMQ; on RabbitMQ by content (docs/sources.md, "Ingest on the executors").

    def ack(self, frames: list) -> None:
        if self.auto or not frames:
            return
        if not self.cumulative:
            for frame in frames:
                self.client.ack(frame)
        elif self.destination_of is None:
            self.client.ack(frames[-1])
        else:
            for frame in last_of_each_subscription(frames):
                self.client.ack(frame)

    def token(self, frame):
        """The frame; with several subscriptions, the last frame of each subscription up to this
        one, in the order they came (``(seq, frame)`` pairs; called in delivery order)."""
        if self.destination_of is None:
            return frame
        self._seq += 1
        self._latest[frame.headers.get("subscription")] = (self._seq, frame)
        return tuple(sorted(self._latest.values(), key=itemgetter(0)))

    def ack_commit(self, token) -> None:
        if self.destination_of is None:
            frames = [token]
        else:
            token = not_yet_acked(token, self._acked)
            if not token:
                return
            frames = [frame for _, frame in token]
        tx = self.client.begin()
        for frame in frames:
            self.client.ack(frame, transaction=tx)
        self.client.commit(tx)
        if self.destination_of is not None:
            for seq, frame in token:
                self._acked[frame.headers.get("subscription")] = seq

    # pause/resume: nothing to send (the base's no-ops). The client stops reading at its bound and
    # TCP holds the broker back, in every mode. (Not an UNSUBSCRIBE: its RECEIPT queues behind whatever
    # the broker has already written, so it would pull all of that into memory.) keepalive: the
    # client's reader thread keeps the heartbeat.

    def broker_stamp_ms(self, frame) -> Optional[int]:
        """When the message was sent (ms since the epoch), where the broker says so: ActiveMQ
        stamps every message it is sent without a ``timestamp`` header (checked: a STOMP SEND
        without one arrives with the broker's time; one with ``timestamp:5`` keeps 5; JMS producers
        set it to their send time); on RabbitMQ a ``timestamp`` header is the producer's own, if
        any, and is not used."""
        return _int(frame.headers.get("timestamp")) if self.broker_stamps else None

    def active_at(self) -> Optional[float]:
        """When bytes last came from the broker: a large frame still arriving is not silence (an
        ActiveMQ batch read with a 5 MB message on a busy machine ended early at the quiet period)."""
        return self.client.received_at

    # depth, depth_in_order: unknown in STOMP (the base's None)

    def buffered(self) -> int:
        return self.client.pending_messages

    def close(self) -> None:
        try:
            self.client.disconnect(timeout=2.0)
        except Exception:  # noqa: BLE001 - a broken connection cannot say goodbye
            self.client.close()


def not_yet_acked(token, acked: dict) -> list:
    """Of a commit's ``token`` (``(seq, frame)`` pairs, see ``StompConsumer.token``), those whose
    subscription was last acknowledged (``acked``: id -> seq) before them: a subscription whose last
    frame is acknowledged already gets no ACK (ActiveMQ would answer an ERROR, RabbitMQ an unknown
    delivery tag; see the module docstring)."""
    return [(seq, frame) for seq, frame in token if seq > acked.get(frame.headers.get("subscription"), 0)]


def last_of_each_subscription(frames: list) -> list:
    """Of ``frames`` (in delivery order), the last of each subscription, in delivery order: the
    ACKs that acknowledge them all on ActiveMQ (cumulative per subscription) and on RabbitMQ
    (cumulative over the connection), each naming a message no earlier ACK settled."""
    last: dict = {}
    for i, frame in enumerate(frames):
        last[frame.headers.get("subscription")] = (i, frame)
    return [frame for _, frame in sorted(last.values(), key=itemgetter(0))]


#: the driver's count of what an availableNow run with ingest=executors reads: none (STOMP tells no queue depth)
queue_depth = None


def connect_consumer(opts: Options, attempt: int = 0) -> StompConsumer:
    return StompConsumer(opts, attempt)
