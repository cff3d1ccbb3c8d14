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
