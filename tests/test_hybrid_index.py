"""HybridIndex against a from-scratch reference: after any sequence of adds, re-adds and removes
(cached BM25 weights invalidated, dead rows compacted, a pickle round trip), the fused score of
every live row is dense_weight * cosine + (1 - dense_weight) * squashed BM25 + its prior."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.index.hybrid import BM25_B, BM25_K1, LEXICAL_HALF, HybridIndex

DIM = 8
WORDS = ["db", "pool", "api", "5xx", "lag"]


def reference_scores(rows: dict[str, tuple[np.ndarray, list[str], float]], vector: np.ndarray, query: list[str],
                     w: float) -> dict[str, float]:
    n = len(rows)
    avg_len = max(sum(len(t) for _, t, _ in rows.values()) / max(n, 1), 1.0)
    out = {}
    for key, (vec, words, prior) in rows.items():
        bm25 = 0.0
        for q in set(query):
            tf = words.count(q)
            if not tf:
                continue
            df = sum(1 for _, t, _ in rows.values() if q in t)
            idf = math.log(1.0 + (n - df + 0.5) / (df + 0.5))
            bm25 += idf * tf * (BM25_K1 + 1) / (tf + BM25_K1 * (1 - BM25_B + BM25_B * len(words) / avg_len))
        out[key] = w * float(vec @ vector) + (1 - w) * bm25 / (bm25 + LEXICAL_HALF) + prior
    return out


op = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 4), st.lists(st.sampled_from(WORDS), min_size=1, max_size=6),
              st.integers(0, 2**31), st.sampled_from([0.0, 0.03, 0.05])),
    st.tuples(st.just("remove"), st.integers(0, 4)),
    st.tuples(st.just("prior"), st.integers(0, 4), st.sampled_from([0.0, 0.05])),
    st.tuples(st.just("search"), st.lists(st.sampled_from(WORDS), min_size=0, max_size=3), st.integers(0, 2**31)),
    st.just(("pickle",)),
)


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


@pytest.mark.parametrize("hnsw_threshold", [4096, 1], ids=["exact", "hnsw"])
@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op, min_size=1, max_size=40))
def test_index_matches_the_reference_after_any_history(hnsw_threshold, ops):
    """Both search paths: the exact scan, and the graph index with a lexical top-k beside it (with
    at most five rows, the graph's k nearest are all rows, so every live row must come back)."""
    index = HybridIndex(DIM, dense_weight=0.6, hnsw_threshold=hnsw_threshold)
    rows: dict[str, tuple[np.ndarray, list[str], float]] = {}
    for o in ops:
        if o[0] == "add":
            key, words, seed, prior = f"k{o[1]}", o[2], o[3], o[4]
            index.add(key, unit(seed), words, prior)
            rows[key] = (unit(seed), words, prior)
        elif o[0] == "remove":
            assert index.remove(f"k{o[1]}") == (rows.pop(f"k{o[1]}", None) is not None)
        elif o[0] == "prior" and f"k{o[1]}" in rows:
            index.set_prior(f"k{o[1]}", o[2])
            vec, words, _ = rows[f"k{o[1]}"]
            rows[f"k{o[1]}"] = (vec, words, o[2])
        elif o[0] == "pickle":
            index = pickle.loads(pickle.dumps(index))
        elif o[0] == "search":
            check(index, rows, o[1], unit(o[2]))
        check(index, rows, WORDS, unit(0))  # after every step: stale cached weights would show
    assert len(index) == len(rows)


def check(index: HybridIndex, rows, query: list[str], vector: np.ndarray) -> None:
    hits = index.search(vector, query, 100)
    want = reference_scores(rows, vector, query, 0.6)
    assert sorted(h.key for h in hits) == sorted(want)
    for h in hits:
        assert abs(h.score - want[h.key]) < 1e-4, (h, want[h.key])
        assert np.allclose(h.vector, rows[h.key][0])
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_compaction_keeps_priors_and_scores():
    """Removing most rows compacts the index; the survivors keep their priors."""
    index = HybridIndex(DIM)
    for i in range(3000):
        index.add(f"k{i}", unit(i), ["db", "pool"] if i % 2 else ["api"], 0.05 if i % 3 == 0 else 0.0)
    for i in range(2990):
        index.remove(f"k{i}")
    assert len(index._keys) < 3000 and len(index._keys) - len(index) <= 1024  # compacted
    hits = {h.key: h.score for h in index.search(unit(7), ["db"], 10)}
    rows = {f"k{i}": (unit(i), ["db", "pool"] if i % 2 else ["api"], 0.05 if i % 3 == 0 else 0.0)
            for i in range(2990, 3000)}
    want = reference_scores(rows, unit(7), ["db"], index.dense_weight)
    assert hits.keys() == want.keys() and all(abs(hits[k] - want[k]) < 1e-4 for k in want)


def test_an_index_pickled_before_priors_loads_with_none():
    index = HybridIndex(DIM)
    index.add("a", unit(1), ["db"])
    state = index.__getstate__()
    del state["_prior"]
    old = HybridIndex.__new__(HybridIndex)
    old.__setstate__(state)
    assert [h.key for h in old.search(unit(1), ["db"], 3)] == ["a"]


def test_graph_search_fuses_the_dense_and_lexical_candidates():
    """Above the threshold a search fuses two candidate lists: the graph index's 2k nearest rows and
    the 2k best lexical rows (ties by row). On 2,000 rows, many of them lexical matches nowhere near
    the query's vector, the top k equal that rule applied to the exact scan's scores of every row
    (some rows removed, some with a prior)."""
    rng = np.random.default_rng(3)
    vocab = [f"w{i}" for i in range(60)]
    graph, exact = HybridIndex(DIM, hnsw_threshold=100), HybridIndex(DIM, hnsw_threshold=10**6)
    for i in range(2000):
        words = [vocab[min(int(rng.zipf(1.3)) - 1, 59)] for _ in range(int(rng.integers(1, 8)))]
        prior = 0.05 if i % 7 == 0 else 0.0
        for index in (graph, exact):
            index.add(f"k{i}", unit(i), words, prior)
    for i in range(0, 2000, 9):
        graph.remove(f"k{i}")
        exact.remove(f"k{i}")
    assert graph._hnsw is not None and exact._hnsw is None
    k, lexical_only = 10, 0
    for q in range(60):
        vector = unit(10_000 + q)
        terms = [str(t) for t in rng.choice(vocab[3:], size=int(rng.integers(0, 3)), replace=False)]
        every = exact.search(vector, terms, 2000)  # every live row with its dense and lexical score
        row = {h.key: int(h.key[1:]) for h in every}
        nearest = {h.key for h in sorted(every, key=lambda h: -h.dense)[:2 * k]}
        lexical = {h.key for h in sorted(every, key=lambda h: (-h.lexical, row[h.key]))[:2 * k] if h.lexical > 0}
        want = sorted((h for h in every if h.key in nearest | lexical), key=lambda h: (-h.score, row[h.key]))[:k]
        got = graph.search(vector, terms, k)
        assert [h.key for h in got] == [h.key for h in want], (q, terms)
        assert np.allclose([h.score for h in got], [h.score for h in want], atol=1e-6)
        lexical_only += sum(h.key not in nearest for h in want)
    assert lexical_only > 20  # the lexical side really had to find rows the dense side did not
