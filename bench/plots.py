"""The benchmark page: ``docs/benchmarks.md`` and its PNG plots, from the latest ``bench/results/*.json``.

``python -m bench.plots`` writes ``docs/bench/*.png`` (needs matplotlib: ``pip install -e .[bench]``)
and ``docs/benchmarks.md``; ``python -m bench`` runs it after the benchmarks. ``--check`` (no
matplotlib needed) exits 1 when the page's text differs from what the result files say, or a plot
it shows is missing: a test runs that check.

Every figure is a ratio against a peer measured in the same run (the machine is shared and noisy);
the plots show the absolute rates next to the ratios so the scale is visible too.
"""

from __future__ import annotations

import argparse
import json
import sys

from bench.bench_sources import JIT_SETTLED, JIT_WARMUP_MAX
from bench.report import RESULTS, ROOT, table

DOCS = ROOT / "docs"
PAGE = DOCS / "benchmarks.md"
PLOTS = DOCS / "bench"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _load(name: str):
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


# -- the data of each plot (pure: the page text and the check use it without matplotlib) ---------

def client_ratios() -> list[tuple[str, float, float]]:
    """(label, ratio, target) for the protocol clients against their peers: rate (target >= 1)."""
    out = []
    r = _load("amqp08")
    if r:
        for size, row in r["sizes"].items():
            out.append((f"AMQP publish {size} vs pika", row["publish_rate_ratio"], 1.0))
            out.append((f"AMQP consume {size} vs pika", row["consume_rate_ratio"], 1.0))
    r = _load("stomp")
    if r:
        for broker, b in r["brokers"].items():
            ratios = b["ratios (spark-mq / stomp.py)"]
            out.append((f"STOMP send vs stomp.py ({broker})", ratios["send_rate_ratio"], 1.0))
            out.append((f"STOMP receive vs stomp.py ({broker})", ratios["receive_rate_ratio"], 1.0))
    r = _load("bench_malamute") or _load("malamute")
    if r:
        for size in ("100B", "4KiB"):
            if size in r:
                out.append((f"Malamute broker {size} vs raw pyzmq", r[size]["ratio_broker_vs_raw"], 0.7))
    return out


def source_rows() -> list[tuple[str, float, float, float]]:
    """(label, raw msg/s, source msg/s, source msg/s counting batch time only) per format and size."""
    r = _load("sources")
    if not r:
        return []
    return [(k.replace("_", " "), r[k]["raw_msgs_per_s"], r[k]["source_msgs_per_s"],
             r[k]["source_in_batches_msgs_per_s"])
            for k in sorted(k for k in r if isinstance(r[k], dict) and "raw_msgs_per_s" in r[k])]


def sink_rows() -> list[tuple[str, float, float, float]]:
    """(format, raw rows/s, df.write rows/s, stream rows/s)."""
    r = _load("sinks")
    if not r:
        return []
    return [(fmt, row["raw"]["rows_per_s"], row["batch"]["rows_per_s"], row["stream"]["rows_per_s"])
            for fmt, row in r["sinks"].items()]


_CPU_KINDS = (("reader", "reader process"), ("jvm", "JVM"), ("pyworkers", "Python workers"),
              ("broker", "broker"), ("driver", "driver"))


def cpu_rows() -> list[tuple]:
    """(label, raw s, raw client CPU, raw broker CPU, source s, {kind: CPU s}, cores) for the median
    round of each format and size, where the results hold the CPU figures."""
    r = _load("sources")
    if not r:
        return []
    out = []
    for k in sorted(k for k in r if isinstance(r[k], dict) and "source_cpu" in r[k]):
        row = r[k]
        out.append((k.replace("_", " "), row["raw_seconds"], row["raw_cpu"].get("driver", 0.0),
                    row["raw_cpu"].get("broker", 0.0), row["source_seconds"], row["source_cpu"], r.get("cpus") or 1,
                    row.get("ceiling_seconds"), row.get("ceiling_cpu"), row.get("best_possible_ratio")))
    return out


def cpu_section() -> list[str]:
    rows = cpu_rows()
    if not rows:
        return []
    cores = rows[0][6]
    has_ceiling = all(row[7] is not None for row in rows)
    lines = [
        "## Where the CPU goes",
        "",
        f"CPU seconds by process during the median round's runs ({cores} cores; user + system, all threads,",
        "sampled from /proc by `bench.common.ProcessCpu`). The raw client runs in the benchmark's own process;",
        "in a source run the *reader process* is the driver-side Python process holding the ingest thread and",
        "the protocol client, the *JVM* is Spark's driver and executor (local mode), the *Python workers* read",
        "the log's segments for the tasks. *Floor* is the sum of all of it divided by the cores: no schedule",
        "finishes the source run faster on this machine.",
        "",
        "| format, size | raw: s | raw: client CPU | raw: broker CPU | source: s | "
        + " | ".join(label for _, label in _CPU_KINDS) + " | floor s | raw s / floor |"
        + (" Spark alone: s | Spark alone: CPU | best possible |" if has_ceiling else ""),
        "|---" * (7 + len(_CPU_KINDS) + (3 if has_ceiling else 0)) + "|",
    ]
    for label, raw_s, raw_client, raw_broker, src_s, cpu, cores, ceil_s, ceil_cpu, best in rows:
        total = sum(cpu.values())
        lines.append(f"| {label} | {raw_s:.2f} | {raw_client:.2f} | {raw_broker:.2f} | {src_s:.2f} | "
                     + " | ".join(f"{cpu.get(kind, 0.0):.2f}" for kind, _ in _CPU_KINDS)
                     + f" | {total / cores:.2f} | {raw_s / (total / cores):.2f} |"
                     + (f" {ceil_s:.2f} | {sum(ceil_cpu.values()):.2f} | {best:.2f} |" if has_ceiling else ""))
    lines += [
        "",
        "*Raw s / floor* is the best ratio the measured CPU total allows on this machine: where it is below",
        "0.7 the target needs CPU taken out of the pipeline, not better overlap.",
        "*Spark alone* is the same availableNow query to the noop sink on the same rows with no broker, no",
        "ingest and no log (`bench/ceiling.py`: a Python data source whose tasks yield one prebuilt Arrow",
        "batch over and over, partitioned as the sources partition): Spark's share, which no source can",
        "avoid. *Best possible* is the raw run's time over the longer of that query's time and (its CPU +",
        "the raw run's client and broker CPU) / cores: the ratio of a source whose reader cost what the raw",
        "client costs and only handed Spark the rows. It is not a hard bound: a reader whose receive path costs",
        "less than the raw client's beats it (Malamute's reads the socket with its own ZMTP code), as",
        "Malamute at 100 B does; where a source comes near it, the rest is this machine's noise. Of Spark's",
        "processes and ours, the reader process takes the most in every run. It receives the same socket traffic as the raw",
        "client, then does the ingest (Arrow batches, log appends, grouped fsyncs), and it",
        "imports pyspark from Spark's `pyspark.zip`, which Python compiles from source in every new reader",
        "process (importing pyspark's source runner took 0.82 s of CPU from the zip, 0.29 s from the installed",
        "package's cached bytecode, measured here with `time.process_time()` around the import). The JVM's",
        "share falls over the queries of one session as its JIT settles.",
        "Malamute's raw client keeps nothing and acknowledges nothing; the source's reader still takes less",
        "CPU than it at both sizes (it reads the socket without pyzmq's IO thread and builds each group's",
        "columns over one buffer), so what the source costs beyond it is Spark's share, the log's writes and",
        "the query's start and end. AMQP and STOMP raw clients pay for acknowledgements the broker must",
        "process, and there the gap between floor and run time is start-up and the ingest waiting for",
        "deliveries.",
        "",
    ]
    return lines


