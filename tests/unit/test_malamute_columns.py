"""The Malamute source's columnar groups: ``deliveries_batch`` of a ``Deliveries`` equals
``build_batch`` of the same deliveries' rows, and ``arrowcols.binary_ends`` builds over the body
buffer without a copy, refusing ends that would make Arrow read out of bounds."""

from __future__ import annotations

from array import array

import pyarrow as pa
import pytest

from spark_mq import arrowcols as A
from spark_mq import schema as S
from spark_mq.clients.malamute import Deliveries
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.zmtp import BodyBuffer
from spark_mq.sources.formats.malamute import MalamuteConsumer, deliveries_batch


def held(deliveries: list, before: bytes = b"") -> Deliveries:
    """The deliveries as ``MalamuteReceiver.poll(..., body)`` returns those it held or read the
    general way (fields from the delivery objects), in a reused body buffer larger than they fill
    that holds ``before`` already."""
    body = BodyBuffer(1 << 16)
    body.append(before)
    taken = Deliveries(body)
    for d in deliveries:
        taken.add(vars(d), d.content)
    return taken


def rows_of(deliveries: list, destination: str, offset: int, now_us: int) -> pa.RecordBatch:
    consumer = MalamuteConsumer.__new__(MalamuteConsumer)  # row() needs only the destination
    consumer.destination = destination
    return S.build_batch("malamute", [consumer.row(d, offset + i, now_us) for i, d in enumerate(deliveries)])


CASES = {
    "single frames, one sender": [codec.MailboxDeliver("s", "box", "subj", "", [b"x" * (i * 13 % 5000)])
                                  for i in range(300)],
    "trackers and senders vary": [codec.MailboxDeliver(f"s{i % 3}", "box", f"t{i}", f"tr{i}" if i % 2 else "",
                                                       [bytes([i % 256]) * 7]) for i in range(50)],
    "stream deliveries (no tracker)": [codec.StreamDeliver("weather", "p", "temp.é", [b"21.5"]),
                                       codec.StreamDeliver("weather", "p", "temp", [b""])],
    "multi-frame and empty content": [codec.ServiceDeliver("c", "svc", "do", "t1", [b"a", b"bb", b"ccc"]),
                                      codec.ServiceDeliver("c", "svc", "do", "", []),
                                      codec.ServiceDeliver("c", "svc", "do", "", [b"one"]),
                                      codec.ServiceDeliver("c", "svc", "do", "t2", [b"", b"z"])],
}


def test_several_streams_take_each_rows_destination_from_its_address():
    """With several streams (option ``streams``) the destination column is each delivery's address,
    in the columns as in the rows."""
    deliveries = [codec.StreamDeliver("weather" if i % 3 else "alerts", "p", f"s{i}", [b"v%d" % i]) for i in range(30)]
    for taken in (held(deliveries), as_received(deliveries)):
        got = deliveries_batch(taken, None, 7, 1_700_000_000_000_000)
        consumer = MalamuteConsumer.__new__(MalamuteConsumer)
        consumer.destination, consumer.by_address = "weather", True
        want = S.build_batch("malamute", [consumer.row(d, 7 + i, 1_700_000_000_000_000)
                                          for i, d in enumerate(deliveries)])
        assert got.equals(want)
        assert got.column("destination").to_pylist() == ["weather" if i % 3 else "alerts" for i in range(30)]


def as_received(deliveries: list) -> Deliveries:
    """The deliveries as the receiver's columns take them off the wire: the header's fields from
    ``codec.delivery_fields`` (one dict per distinct header)."""
    taken = Deliveries(BodyBuffer())
    for d in deliveries:
        fields = codec.delivery_fields(codec.encode_header(d))
        assert fields is not None
        taken.add(fields, d.content)
    return taken


@pytest.mark.parametrize("lane", ["objects", "objects after other bytes", "headers"])
@pytest.mark.parametrize("case", list(CASES))
def test_columns_equal_the_rows_batch(case, lane):
    deliveries = CASES[case]
    if lane == "headers":
        taken = as_received(deliveries)
    else:
        taken = held(deliveries, b"other bytes" if lane == "objects after other bytes" else b"")
    got = deliveries_batch(taken, "dest", 1000, 1_700_000_000_123_456)
    want = rows_of(deliveries, "dest", 1000, 1_700_000_000_123_456)
    assert got.schema.equals(S.source_arrow_schema("malamute"))
    got.validate(full=True)
    assert got.equals(want), (got.to_pylist()[:3], want.to_pylist()[:3])
    # and through the log's format: the same bytes back
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, got.schema) as w:
        w.write_batch(got)
    assert pa.ipc.open_stream(sink.getvalue()).read_next_batch().equals(want)


