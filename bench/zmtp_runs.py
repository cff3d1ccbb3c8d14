"""Parsing cost of ``ZmtpConnection.columns`` with and without its runs, no socket, no broker.

Why: a mailbox drain is mostly deliveries of one shape (the same header frame, the same body size).
``columns`` checks and copies a run of them with numpy (``_take_run``) instead of one Python loop
iteration each. This measures what that saves, and what it costs where no two messages in a row
are alike (it then tries for a run less and less often, up to 1,024 messages apart).

Each case is a stream of Malamute-like two-frame messages (a 46-byte header, then the body), fed in
reads of up to 1 MiB into one connection after its handshake, and taken by ``columns`` into a body
buffer emptied every 8 MiB, as the source's ingest does. The peer is the same code with runs
turned off (``_take_run`` taking none), measured alternately in the same process; CPU time of
this process, median of ``--rounds`` (5).

    python -m bench.zmtp_runs
    python -m bench.zmtp_runs --rounds=9

No target: it explains the Malamute reader's CPU per message (``docs/malamute.md``).
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from array import array

from bench.bench_sources import _arg
from spark_mq.protocol import zmtp
from spark_mq.protocol.zmtp import BodyBuffer, ZmtpConnection, encode_command, encode_message, encode_properties

HEADER = b"\xaa\xa1\x05" + b"\x06sender" + b"\x07address" + b"\x07subject" + b"\x00\x00\x00\x00" + b"\x07tracker"
CASES = {  # name -> (body size, messages, alternate two headers)
    "100B": (100, 2_000_000, False),
    "4KiB": (4096, 300_000, False),
    "100B, headers alternate": (100, 1_000_000, True),
}
ROUNDS = 5


def _stream(size: int, alternate: bool) -> bytes:
    """One read's worth (about 1 MiB) of whole messages, to be fed again and again."""
    unit = encode_message([HEADER, os.urandom(size)])
    if alternate:
        unit += encode_message([HEADER[:-1] + b"X", os.urandom(size)])
    return unit * max(1, (1 << 20) // len(unit))


def _connection() -> ZmtpConnection:
    conn = ZmtpConnection()
    conn.data_to_send()
    hello = zmtp._greeting() + encode_command(b"READY", encode_properties({b"Socket-Type": b"ROUTER"}))
    view = conn.buffer()
    view[:len(hello)] = hello
    view.release()
    conn.received(len(hello))
    if conn.messages([], 1) != 0 or conn.phase is not zmtp.Phase.READY:
        raise RuntimeError("the handshake did not complete")
    return conn


def _drain(chunk: bytes, n: int) -> tuple:
    """Take ``n`` messages (at least) out of reads of ``chunk``; (messages, CPU seconds, body bytes)."""
    conn, body, heads, ends = _connection(), BodyBuffer(), [], array("q")
    taken = stored = 0
    cpu = 0.0
    while taken < n:
        view = conn.buffer()
        if len(view) < len(chunk):  # a read ended inside a message: let the parse catch up
            raise RuntimeError("the receive buffer offered less than one read")
        view[:len(chunk)] = chunk
        view.release()
        conn.received(len(chunk))
        c0 = time.process_time()
        while True:
            before = len(heads)
            if conn.columns(heads, ends, body, 1 << 30) is not None:
                raise RuntimeError("a message of another shape in a stream of two-frame messages")
            if len(heads) == before:
                break
        cpu += time.process_time() - c0
        if conn.buffered:
            raise RuntimeError(f"{conn.buffered} bytes of whole messages left unparsed")
        if body.fill >= 8 << 20:
            taken += len(heads)
            stored += body.fill
            body.fill = 0
            heads.clear()
            del ends[:]
    return taken + len(heads), cpu, stored + body.fill


def main(argv: list[str]) -> dict:
    rounds = max(1, _arg(argv, "rounds", ROUNDS))
    real = zmtp._take_run
    results = {}
    for name, (size, n, alternate) in CASES.items():
        chunk = _stream(size, alternate)
        per = {"runs": [], "loop": []}
        for rnd in range(rounds):
            for way in ("loop", "runs") if rnd % 2 else ("runs", "loop"):
                zmtp._take_run = real if way == "runs" else (lambda *args: 0)
                try:
                    got, cpu, stored = _drain(chunk, n)
                finally:
                    zmtp._take_run = real
                if got < n or stored != got * size:
                    raise RuntimeError(f"{name}: took {got} messages, {stored} body bytes")
                per[way].append(cpu / got * 1e6)
        ratios = sorted(r / lo for r, lo in zip(per["runs"], per["loop"]))
        results[name] = {"runs_us_per_msg": statistics.median(per["runs"]),
                         "loop_us_per_msg": statistics.median(per["loop"]),
                         "ratio_median": statistics.median(ratios), "ratios": ratios}
        print(f"{name}: {n:,} messages, with runs {results[name]['runs_us_per_msg']:.2f} CPU-us/msg, "
              f"loop alone {results[name]['loop_us_per_msg']:.2f}; ratio median x{results[name]['ratio_median']:.2f} "
              f"(rounds {', '.join(f'x{r:.2f}' for r in ratios)})", flush=True)
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
