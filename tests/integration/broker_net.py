"""Loopback networking helpers of the broker harness: free ports, raw AMQP/STOMP probes, listening sockets.

Responsible for the socket-level facts the harness and its tests check (is a port free, does it speak AMQP 0-8 or
STOMP, which sockets does a process listen on, per /proc). Knows nothing about starting brokers (brokers.py).
"""

from __future__ import annotations

import ipaddress
import os
import random
import socket
import threading
import time
from pathlib import Path

LOOPBACK = "127.0.0.1"
AMQP_PROTOCOL_HEADER = b"AMQP\x01\x01\x08\x00"  # AMQP 0-8 as RabbitMQ expects it
STOMP_CONNECT = b"CONNECT\nlogin:%s\npasscode:%s\n\n\x00"
STOMP_CONNECT_ANONYMOUS = b"CONNECT\n\n\x00"
STOMP_DISCONNECT = b"DISCONNECT\n\n\x00"
_POLL = 0.1
_TCP_LISTEN = "0A"  # state column of /proc/net/tcp


# ----------------------------------------------------------------------------------------------- ports

_ports_lock = threading.Lock()
_ports_given: set[int] = set()


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback TCP ports free right now, below the ephemeral range when possible.

    Below the ephemeral range, no outgoing connection can take the port while a killed broker is down, so
    restart() finds its ports free again. Ports handed out earlier in this process are never reused.
    """
    low, high = 20000, _ephemeral_low() - 1
    chosen: list[int] = []
    with _ports_lock:
        for _ in range(count):
            for attempt in range(200):
                port = random.randint(low, high) if high > low and attempt < 150 else 0
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    try:
                        s.bind((LOOPBACK, port))
                    except OSError:
                        continue
                    port = s.getsockname()[1]
                if port not in _ports_given and port not in chosen and _refuses(port):
                    chosen.append(port)
                    break
            else:
                raise OSError("no free loopback TCP port found")
        _ports_given.update(chosen)
    return chosen


def _refuses(port: int, host: str = LOOPBACK) -> bool:
    """True when nothing accepts on host:port (a bind test alone misses listeners on other addresses)."""
    return not port_accepts(port, host, timeout=0.2)


def port_accepts(port: int, host: str = LOOPBACK, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port_refuses(port: int, host: str = LOOPBACK, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while port_accepts(port, host, timeout=0.5):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{host}:{port} still accepts connections after {timeout:.0f}s")
        time.sleep(_POLL)


# ----------------------------------------------------------------------------------------------- raw probes


def _recv_until(sock: socket.socket, done, limit: int = 65536) -> bytes:
    data = b""
    while not done(data) and len(data) < limit:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return data


def amqp_probe(port: int, host: str = LOOPBACK, timeout: float = 5.0, header: bytes = AMQP_PROTOCOL_HEADER) -> bytes:
    """Send an AMQP protocol header (0-8's unless given) and return the first frame's bytes (header,
    payload, frame-end)."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(header)
        data = _recv_until(s, lambda d: len(d) >= 7 and len(d) >= 8 + int.from_bytes(d[3:7], "big"))
    return data


def stomp_probe(port: int, host: str = LOOPBACK, *, login: str | None = None, passcode: str | None = None,
                timeout: float = 5.0) -> bytes:
    """Send a STOMP CONNECT (with login/passcode when given) and return the reply frame up to its NUL."""
    frame = STOMP_CONNECT_ANONYMOUS if login is None else STOMP_CONNECT % (login.encode(), (passcode or "").encode())
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(frame)
        data = _recv_until(s, lambda d: b"\x00" in d)
        if data.startswith(b"CONNECTED"):
            try:
                s.sendall(STOMP_DISCONNECT)
            except OSError:
                pass
    return data


# ----------------------------------------------------------------------------------------------- socket checks


def _hex_addr(text: str) -> str:
    """/proc/net/tcp{,6} address (little-endian 32-bit words) to a printable IP."""
    raw = bytes.fromhex(text)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(words) == 4 else socket.AF_INET6, words)


def listening_sockets(pids: list[int]) -> list[tuple[str, int, int]]:
    """(ip, port, pid) of every TCP socket in LISTEN state owned by one of `pids` (from /proc)."""
    inode_pid: dict[str, int] = {}
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target.startswith("socket:["):
                    inode_pid[target[8:-1]] = pid
        except OSError:
            continue
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == _TCP_LISTEN and inode in inode_pid:
                addr, port = local.rsplit(":", 1)
                found.append((_hex_addr(addr), int(port, 16), inode_pid[inode]))
    return found


def is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback
