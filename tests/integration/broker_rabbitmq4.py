"""A private RabbitMQ 4 node for the tests, on a Debian 12 machine (issue 57).

Debian 12 ships RabbitMQ 3.10; Debian 13 ships 4.0.5 on an Erlang that needs a newer C library than Debian 12
has, so it cannot be installed beside the system. What runs it here: a Debian 13 root made once with
``debootstrap --variant=minbase --include=rabbitmq-server trixie`` from Debian's archive (about 45 s and
200 MB; cached, ``SPARK_MQ_RABBITMQ4_ROOT`` to choose where), ``/proc`` mounted into it, and the node started
with ``chroot ROOT /usr/lib/rabbitmq/bin/rabbitmq-server``: the same private node as ``brokers.RabbitMQ``
(free loopback ports, its own directory, epmd on a private port bound to 127.0.0.1, killed and restarted by
the fault tests), with every path it is given seen from inside the root. ``SPARK_MQ_RABBITMQ4_AMQP_URL``
(and ``..._STOMP_URL``) use a running RabbitMQ 4 instead. Without root, debootstrap or the archive, the
tests that need it fail saying so; they never skip.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import brokers

ENV_ROOT = "SPARK_MQ_RABBITMQ4_ROOT"
ENV_AMQP_URL = "SPARK_MQ_RABBITMQ4_AMQP_URL"
ENV_STOMP_URL = "SPARK_MQ_RABBITMQ4_STOMP_URL"
SUITE = "trixie"  # Debian 13: RabbitMQ 4.0.x
MIRROR = "http://deb.debian.org/debian"
BUILD_TIMEOUT = 900  # seconds for debootstrap on a slow line
INSIDE_BIN = "/usr/lib/rabbitmq/bin"


def default_root() -> Path:
    return Path(os.environ.get(ENV_ROOT) or Path.home() / ".cache" / "spark-mq" / f"rabbitmq4-{SUITE}")


def _ready(root: Path) -> bool:
    return (root / INSIDE_BIN.lstrip("/") / "rabbitmq-server").is_file() and (root / ".spark-mq-complete").is_file()


def ensure_root(root: Path | None = None) -> Path:
    """The Debian 13 root with rabbitmq-server, built once (under a lock, so parallel workers wait for one
    build) and ``/proc`` mounted in it. Raises ``BrokerUnavailable`` saying what is missing."""
    root = Path(root or default_root())
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _ready(root):
            _build(root)
        _mount_proc(root)
    return root


def _build(root: Path) -> None:
    if os.geteuid() != 0:
        raise brokers.BrokerUnavailable(f"RabbitMQ 4 runs in a Debian 13 root made with debootstrap, which needs "
                                        f"root; or give a built one ({ENV_ROOT}) or a running broker ({ENV_AMQP_URL})")
    if shutil.which("debootstrap") is None:
        why = brokers.apt_install("debootstrap")
        if shutil.which("debootstrap") is None:
            raise brokers.BrokerUnavailable(f"RabbitMQ 4 needs debootstrap to make its Debian 13 root: {why}")
    shutil.rmtree(root, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f"{root.name}.build-", dir=root.parent))
    argv = ["debootstrap", "--variant=minbase", "--include=rabbitmq-server", SUITE, str(work), MIRROR]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        _unmount_all(work)
        shutil.rmtree(work, ignore_errors=True)
        raise brokers.BrokerUnavailable(f"debootstrap of Debian {SUITE} took over {BUILD_TIMEOUT}s") from None
    _unmount_all(work)  # debootstrap may leave /proc and /sys mounted in the new root
    if done.returncode != 0 or not (work / INSIDE_BIN.lstrip("/") / "rabbitmq-server").is_file():
        shutil.rmtree(work, ignore_errors=True)
        raise brokers.BrokerUnavailable(f"debootstrap {' '.join(argv[1:])} failed ({done.returncode}): "
                                        f"{(done.stderr or done.stdout).strip()[-1500:]}")
    (work / ".spark-mq-complete").write_text(" ".join(argv) + "\n")
    work.rename(root)


def _mounted(path: Path) -> bool:
    target = str(path.resolve())
    with open("/proc/mounts") as f:
        return any(line.split()[1] == target for line in f if len(line.split()) > 1)


def _mount_proc(root: Path) -> None:
    proc = root / "proc"
    proc.mkdir(exist_ok=True)
    if not _mounted(proc):
        done = subprocess.run(["mount", "-t", "proc", "proc", str(proc)], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=30)
        if done.returncode != 0:
            raise brokers.BrokerUnavailable(f"cannot mount /proc in {root}: {done.stderr.strip()}")


def _unmount_all(root: Path) -> None:
    for sub in ("proc", "sys", "dev/pts"):
        if (root / sub).is_dir() and _mounted(root / sub):
            subprocess.run(["umount", "-l", str(root / sub)], capture_output=True, stdin=subprocess.DEVNULL, timeout=30)


class RabbitMQ4(brokers.RabbitMQ):
    """A private RabbitMQ 4 node in the Debian 13 root: ``brokers.RabbitMQ`` with every command run through
    ``chroot ROOT`` and every path it is given seen from inside the root (its directory lives in the root's
    /tmp). Speaks AMQP 0-9-1 (and 1.0), not 0-8."""

    kind = "rabbitmq4"

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        (self.root / "tmp").mkdir(exist_ok=True)
        super().__init__(Path(INSIDE_BIN), base_dir=self.root / "tmp")

    def inside(self, path: Path) -> str:
        return "/" + str(Path(path).relative_to(self.root))

    def _environment(self) -> dict:
        env = super()._environment()
        for key, value in list(env.items()):  # the directories the node is given, as it sees them
            if key.startswith("RABBITMQ_") or key == "HOME":
                if value.startswith(str(self.root) + "/"):
                    env[key] = self.inside(Path(value))
        env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return env

    def _render_values(self) -> dict:
        values = super()._render_values()
        for key in ("TLS_CERT", "TLS_KEY"):
            values[key] = self.inside(Path(values[key]))
        return values

    def _command(self, program: str, *args: str) -> list[str]:
        return ["chroot", str(self.root), program, *args]

    def _probe_header(self) -> bytes:
        return b"AMQP\x00\x00\x09\x01"  # 4.x answers 0-8's with 1.0's SASL header

    def _epmd_program(self) -> str:
        return "/usr/bin/epmd"

    def __repr__(self) -> str:
        return f"<RabbitMQ4 {self.node} amqp={self.amqp_port} stomp={self.stomp_port}>"


def start_rabbitmq4() -> brokers.Broker:
    """A private RabbitMQ 4 node (the root built first when needed), or the running one the environment names."""
    amqp = os.environ.get(ENV_AMQP_URL)
    if amqp:
        urls = {"amqp": amqp}
        if os.environ.get(ENV_STOMP_URL):
            urls["stomp"] = os.environ[ENV_STOMP_URL]
        return brokers.ExternalBroker("rabbitmq4", urls).start()
    return RabbitMQ4(ensure_root()).start()


if __name__ == "__main__":  # ./dev setup: build the root before the tests need it (its time is the set-up's)
    import sys

    try:
        print(f"RabbitMQ 4 root: {ensure_root()}")
    except brokers.BrokerError as exc:
        print(f"RabbitMQ 4 root not made: {exc}", file=sys.stderr)
        sys.exit(1)
