"""Several consumers (option ``consumers``): the lanes' offsets, layout and arithmetic, read limits split
fairly over the lanes, and one dedup for all lanes (a redelivery on another lane is dropped). Pure
logic on stub ingests and on Ingests that are never started; the broker-facing cases are
``tests/integration/test_sources_lanes.py``."""

from __future__ import annotations

import json
import threading

import pytest

from spark_mq import schema as S
from spark_mq.errors import OptionError
from spark_mq.options import SOURCE, parse_options
from spark_mq.sources.base import MQStreamReader, source_options
from spark_mq.sources.dedup import Dedup
from spark_mq.sources.ingest import Ingest
from spark_mq.sources.lanes import LANES_FILE, Lanes, check_layout, lane_location, lane_options, split_fairly

from .test_ingest_redeliveries import _Consumer


def _opts(fmt="amqp08", **extra):
    base = {"uri": "tcp://127.0.0.1:1"} if fmt == "malamute" else \
        {"uri": "amqp://guest:guest@127.0.0.1:1/%2F", "queue": "q"}
    return parse_options({"logLocation": "/nonexistent/log", **base, **{k: str(v) for k, v in extra.items()}},
                         format=fmt, direction=SOURCE)


# -- split_fairly -------------------------------------------------------------------------------------

@pytest.mark.parametrize("available, total, first, expected", [
    ([100, 100, 100, 100], 40, 0, [10, 10, 10, 10]),    # equal shares
    ([5, 100, 100, 100], 40, 0, [5, 12, 12, 11]),       # what a lane cannot use goes to the others
    ([0, 100, 0, 100], 41, 0, [0, 21, 0, 20]),          # lanes without data get nothing
    ([10, 10], 100, 0, [10, 10]),                       # more than there is: all of it
    ([100, 100, 100, 100], 2, 0, [1, 1, 0, 0]),         # fewer than lanes: one each from ``first`` ...
    ([100, 100, 100, 100], 2, 3, [1, 0, 0, 1]),         # ... rotating, so none is left out for good
    ([3, 0, 7], 0, 0, [0, 0, 0]),
])
def test_split_fairly(available, total, first, expected):
    share = split_fairly(available, total, first)
    assert share == expected
    assert sum(share) == min(total, sum(available))
    assert all(0 <= s <= a for s, a in zip(share, available))


def test_split_fairly_starves_no_lane_over_batches():
    got = [0] * 4
    for batch in range(8):
        for i, s in enumerate(split_fairly([1000] * 4, 3, batch % 4)):
            got[i] += s
    assert got == [6, 6, 6, 6]


# -- offsets and layout -------------------------------------------------------------------------------

