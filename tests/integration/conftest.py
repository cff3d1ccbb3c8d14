"""Broker fixtures for the integration tests (the brokers themselves are in brokers.py).

Fixtures:
  rabbitmq            session: the shared RabbitMQ handle (AMQP 0-8 + STOMP), started at first request
  rabbitmq4           session: the shared RabbitMQ 4 handle (AMQP 0-9-1 + STOMP; broker_rabbitmq4.py)
  activemq            session: the shared ActiveMQ handle (STOMP), started at first request
  stomp_broker        session, parametrized over both STOMP brokers (ids "rabbitmq", "activemq")
  rabbitmq_isolated   function: factory; rabbitmq_isolated() -> a fresh private RabbitMQ, stopped after the test
  activemq_isolated   function: factory; activemq_isolated(users=None) -> a fresh private ActiveMQ, likewise
  unique_name         function: callable; unique_name(prefix="q") -> a queue/destination name unused so far
  spark               session: the process's SparkSession, every format registered (sinktest.local_spark)
  malamute_broker     function: the embedded Malamute broker in a process of its own

When a session needs both shared brokers, the first request starts both in background threads, so their
start-ups overlap. The shared brokers are stopped at session end (finalizer, pytest_sessionfinish, atexit,
and a watchdog process that kills them if this process dies). A test may kill()/restart() a shared broker;
if it leaves it down, the harness restarts it after the test. Fault tests that need a broker of their own, or
an environment-URL broker in use for the shared one, should use the *_isolated factories.
"""

from __future__ import annotations

import re
import secrets
import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # import brokers in every pytest import mode
import brokers  # noqa: E402

SHARED_KINDS = ("rabbitmq", "activemq")
_FIXTURE_NEEDS = {"rabbitmq": {"rabbitmq"}, "activemq": {"activemq"}, "stomp_broker": {"rabbitmq", "activemq"},
                  "rabbitmq4": {"rabbitmq4"}}
_START_WAIT = brokers.START_TIMEOUT * 3  # covers an apt-get install of the broker on a fresh machine
_STARTERS = {"rabbitmq": brokers.rabbitmq_from_environment_or_start,
             "activemq": brokers.activemq_from_environment_or_start,
             "rabbitmq4": lambda: __import__("broker_rabbitmq4").start_rabbitmq4()}
# RabbitMQ 4's first start on a machine also builds its Debian 13 root (broker_rabbitmq4.py)
_START_WAITS = {"rabbitmq4": 900 + _START_WAIT}


class _BrokerPool:
    """Shared brokers of this session: started once each in a background thread, errors remembered."""

    def __init__(self) -> None:
        self.needed: set[str] = set()
        self._lock = threading.Lock()
        self._threads: dict[str, threading.Thread] = {}
        self._handles: dict[str, brokers.Broker] = {}
        self._errors: dict[str, BaseException] = {}
        self._closed = False

    def _start_in_background(self, kind: str) -> None:
        with self._lock:
            if kind in self._threads or self._closed:
                return

            def run() -> None:
                try:
                    handle = _STARTERS[kind]()
                    handle._shared = True
                    self._handles[kind] = handle
                except BaseException as exc:  # noqa: BLE001 - re-raised in the test that asks
                    self._errors[kind] = exc

            thread = threading.Thread(target=run, name=f"start-{kind}", daemon=True)
            self._threads[kind] = thread
            thread.start()

    def get(self, kind: str) -> brokers.Broker:
        for other in sorted(self.needed | {kind}):
            self._start_in_background(other)
        thread = self._threads.get(kind)
        if thread is None:
            raise brokers.BrokerError(f"the session is shutting down; no {kind} any more")
        wait = _START_WAITS.get(kind, _START_WAIT)
        thread.join(wait)
        if thread.is_alive():
            raise brokers.BrokerUnavailable(f"{kind} did not start within {wait:.0f}s")
        if kind in self._errors:
            raise self._errors[kind]
        return self._handles[kind]

    def started(self) -> list[brokers.Broker]:
        return list(self._handles.values())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(_START_WAIT)
        for handle in self.started():
            handle._shutdown()


_POOL = _BrokerPool()


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        for name in getattr(item, "fixturenames", ()):
            _POOL.needed |= _FIXTURE_NEEDS.get(name, set())


def pytest_configure(config: pytest.Config) -> None:
    config._spark_mq_broker_starts = brokers.START_LOG  # read by the durations record (tests/conftest.py)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _POOL.close()


