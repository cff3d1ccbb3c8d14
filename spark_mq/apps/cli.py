"""The ``spark-mq`` console command: the tool to reach for while building or debugging a pipeline.

Responsible for: the command line (``demo``, ``broker``, ``send``, ``tail``, ``bridge``), choosing the protocol
from the broker URI, turning flags into client calls, and printing messages (text, JSON lines, raw
bodies). Errors name the flag or URI at fault (passwords masked) and exit with status 2 (usage) or 1
(broker/connection failure). Not responsible for protocols or connections: it uses
``spark_mq.clients`` through ``spark_mq.clients.connect`` (the same URI/option parsing as the Spark
formats, so a URI that works here works in ``.option("uri", ...)``).

    spark-mq broker --endpoint tcp://127.0.0.1:9999
    spark-mq send tcp://127.0.0.1:9999 --stream orders --subject eu --body '{"id": {n}}' --count 10
    spark-mq tail tcp://127.0.0.1:9999 --stream orders --pattern 'eu.*' --json --max 10 --timeout 5
    spark-mq send amqp://guest:guest@127.0.0.1:5672/%2F orders --declare --file order.json
    spark-mq tail stomp://127.0.0.1:61613 /queue/orders --max 1 --output body

The URI scheme selects the protocol: ``amqp://``/``amqps://`` (AMQP 0-8), ``stomp://``/``stomp+ssl://``
(STOMP 1.0), ``tcp://``/``ipc://`` (Malamute). The optional positional TARGET is the queue (AMQP), the
destination (STOMP) or the stream (Malamute).
"""

from __future__ import annotations

import argparse
import base64
import datetime as _dt
import decimal
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional
from urllib.parse import urlsplit

from spark_mq.options import AMQP08, MALAMUTE, STOMP

__all__ = ["main", "protocol_of", "UsageError"]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
#: ``tail --max N`` ended by ``--timeout`` before N messages arrived
EXIT_INCOMPLETE = 3
OUTPUTS = ("text", "json", "body")
AMQP_INT_PROPERTIES = ("delivery_mode", "priority", "timestamp")
AMQP_PROPERTIES = ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
                   "expiration", "message_id", "timestamp", "type", "user_id", "app_id", "cluster_id")
_COUNTER = "{n}"


class UsageError(Exception):
    """A bad flag, flag combination or URI: printed as ``spark-mq <cmd>: error: ...``, exit status 2."""


class Failure(Exception):
    """The broker or the connection failed: printed as ``spark-mq <cmd>: ...``, exit status 1."""


def _redact(uri: str) -> str:
    from spark_mq.options import redact_uri
    return redact_uri(uri)


def protocol_of(uri: str) -> str:
    """``amqp08``, ``stomp`` or ``malamute`` for a broker URI; ``UsageError`` naming the URI otherwise."""
    from spark_mq.clients.connect import format_of
    from spark_mq.errors import OptionError
    try:
        return format_of(uri)
    except OptionError as exc:
        raise UsageError(str(exc)) from None


