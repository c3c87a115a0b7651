"""Reference selection: fused scoring, ranking order, dedup, greedy budget packing, select, arrange.

* ``fuse_scores``: ``score = (w_relevance*rel + w_recency*r) + w_priority*pri`` with
  ``r = exp(-max(age, 0.0) * LN2 / half_life_s)``, or ``r = 1.0`` when ``half_life_s <= 0``.
* ``ranking_order``: indices by score descending, ties by index ascending (stable sort of -score).
* ``dedup``: walk the ranking; an eligible item is an exact duplicate of the first kept item with the
  same non-zero exact key, else a near duplicate of the first kept item whose non-zero simhash is
  within ``max_hamming`` bits of its own non-zero simhash, else it is kept.
* ``greedy_pack``: categories are packed in id order (0 first); each takes, in ranking order, every
  eligible item of its category that fits both its budget (own budget plus the unused carry of the
  previous category when ``flow_unused``) and what is left of the total budget.
* ``select``: the four steps above, with per-item statuses.
* ``arrange``: where the packed candidates go (section slot) and in what order (see its docstring).

Eligibility flags (``eligible`` arguments) are truthy: any non-zero value means eligible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from fastpath.reference._common import _FLOAT_KINDS, _INT_KINDS, _array, _int, _rows

__all__ = ["SELECTED", "OVER_BUDGET", "DUPLICATE", "LOW_SCORE", "LN2", "INT64_MAX", "Selection", "fuse_scores",
           "ranking_order", "dedup", "greedy_pack", "select", "arrange"]

SELECTED = 0
OVER_BUDGET = 1
DUPLICATE = 2
LOW_SCORE = 3

LN2 = 0.6931471805599453
# Budgets are int64 in the compiled code; saturate instead of overflowing on absurd budgets.
INT64_MAX = (1 << 63) - 1


class Selection(NamedTuple):
    """Result of :func:`select` (shared by the compiled and the reference implementation)."""

    scores: np.ndarray  # float64[n] fused scores
    order: np.ndarray  # int64[n] ranking (score desc, index asc)
    status: np.ndarray  # int8[n] SELECTED / OVER_BUDGET / DUPLICATE / LOW_SCORE
    dup_of: np.ndarray  # int64[n] kept item an item duplicates, else -1
    used: np.ndarray  # int64[ncat] tokens packed per category
    effective_budget: np.ndarray  # int64[ncat] own budget plus inflow
    flowed_in: np.ndarray  # int64[ncat] unused budget received from the previous category
    selected_in_order: np.ndarray  # int64[k] selected indices in ranking order


def _check_permutation(order: list[int], n: int) -> None:
    seen = [False] * n
    for i in order:
        if not 0 <= i < n or seen[i]:
            raise ValueError("order must be a permutation of range(n)")
        seen[i] = True


def fuse_scores(relevance: Any, age_s: Any, priority: Any, w_relevance: float, w_recency: float,
                w_priority: float, half_life_s: float) -> np.ndarray:
    """Fused score per item (see module docstring); float64[n]."""
    rel: list[float] = _array("relevance", relevance, np.float64, _FLOAT_KINDS).tolist()
    n = len(rel)
    age: list[float] = _array("age_s", age_s, np.float64, _FLOAT_KINDS, n).tolist()
    pri: list[float] = _array("priority", priority, np.float64, _FLOAT_KINDS, n).tolist()
    wr, wc, wp, hl = float(w_relevance), float(w_recency), float(w_priority), float(half_life_s)
    out: list[float] = []
    for i in range(n):
        a = max(age[i], 0.0)
        # `<= 0` (not `> 0`) so a NaN half-life propagates exactly as in the compiled code.
        r = 1.0 if hl <= 0.0 else math.exp(-a * LN2 / hl)
        out.append((wr * rel[i] + wc * r) + wp * pri[i])
    return np.array(out, dtype=np.float64)


def ranking_order(scores: Any) -> np.ndarray:
    """Indices by score descending, ties by index ascending; int64[n]. NaN scores are rejected."""
    s: list[float] = _array("scores", scores, np.float64, _FLOAT_KINDS).tolist()
    if any(math.isnan(x) for x in s):
        raise ValueError("scores must not contain NaN")
    # sorted() is stable, so equal scores keep index order.
    return np.array(sorted(range(len(s)), key=lambda i: -s[i]), dtype=np.int64)


def dedup(order: Any, exact_key: Any, simhash: Any, eligible: Any, max_hamming: int) -> np.ndarray:
    """dup_of[i] = the kept item that i duplicates, else -1 (kept or not eligible); int64[n]."""
    ordl: list[int] = _array("order", order, np.int64, _INT_KINDS).tolist()
    n = len(ordl)
    ex: list[int] = _array("exact_key", exact_key, np.uint64, _INT_KINDS, n).tolist()
    sh: list[int] = _array("simhash", simhash, np.uint64, _INT_KINDS, n).tolist()
    el: list[int] = _array("eligible", eligible, np.uint8, _INT_KINDS, n).tolist()
    mh = min(_int("max_hamming", max_hamming), 64)
    _check_permutation(ordl, n)

    dup_of = [-1] * n
    # Kept items have pairwise distinct non-zero exact keys (a repeat would have been a duplicate),
    # so a dict lookup finds exactly "the first kept item with this key".
    kept_by_key: dict[int, int] = {}
    kept_sim: list[tuple[int, int]] = []  # (simhash, index) of kept items with simhash != 0, kept order
    for i in ordl:
        if not el[i]:
            continue
        k = ex[i]
        if k != 0 and k in kept_by_key:
            dup_of[i] = kept_by_key[k]
            continue
        h = sh[i]
        near = -1
        if mh >= 0 and h != 0:
            for kh, j in kept_sim:
                if (h ^ kh).bit_count() <= mh:
                    near = j
                    break
        if near >= 0:
            dup_of[i] = near
            continue
        if k != 0:
            kept_by_key[k] = i
        if h != 0:
            kept_sim.append((h, i))
    return np.array(dup_of, dtype=np.int64)


def greedy_pack(order: Any, tokens: Any, category: Any, eligible: Any, cat_budget: Any,
                total_budget: int, flow_unused: bool
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Greedy packing by category priority; returns (selected, used, effective_budget, flowed_in)."""
    ordl: list[int] = _array("order", order, np.int64, _INT_KINDS).tolist()
    n = len(ordl)
    tok: list[int] = _array("tokens", tokens, np.int32, _INT_KINDS, n).tolist()
    cat: list[int] = _array("category", category, np.int32, _INT_KINDS, n).tolist()
    el: list[int] = _array("eligible", eligible, np.uint8, _INT_KINDS, n).tolist()
    cb: list[int] = _array("cat_budget", cat_budget, np.int64, _INT_KINDS).tolist()
    total = _int("total_budget", total_budget)
    _check_permutation(ordl, n)
    if any(t < 0 for t in tok):
        raise ValueError("tokens must be >= 0")
    ncat = len(cb)

    # Bucket the ranking by category once, so packing is O(n + ncat) rather than O(n * ncat).
    buckets: list[list[int]] = [[] for _ in range(ncat)]
    for i in ordl:
        if el[i] and 0 <= cat[i] < ncat:
            buckets[cat[i]].append(i)

    selected = [0] * n
    used = [0] * ncat
    effective = [0] * ncat
    flowed = [0] * ncat
    remaining = min(max(total, 0), INT64_MAX)
    carry = 0
    for c in range(ncat):
        budget = min(max(cb[c], 0) + carry, INT64_MAX)
        flowed[c] = carry
        effective[c] = budget
        u = 0
        for i in buckets[c]:
            t = tok[i]
            # An item that does not fit is skipped; smaller ones later may still fit.
            if t <= budget - u and t <= remaining:
                selected[i] = 1
                u += t
                remaining -= t
        used[c] = u
        carry = budget - u if flow_unused else 0
    return (np.array(selected, dtype=np.uint8), np.array(used, dtype=np.int64),
            np.array(effective, dtype=np.int64), np.array(flowed, dtype=np.int64))


