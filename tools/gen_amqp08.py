#!/usr/bin/env python3
"""Generate ``spark_mq/protocol/amqp08/spec.py`` from ``specs/amqp0-8.xml`` and
``spark_mq/protocol/amqp08/spec091.py`` from ``specs/amqp-rabbitmq-0.9.1.json``.

Offline and deterministic: the same XML always gives byte-identical output, and
``tests/unit/amqp08/test_generated.py`` fails when a committed module differs from a fresh
generation. Run ``python tools/gen_amqp08.py`` after changing the generator or a spec. Both protocol
versions go through the same loader shape and the same emitter: the two modules have the same names
(``METHODS``, ``PROPERTIES``, ``ERRORS``, ``PROTOCOL_HEADER``, one class per method), so what differs
between 0-8 and 0-9-1 is in the tables, not in the code that uses them.

What is emitted, per the house style (pika's straight-line generated code, pamqp's error classes):
- constants: frame types, frame-end, frame-min-size, reply codes (with soft/hard class);
- one class per method with ``__slots__``, ids, flags (synchronous, content), responses, and a
  straight-line ``encode()`` / ``decode(buf, offset)`` built on precompiled ``struct.Struct``s;
  consecutive fixed-size fields (and packed bit groups) are read and written with one Struct;
- one properties class per content class with the property flags, hand-unrolled decode;
- one exception class per reply code, soft errors under ``AMQPChannelError``, hard under
  ``AMQPConnectionError``.
"""

from __future__ import annotations

import argparse
import builtins
import keyword
import sys
import json
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "amqp0-8.xml"
OVERLAY = ROOT / "specs" / "amqp0-8-rabbitmq.xml"
OUT = ROOT / "spark_mq" / "protocol" / "amqp08" / "spec.py"
SPEC_091 = ROOT / "specs" / "amqp-rabbitmq-0.9.1.json"
OUT_091 = ROOT / "spark_mq" / "protocol" / "amqp08" / "spec091.py"
# Who receives each 0-9-1 method that 0-8 (spec and RabbitMQ's dialect) does not have, or receives
# differently: the JSON specification names no chassis. From the 0-9-1 specification text and RabbitMQ's extensions page.
CHASSIS_091 = {
    "connection.blocked": ["client"], "connection.unblocked": ["client"],
    "connection.update-secret": ["server"], "connection.update-secret-ok": ["client"],
    "exchange.bind": ["server"], "exchange.bind-ok": ["client"],
    "exchange.unbind": ["server"], "exchange.unbind-ok": ["client"],
    "basic.nack": ["client", "server"],  # a consumer's reject of many; the broker's under confirms
    "basic.ack": ["client", "server"],  # 0-8's goes to the server only; under confirms the broker sends it too
    "confirm.select": ["server"], "confirm.select-ok": ["client"],
}

FIXED = {"octet": "B", "short": "H", "long": "I", "longlong": "Q", "timestamp": "Q"}
DEFAULTS = {
    "octet": "0", "short": "0", "long": "0", "longlong": "0", "timestamp": "0",
    "bit": "False", "shortstr": '""', "longstr": 'b""', "table": "None",
}
PY_TYPES = {
    "octet": "int", "short": "int", "long": "int", "longlong": "int", "timestamp": "int",
    "bit": "bool", "shortstr": "str", "longstr": "bytes", "table": "Optional[dict]",
}


def ident(name: str) -> str:
    out = name.replace(" ", "_").replace("-", "_")
    return out + "_" if keyword.iskeyword(out) else out


def camel(name: str) -> str:
    return "".join(p.capitalize() for p in name.replace("-", " ").split())


class Field:
    def __init__(self, name: str, type_: str) -> None:
        self.name = name
        self.attr = ident(name)
        self.type = type_


def load(path: Path):
    root = ET.parse(path).getroot()
    domains = {d.get("name"): d.get("type") for d in root.iter("domain")}

    def field_type(f):
        return f.get("type") or domains[f.get("domain")]

    constants = []
    for c in root.findall("constant"):
        constants.append((c.get("name"), int(c.get("value")), c.get("class")))
    classes = []
    for c in root.findall("class"):
        props = [Field(f.get("name"), field_type(f)) for f in c.findall("field")]
        methods = []
        for m in c.findall("method"):
            methods.append({
                "name": m.get("name"),
                "index": int(m.get("index")),
                "sync": m.get("synchronous") == "1",
                "content": m.get("content") == "1",
                "responses": [r.get("name") for r in m.findall("response")],
                "chassis": sorted(ch.get("name") for ch in m.findall("chassis")),
                "fields": [Field(f.get("name"), field_type(f)) for f in m.findall("field")],
            })
        # The 0-8 XML marks exchange.bound synchronous but names no response although bound-ok
        # exists: a synchronous "x" with no response answers with "x-ok" when the class has one.
        names = {m["name"] for m in methods}
        for m in methods:
            if m["sync"] and not m["responses"] and not m["name"].endswith("-ok") and m["name"] + "-ok" in names:
                m["responses"] = [m["name"] + "-ok"]
        classes.append({"name": c.get("name"), "index": int(c.get("index")), "props": props, "methods": methods})
    return (int(root.get("major")), int(root.get("minor")), int(root.get("port"))), constants, classes


def _chassis_08() -> dict[str, list[str]]:
    out = {}
    for path in (SPEC, OVERLAY):
        for c in ET.parse(path).getroot().findall("class"):
            for m in c.findall("method"):
                out[f"{c.get('name')}.{m.get('name')}"] = sorted(ch.get("name") for ch in m.findall("chassis"))
    return out


def load_json(path: Path):
    """RabbitMQ's JSON specification (rabbitmq-codegen) in the shape ``load`` gives for the XML: constant
    names lower case with spaces ("not found"), error classes "soft error"/"hard error"; the chassis of
    a method 0-8 has too are 0-8's, the others' are ``CHASSIS_091``'s."""
    root = json.loads(path.read_text())
    domains = dict(root["domains"])
    chassis = {**_chassis_08(), **CHASSIS_091}

    def field(arg):
        return Field(arg["name"], arg.get("type") or domains[arg["domain"]])

    constants = [(c["name"].lower().replace("-", " "), int(c["value"]),
                  c["class"].replace("-", " ") if "class" in c else None) for c in root["constants"]]
    classes = []
    for c in root["classes"]:
        methods = []
        for m in c["methods"]:
            name = f"{c['name']}.{m['name']}"
            if name not in chassis:
                raise SystemExit(f"{path.name}: {name} names no chassis: add it to CHASSIS_091")
            methods.append({
                "name": m["name"], "index": int(m["id"]), "sync": bool(m.get("synchronous")),
                "content": bool(m.get("content")), "responses": [], "chassis": chassis[name],
                "fields": [field(a) for a in m.get("arguments", [])],
            })
        names = {m["name"] for m in methods}
        for m in methods:  # the JSON names no responses: a synchronous "x" is answered by "x-ok"
            if m["sync"] and not m["name"].endswith("-ok") and m["name"] + "-ok" in names:
                m["responses"] = [m["name"] + "-ok"]
        classes.append({"name": c["name"], "index": int(c["id"]), "methods": methods,
                        "props": [field(a) for a in c.get("properties", [])]})
    return (int(root["major-version"]), int(root["minor-version"]), int(root["port"])), constants, classes


def groups(fields):
    """Split a field list into runs: ('fixed', [(field|bitgroup)...]) or ('var', field).

    A bit group is a list of consecutive bit fields packed into one octet, LSB first.
    """
    out = []
    run = []
    bits = None
    for f in fields:
        if f.type == "bit":
            if bits is None or len(bits) == 8:
                bits = []
                run.append(bits)
            bits.append(f)
            continue
        bits = None
        if f.type in FIXED:
            run.append(f)
        else:
            if run:
                out.append(("fixed", run))
                run = []
            out.append(("var", f))
    if run:
        out.append(("fixed", run))
    return out


class Emitter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.structs: dict[str, str] = {}

    def w(self, line: str = "") -> None:
        self.lines.append(line)

    def struct(self, fmt: str) -> str:
        name = "_S_" + fmt
        self.structs[fmt] = name
        return name


def run_format(run) -> str:
    return "".join("B" if isinstance(x, list) else FIXED[x.type] for x in run)


