"""AMQP 0-8 client versus pika (0-9-1) on the same RabbitMQ node, in the same run.

For 100 B and 4 KiB bodies: publish rate (per-message ``basic_publish`` calls, and spark-mq's
pipelined ``publish_many``), consume rate (manual acks with ``multiple`` every 100 messages,
prefetch 1000) in two styles each client offers: a blocking iterator (spark-mq ``next_message``,
pika ``channel.consume``) and a callback (spark-mq ``on_message`` on its reader thread, pika
``basic_consume`` + ``start_consuming``); and this process's CPU time per message (user+system,
all threads).
Each figure is the median of ``--rounds`` rounds; the ratios compare the two clients measured
alternately in the same rounds, so a noisy machine affects both alike.

Broker: ``SPARK_MQ_RABBITMQ_AMQP_URL`` if set, else a private node from the test harness.
Run: ``./dev bench amqp08`` or ``python -m bench amqp08 [--quick]``.
"""

from __future__ import annotations

import argparse
import statistics
import uuid

from bench.common import harness, measured, write_results

SIZES = (100, 4096)


def _counts(quick: bool) -> dict:
    return {100: 20_000, 4096: 10_000} if quick else {100: 100_000, 4096: 30_000}


# -- spark-mq --------------------------------------------------------------------------------


def ours_publish(url: str, queue: str, body: bytes, n: int, pipelined: bool):
    from spark_mq.clients.amqp08 import Connection

    with Connection.from_url(url) as conn:
        ch = conn.channel()
        with measured() as m:
            if pipelined:
                ch.publish_many(("", queue, body, None) for _ in range(n))
            else:
                publish = ch.basic_publish
                for _ in range(n):
                    publish("", queue, body)
            ch.queue_declare(queue, passive=True)  # a round trip: everything before it was processed
    return m


def ours_consume(url: str, queue: str, n: int):
    from spark_mq.clients.amqp08 import Connection

    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)
        with measured() as m:
            ch.basic_consume(queue)
            got = 0
            last = None
            while got < n:
                msg = ch.next_message(30)
                if msg is None:
                    raise RuntimeError(f"spark-mq consumer stalled after {got} of {n}")
                got += 1
                last = msg
                if got % 100 == 0:
                    ch.basic_ack(msg.delivery_tag, multiple=True)
            if got % 100:
                ch.basic_ack(last.delivery_tag, multiple=True)
            ch.queue_declare(queue, passive=True)
    return m


def ours_consume_callback(url: str, queue: str, n: int):
    import threading

    from spark_mq.clients.amqp08 import Connection

    done = threading.Event()
    state = {"got": 0}
    with Connection.from_url(url) as conn:
        ch = conn.channel()
        ch.basic_qos(prefetch_count=1000)

        def on_message(msg):
            state["got"] += 1
            got = state["got"]
            if got % 100 == 0 or got == n:
                ch.basic_ack(msg.delivery_tag, multiple=True)
            if got == n:
                done.set()

        with measured() as m:
            ch.basic_consume(queue, on_message=on_message)
            if not done.wait(60):
                raise RuntimeError(f"spark-mq callback consumer stalled after {state['got']} of {n}")
            ch.queue_declare(queue, passive=True)
    return m


# -- pika ------------------------------------------------------------------------------------


def _pika_params(url: str):
    import pika

    return pika.URLParameters(url)


