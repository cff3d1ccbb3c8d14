"""``spark-mq bridge FROM_URI TO_URI``: move messages from one broker to another with a Spark query.

Responsible for: turning the command's arguments into a bridge query (``readStream.format(a)`` written
straight into ``writeStream.format(b)``, see docs/bridges.md), on a local SparkSession unless
``--master`` says otherwise, with the source log and the checkpoint under one ``--state`` directory
(so running the same command again resumes where the last run stopped, after a crash too), and
printing a progress line: batches, messages, rate and the source's figures. ``--available-now``
bridges what is there and exits; otherwise it runs until Ctrl-C or SIGTERM (a clean stop).

Targets: ``--from``/``--to`` name the queue (AMQP: the source's queue; the sink's routing key on the
default exchange), the destination (STOMP) or, for Malamute, ``stream:NAME``, ``mailbox:NAME`` or
``service:NAME`` (a plain name is a stream). ``--source-option``/``--sink-option KEY=VALUE`` pass any
option of docs/options.md.

Not responsible for the mapping of columns (``spark_mq.sinks.bridge``) or for any protocol.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import sys
import threading
import time
from typing import Optional
from urllib.parse import urlsplit

from spark_mq.apps.commands.common import pairs
from spark_mq.apps.progress import backlog_of, offset_dict

__all__ = ["target_options", "progress_line", "state_dir", "cause_of", "run", "BridgeUsageError"]

_MALAMUTE_KINDS = ("stream", "mailbox", "service")


class BridgeUsageError(ValueError):
    """A bad target or option: the command exits with status 2, naming it."""


def target_options(protocol: str, target: str, side: str) -> dict:
    """The format options that ``--from``/``--to`` TARGET means for ``protocol`` on ``side``
    (``source`` or ``sink``)."""
    if not target:
        raise BridgeUsageError(f"--{'from' if side == 'source' else 'to'} is empty")
    if protocol == "amqp08":
        return {"queue": target} if side == "source" else {"routingKey": target}
    if protocol == "stomp":
        return {"destination": target}
    kind, sep, name = target.partition(":")
    if not sep:
        kind, name = "stream", target
    if kind not in _MALAMUTE_KINDS or not name:
        raise BridgeUsageError(f"Malamute target {target!r}: give stream:NAME, mailbox:NAME or service:NAME")
    return {kind: name}


def _where(uri: str) -> str:
    """What of a URI names the place, not the credentials: a rotated password (or a user name) must
    find the same state again, or messages already in the old log would be stranded there."""
    parts = urlsplit(uri)
    host = (parts.hostname or "").lower()
    return f"{parts.scheme.lower()}://{host}:{parts.port or ''}{parts.path}"


def state_dir(args) -> str:
    """``--state``, else ``./spark-mq-bridge-<hash>`` of the two places and targets (no credentials)."""
    if args.state:
        return args.state
    digest = hashlib.blake2b(f"{_where(args.from_uri)}|{args.source}|{_where(args.to_uri)}|{args.sink}".encode(),
                             digest_size=6).hexdigest()
    return os.path.join(os.getcwd(), f"spark-mq-bridge-{digest}")


def progress_line(progress: Optional[dict], total: int, seconds: float) -> str:
    """One line: the last batch, messages bridged so far, rates, and what the source still holds
    (the source log past the last batch plus the broker's queue depth where it reports one)."""
    seconds = max(1e-9, seconds)
    batch = progress.get("batchId", "-") if progress else "-"
    rate = progress.get("processedRowsPerSecond") if progress else None
    text = f"bridge: batch {batch}, {total:,} messages in {seconds:,.0f}s ({total / seconds:,.0f}/s overall"
    if rate:
        text += f", {rate:,.0f}/s last batch"
    text += ")"
    backlog = backlog_of(progress)
    if backlog is not None:
        text += f", backlog {backlog:,}"
    if progress and progress.get("sources"):
        figures = offset_dict(progress["sources"][0].get("latestOffset"))
        if figures.get("reconnects"):
            text += f", {figures['reconnects']} reconnects"
        if figures.get("connected") is False:
            text += ", source broker unreachable"
    return text


def run(args) -> int:
    """Run the bridge (the CLI has checked that both URIs name a format)."""
    from spark_mq.clients.connect import format_of
    source_fmt, sink_fmt = format_of(args.from_uri), format_of(args.to_uri)
    src = {"uri": args.from_uri, **target_options(source_fmt, args.source, "source"),
           **pairs(args.source_option, "--source-option", BridgeUsageError)}
    dst = {"uri": args.to_uri, **target_options(sink_fmt, args.sink, "sink"),
           **pairs(args.sink_option, "--sink-option", BridgeUsageError)}
    state = state_dir(args)
    src.setdefault("logLocation", os.path.join(state, "log"))
    os.makedirs(state, exist_ok=True)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_mq
    spark = (SparkSession.builder.master(args.master).appName("spark-mq bridge")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark_mq.register(spark, [source_fmt, sink_fmt])
    reader = spark.readStream.format(source_fmt).options(**src).load()
    writer = (reader.writeStream.format(sink_fmt).options(**dst)
              .option("checkpointLocation", os.path.join(state, "checkpoint")).queryName("spark_mq_bridge"))
    writer = writer.trigger(availableNow=True) if args.available_now else \
        writer.trigger(processingTime=f"{args.trigger_interval} seconds")
    print(f"bridge: {source_fmt} {args.source!r} -> {sink_fmt} {args.sink!r}; state in {state}", file=sys.stderr,
          flush=True)
    try:
        query = writer.start()
        return _watch(query, args)
    finally:
        spark.stop()


def _watch(query, args) -> int:
    """Print progress until the query ends or a signal stops it; 0 when it ended well, else 1 with
    the query's error (no traceback: the error names the option, frame or broker at fault)."""
    from pyspark.errors import StreamingQueryException

    stop = threading.Event()

    def on_signal(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    started = time.monotonic()
    total, seen = 0, set()
    tty = sys.stderr.isatty()
    last_print = 0.0

    def count() -> int:
        added = 0
        for p in query.recentProgress:
            if p["batchId"] not in seen:
                seen.add(p["batchId"])
                added += p.get("numInputRows", 0)
        return added

    error = None
    try:
        while query.isActive and not stop.is_set():
            try:
                query.awaitTermination(0.5)
            except StreamingQueryException as exc:  # the query failed: reported below, not raised
                error = exc
                break
            total += count()
            now = time.monotonic()
            if now - last_print >= args.progress_interval:
                last_print = now
                line = progress_line(query.lastProgress, total, now - started)
                print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
        if stop.is_set() and query.isActive:
            query.stop()
        error = error or query.exception()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    total += count()
    print(("\n" if tty else "") + f"bridge: {'failed' if error else 'done'}: {total:,} messages in {len(seen)} "
          f"batches, {time.monotonic() - started:,.1f}s", file=sys.stderr, flush=True)
    if error is not None:
        print(f"bridge: {cause_of(getattr(error, 'desc', None) or str(error))}", file=sys.stderr, flush=True)
        return 1
    return 0


_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Timeout\w*|Refused\w*))(?::\s*(.*))?$")


def cause_of(text: str) -> str:
    """The line of a query's error that says what went wrong: Spark wraps a task's Python error in
    ``[STREAM_FAILED] ... [PYTHON_EXCEPTION] ... Traceback``; the last exception line of that
    traceback (``spark_mq.errors.BrokerUnavailableError: ...``) names the option or broker at fault."""
    lines = (text or "").splitlines()
    found = [line.strip() for line in lines if _EXCEPTION_LINE.match(line)]
    return found[-1] if found else (lines[0] if lines else "the query failed")