class _Log:
    def __init__(self, tail, head):
        self.tail, self.head, self.durable_head = tail, head, head

    def body_bytes(self, lo, hi):
        return (hi - lo) * 10

    def limit_bytes(self, lo, hi, max_bytes):
        return min(hi, lo + max(1, max_bytes // 10))

    def fast_forward(self, offset):
        self.head = self.durable_head = self.tail = offset


class _Lane:
    """What the reader reads of one lane: an all-durable log, nothing pending, no availableNow."""

    def __init__(self, tail, head, location="/x"):
        self.log = _Log(tail, head)
        self.committed = tail
        self.available_now = False
        self.target = None
        self.planned_end = 0
        self.paused = False
        self.opts = _opts(logLocation=location)

    def cut_for_plan(self):
        return lambda: True  # nothing is being gathered

    def processed(self, end):
        self.committed = max(self.committed, end)

    def commit(self, end):
        self.processed(end)

    def resume_at(self, offset):
        pass

    def check(self):
        pass


def test_one_lane_keeps_the_offsets_of_before():
    lanes = Lanes([_Lane(0, 0)])
    assert lanes.encode((7,)) == {"offset": 7}
    assert lanes.decode({"offset": 7}) == (7,)
    with pytest.raises(OptionError, match="consumers=3.*'consumers' is 1"):
        lanes.decode({"lanes": [1, 2, 3]})


def test_several_lanes_offsets_cover_every_lane():
    lanes = Lanes([_Lane(0, 0), _Lane(0, 0), _Lane(0, 0)])
    assert lanes.encode((1, 2, 3)) == {"lanes": [1, 2, 3]}
    assert lanes.decode(json.loads(json.dumps({"lanes": [1, 2, 3]}))) == (1, 2, 3)
    with pytest.raises(OptionError, match="consumers=1.*'consumers' is 3"):
        lanes.decode({"offset": 5})
    with pytest.raises(OptionError, match="has 2 lanes.*'consumers' is 3"):
        lanes.decode({"lanes": [1, 2]})
    assert Lanes.count((1, 2, 3), (4, 2, 10)) == 10


def test_a_location_keeps_its_number_of_consumers(tmp_path):
    loc = str(tmp_path / "log")
    check_layout(loc, 1)
    assert not (tmp_path / "log" / LANES_FILE).exists()  # one consumer: the layout of before
    check_layout(loc, 4)
    assert json.loads((tmp_path / "log" / LANES_FILE).read_text()) == {"consumers": 4}
    check_layout(loc, 4)
    for other in (1, 2):
        with pytest.raises(OptionError, match=f"'consumers' is {other}.*consumers=4.*new logLocation"):
            check_layout(loc, other)
    assert lane_location(loc, 2) == loc + "/lane-2"
    assert lane_location("s3://bucket/p/", 0) == "s3://bucket/p/lane-0"


def test_a_single_lane_log_refuses_several_consumers(tmp_path):
    from spark_mq.sources.log import SourceLog
    loc = str(tmp_path / "log")
    import pyarrow as pa
    lg = SourceLog(loc, S.source_arrow_schema("amqp08"))  # a log written with consumers=1
    lg.append(pa.RecordBatch.from_pylist([{"body": b"m", "offset": 0}], schema=S.source_arrow_schema("amqp08")))
    lg.close()
    with pytest.raises(OptionError, match="'consumers' is 2.*consumers=1"):
        check_layout(loc, 2)


def test_lane_options_share_the_bounds_and_the_address():
    opts = _opts("malamute", service="s", consumers=4, address="me", maxUncommittedMessages=1001,
                 maxUncommittedBytes="1m")
    lane = lane_options(opts, 3, 4)
    assert lane.logLocation == "/nonexistent/log/lane-3"
    assert lane.maxUncommittedMessages == 251 and lane.maxUncommittedBytes == (1 << 20) // 4
    assert lane.address == "me-lane-3"
    assert lane_options(opts, 0, 1) is opts


def test_lane_options_share_out_malamute_streams():
    import json
    streams = {"a": "^x", "b": "", "c": "y"}
    opts = _opts("malamute", streams=json.dumps(streams), consumers=2)
    lanes = [lane_options(opts, i, 2) for i in range(2)]
    assert lanes[0].streams == {"a": "^x", "c": "y"} and lanes[1].streams == {"b": ""}
    merged = {**lanes[0].streams, **lanes[1].streams}
    assert merged == streams  # every stream read, each by one lane only


def test_more_consumers_than_malamute_streams_fail_naming_both():
    import json
    from spark_mq.sources.formats.malamute import validate
    with pytest.raises(OptionError, match="'consumers' is 3.*'streams' names 2 streams"):
        validate(_opts("malamute", streams=json.dumps({"a": "", "b": ""}), consumers=3))
    validate(_opts("malamute", streams=json.dumps({"a": "", "b": ""}), consumers=2))


@pytest.mark.parametrize("what", ["stream", "mailbox"])
def test_a_malamute_stream_or_mailbox_refuses_several_consumers(what):
    from spark_mq.sources.formats.malamute import validate
    with pytest.raises(OptionError, match=f"'consumers' is 2.*malamute {what} cannot be split"):
        source_options("malamute", {"uri": "tcp://127.0.0.1:1", what: "x", "consumers": "2",
                                    "logLocation": "/tmp/x"}, validate, streaming=True)
    source_options("malamute", {"uri": "tcp://127.0.0.1:1", "service": "x", "consumers": "2",
                                "logLocation": "/tmp/x"}, validate, streaming=True)


def test_batch_reads_refuse_several_consumers():
    from spark_mq.sources.base import MQBatchReader
    from spark_mq.sources.formats.amqp08 import validate
    opts = source_options("amqp08", {"uri": "amqp://h", "queue": "q", "consumers": "2"}, validate, streaming=False)
    with pytest.raises(OptionError, match="'consumers' is 2.*batch read"):
        MQBatchReader("amqp08", opts, S.source_schema("amqp08"), None)


# -- the reader over several lanes ------------------------------------------------------------------------

def _reader(lanes, **extra):
    reader = MQStreamReader("amqp08", _opts(consumers=lanes.n, **extra), S.source_schema("amqp08"), None)
    reader._engine = lambda: lanes
    reader._wait_first = lambda lanes: None
    return reader


def test_max_messages_is_for_the_batch_split_fairly_over_the_lanes():
    lanes = Lanes([_Lane(0, 1000), _Lane(0, 5), _Lane(0, 1000)])
    reader = _reader(lanes, maxMessagesPerTrigger=100)
    assert reader.latestOffset({"lanes": [0, 0, 0]}, None) == {"lanes": [48, 5, 47]}
    assert reader.latestOffset({"lanes": [48, 5, 47]}, None) == {"lanes": [98, 5, 97]}  # the idle lane's share goes to the others


def test_max_bytes_is_for_the_batch_split_fairly_over_the_lanes():
    lanes = Lanes([_Lane(0, 1000), _Lane(0, 1000)])
    reader = _reader(lanes, maxBytesPerTrigger=400)   # 10 bytes a message: 40 messages
    assert reader.latestOffset({"lanes": [0, 0]}, None) == {"lanes": [20, 20]}


def test_min_messages_counts_every_lane():
    lanes = Lanes([_Lane(0, 3), _Lane(0, 3)])
    reader = _reader(lanes, minMessagesPerTrigger=5)
    reader._last_batch_time = 1e18  # the delay has not passed
    assert reader.latestOffset({"lanes": [0, 0]}, None) == {"lanes": [3, 3]}  # 6 >= 5
    reader = _reader(lanes, minMessagesPerTrigger=7)
    reader._last_batch_time = 1e18
    assert reader.latestOffset({"lanes": [0, 0]}, None) == {"lanes": [0, 0]}


def test_commit_mode_caps_each_lane_at_half_its_prefetch():
    lanes = Lanes([_Lane(0, 1000), _Lane(0, 10)])
    reader = _reader(lanes, ackMode="commit", prefetch=100)
    assert reader.latestOffset({"lanes": [0, 0]}, None) == {"lanes": [50, 10]}


def test_partitions_are_made_per_lane_and_commit_commits_each_lane(tmp_path):
    from spark_mq.sources.log import SourceLog
    import pyarrow as pa
    logs, ingests = [], []
    for i in range(2):
        lg = SourceLog(str(tmp_path / f"lane-{i}"), S.source_arrow_schema("amqp08"))
        rows = [{"body": f"{i}-{k}".encode(), "offset": k} for k in range(10)]
        lg.append(pa.RecordBatch.from_pylist(rows, schema=S.source_arrow_schema("amqp08")))
        lg.sync()
        logs.append(lg)
        lane = _Lane(0, 10, str(tmp_path / f"lane-{i}"))
        lane.log = lg
        ingests.append(lane)
    lanes = Lanes(ingests)
    reader = _reader(lanes, numPartitions=4)
    parts = reader.partitions({"lanes": [2, 0]}, {"lanes": [8, 10]})
    assert [p.index for p in parts] == [0, 1, 2, 3]
    got = [b for p in parts for batch in reader.read(p) for b in batch.column("body").to_pylist()]
    assert got == [f"0-{k}".encode() for k in range(2, 8)] + [f"1-{k}".encode() for k in range(10)]
    again = reader.partitions({"lanes": [2, 0]}, {"lanes": [8, 10]})  # a replay: the same ranges
    assert [(p.lo, p.hi, p.location, p.slices) for p in again] == [(p.lo, p.hi, p.location, p.slices) for p in parts]
    # an empty lane's range makes no partition (numPartitions goes to the lanes with messages)
    parts = reader.partitions({"lanes": [8, 10]}, {"lanes": [10, 10]})
    assert [(p.lo, p.hi, p.location) for p in parts] == [(8, 9, str(tmp_path / "lane-0")),
                                                         (9, 10, str(tmp_path / "lane-0"))]
    reader.commit({"lanes": [10, 10]})
    assert [ing.committed for ing in ingests] == [10, 10]
    for lg in logs:
        lg.close()


def test_the_report_gives_totals_and_each_lane():
    class _Figured(_Lane):
        def __init__(self, n):
            super().__init__(0, n)
            self.n = n

        def figures(self):
            return {"logHead": self.n, "consumed": self.n, "paused": self.n > 5, "connected": True,
                    "brokerQueueDepth": 7, "availableNowTarget": None, "logWaitSeconds": 0.5}

    report = Lanes([_Figured(3), _Figured(9)]).report()
    assert report["lanes"] == [3, 9] and report["consumed"] == 12 and report["paused"] is True
    assert report["brokerQueueDepth"] == 7 and report["logWaitSeconds"] == 1.0
    assert [f["consumed"] for f in report["perLane"]] == [3, 9]
    assert Lanes([_Figured(3)]).report()["offset"] == 3  # one lane: as before


# -- one dedup for all lanes ---------------------------------------------------------------------------

def _lane_ingest(tmp_path, lane, dedup, cond, **extra):
    opts = lane_options(_opts(logLocation=str(tmp_path / "log"), consumers=2, prefetch=4, **extra), lane, 2)
    return Ingest("amqp08", opts, connect=None, lane=lane, dedup=dedup, cond=cond)


def test_a_redelivery_on_another_lane_is_dropped_and_a_restart_remembers_every_lane(tmp_path):
    """Lane 0 logs "a" and "b" and loses its connection before the ack: the broker redelivers them,
    here to lane 1, which must drop them (its own log never held them)."""
    dedup, cond = Dedup(1000, 2), threading.Condition()
    lane0, lane1 = (_lane_ingest(tmp_path, i, dedup, cond) for i in range(2))
    try:
        lane0._consumer = _Consumer([(b"a", False), (b"b", False)])
        lane1._consumer = _Consumer([(b"c", False), (b"a", True), (b"b", True), (b"d", True)])
        for ing in (lane0, lane1):
            while ing._consumer.deliveries:
                ing._step()
            ing._wb.settle(keep=0)
        bodies = [[b for batch in ing.log.read(0, ing.log.head) for b in batch.column("body").to_pylist()]
                  for ing in (lane0, lane1)]
        assert bodies == [[b"a", b"b"], [b"c", b"d"]]
        assert lane1.duplicates == 2 and lane0.duplicates == 0
        assert not dedup.pending
    finally:
        lane0.stop()
        lane1.stop()
    # a restart loads every lane's log into the one dedup
    dedup = Dedup(1000, 2)
    lanes = [_lane_ingest(tmp_path, i, dedup, cond) for i in range(2)]
    try:
        lanes[1]._consumer = _Consumer([(b"a", True), (b"d", True), (b"e", True)])
        while lanes[1]._consumer.deliveries:
            lanes[1]._step()
        lanes[1]._wb.settle(keep=0)
        assert [b for batch in lanes[1].log.read(2, lanes[1].log.head) for b in batch.column("body").to_pylist()] \
            == [b"e"]
    finally:
        for ing in lanes:
            ing.stop()


def test_a_lane_waits_for_an_identity_another_lane_is_appending(tmp_path):
    """The redelivery arrives while the first lane is still appending the message: the second lane
    waits for the outcome instead of logging it as new."""
    dedup, cond = Dedup(1000, 2), threading.Condition()
    lane0, lane1 = (_lane_ingest(tmp_path, i, dedup, cond) for i in range(2))
    try:
        c0 = _Consumer([(b"x", False)])
        rows, _, _, group, _, _ = lane0._redeliveries.sort(c0, c0.deliveries, 0, 0)  # claimed, not yet recorded
        assert len(rows) == 1 and len(dedup.pending) == 1
        c1 = _Consumer([(b"x", True)])
        done = []
        t = threading.Thread(target=lambda: done.append(lane1._redeliveries.sort(c1, c1.deliveries, 0, 0)))
        t.start()
        t.join(0.3)
        assert t.is_alive() and not done  # waits for lane 0
        lane0._redeliveries.record(group)
        t.join(5)
        assert done and done[0][0] == [] and done[0][5] == 1  # then drops it
        assert not dedup.pending
    finally:
        lane0.stop()
        lane1.stop()


def test_dedup_trims_each_lane_by_its_own_commits():
    dedup = Dedup(4, 2)  # two identities of committed messages per lane
    for k in range(5):
        dedup.add(("a", k), k, 0)
        dedup.add(("b", k), 100 + k, 1)
    dedup.trim_later(5, 0)   # lane 0 committed all; lane 1 nothing
    dedup.trim()
    assert [("a", k) in dedup for k in range(5)] == [False, False, False, True, True]
    assert all(("b", k) in dedup for k in range(5))


def test_available_now_ends_when_every_lane_reached_its_target():
    """Each lane stops at its own target; the run is over only when every lane has fixed one."""
    class _Draining(_Lane):
        def __init__(self, head, target):
            super().__init__(0, head)
            self.available_now = True
            self.target = target
            self.available_now_began = 0.0
            self.last_message = 1e18  # still receiving: no silence rule

        def over_bound(self):
            return False

        def starved(self):
            return False

        def waiting_for_commit(self):
            return False

        def wait_for(self, predicate, timeout):
            return predicate()

    lane0, lane1 = _Draining(500, 300), _Draining(400, None)
    lanes = Lanes([lane0, lane1])
    lanes.wait_for = lambda predicate, timeout: predicate()
    reader = _reader(lanes)
    reader._last_batch_time = 1e18  # no overlap rule either
    assert not reader._available_now_ready(lanes, (300, 400), None)  # lane 1 still drains, nothing new
    lane1.target = 450
    assert reader._available_now_ready(lanes, (300, 400), None)
    lane1.log.head = lane1.log.durable_head = 600
    assert reader.latestOffset({"lanes": [0, 0]}, None) == {"lanes": [300, 450]}  # each at its target


def test_lanes_count_a_poison_deliverys_failed_sessions_together(tmp_path):
    """The broker redelivers a poison message to any lane: its failed sessions count for the query."""
    dedup, cond = Dedup(1000, 2), threading.Condition()
    from spark_mq.sources.poison import PoisonCounts
    counts = PoisonCounts()
    lanes = [Ingest("amqp08", lane_options(_opts(logLocation=str(tmp_path / "log"), consumers=2), i, 2),
                    connect=None, lane=i, dedup=dedup, cond=cond, poison_counts=counts) for i in range(2)]
    try:
        assert [counts.one_more("k"), counts.one_more("k")] == [1, 2]
        assert lanes[0]._poison._counts is lanes[1]._poison._counts is counts
    finally:
        for ing in lanes:
            ing.stop()
