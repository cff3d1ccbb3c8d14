"""The STOMP 1.0 frame value and its encoder.

A frame is a command, headers (first occurrence of a repeated name wins, values kept verbatim:
STOMP 1.0 has no escaping, so a value may hold colons but never a line feed) and a body of bytes.
The encoder checks what 1.0 cannot express and raises ``StompLocalProtocolError`` for it.

It must not do IO or keep session state.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Optional, Tuple, Union

from spark_mq.protocol.stomp10._constants import ENCODING, Command, Header
from spark_mq.protocol.stomp10._errors import StompError, StompLocalProtocolError

HeaderItems = Union[Mapping[str, str], Iterable[Tuple[str, str]], None]


class Frame:
    """One STOMP frame.  ``headers`` is a plain dict; ``body`` is bytes.

    ``oversize``: 0, or the size of a MESSAGE frame above the parser's bound, whose body was skipped
    (``body`` is empty): the connection goes on, and the consumer decides what the message means."""

    __slots__ = ("command", "headers", "body", "oversize")

    def __init__(self, command: Command, headers: Optional[dict] = None, body: bytes = b"") -> None:
        self.command = command
        self.headers = {} if headers is None else headers
        self.body = body
        self.oversize = 0

    # -- conveniences for the headers every consumer reads --------------------------------------
    @property
    def destination(self) -> Optional[str]:
        return self.headers.get(Header.DESTINATION)

    @property
    def message_id(self) -> Optional[str]:
        return self.headers.get(Header.MESSAGE_ID)

    @property
    def subscription(self) -> Optional[str]:
        return self.headers.get(Header.SUBSCRIPTION)

    def to_error(self) -> StompError:
        """An ERROR frame as the exception the client raises."""
        return StompError(self.headers.get(Header.MESSAGE, ""), self.body, self.headers)

    def encode(self, *, content_length: bool = True) -> bytes:
        return encode_frame(self.command, self.headers, self.body, content_length=content_length)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Frame):
            return NotImplemented
        return (self.command, self.headers, self.body) == (other.command, other.headers, other.body)

    def __repr__(self) -> str:
        shown = {k: ("***" if k == Header.PASSCODE else v) for k, v in self.headers.items()}
        return f"Frame({self.command.value}, {shown!r}, <{len(self.body)} bytes>)"


def check_header(command: str, name: str, value: str) -> None:
    """Raise if ``name: value`` cannot be written in STOMP 1.0 (no escaping exists)."""
    if not name or ":" in name or "\n" in name:
        raise StompLocalProtocolError("header name must be non-empty without ':' or LF", command=command, header=name)
    if "\n" in value:
        raise StompLocalProtocolError("STOMP 1.0 header values cannot contain a line feed", command=command, header=name)


_ESCAPES = {"\\c": ":", "\\n": "\n", "\\\\": "\\", "\\r": "\r"}


def escape_value(value: str) -> str:
    """Protect backslashes from brokers that read 1.1 escapes in 1.0 frames (see _brokers)."""
    return value.replace("\\", "\\\\") if "\\" in value else value


def unescape_value(value: str) -> str:
    """Undo the 1.1 escaping a broker applied to a header value (unknown escapes kept as is)."""
    if "\\" not in value:
        return value
    out = []
    i = 0
    n = len(value)
    while i < n:
        j = value.find("\\", i)
        if j < 0 or j + 1 >= n:
            out.append(value[i:])
            break
        out.append(value[i:j])
        pair = value[j : j + 2]
        out.append(_ESCAPES.get(pair, pair))
        i = j + 2
    return "".join(out)


def encode_frame(
    command: Command,
    headers: HeaderItems = None,
    body: Union[bytes, bytearray, memoryview] = b"",
    *,
    content_length: bool = True,
    escape: bool = False,
) -> bytes:
    """Encode one frame.

    With ``content_length`` (the default) a ``content-length`` header is added when the body is
    not empty and the caller gave none; without it, a body holding a NUL byte is refused, since
    the first NUL would end the frame.  A caller-given content-length must match the body.
    ``escape`` doubles backslashes in values, for brokers that read escapes (see _brokers).
    """
    cmd = command.value
    items = headers.items() if isinstance(headers, Mapping) else (headers or ())
    lines = [cmd]
    seen_length = None
    for name, value in items:
        value = str(value)
        check_header(cmd, name, value)
        if escape:
            value = escape_value(value)
        if name == Header.CONTENT_LENGTH:
            if seen_length is not None:
                continue  # first one wins, as on the receiving side
            seen_length = value
        lines.append(f"{name}:{value}")
    size = len(body)
    if seen_length is not None:
        if seen_length != str(size):
            raise StompLocalProtocolError(
                f"content-length {seen_length!r} does not match the {size}-byte body",
                command=cmd,
                header=Header.CONTENT_LENGTH,
            )
    elif content_length and size:
        lines.append(f"{Header.CONTENT_LENGTH}:{size}")
    elif size and b"\x00" in body:
        raise StompLocalProtocolError(
            "a body with NUL bytes needs a content-length header", command=cmd, header=Header.CONTENT_LENGTH
        )
    lines.append("\n")
    # surrogateescape: header bytes that were not UTF-8 when received (kept so by the parser) go back
    # as they came, in an ACK's message-id or a dead-lettered copy
    return b"".join(("\n".join(lines).encode(ENCODING, "surrogateescape"), body, b"\x00"))
