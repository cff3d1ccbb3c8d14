"""One step of the Spark version matrix, run by a matrix venv's python with the built wheel installed.

Run by tests/integration/test_spark_versions.py, never collected by pytest (no ``test_`` prefix) and
never importing from the checkout: what runs is the wheel, as a user would install it.

    python matrix_job.py PHASE CONFIG.json

Phases (each one SparkSession, ``local[2]``, all three formats):
- ``connect``: a Spark Connect server of the release and a client session: automatic registration,
  ``register`` twice, a batch write and read.
- ``main``: automatic registration, then ``spark_mq.register`` twice; batch write and batch read;
  stream read with ``maxMessagesPerTrigger`` into the format's stream sink; ``trigger(once=True)``;
  ``trigger(availableNow=True)``; an amqp08 stream read with ``ingest=executors`` (two lanes); then it starts one query per format (source -> parquet file sink,
  small batches) and prints ``READY`` once each has committed batches and has more to read; the
  test then SIGKILLs it (the whole process group: a driver crash).
- ``resume``: restarts the ``kill`` queries from their checkpoints, and the upgrade queries a ``resume``
  on an older release left mid-run (when the config names them), side by side, runs them until every
  message is in the sink, and reports what the sinks hold; finally, when the config asks
  for it, starts the upgrade queries for the next release and exits without stopping them (a kill).
Results go to stdout as ``REPORT <json>`` lines.
"""

from __future__ import annotations

import json
import os
import sys
import time

CONFIG = json.loads(open(sys.argv[2]).read())
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable

from pyspark.sql import SparkSession  # noqa: E402
from pyspark.sql import functions as F  # noqa: E402

WAIT = 240.0  # seconds a query may take to reach its count (a busy 2-core machine)
FORMATS = ("amqp08", "stomp", "malamute")


def report(what: str, **data) -> None:
    print("REPORT " + json.dumps({"what": what, **data}), flush=True)


def session() -> SparkSession:
    # local[2,4]: a task is tried up to 4 times, as on a cluster. Spark waits a fixed 10 s for a new
    # Python worker to connect back (PythonWorkerFactory, not configurable); with two releases side by
    # side on 2 cores that can pass, and local mode would otherwise fail the query on the first try
    return (SparkSession.builder.master("local[2,4]").appName(f"spark-mq-matrix-{sys.argv[1]}")
            .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
            # a busy 2-core machine (two releases run side by side) can take longer than the 15 s
            # default to start a Python worker
            .config("spark.python.authenticate.socketTimeout", "120s")
            .getOrCreate())


def target(fmt: str, name: str) -> dict:
    """Options naming destination ``name`` of format ``fmt`` (the test made the AMQP queues)."""
    uri = CONFIG["uris"][fmt]
    if fmt == "amqp08":
        return {"uri": uri, "queue": name, "exchange": "", "routingKey": name}
    if fmt == "stomp":
        return {"uri": uri, "destination": f"/queue/{name}"}
    return {"uri": uri, "mailbox": name}


def source_options(fmt: str, name: str) -> dict:
    opts = target(fmt, name)
    opts.pop("exchange", None)
    opts.pop("routingKey", None)
    return opts


def sink_options(fmt: str, name: str) -> dict:
    opts = target(fmt, name)
    opts.pop("queue", None)
    return opts


def bodies(prefix: str, n: int) -> list:
    return [f"{prefix}-{i:06d}" for i in range(n)]


def batch_write(spark, fmt: str, name: str, values: list) -> None:
    df = spark.createDataFrame([(v,) for v in values], "body string").repartition(2)
    df.write.format(fmt).options(**sink_options(fmt, name)).mode("append").save()


def batch_read(spark, fmt: str, name: str, expect: int) -> list:
    """Every body in ``name`` (a batch read drains what is there; read again until ``expect`` came)."""
    got: list = []
    deadline = time.monotonic() + 60
    while len(got) < expect and time.monotonic() < deadline:
        rows = (spark.read.format(fmt).options(**source_options(fmt, name)).option("quietPeriod", "0.5s")
                .load().select(F.col("body").cast("string").alias("b")).collect())
        got += [r.b for r in rows]
    return got


def sorted_progress(query) -> list:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]


def wait_rows(query, count_fn, expect: int, what: str) -> int:
    deadline = time.monotonic() + WAIT
    n = count_fn()
    while n < expect:
        if query.exception() is not None:
            raise RuntimeError(f"{what}: the query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: {n} of {expect} rows after {WAIT:.0f} s")
        time.sleep(0.5)
        n = count_fn()
    return n


