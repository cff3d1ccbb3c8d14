"""Sans-IO ZMTP 3.0 DEALER (spark_mq.protocol.zmtp): golden bytes, the three-way parser check,
the handshake, PING/PONG, protocol errors, the receive buffer, and a fuzz invariant.

The peer (a ROUTER) is played by the helpers below, which frame by hand (not through
``encode_message``) so that the encoder and the decoder are not only checked against each other.
"""

from __future__ import annotations

import itertools
import random
from array import array

import pytest

from spark_mq.errors import LocalProtocolError, RemoteProtocolError
from spark_mq.protocol import zmtp
from spark_mq.protocol.zmtp import (
    DEFAULT_BUFFER,
    GREETING_SIZE,
    SIGNATURE,
    BodyBuffer,
    Phase,
    ZmtpConnection,
    encode_command,
    encode_message,
)

MORE, LONG, COMMAND = 0x01, 0x02, 0x04
ALL = 1 << 30  # max_count meaning "every message there is"

# -- the peer: a ROUTER whose bytes are written by hand -------------------------------------------


def greeting(major: int = 3, minor: int = 0, mechanism: bytes = b"NULL") -> bytes:
    return (b"\xff" + b"\x00" * 8 + b"\x7f" + bytes((major, minor)) + mechanism.ljust(20, b"\x00")
            + b"\x01" + b"\x00" * 31)  # as-server 1: the ROUTER binds


def frame(body: bytes, flags: int = 0) -> bytes:
    if len(body) > 255:
        return bytes((flags | LONG,)) + len(body).to_bytes(8, "big") + body
    return bytes((flags, len(body))) + body


def command(name: bytes, data: bytes = b"") -> bytes:
    return frame(bytes((len(name),)) + name + data, COMMAND)


def props(*pairs: tuple) -> bytes:
    return b"".join(bytes((len(k),)) + k + len(v).to_bytes(4, "big") + v for k, v in pairs)


def ready(socket_type: bytes = b"ROUTER", *extra: tuple) -> bytes:
    return command(b"READY", props((b"Socket-Type", socket_type), *extra))


def message(*frames: bytes) -> bytes:
    return b"".join(frame(f, MORE if i < len(frames) - 1 else 0) for i, f in enumerate(frames))


def peer(*messages: list, minor: int = 0) -> bytes:
    """The ROUTER's greeting and READY, then the given messages (lists of frames)."""
    return greeting(minor=minor) + ready() + b"".join(message(*m) for m in messages)


# -- feeding: the driver's side of buffer()/received() --------------------------------------------


def random_sizes(seed: int, hi: int):
    rng = random.Random(seed)
    while True:
        yield rng.randint(1, hi)


CHUNKINGS = {
    "whole": lambda: None,                     # as much as buffer() offers
    "bytes": lambda: itertools.repeat(1),      # one byte at a time
    "random": lambda: random_sizes(1234, 3000),
}


def feed(conn: ZmtpConnection, data: bytes, sizes=None, out=None, take=None) -> list:
    """Copy ``data`` into ``conn`` in chunks of ``sizes`` (None: all buffer() offers), taking every
    whole message out into ``out`` after each chunk unless ``out`` is None (with ``take(out)``
    instead of ``conn.messages(out, ALL)`` if given)."""
    data, pos = memoryview(data), 0
    sizes = iter(sizes) if sizes is not None else None
    while pos < len(data):
        view = conn.buffer()
        n = min(len(view), len(data) - pos, next(sizes) if sizes is not None else len(view))
        view[:n] = data[pos:pos + n]
        view.release()
        conn.received(n)
        pos += n
        if out is not None:
            if take is not None:
                take(out)
            else:
                conn.messages(out, ALL)
    return out


def run(data: bytes, chunking: str = "whole", **kwargs) -> tuple:
    conn = ZmtpConnection(**kwargs)
    return conn, feed(conn, data, CHUNKINGS[chunking](), [])


# a partial next frame left after the messages: 2 header bytes announcing 10, then 4 of them
PARTIAL = b"\x00\x0aabcd"


def check_three_ways(msgs: list) -> None:
    """Whole, byte at a time and random chunks, with a partial frame after: the same messages."""
    for chunking in CHUNKINGS:
        conn, out = run(peer(*msgs) + PARTIAL, chunking)
        assert out == msgs, chunking
        assert conn.buffered == len(PARTIAL), chunking
        feed(conn, b"efghij", None, out)
        assert out[-1] == [b"abcdefghij"] and conn.buffered == 0, chunking


# -- golden bytes ----------------------------------------------------------------------------------

GOLDEN_GREETING = (b"\xff\x00\x00\x00\x00\x00\x00\x00\x00\x7f" b"\x03\x00"
                   b"NULL\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00" b"\x00" + b"\x00" * 31)
