"""fastpath: the compiled routines agree exactly with the plain-Python reference, and both follow the spec."""

from __future__ import annotations

import importlib.machinery
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastpath
from fastpath import reference as ref

IMPLS = pytest.mark.parametrize("impl", [fastpath, ref], ids=["compiled", "reference"])
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def same_floats(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit-identical (so 0.0 != -0.0), same shape and dtype."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a.view(np.uint8), b.view(np.uint8)))


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))


def assert_same_selection(a: fastpath.Selection, b: fastpath.Selection) -> None:
    assert type(a) is type(b)
    for name in fastpath.Selection._fields:
        x, y = getattr(a, name), getattr(b, name)
        assert (same_floats(x, y) if name == "scores" else same(x, y)), name


# --------------------------------------------------------------------------------------------------
# Strategies
# --------------------------------------------------------------------------------------------------

# Few distinct values so that ties and duplicates are common.
tie_floats = st.sampled_from([0.0, -0.0, 0.25, 0.5, 1.0, -1.0, 3.0])
any_floats = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
floats = st.one_of(tie_floats, any_floats)
ages = st.one_of(st.sampled_from([0.0, -5.0, 60.0, 3600.0, 1e9]), st.floats(-1e4, 1e7))
tokens_st = st.one_of(st.sampled_from([0, 0, 1, 5, 400, 10**6]), st.integers(0, 2000))
BASE_HASHES = [0, 1, 0xFFFF_FFFF_FFFF_FFFF, 0x0123_4567_89AB_CDEF, 0xDEAD_BEEF_0000_0000]


@st.composite
def simhashes(draw: st.DrawFn) -> int:
    # Near variants of a few bases, so Hamming distances around the threshold are exercised.
    base = draw(st.one_of(st.sampled_from(BASE_HASHES), st.integers(0, 2**64 - 1)))
    for bit in draw(st.lists(st.integers(0, 63), max_size=5)):
        base ^= 1 << bit
    return base


@st.composite
def candidates(draw: st.DrawFn, max_n: int = 40) -> dict:
    n = draw(st.integers(0, max_n))
    ncat = draw(st.integers(0, 7))
    all_dup = draw(st.booleans()) and n > 0
    keys = st.lists(st.sampled_from([0, 1, 2, 3, 2**64 - 1]), min_size=n, max_size=n)
    exact = [7] * n if all_dup else draw(keys)
    return dict(
        relevance=np.array(draw(st.lists(floats, min_size=n, max_size=n)), dtype=np.float64),
        age_s=np.array(draw(st.lists(ages, min_size=n, max_size=n)), dtype=np.float64),
        priority=np.array(draw(st.lists(floats, min_size=n, max_size=n)), dtype=np.float64),
        tokens=np.array(draw(st.lists(tokens_st, min_size=n, max_size=n)), dtype=np.int32),
        # Includes ids outside 0..ncat-1, which are never selected.
        category=np.array(draw(st.lists(st.integers(-1, 7), min_size=n, max_size=n)), dtype=np.int32),
        exact_key=np.array(exact, dtype=np.uint64),
        simhash=np.array(draw(st.lists(simhashes(), min_size=n, max_size=n)), dtype=np.uint64),
        cat_budget=np.array(draw(st.lists(st.integers(-10, 3000), min_size=ncat, max_size=ncat)),
                            dtype=np.int64),
        total_budget=draw(st.one_of(st.integers(-5, 6000), st.just(2**70))),
    )


options = st.fixed_dictionaries({
    "w_relevance": floats, "w_recency": floats, "w_priority": floats,
    "half_life_s": st.one_of(st.sampled_from([0.0, -1.0, 3600.0]), st.floats(1e-3, 1e7)),
    "max_hamming": st.integers(-2, 70),
    "min_score": st.one_of(st.just(-math.inf), floats),
    "flow_unused": st.booleans(),
})

