"""Unit tests of spark_mq.schema: the source schemas and their exact Arrow form."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema as spark_to_arrow
from pyspark.sql.types import StringType, StructField, StructType

from spark_mq import schema as S

FORMATS = ("amqp08", "stomp", "malamute")


@pytest.mark.parametrize("fmt", FORMATS)
def test_arrow_schema_is_exactly_what_spark_expects(fmt):
    spark_schema = S.source_schema(fmt)
    assert S.source_arrow_schema(fmt).equals(spark_to_arrow(spark_schema, timezone="UTC"))
    assert S.to_arrow_schema(spark_schema).equals(spark_to_arrow(spark_schema, timezone="UTC"))


@pytest.mark.parametrize("fmt", FORMATS)
def test_core_columns_first_and_identical(fmt):
    names = [f.name for f in S.source_schema(fmt).fields]
    assert names[:7] == ["body", "destination", "message_id", "timestamp", "headers", "redelivered", "offset"]
    assert S.source_ddl(fmt).startswith("body binary, destination string, message_id string, timestamp timestamp, "
                                        "headers map<string,string>, redelivered boolean, offset bigint")


def test_build_batch_values():
    row = (b"\x00body", "s", "m1", 1_700_000_000_123_456, [("a", "1"), ("b", None)], True, 42,
           "snd", "addr", "subj", "trk", [b"f1", b"f2"])
    batch = S.build_batch("malamute", [row])
    got = batch.to_pylist()[0]
    assert got["body"] == b"\x00body" and got["offset"] == 42 and got["redelivered"] is True
    assert got["headers"] == [("a", "1"), ("b", None)]
    assert got["frames"] == [b"f1", b"f2"]
    assert got["timestamp"].isoformat() == "2023-11-14T22:13:20.123456+00:00"
    assert S.build_batch("malamute", []).num_rows == 0


def test_project_subset_and_errors():
    batch = S.build_batch("stomp", [(b"x", "d", "m", 0, None, False, 0, "sub", None, None, None, None, None)])
    target = pa.schema([pa.field("offset", pa.int64()), pa.field("body", pa.binary())])
    assert S.project(batch, target).to_pylist() == [{"offset": 0, "body": b"x"}]
    with pytest.raises(S.SchemaError, match="'nope'"):
        S.check_user_schema("stomp", pa.schema([pa.field("nope", pa.string())]))
    with pytest.raises(S.SchemaError, match="'body' is binary"):
        S.check_user_schema("stomp", pa.schema([pa.field("body", pa.string())]))
    with pytest.raises(S.SchemaError):
        S.to_arrow_schema(StructType([StructField("x", StructType([StructField("y", StringType())]))]))
    with pytest.raises(S.SchemaError):
        S.source_ddl("kafka")


def _malamute_rows(frame_lists):
    return [(fl[0] if fl else b"", "d", None, 0, None, False, i, "s", "a", "subj", "", S.frames_value(fl))
            for i, fl in enumerate(frame_lists)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=8), max_size=4), max_size=12))
def test_malamute_frames_null_for_one_frame_else_all_of_them(frame_lists):
    """A single-frame message's only frame is ``body`` and ``frames`` is null (each body is stored and
    shipped once); otherwise ``frames`` holds the whole content, for zero frames too."""
    batch = S.build_batch("malamute", _malamute_rows(frame_lists))
    assert batch.schema.equals(S.source_arrow_schema("malamute"))
    got = batch.to_pylist()
    for row, fl in zip(got, frame_lists):
        assert row["frames"] == (None if len(fl) == 1 else fl)
        assert row["body"] == (fl[0] if fl else b"")
    batch.validate(full=True)


def test_a_projection_without_frames_does_not_build_them():
    stored = S.build_batch("malamute", _malamute_rows([[b"a", b"b"]]))
    target = pa.schema([S.source_arrow_schema("malamute").field("body"), S.source_arrow_schema("malamute").field("subject")])
    assert S.project(stored, target).to_pylist() == [{"body": b"a", "subject": "subj"}]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.binary(max_size=8), max_size=4), max_size=12))
def test_row_bytes_count_what_a_row_puts_in_binary_columns(frame_lists):
    """The size the ingest bounds an append by: the body and, for Malamute, the frames that repeat
    it, measured on the built batch's binary columns."""
    rows = _malamute_rows(frame_lists)
    batch = S.build_batch("malamute", rows)
    size = S.row_bytes_function("malamute")
    expected = sum(len(b) for b in batch.column("body").to_pylist()) + \
        sum(len(f) for fs in batch.column("frames").to_pylist() if fs for f in fs)
    assert sum(size(r) for r in rows) == expected


def test_row_bytes_of_formats_without_frames_is_the_body():
    size = S.row_bytes_function("stomp")
    row = (b"x" * 7,) + (None,) * (len(S.SOURCE_COLUMNS["stomp"]) - 1)
    assert size(row) == 7
    with pytest.raises(S.SchemaError):
        S.row_bytes_function("kafka")
