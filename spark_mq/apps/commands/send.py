"""``spark-mq send URI [TARGET]``: publish messages to any of the three protocols.

The body comes from ``--body`` (``{n}`` becomes the message number), ``--file`` or ``--lines``; the
command returns once the broker has every message (AMQP transaction, STOMP receipt, Malamute PING).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Iterator

from spark_mq.apps.commands.common import AMQP_PROPERTIES, EXIT_OK, Failure, UsageError, err, pairs, redact
from spark_mq.apps.commands.target import Target, add_target_arguments, connection_options, resolve_target
from spark_mq.options import AMQP08, MALAMUTE, STOMP

__all__ = ["add_parser", "run", "bodies"]

AMQP_INT_PROPERTIES = ("delivery_mode", "priority", "timestamp")
_COUNTER = "{n}"

_SEND_DESC = """\
Publish messages to any of the three protocols; the URI's scheme selects it.
  AMQP 0-8:  send amqp://guest:guest@127.0.0.1:5672/%2F QUEUE --body hi         (default exchange)
             send amqp://... --exchange amq.topic --routing-key eu.orders -f order.json
  STOMP 1.0: send stomp://127.0.0.1:61613 /queue/orders --body hi -H priority=9
  Malamute:  send tcp://127.0.0.1:9999 orders --subject eu --body '{"n": {n}}' -n 100
             send tcp://127.0.0.1:9999 --mailbox alice --subject hello --body hi
