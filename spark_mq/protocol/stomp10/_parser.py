"""Incremental STOMP 1.0 frame parser: bytes in, ``Frame`` objects out.

Bodies are framed by ``content-length`` when present (so NUL bytes inside are fine) and by the
first NUL otherwise; line feeds between frames (brokers add them) are skipped.  The receive
buffer is a bytearray searched with ``find`` at offsets and trimmed once per ``feed``; a frame
whose headers are parsed but whose body has not fully arrived is remembered, so a large body is
neither re-parsed nor re-scanned as it trickles in.

Header bytes that are not UTF-8 are kept as lone surrogates (``surrogateescape``: the encoder
writes them back as they came), and a header line without a colon is kept as a name with the value
None: one odd header must not cost the connection (the broker would redeliver the message first,
and the session fail again). A MESSAGE frame above the bound has its body skipped, not buffered,
and comes out with ``oversize`` set and an empty body; any other frame above it is an error.

Anything else that is not a valid frame raises ``StompRemoteProtocolError`` naming the frame and
header at fault.  Frames completed in the same ``feed`` before the bad bytes are not lost:
``take_parsed()`` hands them over after the exception.  A parser that raised is finished; feeding
it again raises the same error.

It must not do IO, keep session state, or import socket/thread/time modules.
"""

from __future__ import annotations

from typing import Iterable, List, Optional

from spark_mq.protocol.stomp10._constants import (
    CLIENT_COMMANDS,
    DEFAULT_MAX_FRAME_SIZE,
    ENCODING,
    LF,
    REQUIRED_HEADERS,
    SERVER_COMMANDS,
    UNSUBSCRIBE_ONE_OF,
    Command,
    Header,
)
from spark_mq.protocol.stomp10._errors import FrameTooLargeError, IncompleteFrameError, StompRemoteProtocolError
from spark_mq.protocol.stomp10._frame import Frame, unescape_value

_CR = 0x0D
_COMMAND_BY_NAME = {c.value: c for c in Command}
_LONGEST_COMMAND = max(len(c.value) for c in Command)
_UNSUBSCRIBE = Command.UNSUBSCRIBE
_CONTENT_LENGTH = Header.CONTENT_LENGTH


