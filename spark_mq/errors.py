"""The one error root of spark-mq and the protocol error split shared by every protocol.

``LocalProtocolError`` means *we* misused a protocol (a bug or bad argument on our side);
``RemoteProtocolError`` means the peer sent something the protocol does not allow.
Broker-reported failures (AMQP close with a reply code, STOMP ERROR, Malamute ERROR status)
are ``BrokerError`` subclasses defined next to each protocol.
"""

from __future__ import annotations


class SparkMqError(Exception):
    """Root of every exception raised by spark-mq."""


class ProtocolError(SparkMqError):
    """A protocol rule was broken, by us or by the peer."""


class LocalProtocolError(ProtocolError):
    """We tried to do something the protocol (or the current state) does not allow."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes or a sequence of frames the protocol does not allow."""


class ConnectionClosedError(SparkMqError):
    """The connection is gone: closed by the peer, dropped, or timed out."""


class BrokerRefusedError(ConnectionClosedError):
    """Every endpoint answered and refused what the options ask for (credentials, permissions, a
    virtual host): retrying the same options cannot help."""


class BrokerError(SparkMqError):
    """The broker refused an operation and said why (code and text)."""


class OptionError(SparkMqError, ValueError):
    """A user-supplied option is missing, unknown, malformed or contradicts another one."""


class PoisonDelivery(SparkMqError):
    """One delivery the source cannot take: its session fails (the broker redelivers it) until it
    has failed ``maxDeliveryFailures`` sessions; then the ingest applies ``poisonMessages`` to it.

    Raised by a source's consumer (a frame above ``maxFrameBytes``) or by the ingest (a message no
    row of the source's schema can hold). ``msg`` is the delivery as the consumer gave it;
    ``held``: its body is in hand, so it can be dead-lettered; ``option``: the option that would let
    it through, if one would."""

    def __init__(self, reason: str, *, msg=None, message_id=None, destination=None, body=None, headers=None,
                 size=None, held: bool = True, option=None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.msg = msg
        self.message_id = message_id
        self.destination = destination
        self.body = body
        self.headers = headers
        self.size = size
        self.held = held
        self.option = option
