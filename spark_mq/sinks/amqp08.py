"""The ``amqp08`` sink: rows published to an AMQP 0-8 exchange, one transaction per partition per batch.

Columns: ``body`` (binary or string, required); ``exchange`` and ``routing_key`` (strings; default
from the options ``exchange`` (else the default exchange "") and ``routingKey``); ``headers``
(map<string,string>, the headers table); and every basic property as a column of its own:
``content_type``, ``content_encoding``, ``delivery_mode``, ``priority``, ``correlation_id``,
``reply_to``, ``expiration``, ``message_id``, ``timestamp`` (timestamp or bigint seconds), ``type``,
``user_id``, ``app_id``, ``cluster_id``. A null value takes the option's default. ``message_id``
defaults to the deterministic id (``spark_mq.sinks.writer``).

Per task: one channel, the rows published with ``publish_many`` (frames of many messages per socket
write, no round trip), then one wait: the task's only round trip. ``publishMode`` says which:
- ``tx`` (the default): the channel in transaction mode (``tx.select`` once per pooled channel); ``tx.commit`` and its
  commit-ok end the task, a failure sends ``tx.rollback`` (nothing of a failed task is delivered);
- ``confirm`` (AMQP 0-9-1): the channel in confirm mode (``confirm.select``); the task ends when the broker
  has acked every message it published (a nack fails it). Nothing can be taken back: a failed task's
  messages may be delivered, and its retry publishes them again under the same message ids;
``tx`` is the default: on RabbitMQ 4 (a quorum queue, persistent messages) it wrote 1.4 times as fast as
``confirm`` (``python -m bench rabbitmq4``).
``channel.flow`` pauses the writer (up to ``flowTimeout``); TCP back-pressure slows it.

Entry points (called by the DataSource in ``spark_mq.datasources``): ``create_writer`` and
``create_stream_writer``.
"""

from __future__ import annotations

from pyspark.sql.types import StructType

from spark_mq.errors import OptionError
from spark_mq.options import AMQP08, Options
from spark_mq.protocol.amqp08.spec import BasicProperties
from spark_mq.sinks import values as V
from spark_mq.sinks.columns import ColumnPlan, ColumnSpec, Kind
from spark_mq.sinks.plan import build_plan
from spark_mq.sinks.writer import Encoder, Session, SinkPlan, make_stream_writer, make_writer

__all__ = ["COLUMNS", "create_writer", "create_stream_writer", "AmqpEncoder", "AmqpSession"]

#: Kinds of the basic properties, in BasicProperties.FIELDS order (headers is the map column).
_PROPERTY_KINDS = {
    "content_type": Kind.STRING, "content_encoding": Kind.STRING, "headers": Kind.STRING_MAP,
    "delivery_mode": Kind.INTEGER, "priority": Kind.INTEGER, "correlation_id": Kind.STRING,
    "reply_to": Kind.STRING, "expiration": Kind.STRING, "message_id": Kind.STRING,
    "timestamp": Kind.TIMESTAMP, "type": Kind.STRING, "user_id": Kind.STRING, "app_id": Kind.STRING,
    "cluster_id": Kind.STRING,
}
if tuple(_PROPERTY_KINDS) != tuple(BasicProperties.FIELDS):  # pragma: no cover - guards the generated spec
    raise ImportError("spark_mq.sinks.amqp08: BasicProperties fields changed; update _PROPERTY_KINDS")

COLUMNS = (
    ColumnSpec("body", Kind.BODY, required=True, doc="Message body."),
    ColumnSpec("exchange", Kind.STRING, doc="Exchange to publish to (default: option exchange, else \"\")."),
    ColumnSpec("routing_key", Kind.STRING, doc="Routing key (default: option routingKey)."),
) + tuple(ColumnSpec(name, kind, doc=f"Basic property {name}.") for name, kind in _PROPERTY_KINDS.items())

_OCTET_PROPERTIES = {"delivery_mode": (1, 2), "priority": (0, 9)}


def _check(opts: Options, columns: ColumnPlan) -> None:
    if "routing_key" not in columns and opts.get("routingKey") is None:
        raise OptionError("the amqp08 sink needs a routing key: give option 'routingKey' (it may be empty, "
                          "e.g. for a fanout exchange) or a 'routing_key' column")
    if opts.get("publishMode") == "confirm" and (opts.get("protocol") or "0-8") == "0-8":
        publish_mode(opts, "0-8")  # fails at query start, naming both options


