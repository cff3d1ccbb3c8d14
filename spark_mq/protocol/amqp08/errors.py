"""Exceptions for AMQP 0-8: broker-reported closes carrying reply code, text, class and method.

A soft error (``AMQPChannelError``) closes one channel and leaves the connection usable; a hard
error (``AMQPConnectionError``) closes the connection. The generated ``spec`` module defines one
subclass per reply code (``NotFoundError``, ``AccessRefusedError``...) and the ``ERRORS`` map;
``broker_error()`` picks the right class for a close method.
"""

from __future__ import annotations

from typing import Optional

from spark_mq.errors import BrokerError, ConnectionClosedError


class AMQPError(BrokerError):
    """The broker closed a channel or the connection; carries the close method's fields."""

    REPLY_CODE: Optional[int] = None

    def __init__(
        self,
        reply_code: int,
        reply_text: str,
        class_id: int = 0,
        method_id: int = 0,
        method_name: Optional[str] = None,
        channel: int = 0,
    ) -> None:
        self.reply_code = reply_code
        self.reply_text = reply_text
        self.class_id = class_id
        self.method_id = method_id
        self.method_name = method_name
        self.channel = channel
        where = f" in reply to {method_name}" if method_name else (
            f" in reply to method ({class_id}, {method_id})" if class_id else ""
        )
        scope = f"channel {channel}" if channel else "connection"
        super().__init__(f"{scope} closed by broker: {reply_code} {reply_text}{where}")


class AMQPChannelError(AMQPError):
    """A soft error: the broker closed one channel; the connection stays usable."""


class AMQPConnectionError(AMQPError, ConnectionClosedError):
    """A hard error: the broker closed the connection."""


class AuthenticationError(AMQPConnectionError):
    """The broker rejected the credentials (RabbitMQ closes with 403 ACCESS_REFUSED during start-ok)."""


class ConnectionRedirect(ConnectionClosedError):
    """The broker answered connection.open with connection.redirect: connect to ``host`` instead."""

    def __init__(self, host: str, known_hosts: str) -> None:
        self.host = host
        self.known_hosts = known_hosts
        super().__init__(f"broker redirected the connection to {host!r} (known hosts {known_hosts!r})")