def started(query, what: str) -> None:
    """Wait until ``query`` has reported a batch or ended: its Python source process is up. Queries that run
    side by side are started one after the other: Spark gives a new Python source process a fixed 10 s to
    connect back (PythonWorkerFactory.createSimpleWorker), and several spawned at once on a busy 2-core
    machine can miss it (a full run of issue 56 did, with six started together)."""
    deadline = time.monotonic() + WAIT
    while not query.recentProgress and query.isActive:
        if query.exception() is not None:
            raise RuntimeError(f"{what}: the query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: no batch after {WAIT:.0f} s")
        time.sleep(0.1)


# -- main ----------------------------------------------------------------------------------------

def auto_registered(spark, fmt: str) -> str:
    """Before any register call: does format(fmt) resolve? It does when pyspark registered the wheel's
    ``pyspark_<fmt>`` module itself; our option check then answers, not Spark's lookup."""
    try:
        spark.read.format(fmt).option("noSuchOption", "1").load().schema  # Spark Connect analyses lazily
    except Exception as exc:  # noqa: BLE001 - the message says who answered
        text = str(exc)
        if "nosuchoption" in text.lower():
            return "ok"
        return text[:400]
    return "loaded without an error"


def main(spark) -> None:
    import spark_mq
    from spark_mq.compat import CAPS

    report("capabilities", **CAPS.as_dict())
    report("auto_registration", result={fmt: auto_registered(spark, fmt) for fmt in FORMATS})
    spark_mq.register(spark)
    spark_mq.register(spark)  # twice, after the automatic registration: never an error
    report("register_twice", result="ok")
    work = CONFIG["work"]
    for fmt in FORMATS:  # batch write, then batch read
        name = CONFIG["names"][fmt]["batch"]
        values = bodies(f"{fmt}-bw", 300)
        batch_write(spark, fmt, name, values)
        got = batch_read(spark, fmt, name, len(values))
        report("batch_write_read", format=fmt, sent=len(values), read=len(got), exact=sorted(got) == values)

    # stream read with maxMessagesPerTrigger into the format's stream sink, the three formats' queries side
    # by side (each waits on its trigger more than it computes)
    streams = {}
    for fmt in FORMATS:
        names = CONFIG["names"][fmt]
        streams[fmt] = (spark.readStream.format(fmt).options(**source_options(fmt, names["stream_in"]))
                        .option("logLocation", f"{work}/{fmt}-stream-log").option("maxMessagesPerTrigger", 200).load()
                        .select("body").writeStream.format(fmt).options(**sink_options(fmt, names["stream_out"]))
                        .option("checkpointLocation", f"{work}/{fmt}-stream-ckpt")
                        .trigger(processingTime="500 milliseconds").start())
        started(streams[fmt], f"{fmt} stream")
    try:
        # sent once the query runs: on a Spark without availableNow support the first batch of a run
        # takes the whole backlog present at its start (docs/getting-started.md, "Spark versions"), later ones obey the cap
        for fmt, query in streams.items():
            wait_rows(query, lambda q=query: len(q.recentProgress), 1, f"{fmt} stream start")
        for fmt in FORMATS:
            batch_write(spark, fmt, CONFIG["names"][fmt]["stream_in"], bodies(f"{fmt}-sr", 600))
        for fmt, query in streams.items():
            wait_rows(query, lambda q=query: sum(sorted_progress(q)), 600, f"{fmt} stream")
    finally:
        for query in streams.values():
            query.stop()
    for fmt, query in streams.items():
        values = bodies(f"{fmt}-sr", 600)
        got = batch_read(spark, fmt, CONFIG["names"][fmt]["stream_out"], len(values))
        report("stream_read_write", format=fmt, batches=sorted_progress(query), cap=200, read=len(got),
               exact=sorted(got) == values)

    # the one-batch triggers: once, and availableNow (many batches only where Spark supports it), every
    # format's two queries side by side
    runs = {}
    for fmt in FORMATS:
        for trigger in ("once", "availableNow"):
            name = CONFIG["names"][fmt][trigger]
            batch_write(spark, fmt, name, bodies(f"{fmt}-{trigger}", 250))
            runs[fmt, trigger] = (spark.readStream.format(fmt).options(**source_options(fmt, name))
                                  .option("logLocation", f"{work}/{fmt}-{trigger}-log").option("maxMessagesPerTrigger", 100)
                                  .load().select(F.col("body").cast("string").alias("b"))
                                  .writeStream.format("memory").queryName(f"{fmt}_{trigger}")
                                  .option("checkpointLocation", f"{work}/{fmt}-{trigger}-ckpt")
                                  .trigger(**{trigger: True}).start())
            started(runs[fmt, trigger], f"{fmt} {trigger}")
    deadline = time.monotonic() + WAIT
    for (fmt, trigger), query in runs.items():
        finished = query.awaitTermination(max(1.0, deadline - time.monotonic()))
        if not finished:
            query.stop()
        values = bodies(f"{fmt}-{trigger}", 250)
        rows = sorted(r.b for r in spark.table(f"{fmt}_{trigger}").collect())
        report("trigger", format=fmt, trigger=trigger, finished=bool(finished), batches=sorted_progress(query),
               rows=len(rows), exact_prefix=rows == values[:len(rows)], error=str(query.exception() or ""))

    # ingest on the executors (amqp08: stomp here is RabbitMQ's adapter, which that placement refuses, and
    # Malamute has no acks): two lanes consume in each batch's tasks
    values = bodies("amqp08-executors", 400)
    batch_write(spark, "amqp08", CONFIG["names"]["amqp08"]["executors"], values)
    query = (spark.readStream.format("amqp08").options(**source_options("amqp08", CONFIG["names"]["amqp08"]["executors"]))
             .option("logLocation", f"{work}/amqp08-executors-log").option("ingest", "executors")
             .option("consumers", 2).option("taskIngestTime", "0.5s").load()
             .select(F.col("body").cast("string").alias("b")).writeStream.format("memory")
             .queryName("amqp08_executors").option("checkpointLocation", f"{work}/amqp08-executors-ckpt")
             .trigger(processingTime="200 milliseconds").start())
    try:
        wait_rows(query, lambda: sum(sorted_progress(query)), len(values), "amqp08 ingest=executors")
    finally:
        query.stop()
    rows = sorted(r.b for r in spark.table("amqp08_executors").collect())
    report("executors_stream", format="amqp08", sent=len(values), read=len(rows), exact=rows == values,
           error=str(query.exception() or ""))


