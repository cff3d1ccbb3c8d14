"""Unit tests of the sinks without a broker or a SparkSession: column checks, options, encoders (Arrow
rows -> protocol messages with deterministic ids), the task loop's commit/rollback with a fake session,
the connection pool, the Row-writer fallback and the idempotent driver-side commit log."""

from __future__ import annotations

import datetime as dt
import json
import os
import re

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType, TimestampType,
)

from spark_mq.errors import OptionError
from spark_mq.sinks import amqp08, commitlog, connections, malamute, stomp
from spark_mq.sinks.columns import SinkSchemaError
from spark_mq.sinks.plan import COMMIT_LOG_DIR
from spark_mq.sinks.values import SinkDataError
from spark_mq.sinks.writer import (
    SinkCommitMessage, StreamRowWriter, abort_batch, commit_batch, make_stream_writer, rows_to_batches,
    write_partition,
)

AMQP_URI = "amqp://guest:secret@127.0.0.1:5672/%2F"


def schema(*fields) -> StructType:
    return StructType([StructField(name, dtype) for name, dtype in fields])


def amqp_plan(sch, **options):
    opts = {"uri": AMQP_URI, "routingKey": "rk", **options}
    return amqp08.create_stream_writer(opts, sch, False).plan


def batch_of(sch: StructType, rows: list) -> pa.RecordBatch:
    return next(rows_to_batches(rows, amqp08_arrow(sch)))


def amqp08_arrow(sch):
    from spark_mq.sinks.writer import arrow_schema_of
    return arrow_schema_of(sch)


# -- columns and options ------------------------------------------------------------------------

def test_missing_body_names_the_column():
    with pytest.raises(SinkSchemaError, match="required column 'body'"):
        amqp_plan(schema(("routing_key", StringType())))


def test_wrong_type_names_column_and_accepted_types():
    with pytest.raises(SinkSchemaError, match=r"column 'priority' has type string.*integer"):
        amqp_plan(schema(("body", BinaryType()), ("priority", StringType())))
    with pytest.raises(SinkSchemaError, match=r"column 'headers' has type map<string,int>"):
        stomp.create_stream_writer({"destination": "/queue/a"},
                                   schema(("body", StringType()), ("headers", MapType(StringType(), IntegerType()))),
                                   False)


def test_unknown_column_fails_unless_ignored():
    sch = schema(("body", BinaryType()), ("routingKey", StringType()))
    with pytest.raises(SinkSchemaError, match="column 'routingKey' is not a amqp08 sink column"):
        amqp_plan(sch)
    plan = amqp_plan(sch, ignoreExtraColumns="true")
    assert plan.columns.names == ("body",)


def test_column_names_match_case_insensitively():
    plan = amqp_plan(schema(("BODY", BinaryType()), ("Routing_Key", StringType())))
    assert plan.columns.index("body") == 0 and plan.columns.index("routing_key") == 1


def test_routing_key_needed_from_option_or_column():
    with pytest.raises(OptionError, match="routingKey"):
        amqp08.create_writer({"uri": AMQP_URI}, schema(("body", BinaryType())), False)
    # an empty routing key is a valid explicit choice (fanout exchanges)
    assert amqp08.create_writer({"uri": AMQP_URI, "routingKey": ""}, schema(("body", BinaryType())), False)


def test_batch_overwrite_is_refused_stream_complete_mode_is_not():
    sch = schema(("body", BinaryType()))
    with pytest.raises(OptionError, match="only appends"):
        amqp08.create_writer({"uri": AMQP_URI, "routingKey": "q"}, sch, True)
    assert amqp08.create_stream_writer({"uri": AMQP_URI, "routingKey": "q"}, sch, True)


def test_unknown_option_is_refused_and_spark_options_are_dropped(tmp_path):
    sch = schema(("body", BinaryType()))
    with pytest.raises(OptionError, match="unknown option 'routingkeyy'"):
        amqp08.create_stream_writer({"uri": AMQP_URI, "routingkeyy": "q"}, sch, False)
    writer = amqp08.create_stream_writer({"uri": AMQP_URI, "routingKey": "q", "checkpointLocation": str(tmp_path),
                                          "path": "ignored"}, sch, False)
    assert writer.plan.options.commitLogLocation == os.path.join(str(tmp_path), COMMIT_LOG_DIR)


