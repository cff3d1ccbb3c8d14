"""The soak run's own logic (scripts/soak.py): how the sink is counted, which outcomes fail a case
against docs/guarantees.md, and which cases --cases selects. The soak itself is ./dev soak."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def soak():
    spec = importlib.util.spec_from_file_location("soak", ROOT / "scripts" / "soak.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["soak"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_the_sink_counts_rows_with_repeats_and_rereads_only_replaced_files(soak, tmp_path):
    (tmp_path / "batch-000000000.txt").write_text("c-000000001\nc-000000002\n")
    (tmp_path / "batch-000000001.txt").write_text("c-000000002\nother\n\n")
    (tmp_path / ".batch-000000002.tmp").write_text("c-000000009\n")  # a write in progress: not a row
    sink = soak.Sink(tmp_path, "c-")
    seqs, foreign = sink.rows()
    assert sorted(seqs) == [1, 2, 2] and foreign == 1
    assert sink.distinct() == 2
    (tmp_path / "batch-000000001.txt").write_text("c-000000003\n")  # a replayed batch replaces its file
    os.utime(tmp_path / "batch-000000001.txt", ns=(1, 1))
    seqs, foreign = sink.rows()
    assert sorted(seqs) == [1, 2, 3] and foreign == 0


def _result(soak, **kw):
    return soak.Result("x", **kw)


def test_verdicts_follow_the_guarantees(soak):
    durable, auto, malamute = (soak.Case("amqp08", "rabbitmq", "durable"), soak.Case("amqp08", "rabbitmq", "auto"),
                               soak.Case("malamute", "malamute", "none"))
    assert soak.verdict(durable, _result(soak, sent=10, read=10)) == "ok"
    assert soak.verdict(durable, _result(soak, sent=10, read=9, lost=1)).startswith("FAIL: 1 lost in ackMode=durable")
    # at-most-once modes: losses are reported, not failures; duplicates fail every mode
    assert soak.verdict(auto, _result(soak, sent=10, read=9, lost=1)).startswith("ok (losses allowed")
    assert soak.verdict(malamute, _result(soak, sent=10, read=8, lost=2)).startswith("ok (losses allowed")
    assert soak.verdict(auto, _result(soak, sent=10, read=10, duplicated=1)).startswith("FAIL: 1 duplicate")
    # a duplicate of a group the producer had to send again may be the broker's second copy
    assert soak.verdict(durable, _result(soak, sent=10, read=10, duplicated=2, dup_resent=2)) == "ok"
    assert soak.verdict(durable, _result(soak, sent=10, read=10, duplicated=3, dup_resent=2)).startswith("FAIL")
    assert soak.verdict(durable, _result(soak, sent=10, read=10, unknown=1)).startswith("FAIL")
    assert soak.verdict(auto, _result(soak, error="broker did not start")).startswith("FAIL: error")


def test_case_selection(soak):
    names = [c.name for c in soak.all_cases()]
    assert len(names) == 10 and "malamute-malamute-none" in names and "stomp-activemq-commit" in names
    args = soak.parse_args(["--cases", "stomp-activemq,malamute", "--messages", "10"])
    assert [c.name for c in args.selected] == ["stomp-activemq-durable", "stomp-activemq-commit",
                                               "stomp-activemq-auto", "malamute-malamute-none"]
    with pytest.raises(SystemExit):
        soak.parse_args(["--cases", "amqp09"])


def test_consumers_gives_the_amqp08_and_stomp_cases_lanes(soak, tmp_path):
    args = soak.parse_args(["--consumers", "4", "--cases", "amqp08-rabbitmq-durable,malamute"])
    broker = type("B", (), {"url": lambda self, scheme="tcp": f"{scheme}://127.0.0.1:1"})()
    amqp, malamute = args.selected
    assert soak.source_options(amqp, broker, "q", tmp_path, args)["consumers"] == "4"
    assert "consumers" not in soak.source_options(malamute, broker, "m", tmp_path, args)
    assert "consumers" not in soak.source_options(amqp, broker, "q", tmp_path, soak.parse_args([]))
    with pytest.raises(SystemExit):
        soak.parse_args(["--consumers", "0"])
