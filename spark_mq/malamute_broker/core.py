"""The Malamute broker's routing core: clients, streams, mailboxes and services, without any IO.

``BrokerCore.handle(routing_id, frames, now)`` takes one message received on the ROUTER socket
(the routing id and the Malamute frames) and answers through the ``send(routing_id, frames) ->
bool`` callable it was built with (``False`` = the peer is unreachable or its queue is full).
``tick(now)`` expires silent clients and timed-out stored messages. The clock is an argument;
this module must not import zmq, sockets, threads or time, so it can be unit tested with lists.

Wire behaviour follows specs/malamute/malamute-observed.md for every exchange a correct client
makes (same replies, same silences: no reply to STREAM-SEND, MAILBOX-SEND, SERVICE-SEND, CREDIT)
and fixes the reference broker's bugs (see docs/malamute.md): malformed messages get ERROR 500
and harm nobody else, invalid or hanging patterns get ERROR 300, OK is always 200, every stored
message keeps its own tracker, overlapping patterns deliver once, queues are bounded, and CREDIT
is honoured when ``credit=True``.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

from spark_mq.errors import RemoteProtocolError
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.malamute.codec import MessageId, StatusCode
from spark_mq.protocol.malamute.patterns import Matcher, PatternError, compile_pattern

SendFn = Callable[[bytes, list], bool]

_OK = codec.encode(codec.Ok(StatusCode.SUCCESS, ""))
_PONG = codec.encode(codec.ConnectionPong())
_STREAM_DELIVER_PREFIX = codec.SIGNATURE + bytes((MessageId.STREAM_DELIVER,))
_STREAM_SEND_ID = MessageId.STREAM_SEND
_U16 = struct.Struct(">H")


def _error(code: int, reason: str) -> list:
    return codec.encode(codec.Error(code, reason[: codec.MAX_STRING]))


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


_MAX_HELD_REPLIES = 10_000  # answers held per client while its queue is full


@dataclass(frozen=True)
class Limits:
    """Memory bounds. A message that would exceed a bound is dropped and counted in ``stats``."""

    max_mailbox: int = 100_000  # stored messages per mailbox address
    max_service_queue: int = 100_000  # queued requests per service
    max_held: int = 100_000  # deliveries waiting for CREDIT per client (credit mode only)
    max_clients: int = 100_000


@dataclass(eq=False)
class Client:
    rid: bytes
    address: str
    last_seen: float
    writer: Optional["Stream"] = None
    writer_prefix: bytes = b""  # STREAM-DELIVER header up to the subject, for the current stream
    reading: dict = field(default_factory=dict)  # stream name -> list[Matcher]
    offers: list = field(default_factory=list)  # list[Offer]
    credit: int = 0
    held: deque = field(default_factory=deque)  # (frames, stored-entry-or-None)


@dataclass(eq=False)
class Stream:
    name: str
    readers: dict = field(default_factory=dict)  # rid -> (client, tuple[Matcher, ...], match_all)
    fanout: tuple = ()  # snapshot of readers.values() for the hot path

    def rebuild(self) -> None:
        self.fanout = tuple(self.readers.values())


@dataclass(eq=False)
class Offer:
    client: Client
    matcher: Matcher
    service: str


@dataclass(eq=False)
class Stored:
    """A mailbox message or service request waiting for its receiver."""

    header: bytes
    content: list
    subject: bytes
    deadline: Optional[float]
    seq: Optional[int] = None  # position in the persistent mailbox store, if any


@dataclass(eq=False)
class Service:
    name: str
    offers: list = field(default_factory=list)  # round robin: the chosen offer moves to the end
    queue: deque = field(default_factory=deque)


class MailboxStoreProtocol:  # documentation only: what BrokerCore expects of a store
    def append(self, address: str, header: bytes, content: Sequence[bytes]) -> int: ...
    def delivered(self, seq: int) -> None: ...


class BrokerCore:
    def __init__(
        self,
        send: SendFn,
        *,
        client_timeout: float = 60.0,
        credit: bool = False,
        limits: Limits = Limits(),
        store=None,
    ) -> None:
        self.send = send
        self.client_timeout = client_timeout
        self.credit_mode = credit
        self.limits = limits
        self.store = store
        self.clients: dict[bytes, Client] = {}
        self.by_address: dict[str, list[Client]] = {}  # newest last: the newest receives the mail
        self.streams: dict[str, Stream] = {}
        self.services: dict[str, Service] = {}
        self.mailboxes: dict[str, deque] = {}
        # Mailboxes and services whose owner/worker is connected but whose ZeroMQ queue was full
        # (ROUTER_MANDATORY: EAGAIN, nothing sent): their messages wait here and are retried by
        # retry_backlog(), which the server calls often while this is non-empty.
        self.backlog_mailboxes: set[str] = set()
        self.backlog_services: set[str] = set()
        # Answers (OK, PONG, ERROR) that met a full client queue, per client, in order: never dropped,
        # since a client matches answers to its requests in order and one lost answer shifts the rest.
        self.backlog_replies: dict[bytes, deque] = {}
        # stored messages with a deadline created since tick() last found none queued: while zero,
        # tick() does not look through the queues (it did, every second: 58 ms a tick with
        # 1,000,000 untimed mails queued, the broker answering nobody meanwhile)
        self._timed = 0
        self.stats = {"malformed": 0, "dropped": 0, "expired_clients": 0, "expired_messages": 0,
                      "unroutable": 0}
        self._handlers = {
            MessageId.CONNECTION_OPEN: self._open,
            MessageId.CONNECTION_PING: self._ping,
            MessageId.CONNECTION_CLOSE: self._close,
            MessageId.STREAM_WRITE: self._stream_write,
            MessageId.STREAM_READ: self._stream_read,
            MessageId.STREAM_CANCEL: self._stream_cancel,
            MessageId.STREAM_SEND: self._stream_send,
            MessageId.MAILBOX_SEND: self._mailbox_send,
            MessageId.SERVICE_SEND: self._service_send,
            MessageId.SERVICE_OFFER: self._service_offer,
            MessageId.CREDIT: self._credit,
            MessageId.CONFIRM: self._confirm,
        }

    # ------------------------------------------------------------ entry points

    def handle(self, rid: bytes, frames: Sequence, now: float) -> None:
        """Process one message from ``rid``. Never raises for bad input: it answers ERROR instead."""
        client = self.clients.get(rid)
        # Hot path: STREAM-SEND from a registered producer, parsed by offsets without decoding.
        header = frames[0] if frames else b""
        if (client is not None and len(header) >= 4 and header[2] == _STREAM_SEND_ID
                and header[0] == 0xAA and header[1] == 0xA8):
            client.last_seen = now
            if header[3] + 4 != len(header):
                self._malformed(rid, "STREAM-SEND header length does not match its subject")
                return
            stream = client.writer
            if stream is None:
                self.stats["dropped"] += 1
                return
            out_header = client.writer_prefix + header[3:]
            subject = header[4:]
            for reader, matchers, match_all in stream.fanout:
                if reader is client:
                    continue
                if match_all or any(m.matches(subject) for m in matchers):
                    self._deliver(reader, [out_header, *frames[1:]], None)
            return
        try:
            message = codec.decode(frames, codec.CLIENT_MESSAGES)
        except RemoteProtocolError as exc:
            self._malformed(rid, str(exc))
            return
        if client is None:
            if message.ID == MessageId.CONNECTION_OPEN:
                self._open(rid, None, message, now)
            elif message.ID == MessageId.CONNECTION_CLOSE:
                self._reply(rid, _OK)
            else:
                self._reply(rid, _error(StatusCode.COMMAND_INVALID, "unknown client: send CONNECTION-OPEN first"))
            return
        client.last_seen = now
        self._handlers[message.ID](rid, client, message, now)

    def tick(self, now: float) -> None:
        """Expire clients silent for longer than ``client_timeout`` and stored messages past their timeout."""
        deadline = now - self.client_timeout
        for client in [c for c in self.clients.values() if c.last_seen < deadline]:
            self.stats["expired_clients"] += 1
            self._deregister(client)
        if not self._timed:
            return
        timed = 0
        for queue in list(self.mailboxes.values()) + [s.queue for s in self.services.values()]:
            deadlines = [e.deadline for e in queue if e.deadline is not None]
            if deadlines and min(deadlines) <= now:
                kept = [e for e in queue if e.deadline is None or e.deadline > now]
                self.stats["expired_messages"] += len(queue) - len(kept)
                for e in queue:
                    if e.seq is not None and e.deadline is not None and e.deadline <= now:
                        self.store.delivered(e.seq)
                queue.clear()
                queue.extend(kept)
                timed += sum(1 for e in kept if e.deadline is not None)
            else:
                timed += len(deadlines)
        self._timed = timed

    def restore(self, address: str, header: bytes, content: list, seq: int) -> None:
        """Put a message loaded from the persistent store back into its mailbox (at start-up)."""
        subject = b""
        self.mailboxes.setdefault(address, deque()).append(Stored(header, content, subject, None, seq))

    # ------------------------------------------------------------ helpers

    def _malformed(self, rid: bytes, why: str) -> None:
        self.stats["malformed"] += 1
        self._reply(rid, _error(StatusCode.COMMAND_INVALID, f"malformed message: {why}"))

    def _deliver(self, client: Client, frames: list, entry: Optional[Stored]) -> bool:
        """Send to a client, through its credit window in credit mode. False if not delivered."""
        if self.credit_mode:
            if client.credit <= 0 or client.held:
                if len(client.held) >= self.limits.max_held:
                    self.stats["dropped"] += 1
                    return False
                client.held.append((frames, entry))
                return True
            client.credit -= 1
        if self.send(client.rid, frames):
            if entry is not None and entry.seq is not None:
                self.store.delivered(entry.seq)
            return True
        self.stats["unroutable"] += 1
        return False

    def _compile(self, rid: bytes, pattern: str) -> Optional[Matcher]:
        try:
            return compile_pattern(pattern)
        except PatternError as exc:
            self._reply(rid, _error(StatusCode.NOT_DELIVERED, str(exc)))
            return None

    def _deregister(self, client: Client) -> None:
        self.clients.pop(client.rid, None)
        if client.address:
            owners = self.by_address.get(client.address)
            if owners is not None:
                if client in owners:
                    owners.remove(client)
                if not owners:
                    del self.by_address[client.address]
        for name in client.reading:
            stream = self.streams.get(name)
            if stream is not None and stream.readers.pop(client.rid, None) is not None:
                stream.rebuild()
        client.reading.clear()
        for offer in client.offers:
            service = self.services.get(offer.service)
            if service is not None and offer in service.offers:
                service.offers.remove(offer)
        client.offers.clear()
        client.writer = None
        # Mail held back by the credit window goes back to the mailbox; nothing else is kept.
        if client.held and client.address:
            box = self.mailboxes.setdefault(client.address, deque())
            for frames, entry in reversed(client.held):
                if entry is not None:
                    box.appendleft(entry)
                    if entry.deadline is not None:
                        self._timed += 1  # a tick may have run while it was held, out of every queue
        client.held.clear()

    # ------------------------------------------------------------ connection

    def _open(self, rid: bytes, client: Optional[Client], msg: codec.ConnectionOpen, now: float) -> None:
        if client is not None:
            # Reference behaviour: a second OPEN on one connection is an error and de-registers it.
            self._deregister(client)
            self._reply(rid, _error(StatusCode.COMMAND_INVALID, "connection already open"))
            return
        if msg.protocol != codec.PROTOCOL_NAME or msg.version != codec.PROTOCOL_VERSION:
            self._reply(rid, _error(StatusCode.COMMAND_INVALID,
                                  f"unsupported protocol {msg.protocol!r} version {msg.version}"))
            return
        if len(self.clients) >= self.limits.max_clients:
            self._reply(rid, _error(StatusCode.INTERNAL_ERROR, "too many clients"))
            return
        client = Client(rid, msg.address, now)
        self.clients[rid] = client
        if msg.address:
            self.by_address.setdefault(msg.address, []).append(client)
        self._reply(rid, _OK)
        if msg.address:
            self._flush_mailbox(msg.address)

    def _ping(self, rid, client, msg, now) -> None:
        self._reply(rid, _PONG)

    def _close(self, rid, client, msg, now) -> None:
        self._deregister(client)
        self._reply(rid, _OK)

    # ------------------------------------------------------------ streams

    def _stream(self, name: str) -> Stream:
        stream = self.streams.get(name)
        if stream is None:
            stream = self.streams[name] = Stream(name)
        return stream

    def _stream_write(self, rid, client: Client, msg: codec.StreamWrite, now) -> None:
        client.writer = self._stream(msg.stream)
        client.writer_prefix = (_STREAM_DELIVER_PREFIX + codec.encode_string(msg.stream)
                                + codec.encode_string(client.address))
        self._reply(rid, _OK)

    def _stream_read(self, rid, client: Client, msg: codec.StreamRead, now) -> None:
        matcher = self._compile(rid, msg.pattern)
        if matcher is None:
            return
        stream = self._stream(msg.stream)
        matchers = client.reading.setdefault(msg.stream, [])
        matchers.append(matcher)
        match_all = any(not m.pattern for m in matchers)
        stream.readers[rid] = (client, tuple(matchers), match_all)
        stream.rebuild()
        self._reply(rid, _OK)

    def _stream_cancel(self, rid, client: Client, msg: codec.StreamCancel, now) -> None:
        client.reading.pop(msg.stream, None)
        stream = self.streams.get(msg.stream)
        if stream is not None and stream.readers.pop(rid, None) is not None:
            stream.rebuild()
        self._reply(rid, _OK)

    def _stream_send(self, rid, client: Client, msg: codec.StreamSend, now) -> None:
        # Reached only when the fast path in handle() did not apply (it always does for valid input).
        self.handle(rid, codec.encode(msg), now)

    # ------------------------------------------------------------ mailboxes

    def _mailbox_send(self, rid, client: Client, msg: codec.MailboxSend, now) -> None:
        header = codec.encode_header(codec.MailboxDeliver(client.address, msg.address, msg.subject, msg.tracker))
        deadline = now + msg.timeout / 1000.0 if msg.timeout else None
        if deadline is not None:
            self._timed += 1
        entry = Stored(header, list(msg.content), b"", deadline)
        owners = self.by_address.get(msg.address)
        box = self.mailboxes.get(msg.address)
        # mail already waiting goes first: a new message joins the queue behind it
        if owners and not box and self._deliver(owners[-1], [header, *entry.content], entry):
            return
        box = self.mailboxes.setdefault(msg.address, deque())
        if len(box) >= self.limits.max_mailbox:
            self.stats["dropped"] += 1
            return
        if self.store is not None:
            entry.seq = self.store.append(msg.address, header, entry.content)
        box.append(entry)
        if owners:
            self.backlog_mailboxes.add(msg.address)

    def _flush_mailbox(self, address: str) -> None:
        box = self.mailboxes.get(address)
        owners = self.by_address.get(address)
        while box and owners:
            entry = box[0]
            if not self._deliver(owners[-1], [entry.header, *entry.content], entry):
                self.backlog_mailboxes.add(address)  # the client's queue is full: retried later
                return
            box.popleft()
        self.backlog_mailboxes.discard(address)
        if box is not None and not box:
            del self.mailboxes[address]

    def _reply(self, rid: bytes, frames: list) -> None:
        """Send an answer; while the client's queue is full it waits, after earlier ones, in
        ``backlog_replies`` (at most ``_MAX_HELD_REPLIES`` per client; beyond, it is dropped and counted).
        The store's records are flushed first: once a client hears anything back, the mail it sent
        before survives a killed broker."""
        if self.store is not None:
            self.store.flush()
        queued = self.backlog_replies.get(rid)
        if queued is None:
            if self.send(rid, frames):
                return
            queued = self.backlog_replies[rid] = deque()
        if len(queued) >= _MAX_HELD_REPLIES:
            self.stats["dropped"] += 1
            return
        queued.append(frames)

    def retry_backlog(self) -> None:
        """Deliver what waited for a full client queue (see ``backlog_mailboxes``), in order."""
        if self.store is not None and self.backlog_replies:
            self.store.flush()
        for rid in list(self.backlog_replies):
            queued = self.backlog_replies[rid]
            while queued and self.send(rid, queued[0]):
                queued.popleft()
            if not queued or rid not in self.clients:  # sent, or the client is gone
                del self.backlog_replies[rid]
        for address in list(self.backlog_mailboxes):
            self._flush_mailbox(address)
        for name in list(self.backlog_services):
            self.backlog_services.discard(name)
            service = self.services.get(name)
            if service is not None and service.queue:
                self._redispatch(service)

    # ------------------------------------------------------------ services

    def _service_send(self, rid, client: Client, msg: codec.ServiceSend, now) -> None:
        header = codec.encode_header(codec.ServiceDeliver(client.address, msg.address, msg.subject, msg.tracker))
        deadline = now + msg.timeout / 1000.0 if msg.timeout else None
        if deadline is not None:
            self._timed += 1
        entry = Stored(header, list(msg.content), _raw(msg.subject), deadline)
        service = self.services.get(msg.address)
        if service is None:
            service = self.services[msg.address] = Service(msg.address)
        if not service.queue and self._dispatch(service, entry):
            return
        if len(service.queue) >= self.limits.max_service_queue:
            self.stats["dropped"] += 1
            return
        service.queue.append(entry)
        if service.offers:
            self.backlog_services.add(service.name)

    def _dispatch(self, service: Service, entry: Stored) -> Optional[bool]:
        """True: delivered. False: a matching worker's queue was full. None: no offer matches."""
        offers = service.offers
        result = None
        for index, offer in enumerate(offers):
            if offer.matcher.matches(entry.subject):
                del offers[index]
                offers.append(offer)  # round robin
                if self._deliver(offer.client, [entry.header, *entry.content], None):
                    return True
                result = False
        return result

    def _redispatch(self, service: Service) -> None:
        """Offer the queued requests again, in order; stop at the first full worker queue."""
        waiting = list(service.queue)
        service.queue.clear()
        for i, entry in enumerate(waiting):
            delivered = self._dispatch(service, entry)
            if not delivered:
                service.queue.append(entry)
                if delivered is False:
                    service.queue.extend(waiting[i + 1:])
                    self.backlog_services.add(service.name)
                    return

    def _service_offer(self, rid, client: Client, msg: codec.ServiceOffer, now) -> None:
        matcher = self._compile(rid, msg.pattern)
        if matcher is None:
            return
        service = self.services.get(msg.address)
        if service is None:
            service = self.services[msg.address] = Service(msg.address)
        offer = Offer(client, matcher, msg.address)
        service.offers.append(offer)
        client.offers.append(offer)
        self._reply(rid, _OK)
        if service.queue:
            self._redispatch(service)

    # ------------------------------------------------------------ credit and confirm

    def _credit(self, rid, client: Client, msg: codec.Credit, now) -> None:
        if not self.credit_mode:
            return  # the reference broker ignores CREDIT; so do we unless asked
        client.credit += msg.amount
        while client.held and client.credit > 0:
            frames, entry = client.held.popleft()
            client.credit -= 1
            if self.send(rid, frames):
                if entry is not None and entry.seq is not None:
                    self.store.delivered(entry.seq)
            else:
                self.stats["unroutable"] += 1

    def _confirm(self, rid, client: Client, msg: codec.Confirm, now) -> None:
        # The grammar allows a client CONFIRM and expects no reply. The reference broker answers
        # ERROR 300 and drops the client; we accept it silently (trackers are not followed up).
        return
