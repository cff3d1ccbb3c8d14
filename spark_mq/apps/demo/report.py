"""What the demo shows: a live progress line (produced, Spark batches, rows/s, the source's backlog)
and the summary that checks every finalized window against the producer's own tally."""

from __future__ import annotations

import sys
import threading
import time

from spark_mq.apps.demo.orders import Producer, Tally
from spark_mq.apps.progress import backlog_of

__all__ = ["Display", "watch"]


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


def watch(query, producer: Producer, tally: Tally, results: list, lock: threading.Lock, args,
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
