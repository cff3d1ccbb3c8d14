"""Codec: golden byte vectors, round trips for every method and property list, field tables,
cross-checks with pika's independent 0-9-1 encoder where the layouts agree, and fuzzing."""

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_mq.errors import LocalProtocolError, RemoteProtocolError
from spark_mq.protocol.amqp08 import spec
from spark_mq.protocol.amqp08.codec import decode_table, encode_shortstr, encode_table
from spark_mq.protocol.amqp08.frames import decode_method

GOLDEN = Path(__file__).with_name("golden_methods.json")

# -- hand-written golden vectors (worked out from the spec by hand, not by our encoder) ----------

HAND_GOLDEN = [
    (spec.ConnectionTuneOk(channel_max=2047, frame_max=131072, heartbeat=60),
     "000a001f" "07ff" "00020000" "003c"),
    (spec.ConnectionClose(reply_code=200, reply_text="bye", class_id=0, method_id=0),
     "000a003c" "00c8" "03" "627965" "0000" "0000"),
    (spec.ConnectionCloseOk(), "000a003d"),
    (spec.ConnectionOpen(virtual_host="/", capabilities="", insist=True), "000a0028" "012f" "00" "01"),
    (spec.ChannelOpen(out_of_band=""), "0014000a" "00"),
    (spec.ChannelFlow(active=True), "00140014" "01"),
    (spec.AccessRequest(realm="/data", exclusive=False, passive=True, active=True, write=True, read=True),
     "001e000a" "052f64617461" "1e"),
    (spec.QueueDeclare(ticket=1, queue="q", passive=False, durable=True, exclusive=False, auto_delete=True,
                       nowait=False, arguments={}),
     "0032000a" "0001" "0171" "0a" "00000000"),
    (spec.BasicPublish(ticket=1, exchange="ex", routing_key="rk", mandatory=True, immediate=False),
     "003c0028" "0001" "02" "6578" "02" "726b" "01"),
    (spec.BasicDeliver(consumer_tag="ctag", delivery_tag=42, redelivered=True, exchange="ex", routing_key="rk"),
     "003c003c" "04" "63746167" "000000000000002a" "01" "02" "6578" "02" "726b"),
    (spec.BasicAck(delivery_tag=7, multiple=True), "003c0050" "0000000000000007" "01"),
    (spec.BasicQos(prefetch_size=0, prefetch_count=500, global_=False), "003c000a" "00000000" "01f4" "00"),
    (spec.BasicRecover(requeue=True), "003c0064" "01"),
    (spec.TxCommit(), "005a0014"),
    (spec.StreamQos(prefetch_size=1, prefetch_count=2, consume_rate=3, global_=True),
     "0050000a" "00000001" "0002" "00000003" "01"),
    (spec.DtxStart(dtx_identifier="x"), "00640014" "0178"),
    (spec.TunnelRequest(meta_data={}), "006e000a" "00000000"),
    (spec.TestInteger(integer_1=1, integer_2=2, integer_3=3, integer_4=4, operation=5),
     "0078000a" "01" "0002" "00000003" "0000000000000004" "05"),
    (spec.FileOpen(identifier="id", content_size=9), "00460028" "026964" "0000000000000009"),
    (spec.RabbitBasicConsume(ticket=0, queue="q", consumer_tag="", no_local=False, no_ack=True,
                             exclusive=False, nowait=False),
     "003c0014" "0000" "0171" "00" "02"),
]


@pytest.mark.parametrize("method,hexbytes", HAND_GOLDEN, ids=lambda x: getattr(x, "NAME", None))
def test_hand_golden_vectors(method, hexbytes):
    raw = bytes.fromhex(hexbytes)
    assert method.encode() == raw
    if not type(method).__name__.startswith("Rabbit"):  # the registry decodes the spec's own shape
        assert decode_method(raw) == method
    decoded, end = type(method).decode(raw, 4)
    assert decoded == method and end == len(raw)


def test_properties_hand_golden():
    props = spec.BasicProperties(content_type="text/plain", delivery_mode=2, message_id="m1", timestamp=1)
    # flags: content-type bit 15, delivery-mode bit 12, message-id bit 7, timestamp bit 6
    raw = bytes.fromhex("90c0" "0a" + b"text/plain".hex() + "02" "02" + b"m1".hex() + "0000000000000001")
    assert props.encode() == raw
    assert spec.BasicProperties.decode(raw, 0) == (props, len(raw))
    assert spec.BasicProperties().encode() == b"\x00\x00"


# -- golden file for all 92 methods + RabbitMQ dialect ------------------------------------------


