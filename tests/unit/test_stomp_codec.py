"""STOMP 1.0 frame codec: golden frames, the three-way parser check, bad input, and a fuzz test."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_mq.errors import LocalProtocolError, RemoteProtocolError
from spark_mq.protocol.stomp10 import (
    Command,
    Frame,
    FrameParser,
    FrameTooLargeError,
    IncompleteFrameError,
    StompError,
    StompLocalProtocolError,
    StompRemoteProtocolError,
    client_frame_parser,
    encode_frame,
)
from spark_mq.protocol.stomp10._frame import escape_value, unescape_value

# -- golden frames: (bytes on the wire, the frame they are) ---------------------------------------
SERVER_GOLDEN = [
    (b"CONNECTED\nsession:abc-1\n\n\x00", Frame(Command.CONNECTED, {"session": "abc-1"})),
    (
        b"MESSAGE\ndestination:/queue/a\nmessage-id:m:1:2\n\nhello queue a\x00",
        Frame(Command.MESSAGE, {"destination": "/queue/a", "message-id": "m:1:2"}, b"hello queue a"),
    ),
    (
        b"MESSAGE\ndestination:/queue/b\nmessage-id:7\ncontent-length:5\n\na\x00b\x00c\x00",
        Frame(Command.MESSAGE, {"destination": "/queue/b", "message-id": "7", "content-length": "5"}, b"a\x00b\x00c"),
    ),
    (b"RECEIPT\nreceipt-id:message-12345\n\n\x00", Frame(Command.RECEIPT, {"receipt-id": "message-12345"})),
    (
        b"ERROR\nmessage:malformed packet received\n\nThe message:\n-----\nMESSAGE\n\x00",
        Frame(Command.ERROR, {"message": "malformed packet received"}, b"The message:\n-----\nMESSAGE\n"),
    ),
    # header values keep colons and spaces verbatim (no escaping, no trimming in 1.0)
    (
        b"MESSAGE\ndestination:/queue/a\nmessage-id:1\nx-url:http://h:80/p\nx-sp: v \n\n\x00",
        Frame(Command.MESSAGE, {"destination": "/queue/a", "message-id": "1", "x-url": "http://h:80/p", "x-sp": " v "}),
    ),
    # a value with a backslash is kept as is: 1.0 has no escapes
    (
        b"MESSAGE\ndestination:/queue/a\nmessage-id:1\nx:a\\cb\n\n\x00",
        Frame(Command.MESSAGE, {"destination": "/queue/a", "message-id": "1", "x": "a\\cb"}),
    ),
]

CLIENT_GOLDEN = [
    (Command.CONNECT, [("login", "guest"), ("passcode", "pw")], b"", b"CONNECT\nlogin:guest\npasscode:pw\n\n\x00"),
    (Command.SEND, [("destination", "/queue/a")], b"hello", b"SEND\ndestination:/queue/a\ncontent-length:5\n\nhello\x00"),
    (Command.SUBSCRIBE, [("destination", "/queue/foo"), ("ack", "client")], b"", b"SUBSCRIBE\ndestination:/queue/foo\nack:client\n\n\x00"),
    (Command.UNSUBSCRIBE, [("id", "s1")], b"", b"UNSUBSCRIBE\nid:s1\n\n\x00"),
    (Command.BEGIN, [("transaction", "tx1")], b"", b"BEGIN\ntransaction:tx1\n\n\x00"),
    (Command.COMMIT, [("transaction", "tx1")], b"", b"COMMIT\ntransaction:tx1\n\n\x00"),
    (Command.ABORT, [("transaction", "tx1")], b"", b"ABORT\ntransaction:tx1\n\n\x00"),
    (Command.ACK, [("message-id", "m1"), ("transaction", "tx1")], b"", b"ACK\nmessage-id:m1\ntransaction:tx1\n\n\x00"),
    (Command.DISCONNECT, [("receipt", "bye")], b"", b"DISCONNECT\nreceipt:bye\n\n\x00"),
]


@pytest.mark.parametrize("command,headers,body,wire", CLIENT_GOLDEN, ids=[c[0].value for c in CLIENT_GOLDEN])
def test_encode_client_golden(command, headers, body, wire):
    assert encode_frame(command, headers, body) == wire
    # and it reads back as the same frame (client-side parser)
    (frame,) = client_frame_parser().feed(wire)
    assert frame.command is command
    assert frame.body == body
    for name, value in headers:
        assert frame.headers[name] == value


def _parse_whole(wire: bytes) -> list:
    return FrameParser().feed(wire)


def _parse_bytewise(wire: bytes) -> list:
    parser = FrameParser()
    out = []
    for i in range(len(wire)):
        out.extend(parser.feed(wire[i : i + 1]))
    assert parser.buffered == 0
    return out


@pytest.mark.parametrize("wire,expected", SERVER_GOLDEN)
def test_parse_golden_three_ways(wire, expected):
    assert _parse_whole(wire) == [expected]
    assert _parse_bytewise(wire) == [expected]
    # with trailing data: the frame, the LFs brokers add, and the start of the next frame
    parser = FrameParser()
    assert parser.feed(wire + b"\n\nRECEIPT\nrece") == [expected]
    assert parser.buffered == len(b"RECEIPT\nrece")
    assert parser.feed(b"ipt-id:x\n\n\x00") == [Frame(Command.RECEIPT, {"receipt-id": "x"})]


def test_stream_of_all_golden_frames_whole_and_bytewise():
    wire = b"\n".join(w for w, _ in SERVER_GOLDEN) + b"\n\n\n"
    expected = [f for _, f in SERVER_GOLDEN]
    assert _parse_whole(wire) == expected
    assert _parse_bytewise(wire) == expected


def test_repeated_header_first_wins():
    (frame,) = _parse_whole(b"MESSAGE\ndestination:/queue/a\nmessage-id:1\nx:first\nx:second\n\n\x00")
    assert frame.headers["x"] == "first"


def test_repeated_content_length_first_wins():
    (frame,) = _parse_whole(b"MESSAGE\ndestination:/q\nmessage-id:1\ncontent-length:3\ncontent-length:1\n\na\x00b\x00")
    assert frame.body == b"a\x00b"


def test_large_binary_body_in_chunks():
    body = bytes(range(256)) * 40000  # 10 MB with NULs everywhere
    wire = encode_frame(Command.MESSAGE, {"destination": "/q", "message-id": "1"}, body)
    parser = FrameParser()
    frames = []
    for i in range(0, len(wire), 65536):
        frames.extend(parser.feed(wire[i : i + 65536]))
    assert len(frames) == 1 and frames[0].body == body


# -- bad input: a clear error naming frame and header ----------------------------------------
BAD = [
    (b"HELLO\n\n\x00", "unknown command", None, None),
    (b"SEND\ndestination:/q\n\n\x00", "from this side", "SEND", None),
    (b"MESSAGE\nmessage-id:1\n\n\x00", "missing required header", "MESSAGE", "destination"),
    (b"MESSAGE\ndestination:/q\n\n\x00", "missing required header", "MESSAGE", "message-id"),
    (b"RECEIPT\n\n\x00", "missing required header", "RECEIPT", "receipt-id"),
    (b"MESSAGE\ndestination:/q\nmessage-id:1\ncontent-length:9\n\nabc\x00MESSAGE\n\n", "not followed by the NUL", "MESSAGE", "content-length"),
    (b"MESSAGE\ndestination:/q\nmessage-id:1\ncontent-length:x1\n\nabc\x00", "not a byte count", "MESSAGE", "content-length"),
    (b"MESSAGE\ndestination:/q\nmessage-id:1\ncontent-length:-1\n\n\x00", "not a byte count", "MESSAGE", "content-length"),
]


@pytest.mark.parametrize("wire,text,command,header", BAD)
def test_bad_frames_raise_remote_protocol_error(wire, text, command, header):
    for feed in (_parse_whole, _parse_bytewise):
        with pytest.raises(StompRemoteProtocolError) as info:
            feed(wire)
        assert text in str(info.value)
        assert info.value.command == command
        assert info.value.header == header


def test_unknown_command_detected_before_frame_completes():
    parser = FrameParser()
    with pytest.raises(StompRemoteProtocolError, match="unknown command"):
        parser.feed(b"GARBAGE\nsome:header\n")


def test_frames_before_bad_bytes_are_not_lost():
    good = b"RECEIPT\nreceipt-id:1\n\n\x00\nMESSAGE\ndestination:/q\nmessage-id:9\n\nx\x00"
    parser = FrameParser()
    with pytest.raises(StompRemoteProtocolError):
        parser.feed(good + b"\nBOGUS\n\n\x00")
    salvaged = parser.take_parsed()
    assert [f.command for f in salvaged] == [Command.RECEIPT, Command.MESSAGE]
    assert salvaged[1].body == b"x"
    with pytest.raises(StompRemoteProtocolError):  # a failed parser stays failed
        parser.feed(b"RECEIPT\nreceipt-id:2\n\n\x00")


def test_header_bytes_not_utf8_are_kept_and_written_back_as_they_came():
    """Issue 43, item 7: RabbitMQ passes such bytes through; failing the frame dropped the connection
    at every redelivery of the message."""
    wire = b"MESSAGE\ndestination:/q\nmessage-id:1\nx-bad:ab\xff\xfecd\n\nbody\x00"
    (frame,) = FrameParser().feed(wire)
    assert frame.headers["x-bad"] == "ab\udcff\udcfecd" and frame.body == b"body"
    assert frame.headers["x-bad"].encode("utf-8", "surrogateescape") == b"ab\xff\xfecd"
    assert encode_frame(Command.MESSAGE, frame.headers, frame.body) == \
        b"MESSAGE\ndestination:/q\nmessage-id:1\nx-bad:ab\xff\xfecd\ncontent-length:4\n\nbody\x00"


def test_a_header_line_without_colon_is_kept_as_a_name_without_value():
    wire = b"MESSAGE\ndestination:/q\nmessage-id:1\nno colon here\n:empty-name\n\nb\x00MESSAGE\ndestination:/q\nmessage-id:2\n\nc\x00"
    first, second = FrameParser().feed(wire)
    assert first.headers == {"destination": "/q", "message-id": "1", "no colon here": None, "": "empty-name"}
    assert first.body == b"b" and second.headers["message-id"] == "2"


def test_a_message_above_the_bound_by_content_length_is_skipped_not_buffered():
    parser = FrameParser(max_frame_size=1000)
    head = b"MESSAGE\ndestination:/q\nmessage-id:1\ncontent-length:5000\n\n"
    assert parser.feed(head) == []
    assert parser.feed(b"x" * 3000) == [] and parser.buffered < 1000  # skipped as it comes
    (big, after) = parser.feed(b"x" * 2000 + b"\x00\nMESSAGE\ndestination:/q\nmessage-id:2\n\nok\x00")
    assert big.oversize == len(head) + 5000 + 1 and big.body == b"" and big.headers["message-id"] == "1"
    assert after.oversize == 0 and after.body == b"ok"


def test_a_message_above_the_bound_without_nul_is_skipped_to_its_nul():
    parser = FrameParser(max_frame_size=1000)
    head = b"MESSAGE\ndestination:/q\nmessage-id:1\n\n"
    parser.feed(head + b"x" * 900)
    assert parser.feed(b"x" * 200) == [] and parser.buffered == 0
    (big,) = parser.feed(b"x" * 100 + b"\x00")
    assert big.oversize == len(head) + 1200 + 1 and big.body == b""
    with pytest.raises(IncompleteFrameError):
        parser.feed(head + b"x" * 2000)
        parser.feed_eof()


def test_other_frames_above_the_bound_still_fail():
    parser = FrameParser(max_frame_size=1000)
    with pytest.raises(FrameTooLargeError) as info:
        parser.feed(b"ERROR\nmessage:x\ncontent-length:5000\n\n")
    assert info.value.header == "content-length"


def test_oversized_headers():
    parser = FrameParser(max_frame_size=1000)
    parser.feed(b"MESSAGE\n")
    with pytest.raises(FrameTooLargeError):
        parser.feed(b"x-h:" + b"y" * 2000)


def test_frame_at_the_bound_passes():
    wire = encode_frame(Command.MESSAGE, {"destination": "/q", "message-id": "1"}, b"z" * 900)
    assert FrameParser(max_frame_size=len(wire)).feed(wire)[0].body == b"z" * 900


def test_eof_mid_frame_is_reported():
    parser = FrameParser()
    assert parser.feed(b"RECEIPT\nreceipt-id:1\n\n\x00\nMESSAGE\ndestination:/q\nmessage-id:1\ncontent-length:10\n\nabc") == [
        Frame(Command.RECEIPT, {"receipt-id": "1"})
    ]
    with pytest.raises(IncompleteFrameError) as info:
        parser.feed_eof()
    assert info.value.command == "MESSAGE"
    assert isinstance(info.value, RemoteProtocolError)


def test_eof_in_headers_and_clean_eof():
    parser = FrameParser()
    parser.feed(b"MESSA")
    with pytest.raises(IncompleteFrameError):
        parser.feed_eof()
    clean = FrameParser()
    clean.feed(b"RECEIPT\nreceipt-id:1\n\n\x00\n\n")
    clean.feed_eof()  # only inter-frame newlines left: not an error


# -- encoder refusals ---------------------------------------------------------------------
def test_encoder_refuses_what_10_cannot_say():
    with pytest.raises(StompLocalProtocolError) as info:
        encode_frame(Command.SEND, {"destination": "/q", "x": "a\nb"})
    assert info.value.header == "x" and isinstance(info.value, LocalProtocolError)
    with pytest.raises(StompLocalProtocolError):
        encode_frame(Command.SEND, {"destination": "/q", "a:b": "v"})
    with pytest.raises(StompLocalProtocolError, match="NUL"):
        encode_frame(Command.SEND, {"destination": "/q"}, b"a\x00b", content_length=False)
    with pytest.raises(StompLocalProtocolError, match="does not match"):
        encode_frame(Command.SEND, {"destination": "/q", "content-length": "2"}, b"abc")


def test_encoder_header_value_with_colons_and_no_content_length_for_text():
    wire = encode_frame(Command.SEND, {"destination": "/q", "x": "a:b:c"}, b"text", content_length=False)
    assert wire == b"SEND\ndestination:/q\nx:a:b:c\n\ntext\x00"


def test_error_frame_becomes_exception():
    (frame,) = _parse_whole(b"ERROR\nmessage:Unknown destination\ncontent-length:7\n\nde\x00tail\x00")
    error = frame.to_error()
    assert isinstance(error, StompError)
    assert error.message == "Unknown destination"
    assert error.body == b"de\x00tail"
    assert "Unknown destination" in str(error)


def test_passcode_hidden_in_repr():
    frame = Frame(Command.CONNECT, {"login": "u", "passcode": "s3cret"})
    assert "s3cret" not in repr(frame)


@pytest.mark.parametrize("value", ["plain", "a\\b", "v:w", "\\c\\n\\\\", "end\\"])
def test_escape_round_trip(value):
    assert unescape_value(escape_value(value).replace(":", "\\c")) == value


# -- fuzz: parses, or raises RemoteProtocolError, nothing else -----------------------------
_frames = st.builds(
    lambda cmd, hdrs, body, cl: encode_frame(cmd, hdrs, body, content_length=cl or b"\x00" in body),
    st.sampled_from([Command.MESSAGE, Command.RECEIPT, Command.ERROR, Command.CONNECTED]),
    st.dictionaries(
        st.text(st.characters(blacklist_characters=":\n\r", blacklist_categories=("Cs",)), min_size=1, max_size=8),
        st.text(st.characters(blacklist_characters="\n", blacklist_categories=("Cs",)), max_size=12),
        max_size=4,
    ).map(lambda d: {"destination": "/q", "message-id": "1", "receipt-id": "r", **d}),
    st.binary(max_size=64),
    st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(_frames, st.binary(max_size=40)), max_size=6), st.integers(1, 50))
def test_fuzz_parse_or_remote_protocol_error(pieces, chunk):
    wire = b"".join(pieces)
    parser = FrameParser(max_frame_size=4096)
    try:
        for i in range(0, len(wire), chunk):
            for frame in parser.feed(wire[i : i + chunk]):
                assert isinstance(frame, Frame)
        parser.feed_eof()
    except RemoteProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.lists(_frames, min_size=1, max_size=5), st.integers(1, 30))
def test_fuzz_valid_streams_parse_the_same_in_any_chunking(frames, chunk):
    wire = b"\n".join(frames)
    whole = FrameParser().feed(wire)
    parser = FrameParser()
    pieces = []
    for i in range(0, len(wire), chunk):
        pieces.extend(parser.feed(wire[i : i + chunk]))
    assert pieces == whole
    assert len(whole) == len(frames)