TEXT_ALPHABET = st.one_of(
    st.sampled_from(list("abcXYZ019_ -,.!?\t\n'\"")),
    st.sampled_from(list("中文测试一下我们的上下文ひらがなカタカナーＡ１éÉßİΣσς\u0307\u00b2\u2167😀\U00020001\uf900\u3000")),
    st.characters(codec="utf-8"),
)
texts_st = st.lists(st.text(TEXT_ALPHABET, max_size=40), max_size=12)


# --------------------------------------------------------------------------------------------------
# Compiled == reference (property tests)
# --------------------------------------------------------------------------------------------------


def test_compiled_extension_is_loaded():
    assert fastpath.select is not ref.select
    assert fastpath._core.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES))
    assert fastpath.Selection is ref.Selection
    for name in ("SELECTED", "OVER_BUDGET", "DUPLICATE", "LOW_SCORE"):
        assert getattr(fastpath, name) == getattr(ref, name)


@FAST
@given(candidates(), options)
def test_select_matches_reference(c, opts):
    assert_same_selection(fastpath.select(**c, **opts), ref.select(**c, **opts))


@FAST
@given(candidates(), options)
def test_building_blocks_match_reference(c, opts):
    args = (c["relevance"], c["age_s"], c["priority"], opts["w_relevance"], opts["w_recency"],
            opts["w_priority"], opts["half_life_s"])
    scores = fastpath.fuse_scores(*args)
    assert same_floats(scores, ref.fuse_scores(*args))
    order = fastpath.ranking_order(scores)
    assert same(order, ref.ranking_order(scores))
    assert same(order, np.argsort(-scores, kind="stable").astype(np.int64))
    n = len(scores)
    eligible = np.array([(i * 7) % 3 != 0 for i in range(n)], dtype=np.uint8)
    d_args = (order, c["exact_key"], c["simhash"], eligible, opts["max_hamming"])
    assert same(fastpath.dedup(*d_args), ref.dedup(*d_args))
    p_args = (order, c["tokens"], c["category"], eligible, c["cat_budget"], c["total_budget"],
              opts["flow_unused"])
    for x, y in zip(fastpath.greedy_pack(*p_args), ref.greedy_pack(*p_args), strict=True):
        assert same(x, y)


@FAST
@given(st.data(), st.integers(0, 200), st.integers(-1, 12))
def test_dedup_many_near_duplicates(data, n, max_hamming):
    # Larger n and clustered simhashes stress the compiled pigeonhole index (0 <= max_hamming <= 7)
    # and its linear-scan fallback against the reference's plain scan.
    bases = data.draw(st.lists(simhashes(), min_size=1, max_size=6))
    rnd = random.Random(data.draw(st.integers(0, 2**32)))
    sim = []
    for _ in range(n):
        h = rnd.choice(bases)
        for _ in range(rnd.randint(0, 9)):
            h ^= 1 << rnd.randrange(64)
        sim.append(h)
    order = np.array(rnd.sample(range(n), n), dtype=np.int64)
    exact = np.array([rnd.choice([0, 1, 2, rnd.getrandbits(64)]) for _ in range(n)], dtype=np.uint64)
    elig = np.array([rnd.random() < 0.9 for _ in range(n)], dtype=np.uint8)
    args = (order, exact, np.array(sim, dtype=np.uint64), elig, max_hamming)
    assert same(fastpath.dedup(*args), ref.dedup(*args))


@FAST
@given(texts_st)
def test_text_keys_match_reference(texts):
    for x, y in zip(fastpath.text_keys(texts), ref.text_keys(texts), strict=True):
        assert same(x, y)
    for t in texts:
        assert fastpath.tokenize(t) == ref.tokenize(t)


@FAST
@given(texts_st, st.sampled_from([1, 2, 7, 64, 256]))
def test_hash_embed_matches_reference(texts, dim):
    assert same_floats(fastpath.hash_embed(texts, dim), ref.hash_embed(texts, dim))


