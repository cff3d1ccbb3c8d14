"""``spark-mq tail URI [TARGET]``: print messages as they arrive, as text, JSON lines or raw bodies.

Queues are consumed (acknowledged as printed) unless ``--requeue`` is given; ``--max`` and
``--timeout`` end it (exit status 3 when ``--max`` was not reached), as do Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import decimal
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from spark_mq.apps.commands.common import AMQP_PROPERTIES, EXIT_INCOMPLETE, EXIT_OK, Stop, UsageError, err, redact
from spark_mq.apps.commands.target import Target, add_target_arguments, connection_options, resolve_target
from spark_mq.options import AMQP08, MALAMUTE, STOMP

__all__ = ["add_parser", "run", "Record"]

OUTPUTS = ("text", "json", "body")

_TAIL_DESC = """\
Print messages as they arrive; the URI's scheme selects the protocol.
  AMQP 0-8:  tail amqp://guest:guest@127.0.0.1:5672/%2F QUEUE --max 10
             tail amqp://... --exchange amq.topic --routing-key '#' --json     (a non-destructive tap)
  STOMP 1.0: tail stomp://127.0.0.1:61613 /queue/orders --requeue --timeout 5
  Malamute:  tail tcp://127.0.0.1:9999 orders --pattern 'eu.*' --output body
             tail tcp://127.0.0.1:9999 --mailbox alice
