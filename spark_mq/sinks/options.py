"""Sink-only options of the three formats, defined once with the shared ``spark_mq.options`` machinery.

Responsible for: the definitions (name, type, default, documentation) of the options that only
writers accept, and ``parse_sink_options``, which parses a writer's raw Spark options against the
shared connection options plus these. The connection options themselves (uri, host, credentials,
TLS, exchange, routingKey, destination, stream, mailbox, service...) are defined in
``spark_mq.options``; defaults that a column can override are documented there and in docs/sinks.md.
Not responsible for connecting or for checking the input columns (``spark_mq.sinks.columns``).
"""

from __future__ import annotations

from typing import Mapping

from spark_mq.options import (
    AMQP08, FORMATS, MALAMUTE, SINK, STOMP, OptionSpec, Options, OptionType, define, parse_options,
)
from spark_mq.schema import ID_HEADER

__all__ = ["SINK_OPTIONS", "parse_sink_options", "MESSAGE_ID_HEADER"]

_SNK = frozenset({SINK})

#: The STOMP header that carries the deterministic message id unless the row's headers name one.
MESSAGE_ID_HEADER = ID_HEADER

SINK_OPTIONS = define(
    # -- every format --------------------------------------------------------------------------
    OptionSpec("commitLogLocation", OptionType.STRING, formats=FORMATS, directions=_SNK, doc=(
        "Driver-side directory (local path) where the sink records, per batch id, how many messages and "
        "bytes every partition committed to the broker: one JSON file per batch, replaced (never added to) "
        "when a batch is committed again, so the record is idempotent by batch id. Default: "
        "<checkpointLocation>/spark-mq-sink-commits when checkpointLocation is a local path; otherwise no "
        "record is kept.")),
    OptionSpec("commitTimeout", OptionType.DURATION, default=120.0, minimum=0.1, formats=FORMATS,
               directions=_SNK, doc=(
                   "How long a task waits for the broker to confirm its transaction (AMQP tx.commit-ok, STOMP "
                   "COMMIT receipt, Malamute PONG) before it fails.")),
    OptionSpec("flowTimeout", OptionType.DURATION, default=3600.0, minimum=0.1, formats=FORMATS,
               directions=_SNK, doc=(
                   "How long a task may stay paused by broker flow control (AMQP channel.flow) before it fails; "
                   "TCP back-pressure only slows the writer.")),
    OptionSpec("flushBytes", OptionType.SIZE, default=1 << 20, minimum=1, formats=FORMATS, directions=_SNK,
               doc=("Pipelining: messages are written in groups of about this many bytes (AMQP: one socket "
                    "write; Malamute: followed by a PING round trip, which bounds the memory in flight).")),
    OptionSpec("cacheConnections", OptionType.BOOL, default=True, formats=FORMATS, directions=_SNK, doc=(
        "Keep the broker connection open in the executor's Python worker between tasks and micro-batches "
        "(a connection is used by one task at a time and dropped after any error).")),
    OptionSpec("writeName", OptionType.STRING, formats=FORMATS, directions=_SNK, doc=(
        "A name for this write, hashed into its message ids. Ids inside a micro-batch are "
        "<queryId>:<batchId>:<tag>:<partition>:<seq>, where the tag hashes the destination options, the column "
        "names and the partition's first row, so two writes of one batch in foreachBatch get different ids "
        "and a replay of the batch gets the same ones. Two writes of one batch to the same place with the "
        "same columns whose partitions start with the same row need distinct writeNames; keep a write's "
        "name when the query restarts.")),
    OptionSpec("ignoreExtraColumns", OptionType.BOOL, default=False, formats=FORMATS, directions=_SNK, doc=(
        "Ignore input columns the sink does not know (default: fail at query start, naming the column, "
        "which catches misspelt column names).")),
    # -- AMQP 0-8 ------------------------------------------------------------------------------
    OptionSpec("deliveryMode", OptionType.INT, minimum=1, maximum=2, formats={AMQP08}, directions=_SNK, doc=(
        "Default delivery-mode property: 2 persistent, 1 transient (default: unset, the broker's default, "
        "transient). A delivery_mode column overrides it per row.")),
    OptionSpec("publishMode", OptionType.ENUM, default="tx", choices=("tx", "confirm"), formats={AMQP08},
               directions=_SNK, doc=(
                   "How a task's messages are committed. tx: one AMQP transaction per task (tx.select, "
                   "tx.commit; a failed task's messages are rolled back and never delivered). confirm: "
                   "publisher confirms (AMQP 0-9-1 only): the task succeeds once the broker has acked every "
                   "message (a nack or a timeout fails it; messages a failed task published may be delivered, "
                   "and the retry publishes them again under the same message ids). tx is the default: on RabbitMQ 4 it "
                   "wrote 1.4 times as fast as confirm (python -m bench rabbitmq4).")),
    OptionSpec("contentType", OptionType.STRING, formats={AMQP08}, directions=_SNK,
               doc="Default content-type property; a content_type column overrides it per row."),
    # -- STOMP ---------------------------------------------------------------------------------
    OptionSpec("persistent", OptionType.BOOL, formats={STOMP}, directions=_SNK, doc=(
        "Send the persistent header (true/false) on every message (default: not sent: the broker's default, "
        "non-persistent on both RabbitMQ and ActiveMQ). A persistent key in the headers column wins.")),
    OptionSpec("messageIdHeader", OptionType.STRING, default=MESSAGE_ID_HEADER, formats={STOMP},
               directions=_SNK, doc=(
                   "Header that carries the deterministic message id (the broker's own message-id is replaced "
                   "on delivery, so the id travels in a header of its own) unless the row's headers set it.")),
    # -- Malamute ------------------------------------------------------------------------------
    OptionSpec("subject", OptionType.STRING, default="", formats={MALAMUTE}, directions=_SNK,
               doc="Default message subject; a subject column overrides it per row."),
    OptionSpec("sendTimeout", OptionType.DURATION, default=0.0, minimum=0, formats={MALAMUTE},
               directions=_SNK, doc=(
                   "Mailbox and service sends: how long the broker keeps an undelivered message (0: no limit).")),
)


def parse_sink_options(raw: Mapping[str, str], fmt: str) -> Options:
    """The writer's options for ``fmt`` (amqp08, stomp, malamute), typed and checked."""
    return parse_options(raw, format=fmt, direction=SINK)