def sample_value(kind, salt):
    return {
        "octet": salt % 256, "short": 1000 + salt, "long": 70000 + salt, "longlong": (1 << 40) + salt,
        "timestamp": 1_700_000_000 + salt, "bit": salt % 2 == 1, "shortstr": f"s{salt}",
        "longstr": f"L{salt}".encode(), "table": {"k": salt, "name": f"v{salt}"},
    }[kind]


def field_kinds(cls):
    """Field name -> wire type, recovered from the spec XML by the generator's loader."""
    import importlib.util

    root = Path(__file__).resolve().parents[3]
    mod_spec = importlib.util.spec_from_file_location("gen_amqp08", root / "tools" / "gen_amqp08.py")
    gen = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(gen)
    kinds = {}
    for path in (gen.SPEC, gen.OVERLAY):
        _v, _c, classes = gen.load(path)
        for c in classes:
            for m in c["methods"]:
                prefix = "Rabbit" if path == gen.OVERLAY else ""
                kinds[prefix + gen.camel(c["name"]) + gen.camel(m["name"])] = {f.attr: f.type for f in m["fields"]}
    return kinds


KINDS = field_kinds(spec)
ALL_METHOD_CLASSES = sorted({*spec.METHODS.values(), *spec.RABBITMQ_METHODS.values()}, key=lambda c: c.__name__)


def sample_method(cls):
    return cls(**{name: sample_value(kind, i + 1) for i, (name, kind) in enumerate(KINDS[cls.__name__].items())})


def test_golden_file_covers_every_method():
    golden = json.loads(GOLDEN.read_text())
    assert set(golden) == {cls.__name__ for cls in ALL_METHOD_CLASSES}
    for cls in ALL_METHOD_CLASSES:
        method = sample_method(cls)
        assert method.encode().hex() == golden[cls.__name__], cls.NAME
        decoded, end = cls.decode(bytes.fromhex(golden[cls.__name__]), 4)
        assert decoded == method and end == len(golden[cls.__name__]) // 2


# -- round trips with generated values ----------------------------------------------------------

STRATEGIES = {
    "octet": st.integers(0, 255), "short": st.integers(0, 65535), "long": st.integers(0, 2**32 - 1),
    "longlong": st.integers(0, 2**64 - 1), "timestamp": st.integers(0, 2**64 - 1), "bit": st.booleans(),
    "shortstr": st.text(max_size=60).filter(lambda s: len(s.encode("utf-8", "surrogateescape")) <= 255),
    "longstr": st.binary(max_size=300),
    "table": st.dictionaries(st.text(max_size=20), st.one_of(
        st.integers(-(2**63), 2**63 - 1), st.text(max_size=30), st.booleans(), st.none(),
        st.binary(max_size=20), st.floats(allow_nan=False)), max_size=5),
}


@pytest.mark.parametrize("cls", ALL_METHOD_CLASSES, ids=lambda c: c.__name__)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_round_trip_every_method(cls, data):
    kwargs = {name: data.draw(STRATEGIES[kind], label=name) for name, kind in KINDS[cls.__name__].items()}
    method = cls(**kwargs)
    raw = method.encode()
    decoded, end = cls.decode(raw, 4)
    assert end == len(raw)
    expected = cls(**{k: ({} if v is None and KINDS[cls.__name__][k] == "table" else v) for k, v in kwargs.items()})
    assert decoded == expected


PROP_KINDS = dict([
        (spec.BasicProperties, {"content_type": "shortstr", "content_encoding": "shortstr", "headers": "table",
                                "delivery_mode": "octet", "priority": "octet", "correlation_id": "shortstr",
                                "reply_to": "shortstr", "expiration": "shortstr", "message_id": "shortstr",
                                "timestamp": "timestamp", "type": "shortstr", "user_id": "shortstr",
                                "app_id": "shortstr", "cluster_id": "shortstr"}),
        (spec.FileProperties, {"content_type": "shortstr", "content_encoding": "shortstr", "headers": "table",
                               "priority": "octet", "reply_to": "shortstr", "message_id": "shortstr",
                               "filename": "shortstr", "timestamp": "timestamp", "cluster_id": "shortstr"}),
        (spec.StreamProperties, {"content_type": "shortstr", "content_encoding": "shortstr", "headers": "table",
                                 "priority": "octet", "timestamp": "timestamp"}),
        (spec.TunnelProperties, {"headers": "table", "proxy_name": "shortstr", "data_name": "shortstr",
                                 "durable": "octet", "broadcast": "octet"}),
])
PROP_STRATEGIES = {
    cls: st.builds(cls, **{name: st.none() | STRATEGIES[kind] for name, kind in kinds.items()})
    for cls, kinds in PROP_KINDS.items()
}