def pika_consume_callback(url: str, queue: str, n: int):
    import pika

    conn = pika.BlockingConnection(_pika_params(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    state = {"got": 0}

    def on_message(channel, method, _props, _body):
        state["got"] += 1
        got = state["got"]
        if got % 100 == 0 or got == n:
            channel.basic_ack(method.delivery_tag, multiple=True)
        if got == n:
            channel.stop_consuming()

    with measured() as m:
        ch.basic_consume(queue, on_message)
        ch.start_consuming()
        ch.queue_declare(queue, passive=True)
    conn.close()
    if state["got"] != n:
        raise RuntimeError(f"pika callback consumer got {state['got']} of {n}")
    return m


def pika_publish(url: str, queue: str, body: bytes, n: int):
    import pika

    conn = pika.BlockingConnection(_pika_params(url))
    ch = conn.channel()
    with measured() as m:
        publish = ch.basic_publish
        for _ in range(n):
            publish("", queue, body)
        ch.queue_declare(queue, passive=True)
    conn.close()
    return m


def pika_consume(url: str, queue: str, n: int):
    import pika

    conn = pika.BlockingConnection(_pika_params(url))
    ch = conn.channel()
    ch.basic_qos(prefetch_count=1000)
    got = 0
    last = None
    with measured() as m:
        for method, _props, _body in ch.consume(queue, inactivity_timeout=30):
            if method is None:
                raise RuntimeError(f"pika consumer stalled after {got} of {n}")
            got += 1
            last = method.delivery_tag
            if got % 100 == 0:
                ch.basic_ack(last, multiple=True)
            if got == n:
                break
        if got % 100:
            ch.basic_ack(last, multiple=True)
        ch.cancel()
        ch.queue_declare(queue, passive=True)
    conn.close()
    return m


# -- instruction counts (deterministic, unaffected by other load on the machine) -------------

_ICOUNT_CHILD = r"""
import sys
url, who, n, q = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
if who == "ours":
    from spark_mq.clients.amqp08 import Connection
    with Connection.from_url(url, heartbeat=0) as c:
        ch = c.channel(); ch.basic_qos(prefetch_count=1000); ch.basic_consume(q)
        for i in range(1, n + 1):
            m = ch.next_message(120)
            if i % 100 == 0:
                ch.basic_ack(m.delivery_tag, multiple=True)
else:
    import pika
    c = pika.BlockingConnection(pika.URLParameters(url))
    ch = c.channel(); ch.basic_qos(prefetch_count=1000)
    i = 0
    for method, props, body in ch.consume(q):
        i += 1
        if i % 100 == 0:
            ch.basic_ack(method.delivery_tag, multiple=True)
        if i == n:
            break
    c.close()
"""


def instructions_per_message(url: str, size: int, n: int = 10_000) -> dict | None:
    """Instructions per consumed message for each client, counted by valgrind's callgrind: the
    difference between consuming ``1000 + n`` and ``1000`` preloaded messages, divided by ``n``,
    so start-up and connection set-up cancel out. Counts user-space instructions only."""
    import re
    import shutil
    import subprocess
    import sys

    from spark_mq.clients.amqp08 import Connection

    if shutil.which("valgrind") is None:
        print("valgrind not found: skipping instruction counts (apt-get install valgrind)")
        return None

    def count(who: str, total: int) -> int:
        queue = f"bench-ic-{uuid.uuid4().hex[:8]}"
        with Connection.from_url(url) as c:
            ch = c.channel()
            ch.queue_declare(queue, auto_delete=False)
            ch.tx_select()
            ch.publish_many(("", queue, bytes(size), None) for _ in range(total))
            ch.tx_commit()
        out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                              "-c", _ICOUNT_CHILD, url, who, str(total), queue],
                             capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
        with Connection.from_url(url) as c:
            c.channel().queue_delete(queue)
        match = re.search(r"Collected : (\d+)", out.stderr)
        if out.returncode != 0 or match is None:
            raise RuntimeError(f"callgrind run of {who} failed: {out.stderr[-2000:]}")
        return int(match.group(1))

    per = {who: (count(who, 1000 + n) - count(who, 1000)) / n for who in ("ours", "pika")}
    per["ratio"] = per["ours"] / per["pika"]
    return per


# -- driver ----------------------------------------------------------------------------------


def _broker_url() -> tuple[str, object]:
    import os

    url = os.environ.get("SPARK_MQ_RABBITMQ_AMQP_URL")
    if url:
        return url, None
    node = harness().start_rabbitmq()
    return node.url("amqp"), node


def main(argv: list[str]) -> dict:
    ap = argparse.ArgumentParser(prog="bench_amqp08")
    ap.add_argument("--quick", action="store_true", help="smaller counts (a smoke run)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-icount", action="store_true", help="skip the callgrind instruction counts")
    args = ap.parse_args(argv)
    counts = _counts(args.quick)
    url, node = _broker_url()
    try:
        return _run(url, counts, args.rounds, icount=not args.no_icount, partial=args.quick)
    finally:
        if node is not None:
            node.stop()


def _run(url: str, counts: dict, rounds: int, icount: bool = True, partial: bool = False) -> dict:
    import pika

    setup = pika.BlockingConnection(_pika_params(url))
    sch = setup.channel()
    results = {}
    for size in SIZES:
        n = counts[size]
        body = bytes(size)
        samples = {k: [] for k in ("ours_pub", "ours_pub_pipelined", "pika_pub", "ours_con", "pika_con",
                                   "ours_cb", "pika_cb")}
        for _ in range(rounds):
            for who in ("pika", "ours"):
                queue = f"bench-{uuid.uuid4().hex[:8]}"
                sch.queue_declare(queue, auto_delete=False)
                if who == "ours":
                    samples["ours_pub"].append(ours_publish(url, queue, body, n, pipelined=False))
                    samples["ours_con"].append(ours_consume(url, queue, n))
                    sch.queue_purge(queue)
                    samples["ours_pub_pipelined"].append(ours_publish(url, queue, body, n, pipelined=True))
                    samples["ours_cb"].append(ours_consume_callback(url, queue, n))
                else:
                    samples["pika_pub"].append(pika_publish(url, queue, body, n))
                    samples["pika_con"].append(pika_consume(url, queue, n))
                    sch.queue_purge(queue)
                    pika_publish(url, queue, body, n)
                    samples["pika_cb"].append(pika_consume_callback(url, queue, n))
                sch.queue_delete(queue)
        row = {}
        for key, ms in samples.items():
            row[key] = {
                "msgs_per_s": statistics.median(n / m.wall for m in ms),
                "cpu_us_per_msg": statistics.median(m.cpu / n * 1e6 for m in ms),
            }
        row["n"] = n
        row["publish_rate_ratio"] = row["ours_pub"]["msgs_per_s"] / row["pika_pub"]["msgs_per_s"]
        row["publish_cpu_ratio"] = row["ours_pub"]["cpu_us_per_msg"] / row["pika_pub"]["cpu_us_per_msg"]
        row["consume_rate_ratio"] = row["ours_con"]["msgs_per_s"] / row["pika_con"]["msgs_per_s"]
        row["consume_cpu_ratio"] = row["ours_con"]["cpu_us_per_msg"] / row["pika_con"]["cpu_us_per_msg"]
        row["callback_rate_ratio"] = row["ours_cb"]["msgs_per_s"] / row["pika_cb"]["msgs_per_s"]
        row["callback_cpu_ratio"] = row["ours_cb"]["cpu_us_per_msg"] / row["pika_cb"]["cpu_us_per_msg"]
        results[f"{size}B"] = row
    setup.close()
    _print(results)
    figures = {"rounds": rounds, "sizes": results}
    if icount:
        ic = instructions_per_message(url, 100)
        if ic is not None:
            figures["consume_instructions_per_msg_100B"] = ic
            print(f"consume 100B, instructions per message (callgrind): spark-mq {ic['ours']:,.0f}, "
                  f"pika {ic['pika']:,.0f}, ratio x{ic['ratio']:.3f}")
    write_results("amqp08", figures, partial=partial)
    return results


def _print(results: dict) -> None:
    print(f"{'body':>6} {'path':<26} {'msg/s':>10} {'CPU us/msg':>11}")
    for size, row in results.items():
        for key, label in (("ours_pub", "spark-mq publish"), ("ours_pub_pipelined", "spark-mq publish_many"),
                           ("pika_pub", "pika publish"), ("ours_con", "spark-mq consume+ack"),
                           ("pika_con", "pika consume+ack"), ("ours_cb", "spark-mq callback+ack"),
                           ("pika_cb", "pika callback+ack")):
            print(f"{size:>6} {label:<26} {row[key]['msgs_per_s']:>10,.0f} {row[key]['cpu_us_per_msg']:>11.2f}")
        print(f"{size:>6} ratios vs pika: publish rate x{row['publish_rate_ratio']:.2f}, "
              f"publish CPU x{row['publish_cpu_ratio']:.2f}, consume rate x{row['consume_rate_ratio']:.2f}, "
              f"consume CPU x{row['consume_cpu_ratio']:.2f}, callback rate x{row['callback_rate_ratio']:.2f}, "
              f"callback CPU x{row['callback_cpu_ratio']:.2f}")


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