def test_single_frame_bodies_are_built_over_the_buffer_itself():
    taken = held([codec.MailboxDeliver("s", "b", "", "", [b"abc"]), codec.MailboxDeliver("s", "b", "", "", [b"de"])],
                 b"xy")
    col = deliveries_batch(taken, "b", 0, 0).column(0)
    assert col.buffers()[2].address == pa.py_buffer(taken.body.data).address + 2  # no copy
    assert col.to_pylist() == [b"abc", b"de"]
    with pytest.raises(BufferError):
        taken.body.data.append(0)  # held by the column: the buffer cannot move under it


def test_binary_ends_reads_each_value_up_to_its_end():
    data = bytearray(b"..0123456789")
    col = A.binary_ends(memoryview(data)[2:], array("q", [4, 5, 5, 12]), start=2)
    assert col.to_pylist() == [b"01", b"2", b"", b"3456789"]
    col.validate(full=True)
    assert A.binary_ends(bytearray(), array("q")).to_pylist() == []


@pytest.mark.parametrize("ends", [[3, 2], [1, 11], [-1, 2]])
def test_binary_ends_refuses_ends_out_of_order_or_past_the_data(ends):
    """Ends that go back or past the data would make Arrow read out of bounds: refused, named."""
    with pytest.raises(ValueError, match="in order within 10 bytes"):
        A.binary_ends(bytearray(10), array("q", ends))


def test_deliveries_cut_gives_back_what_was_taken_and_the_buffer_space():
    """``cut`` (the receiver's way back to ``receive`` for messages it cannot take by columns) returns
    the deliveries from an index on with their content as bytes, and ``body`` where they began."""
    deliveries = CASES["multi-frame and empty content"] + CASES["stream deliveries (no tracker)"]
    taken = held(deliveries, b"before")
    fill = taken.ends[1]
    assert taken.cut(2) == [(vars(d), list(d.content)) for d in deliveries[2:]]
    assert len(taken) == 2 and taken.body.fill == fill and list(taken.frames) == [0, 1]
    assert deliveries_batch(taken, "d", 0, 0).equals(rows_of(deliveries[:2], "d", 0, 0))
    assert taken.cut(0) == [(vars(d), list(d.content)) for d in deliveries[:2]]
    assert taken.body.fill == 6 and not taken.frames and len(taken.ends) == 0


@pytest.mark.parametrize("value, type_", [("dest", pa.string()), (17, pa.int64()), (5, pa.int32()),
                                           (False, pa.bool_()), (1_700_000_000_000_000, pa.timestamp("us", "UTC")),
                                           (None, pa.string())])
def test_repeated_equals_the_column_of_the_values(value, type_):
    assert A.repeated(value, 5, type_).equals(A.column([value] * 5, type_))


def test_the_body_buffer_is_reused_unless_a_column_still_holds_it():
    consumer = MalamuteConsumer.__new__(MalamuteConsumer)
    consumer._bodies = []
    first = consumer._body_buffer()
    first.append(b"x" * 1000)
    assert consumer._body_buffer() is first and first.fill == 0  # nothing holds it: reused, emptied
    taken = Deliveries(first)
    taken.add({"sender": "s", "address": "b", "subject": "", "tracker": ""}, [b"abc"])
    batch = deliveries_batch(taken, "b", 0, 0)
    second = consumer._body_buffer()
    assert second is not first  # the batch's body column is over ``first``: it must not be overwritten
    second.append(b"zzz")
    assert batch.column(0).to_pylist() == [b"abc"]
    del batch
    assert consumer._body_buffer() is second


def test_a_body_buffer_grown_far_past_what_groups_take_is_let_go(monkeypatch):
    import spark_mq.sources.formats.malamute as M

    monkeypatch.setattr(M, "_BODY_KEEP", 1000)
    consumer = MalamuteConsumer.__new__(MalamuteConsumer)
    consumer._bodies = []
    big = consumer._body_buffer()
    big.append(b"x" * 5000)
    assert consumer._body_buffer() is big  # the group that grew it filled it
    big.append(b"x" * 100)
    assert consumer._body_buffer() is not big  # a quarter or less used: a fresh one
    assert big not in consumer._bodies