def emit_decode_fields(e: Emitter, fields, indent: str) -> None:
    for kind, item in groups(fields):
        if kind == "var":
            f = item
            if f.type == "shortstr":
                e.w(f"{indent}n = buf[o]")
                e.w(f"{indent}{f.attr} = str(buf[o + 1:o + 1 + n], 'utf-8', 'surrogateescape')")
                e.w(f"{indent}o += 1 + n")
            elif f.type == "longstr":
                e.w(f"{indent}n = _unpack_I(buf, o)[0]")
                e.w(f"{indent}{f.attr} = bytes(buf[o + 4:o + 4 + n])")
                e.w(f"{indent}o += 4 + n")
            elif f.type == "table":
                e.w(f"{indent}{f.attr}, o = decode_table(buf, o)")
            else:
                raise ValueError(f.type)
            continue
        fmt = run_format(item)
        s = e.struct(fmt)
        names = []
        bitgroups = []
        for i, x in enumerate(item):
            if isinstance(x, list):
                names.append(f"bits{i}")
                bitgroups.append((f"bits{i}", x))
            else:
                names.append(x.attr)
        lhs = ", ".join(names) + ("," if len(names) == 1 else "")
        e.w(f"{indent}{lhs} = {s}.unpack_from(buf, o)")
        e.w(f"{indent}o += {s}.size")
        for var, bits in bitgroups:
            for bit, f in enumerate(bits):
                e.w(f"{indent}{f.attr} = bool({var} & {1 << bit})")


def emit_encode_fields(e: Emitter, fields, indent: str, target: str) -> None:
    """Append to list ``target`` the encoded pieces of ``fields`` read from ``self``."""
    for kind, item in groups(fields):
        if kind == "var":
            f = item
            fn = {"shortstr": "encode_shortstr", "longstr": "encode_longstr", "table": "encode_table"}[f.type]
            e.w(f"{indent}{target}.append({fn}(self.{f.attr}))")
            continue
        fmt = run_format(item)
        s = e.struct(fmt)
        args = []
        for x in item:
            if isinstance(x, list):
                args.append(" | ".join(f"({1 << i} if self.{f.attr} else 0)" for i, f in enumerate(x)))
            else:
                args.append(f"self.{x.attr}")
        e.w(f"{indent}{target}.append({s}.pack({', '.join(args)}))")


def generate(spec_path: Path = SPEC, overlay_path: Path = OVERLAY) -> str:
    """spec.py: AMQP 0-8 from the XML, with RabbitMQ's 0-8 dialect (the overlay) beside it."""
    version, constants, classes = load(spec_path)
    _v, _c, overlay = load(overlay_path)
    return _generate(version, constants, classes, overlay, title="AMQP 0-8", source=spec_path.name,
                     header="# RabbitMQ's header for 0-8 (the spec's own numbering calls it 8-0): 'AMQP' 1 1 8 0.\n"
                            'PROTOCOL_HEADER = b"AMQP\\x01\\x01\\x08\\x00"')


def generate_091(spec_path: Path = SPEC_091) -> str:
    """spec091.py: AMQP 0-9-1 from RabbitMQ's JSON, which holds its errata and extensions already."""
    version, constants, classes = load_json(spec_path)
    return _generate(version, constants, classes, [], title="AMQP 0-9-1", source=spec_path.name,
                     header="# 'AMQP' 0 0 9 1: the header every RabbitMQ since 2.0 accepts, and the only one 4.x does\n"
                            'PROTOCOL_HEADER = b"AMQP\\x00\\x00\\x09\\x01"')


