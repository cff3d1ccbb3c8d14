"""Exceptions for AMQP 0-8: broker-reported closes carrying reply code, text, class and method.

A soft error (``AMQPChannelError``) closes one channel and leaves the connection usable; a hard
error (``AMQPConnectionError``) closes the connection. The generated ``spec`` module defines one
subclass per reply code (``NotFoundError``, ``AccessRefusedError``...) and the ``ERRORS`` map;
``broker_error()`` picks the right class for a close method.
"""

from __future__ import annotations

from typing import Optional

from spark_mq.errors import BrokerError, ConnectionClosedError, RemoteProtocolError


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


#: protocol headers a broker may answer with, and what each means
KNOWN_HEADERS = {
    b"AMQP\x00\x00\x09\x01": "AMQP 0-9-1",
    b"AMQP\x01\x01\x00\x09": "AMQP 0-9",
    b"AMQP\x01\x01\x08\x00": "AMQP 0-8",
    b"AMQP\x01\x01\x09\x01": "AMQP 0-9-1 (the old numbering)",
    b"AMQP\x00\x01\x00\x00": "AMQP 1.0",
    b"AMQP\x02\x01\x00\x00": "AMQP 1.0 (TLS)",
    b"AMQP\x03\x01\x00\x00": "AMQP 1.0 (SASL)",
}
#: what the broker speaks -> the ``protocol`` value of ours that speaks it
_PROTOCOL_FOR = {"AMQP 0-9-1": "0-9-1", "AMQP 0-9-1 (the old numbering)": "0-9-1", "AMQP 0-8": "0-8"}


class ProtocolRefused(RemoteProtocolError):
    """The broker answered the protocol header with another header: it does not speak the version offered.
    Names what was offered, what the broker speaks and the ``protocol`` setting that would fit, if any
    (RabbitMQ 4 answers 0-8 with AMQP 1.0's SASL header: it speaks 0-9-1 and 1.0 only)."""

    def __init__(self, offered: str, answer: bytes) -> None:
        self.offered = offered
        self.answer = bytes(answer)
        self.speaks = KNOWN_HEADERS.get(self.answer[:8], f"protocol header {self.answer[:8]!r}")
        self.fits = _PROTOCOL_FOR.get(self.speaks)
        if self.fits is None and offered == "0-8" and self.speaks.startswith("AMQP 1.0"):
            # RabbitMQ 4 answers every header but 0-9-1's (and 0-9's) with 1.0's: it speaks 0-9-1
            self.fits = "0-9-1"
            fix = ("RabbitMQ 4 answers AMQP 0-8 so and speaks 0-9-1: set protocol=0-9-1 (or protocol=auto, "
                   "which offers 0-9-1 and falls back to 0-8)")
        elif self.fits:
            fix = f"set protocol={self.fits} (or protocol=auto, which offers 0-9-1 and falls back to 0-8)"
        else:
            fix = "no protocol=... setting fits: this connector speaks AMQP 0-9-1 and 0-8"
        super().__init__(f"the broker refused AMQP {offered}: it answered with {self.speaks}; {fix}")
