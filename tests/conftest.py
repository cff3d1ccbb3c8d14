"""Suite-wide test set-up: markers by directory, a per-test time limit as a safety net, the durations
record, and the order and grouping that let pytest-xdist run the suite side by side.

Responsible for:
- marking everything under tests/integration/ with `integration`, and giving every test without its own
  `@pytest.mark.timeout(...)` a generous default limit (pytest-timeout, SIGALRM method, so fixture
  finalizers still run and brokers are stopped) so that no test can hang CI;
- writing each test's setup / call / teardown seconds, the fixtures that took time in its setup, the
  brokers it started, the seconds its own thread slept and the CPU seconds it cost (where the machine
  lets a cgroup count them, see ``_CpuAccount``) to the durations file (`SPARK_MQ_DURATIONS`,
  default `.test-durations.json`; `scripts/test_durations.py` turns a full run's file into
  tests/DURATIONS.md and tests/durations.json);
- under xdist: ordering the collection slowest first by the committed tests/durations.json (a module's
  `xdist_group` kept together), so the long tests start early and the workers end together.
Not responsible for brokers: see tests/integration/conftest.py and tests/integration/brokers.py.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
INTEGRATION_DIR = TESTS_DIR / "integration"
REPO = TESTS_DIR.parent
COMMITTED_DURATIONS = TESTS_DIR / "durations.json"
DURATIONS_ENV = "SPARK_MQ_DURATIONS"
# Spark binds its driver to the first non-loopback interface unless told otherwise: keep test traffic
# on loopback, also when pytest is run directly rather than through ./dev test.
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# The environment of every JVM and Spark driver the tests start: JVM options, the Spark settings, the JVM
# class archive (tests/sparkenv.py)
import sparkenv  # noqa: E402

sparkenv.apply()

# Seconds; a safety net against hangs, not a performance budget. Override per test with
# @pytest.mark.timeout(N), or for a run with SPARK_MQ_TEST_TIMEOUT=N (0 disables) or --timeout=N.
DEFAULT_TEST_TIMEOUT = 600
# A module whose tests share module-scoped state that is expensive to build (a wheel and venvs, a Jupyter
# kernel's runs, a broker of the module) carries ``pytestmark = pytest.mark.xdist_group("<module>")``:
# under ``--dist loadgroup`` its tests run on one worker, in order (a marker added here at collection
# comes after xdist's workers have read the groups; tests/unit/test_durations.py checks the modules).
# pytest-xdist's --dist loadgroup appends "@<group>" to a grouped test's id; the record keeps the plain id
_GROUP_SUFFIX = re.compile(r"@[A-Za-z0-9_.-]+$")


def plain_nodeid(nodeid: str) -> str:
    return _GROUP_SUFFIX.sub("", nodeid)


# A fixture setup shorter than this is not worth a line in the record.
FIXTURE_RECORD_MIN = 0.05


# -- markers, time limits, groups and order ---------------------------------------------------------

def _group_of(item: pytest.Item) -> str | None:
    marker = item.get_closest_marker("xdist_group")
    if marker is not None:
        return marker.args[0] if marker.args else marker.kwargs.get("name")
    return None


def _load_committed() -> dict[str, float]:
    try:
        data = json.loads(COMMITTED_DURATIONS.read_text())
    except (OSError, ValueError):
        return {}
    return {t["nodeid"]: t["setup"] + t["call"] + t["teardown"] for t in data.get("tests", [])}


def _slowest_first(items: list[pytest.Item]) -> None:
    """Order the collection slowest first, a group (or a module's tests, unit tests alike) kept together
    in its own order: a unit of work's weight is the sum of its tests' last recorded seconds (a test not
    in the record weighs 1 s)."""
    known = _load_committed()
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = _group_of(item)
        key = f"group:{group}" if group else (f"test:{item.nodeid}" if INTEGRATION_DIR in Path(item.path).parents
                                              else f"module:{item.path}")
        units.setdefault(key, []).append(item)

    def weight(unit: list[pytest.Item]) -> float:
        return sum(known.get(plain_nodeid(i.nodeid), 1.0) for i in unit)

    first_seen = {key: n for n, key in enumerate(units)}
    ordered = sorted(units, key=lambda k: (-weight(units[k]), first_seen[k]))
    items[:] = [item for key in ordered for item in units[key]]


def _xdist_workers(config: pytest.Config) -> int:
    try:
        return int(config.getoption("numprocesses") or 0)
    except (ValueError, TypeError):
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    has_timeout_plugin = config.pluginmanager.hasplugin("timeout")
    default_timeout = int(os.environ.get("SPARK_MQ_TEST_TIMEOUT", DEFAULT_TEST_TIMEOUT))
    explicit_cli_timeout = has_timeout_plugin and config.getoption("timeout", None) is not None
    for item in items:
        if INTEGRATION_DIR in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.integration)
        if has_timeout_plugin and not explicit_cli_timeout and default_timeout > 0 \
                and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(default_timeout))
    if config.pluginmanager.hasplugin("xdist") and (_xdist_workers(config) or hasattr(config, "workerinput")):
        _slowest_first(items)


# -- the durations record ---------------------------------------------------------------------------

_slept = threading.local()
# "record": the controller's durations record (absent in an xdist worker); "cpu": this process's _CpuAccount
_STORE: dict = {}
_real_sleep = time.sleep


def _counting_sleep(seconds: float) -> None:
    # time.sleep as the tests see it: the main thread's sleeps are added up per test (a sleep in another
    # thread, in Spark's Python workers or in a subprocess is not counted)
    if threading.current_thread() is threading.main_thread():
        _slept.total = getattr(_slept, "total", 0.0) + max(0.0, float(seconds))
    _real_sleep(seconds)


class _CpuAccount:
    """The CPU seconds of this pytest process and of every process it starts (Spark drivers and their JVMs
    and Python workers, brokers, subprocesses): a cgroup (v1, ``cpuacct``) of its own, made inside the one
    the process is in, which children inherit. Each test phase's CPU seconds go into its record. The suite
    is bound by 2 cores: wall seconds rank what waits, CPU seconds what the workers share. A broker a
    worker started counts in the test running when it works (for a shared broker, mostly the test that
    sends it traffic). Where no cgroup can be made (not root, no cpuacct), nothing is counted."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self, name: str) -> None:
        self.group: Path | None = None
        self.parent: Path | None = None
        try:
            here = next(line.split(":", 2)[2] for line in Path("/proc/self/cgroup").read_text().splitlines()
                        if "cpuacct" in line.split(":", 2)[1].split(","))
            self.parent = self.ROOT / here.strip("/")
            group = self.parent / f"spark-mq-tests-{name}-{os.getpid()}"
            group.mkdir(exist_ok=True)
            (group / "cgroup.procs").write_text(str(os.getpid()))
            self.group = group
        except (OSError, StopIteration):
            self.group = None
        self.mark = self.now()

    def now(self) -> float | None:
        if self.group is None:
            return None
        try:
            return int((self.group / "cpuacct.usage").read_text()) / 1e9
        except OSError:
            return None

    def since_mark(self) -> float | None:
        now = self.now()
        took = None if now is None or self.mark is None else now - self.mark
        self.mark = now
        return took

    def close(self) -> None:
        if self.group is None:
            return
        try:  # back to the group the process came from; the group goes once empty
            (self.parent / "cgroup.procs").write_text(str(os.getpid()))
            self.group.rmdir()
        except OSError:
            pass  # a process it started is still alive: the empty group is left to the machine
        self.group = None


def pytest_configure(config: pytest.Config) -> None:
    time.sleep = _counting_sleep
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    _STORE["cpu"] = _CpuAccount(worker)
    if not config.pluginmanager.has_plugin("spark-mq-fixture-timer"):
        config.pluginmanager.register(_FixtureTimer(), "spark-mq-fixture-timer")
    config._spark_mq_durations = {"tests": {}, "started": time.time(), "t0": time.monotonic()}


class _FixtureTimer:
    """Each fixture's set-up time, into the record of the test that caused it. A plugin of its own, not a
    hook of this conftest: pytest calls a session-scoped fixture's set-up hook through the session's
    hooks, which see only the conftest files of the root directory."""

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        t0 = time.monotonic()
        yield
        took = time.monotonic() - t0
        item = getattr(request, "_pyfuncitem", None)
        if item is not None and took >= FIXTURE_RECORD_MIN:
            item.user_properties.append(("fixture", [fixturedef.argname, fixturedef.scope, round(took, 3)]))


def pytest_unconfigure(config: pytest.Config) -> None:
    cpu = _STORE.pop("cpu", None)
    if cpu is not None:
        cpu.close()


def pytest_runtest_logstart(nodeid: str, location) -> None:
    # the CPU a test costs starts with its setup, not with whatever ran since the last one
    cpu = _STORE.get("cpu")
    if cpu is not None:
        cpu.since_mark()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    # before the report is made from the item: what this phase slept, cost and which brokers it started
    slept = getattr(_slept, "total", 0.0)
    _slept.total = 0.0
    if slept:
        item.user_properties.append(("slept", [call.when, round(slept, 3)]))
    cpu = _STORE["cpu"].since_mark() if "cpu" in _STORE else None
    if cpu is not None:
        item.user_properties.append(("cpu", [call.when, round(cpu, 3)]))
    starts = getattr(item.config, "_spark_mq_broker_starts", None)
    while starts:
        kind, seconds = starts.pop(0)
        item.user_properties.append(("broker-start", [kind, call.when, round(seconds, 3)]))
    yield


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    store = _STORE.get("record")
    if store is None:
        return
    nodeid = plain_nodeid(report.nodeid)
    entry = store["tests"].setdefault(nodeid, {"nodeid": nodeid, "setup": 0.0, "call": 0.0, "teardown": 0.0,
                                               "outcome": "passed"})
    entry[report.when] = round(report.duration, 3)
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", None) or getattr(report, "worker_id", None)
    if report.failed:
        # a failure is written out as it comes (xdist prints the details only when the run ends)
        with open(store["failures"], "a") as f:
            f.write(f"==== {report.nodeid} ({report.when}, {worker})\n{report.longreprtext}\n\n")
        entry["outcome"] = "failed" if report.when == "call" else "error"
    elif report.skipped and entry["outcome"] == "passed":
        entry["outcome"] = "skipped"
    if worker:
        entry["worker"] = worker
    if report.when == "teardown":
        extras: dict[str, list] = {}
        for key, value in report.user_properties:
            if key in ("fixture", "slept", "broker-start", "cpu"):
                extras.setdefault(key, []).append(value)
        for key, values in extras.items():
            entry[key] = values


def _record_path() -> Path:
    return Path(os.environ.get(DURATIONS_ENV) or REPO / ".test-durations.json")


def pytest_sessionstart(session: pytest.Session) -> None:
    # the controller (or a run without xdist) keeps the record; workers only send their reports
    if not hasattr(session.config, "workerinput"):
        record = session.config._spark_mq_durations
        record["failures"] = _record_path().with_suffix(".failures")
        record["failures"].write_text("")
        _STORE["record"] = record


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return
    store = session.config._spark_mq_durations
    target = _record_path()
    record = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(store["started"])),
        "wall_seconds": round(time.monotonic() - store["t0"], 1),
        "exitstatus": int(exitstatus),
        "workers": _xdist_workers(session.config),
        "args": list(session.config.invocation_params.args),
        "tests": sorted(store["tests"].values(), key=lambda t: t["nodeid"]),
    }
    try:
        target.write_text(json.dumps(record, indent=0) + "\n")
    except OSError as exc:  # the record must never fail the run
        print(f"could not write the durations record {target}: {exc}")