GOLDEN_READY = (b"\x04\x29" b"\x05READY" b"\x0bSocket-Type\x00\x00\x00\x06DEALER" b"\x08Identity\x00\x00\x00\x00")


def test_our_greeting_is_64_exact_bytes():
    """Our greeting: signature, version 3.0, mechanism NULL, as-server 0, zero filler."""
    out = ZmtpConnection().data_to_send()
    assert len(GOLDEN_GREETING) == GREETING_SIZE == 64
    assert out[:64] == GOLDEN_GREETING and out[:10] == SIGNATURE


def test_our_ready_carries_dealer_and_empty_identity():
    """Our READY follows the greeting: Socket-Type DEALER and Identity "" in exact wire form."""
    conn = ZmtpConnection()
    assert conn.wants_to_send
    assert conn.data_to_send() == GOLDEN_GREETING + GOLDEN_READY
    assert not conn.wants_to_send and conn.data_to_send() == b""


def test_encode_message_short_frames():
    """Short frames: MORE on all but the last, one size octet, empty frames and 255 bytes."""
    assert encode_message([b"a", b"", b"xyz"]) == b"\x01\x01a\x01\x00\x00\x03xyz"
    assert encode_message([b""]) == b"\x00\x00"
    assert encode_message([b"y" * 255]) == b"\x00\xff" + b"y" * 255


def test_encode_message_long_frames():
    """Frames over 255 bytes: LONG flag and an 8-octet big-endian size, MORE kept."""
    big = b"z" * 256
    assert encode_message([big]) == b"\x02\x00\x00\x00\x00\x00\x00\x01\x00" + big
    assert encode_message([big, b"k"]) == b"\x03\x00\x00\x00\x00\x00\x00\x01\x00" + big + b"\x00\x01k"
    assert encode_message([memoryview(b"mv")]) == b"\x00\x02mv"


def test_encode_command_short_and_long():
    """Commands: COMMAND flag, name length, name, data; LONG when the body is over 255."""
    assert encode_command(b"PING", b"\x00\x0aabc") == b"\x04\x0a\x04PING\x00\x0aabc"
    assert encode_command(b"PONG") == b"\x04\x05\x04PONG"
    data = b"d" * 300
    assert encode_command(b"PONG", data) == b"\x06" + (305).to_bytes(8, "big") + b"\x04PONG" + data


def test_bad_local_arguments_raise_local_protocol_error():
    """Our own misuse: no frames, bad command names, a socket type other than DEALER."""
    with pytest.raises(LocalProtocolError, match="at least one frame"):
        encode_message([])
    for name in (b"", b"n" * 256):
        with pytest.raises(LocalProtocolError, match="command name"):
            encode_command(name)
    with pytest.raises(LocalProtocolError, match="only DEALER"):
        ZmtpConnection(socket_type=b"PUB")


# -- messages: the three-way check -----------------------------------------------------------------


def test_multipart_and_empty_frames_three_ways():
    """Multi-frame messages, empty frames and a lone 0-length frame come out the same every way."""
    check_three_ways([[b"a", b"bc", b"def"], [b""], [b"", b"x", b""], [b"one"], [b"", b""]])


def test_short_long_boundary_three_ways():
    """Frames of 255 (short) and 256 (long) bytes, alone and inside multipart messages."""
    check_three_ways([[b"s" * 255], [b"L" * 256], [b"h", b"s" * 255, b"L" * 256, b"t"], [bytes(range(256)) * 2]])


def test_ten_thousand_small_messages_three_ways():
    """10,000 small messages, one or two frames each, in order."""
    check_three_ways([[b"k%d" % i] if i % 3 else [b"k", b"%d" % i] for i in range(10_000)])


def test_long_frame_announced_with_a_small_size_is_accepted():
    """A LONG frame of 3 bytes (non-canonical but legal) is read like a short one."""
    _, out = run(peer() + b"\x02" + (3).to_bytes(8, "big") + b"abc" + message(b"z"))
    assert out == [[b"abc"], [b"z"]]


def big_message_case():
    big = random.Random(3).randbytes(3 << 20)
    msgs = [[b"before"], [b"head", big, b"tail"], [b"after"]]
    return big, msgs, peer(*msgs)


def test_three_mib_frame_grows_the_buffer_and_comes_out_whole():
    """A 3 MiB frame (over the 1 MiB buffer): whole and exact, then normal messages still work."""
    _, msgs, data = big_message_case()
    # whole, random chunks, and byte at a time at both ends (over all 3 MiB it would take seconds)
    edges = itertools.chain(itertools.repeat(1, 2000), [len(data) - 4000], itertools.repeat(1))
    for sizes in (None, random_sizes(5, 200_000), edges):
        conn = ZmtpConnection()
        out = feed(conn, data, sizes, [])
        assert out == msgs
        feed(conn, message(b"x", b"y") + message(b"z"), sizes, out)
        assert out[3:] == [[b"x", b"y"], [b"z"]] and conn.buffered == 0


