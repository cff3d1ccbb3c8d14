"""Malamute receive path: our ZMTP DEALER (``MalamuteReceiver``) vs a pyzmq DEALER, same broker, same run.

Why: the Malamute source's reader spends most of its CPU receiving. ``MalamuteReceiver`` reads the
TCP stream itself (``spark_mq/protocol/zmtp.py``); the peer here is what it replaced: a pyzmq
DEALER read with ``recv_frames`` (``copy=False`` frames, no RCVMORE call) in the caller's thread,
feeding the same sans-IO ``ClientConnection`` (so both decode every message into the same
delivery objects). A third client is ours as the source's ingest drives it: each delivery's
content copied into one reused buffer, handed over by columns: the headers' fields and where each
content ends there (``poll(..., body=BodyBuffer())``, a ``Deliveries``), no delivery objects. For each body size, N
mails are preloaded into a mailbox of the embedded broker
(a separate process), the machine settles, then one client drains them in polls of up to 4,000;
CPU is this process's (every thread: libzmq's IO thread included), wall time from the first poll
to the last delivery. The clients alternate, ``--rounds`` times (3); the median round by CPU
ratio is reported.

    python -m bench zmtp                  # ~3 minutes
    python -m bench zmtp --rounds=1

Target: none of its own; it explains the source's Malamute figures (the reader's CPU per message).
"""

from __future__ import annotations

import sys
import time

import zmq

from bench.bench_sources import _arg, mlm_preload
from bench.common import settle, integration_module, write_results

SIZES = {"100B": 100, "4KiB": 4096}
COUNTS = {"100B": 1_000_000, "4KiB": 300_000}
ROUNDS = 3
POLL = 4000
TIMEOUT = 120.0


def _drain_ours(endpoint: str, mailbox: str, n: int) -> int:
    from spark_mq.clients.malamute import MalamuteReceiver

    got = 0
    with MalamuteReceiver(endpoint, mailbox, timeout=5) as rx:
        deadline = time.monotonic() + TIMEOUT
        while got < n and time.monotonic() < deadline:
            got += len(rx.poll(POLL, 1.0))
    return got


def _drain_columns(endpoint: str, mailbox: str, n: int) -> int:
    """Ours as the source uses it: content into a reused ``BodyBuffer``, deliveries by columns."""
    from spark_mq.clients.malamute import MalamuteReceiver
    from spark_mq.protocol.zmtp import BodyBuffer

    got = 0
    body = BodyBuffer()
    with MalamuteReceiver(endpoint, mailbox, timeout=5) as rx:
        deadline = time.monotonic() + TIMEOUT
        while got < n and time.monotonic() < deadline:
            body.fill = 0
            got += len(rx.poll(POLL, 1.0, body=body))
    return got


def _drain_pyzmq(endpoint: str, mailbox: str, n: int) -> int:
    """The replaced receive path: DEALER + recv_frames + ClientConnection, in this thread."""
    from spark_mq.protocol.malamute.client import ClientConnection, Reply
    from spark_mq.transport.zmqframes import NOBLOCK, recv_frames

    ctx = zmq.Context()
    dealer = ctx.socket(zmq.DEALER)
    dealer.linger = 0
    dealer.rcvhwm = 1000
    dealer.connect(endpoint)
    proto = ClientConnection()
    proto.open(mailbox, time.monotonic(), 5.0)
    got = 0
    try:
        for frames in proto.data_to_send():
            dealer.send_multipart(frames)
        deadline = time.monotonic() + TIMEOUT
        while got < n and time.monotonic() < deadline:
            now = time.monotonic()
            for _ in range(POLL):
                try:
                    frames = recv_frames(dealer, NOBLOCK)
                except zmq.Again:
                    break
                for event in proto.receive(frames, now):
                    if not isinstance(event, Reply) and hasattr(event, "content"):
                        got += 1
            proto.tick(now)  # heartbeats; its events (server lost) do not matter to a drain
            for frames in proto.data_to_send():
                dealer.send_multipart(frames)
            dealer.poll(1, zmq.POLLIN)
    finally:
        dealer.close(0)
        ctx.term()
    return got


