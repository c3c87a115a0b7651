"""Bench the compiled fastpath against its plain-Python reference.

    python bench/fastpath_bench.py [--quick]

Prints a short summary, then the figures as one JSON object on the last line. ``measure(quick)``
returns the same dict for other harnesses.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from harness import median_us

_HERE = Path(__file__).resolve().parent
_ROOT = _HERE.parent

N_CANDIDATES = 700
N_CATEGORIES = 6
CAT_BUDGET = [1500, 3000, 2500, 2000, 1500, 1000]
TOTAL_BUDGET = 8000
EMBED_DIM = 256

_WORDS = ("context window agent memory retrieval token budget summary tool call result user asked "
          "the a of to and in is for with on that this error file path function returns value query "
          "index vector store cache latency request response schema field update delete created").split()
_HANZI = ("上下文窗口代理记忆检索令牌预算摘要工具调用结果"
          "用户问题错误文件路径函数返回值查询索引向量存储缓存延迟请求响应")


def _fastpath() -> tuple[ModuleType, ModuleType]:
    if str(_ROOT) not in sys.path:
        sys.path.insert(0, str(_ROOT))
    fp = importlib.import_module("fastpath")
    return fp, fp.reference


def make_texts(rng: random.Random, n: int) -> list[str]:
    """Short English / Chinese / mixed texts with some exact and near duplicates."""
    texts: list[str] = []
    for _ in range(n):
        r = rng.random()
        if texts and r < 0.08:
            texts.append(rng.choice(texts).upper())  # exact duplicate after normalisation
            continue
        if texts and r < 0.15:
            words = rng.choice(texts).split()
            words[rng.randrange(len(words))] = rng.choice(_WORDS)  # near duplicate
            texts.append(" ".join(words))
            continue
        kind = rng.random()
        if kind < 0.6:
            words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 30))]
            texts.append(" ".join(words).capitalize() + rng.choice([".", "!", "?", ""]))
        elif kind < 0.85:
            texts.append("".join(rng.choice(_HANZI) for _ in range(rng.randint(4, 40))) + "。")
        else:
            texts.append(" ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 10))) + " "
                         + "".join(rng.choice(_HANZI) for _ in range(rng.randint(2, 12))))
    return texts


def make_candidates(fp: ModuleType, rng: random.Random, n: int = N_CANDIDATES) -> dict[str, Any]:
    texts = make_texts(rng, n)
    exact, sim = fp.text_keys(texts)
    return dict(
        relevance=np.array([rng.betavariate(2, 5) for _ in range(n)]),
        age_s=np.array([rng.expovariate(1 / 7200) for _ in range(n)]),
        priority=np.array([rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(n)]),
        tokens=np.array([rng.randint(5, 400) for _ in range(n)], dtype=np.int32),
        category=np.array([rng.randrange(N_CATEGORIES) for _ in range(n)], dtype=np.int32),
        exact_key=exact,
        simhash=sim,
        cat_budget=np.array(CAT_BUDGET, dtype=np.int64),
        total_budget=TOTAL_BUDGET,
    )


def yardstick_ms(reps: int = 5) -> float:
    """Machine speed, for reading a run's latencies: the pure-Python reference select on a fixed set
    of 700 candidates (median ms). The same code every time, so a higher figure is a slower machine."""
    fp, ref = _fastpath()
    cand = make_candidates(fp, random.Random(20240611))
    return round(median_us(lambda: ref.select(**cand), reps) / 1000, 2)


def knapsack_optimum(values: list[float], weights: list[int], capacity: int) -> float:
    best = np.zeros(capacity + 1)
    for v, w in zip(values, weights, strict=True):
        if w <= capacity:
            best[w:] = np.maximum(best[w:], best[: capacity + 1 - w] + v)
    return float(best[capacity])


def greedy_vs_optimum(fp: ModuleType, rng: random.Random, instances: int = 200, n: int = 40) -> float:
    """Mean greedy/optimum score ratio on single-category instances with a total budget."""
    ratios = []
    for _ in range(instances):
        rel = [rng.random() for _ in range(n)]
        tokens = [rng.randint(5, 400) for _ in range(n)]
        budget = int(sum(tokens) * rng.uniform(0.2, 0.8))
        zeros = np.zeros(n)
        sel = fp.select(np.array(rel), zeros, zeros, np.array(tokens, dtype=np.int32), np.zeros(n, np.int32),
                        np.zeros(n, np.uint64), np.zeros(n, np.uint64), np.array([budget]), budget,
                        w_recency=0.0, w_priority=0.0)
        got = sum(rel[i] for i in sel.selected_in_order.tolist())
        best = knapsack_optimum(rel, tokens, budget)
        ratios.append(got / best if best > 0 else 1.0)
    return statistics.fmean(ratios)


def make_hybrid(rng: np.random.Generator, n: int = 10_000, dim: int = EMBED_DIM, k: int = 24) -> tuple:
    """A graph-searched hybrid index's inputs, shaped like the memory bench's: n rows, five query
    terms with postings over 4-27 % of the rows, the graph's 2k nearest rows."""
    vectors = rng.standard_normal((n, dim)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    rows = [np.sort(rng.choice(n, size=int(n * share), replace=False)).astype(np.int64)
            for share in (0.04, 0.11, 0.13, 0.27)]
    weights = [rng.uniform(0.2, 6.0, len(r)).astype(np.float32) for r in rows]
    dense_rows = rng.choice(n, size=2 * k, replace=False).astype(np.int64)
    prior = np.where(rng.random(n) < 0.1, 0.05, 0.0).astype(np.float32)
    return rows, weights, dense_rows, vectors, vectors[0].copy(), prior, rng.random(n) > 0.02, 0.6, 4.0, k, 2 * k


def numpy_hybrid_top_k(rows, weights, dense_rows, vectors, query, prior, alive, w, half, k, lexical_k):
    """The baseline: the same two-list fusion written with numpy over all n rows (what the index did
    before fastpath.hybrid_top_k)."""
    raw = np.zeros(len(alive), np.float32)
    for r, x in zip(rows, weights, strict=True):
        raw[r] += x
    lex_all = raw / (raw + np.float32(half))
    masked = np.where(alive & (lex_all > 0), lex_all, -1.0)
    lex_top = np.argpartition(-masked, lexical_k)[:lexical_k]
    lex_top = lex_top[masked[lex_top] > 0]
    cand = np.array(sorted(set(dense_rows.tolist()).union(lex_top.tolist())), np.int64)
    cand = cand[alive[cand]]
    dense = vectors[cand] @ query
    fused = w * dense + (1 - w) * lex_all[cand] + prior[cand]
    order = np.argsort(-fused, kind="stable")[:k]
    return cand[order], fused[order]


def make_window(rng: np.random.Generator, n: int = 660, w: int = 8) -> tuple:
    """A LoCoMo user's episodic index, as the ranker hands it to window_bm25: n turns in sessions of
    20, each with its 4 previous and 4 next turns as neighbours; 20 terms (query, similar and
    associated words) with postings on 1-10 % of the turns; three groups."""
    pos = np.arange(n) % 20
    offsets = np.r_[np.arange(-w // 2, 0), np.arange(1, w // 2 + 1)]
    nbr = np.arange(n)[:, None] + offsets[None, :]
    nbr = np.where((pos[:, None] + offsets[None, :] >= 0) & (pos[:, None] + offsets[None, :] < 20) & (nbr < n),
                   nbr, -1).astype(np.int32)
    decay = np.array([0.55 ** k for k in range(w // 2, 0, -1)] + [0.55 ** k for k in range(1, w // 2 + 1)], np.float32)
    rows = [np.sort(rng.choice(n, size=int(rng.integers(n // 100, n // 10)), replace=False)).astype(np.int64)
            for _ in range(20)]
    tfs = [rng.integers(1, 3, len(r)).astype(np.float32) for r in rows]
    norm = rng.uniform(0.4, 2.0, n).astype(np.float32)
    sizes = np.array([len(r) for r in rows])
    idf = np.log1p((n - sizes + 0.5) / (sizes + 0.5)).astype(np.float32)
    return rows, tfs, nbr, decay, norm, idf, [list(range(5)), list(range(5, 15)), list(range(15, 20))], 1.2


def numpy_window_bm25(rows, tfs, nbr, decay, norm, idf, groups, k1):
    """The baseline: the same counts with numpy (one bincount over every posting and its neighbours,
    saturate, one matrix product per group), as the episodic ranker did before fastpath.window_bm25."""
    n, width = len(norm), len(decay)
    sizes = np.array([len(r) for r in rows])
    which = np.repeat(np.arange(len(rows)), sizes)
    all_rows, all_tfs = np.concatenate(rows), np.concatenate(tfs)
    targets = np.concatenate([all_rows, nbr[all_rows, :width].ravel()])
    weights = np.concatenate([all_tfs, (all_tfs[:, None] * decay[::-1]).ravel()])
    owners = np.concatenate([which, np.repeat(which, width)])
    ok = (targets >= 0) & (weights > 0)
    tw = np.bincount(owners[ok] * n + targets[ok], weights[ok], minlength=len(rows) * n)
    tw = tw.reshape(len(rows), n).astype(np.float32)
    saturated = tw * (k1 + 1.0) / (tw + k1 * norm)
    return [idf[g] @ saturated[g] for g in groups]


def make_cooccurrence(rng: np.random.Generator, n: int = 660, vocab: int = 2500) -> tuple:
    """A LoCoMo user's turns for the co-occurrence expansion: n turns of 6-20 distinct terms (Zipf-like
    frequencies), three query terms on 10-60 turns each, five terms wanted."""
    weights = 1.0 / np.arange(1, vocab + 1)
    per_row = [np.unique(rng.choice(vocab, size=int(rng.integers(6, 20)), p=weights / weights.sum())) for _ in range(n)]
    ptr = np.concatenate([[0], np.cumsum([len(x) for x in per_row])]).astype(np.int64)
    at = np.concatenate(per_row).astype(np.int32)
    df = np.maximum(np.bincount(at, minlength=vocab), 1).astype(np.int32)
    rows = [np.sort(rng.choice(n, size=int(rng.integers(10, 60)), replace=False)).astype(np.int64) for _ in range(3)]
    return rows, ptr, at, df, n, 2, np.array([1, 2, 3], np.int64), 5


def numpy_cooccurring_terms(rows, ptr, at, df, n, min_count, exclude, k):
    """The baseline: the same gains with numpy (one bincount over every query term's turns' terms), as
    the episodic ranker did before fastpath.cooccurring_terms."""
    size = len(df)
    sizes = np.array([len(p) for p in rows])
    all_rows = np.concatenate(rows)
    starts = ptr[all_rows]
    lens = ptr[all_rows + 1] - starts
    idx = np.repeat(starts - np.cumsum(lens) + lens, lens) + np.arange(int(lens.sum()))
    owner = np.repeat(np.repeat(np.arange(len(rows)), sizes), lens)
    together = np.bincount(owner * size + at[idx], minlength=len(rows) * size)
    hit = np.flatnonzero(together >= max(min_count, 1))
    share = together[hit] / sizes[hit // size]
    gain = np.maximum(np.log(n * share / df[hit % size]), 0.0) * share
    acc = np.bincount(hit % size, gain, minlength=size)
    acc[exclude] = 0.0
    best = np.flatnonzero(acc > 0)
    return best[np.argsort(-acc[best], kind="stable")[:k]]


def measure(quick: bool) -> dict[str, Any]:
    fp, ref = _fastpath()
    rng = random.Random(20240611)
    cand = make_candidates(fp, rng)
    fast_sel, ref_sel = fp.select(**cand), ref.select(**cand)
    agree = all(np.array_equal(a, b) for a, b in zip(fast_sel, ref_sel, strict=True))

    fast_us = median_us(lambda: fp.select(**cand), reps=50 if quick else 300, inner=10)
    ref_us = median_us(lambda: ref.select(**cand), reps=3 if quick else 15)

    texts = make_texts(rng, N_CANDIDATES)
    tk_fast = median_us(lambda: fp.text_keys(texts), reps=20 if quick else 100)
    tk_ref = median_us(lambda: ref.text_keys(texts), reps=2 if quick else 7)
    em_fast = median_us(lambda: fp.hash_embed(texts, EMBED_DIM), reps=20 if quick else 100)
    em_ref = median_us(lambda: ref.hash_embed(texts, EMBED_DIM), reps=2 if quick else 5)
    agree = agree and all(np.array_equal(a, b) for a, b in zip(fp.text_keys(texts), ref.text_keys(texts),
                                                                 strict=True))
    agree = agree and np.array_equal(fp.hash_embed(texts, EMBED_DIM).view(np.uint32),
                                     ref.hash_embed(texts, EMBED_DIM).view(np.uint32))

    hybrid = make_hybrid(np.random.default_rng(7))
    hy_fast = median_us(lambda: fp.hybrid_top_k(*hybrid), reps=50 if quick else 300, inner=10)
    hy_numpy = median_us(lambda: numpy_hybrid_top_k(*hybrid), reps=50 if quick else 300, inner=3)
    hy_ref = median_us(lambda: ref.hybrid_top_k(*hybrid), reps=2 if quick else 5)
    got, want = fp.hybrid_top_k(*hybrid), ref.hybrid_top_k(*hybrid)
    agree = agree and all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    same_rows = got[0].tolist() == numpy_hybrid_top_k(*hybrid)[0].tolist()

    window = make_window(np.random.default_rng(11))
    wb_fast = median_us(lambda: fp.window_bm25(*window), reps=50 if quick else 300, inner=10)
    wb_numpy = median_us(lambda: numpy_window_bm25(*window), reps=50 if quick else 300, inner=10)
    wb_ref = median_us(lambda: ref.window_bm25(*window), reps=2 if quick else 5)
    wb_got = fp.window_bm25(*window)
    agree = agree and np.array_equal(wb_got.view(np.uint32), ref.window_bm25(*window).view(np.uint32))
    wb_close = all(np.allclose(a, b, rtol=1e-5) for a, b in zip(wb_got, numpy_window_bm25(*window), strict=True))

    cooc = make_cooccurrence(np.random.default_rng(13))
    co_fast = median_us(lambda: fp.cooccurring_terms(*cooc), reps=50 if quick else 300, inner=10)
    co_numpy = median_us(lambda: numpy_cooccurring_terms(*cooc), reps=50 if quick else 300, inner=10)
    co_ref = median_us(lambda: ref.cooccurring_terms(*cooc), reps=3 if quick else 10)
    co_got = fp.cooccurring_terms(*cooc)
    agree = agree and all(np.array_equal(a, b) for a, b in zip(co_got, ref.cooccurring_terms(*cooc), strict=True))
    co_same = co_got[0].tolist() == numpy_cooccurring_terms(*cooc).tolist()

    # A LoCoMo user's turn vectors (~660 x 384) as episodic recall keeps them (int8) and as it kept
    # them before (float32, read by BLAS): a quarter of the bytes a query's scan reads.
    from sidecar.index.int8 import quantize_rows  # importable once _fastpath() put the root on sys.path

    rows = np.random.default_rng(17).standard_normal((660, 384)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    codes, scales = quantize_rows(rows)
    query = rows[0] + np.float32(0.5) * rows[1]
    i8_fast = median_us(lambda: fp.int8_dot(codes, scales, query), reps=50 if quick else 300, inner=10)
    i8_float = median_us(lambda: rows @ query, reps=50 if quick else 300, inner=10)
    i8_ref = median_us(lambda: ref.int8_dot(codes, scales, query), reps=2 if quick else 3)
    i8_got = fp.int8_dot(codes, scales, query)
    agree = agree and np.array_equal(i8_got.view(np.uint32), ref.int8_dot(codes, scales, query).view(np.uint32))

    return {
        "int8_dot_rows": len(rows),
        "int8_dot_fast_us": round(i8_fast, 1),
        "int8_dot_float32_blas_us": round(i8_float, 1),
        "int8_dot_reference_us": round(i8_ref, 1),
        "int8_dot_speedup": round(i8_ref / i8_fast, 1),
        "int8_dot_bytes_vs_float32": round(codes.nbytes / rows.nbytes, 2),
        "int8_dot_max_error_vs_float32": float(np.abs(i8_got - rows @ query).max()),
        "cooccurring_terms_fast_us": round(co_fast, 1),
        "cooccurring_terms_numpy_us": round(co_numpy, 1),
        "cooccurring_terms_reference_us": round(co_ref, 1),
        "cooccurring_terms_vs_numpy": round(co_numpy / co_fast, 1),
        "cooccurring_terms_speedup": round(co_ref / co_fast, 1),
        "cooccurring_terms_same_as_numpy": co_same,
        "window_bm25_rows": len(window[4]),
        "window_bm25_fast_us": round(wb_fast, 1),
        "window_bm25_numpy_us": round(wb_numpy, 1),
        "window_bm25_reference_us": round(wb_ref, 1),
        "window_bm25_vs_numpy": round(wb_numpy / wb_fast, 1),
        "window_bm25_speedup": round(wb_ref / wb_fast, 1),
        "window_bm25_close_to_numpy": bool(wb_close),
        "hybrid_top_k_rows": len(hybrid[6]),
        "hybrid_top_k_fast_us": round(hy_fast, 1),
        "hybrid_top_k_numpy_us": round(hy_numpy, 1),
        "hybrid_top_k_reference_us": round(hy_ref, 1),
        "hybrid_top_k_vs_numpy": round(hy_numpy / hy_fast, 1),
        "hybrid_top_k_same_rows_as_numpy": same_rows,
        "n_candidates": N_CANDIDATES,
        "selected": int(len(fast_sel.selected_in_order)),
        "duplicates": int((fast_sel.status == fp.DUPLICATE).sum()),
        "fastpath_select_us": round(fast_us, 2),
        "reference_select_us": round(ref_us, 1),
        "fastpath_speedup": round(ref_us / fast_us, 1),
        "text_keys_fast_us": round(tk_fast, 1),
        "text_keys_reference_us": round(tk_ref, 1),
        "text_keys_speedup": round(tk_ref / tk_fast, 1),
        "embed_fast_us": round(em_fast, 1),
        "embed_reference_us": round(em_ref, 1),
        "embed_speedup": round(em_ref / em_fast, 1),
        "greedy_vs_optimum": round(greedy_vs_optimum(fp, rng), 4),
        "agree": bool(agree),
        "quick": quick,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (< 20 s)")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    r = measure(args.quick)
    print(f"select   ({r['n_candidates']} candidates, {r['selected']} selected, {r['duplicates']} dups): "
          f"compiled {r['fastpath_select_us']:.1f} us, reference {r['reference_select_us']:.0f} us, "
          f"x{r['fastpath_speedup']}")
    print(f"text_keys: compiled {r['text_keys_fast_us']:.0f} us, "
          f"reference {r['text_keys_reference_us']:.0f} us, "
          f"x{r['text_keys_speedup']}")
    print(f"hash_embed (dim {EMBED_DIM}): compiled {r['embed_fast_us']:.0f} us, "
          f"reference {r['embed_reference_us']:.0f} us, x{r['embed_speedup']}")
    print(f"hybrid_top_k ({r['hybrid_top_k_rows']} rows, graph path): compiled {r['hybrid_top_k_fast_us']:.0f} us, "
          f"numpy baseline {r['hybrid_top_k_numpy_us']:.0f} us (x{r['hybrid_top_k_vs_numpy']}, same rows: "
          f"{r['hybrid_top_k_same_rows_as_numpy']}), reference {r['hybrid_top_k_reference_us']:.0f} us")
    print(f"window_bm25 ({r['window_bm25_rows']} turns, 20 terms, 3 groups): compiled {r['window_bm25_fast_us']:.0f} us, "
          f"numpy baseline {r['window_bm25_numpy_us']:.0f} us (x{r['window_bm25_vs_numpy']}, same within 1e-5: "
          f"{r['window_bm25_close_to_numpy']}), reference {r['window_bm25_reference_us']:.0f} us "
          f"(x{r['window_bm25_speedup']})")
    print(f"cooccurring_terms (660 turns, 3 query terms): compiled {r['cooccurring_terms_fast_us']:.0f} us, numpy "
          f"baseline {r['cooccurring_terms_numpy_us']:.0f} us (x{r['cooccurring_terms_vs_numpy']}, same terms: "
          f"{r['cooccurring_terms_same_as_numpy']}), reference {r['cooccurring_terms_reference_us']:.0f} us "
          f"(x{r['cooccurring_terms_speedup']})")
    print(f"greedy / optimum (200 x 40 items): {r['greedy_vs_optimum']:.3f}; "
          f"compiled == reference: {r['agree']}; {time.perf_counter() - t0:.1f} s")
    print(json.dumps(r))
    return 0 if r["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())