def test_buffer_offers_room_for_the_whole_pending_frame():
    """Once a large frame's header is in, buffer() offers all the room its remaining bytes need."""
    big, _, data = big_message_case()
    cut = data.index(big) + 1000
    conn = ZmtpConnection()
    out = feed(conn, data[:cut], None, [])
    assert out == [[b"before"]]
    assert len(conn.buffer()) >= data.index(big) + len(big) - cut


def test_reads_stay_within_the_resting_size_while_a_grown_buffer_still_holds_data():
    """After a large frame, with a partial next frame still in the buffer (so it cannot shrink yet),
    a read is offered at most DEFAULT_BUFFER ahead, not the grown buffer's size."""
    _, msgs, data = big_message_case()
    conn = ZmtpConnection()
    assert feed(conn, data + PARTIAL, None, []) == msgs and conn.buffered == len(PARTIAL)
    assert len(conn.buffer()) <= DEFAULT_BUFFER


def test_buffer_returns_to_resting_size_after_a_large_frame():
    """After a large frame is taken out, reads are again bounded by DEFAULT_BUFFER."""
    # (failed before the fix in the same commit: the buffer kept the 3 MiB for good)
    _, msgs, data = big_message_case()
    conn = ZmtpConnection()
    assert feed(conn, data, None, []) == msgs and conn.buffered == 0
    assert len(conn.buffer()) <= DEFAULT_BUFFER


# -- max_count and partial messages ----------------------------------------------------------------


def test_max_count_leaves_the_rest_for_the_next_call():
    """messages(out, 3) takes at most 3; the rest come out later without more input."""
    conn = ZmtpConnection()
    feed(conn, peer(*[[b"m%d" % i] for i in range(5)]))
    out: list = []
    assert conn.messages(out, 3) == 3 and out == [[b"m0"], [b"m1"], [b"m2"]]
    assert conn.buffered == 2 * 4
    assert conn.messages(out, 3) == 2 and out[3:] == [[b"m3"], [b"m4"]]
    assert conn.messages(out, 3) == 0 and len(out) == 5 and conn.buffered == 0


def test_partial_message_waits_until_completed():
    """A multipart message cut inside its last frame stays until its bytes arrive."""
    wire = message(b"a", b"bb", b"ccc")
    conn = ZmtpConnection()
    out = feed(conn, peer() + wire[:-2], None, [])
    assert out == [] and conn.messages(out, ALL) == 0
    feed(conn, wire[-2:], None, out)
    assert out == [[b"a", b"bb", b"ccc"]]


def test_buffered_counts_bytes_not_yet_taken_out():
    """``buffered``: everything received before messages(), then only what is left after."""
    conn = ZmtpConnection()
    data = peer([b"one"], [b"two"]) + PARTIAL
    feed(conn, data)
    assert conn.buffered == len(data)
    out: list = []
    assert conn.messages(out, 1) == 1 and conn.buffered == len(message(b"two") + PARTIAL)
    assert conn.messages(out, ALL) == 1 and conn.buffered == len(PARTIAL)


def test_received_beyond_the_buffer_raises_local_protocol_error():
    """received() with more than buffer() offered (or a negative count) is our error."""
    conn = ZmtpConnection()
    room = len(conn.buffer())
    for bad in (room + 1, -1):
        with pytest.raises(LocalProtocolError, match="beyond the buffer"):
            conn.received(bad)
    conn.received(room)  # exactly the room given is fine


# -- handshake -------------------------------------------------------------------------------------


def test_greeting_split_after_the_signature():
    """The signature alone: no message, no error, still GREETING; the rest completes the handshake."""
    data = greeting(minor=1) + ready(b"ROUTER", (b"Identity", b""), (b"User-Id", b"Abc")) + message(b"m")
    conn = ZmtpConnection()
    out = feed(conn, data[:10], None, [])
    assert out == [] and conn.phase is Phase.GREETING and conn.peer_version is None
    feed(conn, data[10:GREETING_SIZE], None, out)
    assert conn.phase is Phase.HANDSHAKE and conn.peer_version == (3, 1)
    feed(conn, data[GREETING_SIZE:], None, out)
    assert conn.phase is Phase.READY and out == [[b"m"]]
    assert conn.peer_properties == {b"socket-type": b"ROUTER", b"identity": b"", b"user-id": b"Abc"}


