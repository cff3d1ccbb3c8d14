"""Subject patterns: the CZMQ ``zrex`` subset Malamute uses, validated and matched in linear time.

zrex (an early SLRE) knows ``^ $ . ( ) | [set] [^set] * + ? *? +?`` and the escapes ``\\s \\S \\d \\r
\\n \\xHH`` plus ``\\`` before a meta character. It has no character ranges: in ``[0-9]`` the ``-`` is a
literal. Matching is a search (anywhere in the subject) unless anchored with ``^``.

The real broker hangs on patterns such as ``*``, ``+``, ``a**`` and ``(a*)*`` (backtracking without
progress) and accepts invalid ones as match-all. Here:

- ``compile_pattern`` parses the subset and raises ``PatternError`` for an invalid pattern, a
  quantifier with nothing to repeat, a quantifier on a quantifier, or a quantified group that itself
  contains a quantifier (the shapes that backtrack catastrophically); ``strict=True`` (client side)
  also refuses set ranges like ``[0-9]`` that zrex would silently read as three literals.
- matching never backtracks: the pattern becomes a Thompson NFA run as a lazily built DFA, so a
  match costs O(len(subject)) table lookups whatever the pattern (Python's ``re`` is exponential or
  high-degree polynomial on such patterns, which is why it is not used).
- the empty pattern matches every subject, including the empty one (the real broker's does not).

Subjects and patterns are bytes (``str`` is encoded as UTF-8). No IO, no clocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

from spark_mq.errors import LocalProtocolError

MAX_PATTERN = 255  # a Malamute string; a longer pattern cannot be sent anyway
_MAX_DFA_STATES = 512  # per pattern; the cache is dropped and rebuilt when exceeded

_META = frozenset(b"^$().[]*+?|\\")
_SPACE = frozenset(b" \t\n\r\f\v")
_DIGIT = frozenset(b"0123456789")
_ALL = frozenset(range(256))
_QUANTIFIERS = frozenset(b"*+?")


class PatternError(LocalProtocolError, ValueError):
    """A subject pattern is invalid or could hang the reference broker."""


# ---------------------------------------------------------------- parser (AST as tuples)
# ("set", frozenset[int]) | ("bol",) | ("eol",) | ("cat", [nodes]) | ("alt", [nodes])
# | ("star"|"plus"|"opt", node) | ("group", node)


@dataclass
class _Parser:
    src: bytes
    strict: bool
    pos: int = 0

    def error(self, why: str) -> PatternError:
        return PatternError(f"invalid subject pattern {self.src!r} at offset {self.pos}: {why}")

    def parse(self):
        node = self.alternation()
        if self.pos != len(self.src):
            raise self.error("unbalanced ')'")
        return node

    def alternation(self):
        branches = [self.sequence()]
        while self.pos < len(self.src) and self.src[self.pos] == ord("|"):
            self.pos += 1
            branches.append(self.sequence())
        return branches[0] if len(branches) == 1 else ("alt", branches)

    def sequence(self):
        items = []
        src = self.src
        while self.pos < len(src) and src[self.pos] not in (ord("|"), ord(")")):
            c = src[self.pos]
            if c in _QUANTIFIERS:
                raise self.error("quantifier with nothing to repeat")
            atom, quantifiable, has_quant = self.atom()
            if self.pos < len(src) and src[self.pos] in _QUANTIFIERS:
                q = src[self.pos]
                if not quantifiable:
                    raise self.error("quantifier after an anchor")
                if has_quant:
                    raise self.error("quantified group contains a quantifier (catastrophic backtracking)")
                self.pos += 1
                if self.pos < len(src) and src[self.pos] == ord("?") and q != ord("?"):
                    self.pos += 1  # non-greedy marker: same language
                if self.pos < len(src) and src[self.pos] in _QUANTIFIERS:
                    raise self.error("quantifier follows a quantifier")
                atom = ({ord("*"): "star", ord("+"): "plus", ord("?"): "opt"}[q], atom)
                has_quant = True
            items.append((atom, has_quant))
        return ("cat", [a for a, _ in items])

    def atom(self):
        """Returns (node, quantifiable, contains_quantifier)."""
        src = self.src
        c = src[self.pos]
        self.pos += 1
        if c == ord("("):
            inner = self.alternation()
            if self.pos >= len(src) or src[self.pos] != ord(")"):
                raise self.error("missing ')'")
            self.pos += 1
            return ("group", inner), not _nullable(inner), _has_quant(inner)
        if c == ord("["):
            return ("set", self.charset()), True, False
        if c == ord("."):
            return ("set", _ALL), True, False
        if c == ord("^"):
            return ("bol",), False, False
        if c == ord("$"):
            return ("eol",), False, False
        if c == ord("\\"):
            return ("set", self.escape()), True, False
        if c == ord("]") and self.strict:
            raise self.error("unmatched ']'")
        return ("set", frozenset((c,))), True, False

    def escape(self) -> frozenset:
        src = self.src
        if self.pos >= len(src):
            raise self.error("pattern ends with a backslash")
        c = src[self.pos]
        self.pos += 1
        if c == ord("s"):
            return frozenset(_SPACE)
        if c == ord("S"):
            return _ALL - _SPACE
        if c == ord("d"):
            return frozenset(_DIGIT)
        if c == ord("r"):
            return frozenset(b"\r")
        if c == ord("n"):
            return frozenset(b"\n")
        if c == ord("x"):
            digits = src[self.pos:self.pos + 2]
            try:
                if len(digits) != 2:
                    raise ValueError
                value = int(digits, 16)
            except ValueError:
                raise self.error("\\x needs two hex digits") from None
            self.pos += 2
            return frozenset((value,))
        if chr(c).isalnum():
            raise self.error(f"unsupported escape \\{chr(c)}")
        return frozenset((c,))

    def charset(self) -> frozenset:
        src = self.src
        negate = self.pos < len(src) and src[self.pos] == ord("^")
        if negate:
            self.pos += 1
        members: set[int] = set()
        start = self.pos
        while True:
            if self.pos >= len(src):
                raise self.error("missing ']'")
            c = src[self.pos]
            if c == ord("]"):
                break
            self.pos += 1
            if c == ord("\\"):
                members |= self.escape()
            else:
                if (self.strict and c == ord("-") and self.pos - 1 > start
                        and self.pos < len(src) and src[self.pos] != ord("]")):
                    raise self.error("zrex has no character ranges: '-' is a literal here")
                members.add(c)
        if self.pos == start:
            raise self.error("empty set []")
        self.pos += 1
        return frozenset(_ALL - members if negate else members)


def _nullable(node) -> bool:
    kind = node[0]
    if kind == "set":
        return False
    if kind in ("bol", "eol", "star", "opt"):
        return True
    if kind == "plus" or kind == "group":
        return _nullable(node[1])
    if kind == "cat":
        return all(_nullable(n) for n in node[1])
    return any(_nullable(n) for n in node[1])  # alt


def _has_quant(node) -> bool:
    kind = node[0]
    if kind in ("star", "plus", "opt"):
        return True
    if kind == "group":
        return _has_quant(node[1])
    if kind in ("cat", "alt"):
        return any(_has_quant(n) for n in node[1])
    return False


# ---------------------------------------------------------------- NFA and lazy DFA

_SPLIT, _CHAR, _BOL, _EOL, _MATCH = range(5)


class _Nfa:
    def __init__(self) -> None:
        self.kind: list[int] = []
        self.chars: list[Optional[frozenset]] = []
        self.out: list[list[int]] = []

    def state(self, kind: int, chars: Optional[frozenset] = None) -> int:
        self.kind.append(kind)
        self.chars.append(chars)
        self.out.append([])
        return len(self.kind) - 1

    def build(self, node, nxt: int) -> int:
        """Build ``node`` so that it continues to ``nxt``; returns the entry state."""
        kind = node[0]
        if kind == "set":
            s = self.state(_CHAR, node[1])
            self.out[s].append(nxt)
            return s
        if kind == "bol" or kind == "eol":
            s = self.state(_BOL if kind == "bol" else _EOL)
            self.out[s].append(nxt)
            return s
        if kind == "group":
            return self.build(node[1], nxt)
        if kind == "cat":
            for child in reversed(node[1]):
                nxt = self.build(child, nxt)
            return nxt
        if kind == "alt":
            s = self.state(_SPLIT)
            self.out[s].extend(self.build(child, nxt) for child in node[1])
            return s
        if kind == "opt":
            s = self.state(_SPLIT)
            self.out[s].extend((self.build(node[1], nxt), nxt))
            return s
        # star / plus: a loop state that either enters the body (which returns to it) or leaves
        loop = self.state(_SPLIT)
        body = self.build(node[1], loop)
        self.out[loop].extend((body, nxt))
        return body if kind == "plus" else loop


class Matcher:
    """A compiled pattern. ``matches(subject: bytes) -> bool``; linear in the subject length."""

    __slots__ = ("pattern", "matches", "_nfa", "_start", "_ids", "_sets", "_trans", "_final",
                 "_accepting", "_restart", "_initial")

    def __init__(self, pattern: bytes, ast) -> None:
        self.pattern = pattern
        if ast is None:
            self.matches: Callable[[bytes], bool] = _match_all
            return
        literal = _literal(ast)
        if literal is not None:
            needle, anchored = literal
            self.matches = (lambda s, n=needle: s.startswith(n)) if anchored else (lambda s, n=needle: n in s)
            return
        nfa = _Nfa()
        final = nfa.state(_MATCH)
        self._nfa = nfa
        self._start = nfa.build(ast, final)
        self._restart = self._closure((self._start,), bol=False, eol=False)
        self._initial = self._closure((self._start,), bol=True, eol=False)
        self._reset_cache()
        self.matches = self._run

    def _reset_cache(self) -> None:
        self._ids: dict[frozenset, int] = {}
        self._sets: list[frozenset] = []
        self._trans: list[list[int]] = []
        self._accepting: list[bool] = []
        self._final: list[Optional[bool]] = []

    def _closure(self, seeds, *, bol: bool, eol: bool) -> frozenset:
        nfa = self._nfa
        seen: set[int] = set()
        stack = list(seeds)
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            k = nfa.kind[s]
            if k == _SPLIT or (k == _BOL and bol) or (k == _EOL and eol):
                stack.extend(nfa.out[s])
        return frozenset(seen)

    def _intern(self, states: frozenset) -> int:
        i = self._ids.get(states)
        if i is None:
            i = len(self._sets)
            self._ids[states] = i
            self._sets.append(states)
            self._trans.append([-1] * 256)
            self._accepting.append(any(self._nfa.kind[s] == _MATCH for s in states))
            self._final.append(None)
        return i

    def _step(self, i: int, byte: int) -> int:
        nfa = self._nfa
        targets = [nfa.out[s][0] for s in self._sets[i] if nfa.kind[s] == _CHAR and byte in nfa.chars[s]]
        closed = self._closure(targets, bol=False, eol=False) | self._restart
        if len(self._sets) >= _MAX_DFA_STATES:
            self._reset_cache()  # bound memory: start over; ``i`` is gone, so no transition is stored
            return self._intern(closed)
        j = self._intern(closed)
        self._trans[i][byte] = j
        return j

    def _accepts_at_end(self, i: int) -> bool:
        cached = self._final[i]
        if cached is None:
            closed = self._closure(self._sets[i], bol=False, eol=True)
            cached = any(self._nfa.kind[s] == _MATCH for s in closed)
            self._final[i] = cached
        return cached

    def _run(self, subject: bytes) -> bool:
        if not subject:
            closed = self._closure((self._start,), bol=True, eol=True)
            return any(self._nfa.kind[s] == _MATCH for s in closed)
        state = self._intern(self._initial)
        accepting = self._accepting
        for byte in subject:
            if accepting[state]:
                return True
            nxt = self._trans[state][byte]
            if nxt < 0:
                nxt = self._step(state, byte)
                accepting = self._accepting
            state = nxt
        return accepting[state] or self._accepts_at_end(state)


def _match_all(subject: bytes) -> bool:
    return True


def _literal(ast) -> Optional[tuple[bytes, bool]]:
    """(needle, anchored) when the pattern is a plain (optionally ^-anchored) byte string."""
    if ast[0] != "cat":
        return None
    items = ast[1]
    anchored = bool(items) and items[0] == ("bol",)
    if anchored:
        items = items[1:]
    out = bytearray()
    for node in items:
        if node[0] != "set" or len(node[1]) != 1:
            return None
        out.append(next(iter(node[1])))
    return bytes(out), anchored


def compile_pattern(pattern: Union[str, bytes], *, strict: bool = False) -> Matcher:
    """Validate and compile a zrex subject pattern; ``PatternError`` if invalid or dangerous."""
    raw = pattern.encode("utf-8", "surrogateescape") if isinstance(pattern, str) else bytes(pattern)
    if len(raw) > MAX_PATTERN:
        raise PatternError(f"subject pattern of {len(raw)} bytes exceeds {MAX_PATTERN}")
    if not raw:
        return Matcher(raw, None)
    return Matcher(raw, _Parser(raw, strict).parse())


def validate_pattern(pattern: Union[str, bytes]) -> None:
    """Client-side check: refuse what the real broker would hang on or silently misread."""
    compile_pattern(pattern, strict=True)
