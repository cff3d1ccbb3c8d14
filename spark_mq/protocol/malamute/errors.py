"""Malamute's broker-reported failure: an ERROR reply, with its status code and reason."""

from __future__ import annotations

from spark_mq.errors import BrokerError


class MalamuteBrokerError(BrokerError):
    """The broker answered a request with ERROR. ``code`` may be stale on the reference broker."""

    def __init__(self, command: str, code: int, reason: str) -> None:
        super().__init__(f"{command} refused by the Malamute broker: {code} {reason}".rstrip())
        self.command = command
        self.code = code
        self.reason = reason
