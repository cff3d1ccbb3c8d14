"""Unit tests of spark_mq.arrowcols: columns built from buffers equal what ``pa.array`` builds."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_mq import schema as S
from spark_mq.arrowcols import column
from spark_mq.errors import SparkMqError

_TEXT = st.text(max_size=12)
_BYTES = st.binary(max_size=40)
_HEADERS = st.lists(st.tuples(_TEXT, st.none() | _TEXT), max_size=4)

CASES = {
    "binary": (S.ARROW_TYPES["binary"], _BYTES),
    "string": (S.ARROW_TYPES["string"], _TEXT),
    "bigint": (S.ARROW_TYPES["bigint"], st.integers(-2**63, 2**63 - 1)),
    "int": (S.ARROW_TYPES["int"], st.integers(-2**31, 2**31 - 1)),
    "timestamp": (S.ARROW_TYPES["timestamp"], st.integers(0, 253_402_300_799_999_999)),
    "boolean": (S.ARROW_TYPES["boolean"], st.booleans()),
    "map": (S.ARROW_TYPES["map<string,string>"], _HEADERS),
    "list": (S.ARROW_TYPES["array<binary>"], st.lists(_BYTES, max_size=4)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_column_equals_pa_array(name):
    type_, values = CASES[name]

    @settings(max_examples=150, deadline=None)
    @given(st.lists(st.none() | values, max_size=30))
    def check(vals):
        got = column(vals, type_)
        got.validate(full=True)
        expected = pa.array(vals, type=type_)
        assert got.type.equals(type_)
        assert got.equals(expected), (vals, got, expected)
        assert got.to_pylist() == expected.to_pylist()

    check()


@pytest.mark.parametrize("name", ["string", "binary", "boolean"])
def test_repeated_values_equal_pa_array(name):
    """Columns where most or all rows hold one value (a group's queue or sender: the fast paths)."""
    type_ = CASES[name][0]
    few = {"string": st.sampled_from(["orders", "é-ü", "\udcff", ""]),
           "binary": st.sampled_from([b"a", b"", b"\xff\x00"]),
           "boolean": st.booleans()}[name]

    @settings(max_examples=150, deadline=None)
    @given(st.lists(few, min_size=1, max_size=30), st.lists(st.none() | few, max_size=3), st.booleans())
    def check(same, tail, as_tuple):
        vals = [same[0]] * len(same) + tail
        vals = tuple(vals) if as_tuple else vals
        got = column(vals, type_)
        got.validate(full=True)
        expected = pa.array([_replaced(v) for v in vals], type=type_)
        assert got.equals(expected), (vals, got, expected)

    check()


def _replaced(v):
    """What an Arrow string holds for ``v``: lone surrogates become U+FFFD (see the test below)."""
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return v


def test_all_null_and_empty_columns():
    for type_, _ in CASES.values():
        assert column([None, None], type_).equals(pa.nulls(2, type_))
        assert len(column([], type_)) == 0


def test_map_key_may_not_be_null():
    with pytest.raises(SparkMqError, match="header without a name"):
        column([[(None, "v")]], S.ARROW_TYPES["map<string,string>"])


def test_building_and_projecting_batches_does_not_import_pandas():
    """pa.array imports pandas on its first call (seconds on a busy machine, in every reader
    process): the source's batch building and projection must not."""
    code = (
        "import sys\n"
        "from spark_mq import schema as S\n"
        "row = (b'b', 'd', None, 1, [('k', 'v')], False, 0, 's', 'a', 'subj', '', [b'x', b'y'])\n"
        "one = (b'c', 'd', 'm', 2, None, True, 1, 's', 'a', 'subj', '', None)\n"
        "batch = S.build_batch('malamute', [row, one])\n"
        "S.project(batch, S.source_arrow_schema('malamute'))\n"
        "S.project(S.build_batch('malamute', [one]), S.source_arrow_schema('malamute'))\n"
        "S.build_batch('amqp08', [(b'b', 'q', 'id', 1, None, False, 0, 'ex', 'rk', 7, 'text/plain', None, 2, 0,"
        " None, None, None, None, None, None, None)])\n"
        "print('pandas' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"



def test_strings_with_undecodable_bytes_become_replacement_characters():
    """The protocol decoders keep undecodable bytes as lone surrogates (surrogateescape); an Arrow
    string must be valid UTF-8, so the column shows them as U+FFFD instead of failing the ingest."""
    escaped = b"caf\xe9 \xff".decode("utf-8", "surrogateescape")
    col = column(["ok", escaped, None, "\ud800x"], S.ARROW_TYPES["string"])
    col.validate(full=True)
    assert col.to_pylist() == ["ok", "caf\ufffd \ufffd", None, "?x"]
    headers = column([[("k\udcff", "v")]], S.ARROW_TYPES["map<string,string>"])
    assert headers.to_pylist() == [[("k\ufffd", "v")]]


def test_integers_out_of_the_column_range_become_null():
    """A header value the column cannot hold must not fail the group (the broker would redeliver
    the message into the same failure forever): it is stored as null."""
    assert column([1, 3_000_000_000, None, -5], S.ARROW_TYPES["int"]).to_pylist() == [1, None, None, -5]
    assert column([2**64, 7], S.ARROW_TYPES["bigint"]).to_pylist() == [None, 7]
    ts = column([2**70 * 1_000_000, 1_000_000], S.ARROW_TYPES["timestamp"])
    assert ts.null_count == 1 and ts.is_valid().to_pylist() == [False, True]