@pytest.mark.parametrize("socket_type", [b"ROUTER", b"DEALER", b"REP"])
def test_compatible_peer_socket_types(socket_type):
    """A DEALER talks to ROUTER, DEALER and REP peers (RFC 28)."""
    conn, out = run(greeting() + ready(socket_type) + message(b"hi"))
    assert conn.phase is Phase.READY and out == [[b"hi"]] and conn.peer_version == (3, 0)


# -- PING / PONG -----------------------------------------------------------------------------------


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
def test_a_ping_between_two_frames_of_a_message_is_answered_and_leaves_the_message_whole(chunking):
    """libzmq writes a heartbeat PING whenever its timer fires, between frames of a message too: the
    message comes out whole and the PING is answered (a RemoteProtocolError before the review fix)."""
    data = AFTER_READY + frame(b"head", MORE) + command(b"PING", b"\x00\x0actx") + frame(b"body") + message(b"next")
    conn, out = run(data, chunking)
    assert out == [[b"head", b"body"], [b"next"]]
    assert conn.data_to_send().endswith(b"\x04\x08\x04PONGctx")




@pytest.mark.parametrize("chunking", ["whole", "bytes"])
def test_ping_is_answered_with_pong_carrying_its_context(chunking):
    """A PING (TTL, context) after READY queues a PONG with the same context; messages go on."""
    conn, out = run(peer([b"a"]) + command(b"PING", b"\x00\x64ctx-1") + message(b"b"), chunking)
    assert out == [[b"a"], [b"b"]]
    assert conn.data_to_send() == GOLDEN_GREETING + GOLDEN_READY + b"\x04\x0a\x04PONGctx-1"


def test_ping_without_context_and_long_ping():
    """An empty context gives a bare PONG; a PING in a LONG command frame gets a LONG PONG."""
    conn = ZmtpConnection()
    conn.data_to_send()
    ctx = b"c" * 300
    out = feed(conn, peer() + command(b"PING", b"\x00\x00") + command(b"PING", b"\x00\x01" + ctx), None, [])
    assert out == []
    assert conn.data_to_send() == b"\x04\x05\x04PONG" + b"\x06" + (305).to_bytes(8, "big") + b"\x04PONG" + ctx


def test_pong_and_unknown_commands_from_the_peer_are_ignored():
    """A PONG (or another command) from the peer: nothing sent, no message, no error."""
    conn = ZmtpConnection()
    conn.data_to_send()
    out = feed(conn, peer() + command(b"PONG", b"ctx") + command(b"SUBSCRIBE", b"x") + message(b"m"), None, [])
    assert out == [[b"m"]] and not conn.wants_to_send


# -- protocol errors -------------------------------------------------------------------------------

AFTER_READY = greeting() + ready()
ERRORS = {
    "first-byte-not-ff": (b"\x00" + greeting()[1:], "first byte is not the signature's 0xFF"),
    "zmtp-1.0-signature": (b"\xff" + b"\x00" * 8 + b"\x7e" + greeting()[10:], "ZMTP 1.0"),
    "zmtp-2-peer-v1": (greeting(major=1), r"version 1\.x"),
    "zmtp-2-peer-v2": (greeting(major=2), r"version 2\.x"),
    "mechanism-curve": (greeting(mechanism=b"CURVE"), "'CURVE'; only NULL"),
    "mechanism-plain": (greeting(mechanism=b"PLAIN"), "'PLAIN'; only NULL"),
    "peer-is-pub": (greeting() + ready(b"PUB"), "peer is a PUB, which a DEALER cannot talk to"),
    "peer-has-no-type": (greeting() + command(b"READY", props((b"Identity", b""))), "socket of no type"),
    "handshake-error": (greeting() + command(b"ERROR", b"\x0dAccess denied"), "refused the handshake: Access denied"),
    "message-before-ready": (greeting() + message(b"hi"), "flags 0x00 before its READY"),
    "more-command-before-ready": (greeting() + frame(b"\x05READY", COMMAND | MORE), "flags 0x05 before its READY"),
    "ping-before-ready": (greeting() + command(b"PING", b"\x00\x00"), "b'PING' where READY was due"),
    "ready-name-truncated": (greeting() + frame(b"\x05REA", COMMAND), "shorter than its name"),
    "ready-props-in-name": (greeting() + command(b"READY", b"\x0bSocket-Type\x00\x00"), "ends inside a name"),
    "ready-props-value": (greeting() + command(b"READY", b"\x0bSocket-Type\x00\x00\x00\x10ROUTER"),
                          "property value longer than the command"),
    "error-after-ready": (AFTER_READY + message(b"ok") + command(b"ERROR", b"\x07go away"), "peer sent ERROR: go away"),
    "reserved-bit-0x08": (AFTER_READY + b"\x08\x01x", "flags 0x08 set reserved bits"),
    "reserved-bit-0x80": (AFTER_READY + b"\x81\x01x", "flags 0x81 set reserved bits"),
    "ping-without-ttl": (AFTER_READY + command(b"PING", b"\x01"), "PING shorter than its TTL"),
    "empty-command-frame": (AFTER_READY + b"\x04\x00", "shorter than its name"),
}


