"""The ``malamute`` source: a Malamute stream reader, mailbox or service worker for the ingest loop.

Responsible for: the Malamute-specific parts only: ``stream`` + ``pattern`` (STREAM-READ), or
``streams`` (a JSON object of stream to pattern: one STREAM-READ each on the one client, a row's
``destination`` then the stream of its delivery, the STREAM-DELIVER's address), ``mailbox (the client connects with that address and reads its mailbox) or ``service`` +
``pattern`` (SERVICE-OFFER as a worker), and a delivery as a row (``body`` is the first frame,
``frames`` all of them; ``sender``, ``address``, ``subject``, ``tracker``). The ingest takes a group
of deliveries as one record batch built by columns (``poll_batch``): the receiver copies each
content frame once, into a buffer reused from group to group, and the body column is that buffer.

    spark.readStream.format("malamute").option("uri", "tcp://host:9999").option("stream", "weather")
        .option("pattern", "^temp").option("logLocation", "/shared/weather-log").load()

Malamute has no acknowledgements: once the client holds a message the broker forgets it, so only
the source log protects it (appended and fsynced in groups, as in every mode). There is no queue
depth either: availableNow ends after ``quietPeriod`` without messages, counted only while the
broker answers the client's heartbeats (``heard_at``), and after ``availableNowTimeout`` at the latest. There is no pause message
either: while the log is over its bound the ingest stops reading deliveries (it keeps the
connection's heartbeat going), the receiver holds at most its 1 MiB read buffer of them, and the
rest waits in TCP and the broker (a mailbox or service queue keeps it; a stream drops what its client's queue cannot
take, as Malamute streams do).
"""

from __future__ import annotations

import time
import uuid
from operator import itemgetter

import numpy as np
import pyarrow as pa

from spark_mq import arrowcols as A
from spark_mq import schema as S
from spark_mq.clients.connect import connect_malamute
from spark_mq.errors import ConnectionClosedError, OptionError
from spark_mq.options import Options
from spark_mq.protocol.zmtp import BodyBuffer
from spark_mq.sources.consumer import Consumer
from spark_mq.sources.formats.sourcelist import stream_patterns

__all__ = ["MalamuteConsumer", "connect_consumer", "validate"]

#: seconds without a delivery that end the gathering of a group (else ``fsyncInterval``, the group's
#: count or bytes, or Spark planning a batch: ``Consumer.cut``, which ends it at once). Was 1 ms: at
#: 1,000 msg/s a group then held one or two messages, each group an append, an fsync and a record batch;
#: 5 ms halved the reader's CPU there (0.24 -> 0.13 cores) and brought the batches closer together
#: (every 250 -> 223 ms; bench latency --only=malamute, 2 passes each, bench/HISTORY.md)
_DRAIN_WAIT = 0.005
# bodies gathered into one group (one record batch) at most, whatever the group's count: far below
# Arrow's 2 GiB per binary column (the last read may pass it by one receive buffer or one frame)
_GROUP_BYTES_MAX = 256 << 20
_BODY_KEEP = 64 << 20  # a body buffer larger than this is kept only while groups use a quarter of it
_BODIES_KEPT = 8  # body buffers kept for reuse: more than the groups the log holds unwritten (4) and the one received


def streams(opts: Options) -> tuple:
    """The ``(stream, pattern)`` pairs the source reads: of ``streams``, or ``stream`` with ``pattern``."""
    if opts.get("streams") is not None:
        return stream_patterns(opts)
    return ((opts.stream, opts.pattern),) if opts.get("stream") else ()


