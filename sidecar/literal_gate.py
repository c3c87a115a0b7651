"""A regex behind a cheap gate: the literals one of which every match must contain, read off the
pattern itself, so `in` on the text (C speed) rules out most texts before the regex scans them.
Python's re tries every alternative of a rule at every position of a text; the constraint
detector's rules run on every sentence of every stored user turn.

The gate never changes an answer: a text holding none of the literals cannot match. For an
IGNORECASE pattern the text is lowered first; the only non-ASCII characters re matches to an ASCII
letter without ignoring case (dotted and dotless i, long s, the Kelvin sign) are mapped to that
letter, and a pattern with a cased non-ASCII literal gets no gate."""

from __future__ import annotations

import re
import re._constants as _c  # sre's parse-tree opcodes
import re._parser as _parser
from collections.abc import Iterator

# Every non-ASCII character that an IGNORECASE pattern matches as an ASCII letter (tests check the
# whole of Unicode), with the letter it matches.
_TO_ASCII = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})
_ZERO_WIDTH = (_c.AT, _c.ASSERT, _c.ASSERT_NOT)
_REPEATS = (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT)


class _NoGate(Exception):
    pass


def necessary_literals(rx: re.Pattern[str]) -> frozenset[str] | None:
    """Strings one of which every match of `rx` contains (lowered for an IGNORECASE pattern), the
    longest such set found; None when the pattern has none that can be read off it."""
    icase = bool(rx.flags & re.IGNORECASE)
    try:
        return _needs(_parser.parse(rx.pattern, rx.flags), icase)
    except _NoGate:
        return None


def _better(a: frozenset[str], b: frozenset[str] | None) -> bool:
    """Rarer: a shortest literal longer, or as long and fewer of them."""
    return b is None or (min(map(len, a)), -len(a)) > (min(map(len, b)), -len(b))


def _literal(run: list[int], icase: bool) -> frozenset[str]:
    text = "".join(map(chr, run))
    if icase:
        if any(not c.isascii() and c.lower() != c.upper() for c in text):
            raise _NoGate  # a cased non-ASCII letter: its other cases are not all its lowercase
        text = text.lower()
    return frozenset({text})


def _needs(items, icase: bool) -> frozenset[str] | None:
    """What a sequence of parsed items needs: any one of its mandatory parts' needs, the rarest."""
    best: frozenset[str] | None = None
    for f in _parts(items, icase):
        if _better(f, best):
            best = f
    return best


def _parts(items, icase: bool) -> list[frozenset[str]]:
    """What each mandatory part of a sequence of parsed items needs (those a need can be read off)."""
    found: list[frozenset[str] | None] = []
    run: list[int] = []  # consecutive literal characters (zero-width items do not break a run)
    for op, av in items:
        if op is _c.LITERAL:
            run.append(av)
            continue
        if op in _ZERO_WIDTH:
            continue
        if run:
            found.append(_literal(run, icase))
            run = []
        if op is _c.SUBPATTERN:
            _, add_flags, del_flags, sub = av
            if (add_flags | del_flags) & re.IGNORECASE:
                raise _NoGate
            found.append(_needs(sub, icase))
        elif op is _c.BRANCH:
            alternatives = [_needs(b, icase) for b in av[1]]
            if all(a is not None for a in alternatives):
                found.append(frozenset().union(*alternatives))  # type: ignore[arg-type]
        elif op in _REPEATS and av[0] >= 1:
            found.append(_needs(av[2], icase))
    if run:
        found.append(_literal(run, icase))
    return [f for f in found if f is not None]


def necessary_literal_sets(rx: re.Pattern[str], most: int = 3) -> tuple[frozenset[str], ...]:
    r"""Sets of strings such that every match of `rx` contains one of each set (lowered for an
    IGNORECASE pattern): the needs of up to `most` of its mandatory parts, the rarest first. Asking for
    all of them rules out more texts than the rarest alone ("the" and "fix" and "was", not only "the",
    for r"the\s+fix\s+was"). Empty when none can be read off."""
    icase = bool(rx.flags & re.IGNORECASE)
    try:
        parts = _parts(_parser.parse(rx.pattern, rx.flags), icase)
    except _NoGate:
        return ()
    parts.sort(key=lambda f: (-min(map(len, f)), len(f)))  # rarer first: a longer shortest literal, fewer
    return tuple(dict.fromkeys(parts))[:most]


def passes(gates: tuple[frozenset[str], ...], text: str) -> bool:
    """Whether `text` holds a literal of every gate (an IGNORECASE pattern's gates read folded text)."""
    for gate in gates:
        for lit in gate:
            if lit in text:
                break
        else:
            return False
    return True


def can_match_ascii(gates: tuple[frozenset[str], ...]) -> bool:
    """False when a gate's literals are all non-ASCII: no ASCII text (nor its lowering) holds one."""
    return all(any(lit.isascii() for lit in gate) for gate in gates)


def folded(text: str) -> str:
    """What an IGNORECASE pattern's gate reads: the text lowered, with the non-ASCII characters that
    match an ASCII letter mapped to it."""
    return text.lower() if text.isascii() else text.translate(_TO_ASCII).lower()


class GatedPattern:
    """`rx` with its literal gates: search() answers as rx.search() does."""

    def __init__(self, rx: re.Pattern[str]) -> None:
        self.rx = rx
        self.gates = necessary_literal_sets(rx)
        self.ascii_ok = can_match_ascii(self.gates)  # may an ASCII text match at all
        self._icase = bool(rx.flags & re.IGNORECASE)

    def may_match(self, text: str, low: str | None = None) -> bool:
        """Whether `text` passes the gates (an ASCII text is not read for a pattern it cannot match);
        `low` is folded(text) where the caller has it."""
        if not self.ascii_ok and text.isascii():
            return False
        if self._icase:
            text = folded(text) if low is None else low
        return passes(self.gates, text)

    def search(self, text: str, low: str | None = None) -> re.Match[str] | None:
        return self.rx.search(text) if self.may_match(text, low) else None

    def finditer(self, text: str, low: str | None = None) -> Iterator[re.Match[str]]:
        return self.rx.finditer(text) if self.may_match(text, low) else iter(())
