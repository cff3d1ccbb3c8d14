"""The demo job: its arguments, and one run from start to summary (the broker, Spark, the query, the
producer, the watch, and the clean-up whatever happened). See ``spark_mq.apps.demo``."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from typing import Optional

from spark_mq.apps.demo.backends import BACKENDS
from spark_mq.apps.demo.orders import Producer, Tally
from spark_mq.apps.demo.query import build_query, start_spark, wait_for_first_batch, wait_idle
from spark_mq.apps.demo.report import watch

__all__ = ["main"]


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
        spark = start_spark(args.master, workdir)
        import spark_mq
        spark_mq.register(spark)  # also works where auto-registration does not (editable installs, --py-files)
        print(f"  Spark {spark.version} ready in {time.monotonic() - started:.1f}s", flush=True)
        backend.open_producer()  # AMQP: declares the queues before the source looks for them
        backend.start_results(on_result)
        query = build_query(spark, backend, workdir, args.window, args.watermark, args.trigger)
        wait_for_first_batch(query, timeout=120)
        producer = Producer(backend, args.rate, args.seconds, tally, int(args.jitter * 1000),
                            (args.window + args.watermark) * 1000 + 1000, args.seed)
        producer.start()
        code, summary = watch(query, producer, tally, results, results_lock, args, summary)
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
                wait_idle(query, 15.0)  # stopping in the middle of a batch logs scary (harmless) aborts
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
