"""The Spark version matrix: the built wheel on every Spark 4 minor (latest patch), end to end.

For each release of ``scripts/spark_matrix.py`` (4.0.5, 4.1.4, 4.2.1, 4.3.0), in the release's own
virtual environment (``.venv-spark-<minor>``, made and cached by ``./dev``; 4.3 is the main venv,
where the whole suite runs too) with the wheel installed, three Spark driver processes run
``matrix_job.py`` against the harness's RabbitMQ (amqp08, stomp) and an embedded Malamute broker:

- ``connect``: a Spark Connect server of the release and a client: the formats resolve with no
  register call, ``register`` twice succeeds, a batch write and read go through;
- ``main``: the capabilities ``spark_mq.compat`` detects are the ones the matrix states; automatic
  registration, then ``register`` twice; batch write + batch read; stream read with
  ``maxMessagesPerTrigger`` into each format's stream sink; ``once`` and ``availableNow`` as
  documented for the release (docs/getting-started.md, "Spark versions"); an amqp08 stream read with
  ``ingest=executors`` and two lanes, every message once;
- then, in the same session, one query per format into a parquet sink, SIGKILLed (the whole process
  group) once each has committed batches and has more to read;
- ``resume``: the killed queries restarted from their checkpoints; every message in the sink exactly
  once. For the upgrade pairs (4.0 -> 4.1, 4.2 -> 4.3) the older release's ``resume`` also starts a
  second set of queries and is SIGKILLed mid-run; the newer release's ``resume`` continues them from
  the older release's checkpoint and source log, exactly once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

import brokers

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import build_dist  # noqa: E402
import spark_matrix  # noqa: E402
import sparkenv  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2700),
              pytest.mark.xdist_group("test_spark_versions")]  # one xdist worker: shared state (tests/conftest.py)

JOB = Path(__file__).with_name("matrix_job.py")
JOB_TIMEOUT = 600
# per format and killed query: 14 batches at maxMessagesPerTrigger=150. The kill waits until every format's
# query has committed two batches; with 1,050 (7 batches) the amqp08 upgrade query of 4.2.1 once read all of
# its messages while stomp and malamute got to 450, and the "killed mid-run" check failed (stop 56)
KILL_MESSAGES = 2100
FORMATS = ("amqp08", "stomp", "malamute")
STREAM_CAP = 200
TRIGGER_SENT, TRIGGER_CAP = 250, 100
# releases run side by side (see the ``lanes`` fixture), except under pytest-xdist: there the other
# workers' tests already keep both cores busy, and more at once only makes Spark's fixed 10 s wait for a
# new Python worker to connect back fail (tests/DURATIONS.md)
LANES = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2
LANE_TIMEOUT = 2600  # seconds a release's test waits for its run (the releases before it in its lane too)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, rabbitmq):
    """The wheel built once and installed into every older release's venv; the brokers; a run id."""
    wheel_dir = tmp_path_factory.mktemp("wheel")
    wheel = build_dist.build_wheel(wheel_dir)
    pythons = {}
    for r in spark_matrix.RELEASES:
        python = spark_matrix.ensure_venv(r)
        if not r.newest:  # the main venv holds the checkout, installed in editable mode by ./dev
            subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                           check=True, stdin=subprocess.DEVNULL, capture_output=True)
        pythons[r.version] = python
    with brokers.malamute_running(client_timeout=30.0) as malamute:
        yield {"pythons": pythons, "rabbitmq": rabbitmq, "malamute": malamute,
               "root": tmp_path_factory.mktemp("matrix"), "run": uuid.uuid4().hex[:8]}


def _names(run: str, version: str, upgrade_key: str) -> dict:
    names = {}
    for fmt in FORMATS:
        per = {k: f"mx-{run}-{version}-{fmt}-{k}" for k in ("batch", "stream_in", "stream_out", "once",
                                                            "availableNow", "kill", "connect", "executors")}
        per["upgrade"] = f"mx-{run}-{upgrade_key}-{fmt}-upgrade"
        names[fmt] = per
    return names


def _declare(rabbitmq, names: dict) -> None:
    import pika

    params = pika.URLParameters(rabbitmq.url("amqp"))
    with pika.BlockingConnection(params) as conn:
        ch = conn.channel()
        for queue in names["amqp08"].values():
            ch.queue_declare(queue, durable=True)