@FAST
@given(st.binary(max_size=64))
def test_fnv_matches_reference(data):
    assert fastpath.fnv1a64(data) == ref.fnv1a64(data)


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
def test_arrange_match_reference(data):
    """Batches of any size (empty ones too), with and without order keys (NaN: none), equal keys
    and equal scores (ties keep selection order), -0.0 against 0.0, infinite keys, slots shared
    by several batches or left empty."""
    sizes = data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=5))
    n = sum(sizes)
    starts = np.array([0, *np.cumsum(sizes)[:-1]], np.int64)
    n_slots = data.draw(st.integers(1, 4))
    slots = np.array(data.draw(st.lists(st.integers(0, n_slots - 1), min_size=len(sizes), max_size=len(sizes))), np.int64)
    keys = st.sampled_from([0.0, -0.0, 1.0, 2.0, math.nan, math.inf, -math.inf]) | st.floats(-5, 5)
    orders = [None if data.draw(st.booleans()) else np.array(data.draw(st.lists(keys, min_size=k, max_size=k)))
              for k in sizes]
    scores = np.array(data.draw(st.lists(st.sampled_from([0.0, 0.5, 1.0]) | st.floats(-3, 3), min_size=n, max_size=n)))
    tokens = np.array(data.draw(st.lists(st.integers(0, 500), min_size=n, max_size=n)), np.int32)
    picked = np.array(data.draw(st.permutations(range(n)))[:data.draw(st.integers(0, n))], np.int64)
    args = (picked, starts, slots, orders, scores, tokens, n_slots)
    got, want = fastpath.arrange(*args), ref.arrange(*args)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and same_floats(g, w) if g.dtype.kind == "f" else same(g, w)
    owner, index, key, rank, bounds, slot_tokens = got
    # And in numpy terms: owners, keys, slot grouping and order, token sums.
    assert (starts[owner] + index).tolist() == picked.tolist()
    for s in range(n_slots):
        members = rank[bounds[s]:bounds[s + 1]].tolist()
        assert all(slots[owner[p]] == s for p in members)
        assert members == sorted(members, key=lambda p: (key[p], p))
        assert slot_tokens[s] == sum(int(tokens[picked[p]]) for p in members)
    assert sorted(rank.tolist()) == list(range(len(picked)))


@IMPLS
def test_arrange_check_inputs(impl):
    one, scores, tokens = np.zeros(1, np.int64), np.ones(3), np.ones(3, np.int32)
    with pytest.raises(ValueError, match="picked holds row 3, outside 0-2"):
        impl.arrange(np.array([3]), one, one, [None], scores, tokens, 1)
    with pytest.raises(ValueError, match="starts must rise from 0"):
        impl.arrange(one, np.array([1]), one, [None], scores, tokens, 1)
    with pytest.raises(ValueError, match=r"slots\[0\] is 2, outside 0-1"):
        impl.arrange(one, one, np.array([2]), [None], scores, tokens, 2)
    with pytest.raises(ValueError, match="orders must have length 1"):
        impl.arrange(one, one, one, [], scores, tokens, 1)
    with pytest.raises(ValueError, match=r"orders\[0\] must have length 3"):
        impl.arrange(one, one, one, [np.zeros(2)], scores, tokens, 1)
    with pytest.raises(ValueError, match="scores must not contain NaN"):
        impl.arrange(one, one, one, [None], np.array([math.nan, 1.0, 1.0]), tokens, 1)


# --------------------------------------------------------------------------------------------------
# Semantic rules (each checked on both implementations)
# --------------------------------------------------------------------------------------------------


