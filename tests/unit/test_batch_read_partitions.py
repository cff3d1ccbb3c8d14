"""A batch read without ``logLocation`` ships its messages inside the task descriptions: every
partition, pickled as Spark pickles the planned partitions, must stay under the bound that keeps
it far below Spark's default ``spark.rpc.message.maxSize`` (128 MiB), whatever the bodies.

The consumer here is a stand-in for a broker connection (this is the pure planning code: drained
rows in, partitions out); the user-level tests of batch reads are in
tests/integration/test_batch_reads.py."""

from __future__ import annotations

import pickle

import pytest
from pyspark import cloudpickle

from spark_mq import schema as S
from spark_mq.errors import OptionError
from spark_mq.options import SOURCE, parse_options
from spark_mq.sources.base import MQBatchReader
from spark_mq.sources.consumer import Consumer
from spark_mq.sources.partitions import MemoryPartition, read_partition

MiB = 1 << 20


class _Queue(Consumer):
    """``count`` deliveries of ``size``-byte bodies, handed out as a STOMP consumer would."""

    def __init__(self, count: int, size: int) -> None:
        self.left = count
        self.body = b"x" * size
        self.acked = 0
        self.closed = False

    def poll(self, max_count: int, timeout: float) -> list:
        n = min(max_count, self.left)
        self.left -= n
        return [self.body] * n

    def row(self, body, offset: int, now_us: int) -> tuple:
        return (body, "/queue/q", f"id{offset}", now_us, None, False, offset, None, None, None, None, None, None)

    def ack(self, msgs: list) -> None:
        self.acked += len(msgs)

    def buffered(self) -> int:
        return 0

    def close(self) -> None:
        self.closed = True


def _reader(queue: _Queue, **extra) -> MQBatchReader:
    opts = parse_options({"uri": "stomp://127.0.0.1:1", "destination": "/queue/q", "quietPeriod": "0.01",
                          **{k: str(v) for k, v in extra.items()}}, format="stomp", direction=SOURCE)
    return MQBatchReader("stomp", opts, S.source_schema("stomp"), lambda opts, attempt: queue)


def test_default_max_messages_of_2660_byte_bodies_make_partitions_under_64_mib():
    """The issue's case: 100,000 x 2,660 B (the default maxMessages) made two partitions of about
    138 MiB pickled each, which a cluster's scheduler rejects after the broker was acked."""
    queue = _Queue(100_000, 2660)
    parts = _reader(queue).partitions()
    sizes = [len(cloudpickle.dumps(p, protocol=pickle.HIGHEST_PROTOCOL)) for p in parts]
    assert max(sizes) <= 64 * MiB, [s / MiB for s in sizes]
    assert sum(sizes) >= 100_000 * 2660  # nothing dropped to get there
    assert queue.acked == 100_000 and queue.closed
    rows = sum(b.num_rows for p in parts for b in read_partition(p, S.source_arrow_schema("stomp")))
    assert rows == 100_000


def test_max_task_bytes_is_an_option():
    queue = _Queue(2000, 10_000)  # 20 MB of bodies
    parts = _reader(queue, maxTaskBytes="4m").partitions()
    assert all(isinstance(p, MemoryPartition) for p in parts)
    sizes = [len(cloudpickle.dumps(p)) for p in parts]
    assert len(parts) >= 5 and max(sizes) <= 4 * MiB, [s / MiB for s in sizes]
    assert [p.index for p in parts] == list(range(len(parts)))


def test_a_body_larger_than_the_task_bound_is_refused_before_the_ack():
    """One message that cannot fit a task: the read fails, naming the option, and nothing is acked
    (the broker keeps it; a batch read with logLocation carries no data in its tasks)."""
    queue = _Queue(3, 5 * MiB)
    with pytest.raises(OptionError, match="maxTaskBytes"):
        _reader(queue, maxTaskBytes="4m").partitions()
    assert queue.acked == 0 and queue.closed


# -- with logLocation: the tasks carry log ranges; the log keeps what was served until committed ------

def _bodies(parts) -> list:
    return [b for p in parts for batch in read_partition(p, S.source_arrow_schema("stomp"))
            for b in batch.column("body").to_pylist()]


def test_a_logged_batch_read_serves_again_until_committed(tmp_path):
    from spark_mq.sources.partitions import LogPartition
    from spark_mq.sources.batchread import commit_batch_read

    log = str(tmp_path / "blog")
    q1 = _Queue(10, 100)
    parts = _reader(q1, logLocation=log).partitions()
    assert all(isinstance(p, LogPartition) and not hasattr(p, "data") for p in parts)
    assert len(_bodies(parts)) == 10 and q1.acked == 10
    q2 = _Queue(5, 200)
    parts = _reader(q2, logLocation=log).partitions()
    assert [len(b) for b in _bodies(parts)] == [100] * 10 + [200] * 5  # the uncommitted ones first
    assert commit_batch_read(log, 12) == 12
    parts = _reader(_Queue(0, 1), logLocation=log).partitions()
    assert [len(b) for b in _bodies(parts)] == [200] * 3  # offsets 12-14
    assert commit_batch_read(log) == 15  # default: everything served
    parts = _reader(_Queue(0, 1), logLocation=log).partitions()
    assert _bodies(parts) == []


def test_a_logged_batch_read_refuses_a_stream_querys_log(tmp_path):
    from spark_mq.sources.log import SourceLog

    log = str(tmp_path / "stream-log")
    stream_log = SourceLog(log, S.source_arrow_schema("stomp"))
    row = (b"x", "/queue/q", "id0", 0, None, False, 0, None, None, None, None, None, None)
    stream_log.append(S.build_batch("stomp", [row]))
    stream_log.close()
    queue = _Queue(3, 10)
    with pytest.raises(OptionError, match="logLocation.*stream query"):
        _reader(queue, logLocation=log).partitions()
    assert queue.acked == 0
