"""Broker access for the STOMP integration tests and bench (no tests here).

Prefers the shared harness (``tests/integration/brokers.py`` and its ``rabbitmq`` / ``activemq``
fixtures).  Until that harness can be used, this module starts private brokers itself from the
Debian ``rabbitmq-server`` (with ``rabbitmq_stomp``) and ``activemq`` packages on free loopback
ports, in a temporary directory, and stops them at the end.  A missing broker is a failure that
says how to get one, never a skip.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional

BROKERS = ("rabbitmq", "activemq")
START_TIMEOUT = 90.0

RABBIT_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
ACTIVEMQ_HOME = "/usr/share/activemq"
HOW_TO_GET = (
    "install the Debian packages with `./dev setup` (rabbitmq-server with the rabbitmq_stomp plugin, "
    "activemq, openjdk-17-jre-headless) or point SPARK_MQ_STOMP_{RABBITMQ,ACTIVEMQ}_PORT at a running broker"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_stomp(port: int, timeout: float, proc: Optional[subprocess.Popen] = None, log: Optional[Path] = None) -> None:
    """Wait until a STOMP CONNECT on ``port`` is answered with CONNECTED."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"broker exited with {proc.returncode} before listening on {port}:\n{tail}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.settimeout(5)
                s.sendall(b"CONNECT\nlogin:guest\npasscode:guest\n\n\x00")
                if s.recv(9) == b"CONNECTED":
                    s.sendall(b"DISCONNECT\n\n\x00")
                    return
        except OSError as exc:
            last = exc
        time.sleep(0.3)
    raise RuntimeError(f"no STOMP broker answered on 127.0.0.1:{port} within {timeout}s ({last}); {HOW_TO_GET}")


class LocalBroker:
    """A private broker process; ``stomp_port`` is where it speaks STOMP."""

    name = "?"

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix=f"spark-mq-stomp-{self.name}-"))
        self.stomp_port = free_port()
        self.proc: Optional[subprocess.Popen] = None
        self.log = self.dir / "broker.log"

    def command(self) -> tuple[list, dict]:
        raise NotImplementedError

    def start(self) -> "LocalBroker":
        argv, env = self.command()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for_stomp(self.stomp_port, START_TIMEOUT, self.proc, self.log)
        except BaseException:
            self.kill()
            raise
        return self

    def kill(self) -> None:
        """Kill the broker's whole process group (it is ours: started in a new session)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


class LocalRabbitMQ(LocalBroker):
    name = "rabbitmq"

    def command(self) -> tuple[list, dict]:
        if not os.path.exists(RABBIT_SERVER):
            raise RuntimeError(f"RabbitMQ is not installed ({RABBIT_SERVER} missing); {HOW_TO_GET}")
        d = self.dir
        amqp, dist, epmd = free_port(), free_port(), free_port()
        (d / "enabled_plugins").write_text("[rabbitmq_stomp].\n")
        (d / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{amqp}\nstomp.listeners.tcp.1 = 127.0.0.1:{self.stomp_port}\n"
            "loopback_users = none\nlog.file.level = warning\n"
        )
        env = dict(
            os.environ,
            HOME=str(d),
            RABBITMQ_NODENAME=f"stomp{self.stomp_port}@localhost",
            RABBITMQ_MNESIA_BASE=str(d / "mnesia"),
            RABBITMQ_LOG_BASE=str(d / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(d / "enabled_plugins"),
            RABBITMQ_CONFIG_FILE=str(d / "rabbitmq"),
            RABBITMQ_DIST_PORT=str(dist),
            ERL_EPMD_PORT=str(epmd),
        )
        return [RABBIT_SERVER], env


class LocalActiveMQ(LocalBroker):
    name = "activemq"

    def command(self) -> tuple[list, dict]:
        jar = Path(ACTIVEMQ_HOME) / "bin" / "activemq.jar"
        java = shutil.which("java")
        if not jar.exists() or java is None:
            raise RuntimeError(f"ActiveMQ or Java is missing ({jar}, java={java}); {HOW_TO_GET}")
        d = self.dir
        (d / "data").mkdir()
        (d / "activemq.xml").write_text(
            '<beans xmlns="http://www.springframework.org/schema/beans" '
            'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
            'xsi:schemaLocation="http://www.springframework.org/schema/beans '
            "http://www.springframework.org/schema/beans/spring-beans-2.0.xsd "
            'http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">\n'
            f'<broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" brokerName="stomp{self.stomp_port}" '
            f'persistent="false" dataDirectory="{d}/data">\n'
            "<systemUsage><systemUsage><memoryUsage><memoryUsage limit=\"256 mb\"/></memoryUsage></systemUsage></systemUsage>\n"
            f'<transportConnectors><transportConnector name="stomp" uri="stomp://127.0.0.1:{self.stomp_port}"/>'
            "</transportConnectors>\n</broker>\n</beans>\n"
        )
        argv = [
            java,
            "-Xms128M",
            "-Xmx768M",
            f"-Dactivemq.home={ACTIVEMQ_HOME}",
            f"-Dactivemq.base={d}",
            f"-Dactivemq.conf={d}",
            f"-Dactivemq.data={d}/data",
            "-jar",
            str(jar),
            "start",
            f"xbean:file:{d}/activemq.xml",
        ]
        return argv, dict(os.environ)


class ExternalBroker:
    """A broker someone else runs (``SPARK_MQ_STOMP_<NAME>_PORT``)."""

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.stomp_port = port

    def kill(self) -> None:
        raise RuntimeError(f"cannot kill the external {self.name} broker")

    def stop(self) -> None:
        pass


def start_broker(name: str):
    """A running broker ``name`` (one of BROKERS) with a ``stomp_port`` and ``stop()``."""
    env_port = os.environ.get(f"SPARK_MQ_STOMP_{name.upper()}_PORT")
    if env_port:
        broker = ExternalBroker(name, int(env_port))
        wait_for_stomp(broker.stomp_port, 10)
        return broker
    cls = {"rabbitmq": LocalRabbitMQ, "activemq": LocalActiveMQ}[name]
    return cls().start()


def stomp_port_of(handle) -> int:
    """The STOMP port of a broker handle from the shared harness or from this module."""
    for attr in ("stomp_port", "stomp"):
        value = getattr(handle, attr, None)
        if isinstance(value, int):
            return value
    ports = getattr(handle, "ports", None)
    if isinstance(ports, dict) and isinstance(ports.get("stomp"), int):
        return ports["stomp"]
    raise RuntimeError(f"cannot find the STOMP port of broker handle {handle!r}")
