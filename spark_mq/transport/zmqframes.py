"""Receiving and sending one ZeroMQ multipart message, cheaply.

Responsible for: the per-message receive of the Malamute client's IO thread and of the embedded
broker's loop, and the embedded broker's per-message send. ``Socket.recv_multipart`` asks ``getsockopt(RCVMORE)`` after every frame, through
pyzmq's Python-level option handling (an enum conversion per call, seen in profiles of the
source's reader process); a frame received with ``copy=False`` carries its own "more" flag, so
this saves that call per frame (about a third of the receive's cost for a two-frame message).

``Socket.send_multipart`` type-checks every part in Python, then sends each through the Python
``Socket.send`` wrapper with ``zmq.SNDMORE | flags``: an ``enum.Flag`` operation per frame, whose
enum machinery and the wrappers showed in the broker's profiles. ``send_frames`` calls the
extension type's ``send`` with precomputed ``int`` flags: the same frames, flags and copying
(``copy=True``), so the same message on the wire; a 3-frame message (routing id, header, 4 KiB)
costs about 2 us against 9-13 us. The measurements: bench/HISTORY.md.
"""

from __future__ import annotations

import zmq

__all__ = ["recv_frames", "send_frames", "NOBLOCK"]

NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_send = zmq.backend.Socket.send  # what pyzmq's Python-level Socket.send calls, without the wrapper


def recv_frames(sock: zmq.Socket, flags: int = NOBLOCK) -> list:
    """One whole multipart message from ``sock`` as a list of ``bytes`` (``recv_multipart``'s
    result); raises ``zmq.Again`` when none is waiting and ``flags`` has NOBLOCK. A multipart
    message arrives atomically: once its first frame is read, the rest are there."""
    frame = sock.recv(flags, copy=False)
    parts = [frame.bytes]
    while frame.more:
        frame = sock.recv(flags, copy=False)
        parts.append(frame.bytes)
    return parts


def send_frames(sock: zmq.Socket, frames, flags: int = NOBLOCK) -> None:
    """Send ``frames`` (a non-empty sequence of ``bytes``-like objects) as one multipart message,
    copied, as ``sock.send_multipart(frames, flags)`` does. Raises ``zmq.Again`` (NOBLOCK and the
    peer's queue full) or another ``ZMQError`` from the first frame, before any of the message
    is queued: ZeroMQ takes the parts after an accepted first one whole, as ``send_multipart``
    relies on too."""
    more = flags | _SNDMORE
    last = len(frames) - 1
    for i in range(last):
        _send(sock, frames[i], more)
    _send(sock, frames[last], flags)