def test_property_strategies_cover_every_class():
    assert set(PROP_STRATEGIES) == set(spec.PROPERTIES.values())
    for cls, kinds in PROP_KINDS.items():
        assert tuple(kinds) == cls.FIELDS


@pytest.mark.parametrize("cls", list(PROP_STRATEGIES), ids=lambda c: c.__name__)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_round_trip_every_property_list(cls, data):
    props = data.draw(PROP_STRATEGIES[cls])
    raw = props.encode() + b"trailing"
    decoded, end = cls.decode(raw, 0)
    assert end == len(raw) - len(b"trailing")
    assert decoded == props


# -- field tables -------------------------------------------------------------------------------

TABLE_GOLDEN = [
    ({"a": 1}, "00000007" "0161" "49" "00000001"),
    ({"t": True}, "00000004" "0174" "7401"),
    ({"s": "hi"}, "00000009" "0173" "53" "00000002" "6869"),
    ({"l": 1 << 40}, "0000000b" "016c" "6c" "0000010000000000"),
    ({"x": b"\x00\xff"}, "00000009" "0178" "78" "00000002" "00ff"),
    ({"d": Decimal("1.5")}, "00000008" "0164" "44" "01" "0000000f"),
    ({"T": dt.datetime(1970, 1, 1, 0, 0, 9, tzinfo=dt.timezone.utc)}, "0000000b" "0154" "54" "0000000000000009"),
    ({"n": None}, "00000003" "016e" "56"),
    ({"A": [1, "a"]}, "00000012" "0141" "41" "0000000b" "4900000001" "530000000161"),
    ({"F": {"k": 2}}, "0000000e" "0146" "46" "00000007" "016b" "4900000002"),
    ({"f": 2.5}, "0000000b" "0166" "64" "4004000000000000"),
]


@pytest.mark.parametrize("table,hexbytes", TABLE_GOLDEN, ids=lambda x: str(x)[:20])
def test_table_golden(table, hexbytes):
    raw = bytes.fromhex(hexbytes)
    assert encode_table(table) == raw
    assert decode_table(raw + b"tail", 0) == (table, len(raw))


def test_table_decodes_rabbitmq_wider_types():
    # b (int8), B (uint8), s (int16), u (uint16), i (uint32), f (float32), L (uint64)
    body = (b"\x01b" b"b\xff" b"\x01B" b"B\xff" b"\x01s" b"s\xff\xfe" b"\x01u" b"u\xff\xfe"
            b"\x01i" b"i\xff\xff\xff\xff" b"\x01f" b"f\x3f\xc0\x00\x00" b"\x01L" b"L" + b"\xff" * 8)
    raw = len(body).to_bytes(4, "big") + body
    assert decode_table(raw, 0)[0] == {"b": -1, "B": 255, "s": -2, "u": 65534, "i": 2**32 - 1, "f": 1.5,
                                        "L": 2**64 - 1}


def test_table_errors_name_the_fault():
    with pytest.raises(RemoteProtocolError, match="unknown field table value type 'Z'"):
        decode_table(b"\x00\x00\x00\x03\x01aZ", 0)
    with pytest.raises(RemoteProtocolError, match="runs past the end"):
        decode_table(b"\x00\x00\x00\x09\x01a", 0)
    with pytest.raises(LocalProtocolError, match="cannot encode object"):
        encode_table({"o": object()})
    with pytest.raises(LocalProtocolError, match="does not fit in 64 bits"):
        encode_table({"big": 1 << 70})
    with pytest.raises(LocalProtocolError, match="exceeds 255"):
        encode_shortstr("x" * 256)


# -- cross-checks with pika (an independent encoder of the same layouts in 0-9-1) ----------------

import pika.spec as pika_spec  # noqa: E402  (a test dependency: pip install -e .[test])
from pika import data as pika_data  # noqa: E402