Queues are consumed (acknowledged as printed) unless --requeue is given.
Exit status: 0, or 3 when --max N was not reached before --timeout."""


def add_parser(sub) -> None:
    c = sub.add_parser("tail", help="print messages as they arrive", description=_TAIL_DESC,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(c, "tail")
    c.add_argument("--max", "-n", type=int, default=0, metavar="N", help="stop after N messages (0: no limit)")
    c.add_argument("--timeout", "-t", type=float, default=0.0, metavar="SECONDS",
                   help="stop when nothing arrives for this long (0: wait forever)")
    c.add_argument("--output", "-o", choices=OUTPUTS, default="text",
                   help="text (one line per message), json (JSON lines), body (raw bodies)")
    c.add_argument("--json", action="store_const", const="json", dest="output", help="same as --output json")
    c.add_argument("--requeue", action="store_true",
                   help="AMQP/STOMP: do not acknowledge; the broker redelivers the messages after we leave "
                        "(a peek; without it tail consumes what it prints)")
    c.add_argument("--pattern", default="", help="Malamute subject pattern (stream/service; default all)")
    c.add_argument("--prefetch", type=int, default=100, help="AMQP/STOMP prefetch (default 100)")


def _jsonable(value):
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return {"base64": base64.b64encode(raw).decode("ascii")}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


@dataclass
class Record:
    """One received message, protocol-neutral enough to print."""

    destination: str
    body: bytes
    headers: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def as_json(self, n: int, protocol: str) -> dict:
        out = {"n": n, "protocol": protocol, "destination": self.destination}
        try:
            out["body"] = self.body.decode("utf-8")
        except UnicodeDecodeError:
            out["body"] = None
            out["body_base64"] = base64.b64encode(self.body).decode("ascii")
        out["size"] = len(self.body)
        out["headers"] = _jsonable(self.headers)
        out.update({k: _jsonable(v) for k, v in self.extra.items()})
        return out

    def as_text(self, n: int) -> str:
        body = self.body.decode("utf-8", errors="backslashreplace")
        if len(body) > 2000:
            body = body[:2000] + f"... ({len(self.body)} bytes)"
        meta = " ".join(f"{k}={v}" for k, v in self.extra.items() if v not in (None, "", False))
        head = " ".join(f"{k}={v}" for k, v in self.headers.items())
        parts = [f"#{n}", self.destination]
        if meta:
            parts.append(meta)
        if head:
            parts.append(f"[{head}]")
        return " ".join(parts) + " | " + body.replace("\n", "\\n")


_POLL = 0.25


def _receive_loop(next_record: Callable[[float], Optional[tuple]], emit, args, stop: Stop) -> int:
    """Call ``next_record(wait)`` until --max, --timeout (idle) or a stop signal; returns the count."""
    count = 0
    last = time.monotonic()
    while not stop.event.is_set():
        if args.max and count >= args.max:
            break
        item = next_record(_POLL)
        if item is None:
            if args.timeout and time.monotonic() - last >= args.timeout:
                break
            continue
        record, settle = item
        count += 1
        emit(count, record)
        if settle is not None:
            settle()
        last = time.monotonic()
    return count


def _amqp_record(msg) -> Record:
    p = msg.properties
    props = {} if p is None else {k: getattr(p, k) for k in AMQP_PROPERTIES if getattr(p, k, None) is not None}
    headers = dict(p.headers) if p is not None and p.headers else {}
    extra = {"exchange": msg.exchange, "routing_key": msg.routing_key, "redelivered": msg.redelivered,
             "delivery_tag": msg.delivery_tag, "properties": props}
    error = getattr(p, "error", None)
    if error is not None:  # UndecodableProperties: say so, with the bytes, rather than print none
        extra["undecodable_properties"] = {"error": error, "hex": p.raw.hex()}
    return Record(msg.routing_key, bytes(msg.body), headers, extra)


def tail_amqp08(t: Target, args, opts, emit, stop) -> int:
    from spark_mq.clients.connect import connect_amqp08
    conn = connect_amqp08(opts)
    try:
        ch = conn.channel()
        queue = t.queue
        if t.exchange is not None:
            ok = ch.queue_declare("", exclusive=True, auto_delete=True)
            queue = ok.queue
            ch.queue_bind(queue, t.exchange, t.routing_key or "")
            err(f"tapping exchange {t.exchange!r} (binding key {t.routing_key or ''!r}) with queue {queue}")
        ch.basic_qos(prefetch_count=args.prefetch)
        ch.basic_consume(queue, no_ack=False)
        _listening(queue, t.uri)

        def next_record(wait: float):
            msg = ch.next_message(wait)
            if msg is None:
                return None
            settle = None if args.requeue else (lambda: ch.basic_ack(msg.delivery_tag))
            return _amqp_record(msg), settle

        return _receive_loop(next_record, emit, args, stop)
    finally:
        conn.close()  # unacknowledged messages (--requeue) go back to the queue


def tail_stomp(t: Target, args, opts, emit, stop) -> int:
    from spark_mq.clients.connect import connect_stomp
    client = connect_stomp(opts)
    try:
        client.subscribe(t.destination, ack="client", prefetch=args.prefetch)
        _listening(t.destination, t.uri)

        def next_record(wait: float):
            frame = client.receive(wait)
            if frame is None:
                return None
            if frame.oversize:
                # its body was skipped, never held: printing (and acking) it empty would lose it
                from spark_mq.errors import SparkMqError
                from spark_mq.protocol.stomp10 import DEFAULT_MAX_FRAME_SIZE
                raise SparkMqError(f"message {frame.message_id!r}: its frame of {frame.oversize} bytes is above the "
                                   f"client's bound ({DEFAULT_MAX_FRAME_SIZE} bytes); it was not acknowledged")
            headers = {k: v for k, v in frame.headers.items() if k not in ("destination", "message-id")}
            record = Record(frame.destination or t.destination, bytes(frame.body), headers,
                            {"message_id": frame.message_id})
            settle = None if args.requeue else (lambda: client.ack(frame))
            return record, settle

        count = _receive_loop(next_record, emit, args, stop)
        client.disconnect()
        return count
    finally:
        client.close()


def tail_malamute(t: Target, args, opts, emit, stop) -> int:
    from spark_mq.protocol.malamute import codec
    from spark_mq.clients.connect import connect_malamute
    address = t.mailbox or t.address or ""
    client = connect_malamute(opts, address)
    try:
        if t.stream:
            client.set_consumer(t.stream, args.pattern)
        elif t.service:
            client.set_worker(t.service, args.pattern)
        else:
            client.ping()  # the broker knows our mailbox address once it answered
        _listening(t.stream or t.service or t.mailbox, t.uri)

        def next_record(wait: float):
            msg = client.recv(wait)
            if msg is None:
                return None
            frames = [bytes(f) for f in msg.content]
            if isinstance(msg, codec.StreamDeliver):
                where, extra = msg.address, {"subject": msg.subject, "sender": msg.sender}
            else:
                where = msg.address
                extra = {"subject": msg.subject, "sender": msg.sender, "tracker": msg.tracker}
            if len(frames) != 1:
                extra["frames"] = [_jsonable(f) for f in frames]
            return Record(where, frames[0] if frames else b"", {}, extra), None

        return _receive_loop(next_record, emit, args, stop)
    finally:
        client.close()


def _listening(where: str, uri: str) -> None:
    """Tell the user (and scripts waiting for it) that messages sent from now on will be seen."""
    err(f"listening on {where} at {redact(uri)} (Ctrl-C to stop)")


def _emitter(output: str, protocol: str):
    out = sys.stdout

    def emit(n: int, record: Record) -> None:
        if output == "json":
            out.write(json.dumps(record.as_json(n, protocol), ensure_ascii=False) + "\n")
        elif output == "body":
            out.flush()
            out.buffer.write(record.body + b"\n")
            out.buffer.flush()
            return
        else:
            out.write(record.as_text(n) + "\n")
        out.flush()

    return emit


def run(args: argparse.Namespace) -> int:
    if args.max < 0:
        raise UsageError(f"--max {args.max}: must not be negative")
    if args.timeout < 0:
        raise UsageError(f"--timeout {args.timeout}: must not be negative")
    if args.prefetch < 1:
        raise UsageError(f"--prefetch {args.prefetch}: must be at least 1")
    t = resolve_target(args)
    opts = connection_options(t, args)
    tail = {AMQP08: tail_amqp08, STOMP: tail_stomp, MALAMUTE: tail_malamute}[t.protocol]
    with Stop() as stop:
        count = tail(t, args, opts, _emitter(args.output, t.protocol), stop)
    if args.max and count < args.max and not stop.event.is_set():
        err(f"received {count} of {args.max} messages before the {args.timeout:g}s timeout")
        return EXIT_INCOMPLETE
    return EXIT_OK