def _pairs(items: Optional[list], flag: str) -> dict:
    """``["k=v", ...]`` -> dict; ``UsageError`` naming the flag for an item without ``=``."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------------- parser

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spark-mq",
        description="spark-mq: Spark Structured Streaming over AMQP 0-8, STOMP 1.0 and Malamute. "
                    "URIs: amqp[s]://user:pass@host:5672/vhost, stomp[+ssl]://user:pass@host:61613, "
                    "tcp://host:9999 or ipc://path (Malamute).")
    p.add_argument("--version", action="store_true", help="print the version and exit")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="run the end-to-end streaming demo (python -m spark_mq.apps.demo)",
                          add_help=False)
    demo.add_argument("demo_args", nargs=argparse.REMAINDER, help="arguments of the demo (see demo --help)")

    b = sub.add_parser("broker", help="run the embedded Malamute broker until Ctrl-C",
                       description="Run the embedded Malamute broker (wire-compatible with zeromq/malamute). "
                                   "Prints 'ready <endpoint>...' once bound, then serves until SIGINT/SIGTERM.")
    b.add_argument("--endpoint", "-e", action="append", dest="endpoints", metavar="ENDPOINT",
                   help="tcp://host:port or ipc://path to bind; repeatable (default tcp://127.0.0.1:9999; "
                        "port 0 picks a free port)")
    b.add_argument("--client-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="forget clients silent for this long (default 60)")
    b.add_argument("--credit", action="store_true", help="honour CREDIT flow control")
    b.add_argument("--mailbox-dir", metavar="DIR", help="persist mailboxes of offline clients in DIR")
    b.add_argument("--fsync", action="store_true", help="fsync the mailbox journal after every record")
    b.add_argument("--stats", type=float, default=0.0, metavar="SECONDS",
                   help="print the broker's counters every SECONDS (0: never)")
    b.add_argument("--seconds", type=float, default=0.0, help="stop after this many seconds (0: run until stopped)")
    b.add_argument("--log-level", default="WARNING", help="Python logging level (default WARNING)")

    for name, help_text in (("send", "publish messages"), ("tail", "print messages as they arrive")):
        c = sub.add_parser(name, help=help_text, description=_SEND_DESC if name == "send" else _TAIL_DESC,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        c.add_argument("uri", help="broker URI; the scheme selects the protocol")
        c.add_argument("target", nargs="?",
                       help="AMQP queue, STOMP destination (/queue/x, /topic/x) or Malamute stream")
        g = c.add_argument_group("where (per protocol)")
        g.add_argument("--queue", help="AMQP queue" + (" (send: via the default exchange)" if name == "send" else ""))
        g.add_argument("--exchange", help="AMQP exchange" + (
            "" if name == "send" else " to tap: a private auto-delete queue is bound to it (non-destructive)"))
        g.add_argument("--routing-key", help="AMQP routing key (send) or binding key (tail --exchange)")
        g.add_argument("--destination", help="STOMP destination, e.g. /queue/orders")
        g.add_argument("--stream", help="Malamute stream")
        g.add_argument("--mailbox", help="Malamute mailbox address" + (
            " to send to" if name == "send" else " to read (the client connects with this address)"))
        g.add_argument("--service", help="Malamute service" + (
            " to send requests to" if name == "send" else " to offer as a worker"))
        g.add_argument("--address", help="Malamute client address (default: generated)")
        c.add_argument("--connect-timeout", type=float, default=10.0, metavar="SECONDS",
                       help="time allowed to connect (default 10)")
        c.add_argument("--tls-ca-file", metavar="PEM", help="CA certificates to trust (amqps://, stomp+ssl://)")
        c.add_argument("--tls-insecure", action="store_true", help="do not verify the broker certificate (tests only)")
        if name == "send":
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
        else:
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
    br = sub.add_parser("bridge", help="move messages from one broker to another with a Spark query",
                        description=_BRIDGE_DESC, formatter_class=argparse.RawDescriptionHelpFormatter)
    br.add_argument("from_uri", metavar="FROM_URI", help="source broker URI; the scheme selects the protocol")
    br.add_argument("to_uri", metavar="TO_URI", help="sink broker URI")
    br.add_argument("--from", dest="source", required=True, metavar="TARGET",
                    help="AMQP queue, STOMP destination, or Malamute stream:NAME / mailbox:NAME / service:NAME")
    br.add_argument("--to", dest="sink", required=True, metavar="TARGET",
                    help="AMQP routing key (default exchange), STOMP destination, or Malamute stream:/mailbox:/service:NAME")
    br.add_argument("--state", metavar="DIR", help="source log and checkpoint (default: ./spark-mq-bridge-<hash of "
                    "the URIs and targets>); the same command resumes from it")
    br.add_argument("--available-now", action="store_true", help="bridge what is there now, then exit")
    br.add_argument("--source-option", "-I", action="append", metavar="KEY=VALUE", help="any source option")
    br.add_argument("--sink-option", "-O", action="append", metavar="KEY=VALUE", help="any sink option")
    br.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    br.add_argument("--trigger-interval", type=float, default=1.0, metavar="SECONDS",
                    help="micro-batch interval when not --available-now (default 1)")
    br.add_argument("--progress-interval", type=float, default=2.0, metavar="SECONDS",
                    help="seconds between progress lines (default 2)")
    return p


_BRIDGE_DESC = """\
Move messages between brokers: a Spark query reads FROM_URI and writes TO_URI, each source row written
as it is (docs/bridges.md: headers, properties and ids carried). Runs until Ctrl-C, or with
--available-now until what was there is bridged. Run the same command again to resume (--state).
  bridge stomp://legacy:61613 amqp://guest:guest@rabbit:5672/%2F --from /queue/orders --to orders
  bridge tcp://127.0.0.1:9999 amqp://... --from stream:weather --to weather -O deliveryMode=2"""

