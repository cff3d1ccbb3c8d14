"""What the sans-IO AMQP 0-8 state machine (``connection.Connection``) hands out: its states, the
events ``receive_data`` returns, ``HeartbeatTimeout``, and ``UndecodableProperties``. Values only:
no IO, no clock; ``connection`` re-exports every name.
"""

from __future__ import annotations

import enum
from operator import itemgetter
from typing import Optional

from spark_mq.protocol.amqp08 import spec
from spark_mq.protocol.amqp08.errors import AMQPChannelError, AMQPConnectionError, AMQPError


class UndecodableProperties(spec.BasicProperties):
    """The basic properties of a delivery that could not be decoded, as empty properties with the raw
    property bytes (``raw``) and why (``error``). The content header frame itself was whole, so the
    connection goes on and the message is delivered: a consumer decides what it means (the
    ``amqp08`` source treats it as a poison message). RabbitMQ parses what publishers send but
    passes, for one, a headers table nested 2,000 deep, past Python's recursion limit: failing the
    connection on it would fail every session, as the broker redelivers it first."""

    __slots__ = ("raw", "error")

    def __init__(self, raw: bytes, error: str) -> None:
        super().__init__()
        self.raw = raw
        self.error = error

    def __repr__(self) -> str:
        return f"<UndecodableProperties({len(self.raw)} bytes: {self.error})>"



class ConnState(enum.Enum):
    AWAIT_START = "await-start"
    AWAIT_TUNE = "await-tune"  # after start-ok: secure or tune
    AWAIT_OPEN_OK = "await-open-ok"
    OPEN = "open"
    CLOSING = "closing"  # we sent connection.close
    CLOSED = "closed"


class ChanState(enum.Enum):
    OPENING = "opening"
    OPEN = "open"
    CLOSING = "closing"
    CLOSED = "closed"



class Event:
    __slots__ = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{s}={getattr(self, s)!r}' for s in self.__slots__)})"


class ConnectionOpened(Event):
    __slots__ = ("known_hosts", "server_properties", "channel_max", "frame_max", "heartbeat")

    def __init__(self, known_hosts, server_properties, channel_max, frame_max, heartbeat):
        self.known_hosts = known_hosts
        self.server_properties = server_properties
        self.channel_max = channel_max
        self.frame_max = frame_max
        self.heartbeat = heartbeat


class ConnectionRedirected(Event):
    __slots__ = ("host", "known_hosts")

    def __init__(self, host, known_hosts):
        self.host = host
        self.known_hosts = known_hosts


class ConnectionClosed(Event):
    """The connection ended: ``error`` is None after our own close completed."""

    __slots__ = ("error",)

    def __init__(self, error: Optional[BaseException]):
        self.error = error


class ChannelOpened(Event):
    __slots__ = ("channel",)

    def __init__(self, channel):
        self.channel = channel


class ChannelClosed(Event):
    """A channel ended: ``error`` is the broker's soft error, or None after our own close."""

    __slots__ = ("channel", "error")

    def __init__(self, channel, error: Optional[AMQPChannelError]):
        self.channel = channel
        self.error = error


class MethodReceived(Event):
    """A method without content (a synchronous reply, or a server-initiated one)."""

    __slots__ = ("channel", "method")

    def __init__(self, channel, method):
        self.channel = channel
        self.method = method


class ContentReceived(tuple):
    """A content-bearing method with its assembled properties and body (deliver, get-ok, return...).

    A tuple underneath: one is made per delivered message, and building a tuple costs less than
    running an ``__init__``.
    """

    __slots__ = ()
    channel = property(itemgetter(0))
    method = property(itemgetter(1))
    properties = property(itemgetter(2))
    body = property(itemgetter(3))

    def __new__(cls, channel, method, properties, body):
        return tuple.__new__(cls, (channel, method, properties, body))

    def __repr__(self) -> str:
        return f"ContentReceived(channel={self[0]}, method={self[1]!r}, properties={self[2]!r}, {len(self[3])} bytes)"


class FlowChanged(Event):
    """The broker asked us to stop (active=False) or resume publishing on a channel."""

    __slots__ = ("channel", "active")

    def __init__(self, channel, active):
        self.channel = channel
        self.active = active


class Alert(Event):
    __slots__ = ("channel", "reply_code", "reply_text", "details")

    def __init__(self, channel, reply_code, reply_text, details):
        self.channel = channel
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.details = details


class HeartbeatTimeout(AMQPConnectionError):
    """No frame arrived from the broker for two heartbeat intervals."""

    def __init__(self, silent_for: float, heartbeat: int) -> None:
        self.silent_for = silent_for
        AMQPError.__init__(self, 0, f"no frame from the broker for {silent_for:.1f}s (heartbeat {heartbeat}s)")