# -- kill / resume -------------------------------------------------------------------------------

def base(key: str) -> str:
    """Where a query's log, checkpoint and output live: the upgrade queries in the directory shared
    by the two releases of an upgrade pair, the others in this release's own."""
    return CONFIG["shared"] if key.startswith("upgrade-") else CONFIG["work"]


# the killed runs read in small batches, so that a kill finds batches done and more to do; a restart reads
# what is left in larger ones (a source's limit may change between runs: Spark does not keep it)
KILLED_RUN_CAP = 150
RESUME_CAP = 1000


def start_file_query(spark, fmt: str, name: str, key: str, cap: int = KILLED_RUN_CAP):
    work = base(key)
    return (spark.readStream.format(fmt).options(**source_options(fmt, name))
            .option("logLocation", f"{work}/{key}-log").option("maxMessagesPerTrigger", cap).load()
            .select(F.col("body").cast("string").alias("b"))
            .writeStream.format("parquet").option("path", f"{work}/{key}-out")
            .option("checkpointLocation", f"{work}/{key}-ckpt").trigger(processingTime="300 milliseconds").start())


def file_count(spark, path: str) -> int:
    try:
        return spark.read.parquet(path).count()
    except Exception:  # noqa: BLE001 - nothing written yet
        return 0


def committed_batches(ckpt: str) -> int:
    try:
        return len([n for n in os.listdir(os.path.join(ckpt, "commits")) if n.isdigit()])
    except FileNotFoundError:
        return 0


def run_to_end_and_report(spark, queries: dict) -> None:
    """Restart each query of ``queries`` (key -> (what, fmt, name, expected bodies)) from its checkpoint,
    all side by side, run each until its sink holds as many rows as were sent, and report what the sink
    holds under the query's ``what``."""
    running = {}
    restarts = {key: 0 for key in queries}
    for key, (_, fmt, name, _) in queries.items():  # one after the other: see started()
        running[key] = start_file_query(spark, fmt, name, key, RESUME_CAP)
        try:
            started(running[key], key)
        except RuntimeError as exc:
            if "failed to connect back" not in str(exc):
                raise
            restarts[key] += 1
            running[key] = start_file_query(spark, fmt, name, key, RESUME_CAP)
    try:
        for key, (what, fmt, name, values) in queries.items():
            while True:
                try:
                    wait_rows(running[key], lambda: file_count(spark, f"{base(key)}/{key}-out"), len(values),
                              f"{what} {key}")
                    break
                except RuntimeError as exc:
                    # Spark's fixed 10 s wait for a new Python worker (see session()) can fail the
                    # driver-side source process itself on a busy machine: restarted from its
                    # checkpoint, as a user would, which the exactly-once check below covers too
                    if "failed to connect back" not in str(exc) or restarts[key] >= 3:
                        raise
                    restarts[key] += 1
                    running[key] = start_file_query(spark, fmt, name, key, RESUME_CAP)
        time.sleep(1)  # a duplicate batch would land now
    finally:
        for q in running.values():
            q.stop()
    for key, (what, fmt, name, values) in queries.items():
        rows = [r.b for r in spark.read.parquet(f"{base(key)}/{key}-out").collect()]
        report(what, key=key, format=fmt, sent=len(values), rows=len(rows), distinct=len(set(rows)),
               exact=sorted(rows) == values, restarts=restarts[key])


