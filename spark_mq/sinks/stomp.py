"""The ``stomp`` sink: rows sent as STOMP 1.0 SEND frames inside BEGIN ... COMMIT, one transaction per
partition per batch.

Columns: ``body`` (binary or string, required; a string body is sent as text, which ActiveMQ delivers
as a TextMessage), ``destination`` (string; default: option ``destination``) and ``headers``
(map<string,string>). Every message also carries the deterministic message id in the header named by
``messageIdHeader`` (default ``spark-mq-message-id``) unless the row's headers set it, and
``persistent`` when that option is given.

Per task: ``BEGIN``, the SEND frames, then ``COMMIT`` with a receipt that the task waits for: its only
round trip. On RabbitMQ the last SEND carries a receipt too, waited for as well: RabbitMQ answers a
COMMIT's receipt before the messages are on disk, that SEND's only once it has confirmed it
(``StompClient.send_and_commit``). A failure
sends ``ABORT`` (with a receipt, bounded wait); a broken connection is aborted by the broker.

Entry points (called by the DataSource in ``spark_mq.datasources``): ``create_writer`` and
``create_stream_writer``.
"""

from __future__ import annotations

from pyspark.sql.types import StructType

from spark_mq.errors import OptionError
from spark_mq.options import STOMP, Options
from spark_mq.sinks import values as V
from spark_mq.sinks.columns import ColumnPlan, ColumnSpec, Kind
from spark_mq.sinks.plan import build_plan
from spark_mq.sinks.writer import Encoder, Session, SinkPlan, make_stream_writer, make_writer

__all__ = ["COLUMNS", "create_writer", "create_stream_writer", "StompEncoder", "StompSession"]

COLUMNS = (
    ColumnSpec("body", Kind.BODY, required=True, doc="Message body (string bodies are sent as text)."),
    ColumnSpec("destination", Kind.STRING, doc="Destination, e.g. /queue/a (default: option destination)."),
    ColumnSpec("headers", Kind.STRING_MAP, doc="Extra SEND headers."),
)
_PERSISTENT = "persistent"
_ABORT_TIMEOUT = 30.0


def _check(opts: Options, columns: ColumnPlan) -> None:
    if "destination" not in columns and not opts.get("destination"):
        raise OptionError("the stomp sink needs a destination: give option 'destination' (e.g. /queue/orders) "
                          "or a 'destination' column")


class StompEncoder(Encoder):
    """Arrow rows -> ``(destination, body, headers)`` tuples."""

    def __init__(self, plan: SinkPlan) -> None:
        opts = plan.options
        cols = plan.columns
        self._body = cols.index("body")
        self._destination = cols.index("destination")
        self._headers = cols.index("headers")
        self._text = plan.columns.type_of("body") == "string"
        self._default_destination = opts.get("destination")
        self._id_header = opts.get("messageIdHeader") or "spark-mq-message-id"
        persistent = opts.get("persistent")
        self._fixed = {} if persistent is None else {_PERSISTENT: "true" if persistent else "false"}

    def encode(self, batch, id_prefix: str, first_seq: int):
        n = batch.num_rows
        column = batch.column
        body_array = column(self._body)
        if self._text:  # keep text as str: the client sends it without content-length (a text message)
            body = ["" if v is None else v for v in body_array.to_pylist()]
            size = sum(len(b.encode("utf-8")) for b in body)
        else:
            body = V.bodies(body_array)
            size = sum(map(len, body))
        destination = V.strings(None if self._destination is None else column(self._destination),
                                self._default_destination, n)
        extra = V.string_maps(None if self._headers is None else column(self._headers), n)
        id_header = self._id_header
        fixed = self._fixed
        messages = []
        append = messages.append
        seq = first_seq
        for dest, payload, more in zip(destination, body, extra):
            if dest is None:
                raise V.SinkDataError(f"row {seq} of the partition has a null destination and no default "
                                      f"(option 'destination')")
            headers = dict(fixed) if fixed else {}
            if more:
                headers.update(more)
            if id_header not in headers:
                headers[id_header] = f"{id_prefix}{seq}"
            append((dest, payload, headers))
            seq += 1
        return messages, size


class StompSession(Session):
    """A STOMP connection; one named transaction at a time."""

    def __init__(self, opts: Options) -> None:
        from spark_mq.clients.connect import connect_stomp

        self.client = connect_stomp(opts)
        self.transaction = None
        self._last = None  # the task's last message, sent with the COMMIT
        self.commit_timeout = opts.get("commitTimeout") or 120.0

    def begin(self, options: Options) -> None:
        self.commit_timeout = options.get("commitTimeout") or 120.0
        self.transaction = self.client.begin()
        self._last = None

    def publish(self, messages: list) -> None:
        # the task's last message is held back: it goes with the COMMIT (``send_and_commit``), which
        # on RabbitMQ is what makes the COMMIT wait for the disk
        if not messages:
            return
        send = self.client.send
        tx = self.transaction
        if self._last is not None:
            destination, body, headers = self._last
            send(destination, body, headers=headers, transaction=tx)
        for destination, body, headers in messages[:-1]:
            send(destination, body, headers=headers, transaction=tx)
        self._last = messages[-1]

    def commit(self) -> None:
        tx, self.transaction = self.transaction, None
        last, self._last = self._last, None
        if last is None:
            self.client.commit(tx, receipt=True, timeout=self.commit_timeout)
        else:
            destination, body, headers = last
            self.client.send_and_commit(tx, destination, body, headers=headers, timeout=self.commit_timeout)

    def rollback(self) -> None:
        tx, self.transaction = self.transaction, None
        self._last = None
        if tx is not None and self.client.connected:
            self.client.abort(tx, receipt=True, timeout=min(self.commit_timeout, _ABORT_TIMEOUT))

    def healthy(self) -> bool:
        return self.client.connected and self.transaction is None

    def close(self, timeout: float) -> None:
        try:
            if self.client.connected:
                self.client.disconnect(timeout)
        finally:
            self.client.close()


def _plan(options, schema: StructType, overwrite: bool, streaming: bool) -> SinkPlan:
    return build_plan(STOMP, options, schema, overwrite, streaming=streaming, columns=COLUMNS,
                      open_session=StompSession, make_encoder=StompEncoder, check=_check)


def create_writer(options, schema: StructType, overwrite: bool):
    """``df.write.format("stomp")``: a DataSourceArrowWriter."""
    return make_writer(_plan(options, schema, overwrite, streaming=False))


def create_stream_writer(options, schema: StructType, overwrite: bool):
    """``df.writeStream.format("stomp")``: the Arrow stream writer (pyspark 4.1+) or the Row writer."""
    return make_stream_writer(_plan(options, schema, overwrite, streaming=True))