def ingest_section() -> list[str]:
    """The ingest alone (``bench ingest``): its rate against the raw client, with and without fsync."""
    r = _load("ingest")
    if not r:
        return []
    variants = r.get("variants") or ["defaults"]
    lines = [
        "## The ingest alone",
        "",
        "`./dev bench ingest`: the source's ingest thread alone (no Spark: the reader process's part of a",
        "source run) drains a preloaded queue into a source log, from its start until every message is",
        "durable, committing as it goes; its rate against the raw client consuming the same count in the",
        f"same run (median round of {r['rounds']}), for the default options and "
        + ", ".join(f"`{v}`" for v in variants if v != "defaults") + ". CPU seconds of the raw client's",
        "process and of the ingest's (client IO thread and ingest thread), and the ingest thread's wall time",
        "by stage: *poll* (taking deliveries from the client, waiting for them included), *append* (Arrow IPC",
        "written to the segment), *fsync*, *rest* (rows, Arrow batches, dedup, acks).",
        "",
        "| format, size | n | raw: s | "
        + " | ".join(f"ingest ratio ({v})" for v in variants)
        + " | raw: client CPU | ingest: CPU | poll s | append s | fsync s | rest s |",
        "|---" * (9 + len(variants)) + "|",
    ]
    for key in sorted(k for k in r if isinstance(r[k], dict) and "variants" in r[k]):
        row = r[key]
        d = row["variants"]["defaults"]
        st = d["stages"]
        lines.append(f"| {key.replace('_', ' ')} | {row['n']:,} | {row['raw_seconds']:.2f} | "
                     + " | ".join(f"{row['variants'][v]['ratio']:.2f}" for v in variants if v in row["variants"])
                     + f" | {row['raw_cpu'].get('driver', 0.0):.2f} | {d['cpu'].get('driver', 0.0):.2f} | "
                     f"{st['poll']:.2f} | {st['append']:.2f} | {st['fsync']:.2f} | {st['rest']:.2f} |")
    lines += [
        "",
        "The stages are of the defaults' run. Where *poll* is small the ingest thread is the bottleneck (the",
        "client has deliveries waiting); where it is large the client's IO thread is, and the two share one",
        "Python interpreter lock. The gap between this ratio and the source's in `bench sources` is Spark's",
        "share of the machine (JVM, Python workers) and the query's start and end.",
        "",
    ]
    f = _load("fsync")
    if f:
        ms = f["ms_per_group"]
        lines += [
            f"`./dev bench fsync` replays the log's write pattern alone ({f['groups']} groups of 1 MiB, each after",
            f"{f['work_ms']:.0f} ms of CPU work standing for receiving and building it): {ms['inline']:.2f} ms per group",
            f"with the fsync inline, as the ingest does it; {ms['flusher']:.2f} ms with the fsync in a thread of its",
            f"own, one group in flight (x{f['flusher_gain']:.2f}); {ms['no fsync']:.2f} ms without fsync",
            f"(x{f['most_possible_gain']:.2f}, the most any overlap could give). Median of {f['rounds']} alternating rounds.",
            "In the real ingest it paid only where no ack waits for the fsync. Tried on 2026-11-25 (the fsync in",
            "a thread of its own, one group in flight while the next is gathered, acks once its fsync returned),",
            "A/B in the same `bench ingest` run, 2 rounds, ingest ratio with the fsync thread against inline:",
            "amqp08 100 B 0.75 / 0.73 against 0.84 / 0.82, 4 KiB 0.76 / 0.78 against 0.80 / 0.82; malamute (then",
            "with `MalamuteClient`'s IO thread receiving during the fsync) 100 B 0.85 / 0.87 against 0.91 / 0.89,",
            "4 KiB 0.57 / 0.56 against 0.56 / 0.51. With acks a group waiting for its fsync holds up to half the",
            "prefetch unacknowledged, so the broker stops sending sooner (*poll* rose from 3.4 to 4.6 s at",
            "amqp08 100 B): inline there. Since the malamute ingest receives in its own thread (`MalamuteReceiver`,",
            "no IO thread), nothing received during an inline fsync, and the fsync thread is kept for Malamute and",
            "for `ackMode` commit and auto: malamute only, 2 rounds (a partial run, not in the table above):",
            "100 B 0.92 / 1.01, 4 KiB 0.60 / 0.63; with `fsync=false` 4 KiB 0.59 / 0.60, against 0.71 with the IO",
            "thread, which received while the ingest wrote the log. Also tried that day",
            "and not kept, each within this machine's noise: a 4 MiB receive buffer on the AMQP socket (ingest",
            "alone 0.82 / 0.77 of the raw client against 0.79 / 0.75), and `prefetch=4000` for amqp08 (ingest",
            "alone 0.87 / 0.86 against 0.83 / 0.79; whole source runs of 300,000 x 4 KiB 0.64 / 0.63 against",
            "0.58 / 0.62). What the log's durability costs is the disk's time for its bytes, most at 4 KiB:",
            "`fsync=false` (nothing more lost on a process crash; on a machine crash, what the kernel had not written back) takes it out.",
            "",
        ]
    return lines


