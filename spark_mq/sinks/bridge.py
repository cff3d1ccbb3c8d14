"""Bridges: the rows of any spark-mq source written straight into any sink, with no select.

Responsible for: recognising an input schema as a source's (``detect``: the seven core columns with
their types, plus columns of one format's own), the mapping of every source column to a field of
each sink (``RULES``: carried to a column, carried in a header, used for routing where the sink's
routing options are not given, or knowingly dropped because it describes the delivery, not the
message), and ``Bridge``, the picklable converter that turns a source-schema Arrow batch into the
sink's input columns in the task, before the sink's encoder. The mapping table of docs/bridges.md is
generated from ``RULES`` (``table_markdown``), so the page says what the code does.

Identity across the hop: the sink's id field (AMQP ``message_id``, the STOMP ``messageIdHeader``, the
Malamute tracker) gets the message's own id: a spark-mq id the original producer set (the STOMP
header ``spark-mq-message-id``), else the source's ``message_id``; a row with neither takes the sink's
deterministic id, which a replayed batch repeats (the source log replays the same rows).

Not responsible for encoding (the sink modules) or for checking columns: the converted schema goes
through ``spark_mq.sinks.columns.validate`` like any other input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import pyarrow as pa

from spark_mq.schema import CORE_COLUMNS, ID_HEADER, SOURCE_COLUMNS, struct_of
from spark_mq.sinks.values import SinkDataError

__all__ = ["Rule", "RULES", "Bridge", "detect", "rule_for", "table_markdown", "STOMP_FRAME_HEADERS",
           "ROUTING_OPTIONS"]

FORMATS = ("amqp08", "stomp", "malamute")
#: STOMP headers that belong to one frame (the delivery), never to the message: not carried.
STOMP_FRAME_HEADERS = frozenset({"destination", "message-id", "subscription", "ack", "content-length",
                                 "receipt", "receipt-id", "transaction", "redelivered"})
#: The sink options that, when given, route every bridged message (source routing columns are then
#: dropped): a bridge reads from one place and writes where its options say.
ROUTING_OPTIONS = {"amqp08": ("exchange", "routingKey"), "stomp": ("destination",), "malamute": ("subject",)}
#: AMQP basic properties <-> STOMP headers, as RabbitMQ's STOMP plugin maps them (so a message bridged
#: from AMQP to STOMP on RabbitMQ reaches AMQP consumers there with its properties, and back).
AMQP_STOMP_HEADERS = {
    "content_type": "content-type", "content_encoding": "content-encoding", "delivery_mode": "persistent",
    "priority": "priority", "correlation_id": "correlation-id", "reply_to": "reply-to",
    "expiration": "expiration", "type": "type", "app_id": "app-id", "cluster_id": "cluster-id",
}
_STOMP_TO_AMQP = {v: k for k, v in AMQP_STOMP_HEADERS.items()}
#: Header carrying an AMQP user_id: RabbitMQ refuses a published user_id other than the publisher's own.
ORIGINAL_USER_ID = "original-user-id"
SPARK_MQ_ID_HEADER = ID_HEADER

_CORE = {name: typ for name, typ in CORE_COLUMNS}


@dataclass(frozen=True)
class Rule:
    """What a sink does with one source column. ``how`` is one of: ``column`` (to sink column
    ``target``), ``header`` (into the headers map under ``target``), ``route`` (to routing column
    ``target`` unless a routing option is given), ``id`` (the message's identity), ``headers`` (the
    headers map, filtered), ``frames`` (Malamute multi-frame content), ``single`` (a multi-frame
    message fails the task: the sink carries one body), ``drop``."""

    how: str
    target: str = ""
    note: str = ""


def _drop(why: str) -> Rule:
    return Rule("drop", note=why)


_DELIVERY = "describes the delivery, not the message"
_AMQP_PROPS = ("content_type", "content_encoding", "delivery_mode", "priority", "correlation_id", "reply_to",
               "expiration", "type", "app_id", "cluster_id")

# RULES[sink][(source format or "*", column)]
RULES: Dict[str, Dict[Tuple[str, str], Rule]] = {fmt: {} for fmt in FORMATS}


def _common(sink: str, id_target: str, headers: Rule, timestamp: Rule) -> None:
    r = RULES[sink]
    r[("*", "body")] = Rule("column", "body")
    r[("*", "destination")] = _drop("where the source read it; the sink's options (or routing columns) say "
                                    "where it goes")
    r[("*", "message_id")] = Rule("id", id_target, "the message's id (a spark-mq-message-id header first); "
                                                    "null: the sink's deterministic id")
    r[("*", "timestamp")] = timestamp
    r[("*", "headers")] = headers
    r[("*", "redelivered")] = _drop(_DELIVERY)
    r[("*", "offset")] = _drop("position in the source log")
    r[("amqp08", "delivery_tag")] = _drop(_DELIVERY)
    r[("stomp", "subscription")] = _drop(_DELIVERY)
    r[("malamute", "address")] = _drop("the mailbox or service it was delivered to")
    r[("malamute", "tracker")] = Rule("id", id_target, "same as message_id")


_common("amqp08", "`message_id`",
        Rule("headers", "headers", "from a STOMP source: frame headers left out, and RabbitMQ's STOMP property "
                                   "headers (content-type, persistent, reply-to, ...) become the properties"),
        Rule("column", "timestamp", "seconds"))
for _p in _AMQP_PROPS:
    RULES["amqp08"][("amqp08", _p)] = Rule("column", _p)
RULES["amqp08"].update({
    ("amqp08", "exchange"): Rule("route", "exchange", "used unless option exchange or routingKey is given"),
    ("amqp08", "routing_key"): Rule("route", "routing_key", "used unless option exchange or routingKey is given"),
    ("amqp08", "user_id"): Rule("header", ORIGINAL_USER_ID, "RabbitMQ refuses another publisher's user_id"),
    ("stomp", "content_type"): Rule("column", "content_type"),
    ("stomp", "correlation_id"): Rule("column", "correlation_id"),
    ("stomp", "reply_to"): Rule("column", "reply_to"),
    ("stomp", "priority"): Rule("column", "priority"),
    ("stomp", "expires"): Rule("header", "expires", "absolute ms (AMQP's expiration is a relative TTL)"),
    ("malamute", "sender"): Rule("header", "malamute-sender"),
    ("malamute", "subject"): Rule("header", "malamute-subject"),
    ("malamute", "frames"): Rule("single", "body", "a message of several frames fails the task"),
})

_common("stomp", "header `spark-mq-message-id` (option messageIdHeader)",
        Rule("headers", "headers", "STOMP frame headers (destination, message-id, subscription, ...) left out"),
        Rule("header", "timestamp", "ms, unless the headers have one"))
RULES["stomp"].update({
    ("stomp", "destination"): Rule("route", "destination", "used unless option destination is given"),
    ("amqp08", "exchange"): Rule("header", "amqp-exchange"),
    ("amqp08", "routing_key"): Rule("header", "amqp-routing-key"),
    ("amqp08", "user_id"): Rule("header", ORIGINAL_USER_ID, "RabbitMQ refuses another publisher's user-id"),
    ("stomp", "content_type"): Rule("headers", "headers", "in the headers already"),
    ("stomp", "correlation_id"): Rule("headers", "headers", "in the headers already"),
    ("stomp", "reply_to"): Rule("headers", "headers", "in the headers already"),
    ("stomp", "priority"): Rule("headers", "headers", "in the headers already"),
    ("stomp", "expires"): Rule("headers", "headers", "in the headers already"),
    ("malamute", "sender"): Rule("header", "malamute-sender"),
    ("malamute", "subject"): Rule("header", "malamute-subject"),
    ("malamute", "frames"): Rule("single", "body", "a message of several frames fails the task"),
})
for _p in _AMQP_PROPS:
    RULES["stomp"][("amqp08", _p)] = Rule("header", AMQP_STOMP_HEADERS[_p],
                                          "persistent: delivery_mode 2" if _p == "delivery_mode" else "")

_NO_FIELD = "Malamute messages carry a subject and frames only"
_common("malamute", "`tracker` (mailbox and service modes)", _drop(_NO_FIELD + " (a malamute-subject header becomes the subject)"),
        _drop(_NO_FIELD))
RULES["malamute"].update({
    ("malamute", "subject"): Rule("route", "subject", "used unless option subject is given"),
    ("malamute", "frames"): Rule("frames", "frames"),
    ("malamute", "sender"): _drop("the broker sets the sender"),
})
for _src, _own in (("amqp08", SOURCE_COLUMNS["amqp08"]), ("stomp", SOURCE_COLUMNS["stomp"])):
    for _name, _ in _own:
        RULES["malamute"].setdefault((_src, _name), _drop(_NO_FIELD))


def rule_for(sink: str, source: str, column: str) -> Rule:
    rules = RULES[sink]
    rule = rules.get((source, column)) or rules.get(("*", column))
    if rule is None:  # pragma: no cover - test_bridge checks every source column has a rule
        raise KeyError(f"no bridge rule for {source}.{column} -> {sink}")
    return rule


def detect(fields: List[Tuple[str, str]]) -> Optional[Tuple[str, List[str]]]:
    """``(source format, unknown column names)`` when ``fields`` (name, simple type) are a spark-mq
    source's rows: every core column with its type (``body`` may be a string), the rest best matching
    one format's own columns. None otherwise."""
    types = {name.lower(): typ for name, typ in fields}
    for name, typ in _CORE.items():
        if types.get(name) != typ and not (name == "body" and types.get(name) == "string"):
            return None
    rest = [name for name, _ in fields if name.lower() not in _CORE]
    best, best_hits = "", -1
    for fmt in FORMATS:
        own = {n for n, _ in SOURCE_COLUMNS[fmt]} - set(_CORE)
        hits = sum(1 for n in rest if n.lower() in own and types[n.lower()] == dict(SOURCE_COLUMNS[fmt])[n.lower()])
        if hits > best_hits:
            best, best_hits = fmt, hits
    own_types = dict(SOURCE_COLUMNS[best])
    unknown = [n for n in rest if own_types.get(n.lower()) != types[n.lower()]]
    return best, unknown