class AmqpEncoder(Encoder):
    """Arrow rows -> ``(exchange, routing_key, body, BasicProperties)`` tuples for ``publish_many``."""

    def __init__(self, plan: SinkPlan) -> None:
        opts = plan.options
        cols = plan.columns
        self._body = cols.index("body")
        self._exchange = cols.index("exchange")
        self._routing_key = cols.index("routing_key")
        self._default_exchange = opts.get("exchange") or ""
        self._default_routing_key = opts.get("routingKey") or ""
        self._props = tuple((name, cols.index(name)) for name in BasicProperties.FIELDS)
        self._defaults = {"delivery_mode": opts.get("deliveryMode"), "content_type": opts.get("contentType")}

    def encode(self, batch, id_prefix: str, first_seq: int):
        n = batch.num_rows
        column = batch.column
        body = V.bodies(column(self._body))
        exchange = V.strings(None if self._exchange is None else column(self._exchange), self._default_exchange, n)
        routing_key = V.strings(None if self._routing_key is None else column(self._routing_key),
                                self._default_routing_key, n)
        props = []
        for name, index in self._props:
            array = None if index is None else column(index)
            kind = _PROPERTY_KINDS[name]
            default = self._defaults.get(name)
            if name == "message_id":
                props.append(V.message_ids(array, id_prefix, first_seq, n))
            elif kind is Kind.STRING_MAP:
                props.append(V.string_maps(array, n))
            elif kind is Kind.INTEGER:
                lo, hi = _OCTET_PROPERTIES[name]
                props.append(V.octets(array, default, n, name, lo, hi))
            elif kind is Kind.TIMESTAMP:
                props.append(V.epoch_seconds(array, n, name))
            else:
                props.append(V.strings(array, default, n))
        properties = map(BasicProperties, *props)
        messages = list(zip(exchange, routing_key, body, properties))
        return messages, sum(map(len, body))


def publish_mode(opts: Options, protocol: str) -> str:
    """``tx`` or ``confirm``: option publishMode for a connection speaking ``protocol``."""
    mode = opts.get("publishMode") or "tx"
    if mode == "confirm" and protocol != "0-9-1":
        raise OptionError(f"publishMode=confirm needs AMQP 0-9-1, and this connection speaks {protocol}: "
                          "set option protocol to 0-9-1 (or auto), or publishMode to tx")
    return mode


class AmqpSession(Session):
    """A connection and one channel, in transaction mode or in confirm mode (``publish_mode``)."""

    def __init__(self, opts: Options) -> None:
        from spark_mq.clients.connect import connect_amqp08

        self.connection = connect_amqp08(opts)
        try:
            self.mode = publish_mode(opts, self.connection.protocol)
            self.atomic = self.mode == "tx"
            self.channel = self.connection.channel()
            if self.atomic:
                self.channel.tx_select()
            else:
                self.channel.confirm_select()
        except BaseException:
            self.connection.close(1.0)
            raise
        self._settings(opts)

    def _settings(self, opts: Options) -> None:
        self.flush_bytes = opts.get("flushBytes") or (1 << 20)
        self.flow_timeout = opts.get("flowTimeout") or 3600.0
        self.commit_timeout = opts.get("commitTimeout") or 120.0

    def begin(self, options: Options) -> None:
        self._settings(options)  # tx mode: a transaction is always open on the channel

    def publish(self, messages: list) -> None:
        self.channel.publish_many(messages, batch_bytes=self.flush_bytes, timeout=self.flow_timeout)

    def commit(self) -> None:
        if self.atomic:
            self.channel.tx_commit(timeout=self.commit_timeout)
        else:
            self.channel.wait_for_confirms(timeout=self.commit_timeout)

    def rollback(self) -> None:
        if self.atomic:
            self.channel.tx_rollback(timeout=min(self.commit_timeout, 30.0))
        # confirm mode: what was published is the broker's; the session is dropped after a failed task

    def healthy(self) -> bool:
        return self.channel.is_open and self.connection.is_open

    def close(self, timeout: float) -> None:
        self.connection.close(timeout)


def _plan(options, schema: StructType, overwrite: bool, streaming: bool) -> SinkPlan:
    return build_plan(AMQP08, options, schema, overwrite, streaming=streaming, columns=COLUMNS,
                      open_session=AmqpSession, make_encoder=AmqpEncoder, check=_check)


def create_writer(options, schema: StructType, overwrite: bool):
    """``df.write.format("amqp08")``: a DataSourceArrowWriter."""
    return make_writer(_plan(options, schema, overwrite, streaming=False))


def create_stream_writer(options, schema: StructType, overwrite: bool):
    """``df.writeStream.format("amqp08")``: the Arrow stream writer (pyspark 4.1+) or the Row writer."""
    return make_stream_writer(_plan(options, schema, overwrite, streaming=True))