def test_body_buffers_held_by_unwritten_groups_are_reused_once_written(tmp_path):
    """The log's write-behind holds each group's body buffer (the IPC message's parts are its
    memory) until the group is written: the next groups take other buffers, and a written group's
    buffer is taken again, never a fresh one while one is free; at most ``_BODIES_KEPT`` stay."""
    import spark_mq.sources.formats.malamute as M
    from spark_mq.sources.log import SourceLog

    log = SourceLog(str(tmp_path / "log"), S.source_arrow_schema("malamute"))
    log.defer_writes()
    consumer = MalamuteConsumer.__new__(MalamuteConsumer)
    consumer._bodies = []
    used = []
    for i in range(3):
        body = consumer._body_buffer()
        used.append(body)
        taken = Deliveries(body)
        taken.add({"sender": "s", "address": "b", "subject": "", "tracker": ""}, [b"%d" % i * 100])
        log.append(deliveries_batch(taken, "b", i, 0))
        del taken
    assert len({id(b) for b in used}) == 3  # each unwritten group holds its own
    log.sync()  # all written: their parts are let go
    again = consumer._body_buffer()
    assert again is used[-1] and again.fill == 0  # the last used, free again
    held = []
    for i in range(M._BODIES_KEPT + 3):
        body = consumer._body_buffer()
        body.append(b"x")
        held.append(pa.py_buffer(body.data))  # held, as an unwritten group holds it
    assert len(consumer._bodies) == M._BODIES_KEPT
    log.close()


def test_delivery_fields_are_decoded_once_per_header_and_only_for_deliveries():
    header = codec.encode_header(codec.MailboxDeliver("s", "box", "subj", "t"))
    fields = codec.delivery_fields(header)
    assert fields == {"sender": "s", "address": "box", "subject": "subj", "tracker": "t"}
    assert codec.delivery_fields(bytes(header)) is fields  # the same dict for the same header
    assert codec.delivery_fields(codec.encode_header(codec.StreamDeliver("weather", "p", "temp"))) == \
        {"address": "weather", "sender": "p", "subject": "temp"}
    assert codec.delivery_fields(codec.encode_header(codec.ConnectionPong())) is None  # not a delivery
    assert codec.delivery_fields(header[:-1]) is None  # malformed: left to decode, which names it
    assert codec.delivery_fields(b"") is None



def test_constant_columns_are_shared_by_groups_that_repeat_them(monkeypatch):
    """A group's constant columns (headers, destination, nulls) are built once per value, row count
    and type and shared by later groups; each group's batch still equals its rows' batch, and the
    cache holds a bounded number of columns."""
    from spark_mq.sources.formats import malamute as M

    monkeypatch.setattr(M, "_CONSTANTS", {})
    deliveries = CASES["single frames, one sender"][:40]
    first = deliveries_batch(as_received(deliveries), "dest", 0, 1)
    second = deliveries_batch(as_received(deliveries), "dest", 40, 2)
    assert first.equals(rows_of(deliveries, "dest", 0, 1))
    assert second.equals(rows_of(deliveries, "dest", 40, 2))
    def memory(batch, name):
        return [b.address if b is not None else None for b in batch.column(name).buffers()]

    shared = ("destination", "sender", "address", "subject", "tracker", "redelivered")
    for name in shared:  # the same memory, not equal copies
        assert any(memory(second, name)) and memory(second, name) == memory(first, name), name
    assert memory(second, "body") != memory(first, "body") and memory(second, "offset") != memory(first, "offset")
    other = deliveries_batch(as_received(deliveries[:39]), "other", 0, 1)  # another count and destination
    assert other.equals(rows_of(deliveries[:39], "other", 0, 1))
    assert other.column("destination").to_pylist() == ["other"] * 39
    # "" and None are different values, not one key
    assert M._constant("", 3, pa.string()).to_pylist() == ["", "", ""]
    assert M._constant(None, 3, pa.string()).to_pylist() == [None, None, None]
    for i in range(3 * M._CONSTANTS_MAX):
        M._constant(f"v{i}", 2, pa.string())
    assert len(M._CONSTANTS) <= M._CONSTANTS_MAX