CROSS = [
    (spec.QueueDeclare(ticket=0, queue="q1", passive=False, durable=True, exclusive=True, auto_delete=False,
                       nowait=False, arguments={"x-max-length": 10}),
     pika_spec.Queue.Declare(queue="q1", durable=True, exclusive=True, arguments={"x-max-length": 10})),
    (spec.QueueBind(ticket=0, queue="q", exchange="e", routing_key="r", arguments={}),
     pika_spec.Queue.Bind(queue="q", exchange="e", routing_key="r")),
    (spec.QueuePurge(ticket=0, queue="q"), pika_spec.Queue.Purge(queue="q")),
    (spec.QueueDelete(ticket=0, queue="q", if_unused=True), pika_spec.Queue.Delete(queue="q", if_unused=True)),
    (spec.ExchangeDeclare(ticket=0, exchange="e", type="topic", durable=True, arguments={}),
     pika_spec.Exchange.Declare(exchange="e", type="topic", durable=True)),
    (spec.BasicQos(prefetch_size=0, prefetch_count=10, global_=True),
     pika_spec.Basic.Qos(prefetch_count=10, global_qos=True)),
    (spec.BasicPublish(ticket=0, exchange="e", routing_key="r", mandatory=True),
     pika_spec.Basic.Publish(exchange="e", routing_key="r", mandatory=True)),
    (spec.BasicGet(ticket=0, queue="q", no_ack=True), pika_spec.Basic.Get(queue="q", no_ack=True)),
    (spec.BasicAck(delivery_tag=99, multiple=True), pika_spec.Basic.Ack(delivery_tag=99, multiple=True)),
    (spec.BasicReject(delivery_tag=5, requeue=False), pika_spec.Basic.Reject(delivery_tag=5, requeue=False)),
    (spec.BasicDeliver(consumer_tag="c", delivery_tag=3, redelivered=True, exchange="e", routing_key="r"),
     pika_spec.Basic.Deliver(consumer_tag="c", delivery_tag=3, redelivered=True, exchange="e", routing_key="r")),
    (spec.BasicCancel(consumer_tag="c"), pika_spec.Basic.Cancel(consumer_tag="c")),
    (spec.ChannelClose(reply_code=404, reply_text="gone", class_id=50, method_id=10),
     pika_spec.Channel.Close(reply_code=404, reply_text="gone", class_id=50, method_id=10)),
    (spec.ConnectionTuneOk(channel_max=1, frame_max=4096, heartbeat=5),
     pika_spec.Connection.TuneOk(channel_max=1, frame_max=4096, heartbeat=5)),
    (spec.ConnectionClose(reply_code=320, reply_text="forced", class_id=0, method_id=0),
     pika_spec.Connection.Close(reply_code=320, reply_text="forced", class_id=0, method_id=0)),
]


@pytest.mark.parametrize("ours,theirs", CROSS, ids=lambda x: getattr(x, "NAME", None))
def test_arguments_match_pika(ours, theirs):
    # ids differ where 0-9-1 renumbered (connection.close 60 -> 50); the argument layout is the same
    assert ours.encode()[4:] == b"".join(theirs.encode())


def test_basic_properties_match_pika_both_ways():
    headers = {"int": 7, "long": 1 << 40, "str": "text", "bool": True, "bytes": b"\x00raw", "none": None,
               "list": [1, "two"], "nested": {"k": "v"}, "dec": Decimal("3.14")}
    ours = spec.BasicProperties(content_type="application/json", content_encoding="utf-8", headers=headers,
                                delivery_mode=2, priority=4, correlation_id="c", reply_to="r", expiration="6000",
                                message_id="m", timestamp=1_700_000_000, type="t", user_id="guest", app_id="a")
    theirs = pika_spec.BasicProperties(content_type="application/json", content_encoding="utf-8", headers=headers,
                                       delivery_mode=2, priority=4, correlation_id="c", reply_to="r",
                                       expiration="6000", message_id="m", timestamp=1_700_000_000, type="t",
                                       user_id="guest", app_id="a")
    their_raw = b"".join(theirs.encode())
    assert ours.encode() == their_raw
    decoded, _ = spec.BasicProperties.decode(their_raw, 0)
    assert decoded == ours
    back = pika_spec.BasicProperties()
    back.decode(ours.encode())
    assert back.headers == headers and back.message_id == "m" and back.timestamp == 1_700_000_000


def test_tables_match_pika():
    table = {"a": 1, "b": "x", "c": True, "d": b"\x01\x02", "e": [1, 2], "f": {"g": None},
             "h": dt.datetime(2020, 1, 2, 3, 4, 5)}
    pieces = []
    pika_data.encode_table(pieces, table)
    theirs = b"".join(pieces)
    ours = encode_table(table)
    assert ours == theirs
    decoded, _ = decode_table(theirs, 0)
    assert decoded["h"] == dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)


# -- fuzz: any input decodes or raises RemoteProtocolError, nothing else -------------------------


@settings(max_examples=2000, deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_decode_method(raw):
    try:
        decode_method(raw)
    except RemoteProtocolError:
        pass


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(ALL_METHOD_CLASSES), st.binary(max_size=64))
def test_fuzz_decode_method_with_valid_ids(cls, tail):
    try:
        decode_method(cls._PREFIX + tail)
    except RemoteProtocolError:
        pass
