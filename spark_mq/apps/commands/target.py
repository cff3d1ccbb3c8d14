"""The flags and the target that ``send`` and ``tail`` share: which queue, exchange, destination,
stream, mailbox or service a command addresses, checked against the protocol of the URI (a flag of
another protocol is a usage error naming it), and the connection options parsed exactly as the Spark
formats parse them, so a URI that works here works in ``.option("uri", ...)``."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Optional

from spark_mq.apps.commands.common import UsageError, protocol_of, redact
from spark_mq.options import AMQP08, MALAMUTE, STOMP

__all__ = ["Target", "add_target_arguments", "resolve_target", "connection_options"]


def add_target_arguments(c: argparse.ArgumentParser, name: str) -> None:
    """The arguments ``send`` and ``tail`` (``name``) share: the URI, the TARGET, the per-protocol
    flags naming where, and the connection flags."""
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
                             f"({redact(args.uri)}); it is for {'/'.join(sorted(accepted))}")
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


def connection_options(t: Target, args: argparse.Namespace):
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