def _stringify(value) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class Bridge:
    """Converts a source's Arrow batch into the sink's input columns (see the module docstring).
    Built on the driver from the input schema and the sink's options; pickled to the tasks."""

    def __init__(self, source: str, sink: str, fields: List[Tuple[str, str]], options, ignore: List[str]) -> None:
        self.source, self.sink = source, sink
        self.index = {name.lower(): i for i, (name, _) in enumerate(fields)}
        self.text_body = dict((n.lower(), t) for n, t in fields).get("body") == "string"
        routing = ROUTING_OPTIONS[sink]
        self.route = not any(options.get(name) for name in routing)
        self.stream_mode = sink == "malamute" and bool(options.get("stream"))
        self.id_header = options.get("messageIdHeader") or SPARK_MQ_ID_HEADER
        self.rules = {name.lower(): rule_for(sink, source, name.lower())
                      for name, _ in fields if name.lower() not in {i.lower() for i in ignore}}

    # -- the sink's input schema -------------------------------------------------------------------

    def output_fields(self) -> List[Tuple[str, str]]:
        """(name, Spark DDL type) of the columns ``convert`` produces, in order."""
        out: Dict[str, str] = {"body": "string" if self.text_body else "binary"}
        for name, rule in self.rules.items():
            if rule.how == "column" and rule.target != "body":
                out[rule.target] = dict(SOURCE_COLUMNS[self.source])[name]
            elif rule.how == "route" and self.route:
                out[rule.target] = "string"
            elif rule.how == "frames":
                out["frames"] = "array<binary>"
        if self.sink == "amqp08" and self.source == "stomp" and "headers" in self.index:
            for prop in _STOMP_TO_AMQP.values():  # lifted from RabbitMQ's STOMP property headers
                out.setdefault(prop, "int" if prop in ("delivery_mode", "priority") else "string")
        if self._wants_headers():
            out["headers"] = "map<string,string>"
        if self.sink == "amqp08":
            out["message_id"] = "string"
        elif self.sink == "malamute" and not self.stream_mode:
            out["tracker"] = "string"
        if self.sink == "malamute" and "subject" not in out and self.route and "headers" in self.index:
            out["subject"] = "string"  # from a malamute-subject header (a round trip)
        return list(out.items())

    def output_schema(self):
        """``output_fields`` as a pyspark ``StructType`` (driver side: what the sink's columns are checked on)."""
        return struct_of(self.output_fields())

    def _wants_headers(self) -> bool:
        return self.sink != "malamute"

    # -- the task side -----------------------------------------------------------------------------

    def convert(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        col = lambda name: batch.column(self.index[name]) if name in self.index else None  # noqa: E731
        out: Dict[str, object] = {"body": col("body")}
        headers_in = col("headers")
        header_rows = headers_in.to_pylist() if headers_in is not None else [None] * n
        source_headers = [dict(h) if h else {} for h in header_rows]
        ids = self._identities(col, source_headers, n)
        extra: List[Dict[str, str]] = [{} for _ in range(n)]
        for name, rule in self.rules.items():
            array = col(name)
            if rule.how == "column" and name != "body":
                out[rule.target] = array
            elif rule.how == "route" and self.route:
                out[rule.target] = array
            elif rule.how == "frames":
                out["frames"] = array
            elif rule.how == "single":
                self._check_single(array, col("offset"))
            elif rule.how == "header":
                for row, value in zip(extra, array.to_pylist()):
                    value = self._header_value(name, value)
                    if value is not None:
                        row[rule.target] = value
        if self.sink == "amqp08" and self.source == "stomp" and headers_in is not None:
            self._lift_properties(source_headers, out)
        if self._wants_headers():
            out["headers"] = pa.array(self._merged_headers(source_headers, extra, ids), type=pa.map_(pa.string(), pa.string()))
        if self.sink == "amqp08":
            out["message_id"] = pa.array(ids, type=pa.string())
        elif self.sink == "malamute" and not self.stream_mode:
            out["tracker"] = pa.array(ids, type=pa.string())
        if self.sink == "malamute" and "subject" not in out and self.route and "headers" in self.index:
            out["subject"] = pa.array([h.get("malamute-subject") for h in source_headers], type=pa.string())
        names = [name for name, _ in self.output_fields()]
        return pa.RecordBatch.from_arrays([out[name] for name in names], names=names)

    def _identities(self, col, source_headers: List[dict], n: int) -> List[Optional[str]]:
        own = col("message_id")
        values = own.to_pylist() if own is not None else [None] * n
        return [h.get(SPARK_MQ_ID_HEADER) or h.get(self.id_header) or v for h, v in zip(source_headers, values)]

    def _header_value(self, name: str, value) -> Optional[str]:
        if value is None:
            return None
        if name == "delivery_mode":  # RabbitMQ's STOMP persistent header
            return "true" if value == 2 else "false"
        if name == "timestamp":
            return str(int(value.timestamp() * 1000))
        return _stringify(value)

    def _check_single(self, frames: pa.Array, offsets: Optional[pa.Array]) -> None:
        if frames is None or not frames.null_count < len(frames):
            return
        for i, value in enumerate(frames.to_pylist()):
            if value is not None and len(value) > 1:
                where = f"offset {offsets[i].as_py()}" if offsets is not None else f"row {i}"
                raise SinkDataError(
                    f"the message at {where} has {len(value)} frames, and the {self.sink} sink carries one body: "
                    f"select the frame to send (e.g. frames[1] as body) or join them")

    def _lift_properties(self, source_headers: List[dict], out: dict) -> None:
        """AMQP sink: RabbitMQ's STOMP property headers become the properties a column did not give."""
        for header, prop in _STOMP_TO_AMQP.items():
            if prop in out:
                continue
            values = [h.get(header) for h in source_headers]
            if prop == "delivery_mode":
                out[prop] = pa.array([None if v is None else (2 if v == "true" else 1) for v in values], type=pa.int32())
            elif prop == "priority":
                out[prop] = pa.array([_int_or_none(v) for v in values], type=pa.int32())
            else:
                out[prop] = pa.array(values, type=pa.string())

    def _merged_headers(self, source_headers: List[dict], extra: List[dict], ids: List[Optional[str]]) -> list:
        # STOMP frame headers belong to a STOMP delivery (a STOMP source's) and would rewrite a SEND
        # frame (a STOMP sink's); a STOMP source's property headers became AMQP properties. An AMQP
        # source's application headers are the message's own, whatever their names.
        drop: set = set()
        if self.source == "stomp" or self.sink == "stomp":
            drop |= STOMP_FRAME_HEADERS
        if self.source == "stomp" and self.sink == "amqp08":
            drop |= set(_STOMP_TO_AMQP)
        rows = []
        for h, more, ident in zip(source_headers, extra, ids):
            merged = {k: v for k, v in h.items() if k not in drop and v is not None}
            for k, v in more.items():
                merged.setdefault(k, v)
            if self.sink == "stomp" and ident is not None:
                merged.setdefault(self.id_header, ident)
            rows.append(list(merged.items()))
        return rows


def _int_or_none(value: Optional[str]) -> Optional[int]:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def table_markdown() -> str:
    """The mapping table of docs/bridges.md: one row per source column, one column per sink."""
    lines = ["| source column | into `amqp08` | into `stomp` | into `malamute` |", "|---|---|---|---|"]
    seen = set()
    for fmt in FORMATS:
        for name, _ in SOURCE_COLUMNS[fmt]:
            key = name if name in _CORE else f"{fmt}.{name}"
            if key in seen:
                continue
            seen.add(key)
            cells = []
            for sink in FORMATS:
                cells.append(_describe(rule_for(sink, fmt if name not in _CORE else "*", name)))
            lines.append(f"| `{key}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _describe(rule: Rule) -> str:
    text = {
        "column": f"`{rule.target}`",
        "header": f"header `{rule.target}`",
        "route": f"`{rule.target}` (routing)",
        "id": f"the id, as {rule.target}",
        "headers": "headers",
        "frames": "`frames`",
        "single": "`body`",
        "drop": "dropped",
    }[rule.how]
    return f"{text}: {rule.note}" if rule.note else text
