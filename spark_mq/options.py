"""The one options parser of spark-mq: declarative option definitions, parsed once into a frozen value.

Responsible for: the definition of every user-facing option (name, type, default, allowed values,
secret flag, documentation, which formats and directions accept it), turning Spark's string options
into typed values with errors that name the option, and keeping secrets out of reprs, logs and
error messages. Not responsible for connecting anywhere (see ``spark_mq.clients.connect``) or for
checks that need a broker.

API (stable; extend it, do not change it)::

    from spark_mq.options import OptionSpec, OptionType, define, parse_options, SINK

    # a module (e.g. spark_mq.sinks.amqp08) defines its own options once, at import time:
    MANDATORY = define(OptionSpec("mandatory", OptionType.BOOL, default=False, formats={"amqp08"},
                                  directions={SINK}, doc="Publish with the mandatory flag."))

    opts = parse_options(raw_options, format="amqp08", direction=SINK)
    opts.uri, opts.mandatory, opts["virtualHost"]       # typed values; defaults filled in
    "password" in opts.provided                          # which options the user gave
    repr(opts)                                           # secrets shown as ***

- ``OptionSpec``: one option. ``type`` is an ``OptionType``; ``choices`` limits the values (ENUM);
  ``secret=True`` keeps the value out of every repr and error (URIs are shown with the password
  masked); ``formats`` / ``directions`` say who accepts it; ``excludes`` names options that
  contradict it; ``minimum`` / ``maximum`` bound numbers. ``doc`` is the user documentation.
- ``define(*specs)`` registers specs (for parsing by format/direction and for generated docs);
  redefining a name with a different spec raises ``OptionError`` (a name means one thing).
- ``parse_options(raw, specs=None, *, format, direction)``: ``raw`` is any mapping of str to str
  (Spark's options are case-insensitive and lower-cased; matching here is case-insensitive too).
  ``specs=None`` uses every registered spec for that format and direction. Options that no spec
  accepts, bad values and contradictions raise ``OptionError`` naming every offending option.
- ``Options``: the frozen result (attribute and item access, ``get``, ``provided``, ``redacted()``),
  picklable, so it can travel to executors inside readers and partitions.
- ``registered(format=None, direction=None)`` lists specs (for docs).

Value syntax: BOOL ``true/false/yes/no/1/0``; SIZE ``1048576``, ``64k``, ``16MiB``, ``1g``;
DURATION seconds, or with a unit: ``250ms``, ``5s``, ``2m``, ``1h``; LIST comma-separated;
JSON a JSON object (for queue arguments).

Above 500 lines (about 570): most of it is the option declarations themselves, each with the text
of its generated reference (docs/options.md); splitting them by format would scatter options that
several formats share.
"""

from __future__ import annotations

import difflib
import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional
from urllib.parse import urlsplit, urlunsplit

from spark_mq.errors import OptionError

__all__ = [
    "OptionType", "OptionSpec", "Options", "define", "parse_options", "registered", "redact_uri",
    "SOURCE", "SINK", "FORMATS", "AMQP08", "STOMP", "MALAMUTE", "MASK",
]

SOURCE = "source"
SINK = "sink"
DIRECTIONS = frozenset({SOURCE, SINK})
AMQP08 = "amqp08"
STOMP = "stomp"
MALAMUTE = "malamute"
FORMATS = frozenset({AMQP08, STOMP, MALAMUTE})
MASK = "***"


class OptionType(enum.Enum):
    STRING = "string"
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    SIZE = "size"          # bytes, with optional k/m/g (KiB...) suffix
    DURATION = "duration"  # seconds (float), with optional ms/s/m/h suffix
    ENUM = "enum"          # one of choices (case-insensitive, stored lower-case)
    LIST = "list"          # comma-separated strings -> tuple
    JSON = "json"          # JSON object -> dict (frozen as a tuple of items is overkill; treat as read-only)