@pytest.mark.parametrize("chunking", ["whole", "bytes"])
@pytest.mark.parametrize("case", list(ERRORS))
def test_peer_protocol_errors_are_named(case, chunking):
    """Each broken stream raises RemoteProtocolError naming the problem, however it arrives."""
    data, match = ERRORS[case]
    with pytest.raises(RemoteProtocolError, match=match):
        run(data, chunking)


def test_messages_before_an_error_are_delivered():
    """Messages complete before the offending frame are in ``out`` when the error is raised."""
    conn, out = ZmtpConnection(), []
    with pytest.raises(RemoteProtocolError, match="go away"):
        feed(conn, peer([b"a"], [b"b", b"c"]) + command(b"ERROR", b"\x07go away"), None, out)
    assert out == [[b"a"], [b"b", b"c"]]


def test_long_frame_over_max_frame_raises_at_its_header():
    """A LONG frame announcing more than max_frame is refused as soon as its size is read."""
    data = AFTER_READY + b"\x02" + (1001).to_bytes(8, "big")  # no body needed
    for chunking in ("whole", "bytes"):
        with pytest.raises(RemoteProtocolError, match="1001 bytes announced, over the limit of 1000"):
            run(data, chunking, max_frame=1000)
    _, out = run(AFTER_READY + message(b"m" * 1000), max_frame=1000)  # the limit itself is allowed
    assert out == [[b"m" * 1000]]


def test_ready_over_max_frame_is_refused():
    """A READY announced (LONG) larger than max_frame is refused too."""
    data = greeting() + ready(b"ROUTER", (b"Identity", b"i" * 500))
    with pytest.raises(RemoteProtocolError, match="READY of 541 bytes announced"):
        run(data, max_frame=300)


# -- fuzz: parses, or raises RemoteProtocolError, nothing else ---------------------------------------


def outcome(data: bytes, sizes) -> tuple:
    conn, out = ZmtpConnection(max_frame=1 << 16), []
    conn.data_to_send()
    try:
        feed(conn, data, sizes, out)
        error = None
    except RemoteProtocolError as exc:  # anything else fails the test
        error = str(exc)
    return out, conn.data_to_send(), error, conn.phase


def test_fuzz_random_bytes_after_the_handshake():
    """Random bytes after a valid greeting+READY: parse or RemoteProtocolError, the same in bytes."""
    for seed in range(1000):
        rng = random.Random(seed)
        data = AFTER_READY + rng.randbytes(rng.randint(0, 80))
        assert outcome(data, None) == outcome(data, itertools.repeat(1)), seed


def mutated(valid: bytes, seed: int) -> bytes:
    """``valid`` with 1 to 4 random changes: a byte replaced or flipped, inserted or cut out."""
    rng = random.Random(seed)
    data = bytearray(valid)
    for _ in range(rng.randint(1, 4)):
        op, at = rng.randrange(4), rng.randrange(len(data))
        if op == 0:
            data[at] = rng.randrange(256)
        elif op == 1:
            data[at] ^= 1 << rng.randrange(8)
        elif op == 2:
            data.insert(at, rng.randrange(256))
        else:
            del data[at:at + rng.randint(1, 10)]
    return bytes(data)


def test_fuzz_mutated_valid_streams():
    """Random mutations of a valid stream: parse or RemoteProtocolError, same in random chunks."""
    valid = (greeting(minor=1) + ready(b"ROUTER", (b"Identity", b"")) + message(b"a", b"", b"bc")
             + command(b"PING", b"\x00\x10ctx") + message(b"L" * 300) + message(b"") + message(b"x", b"y" * 256))
    assert outcome(valid, None)[2] is None
    for seed in range(1000):
        data = mutated(valid, seed)
        assert outcome(data, None) == outcome(data, random_sizes(seed, 16)), seed


# -- two-frame messages by columns (columns(heads, ends, body)) --------------------------------------


