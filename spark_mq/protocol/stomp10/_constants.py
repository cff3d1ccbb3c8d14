"""STOMP 1.0 vocabulary: commands, header names, the bytes that frame a frame, and which headers
each command requires.  Everything here is named once and imported by the codec and the session.

It must not contain behaviour: no parsing, no encoding, no state.
"""

from __future__ import annotations

import enum

NUL = 0x00
LF = 0x0A
NUL_BYTE = b"\x00"
LF_BYTE = b"\n"
HEADER_END = b"\n\n"
HEADER_SEPARATOR = ":"
ENCODING = "utf-8"

#: Default bound on one frame (command, headers and body together), in bytes.
DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024


class Command(str, enum.Enum):
    """Every STOMP 1.0 command, client and server."""

    # client frames
    CONNECT = "CONNECT"
    SEND = "SEND"
    SUBSCRIBE = "SUBSCRIBE"
    UNSUBSCRIBE = "UNSUBSCRIBE"
    BEGIN = "BEGIN"
    COMMIT = "COMMIT"
    ABORT = "ABORT"
    ACK = "ACK"
    DISCONNECT = "DISCONNECT"
    # server frames
    CONNECTED = "CONNECTED"
    MESSAGE = "MESSAGE"
    RECEIPT = "RECEIPT"
    ERROR = "ERROR"

    # Enum's __hash__ is a Python function; members are looked up in dicts per frame, so use
    # the C hash of the value (equal to Enum's: the name and value are the same string).
    __hash__ = str.__hash__

    def __str__(self) -> str:
        return self.value


CLIENT_COMMANDS = frozenset(
    {
        Command.CONNECT,
        Command.SEND,
        Command.SUBSCRIBE,
        Command.UNSUBSCRIBE,
        Command.BEGIN,
        Command.COMMIT,
        Command.ABORT,
        Command.ACK,
        Command.DISCONNECT,
    }
)
SERVER_COMMANDS = frozenset({Command.CONNECTED, Command.MESSAGE, Command.RECEIPT, Command.ERROR})


class Header:
    """Header names used by the protocol (string constants, not an enum: they are dict keys)."""

    LOGIN = "login"
    PASSCODE = "passcode"
    SESSION = "session"
    SERVER = "server"
    DESTINATION = "destination"
    CONTENT_LENGTH = "content-length"
    CONTENT_TYPE = "content-type"
    TRANSACTION = "transaction"
    RECEIPT = "receipt"
    RECEIPT_ID = "receipt-id"
    MESSAGE_ID = "message-id"
    MESSAGE = "message"
    ACK = "ack"
    ID = "id"
    SELECTOR = "selector"
    SUBSCRIPTION = "subscription"
    REDELIVERED = "redelivered"
    CLIENT_ID = "client-id"
    # broker-specific consumer flow control
    RABBITMQ_PREFETCH = "prefetch-count"
    ACTIVEMQ_PREFETCH = "activemq.prefetchSize"


class AckMode(str, enum.Enum):
    """Values of the SUBSCRIBE ``ack`` header in STOMP 1.0."""

    AUTO = "auto"
    CLIENT = "client"

    def __str__(self) -> str:
        return self.value


#: Headers a frame must carry, per command.  UNSUBSCRIBE needs one of two and is checked apart.
REQUIRED_HEADERS: dict[Command, tuple[str, ...]] = {
    Command.CONNECT: (),
    Command.SEND: (Header.DESTINATION,),
    Command.SUBSCRIBE: (Header.DESTINATION,),
    Command.UNSUBSCRIBE: (),
    Command.BEGIN: (Header.TRANSACTION,),
    Command.COMMIT: (Header.TRANSACTION,),
    Command.ABORT: (Header.TRANSACTION,),
    Command.ACK: (Header.MESSAGE_ID,),
    Command.DISCONNECT: (),
    Command.CONNECTED: (),
    Command.MESSAGE: (Header.DESTINATION, Header.MESSAGE_ID),
    Command.RECEIPT: (Header.RECEIPT_ID,),
    Command.ERROR: (),
}
UNSUBSCRIBE_ONE_OF = (Header.ID, Header.DESTINATION)
