"""Sans-IO ZMTP 3.0 (ZeroMQ RFC 23): one connection's byte stream, as the connecting DEALER peer.

Responsible for: the greeting (signature, version, the NULL mechanism), the NULL handshake (the
READY command and its properties: ``Socket-Type``, ``Identity``), framing (flags, short and long
sizes, MORE, COMMAND) in both directions, the few commands a NULL connection carries afterwards
(ZMTP 3.1's PING is answered with PONG; ERROR ends the connection), and the receive buffer: a
preallocated ``bytearray`` the driver receives into (``buffer()`` then ``received(n)``), parsed in
place by offsets, whole messages taken out as lists of ``bytes`` frames (or, for two-frame
messages, by columns: the first frames, and the second ones copied into one buffer the caller
gives), the rest left for later.
Not responsible for sockets, reconnecting or time (``spark_mq.transport.zmtp``), nor for what the
frames mean (the Malamute codec).

Why it exists: the Malamute source's reader receives gigabytes of small messages. Through pyzmq
each one crosses libzmq's IO thread, a pipe and a ``Frame`` object per frame before Python sees its
``bytes``; receiving the TCP stream here in 1 MiB reads and cutting it up in place took less than
half of that CPU (``bench/bench_zmtp.py``).

Messages on the wire are what a libzmq DEALER sends and receives: the frames alone (a ROUTER
peer adds and strips the routing id itself). Every ``RemoteProtocolError`` names what was wrong;
the connection is unusable after one (the driver drops it and connects again, as libzmq does).
"""

from __future__ import annotations

from enum import Enum
from itertools import repeat
from struct import Struct
from typing import Optional, Sequence

import numpy as np

from spark_mq.errors import LocalProtocolError, RemoteProtocolError

__all__ = ["ZmtpConnection", "BodyBuffer", "Phase", "encode_message", "encode_command", "GREETING_SIZE", "SIGNATURE"]

SIGNATURE = b"\xff" + b"\x00" * 8 + b"\x7f"
GREETING_SIZE = 64
VERSION = (3, 0)
MECHANISM = b"NULL"
_MECHANISM_SIZE = 20
_MORE, _LONG, _COMMAND = 0x01, 0x02, 0x04
_RESERVED = 0xF8
_U64 = Struct(">Q")
_U32 = Struct(">I")
_SHORT_MAX = 255
DEFAULT_BUFFER = 1 << 20     # bytes received per read at most (and the buffer's resting size)
MIN_READ = 64 << 10          # a read is offered at least this much room (the buffer is compacted)
DEFAULT_MAX_FRAME = 1 << 30  # a frame announced larger than this ends the connection
# socket types a DEALER may talk to (RFC 28)
_PEERS = {b"DEALER": frozenset({b"ROUTER", b"DEALER", b"REP"})}


class Phase(Enum):
    GREETING = "greeting"    # waiting for the peer's 64 bytes
    HANDSHAKE = "handshake"  # waiting for the peer's READY
    READY = "ready"          # messages flow


def _frame_head(flags: int, size: int) -> bytes:
    if size > _SHORT_MAX:
        return bytes((flags | _LONG,)) + _U64.pack(size)
    return bytes((flags, size))


def encode_message(frames: Sequence) -> bytes:
    """One multipart message as wire bytes (frames: bytes-like; at least one)."""
    if not frames:
        raise LocalProtocolError("a ZMTP message has at least one frame")
    last = len(frames) - 1
    parts = []
    for i, frame in enumerate(frames):
        parts.append(_frame_head(_MORE if i < last else 0, len(frame)))
        parts.append(frame)
    return b"".join(parts)


def encode_command(name: bytes, data: bytes = b"") -> bytes:
    """One command frame (RFC 23: name length, name, data)."""
    if not 0 < len(name) <= _SHORT_MAX:
        raise LocalProtocolError(f"bad ZMTP command name {name!r}")
    body = bytes((len(name),)) + name + data
    return _frame_head(_COMMAND, len(body)) + body


def encode_properties(props: dict) -> bytes:
    """Metadata as READY carries it: name length (1 octet), name, value length (4 octets), value."""
    out = bytearray()
    for name, value in props.items():
        out += bytes((len(name),)) + name + _U32.pack(len(value)) + value
    return bytes(out)


def _greeting() -> bytes:
    return (SIGNATURE + bytes(VERSION) + MECHANISM.ljust(_MECHANISM_SIZE, b"\x00") + b"\x00"
            + b"\x00" * 31)