_SEND_DESC = """\
Publish messages to any of the three protocols; the URI's scheme selects it.
  AMQP 0-8:  send amqp://guest:guest@127.0.0.1:5672/%2F QUEUE --body hi         (default exchange)
             send amqp://... --exchange amq.topic --routing-key eu.orders -f order.json
  STOMP 1.0: send stomp://127.0.0.1:61613 /queue/orders --body hi -H priority=9
  Malamute:  send tcp://127.0.0.1:9999 orders --subject eu --body '{"n": {n}}' -n 100
             send tcp://127.0.0.1:9999 --mailbox alice --subject hello --body hi
AMQP sends are transactional (tx.commit every --batch), STOMP sends end with a receipt and Malamute
sends with a PING round trip: when the command returns, the broker has every message."""

_TAIL_DESC = """\
Print messages as they arrive; the URI's scheme selects the protocol.
  AMQP 0-8:  tail amqp://guest:guest@127.0.0.1:5672/%2F QUEUE --max 10
             tail amqp://... --exchange amq.topic --routing-key '#' --json     (a non-destructive tap)
  STOMP 1.0: tail stomp://127.0.0.1:61613 /queue/orders --requeue --timeout 5
  Malamute:  tail tcp://127.0.0.1:9999 orders --pattern 'eu.*' --output body
             tail tcp://127.0.0.1:9999 --mailbox alice
Queues are consumed (acknowledged as printed) unless --requeue is given.
Exit status: 0, or 3 when --max N was not reached before --timeout."""


# ---------------------------------------------------------------------------------------------- targets

@dataclass
class Target:
    protocol: str
    uri: str
    queue: Optional[str] = None
    exchange: Optional[str] = None
    routing_key: Optional[str] = None
    destination: Optional[str] = None
    stream: Optional[str] = None
    mailbox: Optional[str] = None
    service: Optional[str] = None
    address: Optional[str] = None
    flags: dict = field(default_factory=dict)


_FLAG_PROTOCOLS = {  # flag -> protocols that accept it
    "queue": {AMQP08}, "exchange": {AMQP08}, "routing_key": {AMQP08}, "destination": {STOMP},
    "stream": {MALAMUTE}, "mailbox": {MALAMUTE}, "service": {MALAMUTE}, "address": {MALAMUTE},
    "property": {AMQP08}, "declare": {AMQP08}, "subject": {MALAMUTE}, "tracker": {MALAMUTE},
    "pattern": {MALAMUTE}, "persistent": {AMQP08, STOMP}, "header": {AMQP08, STOMP},
    "requeue": {AMQP08, STOMP},
}
_DEFAULTS = {"subject": "", "tracker": "", "pattern": "", "persistent": False, "declare": False, "requeue": False}


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def resolve_target(args: argparse.Namespace) -> Target:
    """Check the flags against the URI's protocol and fill in the positional TARGET."""
    protocol = protocol_of(args.uri)
    for name, accepted in _FLAG_PROTOCOLS.items():
        value = getattr(args, name, None)
        if value not in (None, _DEFAULTS.get(name), []) and protocol not in accepted:
            raise UsageError(f"{_flag(name)} does not apply to {protocol} URIs "
                             f"({_redact(args.uri)}); it is for {'/'.join(sorted(accepted))}")
    t = Target(protocol, args.uri, queue=args.queue, exchange=args.exchange, routing_key=args.routing_key,
               destination=args.destination, stream=args.stream, mailbox=args.mailbox, service=args.service,
               address=args.address)
    if args.target is not None:
        slot = {AMQP08: "queue", STOMP: "destination", MALAMUTE: "stream"}[protocol]
        if getattr(t, slot) is not None:
            raise UsageError(f"TARGET {args.target!r} and --{slot} both given: give one")
        setattr(t, slot, args.target)
    if protocol == AMQP08:
        if args.command == "send":
            if t.queue is not None and (t.exchange is not None or t.routing_key is not None):
                raise UsageError("send: give a queue (default exchange) or --exchange/--routing-key, not both")
            if t.queue is None and t.exchange is None and t.routing_key is None:
                raise UsageError("send: name a queue (TARGET or --queue) or --exchange/--routing-key")
        else:
            if t.queue is not None and t.exchange is not None:
                raise UsageError("tail: give a queue, or --exchange to tap (not both)")
            if t.queue is None and t.exchange is None:
                raise UsageError("tail: name a queue (TARGET or --queue), or --exchange to tap")
            if t.routing_key is not None and t.exchange is None:
                raise UsageError("tail: --routing-key needs --exchange")
    elif protocol == STOMP:
        if not t.destination:
            raise UsageError("name a STOMP destination (TARGET or --destination), e.g. /queue/orders")
    else:
        given = [n for n in ("stream", "mailbox", "service") if getattr(t, n)]
        if args.command == "send" and len(given) != 1:
            raise UsageError("send: give exactly one of a stream (TARGET or --stream), --mailbox, --service "
                             f"(got {', '.join(_flag(n) for n in given) or 'none'})")
        if args.command == "tail":
            if len(given) != 1:
                raise UsageError("tail: give exactly one of a stream (TARGET or --stream), --mailbox, --service "
                                 f"(got {', '.join(_flag(n) for n in given) or 'none'})")
            if t.mailbox and t.address and t.address != t.mailbox:
                raise UsageError("tail --mailbox reads as that address: --address must be absent or equal")
    return t