def _generate(version, constants, classes, overlay, *, title: str, source: str, header: str) -> str:
    major, minor, port = version
    e = Emitter()
    body = Emitter()
    body.structs = e.structs

    # --- constants
    body.w("# -- constants " + "-" * 66)
    body.w(f"VERSION_MAJOR = {major}")
    body.w(f"VERSION_MINOR = {minor}")
    body.w(f"DEFAULT_PORT = {port}")
    for line in header.splitlines():
        body.w(line)
    body.w()
    body.w("")
    body.w("class FrameType(IntEnum):")
    for name, value, _cls in constants:
        if name.startswith("frame ") and name not in ("frame end", "frame min size"):
            body.w(f"    {ident(name[6:]).upper()} = {value}")
    body.w()
    body.w()
    for name, value, _cls in constants:
        if name in ("frame end", "frame min size"):
            body.w(f"{ident(name).upper()} = {value}")
    body.w()
    body.w()
    body.w("class ReplyCode(IntEnum):")
    for name, value, cls in constants:
        if cls in ("soft error", "hard error") or name.startswith("reply "):
            body.w(f"    {ident(name).upper()} = {value}")
    body.w()
    body.w()
    body.w("#: reply code -> True when the spec calls it a hard (connection) error")
    body.w("HARD_ERRORS = {")
    for name, value, cls in constants:
        if cls in ("soft error", "hard error"):
            body.w(f"    {value}: {cls == 'hard error'},")
    body.w("}")
    body.w()

    # --- methods
    body.w()
    body.w("# -- methods " + "-" * 68)
    registry = []
    rabbit_registry = []
    todo = [(c, m, "") for c in classes for m in c["methods"]]
    todo += [(c, m, "Rabbit") for c in overlay for m in c["methods"]]
    for c, m, prefix in todo:
        if True:
            cname = prefix + camel(c["name"]) + camel(m["name"])
            (rabbit_registry if prefix else registry).append((c, m, cname))
            fields = m["fields"]
            index = (c["index"] << 16) | m["index"]
            body.w()
            body.w()
            body.w(f"class {cname}(Method):")
            dialect = "RabbitMQ's " if prefix else ""
            body.w(f'    """{dialect}{c["name"]}.{m["name"]} ({c["index"]}, {m["index"]}); received by the {" and ".join(m["chassis"])}."""')
            body.w()
            body.w(f"    __slots__ = ({''.join(repr(f.attr) + ', ' for f in fields)})")
            body.w(f"    NAME = {c['name'] + '.' + m['name']!r}")
            body.w(f"    CLASS_ID = {c['index']}")
            body.w(f"    METHOD_ID = {m['index']}")
            body.w(f"    INDEX = 0x{index:08X}")
            body.w(f"    SYNCHRONOUS = {m['sync']}")
            body.w(f"    HAS_CONTENT = {m['content']}")
            body.w(f"    CLIENT_MAY_SEND = {'server' in m['chassis']}")
            body.w(f"    SERVER_MAY_SEND = {'client' in m['chassis']}")
            body.w(f"    FIELDS = ({''.join(repr(f.attr) + ', ' for f in fields)})")
            body.w(f"    _PREFIX = {bytes([c['index'] >> 8, c['index'] & 255, m['index'] >> 8, m['index'] & 255])!r}")
            if fields:
                body.w()
                params = ", ".join(f"{f.attr}: {PY_TYPES[f.type]} = {DEFAULTS[f.type]}" for f in fields)
                body.w(f"    def __init__(self, {params}) -> None:")
                for f in fields:
                    body.w(f"        self.{f.attr} = {f.attr}")
            body.w()
            body.w("    def encode(self) -> bytes:")
            if not fields:
                body.w("        return self._PREFIX")
            else:
                body.w("        p = [self._PREFIX]")
                emit_encode_fields(body, fields, "        ", "p")
                body.w('        return b"".join(p)')
            body.w()
            body.w("    @classmethod")
            body.w(f"    def decode(cls, buf, o: int) -> tuple[{cname}, int]:")
            body.w('        """Decode the arguments at ``buf[o:]`` (after the ids); return (method, end offset)."""')
            if not fields:
                body.w("        return cls(), o")
            else:
                emit_decode_fields(body, fields, "        ")
                # no __init__ frame: decoding is the hot path of a consumer
                body.w("        self = _new(cls)")
                for f in fields:
                    body.w(f"        self.{f.attr} = {f.attr}")
                body.w("        return self, o")

    # responses, once every class exists
    body.w()
    body.w()
    defined = {cname for _c, _m, cname in registry + rabbit_registry}
    for c, m, cname in registry + rabbit_registry:
        if m["responses"]:
            names = [camel(c["name"]) + camel(r) for r in m["responses"]]
            if cname.startswith("Rabbit"):  # the dialect's own reply if it has one, else the spec's
                names = ["Rabbit" + n if "Rabbit" + n in defined else n for n in names]
            resp = ", ".join(names)
            body.w(f"{cname}.RESPONSES = ({resp},)")
    body.w()
    body.w("#: (class id << 16 | method id) -> method class")
    body.w("METHODS = {cls.INDEX: cls for cls in (")
    for _c, _m, cname in registry:
        body.w(f"    {cname},")
    body.w(")}")
    body.w("#: 'class.method' -> method class of the spec")
    body.w("METHODS_BY_NAME = {cls.NAME: cls for cls in METHODS.values()}")
    if not rabbit_registry:
        body.w("#: RabbitMQ's dialect: none beside this specification (RabbitMQ's own, errata included)")
        body.w("RABBITMQ_METHODS: dict = {}")
    else:
        body.w("#: RabbitMQ's dialect (specs/amqp0-8-rabbitmq.xml): methods it adds or encodes differently.")
        body.w("RABBITMQ_METHODS = {cls.NAME: cls for cls in (")
        for _c, _m, cname in rabbit_registry:
            body.w(f"    {cname},")
        body.w(")}")
        body.w("#: replies only RabbitMQ sends, decoded alongside the spec's methods")
        body.w("for _cls in RABBITMQ_METHODS.values():")
        body.w("    if _cls.SERVER_MAY_SEND and _cls.INDEX not in METHODS:")
        body.w("        METHODS[_cls.INDEX] = _cls")
        body.w("del _cls")

    # --- properties
    body.w()
    body.w()
    body.w("# -- content header properties " + "-" * 49)
    prop_classes = []
    for c in classes:
        props = c["props"]
        if not props:
            continue
        pname = camel(c["name"]) + "Properties"
        prop_classes.append((c, pname))
        body.w()
        body.w()
        body.w(f"class {pname}(Properties):")
        body.w(f'    """Content header properties of class {c["name"]} ({c["index"]}); None means absent."""')
        body.w()
        body.w(f"    __slots__ = ({''.join(repr(f.attr) + ', ' for f in props)})")
        body.w(f"    CLASS_ID = {c['index']}")
        body.w(f"    FIELDS = ({''.join(repr(f.attr) + ', ' for f in props)})")
        body.w()
        params = ", ".join(f"{f.attr}: Optional[{PY_TYPES[f.type].replace('Optional[dict]', 'dict')}] = None" for f in props)
        body.w(f"    def __init__(self, {params}) -> None:")
        for f in props:
            body.w(f"        self.{f.attr} = {f.attr}")
        body.w()
        body.w("    def encode(self) -> bytes:")
        body.w('        """Property flags followed by the present properties."""')
        body.w("        flags = 0")
        body.w("        p = [b\"\"]")
        for i, f in enumerate(props):
            word, bit = divmod(i, 15)
            mask = 1 << (15 - bit)
            if word:
                raise NotImplementedError("more than 15 properties: continuation words")
            body.w(f"        if self.{f.attr} is not None:")
            body.w(f"            flags |= 0x{mask:04X}")
            body.w(f"            p.append({encode_prop(body, f)})")
        body.w("        p[0] = _S_H.pack(flags)")
        body.w('        return b"".join(p)')
        body.w()
        body.w("    @classmethod")
        body.w(f"    def decode(cls, buf, o: int) -> tuple[{pname}, int]:")
        body.w('        """Decode property flags and list at ``buf[o:]``; return (properties, end offset)."""')
        body.w("        flags = _S_H.unpack_from(buf, o)[0]")
        body.w("        o += 2")
        body.w("        if flags & 1:")
        body.w("            # continuation words carry flags for properties this class does not have")
        body.w("            raise RemoteProtocolError(")
        body.w(f'                "content header for class {c["name"]} has property flag continuation; the class has {len(props)} properties"')
        body.w("            )")
        valid = 0
        for i, _f in enumerate(props):
            valid |= 1 << (15 - i)
        body.w(f"        if flags & 0x{(~valid) & 0xFFFE:04X}:")
        body.w("            raise RemoteProtocolError(")
        body.w(f'                f"content header for class {c["name"]} sets unknown property flags 0x{{flags:04X}}"')
        body.w("            )")
        body.w("        self = cls.__new__(cls)")
        body.w("        " + " = ".join(f"self.{f.attr}" for f in props) + " = None")
        body.w("        if not flags:")
        body.w("            return self, o")
        for i, f in enumerate(props):
            mask = 1 << (15 - i)
            body.w(f"        if flags & 0x{mask:04X}:")
            for line in decode_prop(body, f):
                body.w("            " + line)
        body.w("        return self, o")
    body.w()
    body.w()
    body.w("#: class id -> properties class")
    body.w("PROPERTIES = {")
    for c, pname in prop_classes:
        body.w(f"    {c['index']}: {pname},")
    body.w("}")

    # --- errors
    body.w()
    body.w()
    body.w("# -- errors, one class per reply code " + "-" * 43)
    err_names = []
    for name, value, cls in constants:
        if cls not in ("soft error", "hard error"):
            continue
        ename = error_class_name(name)
        base = "AMQPChannelError" if cls == "soft error" else "AMQPConnectionError"
        err_names.append((value, ename))
        body.w()
        body.w()
        body.w(f"class {ename}({base}):")
        body.w(f'    """Reply code {value} ({name}), a {cls}."""')
        body.w()
        body.w(f"    REPLY_CODE = {value}")
    body.w()
    body.w()
    body.w("#: reply code -> exception class")
    body.w("ERRORS = {")
    for value, ename in err_names:
        body.w(f"    {value}: {ename},")
    body.w("}")

    # --- header
    e.w(f'"""{title} method, property and error tables.')
    e.w()
    e.w(f"GENERATED by tools/gen_amqp08.py from specs/{source}: do not edit by hand.")
    e.w("tests/unit/amqp08/test_generated.py checks that regeneration changes nothing.")
    e.w('"""')
    e.w()
    e.w("# fmt: off")
    e.w("from __future__ import annotations")
    e.w()
    e.w("from enum import IntEnum")
    e.w("from struct import Struct")
    e.w("from typing import Optional")
    e.w()
    e.w("from spark_mq.errors import RemoteProtocolError")
    e.w("from spark_mq.protocol.amqp08.codec import (")
    e.w("    Method,")
    e.w("    Properties,")
    e.w("    _unpack_I,")
    e.w("    decode_table,")
    e.w("    encode_longstr,")
    e.w("    encode_shortstr,")
    e.w("    encode_table,")
    e.w(")")
    e.w("from spark_mq.protocol.amqp08.errors import AMQPChannelError, AMQPConnectionError")
    e.w()
    e.w("_new = object.__new__")
    e.structs.setdefault("H", "_S_H")
    for fmt in sorted(e.structs):
        e.w(f'_S_{fmt} = Struct(">{fmt}")')
    e.w()
    return "\n".join(e.lines + body.lines).rstrip("\n") + "\n"


