"""fastpath._ranking (set overlaps, fused and hybrid top-k, windowed BM25, co-occurring and feedback
terms) agrees exactly with fastpath.reference.ranking, and both follow the spec."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastpath
from fastpath import reference as ref
from tests.fastpath_checks import FAST, IMPLS, same, same_floats

_ID_SETS = st.lists(st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 40), max_size=30, unique=True)
                    .map(lambda xs: np.array(sorted(xs), np.uint64)), max_size=8)


@FAST
@given(_ID_SETS, _ID_SETS)
def test_overlap_counts_match_reference(a, b):
    got = fastpath.overlap_counts(a, b)
    assert got.dtype == np.int32 and got.shape == (len(a), len(b))
    assert np.array_equal(got, ref.overlap_counts(a, b))
    for r, x in enumerate(a):  # and both are the plain set intersection
        for c, y in enumerate(b):
            assert got[r, c] == len(set(x.tolist()) & set(y.tolist()))


@IMPLS
def test_overlap_counts_need_sorted_unique_ids(impl):
    ok = np.array([1, 2], np.uint64)
    for bad in (np.array([2, 1], np.uint64), np.array([3, 3], np.uint64)):
        with pytest.raises(ValueError, match=r"b_sets\[1\] must be sorted and unique"):
            impl.overlap_counts([ok], [ok, bad])
    with pytest.raises(ValueError, match=r"a_sets\[0\] must be 1-D"):
        impl.overlap_counts([np.zeros((2, 2), np.uint64)], [ok])


_SMALL_SETS = st.lists(st.integers(0, 12), max_size=8, unique=True).map(lambda xs: np.array(sorted(xs), np.uint64))


@FAST
@given(st.data())
def test_best_matches_match_reference(data):
    """Ties (equal cosines, shares that tie a cosine), thresholds hit exactly and empty sides."""
    na, nb = data.draw(st.integers(0, 6)), data.draw(st.integers(0, 6))
    a = data.draw(st.lists(_SMALL_SETS, min_size=na, max_size=na))
    b = data.draw(st.lists(_SMALL_SETS, min_size=nb, max_size=nb))
    values = st.sampled_from([-1.0, -0.25, 0.0, 0.2, 0.45, 0.5, 0.9, 1.0]) | st.floats(-1, 1, width=32)
    cos = np.array(data.draw(st.lists(values, min_size=na * nb, max_size=na * nb)), np.float32).reshape(na, nb)
    floor, min_shared = data.draw(st.sampled_from([0.2, 0.0, -2.0])), data.draw(st.integers(0, 3))
    scale = data.draw(st.sampled_from([0.75, 1.0, 2.0]))
    got = fastpath.best_matches(cos, a, b, floor, min_shared, scale)
    want = ref.best_matches(cos, a, b, floor, min_shared, scale)
    assert all(same_floats(g, w) if g.dtype.kind == "f" else same(g, w) for g, w in zip(got, want, strict=True))
    best, score, cosine = got
    for r in range(na):  # and both are the plain definition: the first column of the best score
        scores = [max(float(cos[r, c]), len(set(a[r].tolist()) & set(b[c].tolist())) / max(len(a[r]), 1) * scale
                      if cos[r, c] >= floor and len(set(a[r].tolist()) & set(b[c].tolist())) >= min_shared
                      else float(cos[r, c])) for c in range(nb)]
        assert best[r] == (scores.index(max(scores)) if nb else -1)
        if nb:
            assert score[r] == max(scores) and cosine[r] == float(cos[r, best[r]])


@IMPLS
def test_best_matches_check_shapes(impl):
    ok = np.array([1, 2], np.uint64)
    with pytest.raises(ValueError, match=r"cos must have shape \(1, 2\)"):
        impl.best_matches(np.zeros((2, 1), np.float32), [ok], [ok, ok], 0.2, 1, 1.0)
    with pytest.raises(ValueError, match=r"b_sets\[0\] must be sorted and unique"):
        impl.best_matches(np.zeros((1, 1), np.float32), [ok], [np.array([2, 1], np.uint64)], 0.2, 1, 1.0)


@FAST
@given(st.data())
def test_fused_top_k_match_reference(data):
    """Ties (repeated values, so equal fused scores), dead rows, infinities from the dense side, k
    beyond the rows, and weights that push float32 products to overflow."""
    n = data.draw(st.integers(0, 40))
    values = st.sampled_from([0.0, -0.0, 0.5, 1.0, -1.0, 3.0]) | st.floats(-2, 2, width=32)
    dense = np.array(data.draw(st.lists(values | st.sampled_from([math.inf, -math.inf, 3e38]), min_size=n,
                                        max_size=n)), np.float32)
    lexical = np.array(data.draw(st.lists(st.sampled_from([0.0, 1.0, 2.5]) | st.floats(0, 50, width=32),
                                          min_size=n, max_size=n)), np.float32)
    prior = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.1, 0.2]), min_size=n, max_size=n)), np.float32)
    alive = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    w = data.draw(st.sampled_from([0.0, 0.2, 0.6, 1.0, 2.0, 1e30]))
    half, k = data.draw(st.sampled_from([2.0, 0.5, 1e-3])), data.draw(st.integers(-1, 45))
    got = fastpath.fused_top_k(dense, lexical, prior, alive, w, half, k)
    want = ref.fused_top_k(dense, lexical, prior, alive, w, half, k)
    assert same(got[0], want[0]) and same_floats(got[1], want[1]) and same_floats(got[2], want[2])
    with np.errstate(all="ignore"):  # and both are numpy's float32 formula, ranked by (-fused, row)
        lex = lexical / (lexical + np.float32(half))
        fused = np.float32(w) * dense + np.float32(1.0 - w) * lex + prior
    rows = sorted((i for i in range(n) if alive[i] and np.isfinite(fused[i])), key=lambda i: (-fused[i], i))
    assert got[0].tolist() == rows[:max(k, 0)]
    assert same_floats(got[1], fused[got[0]]) and same_floats(got[2], lex[got[0]])


@IMPLS
def test_fused_top_k_check_inputs(impl):
    one = np.ones(1, np.float32)
    with pytest.raises(ValueError, match="lexical must have length 1"):
        impl.fused_top_k(one, np.ones(2, np.float32), one, np.ones(1, bool), 0.5, 2.0, 1)
    with pytest.raises(ValueError, match="lexical must be >= 0"):
        impl.fused_top_k(one, -one, one, np.ones(1, bool), 0.5, 2.0, 1)
    with pytest.raises(ValueError, match="half must be > 0"):
        impl.fused_top_k(one, one, one, np.ones(1, bool), 0.5, 0.0, 1)


@FAST
@given(st.data())
def test_hybrid_top_k_match_reference(data):
    """Postings that repeat rows and terms, dead rows, zero weights (a posting with no lexical
    score), dense rows that are also lexical winners or dead, no query vector, dims that are not a
    multiple of the 8 sum lanes, overflowing weights, and both lists cut short."""
    n = data.draw(st.integers(0, 30))
    dim = data.draw(st.integers(1, 19))
    floats = st.sampled_from([0.0, 0.5, 1.0, -1.0]) | st.floats(-2, 2, width=32)
    vectors = np.array(data.draw(st.lists(floats, min_size=n * dim, max_size=n * dim)), np.float32).reshape(n, dim)
    query = (None if n == 0 or data.draw(st.booleans()) else
             np.array(data.draw(st.lists(floats, min_size=dim, max_size=dim)), np.float32))
    rows = st.integers(0, n - 1) if n else st.nothing()
    n_terms = data.draw(st.integers(0, 4)) if n else 0
    term_rows = [np.array(data.draw(st.lists(rows, max_size=12)), np.int64) for _ in range(n_terms)]
    weights = st.sampled_from([0.0, 1.0, 2.5]) | st.floats(0, 50, width=32)
    term_weights = [np.array(data.draw(st.lists(weights, min_size=len(r), max_size=len(r))), np.float32)
                    for r in term_rows]
    dense_rows = np.array(data.draw(st.lists(rows, max_size=10)) if n else [], np.int64)
    prior = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.1, 3e38]), min_size=n, max_size=n)), np.float32)
    alive = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)), bool)
    w = data.draw(st.sampled_from([0.0, 0.55, 0.6, 1.0]))
    half = data.draw(st.sampled_from([4.0, 0.5]))
    k, lexical_k = data.draw(st.integers(-1, 12)), data.draw(st.integers(0, 12))
    args = (term_rows, term_weights, dense_rows, vectors, query, prior, alive, w, half, k, lexical_k)
    got, want = fastpath.hybrid_top_k(*args), ref.hybrid_top_k(*args)
    assert same(got[0], want[0]) and all(same_floats(g, x) for g, x in zip(got[1:], want[1:], strict=True))
    # And the rule in numpy terms: the raw sums (np.add.at), the two lists, the fusion.
    raw = np.zeros(n, np.float32)
    for r, x in zip(term_rows, term_weights, strict=True):
        np.add.at(raw, r, x)
    lex = raw / (raw + np.float32(half))
    lexical = sorted((r for r in range(n) if alive[r] and lex[r] > 0), key=lambda r: (-lex[r], r))[:lexical_k]
    candidates = set(lexical) | {r for r in dense_rows.tolist() if alive[r]}
    dense = vectors @ query if query is not None else np.zeros(n, np.float32)
    with np.errstate(all="ignore"):
        fused = np.float32(w) * dense + np.float32(1.0 - w) * lex + prior
    assert set(got[0].tolist()) <= candidates
    assert np.allclose(got[2], dense[got[0]], atol=1e-5) and same_floats(got[3], lex[got[0]])
    finite = [r for r in candidates if np.isfinite(fused[r])]
    assert len(got[0]) == min(max(k, 0), len(finite))
    if len(got[0]):  # best first, and nothing left out beats the last one kept
        assert np.all(np.diff(got[1]) <= 0)
        assert all(fused[r] <= got[1][-1] + 1e-5 for r in finite if r not in set(got[0].tolist()))


def test_hybrid_top_k_dense_sums_in_fixed_lanes():
    """The dense score's float32 sum order (element j into running sum j % 8, the sums then added
    pairwise) is part of the contract. 2**24 + 1 rounds back to 2**24 in float32, so a vector of
    ones with one 2**24 shows where each element was added: compiled and reference agree bit for
    bit at every dim and position."""
    for dim in range(1, 41):
        for big in range(dim):
            v = np.ones(dim, np.float32)
            v[big] = 2.0 ** 24
            args = ([], [], [0], v[None, :], np.ones(dim, np.float32), np.zeros(1, np.float32), np.ones(1, bool),
                    1.0, 4.0, 1, 0)
            assert same_floats(fastpath.hybrid_top_k(*args)[2], ref.hybrid_top_k(*args)[2]), (dim, big)


@IMPLS
def test_hybrid_top_k_check_inputs(impl):
    vectors, alive, prior = np.zeros((3, 2), np.float32), np.ones(3, bool), np.zeros(3, np.float32)
    rows, weights, q = [np.array([0, 2])], [np.ones(2, np.float32)], np.ones(2, np.float32)
    with pytest.raises(ValueError, match=r"term_rows\[0\] holds row 3, outside 0-2"):
        impl.hybrid_top_k([np.array([3])], [np.ones(1, np.float32)], [], vectors, q, prior, alive, 0.5, 4.0, 2, 2)
    with pytest.raises(ValueError, match="dense_rows holds row -1"):
        impl.hybrid_top_k(rows, weights, [-1], vectors, q, prior, alive, 0.5, 4.0, 2, 2)
    with pytest.raises(ValueError, match=r"term_weights\[0\] must be >= 0"):
        impl.hybrid_top_k(rows, [-np.ones(2, np.float32)], [], vectors, q, prior, alive, 0.5, 4.0, 2, 2)
    with pytest.raises(ValueError, match=r"term_weights\[0\] must have length 2"):
        impl.hybrid_top_k(rows, [np.ones(3, np.float32)], [], vectors, q, prior, alive, 0.5, 4.0, 2, 2)
    with pytest.raises(ValueError, match="term_weights must have length 1"):
        impl.hybrid_top_k(rows, [], [], vectors, q, prior, alive, 0.5, 4.0, 2, 2)
    with pytest.raises(ValueError, match=r"vectors must have shape \(3, 3\)"):
        impl.hybrid_top_k(rows, weights, [], vectors, np.ones(3, np.float32), prior, alive, 0.5, 4.0, 2, 2)
    with pytest.raises(ValueError, match="prior must have length 3"):
        impl.hybrid_top_k(rows, weights, [], vectors, q, np.zeros(2, np.float32), alive, 0.5, 4.0, 2, 2)
    with pytest.raises(ValueError, match="half must be > 0"):
        impl.hybrid_top_k(rows, weights, [], vectors, q, prior, alive, 0.5, 0.0, 2, 2)


@FAST
@given(st.data())
def test_window_bm25_match_reference(data):
    """Rows listed twice in a term's postings, zero counts and zero decays (no neighbour weight),
    rows without neighbours, a row whose norm is 0 (0 / 0 = NaN from every term, touched or not),
    groups that repeat a term, name none or skip some, overflowing counts: compiled and reference
    agree bit for bit; and both agree with the rule written with numpy (bincount, then saturate)."""
    n = data.draw(st.integers(0, 25))
    w = data.draw(st.sampled_from([2, 4, 8]))
    rows = st.integers(0, n - 1) if n else st.nothing()
    nbr = np.array(data.draw(st.lists(st.integers(-1, n - 1), min_size=n * w, max_size=n * w)) if n else [],
                   np.int32).reshape(n, w)
    decay = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.55, 0.3025, 1.0]), min_size=w, max_size=w)), np.float32)
    norm = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.25, 1.0]) | st.floats(0.125, 4, width=32),
                                       min_size=n, max_size=n)), np.float32)
    n_terms = data.draw(st.integers(0, 5)) if n else 0
    term_rows = [np.array(data.draw(st.lists(rows, max_size=8)), np.int64) for _ in range(n_terms)]
    counts = st.sampled_from([0.0, 1.0, 2.0, 3e38]) | st.floats(0, 8, width=32)
    term_tfs = [np.array(data.draw(st.lists(counts, min_size=len(r), max_size=len(r))), np.float32) for r in term_rows]
    idf = np.array(data.draw(st.lists(st.floats(0, 12, width=32), min_size=n_terms, max_size=n_terms)), np.float32)
    slot = st.integers(0, n_terms - 1) if n_terms else st.nothing()
    groups = [np.array(data.draw(st.lists(slot, max_size=6 if n_terms else 0)), np.int64)
              for _ in range(data.draw(st.integers(0, 3)))]
    k1 = data.draw(st.sampled_from([1.2, 0.9, 2.0]))
    args = (term_rows, term_tfs, nbr, decay, norm, idf, groups, k1)
    got, want = fastpath.window_bm25(*args), ref.window_bm25(*args)
    assert got.shape == (len(groups), n) and same_floats(got, want)
    # The rule in numpy terms (the formulation the episodic ranker used before): each posting's count
    # at its row and, decayed, at its neighbours' rows, summed by bincount; saturated; idf-weighted.
    with np.errstate(all="ignore"):
        sat = np.zeros((n_terms, n), np.float32)
        for t, (r, tf) in enumerate(zip(term_rows, term_tfs, strict=True)):
            targets = np.concatenate([r, nbr[r].ravel()]).astype(np.int64)
            weights = np.concatenate([tf, (tf[:, None] * decay[::-1]).ravel()])
            ok = (targets >= 0) & (weights > 0)
            x = np.bincount(targets[ok], weights[ok], minlength=n).astype(np.float32)
            sat[t] = x * np.float32(k1 + 1.0) / (x + np.float32(k1) * norm)
        for g, group in enumerate(groups):
            expect = (idf[group][:, None] * sat[group]).sum(axis=0) if len(group) else np.zeros(n, np.float32)
            assert np.allclose(got[g], expect, rtol=1e-5, atol=1e-6, equal_nan=True)


@IMPLS
def test_window_bm25_check_inputs(impl):
    nbr, decay, norm = np.full((3, 2), -1, np.int32), np.ones(2, np.float32), np.ones(3, np.float32)
    rows, tfs, idf = [np.array([0, 2])], [np.ones(2, np.float32)], np.ones(1, np.float32)
    with pytest.raises(ValueError, match=r"term_rows\[0\] holds row 3, outside 0-2"):
        impl.window_bm25([np.array([3])], [np.ones(1, np.float32)], nbr, decay, norm, idf, [[0]], 1.2)
    with pytest.raises(ValueError, match=r"term_tfs\[0\] must be >= 0"):
        impl.window_bm25(rows, [-np.ones(2, np.float32)], nbr, decay, norm, idf, [[0]], 1.2)
    with pytest.raises(ValueError, match=r"term_tfs\[0\] must have length 2"):
        impl.window_bm25(rows, [np.ones(3, np.float32)], nbr, decay, norm, idf, [[0]], 1.2)
    with pytest.raises(ValueError, match="term_tfs must have length 1"):
        impl.window_bm25(rows, [], nbr, decay, norm, idf, [[0]], 1.2)
    with pytest.raises(ValueError, match=r"groups\[1\] holds row 1, outside 0-0"):
        impl.window_bm25(rows, tfs, nbr, decay, norm, idf, [[0], [1]], 1.2)
    with pytest.raises(ValueError, match=r"nbr must be an integer array of shape \(3, 2\)"):
        impl.window_bm25(rows, tfs, nbr[:, :1], decay, norm, idf, [[0]], 1.2)
    with pytest.raises(ValueError, match="nbr holds a row outside -1-2"):
        impl.window_bm25(rows, tfs, np.full((3, 2), 3, np.int32), decay, norm, idf, [[0]], 1.2)
    with pytest.raises(ValueError, match="decay must be >= 0"):
        impl.window_bm25(rows, tfs, nbr, -decay, norm, idf, [[0]], 1.2)
    with pytest.raises(ValueError, match="idf must be finite and >= 0"):
        impl.window_bm25(rows, tfs, nbr, decay, norm, np.full(1, np.inf, np.float32), [[0]], 1.2)
    with pytest.raises(ValueError, match="idf must have length 1"):
        impl.window_bm25(rows, tfs, nbr, decay, norm, np.ones(2, np.float32), [[0]], 1.2)


@FAST
@given(st.data())
def test_cooccurring_terms_match_reference(data):
    """Rows holding no term or one term twice, query terms sharing rows, empty query terms, excluded
    ids (some outside the vocabulary), ties, k of 0 or more than there are: compiled and reference agree
    bit for bit; and both follow the rule written with numpy (bincount per query term, PMI, sum)."""
    n = data.draw(st.integers(0, 20))
    size = data.draw(st.integers(1, 12))
    per_row = [data.draw(st.lists(st.integers(0, size - 1), max_size=5)) for _ in range(n)]
    ptr = np.concatenate([[0], np.cumsum([len(x) for x in per_row])]).astype(np.int64)
    at = np.array([v for x in per_row for v in x], np.int32)
    df = np.bincount(at, minlength=size).astype(np.int32) + np.array(
        data.draw(st.lists(st.integers(0, 3), min_size=size, max_size=size)), np.int32)
    df = np.maximum(df, 1).astype(np.int32)
    rows = st.integers(0, n - 1) if n else st.nothing()
    term_rows = [np.array(sorted(set(data.draw(st.lists(rows, max_size=8 if n else 0)))), np.int64)
                 for _ in range(data.draw(st.integers(0, 4)))]
    exclude = np.array(data.draw(st.lists(st.integers(0, size + 2), max_size=3)), np.int64)
    n_rows, min_count, k = data.draw(st.sampled_from([n, n + 5, 0])), data.draw(st.integers(0, 3)), data.draw(st.integers(-1, 6))
    args = (term_rows, ptr, at, df, n_rows, min_count, exclude, k)
    got, want = fastpath.cooccurring_terms(*args), ref.cooccurring_terms(*args)
    assert same(got[0], want[0]) and same_floats(got[1], want[1])
    acc = np.zeros(size)
    for r in term_rows:
        if len(r):
            together = np.bincount(np.concatenate([at[ptr[x]:ptr[x + 1]] for x in r] + [np.zeros(0, np.int32)]),
                                   minlength=size)
            share = together / len(r)
            with np.errstate(divide="ignore"):
                gain = np.maximum(np.log(n_rows * share / df), 0.0) * share
            acc += np.where(together >= max(min_count, 1), gain, 0.0)
    acc[exclude[exclude < size]] = 0.0
    expect = sorted((-g, v) for v, g in enumerate(acc.tolist()) if g > 0)[:max(k, 0)]
    assert np.allclose(got[1], [-g for g, _ in expect], rtol=1e-12)
    assert len(got[0]) == len(expect)


@FAST
@given(st.data())
def test_feedback_terms_match_reference(data):
    """Rows holding no term or one term twice, a row listed twice, excluded ids (some outside the
    vocabulary), terms below min_df, ties, k of 0 or more than there are: compiled and reference agree
    bit for bit; and both follow the rule written with numpy (idf summed per term over the rows)."""
    n = data.draw(st.integers(0, 20))
    size = data.draw(st.integers(1, 12))
    per_row = [data.draw(st.lists(st.integers(0, size - 1), max_size=5)) for _ in range(n)]
    ptr = np.concatenate([[0], np.cumsum([len(x) for x in per_row])]).astype(np.int64)
    at = np.array([v for x in per_row for v in x], np.int32)
    df = (np.bincount(at, minlength=size) + np.array(
        data.draw(st.lists(st.integers(0, 3), min_size=size, max_size=size)))).astype(np.int32)
    rows = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=8)) if n else [], np.int64)
    exclude = np.array(data.draw(st.lists(st.integers(0, size + 2), max_size=3)), np.int64)
    n_rows, min_df, k = data.draw(st.sampled_from([n, n + 5, 0])), data.draw(st.integers(0, 3)), data.draw(st.integers(-1, 6))
    args = (rows, ptr, at, df, n_rows, min_df, exclude, k)
    got, want = fastpath.feedback_terms(*args), ref.feedback_terms(*args)
    assert same(got[0], want[0]) and same_floats(got[1], want[1])
    held = np.concatenate([at[ptr[r]:ptr[r + 1]] for r in rows] + [np.zeros(0, np.int32)])
    count = np.bincount(held, minlength=size)
    weight = count * np.log(1.0 + (n_rows - df + 0.5) / (df + 0.5))
    live = (count > 0) & (df >= max(min_df, 1))
    live[exclude[exclude < size]] = False
    expect = sorted(weight[live].tolist(), reverse=True)[:max(k, 0)]
    assert np.allclose(got[1], expect, rtol=1e-12) and len(got[0]) == len(expect)
    assert all(live[v] for v in got[0].tolist())


@IMPLS
def test_feedback_terms_check_inputs(impl):
    ptr, at, df = np.array([0, 2, 3]), np.array([0, 1, 1], np.int32), np.array([1, 2], np.int32)
    with pytest.raises(ValueError, match="rows holds row 2, outside 0-1"):
        impl.feedback_terms(np.array([2]), ptr, at, df, 2, 1, [], 3)
    with pytest.raises(ValueError, match="term_at holds term 5, outside 0-1"):
        impl.feedback_terms(np.array([0]), ptr, np.array([0, 5, 1], np.int32), df, 2, 1, [], 3)
    with pytest.raises(ValueError, match="term_ptr must rise"):
        impl.feedback_terms(np.array([0]), np.array([0, 4, 3]), at, df, 2, 1, [], 3)
    with pytest.raises(ValueError, match="n_rows must be >= 0"):
        impl.feedback_terms(np.array([0]), ptr, at, df, -1, 1, [], 3)


@IMPLS
def test_feedback_terms_rank_by_weight_then_first_appearance(impl):
    """Rows 1 then 0 are read: terms 2 and 1 appear in both (equal weights, 2 first as row 1 says it
    first), term 0 once; term 3 is excluded, term 4 is in fewer than min_df rows; k cuts the list."""
    rows = [[1, 0, 2, 4], [2, 1, 3], [5]]
    ptr = np.array([0, 4, 7, 8], np.int64)
    at = np.array([v for r in rows for v in r], np.int32)
    df = np.array([2, 2, 2, 2, 1, 1], np.int32)
    ids, weights = impl.feedback_terms(np.array([1, 0]), ptr, at, df, 3, 2, [3], 9)
    assert ids.tolist() == [2, 1, 0] and weights[0] == weights[1] == 2 * weights[2] > 0
    assert impl.feedback_terms(np.array([1, 0]), ptr, at, df, 3, 2, [3], 1)[0].tolist() == [2]
    assert impl.feedback_terms(np.array([1, 0]), ptr, at, df, 3, 1, [3], 9)[0].tolist() == [4, 2, 1, 0]  # the rarest first
    assert impl.feedback_terms(np.array([], np.int64), ptr, at, df, 3, 2, [], 9)[0].tolist() == []


@IMPLS
def test_cooccurring_terms_check_inputs(impl):
    ptr, at, df = np.array([0, 2, 3]), np.array([0, 1, 1], np.int32), np.array([1, 2], np.int32)
    with pytest.raises(ValueError, match=r"term_rows\[0\] holds row 2, outside 0-1"):
        impl.cooccurring_terms([np.array([2])], ptr, at, df, 2, 1, [], 3)
    with pytest.raises(ValueError, match="term_at holds term 5, outside 0-1"):
        impl.cooccurring_terms([np.array([0])], ptr, np.array([0, 5, 1], np.int32), df, 2, 1, [], 3)
    with pytest.raises(ValueError, match="term_ptr must rise"):
        impl.cooccurring_terms([np.array([0])], np.array([0, 4, 3]), at, df, 2, 1, [], 3)
    with pytest.raises(ValueError, match=r"term_df\[1\] must be >= 1"):
        impl.cooccurring_terms([np.array([0])], ptr, at, np.array([1, 0], np.int32), 2, 1, [], 3)
    with pytest.raises(ValueError, match="n_rows must be >= 0"):
        impl.cooccurring_terms([np.array([0])], ptr, at, df, -1, 1, [], 3)


@IMPLS
def test_cooccurring_terms_rank_by_gain_then_id(impl):
    """Terms 3, 1 and 2 are in both rows of the query term: equal gains, ranked by id. Term 0 is in one
    of them (a lower gain, and none with min_count 2); term 4 is excluded; k cuts the list."""
    rows = [[3, 1, 2, 0, 4], [2, 1, 3, 4], [5]]
    ptr = np.array([0, 5, 9, 10], np.int64)
    at = np.array([v for r in rows for v in r], np.int32)
    df = np.array([1, 2, 2, 2, 2, 1], np.int32)
    ids, gains = impl.cooccurring_terms([np.array([0, 1])], ptr, at, df, 3, 1, [4], 2)
    assert ids.tolist() == [1, 2] and gains[0] == gains[1] > 0
    ids, gains = impl.cooccurring_terms([np.array([0, 1])], ptr, at, df, 3, 1, [4], 9)
    assert ids.tolist() == [1, 2, 3, 0] and gains[2] > gains[3] > 0
    assert impl.cooccurring_terms([np.array([0, 1])], ptr, at, df, 3, 2, [4], 9)[0].tolist() == [1, 2, 3]


@FAST
@given(st.data())
def test_newer_first_match_reference(data):
    """Turns sharing all, some or none of the query terms, of one speaker or two, at equal or
    different times, with equal or very different scores: compiled and reference agree bit for bit;
    and every update the rule names ends with the newer turn above the older one."""
    n = data.draw(st.integers(1, 40))
    rows = np.array(data.draw(st.lists(st.integers(0, n - 1), max_size=12, unique=True)), np.int64)
    m = len(rows)
    postings = [np.array(sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n))), np.int64)
                for _ in range(data.draw(st.integers(0, 5)))]
    when = np.array(data.draw(st.lists(st.integers(0, 3), min_size=m, max_size=m)), np.int64)
    who = np.array(data.draw(st.lists(st.integers(0, 1), min_size=m, max_size=m)), np.int64)
    scores = np.array(data.draw(st.lists(st.floats(0.01, 1.0), min_size=m, max_size=m)), np.float64)
    cover, least = data.draw(st.sampled_from([0.0, 0.5, 1.0])), data.draw(st.sampled_from([0.0, 0.5, 2.0]))
    args = (postings, n, rows, when, who, scores, cover, least)
    got, want = fastpath.newer_first(*args), ref.newer_first(*args)
    assert same_floats(got, want)
    said = np.array([[r in set(p.tolist()) for p in postings] for r in rows.tolist()], bool).reshape(m, len(postings))
    idf = np.array([math.log1p((n - len(p) + 0.5) / (len(p) + 0.5)) for p in postings])
    mass = said @ idf
    for i in range(m):
        for j in range(m):
            newer = (when[j], rows[j]) > (when[i], rows[i])
            if (newer and who[i] == who[j] and mass[i] > 0 and mass[j] > 0
                    and (said[i] & said[j]) @ idf >= (cover - 1e-9) * mass[i] and scores[j] >= least * scores[i]):
                assert got[j] > got[i] and got[j] >= scores[i]


@IMPLS
def test_newer_first_lifts_a_chain_of_tellings_and_checks_inputs(impl):
    postings = [np.array([0, 1, 2, 5]), np.array([0, 2])]  # term 0 said by rows 0-2 and 5, term 1 by 0 and 2
    rows, when, who = np.array([0, 1, 2, 5]), np.array([10, 20, 30, 40]), np.array([1, 1, 1, 2])
    out = impl.newer_first(postings, 8, rows, when, who, np.array([0.9, 0.5, 0.8, 0.95]), 1.0, 0.0)
    # Row 1 says term 0 only, so it is no update of row 0 (which also says term 1); row 2 says both and
    # updates both, so it scores above the better of them; row 5 is another speaker's and keeps its score.
    assert out[2] > out[0] > 0.9 > out[1] > 0.5 and out[3] == 0.95
    with pytest.raises(ValueError, match="rows must be distinct"):
        impl.newer_first(postings, 8, np.array([0, 0]), when[:2], who[:2], np.ones(2), 1.0, 0.0)
    with pytest.raises(ValueError, match="must be ascending and unique"):
        impl.newer_first([np.array([2, 1])], 8, rows, when, who, np.ones(4), 1.0, 0.0)
    with pytest.raises(ValueError, match="rows holds row 9, outside 0-7"):
        impl.newer_first(postings, 8, np.array([9]), when[:1], who[:1], np.ones(1), 1.0, 0.0)
    with pytest.raises(ValueError, match="when must have length 4"):
        impl.newer_first(postings, 8, rows, when[:2], who, np.ones(4), 1.0, 0.0)