def _options(t: Target, args: argparse.Namespace):
    """Parsed connection options, so the URI means exactly what it means to the Spark formats."""
    from spark_mq.errors import OptionError
    from spark_mq.options import SINK, parse_options
    raw = {"uri": t.uri, "connectTimeout": str(args.connect_timeout)}
    if args.tls_ca_file:
        raw["tlsCaFile"] = args.tls_ca_file
    if args.tls_insecure:
        raw["tlsVerify"] = "false"
    try:
        opts = parse_options(raw, format=t.protocol, direction=SINK)
        from spark_mq.clients.connect import endpoints
        endpoints(opts)  # URI errors surface here, before any connection attempt
    except OptionError as exc:
        raise UsageError(str(exc)) from None
    return opts


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
    props = _pairs(args.property, "--property")
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
    headers = _pairs(args.header, "--header")
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
    headers = _pairs(args.header, "--header")
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


def cmd_send(args: argparse.Namespace) -> int:
    if args.batch < 1:
        raise UsageError(f"--batch {args.batch}: must be at least 1")
    if args.rate < 0:
        raise UsageError(f"--rate {args.rate}: must not be negative")
    t = resolve_target(args)
    messages = bodies(args)
    if t.protocol == AMQP08:
        _amqp_properties(args)  # flag errors before connecting
    opts = _options(t, args)
    started = time.monotonic()
    sender = {AMQP08: send_amqp08, STOMP: send_stomp, MALAMUTE: send_malamute}[t.protocol]
    sent = sender(t, args, messages, opts)
    elapsed = time.monotonic() - started
    where = t.queue or t.exchange or t.routing_key or t.destination or t.stream or t.mailbox or t.service
    _err(f"sent {sent} message{'s' if sent != 1 else ''} to {where} on {_redact(t.uri)} in {elapsed:.2f}s")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- tail

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


