"""One hybrid index over a set of rows: dense vectors (exact numpy search, hnswlib above a size
threshold) plus BM25 postings. Rows are removed in the same call that deletes their data.

Not thread-safe on its own: owners guard it with their lock."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import hnswlib
import numpy as np

import fastpath

BM25_K1, BM25_B = 1.2, 0.75
# Lexical scores are squashed as s / (s + LEXICAL_HALF) so that they stay comparable across
# queries (an absolute threshold like "no knowledge matched" needs that).
LEXICAL_HALF = 4.0
NO_ROWS = np.zeros(0, np.int64)
NO_SCORES = np.zeros(0, np.float32)


@dataclass(slots=True)
class Hit:
    key: str
    score: float
    dense: float
    lexical: float
    vector: np.ndarray  # the row's vector (a view of one copy made per search)


class HybridIndex:
    def __init__(self, dim: int, *, dense_weight: float = 0.6, hnsw_threshold: int = 4096, ef: int = 96,
                 m: int = 16) -> None:
        self.dim = dim
        self.dense_weight = dense_weight
        self.hnsw_threshold = hnsw_threshold
        self._ef, self._m = ef, m
        self._vectors = np.zeros((64, dim), np.float32)
        self._alive = np.zeros(64, bool)
        # Added to a row's fused score (a memory's authority): ranking needs no over-fetch to apply it.
        self._prior = np.zeros(64, np.float32)
        self._keys: list[str | None] = []
        self._row_of: dict[str, int] = {}
        self._doc_len = np.zeros(64, np.float32)
        self._postings: dict[str, tuple[list[int], list[int]]] = {}
        # term -> (rows, BM25 weight of the term in each row), built on first read; every write
        # changes the document count or average length, so writes clear it.
        self._posting_arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._terms_of: list[tuple[str, ...]] = []
        self._hnsw: hnswlib.Index | None = None
        self._total_len = 0.0
        self._df: dict[str, int] = {}  # live documents per term (postings also hold dead rows)

    def __len__(self) -> int:
        return len(self._row_of)

    def __contains__(self, key: str) -> bool:
        return key in self._row_of

    def keys(self) -> list[str]:
        return list(self._row_of)

    def vector(self, key: str) -> np.ndarray:
        return self._vectors[self._row_of[key]].copy()

    def terms(self, key: str) -> tuple[str, ...]:
        """The terms the row was indexed with."""
        return self._terms_of[self._row_of[key]]

    # ------------------------------------------------------------------ writes
    def add(self, key: str, vector: np.ndarray, terms: Sequence[str], prior: float = 0.0) -> None:
        row = self._add_row(key, vector, terms, prior)
        if self._hnsw is not None:
            self._hnsw_add([row])
        elif len(self._row_of) > self.hnsw_threshold:
            self._build_hnsw()

    def add_many(self, items: Iterable[tuple[str, np.ndarray, Sequence[str]]], priors: Sequence[float] = ()) -> None:
        """Bulk add: the graph index gets one batched insert (or one build) instead of one per row."""
        items = list(items)
        priors = priors or [0.0] * len(items)
        rows = [self._add_row(key, vec, terms, p) for (key, vec, terms), p in zip(items, priors, strict=True)]
        if self._hnsw is not None:
            self._hnsw_add(rows)
        elif len(self._row_of) > self.hnsw_threshold:
            self._build_hnsw()

    def set_prior(self, key: str, prior: float) -> None:
        self._prior[self._row_of[key]] = prior

    def _add_row(self, key: str, vector: np.ndarray, terms: Sequence[str], prior: float) -> int:
        if key in self._row_of:
            self.remove(key)
        row = len(self._keys)
        if row >= len(self._alive):
            grow = len(self._alive) * 2
            self._vectors = np.resize(self._vectors, (grow, self.dim))
            self._alive = np.concatenate([self._alive, np.zeros(grow - len(self._alive), bool)])
            self._prior = np.concatenate([self._prior, np.zeros(grow - len(self._prior), np.float32)])
            self._doc_len = np.concatenate([self._doc_len, np.zeros(grow - len(self._doc_len), np.float32)])
        self._vectors[row] = vector
        self._alive[row] = True
        self._prior[row] = prior
        self._keys.append(key)
        self._row_of[key] = row
        counts: dict[str, int] = {}
        for t in terms:
            counts[t] = counts.get(t, 0) + 1
        df, postings = self._df, self._postings
        for t, tf in counts.items():
            df[t] = df.get(t, 0) + 1
            posting = postings.get(t)
            if posting is None:
                posting = postings[t] = ([], [])
            posting[0].append(row)
            posting[1].append(tf)
        self._posting_arrays.clear()
        self._terms_of.append(tuple(terms))
        self._doc_len[row] = len(terms)
        self._total_len += len(terms)
        return row

    def remove(self, key: str) -> bool:
        row = self._row_of.pop(key, None)
        if row is None:
            return False
        self._alive[row] = False
        self._keys[row] = None
        self._total_len -= float(self._doc_len[row])
        for term in set(self._terms_of[row]):
            self._df[term] -= 1
        self._posting_arrays.clear()
        if self._hnsw is not None:
            self._hnsw.mark_deleted(row)
        if len(self._keys) - len(self._row_of) > max(1024, len(self._row_of)):
            self._compact()
        return True

    def _compact(self) -> None:
        """Rebuild without dead rows once they outnumber the live ones (updates re-add rows)."""
        live = [(key, self._vectors[row].copy(), self._terms_of[row]) for key, row in self._row_of.items()]
        priors = [float(self._prior[row]) for row in self._row_of.values()]
        self.__init__(self.dim, dense_weight=self.dense_weight, hnsw_threshold=self.hnsw_threshold,  # type: ignore[misc]
                      ef=self._ef, m=self._m)
        self.add_many(live, priors)

    def _build_hnsw(self) -> None:
        index = hnswlib.Index(space="ip", dim=self.dim)
        index.init_index(max_elements=max(2 * len(self._keys), 1024), ef_construction=100, M=self._m)
        index.set_ef(self._ef)
        self._hnsw = index
        rows = np.flatnonzero(self._alive[: len(self._keys)])
        self._hnsw_add(rows.tolist())

    def __getstate__(self) -> dict:
        # hnswlib indexes pickle themselves (graph included), so a saved index loads without a rebuild.
        return dict(self.__dict__, _posting_arrays={})

    def __setstate__(self, state: dict) -> None:
        state.setdefault("_prior", np.zeros(len(state["_alive"]), np.float32))  # files saved before priors
        self.__dict__.update(state)

    def _hnsw_add(self, rows: list[int]) -> None:
        assert self._hnsw is not None
        needed = max(rows) + 1 if rows else 0
        if needed > self._hnsw.get_max_elements():
            self._hnsw.resize_index(max(needed * 2, 1024))
        if rows:
            self._hnsw.add_items(self._vectors[rows], np.asarray(rows, np.int64), num_threads=1)
            self._hnsw.set_ef(self._ef)

    # ------------------------------------------------------------------ reads
    def _weights(self, t: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The rows holding term t and its BM25 weight in each (dead rows included, masked later)."""
        arrays = self._posting_arrays.get(t)
        if arrays is None:
            posting = self._postings.get(t)
            if posting is None:
                return None
            n_docs = max(len(self._row_of), 1)
            avg_len = max(self._total_len / n_docs, 1.0)
            rows, tfs = np.asarray(posting[0], np.int64), np.asarray(posting[1], np.float32)
            df = self._df.get(t, 0)
            idf = math.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
            norm = BM25_K1 * (1.0 - BM25_B + BM25_B * self._doc_len[rows] / avg_len)
            arrays = self._posting_arrays[t] = (rows, (idf * tfs * (BM25_K1 + 1.0) / (tfs + norm)).astype(np.float32))
        return arrays

    def _lexical(self, terms: Iterable[str]) -> np.ndarray:
        acc = np.zeros(len(self._keys), np.float32)
        for t in set(terms):
            arrays = self._weights(t)
            if arrays is not None:
                # A row is in a term's posting once (tf counts repeats), so a plain fancy-index add is exact.
                acc[arrays[0]] += arrays[1]
        return acc

    def search(self, vector: np.ndarray | None, terms: Sequence[str], k: int) -> list[Hit]:
        """Top k rows by fused score: dense_weight * cosine + (1 - dense_weight) * squashed BM25 + prior."""
        top, fused, dense, lex = self._top(vector, terms, k)
        return _hits(self._keys, top, fused, dense, lex, self._vectors[top])

    def ranked(self, vector: np.ndarray | None, terms: Sequence[str], k: int) -> tuple[list[str], list[float]]:
        """The keys and fused scores of search(), best first, without a Hit object per row."""
        top, fused, _, _ = self._top(vector, terms, k)
        keys = self._keys
        return [keys[r] for r in top.tolist()], fused.tolist()  # type: ignore[misc]  # live rows have keys

    def _top(self, vector: np.ndarray | None, terms: Sequence[str],
             k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(rows, fused, dense, lexical) of the top k live rows, best first (ties by row)."""
        n_rows = len(self._keys)
        if not self._row_of or k <= 0:
            return NO_ROWS, NO_SCORES, NO_SCORES, NO_SCORES
        alive = self._alive[:n_rows]
        w = self.dense_weight
        has_vector = vector is not None and bool(vector.any())
        if has_vector and self._hnsw is None:  # exact: every row has a dense score
            raw = self._lexical(terms) if terms else np.zeros(n_rows, np.float32)
            dense_of = self._vectors[:n_rows] @ vector
            # Fuse, skip the dead and keep the best k in one compiled pass (a handful of numpy
            # temporaries of n rows otherwise).
            top, fused, lex = fastpath.fused_top_k(dense_of, raw, self._prior[:n_rows], alive, w, LEXICAL_HALF, k)
            return top, fused, dense_of[top], lex
        # Graph path: two candidate lists, the graph index's 2k nearest rows and the 2k best lexical
        # rows, fused and ranked in one compiled call (postings summed, no array of n rows built here).
        dense_rows = NO_ROWS
        if has_vector:
            want = min(k * 2, len(self._row_of))
            self._hnsw.set_ef(max(self._ef, want))
            # hnswlib labels are uint64 row numbers (< 2**63): the same bytes read as int64, no copy.
            dense_rows = self._hnsw.knn_query(vector, k=want, num_threads=1)[0][0].view(np.int64)
        postings = [p for p in map(self._weights, set(terms)) if p is not None]
        return fastpath.hybrid_top_k(
            [p[0] for p in postings], [p[1] for p in postings], dense_rows, self._vectors[:n_rows],
            vector if has_vector else None, self._prior[:n_rows], alive, w, LEXICAL_HALF, k, k * 2)


def _hits(keys: list[str | None], rows: np.ndarray, fused: np.ndarray, dense: np.ndarray,
          lexical: np.ndarray, vectors: np.ndarray) -> list[Hit]:
    # One tolist() per array instead of a numpy scalar per field and row.
    return [Hit(keys[r], f, d, x, v) for r, f, d, x, v in zip(rows.tolist(), fused.tolist(), dense.tolist(),
                                                               lexical.tolist(), vectors, strict=True)]