AMQP sends are transactional (tx.commit every --batch), STOMP sends end with a receipt and Malamute
sends with a PING round trip: when the command returns, the broker has every message."""


def add_parser(sub) -> None:
    c = sub.add_parser("send", help="publish messages", description=_SEND_DESC,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_target_arguments(c, "send")
    body = c.add_argument_group("body (exactly one)")
    body.add_argument("--body", "-b", help="the body text; {n} is replaced by the message number (1..count)")
    body.add_argument("--file", "-f", metavar="PATH", help="the body is the file's bytes ('-': stdin)")
    body.add_argument("--lines", "-l", metavar="PATH",
                      help="one message per line of the file ('-': stdin); empty lines are skipped")
    c.add_argument("--count", "-n", type=int, default=1, help="send the body this many times (default 1)")
    c.add_argument("--header", "-H", action="append", metavar="KEY=VALUE",
                   help="a header (AMQP headers table, STOMP frame header); repeatable")
    c.add_argument("--property", "-p", action="append", metavar="KEY=VALUE",
                   help="an AMQP basic property: " + ", ".join(AMQP_PROPERTIES) + "; repeatable")
    c.add_argument("--persistent", action="store_true",
                   help="persistent messages (AMQP delivery_mode=2, STOMP persistent:true)")
    c.add_argument("--subject", "-s", default="", help="Malamute subject ({n} is replaced as in --body)")
    c.add_argument("--tracker", default="", help="Malamute tracker (mailbox/service sends)")
    c.add_argument("--declare", action="store_true",
                   help="AMQP: declare the queue (durable) first, so the messages are not dropped")
    c.add_argument("--batch", type=int, default=1000, metavar="N",
                   help="AMQP: commit the transaction / STOMP and Malamute: flush every N messages "
                        "(default 1000)")
    c.add_argument("--rate", type=float, default=0.0, metavar="PER_SECOND",
                   help="send at most this many messages per second (default: as fast as possible)")


# ---------------------------------------------------------------------------------------------- bodies

def _read_source(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path!r}: {exc.strerror}") from None


def bodies(args: argparse.Namespace) -> Iterator[tuple[int, bytes]]:
    """``(n, body)`` for every message to send, n = 1, 2, ... (checked before connecting)."""
    given = [f for f in ("body", "file", "lines") if getattr(args, f) is not None]
    if len(given) != 1:
        raise UsageError("give exactly one of --body, --file, --lines "
                         f"(got {', '.join('--' + g for g in given) or 'none'}; --file - reads stdin)")
    if args.count < 1:
        raise UsageError(f"--count {args.count}: must be at least 1")
    if args.lines is not None:
        if args.count != 1:
            raise UsageError("--count applies to --body and --file, not --lines")
        lines = [ln for ln in _read_source(args.lines).splitlines() if ln.strip()]
        return iter(enumerate(lines, 1))
    if args.file is not None:
        data = _read_source(args.file)
        return ((n, data) for n in range(1, args.count + 1))
    text = args.body
    if _COUNTER in text:
        return ((n, text.replace(_COUNTER, str(n)).encode()) for n in range(1, args.count + 1))
    data = text.encode()
    return ((n, data) for n in range(1, args.count + 1))


# ---------------------------------------------------------------------------------------------- send

class _Pacer:
    """Keeps ``--rate``: sleeps so that message n goes out no earlier than n/rate after the start."""

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.start = time.monotonic()

    def wait(self, n: int) -> None:
        if self.rate > 0:
            delay = self.start + (n - 1) / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def _amqp_properties(args: argparse.Namespace):
    from spark_mq.clients.amqp08 import BasicProperties
    props = pairs(args.property, "--property")
    kwargs: dict = {}
    for key, value in props.items():
        if key not in AMQP_PROPERTIES:
            raise UsageError(f"--property {key}=...: not an AMQP basic property; use one of "
                             f"{', '.join(AMQP_PROPERTIES)} (or --header for application headers)")
        if key in AMQP_INT_PROPERTIES:
            try:
                kwargs[key] = int(value)
            except ValueError:
                raise UsageError(f"--property {key}={value!r}: expected an integer") from None
        else:
            kwargs[key] = value
    if args.persistent:
        kwargs.setdefault("delivery_mode", 2)
    headers = pairs(args.header, "--header")
    if headers:
        kwargs["headers"] = headers
    return BasicProperties(**kwargs) if kwargs else None


def send_amqp08(t: Target, args: argparse.Namespace, messages, opts) -> int:
    from spark_mq.clients.connect import connect_amqp08
    properties = _amqp_properties(args)
    exchange = t.exchange or ""
    routing_key = t.queue if t.queue is not None else (t.routing_key or "")
    conn = connect_amqp08(opts)
    sent = 0
    returned = []
    try:
        ch = conn.channel()
        ch.on_return = returned.append
        if args.declare:
            if t.queue is None:
                raise UsageError("--declare declares the queue: name one (TARGET or --queue)")
            ch.queue_declare(t.queue, durable=True)
        ch.tx_select()
        pacer = _Pacer(args.rate)
        pending = 0
        for n, body in messages:
            pacer.wait(n)
            ch.basic_publish(exchange, routing_key, body, properties, mandatory=True)
            sent += 1
            pending += 1
            if pending >= args.batch:
                ch.tx_commit()
                pending = 0
        ch.tx_commit()
        # RabbitMQ sends basic.return before tx.commit-ok: a commit round trip has them all.
    finally:
        conn.close()
    if returned:
        first = returned[0]
        raise Failure(f"{len(returned)} of {sent} messages were returned unroutable ({first.reply_code} "
                      f"{first.reply_text}: nothing bound to exchange {exchange or '(default)'!r} with routing "
                      f"key {routing_key!r}; use --declare to create the queue)")
    return sent


def send_stomp(t: Target, args: argparse.Namespace, messages, opts) -> int:
    from spark_mq.clients.connect import connect_stomp
    headers = pairs(args.header, "--header")
    if args.persistent:
        headers.setdefault("persistent", "true")
    client = connect_stomp(opts)
    sent = 0
    try:
        pacer = _Pacer(args.rate)
        for n, body in messages:
            pacer.wait(n)
            client.send(t.destination, body, headers=dict(headers) if headers else None)
            sent += 1
            if sent % args.batch == 0:
                client.flush()
        client.flush()
        client.disconnect()
    finally:
        client.close()
    return sent


def send_malamute(t: Target, args: argparse.Namespace, messages, opts) -> int:
    from spark_mq.clients.connect import connect_malamute
    client = connect_malamute(opts, t.address or "")
    sent = 0
    try:
        if t.stream:
            client.set_producer(t.stream)
        pacer = _Pacer(args.rate)
        for n, body in messages:
            pacer.wait(n)
            subject = args.subject.replace(_COUNTER, str(n))
            if t.stream:
                client.send(subject, body)
            elif t.mailbox:
                client.sendto(t.mailbox, subject, body, tracker=args.tracker)
            else:
                client.sendfor(t.service, subject, body, tracker=args.tracker)
            sent += 1
            if sent % args.batch == 0:
                client.ping()
        client.ping()
    finally:
        client.close()
    return sent


def run(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise UsageError(f"--batch {args.batch}: must be at least 1")
    if args.rate < 0:
        raise UsageError(f"--rate {args.rate}: must not be negative")
    t = resolve_target(args)
    messages = bodies(args)
    if t.protocol == AMQP08:
        _amqp_properties(args)  # flag errors before connecting
    opts = connection_options(t, args)
    started = time.monotonic()
    sender = {AMQP08: send_amqp08, STOMP: send_stomp, MALAMUTE: send_malamute}[t.protocol]
    sent = sender(t, args, messages, opts)
    elapsed = time.monotonic() - started
    where = t.queue or t.exchange or t.routing_key or t.destination or t.stream or t.mailbox or t.service
    err(f"sent {sent} message{'s' if sent != 1 else ''} to {where} on {redact(t.uri)} in {elapsed:.2f}s")
    return EXIT_OK
