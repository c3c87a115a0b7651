"""Reference ranking kernels of the indexes and the episodic ranker: set overlaps (overlap_counts,
best_matches), fused and hybrid top-k, windowed BM25, co-occurring and feedback terms, and newer tellings
first (newer_first).

The float32 kernels round every step with _f32, which is what compiled float32 code computes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastpath.reference._common import _FLOAT_KINDS, _INT_KINDS, _array, _f32, _rows

__all__ = ["overlap_counts", "best_matches", "fused_top_k", "hybrid_top_k", "window_bm25", "cooccurring_terms",
           "feedback_terms", "newer_first"]


def overlap_counts(a_sets: Sequence[Any], b_sets: Sequence[Any]) -> np.ndarray:
    """int32[len(a_sets), len(b_sets)]: |a_sets[r] & b_sets[c]| for sorted unique uint64 id arrays."""

    def ids(name: str, sets: Sequence[Any]) -> list[set[int]]:
        out = []
        for k, x in enumerate(sets):
            a = _array(f"{name}[{k}]", x, np.uint64, "biu")
            if len(a) > 1 and not bool(np.all(a[1:] > a[:-1])):
                raise ValueError(f"{name}[{k}] must be sorted and unique (text.term_ids)")
            out.append(set(a.tolist()))
        return out

    a, b = ids("a_sets", a_sets), ids("b_sets", b_sets)
    return np.array([[len(x & y) for y in b] for x in a], np.int32).reshape(len(a), len(b))


def best_matches(cos: Any, a_sets: Sequence[Any], b_sets: Sequence[Any], floor: float, min_shared: int,
                 share_scale: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each row r: the column c that matches it best, with that match's score and cosine.

    cos is float32[len(a_sets), len(b_sets)] (e.g. a_vecs @ b_vecs.T); share[r, c] =
    |a_sets[r] & b_sets[c]| / max(len(a_sets[r]), 1) when cos[r, c] >= floor and the overlap is at
    least min_shared, else 0; score = max(cos, share * share_scale), in double. Returns
    (best int64[n_a], score float64[n_a], cos float64[n_a]); best is the first column of the highest
    score, -1 when there are no columns."""
    shared = overlap_counts(a_sets, b_sets).tolist()
    m = np.asarray(cos, np.float32)
    if m.shape != (len(a_sets), len(b_sets)):
        raise ValueError(f"cos must have shape ({len(a_sets)}, {len(b_sets)}), got {np.shape(cos)}")
    sizes = [max(len(np.asarray(t)), 1) for t in a_sets]
    best, score, cosine = [], [], []
    for r, row in enumerate(m.tolist()):  # float32 values as Python floats (exact)
        top, top_s, top_cos = -1, -math.inf, 0.0
        for c, x in enumerate(row):
            s = x
            if x >= floor and shared[r][c] >= min_shared:
                s = max(s, shared[r][c] / sizes[r] * share_scale)
            if s > top_s:
                top, top_s, top_cos = c, s, x
        best.append(top)
        score.append(top_s)
        cosine.append(top_cos)
    return np.array(best, np.int64), np.array(score, np.float64), np.array(cosine, np.float64)


