"""Build protocol clients from parsed connection options (shared by the sources, the sinks and the apps).

Responsible for: the broker URI schemes (which format a scheme names, ``format_of``; which schemes
each format's option 'uri' accepts), turning ``spark_mq.options.Options`` (uri, host list, port,
credentials, virtual host, TLS, heartbeat, timeouts) into connected clients, trying the listed
endpoints in turn.
Not responsible for retries over time, consuming or publishing: callers own those policies.

    conn = connect_amqp08(opts)                 # spark_mq.clients.amqp08.Connection
    client = connect_stomp(opts)                # connected spark_mq.clients.stomp.StompClient
    client = connect_malamute(opts, "reader-1") # spark_mq.clients.malamute.MalamuteClient

``start`` rotates the endpoint list (a reconnect passes its attempt number so it tries the next
host first). Errors name the endpoint with the password masked, never the secret itself.
"""

from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Optional
from urllib.parse import unquote, urlsplit

from spark_mq.errors import BrokerRefusedError, ConnectionClosedError, OptionError, SparkMqError
from spark_mq.options import AMQP08, MALAMUTE, STOMP, Options, redact_uri
from spark_mq.transport.stream import TlsOptions

__all__ = ["SCHEME_FORMATS", "format_of", "Endpoint", "endpoints", "connect_amqp08", "connect_stomp", "connect_malamute", "tls_options", "refusal"]

#: AMQP reply codes that answer the options, not the moment: access refused (credentials,
#: permissions), not found (queue, vhost), precondition failed (a queue declared otherwise),
#: not allowed (vhost access)
_REFUSAL_CODES = frozenset({403, 404, 406, 530})


def refusal(exc: BaseException) -> bool:
    """The broker refused the options themselves (retrying them cannot help): a ``BrokerRefusedError``
    from connecting, an AMQP channel or connection closed with 403, 404, 406 or 530, or an AMQP protocol
    header answered with another (the broker does not speak the version offered: option ``protocol``)."""
    if isinstance(exc, BrokerRefusedError):
        return True
    from spark_mq.protocol.amqp08.errors import AMQPError, ProtocolRefused
    if isinstance(exc, ProtocolRefused):
        return True
    return isinstance(exc, AMQPError) and exc.reply_code in _REFUSAL_CODES

_DEFAULT_PORTS = {AMQP08: (5672, 5671), STOMP: (61613, 61614), MALAMUTE: (9999, 9999)}
#: format -> the URI schemes its option 'uri' accepts -> whether the scheme means TLS
_SCHEMES = {
    AMQP08: {"amqp": False, "amqps": True},
    STOMP: {"stomp": False, "stomp+ssl": True, "stomp+tls": True, "ssl": True, "tcp": False},
    MALAMUTE: {"tcp": False, "ipc": False, "inproc": False},
}
#: schemes a format's option 'uri' accepts that do not name the format by themselves
_ALIASES = {STOMP: {"ssl", "tcp"}, MALAMUTE: {"inproc"}}
#: URI scheme -> the format it names (a broker URI given without a format: the CLI, the demo)
SCHEME_FORMATS = {scheme: fmt for fmt, schemes in _SCHEMES.items() for scheme in schemes
                  if scheme not in _ALIASES.get(fmt, ())}


def format_of(uri: str) -> str:
    """``amqp08``, ``stomp`` or ``malamute``: the format a broker URI's scheme names (``SCHEME_FORMATS``);
    ``OptionError`` naming the URI (password masked) otherwise."""
    try:
        scheme = urlsplit(uri).scheme.lower()
    except ValueError as exc:
        raise OptionError(f"URI {redact_uri(uri)!r} cannot be parsed: {exc}") from None
    if scheme not in SCHEME_FORMATS:
        accepted = ", ".join(f"{s}://" for s in SCHEME_FORMATS)
        what = f"unknown scheme {scheme!r}" if scheme else "no scheme"
        raise OptionError(f"URI {redact_uri(uri)!r}: {what}; use one of {accepted}")
    return SCHEME_FORMATS[scheme]


@dataclass(frozen=True)
class Endpoint:
    """One place to connect to. ``repr`` never shows the password."""

    host: str
    port: int
    username: Optional[str] = None
    password: Optional[str] = None
    virtual_host: str = "/"
    tls: bool = False
    zmq_endpoint: Optional[str] = None  # Malamute: tcp://... or ipc://...

    def __repr__(self) -> str:
        if self.zmq_endpoint:
            return f"Endpoint({self.zmq_endpoint})"
        return f"Endpoint({'tls ' if self.tls else ''}{self.username or ''}@{self.host}:{self.port}{'' if self.virtual_host == '/' else ' vhost=' + self.virtual_host})"

    __str__ = __repr__