@IMPLS
def test_fuse_scores_formula(impl):
    rel, age, pri = np.array([0.5, 0.1]), np.array([3600.0, -10.0]), np.array([2.0, 0.0])
    out = impl.fuse_scores(rel, age, pri, 2.0, 3.0, 0.5, 3600.0)
    assert out[0] == (2.0 * 0.5 + 3.0 * math.exp(-3600.0 * ref.LN2 / 3600.0)) + 0.5 * 2.0
    assert out[1] == (2.0 * 0.1 + 3.0 * 1.0) + 0.0  # negative age counts as 0
    no_decay = impl.fuse_scores(rel, age, pri, 0.0, 1.0, 0.0, 0.0)  # half_life <= 0: r = 1
    assert no_decay.tolist() == [1.0, 1.0]


@IMPLS
def test_ranking_ties_by_index(impl):
    assert impl.ranking_order(np.array([1.0, 3.0, 1.0, 3.0, 0.0, -0.0])).tolist() == [1, 3, 0, 2, 4, 5]
    assert impl.ranking_order(np.array([], dtype=np.float64)).tolist() == []
    with pytest.raises(ValueError, match="NaN"):
        impl.ranking_order(np.array([1.0, math.nan]))


@IMPLS
def test_dedup_rules(impl):
    order = np.arange(6)
    exact = np.array([5, 5, 0, 0, 9, 9], dtype=np.uint64)
    sim = np.array([0b1111, 0, 0b0111, 0, 0, 0], dtype=np.uint64)
    elig = np.array([1, 1, 1, 1, 0, 1], dtype=np.uint8)
    # 1 = exact dup of 0; 2 near (1 bit) of 0; key 0 / simhash 0 never match; 4 is ineligible and
    # not kept, so 5 (same key as 4) is kept.
    assert impl.dedup(order, exact, sim, elig, 1).tolist() == [-1, 0, 0, -1, -1, -1]
    assert impl.dedup(order, exact, sim, elig, 0).tolist() == [-1, 0, -1, -1, -1, -1]
    assert impl.dedup(order, exact, sim, elig, -1).tolist() == [-1, 0, -1, -1, -1, -1]
    # Order decides who is kept.
    assert impl.dedup(np.array([1, 0]), exact[:2], sim[:2], elig[:2], 3).tolist() == [1, -1]


@IMPLS
def test_dedup_exact_before_near_and_first_kept(impl):
    order = np.arange(4)
    exact = np.array([1, 2, 3, 2], dtype=np.uint64)
    sim = np.array([0x138, 0x107, 0x100, 0x138], dtype=np.uint64)  # 0 and 1 are 6 bits apart: both kept
    # Item 2 is 3 bits from both kept items: the first in kept order, 0, wins.
    # Item 3 is identical to 0 by simhash but shares an exact key with 1: the exact check wins.
    assert impl.dedup(order, exact, sim, np.ones(4, np.uint8), 3).tolist() == [-1, -1, 0, 1]
    # With the roles of 0 and 1 swapped in the ranking, 1 is first kept.
    assert impl.dedup(np.array([1, 0, 2, 3]), exact, sim, np.ones(4, np.uint8), 3).tolist() == [-1, -1, 1, 1]


@IMPLS
def test_dedup_all_duplicates(impl):
    n = 5
    out = impl.dedup(np.arange(n)[::-1].copy(), np.full(n, 42, np.uint64), np.zeros(n, np.uint64),
                     np.ones(n, np.uint8), 3)
    assert out.tolist() == [4, 4, 4, 4, -1]