def _parse_properties(data: bytes) -> dict:
    props, pos, n = {}, 0, len(data)
    while pos < n:
        size = data[pos]
        name_end = pos + 1 + size
        if name_end + 4 > n:
            raise RemoteProtocolError("ZMTP READY: property list ends inside a name")
        (vsize,) = _U32.unpack_from(data, name_end)
        end = name_end + 4 + vsize
        if end > n:
            raise RemoteProtocolError("ZMTP READY: property value longer than the command")
        props[bytes(data[pos + 1:name_end]).lower()] = bytes(data[name_end + 4:end])
        pos = end
    return props


_RUN_MIN = 8    # a run shorter than this is not worth numpy's call overhead: ...
_RUN_SKIP = 64  # ... so the loop takes this many messages alone before it tries again, and twice
_RUN_SKIP_MAX = 1024  # as many after each failure in a row, up to this (a run waits for at most so many)
_RUN_PROBE = 16  # messages a run is first checked over, before all the rest


def _take_run(buf: bytearray, first: int, head: int, stride: int, most: int, out: memoryview, at: int) -> int:
    """How many of the ``most`` messages laid end to end after the one at ``buf[first:first + stride]``
    start with the same ``head`` bytes (framing, first frame, second frame's size: the same shape,
    so each is ``stride`` bytes long too), in a row; their second frames (the ``stride - head``
    bytes after each one's ``head``) are copied into ``out`` from ``at``, end to end. ``most``
    messages must lie whole in ``buf`` and their second frames fit in ``out``."""
    size = stride - head
    rows = np.frombuffer(buf, np.uint8, (most + 1) * stride, first).reshape(most + 1, stride)
    model = rows[0, :head]
    run = 0
    probe = min(most, _RUN_PROBE)
    while run < most:
        same = (rows[run + 1:run + 1 + probe, :head] == model).all(axis=1)
        if same.all():
            run += probe
        else:
            run += int(same.argmin())
            break
        probe = most - run
    if run and size:
        target = np.frombuffer(out, np.uint8, run * size, at).reshape(run, size)
        target[...] = rows[1:run + 1, head:]
    return run


class BodyBuffer:
    """Where ``ZmtpConnection.columns`` copies the second frames of two-frame messages: ``data[:fill]``.

    ``data`` is a ``bytearray`` reused from one group of messages to the next: ``fill`` goes back
    to 0 and ``data`` keeps its size (it grows when a group needs more, and never shrinks by
    itself), so the same memory takes every group. A buffer freed and allocated again per group
    of a megabyte or more comes back as fresh pages from the kernel each time, cleared first: in the
    reader process that clearing was a quarter of its CPU. Whoever sets ``fill`` back to 0 must know
    that nothing built over ``data`` is still alive: a write that does not resize a ``bytearray``
    is allowed while its memory is exported (``MalamuteConsumer`` checks with a resize first)."""

    __slots__ = ("data", "fill")

    def __init__(self, size: int = 0) -> None:
        self.data = bytearray(size)
        self.fill = 0

    def room(self, size: int) -> None:
        """Make ``data`` hold at least ``size`` bytes after ``fill`` (growing by an eighth at least,
        as a ``bytearray`` grows by itself, so that a buffer filled a read at a time is not copied
        each time it grows; the new bytes are written, so kept small)."""
        short = self.fill + size - len(self.data)
        if short > 0:
            self.data += bytes(max(short, len(self.data) >> 3))

    def append(self, data) -> tuple:
        """Copy ``data`` in after what is there; its ``(start, stop)``."""
        self.room(len(data))
        start = self.fill
        stop = self.fill = start + len(data)
        self.data[start:stop] = data
        return start, stop

    def __bytes__(self) -> bytes:
        return bytes(self.data[:self.fill])