def take_columns(conn: ZmtpConnection, out: list, max_count: int = ALL) -> None:
    """``columns`` until it returns None, each call with a new ``BodyBuffer`` holding a few bytes
    already (what was there stays in front); the messages in order into ``out`` as ``(frames,
    how)``: a two-frame message read back from its buffer (``"col"``), or another returned whole
    (``"other"``). Checks that each call's ends tile its buffer after what it held, in order."""
    while True:
        body = BodyBuffer()
        body.append(b"before")
        heads: list = []
        ends = array("q")
        try:
            other = conn.columns(heads, ends, body, max_count)
        finally:  # what was taken before an error stays taken (the caller's lists hold it)
            assert len(heads) == len(ends) and list(ends) == sorted(ends)
            assert (ends[-1] if ends else 6) == body.fill and bytes(body.data[:6]) == b"before"
            begin = 6
            for head, end in zip(heads, ends):
                assert isinstance(head, bytes)
                out.append(([head, bytes(body.data[begin:end])], "col"))
                begin = end
        if other is None:
            return
        assert all(isinstance(f, bytes) for f in other)
        out.append((other, "other"))


def fed(msgs: list) -> tuple:
    """A connection that has received ``msgs`` (nothing taken yet), and empty columns to take them into."""
    conn = ZmtpConnection()
    feed(conn, peer(*msgs))
    return conn, [], array("q"), BodyBuffer()


def columns_outcome(data: bytes, sizes, max_frame: int = 1 << 16) -> tuple:
    """Messages and the error as ``outcome``'s (``max_frame`` as there), taken by ``take_columns``
    after each chunk; and how each came."""
    conn = ZmtpConnection(max_frame=max_frame)
    taken: list = []
    try:
        feed(conn, data, sizes, taken, lambda out: take_columns(conn, out))
        error = None
    except RemoteProtocolError as exc:
        error = str(exc)
    return [m for m, _ in taken], error, [how for _, how in taken]


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
def test_messages_taken_by_columns_come_out_the_same(chunking):
    """Two-frame messages come by columns, the rest whole, in their order; read back, the messages
    equal those of the plain parse however the stream is cut. A two-frame message is never taken
    in parts: whatever the cut, every one (short first frame) comes by columns."""
    msgs = [[b"h%d" % i] + [bytes([i % 251]) * (i * 37 % 700) for _ in range(i % 4)] for i in range(300)]
    msgs += [[b"h", b"x" * 70_000, b""], [b"h", b"y" * 70_000], [b"L" * 256, b"long head"]]
    got, error, how = columns_outcome(peer(*msgs), CHUNKINGS[chunking](), max_frame=1 << 20)
    assert error is None and got == msgs
    assert how == ["col" if len(m) == 2 and len(m[0]) <= 255 else "other" for m in msgs]


def test_a_two_frame_message_not_all_received_stays_in_the_buffer_whole():
    """Its first frame whole, its second not: nothing is taken (no partial message held), and the
    buffer makes room for all of it; the rest arrives and it comes by columns."""
    wire = message(b"head", b"z" * 100_000)
    conn = ZmtpConnection()
    feed(conn, peer([b"h0", b"done"]) + wire[:5000])
    taken: list = []
    take_columns(conn, taken)
    assert taken == [([b"h0", b"done"], "col")] and conn.buffered == 5000
    assert len(conn.buffer()) >= len(wire) - 5000
    feed(conn, wire[5000:])
    take_columns(conn, taken)
    assert taken[1] == ([b"head", b"z" * 100_000], "col") and conn.buffered == 0


def test_a_repeated_first_frame_is_handed_out_as_the_same_object():
    """Consecutive two-frame messages whose first frames hold the same bytes share one ``bytes``
    object (the Malamute receiver then looks their header up once); another header in between
    gets its own."""
    msgs = [[b"header-a", b"x" * 300], [b"header-a", b"y"], [b"header-b", b"z" * 5],
            [b"header-a", b""], [b"header-a", b"w" * 1000]]
    conn, heads, ends, body = fed(msgs)
    assert conn.columns(heads, ends, body, ALL) is None
    assert heads == [m[0] for m in msgs] and list(ends) == [300, 301, 306, 306, 1306]
    assert bytes(body) == b"".join(m[1] for m in msgs)
    assert heads[0] is heads[1] and heads[3] is heads[4] and heads[2] is not heads[3]


@pytest.mark.parametrize("flags", [0x01, 0x04, 0x05, 0x06, 0x08, 0x80])
def test_a_last_frame_with_other_flags_is_left_to_the_frame_by_frame_parse(flags):
    """After a short first frame with MORE, columns take only a last frame flagged 0x00 or 0x02:
    MORE (a third frame follows), COMMAND and reserved bits go the general way, with the plain
    parse's outcome (a third frame, a PONG answered... or the error that names the flags)."""
    second = bytes((flags, 3)) + b"abc" if not flags & LONG else bytes((flags,)) + (3).to_bytes(8, "big") + b"abc"
    rest = frame(b"end") if flags & MORE else b""
    data = peer([b"ok", b"body"]) + frame(b"hdr", MORE) + second + rest + message(b"after", b"x")
    plain = outcome(data, None)
    assert columns_outcome(data, None)[:2] == (plain[0], plain[2])
    assert columns_outcome(data, itertools.repeat(1))[:2] == (plain[0], plain[2])
    if flags & 0xF8:
        assert plain[2] is not None and "reserved" in plain[2]


