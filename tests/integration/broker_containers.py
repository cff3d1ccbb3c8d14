"""Brokers in Docker containers (testcontainers), the harness's fallback when no local binary exists.

Responsible for RabbitMQ (with rabbitmq_stomp) and ActiveMQ containers whose ports are published on 127.0.0.1
only, with the same handle API as the local brokers in brokers.py. Only used when a Docker engine answers;
machines without Docker (like the project's CI) never run this code.
"""

from __future__ import annotations

import time

from broker_net import LOOPBACK, amqp_probe, free_ports, port_accepts, stomp_probe
from brokers import CTL_TIMEOUT, START_TIMEOUT, Broker, BrokerControlError, BrokerError, BrokerUnavailable, RabbitMQ


class _ContainerBroker(Broker):
    """A broker in a Docker container, ports published on 127.0.0.1 only."""

    image = ""
    container_ports: dict[str, int] = {}

    def __init__(self, image: str) -> None:
        super().__init__()
        self.image = image
        ports = free_ports(len(self.container_ports))
        self._ports = dict(zip(self.container_ports, ports))
        self._container = None

    def _configure(self, container) -> None:
        pass

    def _launch(self) -> None:
        if self._container is None:
            from testcontainers.core.container import DockerContainer

            container = DockerContainer(self.image)
            for scheme, inner in self.container_ports.items():
                container.with_bind_ports(inner, (LOOPBACK, self._ports[scheme]))
            self._configure(container)
            self._container = container.start()
        else:
            self._container.get_wrapped_container().start()
        deadline = time.monotonic() + START_TIMEOUT
        while not self._ready():
            if time.monotonic() > deadline:
                logs = self._container.get_wrapped_container().logs(tail=30).decode(errors="replace")
                raise BrokerUnavailable(f"{self!r} not ready after {START_TIMEOUT:.0f}s\n{logs}")
            time.sleep(0.5)

    def _ready(self) -> bool:
        raise NotImplementedError

    def _alive(self) -> bool:
        if self._container is None:
            return False
        wrapped = self._container.get_wrapped_container()
        wrapped.reload()
        return wrapped.status == "running"

    def is_running(self) -> bool:
        return self._alive() and all(port_accepts(p) for p in self._ports.values())

    def _kill(self) -> None:
        self._container.get_wrapped_container().kill()

    def _terminate(self) -> None:
        if self._container is not None:
            self._container.stop()

    def pids(self) -> list[int]:
        raise BrokerControlError(f"{self!r} runs in a container: its processes are not visible here")


class RabbitMQContainer(_ContainerBroker):
    kind = "rabbitmq"
    user = "guest"
    password = "guest"
    vhost = "/"
    container_ports = {"amqp": 5672, "stomp": 61613}

    def _configure(self, container) -> None:
        container.with_command("sh -c 'rabbitmq-plugins enable --offline rabbitmq_stomp && "
                               "exec docker-entrypoint.sh rabbitmq-server'")

    @property
    def amqp_port(self) -> int:
        return self._ports["amqp"]

    @property
    def stomp_port(self) -> int:
        return self._ports["stomp"]

    def _ready(self) -> bool:
        try:
            return amqp_probe(self.amqp_port, timeout=2)[:1] == b"\x01" and \
                stomp_probe(self.stomp_port, login="guest", passcode="guest", timeout=2).startswith(b"CONNECTED")
        except OSError:
            return False

    def ctl(self, *args: str, timeout: float = CTL_TIMEOUT) -> str:
        code, out = self._container.get_wrapped_container().exec_run(["rabbitmqctl", "-q", *args])
        text = out.decode(errors="replace")
        if code != 0:
            raise BrokerError(f"rabbitmqctl {' '.join(args)} failed ({code}): {text.strip()[-2000:]}")
        return text

    sync = RabbitMQ.sync
    add_vhost = RabbitMQ.add_vhost
    delete_vhost = RabbitMQ.delete_vhost
    add_user = RabbitMQ.add_user
    delete_user = RabbitMQ.delete_user
    set_permissions = RabbitMQ.set_permissions


class ActiveMQContainer(_ContainerBroker):
    kind = "activemq"
    container_ports = {"stomp": 61613}

    @property
    def stomp_port(self) -> int:
        return self._ports["stomp"]

    def _ready(self) -> bool:
        try:
            return stomp_probe(self.stomp_port, timeout=2).startswith(b"CONNECTED")
        except OSError:
            return False


def docker_answers() -> str | None:
    """None when a Docker engine answers a ping, else the reason it does not."""
    try:
        import docker
    except ImportError:
        return "the docker Python package is not installed"
    try:
        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
    except Exception as exc:  # noqa: BLE001 - docker raises many unrelated types for "no engine"
        return f"no Docker engine answers ({type(exc).__name__}: {str(exc)[:120]})"
    return None
