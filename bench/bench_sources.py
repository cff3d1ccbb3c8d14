"""End-to-end rate of each source next to the same protocol's raw client, plus reader-process memory.

For each format and broker the format supports (amqp08 on RabbitMQ; stomp on RabbitMQ's STOMP
plugin and on ActiveMQ, the row ``stomp-activemq``; malamute on the embedded broker) and body size
(100 B, 4 KiB): preload N messages, time our raw client consuming (and acking) them; preload N
again, time the library a user would otherwise reach for (the peer: pika for amqp08, stomp.py for
stomp; Malamute has none in Python) consuming them the same way (client acks, prefetch 1000, an ack
per 100 messages: ``PEER_ACK_EVERY``); preload N again, time a ``trigger(availableNow=True)``
query from the source to the ``noop`` sink (start to termination, Spark's planning included).
Each row has ``ratio`` (source / raw client) and, where there is a peer, ``peer_ratio`` (source /
peer, the figure issue 48 asks to be at least 0.9 on ActiveMQ) and ``raw_vs_peer``. Then one long amqp08 run with a
small log bound, sampling the RSS of the driver-side reader process (the one running the ingest),
and one on malamute: memory must follow the bound, not the message count.

    python -m bench sources                 # ~30 minutes: counts per format (COUNTS), 200,000 for memory
    python -m bench sources --memory=2000000 --memory-malamute=400000
    python -m bench sources --only=stomp --memory=0 --rounds=1
    python -m bench sources --only=stomp-activemq --memory=0 --memory-malamute=0 --rounds=1 --warm=0 --n=20000

Each format and size is measured ``--rounds`` times (3 by default), all pairs once per round; the
round with the median ratio is reported, with every round's ratio kept in the results file. Every
run also records the CPU seconds spent by each kind of process (raw client or Spark driver, the
driver-side reader process, the JVM, the executor Python workers, the broker), sampled from /proc:
on a machine with few cores the source's rate is bounded by their sum.

Each timed run, the raw client's and the source's, starts once its preload is over for the whole
machine, not only for the preloading client: dirty pages written back and the broker idle
(``bench.common.settle``; the wait is recorded with each run), so that neither run pays for the
other's setup (a 500,000 x 4 KiB Malamute preload left 1.5-1.8 GB of dirty pages in a scratch run).

Before the measured runs, one small query per format (two partitions) starts both executor Python
workers, and unmeasured queries per format and size (100,000 messages each, repeated until the JIT
compiler threads take under ``JIT_SETTLED`` CPU-s in one, at most ``JIT_WARMUP_MAX``) warm the JVM's
JIT (``--warm=0`` skips them): costs of the first queries in a Spark session, not of the source (the
trace behind it is in docs/benchmarks.md, "Reading the source figures").
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from typing import NamedTuple, Optional

from spark_mq import schema as S
from spark_mq.sources.log import SEGMENT_PREFIX

from bench.common import ProcessCpu, harness, settle, integration_module, write_results

SIZES = {"100B": 100, "4KiB": 4096}
# A rate, not a start-up time: every query pays 1.5-2.5 s that do not depend on the count (about 1 s
# from start() to the first message in the log: the reader process, pyspark imported from Spark's
# zip, connecting; the quiet period or last depth check, and the last micro-batch, after the drain;
# see docs/benchmarks.md). So each format's counts keep its raw client's run at about 10 s or more on
# this machine: on 2026-11-25, at 500,000 x 100 B / 200,000 x 4 KiB for every format, the raw runs
# took 11.7 / 6.3 s (amqp08), 18.8 / 8.5 s (stomp) and 3.0 / 1.8 s (malamute), where that fixed
# part was up to half a source run. Each run records when the first message reached the log
# (first_data_seconds), so the fixed part stays visible. The raw Malamute client got faster since:
# on 2026-11-27 it drained 1,000,000 x 4 KiB in 8.4 / 8.7 / 11.8 s (8.0-11.9 s in the run before),
# so that count became 1,500,000.
# ActiveMQ (issue 48, 2026-11-28): stomp.py drains 200,000 x 100 B there in 6.5-7.5 s on an idle
# machine; 4 KiB stays at 150,000 (600 MB of non-persistent messages go to the broker's temp store,
# whose limit in the harness's configuration is 1 GB).
COUNTS = {
    "amqp08": {"100B": 500_000, "4KiB": 400_000},
    "stomp": {"100B": 500_000, "4KiB": 300_000},
    "stomp-activemq": {"100B": 200_000, "4KiB": 150_000},
    "malamute": {"100B": 2_000_000, "4KiB": 1_500_000},
}
PEER_ACK_EVERY = 100  # the peers acknowledge (cumulatively) every this many messages, as issue 48's stomp.py run
PREFETCH = 1000       # the raw client's and the peers' prefetch: the source's default
WARMUP = 2_000
JIT_WARMUP = 100_000  # messages in the unmeasured warm-up query per format and size
# ... repeated while the JVM's JIT compiler threads took more than JIT_SETTLED CPU-s in it, at most
# JIT_WARMUP_MAX times: measured on 2026-11-25 (1,000,000 x 4 KiB Malamute runs after three 100,000
# warm-ups), the C2 threads took 4.1, 2.6, 0.9, 0.5 CPU-s in consecutive runs, the JVM's whole CPU
# 10.7 to 5.5 s: a one-off cost of a Spark session, which a measured run should not pay
JIT_SETTLED = 0.3
JIT_WARMUP_MAX = 4
MEMORY_MESSAGES = 200_000
MEMORY_BOUND = 20_000  # maxUncommittedMessages of the memory runs
MEMORY_MALAMUTE = 400_000  # the Malamute memory run (the embedded broker keeps them all in its memory)
TARGET = 0.7
ROUNDS = 3  # each pair is measured this many times; the round with the median ratio is reported


def _arg(argv, name, default, kind=int):
    for a in argv:
        if a.startswith(f"--{name}="):
            return kind(a.split("=", 1)[1])
    return default


# -- preload and raw consumption per protocol ---------------------------------------------------

def amqp_preload(url, queue, n, size):
    from spark_mq.clients.amqp08 import BasicProperties, Connection
    body = b"x" * size
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, durable=True)
        props = BasicProperties(delivery_mode=2)
        ch.publish_many(("", queue, body, props) for _ in range(n))
        # RabbitMQ counts a publish once its queue process has taken it, which lags the publisher:
        # wait until all n are queued, or the drain would (rightly) stop at what was there when it began
        deadline = time.monotonic() + 600
        while ch.queue_declare(queue, passive=True).message_count < n and time.monotonic() < deadline:
            time.sleep(0.2)


def amqp_raw(url, queue, n):
    from spark_mq.clients.amqp08 import Connection
    got = 0
    t0 = time.perf_counter()
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        ch.basic_consume(queue)
        while got < n:
            msg = ch.next_message(10)
            if msg is None:
                break
            batch = [msg] + ch.drain(1000)
            got += len(batch)
            ch.basic_ack(batch[-1].delivery_tag, multiple=True)
    return got, time.perf_counter() - t0


def pika_peer(url, queue, n):
    """pika's BlockingConnection consuming with a callback, prefetch 1000, a multiple ack every
    ``PEER_ACK_EVERY`` messages (and at the last)."""
    import pika
    got = 0
    t0 = time.perf_counter()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=PREFETCH)

        def on_message(channel, method, properties, body):
            nonlocal got
            got += 1
            if got % PEER_ACK_EVERY == 0 or got >= n:
                channel.basic_ack(method.delivery_tag, multiple=True)
            if got >= n:
                channel.stop_consuming()

        ch.basic_consume(queue, on_message, auto_ack=False)
        # stops at n, or after 10 s without a message (as the raw client's next_message(10)); a call
        # may return having dispatched nothing (other events), so the silence is timed, not counted
        last = time.monotonic()
        while got < n and time.monotonic() - last < 10:
            before = got
            conn.process_data_events(time_limit=1)
            if got != before:
                last = time.monotonic()
        seconds = time.perf_counter() - t0
    finally:
        conn.close()
    return got, seconds


def stomppy_peer(url, dest, n):
    """stomp.py (STOMP 1.0) with a listener, ``ack:client``, prefetch 1000 (ActiveMQ's and RabbitMQ's
    headers both), a cumulative ACK every ``PEER_ACK_EVERY`` messages (and at the last)."""
    import threading as _threading
    from urllib.parse import urlsplit

    import stomp
    parts = urlsplit(url)
    done, state = _threading.Event(), {"got": 0, "last": time.monotonic()}

    class Listener(stomp.ConnectionListener):
        def on_message(self, frame):
            state["got"] += 1
            state["last"] = time.monotonic()
            if state["got"] % PEER_ACK_EVERY == 0 or state["got"] >= n:
                conn.ack(frame.headers["message-id"])
            if state["got"] >= n:
                done.set()

    conn = stomp.Connection10([(parts.hostname or "127.0.0.1", parts.port or 61613)])
    conn.set_listener("bench", Listener())
    conn.connect(parts.username or "guest", parts.password or "guest", wait=True)
    try:
        t0 = time.perf_counter()
        conn.subscribe(dest, id="1", ack="client",
                       headers={"activemq.prefetchSize": str(PREFETCH), "prefetch-count": str(PREFETCH)})
        while not done.wait(0.5) and time.monotonic() - state["last"] < 10:
            pass
        seconds = time.perf_counter() - t0
    finally:
        conn.disconnect()
    return state["got"], seconds


def stomp_preload(url, dest, n, size):
    from spark_mq.clients.stomp import StompClient
    body = b"x" * size
    with StompClient.from_uri(url) as c:
        c.send_many(dest, (body for _ in range(n)), receipt=True)


def stomp_raw(url, dest, n):
    from spark_mq.clients.stomp import StompClient
    got = 0
    t0 = time.perf_counter()
    with StompClient.from_uri(url) as c:
        c.subscribe(dest, ack="client", prefetch=1000)
        while got < n:
            frames = c.receive_many(1000, timeout=10)
            if not frames:
                break
            got += len(frames)
            c.ack(frames[-1])
    return got, time.perf_counter() - t0


def mlm_preload(endpoint, mailbox, n, size):
    from spark_mq.clients.malamute import MalamuteClient
    body = b"x" * size
    # the broker answers PINGs behind every send queued before them: a GB of sends takes it longer
    # than the reference client's 4 s of silence before "server lost"
    with MalamuteClient(endpoint, f"p-{uuid.uuid4().hex[:8]}", timeout=5, server_timeout=60) as c:
        for _ in range(n):
            c.sendto(mailbox, "s", body)
        c.ping(timeout=60)


def mlm_raw(endpoint, mailbox, n):
    from spark_mq.clients.malamute import MalamuteClient
    got = 0
    t0 = time.perf_counter()
    with MalamuteClient(endpoint, mailbox, timeout=5) as c:
        while got < n:
            if c.recv(timeout=10) is None:
                break
            got += 1
    return got, time.perf_counter() - t0


def protocol_table(amqp_url: str, stomp_url: str, mlm_endpoint: str, activemq_url: Optional[str] = None) -> dict:
    """row -> (preload(name, n, size), raw(name, n) -> (received, seconds), source options(name)). A
    row is a format, or format-broker where the format is measured on a second broker
    (``stomp-activemq``, with ``activemq_url``): ``format_of`` gives the format."""
    table = {
        "amqp08": (lambda name, n, s: amqp_preload(amqp_url, name, n, s), lambda name, n: amqp_raw(amqp_url, name, n),
                   lambda name: {"uri": amqp_url, "queue": name}),
        "stomp": (lambda name, n, s: stomp_preload(stomp_url, "/queue/" + name, n, s),
                  lambda name, n: stomp_raw(stomp_url, "/queue/" + name, n),
                  # the default quiet period (1 s), not _run_source's 0.5 s: twice a 500,000 x 100 B
                  # drain on RabbitMQ ended at 0.5 s of silence after about 5,380 messages: RabbitMQ's STOMP
                  # adapter pauses up to 0.54 s within a drain (python -m bench.stomp_pauses; docs/performance.md)
                  lambda name: {"uri": stomp_url, "destination": "/queue/" + name, "quietPeriod": "1"}),
        "malamute": (lambda name, n, s: mlm_preload(mlm_endpoint, name, n, s),
                     lambda name, n: mlm_raw(mlm_endpoint, name, n),
                     lambda name: {"uri": mlm_endpoint, "mailbox": name}),
    }
    if activemq_url:
        table["stomp-activemq"] = (lambda name, n, s: stomp_preload(activemq_url, "/queue/" + name, n, s),
                                   lambda name, n: stomp_raw(activemq_url, "/queue/" + name, n),
                                   # the default quiet period; ActiveMQ's stamps end a drain too (sources.formats.stomp)
                                   lambda name: {"uri": activemq_url, "destination": "/queue/" + name,
                                                 "quietPeriod": "1"})
    return table


def peer_table(amqp_url: str, stomp_url: str, activemq_url: Optional[str] = None) -> dict:
    """row -> (peer library's name, consume(name, n) -> (received, seconds)); rows without a peer are absent."""
    table = {"amqp08": ("pika", lambda name, n: pika_peer(amqp_url, name, n)),
             "stomp": ("stomp.py", lambda name, n: stomppy_peer(stomp_url, "/queue/" + name, n))}
    if activemq_url:
        table["stomp-activemq"] = ("stomp.py", lambda name, n: stomppy_peer(activemq_url, "/queue/" + name, n))
    return table


def format_of(row: str) -> str:
    """The source format of a row of ``protocol_table`` (``stomp-activemq`` -> ``stomp``)."""
    return row.split("-", 1)[0]


def only_formats(protocols: dict, only: Optional[str]) -> dict:
    """``--only=a,b``: those rows of ``protocols`` (a format names its rows on every broker:
    ``stomp`` is ``stomp`` and ``stomp-activemq``); all without it."""
    if not only:
        return dict(protocols)
    wanted = only.split(",")
    return {row: p for row, p in protocols.items() if row in wanted or format_of(row) in wanted}


def pairs(protocols: dict, counts: dict, rounds: int, prefix: str):
    """The measured order: every format and size once per round (so a noisy minute of this shared
    machine lands in one round of several pairs, not in every round of one pair). Yields (round,
    format, size label, body size, count, a fresh queue name, (preload, raw, options)); the caller
    preloads and runs."""
    for rnd in range(rounds):
        for fmt, protocol in protocols.items():
            for label, size in SIZES.items():
                yield (rnd, fmt, label, size, counts[fmt][label],
                       f"{prefix}-{fmt}-{label}-{uuid.uuid4().hex[:6]}", protocol)


# -- the source through Spark -------------------------------------------------------------------

def warm_workers(spark, fmt, preload, options) -> None:
    """A small query in two partitions, so that both executor Python workers are running when the
    next query starts. Spark stops a Python worker that stayed idle for a minute (PythonWorkerFactory's
    IDLE_WORKER_TIMEOUT_NS, not configurable), and a pair's preload and raw run take longer than
    that: without this the measured source run started fresh workers (each importing numpy, pyarrow
    and pyspark's modules from Spark's zip: 2.3-3.5 CPU-s more in the workers and 2.7-4.0 s more per
    1,000,000 x 4 KiB Malamute run, scratch A/B of 2 rounds on 2026-11-26), while Spark alone, which
    follows the source within seconds, never did. Unmeasured; the same for every format."""
    warm = f"bench-{fmt}-warmup-{uuid.uuid4().hex[:6]}"
    preload(warm, WARMUP, 100)
    run_source(spark, format_of(fmt), {**options(warm), "numPartitions": "2"}, tempfile.mkdtemp(prefix="bench-log-"))


class SourceRun(NamedTuple):
    rows: int
    seconds: float               # start() (load() included) to termination
    query: object
    in_batches: float            # summed triggerExecution of the micro-batches
    first_data: Optional[float]  # start() to the first message in the source log (None: never seen)
    last_data: Optional[float]   # start() to the last append seen (the drain's steady part ends there)


def run_source(spark, fmt, options, logdir) -> SourceRun:
    try:
        return _run_source(spark, fmt, options, logdir)
    finally:
        shutil.rmtree(logdir, ignore_errors=True)  # hundreds of MB per run: the final batch is never committed
        shutil.rmtree(_checkpoint_of(logdir), ignore_errors=True)


def _checkpoint_of(logdir: str) -> str:
    return logdir + "-ckpt"


def _first_data(logdir: str, header: int, t0: float, stop: threading.Event, out: list) -> None:
    """Poll ``logdir`` until a segment holds more than its schema header: the first group's append
    (``out[0]``); then until ``stop``, the time the log last grew (``out[1]``)."""
    total = None
    while not stop.is_set():
        try:
            sizes = [e.stat().st_size for e in os.scandir(logdir) if e.name.startswith(SEGMENT_PREFIX)]
        except OSError:
            sizes = []
        if not out:
            if any(size > header for size in sizes):
                out.append(time.perf_counter() - t0)
                out.append(out[0])
                total = sum(sizes)
        elif sum(sizes) > total:
            total = sum(sizes)
            out[1] = time.perf_counter() - t0
        stop.wait(0.01)


def _run_source(spark, fmt, options, logdir) -> SourceRun:
    r = spark.readStream.format(fmt).option("logLocation", logdir).option("quietPeriod", "0.5")
    for k, v in options.items():
        r = r.option(k, v)
    ckpt = _checkpoint_of(logdir)
    header = S.source_arrow_schema(fmt).serialize().size  # a segment starts with the schema message
    stop, first = threading.Event(), []
    t0 = time.perf_counter()
    watcher = threading.Thread(target=_first_data, args=(logdir, header, t0, stop, first), daemon=True)
    watcher.start()
    try:
        q = r.load().writeStream.format("noop").option("checkpointLocation", ckpt).trigger(availableNow=True).start()
        q.awaitTermination(600)
        seconds = time.perf_counter() - t0
    finally:
        stop.set()
        watcher.join(2)
    if q.exception() is not None:
        raise RuntimeError(f"{fmt} query failed: {q.exception()}")
    progress = q.recentProgress
    rows = sum(p["numInputRows"] for p in progress)
    in_batches = sum(p["durationMs"].get("triggerExecution", 0) for p in progress) / 1000
    return SourceRun(rows, seconds, q, in_batches, first[0] if first else None, first[1] if first else None)


def _reader_pids() -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"python_streaming_source_runner" in cmd:
            out.append(int(pid))
    return out


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def memory_run(spark, fmt: str, preload, options: dict, n: int) -> dict:
    """``n`` 100-byte messages through the ``fmt`` source with a log bound of MEMORY_BOUND messages,
    sampling the RSS of the driver-side reader process: it must level off, whatever ``n``."""
    queue = f"bench-mem-{uuid.uuid4().hex[:6]}"
    preload(queue, n, 100)
    samples: list[float] = []
    stop = threading.Event()

    times: list[float] = []
    t0 = time.monotonic()

    def sample():
        while not stop.is_set():
            for pid in _reader_pids():
                samples.append(_rss_mib(pid))
                times.append(time.monotonic() - t0)
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    got, seconds, *_ = run_source(spark, fmt, {**options(queue),
                                                 "maxUncommittedMessages": str(MEMORY_BOUND),
                                                 "maxMessagesPerTrigger": str(MEMORY_BOUND // 2)},
                                    tempfile.mkdtemp(prefix="bench-log-"))
    stop.set()
    sampler.join(2)
    if got != n:
        raise RuntimeError(f"{fmt} memory run: the source delivered {got} of {n} messages")
    k = max(1, len(samples) // 4)
    quarters = [round(max(samples[i:i + k]), 1) for i in range(0, k * 4, k)] if samples else []
    return {"format": fmt, "messages": n, "rows": got, "seconds": seconds, "bound_messages": MEMORY_BOUND,
            "reader_rss_mib_max": max(samples) if samples else None,
            "reader_rss_mib_first": samples[0] if samples else None,
            "reader_rss_mib_quarters": quarters, "samples": len(samples),
            "reader_rss_series": [(round(times[i], 1), round(samples[i], 1))
                                  for i in range(0, len(samples), max(1, len(samples) // 300))]}


def main(argv: list[str]) -> dict:
    counts = {fmt: dict(c) for fmt, c in COUNTS.items()}
    memory_n = _arg(argv, "memory", MEMORY_MESSAGES)
    memory_mlm_n = _arg(argv, "memory-malamute", MEMORY_MALAMUTE)
    rounds = max(1, _arg(argv, "rounds", ROUNDS))
    warm_up = bool(_arg(argv, "warm", 1))
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    brokers = harness()
    BrokerProcess = integration_module("broker_process").BrokerProcess

    only = _arg(argv, "only", None, str)
    n_override = _arg(argv, "n", None)  # a quick check of the code: every count this (the run writes nothing)
    if n_override:
        counts = {fmt: {label: n_override for label in c} for fmt, c in counts.items()}
    rabbit = brokers.start_rabbitmq()
    activemq = None
    if not only or "stomp" in only.split(",") or "stomp-activemq" in only.split(","):
        activemq = brokers.start_activemq()
    # mailboxes hold 100,000 messages by default (more are dropped, as Malamute's bounded queues do).
    # They are kept in memory, as the reference broker (zeromq/malamute) keeps them: the journal of
    # --mailbox-dir, our broker's extension, cost it 2-3 CPU-s more per 1,500,000 x 4 KiB drain
    # whichever client drained it: CPU of this 2-core machine that both runs pay for, the CPU-bound
    # source run the more (scratch A/B of 2026-11-28 in bench/HISTORY.md, "The Malamute broker's
    # journal"). Until then the benchmark's broker journaled them.
    mlm = BrokerProcess(client_timeout=60.0,
                        args=("--max-queue", str(max(max(COUNTS["malamute"].values()) * 2, memory_mlm_n))))
    mlm.start()
    from pyspark.sql import SparkSession
    from spark_mq.datasources import Amqp08DataSource
    from spark_mq.datasources import MalamuteDataSource
    from spark_mq.datasources import StompDataSource

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.python.authenticate.socketTimeout", "120s")
             # recentProgress keeps the last 100 batches by default; the memory run has more
             .config("spark.sql.streaming.numRecentProgressUpdates", "100000").getOrCreate())
    for ds in (Amqp08DataSource, StompDataSource, MalamuteDataSource):
        spark.dataSource.register(ds)
    from bench import ceiling
    ceiling.register(spark)
    cores = os.cpu_count() or 1
    figures: dict = {"counts": counts, "target_ratio": TARGET, "rounds": rounds}
    rows = []
    try:
        amqp_url, stomp_url = rabbit.url("amqp"), rabbit.url("stomp")
        activemq_url = f"stomp://127.0.0.1:{activemq.stomp_port}" if activemq is not None else None
        protocols_all = protocol_table(amqp_url, stomp_url, mlm.endpoint, activemq_url)
        peers = peer_table(amqp_url, stomp_url, activemq_url)
        protocols = only_formats(protocols_all, only)
        measured: dict = {}
        warm_ups: dict = {}
        for fmt, (preload, raw, options) in protocols.items():
            warm_workers(spark, fmt, preload, options)
        if warm_up:
            for fmt, (preload, raw, options) in protocols.items():
                for label, size in SIZES.items():
                    jits = []
                    while len(jits) < JIT_WARMUP_MAX and (not jits or jits[-1] > JIT_SETTLED):
                        warm = f"bench-{fmt}-{label}-warm-{uuid.uuid4().hex[:6]}"
                        preload(warm, JIT_WARMUP, size)
                        with ProcessCpu() as warm_cpu:
                            got, seconds, *_ = run_source(spark, format_of(fmt), options(warm),
                                                          tempfile.mkdtemp(prefix="bench-log-"))
                        jits.append(warm_cpu.jit)
                        print(f"warm-up (not measured): {fmt} {label} {got} messages in {seconds:.1f}s, JIT "
                              f"{warm_cpu.jit:.2f} CPU-s", flush=True)
                    warm_ups[f"{fmt}_{label}"] = jits
        for rnd, fmt, label, size, n, name, (preload, raw, options) in pairs(protocols, counts, rounds, "bench"):
            preload(name + "-raw", n, size)
            raw_settle = settle()
            with ProcessCpu() as raw_cpu:
                got_raw, raw_s = raw(name + "-raw", n)
            peer_name, peer = peers.get(fmt, (None, None))
            if peer is not None:
                preload(name + "-peer", n, size)
                peer_settle = settle()
                with ProcessCpu() as peer_cpu:
                    got_peer, peer_s = peer(name + "-peer", n)
                if got_peer != n:
                    raise RuntimeError(f"{fmt} {label}: {peer_name} got {got_peer} of {n}")
            preload(name, n, size)
            warm_workers(spark, fmt, preload, options)
            src_settle = settle()
            with ProcessCpu() as src_cpu:
                got_src, src_s, _, batch_s, first_s, last_s = run_source(spark, format_of(fmt), options(name),
                                                                 tempfile.mkdtemp(prefix="bench-log-"))
            # Spark alone on the same rows (no broker, no ingest, no log): what the source
            # cannot beat; with the raw run's CPU it bounds the best ratio this machine allows
            with ProcessCpu() as ceil_cpu:
                got_ceil, ceil_s = ceiling.run(spark, format_of(fmt), n, size)
            if got_raw != n or got_src != n or got_ceil != n:
                raise RuntimeError(f"{fmt} {label}: raw client got {got_raw}, source {got_src}, Spark alone "
                                   f"{got_ceil} of {n}: the rates would not compare the same work")
            best_s = max(ceil_s, (sum(ceil_cpu.seconds.values()) + sum(raw_cpu.seconds.values())) / cores)
            raw_rate, src_rate = got_raw / raw_s, got_src / src_s
            batch_rate = got_src / batch_s if batch_s else 0.0
            row = {"n": n, "raw_received": got_raw, "source_rows": got_src, "round": rnd + 1,
                   "raw_msgs_per_s": raw_rate, "source_msgs_per_s": src_rate,
                   "source_in_batches_msgs_per_s": batch_rate,
                   "ratio": src_rate / raw_rate, "ratio_in_batches": batch_rate / raw_rate,
                   "raw_seconds": raw_s, "source_seconds": src_s, "first_data_seconds": first_s,
                   # CPU seconds by process during each run ("driver" is this process: the raw
                   # client itself in the raw run; py4j and the CPU sampler in the source run)
                   "raw_cpu": raw_cpu.seconds, "source_cpu": src_cpu.seconds,
                   # of "jvm": the JIT compiling (high while the session's JIT is still warming up)
                   "source_jit_cpu": src_cpu.jit, "ceiling_jit_cpu": ceil_cpu.jit,
                   "ceiling_seconds": ceil_s, "ceiling_msgs_per_s": got_ceil / ceil_s,
                   "ceiling_ratio": (got_ceil / ceil_s) / raw_rate, "ceiling_cpu": ceil_cpu.seconds,
                   "best_possible_ratio": raw_s / best_s,
                   # how long each timed run waited for its preload to be over (bench.common.settle)
                   "raw_settle": raw_settle, "source_settle": src_settle}
            # from the first message in the log to the query's end: the drain without the query's
            # start (the reader process, connecting), with its tail (quiet period, last batch)
            after_first = got_src / (src_s - first_s) if first_s is not None and src_s > first_s else None
            # from the first append to the last: the drain's steady part, without start or tail (the
            # quiet period that tells a drained queue, the last batch)
            steady = got_src / (last_s - first_s) if first_s is not None and last_s and last_s > first_s else None
            row.update({"source_after_first_msgs_per_s": after_first, "source_steady_msgs_per_s": steady,
                        "last_data_seconds": last_s})
            if peer is not None:
                peer_rate = got_peer / peer_s
                row.update({"peer": peer_name, "peer_msgs_per_s": peer_rate, "peer_seconds": peer_s,
                            "peer_cpu": peer_cpu.seconds, "peer_settle": peer_settle,
                            "peer_ratio": src_rate / peer_rate, "raw_vs_peer": raw_rate / peer_rate,
                            "peer_ratio_after_first": after_first / peer_rate if after_first else None,
                            "peer_ratio_steady": steady / peer_rate if steady else None})
            measured.setdefault((fmt, label), []).append(row)
            print(f"round {rnd + 1}: {fmt} {label} raw {raw_rate:.0f} msg/s, source {src_rate:.0f} msg/s, "
                  f"ratio {src_rate / raw_rate:.2f}"
                  + (f", {peer_name} {row['peer_msgs_per_s']:.0f} msg/s, source/{peer_name} {row['peer_ratio']:.2f} "
                     f"({row['peer_ratio_after_first'] or float('nan'):.2f} from the first message in the log, "
                     f"{row['peer_ratio_steady'] or float('nan'):.2f} steady: first to last append)"
                     if peer is not None else "") + ", first message in the log after "
                  f"{first_s if first_s is not None else float('nan'):.2f}s; Spark alone x{(got_ceil / ceil_s) / raw_rate:.2f}, "
                  f"best possible x{raw_s / best_s:.2f}; CPU s raw {raw_cpu.seconds}, source {src_cpu.seconds} "
                  f"(JIT {src_cpu.jit}), "
                  f"Spark alone {ceil_cpu.seconds}",
                  flush=True)
        for (fmt, label), runs in measured.items():
            median = sorted(runs, key=lambda r: r["ratio"])[len(runs) // 2]
            figures[f"{fmt}_{label}"] = {**median, "rounds": len(runs),
                                         "round_ratios": [round(r["ratio"], 3) for r in runs]}
            if "peer_ratio" in median:
                figures[f"{fmt}_{label}"]["round_peer_ratios"] = [round(r["peer_ratio"], 3) for r in runs]
                figures[f"{fmt}_{label}"]["round_peer_ratios_steady"] = [
                    round(r["peer_ratio_steady"], 3) if r.get("peer_ratio_steady") else None for r in runs]
            rows.append((fmt, label, median["n"], median["raw_msgs_per_s"], median["source_msgs_per_s"],
                         median["ratio"], median["source_in_batches_msgs_per_s"], median.get("peer"),
                         median.get("peer_msgs_per_s"), median.get("peer_ratio")))
        if memory_n:
            amqp = protocols_all["amqp08"]
            figures["memory"] = memory_run(spark, "amqp08", amqp[0], amqp[2], memory_n)
        if memory_mlm_n:
            # Malamute has no acks to hold deliveries back: the receiver's bounded read-ahead (1 MiB)
            # is what keeps the reader's memory to the log bound while the mailbox holds the rest
            mlm_p = protocols_all["malamute"]
            figures["memory_malamute"] = memory_run(spark, "malamute", mlm_p[0], mlm_p[2], memory_mlm_n)
    finally:
        spark.stop()
        mlm.stop()
        rabbit._shutdown()
        if activemq is not None:
            activemq._shutdown()
    print(f"median of {rounds} round(s) by ratio;")
    print("source msg/s: query start to end (Spark start-up of the query included); in batches: rows over the")
    print("summed triggerExecution times of its micro-batches")
    print(f"{'format':14} {'size':5} {'n':>7} {'raw msg/s':>11} {'source msg/s':>13} {'ratio':>6} {'in batches':>11} "
          f"{'ratio':>6} {'peer':>9} {'peer msg/s':>11} {'src/peer':>8}")
    for fmt, label, n, raw_rate, src_rate, ratio, batch_rate, peer_name, peer_rate, peer_ratio in rows:
        print(f"{fmt:14} {label:5} {n:7d} {raw_rate:11.0f} {src_rate:13.0f} {ratio:6.2f} {batch_rate:11.0f} "
              f"{batch_rate / raw_rate:6.2f} {peer_name or '-':>9} "
              + (f"{peer_rate:11.0f} {peer_ratio:8.2f}" if peer_rate else f"{'-':>11} {'-':>8}"))
    for key in ("memory", "memory_malamute"):
        m = figures.get(key)
        if m:
            print(f"{m['format']} memory run: {m['rows']} of {m['messages']} messages in {m['seconds']:.1f}s, log bound "
                  f"{MEMORY_BOUND} messages; reader RSS MiB by quarter of the run: {m['reader_rss_mib_quarters']}, "
                  f"max {m['reader_rss_mib_max']:.0f}")
    figures["warm_up_queries"] = warm_up
    figures["malamute_mailboxes"] = "in memory"  # the embedded broker without --mailbox-dir (see above)
    figures["warm_workers"] = True  # every measured source run starts with both Python workers running
    figures["warm_up_jit_cpu"] = warm_ups  # per format and size: the JIT's CPU-s in each warm-up query
    write_results("sources", figures, partial=bool(only) or not memory_n or not memory_mlm_n or bool(n_override))
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
