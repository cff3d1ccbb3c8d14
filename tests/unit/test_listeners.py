"""scripts/listeners.py: what ``./dev`` uses to fail when its set-up or run leaves a port open outside
loopback (issue 47), and to stop a daemon a package installation left behind (never one that was there)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import listeners  # noqa: E402

pytestmark = pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="needs Linux /proc")

# a daemon that binds every interface, like `epmd -daemon`: the launcher exits, the child is adopted
_DAEMON = r"""
import os, socket, sys, time
if os.fork():
    os._exit(0)
s = socket.socket(); s.bind((sys.argv[1], 0)); s.listen()
print(s.getsockname()[1], flush=True)
time.sleep(60)
"""


def test_decodes_proc_addresses():
    assert listeners.decode_address("0100007F") == "127.0.0.1"
    assert listeners.decode_address("00000000") == "0.0.0.0"
    assert listeners.decode_address("00000000000000000000000001000000") == "::1"
    assert listeners.is_loopback(listeners.decode_address("0000000000000000FFFF00000100007F"))  # ::ffff:127.0.0.1
    assert listeners.is_loopback("127.0.0.53") and listeners.is_loopback("::1")
    assert listeners.is_loopback("::ffff:127.0.0.1")
    assert not listeners.is_loopback("0.0.0.0") and not listeners.is_loopback("::")


def test_parse_keeps_listening_tcp_only():
    table = (
        "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
        "   0: 00000000:1111 00000000:0000 0A 00000000:00000000 00:00000000 00000000   107        0 4242 1\n"
        "   1: 0100007F:2222 0100007F:9999 01 00000000:00000000 00:00000000 00000000     0        0 4243 1\n")
    assert listeners.parse_table("tcp", table, "0A") == [listeners.Listener("tcp", "0.0.0.0", 0x1111, 4242)]


def _daemon(tmp_path, address: str):
    out = tmp_path / "port"
    with open(out, "w") as fh:
        subprocess.run([sys.executable, "-c", _DAEMON, address], stdout=fh, check=True, timeout=30)
    deadline = time.monotonic() + 20
    while not out.read_text().strip():
        assert time.monotonic() < deadline, "the test daemon did not start"
        time.sleep(0.05)
    return int(out.read_text())


def _holders(port: int) -> set:
    owners = listeners.socket_owners()
    return {pid for e in listeners.public_listeners() if e.port == port for pid in owners.get(e.inode, ())}


def test_check_fails_naming_a_new_public_listener_and_stop_new_stops_only_new_daemons(tmp_path):
    snapshot = tmp_path / "before"
    pids = tmp_path / "pids"
    old_port = _daemon(tmp_path, "0.0.0.0")  # "the machine already had it"
    old = _holders(old_port)
    try:
        assert listeners.main(["snapshot", str(snapshot)]) == 0
        pids.write_text("\n".join(map(str, listeners.all_pids())))
        assert listeners.main(["check", str(snapshot), "the set-up"]) == 0
        new_port = _daemon(tmp_path, "0.0.0.0")
        _daemon(tmp_path, "127.0.0.1")  # loopback is fine
        found = listeners.new_listeners({l.strip() for l in snapshot.read_text().splitlines()})
        assert [line for line in found if f":{new_port} " in line], found
        assert all(f":{old_port} " not in line for line in found)
        assert listeners.main(["check", str(snapshot), "the set-up"]) == 1
        stopped = listeners.stop_new_daemons({int(p) for p in pids.read_text().split()})
        assert len(stopped) == 1 and "socket" in stopped[0]
        assert _holders(new_port) == set()
        assert _holders(old_port) == old  # a process that was there before is never touched
        assert listeners.main(["check", str(snapshot), "the set-up"]) == 0
    finally:
        for pid in _holders(old_port):
            subprocess.run(["kill", str(pid)], check=False)
