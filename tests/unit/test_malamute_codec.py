"""Malamute codec: golden frames for all 18 messages, round trips, malformed input, decoder fuzzing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_mq.errors import LocalProtocolError, RemoteProtocolError
from spark_mq.protocol.malamute import codec
from spark_mq.protocol.malamute.codec import MessageId

H = bytes.fromhex

# (message, header hex, content frames). The first two are the hex examples of malamute-observed.md;
# the others are hand-assembled from mlm_proto.bnf and the observed differences (status = n2 + string).
GOLDEN = [
    (codec.ConnectionOpen("ala6"), "aaa8 01 08 4d414c414d555445 0001 04 616c6136", []),
    (codec.Ok(200, ""), "aaa8 0e 00c8 00", []),
    (codec.ConnectionPing(), "aaa8 02", []),
    (codec.ConnectionPong(), "aaa8 03", []),
    (codec.ConnectionClose(), "aaa8 04", []),
    (codec.StreamWrite("s1"), "aaa8 05 02 7331", []),
    (codec.StreamRead("s1", "^a"), "aaa8 06 02 7331 02 5e61", []),
    (codec.StreamSend("subj", [b"x", b""]), "aaa8 07 04 7375626a", [b"x", b""]),
    (codec.StreamDeliver("s1", "me", "t", [b"body"]), "aaa8 08 02 7331 02 6d65 01 74", [b"body"]),
    (codec.MailboxSend("bob", "hi", "tr", 1000, [b"a"]), "aaa8 09 03 626f62 02 6869 02 7472 000003e8", [b"a"]),
    (codec.MailboxDeliver("me", "bob", "hi", "", []), "aaa8 0a 02 6d65 03 626f62 02 6869 00", []),
    (codec.ServiceSend("svc", "q", "", 0, [b"r"]), "aaa8 0b 03 737663 01 71 00 00000000", [b"r"]),
    (codec.ServiceOffer("svc", ""), "aaa8 0c 03 737663 00", []),
    (codec.ServiceDeliver("me", "svc", "q", "t", [b"r", b"s"]), "aaa8 0d 02 6d65 03 737663 01 71 01 74", [b"r", b"s"]),
    (codec.Error(500, "no"), "aaa8 0f 01f4 02 6e6f", []),
    (codec.Credit(10), "aaa8 10 000a", []),
    (codec.Confirm("t", 300, ""), "aaa8 11 01 74 012c 00", []),
    (codec.StreamCancel("s1"), "aaa8 12 02 7331", []),
]


def test_golden_covers_all_18_messages():
    assert {type(m).ID for m, _, _ in GOLDEN} == set(MessageId)
    assert len(MessageId) == 18


@pytest.mark.parametrize("message,header,content", GOLDEN, ids=[type(m).__name__ for m, _, _ in GOLDEN])
def test_golden_encode_and_decode(message, header, content):
    frames = [H(header), *content]
    assert codec.encode(message) == frames
    decoded = codec.decode(frames)
    assert decoded == message if not message.HAS_CONTENT else (
        decoded.__class__ is message.__class__ and list(decoded.content) == list(message.content))


@pytest.mark.parametrize("message,header,content", GOLDEN, ids=[type(m).__name__ for m, _, _ in GOLDEN])
def test_every_truncation_of_a_header_is_rejected(message, header, content):
    raw = H(header)
    for cut in range(len(raw)):
        with pytest.raises(RemoteProtocolError):
            codec.decode([raw[:cut], *content])


@pytest.mark.parametrize("message,header,content", GOLDEN, ids=[type(m).__name__ for m, _, _ in GOLDEN])
def test_trailing_bytes_and_extra_frames(message, header, content):
    raw = H(header)
    with pytest.raises(RemoteProtocolError, match="trailing"):
        codec.decode([raw + b"\x00", *content])
    if message.HAS_CONTENT:
        assert list(codec.decode([raw, *content, b"more"]).content) == [*content, b"more"]
    else:
        with pytest.raises(RemoteProtocolError, match="extra frames"):
            codec.decode([raw, b""])


def test_bad_signature_unknown_id_and_direction():
    with pytest.raises(RemoteProtocolError, match="signature"):
        codec.decode([H("aaa9 02")])
    with pytest.raises(RemoteProtocolError, match="unknown message id"):
        codec.decode([H("aaa8 13")])
    with pytest.raises(RemoteProtocolError, match="unknown message id"):
        codec.decode([H("aaa8 00")])
    with pytest.raises(RemoteProtocolError, match="empty"):
        codec.decode([])
    with pytest.raises(RemoteProtocolError, match="not allowed"):
        codec.decode([H("aaa8 02")], codec.SERVER_MESSAGES)
    with pytest.raises(RemoteProtocolError, match="not allowed"):
        codec.decode([H("aaa8 03")], codec.CLIENT_MESSAGES)


def test_string_claiming_more_than_remains():
    with pytest.raises(RemoteProtocolError, match="claims 255 bytes"):
        codec.decode([H("aaa8 05 ff 61")])


def test_encode_limits_are_local_errors():
    with pytest.raises(LocalProtocolError):
        codec.encode(codec.StreamWrite("x" * 256))
    assert codec.encode(codec.StreamWrite("x" * 255))[0][3] == 255
    with pytest.raises(LocalProtocolError):
        codec.encode(codec.Credit(65536))
    with pytest.raises(LocalProtocolError):
        codec.encode(codec.MailboxSend("a", "b", "", -1))
    with pytest.raises(LocalProtocolError):
        codec.encode(codec.MailboxSend("a", "b", "", 2**32))


def test_non_utf8_strings_round_trip():
    raw = H("aaa8 05 03 ff00fe")
    msg = codec.decode([raw])
    assert codec.encode(msg) == [raw]


def test_multibyte_utf8_length_is_counted_in_bytes():
    assert codec.encode(codec.StreamWrite("é"))[0] == H("aaa8 05 02 c3a9")
    with pytest.raises(LocalProtocolError):
        codec.encode(codec.StreamWrite("é" * 128))


# ---------------------------------------------------------------- property-based

text = st.text(max_size=40).filter(lambda s: len(s.encode("utf-8", "surrogateescape")) <= 255)
frames = st.lists(st.binary(max_size=64), max_size=4)
n2 = st.integers(0, 0xFFFF)
n4 = st.integers(0, 0xFFFFFFFF)

MESSAGES = st.one_of(
    st.builds(codec.ConnectionOpen, text),
    st.just(codec.ConnectionPing()), st.just(codec.ConnectionPong()), st.just(codec.ConnectionClose()),
    st.builds(codec.StreamWrite, text), st.builds(codec.StreamRead, text, text),
    st.builds(codec.StreamSend, text, frames), st.builds(codec.StreamDeliver, text, text, text, frames),
    st.builds(codec.MailboxSend, text, text, text, n4, frames),
    st.builds(codec.MailboxDeliver, text, text, text, text, frames),
    st.builds(codec.ServiceSend, text, text, text, n4, frames),
    st.builds(codec.ServiceOffer, text, text),
    st.builds(codec.ServiceDeliver, text, text, text, text, frames),
    st.builds(codec.Ok, n2, text), st.builds(codec.Error, n2, text), st.builds(codec.Credit, n2),
    st.builds(codec.Confirm, text, n2, text), st.builds(codec.StreamCancel, text),
)


@settings(max_examples=400, deadline=None)
@given(MESSAGES)
def test_round_trip(message):
    frames_out = codec.encode(message)
    back = codec.decode(frames_out)
    assert type(back) is type(message)
    for name, _ in message.FIELDS:
        assert getattr(back, name) == getattr(message, name)
    if message.HAS_CONTENT:
        assert list(back.content) == list(message.content)
    assert codec.encode(back) == frames_out


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.binary(max_size=40), min_size=0, max_size=4))
def test_fuzz_decoder_parses_or_raises_remote_protocol_error(frames_in):
    for allowed in (None, codec.CLIENT_MESSAGES, codec.SERVER_MESSAGES):
        try:
            codec.decode(frames_in, allowed)
        except RemoteProtocolError:
            pass


@settings(max_examples=1000, deadline=None)
@given(st.sampled_from(list(MessageId)), st.binary(max_size=40), st.lists(st.binary(max_size=8), max_size=3))
def test_fuzz_valid_prefix_random_fields(mid, body, extra):
    header = codec.SIGNATURE + bytes((mid,)) + body
    try:
        codec.decode([header, *extra])
    except RemoteProtocolError:
        pass


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(codec.MESSAGE_TYPES)), st.binary(max_size=40), st.lists(st.binary(max_size=6), max_size=3),
       st.sampled_from([None, codec.SERVER_MESSAGES, codec.CLIENT_MESSAGES]))
def test_fast_path_decodes_exactly_as_the_general_decoder(mid, rest, content, allowed):
    """decode's fast path (all-string headers) answers as the general decoder does, message or
    error, for any bytes after the id: truncated, over-long, trailing, with or without content."""
    frames = [codec.SIGNATURE + bytes((mid,)) + rest, *content]

    def outcome(fn):
        try:
            return fn(frames, allowed)
        except RemoteProtocolError as exc:
            return ("error", str(exc))

    assert outcome(codec.decode) == outcome(codec._decode_general)
    assert outcome(codec.decode) == outcome(codec._decode_general)  # again: a header seen before


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(codec._STRINGS_ONLY)), st.lists(st.text(max_size=8), min_size=4, max_size=4),
       st.lists(st.binary(max_size=6), max_size=3),
       st.lists(st.sampled_from([None, codec.SERVER_MESSAGES, codec.CLIENT_MESSAGES]), min_size=2, max_size=4))
def test_a_remembered_header_decodes_as_the_first_time(mid, strings, content, alloweds):
    """decode remembers recent headers: the same header later, in another direction (allowed set)
    or with other content frames, answers exactly as the general decoder does."""
    cls = codec.MESSAGE_TYPES[mid]
    header = codec.SIGNATURE + bytes((mid,)) + b"".join(
        codec.encode_string(t) for t in strings[:len(cls.FIELDS)])
    for i, allowed in enumerate(alloweds):
        frames = [header, *content[:i]]

        def outcome(fn):
            try:
                return fn(frames, allowed)
            except RemoteProtocolError as exc:
                return ("error", str(exc))

        assert outcome(codec.decode) == outcome(codec._decode_general)


def test_remembered_headers_are_bounded():
    codec._RECENT_HEADERS.clear()
    for i in range(codec._RECENT_MAX + 10):
        msg = codec.StreamDeliver("s", f"sender-{i}", "subject", [b"b"])
        assert codec.decode(codec.encode(msg), codec.SERVER_MESSAGES) == msg
    assert 0 < len(codec._RECENT_HEADERS) <= codec._RECENT_MAX


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(max_size=20), min_size=4, max_size=4), st.lists(st.binary(max_size=10), max_size=3))
def test_deliveries_round_trip_through_the_fast_path(strings, content):
    sender, address, subject, tracker = strings
    for msg in (codec.MailboxDeliver(sender, address, subject, tracker, content),
                codec.ServiceDeliver(sender, address, subject, tracker, content),
                codec.StreamDeliver(address, sender, subject, content)):
        try:
            frames = codec.encode(msg)
        except LocalProtocolError:
            continue  # a string over 255 bytes: not encodable
        assert codec.decode(frames, codec.SERVER_MESSAGES) == msg