@IMPLS
def test_greedy_pack_rules(impl):
    order = np.arange(6)
    tokens = np.array([60, 50, 30, 0, 10, 5], dtype=np.int32)
    cat = np.array([0, 0, 0, 0, 1, 9], dtype=np.int32)  # 9 is outside 0..ncat-1
    elig = np.ones(6, np.uint8)
    sel, used, eff, flowed = impl.greedy_pack(order, tokens, cat, elig, np.array([100, 5]), 1000, True)
    # 60 fits, 50 does not (skipped), 30 fits, 0 always fits; 10 unused tokens flow into category 1.
    assert sel.tolist() == [1, 0, 1, 1, 1, 0]
    assert used.tolist() == [90, 10] and eff.tolist() == [100, 15] and flowed.tolist() == [0, 10]
    sel, used, eff, flowed = impl.greedy_pack(order, tokens, cat, elig, np.array([100, 5]), 1000, False)
    assert sel.tolist() == [1, 0, 1, 1, 0, 0] and eff.tolist() == [100, 5] and flowed.tolist() == [0, 0]
    # The total budget caps everything, but a 0-token item still fits.
    sel, used, _, _ = impl.greedy_pack(order, tokens, cat, elig, np.array([100, 100]), 65, True)
    assert sel.tolist() == [1, 0, 0, 1, 0, 0] and used.tolist() == [60, 0]
    # Negative budgets count as 0; ineligible items are never taken.
    sel, used, eff, _ = impl.greedy_pack(order, tokens, cat, np.zeros(6, np.uint8), np.array([-5, 7]), 10,
                                         True)
    assert sel.tolist() == [0] * 6 and eff.tolist() == [0, 7]


@IMPLS
def test_greedy_pack_total_budget(impl):
    order = np.arange(4)
    tokens = np.array([40, 30, 0, 20], dtype=np.int32)
    sel, used, _, _ = impl.greedy_pack(order, tokens, np.zeros(4, np.int32), np.ones(4, np.uint8),
                                       np.array([1000]), 65, True)
    assert sel.tolist() == [1, 0, 1, 1] and used.tolist() == [60]


@IMPLS
def test_item_larger_than_every_budget(impl):
    sel = impl.select(np.array([1.0, 0.5]), np.zeros(2), np.zeros(2), np.array([10**6, 10]),
                      np.zeros(2, np.int32), np.array([1, 2], np.uint64), np.zeros(2, np.uint64),
                      np.array([100, 100]), 10**5)
    assert sel.status.tolist() == [fastpath.OVER_BUDGET, fastpath.SELECTED]
    assert sel.selected_in_order.tolist() == [1]


@IMPLS
def test_select_statuses(impl):
    rel = np.array([0.9, 0.8, 0.7, 0.1, 0.6])
    sel = impl.select(rel, np.zeros(5), np.zeros(5), np.array([10, 10, 10, 10, 500]), np.zeros(5, np.int32),
                      np.array([1, 1, 2, 3, 4], np.uint64), np.zeros(5, np.uint64), np.array([100]), 1000,
                      w_recency=0.0, w_priority=0.0, min_score=0.5)
    assert sel.status.tolist() == [fastpath.SELECTED, fastpath.DUPLICATE, fastpath.SELECTED,
                                   fastpath.LOW_SCORE, fastpath.OVER_BUDGET]
    assert sel.dup_of.tolist() == [-1, 0, -1, -1, -1]
    assert sel.order.tolist() == [0, 1, 2, 4, 3]
    assert sel.selected_in_order.tolist() == [0, 2]
    assert sel.used.tolist() == [20] and sel.effective_budget.tolist() == [100]


@IMPLS
def test_select_empty(impl):
    e = np.array([])
    sel = impl.select(e, e, e, e.astype(np.int32), e.astype(np.int32), e.astype(np.uint64),
                      e.astype(np.uint64),
                      np.array([10, 20]), 30)
    assert len(sel.scores) == 0 and len(sel.selected_in_order) == 0
    assert sel.used.tolist() == [0, 0] and sel.flowed_in.tolist() == [0, 10]


@IMPLS
def test_select_accepts_other_dtypes(impl):
    sel = impl.select([1, 2], [0, 0], [0, 0], np.array([1, 2], np.int64), [0, 0], [1, 2], [0, 0], [10], 10)
    assert sel.status.tolist() == [0, 0] and sel.scores.dtype == np.float64