def test_max_count_stops_the_columns_and_the_rest_follows_in_order():
    """``max_count`` below the messages waiting: columns take that many, the next call the rest,
    in order, into the same buffer after the first ones."""
    msgs = [[b"h", b"m%d" % i] for i in range(10)]
    conn, heads, ends, body = fed(msgs)
    assert conn.columns(heads, ends, body, 4) is None and len(heads) == 4 and body.fill == 8
    assert conn.columns(heads, ends, body, ALL) is None and len(heads) == 10
    assert list(ends) == [2 * i + 2 for i in range(10)] and bytes(body) == b"".join(m[1] for m in msgs)


def test_a_message_of_another_shape_ends_the_call_and_comes_whole():
    """Columns stop at a message of another shape: it is returned, nothing after it taken (the
    caller acts on it in order), and the next call goes on by columns."""
    conn = ZmtpConnection()
    feed(conn, peer([b"h", b"one"], [b"solo"], [b"h", b"two"]))
    heads: list = []
    ends = array("q")
    body = BodyBuffer()
    assert conn.columns(heads, ends, body, ALL) == [b"solo"]
    assert heads == [b"h"] and bytes(body) == b"one"
    assert conn.columns(heads, ends, body, ALL) is None
    assert heads == [b"h", b"h"] and bytes(body) == b"onetwo" and list(ends) == [3, 6]


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
def test_two_frame_messages_around_commands_and_longer_messages_come_out_the_same(chunking):
    """Columns give way to the frame-by-frame parse for anything else (a PING between the two
    frames or between messages, three frames, a long first frame, a one-frame message), with the
    same messages and the PINGs answered."""
    ping = command(b"PING", b"\x00\x0actx")
    parts = [message(b"h", b"one"), frame(b"h", MORE) + ping + frame(b"two"), ping, message(b"h", b"a", b"b"),
             message(b"H" * 300, b"long head"), message(b"single"), message(b"h", b"L" * 70_000),
             message(b"h", b"three")]
    expected = [[b"h", b"one"], [b"h", b"two"], [b"h", b"a", b"b"], [b"H" * 300, b"long head"], [b"single"],
                [b"h", b"L" * 70_000], [b"h", b"three"]]
    conn = ZmtpConnection()
    taken = feed(conn, peer() + b"".join(parts), CHUNKINGS[chunking](), [], lambda out: take_columns(conn, out))
    assert [m for m, _ in taken] == expected
    assert conn.data_to_send().count(b"PONG") == 2


def test_a_last_frame_over_max_frame_raises_in_a_two_frame_message():
    """The size check holds for columns: a two-frame message whose last frame announces more than
    ``max_frame`` raises at that frame's header, the message before it delivered."""
    # the whole frame is there: without the check, the columns would take the message
    data = peer([b"ok", b"fine"]) + frame(b"head", MORE) + b"\x02" + (1001).to_bytes(8, "big") + b"x" * 1001
    taken, error, _ = columns_outcome(data, None, max_frame=1000)
    assert taken == [[b"ok", b"fine"]]
    assert error is not None and "1001" in error


FUZZ_STREAMS = {  # name -> (a valid stream, the largest random chunk)
    # two-frame messages of changing sizes (no runs), then three frames
    "sizes": (peer(*[[b"hdr", b"v" * (i * 97 % 400)] for i in range(12)], [b"a", b"b", b"c"]), 16),
    # runs of one shape (taken by numpy), broken by three frames and by another size
    "runs": (peer(*[[b"mailbox", b"v" * 40]] * 60, [b"a", b"b", b"c"], *[[b"mailbox", b"w" * 300]] * 20), 300),
}


@pytest.mark.parametrize("stream", list(FUZZ_STREAMS))
def test_fuzz_mutated_two_frame_streams_by_columns(stream):
    """Mutations of a stream of two-frame messages: taken by columns, whole or in random chunks,
    the same messages and error as the plain parse."""
    valid, chunk = FUZZ_STREAMS[stream]
    assert columns_outcome(valid, None)[:2] == (outcome(valid, None)[0], None)
    for seed in range(500):
        data = mutated(valid, seed)
        plain, _, error, _ = outcome(data, None)
        assert columns_outcome(data, None)[:2] == (plain, error), seed
        assert columns_outcome(data, random_sizes(seed, chunk))[:2] == (plain, error), seed


# -- runs: messages of one shape checked and copied together (numpy) ---------------------------------