def fused_top_k(dense: Any, lexical: Any, prior: Any, alive: Any, w: float, half: float,
                k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The k best rows of a hybrid index by fused score.

    All arithmetic in float32: lex = lexical / (lexical + half); fused = (w * dense + (1 - w) * lex)
    + prior. Rows that are not alive or whose fused score is not finite are skipped. Returns
    (rows int64[m], fused float32[m], lex float32[m]), m = min(k, eligible rows), ordered by fused
    descending, ties by row ascending. lexical must be >= 0 and half > 0."""
    d = _array("dense", dense, np.float32, "biuf").tolist()
    n = len(d)
    lx = _array("lexical", lexical, np.float32, "biuf", n).tolist()
    pr = _array("prior", prior, np.float32, "biuf", n).tolist()
    al = _array("alive", alive, np.bool_, "biu", n).tolist()
    if not half > 0:
        raise ValueError(f"half must be > 0, got {half}")
    if not all(x >= 0 for x in lx):
        raise ValueError("lexical must be >= 0")
    w32, omw32, h32 = _f32(w), _f32(1.0 - w), _f32(half)
    lex = [_f32(x / _f32(x + h32)) for x in lx]
    scored = []
    for i in range(n):
        if al[i]:
            f = _f32(_f32(_f32(w32 * d[i]) + _f32(omw32 * lex[i])) + pr[i])
            if math.isfinite(f):
                scored.append((-f, i))
    scored.sort()
    top = scored[:max(k, 0)]
    return (np.array([i for _, i in top], np.int64), np.array([-f for f, _ in top], np.float32),
            np.array([lex[i] for _, i in top], np.float32))


def _dot32(a: Sequence[float], b: Sequence[float]) -> float:
    """float32 dot product of a and b padded with zeros to a multiple of 8, summed in 8 lanes
    (element j into lane j % 8), the lanes then added pairwise: ((l0 + l1) + (l2 + l3)) + ((l4 + l5)
    + (l6 + l7))."""
    pad = [0.0] * (-len(a) % 8)
    lanes = [0.0] * 8
    for j, (x, y) in enumerate(zip([*a, *pad], [*b, *pad], strict=True)):
        lanes[j % 8] = _f32(lanes[j % 8] + _f32(x * y))
    pair = [_f32(lanes[i] + lanes[i + 1]) for i in range(0, 8, 2)]
    return _f32(_f32(pair[0] + pair[1]) + _f32(pair[2] + pair[3]))


def hybrid_top_k(term_rows: Sequence[Any], term_weights: Sequence[Any], dense_rows: Any, vectors: Any,
                 query: Any, prior: Any, alive: Any, w: float, half: float, k: int,
                 lexical_k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The k best rows of a graph-searched hybrid index, fused from two candidate lists.

    n = len(alive). Each row's raw lexical score is the float32 sum of its postings' weights
    (term_weights[t][j] for every term_rows[t][j] == row), terms in order, and lex = raw / (raw +
    half) (0 for a row without postings). Candidates: the lexical_k live rows with the best lex > 0
    (ties by row ascending), then the live dense_rows (e.g. a graph index's nearest rows) not
    already in. Each candidate's dense score is the float32 dot (see _dot32) of vectors[row] (shape
    (n, dim)) and query, or 0 when query is None; fused = (w * dense + (1 - w) * lex) + prior[row],
    all in float32, candidates whose fused score is not finite skipped. Returns (rows int64[m], fused,
    dense, lex float32[m]), m = min(k, candidates), fused descending, ties by row ascending.
    Weights must be >= 0, rows in 0..n-1, half > 0."""
    al = _array("alive", alive, np.bool_, "biu").tolist()
    n = len(al)
    pr = _array("prior", prior, np.float32, _FLOAT_KINDS, n).tolist()
    dense_list = _rows("dense_rows", dense_rows, n)
    q = None if query is None else _array("query", query, np.float32, _FLOAT_KINDS).tolist()
    vecs = np.asarray(vectors, np.float32)
    if vecs.ndim != 2 or vecs.shape[0] != n or (q is not None and vecs.shape[1] != len(q)):
        raise ValueError(f"vectors must have shape ({n}, {'dim' if q is None else len(q)}), got {vecs.shape}")
    if not half > 0:
        raise ValueError(f"half must be > 0, got {half}")
    if len(term_rows) != len(term_weights):
        raise ValueError(f"term_weights must have length {len(term_rows)}, got {len(term_weights)}")
    raw: dict[int, float] = {}
    for t, (rows_t, weights_t) in enumerate(zip(term_rows, term_weights, strict=True)):
        rows = _rows(f"term_rows[{t}]", rows_t, n)
        weights = _array(f"term_weights[{t}]", weights_t, np.float32, _FLOAT_KINDS, len(rows)).tolist()
        if not all(x >= 0 for x in weights):
            raise ValueError(f"term_weights[{t}] must be >= 0")
        for r, x in zip(rows, weights, strict=True):
            raw[r] = _f32(raw.get(r, 0.0) + x)
    h32, w32, omw32 = _f32(half), _f32(w), _f32(1.0 - w)
    lex = {r: _f32(x / _f32(x + h32)) for r, x in raw.items()}
    lexical = sorted((-x, r) for r, x in lex.items() if al[r] and x > 0)[:max(lexical_k, 0)]
    candidates = [r for _, r in lexical]
    seen = set(candidates)
    for r in dense_list:
        if al[r] and r not in seen:
            seen.add(r)
            candidates.append(r)
    scored = []
    for r in candidates:
        d = 0.0 if q is None else _dot32(vecs[r].tolist(), q)
        f = _f32(_f32(_f32(w32 * d) + _f32(omw32 * lex.get(r, 0.0))) + pr[r])
        if math.isfinite(f):
            scored.append((-f, r, d))
    scored.sort()
    top = scored[:max(k, 0)]
    return (np.array([r for _, r, _ in top], np.int64), np.array([-f for f, _, _ in top], np.float32),
            np.array([d for _, _, d in top], np.float32), np.array([lex.get(r, 0.0) for _, r, _ in top], np.float32))


def _div32(a: float, b: float) -> float:
    """float32 a / b with IEEE results where Python raises (x / 0)."""
    if b == 0:
        return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1.0, b)
    return _f32(a / b)