class FrameParser:
    """Parse frames of the commands in ``commands`` (server frames by default).

    ``max_frame_size`` bounds one frame (headers plus body) so a broken or hostile peer cannot
    make the buffer grow without end.
    """

    def __init__(
        self,
        *,
        commands: Iterable[Command] = SERVER_COMMANDS,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
    ) -> None:
        self._commands = {c.value: c for c in commands}
        # command name -> (command, required headers, is UNSUBSCRIBE): one lookup per frame
        self._specs = {c.value: (c, REQUIRED_HEADERS[c], c is _UNSUBSCRIBE) for c in commands}
        #: Undo 1.1-style escapes in header values (set for brokers that escape in 1.0 too).
        self.unescape_headers = False
        self._max = max_frame_size
        self._buf = bytearray()
        # A frame whose head is parsed and whose body is still arriving:
        self._pending: Optional[Frame] = None
        self._body_start = 0  # offset of the pending body in _buf
        self._body_len = -1  # its content-length, or -1 when framed by NUL
        self._scan_from = 0  # where to resume looking for the NUL of a NUL-framed body
        self._parsed: List[Frame] = []
        self._failed: Optional[StompRemoteProtocolError] = None
        # A MESSAGE above the bound whose body is being skipped: the frame, the body bytes still to
        # skip (-1: up to the NUL), the frame's size so far
        self._skip: Optional[Frame] = None
        self._skip_left = 0
        self._skip_size = 0

    @property
    def buffered(self) -> int:
        """Bytes received and not yet part of a returned frame."""
        return len(self._buf)

    def take_parsed(self) -> List[Frame]:
        """Frames completed by the last ``feed`` before it raised (empty otherwise)."""
        out, self._parsed = self._parsed, []
        return out

    def feed(self, data: bytes) -> List[Frame]:
        """Add bytes; return the frames they complete, in order."""
        if self._failed is not None:
            raise self._failed
        buf = self._buf
        buf += data
        out = self._parsed = []
        pos = 0
        try:
            pos = self._parse(buf, out)
        except StompRemoteProtocolError as exc:
            self._failed = exc
            raise
        finally:
            # Trim once per read.  On error _parse leaves pos at the start of the bad frame.
            if pos:
                del buf[:pos]
                if self._pending is not None:
                    self._body_start -= pos
                    self._scan_from -= pos
        self._parsed = []
        return out

    def feed_eof(self) -> None:
        """The stream ended: raise ``IncompleteFrameError`` if it ended inside a frame."""
        buf = self._buf
        rest = buf.lstrip(b"\r\n")
        if self._skip is not None:
            raise IncompleteFrameError(f"connection closed inside a frame above the {self._max}-byte bound",
                                       command=self._skip.command.value)
        if self._pending is not None or rest:
            command = self._pending.command.value if self._pending is not None else _peek_command(rest)
            raise IncompleteFrameError(
                f"connection closed inside a frame, {len(buf)} bytes of it received", command=command
            )

    # ------------------------------------------------------------------------------------------
    def _parse(self, buf: bytearray, out: List[Frame]) -> int:
        n = len(buf)
        pos = 0
        maxsize = self._max
        while True:
            if self._skip is not None:
                pos = self._skip_body(buf, pos, n, out)
                if self._skip is not None:
                    return pos
                continue
            frame = self._pending
            if frame is None:
                # Skip the line feeds brokers put between frames (and CR LF from lenient ones).
                while pos < n and (buf[pos] == LF or buf[pos] == _CR):
                    pos += 1
                if pos >= n:
                    return pos
                head_end = buf.find(b"\n\n", pos)
                if head_end < 0:
                    self._check_partial_head(buf, pos, n)
                    return pos
                self._pending = frame = self._parse_head(buf, pos, head_end)
                body_start = self._body_start = head_end + 2
                length = self._body_len
                self._scan_from = body_start
                if length >= 0 and body_start - pos + length > maxsize:
                    self._pending = None
                    if frame.command is Command.MESSAGE:
                        self._start_skip(frame, length, body_start - pos)
                        pos = body_start
                        continue
                    raise FrameTooLargeError(
                        f"content-length {length} exceeds the {maxsize}-byte frame bound",
                        command=frame.command.value,
                        header=_CONTENT_LENGTH,
                    )
                frame_start = pos
            else:
                frame_start = pos
            body_start = self._body_start
            length = self._body_len
            if length >= 0:
                end = body_start + length
                if end >= n:  # the body or its NUL has not arrived yet
                    return frame_start
                if buf[end] != 0:
                    self._pending = None
                    raise StompRemoteProtocolError(
                        f"content-length {length} is not followed by the NUL that ends the frame",
                        command=frame.command.value,
                        header=_CONTENT_LENGTH,
                    )
            else:
                end = buf.find(b"\x00", self._scan_from)
                if end < 0:
                    if n - frame_start > maxsize:
                        self._pending = None
                        if frame.command is Command.MESSAGE:
                            self._start_skip(frame, -1, n - frame_start)
                            return n
                        raise FrameTooLargeError(
                            f"frame without NUL exceeds the {maxsize}-byte frame bound",
                            command=frame.command.value,
                        )
                    self._scan_from = n
                    return frame_start
                if end - frame_start > maxsize:
                    self._pending = None
                    if frame.command is Command.MESSAGE:
                        frame.oversize = end + 1 - frame_start
                        out.append(frame)
                        pos = end + 1
                        continue
                    raise FrameTooLargeError(
                        f"frame exceeds the {maxsize}-byte frame bound", command=frame.command.value
                    )
            frame.body = bytes(buf[body_start:end])
            out.append(frame)
            self._pending = None
            pos = end + 1

    def _start_skip(self, frame: Frame, left: int, size: int) -> None:
        self._skip, self._skip_left, self._skip_size = frame, left, size

    def _skip_body(self, buf: bytearray, pos: int, n: int, out: List[Frame]) -> int:
        """Skip what arrived of an oversize MESSAGE's body; once it is over, hand out the frame."""
        frame = self._skip
        left = self._skip_left
        if left >= 0:
            take = min(left, n - pos)
            pos += take
            self._skip_size += take
            self._skip_left = left = left - take
            if left or pos >= n:
                return pos
            if buf[pos] != 0:
                self._skip = None
                raise StompRemoteProtocolError(
                    f"content-length {frame.headers.get(_CONTENT_LENGTH)} is not followed by the NUL that "
                    f"ends the frame", command=frame.command.value, header=_CONTENT_LENGTH)
            pos += 1
        else:
            end = buf.find(b"\x00", pos)
            if end < 0:
                self._skip_size += n - pos
                return n
            self._skip_size += end - pos
            pos = end + 1
        frame.oversize = self._skip_size + 1
        out.append(frame)
        self._skip = None
        return pos

    def _check_partial_head(self, buf: bytearray, pos: int, n: int) -> None:
        """Fail early on an unknown command or an endless header block."""
        nl = buf.find(b"\n", pos, pos + _LONGEST_COMMAND + 1)
        if nl >= 0:
            self._command(bytes(buf[pos:nl]))
        elif n - pos > _LONGEST_COMMAND:
            self._command(bytes(buf[pos : pos + _LONGEST_COMMAND + 1]))
        if n - pos > self._max:
            raise FrameTooLargeError(f"frame headers exceed the {self._max}-byte frame bound")

    def _command(self, raw: bytes) -> Command:
        try:
            name = raw.decode(ENCODING)
        except UnicodeDecodeError:
            name = None
        command = self._commands.get(name) if name is not None else None
        if command is None:
            shown = raw[:40].decode(ENCODING, "replace")
            if name in _COMMAND_BY_NAME:
                raise StompRemoteProtocolError(f"unexpected command {shown!r} from this side", command=name)
            raise StompRemoteProtocolError(f"unknown command {shown!r}")
        return command

    def _parse_head(self, buf: bytearray, pos: int, head_end: int) -> Frame:
        text = buf[pos:head_end].decode(ENCODING, "surrogateescape")
        lines = text.split("\n")
        spec = self._specs.get(lines[0])
        if spec is None:
            self._command(lines[0].encode(ENCODING, "surrogateescape"))  # raises, naming the command
        command, required, is_unsubscribe = spec
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                value = None  # kept, as a name without value: the whole line is there to read
            if name not in headers:  # the first of repeated headers wins
                headers[name] = value
        if self.unescape_headers and "\\" in text:
            headers = {unescape_value(k): (unescape_value(v) if v is not None else None) for k, v in headers.items()}
        for name in required:
            if name not in headers:
                raise StompRemoteProtocolError("missing required header", command=command.value, header=name)
        if is_unsubscribe and not any(h in headers for h in UNSUBSCRIBE_ONE_OF):
            raise StompRemoteProtocolError(
                "UNSUBSCRIBE needs an id or destination header", command=command.value, header=Header.ID
            )
        raw_length = headers.get(_CONTENT_LENGTH)
        if raw_length is None:
            self._body_len = -1
        elif raw_length.isdigit() and raw_length.isascii():
            self._body_len = int(raw_length)
        else:
            raise StompRemoteProtocolError(
                f"content-length {raw_length[:40]!r} is not a byte count", command=command.value, header=_CONTENT_LENGTH
            )
        return Frame(command, headers)


def _peek_command(rest: bytes) -> Optional[str]:
    line = bytes(rest[: _LONGEST_COMMAND + 1]).split(b"\n", 1)[0]
    try:
        name = line.decode(ENCODING)
    except UnicodeDecodeError:
        return None
    return name if name in _COMMAND_BY_NAME else None


def client_frame_parser(max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> FrameParser:
    """A parser for frames a client sends (used by tests and tools that play the broker)."""
    return FrameParser(commands=CLIENT_COMMANDS, max_frame_size=max_frame_size)