def test_plan_repr_hides_the_password():
    plan = amqp_plan(schema(("body", BinaryType())))
    assert "secret" not in repr(plan)


def test_malamute_mode_options():
    sch = schema(("body", BinaryType()))
    with pytest.raises(OptionError, match="exactly one of"):
        malamute.create_writer({"uri": "tcp://127.0.0.1:1"}, sch, False)
    with pytest.raises(OptionError, match="'address' is only used in mailbox and service modes"):
        malamute.create_writer({"uri": "tcp://127.0.0.1:1", "stream": "s"},
                               schema(("body", BinaryType()), ("address", StringType())), False)
    with pytest.raises(OptionError, match="default recipient"):
        malamute.create_writer({"uri": "tcp://127.0.0.1:1", "mailbox": ""}, sch, False)
    assert malamute.create_writer({"uri": "tcp://127.0.0.1:1", "mailbox": ""},
                                  schema(("body", BinaryType()), ("address", StringType())), False)


def test_stream_writer_is_arrow_where_available_and_row_writer_on_request():
    sch = schema(("body", BinaryType()))
    plan = amqp_plan(sch)
    from spark_mq.sinks.writer import HAS_STREAM_ARROW_WRITER, StreamArrowWriter
    assert HAS_STREAM_ARROW_WRITER and isinstance(make_stream_writer(plan), StreamArrowWriter)
    assert isinstance(make_stream_writer(plan, arrow=False), StreamRowWriter)


# -- encoders ------------------------------------------------------------------------------------

def test_amqp_encoder_ids_defaults_and_overrides():
    sch = schema(("body", StringType()), ("routing_key", StringType()), ("message_id", StringType()),
                 ("delivery_mode", IntegerType()), ("headers", MapType(StringType(), StringType())),
                 ("timestamp", TimestampType()), ("exchange", StringType()))
    plan = amqp_plan(sch, exchange="ex", deliveryMode="2", contentType="text/plain")
    when = dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=dt.timezone.utc)
    batch = batch_of(sch, [
        ("héllo", None, None, None, {"a": "b"}, when, None),
        (None, "rk2", "own-id", 1, None, None, "other"),
    ])
    messages, size = amqp08.AmqpEncoder(plan).encode(batch, "Q:7:3:", 10)
    (ex0, rk0, body0, p0), (ex1, rk1, body1, p1) = messages
    assert (ex0, rk0, body0) == ("ex", "rk", "héllo".encode())
    assert (ex1, rk1, body1) == ("other", "rk2", b"")
    assert p0.message_id == "Q:7:3:10" and p1.message_id == "own-id"
    assert p0.delivery_mode == 2 and p1.delivery_mode == 1
    assert p0.content_type == "text/plain" and p0.headers == {"a": "b"} and p1.headers is None
    assert p0.timestamp == int(when.timestamp()) and p1.timestamp is None
    assert size == len("héllo".encode())


def test_amqp_encoder_refuses_out_of_range_octets():
    sch = schema(("body", BinaryType()), ("priority", IntegerType()))
    plan = amqp_plan(sch)
    with pytest.raises(SinkDataError, match="'priority' holds 0..12"):
        amqp08.AmqpEncoder(plan).encode(batch_of(sch, [(b"x", 0), (b"y", 12)]), "p:", 0)


def test_amqp_encoder_timestamp_as_seconds_column():
    sch = schema(("body", BinaryType()), ("timestamp", LongType()))
    plan = amqp_plan(sch)
    messages, _ = amqp08.AmqpEncoder(plan).encode(batch_of(sch, [(b"x", 1700000000)]), "p:", 0)
    assert messages[0][3].timestamp == 1700000000
    with pytest.raises(SinkDataError, match="before 1970"):
        amqp08.AmqpEncoder(plan).encode(batch_of(sch, [(b"x", -5)]), "p:", 0)


