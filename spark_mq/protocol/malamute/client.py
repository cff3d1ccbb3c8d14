"""Sans-IO Malamute client: commands in, frames out; frames in, events out; the clock is an argument.

``ClientConnection`` keeps what the reference C client (mlm_client) keeps: the connection state,
the FIFO of requests awaiting OK/ERROR/PONG (the broker answers in order), and the registrations
(producer stream, consumer patterns, service offers) it must replay after a broker restart.

Rules it enforces, from specs/malamute/malamute-observed.md:

- never wait for a reply to STREAM-SEND, MAILBOX-SEND, SERVICE-SEND or CREDIT (there is none);
- judge a reply by its message id (OK or ERROR), never by its status code, which may be stale;
- refuse CONFIRM unless ``confirm_supported`` (the real broker de-registers a client that sends it);
- refuse, locally, patterns that hang the real broker and strings it would truncate (NUL);
- ping every ``heartbeat`` seconds; declare the server lost after ``server_timeout`` seconds of
  silence; when the broker answers a PING with ERROR (or sends an unsolicited ERROR: it forgot us,
  typically after a restart) re-OPEN and replay STREAM-WRITE, STREAM-READ and SERVICE-OFFER.
  While that OPEN is outstanding, ERRORs are stale answers to messages sent before it and are
  ignored: the broker answers in order, so everything sent before the OPEN is answered before it.
  A PING the application asked for (a flush barrier) that such a recovery overtakes fails: the
  sends before it may have been dropped, and only the application can send them again.

Command methods append frames to an outbox drained by ``data_to_send()``. The fire-and-forget
encoders (``stream_send``, ``mailbox_send``, ``service_send``, ``credit``) touch no state and return
frames directly, so an IO driver may call them from any thread. No IO, threads, time or zmq here.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from enum import Enum
from typing import Optional, Sequence, Union

from spark_mq.errors import LocalProtocolError
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.malamute.codec import MessageId
from spark_mq.protocol.malamute.patterns import validate_pattern

DEFAULT_HEARTBEAT = 1.0  # seconds between PINGs, as the reference client
DEFAULT_SERVER_TIMEOUT = 4.0  # silence after which the server is considered gone, as the reference client
_FORGOTTEN = ("the broker forgot this client before answering (it restarted or expired the client): messages "
              "sent before this PING may have been dropped")


class State(Enum):
    IDLE = "idle"
    OPENING = "opening"
    CONNECTED = "connected"
    LOST = "lost"  # server silent too long; pinging until it answers
    RECOVERING = "recovering"  # re-OPEN and replay sent, waiting for the answers
    CLOSING = "closing"
    CLOSED = "closed"


# ---------------------------------------------------------------- events

@dataclass(frozen=True)
class Reply:
    """The answer to a request made with a token-returning command."""

    token: int
    command: MessageId
    ok: bool
    code: int = 0
    reason: str = ""


@dataclass(frozen=True)
class ServerLost:
    """No word from the server for ``server_timeout`` seconds; pending requests failed."""


@dataclass(frozen=True)
class ServerBack:
    """The server answered again after ``ServerLost`` and still knows us."""


@dataclass(frozen=True)
class Recovering:
    """The broker forgot us (ERROR to a PING, or unsolicited ERROR); re-OPEN and replay were sent."""

    code: int
    reason: str


@dataclass(frozen=True)
class Recovered:
    """Re-OPEN and replay were all answered."""


@dataclass(frozen=True)
class BrokerNotice:
    """An ERROR that answers nothing we are waiting for (kept for the application's information)."""

    code: int
    reason: str


Event = Union[Reply, ServerLost, ServerBack, Recovering, Recovered, BrokerNotice,
              codec.StreamDeliver, codec.MailboxDeliver, codec.ServiceDeliver, codec.Confirm]


@dataclass
class _Pending:
    token: int
    command: MessageId
    internal: bool  # a replay or heartbeat: no Reply event for it


def check_string(value: str, what: str) -> str:
    if "\x00" in value:
        raise LocalProtocolError(f"{what} contains NUL, which the reference broker truncates at")
    if len(value.encode("utf-8", "surrogateescape")) > codec.MAX_STRING:
        raise LocalProtocolError(f"{what} is longer than {codec.MAX_STRING} bytes")
    return value


class ClientConnection:
    def __init__(
        self,
        *,
        heartbeat: float = DEFAULT_HEARTBEAT,
        server_timeout: float = DEFAULT_SERVER_TIMEOUT,
        confirm_supported: bool = False,
    ) -> None:
        self.heartbeat = heartbeat
        self.server_timeout = server_timeout
        self.confirm_supported = confirm_supported
        self.state = State.IDLE
        self.address = ""
        self.writer: Optional[str] = None
        self.readers: list[tuple[str, str]] = []
        self.offers: list[tuple[str, str]] = []
        self._pending: deque[_Pending] = deque()
        self._outbox: list[list] = []
        self._next_token = 1
        self._open_deadline = 0.0
        self._next_ping = 0.0
        self._last_heard = 0.0
        self._awaiting_reopen = False
        self._carried: list[_Pending] = []  # user requests overtaken by a recovery
        self.recoveries = 0

    # ------------------------------------------------------------ plumbing

    def data_to_send(self) -> list[list]:
        out, self._outbox = self._outbox, []
        return out

    def _request(self, message: codec.Message, *, internal: bool = False) -> int:
        token = self._next_token
        self._next_token += 1
        self._pending.append(_Pending(token, message.ID, internal))
        self._outbox.append(codec.encode(message))
        return token

    def _require_open(self) -> None:
        if self.state in (State.IDLE, State.OPENING, State.CLOSING, State.CLOSED):
            raise LocalProtocolError(f"not connected (state {self.state.value})")

    @property
    def pending(self) -> int:
        return len(self._pending)

    @property
    def awaiting_reply(self) -> bool:
        """A request other than a heartbeat PING waits for its answer (an IO driver that holds back
        reading must read through to it: the answer may be queued behind deliveries)."""
        return any(not (p.internal and p.command is MessageId.CONNECTION_PING) for p in self._pending)

    # ------------------------------------------------------------ commands with replies

    def open(self, address: str, now: float, timeout: float) -> int:
        if self.state is not State.IDLE:
            raise LocalProtocolError(f"open() in state {self.state.value}")
        self.address = check_string(address, "address")
        self.state = State.OPENING
        self._open_deadline = now + timeout
        self._last_heard = now
        self._next_ping = now + self.heartbeat
        return self._request(codec.ConnectionOpen(address))

    def set_producer(self, stream: str) -> int:
        self._require_open()
        self.writer = check_string(stream, "stream")
        return self._request(codec.StreamWrite(stream))

    def set_consumer(self, stream: str, pattern: str = "") -> int:
        self._require_open()
        check_string(stream, "stream")
        check_string(pattern, "pattern")
        validate_pattern(pattern)
        if (stream, pattern) not in self.readers:
            self.readers.append((stream, pattern))
        return self._request(codec.StreamRead(stream, pattern))

    def remove_consumer(self, stream: str) -> int:
        self._require_open()
        check_string(stream, "stream")
        self.readers = [(s, p) for s, p in self.readers if s != stream]
        return self._request(codec.StreamCancel(stream))

    def set_worker(self, service: str, pattern: str = "") -> int:
        self._require_open()
        check_string(service, "service")
        check_string(pattern, "pattern")
        validate_pattern(pattern)
        if (service, pattern) not in self.offers:
            self.offers.append((service, pattern))
        return self._request(codec.ServiceOffer(service, pattern))

    def ping(self) -> int:
        """A PING whose PONG the caller wants to see (a flush barrier: everything before it was processed)."""
        self._require_open()
        return self._request(codec.ConnectionPing())

    def close(self) -> Optional[int]:
        if self.state in (State.IDLE, State.CLOSED):
            self.state = State.CLOSED
            return None
        self.state = State.CLOSING
        return self._request(codec.ConnectionClose())

    # ------------------------------------------------------------ fire-and-forget encoders (stateless)

    @staticmethod
    def stream_send(subject: str, content: Sequence = ()) -> list:
        return [codec.encode_header(codec.StreamSend(check_string(subject, "subject"))), *content]

    @staticmethod
    def mailbox_send(address: str, subject: str, content: Sequence = (), tracker: str = "", timeout: int = 0) -> list:
        msg = codec.MailboxSend(check_string(address, "address"), check_string(subject, "subject"),
                                check_string(tracker, "tracker"), timeout)
        return [codec.encode_header(msg), *content]

    @staticmethod
    def service_send(service: str, subject: str, content: Sequence = (), tracker: str = "", timeout: int = 0) -> list:
        msg = codec.ServiceSend(check_string(service, "service"), check_string(subject, "subject"),
                                check_string(tracker, "tracker"), timeout)
        return [codec.encode_header(msg), *content]

    @staticmethod
    def credit(amount: int) -> list:
        return codec.encode(codec.Credit(amount))

    def confirm(self, tracker: str, code: int = codec.StatusCode.SUCCESS, reason: str = "") -> list:
        if not self.confirm_supported:
            raise LocalProtocolError("CONFIRM is refused: the reference broker answers it with ERROR and "
                                     "drops the client (pass confirm_supported=True for a broker that accepts it)")
        return codec.encode(codec.Confirm(check_string(tracker, "tracker"), code, reason))

    # ------------------------------------------------------------ input

    def receive(self, frames: Sequence, now: float) -> list:
        """Handle one message from the server. Raises ``RemoteProtocolError`` if it is malformed."""
        message = codec.decode(frames, codec.SERVER_MESSAGES)
        self._last_heard = now
        events: list = []
        mid = message.ID
        if self.state is State.LOST:
            if mid == MessageId.ERROR:
                self._recover(message, events)
                return events
            self.state = State.CONNECTED
            events.append(ServerBack())
            if mid in (MessageId.OK, MessageId.CONNECTION_PONG):
                return events  # answers to requests already failed when the server was lost
        if mid == MessageId.OK or mid == MessageId.ERROR:
            self._on_status(message, events)
        elif mid == MessageId.CONNECTION_PONG:
            if self._pending and self._pending[0].command == MessageId.CONNECTION_PING:
                entry = self._pending.popleft()
                if not entry.internal:
                    events.append(Reply(entry.token, entry.command, True))
            self._maybe_recovered(events)
        else:
            events.append(message)  # deliveries and server CONFIRM
        return events

    def _on_status(self, message, events: list) -> None:
        ok = message.ID == MessageId.OK
        if self._awaiting_reopen:
            if not ok:
                return  # stale: answers a message sent to the broker before our re-OPEN reached it
            self._awaiting_reopen = False
        if not self._pending:
            if not ok and self.state in (State.CONNECTED, State.RECOVERING):
                self._recover(message, events)
            elif not ok:
                events.append(BrokerNotice(message.code, message.reason))
            return
        entry = self._pending.popleft()
        if entry.command == MessageId.CONNECTION_PING:
            if not ok:  # the broker does not know us: it restarted or expired us
                if not entry.internal:
                    # a flush barrier: what was sent before it may have been dropped (each send to a
                    # broker that forgot us is answered with ERROR and discarded), so it fails
                    events.append(Reply(entry.token, entry.command, False, 0, _FORGOTTEN))
                self._recover(message, events)
            return
        if entry.command == MessageId.CONNECTION_OPEN and self.state is State.OPENING:
            self.state = State.CONNECTED if ok else State.CLOSED
        elif entry.command == MessageId.CONNECTION_CLOSE:
            self.state = State.CLOSED
        if not entry.internal:
            events.append(Reply(entry.token, entry.command, ok, message.code, message.reason))
        elif not ok:
            events.append(BrokerNotice(message.code, f"replayed {entry.command.name} failed: {message.reason}"))
        self._maybe_recovered(events)

    def _maybe_recovered(self, events: list) -> None:
        if self.state is State.RECOVERING and not any(p.internal and p.command != MessageId.CONNECTION_PING
                                                      for p in self._pending):
            self.state = State.CONNECTED
            for entry in self._carried:
                if entry.command == MessageId.CONNECTION_PING:
                    # a flush barrier across a recovery cannot vouch for what was sent before it
                    events.append(Reply(entry.token, entry.command, False, 0, _FORGOTTEN))
                else:  # registrations were replayed
                    events.append(Reply(entry.token, entry.command, True, 0, "completed by replay after recovery"))
            self._carried.clear()
            events.append(Recovered())

    def _recover(self, message, events: list) -> None:
        if self.state in (State.OPENING, State.CLOSING, State.CLOSED, State.IDLE):
            self.state = State.CLOSED
            self._fail_pending(events, "broker does not know this client")
            return
        self.recoveries += 1
        # Requests in flight were sent to a broker that forgot us; registrations among them are
        # replayed below (they were recorded when made), so they complete with the replay.
        for entry in self._pending:
            if not entry.internal:
                self._carried.append(entry)
        self._pending.clear()
        self.state = State.RECOVERING
        self._awaiting_reopen = True
        events.append(Recovering(message.code, message.reason))
        self._request(codec.ConnectionOpen(self.address), internal=True)
        if self.writer is not None:
            self._request(codec.StreamWrite(self.writer), internal=True)
        for stream, pattern in self.readers:
            self._request(codec.StreamRead(stream, pattern), internal=True)
        for service, pattern in self.offers:
            self._request(codec.ServiceOffer(service, pattern), internal=True)

    def _fail_pending(self, events: list, why: str) -> None:
        for entry in list(self._carried) + list(self._pending):
            if not entry.internal:
                events.append(Reply(entry.token, entry.command, False, 0, why))
        self._carried.clear()
        self._pending.clear()
        self._awaiting_reopen = False

    # ------------------------------------------------------------ time

    def heard(self, now: float) -> None:
        """The transport holds unread messages from the server (the application is behind, and
        reading is held back): the server is not silent, whatever ``tick`` would conclude."""
        self._last_heard = now

    @property
    def last_heard(self) -> float:
        """When (the caller's clock, as passed to ``heard``/``receive``) the server was last heard."""
        return self._last_heard

    def lost_for(self, now: float) -> float:
        """Seconds since the server's silence passed ``server_timeout`` (0 unless it is ``LOST``)."""
        return max(0.0, now - self._last_heard - self.server_timeout) if self.state is State.LOST else 0.0

    def next_deadline(self) -> float:
        """When ``tick`` next has something to do."""
        if self.state is State.OPENING:
            return min(self._open_deadline, self._next_ping)
        return self._next_ping

    def tick(self, now: float) -> list:
        events: list = []
        state = self.state
        if state is State.OPENING:
            if now >= self._open_deadline:
                self.state = State.CLOSED
                self._fail_pending(events, "no answer to CONNECTION-OPEN within the connect timeout")
            return events
        if state not in (State.CONNECTED, State.LOST, State.RECOVERING):
            return events
        if state is not State.LOST and now - self._last_heard > self.server_timeout:
            self.state = State.LOST
            self._fail_pending(events, "server lost: no answer within the server timeout")
            events.append(ServerLost())
        if now >= self._next_ping:
            self._next_ping = now + self.heartbeat
            if self.state is State.LOST:
                self._outbox.append(codec.encode(codec.ConnectionPing()))  # untracked: anything back will do
            else:
                self._request(codec.ConnectionPing(), internal=True)
        return events
