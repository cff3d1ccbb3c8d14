"""spark-mq on real multi-process Spark deployments, started from the pip-installed pyspark alone:

- a standalone cluster on loopback: one master and two workers, each its own JVM
  (``bin/spark-class org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), and a driver
  submitted with ``bin/spark-submit --master spark://...``. The job streams from a Malamute stream to a
  Malamute stream with the source log on a path every process shares, with two executors.
- Spark Connect: a Connect server (``SparkConnectServer`` through ``spark-submit``) and a client
  session (``SparkSession.builder.remote``) in a separate process that registers the formats and
  runs the same pipeline. The server's Python workers import spark_mq from this environment.

Every process is started with a timeout, waited for on its log line or port, and killed (process
group) at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import pyspark

PYSPARK_HOME = Path(pyspark.__file__).resolve().parent
SPARK_CLASS = PYSPARK_HOME / "bin" / "spark-class"
SPARK_SUBMIT = PYSPARK_HOME / "bin" / "spark-submit"
#: the job scripts' test helper (stream_round_trip), not part of the package: shipped with --py-files
BROKER_PROCESS = Path(__file__).resolve().parent / "broker_process.py"
START_TIMEOUT = 180
JOB_TIMEOUT = 400

pytestmark = [pytest.mark.timeout(900),
              pytest.mark.xdist_group("test_cluster")]  # one xdist worker: shared state (tests/conftest.py)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp: Path) -> dict:
    env = dict(os.environ)
    env.update({
        "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_HOME": str(PYSPARK_HOME),
        "SPARK_LOG_DIR": str(tmp / "logs"), "SPARK_WORKER_DIR": str(tmp / "work"), "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(tmp / "local"), "PYTHONUNBUFFERED": "1",
    })
    for name in ("logs", "work", "local"):
        (tmp / name).mkdir(exist_ok=True)
    return env


class Daemon:
    """A long-running Spark JVM (master, worker, Connect server) in its own process group."""

    def __init__(self, name: str, cmd: list, env: dict, tmp: Path) -> None:
        self.name = name
        self.log_path = tmp / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([str(c) for c in cmd], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, needle: str, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.text():
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.3)
        raise AssertionError(f"{self.name}: no {needle!r} within {timeout}s (exit {self.proc.poll()}); log tail:\n"
                             f"{self.text()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(15)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(10)
        self.log.close()


@pytest.fixture
def daemons():
    started: list[Daemon] = []
    yield started
    for d in reversed(started):
        d.stop()


def _run_job(cmd: list, env: dict, cwd: Path, what: str) -> dict:
    try:
        result = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, timeout=JOB_TIMEOUT,
                                stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{what} timed out:\n{(exc.stdout or b'').decode()[-3000:]}\n"
                             f"{(exc.stderr or b'').decode(errors='replace')[-5000:]}")
    out = result.stdout.decode()
    (cwd / "job.stdout").write_bytes(result.stdout)
    (cwd / "job.stderr").write_bytes(result.stderr)
    lines = [ln for ln in out.splitlines() if ln.startswith("REPORT ")]
    if result.returncode != 0 or not lines:
        err = result.stderr.decode(errors="replace")
        causes = [ln for ln in (out + err).splitlines() if ("Error" in ln or "Exception" in ln) and " INFO " not in ln
                  and not ln.lstrip().startswith("at ")]
        raise AssertionError(f"{what} failed (exit {result.returncode}):\n{out[-3000:]}\nerrors:\n"
                             + "\n".join(causes[:40]) + f"\nstderr tail:\n{err[-3000:]}")
    return json.loads(lines[-1][len("REPORT "):])


# The pipeline both tests run: Malamute stream "in" -> query (upper-case) -> Malamute stream "out".
PIPELINE = r'''
import json, os, sys, threading, time
from spark_mq.clients.malamute import MalamuteClient
from spark_mq.malamute_broker import Broker

def run_pipeline(spark, shared_dir, report, n=40, partitions=2):
    broker = Broker(["tcp://127.0.0.1:0"]).start()
    endpoint = broker.endpoints[0]
    consumer = MalamuteClient(endpoint, "checker")
    consumer.set_consumer("out", "")
    query = (spark.readStream.format("malamute").option("uri", endpoint).option("stream", "in")
             .option("logLocation", os.path.join(shared_dir, "source-log"))
             .option("numPartitions", str(partitions)).load()
             .selectExpr("upper(cast(body as string)) as body")
             .writeStream.format("malamute").option("uri", endpoint).option("stream", "out")
             .option("checkpointLocation", os.path.join(shared_dir, "checkpoint"))
             .trigger(processingTime="1 second").start())
    from broker_process import stream_round_trip
    report.update(stream_round_trip(endpoint, consumer, query, n, first_wait=240))
    report["batches"] = len(query.recentProgress)
    deadline = time.monotonic() + 15
    while query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.1)
    query.stop()
    consumer.close()
    broker.stop()
'''


def _check_pipeline(report: dict) -> None:
    assert report["query_exception"] is None, report["query_exception"]
    bodies = report["received"]
    assert len(bodies) >= 40 and all(b.startswith("M") for b in bodies), bodies
    numbers = sorted(int(b[1:]) for b in bodies)
    # from the first message the source saw to the last one sent: no gap, no duplicate
    assert numbers == list(range(numbers[0], report["last_sent"] + 1)), numbers


CLUSTER_JOB = PIPELINE + r'''
from pyspark.sql import SparkSession
spark = SparkSession.builder.appName("spark-mq cluster test").getOrCreate()
import spark_mq
spark_mq.register(spark)  # editable (development) installs are not auto-registered: pkgutil cannot see them
sc = spark.sparkContext
deadline = time.monotonic() + 120
while sc._jsc.sc().getExecutorMemoryStatus().size() < 3 and time.monotonic() < deadline:   # driver + 2
    time.sleep(0.5)
report = {"master": sc.master, "executors": sc._jsc.sc().getExecutorMemoryStatus().size() - 1}
# where Python work runs: one task per executor core, each reports its worker's host:port and pid
report["python_worker_pids"] = sorted(set(
    sc.parallelize(range(8), 8).map(lambda _: os.getppid()).collect()))
run_pipeline(spark, sys.argv[1], report)
spark.stop()
print("REPORT " + json.dumps(report))
'''


def _worker(url: str, i: int, env: dict, tmp: Path) -> Daemon:
    """Worker ``i`` on loopback address 127.0.0.<i>: each worker's executor is on a host of its own, as on
    a real cluster (Spark never runs a speculative copy of a task on the host of its first attempt)."""
    host = f"127.0.0.{i}"
    return Daemon(f"worker{i}", [SPARK_CLASS, "org.apache.spark.deploy.worker.Worker", url, "--host",
                                 host, "--cores", "1", "--memory", "1g", "--webui-port", _free_port(),
                                 "--work-dir", tmp / f"work{i}"], {**env, "SPARK_LOCAL_IP": host}, tmp)


def start_cluster(tmp_path: Path, daemons: list) -> tuple:
    """A master and two workers of one core each: ``(master URL, env, [worker1, worker2])``."""
    env = _env(tmp_path)
    master_port = _free_port()
    master = Daemon("master", [SPARK_CLASS, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", master_port, "--webui-port", _free_port()], env, tmp_path)
    daemons.append(master)
    master.wait_for("I have been elected leader")
    url = f"spark://127.0.0.1:{master_port}"
    workers = [_worker(url, i, env, tmp_path) for i in (1, 2)]
    daemons.extend(workers)
    for worker in workers:
        worker.wait_for("Successfully registered with master")
    return url, env, workers


def test_standalone_cluster_two_workers(tmp_path, daemons):
    url, env, _ = start_cluster(tmp_path, daemons)
    shared = tmp_path / "shared"
    shared.mkdir()
    job = tmp_path / "job.py"
    job.write_text(CLUSTER_JOB)
    report = _run_job([SPARK_SUBMIT, "--master", url, "--conf", "spark.ui.enabled=false",
                       "--conf", "spark.executor.memory=512m", "--conf", "spark.cores.max=2",
                       "--conf", "spark.sql.shuffle.partitions=2", "--conf", f"spark.pyspark.python={sys.executable}",
                       "--py-files", BROKER_PROCESS, job, shared], env, tmp_path, "spark-submit to the standalone cluster")
    assert report["master"] == url
    assert report["executors"] == 2
    # two executor JVMs, each with its own Python worker daemon
    assert len(report["python_worker_pids"]) == 2, report["python_worker_pids"]
    _check_pipeline(report)
    # the executors ran in the workers' JVMs: each worker has an executor directory of the app
    for i in (1, 2):
        apps = list((tmp_path / f"work{i}").glob("app-*/*/stderr"))
        assert apps, f"worker {i} ran no executor"


CONNECT_CLIENT = PIPELINE + r'''
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[2]).getOrCreate()
report = {"connect": type(spark).__module__}
import spark_mq
report["registered"] = spark_mq.register(spark)
report["schema"] = spark.read.format("malamute").option("uri", "tcp://127.0.0.1:1").option("stream", "s") \
    .load().schema.fieldNames()
run_pipeline(spark, sys.argv[1], report, partitions=1)
spark.stop()
print("REPORT " + json.dumps(report))
'''


def test_spark_connect_server_and_client(tmp_path, daemons):
    try:  # a missing client library fails the test (it does not skip)
        import grpc  # noqa: F401
        import pandas  # noqa: F401
    except ImportError as exc:
        raise AssertionError(f"the Spark Connect client needs pyspark[connect] (./dev setup installs it): {exc}")
    env = _env(tmp_path)
    port = _free_port()
    server = Daemon("connect", [SPARK_SUBMIT, "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
                                "--master", "local[2]", "--conf", f"spark.connect.grpc.binding.port={port}",
                                "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
                                "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
                                "--conf", f"spark.pyspark.python={sys.executable}", "spark-internal"], env, tmp_path)
    daemons.append(server)
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        with socket.socket() as s:
            s.settimeout(1)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if server.proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the Connect server did not listen on {port}:\n{server.text()[-4000:]}")
        time.sleep(0.5)
    shared = tmp_path / "shared"
    shared.mkdir()
    client = tmp_path / "client.py"
    client.write_text(CONNECT_CLIENT)
    # a plain Python client: its test helper (stream_round_trip) comes from PYTHONPATH
    client_env = dict(env, PYTHONPATH=os.pathsep.join(p for p in (str(BROKER_PROCESS.parent), env.get("PYTHONPATH"))
                                                       if p))
    report = _run_job([sys.executable, client, shared, f"sc://127.0.0.1:{port}"], client_env, tmp_path,
                      "the Spark Connect client")
    assert report["connect"].startswith("pyspark.sql.connect")
    assert report["registered"] == ["amqp08", "stomp", "malamute"]
    assert {"body", "subject", "frames", "offset"} <= set(report["schema"])
    _check_pipeline(report)


# -- ingest on the executors (option ingest=executors) ---------------------------------------------

# The streaming job: two queues (destinations), four consumers on the executors, into an idempotent
# file sink (one file per batch id, replaced whole). Mode "stream" runs until killed; mode "final"
# restarts from the checkpoint, runs until the sink holds ``expected`` rows and two batches more,
# and reports every row the sink holds.
EXECUTORS_JOB = r'''
import json, os, sys, time
from pyspark.sql import SparkSession
fmt, url, dests, shared, mode, expected = sys.argv[1:7]
spark = SparkSession.builder.appName("spark-mq executor ingest " + mode).getOrCreate()
import spark_mq
spark_mq.register(spark)
out = os.path.join(shared, "out")
os.makedirs(out, exist_ok=True)

def straggle(index, rows):
    # with speculation on (STRAGGLER set): the first attempt of each batch's first task is slow, so that
    # Spark marks it speculatable whatever this machine's timing (its lanes' tasks may finish together)
    from pyspark import TaskContext
    if index == 0 and TaskContext.get().attemptNumber() == 0:
        time.sleep(1.5)
    return rows

def sink(df, batch_id):
    bodies = df.select("body")
    if os.environ.get("STRAGGLER"):
        rows = [r.body.decode() for r in bodies.rdd.mapPartitionsWithIndex(straggle).collect()]
    else:
        rows = [r.body.decode() for r in bodies.collect()]
    tmp = os.path.join(out, f".{batch_id}.tmp")
    with open(tmp, "w") as f:
        json.dump(rows, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(out, f"{batch_id}.json"))

def held():
    bodies = []
    for name in os.listdir(out):
        if name.endswith(".json"):
            with open(os.path.join(out, name)) as f:
                bodies += json.load(f)
    return bodies

df = (spark.readStream.format(fmt).option("uri", url).option("queue" if fmt == "amqp08" else "destination", dests)
      .option("ingest", "executors").option("consumers", "4")
      .option("taskMaxMessages", "150").option("taskIngestTime", "1s")
      .option("logLocation", os.path.join(shared, "log")).load())
q = (df.writeStream.foreachBatch(sink).option("checkpointLocation", os.path.join(shared, "ckpt"))
     .trigger(processingTime="200 milliseconds").start())
if mode == "stream":
    q.awaitTermination(600)
    sys.exit(0)
deadline = time.monotonic() + 300
while len(held()) < int(expected) and q.exception() is None and time.monotonic() < deadline:
    time.sleep(0.5)
then = q.lastProgress["batchId"] if q.lastProgress else -1
while q.exception() is None and time.monotonic() < deadline and \
        (q.lastProgress["batchId"] if q.lastProgress else -1) < then + 2:
    time.sleep(0.2)
exc = q.exception()
q.stop()
print("REPORT " + json.dumps({"bodies": held(), "exception": str(exc) if exc else None}))
'''


def _publish_two(fmt: str, broker, dests: list, count: int) -> None:
    from spark_mq.clients.amqp08 import BasicProperties, Connection
    from spark_mq.clients.stomp import StompClient
    if fmt == "amqp08":
        with Connection.from_url(broker.url("amqp")) as conn:
            ch = conn.channel()
            for d in dests:
                ch.queue_declare(d, durable=True)
                ch.publish_many(("", d, f"{d}:{i}".encode(), BasicProperties(delivery_mode=2)) for i in range(count))
                ch.queue_declare(d, passive=True)
        return
    with StompClient.from_uri(broker.url("stomp")) as client:
        for d in dests:
            for i in range(count):
                client.send(d, f"{d}:{i}".encode(), headers={"persistent": "true"})
        client.flush()


SPECULATION = ["--conf", "spark.speculation=true", "--conf", "spark.speculation.interval=100ms",
               "--conf", "spark.speculation.quantile=0.25", "--conf", "spark.speculation.multiplier=1.0",
               "--conf", "spark.speculation.minTaskRuntime=100ms",
               # on by default since Spark 3.4: a task past the threshold is then speculated only if its rate of
               # records is low or it runs twice the threshold, which a lane's short tasks rarely did (CI run of
               # stop 55: no task of a whole amqp08 run was marked speculatable)
               "--conf", "spark.speculation.efficiency.enabled=false"]


# stomp: on ActiveMQ. A case without speculation (amqp08) was merged into amqp08-speculation: every check
# of it is made there, where only each batch's first task straggles and the others run as they would
# without speculation (the suite's time, issue 56)
@pytest.mark.parametrize("case", ["amqp08-speculation", "stomp-speculation"])
def test_executor_ingest_survives_a_worker_and_a_driver_sigkill(tmp_path, daemons, request, unique_name, case):
    """Two queues, four consumers ingesting on the executors of a two-worker cluster: one worker
    (its JVM, executor and Python workers) is SIGKILLed mid-run, then the driver mid-batch; the query
    restarted from its checkpoint ends with every message exactly once in an idempotent file sink.
    With speculation on, slow tasks (a lane that finds its queue empty drains for taskIngestTime)
    get a second attempt: the first to link its batch file wins, the other gives its deliveries back."""
    from killing import committed_batches, kill_group, mid_batch

    from spark_mq.clients.amqp08 import Connection

    fmt = case.split("-")[0]
    speculation = case.endswith("speculation")
    # stomp on ActiveMQ: ingest=executors refuses RabbitMQ's STOMP adapter (spark_mq.sources.executors)
    broker = request.getfixturevalue("rabbitmq" if fmt == "amqp08" else "activemq")
    per_queue = 3000  # 10 batches of at most 4 x 150: the first run must not read it all before its kills
    if fmt == "amqp08":
        dests, url = [unique_name("xc"), unique_name("xd")], broker.url("amqp")
    else:
        dests, url = ["/queue/" + unique_name("xc"), "/queue/" + unique_name("xd")], broker.url("stomp")
    _publish_two(fmt, broker, dests, per_queue)
    expected = sorted(f"{d}:{i}" for d in dests for i in range(per_queue))
    master, env, workers = start_cluster(tmp_path, daemons)
    if speculation:
        env = {**env, "STRAGGLER": "1"}
    shared = tmp_path / "shared"
    shared.mkdir()
    job = tmp_path / "job.py"
    job.write_text(EXECUTORS_JOB)
    cmd = [SPARK_SUBMIT, "--master", master, "--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=512m",
           "--conf", "spark.cores.max=2", "--conf", "spark.sql.shuffle.partitions=2",
           "--conf", f"spark.pyspark.python={sys.executable}", *(SPECULATION if speculation else []),
           job, fmt, url, ",".join(dests), shared]
    ckpt = shared / "ckpt"
    with open(tmp_path / "stream.log", "wb") as out:
        proc = subprocess.Popen([str(c) for c in cmd + ["stream", len(expected)]], env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=tmp_path)
        try:
            def until(what, predicate, timeout=240):
                deadline = time.monotonic() + timeout
                while not predicate():
                    if proc.poll() is not None:
                        raise AssertionError(f"the job exited ({proc.returncode}) waiting for {what}; see {tmp_path}/stream.log")
                    assert time.monotonic() < deadline, f"no {what} within {timeout}s; see {tmp_path}/stream.log"
                    time.sleep(0.05)

            until("two committed batches", lambda: committed_batches(ckpt) >= 2)
            os.killpg(workers[0].proc.pid, signal.SIGKILL)  # the worker, its executor and Python workers
            workers[0].proc.wait(30)
            done = committed_batches(ckpt)
            until("a batch after the worker's death", lambda: committed_batches(ckpt) >= done + 2)
            until("a batch in flight", lambda: mid_batch(ckpt))
            time.sleep(0.3)
        finally:
            kill_group(proc)
    assert len(set(sum((json.load(open(f)) for f in (shared / "out").glob("*.json")), []))) < len(expected), \
        "the first run read everything before its kills"
    report = _run_job(cmd + ["final", len(expected)], env, tmp_path, "the restarted executor-ingest query")
    assert report["exception"] is None, report["exception"]
    assert sorted(report["bodies"]) == expected, (len(report["bodies"]), len(expected))
    driver_log = (tmp_path / "stream.log").read_text(errors="replace") + (tmp_path / "job.stderr").read_text(errors="replace")
    if speculation:
        # Spark found tasks to speculate on: the job's sink makes each batch's first task straggle in its first
        # attempt (left to this machine's timing, a whole amqp08 run had none: CI of stop 57). Whether a copy
        # runs depends on a free core at that moment (seen: copies ran and the first attempts were killed in the
        # amqp08 runs, none in one ActiveMQ run); the race of two attempts to link is forced in
        # test_sources_executors.py
        assert "as speculatable" in driver_log, "speculation was on, but Spark marked no task speculatable"
        copies = len(re.findall(r"Starting task \d+\.1 in stage", driver_log))
        lost = sum(p.read_text(errors="replace").count("another attempt wrote the batch first")
                   for p in tmp_path.glob("work*/app-*/*/stderr"))
        print(f"speculative copies started: {copies}; attempts that lost the link: {lost}")
    if fmt == "amqp08":
        with Connection.from_url(broker.url("amqp")) as conn:
            ch = conn.channel()
            left = [ch.queue_declare(d, passive=True).message_count for d in dests]
        assert left == [0, 0], left
