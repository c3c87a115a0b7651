"""Term proximity: a turn that says two of the query's neighbouring terms close together ("high school"
in "my high school friends", "cherry tomatoes from my garden") is more likely about what is asked
than one that says them sentences apart, which BM25 over the window cannot tell (it counts terms, not
where they stand). Each pair of terms next to each other in the query is scored as a term of its own:
its count in a turn is how often the two stand within Ranking.proximity_gap terms of each other, and
its BM25 over the window is added to the fused score (Ranking.proximity_weight), as the query's
expansions are.

The index keeps no positions; a pair can only stand close in a turn that says both terms (the
intersection of their postings), so those turns are read again, the best-scored first, up to
Ranking.proximity_chars characters per query: a bound on the cost of a query over long pasted turns.
Proximity.proximity_postings is mixed into _UserIndex (index.py); Fusion.rank (scoring.py) calls it."""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from sidecar.memory.episodic.terms import terms

if TYPE_CHECKING:
    from sidecar.memory.episodic.ranking import Ranking


def query_pairs(query_terms: Sequence[str]) -> list[tuple[str, str]]:
    """The pairs of terms next to each other in the query, each once, in either order once."""
    seen: dict[frozenset[str], tuple[str, str]] = {}
    for a, b in zip(query_terms, query_terms[1:], strict=False):
        if a != b:
            seen.setdefault(frozenset((a, b)), (a, b))
    return list(seen.values())


def close_counts(seq: Sequence[str], pairs: Sequence[tuple[str, str]], gap: int) -> list[int]:
    """For each pair, how many times its two terms stand at most `gap` terms apart in `seq` (each
    occurrence of the one with each of the other, in either order)."""
    wanted = {t for pair in pairs for t in pair}
    where: dict[str, list[int]] = {}
    for i, t in enumerate(seq):
        if t in wanted:
            where.setdefault(t, []).append(i)
    out = []
    for a, b in pairs:
        pa, pb = where.get(a, []), where.get(b, [])  # ascending: each occurrence of a counts b's near it
        out.append(sum(bisect_right(pb, i + gap) - bisect_left(pb, i - gap) for i in pa) if pb else 0)
    return out


def pair_key(a: str, b: str) -> str:
    """A pair's name as a term of the window BM25 (no term holds a space)."""
    return f"{a} {b}"


class Proximity:
    """Pairs of query terms said close together, as a method of _UserIndex (index.py)."""

    def proximity_postings(self, query_terms: Sequence[str], score: np.ndarray, r: Ranking
                           ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The query's pairs that stand close in some turn, as terms (pair_key) with their postings
        (rows, counts) for window_bm25_groups; `score`: the turns' scores so far, which decide the order
        in which turns are read within the bound."""
        pairs = []
        rows_of = []
        for a, b in query_pairs(query_terms):
            pa, pb = self._arrays(a), self._arrays(b)
            if pa is None or pb is None:
                continue
            both = np.intersect1d(pa[0], pb[0], assume_unique=True)
            if len(both):
                pairs.append((a, b))
                rows_of.append(both)
        if not pairs:
            return {}
        candidates = np.unique(np.concatenate(rows_of))
        candidates = candidates[np.argsort(-score[candidates], kind="stable")]
        counts: dict[int, list[int]] = {}
        left = r.proximity_chars
        for row in candidates.tolist():
            text = self.texts[row]
            if len(text) > left:
                continue
            left -= len(text)
            counts[row] = close_counts(terms(text, stemmed=r.stem), pairs, r.proximity_gap)
        found = {}
        for k, (a, b) in enumerate(pairs):
            hits = sorted((row, c[k]) for row, c in counts.items() if c[k])
            if hits:
                found[pair_key(a, b)] = (np.fromiter((h[0] for h in hits), np.int64, len(hits)),
                                         np.fromiter((h[1] for h in hits), np.float32, len(hits)))
        return found