_TRUE = {"true", "yes", "1", "on"}
_FALSE = {"false", "no", "0", "off"}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|min)?\s*$", re.IGNORECASE)
_DURATION_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def redact_uri(uri: str) -> str:
    """The URI with its password (if any) replaced by ``***``; other parts kept for diagnosis."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return MASK
    if parts.password is None:
        scheme, sep, rest = uri.partition("://")
        if sep and "@" in rest:
            # an '@' after what urlsplit took for the host: a password with an unencoded '/', '?'
            # or '#' (``amqp://u:pa/ss@h/``) ends the netloc early and would be shown as host and path
            return f"{scheme}://{MASK}@{rest.rpartition('@')[2]}"
        return uri
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{parts.username or ''}:{MASK}@{host}"
    try:
        if parts.port is not None:
            netloc += f":{parts.port}"
    except ValueError:
        pass
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _redact_uri_list(value: Any) -> str:
    return ",".join(redact_uri(u) for u in str(value).split(","))


@dataclass(frozen=True)
class OptionSpec:
    """One option: how to parse it, its default, who accepts it, and its documentation."""

    name: str
    type: OptionType
    default: Any = None
    doc: str = ""
    choices: tuple = ()
    secret: bool = False
    formats: frozenset = FORMATS
    directions: frozenset = DIRECTIONS
    excludes: tuple = ()
    minimum: Optional[float] = None
    maximum: Optional[float] = None
    #: how to show a secret value (default: ``***``); URIs keep everything but the password
    redactor: Optional[Callable[[Any], str]] = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "formats", frozenset(self.formats))
        object.__setattr__(self, "directions", frozenset(self.directions))
        object.__setattr__(self, "choices", tuple(c.lower() for c in self.choices))
        object.__setattr__(self, "excludes", tuple(self.excludes))
        if not self.formats <= FORMATS:
            raise OptionError(f"option spec {self.name!r}: unknown formats {sorted(self.formats - FORMATS)}")
        if not self.directions <= DIRECTIONS:
            raise OptionError(f"option spec {self.name!r}: unknown directions {sorted(self.directions - DIRECTIONS)}")
        if self.type is OptionType.ENUM and not self.choices:
            raise OptionError(f"option spec {self.name!r}: an ENUM needs choices")

    def applies(self, format: str, direction: str) -> bool:  # noqa: A002 - Spark's word
        return format in self.formats and direction in self.directions

    def show(self, value: Any) -> str:
        """The value as it may appear in a repr, log or error."""
        if value is None:
            return "None"
        if self.secret:
            return self.redactor(value) if self.redactor is not None else MASK
        return repr(value)

    def parse(self, text: str) -> Any:
        """The typed value of ``text``; raises ``OptionError`` naming the option (never the secret)."""
        if not isinstance(text, str):
            text = str(text)
        shown = MASK if self.secret and self.redactor is None else (
            self.redactor(text) if self.secret else repr(text))
        try:
            value = self._convert(text)
        except (ValueError, TypeError) as exc:
            detail = "" if self.secret else f": {exc}"  # the cause may quote the secret value
            raise OptionError(f"option {self.name!r}: {shown} is not a valid {self._expected()}{detail}") from None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.minimum is not None and value < self.minimum:
                raise OptionError(f"option {self.name!r}: {shown} is below the minimum {self.minimum}")
            if self.maximum is not None and value > self.maximum:
                raise OptionError(f"option {self.name!r}: {shown} is above the maximum {self.maximum}")
        return value

    def _expected(self) -> str:
        if self.type is OptionType.ENUM:
            return "value; accepted: " + ", ".join(self.choices)
        return {
            OptionType.INT: "integer", OptionType.FLOAT: "number", OptionType.BOOL: "boolean (true/false)",
            OptionType.SIZE: "size (bytes, or with k/m/g: 64k, 16MiB)",
            OptionType.DURATION: "duration (seconds, or 250ms, 5s, 2m, 1h)",
            OptionType.JSON: "JSON object", OptionType.LIST: "comma-separated list", OptionType.STRING: "string",
        }[self.type]

    def _convert(self, text: str) -> Any:
        t = self.type
        if t is OptionType.STRING:
            return text
        if t is OptionType.INT:
            return int(text.strip())
        if t is OptionType.FLOAT:
            return float(text.strip())
        if t is OptionType.BOOL:
            low = text.strip().lower()
            if low in _TRUE:
                return True
            if low in _FALSE:
                return False
            raise ValueError("expected true or false")
        if t is OptionType.SIZE:
            m = _SIZE.match(text)
            if not m:
                raise ValueError("expected a number of bytes")
            return int(float(m.group(1)) * _SIZE_UNITS[m.group(2).lower()])
        if t is OptionType.DURATION:
            m = _DURATION.match(text)
            if not m:
                raise ValueError("expected a duration")
            unit = m.group(2).lower() if m.group(2) else None
            return float(m.group(1)) * _DURATION_UNITS[unit]
        if t is OptionType.ENUM:
            low = text.strip().lower()
            if low not in self.choices:
                raise ValueError(f"not one of {', '.join(self.choices)}")
            return low
        if t is OptionType.LIST:
            return tuple(p.strip() for p in text.split(",") if p.strip())
        if t is OptionType.JSON:
            value = json.loads(text)
            if not isinstance(value, dict):
                raise ValueError("expected a JSON object")
            return value
        raise ValueError(f"unknown option type {t}")  # pragma: no cover - enum is closed


_REGISTRY: dict[str, OptionSpec] = {}


def define(*specs: OptionSpec) -> tuple[OptionSpec, ...] | OptionSpec:
    """Register specs (idempotent for an identical spec). Returns the spec, or the tuple of specs."""
    for spec in specs:
        key = spec.name.lower()
        old = _REGISTRY.get(key)
        if old is not None and old != spec:
            raise OptionError(f"option {spec.name!r} is already defined differently ({old!r})")
        _REGISTRY[key] = spec
    return specs[0] if len(specs) == 1 else specs


def registered(format: Optional[str] = None, direction: Optional[str] = None) -> list[OptionSpec]:  # noqa: A002
    """Registered specs, optionally only those a format/direction accepts, sorted by name."""
    return sorted((s for s in _REGISTRY.values()
                   if (format is None or format in s.formats) and (direction is None or direction in s.directions)),
                  key=lambda s: s.name.lower())


class Options(Mapping):
    """Parsed options: read-only, picklable, secrets masked in repr. ``provided`` = names the user gave."""

    __slots__ = ("_values", "_specs", "provided", "format", "direction")

    def __init__(self, values: dict, specs: dict, provided: frozenset, format: str, direction: str) -> None:  # noqa: A002
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "_specs", dict(specs))
        object.__setattr__(self, "provided", frozenset(provided))
        object.__setattr__(self, "format", format)
        object.__setattr__(self, "direction", direction)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no option {name!r} for format {self.format} ({self.direction})") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Options are read-only")

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __reduce__(self):
        return (Options, (self._values, self._specs, self.provided, self.format, self.direction))

    def replace(self, **changes: Any) -> "Options":
        """A copy with some values changed (names must exist)."""
        for name in changes:
            if name not in self._values:
                raise OptionError(f"no option {name!r} for format {self.format}")
        return Options({**self._values, **changes}, self._specs, self.provided | set(changes),
                       self.format, self.direction)

    def redacted(self) -> dict:
        """Every value as it may be shown (secrets masked)."""
        return {name: self._specs[name].show(value) for name, value in self._values.items()}

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={v}" for k, v in self.redacted().items() if k in self.provided)
        return f"Options({self.format}/{self.direction}: {shown})"

    __str__ = __repr__


def parse_options(raw: Mapping[str, Any], specs: Optional[Iterable[OptionSpec]] = None, *,
                  format: str, direction: str) -> Options:  # noqa: A002
    """Parse Spark's string options into ``Options`` (see the module docstring)."""
    if format not in FORMATS:
        raise OptionError(f"unknown format {format!r}; accepted: {', '.join(sorted(FORMATS))}")
    if direction not in DIRECTIONS:
        raise OptionError(f"unknown direction {direction!r}; accepted: source, sink")
    pool = list(_REGISTRY.values()) if specs is None else list(specs)
    accepted = {s.name.lower(): s for s in pool if s.applies(format, direction)}
    errors: list[str] = []
    values: dict[str, Any] = {}
    provided: set[str] = set()
    unknown: list[str] = []
    for key, text in raw.items():
        spec = accepted.get(str(key).lower())
        if spec is None:
            unknown.append(str(key))
            continue
        if text is None:
            continue
        try:
            values[spec.name] = spec.parse(text)
        except OptionError as exc:
            errors.append(str(exc))
            continue
        provided.add(spec.name)
    if unknown:
        for key in sorted(unknown):
            hint = difflib.get_close_matches(key.lower(), list(accepted), n=1)
            other = _REGISTRY.get(key.lower())
            if other is not None:
                where = (f"it applies to {'/'.join(sorted(other.formats))} "
                         f"{'/'.join(sorted(other.directions))}s only")
            elif hint:
                where = f"did you mean {accepted[hint[0]].name!r}?"
            else:
                where = "no such option"
            errors.append(f"unknown option {key!r} for the {format} {direction} ({where})")
    clashes = set()
    for spec in accepted.values():
        if spec.name in provided:
            clashes.update(tuple(sorted((spec.name, other))) for other in spec.excludes if other in provided)
        values.setdefault(spec.name, spec.default)
    for first, second in sorted(clashes):
        errors.append(f"options {first!r} and {second!r} contradict each other: give only one")
    if errors:
        raise OptionError("invalid options: " + "; ".join(errors))
    return Options(values, {s.name: s for s in accepted.values()}, frozenset(provided), format, direction)