@IMPLS
@pytest.mark.parametrize("field,value,match", [
    ("age_s", np.zeros(3), "age_s"),
    ("tokens", np.ones((2, 1), np.int32), "tokens"),
    ("tokens", np.array([1.5, 2.0]), "tokens"),
    ("tokens", np.array([-1, 2], np.int32), "tokens"),
    ("tokens", np.array([2**40, 1]), "tokens"),
    ("category", np.array([0.0, 1.0]), "category"),
    ("exact_key", np.array([1.0, 2.0]), "exact_key"),
    ("simhash", np.zeros(1, np.uint64), "simhash"),
    ("cat_budget", np.zeros((1, 1), np.int64), "cat_budget"),
    ("total_budget", 1.5, "total_budget"),
])
def test_select_validation(impl, field, value, match):
    args = dict(relevance=np.ones(2), age_s=np.zeros(2), priority=np.zeros(2), tokens=np.ones(2, np.int32),
                category=np.zeros(2, np.int32), exact_key=np.zeros(2, np.uint64),
                simhash=np.zeros(2, np.uint64), cat_budget=np.array([10]), total_budget=10)
    args[field] = value
    with pytest.raises(ValueError, match=match):
        impl.select(**args)


@IMPLS
def test_order_must_be_permutation(impl):
    with pytest.raises(ValueError, match="order"):
        impl.dedup(np.array([0, 0]), np.zeros(2, np.uint64), np.zeros(2, np.uint64), np.ones(2, np.uint8), 3)
    with pytest.raises(ValueError, match="order"):
        impl.greedy_pack(np.array([0, 5]), np.ones(2, np.int32), np.zeros(2, np.int32), np.ones(2, np.uint8),
                         np.array([10]), 10, True)


@IMPLS
def test_tokenize_rules(impl):
    assert impl.tokenize("Hello, World_1 中文テスト") == ["hello", "world_1", "中", "文", "テ", "ス", "ト"]
    assert impl.tokenize("ab中cd  x²-ΑΣ") == ["ab", "中", "cd", "x²", "ας"]
    assert impl.tokenize("") == [] and impl.tokenize(" ,.! ") == []
    with pytest.raises(TypeError):
        impl.text_keys("not a list")


@IMPLS
def test_text_keys_rules(impl):
    exact, sim = impl.text_keys(["", "  Hello  WORLD ", "hello world", "solo", "a b c"])
    assert exact[0] == 0 and sim[0] == 0
    assert exact[1] == exact[2] == ref.fnv1a64(b"hello world")
    assert sim[1] == sim[2] == ref.fnv1a64(b"hello world")  # one bigram: simhash = its hash
    assert sim[3] == ref.fnv1a64(b"solo")  # single token: the token itself is the feature
    assert exact[4] == ref.fnv1a64(b"a b c")
    assert ref.fnv1a64(b"") == 0xCBF29CE484222325 and ref.fnv1a64(b"a") == 0xAF63DC4C8601EC8C


@IMPLS
def test_hash_embed_rules(impl):
    out = impl.hash_embed(["", "The quick brown fox", "上下文 窗口", "the QUICK brown fox!"], 64)
    assert out.shape == (4, 64) and out.dtype == np.float32
    assert not out[0].any()
    assert np.allclose(np.linalg.norm(out[1:], axis=1), 1.0, atol=1e-6)
    assert np.array_equal(out[1], out[3])  # case and punctuation do not matter
    with pytest.raises(ValueError, match="dim"):
        impl.hash_embed(["x"], 0)


# --------------------------------------------------------------------------------------------------
# Packing quality: greedy by score vs the exact 0/1 knapsack optimum
# --------------------------------------------------------------------------------------------------


def knapsack_optimum(values: np.ndarray, weights: np.ndarray, capacity: int) -> float:
    best = np.zeros(capacity + 1)
    for v, w in zip(values.tolist(), weights.tolist(), strict=True):
        if w <= capacity:
            best[w:] = np.maximum(best[w:], best[: capacity + 1 - w] + v)
    return float(best[capacity])


