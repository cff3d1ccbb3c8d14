"""STOMP-specific exceptions, each rooted in ``spark_mq.errors``.

``StompError`` is a broker ERROR frame turned into an exception; the two protocol errors name the
frame (command) and header at fault so a log line says exactly what was wrong.
"""

from __future__ import annotations

from typing import Mapping, Optional

from spark_mq.errors import BrokerError, LocalProtocolError, RemoteProtocolError


class StompError(BrokerError):
    """The broker sent an ERROR frame: ``message`` is its message header, ``body`` its body."""

    def __init__(self, message: str, body: bytes = b"", headers: Optional[Mapping[str, str]] = None) -> None:
        self.message = message
        self.body = body
        self.headers = dict(headers or {})
        detail = body.decode("utf-8", "replace").strip()
        text = f"STOMP ERROR: {message}"
        if detail:
            text += f"\n{detail}"
        super().__init__(text)


class _NamesFrame:
    def _init_names(self, text: str, command: Optional[str], header: Optional[str]) -> str:
        self.command = command
        self.header = header
        where = []
        if command:
            where.append(f"frame {command}")
        if header:
            where.append(f"header {header!r}")
        return f"{text} ({', '.join(where)})" if where else text


class StompRemoteProtocolError(RemoteProtocolError, _NamesFrame):
    """The broker sent bytes that are not a valid STOMP 1.0 frame."""

    def __init__(self, text: str, *, command: Optional[str] = None, header: Optional[str] = None) -> None:
        super().__init__(self._init_names(text, command, header))


class StompLocalProtocolError(LocalProtocolError, _NamesFrame):
    """We were asked to send something STOMP 1.0 (or the session state) does not allow."""

    def __init__(self, text: str, *, command: Optional[str] = None, header: Optional[str] = None) -> None:
        super().__init__(self._init_names(text, command, header))


class FrameTooLargeError(StompRemoteProtocolError):
    """A frame from the broker exceeds the configured ``max_frame_size``."""


class IncompleteFrameError(StompRemoteProtocolError):
    """The stream ended inside a frame."""
