"""Private message brokers for the integration tests: RabbitMQ (AMQP 0-8 and STOMP) and ActiveMQ (STOMP).

Responsible for finding a broker, starting a private instance of it on free loopback ports in a temporary
directory, waiting until it answers, and killing / restarting / stopping it. It must not touch system
services, /etc, or fixed ports (5672, 61613, 4369, 25672): two test runs on one machine never clash.

Where a broker comes from (first that works, per broker):
  1. an environment URL: SPARK_MQ_RABBITMQ_AMQP_URL (+ SPARK_MQ_RABBITMQ_STOMP_URL), SPARK_MQ_ACTIVEMQ_STOMP_URL.
     Such an ExternalBroker has no kill/restart/ctl: they raise BrokerControlError (the test fails, it does not
     skip). Fault tests need a harness-managed broker: use the *_isolated fixtures, which ignore these URLs.
  2. a local binary: Debian's rabbitmq-server (/usr/lib/rabbitmq/bin) or activemq (/usr/share/activemq),
     installed with apt-get when missing and we are root, unless SPARK_MQ_NO_APT=1.
  3. testcontainers, when a Docker engine answers (images: SPARK_MQ_RABBITMQ_IMAGE, SPARK_MQ_ACTIVEMQ_IMAGE).
  4. otherwise BrokerUnavailable, whose message says how to get a broker.

Handle API (RabbitMQ and ActiveMQ; the pytest fixtures hand these out, see conftest.py):
  h.kind                 "rabbitmq" or "activemq"
  h.host                 "127.0.0.1"
  h.managed              True when the harness owns the process: kill/restart work
  h.url(scheme, user=None, password=None, vhost=None) -> str
                         "amqp://guest:guest@127.0.0.1:PORT/%2F" (vhost percent-encoded), "stomp://[user:pass@]127.0.0.1:PORT"
  h.port(scheme)         the port of "amqp" or "stomp"
  h.user, h.password     default credentials (RabbitMQ: guest/guest, loopback-only; ActiveMQ: None, any login works
                         unless the broker was started with users=...)
  h.kill()               SIGKILL the broker's whole process group; returns when the ports refuse connections
  h.restart()            start again on the same ports with the same data directory; waits until ready
  h.stop()               graceful stop, then remove the temporary directory (not allowed on the shared broker)
  h.is_running()         the process is alive and the main port accepts
  h.start_seconds        start-up times, first start then each restart
  h.workdir, h.log_path  temporary directory and main log file (kept with SPARK_MQ_KEEP_BROKER_DIRS=1)
  h.pids()               process ids of the broker (for checks on its sockets)
RabbitMQ only:
  h.amqp_port, h.stomp_port, h.vhost ("/"), h.node ("sparkmq-<hex>@localhost")
  h.amqps_port, h.stomps_port, h.tls_ca_file   TLS listeners (url("amqps"), url("stomp+ssl")) with a self-signed
                         certificate for 127.0.0.1; clients verify with tls_ca_file as their CA file
  h.ctl(*args, timeout=60) -> stdout of rabbitmqctl -n <node> with the node's environment
  h.sync()               force queue/exchange declarations to disk before a kill() (RabbitMQ 3.10 may otherwise
                         lose a durable queue declared just before a SIGKILL)
  h.add_vhost(name), h.delete_vhost(name)
  h.add_user(name, password, vhost="/", configure=".*", write=".*", read=".*", tags=()), h.delete_user(name)
  h.set_permissions(user, vhost, configure=".*", write=".*", read=".*")
ActiveMQ only:
  h.stomp_port; ActiveMQ(users={"name": "password"}) turns authentication on (for auth-failure tests).

Functions: rabbitmq_from_environment_or_start(), activemq_from_environment_or_start() (selection 1-4),
start_rabbitmq(**kw), start_activemq(**kw) (selection 2-4: always a private, managed broker).
Socket helpers (from broker_net.py, importable from here): free_ports(n), port_accepts(port), amqp_probe(port),
stomp_probe(port, login=, passcode=), listening_sockets(pids), is_loopback(ip). Docker handles: broker_containers.py.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

from broker_net import (  # noqa: F401 - re-exported: tests use brokers.<helper>
    AMQP_PROTOCOL_HEADER, LOOPBACK, amqp_probe, free_ports, is_loopback, listening_sockets, port_accepts,
    stomp_probe, wait_port_refuses,
)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

ENV_RABBITMQ_AMQP_URL = "SPARK_MQ_RABBITMQ_AMQP_URL"
ENV_RABBITMQ_STOMP_URL = "SPARK_MQ_RABBITMQ_STOMP_URL"
ENV_ACTIVEMQ_STOMP_URL = "SPARK_MQ_ACTIVEMQ_STOMP_URL"
ENV_NO_APT = "SPARK_MQ_NO_APT"
ENV_KEEP_DIRS = "SPARK_MQ_KEEP_BROKER_DIRS"
ENV_RABBITMQ_BIN_DIR = "SPARK_MQ_RABBITMQ_BIN_DIR"
ENV_ACTIVEMQ_HOME = "SPARK_MQ_ACTIVEMQ_HOME"
ENV_RABBITMQ_IMAGE = "SPARK_MQ_RABBITMQ_IMAGE"
ENV_ACTIVEMQ_IMAGE = "SPARK_MQ_ACTIVEMQ_IMAGE"

RABBITMQ_BIN_DIRS = ("/usr/lib/rabbitmq/bin",)  # Debian/Ubuntu; the /usr/sbin wrappers su to the rabbitmq user
ACTIVEMQ_HOMES = ("/usr/share/activemq",)  # Debian/Ubuntu
DEFAULT_RABBITMQ_IMAGE = "rabbitmq:3.10"
DEFAULT_ACTIVEMQ_IMAGE = "apache/activemq-classic:5.18.3"

START_TIMEOUT = 90.0  # seconds; a loaded 2-core CI machine starts either broker in under 15
STOP_TIMEOUT = 20.0
CTL_TIMEOUT = 60.0
APT_TIMEOUT = 900.0
ACTIVEMQ_HEAP = "-Xmx512m"


_POLL = 0.1
_PLACEHOLDER = re.compile(r"@[A-Z_]+@")


class BrokerError(Exception):
    """Root of the harness errors (test infrastructure, not part of spark_mq)."""


class BrokerUnavailable(BrokerError):
    """No broker could be found or started; the message says how to get one."""


class BrokerControlError(BrokerError):
    """The operation needs a harness-managed broker (kill/restart/ctl on an external one, stop on the shared one)."""


# ----------------------------------------------------------------------------------------------- processes

# A watchdog per launched process group: a tiny child Python that blocks reading a pipe from us. If this
# test process dies in any way (even SIGKILL), the pipe closes and the watchdog kills the broker's process
# group (and removes its temporary directory, when given), so no broker outlives its test run. A normal
# stop writes one byte first, which disarms it.
_WATCHDOG = (
    "import os,shutil,signal,sys,time\n"
    "pgid=int(sys.argv[1])\n"
    "try:\n d=os.read(0,1)\nexcept BaseException:\n d=b''\n"
    "if not d:\n"
    " try: os.killpg(pgid, signal.SIGKILL)\n except OSError: pass\n"
    " if len(sys.argv) > 2:\n  time.sleep(1)\n  shutil.rmtree(sys.argv[2], ignore_errors=True)\n"
)


class _Process:
    """A broker process in its own session (process group), with a watchdog and a log file."""

    def __init__(self, argv: list[str], env: dict, cwd: Path, log_path: Path, cleanup_dir: Path | None = None):
        self.log_path = log_path
        with open(log_path, "ab") as log:
            self.popen = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        self.pgid = self.popen.pid
        cleanup = [] if cleanup_dir is None or _keep_dirs() else [str(cleanup_dir)]
        self._watchdog = subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(self.pgid), *cleanup],
                                          stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL, start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def group_pids(self) -> list[int]:
        pids = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
                except (OSError, IndexError):
                    continue
                if int(fields[2]) == self.pgid:  # fields after "(comm)": state ppid pgrp ...
                    pids.append(int(entry))
        return pids

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass

    def kill(self) -> None:
        self.signal_group(signal.SIGKILL)
        try:
            self.popen.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(f"process group {self.pgid} survived SIGKILL") from exc
        self._wait_group_gone(STOP_TIMEOUT)
        self._disarm()

    def terminate(self, timeout: float = STOP_TIMEOUT) -> None:
        self.signal_group(signal.SIGTERM)
        try:
            self.popen.wait(timeout=timeout)
            self._wait_group_gone(timeout)
        except (subprocess.TimeoutExpired, BrokerError):
            self.signal_group(signal.SIGKILL)
            self.popen.wait(timeout=STOP_TIMEOUT)
        self._disarm()

    def _wait_group_gone(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.group_pids():
            if time.monotonic() > deadline:
                raise BrokerError(f"process group {self.pgid} still has members")
            time.sleep(_POLL)

    def _disarm(self) -> None:
        if self._watchdog.poll() is None:
            try:
                self._watchdog.stdin.write(b"x")
                self._watchdog.stdin.close()
            except OSError:
                pass
            try:
                self._watchdog.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text[-lines:])


def _render(template: Path, target: Path, values: dict[str, str]) -> None:
    """Copy `template` to `target`, replacing each @KEY@; refuse to leave a placeholder unreplaced."""
    text = template.read_text()
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    leftovers = _PLACEHOLDER.findall(code)
    if leftovers:
        raise BrokerError(f"unreplaced placeholders {leftovers} in {template}")
    target.write_text(text)


_live: set["Broker"] = set()
_live_lock = threading.Lock()


# (kind, seconds) of every broker start and restart in this process, in order: the suite's durations
# record (tests/conftest.py) takes them into the phase of the test that caused them.
START_LOG: list[tuple[str, float]] = []


def _log_start(kind: str, seconds: float) -> None:
    START_LOG.append((kind, seconds))


@atexit.register
def stop_all() -> None:
    """Stop every broker this process started (pytest finalizers normally did it already)."""
    with _live_lock:
        brokers = list(_live)
    for broker in brokers:
        try:
            broker._shutdown()
        except Exception as exc:  # noqa: BLE001 - best effort at interpreter exit, report and go on
            print(f"warning: could not stop {broker!r}: {exc}", file=sys.stderr)


def _keep_dirs() -> bool:
    return os.environ.get(ENV_KEEP_DIRS, "") not in ("", "0")


# ----------------------------------------------------------------------------------------------- handles


class Broker:
    """Common part of the handles; see the module docstring for the API."""

    kind = "broker"
    managed = True
    host = LOOPBACK
    user: str | None = None
    password: str | None = None
    vhost: str | None = None

    def __init__(self) -> None:
        self.start_seconds: list[float] = []
        self.workdir: Path | None = None
        self.log_path: Path | None = None
        self._ports: dict[str, int] = {}
        self._shared = False
        self._stopped = False

    def port(self, scheme: str) -> int:
        try:
            return self._ports[scheme]
        except KeyError:
            raise BrokerError(f"{self!r} has no {scheme} endpoint (it has: {sorted(self._ports)})") from None

    def url(self, scheme: str, user: str | None = None, password: str | None = None, vhost: str | None = None) -> str:
        port = self.port(scheme)
        user = self.user if user is None else user
        password = self.password if password is None else password
        auth = ""
        if user is not None:
            auth = quote(user, safe="") + (":" + quote(password, safe="") if password is not None else "") + "@"
        path = ""
        if scheme in ("amqp", "amqps"):
            path = "/" + quote(self.vhost if vhost is None else vhost, safe="")
        return f"{scheme}://{auth}{self.host}:{port}{path}"

    # lifecycle, implemented by subclasses
    def _launch(self) -> None:
        raise NotImplementedError

    def _kill(self) -> None:
        raise NotImplementedError

    def _terminate(self) -> None:
        raise NotImplementedError

    def is_running(self) -> bool:
        raise NotImplementedError

    def pids(self) -> list[int]:
        raise NotImplementedError

    def start(self) -> "Broker":
        with _live_lock:
            _live.add(self)
        t0 = time.monotonic()
        try:
            self._launch()
        except BaseException:
            self._shutdown(remove=False)  # keep the logs the error points to
            raise
        self.start_seconds.append(time.monotonic() - t0)
        _log_start(self.kind, self.start_seconds[-1])
        return self

    def kill(self) -> None:
        """SIGKILL the broker; returns once its ports refuse connections."""
        self._check_running_op("kill")
        self._kill()
        for port in self._ports.values():
            wait_port_refuses(port, self.host)

    def restart(self) -> None:
        """Start again on the same ports and data directory (after kill(), or while running: kill first)."""
        self._check_running_op("restart")
        if self._alive():
            self._kill()
        t0 = time.monotonic()
        self._launch()
        self.start_seconds.append(time.monotonic() - t0)
        _log_start(self.kind + "-restart", self.start_seconds[-1])

    def stop(self) -> None:
        if self._shared:
            raise BrokerControlError(
                f"{self!r} is the session's shared broker; the harness stops it at the end. "
                "Use the rabbitmq_isolated / activemq_isolated fixtures for a broker a test may stop.")
        self._shutdown()

    def _check_running_op(self, what: str) -> None:
        if self._stopped:
            raise BrokerControlError(f"{what}() on {self!r}, which was stopped")

    def _alive(self) -> bool:
        raise NotImplementedError

    def _shutdown(self, remove: bool = True) -> None:
        if self._stopped:
            return
        self._stopped = True
        try:
            self._terminate()
        finally:
            with _live_lock:
                _live.discard(self)
            if remove and self.workdir is not None and not _keep_dirs():
                shutil.rmtree(self.workdir, ignore_errors=True)

    def _fail(self, message: str) -> BrokerUnavailable:
        log = f"\n--- last lines of {self.log_path} ---\n{_tail(self.log_path)}" if self.log_path else ""
        return BrokerUnavailable(f"{self!r}: {message}{log}")

    def __repr__(self) -> str:
        ports = " ".join(f"{k}={v}" for k, v in sorted(self._ports.items()))
        return f"<{type(self).__name__} {ports}>"


class RabbitMQ(Broker):
    """A private RabbitMQ node from a local installation (see the module docstring)."""

    kind = "rabbitmq"
    user = "guest"
    password = "guest"
    vhost = "/"

    def __init__(self, bin_dir: Path, base_dir: Path | None = None) -> None:
        super().__init__()
        self.bin_dir = Path(bin_dir)
        self.node_short = f"sparkmq-{secrets.token_hex(4)}"
        self.node = f"{self.node_short}@localhost"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.node_short}-", dir=base_dir))
        amqp, stomp, dist, epmd, amqps, stomps = free_ports(6)
        self._ports = {"amqp": amqp, "stomp": stomp, "amqps": amqps, "stomp+ssl": stomps}
        self.amqp_port, self.stomp_port, self.dist_port, self.epmd_port = amqp, stomp, dist, epmd
        self.amqps_port, self.stomps_port = amqps, stomps
        self.log_path = self.workdir / "log" / f"{self.node}.log"
        self._server: _Process | None = None
        self._epmd: _Process | None = None
        self.env = self._environment()
        self._write_config()

    def _environment(self) -> dict:
        w = self.workdir
        loopback_dist = "-kernel inet_dist_use_interface {127,0,0,1}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))}
        env.update({
            "HOME": str(w / "home"),  # the Erlang cookie lives here, for the server and rabbitmqctl alike
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_PORT": str(self.epmd_port),
            "ERL_EPMD_ADDRESS": LOOPBACK,
            "RABBITMQ_MNESIA_BASE": str(w / "mnesia"),
            "RABBITMQ_LOG_BASE": str(w / "log"),
            "RABBITMQ_CONFIG_FILE": str(w / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(w / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(w / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(w / "rabbitmq-env.conf"),  # empty: keeps /etc/rabbitmq out
            "RABBITMQ_PID_FILE": str(w / "rabbitmq.pid"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": loopback_dist,
            "RABBITMQ_CTL_ERL_ARGS": loopback_dist,
        })
        return env

    def _write_config(self) -> None:
        w = self.workdir
        for sub in ("home", "mnesia", "log"):
            (w / sub).mkdir(mode=0o700)
        cookie = w / "home" / ".erlang.cookie"
        cookie.write_text(secrets.token_hex(16).upper())
        cookie.chmod(0o400)
        (w / "rabbitmq-env.conf").write_text("# intentionally empty: the environment comes from brokers.py\n")
        self.tls_ca_file = make_self_signed_cert(w / "tls")
        _render(CONF_DIR / "rabbitmq" / "rabbitmq.conf.in", w / "rabbitmq.conf", self._render_values())
        shutil.copyfile(CONF_DIR / "rabbitmq" / "enabled_plugins", w / "enabled_plugins")

    # -- what a node run another way (broker_rabbitmq4.py: in a chroot) changes --------------------------

    def _render_values(self) -> dict:
        w = self.workdir
        return {"AMQP_PORT": str(self.amqp_port), "STOMP_PORT": str(self.stomp_port),
                "AMQPS_PORT": str(self.amqps_port), "STOMPS_PORT": str(self.stomps_port),
                "TLS_CERT": str(w / "tls" / "cert.pem"), "TLS_KEY": str(w / "tls" / "key.pem")}

    def _command(self, program: str, *args: str) -> list[str]:
        return [program, *args]

    def _epmd_program(self) -> str:
        return shutil.which("epmd", path=self.env.get("PATH")) or "epmd"

    def _probe_header(self) -> bytes:
        return AMQP_PROTOCOL_HEADER  # 0-8: what RabbitMQ 3.x answers with connection.start

    def _launch(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        if self._epmd is None or not self._epmd.alive():
            self._epmd = _Process(self._command(self._epmd_program(), "-port", str(self.epmd_port)), self.env,
                                  self.workdir, self.workdir / "epmd.log")
            while not port_accepts(self.epmd_port, timeout=0.5):
                if not self._epmd.alive() or time.monotonic() > deadline:
                    raise self._fail(f"epmd did not start on port {self.epmd_port}")
                time.sleep(_POLL)
        self._server = _Process(self._command(str(self.bin_dir / "rabbitmq-server")), self.env, self.workdir,
                                self.workdir / "server.out", cleanup_dir=self.workdir)
        while not all(port_accepts(p, timeout=0.5) for p in (self.amqp_port, self.stomp_port, self.amqps_port,
                                                              self.stomps_port)):
            if not self._server.alive():
                raise self._fail(f"rabbitmq-server exited with {self._server.popen.returncode} during start-up"
                                 f"\n--- {self._server.log_path} ---\n{_tail(self._server.log_path)}")
            if time.monotonic() > deadline:
                raise self._fail(f"not listening after {START_TIMEOUT:.0f}s")
            time.sleep(_POLL)
        self.ctl("await_startup", "--timeout", str(int(max(5, deadline - time.monotonic()))))
        reply = amqp_probe(self.amqp_port, header=self._probe_header())
        if reply[:1] != b"\x01":
            raise self._fail(f"AMQP port answered {reply[:16]!r}, not a method frame")

    def _alive(self) -> bool:
        return self._server is not None and self._server.alive()

    def is_running(self) -> bool:
        return self._alive() and port_accepts(self.amqp_port)

    def _kill(self) -> None:
        if self._server is not None:
            self._server.kill()

    def _terminate(self) -> None:
        try:
            if self._server is not None and self._server.alive():
                self._server.terminate()  # SIGTERM: the script and the VM both stop the node cleanly
        finally:
            if self._epmd is not None:
                self._epmd.terminate(timeout=5)

    def pids(self) -> list[int]:
        pids = self._server.group_pids() if self._alive() else []
        if self._epmd is not None and self._epmd.alive():
            pids += self._epmd.group_pids()
        return pids

    def ctl(self, *args: str, timeout: float = CTL_TIMEOUT) -> str:
        """Run rabbitmqctl -n <node> ARGS with the node's environment; return stdout, raise on failure."""
        argv = self._command(str(self.bin_dir / "rabbitmqctl"), "-q", "-n", self.node, *args)
        try:
            done = subprocess.run(argv, env=self.env, cwd=self.workdir, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(f"rabbitmqctl {' '.join(args)} timed out after {timeout:.0f}s") from exc
        if done.returncode != 0:
            raise BrokerError(f"rabbitmqctl {' '.join(args)} failed ({done.returncode}): "
                              f"{(done.stderr or done.stdout).strip()[-2000:]}")
        return done.stdout

    def sync(self) -> None:
        """Force the node's metadata log (queue/exchange/binding declarations) to disk.

        RabbitMQ 3.10 can lose a durable queue declared less than a second before a SIGKILL (seen here in 1 of
        4 tries, even after a confirmed persistent publish to it); call this between declaring and kill().
        """
        self.ctl("eval", "mnesia:sync_log().")

    def add_vhost(self, name: str) -> None:
        self.ctl("add_vhost", name)

    def delete_vhost(self, name: str) -> None:
        self.ctl("delete_vhost", name)

    def add_user(self, name: str, password: str, vhost: str | None = "/", configure: str = ".*",
                 write: str = ".*", read: str = ".*", tags: tuple[str, ...] = ()) -> None:
        """Create a user; with permissions on `vhost` unless it is None. Non-guest users may log in remotely."""
        self.ctl("add_user", name, password)
        if tags:
            self.ctl("set_user_tags", name, *tags)
        if vhost is not None:
            self.set_permissions(name, vhost, configure, write, read)

    def delete_user(self, name: str) -> None:
        self.ctl("delete_user", name)

    def set_permissions(self, user: str, vhost: str, configure: str = ".*", write: str = ".*",
                        read: str = ".*") -> None:
        self.ctl("set_permissions", "-p", vhost, user, configure, write, read)

    def __repr__(self) -> str:
        return f"<RabbitMQ {self.node} amqp={self.amqp_port} stomp={self.stomp_port}>"


class ActiveMQ(Broker):
    """A private ActiveMQ broker run with `java -jar activemq.jar` from a local installation."""

    kind = "activemq"

    def __init__(self, home: Path, users: dict[str, str] | None = None, base_dir: Path | None = None,
                 max_page_size: int | None = None) -> None:
        super().__init__()
        self.home = Path(home)
        self.max_page_size = max_page_size
        self.name = f"sparkmq-{secrets.token_hex(4)}"
        self.workdir = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=base_dir))
        (self.stomp_port,) = free_ports(1)
        self._ports = {"stomp": self.stomp_port}
        self.users = dict(users or {})
        if self.users:
            self.user, self.password = next(iter(self.users.items()))
        self.log_path = self.workdir / "data" / "activemq.log"
        self._proc: _Process | None = None
        self._write_config()

    def _write_config(self) -> None:
        w = self.workdir
        (w / "data").mkdir()
        plugins = ""
        if self.users:
            entries = "\n".join(
                f'          <authenticationUser username="{_xml(u)}" password="{_xml(p)}" groups="users"/>'
                for u, p in self.users.items())
            plugins = ("    <plugins>\n      <simpleAuthenticationPlugin>\n        <users>\n"
                       f"{entries}\n        </users>\n      </simpleAuthenticationPlugin>\n    </plugins>")
        policy = ""
        if self.max_page_size is not None:  # messages a queue pages in from the store: 200 unless set
            policy = ("    <destinationPolicy><policyMap><policyEntries>\n"
                      f'      <policyEntry queue="&gt;" maxPageSize="{int(self.max_page_size)}"/>\n'
                      "    </policyEntries></policyMap></destinationPolicy>")
        _render(CONF_DIR / "activemq" / "activemq.xml.in", w / "activemq.xml",
                {"BROKER_NAME": self.name, "DATA_DIR": str(w / "data"), "STOMP_PORT": str(self.stomp_port),
                 "PLUGINS": plugins, "POLICY": policy})
        _render(CONF_DIR / "activemq" / "log4j.properties.in", w / "log4j.properties",
                {"LOG_FILE": str(self.log_path)})

    def _argv(self) -> list[str]:
        w = self.workdir
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else (shutil.which("java") or "java")
        return [java, "-Xms64m", ACTIVEMQ_HEAP, "-Djava.awt.headless=true",
                f"-Dactivemq.home={self.home}", f"-Dactivemq.base={w}", f"-Dactivemq.conf={w}",
                f"-Dactivemq.data={w / 'data'}", f"-Djava.io.tmpdir={w / 'data'}",
                f"-Dlog4j.configuration=file:{w / 'log4j.properties'}",
                "-jar", str(self.home / "bin" / "activemq.jar"), "start", f"xbean:file:{w / 'activemq.xml'}"]

    def _launch(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        self._proc = _Process(self._argv(), dict(os.environ), self.workdir, self.workdir / "java.out",
                              cleanup_dir=self.workdir)
        login, passcode = (self.user, self.password) if self.users else (None, None)
        while True:
            if not self._proc.alive():
                raise self._fail(f"java exited with {self._proc.popen.returncode} during start-up"
                                 f"\n--- {self._proc.log_path} ---\n{_tail(self._proc.log_path)}")
            if time.monotonic() > deadline:
                raise self._fail(f"STOMP port {self.stomp_port} gave no CONNECTED after {START_TIMEOUT:.0f}s")
            try:
                if stomp_probe(self.stomp_port, login=login, passcode=passcode, timeout=2).startswith(b"CONNECTED"):
                    return
            except OSError:
                pass
            time.sleep(_POLL)

    def _alive(self) -> bool:
        return self._proc is not None and self._proc.alive()

    def is_running(self) -> bool:
        return self._alive() and port_accepts(self.stomp_port)

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()

    def _terminate(self) -> None:
        if self._proc is not None and self._proc.alive():
            self._proc.terminate()

    def pids(self) -> list[int]:
        return self._proc.group_pids() if self._alive() else []

    def __repr__(self) -> str:
        return f"<ActiveMQ {self.name} stomp={self.stomp_port}>"


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;").replace(">", "&gt;")


class ExternalBroker(Broker):
    """A broker given by environment URLs: usable, but the harness cannot kill, restart or administer it."""

    managed = False

    def __init__(self, kind: str, urls: dict[str, str]) -> None:
        super().__init__()
        self.kind = kind
        self._urls = urls
        first = urlsplit(next(iter(urls.values())))
        self.host = first.hostname or LOOPBACK
        self.user = unquote(first.username) if first.username is not None else None
        self.password = unquote(first.password) if first.password is not None else None
        for scheme, url in urls.items():
            parts = urlsplit(url)
            if parts.port is None:
                raise BrokerUnavailable(f"{url!r}: the URL needs an explicit port")
            self._ports[scheme] = parts.port
        if "amqp" in urls:
            path = urlsplit(urls["amqp"]).path
            self.vhost = unquote(path[1:]) if len(path) > 1 else "/"
            self.amqp_port = self._ports["amqp"]
        self.stomp_port = self._ports.get("stomp")

    def url(self, scheme: str, user: str | None = None, password: str | None = None, vhost: str | None = None) -> str:
        """The environment URL itself, or rebuilt with the overrides (keeping its scheme, e.g. amqps)."""
        self.port(scheme)
        url = self._urls[scheme]
        if user is None and password is None and vhost is None:
            return url
        real_scheme = urlsplit(url).scheme
        rebuilt = Broker.url(self, scheme, user, password, vhost)
        return real_scheme + rebuilt[len(scheme):]

    def _refuse(self, what: str) -> BrokerControlError:
        return BrokerControlError(
            f"{what}() needs a harness-managed {self.kind}, but this one comes from an environment URL "
            f"({', '.join(self._urls)}). Fault tests need a private broker: use the {self.kind}_isolated fixture, "
            f"or unset the SPARK_MQ_{self.kind.upper()}_*_URL variables.")

    def start(self) -> "ExternalBroker":
        for scheme, port in self._ports.items():
            if not port_accepts(port, self.host, timeout=5):
                raise BrokerUnavailable(f"{self._urls[scheme]!r} from the environment does not accept connections")
        return self

    def kill(self) -> None:
        raise self._refuse("kill")

    def restart(self) -> None:
        raise self._refuse("restart")

    def ctl(self, *args: str, **kw) -> str:
        raise self._refuse("ctl")

    sync = add_vhost = delete_vhost = add_user = delete_user = set_permissions = ctl

    def stop(self) -> None:
        pass

    def _shutdown(self, remove: bool = True) -> None:
        self._stopped = True

    def is_running(self) -> bool:
        return all(port_accepts(p, self.host) for p in self._ports.values())

    def pids(self) -> list[int]:
        raise self._refuse("pids")

    def __repr__(self) -> str:
        return f"<ExternalBroker {self.kind} {self.host} {self._ports}>"


# ----------------------------------------------------------------------------------------------- selection

_apt_lock = threading.Lock()
_apt_tried: dict[str, str | None] = {}


def apt_install(package: str) -> str | None:
    """Install a Debian package when we are root and allowed; None on success, else why not."""
    with _apt_lock:
        if package in _apt_tried:
            return _apt_tried[package]
        reason = _apt_install(package)
        _apt_tried[package] = reason
        return reason


def _apt_install(package: str) -> str | None:
    if os.environ.get(ENV_NO_APT, "") not in ("", "0"):
        return f"{ENV_NO_APT} is set"
    if os.geteuid() != 0:
        return "not root, so apt-get install was not tried"
    if shutil.which("apt-get") is None:
        return "no apt-get on this machine"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", package]
    try:
        done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=APT_TIMEOUT)
        if done.returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=APT_TIMEOUT)
            done = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=APT_TIMEOUT)
    except subprocess.TimeoutExpired:
        return f"apt-get install {package} timed out"
    if done.returncode != 0:
        return f"apt-get install {package} failed: {done.stderr.strip()[-500:]}"
    return None