# -- shared connection options (readers and writers of every format) --------------------------

_BOTH = DIRECTIONS
_ALL = FORMATS
_SOCKET = frozenset({AMQP08, STOMP})

CONNECTION_OPTIONS = define(
    OptionSpec("uri", OptionType.STRING, secret=True, redactor=_redact_uri_list, doc=(
        "Where the broker is: amqp://user:pass@host:5672/vhost (amqps:// for TLS), stomp://user:pass@host:61613 "
        "(stomp+ssl://; a path, stomp://host:61613/vhost, is sent as CONNECT's host header, which RabbitMQ takes "
        "as the virtual host), tcp://host:9999 or ipc://path (Malamute). Several comma-separated URIs are tried "
        "in turn (failover). host/port/username/password/virtualHost override its parts. A user or password "
        "with '/', '?', '#' or '@' must be percent-encoded. Spark shows a source's options in its query plans "
        "(explain(), the UI) and hides this one only once spark_mq.register(spark) has run in the session (or "
        "spark.sql.redaction.options.regex matches 'uri', as conf/spark/spark-defaults.conf sets it); the password "
        "option is always hidden.")),
    OptionSpec("host", OptionType.LIST, doc=(
        "Broker host, or a comma-separated list host[:port],host[:port] tried in turn on (re)connect.")),
    OptionSpec("port", OptionType.INT, minimum=1, maximum=65535, formats=_SOCKET | {MALAMUTE},
               doc="Broker port (default: the protocol's, plain/TLS: AMQP 5672/5671, STOMP 61613/61614, "
                   "Malamute 9999); overrides the uri's port (Malamute: a tcp:// uri only)."),
    OptionSpec("username", OptionType.STRING, formats=_SOCKET, doc=(
        "User name (AMQP login / STOMP login). AMQP logs in as guest / guest when neither this, password nor "
        "the uri gives one; STOMP then sends CONNECT without login and passcode.")),
    OptionSpec("password", OptionType.STRING, secret=True, formats=_SOCKET,
               doc="Password (AMQP) or passcode (STOMP). Never logged or shown."),
    OptionSpec("virtualHost", OptionType.STRING, formats={AMQP08}, doc="AMQP virtual host (default /)."),
    OptionSpec("tls", OptionType.BOOL, default=None, formats=_SOCKET,
               doc=("Use TLS (default: from the URI scheme, or true when tlsCaFile, tlsCertFile or tlsKeyFile is "
                    "given; tlsVerify and tlsServerName alone do not switch it on).")),
    OptionSpec("tlsCaFile", OptionType.STRING, formats=_SOCKET, doc="PEM file of CA certificates to trust."),
    OptionSpec("tlsCertFile", OptionType.STRING, formats=_SOCKET, doc="PEM client certificate (mutual TLS)."),
    OptionSpec("tlsKeyFile", OptionType.STRING, formats=_SOCKET, doc="PEM private key of the client certificate."),
    OptionSpec("tlsVerify", OptionType.BOOL, default=True, formats=_SOCKET,
               doc="Verify the broker's certificate and host name (false only for tests)."),
    OptionSpec("tlsServerName", OptionType.STRING, formats=_SOCKET, doc="Host name expected in the broker certificate."),
    OptionSpec("heartbeat", OptionType.DURATION, default=30.0, minimum=0, doc=(
        "Heartbeat interval. amqp08: the connection heartbeat asked of the broker, in whole seconds (30 s by default; "
        "0 disables; a fraction rounds up). "
        "malamute: seconds between the client's PINGs, 1 s unless a positive value is given (the 30 s default does "
        "not apply); the broker counts as lost after 4 intervals of silence, at least 4 s. stomp: STOMP 1.0 has no heartbeat, the option is ignored.")),
    OptionSpec("connectTimeout", OptionType.DURATION, default=10.0, minimum=0.1,
               doc="Time allowed to connect (TCP, TLS and the protocol handshake)."),
    OptionSpec("protocol", OptionType.ENUM, default="0-8", choices=("0-8", "0-9-1", "auto"), formats={AMQP08}, doc=(
        "AMQP version offered to the broker: 0-8 (RabbitMQ 3.x), 0-9-1 (RabbitMQ 3.x and 4.x: 4.x refuses 0-8), "
        "or auto (0-9-1, then 0-8 on a new connection only if the broker answers with 0-8's header). A broker "
        "that refuses the version offered fails the query at once, naming what it speaks and the value that "
        "fits. The default stays 0-8 until the suite runs every amqp08 test on both versions (issue 57).")),
    OptionSpec("address", OptionType.STRING, formats={MALAMUTE}, doc=(
        "Malamute client address (the mailbox name for mailbox reads; default: generated).")),
    OptionSpec("exchange", OptionType.STRING, formats={AMQP08}, doc=(
        "AMQP exchange: the sink publishes to it; the source binds its queue to it when declare=create.")),
    OptionSpec("routingKey", OptionType.STRING, formats={AMQP08}, doc=(
        "AMQP routing key: the sink's default; the source's binding key when declare=create.")),
    OptionSpec("destination", OptionType.STRING, formats={STOMP}, doc=(
        "STOMP destination, e.g. /queue/orders (sink: default destination). Source: subscribed; a comma-separated "
        "list subscribes to each on one connection (a row's destination: the one of its subscription).")),
    OptionSpec("stream", OptionType.STRING, formats={MALAMUTE}, excludes=("mailbox", "service"),
               doc="Malamute stream (source: consumed with pattern; sink: produced to)."),
    OptionSpec("mailbox", OptionType.STRING, formats={MALAMUTE}, excludes=("service",),
               doc="Malamute mailbox address (source: read as that client address; sink: default recipient)."),
    OptionSpec("service", OptionType.STRING, formats={MALAMUTE},
               doc="Malamute service (source: offered as a worker with pattern; sink: requests sent to it)."),
)