class ZmtpConnection:
    """One ZMTP 3.0 connection over NULL security, seen from the peer that connected.

    >>> c = ZmtpConnection()
    >>> wire = c.data_to_send()          # our greeting and READY: send them first
    >>> view = c.buffer(); n = 0         # receive into ``view`` (n bytes), then:
    >>> c.received(n); msgs = []; c.messages(msgs, 100)
    0
    """

    def __init__(self, socket_type: bytes = b"DEALER", identity: bytes = b"", *,
                 buffer_size: int = DEFAULT_BUFFER, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        if socket_type not in _PEERS:
            raise LocalProtocolError(f"ZMTP socket type {socket_type!r} is not supported here (only DEALER)")
        self.socket_type = socket_type
        self.phase = Phase.GREETING
        self.peer_properties: dict = {}
        self.peer_version: Optional[tuple] = None
        self.max_frame = max(max_frame, _SHORT_MAX)  # checked on LONG frames (short ones are within it)
        self._rest = self._size = max(buffer_size, 2 * MIN_READ)
        self._buf = bytearray(self._size)
        self._view = memoryview(self._buf)
        self._pos = 0      # first byte not yet parsed
        self._fill = 0     # end of the bytes received
        self._need = 0     # bytes from _pos the next frame needs whole (0: unknown)
        self._frames: list = []  # frames of a message whose last frame has not arrived yet
        self._header = b""  # the first frame of the last message ``columns`` took
        self._skip = 0  # messages ``columns`` takes one by one before it tries for a run again
        self._backoff = _RUN_SKIP // 2  # half of what it sets ``_skip`` to after the next short run
        self._out = bytearray(_greeting())
        self._out += encode_command(b"READY", encode_properties({b"Socket-Type": socket_type, b"Identity": identity}))

    # ------------------------------------------------------------ output

    @property
    def wants_to_send(self) -> bool:
        return bool(self._out)

    def data_to_send(self) -> bytes:
        """Bytes the connection itself must send (greeting, READY, PONGs), in order."""
        out, self._out = bytes(self._out), bytearray()
        return out

    # ------------------------------------------------------------ input

    @property
    def buffered(self) -> int:
        """Bytes received and not yet taken out as messages (a partial frame included)."""
        return self._fill - self._pos

    def buffer(self) -> memoryview:
        """Room to receive into (at least ``MIN_READ`` bytes, or all a pending large frame needs);
        call ``received(n)`` with the count written at its start. Release it (or let it go) before
        the next call: the buffer may move."""
        room = self._size - self._fill
        if room < MIN_READ or self._need > self._size - self._pos or (self._fill == 0 and self._size > self._rest):
            self._compact()
        # at most the resting size ahead (or what a pending large frame needs), even in a grown buffer
        held = self._fill - self._pos
        end = min(self._size, self._fill + max(MIN_READ, self._rest - held, self._need - held))
        return self._view[self._fill:end]

    def _compact(self) -> None:
        """Move the unparsed tail to the start; grow the buffer for a frame larger than it, and
        return to the resting size once such a frame is out."""
        pos, fill = self._pos, self._fill
        tail = fill - pos
        size = max(self._rest, self._need, tail + MIN_READ)
        if size != self._size:
            buf = bytearray(size)
            buf[:tail] = self._view[pos:fill]
            self._view.release()
            self._buf, self._view, self._size = buf, memoryview(buf), size
        elif pos:
            self._buf[:tail] = self._view[pos:fill]
        self._pos, self._fill = 0, tail

    def received(self, count: int) -> None:
        """``count`` bytes were written at the start of the last ``buffer()``."""
        if count < 0 or self._fill + count > self._size:
            raise LocalProtocolError(f"received({count}) beyond the buffer given")
        self._fill += count

    def messages(self, out: list, max_count: int) -> int:
        """Append up to ``max_count`` whole messages (lists of ``bytes`` frames) to ``out``; returns
        how many. Raises ``RemoteProtocolError`` when the peer broke the protocol."""
        if self.phase is not Phase.READY:
            self._handshake()
            if self.phase is not Phase.READY:
                return 0
        buf, view, fill = self._buf, self._view, self._fill
        pos = self._pos
        frames = self._frames
        count = need = 0
        try:
            while count < max_count:
                left = fill - pos
                if left < 2:
                    break
                flags = buf[pos]
                if flags & _LONG:
                    if left < 9:
                        break
                    (size,) = _U64.unpack_from(buf, pos + 1)
                    start = pos + 9
                    if size > self.max_frame:
                        raise RemoteProtocolError(f"ZMTP frame of {size} bytes announced, over the limit of "
                                                  f"{self.max_frame}")
                else:
                    size = buf[pos + 1]
                    start = pos + 2
                stop = start + size
                if stop > fill:
                    need = stop - pos  # the buffer must hold this frame whole
                    break
                if flags & (_RESERVED | _COMMAND):
                    self._command(flags, bytes(view[start:stop]))
                    pos = stop
                    continue
                frames.append(view[start:stop].tobytes())
                pos = stop
                if not flags & _MORE:
                    out.append(frames)
                    frames = self._frames = []
                    count += 1
        finally:
            self._need = need
            self._took(pos)
        return count

    def columns(self, heads: list, ends, body: BodyBuffer, max_count: int) -> Optional[list]:
        """Take up to ``max_count`` two-frame messages by columns: each one's first frame appended
        to ``heads`` (the same ``bytes`` object as the message before's while its bytes repeat: a
        stream of Malamute deliveries repeats a few headers), its second frame copied into ``body``
        after what it holds, and where that copy ends appended to ``ends`` (an ``array('q')``), so
        that message i's second frame is ``body.data[ends[i - 1]:ends[i]]``. One copy out of the
        receive buffer, into a buffer the caller can hand to Arrow whole, and no object per message
        but its header's.

        Stops at ``max_count``, at the end of the whole messages received, or at a message of any
        other shape (one frame, three or more, a first frame over 255 bytes; commands are acted on
        and passed over): that one is taken the way ``messages`` takes it and returned (a list of
        ``bytes`` frames), and nothing after it; otherwise returns None. A two-frame message not all
        received yet is left in the receive buffer whole (``buffer()`` makes room for it), so a
        partial message is only ever one of another shape. Raises as ``messages``."""
        other: list = []
        if self.phase is not Phase.READY:
            self._handshake()
            if self.phase is not Phase.READY:
                return None
        if self._frames:  # a message of another shape begun in an earlier call: the general way
            if self.messages(other, 1):
                return other[0]
            if self._frames:
                return None
        buf, view, fill = self._buf, self._view, self._fill
        pos = self._pos
        body.room(fill - pos)
        # copies through a memoryview (cheaper than through the bytearray's slice assignment)
        bdata, bfill = memoryview(body.data), body.fill
        count = need = 0
        shaped = True  # False: the message at ``pos`` is of another shape
        unpack_u64 = _U64.unpack_from
        max_frame = self.max_frame
        add_head, add_end = heads.append, ends.append
        header = self._header
        skip, backoff = self._skip, self._backoff  # messages to take before trying for a run again
        try:
            while count < max_count:
                if fill - pos < 2:
                    break
                if buf[pos] != _MORE:  # a short first frame with more to come, nothing else
                    shaped = False
                    break
                hstop = pos + 2 + buf[pos + 1]
                if hstop + 2 > fill:
                    break
                last = buf[hstop]
                if last == _LONG:
                    if hstop + 9 > fill:
                        break
                    (size,) = unpack_u64(buf, hstop + 1)
                    if size > max_frame:
                        shaped = False  # ``messages`` raises, naming the size
                        break
                    start = hstop + 9
                elif last == 0:
                    size = buf[hstop + 1]
                    start = hstop + 2
                else:  # a third frame follows, a command comes between, or reserved bits
                    shaped = False
                    break
                stop = start + size
                if stop > fill:
                    need = stop - pos  # the buffer must hold this message whole
                    break
                if len(header) != hstop - pos - 2 or not buf.startswith(header, pos + 2):
                    header = self._header = view[pos + 2:hstop].tobytes()
                bdata[bfill:bfill + size] = view[start:stop]
                bfill += size
                add_head(header)
                add_end(bfill)
                count += 1
                first, pos = pos, stop
                if skip:
                    skip -= 1
                    continue
                stride = stop - first
                most = min(max_count - count, (fill - stop) // stride)
                if most < _RUN_MIN:
                    continue  # too few after it to be worth a try (the end of a read)
                # the messages after this one while they repeat its framing and header byte for byte
                # (a mailbox drain is mostly such a run): checked and copied by numpy, not one by one
                run = _take_run(buf, first, start - first, stride, most, bdata, bfill)
                if run < _RUN_MIN:  # the next messages differ: the loop alone for a while, longer each time
                    backoff = skip = min(backoff * 2, _RUN_SKIP_MAX)
                else:
                    backoff = _RUN_SKIP // 2
                if run:
                    heads.extend(repeat(header, run))
                    ends.extend(range(bfill + size, bfill + run * size + 1, size) if size else repeat(bfill, run))
                    bfill += run * size
                    pos += run * stride
                    count += run
        finally:
            bdata.release()
            body.fill = bfill
            self._skip, self._backoff = skip, backoff
            self._need = need
            self._took(pos)
        if shaped or not self.messages(other, 1):
            return None
        return other[0]

    def _took(self, pos: int) -> None:
        """Parsed up to ``pos``; once all is taken, the next read starts at the buffer's start."""
        if pos == self._fill:
            self._pos = self._fill = 0
        else:
            self._pos = pos

    def _command(self, flags: int, body: bytes) -> None:
        if flags & _RESERVED:
            raise RemoteProtocolError(f"ZMTP frame flags {flags:#04x} set reserved bits")
        # a command may come between two frames of a message: libzmq sends a heartbeat PING when
        # its timer fires, between whatever frames it is writing; it leaves the message alone
        name, data = self._split_command(body)
        if name == b"PING":  # ZMTP 3.1 heartbeat: TTL (2 octets), then a context echoed in PONG
            if len(data) < 2:
                raise RemoteProtocolError("ZMTP PING shorter than its TTL")
            self._out += encode_command(b"PONG", data[2:])
        elif name == b"ERROR":
            raise RemoteProtocolError(f"ZMTP peer sent ERROR: {self._reason(data)}")
        # PONG and any other command: nothing to do for a NULL DEALER

    @staticmethod
    def _split_command(body: bytes) -> tuple:
        if not body or len(body) < 1 + body[0]:
            raise RemoteProtocolError("ZMTP command frame shorter than its name")
        return body[1:1 + body[0]], body[1 + body[0]:]

    @staticmethod
    def _reason(data: bytes) -> str:
        return data[1:1 + data[0]].decode("utf-8", "replace") if data else ""

    # ------------------------------------------------------------ greeting and handshake

    def _handshake(self) -> None:
        buf, pos, fill = self._buf, self._pos, self._fill
        if self.phase is Phase.GREETING:
            # the signature is checked as soon as it is there: a peer that is not ZMTP is named early
            if fill - pos >= 1 and buf[pos] != 0xFF:
                raise RemoteProtocolError("not a ZMTP peer: its first byte is not the signature's 0xFF")
            if fill - pos >= 10 and not buf[pos + 9] & 0x01:
                raise RemoteProtocolError("not a ZMTP 3 peer: bad signature (ZMTP 1.0 framing)")
            if fill - pos >= 11 and buf[pos + 10] < 3:
                raise RemoteProtocolError(f"ZMTP peer speaks version {buf[pos + 10]}.x; 3.0 or later is needed")
            if fill - pos < GREETING_SIZE:
                return
            self.peer_version = (buf[pos + 10], buf[pos + 11])
            mechanism = bytes(buf[pos + 12:pos + 12 + _MECHANISM_SIZE]).rstrip(b"\x00")
            if mechanism != MECHANISM:
                raise RemoteProtocolError(f"ZMTP peer wants security mechanism {mechanism.decode('ascii', 'replace')!r}; "
                                          "only NULL is supported")
            pos += GREETING_SIZE
            self._pos = pos
            self.phase = Phase.HANDSHAKE
        # the peer's READY (or ERROR): one command frame
        if fill - pos < 2:
            return
        flags = buf[pos]
        if not flags & _COMMAND or flags & (_RESERVED | _MORE):
            raise RemoteProtocolError(f"ZMTP peer sent a frame with flags {flags:#04x} before its READY")
        if flags & _LONG:
            if fill - pos < 9:
                return
            (size,) = _U64.unpack_from(buf, pos + 1)
            start = pos + 9
            if size > self.max_frame:
                raise RemoteProtocolError(f"ZMTP READY of {size} bytes announced")
        else:
            size, start = buf[pos + 1], pos + 2
        if start + size > fill:
            self._need = start + size - pos
            return
        name, data = self._split_command(bytes(buf[start:start + size]))
        if name == b"ERROR":
            raise RemoteProtocolError(f"ZMTP peer refused the handshake: {self._reason(data)}")
        if name != b"READY":
            raise RemoteProtocolError(f"ZMTP peer sent {name!r} where READY was due")
        props = _parse_properties(data)
        peer = props.get(b"socket-type")
        if peer not in _PEERS[self.socket_type]:
            raise RemoteProtocolError(f"ZMTP peer is a {peer.decode('ascii', 'replace') if peer else 'socket of no type'}, "
                                      f"which a {self.socket_type.decode()} cannot talk to")
        self.peer_properties = props
        self._pos = start + size
        self._need = 0
        self.phase = Phase.READY
