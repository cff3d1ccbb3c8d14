"""The broker's ZeroMQ shell: a ROUTER socket, a poll loop, and the clock, around ``BrokerCore``.

``Broker(endpoints=[...])`` binds on ``start()`` (so a busy port fails there, in the caller),
then runs its loop in a daemon thread until ``stop()``; it is also a context manager.
``run()`` runs the loop in the calling thread (used by ``python -m spark_mq.malamute_broker``).

The loop is the hot path: it polls with ``zmq.Poller``, then drains the ROUTER with NOBLOCK
receives in a bounded batch before polling again, hands each message to the core, and ticks the
core about once a second. No per-message logging. Everything protocol-related is in ``core``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Iterable, Optional, Sequence

import zmq

from spark_mq.malamute_broker.core import BrokerCore, Limits
from spark_mq.malamute_broker.store import MailboxStore
from spark_mq.transport.zmqframes import NOBLOCK, recv_frames, send_frames

log = logging.getLogger("spark_mq.malamute_broker")

DEFAULT_ENDPOINT = "tcp://127.0.0.1:9999"
_DRAIN_BATCH = 4096
_TICK_INTERVAL = 1.0
_POLL_MS = 250
_BACKLOG_POLL_MS = 5  # while mail waits for a full client queue, retry this often


class Broker:
    """An embeddable Malamute broker.

    >>> with Broker(["tcp://127.0.0.1:0"]) as broker:   # doctest: +SKIP
    ...     endpoint = broker.endpoints[0]                # the port actually bound
    """

    def __init__(
        self,
        endpoints: Sequence[str] = (DEFAULT_ENDPOINT,),
        *,
        client_timeout: float = 60.0,
        credit: bool = False,
        limits: Limits = Limits(),
        mailbox_dir: Optional[str] = None,
        fsync: bool = False,
        hwm: int = 100_000,
        context: Optional[zmq.Context] = None,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        self.requested = list(endpoints)
        self.endpoints: list[str] = []
        self.hwm = hwm
        self._own_context = context is None
        self._context = context or zmq.Context()
        self.store = MailboxStore(mailbox_dir, fsync=fsync) if mailbox_dir else None
        self._router: Optional[zmq.Socket] = None
        self.core = BrokerCore(self._send, client_timeout=client_timeout, credit=credit, limits=limits,
                               store=self.store)
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._wake_addr = f"inproc://spark-mq-malamute-broker-{id(self):x}"
        self._wake_recv: Optional[zmq.Socket] = None
        self.error: Optional[BaseException] = None

    # ------------------------------------------------------------ lifecycle

    def bind(self) -> None:
        """Create and bind the sockets; load the persistent mailboxes. Idempotent."""
        if self._router is not None:
            return
        router = self._context.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.ROUTER_MANDATORY, 1)  # unroutable mail is kept, not silently lost
        router.setsockopt(zmq.SNDHWM, self.hwm)
        router.setsockopt(zmq.RCVHWM, self.hwm)
        try:
            for endpoint in self.requested:
                router.bind(endpoint)
                self.endpoints.append(router.getsockopt_string(zmq.LAST_ENDPOINT))
        except zmq.ZMQError:
            router.close(0)
            self.endpoints.clear()
            raise
        self._router = router
        self._wake_recv = self._context.socket(zmq.PAIR)
        self._wake_recv.bind(self._wake_addr)
        if self.store is not None:
            for seq, address, header, content in self.store.load():
                self.core.restore(address, header, content, seq)

    def start(self) -> "Broker":
        self.bind()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop_guarded, name="malamute-broker", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop thread, close the sockets. Safe to call twice."""
        self._stop.set()
        if self._thread is not None:
            wake = self._context.socket(zmq.PAIR)
            wake.setsockopt(zmq.LINGER, 0)
            wake.connect(self._wake_addr)
            wake.send(b"stop")
            self._thread.join(timeout)
            wake.close(0)
            if self._thread.is_alive():
                raise TimeoutError("malamute broker loop did not stop")
            self._thread = None
        self._close()

    def _close(self) -> None:
        for sock in (self._router, self._wake_recv):
            if sock is not None:
                sock.close(0)
        self._router = self._wake_recv = None
        if self.store is not None:
            self.store.close()
        if self._own_context:
            self._context.term()
            self._own_context = False

    def __enter__(self) -> "Broker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def run(self, stop_event: Optional[threading.Event] = None) -> None:
        """Run the loop in this thread until ``stop_event`` (or ``stop()``) is set."""
        self.bind()
        if stop_event is not None:
            self._stop = stop_event
        try:
            self._loop()
        finally:
            self._close()

    @property
    def stats(self) -> dict:
        return dict(self.core.stats, clients=len(self.core.clients))

    # ------------------------------------------------------------ the loop

    def _send(self, rid: bytes, frames: list) -> bool:
        try:
            send_frames(self._router, [rid, *frames])
            return True
        except zmq.ZMQError:  # EHOSTUNREACH (peer gone) or EAGAIN (peer's queue full)
            return False

    def _loop_guarded(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # recorded for the owner; the thread must not die silently
            self.error = exc
            log.exception("malamute broker loop failed")

    def _loop(self) -> None:
        router = self._router
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._wake_recv, zmq.POLLIN)
        handle = self.core.handle
        noblock = NOBLOCK
        again = zmq.Again
        clock = time.monotonic
        next_tick = clock() + _TICK_INTERVAL
        stop = self._stop
        core = self.core
        store = self.store
        while not stop.is_set():
            backlog = core.backlog_mailboxes or core.backlog_services or core.backlog_replies
            poller.poll(_BACKLOG_POLL_MS if backlog else _POLL_MS)
            now = clock()
            if backlog:
                core.retry_backlog()  # clients whose queue was full may have room again
            for _ in range(_DRAIN_BATCH):
                try:
                    frames = recv_frames(router, noblock)
                except again:
                    break
                try:
                    handle(frames[0], frames[1:], now)
                except Exception:  # a core bug must not take every other client down
                    log.exception("malamute broker: unexpected error handling a message")
            if now >= next_tick:
                self.core.tick(now)
                next_tick = now + _TICK_INTERVAL
            if store is not None:
                store.flush()  # one write for the turn's records (see MailboxStore)


def serve(endpoints: Iterable[str], **kwargs) -> Broker:
    """Start a broker in a background thread and return it (call ``stop()`` when done)."""
    return Broker(list(endpoints), **kwargs).start()
