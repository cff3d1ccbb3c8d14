"""The demo's data: order events (JSON, event times slightly out of order), the producer that sends
them at a steady rate and ends with the end-of-stream marker, and its own tally of every window."""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Optional

from spark_mq.apps.demo.backends import Backend

__all__ = ["REGIONS", "PRODUCTS", "EOS_REGION", "ORDER_SCHEMA", "make_order", "Tally", "Producer"]

REGIONS = ("eu-west", "eu-north", "us-east", "us-west", "ap-south")
#: product -> unit price in cents
PRODUCTS = {"keyboard": 4_999, "mouse": 1_999, "monitor": 18_900, "laptop": 119_900, "cable": 899, "dock": 21_500}
EOS_REGION = "__end_of_stream__"
ORDER_SCHEMA = "order_id STRING, ts_ms BIGINT, region STRING, product STRING, quantity INT, price_cents BIGINT"


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