def test_stomp_encoder_id_header_row_headers_and_text_bodies():
    sch = schema(("body", StringType()), ("destination", StringType()),
                 ("headers", MapType(StringType(), StringType())))
    plan = stomp.create_stream_writer({"destination": "/queue/d", "persistent": "true"}, sch, False).plan
    batch = batch_of(sch, [("a", None, None), ("b", "/topic/t", {"spark-mq-message-id": "mine", "x": "1"})])
    messages, size = stomp.StompEncoder(plan).encode(batch, "q:0:1:", 5)
    assert messages[0] == ("/queue/d", "a", {"persistent": "true", "spark-mq-message-id": "q:0:1:5"})
    assert messages[1] == ("/topic/t", "b", {"persistent": "true", "spark-mq-message-id": "mine", "x": "1"})
    assert size == 2


def test_stomp_encoder_custom_id_header_and_binary_body():
    sch = schema(("body", BinaryType()))
    plan = stomp.create_stream_writer({"destination": "/queue/d", "messageIdHeader": "x-id"}, sch, False).plan
    messages, _ = stomp.StompEncoder(plan).encode(batch_of(sch, [(b"\x00\x01",)]), "q:0:0:", 0)
    assert messages == [("/queue/d", b"\x00\x01", {"x-id": "q:0:0:0"})]


def test_malamute_encoder_frames_tracker_and_address():
    sch = schema(("body", BinaryType()), ("frames", ArrayType(BinaryType())), ("subject", StringType()),
                 ("address", StringType()))
    plan = malamute.create_stream_writer({"uri": "tcp://127.0.0.1:1", "mailbox": "box", "subject": "dflt"},
                                         sch, False).plan
    batch = batch_of(sch, [(b"b0", None, None, None), (b"ignored", [b"f1", b"f2"], "s", "other")])
    messages, size = malamute.MalamuteEncoder(plan).encode(batch, "q:1:0:", 0)
    assert messages == [("box", "dflt", [b"b0"], "q:1:0:0"), ("other", "s", [b"f1", b"f2"], "q:1:0:1")]
    assert size == 6


def test_malamute_encoder_stream_mode():
    sch = schema(("body", StringType()))
    plan = malamute.create_stream_writer({"uri": "tcp://127.0.0.1:1", "stream": "weather"}, sch, False).plan
    messages, _ = malamute.MalamuteEncoder(plan).encode(batch_of(sch, [("t",)]), "q:1:0:", 0)
    assert messages == [(None, "", [b"t"], "")]


# -- the task loop with a fake session ---------------------------------------------------------

class FakeSession:
    instances: list = []
    atomic = True  # a rollback undoes the task's messages (writer.Session.atomic)

    def __init__(self, opts, fail_publish_at=None):
        self.log: list = []
        self.published: list = []
        self.open = True
        FakeSession.instances.append(self)

    def begin(self, options):
        self.log.append("begin")

    def publish(self, messages):
        self.log.append(("publish", len(messages)))
        self.published.extend(messages)

    def commit(self):
        self.log.append("commit")

    def rollback(self):
        self.log.append("rollback")

    def healthy(self):
        return self.open

    def close(self, timeout):
        self.log.append("close")
        self.open = False


@pytest.fixture
def fake_plan():
    FakeSession.instances = []
    connections.close_all()
    sch = schema(("body", BinaryType()))
    plan = amqp_plan(sch, flushBytes="100")
    from dataclasses import replace
    plan = replace(plan, open_session=FakeSession)
    yield plan, sch
    connections.close_all()


def test_write_partition_publishes_in_slices_and_commits_once(fake_plan):
    plan, sch = fake_plan
    rows = [(b"x" * 10,) for _ in range(100)]
    batches = list(rows_to_batches(rows, plan.arrow_schema, batch_rows=60))
    msg = write_partition(plan, iter(batches))
    session = FakeSession.instances[0]
    assert isinstance(msg, SinkCommitMessage) and msg.messages == 100 and msg.bytes == 1000
    assert session.log[0] == "begin" and session.log[-1] == "commit" and session.log.count("commit") == 1
    # 60-row batches of ~1000 bytes are sliced to about 4 x flushBytes (400 bytes) per publish
    sizes = [n for entry, n in (e for e in session.log if isinstance(e, tuple))]
    assert sum(sizes) == 100 and max(sizes) < 60
    ids = [props.message_id for _, _, _, props in session.published]
    assert ids == [f"{plan.write_id}:0:{i}" for i in range(100)]
    assert connections.idle_count(plan.session_key()) == 1  # clean: back in the pool