def _upgrade_pair(version: str):
    for older, newer in spark_matrix.UPGRADES:
        if version in (older, newer):
            return older, newer
    return None


class Job:
    """``matrix_job.py PHASE`` in a release's venv, in a process group of its own (JVM included)."""

    def __init__(self, python: Path, phase: str, config: Path, cwd: Path) -> None:
        self.phase = phase
        self.out_path = cwd / f"{phase}.out"
        self.err_path = cwd / f"{phase}.err"
        env = dict(os.environ, PYTHONUNBUFFERED="1", SPARK_LOCAL_IP="127.0.0.1")
        env.pop("PYTHONPATH", None)  # the wheel, not the checkout
        env.pop("SPARK_HOME", None)
        env["SPARK_SUBMIT_OPTS"] = sparkenv.spark_submit_options(python)  # this release's class archive
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen([str(python), str(JOB), phase, str(config)], cwd=cwd, env=env, stdout=out,
                                         stderr=err, stdin=subprocess.DEVNULL, start_new_session=True)

    def text(self) -> str:
        return self.out_path.read_text(errors="replace")

    def reports(self) -> list:
        return [json.loads(line[len("REPORT "):]) for line in self.text().splitlines() if line.startswith("REPORT ")]

    def failure(self, why: str) -> AssertionError:
        err = self.err_path.read_text(errors="replace")
        causes = [ln for ln in err.splitlines() if ("Error" in ln or "Exception" in ln) and " INFO " not in ln
                  and not ln.lstrip().startswith("at ")]
        return AssertionError(f"matrix {self.phase}: {why}\nstdout:\n{self.text()[-3000:]}\nerrors:\n"
                              + "\n".join(causes[:30]) + f"\nstderr tail:\n{err[-3000:]}")

    def wait(self) -> list:
        try:
            rc = self.proc.wait(JOB_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            raise self.failure(f"no end within {JOB_TIMEOUT} s") from None
        if rc != 0:
            raise self.failure(f"exit {rc}")
        return self.reports()

    def wait_ready_and_kill(self) -> list:
        deadline = time.monotonic() + JOB_TIMEOUT
        while "\nREADY" not in "\n" + self.text():
            if self.proc.poll() is not None:
                raise self.failure(f"exit {self.proc.returncode} before READY")
            if time.monotonic() > deadline:
                self.kill()
                raise self.failure("no READY in time")
            time.sleep(0.2)
        self.kill()
        return self.reports()

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the driver and its JVM and Python workers: a crash
        except ProcessLookupError:
            pass
        self.proc.wait(30)


def _one(reports: list, what: str, **match) -> dict:
    found = [r for r in reports if r["what"] == what and all(r.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (what, match, reports)
    return found[0]


def _check_main(r: spark_matrix.Release, reports: list) -> None:
    caps = {k: v for k, v in _one(reports, "capabilities").items() if k != "what"}
    assert caps == r.capabilities(), f"pyspark {r.version}: spark_mq.compat detected {caps}"
    assert _one(reports, "auto_registration")["result"] == {fmt: "ok" for fmt in FORMATS}
    _one(reports, "register_twice")
    for fmt in FORMATS:
        rw = _one(reports, "batch_write_read", format=fmt)
        assert rw["exact"] and rw["read"] == rw["sent"], rw
        stream = _one(reports, "stream_read_write", format=fmt)
        assert stream["exact"], stream
        assert sum(stream["batches"]) == 600 and max(stream["batches"]) <= STREAM_CAP, stream
        for trigger in ("once", "availableNow"):
            run = _one(reports, "trigger", format=fmt, trigger=trigger)
            assert run["finished"] and not run["error"], run
            assert run["exact_prefix"], run
            if trigger == "availableNow" and r.available_now:
                # many batches, each within the cap, up to everything available at start
                assert run["rows"] == TRIGGER_SENT and max(run["batches"]) <= TRIGGER_CAP, run
                assert len(run["batches"]) >= TRIGGER_SENT // TRIGGER_CAP, run
            else:
                # one batch holding everything available at start (docs/getting-started.md, "Spark versions")
                assert run["batches"] == [TRIGGER_SENT] and run["rows"] == TRIGGER_SENT, run
    executors = _one(reports, "executors_stream", format="amqp08")  # ingest on the executors, every release
    assert executors["exact"] and executors["read"] == executors["sent"] == 400 and not executors["error"], executors


def _check_connect(reports: list) -> None:
    assert _one(reports, "connect_session")["module"].startswith("pyspark.sql.connect")
    assert _one(reports, "connect_auto_registration")["result"] == {fmt: "ok" for fmt in FORMATS}
    twice = _one(reports, "connect_register_twice")
    assert twice["first"] == twice["second"] == list(FORMATS), twice
    for fmt in ("amqp08", "malamute"):
        rw = _one(reports, "connect_write_read", format=fmt)
        assert rw["exact"] and rw["read"] == rw["sent"], rw


def _check_exact(reports: list, what: str) -> None:
    for fmt in FORMATS:
        got = [x for x in reports if x["what"] == what and x["format"] == fmt]
        assert len(got) == 1, (what, fmt, reports)
        assert got[0]["exact"] and got[0]["rows"] == got[0]["sent"] == got[0]["distinct"], got[0]


def _run_release(matrix: dict, version: str) -> None:
    r = spark_matrix.release(version)
    pair = _upgrade_pair(version)
    upgrade_key = "-".join(pair) if pair else version
    work = matrix["root"] / version
    work.mkdir()
    shared = matrix["root"] / f"upgrade-{upgrade_key}"
    shared.mkdir(exist_ok=True)
    names = _names(matrix["run"], version, upgrade_key)
    _declare(matrix["rabbitmq"], names)
    config = {
        "uris": {"amqp08": matrix["rabbitmq"].url("amqp"), "stomp": matrix["rabbitmq"].url("stomp"),
                 "malamute": matrix["malamute"].endpoint},
        "names": names, "work": str(work), "shared": str(shared), "kill_messages": KILL_MESSAGES,
        "upgrade_from": bool(pair and pair[1] == version), "upgrade_to": bool(pair and pair[0] == version),
    }
    path = work / "config.json"
    path.write_text(json.dumps(config))
    python = matrix["pythons"][version]

    # the Connect server and client run beside the classic session: both wait on JVMs and brokers
    # more than they compute, and side by side they take less time than one after the other
    connect = Job(python, "connect", path, work)
    main = Job(python, "main", path, work)
    try:
        killed = main.wait_ready_and_kill()
        _one(killed, "main_done")
        _check_main(r, killed)
        _check_connect(connect.wait())
    finally:
        connect.kill()
    ready = _one(killed, "kill_ready")["counts"]
    assert all(0 < n < KILL_MESSAGES for n in ready.values()), f"killed mid-run: {ready}"

    resume = Job(python, "resume", path, work)
    reports = resume.wait_ready_and_kill() if config["upgrade_to"] else resume.wait()
    _check_exact(reports, "kill_resume")
    if config["upgrade_from"]:
        _check_exact(reports, "upgrade_resume")
    if config["upgrade_to"]:
        left = _one(reports, "upgrade_ready")["counts"]
        assert all(0 < n < KILL_MESSAGES for n in left.values()), f"upgrade queries killed mid-run: {left}"


@pytest.fixture(scope="module")
def lanes(matrix):
    """Every release's run, started at once in lanes: an upgrade pair is one lane (the newer release
    continues the older one's queries), and the lanes run side by side. Each release's outcome is a
    Future its test waits for. A release's processes wait on JVM start-ups, brokers and trigger
    intervals more than they compute, so two lanes on 2 cores take less time than one after the other."""
    futures = {r.version: Future() for r in spark_matrix.RELEASES}

    def run_lane(versions) -> None:
        for version in versions:
            try:
                _run_release(matrix, version)
            except BaseException as exc:  # noqa: BLE001 - handed to the release's test
                futures[version].set_exception(exc)
            else:
                futures[version].set_result(None)

    pool = ThreadPoolExecutor(max_workers=LANES, thread_name_prefix="spark-matrix")
    for versions in spark_matrix.lanes():
        pool.submit(run_lane, versions)
    try:
        yield futures
    finally:
        pool.shutdown(wait=True)


@pytest.mark.parametrize("version", [r.version for r in spark_matrix.RELEASES])
def test_release_end_to_end(lanes, version):
    lanes[version].result(timeout=LANE_TIMEOUT)