def start_and_await_kill(spark, kind: str) -> None:
    """Send each format's messages, start its ``kind`` query, and once every query has committed two
    batches (and has more to read), print READY and wait for the test's SIGKILL."""
    queries = {}
    for fmt in FORMATS:  # one after the other: see started()
        key = f"{kind}-{fmt}"
        queries[key] = start_file_query(spark, fmt, CONFIG["names"][fmt][kind], key)
        # sent once each query runs, so that the run has batches to do under every Spark (without
        # availableNow support the first batch of a run takes what is there at its start)
        wait_rows(queries[key], lambda q=queries[key]: len(q.recentProgress), 1, f"{key} start")
    for fmt in FORMATS:
        batch_write(spark, fmt, CONFIG["names"][fmt][kind], bodies(f"{kind}-{fmt}", CONFIG["kill_messages"]))
    deadline = time.monotonic() + WAIT
    while min(committed_batches(f"{base(key)}/{key}-ckpt") for key in queries) < 2:
        for key, q in queries.items():
            if q.exception() is not None:
                raise RuntimeError(f"{key}: {q.exception()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {kind} queries did not commit two batches in time")
        time.sleep(0.2)
    report(f"{kind}_ready", counts={key: file_count(spark, f"{base(key)}/{key}-out") for key in queries})
    print("READY", flush=True)
    time.sleep(WAIT)  # the test kills this process (a driver crash: no stop(), no commit)


def main_then_kill(spark) -> None:
    """``main``, then the ``kill`` queries in the same session (one Spark start less per release)."""
    main(spark)
    report("main_done")
    start_and_await_kill(spark, "kill")


def resume(spark) -> None:
    """The killed queries, and the upgrade queries an older release's ``resume`` left (when the config
    names them), restarted side by side and run to the end; then, when the config asks for it, the
    upgrade queries for the next release started and left to the test's kill."""
    n = CONFIG["kill_messages"]
    kinds = ("upgrade", "kill") if CONFIG.get("upgrade_from") else ("kill",)
    run_to_end_and_report(spark, {
        f"{kind}-{fmt}": (f"{kind}_resume", fmt, CONFIG["names"][fmt][kind], bodies(f"{kind}-{fmt}", n))
        for kind in kinds for fmt in FORMATS})
    if CONFIG.get("upgrade_to"):
        start_and_await_kill(spark, "upgrade")


# -- Spark Connect ---------------------------------------------------------------------------------

def connect() -> None:
    """A Spark Connect server of this release (its own JVM, from the installed pyspark, workers in this
    venv), and a client session of it: the formats resolve before any register call (the server
    registered them itself), ``register`` twice succeeds, and a batch write and read go through."""
    import signal
    import socket
    import subprocess
    from pathlib import Path

    import pyspark

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    submit = Path(pyspark.__file__).resolve().parent / "bin" / "spark-submit"
    log_path = Path(CONFIG["work"]) / "connect-server.log"
    env = dict(os.environ, SPARK_HOME=str(submit.parent.parent))
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [str(submit), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", "local[2]",
             "--conf", f"spark.connect.grpc.binding.port={port}", "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
             "--conf", "spark.ui.enabled=false", "--conf", "spark.sql.shuffle.partitions=2",
             "--conf", "spark.python.authenticate.socketTimeout=120s", "--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1",
             "--conf", f"spark.pyspark.python={sys.executable}", "spark-internal"],
            env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + WAIT
        while True:
            with socket.socket() as s:
                s.settimeout(1)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Connect server did not listen on {port}:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        import spark_mq

        spark = SparkSession.builder.remote(f"sc://127.0.0.1:{port}").getOrCreate()
        report("connect_session", module=type(spark).__module__)
        report("connect_auto_registration", result={fmt: auto_registered(spark, fmt) for fmt in FORMATS})
        report("connect_register_twice", first=spark_mq.register(spark), second=spark_mq.register(spark))
        for fmt in ("amqp08", "malamute"):
            name = CONFIG["names"][fmt]["connect"]
            values = bodies(f"{fmt}-connect", 50)
            batch_write(spark, fmt, name, values)
            got = batch_read(spark, fmt, name, len(values))
            report("connect_write_read", format=fmt, sent=len(values), read=len(got), exact=sorted(got) == values)
        spark.stop()
    finally:
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        server.wait(30)


if __name__ == "__main__":
    phase = sys.argv[1]
    if phase == "connect":
        connect()
    else:
        spark = session()
        {"main": main_then_kill, "resume": resume}[phase](spark)
        spark.stop()
    report("done", phase=phase)
