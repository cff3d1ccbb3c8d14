"""How a micro-batch's range is split into partitions: by numPartitions, else by body bytes and by
message count (pure arithmetic on parsed options)."""

from __future__ import annotations

import pytest

from spark_mq.options import SOURCE, parse_options
from spark_mq.sources.lanes import Lanes
from spark_mq.sources.partitions import partition_count


def _opts(**extra):
    base = {"uri": "tcp://127.0.0.1:1", "mailbox": "m", "logLocation": "/nonexistent/log"}
    return parse_options({**base, **{k: str(v) for k, v in extra.items()}}, format="malamute", direction=SOURCE)


@pytest.mark.parametrize("count, body_bytes, expected", [
    (1, 10, 1),
    (500_000, 50_000_000, 10),        # 100 B bodies: by count (50,000 each), not one 50 MB partition
    (200_000, 819_200_000, 7),        # 4 KiB bodies: by bytes (128 MiB each), count would say 4
    (50_000, 5_000_000, 1),           # exactly one partition's worth of messages
    (50_001, 5_000_100, 2),
    (3, 3 << 30, 3),                  # 1 GiB bodies: never more partitions than messages
    (0, 0, 1),                        # an empty batch reader still has one partition
])
def test_default_split_by_bytes_and_count(count, body_bytes, expected):
    assert partition_count(count, body_bytes, _opts()) == expected


def test_limits_are_options():
    assert partition_count(1000, 1000, _opts(maxPartitionMessages=100)) == 10
    assert partition_count(1000, 1_000_000, _opts(maxPartitionBytes="100k")) == 10


def test_num_partitions_overrides_both_limits():
    assert partition_count(500_000, 50_000_000, _opts(numPartitions=3)) == 3
    assert partition_count(2, 50_000_000, _opts(numPartitions=3)) == 2  # at most one per message


class _Log:
    def __init__(self, tail, head):
        self.tail, self.head, self.durable_head = tail, head, head

    def limit_bytes(self, s, end, max_bytes):
        return end


class _Ingest:
    """What ``latestOffset`` reads of the ingest: a log that is all durable, nothing pending."""

    def __init__(self, tail, head):
        self.log = _Log(tail, head)
        self.committed = tail
        self.available_now = False
        self.target = None
        self.planned_end = 0

    def processed(self, end):
        self.committed = max(self.committed, end)

    commit = processed

    def resume_at(self, offset):
        pass

    def end_group_for_plan(self, timeout):
        pass  # nothing is being gathered


def test_spark_before_4_2_first_offset_call_without_a_start_is_never_below_the_checkpoint():
    """Spark < 4.2 calls ``latestOffset()`` without a start. On a restart its checkpoint's last end
    (here 900) is unknown to the first call, and the log's tail (0) lies below it: a limit counted
    from the tail answered 100, and Spark would run [900, 100) and then read [100, 900) again. The
    first call answers all that is durable; limits apply from the next call on."""
    from spark_mq import schema as S
    from spark_mq.sources.base import MQStreamReader

    reader = MQStreamReader("malamute", _opts(maxMessagesPerTrigger=100), S.source_schema("malamute"), None)
    ing = _Ingest(tail=0, head=1000)
    lanes = Lanes([ing])
    reader._engine = lambda: lanes
    reader._wait_first = lambda ing: None
    assert reader.latestOffset() == {"offset": 1000}
    ing.log.head = ing.log.durable_head = 1500
    assert reader.latestOffset() == {"offset": 1100}  # from the last end, within the limit
    assert reader.latestOffset({"offset": 1100}, None) == {"offset": 1200}  # Spark >= 4.2: a start, limits


class _OneBatchIngest(_Ingest):
    """The stub ingest with what a Spark without availableNow support makes the reader use: the
    availableNow target (fixed at once, as for a counted queue depth) for a run's first batch."""

    def __init__(self, tail, head):
        super().__init__(tail, head)
        self.paused = False
        self.prepared = self.ended = 0

    def prepare_available_now(self):
        self.prepared += 1
        self.target = self.log.head

    def end_available_now(self):
        self.ended += 1
        self.target = None

    def wait_for(self, predicate, timeout):
        return predicate()

    def over_bound(self):
        return False

    def starved(self):
        return False

    def waiting_for_commit(self):
        return False


@pytest.mark.parametrize("restart", [False, True])
def test_without_available_now_support_a_runs_first_batch_takes_the_backlog_then_limits_apply(monkeypatch, restart):
    """Spark 4.0/4.1 (no SupportsTriggerAvailableNow) run once and availableNow as one batch planned by
    the run's first latestOffset(): it holds what was available at the start, read limits apply from
    the second batch; a new query's first batch starts at initialOffset, a restart's at the log."""
    import spark_mq.sources.base as base
    from spark_mq import schema as S
    from spark_mq.compat import Capabilities

    monkeypatch.setattr(base, "CAPS", Capabilities("4.0.5", read_limits=False, available_now=False,
                                                   stream_arrow_writer=False))
    reader = base.MQStreamReader("malamute", _opts(maxMessagesPerTrigger=100), S.source_schema("malamute"), None)
    ing = _OneBatchIngest(tail=0, head=1000)
    lanes = Lanes([ing])
    reader._engine = lambda: lanes
    reader._wait_first = lambda ing: None
    if not restart:
        assert reader.initialOffset() == {"offset": 0}
    assert reader.latestOffset() == {"offset": 1000}  # the whole backlog, beyond maxMessagesPerTrigger
    assert (ing.prepared, ing.ended, ing.target) == (1, 1, None)  # the target served one batch only
    ing.log.head = ing.log.durable_head = 1500
    assert reader.latestOffset() == {"offset": 1100}  # then the limit
    assert reader.latestOffset() == {"offset": 1200}
    assert ing.prepared == 1