def validate(opts: Options) -> None:
    given = [k for k in ("stream", "streams", "mailbox", "service") if opts.get(k) is not None and opts.get(k) != ""]
    if len(given) != 1:
        raise OptionError("the malamute source needs exactly one of the options 'stream', 'streams', 'mailbox', "
                          "'service'" + (f" (got {', '.join(given)})" if given else ""))
    if opts.get("streams") is not None:
        if "pattern" in opts.provided:
            raise OptionError("options 'streams' and 'pattern' contradict each other: with 'streams' each stream "
                              'has its pattern in the JSON object, e.g. {"weather": "^temp", "alerts": ""}')
        streams(opts)  # its errors name the option
    if opts.get("mailbox") and "," in opts.mailbox:
        raise OptionError(f"option 'mailbox' is {opts.mailbox!r}: a Malamute client has one address, so one "
                          f"connection reads one mailbox; several mailboxes are not supported by one source "
                          f"(run a query per mailbox)")
    if opts.get("mailbox") and opts.get("address") and opts.address != opts.mailbox:
        raise OptionError("options 'mailbox' and 'address' contradict each other: a mailbox is read as its address")
    consumers = opts.get("consumers") or 1
    shared_out = opts.get("streams") or {}
    if consumers > 1 and shared_out and len(shared_out) < consumers:
        raise OptionError(f"option 'consumers' is {consumers}, but option 'streams' names {len(shared_out)} stream"
                          f"{'s' if len(shared_out) != 1 else ''}: each consumer (lane) reads streams of its own (a "
                          f"stream gives every reader each message), so at most {len(shared_out)} consumers")
    if consumers > 1 and not opts.get("service") and not shared_out:
        what = "stream" if opts.get("stream") else "mailbox"
        why = ("a Malamute stream delivers every message to each of its consumers, so each lane would log all of "
               "them" if what == "stream" else
               "a Malamute mailbox has one address, and one client at a time can hold it")
        raise OptionError(f"option 'consumers' is {consumers}, but a malamute {what} cannot be split across "
                          f"connections: {why}. Use consumers=1 for a {what}, or a service (option 'service'), "
                          f"whose workers compete for the requests")


class MalamuteConsumer(Consumer):
    """No acknowledgements, no pause message, no queue depth: the base's no-ops and None serve."""

    stable_ids = False  # no redeliveries in Malamute; trackers are not unique
    returns_unacked = False  # closing loses what the client holds: batch reads take it all
    builds_batches = True
    #: several streams: a row's destination is its delivery's address (its stream), not ``destination``
    by_address = False

    def __init__(self, opts: Options, attempt: int = 0) -> None:
        self.opts = opts
        self.streams = streams(opts)
        if opts.get("mailbox"):
            address, self.destination = opts.mailbox, opts.mailbox
        else:
            address = opts.get("address") or f"spark-mq-{uuid.uuid4().hex[:12]}"
            self.destination = self.streams[0][0] if self.streams else opts.get("service")
        self.by_address = len(self.streams) > 1
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
        self._bodies: list = []  # the BodyBuffers groups are received into (reused), last used first
        self.client = connect_malamute(opts, address, start=attempt, client_class=MalamuteReceiver)
        try:
            if self.streams:
                for stream, pattern in self.streams:
                    self.client.set_consumer(stream, pattern)
            elif opts.get("service"):
                self.client.set_worker(opts.service, opts.pattern)
        except BaseException:
            self.client.close()
            raise

    def poll(self, max_count: int, timeout: float) -> list:
        msgs = self.client.poll(max_count, timeout, _DRAIN_WAIT, stop=self.cut)
        if not msgs:
            self._check_lost()
        return msgs

    def _check_lost(self) -> None:
        """After a poll that found the socket empty: give up a broker silent for too long."""
        lost = self.client.lost_for
        if lost > self._give_up:
            # the client would wait for this broker forever (ZeroMQ reconnects by itself); the
            # ingest's reconnect loop tries the other endpoints and fails the query after
            # ``brokerTimeout``. Nothing is unread: this poll found the socket empty.
            raise ConnectionClosedError(
                f"malamute broker at {self.client.endpoint} lost: still silent {lost:.0f}s after the client "
                f"declared it lost")

    def poll_batch(self, max_count: int, timeout: float, offset: int):
        """``poll``, with the group built as columns straight from the receive path: ``(count,
        record batch)`` with offsets from ``offset``, or ``(0, None)``. Every body is copied once out
        of the receive buffer, into the buffer the body column is built over; no ``bytes``, no row
        tuple per message (``bench/bench_ingest.py``)."""
        taken = self.client.poll(max_count, timeout, _DRAIN_WAIT, self._body_buffer(), _GROUP_BYTES_MAX, self.cut)
        if not taken:
            self._check_lost()
            return 0, None
        return len(taken), deliveries_batch(taken, None if self.by_address else self.destination, offset,
                                            int(time.time() * 1_000_000))

    def _body_buffer(self) -> BodyBuffer:
        """The buffer for the next group: the one used last that nothing holds any more, emptied
        (the log's write-behind holds a group's body buffer until the group is written: a few
        groups), else a new one. Up to ``_BODIES_KEPT`` are kept for reuse; a buffer grown far past
        what groups take (one large group) is let go."""
        bodies = self._bodies
        for i, body in enumerate(bodies):
            try:
                body.data.append(0)  # a bytearray whose memory a column holds cannot be resized
                body.data.pop()
            except BufferError:
                continue
            if len(body.data) > _BODY_KEEP and body.fill < len(body.data) // 4:
                del bodies[i]
                break
            del bodies[i]
            bodies.insert(0, body)
            body.fill = 0
            return body
        body = BodyBuffer()
        bodies.insert(0, body)
        del bodies[_BODIES_KEPT:]  # the oldest held one goes with its column
        return body

    def row(self, msg, offset: int, now_us: int) -> tuple:
        frames = msg.content  # a list of bytes (the client receives every frame as bytes)
        tracker = getattr(msg, "tracker", "") or ""
        return (frames[0] if frames else b"", msg.address if self.by_address else self.destination, tracker or None, now_us, None, False, offset,
                msg.sender, msg.address, msg.subject, tracker, S.frames_value(frames))

    def keepalive(self) -> None:
        self.client.keepalive()

    def heard_at(self) -> float:
        """When (``time.monotonic``) the broker was last heard from: the client pings every second
        and the broker answers, so silence from a broker that is there but stopped sending (paused,
        stalled) is told from an empty mailbox."""
        return self.client.heard_at

    def buffered(self) -> int:
        return self.client.buffered

    def close(self) -> None:
        self.client.close(timeout=1.0)


