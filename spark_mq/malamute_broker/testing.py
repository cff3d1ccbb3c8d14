"""Run the broker as a separate process for tests and demos: start, kill -9, restart on the same port.

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