#: reply-code names whose natural class name would mislead (504 is a hard error despite its name)
_ERROR_NAMES = {"channel error": "ChannelProtocolError"}


def error_class_name(name: str) -> str:
    """'not found' -> NotFoundError; names that clash with Python builtins get an AMQP prefix."""
    if name in _ERROR_NAMES:
        return _ERROR_NAMES[name]
    ename = camel(name) if name.endswith("error") else camel(name) + "Error"
    return "AMQP" + ename if hasattr(builtins, ename) else ename


def encode_prop(e: Emitter, f: Field) -> str:
    if f.type in FIXED:
        return f"{e.struct(FIXED[f.type])}.pack(self.{f.attr})"
    fn = {"shortstr": "encode_shortstr", "longstr": "encode_longstr", "table": "encode_table"}[f.type]
    return f"{fn}(self.{f.attr})"


def decode_prop(e: Emitter, f: Field) -> list[str]:
    if f.type in FIXED:
        s = e.struct(FIXED[f.type])
        return [f"self.{f.attr} = {s}.unpack_from(buf, o)[0]", f"o += {s}.size"]
    if f.type == "shortstr":
        return ["n = buf[o]", f"self.{f.attr} = str(buf[o + 1:o + 1 + n], 'utf-8', 'surrogateescape')", "o += 1 + n"]
    if f.type == "longstr":
        return ["n = _unpack_I(buf, o)[0]", f"self.{f.attr} = bytes(buf[o + 4:o + 4 + n])", "o += 4 + n"]
    if f.type == "table":
        return [f"self.{f.attr}, o = decode_table(buf, o)"]
    raise ValueError(f.type)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed module is stale")
    args = ap.parse_args(argv)
    stale = 0
    for out, text in ((OUT, generate()), (OUT_091, generate_091())):
        if args.check:
            if not out.exists() or out.read_text() != text:
                print(f"{out.relative_to(ROOT)} is stale: run tools/gen_amqp08.py", file=sys.stderr)
                stale = 1
            continue
        out.write_text(text)
        print(f"wrote {out.relative_to(ROOT)}")
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
