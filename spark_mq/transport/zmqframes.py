"""Receiving one ZeroMQ multipart message as a list of ``bytes``, cheaply.

Responsible for: the per-message receive of the Malamute client's IO thread and of the embedded
broker's loop. ``Socket.recv_multipart`` asks ``getsockopt(RCVMORE)`` after every frame, through
pyzmq's Python-level option handling (an enum conversion per call, seen in profiles of the
source's reader process); a frame received with ``copy=False`` carries its own "more" flag, so
this saves that call per frame (about a third of the receive's cost for a two-frame message on
inproc, in a scratch measurement; the end-to-end rates in ``./dev bench sources`` did not move
beyond this machine's noise).
"""

from __future__ import annotations

import zmq

__all__ = ["recv_frames", "NOBLOCK"]

NOBLOCK = int(zmq.NOBLOCK)


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