def find_rabbitmq_bin_dir() -> Path | None:
    candidates = [os.environ.get(ENV_RABBITMQ_BIN_DIR, ""), *RABBITMQ_BIN_DIRS]
    server = shutil.which("rabbitmq-server")
    if server and "sbin" not in Path(server).parent.name:  # a tarball's sbin is fine, Debian's /usr/sbin wraps su
        candidates.append(str(Path(server).resolve().parent))
    for c in candidates:
        if c and (Path(c) / "rabbitmq-server").is_file() and (Path(c) / "rabbitmqctl").is_file():
            return Path(c)
    return None


def find_activemq_home() -> Path | None:
    for c in (os.environ.get(ENV_ACTIVEMQ_HOME, ""), *ACTIVEMQ_HOMES):
        if c and (Path(c) / "bin" / "activemq.jar").is_file():
            return Path(c)
    return None


_RABBITMQ_HELP = f"""\
How to get a RabbitMQ for the integration tests (any one):
  * run ./dev test as root: it installs Debian's rabbitmq-server (or: apt-get install -y rabbitmq-server);
    the tests then start private nodes on free loopback ports, no system service needed;
  * an unpacked RabbitMQ (generic-unix tarball) plus Erlang: {ENV_RABBITMQ_BIN_DIR}=<dir with rabbitmq-server>;
  * a running broker: {ENV_RABBITMQ_AMQP_URL}=amqp://guest:guest@127.0.0.1:5672/%2F and
    {ENV_RABBITMQ_STOMP_URL}=stomp://guest:guest@127.0.0.1:61613 (rabbitmq_stomp enabled); fault tests
    (kill/restart) still need a private broker;
  * a Docker engine: the harness then runs {DEFAULT_RABBITMQ_IMAGE} through testcontainers."""

_ACTIVEMQ_HELP = f"""\
How to get an ActiveMQ for the integration tests (any one):
  * run ./dev test as root: it installs Debian's activemq (or: apt-get install -y activemq) and Java 17;
    the tests then start private brokers on free loopback ports, no system service needed;
  * an unpacked ActiveMQ Classic 5.x: {ENV_ACTIVEMQ_HOME}=<dir with bin/activemq.jar>;
  * a running broker: {ENV_ACTIVEMQ_STOMP_URL}=stomp://127.0.0.1:61613; fault tests still need a private broker;
  * a Docker engine: the harness then runs {DEFAULT_ACTIVEMQ_IMAGE} through testcontainers."""


def make_self_signed_cert(directory: Path) -> Path:
    """A self-signed certificate for 127.0.0.1 (cert.pem, key.pem) valid for a day; returns cert.pem,
    which clients use as their CA file. Needs the openssl command (Debian's openssl package)."""
    directory.mkdir(mode=0o700, exist_ok=True)
    openssl = shutil.which("openssl")
    if openssl is None:
        apt_install("openssl")
        openssl = shutil.which("openssl")
    if openssl is None:
        raise BrokerUnavailable("the TLS listeners need a certificate and the openssl command is missing: "
                                "apt-get install openssl")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True,
                   stdin=subprocess.DEVNULL, timeout=60)
    for f in (cert, key):
        f.chmod(0o644)  # the broker may run as another user
    return cert


