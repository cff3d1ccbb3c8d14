"""The main job: an end-to-end streaming pipeline through a message broker, self-checking.

Responsible for: starting the embedded Malamute broker in-process (unless ``--uri`` names another
broker), producing realistic order events (JSON, event times slightly out of order), running a
Spark query that reads them with ``readStream.format(<protocol>)``, aggregates orders and revenue per
region in event-time tumbling windows with a watermark, and writes each finalized window back to the
broker with ``writeStream.format(<protocol>)``; reading those results back, showing live progress
(messages/s, Spark batches, backlog from ``lastProgress``), and ending with a summary that checks
every finalized window against the producer's own tally. Not responsible for any protocol or Spark
data source logic: it only uses the public clients and formats.

    python -m spark_mq.apps.demo                         # embedded Malamute broker, 60 s
    python -m spark_mq.apps.demo --seconds 20 --rate 1000
    python -m spark_mq.apps.demo --uri amqp://guest:guest@127.0.0.1:5672/%2F
    python -m spark_mq.apps.demo --uri stomp://127.0.0.1:61613
    spark-mq demo ...                               # the same

Exit status 0 when every finalized window matches the tally, 1 otherwise (or on failure).

How the pipeline ends cleanly: windows are emitted (append mode) only once the watermark passes
them, and the watermark only moves with new events. When the producer stops, it sends one
end-of-stream marker (quantity 0) whose event time lies beyond the last window plus the watermark
delay; the query drops its group after the aggregation (``items > 0``: Spark would push a filter on
the region below the watermark), but it moves the watermark, so Spark's next (no-data) batch
emits every remaining window.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Optional

from spark_mq.apps.progress import backlog_of
from spark_mq.registration import REDACTION_CONF, SPARK_DEFAULT_REDACTION, with_uri_redaction

__all__ = ["main", "Tally", "make_order", "REGIONS", "PRODUCTS", "EOS_REGION"]

REGIONS = ("eu-west", "eu-north", "us-east", "us-west", "ap-south")
#: product -> unit price in cents
PRODUCTS = {"keyboard": 4_999, "mouse": 1_999, "monitor": 18_900, "laptop": 119_900, "cable": 899, "dock": 21_500}
EOS_REGION = "__end_of_stream__"
ORDER_SCHEMA = "order_id STRING, ts_ms BIGINT, region STRING, product STRING, quantity INT, price_cents BIGINT"
#: Spark settings of the demo; conf/spark/spark-defaults.conf holds the same (a unit test checks it) as
#: recommended defaults for spark-mq pipelines.
SPARK_DEFAULTS = {
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Spark's default extended by uri, as spark_mq.register does: a password inside a broker URI stays
    # out of query plans also where the formats register themselves and nothing calls register
    REDACTION_CONF: with_uri_redaction(SPARK_DEFAULT_REDACTION),
}
#: log4j2 configuration of the demo's JVM; conf/logging/log4j2.properties is the same file.
LOG4J2 = """\
# spark-mq: quiet Spark logging for streaming jobs (used by the demo; pass it with
#   --conf spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=file:conf/logging/log4j2.properties).
# Errors from Spark, warnings from the Python data source machinery, everything else off.
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.pyds.name = org.apache.spark.sql.execution.datasources.v2.python
logger.pyds.level = warn
"""


def make_order(n: int, now_ms: int, rng: random.Random, jitter_ms: int) -> dict:
    """Order number ``n``: event time up to ``jitter_ms`` before ``now_ms`` (events arrive out of order)."""
    product = rng.choice(list(PRODUCTS))
    return {
        "order_id": f"o-{n:08d}",
        "ts_ms": now_ms - rng.randint(0, jitter_ms),
        "region": rng.choice(REGIONS),
        "product": product,
        "quantity": rng.randint(1, 5),
        "price_cents": PRODUCTS[product],
    }


@dataclass
class Tally:
    """The producer's own count of orders and revenue per (window start ms, region)."""

    window_ms: int
    cells: dict = field(default_factory=dict)

    def add(self, order: dict) -> None:
        start = order["ts_ms"] - order["ts_ms"] % self.window_ms
        cell = self.cells.setdefault((start, order["region"]), [0, 0])
        cell[0] += 1
        cell[1] += order["quantity"] * order["price_cents"]


# ------------------------------------------------------------------------------------------- brokers