@pytest.fixture
def runs(monkeypatch):
    """The messages ``columns`` took as runs (after the message each run repeats), one count per run."""
    taken: list = []
    real = zmtp._take_run

    def counted(*args):
        got = real(*args)
        taken.append(got)
        return got

    monkeypatch.setattr(zmtp, "_take_run", counted)
    return taken


def run_stream(n: int = 400) -> list:
    """Runs of repeated messages broken by every kind of difference: another body size, another
    header of the same length, a byte changed inside the header, a long second frame, an empty
    one, three frames, a one-frame message."""
    same = [b"mailbox-deliver", b"body-0004"]
    msgs = [same] * n
    msgs += [[b"mailbox-deliver", b"body-05"]] + [same] * 50
    msgs += [[b"mailbox-delivez", b"body-0004"]] + [same] * 50          # last header byte differs
    msgs += [[b"Mailbox-deliver", b"body-0004"]] + [same] * 50          # first header byte differs
    msgs += [[b"mailbox-deliver", b"L" * 300]] * 40 + [same] * 20      # long frames (8-byte size)
    msgs += [[b"mailbox-deliver", b"M" * 300]] + [[b"mailbox-deliver", b"L" * 301]] * 30
    msgs += [[b"mailbox-deliver", b""]] * 30 + [[b"x", b"y", b"z"]] + [same] * 30 + [[b"solo"]] + [same] * 30
    return msgs


@pytest.mark.parametrize("chunking", list(CHUNKINGS))
def test_runs_of_one_shape_come_out_as_the_plain_parse_however_broken(chunking, runs):
    """Runs of messages with the same framing and header, broken in every way a message can differ
    from the one before, cut at any read boundary: the same messages as the plain parse, each
    two-frame one by columns; and (read whole) most of them went by runs."""
    msgs = run_stream()
    got, error, how = columns_outcome(peer(*msgs), CHUNKINGS[chunking](), max_frame=1 << 20)
    assert error is None and got == msgs
    assert how == ["col" if len(m) == 2 else "other" for m in msgs]
    if chunking == "whole":
        assert sum(runs) > len(msgs) // 2  # after a break, the loop takes up to 64 before the next try


def test_a_run_that_differs_only_in_a_body_byte_is_still_a_run(runs):
    """Only framing and the first frame make a run: bodies of the same size may hold anything, and
    each comes out as sent."""
    msgs = [[b"h", bytes([i % 256]) * 4096] for i in range(500)]
    conn, heads, ends, body = fed(msgs)
    while conn.columns(heads, ends, body, ALL) is None and len(heads) < len(msgs):
        feed(conn, b"")
    assert len(heads) == 500 and all(h is heads[0] for h in heads)
    assert list(ends) == [4096 * (i + 1) for i in range(500)]
    assert bytes(body) == b"".join(m[1] for m in msgs)
    assert max(runs) >= 200  # whole reads of 1 MiB: each is one run after its first message


def test_a_run_of_empty_second_frames(runs):
    """Second frames of no bytes make a run too: every end is the same."""
    msgs = [[b"h", b""]] * 100 + [[b"h", b"x"]]
    conn, heads, ends, body = fed(msgs)
    assert conn.columns(heads, ends, body, ALL) is None
    assert len(heads) == 101 and list(ends) == [0] * 100 + [1] and bytes(body) == b"x"
    assert runs[0] == 99


def test_max_count_cuts_a_run_and_the_next_call_goes_on(runs):
    """``max_count`` inside a run: exactly that many, then the rest, in order."""
    msgs = [[b"h", b"m%03d" % i] for i in range(100)]
    conn, heads, ends, body = fed(msgs)
    assert conn.columns(heads, ends, body, 37) is None and len(heads) == 37 and body.fill == 37 * 4
    assert conn.columns(heads, ends, body, ALL) is None and len(heads) == 100
    assert list(ends) == [4 * (i + 1) for i in range(100)] and bytes(body) == b"".join(m[1] for m in msgs)
    assert 36 in runs


def test_runs_resume_after_messages_that_all_differ(runs):
    """Thousands of messages that each differ from the one before (the loop takes them, trying for
    a run less and less often: 64, 128, ... up to 1,024 messages apart), then a run: it goes by
    runs again after 1,024 messages at most."""
    msgs = [[b"h%d" % (i % 2), b"body"] for i in range(5000)] + [[b"h", b"body"]] * 3000
    conn = ZmtpConnection()
    taken = feed(conn, peer(*msgs), None, [], lambda out: take_columns(conn, out))
    assert [m for m, _ in taken] == msgs
    short = [r for r in runs if r < 8]
    assert len(short) < 20  # not at each message
    assert sum(r for r in runs if r >= 8) >= 3000 - 1024 - 1