def start_rabbitmq(base_dir: Path | None = None) -> Broker:
    """A private, harness-managed RabbitMQ: local binary (apt-installed if needed), else Docker."""
    tried = []
    bin_dir = find_rabbitmq_bin_dir()
    if bin_dir is None:
        reason = apt_install("rabbitmq-server")
        bin_dir = find_rabbitmq_bin_dir()
        if bin_dir is None:
            tried.append(f"no local rabbitmq-server ({reason or 'installed, but not found'})")
    if bin_dir is not None:
        if shutil.which("epmd") is None and shutil.which("erl") is None:
            tried.append("rabbitmq-server found but no Erlang (erl/epmd) on PATH")
        else:
            return RabbitMQ(bin_dir, base_dir=base_dir).start()
    from broker_containers import docker_answers

    why_not = docker_answers()
    if why_not is None:
        from broker_containers import RabbitMQContainer

        return RabbitMQContainer(os.environ.get(ENV_RABBITMQ_IMAGE, DEFAULT_RABBITMQ_IMAGE)).start()
    tried.append(why_not)
    raise BrokerUnavailable("No RabbitMQ available: " + "; ".join(tried) + "\n" + _RABBITMQ_HELP)


def start_activemq(users: dict[str, str] | None = None, base_dir: Path | None = None,
                   max_page_size: int | None = None) -> Broker:
    """A private, harness-managed ActiveMQ: local installation (apt-installed if needed), else Docker.
    ``max_page_size``: the queues' ``maxPageSize`` policy (ActiveMQ's default is 200), which also bounds
    what a consumer gets unacknowledged from a queue, whatever its prefetch."""
    tried = []
    home = find_activemq_home()
    if home is None:
        reason = apt_install("activemq")
        home = find_activemq_home()
        if home is None:
            tried.append(f"no local ActiveMQ ({reason or 'installed, but not found'})")
    if home is not None:
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            tried.append("ActiveMQ found but no java on PATH (apt-get install -y openjdk-17-jre-headless)")
        else:
            return ActiveMQ(home, users=users, base_dir=base_dir, max_page_size=max_page_size).start()
    if users or max_page_size is not None:
        tried.append("users= and max_page_size= need a local ActiveMQ (the container path does not configure them)")
    else:
        from broker_containers import docker_answers

        why_not = docker_answers()
        if why_not is None:
            from broker_containers import ActiveMQContainer

            return ActiveMQContainer(os.environ.get(ENV_ACTIVEMQ_IMAGE, DEFAULT_ACTIVEMQ_IMAGE)).start()
        tried.append(why_not)
    raise BrokerUnavailable("No ActiveMQ available: " + "; ".join(tried) + "\n" + _ACTIVEMQ_HELP)