def window_bm25(term_rows: Sequence[Any], term_tfs: Sequence[Any], nbr: Any, decay: Any, norm: Any, idf: Any,
                groups: Sequence[Any], k1: float) -> np.ndarray:
    """BM25 of each row's window (the row and its neighbours as one document) for groups of terms.

    n = len(norm); nbr[r] (shape (n, w), -1 for none) are row r's neighbours, decay (w) their
    weights: a row that is my c-th neighbour has me as its (w - 1 - c)-th, so a posting (row, tf) of
    term t counts tf at its row and f32(tf * decay[w - 1 - c]) at nbr[row, c] (when > 0). Term t's
    count at row r is summed in double, its row's own tf first, then its postings in order, c
    ascending, then rounded to float32: x. sat_t[r] = f32(f32(x * f32(k1 + 1)) / f32(x +
    f32(f32(k1) * norm[r]))). out[g, r] = the float32 sum, from 0 in the order of groups[g], of
    f32(idf[p] * sat_p[r]) for the term indices p in groups[g]; a NaN (0 / 0 where norm is 0) is
    the positive quiet NaN. Returns float32 (len(groups), n).
    tfs, decay and idf must be >= 0 (idf finite), rows and slots in range, nbr in -1..n-1."""
    nm = _array("norm", norm, np.float32, _FLOAT_KINDS).tolist()
    n = len(nm)
    dc = _array("decay", decay, np.float32, _FLOAT_KINDS).tolist()
    w = len(dc)
    nb = np.asarray(nbr)
    if nb.shape != (n, w) or (nb.size and nb.dtype.kind not in _INT_KINDS):
        raise ValueError(f"nbr must be an integer array of shape ({n}, {w}), got {nb.dtype} {nb.shape}")
    nb_list = nb.tolist()
    if any(not -1 <= x < n for row in nb_list for x in row):
        raise ValueError(f"nbr holds a row outside -1-{n - 1}")
    if not all(x >= 0 for x in dc):
        raise ValueError("decay must be >= 0")
    if len(term_rows) != len(term_tfs):
        raise ValueError(f"term_tfs must have length {len(term_rows)}, got {len(term_tfs)}")
    n_terms = len(term_rows)
    idf_list = _array("idf", idf, np.float32, _FLOAT_KINDS, n_terms).tolist()
    if not all(0 <= x < math.inf for x in idf_list):
        raise ValueError("idf must be finite and >= 0")
    slots = [_rows(f"groups[{g}]", grp, n_terms) for g, grp in enumerate(groups)]
    k1p, k1f = _f32(k1 + 1.0), _f32(k1)
    sats = []
    for t in range(n_terms):
        rows = _rows(f"term_rows[{t}]", term_rows[t], n)
        tfs = _array(f"term_tfs[{t}]", term_tfs[t], np.float32, _FLOAT_KINDS, len(rows)).tolist()
        if not all(x >= 0 for x in tfs):
            raise ValueError(f"term_tfs[{t}] must be >= 0")
        count: dict[int, float] = {}
        for r, x in zip(rows, tfs, strict=True):
            if x > 0:
                count[r] = count.get(r, 0.0) + x
        for r, x in zip(rows, tfs, strict=True):
            for c in range(w):
                target, weight = nb_list[r][c], _f32(x * dc[w - 1 - c])
                if target >= 0 and weight > 0:
                    count[target] = count.get(target, 0.0) + weight
        sat = []
        for r in range(n):
            x = _f32(count.get(r, 0.0))
            sat.append(_div32(_f32(x * k1p), _f32(x + _f32(k1f * nm[r]))))
        sats.append(sat)
    out = np.zeros((len(slots), n), np.float32)
    for g, group in enumerate(slots):
        for r in range(n):
            acc = 0.0
            for p in group:
                acc = _f32(acc + _f32(idf_list[p] * sats[p][r]))
            out[g, r] = math.nan if math.isnan(acc) else acc  # one NaN, whatever its sign or payload
    return out