def test_write_partition_rolls_back_and_raises_on_failure_mid_partition(fake_plan):
    plan, sch = fake_plan

    def failing():
        yield from rows_to_batches([(b"a",)] * 10, plan.arrow_schema)
        raise RuntimeError("upstream failed")

    with pytest.raises(RuntimeError, match="upstream failed"):
        write_partition(plan, failing())
    session = FakeSession.instances[0]
    assert session.log == ["begin", ("publish", 10), "rollback", "close"]
    assert connections.idle_count(plan.session_key()) == 0  # never reused after a failure


def test_pooled_session_is_reused_by_the_next_task(fake_plan):
    plan, sch = fake_plan
    write_partition(plan, iter(rows_to_batches([(b"a",)], plan.arrow_schema)))
    write_partition(plan, iter(rows_to_batches([(b"b",)], plan.arrow_schema)))
    assert len(FakeSession.instances) == 1
    assert FakeSession.instances[0].log.count("commit") == 2


def test_pool_drops_unhealthy_and_foreign_process_sessions(fake_plan):
    plan, _ = fake_plan
    key = ("k",)
    dead = FakeSession(None)
    dead.open = False
    connections.release(key, dead, reusable=True)  # unhealthy: closed, not pooled
    assert connections.idle_count(key) == 0
    good = FakeSession(None)
    connections.release(key, good, reusable=True)
    assert connections.acquire(key, lambda: pytest.fail("should reuse")) is good
    connections.release(key, good, reusable=True)
    connections._idle[key] = [(os.getpid() + 1, good)]  # as if inherited through fork
    fresh = connections.acquire(key, lambda: "new")
    assert fresh == "new"


# -- Row writer fallback ---------------------------------------------------------------------------

def test_rows_to_batches_keeps_types_and_maps():
    sch = schema(("body", BinaryType()), ("headers", MapType(StringType(), StringType())),
                 ("priority", IntegerType()))
    arrow = amqp08_arrow(sch)
    batches = list(rows_to_batches([(b"a", {"k": "v"}, 1), (b"b", None, None), (b"c", {}, 3)], arrow, batch_rows=2))
    assert [b.num_rows for b in batches] == [2, 1]
    assert batches[0].schema == arrow
    assert batches[0].column(1).to_pylist() == [[("k", "v")], None]


# -- driver-side commit ------------------------------------------------------------------------------

def test_commit_log_is_idempotent_by_batch_id(tmp_path):
    loc = str(tmp_path / "log")
    assert commitlog.record(loc, 3, {"messages": 5, "bytes": 50})
    assert not commitlog.record(loc, 3, {"messages": 5, "bytes": 50})  # same again: untouched
    assert commitlog.record(loc, 3, {"messages": 6, "bytes": 60})      # replayed with other counts: replaced
    assert commitlog.record(loc, 4, {"messages": 1, "bytes": 1})
    assert commitlog.totals(loc) == {"batches": 2, "messages": 7, "bytes": 61}
    assert not [n for n in os.listdir(loc) if n.startswith(".")]  # no temporary files left


def test_commit_batch_aggregates_and_repeats_harmlessly(tmp_path):
    plan = amqp_plan(schema(("body", BinaryType())), commitLogLocation=str(tmp_path))
    msgs = [SinkCommitMessage(1, 20, 200, 0, "q:0:1:0", 0.1), SinkCommitMessage(0, 10, 100, 1, "q:0:0:0", 0.1)]
    first = commit_batch(plan, msgs, 0)
    again = commit_batch(plan, msgs, 0)
    assert first == again and first["messages"] == 30 and first["bytes"] == 300
    assert [p["partition"] for p in first["partitions"]] == [0, 1]
    assert commitlog.totals(str(tmp_path)) == {"batches": 1, "messages": 30, "bytes": 300}
    assert json.loads((tmp_path / "0.json").read_text())["partitions"][0]["attempt"] == 1


