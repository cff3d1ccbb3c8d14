"""Executor-side ingest (``spark_mq.sources.executors``, its batch files in ``spark_mq.sources.batchfiles``):
the pure parts. Batch files (first link wins,
row counts), identities the same in every process, the stream reader's offsets, availableNow's end,
trimming, and the options it refuses. The broker-facing parts are in
tests/integration/test_sources_executors.py and test_cluster.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spark_mq import schema as S
from spark_mq.errors import OptionError
from spark_mq.options import SOURCE, parse_options
from spark_mq.sources import batchfiles as B
from spark_mq.sources import executors as X


def _opts(tmp_path, fmt="amqp08", **extra):
    base = {"uri": "amqp://guest:guest@127.0.0.1:1/", "queue": "q"} if fmt == "amqp08" else \
        {"uri": "stomp://127.0.0.1:1", "destination": "/queue/q"} if fmt == "stomp" else \
        {"uri": "tcp://127.0.0.1:1", "stream": "s"}
    return parse_options({**base, "logLocation": str(tmp_path / "log"), "ingest": "executors",
                          **{k: str(v) for k, v in extra.items()}}, format=fmt, direction=SOURCE)


def _row(body: bytes, offset: int):
    cols = S.SOURCE_COLUMNS["amqp08"]
    row = [None] * len(cols)
    row[S.BODY], row[S.DESTINATION], row[S.TIMESTAMP], row[S.REDELIVERED], row[S.OFFSET] = body, "q", 0, False, offset
    return tuple(row)


def _write(path, bodies, late=False):
    rows = [_row(b, i) for i, b in enumerate(bodies)]
    batches = [S.build_batch("amqp08", rows)] if rows else []
    return B.write_first(path, S.source_arrow_schema("amqp08"), batches, len(rows), late)


def test_the_first_link_wins_and_the_loser_leaves_no_file(tmp_path):
    path = B.batch_path(str(tmp_path), 2, 7)
    assert _write(path, [b"a", b"b"]) is True
    assert _write(path, [b"x"]) is False  # a second attempt of the same task
    assert B.file_rows(path) == 2
    got = [b for batch in B.read_file(path) for b in batch.column("body").to_pylist()]
    assert got == [b"a", b"b"]
    assert sorted(os.listdir(os.path.dirname(path))) == ["batch-000000000007.arrow"]  # no temporary left


def test_an_empty_batch_file_says_zero_rows_and_a_missing_one_none(tmp_path):
    path = B.batch_path(str(tmp_path), 0, 0)
    assert B.file_rows(path) is None
    assert _write(path, []) is True
    assert B.file_rows(path) == 0


def test_identities_are_the_same_in_another_process():
    args = (b"body\x00", None, [("k", "v"), ("redelivered", "true"), ("x-delivery-count", "1")], False)
    here = B.task_identity(*args)
    code = ("from spark_mq.sources.batchfiles import task_identity as t; "
            "print(t(b'body\\x00', None, [('x-delivery-count', '3'), ('k', 'v')], False))")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert there.strip() == repr(here)  # volatile headers ignored, header order ignored, no per-process key
    assert B.task_identity(b"body\x01", None, [("k", "v")], False) != here
    assert B.task_identity(b"b", "id-1", None, True) == ("m", "id-1")
    assert B.task_identity(b"b", "id-1", None, False)[0] == "c"  # ids that change per session are not used
    assert B.task_identity(b"b", "id-1", [(S.ID_HEADER, "sink-7")], True) == ("h", "sink-7")


def test_recent_identities_see_files_that_appear_later(tmp_path):
    root = str(tmp_path)
    _write(B.batch_path(root, 0, 25 - B.RECENT_BATCHES - 1), [b"too-old"])
    _write(B.batch_path(root, 1, 25 - B.RECENT_BATCHES), [b"recent"])
    recent = B.RecentIdentities(root, 25, stable_ids=False)
    key = lambda b: B.task_identity(b, None, None, False)  # noqa: E731
    assert key(b"recent") in recent
    assert key(b"too-old") not in recent  # older than RECENT_BATCHES behind this batch
    assert key(b"now") not in recent
    _write(B.batch_path(root, 2, 25), [b"now"])  # another lane of this batch links its file
    assert key(b"now") in recent
    _write(B.batch_path(root, 2, 26), [b"later"])  # a later batch's file is not this task's business
    assert key(b"later") not in recent


def test_recent_identities_list_the_files_again_only_when_one_was_linked(tmp_path, monkeypatch):
    root = str(tmp_path)
    _write(B.batch_path(root, 0, 20), [b"old"])
    _write(B.batch_path(root, 1, 20), [b"older"])
    listings = []
    real = B.batch_files
    monkeypatch.setattr(B, "batch_files", lambda r: listings.append(r) or real(r))
    recent = B.RecentIdentities(root, 21, stable_ids=False)
    key = lambda b: B.task_identity(b, None, None, False)  # noqa: E731
    # a STOMP task holds many redeliveries that are in no file (sent after its ACK to the one before): misses
    assert not any(key(b"new-%d" % i) in recent for i in range(2000))
    assert len(listings) == 1
    assert key(b"old") in recent and len(listings) == 1
    _write(B.batch_path(root, 1, 21), [b"linked"])  # another lane of this batch links its file
    assert key(b"linked") in recent
    assert len(listings) == 2


def test_stream_reader_plans_one_batch_per_trigger_over_every_lane(tmp_path):
    opts = _opts(tmp_path, consumers=3)
    reader = X.ExecutorStreamReader("amqp08", opts, S.source_schema("amqp08"), lambda o, a: None)
    start = reader.initialOffset()
    assert start == {"batch": 0, "consumers": 3}
    assert (tmp_path / "log" / B.EXECUTORS_FILE).exists()
    end = reader.latestOffset(start, None)
    assert end == {"batch": 1, "consumers": 3}
    parts = reader.partitions(start, end)
    assert [(p.batch, p.lane) for p in parts] == [(0, 0), (0, 1), (0, 2)]
    # a checkpoint written with 2 consumers replays its batches with 2 lanes, whatever the option says now
    parts = reader.partitions({"batch": 4, "consumers": 2}, {"batch": 5, "consumers": 2})
    assert [(p.batch, p.lane, p.consumers) for p in parts] == [(4, 0, 2), (4, 1, 2)]
    with pytest.raises(OptionError, match="driver-side ingest"):
        reader.latestOffset({"offset": 5}, None)


def test_a_new_query_starts_after_existing_batch_files(tmp_path):
    opts = _opts(tmp_path)
    _write(B.batch_path(str(tmp_path / "log"), 0, 41), [b"served"])
    reader = X.ExecutorStreamReader("amqp08", opts, S.source_schema("amqp08"), lambda o, a: None)
    assert reader.initialOffset()["batch"] == 42


def test_available_now_ends_after_a_batch_with_nothing(tmp_path):
    opts = _opts(tmp_path, consumers=2)
    root = str(tmp_path / "log")
    reader = X.ExecutorStreamReader("amqp08", opts, S.source_schema("amqp08"), lambda o, a: None)
    reader.initialOffset()
    _write(B.batch_path(root, 0, 0), [])
    _write(B.batch_path(root, 1, 0), [])   # the last run's final batch was empty ...
    reader.prepareForTriggerAvailableNow()
    assert reader.latestOffset({"batch": 1, "consumers": 2})["batch"] == 2  # ... a new run plans one all the same
    _write(B.batch_path(root, 0, 1), [b"m"])
    _write(B.batch_path(root, 1, 1), [])
    assert reader.latestOffset({"batch": 2, "consumers": 2})["batch"] == 3   # batch 1 had a message
    _write(B.batch_path(root, 0, 2), [])
    _write(B.batch_path(root, 1, 2), [])
    assert reader.latestOffset({"batch": 3, "consumers": 2})["batch"] == 3   # batch 2 had none: the run ends


def test_available_now_ends_once_its_batches_hold_the_depth_counted_at_its_start(tmp_path):
    opts = _opts(tmp_path, consumers=2)
    root = str(tmp_path / "log")
    asked = []
    reader = X.ExecutorStreamReader("amqp08", opts, S.source_schema("amqp08"), lambda o, a: None,
                                    lambda o: asked.append(o) or 5)
    reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    assert len(asked) == 1  # counted once, at the run's start
    assert reader.latestOffset({"batch": 0, "consumers": 2})["batch"] == 1
    _write(B.batch_path(root, 0, 0), [b"a", b"b"])
    _write(B.batch_path(root, 1, 0), [b"c"])
    assert reader.latestOffset({"batch": 1, "consumers": 2})["batch"] == 2   # 3 of 5: on
    _write(B.batch_path(root, 0, 1), [b"d"])
    _write(B.batch_path(root, 1, 1), [b"e", b"f"])  # a producer keeps sending: never an empty batch
    assert reader.latestOffset({"batch": 2, "consumers": 2})["batch"] == 2   # 6 of 5: the run ends
    assert len(asked) == 1


def test_available_now_without_a_depth_ends_at_an_empty_batch(tmp_path):
    from spark_mq.errors import BrokerError

    def depth(opts):  # a queue not yet declared: RabbitMQ answers a passive declare with 404
        raise BrokerError("NOT_FOUND - no queue 'q'")

    opts = _opts(tmp_path)
    root = str(tmp_path / "log")
    reader = X.ExecutorStreamReader("amqp08", opts, S.source_schema("amqp08"), lambda o, a: None, depth)
    reader.initialOffset()
    reader.prepareForTriggerAvailableNow()  # logs the unknown depth, does not fail the query
    assert reader.latestOffset({"batch": 0, "consumers": 1})["batch"] == 1
    _write(B.batch_path(root, 0, 0), [b"a"])
    assert reader.latestOffset({"batch": 1, "consumers": 1})["batch"] == 2
    _write(B.batch_path(root, 0, 1), [])
    assert reader.latestOffset({"batch": 2, "consumers": 1})["batch"] == 2


def test_available_now_ends_after_a_message_stamped_after_its_start(tmp_path):
    opts = _opts(tmp_path, "stomp")
    root = str(tmp_path / "log")
    reader = X.ExecutorStreamReader("stomp", opts, S.source_schema("stomp"), lambda o, a: None)
    reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    end = reader.latestOffset({"batch": 0, "consumers": 1})
    (part,) = reader.partitions({"batch": 0, "consumers": 1}, end)
    assert part.run_began_ms is not None  # the task compares its messages' stamps with it
    _write(B.batch_path(root, 0, 0), [b"a"])
    assert reader.latestOffset({"batch": 1, "consumers": 1})["batch"] == 2
    _write(B.batch_path(root, 0, 1), [b"b", b"c"], late=True)
    assert B.file_stamped_late(B.batch_path(root, 0, 1)) and not B.file_stamped_late(B.batch_path(root, 0, 0))
    assert reader.latestOffset({"batch": 2, "consumers": 1})["batch"] == 2


def test_a_task_notes_a_message_its_broker_stamped_after_the_run_began(tmp_path):
    class Stamped:  # a consumer whose broker stamps messages (ActiveMQ): the message is its stamp
        broker_stamps, stable_ids = True, True

        def broker_stamp_ms(self, msg):
            return msg

    msgs = [1_000, 2_000]
    assert X._stamped_late(Stamped(), msgs, 1_500) and not X._stamped_late(Stamped(), msgs, 2_000)
    assert not X._stamped_late(Stamped(), msgs, None)  # not in an availableNow run
    Stamped.broker_stamps = False
    assert not X._stamped_late(Stamped(), msgs, 0)  # the broker stamps nothing (or several destinations)


def test_commit_keeps_the_recent_batch_files(tmp_path):
    opts = _opts(tmp_path)
    root = str(tmp_path / "log")
    reader = X.ExecutorStreamReader("amqp08", opts, S.source_schema("amqp08"), lambda o, a: None)
    for b in range(15):
        _write(B.batch_path(root, 0, b), [b"m"])
    reader.commit({"batch": 15, "consumers": 1})
    left = sorted(B._batch_of(n) for n in os.listdir(os.path.join(root, "lane-0")))
    assert left == list(range(15 - B.RECENT_BATCHES, 15))


def test_what_executor_ingest_refuses(tmp_path):
    with pytest.raises(OptionError, match="Malamute has no acknowledgements"):
        X.check_placement(_opts(tmp_path, fmt="malamute"), "malamute")
    with pytest.raises(OptionError, match="ackMode=commit"):
        X.check_placement(_opts(tmp_path, ackMode="commit"), "amqp08")
    with pytest.raises(OptionError, match="poisonMessages=deadLetter"):
        X.check_placement(_opts(tmp_path, fmt="stomp", poisonMessages="deadLetter",
                                deadLetterDestination="/queue/dlq"), "stomp")
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "seg-00000000000000000000.arrow").write_bytes(b"")
    with pytest.raises(OptionError, match="written by the driver-side ingest"):
        X.check_placement(_opts(tmp_path), "amqp08")


def test_the_driver_side_ingest_refuses_a_location_of_executor_ingest(tmp_path):
    from spark_mq.sources.lanes import check_layout
    B.mark_placement(str(tmp_path))
    with pytest.raises(OptionError, match="ingest=executors"):
        check_layout(str(tmp_path), 1)


def test_task_caps_share_max_messages_per_trigger_over_the_lanes(tmp_path):
    assert X._task_caps(_opts(tmp_path, maxMessagesPerTrigger=1000), 4)[0] == 250
    assert X._task_caps(_opts(tmp_path, taskMaxMessages=10, maxMessagesPerTrigger=1000), 4)[0] == 10
    assert X._task_caps(_opts(tmp_path), 4) == (50_000, 128 << 20)
    assert X._task_caps(_opts(tmp_path, prefetch=300, maxMessagesPerTrigger=2000), 4)[0] == 300


def test_a_task_prefetches_what_it_may_take(tmp_path):
    """A task acknowledges at its end: with the default prefetch (1000) the broker would stop there."""
    assert X.task_options(_opts(tmp_path, taskMaxMessages=5000), 2).prefetch == 5000
    assert X.task_options(_opts(tmp_path, maxMessagesPerTrigger=1000), 4).prefetch == 250
    assert X.task_options(_opts(tmp_path, prefetch=70), 4).prefetch == 70
    # each consumer of a queue (subscription of a destination) is bounded by the prefetch: shared out
    assert X.task_options(_opts(tmp_path, queue="a,b", taskMaxMessages=151), 1).prefetch == 76
    assert X.task_options(_opts(tmp_path, fmt="stomp", destination="/queue/a,/queue/b,/queue/c",
                                taskMaxMessages=300), 1).prefetch == 100
    with pytest.raises(OptionError, match="taskMaxMessages"):
        _opts(tmp_path, taskMaxMessages=70_000)


def test_a_files_identities_taken_column_wise_are_each_messages_own(tmp_path):
    """Stable ids: the column-wise identities of a batch file are those ``task_identity`` gives each
    message: by the id header where it is set and not empty, else by the message id, else by content."""
    cols = S.SOURCE_COLUMNS["stomp"]
    cases = [  # (message id, headers)
        ("ID:1", [("spark-mq-message-id", "u-1"), ("a", "1")]),  # the id header wins
        ("ID:2", [("a", "2")]),                                   # the message id
        (None, [("a", "3")]),                                     # no id: the content
        ("ID:4", [("spark-mq-message-id", "")]),                  # an empty id header: one by one
        ("ID:5", None),                                           # no headers at all
        (None, [("spark-mq-message-id", "u-6"), ("redelivered", "true")]),
    ]
    rows = []
    for i, (mid, headers) in enumerate(cases):
        row = [None] * len(cols)
        row[S.BODY], row[S.DESTINATION], row[S.TIMESTAMP], row[S.REDELIVERED] = b"body-%d" % i, "/queue/q", 0, False
        row[S.OFFSET], row[S.MESSAGE_ID], row[S.HEADERS] = i, mid, headers
        rows.append(tuple(row))
    path = B.batch_path(str(tmp_path), 0, 0)
    assert B.write_first(path, S.source_arrow_schema("stomp"), [S.build_batch("stomp", rows)], len(rows))
    expected = {B.task_identity(r[S.BODY], r[S.MESSAGE_ID], r[S.HEADERS], True) for r in rows}
    assert {kind for kind, _ in expected} == {"h", "m", "c"}
    assert B._file_identities(path, True) == expected
    assert B._file_identities(path, False) == {B.task_identity(r[S.BODY], r[S.MESSAGE_ID], r[S.HEADERS], False)
                                               for r in rows}
