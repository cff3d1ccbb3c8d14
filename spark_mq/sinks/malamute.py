"""The ``malamute`` sink: rows sent to a Malamute stream, mailbox or service, then a PING round trip.

Where messages go is chosen by exactly one option: ``stream`` (STREAM-SEND as a producer of that
stream), ``mailbox`` (MAILBOX-SEND; the option is the default recipient) or ``service``
(SERVICE-SEND; the option is the default service). Columns: ``body`` (binary or string, required),
``subject`` (string; default: option ``subject``), ``address`` (string: the recipient mailbox or the
service, per row; mailbox and service modes only), ``frames`` (array<binary|string>: when non-null,
the message's whole content, replacing ``body``) and ``tracker`` (string; mailbox and service modes).

Malamute has no transactions: the sink sends, then waits for a PING/PONG round trip as a flush barrier
(every message before it has been processed by the broker), also after every ``flushBytes`` so the
data in flight stays bounded. A task that fails part-way cannot take back what it already sent: a
replay sends those rows again. Mailbox and service messages carry the deterministic message id as
their tracker (unless a ``tracker`` column supplies one), so a consumer can drop such duplicates;
stream messages have no field for it (put an id in the subject or the frames if you need one).

Entry points (called by the DataSource in ``spark_mq.datasources``): ``create_writer`` and
``create_stream_writer``.
"""

from __future__ import annotations

import enum
import os

from pyspark.sql.types import StructType

from spark_mq.errors import ConnectionClosedError, OptionError
from spark_mq.options import MALAMUTE, Options
from spark_mq.sinks import values as V
from spark_mq.sinks.columns import ColumnPlan, ColumnSpec, Kind
from spark_mq.sinks.plan import build_plan
from spark_mq.sinks.writer import Encoder, Session, SinkPlan, make_stream_writer, make_writer

__all__ = ["COLUMNS", "Mode", "create_writer", "create_stream_writer", "MalamuteEncoder", "MalamuteSession"]


class Mode(enum.Enum):
    STREAM = "stream"
    MAILBOX = "mailbox"
    SERVICE = "service"


COLUMNS = (
    ColumnSpec("body", Kind.BODY, required=True, doc="Message body: the single frame of the content."),
    ColumnSpec("subject", Kind.STRING, doc="Subject (default: option subject)."),
    ColumnSpec("address", Kind.STRING, doc="Recipient mailbox or service (mailbox/service modes)."),
    ColumnSpec("frames", Kind.FRAMES, doc="The whole content as frames (replaces body where not null)."),
    ColumnSpec("tracker", Kind.STRING, doc="Tracker (mailbox/service modes; default: the message id)."),
)
_MS = 1000


def mode_of(opts: Options) -> Mode:
    given = [m for m in Mode if m.value in opts.provided]
    if len(given) != 1:
        raise OptionError("the malamute sink needs exactly one of the options 'stream', 'mailbox', 'service' "
                          f"(got {', '.join(m.value for m in given) or 'none'})")
    return given[0]


def _check(opts: Options, columns: ColumnPlan) -> None:
    mode = mode_of(opts)
    if mode is Mode.STREAM:
        if not opts.get("stream"):
            raise OptionError("option 'stream' must name the stream to produce to")
        for name in ("address", "tracker"):
            if name in columns:
                raise OptionError(f"column {name!r} is only used in mailbox and service modes, not with 'stream'")
    elif not opts.get(mode.value) and "address" not in columns:
        raise OptionError(f"option {mode.value!r} is empty: give the default recipient, or an 'address' column")