class _Stop:
    """Ctrl-C / SIGTERM ends ``tail`` cleanly (acks/close still happen)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self._old = {}

    def __enter__(self) -> "_Stop":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, lambda *_: self.event.set())
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)


_POLL = 0.25


def _receive_loop(next_record: Callable[[float], Optional[tuple]], emit, args, stop: _Stop) -> int:
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
            _err(f"tapping exchange {t.exchange!r} (binding key {t.routing_key or ''!r}) with queue {queue}")
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
    _err(f"listening on {where} at {_redact(uri)} (Ctrl-C to stop)")


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


def cmd_tail(args: argparse.Namespace) -> int:
    if args.max < 0:
        raise UsageError(f"--max {args.max}: must not be negative")
    if args.timeout < 0:
        raise UsageError(f"--timeout {args.timeout}: must not be negative")
    if args.prefetch < 1:
        raise UsageError(f"--prefetch {args.prefetch}: must be at least 1")
    t = resolve_target(args)
    opts = _options(t, args)
    tail = {AMQP08: tail_amqp08, STOMP: tail_stomp, MALAMUTE: tail_malamute}[t.protocol]
    with _Stop() as stop:
        count = tail(t, args, opts, _emitter(args.output, t.protocol), stop)
    if args.max and count < args.max and not stop.event.is_set():
        _err(f"received {count} of {args.max} messages before the {args.timeout:g}s timeout")
        return EXIT_INCOMPLETE
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- broker

def cmd_broker(args: argparse.Namespace) -> int:
    import logging

    import zmq

    from spark_mq.malamute_broker import DEFAULT_ENDPOINT, Broker
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    for ep in args.endpoints or ():
        protocol = protocol_of(ep)
        if protocol != MALAMUTE:
            raise UsageError(f"--endpoint {ep!r}: the broker binds ZeroMQ endpoints, tcp://host:port or ipc://path")
    broker = Broker(args.endpoints or [DEFAULT_ENDPOINT], client_timeout=args.client_timeout, credit=args.credit,
                    mailbox_dir=args.mailbox_dir, fsync=args.fsync)
    try:
        broker.start()
    except zmq.ZMQError as exc:
        raise Failure(f"cannot bind {', '.join(args.endpoints or [DEFAULT_ENDPOINT])}: {exc}") from None
    print("ready " + " ".join(broker.endpoints), flush=True)
    deadline = time.monotonic() + args.seconds if args.seconds > 0 else None
    next_stats = time.monotonic() + args.stats if args.stats > 0 else None
    with _Stop() as stop:
        try:
            while not stop.event.is_set():
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    break
                if broker.error is not None:
                    raise Failure(f"broker loop failed: {broker.error!r}")
                if next_stats is not None and now >= next_stats:
                    print("stats " + json.dumps(broker.stats, sort_keys=True), flush=True)
                    next_stats = now + args.stats
                stop.event.wait(0.2)
        finally:
            broker.stop()
    _err("broker stopped")
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- bridge

def cmd_bridge(args: argparse.Namespace) -> int:
    from spark_mq.apps import bridge_job
    for flag, uri in (("FROM_URI", args.from_uri), ("TO_URI", args.to_uri)):
        try:
            protocol_of(uri)
        except UsageError as exc:
            raise UsageError(f"{flag}: {exc}") from None
    try:
        return bridge_job.run(args)
    except bridge_job.BridgeUsageError as exc:
        raise UsageError(str(exc)) from None


# ---------------------------------------------------------------------------------------------- main

def _err(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if argv and argv[0] == "demo":  # everything after "demo" belongs to the demo's own parser
        from spark_mq.apps import demo
        return demo.main(argv[1:])
    args = parser.parse_args(argv)
    if args.version:
        from spark_mq import __version__
        print(f"spark-mq {__version__}")
        return EXIT_OK
    if args.command is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    from spark_mq.errors import SparkMqError
    handler = {"broker": cmd_broker, "send": cmd_send, "tail": cmd_tail, "bridge": cmd_bridge}[args.command]
    prog = f"spark-mq {args.command}"
    try:
        return handler(args)
    except UsageError as exc:
        _err(f"{prog}: error: {exc}")
        return EXIT_USAGE
    except Failure as exc:
        _err(f"{prog}: {exc}")
        return EXIT_FAILURE
    except BrokenPipeError:  # `spark-mq tail ... | head`
        try:
            sys.stdout.close()
        except OSError:
            pass
        return EXIT_OK
    except (SparkMqError, OSError, TimeoutError) as exc:
        text = f"{type(exc).__name__}: {exc}"
        uris = [u for u in (getattr(args, n, None) for n in ("uri", "from_uri", "to_uri")) if u]
        for uri in uris:
            parts = urlsplit(uri)
            if parts.password:
                text = text.replace(parts.password, "***")
        if uris:
            text += f" (URI {', '.join(_redact(u) for u in uris)})"
        _err(f"{prog}: {text}")
        return EXIT_FAILURE


if __name__ == "__main__":
    sys.exit(main())
