"""Run the Malamute broker as a separate process for tests and benchmarks: start, kill -9, restart on the same port.

Not part of the package: the integration tests import it as ``broker_process`` (tests/integration is
on their sys.path), scripts/soak.py and the benchmarks put that directory on sys.path, and a job
script run by spark-submit that calls ``stream_round_trip`` gets this file with ``--py-files``.

``BrokerProcess().start()`` launches ``python -m spark_mq.malamute_broker`` on a free loopback TCP
port, waits for its ``ready`` line (bounded), and exposes ``endpoint``. ``kill()`` sends SIGKILL
(a crash, not a clean stop); ``restart()`` starts it again on the same endpoint. Every wait is
bounded so a test can never hang here.
"""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import time
from typing import Optional, Sequence


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BrokerProcess:
    def __init__(self, port: Optional[int] = None, *, args: Sequence[str] = (), client_timeout: float = 10.0,
                 mailbox_dir: Optional[str] = None, ready_timeout: float = 20.0) -> None:
        self.port = port or free_tcp_port()
        self.endpoint = f"tcp://127.0.0.1:{self.port}"
        self.args = list(args)
        self.client_timeout = client_timeout
        self.mailbox_dir = mailbox_dir
        self.ready_timeout = ready_timeout
        self.proc: Optional[subprocess.Popen] = None

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "spark_mq.malamute_broker", "--endpoint", self.endpoint,
               "--client-timeout", str(self.client_timeout), *self.args]
        if self.mailbox_dir:
            cmd += ["--mailbox-dir", self.mailbox_dir]
        return cmd

    def start(self) -> "BrokerProcess":
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        deadline = time.monotonic() + self.ready_timeout
        while True:  # the port may linger briefly after a kill; retry the bind within the deadline
            self.proc = subprocess.Popen(self.command(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
            line = self._read_ready(deadline)
            if line.startswith(b"ready"):
                return self
            err = self._reap()
            if time.monotonic() > deadline:
                raise RuntimeError(f"malamute broker did not start on {self.endpoint}: {err.decode(errors='replace')}")
            time.sleep(0.2)

    def _read_ready(self, deadline: float) -> bytes:
        out = self.proc.stdout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([out], [], [], 0.2)
            if ready:
                return out.readline()
            if self.proc.poll() is not None:
                return b""
        return b""

    def _reap(self) -> bytes:
        if self.proc is None:
            return b""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            err = b"(no stderr: process did not exit)"
        self.proc = None
        return err or b""

    def kill(self) -> None:
        """SIGKILL: the broker dies without any goodbye, like a crash."""
        self._reap()

    def stop(self) -> None:
        """SIGTERM and wait (bounded); SIGKILL if it does not exit."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._reap()

    def restart(self) -> "BrokerProcess":
        self.kill()
        return self.start()

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> "BrokerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def stream_round_trip(endpoint: str, consumer, query, n: int, *, subject: str = "event",
                      first_wait: float = 150.0) -> dict:
    """Drive a running ``in`` -> query -> ``out`` stream pipeline (used by the job scripts of the
    cluster and spark-submit tests): send ``m0, m1, ...`` on stream ``in`` every 50 ms until
    ``consumer`` (reading ``out``) has ``n`` messages, then stop and collect up to the last one sent.
    A stream keeps nothing for absent readers, so everything from the query's first message on must
    arrive, exactly once. Returns ``last_sent``, ``query_exception`` and ``received``."""
    import threading

    from spark_mq.clients.malamute import MalamuteClient

    stop = threading.Event()
    sent: list = []

    def produce() -> None:
        producer = MalamuteClient(endpoint, "producer")
        producer.set_producer("in")
        i = 0
        while not stop.is_set():
            producer.send(subject, f"m{i}")
            sent.append(i)
            i += 1
            time.sleep(0.05)
        producer.ping()
        producer.close()

    def collect(done, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not done() and time.monotonic() < deadline and query.exception() is None:
            msg = consumer.recv(0.5)
            if msg is not None:
                got.append(bytes(msg.content[0]).decode())

    got: list = []
    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    collect(lambda: len(got) >= n, first_wait)
    # Stop producing, then collect the rest: partitions are written concurrently, so what has
    # arrived at any moment need not be contiguous; once everything is through, it must be.
    # Done when every number from the first one received to the last one sent is in: waiting only
    # for the last one sent would stop while another partition's messages are still on their way.
    stop.set()
    thread.join(30)
    last = sent[-1]

    def complete() -> bool:
        numbers = {int(b[1:]) for b in got if b[1:].isdigit()}
        return last in numbers and len(numbers) == last - min(numbers) + 1

    collect(complete, 120)
    collect(lambda: False, 1.0)  # anything still arriving now would be a duplicate: keep it to be seen
    error = query.exception()
    return {"last_sent": sent[-1], "query_exception": str(error)[:3000] if error is not None else None,
            "received": got}