def _split_hostport(text: str, default_port: int) -> tuple[str, int]:
    if text.startswith("["):  # [ipv6]:port
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") else default_port
    if text.count(":") == 1:
        host, port = text.split(":")
        try:
            return host, int(port)
        except ValueError:
            raise OptionError(f"option 'host': bad port in {text!r}") from None
    return text, default_port


def endpoints(opts: Options) -> list[Endpoint]:
    """Every endpoint the options name, in order (uri list, or host list, with overrides applied)."""
    fmt = opts.format
    schemes = _SCHEMES[fmt]
    plain_port, tls_port = _DEFAULT_PORTS[fmt]
    explicit_tls = opts.get("tls")
    tls_files = any(opts.get(k) for k in ("tlsCaFile", "tlsCertFile", "tlsKeyFile"))
    bases: list[dict] = []
    for uri in [u.strip() for u in (opts.get("uri") or "").split(",") if u.strip()]:
        try:
            parts = urlsplit(uri)
            port = parts.port
        except ValueError as exc:
            # not the ValueError's text: it may quote the password (urlsplit read it as the port)
            raise OptionError(f"option 'uri': cannot parse {redact_uri(uri)} (its port is not a number; a "
                              f"password with '/', '?' or '#' must be percent-encoded: %2F, %3F, %23)") from None
        if parts.scheme not in schemes:
            raise OptionError(f"option 'uri': scheme {parts.scheme!r} of {redact_uri(uri)} is not one of "
                              f"{', '.join(sorted(schemes))} for format {fmt}")
        if "@" in parts.path + parts.query + parts.fragment and fmt != MALAMUTE:
            raise OptionError(f"option 'uri': {redact_uri(uri)} has an '@' after its host: a user or password "
                              f"with '/', '?' or '#' must be percent-encoded (%2F, %3F, %23)")
        if fmt == MALAMUTE:
            if opts.get("port") is not None:  # as for the other formats: the option overrides the URI's
                if parts.scheme != "tcp":
                    raise OptionError(f"option 'port' does not apply to {uri}: only a tcp:// endpoint has a port")
                host = parts.hostname or "127.0.0.1"
                uri = f"tcp://{'[' + host + ']' if ':' in host else host}:{opts.port}"
            bases.append({"zmq_endpoint": uri})
            continue
        tls = schemes[parts.scheme]
        path = parts.path[1:] if parts.path.startswith("/") else parts.path
        bases.append({
            "host": parts.hostname or "127.0.0.1",
            "port": port,
            "username": unquote(parts.username) if parts.username else None,
            "password": unquote(parts.password) if parts.password is not None else None,
            "virtual_host": unquote(path) if path else "/",
            "tls": tls,
        })
    hosts = opts.get("host") or ()
    if hosts:
        template = bases[0] if bases and "zmq_endpoint" not in bases[0] else {}
        bases = []
        for h in hosts:
            host, port = _split_hostport(h, 0)
            bases.append({**template, "host": host, "port": port or None})
    if not bases:
        if fmt == MALAMUTE:
            raise OptionError("malamute needs option 'uri' (tcp://host:port or ipc://path) or 'host'")
        bases = [{"host": "127.0.0.1", "port": None}]
    out = []
    for b in bases:
        if "zmq_endpoint" in b:
            out.append(Endpoint(host="", port=0, zmq_endpoint=b["zmq_endpoint"]))
            continue
        tls = b.get("tls", False)
        if explicit_tls is not None:
            tls = explicit_tls
        elif tls_files:
            tls = True
        port = opts.get("port") or b.get("port") or (tls_port if tls else plain_port)
        if fmt == MALAMUTE:
            out.append(Endpoint(host=b["host"], port=port, zmq_endpoint=f"tcp://{b['host']}:{port}"))
            continue
        username = opts.get("username") or b.get("username")
        password = opts.get("password") if opts.get("password") is not None else b.get("password")
        vhost = opts.get("virtualHost") or b.get("virtual_host") or "/"
        out.append(Endpoint(b["host"], port, username, password, vhost, tls))
    return out


def tls_options(opts: Options) -> TlsOptions:
    return TlsOptions(ca_file=opts.get("tlsCaFile"), cert_file=opts.get("tlsCertFile"),
                      key_file=opts.get("tlsKeyFile"), verify=opts.get("tlsVerify", True),
                      server_hostname=opts.get("tlsServerName"))


def _rotate(items: list, start: int) -> list:
    if not items:
        return items
    k = start % len(items)
    return items[k:] + items[:k]


def _fail(fmt: str, tried: list, errors: list, refused: Optional[list] = None) -> ConnectionClosedError:
    detail = "; ".join(f"{ep!r}: {err}" for ep, err in zip(tried, errors))
    if refused and all(refused):
        return BrokerRefusedError(f"every {fmt} broker refused the connection ({detail})")
    return ConnectionClosedError(f"cannot connect to any {fmt} broker ({detail})")