def _term_table(term_ptr: Any, term_at: Any, term_df: Any, n_rows: float) -> tuple[list[int], list[int], list[int]]:
    """(ptr, at, df) as lists, checked: the row pointers rise from 0 to at most len(term_at) and the
    row count is not negative."""
    ptr = _array("term_ptr", term_ptr, np.int64, _INT_KINDS).tolist()
    at = _array("term_at", term_at, np.int32, _INT_KINDS).tolist()
    df = _array("term_df", term_df, np.int32, _INT_KINDS).tolist()
    if not n_rows >= 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    if len(ptr) < 1 or any(not 0 <= ptr[r] <= ptr[r + 1] <= len(at) for r in range(len(ptr) - 1)):
        raise ValueError("term_ptr must rise from 0 to at most len(term_at)")
    return ptr, at, df


def cooccurring_terms(term_rows: Sequence[Any], term_ptr: Any, term_at: Any, term_df: Any, n_rows: int,
                      min_count: int, exclude: Any, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k terms said most with some query terms, by positive pointwise mutual information.

    Row r holds the term ids term_at[term_ptr[r]:term_ptr[r + 1]]; term_df[v] is the number of rows
    holding v. For each query term i in order (its rows term_rows[i], size_i of them), every term v
    found in at least max(min_count, 1) of those rows (together) gains, in double,
    max(log(n_rows * share / term_df[v]), 0) * share with share = together / size_i, summed over the
    query terms in order. Excluded ids gain nothing. Returns (ids int64[m], gains float64[m]): the k
    ids with the highest positive gain, ties by id ascending. Rows must be in 0..len(term_ptr) - 2,
    term ids in 0..len(term_df) - 1, and a term found must have term_df >= 1."""
    ptr, at, df = _term_table(term_ptr, term_at, term_df, n_rows)
    n, size = len(ptr) - 1, len(df)
    acc: dict[int, float] = {}
    for i, rows_i in enumerate(term_rows):
        rows = _rows(f"term_rows[{i}]", rows_i, n)
        together: dict[int, int] = {}
        for r in rows:
            for v in at[ptr[r]:ptr[r + 1]]:
                if not 0 <= v < size:
                    raise ValueError(f"term_at holds term {v}, outside 0-{size - 1}")
                together[v] = together.get(v, 0) + 1
        for v in sorted(together):
            if together[v] >= max(min_count, 1):
                if df[v] < 1:
                    raise ValueError(f"term_df[{v}] must be >= 1 (the term is in term_at)")
                share = together[v] / len(rows)
                ratio = n_rows * share / df[v]
                acc[v] = acc.get(v, 0.0) + max(math.log(ratio) if ratio > 0 else -math.inf, 0.0) * share
    for v in _array("exclude", exclude, np.int64, _INT_KINDS).tolist():
        acc.pop(v, None)
    best = sorted((-g, v) for v, g in acc.items() if g > 0)[:max(k, 0)]
    return np.array([v for _, v in best], np.int64), np.array([-g for g, _ in best], np.float64)


def feedback_terms(rows: Any, term_ptr: Any, term_at: Any, term_df: Any, n_rows: int, min_df: int, exclude: Any,
                   k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k terms most characteristic of some rows (pseudo-relevance feedback from the best turns).

    Row r holds the term ids term_at[term_ptr[r]:term_ptr[r + 1]]; term_df[v] is the number of rows
    holding v. For each row in the order given and each of its ids in order, a term v with
    term_df[v] >= max(min_df, 1) that is not excluded gains, in double, its BM25 idf
    log(1 + (n_rows - term_df[v] + 0.5) / (term_df[v] + 0.5)). Returns (ids int64[m], weights
    float64[m]): the k ids with the highest weight, ties in the order the ids first appear. Rows must
    be in 0..len(term_ptr) - 2, term ids in 0..len(term_df) - 1; excluded ids outside it are ignored."""
    ptr, at, df = _term_table(term_ptr, term_at, term_df, n_rows)
    n, size = len(ptr) - 1, len(df)
    skip = set(_array("exclude", exclude, np.int64, _INT_KINDS).tolist())
    acc: dict[int, float] = {}
    for r in _rows("rows", rows, n):
        for v in at[ptr[r]:ptr[r + 1]]:
            if not 0 <= v < size:
                raise ValueError(f"term_at holds term {v}, outside 0-{size - 1}")
            if df[v] >= max(min_df, 1) and v not in skip:
                acc[v] = acc.get(v, 0.0) + math.log(1.0 + (n_rows - df[v] + 0.5) / (df[v] + 0.5))
    best = sorted(acc, key=acc.__getitem__, reverse=True)[:max(k, 0)]  # stable: ties by first appearance
    return np.array(best, np.int64), np.array([acc[v] for v in best], np.float64)


def newer_first(postings: Sequence[Any], n_rows: int, rows: Any, when: Any, who: Any, scores: Any,
                cover_min: float, score_min: float) -> np.ndarray:
    """Scores of packed turns with each newer telling of the same thing scored above the older ones
    (the episodic ranker's knowledge updates, sidecar.memory.episodic.updates).

    postings[b]: the ascending rows (of n_rows) that say query term b, idf[b] = log1p((n_rows - df +
    0.5) / (df + 0.5)) with df = len(postings[b]). Turn i (row rows[i]) says term b when rows[i] is in
    postings[b]; mass[i] = the sum over the terms it says, in b order, of idf[b]; shared(i, j) the same
    sum over the terms both say. place[i]: turn i's index when the turns are sorted by (when, rows).
    Turn j updates turn i when place[i] < place[j], who[i] == who[j], mass[i] > 0, mass[j] > 0,
    shared(i, j) >= (cover_min - 1e-9) * mass[i] and scores[j] >= score_min * scores[i]. In place
    order, best[j] = max(scores[j], best[i] for every i that j updates) (so through chains of
    updates). A turn in any update scores best * (1 + 1e-7 * (place + 1)), any other keeps its score.
    Returns float64 (len(rows)); rows must be distinct, in 0..n_rows-1, and the arrays of one length."""
    row_list = _rows("rows", rows, max(int(n_rows), 1))
    m = len(row_list)
    when_list = _array("when", when, np.int64, _INT_KINDS, m).tolist()
    who_list = _array("who", who, np.int64, _INT_KINDS, m).tolist()
    score_list = _array("scores", scores, np.float64, _FLOAT_KINDS, m).tolist()
    if len(set(row_list)) != m:
        raise ValueError("rows must be distinct")
    said: list[list[bool]] = [[] for _ in range(m)]
    idf = []
    for b, posting in enumerate(postings):
        listed = _rows(f"postings[{b}]", posting, max(int(n_rows), 1))
        if any(x >= y for x, y in zip(listed, listed[1:], strict=False)):
            raise ValueError(f"postings[{b}] must be ascending and unique")
        members = set(listed)
        df = len(members)
        idf.append(math.log1p((n_rows - df + 0.5) / (df + 0.5)))
        for i, r in enumerate(row_list):
            said[i].append(r in members)
    mass = []
    for i in range(m):
        total = 0.0
        for b, s in enumerate(said[i]):
            if s:
                total += idf[b]
        mass.append(total)
    order = sorted(range(m), key=lambda i: (when_list[i], row_list[i]))
    place = [0] * m
    for p, i in enumerate(order):
        place[i] = p
    best = list(score_list)
    involved = [False] * m
    for pj, j in enumerate(order):
        for i in order[:pj]:
            if who_list[i] != who_list[j] or mass[i] <= 0.0 or mass[j] <= 0.0:
                continue
            shared = 0.0
            for b in range(len(idf)):
                if said[i][b] and said[j][b]:
                    shared += idf[b]
            if shared >= (cover_min - 1e-9) * mass[i] and score_list[j] >= score_min * score_list[i]:
                involved[i] = involved[j] = True
                best[j] = max(best[j], best[i])
    out = [best[k] * (1.0 + 1e-7 * (place[k] + 1)) if involved[k] else score_list[k] for k in range(m)]
    return np.array(out, np.float64)