CLIENTS = {"zmtp": _drain_ours, "pyzmq": _drain_pyzmq, "zmtp_columns": _drain_columns}


def main(argv: list[str]) -> dict:
    BrokerProcess = integration_module("broker_process").BrokerProcess

    rounds = max(1, _arg(argv, "rounds", ROUNDS))
    biggest = max(COUNTS.values())
    broker = BrokerProcess(client_timeout=60.0, args=("--max-queue", str(biggest * 2)))
    broker.start()
    runs: dict = {label: [] for label in SIZES}
    try:
        for rnd in range(rounds):
            for label, size in SIZES.items():
                n = COUNTS[label]
                row = {}
                for name, drain in CLIENTS.items():
                    mailbox = f"bench-zmtp-{rnd}-{label}-{name}"
                    mlm_preload(broker.endpoint, mailbox, n, size)
                    settle()
                    c0, t0 = time.process_time(), time.perf_counter()
                    got = drain(broker.endpoint, mailbox, n)
                    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                    if got != n:
                        raise RuntimeError(f"{name} {label}: drained {got} of {n}")
                    row[name] = {"seconds": seconds, "cpu_seconds": cpu, "cpu_us_per_msg": cpu / n * 1e6,
                                 "msgs_per_s": n / seconds}
                row["cpu_ratio"] = row["zmtp"]["cpu_seconds"] / row["pyzmq"]["cpu_seconds"]
                row["rate_ratio"] = row["zmtp"]["msgs_per_s"] / row["pyzmq"]["msgs_per_s"]
                row["columns_cpu_ratio"] = row["zmtp_columns"]["cpu_seconds"] / row["pyzmq"]["cpu_seconds"]
                runs[label].append(row)
                print(f"round {rnd + 1}: {n:,} x {label}: zmtp {row['zmtp']['cpu_us_per_msg']:.2f} CPU-us/msg "
                      f"{row['zmtp']['msgs_per_s']:,.0f} msg/s; pyzmq {row['pyzmq']['cpu_us_per_msg']:.2f} CPU-us/msg "
                      f"{row['pyzmq']['msgs_per_s']:,.0f} msg/s; CPU x{row['cpu_ratio']:.2f}, rate "
                      f"x{row['rate_ratio']:.2f}; into a body buffer (the source's path) "
                      f"{row['zmtp_columns']['cpu_us_per_msg']:.2f} CPU-us/msg, CPU x{row['columns_cpu_ratio']:.2f}",
                      flush=True)
    finally:
        broker.stop()
    figures: dict = {"counts": COUNTS, "rounds": rounds, "readme_rows": []}
    for label, rows in runs.items():
        median = sorted(rows, key=lambda r: r["cpu_ratio"])[len(rows) // 2]
        figures[label] = {**median, "round_cpu_ratios": [round(r["cpu_ratio"], 3) for r in rows]}
        figures["readme_rows"].append((
            "Malamute receive: our ZMTP DEALER vs pyzmq DEALER", f"{COUNTS[label]:,} x {label} mails drained",
            f"{median['zmtp']['cpu_us_per_msg']:.1f} CPU-us/msg",
            f"x{median['cpu_ratio']:.2f} CPU/msg, x{median['rate_ratio']:.2f} rate (median of {rounds}: CPU "
            + ", ".join(f"x{r['cpu_ratio']:.2f}" for r in rows) + ")",
            "(explains the source's reader)"))
        figures["readme_rows"].append((
            "Malamute receive as the source does it (content into one reused buffer) vs pyzmq DEALER",
            f"{COUNTS[label]:,} x {label} mails drained",
            f"{median['zmtp_columns']['cpu_us_per_msg']:.1f} CPU-us/msg",
            f"x{median['columns_cpu_ratio']:.2f} CPU/msg (same rounds: "
            + ", ".join(f"x{r['columns_cpu_ratio']:.2f}" for r in rows) + ")",
            "(explains the source's reader)"))
    write_results("zmtp", figures, partial=rounds != ROUNDS)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