_CONSTANTS: dict = {}  # (value, rows, type) -> a column of that value: groups repeat a few
_CONSTANTS_MAX = 64     # columns kept at most (then all are dropped: a new set of values has come)
_CONSTANT_BYTES_MAX = 4 << 20  # a column larger than this (in value bytes) is not kept


def _constant(value, n: int, type_: pa.DataType) -> pa.Array:
    """``A.repeated(value, n, type_)``, built once for each value, count and type and then shared by
    every group that has them (an Arrow array is immutable; a record batch only refers to it): a
    group of deliveries mostly repeats the last group's headers, destination and row count."""
    key = (value, n, type_)
    column = _CONSTANTS.get(key)
    if column is None:
        column = A.repeated(value, n, type_)
        if column.nbytes <= _CONSTANT_BYTES_MAX:
            if len(_CONSTANTS) >= _CONSTANTS_MAX:
                _CONSTANTS.clear()
            _CONSTANTS[key] = column
    return column


def deliveries_batch(taken, destination: str, offset: int, now_us: int) -> pa.RecordBatch:
    """The source's record batch of the deliveries ``MalamuteReceiver.poll(..., body)`` took (a
    ``Deliveries``), ``destination`` the value of that column (None: each delivery's address): equal to ``build_batch`` of the deliveries' ``row``s (a unit test holds them to
    it), built by columns. The body column is the body buffer itself; a group mostly repeats one
    header (one dict for all), whose columns are then constants."""
    n = len(taken)
    schema = S.source_arrow_schema("malamute")
    types = dict(zip(schema.names, schema.types))
    fields = taken.fields
    if fields.count(fields[0]) == n:  # the same dict in every item: an identity test per item, in C
        one = fields[0]

        def header_col(get, name):
            return _constant(get(one), n, types[name])
    else:
        def header_col(get, name):
            return A.column([get(f) for f in fields], types[name])
    body = taken.body
    if taken.frames:  # some with other than one content frame: the frames column too
        listed = [None] * n
        for i, frames in taken.frames.items():
            listed[i] = frames
        frames_col = A.column(listed, types["frames"])
    else:
        frames_col = _constant(None, n, types["frames"])
    columns = {
        "body": A.binary_ends(memoryview(body.data)[taken.start:body.fill], taken.ends, taken.start, types["body"]),
        "destination": (_constant(destination, n, types["destination"]) if destination is not None
                        else header_col(itemgetter("address"), "destination")),
        "message_id": header_col(lambda f: f.get("tracker") or None, "message_id"),
        "timestamp": A.repeated(now_us, n, types["timestamp"]),
        "headers": _constant(None, n, types["headers"]),
        "redelivered": _constant(False, n, types["redelivered"]),
        "offset": pa.Array.from_buffers(types["offset"], n,
                                        [None, pa.py_buffer(np.arange(offset, offset + n, dtype=np.int64))]),
        **{k: header_col(itemgetter(k), k) for k in ("sender", "address", "subject")},
        "tracker": header_col(lambda f: f.get("tracker") or "", "tracker"),
        "frames": frames_col,
    }
    return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)


#: the driver's count of what an availableNow run with ingest=executors reads: none (Malamute tells no queue depth)
queue_depth = None


def connect_consumer(opts: Options, attempt: int = 0) -> MalamuteConsumer:
    return MalamuteConsumer(opts, attempt)
