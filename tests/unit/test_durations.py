"""The suite's durations record and summary (scripts/test_durations.py, tests/conftest.py): pure code."""

from __future__ import annotations

import importlib.util
import os
import json
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import test_durations as td  # noqa: E402


def _record() -> dict:
    return {"started": "2026-12-07T00:00:00Z", "wall_seconds": 125.0, "exitstatus": 0, "workers": 2,
            "args": ["-n", "2", "tests"],
            "tests": [
                {"nodeid": "tests/integration/test_a.py::test_slow", "setup": 5.0, "call": 40.0, "teardown": 1.0,
                 "outcome": "passed", "worker": "gw0", "fixture": [["spark", "session", 4.5]],
                 "broker-start": [["rabbitmq", "setup", 6.0], ["rabbitmq-restart", "call", 3.0]],
                 "slept": [["call", 2.5]]},
                {"nodeid": "tests/integration/test_a.py::test_fast", "setup": 0.0, "call": 1.0, "teardown": 0.0,
                 "outcome": "failed", "worker": "gw1"},
                {"nodeid": "tests/unit/test_b.py::test_x", "setup": 0.0, "call": 0.2, "teardown": 0.0,
                 "outcome": "passed", "worker": "gw1", "fixture": [["malamute_broker", "function", 0.7]]},
            ]}


def test_summary_ranks_tests_and_adds_up_files_and_kinds():
    text = td.render(td.committed_form(_record()))
    slowest = [line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert "test_a.py::test_slow" in slowest[0] and "46.0" in slowest[0]
    assert "test_a.py::test_fast" in slowest[1]
    assert "| `tests/integration/test_a.py` | 2 | 47.0 |" in text
    assert "| Spark session (in-process) | 1 | 4.5 |" in text
    assert "| broker start: rabbitmq | 1 | 6.0 |" in text
    assert "| broker start: rabbitmq-restart | 1 | 3.0 |" in text
    assert "| broker fixtures | 1 | 0.7 |" in text
    assert "| time.sleep in the test's own thread | 1 | 2.5 |" in text
    assert "1 failed, 2 passed" in text
    assert "**2:05**" in text


def test_committed_summary_is_what_the_committed_record_gives():
    record = json.loads(td.COMMITTED.read_text())
    assert td.SUMMARY.read_text() == td.render(record), "tests/DURATIONS.md is stale: run ./dev durations"
    assert len(record["tests"]) > 1000, "the committed record is not of a full run"


def _conftest():
    spec = importlib.util.spec_from_file_location("suite_conftest", ROOT / "tests" / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Item(SimpleNamespace):
    def get_closest_marker(self, name):
        return self.markers.get(name)


def test_collection_runs_slowest_first_keeping_groups_and_unit_modules_together(monkeypatch):
    conftest = _conftest()
    integ = conftest.INTEGRATION_DIR
    unit = conftest.TESTS_DIR / "unit" / "test_u.py"

    def item(path, name, group=None):
        markers = {"xdist_group": SimpleNamespace(args=(group,), kwargs={})} if group else {}
        return _Item(path=path, nodeid=f"{path.name}::{name}", markers=markers)

    items = [item(unit, "u1"), item(unit, "u2"),
             item(integ / "test_p.py", "p1", "g"), item(integ / "test_p.py", "p2", "g"),
             item(integ / "test_s.py", "fast"), item(integ / "test_s.py", "slow")]
    known = {"test_p.py::p1": 30.0, "test_p.py::p2": 30.0, "test_s.py::slow": 50.0, "test_s.py::fast": 2.0,
             "test_u.py::u1": 0.1, "test_u.py::u2": 0.1}
    monkeypatch.setattr(conftest, "_load_committed", lambda: known)
    conftest._slowest_first(items)
    assert [i.nodeid.split("::")[1] for i in items] == ["p1", "p2", "slow", "fast", "u1", "u2"]


def test_integration_modules_with_module_scoped_fixtures_run_on_one_worker():
    """A module-scoped fixture under ``--dist loadgroup`` is built once per worker its tests land on: a
    module with one (a wheel and venvs, notebook runs, a broker) must be an xdist group of its own."""
    import re

    integration = ROOT / "tests" / "integration"
    for path in sorted(integration.glob("test_*.py")):
        text = path.read_text()
        if re.search(r'@pytest\.fixture\(scope="module"', text):
            assert f'pytest.mark.xdist_group("{path.stem}")' in text, f"{path.name} has module-scoped fixtures"


def test_the_record_keeps_a_grouped_tests_plain_id():
    conftest = _conftest()
    assert conftest.plain_nodeid("tests/x.py::test_a[p]@test_x") == "tests/x.py::test_a[p]"
    assert conftest.plain_nodeid("tests/x.py::test_a[u@h]") == "tests/x.py::test_a[u@h]"
    assert conftest.plain_nodeid("tests/x.py::test_b") == "tests/x.py::test_b"


def test_cpu_seconds_are_ranked_and_added_up_when_the_record_has_them():
    record = _record()
    record["tests"][0]["cpu"] = [["setup", 2.0], ["call", 30.0], ["teardown", 0.5]]
    record["tests"][1]["cpu"] = [["call", 40.0]]  # a short test that cost more CPU than the slow one
    record["tests"][2]["cpu"] = [["call", 0.25]]
    text = td.render(td.committed_form(record))
    assert "CPU seconds of all tests: 72.8 s" in text
    costly = text.split("cost the most CPU", 1)[1].splitlines()
    first = next(line for line in costly if line.startswith("| 1 |"))
    assert "test_a.py::test_fast" in first and "| 40.0 |" in first
    assert "| `tests/integration/test_a.py` | 2 | 47.0 | 99.6% | 46.0 | 72.5 |" in text
    assert "| gw1 | 2 | 1.2 | 40.2 |" in text
    assert "CPU" not in td.render(td.committed_form(_record()))  # a record without them: no CPU columns


def test_the_cpu_account_counts_what_a_child_process_burns(tmp_path):
    """The cgroup of tests/conftest.py (where the machine lets it be made): a child's CPU is counted."""
    import subprocess

    account = _conftest()._CpuAccount("unit-test")
    try:
        if account.group is None:  # made where the suite runs (root, cgroup v1 cpuacct); said, not skipped
            assert not (account.ROOT / "cpuacct.usage").exists() or os.geteuid() != 0, \
                "root with a cpuacct hierarchy, yet no group was made"
            return
        account.since_mark()
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                        "while time.process_time() - t < 0.5: pass"], check=True)
        burnt = account.since_mark()
        assert 0.4 <= burnt < 5.0, burnt
    finally:
        account.close()