def _whole_seconds(heartbeat: float) -> int:
    """AMQP 0-8 negotiates the heartbeat in whole seconds: a fraction rounds up (0.5 s asks for
    1 s; rounded to the nearest it would be 0, which turns heartbeats off)."""
    return math.ceil(heartbeat) if heartbeat > 0 else 0


def _buffer_bounds(opts: Options, kwargs: dict) -> dict:
    """The client's bound on deliveries not yet taken, from a source's options (a sink's client
    keeps the client's defaults: it takes no deliveries)."""
    if opts.get("clientBufferMessages") is not None:
        kwargs.setdefault("max_buffered_messages", opts.clientBufferMessages)
    if opts.get("clientBufferBytes") is not None:
        kwargs.setdefault("max_buffered_bytes", opts.clientBufferBytes)
    return kwargs


def connect_amqp08(opts: Options, *, start: int = 0, **kwargs):
    """An open ``spark_mq.clients.amqp08.Connection`` to the first endpoint that answers."""
    from spark_mq.clients.amqp08 import Connection

    kwargs = _buffer_bounds(opts, kwargs)
    tried, errors, refused, causes = [], [], [], []
    for ep in _rotate(endpoints(opts), start):
        try:
            return Connection(
                ep.host, ep.port, username=ep.username or "guest",
                password=ep.password if ep.password is not None else "guest",
                virtual_host=ep.virtual_host, heartbeat=_whole_seconds(opts.get("heartbeat") or 0),
                tls=tls_options(opts) if ep.tls else None, connect_timeout=opts.get("connectTimeout") or 10.0,
                protocol=opts.get("protocol") or "0-8", **kwargs)
        except (SparkMqError, OSError) as exc:
            tried.append(ep)
            errors.append(_clean(exc, ep))
            refused.append(refusal(exc))
            causes.append(exc)
    # every endpoint answered with another protocol's header: that error, kept as the cause (the sources
    # fail the query on it at once: spark_mq.sources.reconnect)
    from spark_mq.protocol.amqp08.errors import ProtocolRefused
    protocol_refused = causes and all(isinstance(c, ProtocolRefused) for c in causes)
    raise _fail(AMQP08, tried, errors, refused) from (causes[-1] if protocol_refused else None)


def connect_stomp(opts: Options, *, start: int = 0, **kwargs):
    """A connected ``spark_mq.clients.stomp.StompClient`` to the first endpoint that answers."""
    from spark_mq.clients.stomp import StompClient
    from spark_mq.protocol.stomp10 import StompError

    kwargs = _buffer_bounds(opts, kwargs)
    tried, errors, refused = [], [], []
    for ep in _rotate(endpoints(opts), start):
        client = StompClient(ep.host, ep.port, login=ep.username, passcode=ep.password, virtual_host=ep.virtual_host,
                             tls=tls_options(opts) if ep.tls else None,
                             timeout=opts.get("connectTimeout") or 10.0, **kwargs)
        try:
            return client.connect()
        except (SparkMqError, OSError) as exc:
            client.close()
            tried.append(ep)
            errors.append(_clean(exc, ep))
            # an ERROR frame in reply to CONNECT: the broker refused the login or virtual host
            refused.append(isinstance(exc, StompError))
    raise _fail(STOMP, tried, errors, refused)


def connect_malamute(opts: Options, address: str = "", *, start: int = 0, client_class=None, **kwargs):
    """A connected ``spark_mq.clients.malamute.MalamuteClient`` (``address`` names the client), or
    an instance of ``client_class`` (``MalamuteReceiver``) that takes the same arguments."""
    from spark_mq.clients.malamute import MalamuteClient

    if "heartbeat" in opts.provided and opts.heartbeat > 0:
        from spark_mq.protocol.malamute.client import DEFAULT_HEARTBEAT, DEFAULT_SERVER_TIMEOUT

        kwargs.setdefault("heartbeat", opts.heartbeat)
        # the broker answers each PING: between two PINGs an idle broker says nothing, so the silence
        # that counts as a lost broker stays the reference client's 4 PINGs (4 s at 1 s), never less
        # than one interval (a 10 s heartbeat against 4 s would "lose" every idle broker)
        kwargs.setdefault("server_timeout", DEFAULT_SERVER_TIMEOUT * max(1.0, opts.heartbeat / DEFAULT_HEARTBEAT))
    cls = client_class or MalamuteClient
    tried, errors = [], []
    for ep in _rotate(endpoints(opts), start):
        try:
            return cls(ep.zmq_endpoint, address, timeout=opts.get("connectTimeout") or 10.0, **kwargs)
        except (SparkMqError, OSError, TimeoutError) as exc:
            tried.append(ep)
            errors.append(_clean(exc, ep))
    raise _fail(MALAMUTE, tried, errors)


def _clean(exc: BaseException, ep: Endpoint) -> str:
    text = f"{type(exc).__name__}: {exc}"
    if ep.password:
        text = text.replace(ep.password, "***")
    return text
