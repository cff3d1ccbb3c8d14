"""STOMP 1.0: spark-mq's client versus stomp.py, same run, same brokers (RabbitMQ and ActiveMQ).

For each broker and client: send rate (one ``send`` call per message; for spark-mq also
``send_many``, which coalesces frames into few socket writes), receive rate (a pre-filled queue
drained with ack:auto: spark-mq both with ``receive_many`` (pull, a thread hand-over) and with an
``on_message`` callback (push, as stomp.py's listener)), and client CPU time per message (user+system of this process, all
threads, during the timed phase).  Every phase checks that all N messages arrived.

    python -m bench stomp [--n=20000] [--size=100] [--brokers=rabbitmq,activemq]

Brokers: SPARK_MQ_STOMP_<NAME>_PORT when set, else private brokers started for the run
(tests/integration/brokers.py).
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

from bench.common import flag_options, harness, measured, write_results

DEFAULTS = {"n": 20000, "size": 100, "brokers": "rabbitmq,activemq"}
TIMEOUT = 120.0


def _args(argv):
    return flag_options(argv, DEFAULTS)


def _start(name):
    import os

    port = os.environ.get(f"SPARK_MQ_STOMP_{name.upper()}_PORT")
    if port:
        return int(port), None
    brokers = harness()
    handle = {"rabbitmq": brokers.start_rabbitmq, "activemq": brokers.start_activemq}[name]()
    return handle.stomp_port, handle


# -- spark-mq ---------------------------------------------------------------------------------
def _ours(port):
    from spark_mq.clients.stomp import StompClient

    return StompClient("127.0.0.1", port, login="guest", passcode="guest", timeout=60).connect()


def ours_send(port, q, bodies):
    c = _ours(port)
    try:
        with measured() as m:
            send = c.send
            for b in bodies:
                send(q, b)
            c.flush(timeout=TIMEOUT)
    finally:
        c.disconnect()
    return m


def ours_send_many(port, q, bodies):
    c = _ours(port)
    try:
        with measured() as m:
            c.send_many(q, bodies, receipt=True)
    finally:
        c.disconnect()
    return m


def ours_receive(port, q, n):
    """Pull model: the reader thread queues, the caller takes with receive_many."""
    c = _ours(port)
    try:
        with measured() as m:
            c.subscribe(q, receipt=False)
            got = 0
            deadline = time.monotonic() + TIMEOUT
            while got < n and time.monotonic() < deadline:
                got += len(c.receive_many(1000, 5))
    finally:
        c.disconnect()
    if got != n:
        raise RuntimeError(f"spark-mq received {got} of {n}")
    return m


def ours_receive_callback(port, q, n):
    """Push model, like stomp.py's listener: on_message runs on the reader thread."""
    c = _ours(port)
    count = [0]
    done = threading.Event()

    def on_message(frame):
        count[0] += 1
        if count[0] >= n:
            done.set()

    try:
        with measured() as m:
            c.subscribe(q, receipt=False, on_message=on_message)
            done.wait(TIMEOUT)
    finally:
        c.disconnect()
    if count[0] != n:
        raise RuntimeError(f"spark-mq received {count[0]} of {n}")
    return m


# -- stomp.py ---------------------------------------------------------------------------------
def _theirs(port, listener=None):
    import stomp

    conn = stomp.Connection10([("127.0.0.1", port)])
    if listener is not None:
        conn.set_listener("bench", listener)
    conn.connect("guest", "guest", wait=True)
    return conn


def theirs_send(port, q, bodies):
    import stomp

    class Receipts(stomp.ConnectionListener):
        def __init__(self):
            self.done = threading.Event()

        def on_receipt(self, frame):
            self.done.set()

    listener = Receipts()
    conn = _theirs(port, listener)
    try:
        with measured() as m:
            send = conn.send
            for b in bodies:
                send(q, b)
            conn.send(q, b"", headers={"receipt": "end"})  # a flush barrier: the broker has all
            if not listener.done.wait(TIMEOUT):
                raise RuntimeError("stomp.py: no receipt")
    finally:
        conn.disconnect()
    return m


