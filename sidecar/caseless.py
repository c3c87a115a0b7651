"""An IGNORECASE pattern matched on ASCII text without case folding: the text lowered, against the
same pattern compiled case-sensitively. re folds every character it compares under IGNORECASE,
which is most of the cost of reading extraction cues and a turn's voice off long turns. The answers
are the same: a pattern is only taken when it holds no letter that lowering could miss (no upper-case
ASCII letter, no cased non-ASCII one), and other text is matched by the pattern itself."""

from __future__ import annotations

import re
import re._constants as _c  # sre's parse-tree opcodes
import re._parser as _parser
from collections.abc import Iterator


class CaselessPattern:
    def __init__(self, rx: re.Pattern[str]) -> None:
        if not rx.flags & re.IGNORECASE:
            raise ValueError("CaselessPattern takes an IGNORECASE pattern")
        cased = [c for c in _characters(_parser.parse(rx.pattern, rx.flags & ~re.IGNORECASE))
                 if c.lower() != c.upper() and not (c.isascii() and c.islower())]
        if cased:
            raise ValueError(f"pattern holds letters lowered text may not match: {cased[:5]}")
        self.rx = rx
        self._cased = re.compile(rx.pattern, rx.flags & ~re.IGNORECASE)

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        """rx.finditer(text); on ASCII text the matches are of the lowered text (same positions)."""
        return self._cased.finditer(text.lower()) if text.isascii() else self.rx.finditer(text)

    def found(self, text: str) -> bool:
        """Whether rx.search(text) finds a match."""
        return (self._cased.search(text.lower()) if text.isascii() else self.rx.search(text)) is not None


def _characters(items) -> Iterator[str]:
    """Every character a parsed pattern names (literals and the ends and insides of ranges)."""
    for op, av in items:
        if op in (_c.LITERAL, _c.NOT_LITERAL):
            yield chr(av)
        elif op is _c.RANGE:
            yield from map(chr, range(av[0], av[1] + 1))
        elif op is _c.IN:
            yield from _characters(av)
        elif op is _c.BRANCH:
            for branch in av[1]:
                yield from _characters(branch)
        elif op is _c.SUBPATTERN:
            yield from _characters(av[3])
        elif op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
            yield from _characters(av[2])
        elif op in (_c.ASSERT, _c.ASSERT_NOT):
            yield from _characters(av[1])
        elif op is _c.ATOMIC_GROUP:
            yield from _characters(av)
