"""Bridges (issue 46): a source's rows accepted by every sink; the column mapping, pure Arrow, no broker."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_mq import schema as S
from spark_mq.sinks import amqp08, malamute, stomp
from spark_mq.sinks.bridge import FORMATS, RULES, detect, rule_for, table_markdown
from spark_mq.sinks.columns import SinkSchemaError
from spark_mq.sinks.values import SinkDataError

SINKS = {"amqp08": (amqp08, {"uri": "amqp://guest:guest@127.0.0.1:5672/%2F", "routingKey": "out"}),
         "stomp": (stomp, {"uri": "stomp://127.0.0.1:61613", "destination": "/queue/out"}),
         "malamute": (malamute, {"uri": "tcp://127.0.0.1:9999", "mailbox": "out"})}
TS_US = 1_700_000_000_123_000  # the source's timestamp column, microseconds


def source_row(fmt: str, offset: int = 7):
    core = (b"\x00body\xff", "/queue/in" if fmt == "stomp" else "in", "id-1", TS_US,
            [("k", "v"), ("destination", "/queue/in"), ("message-id", "ID:broker-1"), ("subscription", "s1"),
             ("content-type", "text/plain"), ("persistent", "true")] if fmt == "stomp" else [("k", "v")],
            True, offset)
    own = {
        "amqp08": ("ex", "rk", 42, "application/json", "gzip", 2, 5, "corr", "reply", "60000", "evt", "guest",
                   "app", "cl"),
        "stomp": ("s1", "text/plain", "corr", "reply", 5, 1_800_000_000_000),
        "malamute": ("sender-1", "in", "subj", "trk-1", None),
    }[fmt]
    return core + own


def plan_for(source: str, sink: str, **options):
    module, base = SINKS[sink]
    given = {k: v for k, v in {**base, **options}.items() if v is not None}
    if "stream" in options:
        given.pop("mailbox")
    return module.create_stream_writer(given, S.source_schema(source), False).plan


@pytest.mark.parametrize("source", FORMATS)
@pytest.mark.parametrize("sink", FORMATS)
def test_every_source_is_accepted_by_every_sink_with_no_select(source, sink):
    plan = plan_for(source, sink)
    assert plan.bridge is not None and plan.bridge.source == source
    out = plan.bridge.convert(S.build_batch(source, [source_row(source)]))
    assert out.column(out.schema.get_field_index("body")).to_pylist() == [b"\x00body\xff"]
    # the converted columns are what the sink's column check accepted, in the same positions
    assert tuple(out.schema.names) == tuple(name for name, _ in plan.bridge.output_fields())
    for name, index, _ in plan.columns.positions:
        assert out.schema.names[index] == name
    encoder = plan.make_encoder(plan)
    messages, size = encoder.encode(out, "q:0:tag:0:", 0)
    assert len(messages) == 1 and size >= len(b"\x00body\xff")


def test_every_source_column_has_a_rule_in_every_sink():
    for sink in FORMATS:
        for source in FORMATS:
            for name, _ in S.SOURCE_COLUMNS[source]:
                assert rule_for(sink, source, name).how in ("column", "header", "route", "id", "headers",
                                                            "frames", "single", "drop")
    assert set(RULES) == set(FORMATS)
    table = table_markdown()
    assert "`amqp08.user_id`" in table and "`malamute.frames`" in table and "`offset`" in table


def test_amqp_to_stomp_carries_properties_as_rabbitmq_stomp_headers_and_the_id():
    plan = plan_for("amqp08", "stomp")
    out = plan.bridge.convert(S.build_batch("amqp08", [source_row("amqp08")]))
    (dest, body, headers), = plan.make_encoder(plan).encode(out, "q:0:tag:0:", 0)[0]
    assert dest == "/queue/out" and body == b"\x00body\xff"
    assert headers["spark-mq-message-id"] == "id-1"
    assert headers["content-type"] == "application/json" and headers["content-encoding"] == "gzip"
    assert headers["persistent"] == "true" and headers["priority"] == "5" and headers["reply-to"] == "reply"
    assert headers["correlation-id"] == "corr" and headers["type"] == "evt" and headers["app-id"] == "app"
    assert headers["amqp-routing-key"] == "rk" and headers["original-user-id"] == "guest"
    assert headers["k"] == "v" and headers["timestamp"] == str(TS_US // 1000)
    assert "user-id" not in headers


def test_stomp_to_amqp_lifts_property_headers_and_leaves_frame_headers_out():
    plan = plan_for("stomp", "amqp08")
    out = plan.bridge.convert(S.build_batch("stomp", [source_row("stomp")]))
    (exchange, rk, body, props), = plan.make_encoder(plan).encode(out, "q:0:tag:0:", 0)[0]
    assert (exchange, rk) == ("", "out")
    assert props.message_id == "id-1" and props.content_type == "text/plain" and props.delivery_mode == 2
    assert props.priority == 5 and props.correlation_id == "corr" and props.timestamp == TS_US // 1_000_000
    assert props.headers == {"k": "v", "expires": "1800000000000"}


def test_routing_columns_route_only_when_no_routing_option_is_given():
    row = source_row("amqp08")
    plan = plan_for("amqp08", "amqp08", routingKey=None)
    (exchange, rk, _, props), = plan.make_encoder(plan).encode(
        plan.bridge.convert(S.build_batch("amqp08", [row])), "p", 0)[0]
    assert (exchange, rk) == ("ex", "rk") and props.delivery_mode == 2 and props.app_id == "app"
    assert props.user_id is None and props.headers == {"k": "v", "original-user-id": "guest"}
    plan = plan_for("amqp08", "amqp08", routingKey="elsewhere")
    (exchange, rk, _, _), = plan.make_encoder(plan).encode(plan.bridge.convert(S.build_batch("amqp08", [row])), "p", 0)[0]
    assert (exchange, rk) == ("", "elsewhere")
    plan = plan_for("stomp", "stomp", destination=None)
    (dest, _, headers), = plan.make_encoder(plan).encode(plan.bridge.convert(S.build_batch("stomp", [source_row("stomp")])), "p", 0)[0]
    assert dest == "/queue/in" and "destination" not in headers and "message-id" not in headers
    assert headers["spark-mq-message-id"] == "id-1" and "subscription" not in headers


def test_a_message_without_an_id_takes_the_sinks_deterministic_id():
    row = list(source_row("amqp08"))
    row[2] = None
    plan = plan_for("amqp08", "stomp")
    (_, _, headers), = plan.make_encoder(plan).encode(plan.bridge.convert(S.build_batch("amqp08", [tuple(row)])),
                                                     "q:3:abcd0123:1:", 9)[0]
    assert headers["spark-mq-message-id"] == "q:3:abcd0123:1:9"


def test_malamute_frames_go_whole_to_malamute_and_fail_a_single_body_sink():
    row = list(source_row("malamute"))
    row[-1] = S.frames_value([b"a", b"b"])
    batch = S.build_batch("malamute", [tuple(row)])
    plan = plan_for("malamute", "malamute")
    (address, subject, content, tracker), = plan.make_encoder(plan).encode(plan.bridge.convert(batch), "p", 0)[0]
    assert (address, subject, content, tracker) == ("out", "subj", [b"a", b"b"], "id-1")
    with pytest.raises(SinkDataError, match="offset 7 has 2 frames"):
        plan_for("malamute", "amqp08").bridge.convert(batch)


def test_a_malamute_subject_header_comes_back_as_the_subject():
    plan = plan_for("malamute", "stomp")
    (_, _, headers), = plan.make_encoder(plan).encode(
        plan.bridge.convert(S.build_batch("malamute", [source_row("malamute")])), "p", 0)[0]
    assert headers["malamute-subject"] == "subj" and headers["malamute-sender"] == "sender-1"
    row = list(source_row("stomp"))
    row[4] = row[4] + [("malamute-subject", "back")]
    plan = plan_for("stomp", "malamute", stream="weather")
    (_, subject, _, _), = plan.make_encoder(plan).encode(plan.bridge.convert(S.build_batch("stomp", [tuple(row)])), "p", 0)[0]
    assert subject == "back"


def test_unknown_columns_still_fail_and_a_subset_is_not_a_bridge():
    from pyspark.sql.types import StringType, StructField
    extra = S.source_schema("stomp").add(StructField("oops", StringType()))
    with pytest.raises(SinkSchemaError, match="'oops' is not a column of that source"):
        amqp08.create_stream_writer(SINKS["amqp08"][1], extra, False)
    plan = amqp08.create_stream_writer({**SINKS["amqp08"][1], "ignoreExtraColumns": "true"}, extra, False).plan
    assert plan.bridge is not None
    assert detect([("body", "binary"), ("headers", "map<string,string>")]) is None


def test_bridge_command_targets_and_progress_line():
    from spark_mq.apps.bridge_job import BridgeUsageError, progress_line, target_options

    assert target_options("amqp08", "orders", "source") == {"queue": "orders"}
    assert target_options("amqp08", "orders", "sink") == {"routingKey": "orders"}
    assert target_options("stomp", "/queue/a", "sink") == {"destination": "/queue/a"}
    assert target_options("malamute", "weather", "source") == {"stream": "weather"}
    assert target_options("malamute", "mailbox:alice", "sink") == {"mailbox": "alice"}
    with pytest.raises(BridgeUsageError, match="stream:NAME, mailbox:NAME or service:NAME"):
        target_options("malamute", "queue:x", "source")
    progress = {"batchId": 4, "processedRowsPerSecond": 2500.0,
                "sources": [{"latestOffset": '{"offset": 900, "logHead": 1000, "brokerQueueDepth": 50, '
                                             '"reconnects": 2, "connected": true}',
                             "endOffset": '{"offset": 900}'}]}
    line = progress_line(progress, 12_000, 10.0)
    assert line == ("bridge: batch 4, 12,000 messages in 10s (1,200/s overall, 2,500/s last batch), "
                    "backlog 150, 2 reconnects")
    assert progress_line(None, 0, 1.0) == "bridge: batch -, 0 messages in 1s (0/s overall)"


def test_bridge_command_usage_errors_name_the_argument(capsys):
    from spark_mq.apps.cli import EXIT_USAGE, main

    assert main(["bridge", "http://x", "amqp://h/%2F", "--from", "a", "--to", "b"]) == EXIT_USAGE
    assert "FROM_URI" in capsys.readouterr().err
    assert main(["bridge", "tcp://127.0.0.1:1", "amqp://h/%2F", "--from", "topic:x", "--to", "b"]) == EXIT_USAGE
    assert "Malamute target 'topic:x'" in capsys.readouterr().err


def test_amqp_application_headers_with_stomp_like_names_cross_an_amqp_bridge_untouched():
    """Review finding: the STOMP frame and property header names were dropped from every source."""
    row = list(source_row("amqp08"))
    row[4] = [("type", "order"), ("priority", "high"), ("destination", "eu"), ("x", "1")]
    plan = plan_for("amqp08", "amqp08")
    (_, _, _, props), = plan.make_encoder(plan).encode(plan.bridge.convert(S.build_batch("amqp08", [tuple(row)])),
                                                      "p", 0)[0]
    assert props.headers == {"type": "order", "priority": "high", "destination": "eu", "x": "1",
                             "original-user-id": "guest"}
    assert props.type == "evt" and props.priority == 5  # the properties stay the source's own
    plan = plan_for("amqp08", "stomp")  # into a SEND frame, a 'destination' header would reroute it
    (dest, _, headers), = plan.make_encoder(plan).encode(plan.bridge.convert(S.build_batch("amqp08", [tuple(row)])),
                                                        "p", 0)[0]
    assert dest == "/queue/out" and "destination" not in headers and headers["x"] == "1"


def test_the_default_bridge_state_does_not_depend_on_credentials():
    """Review finding: a rotated password gave a new state directory, stranding the old log."""
    from types import SimpleNamespace

    from spark_mq.apps.bridge_job import state_dir

    def args(src, dst):
        return SimpleNamespace(state=None, from_uri=src, to_uri=dst, source="/queue/a", sink="a")

    one = state_dir(args("stomp://u:old@Broker:61613", "amqp://g:x@rabbit:5672/%2F"))
    assert one == state_dir(args("stomp://u:new@broker:61613", "amqp://h:y@rabbit:5672/%2F"))
    assert one != state_dir(args("stomp://u:new@other:61613", "amqp://h:y@rabbit:5672/%2F"))
    assert "old" not in one and "new" not in one


def test_the_bridge_command_reports_the_cause_inside_sparks_wrapping():
    from spark_mq.apps.bridge_job import cause_of

    text = ("[STREAM_FAILED] Query [id = x] terminated with exception: [PYTHON_EXCEPTION] An exception was thrown "
            "from the Python worker: Traceback (most recent call last):\n  File \"w.py\", line 1, in f\n    g()\n"
            "spark_mq.errors.ConnectionClosedError: connection to 127.0.0.1:5 refused (option 'uri')\n"
            "\tat org.apache.spark.api.python.X(X.scala:1)")
    assert cause_of(text) == "spark_mq.errors.ConnectionClosedError: connection to 127.0.0.1:5 refused (option 'uri')"
    assert cause_of("plain failure") == "plain failure"


def test_key_value_flags_name_the_flag_and_the_item():
    """``--source-option``/``--sink-option`` of the bridge and the other commands' KEY=VALUE flags share
    one parser; each command's own usage error names the flag at fault."""
    from spark_mq.apps.bridge_job import BridgeUsageError
    from spark_mq.apps.commands.common import UsageError, pairs

    assert pairs(["a=1", "b=x=y", "c="], "--source-option") == {"a": "1", "b": "x=y", "c": ""}
    assert pairs(None, "--header") == {}
    with pytest.raises(BridgeUsageError, match=r"--sink-option 'bad': expected KEY=VALUE"):
        pairs(["ok=1", "bad"], "--sink-option", BridgeUsageError)
    with pytest.raises(UsageError, match=r"--header '=v': expected KEY=VALUE"):
        pairs(["=v"], "--header")