def theirs_receive(port, q, n):
    import stomp

    class Counter(stomp.ConnectionListener):
        def __init__(self):
            self.count = 0
            self.done = threading.Event()

        def on_message(self, frame):
            self.count += 1
            if self.count >= n:
                self.done.set()

    listener = Counter()
    conn = _theirs(port, listener)
    try:
        with measured() as m:
            conn.subscribe(q, id="1", ack="auto")
            listener.done.wait(TIMEOUT)
    finally:
        conn.disconnect()
    if listener.count != n:
        raise RuntimeError(f"stomp.py received {listener.count} of {n}")
    return m


def _drain_extra(port, q):
    """stomp.py's send phase adds one empty marker message; take it out of the queue."""
    c = _ours(port)
    try:
        c.subscribe(q)
        c.receive(10)
    finally:
        c.disconnect()


def _fill(port, q, bodies):
    c = _ours(port)
    try:
        c.send_many(q, bodies, receipt=True)
    finally:
        c.disconnect()


def run_broker(name, port, n, size):
    body = bytes(range(256)) * (size // 256 + 1)
    bodies = [body[:size] for _ in range(n)]
    rows = {}

    def queue():
        return f"/queue/bench-{name}-{uuid.uuid4().hex[:8]}"

    # Interleave ours and theirs so drift in the broker hits both alike.
    q = queue()
    rows["stomp.py send"] = theirs_send(port, q, bodies)
    _drain_extra(port, q)
    q2 = queue()
    rows["spark-mq send"] = ours_send(port, q2, bodies)
    rows["spark-mq receive"] = ours_receive(port, q2, n)
    q3 = queue()
    rows["spark-mq send_many"] = ours_send_many(port, q3, bodies)
    rows["stomp.py receive"] = theirs_receive(port, q3, n)
    q4 = queue()
    _fill(port, q4, bodies)
    rows["spark-mq receive cb"] = ours_receive_callback(port, q4, n)
    return {k: {"msgs_per_s": n / m.wall, "cpu_us_per_msg": 1e6 * m.cpu / n, "wall_s": m.wall} for k, m in rows.items()}


def main(argv):
    opts = _args(argv)
    n, size = opts["n"], opts["size"]
    figures = {"n": n, "size": size, "brokers": {}}
    for name in opts["brokers"].split(","):
        port, handle = _start(name)
        try:
            figures["brokers"][name] = run_broker(name, port, n, size)
        finally:
            if handle is not None:
                handle.stop()
    print(f"STOMP 1.0, {n} messages of {size} bytes per phase")
    print(f"{'broker':9} {'phase':20} {'msg/s':>10} {'CPU us/msg':>11}")
    for name, rows in figures["brokers"].items():
        for phase, r in rows.items():
            print(f"{name:9} {phase:20} {r['msgs_per_s']:10.0f} {r['cpu_us_per_msg']:11.1f}")
        ratios = {
            "send_cpu_ratio": rows["spark-mq send"]["cpu_us_per_msg"] / rows["stomp.py send"]["cpu_us_per_msg"],
            "send_many_cpu_ratio": rows["spark-mq send_many"]["cpu_us_per_msg"] / rows["stomp.py send"]["cpu_us_per_msg"],
            "receive_cpu_ratio": rows["spark-mq receive"]["cpu_us_per_msg"] / rows["stomp.py receive"]["cpu_us_per_msg"],
            "receive_cb_cpu_ratio": rows["spark-mq receive cb"]["cpu_us_per_msg"] / rows["stomp.py receive"]["cpu_us_per_msg"],
            "send_rate_ratio": rows["spark-mq send"]["msgs_per_s"] / rows["stomp.py send"]["msgs_per_s"],
            "send_many_rate_ratio": rows["spark-mq send_many"]["msgs_per_s"] / rows["stomp.py send"]["msgs_per_s"],
            "receive_rate_ratio": rows["spark-mq receive"]["msgs_per_s"] / rows["stomp.py receive"]["msgs_per_s"],
            "receive_cb_rate_ratio": rows["spark-mq receive cb"]["msgs_per_s"] / rows["stomp.py receive"]["msgs_per_s"],
        }
        rows["ratios (spark-mq / stomp.py)"] = ratios
        print(f"{name:9} ratios spark-mq/stomp.py: " + ", ".join(f"{k}={v:.2f}" for k, v in ratios.items()))
    path = write_results("stomp", figures, partial=opts != DEFAULTS)
    if path:
        print(f"results: {path}")
    return figures


if __name__ == "__main__":
    main(sys.argv[1:])
