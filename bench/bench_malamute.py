"""Malamute: STREAM-SEND -> STREAM-DELIVER rate through the embedded broker vs a raw pyzmq relay.

Both relays run as separate processes on loopback TCP, with the same producer and consumer
(raw DEALER sockets in this process: a producer thread sends N messages as fast as it can, the
main thread receives them). The peer is the simplest possible Python forwarder,
DEALER -> ROUTER (poll + NOBLOCK drain loop) -> DEALER, which does no protocol work at all; the
broker decodes the header, matches the subscription and builds the STREAM-DELIVER header.
A third row measures the same broker through the ``MalamuteClient`` facade (IO thread, pipes,
decoding into message objects). Rate = N / (first send .. last receive). Target: broker >= 0.7 x raw.

``python -m bench bench_malamute [--quick] [--repeats=N]``
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time

import zmq

from bench.common import integration_module, write_results
from spark_mq.protocol.malamute import codec

_broker_process = integration_module("broker_process")  # tests/integration/broker_process.py
BrokerProcess, free_tcp_port = _broker_process.BrokerProcess, _broker_process.free_tcp_port

SIZES = {"100B": 100, "4KiB": 4096}
COUNTS = {"100B": 200_000, "4KiB": 20_000}
QUICK_COUNTS = {"100B": 30_000, "4KiB": 5_000}
TARGET = 0.7
_RECV_TIMEOUT_MS = 10_000

RAW_RELAY = r"""
import sys, zmq
ctx = zmq.Context()
router = ctx.socket(zmq.ROUTER)
router.setsockopt(zmq.SNDHWM, 0); router.setsockopt(zmq.RCVHWM, 0)
router.bind(sys.argv[1])
print("ready", flush=True)
poller = zmq.Poller(); poller.register(router, zmq.POLLIN)
recv = router.recv_multipart; send = router.send_multipart; again = zmq.Again; nb = zmq.NOBLOCK
while True:
    poller.poll(1000)
    while True:
        try:
            frames = recv(nb)
        except again:
            break
        if frames[0] == b"P":
            frames[0] = b"C"
            send(frames)
"""


def _dealer(ctx: zmq.Context, endpoint: str, identity: bytes) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.ROUTING_ID, identity)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, _RECV_TIMEOUT_MS)
    sock.connect(endpoint)
    return sock


def _pump(producer_send, consumer_recv, count: int) -> tuple[float, int]:
    """Producer thread sends ``count``; the caller's thread receives. Returns (seconds, received)."""
    started = threading.Event()
    t0 = [0.0]

    def produce():
        started.set()
        t0[0] = time.perf_counter()
        for _ in range(count):
            producer_send()

    thread = threading.Thread(target=produce)
    thread.start()
    started.wait()
    received = 0
    try:
        for _ in range(count):
            if not consumer_recv():
                break
            received += 1
    finally:
        thread.join(60)
    return time.perf_counter() - t0[0], received


def run_raw(endpoint: str, size: int, count: int) -> tuple[float, int]:
    ctx = zmq.Context()
    try:
        prod, cons = _dealer(ctx, endpoint, b"P"), _dealer(ctx, endpoint, b"C")
        cons.send(b"hello")
        time.sleep(0.2)
        body = b"x" * size
        frames = [b"hdr", body]

        def recv():
            try:
                cons.recv_multipart()
                return True
            except zmq.Again:
                return False

        return _pump(lambda: prod.send_multipart(frames), recv, count)
    finally:
        ctx.destroy(0)


