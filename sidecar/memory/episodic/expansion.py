"""Everything that widens a query beyond its own terms: the user's words nearest the query's terms in
the static word vectors (similar words), the terms the user says most with the query's
(co-occurrence, PMI over their own turns) and pseudo-relevance feedback from the best turns.

The module-level tables (_stem_vectors, _SIMILAR) are shared by every user; the
per-user parts are QueryExpansion's methods, mixed into _UserIndex (index.py), whose vocabulary,
postings and term arrays they read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np

import fastpath
from sidecar.index.word_vectors import default_vectors
from sidecar.memory.episodic.terms import QUESTION_WORDS, stem

if TYPE_CHECKING:
    from sidecar.memory.episodic.ranking import Ranking


@lru_cache(maxsize=1)
def _stem_vectors() -> tuple[dict[str, int], list[str], np.ndarray]:
    """The static word vectors averaged per stem (built once, ~0.3 s: EpisodicSource.warm_up at start-up)."""
    index, mat = default_vectors().by_stem(stem)
    return index, list(index), mat


# (term, min_cosine) -> rows of the similar stems in the table; bounded by the table's stems (~14.5k,
# ~41 rows each at cosine 0.4) per min_cosine in use.
_SIMILAR: dict[tuple[str, float], np.ndarray] = {}
_NO_ROWS = np.zeros(0, np.int32)


def similar_rows(query_terms: Sequence[str], min_cosine: float) -> list[np.ndarray]:
    """Per term, the table rows (_stem_vectors) of the stems whose static word vectors have a cosine of
    at least min_cosine with its own, nearest first (the term itself left out; none for a term the
    table lacks). From _SIMILAR, which precompute_similar fills at start-up for the ranking's
    min_cosine; a term not in it yet costs a pass over the table (0.1-0.5 ms, memory-bound)."""
    index = _stem_vectors()[0]
    missing = [t for t in dict.fromkeys(query_terms) if t in index and (t, min_cosine) not in _SIMILAR]
    if missing:
        _fill_similar(missing, min_cosine)
    return [_SIMILAR.get((t, min_cosine), _NO_ROWS) for t in query_terms]


def precompute_similar(min_cosine: float, stop: Callable[[], bool] = lambda: False) -> None:
    """similar_rows of every stem of the table (~1 s on this machine, in the warm-up thread), so a
    query's new words cost no pass over the table; `stop` is asked between blocks."""
    keys = _stem_vectors()[1]
    _fill_similar([t for t in keys if (t, min_cosine) not in _SIMILAR], min_cosine, stop)


def _fill_similar(stems: list[str], min_cosine: float, stop: Callable[[], bool] = lambda: False,
                  block: int = 512) -> None:
    index, _, mat = _stem_vectors()
    for start in range(0, len(stems), block):
        if stop():
            return
        part = stems[start:start + block]
        sims = mat[[index[t] for t in part]] @ mat.T
        for t, row in zip(part, sims, strict=True):
            hits = np.flatnonzero(row >= min_cosine)
            hits = hits[np.argsort(-row[hits], kind="stable")]
            _SIMILAR[t, min_cosine] = hits[hits != index[t]].astype(np.int32)  # ~2.4 MB for all stems


def table_stems(rows: np.ndarray) -> tuple[str, ...]:
    """The stems of these table rows (similar_rows), in order."""
    keys = _stem_vectors()[1]
    return tuple(keys[i] for i in rows.tolist())


class QueryExpansion:
    """The per-user expansions of a query, as methods of _UserIndex (index.py)."""

    def similar(self, query_terms: Sequence[str], names: set[str], r: Ranking) -> list[str]:
        """Per query term, the similar_terms terms of this user nearest it in the static word vectors
        (cosine at least similar_min); query terms, names and question words left out."""
        exclude = {*query_terms, *names}
        asked = [q for q in dict.fromkeys(query_terms) if q not in QUESTION_WORDS]
        out: dict[str, None] = {}
        for rows in similar_rows(asked, r.similar_min):
            out.update(dict.fromkeys(self._first_said(rows, r.similar_terms, exclude)))
        return list(out)

    def _first_said(self, rows: np.ndarray, k: int, exclude: set[str]) -> list[str]:
        """The first k stems of these table rows that this user says, those in `exclude` left out (a
        plain loop over the said ones: the rows are a few dozen, and it stops at the k-th)."""
        if k <= 0 or not len(rows):
            return []
        keys = _stem_vectors()[1]
        out: list[str] = []
        for i in rows[self._said()[rows]].tolist():
            if keys[i] not in exclude:
                out.append(keys[i])
                if len(out) == k:
                    break
        return out

    def _said(self) -> np.ndarray:
        """By table row (_stem_vectors), whether this user says that stem; brought up to date with the
        terms added since the last call (the vocabulary only grows; a compacted index starts its own)."""
        index = _stem_vectors()[0]
        if len(self._said_mask) != len(index):
            self._said_mask, self._said_upto = np.zeros(len(index), bool), 0
        new = [row for t in self.words[self._said_upto:] if (row := index.get(t)) is not None]
        if new:
            self._said_mask[new] = True
        self._said_upto = len(self.words)
        return self._said_mask

    def associated(self, query_terms: Sequence[str], names: set[str], r: Ranking) -> list[str]:
        """The assoc_terms terms the user says most with the query's terms ("hike" -> trail, view):
        per query term, sum over the terms sharing at least assoc_min of its turns of their PMI
        (when positive) times the share of its turns they are in; query terms and names excluded."""
        n, size = len(self.ids), len(self.words)
        picked = [a[0] for q in dict.fromkeys(query_terms)
                  if q not in QUESTION_WORDS and (a := self._arrays(q)) is not None]
        if not picked:
            return []
        exclude = self._term_ids({*query_terms, *names})
        best, _ = fastpath.cooccurring_terms(picked, self.term_ptr[:n + 1], self.term_at[:int(self.term_ptr[n])],
                                             self.term_df[:size], n, r.assoc_min, exclude, r.assoc_terms)
        return [self.words[i] for i in best.tolist()]

    def _feedback(self, score: np.ndarray, query_terms: Sequence[str], names: set[str], r: Ranking) -> list[str]:
        """The prf_terms terms most characteristic of the prf_docs best turns (fastpath.feedback_terms:
        each term's idf summed over those turns; terms of one turn only, the query's and the names left out)."""
        n = len(self.ids)
        best = np.argpartition(-score, r.prf_docs - 1)[: r.prf_docs]
        best = best[score[best] > 0]
        skip = self._term_ids({*query_terms, *names})
        ids, _ = fastpath.feedback_terms(best, self.term_ptr[:n + 1], self.term_at[:int(self.term_ptr[n])],
                                         self.term_df[:len(self.words)], n, 2, skip, r.prf_terms)
        return [self.words[i] for i in ids.tolist()]