class MalamuteEncoder(Encoder):
    """Arrow rows -> ``(address, subject, content frames, tracker)`` tuples."""

    def __init__(self, plan: SinkPlan) -> None:
        opts = plan.options
        cols = plan.columns
        self.mode = mode_of(opts)
        self._body = cols.index("body")
        self._subject = cols.index("subject")
        self._address = cols.index("address")
        self._frames = cols.index("frames")
        self._tracker = cols.index("tracker")
        self._default_subject = opts.get("subject") or ""
        self._default_address = opts.get(self.mode.value) or ""

    def encode(self, batch, id_prefix: str, first_seq: int):
        n = batch.num_rows
        column = batch.column
        body = V.bodies(column(self._body))
        subject = V.strings(None if self._subject is None else column(self._subject), self._default_subject, n)
        extra = V.frames(None if self._frames is None else column(self._frames), n)
        content = [[b] if f is None else f for b, f in zip(body, extra)]
        size = sum(sum(map(len, c)) for c in content)
        if self.mode is Mode.STREAM:
            return list(zip(V.constant(None, n), subject, content, V.constant("", n))), size
        address = V.strings(None if self._address is None else column(self._address), self._default_address, n)
        tracker = V.message_ids(None if self._tracker is None else column(self._tracker), id_prefix, first_seq, n)
        messages = list(zip(address, subject, content, tracker))
        for seq, (target, _, _, _) in enumerate(messages, first_seq):
            if not target:
                raise V.SinkDataError(f"row {seq} of the partition has no recipient: null 'address' and no "
                                      f"default (option {self.mode.value!r})")
        return messages, size


class MalamuteSession(Session):
    """An anonymous (or ``<address>.<pid>``) Malamute client; a producer of at most one stream at a time."""

    atomic = False  # Malamute has no transactions

    def __init__(self, opts: Options) -> None:
        from spark_mq.clients.connect import connect_malamute

        address = opts.get("address")
        self.client = connect_malamute(opts, f"{address}.{os.getpid()}" if address else "")
        self.stream = None
        self._configure(opts)

    def _configure(self, opts: Options) -> None:
        self.mode = mode_of(opts)
        self.flush_bytes = opts.get("flushBytes") or (1 << 20)
        self.commit_timeout = opts.get("commitTimeout") or 120.0
        self.send_timeout_ms = int((opts.get("sendTimeout") or 0) * _MS)
        self.target_stream = opts.get("stream")
        self._unflushed = 0

    def begin(self, options: Options) -> None:
        self._configure(options)
        # a broker that restarts (or expires this client) during the task drops what it is sent
        # until the client has re-opened: such a task must fail (Spark retries it; the trackers
        # make the retry deduplicable), never report its rows as written
        self._recoveries = self.client.recoveries
        if self.mode is Mode.STREAM and self.stream != self.target_stream:
            self.client.set_producer(self.target_stream)
            self.stream = self.target_stream

    def publish(self, messages: list) -> None:
        client = self.client
        if self.mode is Mode.STREAM:
            send = client.send
            for _, subject, content, _ in messages:
                send(subject, content)
                self._unflushed += sum(map(len, content))
        else:
            send = client.sendto if self.mode is Mode.MAILBOX else client.sendfor
            timeout = self.send_timeout_ms
            for address, subject, content, tracker in messages:
                send(address, subject, content, tracker, timeout)
                self._unflushed += sum(map(len, content))
        if self._unflushed >= self.flush_bytes:
            self._barrier()  # bounds what sits in the pipe and the socket queues

    def _barrier(self) -> None:
        """A PING round trip: everything sent before it was taken by the broker, unless the broker
        forgot this client meanwhile (a failed PING, or a recovery since ``begin``)."""
        self.client.ping(self.commit_timeout)
        self._unflushed = 0
        if self.client.recoveries != self._recoveries:
            raise ConnectionClosedError(
                f"the Malamute broker at {self.client.endpoint} forgot this client during the write (it "
                f"restarted or expired the client): messages sent before may have been dropped, so the "
                f"task fails and Spark retries it")

    def commit(self) -> None:
        self._barrier()

    def rollback(self) -> None:
        """Nothing sent can be taken back; the caller drops this session."""

    def healthy(self) -> bool:
        return self.client.connected

    def close(self, timeout: float) -> None:
        self.client.close(timeout)


def _plan(options, schema: StructType, overwrite: bool, streaming: bool) -> SinkPlan:
    return build_plan(MALAMUTE, options, schema, overwrite, streaming=streaming, columns=COLUMNS,
                      open_session=MalamuteSession, make_encoder=MalamuteEncoder, check=_check)


def create_writer(options, schema: StructType, overwrite: bool):
    """``df.write.format("malamute")``: a DataSourceArrowWriter."""
    return make_writer(_plan(options, schema, overwrite, streaming=False))


def create_stream_writer(options, schema: StructType, overwrite: bool):
    """``df.writeStream.format("malamute")``: the Arrow stream writer (pyspark 4.1+) or the Row writer."""
    return make_stream_writer(_plan(options, schema, overwrite, streaming=True))