def test_greedy_close_to_optimum():
    rng = random.Random(1234)
    ratios = []
    for _ in range(120):
        n = rng.randint(1, 40)
        rel = np.array([rng.random() for _ in range(n)])
        tokens = np.array([rng.randint(5, 400) for _ in range(n)], dtype=np.int32)
        budget = int(tokens.sum() * rng.uniform(0.2, 0.8))
        zeros = np.zeros(n)
        sel = fastpath.select(rel, zeros, zeros, tokens, np.zeros(n, np.int32), np.zeros(n, np.uint64),
                              np.zeros(n, np.uint64), np.array([budget]), budget, w_recency=0.0,
                              w_priority=0.0)
        got = float(rel[sel.selected_in_order].sum())
        best = knapsack_optimum(rel, tokens, budget)
        assert got <= best + 1e-9
        ratios.append(got / best if best > 0 else 1.0)
    assert np.mean(ratios) >= 0.8, np.mean(ratios)
    assert min(ratios) >= 0.3, min(ratios)


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
def test_int8_dot_matches_reference(data):
    """Rows of any int8 values (-128 too), a dimension below, at and above a chunk, zero or tiny
    queries: compiled and reference agree bit for bit, and both are the float dot product within
    the int16 rounding of the query."""
    n = data.draw(st.integers(0, 6))
    dim = data.draw(st.sampled_from([1, 7, 16, 255, 256, 300]))
    codes = np.array(data.draw(st.lists(st.integers(-128, 127), min_size=n * dim, max_size=n * dim)),
                     np.int8).reshape(n, dim)
    scales = np.array(data.draw(st.lists(st.floats(0, 2, width=32), min_size=n, max_size=n)), np.float32)
    query = np.array(data.draw(st.lists(st.floats(-1e3, 1e3, width=32), min_size=dim, max_size=dim)), np.float32)
    got, want = fastpath.int8_dot(codes, scales, query), ref.int8_dot(codes, scales, query)
    assert same_floats(got, want) and got.dtype == np.float32 and got.shape == (n,)
    exact = (codes.astype(np.float64) @ query.astype(np.float64)) * scales
    bound = 128 * dim * float(np.abs(query).max(initial=0.0)) / 32767 * scales  # half a step per component
    assert np.all(np.abs(got - exact) <= bound + 1e-5 * np.abs(exact) + 1e-30)


@IMPLS
def test_int8_dot_rules(impl):
    codes, scales = np.array([[1, -2, 3], [0, 0, 0]], np.int8), np.array([0.5, 1.0], np.float32)
    assert impl.int8_dot(codes, scales, np.array([1.0, -1.0, -1.0], np.float32)).tolist() == [0.0, 0.0]
    # The query is scaled to int16 (1.0 -> 16384 of 32767 steps, a step ~6e-5): 2 - 2 comes out near 0.
    assert abs(impl.int8_dot(codes, scales, np.array([2.0, 1.0, 0.0], np.float32))[0]) < 1e-4
    assert impl.int8_dot(codes, scales, np.array([1.0, 1.0, 1.0], np.float32)).tolist() == [1.0, 0.0]
    assert impl.int8_dot(codes, scales, np.zeros(3, np.float32)).tolist() == [0.0, 0.0]
    assert impl.int8_dot(codes[:0], scales[:0], np.ones(3, np.float32)).shape == (0,)
    with pytest.raises(ValueError, match=r"codes must be an int8 array of shape \(n, 3\)"):
        impl.int8_dot(codes.astype(np.int16), scales, np.ones(3, np.float32))
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
        impl.int8_dot(codes, scales, np.ones(2, np.float32))
    with pytest.raises(ValueError, match="scales must have length 2"):
        impl.int8_dot(codes, scales[:1], np.ones(3, np.float32))
    with pytest.raises(ValueError, match="query must be finite"):
        impl.int8_dot(codes, scales, np.array([1.0, np.nan, 0.0], np.float32))
