"""zrex subject patterns: the subset, the refusals, agreement with ``re``, and linear-time matching."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_mq.errors import LocalProtocolError
from spark_mq.protocol.malamute.patterns import PatternError, compile_pattern, validate_pattern


@pytest.mark.parametrize("pattern,subject,expected", [
    ("", b"", True), ("", b"anything", True),
    ("abc", b"xxabcxx", True), ("abc", b"ab", False),
    ("^abc", b"abcd", True), ("^abc", b"xabc", False),
    ("abc$", b"xabc", True), ("abc$", b"abcx", False), ("^$", b"", True), ("^$", b"a", False),
    ("a.c", b"a\nc", True), ("a*b", b"b", True), ("^a+$", b"aaa", True), ("^a+$", b"", False),
    ("x?y", b"y", True), ("(ab|cd)e", b"cde", True), ("(ab|cd)e", b"ace", False),
    ("[abc]+z", b"cbz", True), ("[^abc]", b"abc", False), ("[^abc]", b"abcd", True),
    ("\\d\\d", b"a12", True), ("\\d\\d", b"a1b", False), ("\\s", b"a b", True), ("\\S", b"   ", False),
    ("\\.", b"a.b", True), ("\\.", b"ab", False), ("\\x41", b"A", True), ("a*?b", b"aab", True),
    ("^temp\\.", b"temp.x", True), ("[0-9]", b"-", True), ("[0-9]", b"5", False),  # no ranges in zrex
])
def test_semantics(pattern, subject, expected):
    assert compile_pattern(pattern).matches(subject) is expected


@pytest.mark.parametrize("pattern", [
    "*", "+", "?", "a**", "a+*", "a*+", "(a*)*", "(a+)+", "(a|b*)+", "()*", "^*", "$+",
    "(", ")", "a)", "[", "[]", "[^]", "\\", "\\w", "\\D", "\\xZZ", "\\x4", "a|*", "(*)",
])
def test_refused_patterns(pattern):
    with pytest.raises(PatternError):
        compile_pattern(pattern)
    with pytest.raises(LocalProtocolError):  # PatternError is a LocalProtocolError for the client
        validate_pattern(pattern)


def test_strict_mode_refuses_ranges_the_broker_accepts_as_literals():
    compile_pattern("[a-z]")
    with pytest.raises(PatternError, match="ranges"):
        validate_pattern("[a-z]")
    validate_pattern("[-az]")
    validate_pattern("[az-]")


def test_too_long():
    with pytest.raises(PatternError):
        compile_pattern("a" * 256)


@pytest.mark.parametrize("pattern", [".*.*.*.*.*.*.*.*x", "a*a*a*a*a*a*a*a*a*a*b", "(a|aa)(a|aa)(a|aa)c$"])
def test_no_catastrophic_backtracking(pattern):
    matcher = compile_pattern(pattern)
    subject = b"a" * 255
    start = time.perf_counter()
    for _ in range(20):
        assert matcher.matches(subject) is False
    assert time.perf_counter() - start < 1.0


def test_dfa_cache_is_bounded():
    matcher = compile_pattern("(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)c")
    import random
    rnd = random.Random(7)
    for _ in range(300):
        subject = bytes(rnd.choice(b"abc") for _ in range(60))
        expected = re.search(rb"(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)(a|b)c", subject) is not None
        assert matcher.matches(subject) is expected
    assert len(matcher._sets) <= 512


def _to_re(pattern: str) -> bytes:
    return pattern.encode().replace(b"\\d", b"[0-9]")


ATOMS = st.sampled_from(["a", "b", ".", "\\d", "[ab]", "[^a]", "(a|b)", "(ab)", "x"])
QUANT = st.sampled_from(["", "", "*", "+", "?", "*?"])


@st.composite
def zrex(draw):
    parts = [draw(ATOMS) + draw(QUANT) for _ in range(draw(st.integers(1, 5)))]
    body = "".join(parts)
    if draw(st.booleans()):
        body = "^" + body
    if draw(st.booleans()):
        body += "$"
    return body


@settings(max_examples=300, deadline=None)
@given(zrex(), st.lists(st.binary(min_size=0, max_size=12, ).map(lambda b: bytes(x % 4 + 97 if x % 5 else 49 for x in b)),
                        min_size=1, max_size=8))
def test_agrees_with_re_on_the_common_subset(pattern, subjects):
    matcher = compile_pattern(pattern)
    rx = re.compile(_to_re(pattern), re.S)
    for subject in subjects:
        assert matcher.matches(subject) is (rx.search(subject) is not None), (pattern, subject)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=30))
def test_fuzz_compile_is_a_pattern_or_pattern_error(raw):
    try:
        matcher = compile_pattern(raw)
    except PatternError:
        return
    matcher.matches(raw)
    matcher.matches(b"")