def select(relevance: Any, age_s: Any, priority: Any, tokens: Any, category: Any, exact_key: Any,
           simhash: Any, cat_budget: Any, total_budget: int, *, w_relevance: float = 1.0,
           w_recency: float = 1.0, w_priority: float = 1.0, half_life_s: float = 3600.0,
           max_hamming: int = 3, min_score: float = -math.inf, flow_unused: bool = True) -> Selection:
    """Score, rank, dedup and pack candidates in one call."""
    n = _array("relevance", relevance, np.float64, _FLOAT_KINDS).shape[0]
    # Validate everything up front so errors name the caller's argument.
    tok = _array("tokens", tokens, np.int32, _INT_KINDS, n)
    cat = _array("category", category, np.int32, _INT_KINDS, n)
    ex = _array("exact_key", exact_key, np.uint64, _INT_KINDS, n)
    sh = _array("simhash", simhash, np.uint64, _INT_KINDS, n)
    cb = _array("cat_budget", cat_budget, np.int64, _INT_KINDS)
    ms = float(min_score)

    scores = fuse_scores(relevance, age_s, priority, w_relevance, w_recency, w_priority, half_life_s)
    order = ranking_order(scores)
    sc: list[float] = scores.tolist()
    status = [OVER_BUDGET] * n
    dedup_ok = [0] * n
    for i in range(n):
        if sc[i] < ms:
            status[i] = LOW_SCORE
        else:
            dedup_ok[i] = 1
    dup_of = dedup(order, ex, sh, np.array(dedup_ok, dtype=np.uint8), max_hamming)
    dl: list[int] = dup_of.tolist()
    pack_ok = [0] * n
    for i in range(n):
        if dedup_ok[i]:
            if dl[i] >= 0:
                status[i] = DUPLICATE
            else:
                pack_ok[i] = 1
    selected, used, effective, flowed = greedy_pack(order, tok, cat, np.array(pack_ok, dtype=np.uint8), cb,
                                                    total_budget, flow_unused)
    sel: list[int] = selected.tolist()
    chosen: list[int] = []
    for i in order.tolist():
        if sel[i]:
            status[i] = SELECTED
            chosen.append(i)
    return Selection(scores, order, np.array(status, dtype=np.int8), dup_of, used, effective, flowed,
                     np.array(chosen, dtype=np.int64))


