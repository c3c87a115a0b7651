"""Lexical scoring: BM25 of each turn's same-session window as one document (a fact is often spread
over question and answer), the decay weights of the window's neighbours, and the smoothing of a
per-turn score over them. WindowScoring's methods are mixed into _UserIndex (index.py), whose
postings, lengths and neighbour rows they read."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache

import numpy as np

import fastpath

BM25_K1, BM25_B = 1.2, 0.75  # plain BM25's defaults (bm25()); the ranker passes Ranking.k1 / b


@lru_cache(maxsize=64)
def _decay(prev_decay: float, next_decay: float, neighbours: int, window: int) -> np.ndarray:
    """Weights of the neighbours -window..-1, +1..+window: prev_decay ** k and next_decay ** k up to
    `neighbours` away, 0 beyond. Read-only: it is shared by every call with these knobs."""
    decay = np.array([prev_decay ** k for k in range(window, 0, -1)] + [next_decay ** k for k in range(1, window + 1)],
                     np.float32)
    decay[np.abs(np.r_[np.arange(-window, 0), np.arange(1, window + 1)]) > neighbours] = 0.0
    decay.flags.writeable = False
    return decay


def bm25_idf(n: int, df: int) -> float:
    """BM25's idf of a term in df of n turns."""
    return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


class WindowScoring:
    """BM25 of turns and of their windows, as methods of _UserIndex (index.py)."""

    def bm25(self, query_terms: Sequence[str], k1: float = BM25_K1, b: float = BM25_B) -> np.ndarray:
        n = len(self.ids)
        acc = np.zeros(n + 1, np.float32)  # + 1: a zero sentinel that "no neighbour" (-1) points at
        avg_len = max(self.total_len / max(n, 1), 1.0)
        for t in set(query_terms):
            arrays = self._arrays(t)
            if arrays is None:
                continue
            rows, tfs = arrays
            idf = bm25_idf(n, len(rows))
            norm = k1 * (1.0 - b + b * self.doc_len[rows] / avg_len)
            acc[rows] += idf * tfs * (k1 + 1.0) / (tfs + norm)  # rows are unique per term
        return acc

    def idf_weights(self, query_terms: Sequence[str]) -> dict[str, float]:
        """BM25's idf of each of these terms the user says (the terms they never say left out)."""
        n = len(self.ids)
        return {t: bm25_idf(n, len(arrays[0])) for t in set(query_terms) if (arrays := self._arrays(t)) is not None}

    def window_bm25(self, query_terms: Sequence[str], decay: np.ndarray, k1: float, b: float) -> np.ndarray:
        """BM25 of each turn's neighbourhood as one document: the decayed term counts of the window
        saturate per term, so a window that covers more of the query's terms wins."""
        return self.window_bm25_groups([query_terms], decay, k1, b)[0]

    def window_bm25_groups(self, groups: Sequence[Sequence[str]], decay: np.ndarray, k1: float, b: float,
                           given: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None) -> list[np.ndarray]:
        """window_bm25 of each group of terms, their window counts taken once (fastpath.window_bm25,
        compiled): each posting adds its count to its own row and, decayed, to its neighbours' rows,
        so the cost follows the postings rather than rows x terms. A term's counts do not depend on
        the other terms, so each group gets exactly what a call of its own would. `given`: postings of
        terms the index does not hold (proximity.py's pairs), looked up first."""
        n = len(self.ids)
        slot: dict[str, int] = {}  # term -> its index in rows / tfs (-1: the user never says it)
        rows: list[np.ndarray] = []
        tfs: list[np.ndarray] = []
        at: list[list[int]] = []  # per group, its terms' indices
        for group in groups:
            mine = []
            for t in dict.fromkeys(group):
                s = slot.get(t)
                if s is None:
                    arrays = given.get(t) if given else None
                    arrays = arrays if arrays is not None else self._arrays(t)
                    s = slot[t] = -1 if arrays is None else len(rows)
                    if arrays is not None:
                        rows.append(arrays[0])
                        tfs.append(arrays[1])
                if s >= 0:
                    mine.append(s)
            at.append(mine)
        if not rows or not n:
            return [np.zeros(n, np.float32) for _ in groups]
        sizes = np.fromiter(map(len, rows), np.float64, len(rows))
        idf = np.log1p((n - sizes + 0.5) / (sizes + 0.5)).astype(np.float32)
        return list(fastpath.window_bm25(rows, tfs, self.nbr[:n], decay, self._window_norm(decay, b), idf, at, k1))

    def _window_norm(self, decay: np.ndarray, b: float) -> np.ndarray:
        """Each turn's BM25 length norm of its window (the decayed lengths of its neighbours with its
        own), kept until turns are added or the knobs change."""
        n = len(self.ids)
        key = (n, b, decay.tobytes())
        if self._win_key != key:
            lens = np.zeros(n + 1, np.float32)
            lens[:n] = self.doc_len[:n]
            win_len = lens[:n] + lens[self._neighbour_rows()] @ decay
            self._win_norm = (1.0 - b + b * win_len / max(float(win_len.mean()), 1.0)).astype(np.float32)
            self._win_key = key
        return self._win_norm

    def smooth(self, scores: np.ndarray, weights: np.ndarray) -> np.ndarray:
        """scores[i] + sum_k weights[k] * scores[k-th neighbour of i]; scores carries a 0 sentinel at n."""
        return scores[:len(self.ids)] + scores[self._neighbour_rows()] @ weights