def test_abort_batch_counts_what_was_already_committed():
    plan = amqp_plan(schema(("body", BinaryType())))
    summary = abort_batch(plan, [SinkCommitMessage(0, 10, 100, 0, None, 0.1), None], 2)
    assert summary["messages"] == 10 and summary["failedTasks"] == 1


def test_unpooled_session_is_closed_after_success_and_failure(fake_plan):
    from dataclasses import replace
    plan, _ = fake_plan
    plan = replace(plan, options=plan.options.replace(cacheConnections=False))
    write_partition(plan, iter(rows_to_batches([(b"a",)], plan.arrow_schema)))

    def failing():
        yield from rows_to_batches([(b"a",)], plan.arrow_schema)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_partition(plan, failing())
    assert [s.log[-1] for s in FakeSession.instances] == ["close", "close"]
    assert FakeSession.instances[1].log == ["begin", ("publish", 1), "rollback", "close"]
    assert connections.idle_count(plan.session_key()) == 0


def test_options_spark_adds_itself_are_not_unknown_options():
    # writeStream.queryName(...) and checkpointLocation reach the writer as options
    plan = amqp_plan(schema(("body", BinaryType())), queryName="q1", checkpointLocation="/tmp/ckpt")
    assert plan.columns.names == ("body",)
    with pytest.raises(OptionError, match="notAnOption"):
        amqp_plan(schema(("body", BinaryType())), notAnOption="x")


def test_ids_inside_a_micro_batch_tell_writes_apart_and_repeat_on_replay():
    """Issue 43 item 6: the id prefix of a partition inside a micro-batch hashes what the write targets
    and the partition's first row; a plain df.write keeps its per-write uuid."""
    from spark_mq.sinks.writer import id_prefix

    sch = schema(("body", BinaryType()))
    first = pa.record_batch([pa.array([b"row-0", b"row-1"])], names=["body"])
    other = pa.record_batch([pa.array([b"row-1", b"row-0"])], names=["body"])
    plan = amqp_plan(sch, routingKey="q")
    batch = "qid:7:"
    same = id_prefix(plan, batch, 3, first)
    assert re.fullmatch(r"qid:7:[0-9a-f]{8}:3:", same)
    # a replay: another plan of the same write (a new writeId) over the same rows gets the same prefix
    assert id_prefix(amqp_plan(sch, routingKey="q"), batch, 3, first) == same
    # tuning options are not part of it: a replay with other timeouts keeps its ids
    assert id_prefix(amqp_plan(sch, routingKey="q", commitTimeout="5s"), batch, 3, first) == same
    # another destination, another writeName, or another first row: another prefix
    assert id_prefix(amqp_plan(sch, routingKey="r"), batch, 3, first) != same
    assert id_prefix(amqp_plan(sch, routingKey="q", writeName="audit"), batch, 3, first) != same
    assert id_prefix(plan, batch, 3, other) != same
    # a plain df.write: the write's own id, no hashing
    assert id_prefix(plan, None, 3, first) == f"{plan.write_id}:3:"


def test_the_id_tag_does_not_depend_on_the_session_time_zone():
    """Review finding: the tag hashed repr() of the first row, whose timestamps print in the session's
    time zone: a replay after a time-zone change would have got new ids."""
    from spark_mq.sinks.writer import id_prefix

    plan = amqp_plan(schema(("body", BinaryType())), routingKey="q")
    at = 1_700_000_000_000_000
    utc = pa.record_batch([pa.array([b"x"]), pa.array([at], pa.timestamp("us", tz="UTC"))], names=["body", "ts"])
    paris = pa.record_batch([pa.array([b"x"]), pa.array([at], pa.timestamp("us", tz="Europe/Paris"))],
                            names=["body", "ts"])
    later = pa.record_batch([pa.array([b"x"]), pa.array([at + 1], pa.timestamp("us", tz="UTC"))], names=["body", "ts"])
    assert id_prefix(plan, "q:1:", 0, utc) == id_prefix(plan, "q:1:", 0, paris)
    assert id_prefix(plan, "q:1:", 0, utc) != id_prefix(plan, "q:1:", 0, later)
