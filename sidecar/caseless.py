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

import fastpath
from sidecar.literal_gate import can_match_ascii, folded, necessary_literal_sets, passes


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
        # found() asks each top-level alternative behind its literal gates: re tries every alternative at
        # every position, so a long text most alternatives' literals are absent from is read far faster.
        # An ASCII text (most) is asked only the alternatives an ASCII text can match.
        self._gated = [(necessary_literal_sets(re.compile(a, rx.flags)), re.compile(a, rx.flags),
                        re.compile(a, rx.flags & ~re.IGNORECASE)) for a in alternatives(rx)]
        self._gated_ascii = [(gates, cased) for gates, _, cased in self._gated if can_match_ascii(gates)]
        # Every literal of those, found in one pass over the lowered text; then only the alternatives
        # whose rarest gate holds a literal found are asked (and those without a gate).
        self._literals = fastpath.NeedleSet(sorted({lit for gates, _ in self._gated_ascii for g in gates for lit in g}))
        self._by_literal: dict[str, list[int]] = {}
        for i, (gates, _) in enumerate(self._gated_ascii):
            for lit in gates[0] if gates else ():
                self._by_literal.setdefault(lit, []).append(i)
        self._ungated = [i for i, (gates, _) in enumerate(self._gated_ascii) if not gates]

    def finditer(self, text: str) -> Iterator[re.Match[str]]:
        """rx.finditer(text); on ASCII text the matches are of the lowered text (same positions)."""
        return self._cased.finditer(text.lower()) if text.isascii() else self.rx.finditer(text)

    def findall(self, text: str) -> list:
        """rx.findall(text); on ASCII text the groups are of the lowered text."""
        return self._cased.findall(text.lower()) if text.isascii() else self.rx.findall(text)

    def found(self, text: str) -> bool:
        """Whether rx.search(text) finds a match."""
        if text.isascii():  # the cased alternatives read the lowered text
            low = text.lower()
            held = self._literals.found(low)
            asked = {i for lit in held for i in self._by_literal.get(lit, ())}
            for i in sorted(asked.union(self._ungated)):
                gates, cased = self._gated_ascii[i]
                if all(not held.isdisjoint(g) for g in gates) and cased.search(low) is not None:
                    return True
            return False
        low = folded(text)
        return any(passes(gates, low) and folding.search(text) is not None for gates, folding, _ in self._gated)


def alternatives(rx: re.Pattern[str]) -> list[str]:
    """The pattern's top-level alternatives ("a|(b|c)|d" -> a, (b|c), d): split at each "|" outside
    groups and character sets; the pattern whole when the split does not parse as it does or an
    alternative does not compile alone."""
    parts, depth, in_set, escaped, start, set_start = [], 0, False, False, 0, 0
    source = rx.pattern
    for i, ch in enumerate(source):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif in_set:
            in_set = not (ch == "]" and i > set_start)  # a set's first "]" is one of its characters
        elif ch == "[":
            in_set, set_start = True, i + 1 + (source[i + 1:i + 2] == "^")
        elif ch in "()":
            depth += 1 if ch == "(" else -1
        elif ch == "|" and depth == 0:
            parts.append(source[start:i])
            start = i + 1
    parts.append(source[start:])
    tree = _parser.parse(source, rx.flags)
    top = len(tree.data[0][1][1]) if len(tree.data) == 1 and tree.data[0][0] is _c.BRANCH else 1
    try:  # an alternative alone may not compile (a back-reference to a group of another)
        for part in parts:
            re.compile(part, rx.flags)
    except re.error:
        return [source]
    return parts if len(parts) == top else [source]


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
