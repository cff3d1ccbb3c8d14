"""The generated tables match the spec XML, and regeneration changes nothing."""

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

from spark_mq.protocol.amqp08 import spec

ROOT = Path(__file__).resolve().parents[3]


def _generator():
    path = ROOT / "tools" / "gen_amqp08.py"
    mod_spec = importlib.util.spec_from_file_location("gen_amqp08", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def test_regeneration_is_a_no_op():
    gen = _generator()
    committed = (ROOT / "spark_mq" / "protocol" / "amqp08" / "spec.py").read_text()
    assert gen.generate() == committed, "spec.py is stale: run python tools/gen_amqp08.py"


def test_every_spec_method_is_generated_with_its_ids():
    root = ET.parse(ROOT / "specs" / "amqp0-8.xml").getroot()
    expected = {}
    for c in root.findall("class"):
        for m in c.findall("method"):
            expected[f"{c.get('name')}.{m.get('name')}"] = (int(c.get("index")), int(m.get("index")))
    assert len(expected) == 92
    spec_methods = {cls.NAME: cls for cls in spec.METHODS.values() if not cls.__name__.startswith("Rabbit")}
    assert set(spec_methods) == set(expected)
    for name, (class_id, method_id) in expected.items():
        cls = spec.METHODS_BY_NAME[name]
        assert (cls.CLASS_ID, cls.METHOD_ID) == (class_id, method_id), name
        assert cls.INDEX == (class_id << 16) | method_id


def test_zero_eight_numbering_not_zero_nine_one():
    # 0-8: connection.close is 60/61 (0-9-1 moved it to 50/51); channel.alert exists (30)
    assert spec.ConnectionClose.METHOD_ID == 60
    assert spec.ConnectionCloseOk.METHOD_ID == 61
    assert spec.ConnectionRedirect.METHOD_ID == 50
    assert spec.ChannelAlert.METHOD_ID == 30
    assert spec.PROTOCOL_HEADER == b"AMQP\x01\x01\x08\x00"
    assert (spec.VERSION_MAJOR, spec.VERSION_MINOR) == (8, 0)


def test_every_content_class_has_its_property_list():
    root = ET.parse(ROOT / "specs" / "amqp0-8.xml").getroot()
    for c in root.findall("class"):
        fields = [f.get("name").replace(" ", "_") for f in c.findall("field")]
        if not fields:
            assert int(c.get("index")) not in spec.PROPERTIES
            continue
        props = spec.PROPERTIES[int(c.get("index"))]
        assert list(props.FIELDS) == fields, c.get("name")
    assert set(spec.PROPERTIES) == {60, 70, 80, 110}


def test_reply_codes_map_to_soft_and_hard_errors():
    from spark_mq.protocol.amqp08.errors import AMQPChannelError, AMQPConnectionError

    assert issubclass(spec.ERRORS[404], AMQPChannelError)
    assert issubclass(spec.ERRORS[403], AMQPChannelError)
    assert issubclass(spec.ERRORS[320], AMQPConnectionError)
    assert issubclass(spec.ERRORS[540], AMQPConnectionError)
    for code, hard in spec.HARD_ERRORS.items():
        assert issubclass(spec.ERRORS[code], AMQPConnectionError if hard else AMQPChannelError)
        assert spec.ERRORS[code].REPLY_CODE == code


def test_rabbitmq_dialect_overlay():
    # RabbitMQ's 0-8 basic.consume has no arguments table; its sync recover is 110/111
    assert "arguments" not in spec.RabbitBasicConsume.FIELDS
    assert spec.RabbitBasicConsume.INDEX == spec.BasicConsume.INDEX
    assert spec.RabbitBasicRecover.METHOD_ID == 110
    assert spec.RabbitBasicRecover.RESPONSES == (spec.RabbitBasicRecoverOk,)
    assert spec.METHODS[(60 << 16) | 111] is spec.RabbitBasicRecoverOk
    # the spec's own classes keep their registry slots
    assert spec.METHODS[(60 << 16) | 20] is spec.BasicConsume
    assert spec.METHODS[(60 << 16) | 100] is spec.BasicRecover


# -- AMQP 0-9-1, from RabbitMQ's JSON specification --------------------------------------------------

def test_regeneration_of_091_is_a_no_op():
    gen = _generator()
    committed = (ROOT / "spark_mq" / "protocol" / "amqp08" / "spec091.py").read_text()
    assert gen.generate_091() == committed, "spec091.py is stale: run python tools/gen_amqp08.py"


def _ident(name: str) -> str:
    import keyword

    out = name.replace("-", "_")
    return out + "_" if keyword.iskeyword(out) else out  # basic.qos' "global"


def test_every_091_method_and_property_is_generated_with_its_ids():
    import json

    from spark_mq.protocol.amqp08 import spec091

    root = json.loads((ROOT / "specs" / "amqp-rabbitmq-0.9.1.json").read_text())
    expected = {f"{c['name']}.{m['name']}": (c["id"], m["id"]) for c in root["classes"] for m in c["methods"]}
    assert len(expected) == 66
    assert set(spec091.METHODS_BY_NAME) == set(expected)
    assert len(spec091.METHODS) == 66 and spec091.RABBITMQ_METHODS == {}
    for name, (class_id, method_id) in expected.items():
        cls = spec091.METHODS_BY_NAME[name]
        assert (cls.CLASS_ID, cls.METHOD_ID, cls.INDEX) == (class_id, method_id, (class_id << 16) | method_id), name
        args = [_ident(a["name"]) for c in root["classes"] if c["name"] == name.split(".")[0]
                for m in c["methods"] if m["name"] == name.split(".")[1] for a in m.get("arguments", [])]
        assert list(cls.FIELDS) == args, name
    for c in root["classes"]:
        props = [_ident(p["name"]) for p in c.get("properties", [])]
        assert (list(spec091.PROPERTIES[c["id"]].FIELDS) if props else c["id"] not in spec091.PROPERTIES) \
            in (props, True), c["name"]


def test_091_numbering_header_and_extensions():
    from spark_mq.protocol.amqp08 import spec091

    assert spec091.PROTOCOL_HEADER == b"AMQP\x00\x00\x09\x01"
    assert (spec091.VERSION_MAJOR, spec091.VERSION_MINOR) == (0, 9)
    assert (spec091.ConnectionClose.METHOD_ID, spec091.ConnectionCloseOk.METHOD_ID) == (50, 51)  # 0-8: 60/61
    assert spec091.ChannelOpenOk.FIELDS == ("channel_id",)  # 0-8's has none
    assert "arguments" in spec091.BasicConsume.FIELDS
    # RabbitMQ's extensions, each with who may send it
    assert spec091.ConfirmSelect.CLASS_ID == 85 and spec091.ConfirmSelect.RESPONSES == (spec091.ConfirmSelectOk,)
    assert spec091.ConfirmSelect.CLIENT_MAY_SEND and not spec091.ConfirmSelect.SERVER_MAY_SEND
    assert spec091.BasicNack.CLIENT_MAY_SEND and spec091.BasicNack.SERVER_MAY_SEND
    assert spec091.ConnectionBlocked.SERVER_MAY_SEND and not spec091.ConnectionBlocked.CLIENT_MAY_SEND
    assert spec091.ExchangeBind.RESPONSES == (spec091.ExchangeBindOk,)
    nack, end = spec091.BasicNack.decode(spec091.BasicNack(7, multiple=True, requeue=False).encode(), 4)
    assert (nack.delivery_tag, nack.multiple, nack.requeue, end) == (7, True, False, 13)
    from spark_mq.protocol.amqp08.errors import AMQPChannelError, AMQPConnectionError

    assert issubclass(spec091.ERRORS[404], AMQPChannelError) and issubclass(spec091.ERRORS[501], AMQPConnectionError)
    assert spec091.HARD_ERRORS[501] and not spec091.HARD_ERRORS[404]