def run_broker_raw_sockets(endpoint: str, size: int, count: int, stream: str) -> tuple[float, int]:
    ctx = zmq.Context()
    try:
        prod, cons = _dealer(ctx, endpoint, b"P"), _dealer(ctx, endpoint, b"C")
        for sock, address in ((prod, "producer"), (cons, "consumer")):
            sock.send_multipart(codec.encode(codec.ConnectionOpen(address)))
            sock.recv_multipart()
        cons.send_multipart(codec.encode(codec.StreamRead(stream, "")))
        cons.recv_multipart()
        prod.send_multipart(codec.encode(codec.StreamWrite(stream)))
        prod.recv_multipart()
        frames = [codec.encode_header(codec.StreamSend("bench.subject")), b"x" * size]

        def recv():
            try:
                cons.recv_multipart()
                return True
            except zmq.Again:
                return False

        result = _pump(lambda: prod.send_multipart(frames), recv, count)
        for sock in (prod, cons):
            sock.send_multipart(codec.encode(codec.ConnectionClose()))
        return result
    finally:
        ctx.destroy(0)


def run_broker_client(endpoint: str, size: int, count: int, stream: str) -> tuple[float, int]:
    from spark_mq.clients.malamute import MalamuteClient
    with MalamuteClient(endpoint, "cprod", timeout=5) as prod, MalamuteClient(endpoint, "ccons", timeout=5) as cons:
        prod.set_producer(stream)
        cons.set_consumer(stream, "")
        body = b"x" * size
        return _pump(lambda: prod.send("bench.subject", body), lambda: cons.recv(timeout=10) is not None, count)


def main(argv: list[str]) -> dict:
    quick = "--quick" in argv
    repeats = next((int(a.split("=", 1)[1]) for a in argv if a.startswith("--repeats=")), 1 if quick else 3)
    counts = QUICK_COUNTS if quick else COUNTS
    raw_endpoint = f"tcp://127.0.0.1:{free_tcp_port()}"
    raw = subprocess.Popen([sys.executable, "-c", RAW_RELAY, raw_endpoint], stdout=subprocess.PIPE)
    broker = BrokerProcess(args=["--hwm", "0"], client_timeout=60.0)
    figures: dict = {"repeats": repeats, "counts": counts, "target_ratio": TARGET}
    try:
        if not raw.stdout.readline().startswith(b"ready"):
            raise RuntimeError("raw relay did not start")
        broker.start()
        rows = []
        for label, size in SIZES.items():
            count = counts[label]
            results: dict[str, list[float]] = {"raw": [], "broker": [], "client": []}
            lost = 0
            for r in range(repeats):
                for name, fn in (("raw", lambda: run_raw(raw_endpoint, size, count)),
                                 ("broker", lambda: run_broker_raw_sockets(broker.endpoint, size, count, f"b{r}{label}")),
                                 ("client", lambda: run_broker_client(broker.endpoint, size, count // 2, f"c{r}{label}"))):
                    n = count // 2 if name == "client" else count
                    seconds, received = fn()
                    lost += n - received
                    results[name].append(received / seconds)
            med = {k: statistics.median(v) for k, v in results.items()}
            figures[label] = {k: {"min": min(v), "median": med[k], "max": max(v)} for k, v in results.items()}
            figures[label]["ratio_broker_vs_raw"] = med["broker"] / med["raw"]
            figures[label]["ratio_client_vs_raw"] = med["client"] / med["raw"]
            figures[label]["lost"] = lost
            rows.append((label, count, med, lost))
    finally:
        broker.stop()
        raw.kill()
        raw.wait(10)
    print(f"{'body':>6} {'count':>8} {'raw relay msg/s':>16} {'broker msg/s':>13} {'ratio':>6} "
          f"{'via client msg/s':>17} {'ratio':>6} {'lost':>5}")
    for label, count, med, lost in rows:
        print(f"{label:>6} {count:>8} {med['raw']:>16,.0f} {med['broker']:>13,.0f} {med['broker'] / med['raw']:>6.2f} "
              f"{med['client']:>17,.0f} {med['client'] / med['raw']:>6.2f} {lost:>5}")
    print(f"target: broker >= {TARGET} x raw relay (medians of {repeats} runs)")
    write_results("bench_malamute", figures, partial=quick)
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