def rabbitmq_from_environment_or_start() -> Broker:
    amqp = os.environ.get(ENV_RABBITMQ_AMQP_URL)
    if amqp:
        urls = {"amqp": amqp}
        if os.environ.get(ENV_RABBITMQ_STOMP_URL):
            urls["stomp"] = os.environ[ENV_RABBITMQ_STOMP_URL]
        return ExternalBroker("rabbitmq", urls).start()
    return start_rabbitmq()


def activemq_from_environment_or_start() -> Broker:
    stomp = os.environ.get(ENV_ACTIVEMQ_STOMP_URL)
    if stomp:
        return ExternalBroker("activemq", {"stomp": stomp}).start()
    return start_activemq()




@contextlib.contextmanager
def malamute_running(**kwargs):
    """The embedded Malamute broker as a process of its own on a free TCP port, for the block
    (``BrokerProcess`` keyword arguments: client_timeout, mailbox_dir, args ...)."""
    from broker_process import BrokerProcess

    broker = BrokerProcess(**kwargs)
    t0 = time.monotonic()
    try:
        broker.start()
        _log_start("malamute", time.monotonic() - t0)
    except RuntimeError as exc:
        raise BrokerUnavailable(f"cannot start the embedded Malamute broker (python -m spark_mq.malamute_broker): "
                                f"{exc}") from exc
    try:
        yield broker
    finally:
        broker.stop()
