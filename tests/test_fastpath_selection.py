"""fastpath._selection (scoring, ranking, dedup, packing, select, arrange) agrees exactly with
fastpath.reference.selection, and both follow the spec."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastpath
from fastpath import reference as ref
from tests.fastpath_checks import FAST, IMPLS, same, same_floats


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


# --------------------------------------------------------------------------------------------------
# Compiled == reference (property tests)
# --------------------------------------------------------------------------------------------------


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
