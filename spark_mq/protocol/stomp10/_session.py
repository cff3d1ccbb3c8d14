"""The STOMP 1.0 client session as a sans-IO state machine (in the manner of h11).

Commands in, bytes out: ``connect``, ``send``, ``subscribe``... check the call against the
session state (transitions are the tables below) and return the bytes to write.  Bytes in,
frames out: ``receive_data`` parses server frames, checks each against the state, and keeps the
books the client needs: the CONNECTED session and broker profile, open transactions,
subscriptions, outstanding receipts, and (for ``ack:client`` subscriptions) the message ids
delivered and not yet acknowledged, so that ``ack`` is cumulative on every broker: one ACK where
the broker is cumulative, one ACK per pending message, in delivery order, where it is not.

ERROR frames are returned like any frame (``Frame.to_error()`` makes the exception); the caller
decides whom to raise them to.  Our misuse raises ``StompLocalProtocolError``; a broker breaking
the protocol raises ``StompRemoteProtocolError``.

It must not do IO, start threads or read a clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable, List, Mapping, Optional, Set, Union

from spark_mq.protocol.stomp10._brokers import UNKNOWN, BrokerProfile, detect_broker
from spark_mq.protocol.stomp10._constants import (
    DEFAULT_MAX_FRAME_SIZE,
    ENCODING,
    AckMode,
    Command,
    Header,
)
from spark_mq.protocol.stomp10._errors import StompLocalProtocolError, StompRemoteProtocolError
from spark_mq.protocol.stomp10._frame import Frame, HeaderItems, check_header, encode_frame, escape_value
from spark_mq.protocol.stomp10._parser import FrameParser

Body = Union[bytes, bytearray, memoryview, str]

_MESSAGE = Command.MESSAGE
_CLIENT_ACK = AckMode.CLIENT
_SUBSCRIPTION = Header.SUBSCRIPTION
_DESTINATION = Header.DESTINATION
_MESSAGE_ID = Header.MESSAGE_ID


class State(enum.Enum):
    __hash__ = object.__hash__  # members are unique: identity hash, in C (Enum's is Python)

    IDLE = "idle"  # nothing sent yet
    CONNECTING = "connecting"  # CONNECT sent, waiting for CONNECTED
    CONNECTED = "connected"
    DISCONNECTING = "disconnecting"  # DISCONNECT sent; frames still in flight may arrive
    CLOSED = "closed"  # the stream ended


_SESSION_COMMANDS = (
    Command.SEND,
    Command.SUBSCRIBE,
    Command.UNSUBSCRIBE,
    Command.BEGIN,
    Command.COMMIT,
    Command.ABORT,
    Command.ACK,
)

#: (state, command we send) -> next state
CLIENT_TRANSITIONS = {
    (State.IDLE, Command.CONNECT): State.CONNECTING,
    **{(State.CONNECTED, c): State.CONNECTED for c in _SESSION_COMMANDS},
    (State.CONNECTED, Command.DISCONNECT): State.DISCONNECTING,
}

#: (state, command the broker sends) -> next state
SERVER_TRANSITIONS = {
    (State.CONNECTING, Command.CONNECTED): State.CONNECTED,
    (State.CONNECTING, Command.ERROR): State.CONNECTING,  # refused; the broker closes next
    **{
        (s, c): s
        for s in (State.CONNECTED, State.DISCONNECTING)
        for c in (Command.MESSAGE, Command.RECEIPT, Command.ERROR)
    },
}


@dataclass
class Subscription:
    id: str
    destination: str
    ack: AckMode
    #: message ids delivered and not acknowledged, in delivery order (``ack:client`` only)
    pending: List[str] = field(default_factory=list)


class StompSession:
    """One client session.  Not thread-safe: the driver serialises calls."""

    def __init__(self, *, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, broker: Optional[BrokerProfile] = None):
        self.state = State.IDLE
        self.broker: BrokerProfile = broker or UNKNOWN
        self._broker_forced = broker is not None
        self.session_id: Optional[str] = None
        self.server: Optional[str] = None
        self.connected_headers: dict = {}
        self.transactions: Set[str] = set()
        self.subscriptions: dict[str, Subscription] = {}
        self.receipts: Set[str] = set()  # receipt ids asked for and not yet answered
        self._tx_receipts: dict = {}  # transaction -> receipt ids of its frames
        self._parser = FrameParser(max_frame_size=max_frame_size)
        self._counter = 0
        self._send_heads: dict = {}
        self._salvaged: List[Frame] = []

    # -- helpers -----------------------------------------------------------------------------
    def next_id(self, prefix: str) -> str:
        """A fresh identifier for a receipt, subscription or transaction."""
        self._counter += 1
        return f"{prefix}-{self._counter}"

    def _transition(self, command: Command) -> None:
        nxt = CLIENT_TRANSITIONS.get((self.state, command))
        if nxt is None:
            raise StompLocalProtocolError(f"cannot send {command.value} in state {self.state.value}", command=command.value)
        self.state = nxt

    def _check(self, command: Command) -> None:
        if (self.state, command) not in CLIENT_TRANSITIONS:
            raise StompLocalProtocolError(f"cannot send {command.value} in state {self.state.value}", command=command.value)

    def _receipt(self, command: Command, receipt: Optional[str], items: list, transaction: Optional[str] = None) -> None:
        if receipt is not None:
            if receipt in self.receipts:
                raise StompLocalProtocolError(f"receipt id {receipt!r} is already outstanding", command=command.value, header=Header.RECEIPT)
            items.append((Header.RECEIPT, receipt))
            if transaction is not None:
                self._tx_receipts.setdefault(transaction, []).append(receipt)

    def _known_transaction(self, command: Command, transaction: str) -> None:
        if transaction not in self.transactions:
            raise StompLocalProtocolError(f"transaction {transaction!r} is not open", command=command.value, header=Header.TRANSACTION)

    def _emit(self, command: Command, items: list, body: bytes = b"", content_length: bool = True) -> bytes:
        data = encode_frame(command, items, body, content_length=content_length, escape=self.broker.unescapes_sent_headers)
        self._transition(command)
        for name, value in items:
            if name == Header.RECEIPT:
                self.receipts.add(value)
                break
        return data

    # -- client frames -----------------------------------------------------------------------
    def connect(self, login: Optional[str] = None, passcode: Optional[str] = None, headers: HeaderItems = None) -> bytes:
        items = []
        if login is not None:
            items.append((Header.LOGIN, login))
        if passcode is not None:
            items.append((Header.PASSCODE, passcode))
        items.extend(_items(headers))
        return self._emit(Command.CONNECT, items)

    def send(
        self,
        destination: str,
        body: Body = b"",
        *,
        headers: HeaderItems = None,
        transaction: Optional[str] = None,
        receipt: Optional[str] = None,
        content_length: Optional[bool] = None,
    ) -> bytes:
        """A SEND frame.  Bytes bodies always carry ``content-length``; str bodies carry it only
        when they hold a NUL (ActiveMQ makes a TextMessage of a frame without one) unless
        ``content_length`` says otherwise."""
        if headers is None and transaction is None and receipt is None and content_length is None and not isinstance(body, str):
            self._check(Command.SEND)
            return b"".join(self._send_pieces(destination, body))
        if isinstance(body, str):
            body = body.encode(ENCODING)
            if content_length is None:
                content_length = b"\x00" in body
        elif content_length is None:
            content_length = True
        items = [(Header.DESTINATION, destination)]
        if transaction is not None:
            self._known_transaction(Command.SEND, transaction)
            items.append((Header.TRANSACTION, transaction))
        self._receipt(Command.SEND, receipt, items, transaction)
        items.extend(_items(headers))
        return self._emit(Command.SEND, items, body, content_length)

    def send_many(self, destination: str, bodies: Iterable[Union[bytes, bytearray, memoryview]], *, transaction: Optional[str] = None) -> bytes:
        """Many SEND frames of bytes bodies to one destination, as one buffer for one write."""
        self._check(Command.SEND)
        if transaction is not None:
            self._known_transaction(Command.SEND, transaction)
        pieces: list = []
        extend = pieces.extend
        for body in bodies:
            extend(self._send_pieces(destination, body, transaction))
        return b"".join(pieces)

    def send_pieces(self, destination: str, body, transaction: Optional[str] = None) -> tuple:
        """A SEND of a bytes body as pieces to join (for callers that batch writes)."""
        if self.state is not State.CONNECTED:
            self._check(Command.SEND)
        return self._send_pieces(destination, body, transaction)

    def _send_pieces(self, destination: str, body, transaction: Optional[str] = None) -> tuple:
        key = destination if transaction is None else (destination, transaction)
        head = self._send_heads.get(key)
        if head is None:
            check_header(Command.SEND.value, Header.DESTINATION, destination)
            escape = escape_value if self.broker.unescapes_sent_headers else str
            text = f"{Command.SEND.value}\n{Header.DESTINATION}:{escape(destination)}\n"
            if transaction is not None:
                check_header(Command.SEND.value, Header.TRANSACTION, transaction)
                text += f"{Header.TRANSACTION}:{escape(transaction)}\n"
            head = (text + f"{Header.CONTENT_LENGTH}:").encode(ENCODING)
            if len(self._send_heads) > 1024:
                self._send_heads.clear()
            self._send_heads[key] = head
        return head, b"%d\n\n" % len(body), body, b"\x00"

    def subscribe(
        self,
        destination: str,
        *,
        id: Optional[str] = None,
        ack: Union[AckMode, str] = AckMode.AUTO,
        selector: Optional[str] = None,
        prefetch: Optional[int] = None,
        headers: HeaderItems = None,
        receipt: Optional[str] = None,
    ) -> tuple[str, bytes]:
        """A SUBSCRIBE frame; returns ``(subscription id, bytes)``.  ``prefetch`` bounds the
        unacknowledged deliveries with the broker's own header (both known ones when the broker
        is not recognised)."""
        self._check(Command.SUBSCRIBE)
        ack = AckMode(ack)
        sub_id = id if id is not None else self.next_id("sub")
        if sub_id in self.subscriptions:
            raise StompLocalProtocolError(f"subscription id {sub_id!r} is in use", command=Command.SUBSCRIBE.value, header=Header.ID)
        items = [(Header.DESTINATION, destination), (Header.ID, sub_id), (Header.ACK, ack.value)]
        if selector is not None:
            items.append((Header.SELECTOR, selector))
        if prefetch is not None:
            if prefetch < 1:
                raise StompLocalProtocolError("prefetch must be at least 1", command=Command.SUBSCRIBE.value)
            items.extend((name, str(prefetch)) for name in self.broker.prefetch_headers)
        self._receipt(Command.SUBSCRIBE, receipt, items)
        items.extend(_items(headers))
        data = self._emit(Command.SUBSCRIBE, items)
        self.subscriptions[sub_id] = Subscription(sub_id, destination, ack)
        return sub_id, data

    def unsubscribe(self, *, id: Optional[str] = None, destination: Optional[str] = None, receipt: Optional[str] = None) -> bytes:
        """UNSUBSCRIBE by id, or every subscription to ``destination`` (by their ids, since both
        brokers key a subscription made with an id by that id)."""
        self._check(Command.UNSUBSCRIBE)
        if (id is None) == (destination is None):
            raise StompLocalProtocolError("give exactly one of id and destination", command=Command.UNSUBSCRIBE.value, header=Header.ID)
        if id is not None:
            if id not in self.subscriptions:
                raise StompLocalProtocolError(f"no subscription {id!r}", command=Command.UNSUBSCRIBE.value, header=Header.ID)
            ids = [id]
        else:
            ids = [s.id for s in self.subscriptions.values() if s.destination == destination]
            if not ids:
                raise StompLocalProtocolError(f"no subscription to {destination!r}", command=Command.UNSUBSCRIBE.value, header=Header.DESTINATION)
        frames = []
        for n, sub_id in enumerate(ids):
            items = [(Header.ID, sub_id), (Header.DESTINATION, self.subscriptions[sub_id].destination)]
            if n == len(ids) - 1:
                self._receipt(Command.UNSUBSCRIBE, receipt, items)
            frames.append(self._emit(Command.UNSUBSCRIBE, items))
            del self.subscriptions[sub_id]
        return b"".join(frames)

    def begin(self, transaction: Optional[str] = None, *, receipt: Optional[str] = None) -> tuple[str, bytes]:
        """BEGIN; returns ``(transaction id, bytes)``."""
        self._check(Command.BEGIN)
        tx = transaction if transaction is not None else self.next_id("tx")
        if tx in self.transactions:
            raise StompLocalProtocolError(f"transaction {tx!r} is already open", command=Command.BEGIN.value, header=Header.TRANSACTION)
        items = [(Header.TRANSACTION, tx)]
        self._receipt(Command.BEGIN, receipt, items)
        data = self._emit(Command.BEGIN, items)
        self.transactions.add(tx)
        return tx, data

    def commit(self, transaction: str, *, receipt: Optional[str] = None) -> bytes:
        return self._end_transaction(Command.COMMIT, transaction, receipt)

    def abort(self, transaction: str, *, receipt: Optional[str] = None) -> bytes:
        return self._end_transaction(Command.ABORT, transaction, receipt)

    def _end_transaction(self, command: Command, transaction: str, receipt: Optional[str]) -> bytes:
        self._check(command)
        self._known_transaction(command, transaction)
        items = [(Header.TRANSACTION, transaction)]
        self._receipt(command, receipt, items)
        data = self._emit(command, items)
        self.transactions.discard(transaction)
        held = self._tx_receipts.pop(transaction, ())
        if command is Command.ABORT and self.broker.defers_transaction_receipts:
            self.receipts.difference_update(held)  # they will never come
        return data

    def receipt_waits_for_commit(self, transaction: Optional[str]) -> bool:
        """True when a receipt asked on a frame of ``transaction`` comes only at COMMIT."""
        return transaction is not None and self.broker.defers_transaction_receipts

    def ack(
        self,
        message_id: str,
        *,
        subscription: Optional[str] = None,
        transaction: Optional[str] = None,
        receipt: Optional[str] = None,
    ) -> bytes:
        """Acknowledge ``message_id`` and every earlier unacknowledged message of its
        subscription (cumulative on every broker, see the module docstring)."""
        self._check(Command.ACK)
        sub = self._subscription_of(message_id, subscription)
        pending = sub.pending
        try:
            upto = pending.index(message_id)
        except ValueError:
            raise StompLocalProtocolError(
                f"message {message_id!r} of subscription {sub.id!r} is not awaiting an ACK", command=Command.ACK.value, header=Header.MESSAGE_ID
            ) from None
        if transaction is not None:
            self._known_transaction(Command.ACK, transaction)
        ids = [message_id] if self.broker.cumulative_client_ack else pending[: upto + 1]
        frames = []
        last = len(ids) - 1
        for n, mid in enumerate(ids):
            items = [(Header.MESSAGE_ID, mid)]
            if transaction is not None:
                items.append((Header.TRANSACTION, transaction))
            if n == last:
                self._receipt(Command.ACK, receipt, items, transaction)
            frames.append(self._emit(Command.ACK, items))
        del pending[: upto + 1]
        return b"".join(frames)

    def _subscription_of(self, message_id: str, subscription: Optional[str]) -> Subscription:
        if subscription is not None:
            sub = self.subscriptions.get(subscription)
            if sub is None:
                raise StompLocalProtocolError(f"no subscription {subscription!r}", command=Command.ACK.value, header=Header.SUBSCRIPTION)
        else:
            found = [s for s in self.subscriptions.values() if message_id in s.pending]
            if not found:
                raise StompLocalProtocolError(f"message {message_id!r} is not awaiting an ACK", command=Command.ACK.value, header=Header.MESSAGE_ID)
            sub = found[0]
        if sub.ack is not AckMode.CLIENT:
            raise StompLocalProtocolError(f"subscription {sub.id!r} is ack:{sub.ack.value}; nothing to ACK", command=Command.ACK.value, header=Header.MESSAGE_ID)
        return sub

    def disconnect(self, *, receipt: Optional[str] = None) -> bytes:
        items: list = []
        self._receipt(Command.DISCONNECT, receipt, items)
        return self._emit(Command.DISCONNECT, items)

    # -- server frames -----------------------------------------------------------------------
    def receive_data(self, data: bytes) -> List[Frame]:
        """Parse ``data``; return the complete frames.  On a protocol error, the valid frames
        that came before the fault are in ``take_parsed()``."""
        try:
            frames = self._parser.feed(data)
        except StompRemoteProtocolError:
            frames = self._parser.take_parsed()
            self._apply(frames)  # may raise for one of them; then it keeps those before it
            self._salvaged = frames
            raise
        self._apply(frames)
        return frames

    def take_parsed(self) -> List[Frame]:
        """After ``receive_data`` raised: the valid frames that preceded the bad bytes."""
        out = self._salvaged
        self._salvaged = []
        return out

    def _apply(self, frames: List[Frame]) -> None:
        state = self.state
        subs = self.subscriptions
        transitions = SERVER_TRANSITIONS
        messages_ok = (state, _MESSAGE) in transitions  # a MESSAGE keeps the state: checked once
        for index, frame in enumerate(frames):
            command = frame.command
            if command is _MESSAGE and messages_ok:  # the usual frame, first
                headers = frame.headers
                sub_id = headers.get(_SUBSCRIPTION)
                sub = subs.get(sub_id) if sub_id is not None else self._by_destination(headers[_DESTINATION])
                if sub is not None and sub.ack is _CLIENT_ACK:
                    sub.pending.append(headers[_MESSAGE_ID])
                continue
            nxt = transitions.get((state, command))
            if nxt is None:
                self._salvaged = frames[:index]
                raise StompRemoteProtocolError(f"unexpected {command.value} in state {state.value}", command=command.value)
            if command is Command.RECEIPT:
                rid = frame.headers[Header.RECEIPT_ID]
                if rid not in self.receipts:
                    self._salvaged = frames[:index]
                    raise StompRemoteProtocolError(f"receipt for {rid!r}, which was not asked for", command=command.value, header=Header.RECEIPT_ID)
                self.receipts.discard(rid)
            elif command is Command.ERROR:
                rid = frame.headers.get(Header.RECEIPT_ID)
                if rid is not None:
                    self.receipts.discard(rid)
            elif command is Command.CONNECTED:
                self.connected_headers = dict(frame.headers)
                self.session_id = frame.headers.get(Header.SESSION)
                self.server = frame.headers.get(Header.SERVER)
                if not self._broker_forced:
                    self.broker = detect_broker(frame.headers)
                self._parser.unescape_headers = self.broker.escapes_received_headers
            state = self.state = nxt
            messages_ok = (state, _MESSAGE) in transitions

    def _by_destination(self, destination: str) -> Optional[Subscription]:
        for sub in self.subscriptions.values():
            if sub.destination == destination:
                return sub
        return None

    def receive_eof(self) -> None:
        """The stream ended.  Raises ``IncompleteFrameError`` when it ended inside a frame."""
        self.state = State.CLOSED
        self._parser.feed_eof()


def _items(headers: HeaderItems) -> list:
    if headers is None:
        return []
    if isinstance(headers, Mapping):
        return list(headers.items())
    return list(headers)