class Backend:
    """Protocol-specific plumbing: where the orders go, where the results come back, how to clean up."""

    fmt = ""

    def __init__(self, uri: str, run_id: str) -> None:
        self.uri = uri
        self.run_id = run_id

    def _opts(self):
        from spark_mq.options import SINK, parse_options
        return parse_options({"uri": self.uri}, format=self.fmt, direction=SINK)

    # subclasses: source_options(), sink_options(), open_producer(), publish(body, key), flush(),
    # close_producer(), start_results(callback), stop_results(), describe_results(), cleanup()


class MalamuteBackend(Backend):
    fmt = "malamute"

    def __init__(self, uri: str, run_id: str) -> None:
        super().__init__(uri, run_id)
        self.orders = f"demo.orders.{run_id}"
        self.results = f"demo.revenue.{run_id}"
        self._producer = self._reader = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def source_options(self) -> dict:
        return {"uri": self.uri, "stream": self.orders}

    def sink_options(self) -> dict:
        return {"uri": self.uri, "stream": self.results}

    def describe_results(self) -> str:
        return f"stream {self.results}"

    def open_producer(self) -> None:
        from spark_mq.clients.connect import connect_malamute
        self._producer = connect_malamute(self._opts(), f"demo-producer-{self.run_id}")
        self._producer.set_producer(self.orders)

    def publish(self, body: bytes, key: str) -> None:
        self._producer.send(key, body)

    def flush(self) -> None:
        self._producer.ping()

    def close_producer(self) -> None:
        if self._producer is not None:
            self._producer.close()

    def start_results(self, callback) -> None:
        from spark_mq.clients.connect import connect_malamute
        self._reader = connect_malamute(self._opts(), f"demo-results-{self.run_id}")
        self._reader.set_consumer(self.results, "")

        def run() -> None:
            while not self._stop.is_set():
                msg = self._reader.recv(0.2)
                if msg is not None:
                    callback(bytes(msg.content[0]) if msg.content else b"")

        self._thread = threading.Thread(target=run, name="demo-results", daemon=True)
        self._thread.start()

    def stop_results(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._reader is not None:
            self._reader.close()

    def cleanup(self) -> None:
        pass  # streams keep nothing


class AmqpBackend(Backend):
    fmt = "amqp08"

    def __init__(self, uri: str, run_id: str) -> None:
        super().__init__(uri, run_id)
        self.orders = f"spark-mq-demo.orders.{run_id}"
        self.results = f"spark-mq-demo.revenue.{run_id}"
        self._conn = self._ch = self._rconn = None
        self._pending = 0

    def source_options(self) -> dict:
        return {"uri": self.uri, "queue": self.orders, "declare": "passive"}

    def sink_options(self) -> dict:
        return {"uri": self.uri, "routingKey": self.results, "contentType": "application/json"}

    def describe_results(self) -> str:
        return f"queue {self.results}"

    def open_producer(self) -> None:
        from spark_mq.clients.connect import connect_amqp08
        self._conn = connect_amqp08(self._opts())
        self._ch = self._conn.channel()
        # both queues exist before anything is sent: nothing is dropped as unroutable
        self._ch.queue_declare(self.orders, durable=True)
        self._ch.queue_declare(self.results, durable=True)
        self._ch.tx_select()

    def publish(self, body: bytes, key: str) -> None:
        self._ch.basic_publish("", self.orders, body)
        self._pending += 1
        if self._pending >= 500:
            self.flush()

    def flush(self) -> None:
        self._ch.tx_commit()
        self._pending = 0

    def close_producer(self) -> None:
        if self._conn is not None:
            self._conn.close()

    def start_results(self, callback) -> None:
        from spark_mq.clients.connect import connect_amqp08
        self._rconn = connect_amqp08(self._opts())
        ch = self._rconn.channel()
        ch.queue_declare(self.results, durable=True)
        ch.basic_consume(self.results, no_ack=True, on_message=lambda m: callback(bytes(m.body)))

    def stop_results(self) -> None:
        if self._rconn is not None:
            self._rconn.close()

    def cleanup(self) -> None:
        from spark_mq.clients.connect import connect_amqp08
        with connect_amqp08(self._opts()) as conn:
            ch = conn.channel()
            for q in (self.orders, self.results):
                ch.queue_delete(q)


class StompBackend(Backend):
    fmt = "stomp"

    def __init__(self, uri: str, run_id: str) -> None:
        super().__init__(uri, run_id)
        self.orders = f"/queue/spark-mq-demo.orders.{run_id}"
        self.results = f"/queue/spark-mq-demo.revenue.{run_id}"
        self._producer = self._reader = None

    def source_options(self) -> dict:
        return {"uri": self.uri, "destination": self.orders}

    def sink_options(self) -> dict:
        return {"uri": self.uri, "destination": self.results}

    def describe_results(self) -> str:
        return f"destination {self.results}"

    def open_producer(self) -> None:
        from spark_mq.clients.connect import connect_stomp
        self._producer = connect_stomp(self._opts())

    def publish(self, body: bytes, key: str) -> None:
        self._producer.send(self.orders, body)

    def flush(self) -> None:
        self._producer.flush()

    def close_producer(self) -> None:
        if self._producer is not None:
            try:
                self._producer.disconnect()
            finally:
                self._producer.close()

    def start_results(self, callback) -> None:
        from spark_mq.clients.connect import connect_stomp
        self._reader = connect_stomp(self._opts())
        self._reader.subscribe(self.results, ack="auto", on_message=lambda f: callback(bytes(f.body)))

    def stop_results(self) -> None:
        if self._reader is not None:
            self._reader.close()

    def cleanup(self) -> None:
        pass


BACKENDS = {"malamute": MalamuteBackend, "amqp08": AmqpBackend, "stomp": StompBackend}


# ------------------------------------------------------------------------------------------- producer

class Producer(threading.Thread):
    """Sends orders at ``rate`` per second for ``seconds``, then the end-of-stream marker."""

    def __init__(self, backend: Backend, rate: float, seconds: float, tally: Tally, jitter_ms: int,
                 eos_offset_ms: int, seed: Optional[int]) -> None:
        super().__init__(name="demo-producer", daemon=True)
        self.backend = backend
        self.rate = rate
        self.seconds = seconds
        self.tally = tally
        self.jitter_ms = jitter_ms
        self.eos_offset_ms = eos_offset_ms
        self.rng = random.Random(seed)
        self.sent = 0
        self.max_ts = 0
        self.started = self.finished = None
        self.error: Optional[BaseException] = None
        self.stop_event = threading.Event()

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def _run(self) -> None:
        self.started = time.monotonic()
        deadline = self.started + self.seconds
        tick = 0.05
        next_flush = self.started + 0.25
        while not self.stop_event.is_set():
            now = time.monotonic()
            if now >= deadline:
                break
            due = int((now - self.started) * self.rate) - self.sent
            now_ms = int(time.time() * 1000)
            for _ in range(max(0, due)):
                order = make_order(self.sent, now_ms, self.rng, self.jitter_ms)
                self.backend.publish(json.dumps(order, separators=(",", ":")).encode(), order["region"])
                self.tally.add(order)
                self.sent += 1
                self.max_ts = max(self.max_ts, order["ts_ms"])
            if now >= next_flush:
                self.backend.flush()
                next_flush = now + 0.25
            time.sleep(tick)
        marker = {"order_id": "eos", "ts_ms": max(self.max_ts, int(time.time() * 1000)) + self.eos_offset_ms,
                  "region": EOS_REGION, "product": "", "quantity": 0, "price_cents": 0}
        self.backend.publish(json.dumps(marker).encode(), EOS_REGION)
        self.backend.flush()
        self.finished = time.monotonic()


# ------------------------------------------------------------------------------------------- Spark

def build_query(spark, backend: Backend, workdir: str, window_s: int, watermark_s: int, trigger_s: float):
    from pyspark.sql import functions as F

    raw = (spark.readStream.format(backend.fmt).options(**backend.source_options())
           .option("logLocation", os.path.join(workdir, "source-log")).load())
    orders = (raw.select(F.from_json(F.col("body").cast("string"), ORDER_SCHEMA).alias("o")).select("o.*")
              .withColumn("event_time", F.timestamp_millis("ts_ms")))
    windows = (orders.withWatermark("event_time", f"{watermark_s} seconds")
               .groupBy(F.window("event_time", f"{window_s} seconds"), "region")
               .agg(F.count(F.lit(1)).alias("orders"), F.sum(F.col("quantity") * F.col("price_cents")).alias("revenue_cents"),
                    F.sum("quantity").alias("items")))
    # Drop the marker's own group by an aggregate (its quantity is 0): a filter on the region column
    # would be pushed below the aggregation and the watermark, and the marker could not move it.
    results = (windows.where(F.col("items") > 0)
               .select(F.to_json(F.struct(
                   (F.unix_micros(F.col("window.start")) / 1000).cast("long").alias("window_start_ms"),
                   (F.unix_micros(F.col("window.end")) / 1000).cast("long").alias("window_end_ms"),
                   "region", "orders", "items", "revenue_cents")).alias("body")))
    if backend.fmt == "malamute":
        results = results.withColumn("subject", F.get_json_object("body", "$.region"))
    return (results.writeStream.format(backend.fmt).options(**backend.sink_options())
            .outputMode("append").option("checkpointLocation", os.path.join(workdir, "checkpoint"))
            .trigger(processingTime=f"{trigger_s} seconds").start())


# ------------------------------------------------------------------------------------------- main

def _parse(argv) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m spark_mq.apps.demo",
        description="End-to-end streaming demo: orders -> broker -> Spark (event-time windows, watermark) -> "
                    "broker, with live progress and a self-checking summary.")
    p.add_argument("--uri", help="use this broker instead of the embedded Malamute broker: amqp://..., "
                                 "stomp://..., tcp://... (default: embedded Malamute on a free port)")
    p.add_argument("--seconds", type=float, default=60.0, help="how long the producer runs (default 60)")
    p.add_argument("--rate", type=float, default=500.0, help="orders per second (default 500)")
    p.add_argument("--window", type=int, default=10, help="tumbling window, seconds (default 10)")
    p.add_argument("--watermark", type=int, default=5, help="watermark delay, seconds (default 5)")
    p.add_argument("--jitter", type=float, default=2.0,
                   help="event times are up to this many seconds in the past: out-of-order events (default 2)")
    p.add_argument("--trigger", type=float, default=2.0, help="micro-batch interval, seconds (default 2)")
    p.add_argument("--drain-timeout", type=float, default=60.0,
                   help="after the producer stops, wait at most this long for the last windows (default 60)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--workdir", help="checkpoint and source log directory (default: a temporary one, removed)")
    p.add_argument("--seed", type=int, help="random seed for the generated orders")
    p.add_argument("--quiet", action="store_true", help="no live progress lines")
    p.add_argument("--summary-json", metavar="PATH", help="also write the summary as JSON to PATH")
    args = p.parse_args(argv)
    for name in ("seconds", "rate", "trigger"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be positive")
    if args.window < 1 or args.watermark < 0 or args.jitter < 0:
        p.error("--window must be >= 1 s, --watermark and --jitter >= 0")
    if args.jitter >= args.watermark + args.window:
        p.error("--jitter must stay below --window + --watermark, or late orders would be dropped")
    return args


class Display:
    """One progress line per second on a terminal (rewritten in place), every 5 s otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.tty = sys.stdout.isatty()
        self.last = 0.0

    def show(self, text: str, force: bool = False) -> None:
        if self.quiet:
            return
        now = time.monotonic()
        if self.tty:
            sys.stdout.write("\r\033[K" + text)
            sys.stdout.flush()
        elif force or now - self.last >= 5.0:
            print(text, flush=True)
            self.last = now

    def end(self) -> None:
        if self.tty and not self.quiet:
            sys.stdout.write("\n")
            sys.stdout.flush()


def _fmt_ms(ms: int) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ms / 1000))


def main(argv: Optional[list] = None) -> int:
    args = _parse(sys.argv[1:] if argv is None else argv)
    from spark_mq.clients.connect import format_of
    from spark_mq.errors import OptionError
    broker = None
    uri = args.uri
    if uri:
        try:
            fmt = format_of(uri)
        except OptionError as exc:
            print(f"demo: error: --uri: {exc}", file=sys.stderr)
            return 2
    else:
        from spark_mq.malamute_broker import Broker
        broker = Broker(["tcp://127.0.0.1:0"]).start()
        uri = broker.endpoints[0]
        fmt = "malamute"
    from spark_mq.options import redact_uri
    shown_uri = redact_uri(uri)
    run_id = uuid.uuid4().hex[:8]
    backend = BACKENDS[fmt](uri, run_id)
    own_workdir = args.workdir is None
    workdir = tempfile.mkdtemp(prefix="spark-mq-demo-") if own_workdir else args.workdir
    os.makedirs(workdir, exist_ok=True)
    print(f"spark-mq demo: {fmt} broker {shown_uri}{' (embedded, in this process)' if broker else ''}", flush=True)
    print(f"  orders: {args.rate:g}/s for {args.seconds:g}s -> {fmt} source -> {args.window}s windows per region "
          f"(watermark {args.watermark}s) -> {fmt} sink ({backend.describe_results()})", flush=True)
    results: list = []
    results_lock = threading.Lock()

    def on_result(body: bytes) -> None:
        with results_lock:
            results.append(json.loads(body))

    tally = Tally(args.window * 1000)
    spark = query = producer = None
    summary: dict = {"format": fmt, "uri": shown_uri, "embedded_broker": broker is not None}
    code = 1
    try:
        print("  starting Spark ...", flush=True)
        started = time.monotonic()
        spark = _spark(args.master, workdir)
        import spark_mq
        spark_mq.register(spark)  # also works where auto-registration does not (editable installs, --py-files)
        print(f"  Spark {spark.version} ready in {time.monotonic() - started:.1f}s", flush=True)
        backend.open_producer()  # AMQP: declares the queues before the source looks for them
        backend.start_results(on_result)
        query = build_query(spark, backend, workdir, args.window, args.watermark, args.trigger)
        _wait_for_first_batch(query, timeout=120)
        producer = Producer(backend, args.rate, args.seconds, tally, int(args.jitter * 1000),
                            (args.window + args.watermark) * 1000 + 1000, args.seed)
        producer.start()
        code, summary = _watch(query, producer, tally, results, results_lock, args, summary)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        code = 130
    except Exception as exc:  # noqa: BLE001 - the demo reports and exits non-zero
        print(f"\ndemo failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    finally:
        if producer is not None:
            producer.stop_event.set()
            producer.join(10)
        if query is not None:
            try:
                _wait_idle(query, 15.0)  # stopping in the middle of a batch logs scary (harmless) aborts
                query.stop()
            except Exception:  # noqa: BLE001
                pass
        backend.stop_results()
        backend.close_producer()
        if spark is not None:
            spark.stop()
        try:
            backend.cleanup()
        except Exception:  # noqa: BLE001 - leftovers in someone's broker are not worth a failure
            pass
        if broker is not None:
            broker.stop()
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    summary["exit_code"] = code
    if args.summary_json:
        with open(args.summary_json, "w") as fh:
            json.dump(summary, fh, indent=2, sort_keys=True)
    return code


def spark_settings(workdir: str) -> dict:
    """The demo's Spark settings: ``SPARK_DEFAULTS`` (what conf/spark/spark-defaults.conf recommends),
    no UI, and the quiet log4j2 configuration (written into ``workdir``)."""
    log_conf = os.path.join(workdir, "log4j2.properties")
    with open(log_conf, "w") as fh:
        fh.write(LOG4J2)
    return {**SPARK_DEFAULTS, "spark.ui.enabled": "false",
            "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log_conf}"}


def _spark(master: str, workdir: str):
    from pyspark.sql import SparkSession
    # Python workers (and the lookup of auto-registered formats) run $PYSPARK_PYTHON, else "python3",
    # which may lack pyarrow/spark_mq: use this interpreter unless the user chose one.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName("spark-mq demo")
    for key, value in spark_settings(workdir).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _wait_idle(query, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.1)


def _wait_for_first_batch(query, timeout: float) -> None:
    """The source subscribes when Spark plans the first batch: streams keep nothing for absent readers."""
    deadline = time.monotonic() + timeout
    while query.lastProgress is None:
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"no Spark batch within {timeout:.0f}s")
        time.sleep(0.2)


def _watch(query, producer: Producer, tally: Tally, results: list, lock: threading.Lock, args,
           summary: dict) -> tuple:
    display = Display(args.quiet)
    started = time.monotonic()
    batches = set()
    input_rows = 0
    drain_deadline = None
    last_sent, last_t = 0, started
    rate = 0.0
    while True:
        time.sleep(0.5 if display.tty else 1.0)
        if producer.error is not None:
            raise RuntimeError(f"the producer failed: {producer.error!r}")
        if query.exception() is not None:
            raise RuntimeError(f"the query failed: {query.exception()}")
        for progress in query.recentProgress:
            if progress["batchId"] not in batches:
                batches.add(progress["batchId"])
                input_rows += int(progress.get("numInputRows") or 0)
        progress = query.lastProgress
        backlog = backlog_of(progress)
        now = time.monotonic()
        if now - last_t >= 1.0:
            rate = (producer.sent - last_sent) / (now - last_t)
            last_sent, last_t = producer.sent, now
        with lock:
            n_results = len(results)
        spark_rate = float(progress.get("processedRowsPerSecond") or 0.0) if progress else 0.0
        display.show(f"  {now - started:5.0f}s  produced {producer.sent:,} ({rate:,.0f}/s)  |  Spark: "
                     f"{len(batches)} batches, {input_rows:,} rows in, {spark_rate:,.0f} rows/s, "
                     f"backlog {backlog if backlog is not None else '-'}  |  {n_results} window results")
        if producer.finished is not None and drain_deadline is None:
            drain_deadline = now + args.drain_timeout
        if drain_deadline is not None:
            expected = set(tally.cells)
            with lock:
                got = {(r["window_start_ms"], r["region"]) for r in results}
            if expected <= got or now >= drain_deadline:
                break
    display.end()
    summary["progress"] = [_brief(p) for p in query.recentProgress]
    return _summarize(producer, tally, results, lock, input_rows, len(batches), summary)


def _brief(progress: dict) -> dict:
    """The figures of one progress report worth keeping in the JSON summary."""
    state = (progress.get("stateOperators") or [{}])[0]
    return {"batchId": progress.get("batchId"), "numInputRows": progress.get("numInputRows"),
            "eventTime": progress.get("eventTime"),
            "stateRows": state.get("numRowsTotal"), "stateRowsRemoved": state.get("numRowsRemoved"),
            "sinkOutputRows": (progress.get("sink") or {}).get("numOutputRows"),
            "backlog": backlog_of(progress)}


def _summarize(producer: Producer, tally: Tally, results: list, lock: threading.Lock, input_rows: int,
               batches: int, summary: dict) -> tuple:
    with lock:
        rows = list(results)
    got = {}
    duplicates = 0
    for r in rows:
        key = (r["window_start_ms"], r["region"])
        duplicates += key in got
        got[key] = r
    matched, mismatched, missing = [], [], []
    for key, (orders, revenue) in sorted(tally.cells.items()):
        r = got.get(key)
        if r is None:
            missing.append(key)
        elif r["orders"] == orders and r["revenue_cents"] == revenue:
            matched.append(key)
        else:
            mismatched.append((key, (orders, revenue), (r["orders"], r["revenue_cents"])))
    unexpected = sorted(set(got) - set(tally.cells))
    produced_s = (producer.finished or time.monotonic()) - (producer.started or time.monotonic())
    ok = not missing and not mismatched and not unexpected and not duplicates and producer.sent > 0
    summary.update({
        "produced": producer.sent, "produced_seconds": round(produced_s, 2),
        "spark_batches": batches, "spark_input_rows": input_rows,
        "windows_expected": len(tally.cells), "windows_matched": len(matched),
        "windows_mismatched": len(mismatched), "windows_missing": len(missing),
        "windows_unexpected": len(unexpected), "duplicate_results": duplicates,
        "revenue_cents": sum(r["revenue_cents"] for r in got.values()),
        "verified": ok,
    })
    print("\nsummary")
    print(f"  produced        {producer.sent:,} orders in {produced_s:.1f}s "
          f"({producer.sent / max(produced_s, 1e-9):,.0f}/s) + 1 end-of-stream marker")
    print(f"  Spark           {batches} micro-batches, {input_rows:,} messages read from the {summary['format']} source")
    print(f"  results         {len(got)} window x region rows written by the {summary['format']} sink and read back")
    by_window: dict = {}
    for (start, region), r in sorted(got.items()):
        by_window.setdefault(start, []).append(r)
    print(f"  {'window':<19} {'orders':>7} {'items':>7} {'revenue':>13}  top region")
    for start, rs in sorted(by_window.items()):
        top = max(rs, key=lambda r: r["revenue_cents"])
        print(f"  {_fmt_ms(start)}-{_fmt_ms(rs[0]['window_end_ms'])}  {sum(r['orders'] for r in rs):>7,} "
              f"{sum(r['items'] for r in rs):>7,} {sum(r['revenue_cents'] for r in rs) / 100:>13,.2f}  "
              f"{top['region']}")
    if ok:
        print(f"  verified        all {len(matched)} window x region results match the producer's own tally "
              f"(orders and revenue), no duplicates")
    else:
        print(f"  NOT verified    matched {len(matched)}, mismatched {len(mismatched)}, missing {len(missing)}, "
              f"unexpected {len(unexpected)}, duplicates {duplicates}")
        for key, want, have in mismatched[:5]:
            print(f"    {_fmt_ms(key[0])} {key[1]}: producer {want}, Spark {have}")
        for key in missing[:5]:
            print(f"    missing {_fmt_ms(key[0])} {key[1]}")
    return (0 if ok else 1), summary


if __name__ == "__main__":
    sys.exit(main())
