"""Sockets listening outside loopback, and the processes that hold them (Linux ``/proc``, no ``ss`` needed).

``./dev`` takes a snapshot before its set-up (``snapshot FILE``) and checks after the set-up and
after the run (``check FILE WHAT``): a listener outside loopback that was not in the snapshot fails
the command, naming the process. The set-up must leave the machine as it found it, and no test,
demo or benchmark may open a port on a public interface (the brokers the harness starts bind to
127.0.0.1).

    python3 scripts/listeners.py snapshot /tmp/before      # record the current listeners
    python3 scripts/listeners.py check /tmp/before "set-up" # exit 1 naming new ones
    python3 scripts/listeners.py list                      # print them
    python3 scripts/listeners.py pids                      # every pid, one per line (for stop-new)
    python3 scripts/listeners.py stop-new PIDFILE          # stop new daemons holding public listeners

Standard library only: it runs before the project's virtual environment exists.
"""

from __future__ import annotations

import ipaddress
import os
import signal
import sys
import time
from typing import Dict, Iterable, List, NamedTuple, Optional, Set

_TCP_LISTEN = "0A"
_UDP_UNCONNECTED = "07"
_TABLES = (("tcp", "/proc/net/tcp", _TCP_LISTEN), ("tcp6", "/proc/net/tcp6", _TCP_LISTEN),
           ("udp", "/proc/net/udp", _UDP_UNCONNECTED), ("udp6", "/proc/net/udp6", _UDP_UNCONNECTED))


class Listener(NamedTuple):
    proto: str
    address: str
    port: int
    inode: int

    def key(self) -> str:
        return f"{self.proto} {self.address}:{self.port}"


def decode_address(hex_addr: str) -> str:
    """``0100007F`` -> ``127.0.0.1``; 32 hex digits -> an IPv6 address (the kernel writes each
    32-bit word in host byte order, little-endian here)."""
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return str(ipaddress.IPv6Address(words))


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def parse_table(proto: str, text: str, state: str) -> List[Listener]:
    """Listening (TCP) or bound, unconnected (UDP) sockets of one ``/proc/net`` table."""
    out = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != state:
            continue
        addr, port = fields[1].split(":")
        out.append(Listener(proto, decode_address(addr), int(port, 16), int(fields[9])))
    return out


def public_listeners() -> List[Listener]:
    found = []
    for proto, path, state in _TABLES:
        try:
            with open(path) as fh:
                text = fh.read()
        except OSError:
            continue
        found += [entry for entry in parse_table(proto, text, state) if not is_loopback(entry.address)]
    return found


def socket_owners() -> Dict[int, Set[int]]:
    """socket inode -> pids holding it (what we may read of ``/proc/*/fd``)."""
    owners: Dict[int, Set[int]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners.setdefault(int(target[8:-1]), set()).add(int(pid))
    return owners


def describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        cmd = "?"
    return f"pid {pid} ({cmd[:120]})"


def _keys(listeners: Iterable[Listener]) -> Set[str]:
    return {entry.key() for entry in listeners}


def new_listeners(before: Set[str]) -> List[str]:
    owners = socket_owners()
    lines = []
    for entry in public_listeners():
        if entry.key() in before:
            continue
        who = ", ".join(describe(p) for p in sorted(owners.get(entry.inode, ()))) or "owner not visible"
        lines.append(f"{entry.key()} held by {who}")
    return sorted(set(lines))


def all_pids() -> Set[int]:
    return {int(p) for p in os.listdir("/proc") if p.isdigit()}


def _parent(pid: int) -> Optional[int]:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return int(fh.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def stop_new_daemons(pids_before: Set[int]) -> List[str]:
    """Stop the processes that did not exist in ``pids_before``, listen outside loopback, and whose
    parent did exist (a daemon a package script left behind, such as ``epmd -daemon``, is adopted by
    init or by the container's reaper). Never a process the machine already had."""
    owners = socket_owners()
    targets = set()
    for entry in public_listeners():
        for pid in owners.get(entry.inode, ()):
            if pid not in pids_before and _parent(pid) in pids_before:
                targets.add(pid)
    stopped = []
    for pid in sorted(targets):
        what = describe(pid)
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            continue
        for _ in range(50):
            if not os.path.exists(f"/proc/{pid}") or _parent(pid) is None:
                break
            time.sleep(0.1)
        else:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        stopped.append(what)
    return stopped


def main(argv: List[str]) -> int:
    if not argv or argv[0] not in {"snapshot", "check", "list", "pids", "stop-new"}:
        print(__doc__, file=sys.stderr)
        return 2
    verb = argv[0]
    if verb == "list":
        for line in new_listeners(set()):
            print(line)
        return 0
    if verb == "pids":
        print("\n".join(str(p) for p in sorted(all_pids())))
        return 0
    if verb == "snapshot":
        with open(argv[1], "w") as fh:
            fh.write("\n".join(sorted(_keys(public_listeners()))) + "\n")
        return 0
    if verb == "stop-new":
        with open(argv[1]) as fh:
            before = {int(line) for line in fh if line.strip()}
        for what in stop_new_daemons(before):
            print(f"stopped {what}: started by the package installation, listening outside loopback")
        return 0
    with open(argv[1]) as fh:
        before = {line.strip() for line in fh if line.strip()}
    what = argv[2] if len(argv) > 2 else "the run"
    found = new_listeners(before)
    if found:
        print(f"error: after {what}, sockets listen outside loopback that were not there before:", file=sys.stderr)
        for line in found:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