def ingest_memory_section() -> list[str]:
    """The ingest's memory with recurring bodies (``bench ingest --memory``; issue 43, item 11)."""
    r = _load("ingest_memory")
    if not r:
        return []
    order = ("unique", "recurring", "recurring, before the fix")  # bench_ingest.MEMORY_KINDS
    kinds = sorted((k for k in r if isinstance(r[k], dict) and "identities_max" in r[k]),
                   key=lambda k: order.index(k) if k in order else len(order))
    lines = [
        "## The ingest's memory with recurring bodies",
        "",
        f"`./dev bench ingest --memory` (also at the end of a full `bench ingest`): the ingest alone drains "
        f"{r['messages']:,} AMQP",
        f"messages without message ids (the dedup identities are content hashes), `dedupWindow={r['dedupWindow']}`,",
        f"committing as it goes ({r.get('commit_lag', 0):,} messages behind the log's head, as Spark's commits lag a",
        "batch in flight), once with every body unique and once with `{}` as every hundredth body; each",
        "in a fresh process, the resident set's growth over the run (VmRSS sampled every 10 ms) and",
        "tracemalloc's peak in separate runs. *before the fix* runs the `_Dedup.add` before c3c3548 (a recurring",
        "identity kept its first position, and trimming stopped there): what a leak looks like in these figures.",
        "",
        "| bodies | identities held (max) | at the end | RSS growth MiB | tracemalloc peak MiB | against unique (identities, RSS, tracemalloc) | s |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in kinds:
        row = r[kind]
        vs = row.get("against_unique")
        against = (f"x{vs['identities_max']:.2f}, x{vs['rss_growth_mib']:.2f}, x{vs['tracemalloc_peak_mib']:.2f}"
                   if vs else "")
        lines.append(f"| {kind} | {row['identities_max']:,} | {row['identities_end']:,} | {row['rss_growth_mib']:.1f} | "
                     f"{row['tracemalloc_peak_mib']:.1f} | {against} | {row['seconds']:.1f} |")
    lines += ["", f"Measured {r['when']} ({r['cpus']} CPUs).", ""]
    return lines


def memory_run(key: str = "memory") -> dict | None:
    r = _load("sources")
    return r.get(key) if r else None


_DATA_OF = {"clients.png": client_ratios, "sources.png": source_rows, "sinks.png": sink_rows,
            "source_memory.png": memory_run}


def data_digest(name: str) -> str:
    """A digest of the figures a plot shows; written into the PNG, so a check can tell it is current."""
    import hashlib

    return hashlib.sha256(json.dumps(_DATA_OF[name](), sort_keys=True).encode()).hexdigest()[:16]


def plots() -> dict[str, str]:
    """file name -> caption, for the plots the current results allow."""
    out = {}
    if client_ratios():
        out["clients.png"] = "Protocol clients and the Malamute broker: rate relative to the peer (same run)"
    if source_rows():
        out["sources.png"] = "Sources: availableNow drain to the noop sink vs the raw client consuming the same count"
    if sink_rows():
        out["sinks.png"] = "Sinks: df.write and one streaming batch vs the raw client publishing the same rows"
    m = memory_run()
    if m and m.get("reader_rss_series"):
        out["source_memory.png"] = "Sources: RSS of the driver-side reader process over a long run with a small log bound"
    return out


# -- rendering ------------------------------------------------------------------------------------

def _render(name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if name == "clients.png":
        rows = client_ratios()
        fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1.2))
        labels = [r[0] for r in rows]
        ax.barh(labels, [r[1] for r in rows], color=["#2b7" if r[1] >= r[2] else "#d54" for r in rows])
        for i, (_, ratio, target) in enumerate(rows):
            ax.plot([target, target], [i - 0.4, i + 0.4], color="black", linewidth=1)
            ax.text(ratio, i, f" x{ratio:.2f}", va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("spark-mq rate / peer rate (bar); target (black tick)")
    elif name in ("sources.png", "sinks.png"):
        rows = source_rows() if name == "sources.png" else sink_rows()
        series = (("raw client", "source, end to end", "source, batch time only") if name == "sources.png"
                  else ("raw client", "df.write", "one stream batch"))
        fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.5))
        height = 0.27
        for j, label in enumerate(series):
            ys = [i + (j - 1) * height for i in range(len(rows))]
            values = [r[j + 1] for r in rows]
            ax.barh(ys, values, height=height, label=label)
            if j:
                for y, v, r in zip(ys, values, rows):
                    ax.text(v, y, f" x{v / r[1]:.2f}", va="center", fontsize=7)
        ax.set_yticks(range(len(rows)), [r[0] for r in rows])
        ax.invert_yaxis()
        ax.set_xlabel("messages per second (ratio to the raw client at the bar's end)")
        ax.legend(fontsize=8, loc="lower right")
    elif name == "source_memory.png":
        m = memory_run()
        t = [p[0] for p in m["reader_rss_series"]]
        mib = [p[1] for p in m["reader_rss_series"]]
        fig, ax = plt.subplots(figsize=(8, 3.2))
        ax.plot(t, mib)
        ax.set_xlabel("seconds into the run")
        ax.set_ylabel("reader RSS (MiB)")
        ax.set_ylim(bottom=0)
        ax.set_title(f"{m['messages']:,} messages, log bound {m['bound_messages']:,} messages", fontsize=9)
    else:
        raise ValueError(name)
    fig.tight_layout()
    PLOTS.mkdir(parents=True, exist_ok=True)
    fig.savefig(PLOTS / name, dpi=100, metadata={"Software": None, "Description": f"spark-mq-data:{data_digest(name)}"})
    plt.close(fig)


def page() -> str:
    parts = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench.plots` from `bench/results/*.json`, the files the benchmarks in `bench/`",
        "write (`./dev bench` runs them all, then this). Do not edit: a test fails when this page and the",
        "result files disagree.",
        "",
        "Every figure is a ratio against a peer measured in the same run: the machine is shared and noisy,",
        "so absolute rates move between runs while the ratios hold. Targets come from the issues that set them.",
        "",
        "| benchmark | command | peer |",
        "|---|---|---|",
        "| AMQP 0-8 client | `./dev bench amqp08` | pika, same broker, same run |",
        "| STOMP 1.0 client | `./dev bench stomp` | stomp.py, on RabbitMQ and ActiveMQ |",
        "| Malamute broker | `./dev bench malamute` | a raw pyzmq relay doing the same routing |",
        "| sources | `./dev bench sources` | our raw client consuming the same preloaded count |",
        "| sinks | `./dev bench sinks` | our raw client publishing the same rows |",
        "| the ingest alone (diagnostic) | `./dev bench ingest` | our raw client consuming the same preloaded count |",
        "| Malamute receive path (diagnostic) | `./dev bench zmtp` | the pyzmq DEALER our ZMTP DEALER replaced, same broker and mails (ours both plain and as the source drives it) |",
        "| writes during an fsync (diagnostic) | `./dev bench fsync` | the same appends with nothing beside them |",
        "| latency | `./dev bench latency` | the floor: a Python streaming source with no broker and no log, same run |",
        "",
        "## All figures",
        "",
        table(),
        "",
    ]
    for name, caption in plots().items():
        parts += [f"## {caption}", "", f"![{caption}](bench/{name})", ""]
    runs = [run for run in (memory_run(), memory_run("memory_malamute")) if run]
    if runs:
        parts += ["## Source memory", ""]
        for m in runs:
            quarters = m.get("reader_rss_mib_quarters")
            parts += [
                f"{m['rows']:,} of {m['messages']:,} messages through the {m.get('format', 'amqp08')} source in "
                f"{m['seconds']:.0f} s with `maxUncommittedMessages={m['bound_messages']:,}`: the reader process "
                f"peaked at {m['reader_rss_mib_max']:.0f} MiB"
                + (f"; peak by quarter of the run: {quarters} MiB." if quarters else "."),
                "",
            ]
        parts += ["Memory follows the log bound, not the message count.", ""]
    parts += [
        "## Reading the source figures",
        "",
        "*End to end* is the query from `start()` to termination; *batch time only* divides by the summed",
        "`triggerExecution` of the micro-batches (the first one's includes the reader process's start). A",
        "source run pays about 2 s that do not grow with the count and that the raw client does not pay.",
        "Timed from outside on amqp08 (the queue's depth polled on a second connection; 2 runs each of",
        "100,000 x 4 KiB and 200,000 x 100 B): 1.3-1.5 s from `start()` to the first consumed message, the",
        "drain itself at 0.72-0.83 of the raw client's rate, 0.7 s from the emptied queue to the query's end",
        "(the last groups and micro-batch). *First message in the log* in the table is the first part,",
        "measured in every run. The counts differ by format (`COUNTS` in `bench/bench_sources.py`) so that",
        "each raw client's run lasts about 10 s or more: with one count for all (500,000 x 100 B and 200,000",
        "x 4 KiB) the raw runs took 1.8-19 s on 2026-11-25, the fixed part was up to half a Malamute source",
        "run, and that run measured amqp08 0.73 / 0.59, stomp 1.02 / 0.85, malamute 0.55 / 0.32 (commit",
        "\"bench: ... with Spark alone measured beside each pair\").",
        "Traced on 100,000 x 4 KiB messages (Malamute, AMQP): 1.3 to 2 s pass between `start()`",
        "and Spark's first call into the source (the JVM's query start, and the reader process, which imports",
        "pyspark from Spark's `pyspark.zip` and so compiles it from source every time: importing pyspark's",
        "source runner took 1.1 s from the zip, 0.34 s from the installed package), 0.1-0.2 s connecting,",
        "then the drain and the reads, which overlap; an availableNow run without a queue depth (STOMP,",
        "Malamute) ends after `quietPeriod` of silence (0.5 s for Malamute in the benchmark; for STOMP the default",
        "1 s since 2026-11-26, after two RabbitMQ drains ended early at 0.5 s). The raw Malamute client does",
        "nothing per message but take it from the list its IO thread hands over, so its ratio measures the",
        "whole Spark path against almost nothing.",
        "",
    ]
    src = _load("sources") or {}
    if src.get("warm_up_queries"):
        parts += [
            "Before the measured rounds, unmeasured queries per format and size (100,000 messages each) warm",
            "the JVM's JIT compiler: traced in a fresh JVM, its C2 threads took about 1.9 CPU-s in each of the",
            "first 4 KiB queries, and without this warm-up the JVM's CPU per 4 KiB run fell from about 3.3 to",
            "1.8 s over three rounds. A long-running query pays that once; short availableNow runs in a fresh",
            "Spark session pay it every time.",
        ]
        jits = src.get("warm_up_jit_cpu")
        if jits:
            measured = [(key, src[key]["source_jit_cpu"]) for key in sorted(jits)
                        if isinstance(src.get(key), dict) and "source_jit_cpu" in src[key]]
            parts += [
                "One warm-up was not always enough (1,000,000 x 4 KiB Malamute runs after three warm-ups: the",
                "C2 threads took 4.1, 2.6, 0.9, 0.5 CPU-s in consecutive runs), so a warm-up query is repeated",
                f"until the JIT compiler threads take under {JIT_SETTLED} CPU-s in one, at most {JIT_WARMUP_MAX} times. "
                "The JIT's CPU-s in",
                "each warm-up of this run: " + "; ".join(f"{k.replace('_', ' ')} {', '.join(f'{x:.2f}' for x in v)}"
                                                        for k, v in sorted(jits.items())) + ".",
                "In the median round's source runs: " + "; ".join(f"{k.replace('_', ' ')} {v:.2f}"
                                                                   for k, v in measured) + ".",
            ]
        parts.append("")
    if src.get("warm_workers"):
        parts += [
            "Each measured source run also starts with both executor Python workers running: a small query",
            "in two partitions runs just before it (`warm_workers`). Spark stops a Python worker idle for a",
            "minute (not configurable), and a pair's preload and raw run take longer, so before 2026-11-26",
            "every measured source run started fresh workers while Spark alone, which follows it within",
            "seconds, did not. Fresh workers import numpy, pyarrow and pyspark's modules (from Spark's zip, so",
            "compiled from source each time): a scratch A/B on 1,000,000 x 4 KiB Malamute messages (2 rounds)",
            "measured 2.3-3.5 CPU-s more in the workers and 2.7-4.0 s more per run with fresh workers. A",
            "long-running query pays that once; an availableNow job pays it at every start, as a fixed cost.",
            "",
        ]
    settles = [row[key] for row in (_load("sources") or {}).values() if isinstance(row, dict)
               for key in ("raw_settle", "source_settle") if isinstance(row.get(key), dict)]
    if settles:
        parts += [
            "Each timed run, the raw client's and the source's, starts once its preload is over for the",
            "whole machine (`bench.common.settle`: `os.sync()`, then the broker's CPU under 5% of a core over",
            "0.5 s), so that neither pays for the other's setup: a 500,000 x 4 KiB Malamute preload left",
            "1.5-1.8 GB of dirty pages behind it in a scratch run. In the reported rounds the waits were short",
            f"(`os.sync()` up to {max(s['sync_seconds'] for s in settles):.2f} s, the whole wait up to "
            f"{max(s['settle_seconds'] for s in settles):.1f} s), and their effect on the ratios",
            "was not measured apart: runs before commit \"bench: ... settle\" did not wait, and they ran on",
            "another session's machine.",
            "",
        ]
    if (_load("sources") or {}).get("malamute_mailboxes") == "in memory":
        parts += [
            "The embedded Malamute broker keeps its mailboxes in memory, as the reference broker does. Until",
            "2026-11-28 it journaled them (`--mailbox-dir`, our extension), which cost it 2-3 CPU-s per 1,500,000 x",
            "4 KiB drain whichever client drained it, the CPU-bound source run paying the more: see",
            "[performance.md](performance.md#the-malamute-brokers-journal).",
            "",
        ]
    parts += cpu_section()
    parts += ingest_section()
    parts += ingest_memory_section()
    parts += latency_section()
    return "\n".join(parts)


def latency_section() -> list[str]:
    """Publish-to-foreachBatch latency (``bench latency``): every row beside the floor of the same run."""
    r = _load("latency")
    if not r:
        return []
    floor = r["floor"]
    lines = [
        "## Latency",
        "",
        f"`./dev bench latency`: a producer sends {r['rate_msgs_per_s']:,} messages a second, each body carrying",
        "its send time, to a streaming query with the default trigger whose `foreachBatch` collects the batch",
        "and records, per row, the time it saw the row minus the send time; "
        f"{r['seconds']:g} s measured per case after {r['warmup_seconds']:g} s of warm-up. The floor is a Python",
        "streaming source with no broker and no log whose rows carry the time they became available, measured",
        ("the same way first and last in the same run (its rows pooled). *every ms*: the mean spacing of the"
         if r.get("passes", 1) == 1 else
         f"the same way in the same run, before the first pass over the cases and after each ({r['passes']} passes,"
         " every other one in turned order; a row's and the floor's rows pooled over its passes). *every ms*: the"
         " mean spacing of the"),
        "batches; the Spark columns are medians of the batches' `durationMs` (`latestOffset`: the source's",
        "offset call; `addBatch`: the `foreachBatch` function, its collect included; `triggerExecution`: the",
        "whole batch).",
        "",
        "| row | ingest | p50 ms | p99 ms | max ms | x floor p50 | x floor p99 | batches | every ms |"
        " latestOffset ms | addBatch ms | triggerExecution ms |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def spark(row, part):
        v = row.get("spark_duration_ms_median", {}).get(part)
        return f"{v:.0f}" if v is not None else "-"

    for i, run in enumerate(floor["runs"]):
        name = f"run {i + 1}" if r.get("passes", 1) > 1 else "first" if i == 0 else "last"
        lines.append(f"| floor ({name}) | - | {run['p50_ms']:.0f} | {run['p99_ms']:.0f} | "
                     f"{run['max_ms']:.0f} | | | {run['batches']} | {run['batch_spacing_ms']:.0f} | "
                     f"{spark(run, 'latestOffset')} | {spark(run, 'addBatch')} | {spark(run, 'triggerExecution')} |")
    lines.append(f"| floor (pooled) | - | {floor['p50_ms']:.0f} | {floor['p99_ms']:.0f} | {floor['max_ms']:.0f} | "
                 "1.00 | 1.00 | | | | | |")
    for key, row in r["rows"].items():
        fmt, placement, *variant = key.split("/")
        fmt += f" (`{variant[0]}`)" if variant else ""
        lines.append(f"| {fmt} | {placement} | {row['p50_ms']:.0f} | {row['p99_ms']:.0f} | {row['max_ms']:.0f} | "
                     f"{row['p50_ratio']:.2f} | {row['p99_ratio']:.2f} | {row['batches']} | "
                     f"{row['batch_spacing_ms']:.0f} | {spark(row, 'latestOffset')} | {spark(row, 'addBatch')} | "
                     f"{spark(row, 'triggerExecution')} |")
    lines += [
        "",
        f"Target (issue 45): p50 within x{r['target']['p50_ratio']} and p99 within x{r['target']['p99_ratio']} of"
        " the floor. Where the time goes and what tunes it: [performance.md](performance.md#latency).",
        "",
    ]
    return lines


def check() -> list[str]:
    problems = []
    if not PAGE.exists() or PAGE.read_text() != page():
        problems.append(f"{PAGE.relative_to(ROOT)} is stale: run python -m bench.plots")
    for name in plots():
        path = PLOTS / name
        if not path.exists() or not path.read_bytes().startswith(PNG_MAGIC):
            problems.append(f"{path.relative_to(ROOT)} is missing or not a PNG: run python -m bench.plots")
        elif f"spark-mq-data:{data_digest(name)}".encode() not in path.read_bytes():
            problems.append(f"{path.relative_to(ROOT)} was drawn from other results: run python -m bench.plots")
    return problems


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    if args.check:
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        return 1 if problems else 0
    for name in plots():
        _render(name)
    PAGE.write_text(page())
    print(f"{PAGE.relative_to(ROOT)} and {len(plots())} plots in {PLOTS.relative_to(ROOT)}/ updated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