def arrange(picked: Any, starts: Any, slots: Any, orders: Sequence[Any], scores: Any, tokens: Any,
            n_slots: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where the packed candidates go and in what order.

    The candidates come in batches: batch b holds the global indices starts[b] up to the next
    start (the last up to len(scores)); starts rise from 0. picked lists the packed ones (global
    indices, in selection order); slots[b] is batch b's section slot (0..n_slots-1); orders[b] is
    None or the batch's order keys inside its section (float64, NaN: none). A pick's key is its
    batch's order key, or -score when it has none (best first). Returns int64 / float64 arrays:
    (batch[m], index in the batch[m], key[m], rank[m]: the picks by slot, then key ascending, ties in
    selection order; bounds[n_slots + 1]: rank[bounds[s]:bounds[s + 1]] are slot s's picks;
    slot_tokens[n_slots]: tokens[pick] summed per slot)."""
    st = _array("starts", starts, np.int64, _INT_KINDS).tolist()
    nb = len(st)
    sl = _array("slots", slots, np.int64, _INT_KINDS, nb).tolist()
    sc = _array("scores", scores, np.float64, _FLOAT_KINDS).tolist()
    n = len(sc)
    tk = _array("tokens", tokens, np.int32, _INT_KINDS, n).tolist()
    if len(orders) != nb:
        raise ValueError(f"orders must have length {nb}, got {len(orders)}")
    if n_slots < 0:
        raise ValueError(f"n_slots must be >= 0, got {n_slots}")
    for b in range(nb):
        if st[b] < (0 if b == 0 else st[b - 1]) or st[b] > n or (b == 0 and st[0] != 0):
            raise ValueError("starts must rise from 0 and stay within the candidates")
        if not 0 <= sl[b] < n_slots:
            raise ValueError(f"slots[{b}] is {sl[b]}, outside 0-{n_slots - 1}")
    ends = [*st[1:], n]
    keyed = [None if orders[b] is None else
             _array(f"orders[{b}]", orders[b], np.float64, _FLOAT_KINDS, ends[b] - st[b]).tolist() for b in range(nb)]
    pk = _rows("picked", picked, n)
    owner = [max(b for b in range(nb) if st[b] <= g) for g in pk]
    index = [g - st[b] for g, b in zip(pk, owner, strict=True)]
    keys = []
    for g, b, j in zip(pk, owner, index, strict=True):
        x = math.nan if keyed[b] is None else keyed[b][j]
        keys.append(-sc[g] if math.isnan(x) else x)
    if any(math.isnan(k) for k in keys):
        raise ValueError("scores must not contain NaN")
    rank = sorted(range(len(pk)), key=lambda p: (sl[owner[p]], keys[p], p))
    counts = [0] * n_slots
    slot_tokens = [0] * n_slots
    for g, b in zip(pk, owner, strict=True):
        counts[sl[b]] += 1
        slot_tokens[sl[b]] += tk[g]
    bounds = [0]
    for c in counts:
        bounds.append(bounds[-1] + c)
    return (np.array(owner, np.int64), np.array(index, np.int64), np.array(keys, np.float64),
            np.array(rank, np.int64), np.array(bounds, np.int64), np.array(slot_tokens, np.int64))