def pytest_terminal_summary(terminalreporter) -> None:
    for handle in _POOL.started():
        times = ", ".join(f"{s:.1f}s" for s in handle.start_seconds) or "external"
        terminalreporter.write_line(f"broker {handle!r}: start-up times {times}")


def _shared(request: pytest.FixtureRequest, kind: str) -> brokers.Broker:
    # No finalizer here: stomp_broker's per-param teardown must not stop a broker other tests still use.
    # The pool stops every shared broker in pytest_sessionfinish (also after Ctrl-C), atexit as a fallback.
    return _POOL.get(kind)


@pytest.fixture(scope="session")
def rabbitmq(request: pytest.FixtureRequest) -> brokers.Broker:
    """The session's RabbitMQ: amqp_port, stomp_port, url("amqp"|"stomp"), ctl/add_user/add_vhost, kill/restart."""
    return _shared(request, "rabbitmq")


@pytest.fixture(scope="session")
def rabbitmq4(request: pytest.FixtureRequest) -> brokers.Broker:
    """The session's RabbitMQ 4 (AMQP 0-9-1 + STOMP; broker_rabbitmq4.py): the same handle as ``rabbitmq``."""
    return _shared(request, "rabbitmq4")


@pytest.fixture(scope="session")
def activemq(request: pytest.FixtureRequest) -> brokers.Broker:
    """The session's ActiveMQ: stomp_port, url("stomp"), kill/restart."""
    return _shared(request, "activemq")


@pytest.fixture(scope="session", params=SHARED_KINDS)
def stomp_broker(request: pytest.FixtureRequest) -> brokers.Broker:
    """Each STOMP broker in turn (RabbitMQ's STOMP plugin, then ActiveMQ); use h.url("stomp"), h.stomp_port."""
    return _shared(request, request.param)


@pytest.fixture(autouse=True)
def _restore_shared_brokers():
    """After each test, bring back a shared broker that the test killed and left down."""
    yield
    for handle in _POOL.started():
        if handle.managed and not handle._stopped and not handle.is_running():
            handle.restart()


def _isolated_factory(request: pytest.FixtureRequest, start):
    started: list[brokers.Broker] = []

    def make(**kwargs) -> brokers.Broker:
        handle = start(**kwargs)
        started.append(handle)
        return handle

    def stop_all() -> None:
        for handle in started:
            handle._shutdown()

    request.addfinalizer(stop_all)
    return make


@pytest.fixture
def rabbitmq_isolated(request: pytest.FixtureRequest):
    """Factory: rabbitmq_isolated() starts a private RabbitMQ (never an environment URL) for this test only."""
    return _isolated_factory(request, brokers.start_rabbitmq)


@pytest.fixture
def activemq_isolated(request: pytest.FixtureRequest):
    """Factory: activemq_isolated(users={"u": "p"} or None) starts a private ActiveMQ for this test only."""
    return _isolated_factory(request, brokers.start_activemq)


_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_name_counter = 0
_name_lock = threading.Lock()


@pytest.fixture
def unique_name(request: pytest.FixtureRequest):
    """Callable: unique_name(prefix="q") -> e.g. "q.test_publish-3-a1b2c3", new on every call, safe in any
    queue or destination name (letters, digits, "_", ".", "-"); STOMP: "/queue/" + unique_name()."""
    test = _NAME_UNSAFE.sub("-", request.node.name)[:60].strip("-")
    run = secrets.token_hex(3)

    def make(prefix: str = "q") -> str:
        global _name_counter
        with _name_lock:
            _name_counter += 1
            n = _name_counter
        return f"{prefix}.{test}-{n}-{run}"

    return make



@pytest.fixture(scope="session")
def spark():
    """The process's one local[2] SparkSession (one per xdist worker), with the three formats and the sink
    tests' own formats registered (sinktest.register_all). A SparkContext takes seconds to start and a
    process can hold one at a time: every in-process test shares it; tests that kill a driver run their
    own in a subprocess."""
    from sinktest import local_spark

    session = local_spark("spark-mq-tests")
    yield session
    session.stop()


@pytest.fixture
def malamute_broker(tmp_path):
    """The embedded Malamute broker as a process of its own (mailboxes on disk under tmp_path)."""
    with brokers.malamute_running(client_timeout=10.0, mailbox_dir=str(tmp_path / "mailboxes")) as broker:
        yield broker