# -- source options -----------------------------------------------------------------------------

_SRC = frozenset({SOURCE})

SOURCE_OPTIONS = define(
    OptionSpec("queue", OptionType.STRING, formats={AMQP08}, directions=_SRC, doc=(
        "AMQP queue to consume; a comma-separated list consumes each on one connection and channel (declare "
        "applies to each; a row's destination is its queue).")),
    OptionSpec("streams", OptionType.JSON, formats={MALAMUTE}, directions=_SRC, excludes=("stream", "mailbox", "service"),
               doc='Malamute streams to read on one client, each with its pattern: {"weather": "^temp", "alerts": ""} '
                   "(in place of stream and pattern; a row's destination is the stream of its message)."),
    OptionSpec("pattern", OptionType.STRING, default="", formats={MALAMUTE}, directions=_SRC,
               doc="Malamute subject pattern (zrex) for stream or service reads; empty matches all."),
    OptionSpec("declare", OptionType.ENUM, default="none", choices=("none", "passive", "create"),
               formats={AMQP08}, directions=_SRC, doc=(
                   "What the source declares before consuming: none; passive (fail early if the queue is "
                   "missing); create (declare the queue durable with queueArguments, and bind it to exchange "
                   "with routingKey when exchange is given).")),
    OptionSpec("queueArguments", OptionType.JSON, formats={AMQP08}, directions=_SRC,
               doc="JSON object of queue arguments for declare=create, e.g. {\"x-max-length\": 100000}."),
    OptionSpec("exchangeType", OptionType.STRING, formats={AMQP08}, directions=_SRC,
               doc="With declare=create and exchange: also declare the exchange with this type (direct, topic...)."),
    OptionSpec("logLocation", OptionType.STRING, directions=_SRC, doc=(
        "Where the source log lives: a local path or any pyarrow filesystem URI (file://, s3://, hdfs://...). "
        "It must be reachable from the executors and must belong to ONE query (on a local or mounted path a lock "
        "enforces it: a second query fails naming the location). Required for streaming reads. A batch read given "
        "one drains into a log there and keeps what it served until spark_mq.commit_batch_read(location): a "
        "job that fails loses nothing, the next batch read on it serves the messages again.")),
    OptionSpec("consumers", OptionType.INT, default=1, minimum=1, directions=_SRC, doc=(
        "Stream reads: consumers (connections) competing for the queue, destination or Malamute service, each "
        "an independent ingest feeding its own lane of the source log (logLocation/lane-<i>; order is kept within "
        "a lane only). Fixed for a logLocation once written. Read limits and maxUncommittedMessages/Bytes hold for "
        "all lanes together (docs/sources.md, \"Several consumers\"). Malamute 'streams' are shared out: stream i "
        "to lane i mod consumers (at most one consumer per stream). Batch reads, a single Malamute stream and "
        "mailboxes take 1 only.")),
    OptionSpec("ingest", OptionType.ENUM, default="driver", choices=("driver", "executors"), directions=_SRC, doc=(
                   "Stream reads: where the consumers run. driver (the default): an ingest thread per consumer in "
                   "the driver-side reader process, appending to the source log as messages come (lowest latency, "
                   "order kept per lane). executors: each micro-batch's tasks consume, one task per consumer "
                   "(lane), each draining for up to taskIngestTime into its own batch file under logLocation "
                   "(written, fsynced and linked; the first attempt wins) and acknowledging after it, so ingest "
                   "grows with the executors. logLocation must be a path every executor shares; ackMode commit, "
                   "poisonMessages=deadLetter and malamute are refused (docs/sources.md, \"Ingest on the executors\").")),
    OptionSpec("taskIngestTime", OptionType.DURATION, default=1.0, minimum=0.05, directions=_SRC, doc=(
        "ingest=executors: the longest a batch's task drains its broker (it ends sooner at taskMaxMessages, "
        "taskMaxBytes, its share of maxMessagesPerTrigger, or 0.2 s without a message after the first). With "
        "nothing to read each batch lasts about this long.")),
    OptionSpec("taskMaxMessages", OptionType.INT, default=50_000, minimum=1, maximum=65_535, directions=_SRC, doc=(
        "ingest=executors: at most this many messages per task (lane) and batch, and without a 'prefetch' option "
        "the consumer's prefetch (a task acknowledges at its end; an AMQP prefetch is at most 65535). A broker's "
        "prefetch counts messages, not bytes: a task may hold up to this many in memory, so with large messages "
        "lower it to about taskMaxBytes / message size.")),
    OptionSpec("taskMaxBytes", OptionType.SIZE, default=128 << 20, minimum=1, directions=_SRC,
               doc="ingest=executors: a task stops draining once it holds about this many body bytes."),
    OptionSpec("ackMode", OptionType.ENUM, default="durable", choices=("durable", "commit", "auto"),
               formats={AMQP08, STOMP}, directions=_SRC, doc=(
                   "When the broker is acknowledged: durable (after the messages are fsynced in the log), commit "
                   "(only when Spark commits the batch: one cumulative ack, in a broker transaction), auto "
                   "(broker acks on delivery: at-most-once).")),
    OptionSpec("maxMessagesPerTrigger", OptionType.INT, minimum=1, directions=_SRC,
               doc="At most this many messages per micro-batch."),
    OptionSpec("maxBytesPerTrigger", OptionType.SIZE, minimum=1, directions=_SRC,
               doc="At most about this many body bytes per micro-batch (at least one message)."),
    OptionSpec("minMessagesPerTrigger", OptionType.INT, minimum=1, directions=_SRC,
               doc="Wait for at least this many messages before a micro-batch, up to maxTriggerDelay."),
    OptionSpec("maxTriggerDelay", OptionType.DURATION, default=15 * 60.0, minimum=0, directions=_SRC,
               doc="With minMessagesPerTrigger: run a smaller batch once this long has passed since the last."),
    OptionSpec("numPartitions", OptionType.INT, minimum=1, directions=_SRC, doc=(
        "Split each micro-batch into this many partitions (contiguous log ranges; order is kept within each). "
        "Default: by size and count, see maxPartitionBytes and maxPartitionMessages.")),
    OptionSpec("maxPartitionBytes", OptionType.SIZE, default=128 << 20, minimum=1, directions=_SRC, doc=(
        "Without numPartitions: a partition holds at most about this many body bytes (as Spark's "
        "spark.sql.files.maxPartitionBytes; each task costs a fixed share, measured).")),
    OptionSpec("maxPartitionMessages", OptionType.INT, default=50_000, minimum=1, directions=_SRC, doc=(
        "Without numPartitions: a partition holds at most this many messages (a large batch of small "
        "bodies is read by several tasks at once).")),
    OptionSpec("prefetch", OptionType.INT, minimum=1, directions=_SRC, formats=_SOCKET, doc=(
        "Broker prefetch (AMQP basic.qos, STOMP prefetch header). Default 1000 (10000 for ackMode=commit). "
        "Malamute has none: its reader reads at most 1 MiB ahead.")),
    OptionSpec("clientBufferMessages", OptionType.INT, default=10_000, minimum=1, directions=_SRC, formats=_SOCKET,
               doc=(
        "Deliveries the AMQP/STOMP client holds received but not yet taken by the ingest; past it (or "
        "clientBufferBytes) the client stops reading its socket, so TCP holds the broker back until the "
        "ingest takes more. In ackMode=auto, which has no prefetch, this is the bound on what the broker has "
        "forgotten and the log does not hold yet (plus the TCP buffers): lower it to narrow that window.")),
    OptionSpec("clientBufferBytes", OptionType.SIZE, default=16 << 20, minimum=1, directions=_SRC, formats=_SOCKET,
               doc="Body bytes the AMQP/STOMP client holds received but not yet taken by the ingest before it "
                   "stops reading its socket (see clientBufferMessages)."),
    OptionSpec("failOnDataLoss", OptionType.BOOL, default=True, directions=_SRC, doc=(
        "Fail a batch whose log segments are gone (true), or read what is left and log a warning (false).")),
    OptionSpec("includeHeaders", OptionType.BOOL, default=True, directions=_SRC,
               doc="Fill the headers column (false leaves it null: smaller logs, faster)."),
    OptionSpec("maxUncommittedMessages", OptionType.INT, default=1_000_000, minimum=1, directions=_SRC,
               doc="Back-pressure: pause consuming while the unprocessed log holds this many messages."),
    OptionSpec("maxUncommittedBytes", OptionType.SIZE, default=1 << 30, minimum=1, directions=_SRC,
               doc="Back-pressure: pause consuming while the unprocessed log holds this many body bytes."),
    OptionSpec("fsyncInterval", OptionType.DURATION, default=0.05, minimum=0, directions=_SRC,
               doc="Group messages for this long before one append+fsync (and, in durable mode, one ack)."),
    OptionSpec("endGroupAtPlan", OptionType.BOOL, default=True, directions=_SRC, doc=(
        "Repeating triggers: when Spark plans a batch, the group being gathered (see fsyncInterval) ends, "
        "is appended and fsynced, and goes into that batch; the offset call waits for that fsync. False: "
        "the batch takes only groups already durable, and messages received meanwhile wait for the next "
        "batch (up to a whole batch interval more of latency; docs/performance.md, Latency).")),
    OptionSpec("fsyncMessages", OptionType.INT, default=20_000, minimum=1, directions=_SRC,
               doc="Append+fsync at most this many messages at once."),
    OptionSpec("fsyncBytes", OptionType.SIZE, default=1 << 20, minimum=1, directions=_SRC, doc=(
        "Aim for groups of about this many body bytes (the count per group follows the recent body size, "
        "within fsyncMessages): large groups of large bodies cost more CPU per message (measured).")),
    OptionSpec("fsync", OptionType.BOOL, default=True, directions=_SRC,
               doc=("fsync the log (false: faster; a process crash loses nothing more, but a machine crash loses what the "
                    "kernel had not yet written back, up to the whole uncommitted log, acknowledged messages included).")),
    OptionSpec("segmentBytes", OptionType.SIZE, default=64 << 20, minimum=1, directions=_SRC,
               doc="Start a new log segment once the current one holds this many bytes."),
    OptionSpec("dedupWindow", OptionType.INT, default=200_000, minimum=0, directions=_SRC, doc=(
        "How many identities of committed messages are remembered (beyond those still in the log) to drop "
        "redeliveries.")),
    OptionSpec("dedupById", OptionType.BOOL, default=False, directions=_SRC, formats=_SOCKET, doc=(
        "Also drop first deliveries whose message id is already in the log or among the last dedupWindow "
        "committed ones (for producers that resend with the same id). Off: a message the broker delivers for "
        "the first time is never dropped (business keys used as ids, such as three events of one order, stay "
        "three messages); only deliveries the broker marks redelivered, and the first prefetch of deliveries "
        "after a reconnect or restart (which a broker may resend unmarked), are matched. The id is the AMQP "
        "message_id property, the STOMP header spark-mq-message-id where a spark-mq sink or bridge set it (the "
        "same on every broker and in a replayed batch), else ActiveMQ's message-id (RabbitMQ's STOMP "
        "message-ids change per session and are not used).")),
    OptionSpec("maxDeliveryFailures", OptionType.INT, default=5, minimum=1, directions=_SRC, formats=_SOCKET, doc=(
        "A delivery that fails this many sessions is a poison message, handled as poisonMessages says. It "
        "fails a session when the source cannot take it: AMQP properties the client cannot decode (a "
        "headers table nested thousands deep), a STOMP frame above maxFrameBytes; the broker redelivers it, "
        "usually first. Counted by message id where the broker keeps it, else by body and headers; "
        "sessions that fail before taking anything back off as failed connects do (reconnectDelay).")),
    OptionSpec("poisonMessages", OptionType.ENUM, default="fail", choices=("fail", "deadLetter"),
               directions=_SRC, formats=_SOCKET, doc=(
                   "What a poison message (see maxDeliveryFailures) does: fail (the query fails naming it; it "
                   "stays in the broker, unacknowledged) or deadLetter (the messages before it are logged and made "
                   "durable, then amqp08 rejects it without requeue, so the queue's x-dead-letter-exchange gets it "
                   "(without one RabbitMQ drops it), and stomp sends it to deadLetterDestination with its headers "
                   "and x-spark-mq-dead-letter-* headers saying why, then acknowledges it; the query goes on). A "
                   "frame above maxFrameBytes cannot be dead-lettered (its body was never held): it fails the "
                   "query either way. amqp08 needs ackMode durable or commit for deadLetter.")),
    OptionSpec("deadLetterDestination", OptionType.STRING, formats={STOMP}, directions=_SRC, doc=(
        "STOMP destination poison messages are sent to with poisonMessages=deadLetter (required then), "
        "e.g. /queue/orders.dlq.")),
    OptionSpec("maxFrameBytes", OptionType.SIZE, default=64 << 20, minimum=1024, formats={STOMP}, directions=_SRC,
               doc=("Largest STOMP frame the source takes (headers and body). A MESSAGE above it is skipped "
                    "as it arrives, never buffered, and fails its session as a poison message naming this "
                    "option, its size and message-id; raise it to read such messages (ActiveMQ accepts "
                    "frames of 100 MB by default).")),
    OptionSpec("reconnectDelay", OptionType.DURATION, default=0.2, minimum=0, directions=_SRC,
               doc="First delay before reconnecting; doubles each attempt (with full jitter) up to reconnectMaxDelay."),
    OptionSpec("reconnectMaxDelay", OptionType.DURATION, default=10.0, minimum=0, directions=_SRC,
               doc="Longest delay between reconnect attempts."),
    OptionSpec("brokerTimeout", OptionType.DURATION, default=300.0, minimum=0, directions=_SRC,
               doc=("Fail the query when the broker stays unreachable this long (0: never). A first connection "
                    "the broker keeps refusing (credentials, permissions, a missing queue or virtual host) fails "
                    "after about 10 s.")),
    OptionSpec("quietPeriod", OptionType.DURATION, default=1.0, minimum=0, directions=_SRC, doc=(
        "availableNow (Spark 4.2+) and batch reads: the backlog is drained once nothing arrives for this long "
        "(AMQP also uses the queue depth: silence ends the drain only when the queue is empty; ActiveMQ's "
        "timestamps end it at the first message sent after the start; on Malamute silence counts only while "
        "the broker answers heartbeats). Silence counts only while the broker is free to "
        "send: connected, not paused, from the last acknowledgement (a slow fsync holds the prefetch), and "
        "while the reader process runs. Keep it above the broker's own pauses: RabbitMQ's STOMP adapter was "
        "measured pausing up to 0.54 s within a drain (python -m bench.stomp_pauses).")),
    OptionSpec("maxMessages", OptionType.INT, default=100_000, minimum=1, directions=_SRC,
               doc="Batch reads (spark.read): read at most this many messages from the broker (with "
                   "logLocation: new ones, besides what earlier reads on the log served and nobody committed)."),
    OptionSpec("readTimeout", OptionType.DURATION, default=30.0, minimum=0, directions=_SRC,
               doc="Batch reads: stop after this long even if messages keep arriving."),
    OptionSpec("availableNowTimeout", OptionType.DURATION, default=300.0, minimum=0, directions=_SRC, doc=(
        "availableNow, where the broker tells no queue depth (STOMP, Malamute): the run's drain ends after "
        "this long even if messages keep arriving (a destination a producer keeps feeding never falls "
        "quiet); what comes later is read by the next run. On ActiveMQ the first message stamped after the "
        "run began ends it sooner; AMQP ends at the queue depth counted at the start.")),
    OptionSpec("maxTaskBytes", OptionType.SIZE, default=64 << 20, minimum=64 << 10, directions=_SRC, doc=(
        "Batch reads without logLocation: the Arrow data a partition carries inside its task is at most "
        "this large, far below Spark's spark.rpc.message.maxSize (128 MiB by default), above which the "
        "scheduler refuses the task. A single larger message fails the read, unacknowledged (on ActiveMQ, which "
        "sends no more until acks come, the groups drained before it were acknowledged as they came and are "
        "lost with the read, which says how many).")),
)
