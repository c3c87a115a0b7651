"""Plain-Python reference implementation of the fastpath routines: the readable spec.

Every routine here has a compiled twin in ``fastpath._core`` that must return identical results
(bit-identical floats). The algorithms below use lists, loops and the ``math`` module only; numpy is
used solely to validate inputs and to package outputs, never for the computation itself.

Ranking and packing
-------------------
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

Eligibility flags (``eligible`` arguments) are truthy: any non-zero value means eligible.

Text keys
---------
Tokenization: the text is lowercased with ``str.lower()``; then each character is, in this order of
tests:

* a CJK single token if its code point is in U+3040-U+30FF (kana), U+3400-U+4DBF, U+4E00-U+9FFF,
  U+F900-U+FAFF or U+20000-U+2FFFF (CJK ideographs);
* a word character if ``ch.isalnum() or ch == "_"``; consecutive word characters form one token;
* a separator otherwise.

So ``"Hello, World_1 中文"`` gives ``["hello", "world_1", "中", "文"]`` and ``"ab中cd"`` gives
``["ab", "中", "cd"]``.

Hash: FNV-1a 64-bit over the UTF-8 bytes of a feature string (offset 0xcbf29ce484222325,
prime 0x100000001b3, arithmetic mod 2**64).

* ``exact`` key: hash of the tokens joined by single spaces; no tokens gives 0, and a hash that
  happens to be 0 becomes 1 (0 means "no key").
* ``simhash``: features are the token bigrams ``"a b"`` when there are >= 2 tokens, else the single
  token; 64-bit SimHash of the feature hashes (bit b set iff more features have it set than not);
  no tokens gives 0, a result of 0 from real features becomes 1.
* ``hash_embed``: per token position t, in this order: ``"w:"+tok`` (weight 1.0), then
  ``"b:"+prev+" "+tok`` if t > 0 (0.5), then, for tokens of >= 4 characters (always word tokens,
  CJK tokens are single characters), each character trigram of ``"<"+tok+">"`` as ``"c:"+tri`` (0.3).
  Feature hash h adds ``sign*weight`` to ``vec[h % dim]`` (sign -1 iff bit 63 of h is set),
  accumulated in float64; the vector is divided by the square root of its sum of squares (summed in
  index order) and cast to float32; an all-zero vector stays zero.

Wire encoding
-------------
BuildContext answers with ~150 items per call; building them as protobuf objects costs more than
choosing them. So items are encoded straight to protobuf wire bytes (proto3 rules: a field equal
to its default is left out; varints little-endian base 128; a negative int is its 64-bit two's
complement, 10 bytes). Field numbers are those of context_service.proto:

* ``encode_item``: a ``ContextItem`` without its score, fields in number order: source (1,
  string), category (2), tokens (4), text (5), role (6), timestamp_ms (7), each source message
  id (8, repeated string).
* ``encode_section``: one ``sections`` entry (field 1) of ``BuildContextResponse``: the tag, the
  length, then the ``Section``: kind (1), each item (2) as its body followed by its score (3,
  float32, rounded to nearest, left out when its bits are all zero), tokens (3).
* ``encode_dropped``: ``dropped`` entries (field 7) of ``BuildContextResponse``, each a
  ``DroppedItem``: source (1), category (2), reason (3), score (4, float32 as above), tokens (5),
  kept_source (6).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

SELECTED = 0
OVER_BUDGET = 1
DUPLICATE = 2
LOW_SCORE = 3

LN2 = 0.6931471805599453
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK64 = (1 << 64) - 1
# Budgets are int64 in the compiled code; saturate instead of overflowing on absurd budgets.
INT64_MAX = (1 << 63) - 1

_FLOAT_KINDS = "biuf"
_INT_KINDS = "biu"


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


# --------------------------------------------------------------------------------------------------
# Input validation (mirrors the checks of the compiled wrappers; not part of the algorithm)
# --------------------------------------------------------------------------------------------------


def _array(name: str, x: Any, dtype: type, kinds: str, n: int | None = None) -> np.ndarray:
    """Return ``x`` as a contiguous 1-D array of ``dtype``, or raise ValueError naming ``name``."""
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if n is not None and a.shape[0] != n:
        raise ValueError(f"{name} must have length {n}, got {a.shape[0]}")
    if a.dtype.kind not in kinds and a.size:  # an empty list arrives as float64; let it through
        raise ValueError(f"{name} has unsupported dtype {a.dtype}")
    target = np.dtype(dtype)
    if a.dtype != target:
        # Narrowing integer casts would wrap silently; refuse values that do not fit.
        if target.kind == "i" and a.size and not np.can_cast(a.dtype, target):
            info = np.iinfo(target)
            if a.min() < info.min or a.max() > info.max:
                raise ValueError(f"{name} has values outside the range of {target}")
        a = a.astype(target)
    return np.ascontiguousarray(a)


def _int(name: str, x: Any) -> int:
    try:
        return int(x.__index__())
    except (AttributeError, TypeError):
        raise ValueError(f"{name} must be an integer, got {x!r}") from None


def _check_permutation(order: list[int], n: int) -> None:
    seen = [False] * n
    for i in order:
        if not 0 <= i < n or seen[i]:
            raise ValueError("order must be a permutation of range(n)")
        seen[i] = True


def _texts(texts: Sequence[str], name: str = "texts") -> list[str]:
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a sequence of str, not a single str")
    out = list(texts)
    for k, t in enumerate(out):
        if not isinstance(t, str):
            raise TypeError(f"{name}[{k}] must be str, got {type(t).__name__}")
    return out


# --------------------------------------------------------------------------------------------------
# Ranking and packing
# --------------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------------
# Text keys
# --------------------------------------------------------------------------------------------------


def _is_cjk(cp: int) -> bool:
    return (0x3040 <= cp <= 0x30FF or 0x3400 <= cp <= 0x4DBF or 0x4E00 <= cp <= 0x9FFF
            or 0xF900 <= cp <= 0xFAFF or 0x20000 <= cp <= 0x2FFFF)


def tokenize(text: str) -> list[str]:
    """Tokens of ``text`` (see module docstring)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    tokens: list[str] = []
    word: list[str] = []
    for ch in text.lower():
        if _is_cjk(ord(ch)):
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(ch)
        elif ch.isalnum() or ch == "_":
            word.append(ch)
        elif word:
            tokens.append("".join(word))
            word = []
    if word:
        tokens.append("".join(word))
    return tokens


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64-bit hash of ``data``."""
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return h


def _fnv(s: str) -> int:
    return fnv1a64(s.encode("utf-8"))


def _simhash(features: list[str]) -> int:
    if not features:
        return 0
    v = [0] * 64
    for f in features:
        h = _fnv(f)
        for b in range(64):
            v[b] += 1 if (h >> b) & 1 else -1
    out = 0
    for b in range(64):
        if v[b] > 0:
            out |= 1 << b
    return out or 1


def text_keys(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(exact key, simhash) per text, both uint64[n]."""
    exact: list[int] = []
    sims: list[int] = []
    for text in _texts(texts):
        toks = tokenize(text)
        exact.append((_fnv(" ".join(toks)) or 1) if toks else 0)
        feats = [a + " " + b for a, b in zip(toks, toks[1:], strict=False)] if len(toks) >= 2 else toks
        sims.append(_simhash(feats))
    return np.array(exact, dtype=np.uint64), np.array(sims, dtype=np.uint64)


def _embed_features(toks: list[str]) -> list[tuple[str, float]]:
    feats: list[tuple[str, float]] = []
    for t, tok in enumerate(toks):
        feats.append(("w:" + tok, 1.0))
        if t > 0:
            feats.append(("b:" + toks[t - 1] + " " + tok, 0.5))
        if len(tok) >= 4:
            padded = "<" + tok + ">"
            for k in range(len(padded) - 2):
                feats.append(("c:" + padded[k:k + 3], 0.3))
    return feats


def hash_embed(texts: Sequence[str], dim: int) -> np.ndarray:
    """Model-free L2-normalised hashed bag-of-features embedding; float32[n, dim]."""
    d = _int("dim", dim)
    if d < 1:
        raise ValueError(f"dim must be >= 1, got {d}")
    rows: list[list[float]] = []
    for text in _texts(texts):
        vec = [0.0] * d
        for feat, weight in _embed_features(tokenize(text)):
            h = _fnv(feat)
            sign = 1.0 if (h >> 63) & 1 == 0 else -1.0
            vec[h % d] += sign * weight
        ss = 0.0
        for x in vec:
            ss += x * x
        if ss > 0.0:
            norm = math.sqrt(ss)
            vec = [x / norm for x in vec]
        rows.append(vec)
    # float64 -> float32 rounding of the finished row is the only numpy step (output packaging).
    return np.array(rows, dtype=np.float32).reshape(len(rows), d)


# ------------------------------------------------------------------------------ wire encoding
def _varint(value: int) -> bytes:
    value &= MASK64  # negative ints are sent as their 64-bit two's complement
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value) if value else b""


def _str_field(number: int, value: str) -> bytes:
    return _len_field(number, value.encode("utf-8")) if value else b""


def _float_field(number: int, value: float) -> bytes:
    """A float32 field: rounded to nearest, left out when its bits are all zero."""
    try:
        packed = struct.pack("<f", value)
    except OverflowError:  # beyond float32: C's cast gives infinity, so does this
        packed = struct.pack("<f", math.copysign(math.inf, value))
    return _varint(number << 3 | 5) + packed if packed != bytes(4) else b""


def encode_item(source: str, category: int, tokens: int, text: str, role: int, timestamp_ms: int,
                source_message_ids: Sequence[str]) -> bytes:
    """Wire bytes of a ContextItem without its score (see "Wire encoding" above)."""
    for mid in source_message_ids:
        if not isinstance(mid, str):
            raise TypeError(f"source_message_ids holds a {type(mid).__name__}, not str")
    return b"".join([
        _str_field(1, source), _int_field(2, category), _int_field(4, tokens), _str_field(5, text),
        _int_field(6, role), _int_field(7, timestamp_ms),
        *(_len_field(8, mid.encode("utf-8")) for mid in source_message_ids),
    ])


def encode_section(kind: int, bodies: Sequence[bytes], scores: Any, tokens: int) -> bytes:
    """Wire bytes of one BuildContextResponse.sections entry: tag, length, Section."""
    score_list = _array("scores", scores, np.float64, _FLOAT_KINDS, len(bodies)).tolist()
    parts = [_int_field(1, kind)]
    for body, score in zip(bodies, score_list, strict=True):
        parts.append(_len_field(2, bytes(body) + _float_field(3, score)))
    parts.append(_int_field(3, tokens))
    return _len_field(1, b"".join(parts))


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


def _f32(x: float) -> float:
    """x rounded to the nearest float32. One IEEE float32 operation is exactly the double result
    rounded once to float32 (double has more than 2 * 24 + 2 bits), so chains of _f32 steps give
    what compiled float32 code gives."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:  # struct rounds first and refuses only what rounds to infinity
        return math.copysign(math.inf, x)


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


def _rows(name: str, x: Any, n: int) -> list[int]:
    rows = _array(name, x, np.int64, _INT_KINDS).tolist()
    for r in rows:
        if not 0 <= r < n:
            raise ValueError(f"{name} holds row {r}, outside 0-{n - 1}")
    return rows


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


def encode_dropped(sources: Sequence[str], categories: Any, reasons: Any, scores: Any, tokens: Any,
                   kept_sources: Sequence[str]) -> bytes:
    """Wire bytes of BuildContextResponse.dropped entries, one per index (see "Wire encoding")."""
    src, kept = _texts(sources, "sources"), _texts(kept_sources, "kept_sources")
    n = len(src)
    if len(kept) != n:
        raise ValueError(f"kept_sources must have length {n}, got {len(kept)}")
    cat = _array("categories", categories, np.int64, _INT_KINDS, n).tolist()
    rea = _array("reasons", reasons, np.int64, _INT_KINDS, n).tolist()
    tok = _array("tokens", tokens, np.int64, _INT_KINDS, n).tolist()
    sc = _array("scores", scores, np.float64, _FLOAT_KINDS, n).tolist()
    return b"".join(_len_field(7, b"".join([_str_field(1, src[k]), _int_field(2, cat[k]), _int_field(3, rea[k]),
                                            _float_field(4, sc[k]), _int_field(5, tok[k]), _str_field(6, kept[k])]))
                    for k in range(n))


# --------------------------------------------------------------------------------------------------
# Dense scores over int8 rows
# --------------------------------------------------------------------------------------------------
QUERY_STEPS = 32767


def int8_dot(codes: Any, scales: Any, query: Any) -> np.ndarray:
    """out[r] = f32(float(d_r) * scales[r] * qs), r over the rows of codes (int8, shape (n, dim)): the
    query (float32, finite) is scaled to int16, qs = max |query| / 32767 and qc[k] = round(query[k] /
    qs) (half to even, in double, clipped to +-32767), and d_r is the exact integer dot product of
    row r with qc (the two products in double, left to right). A zero query gives zeros. Returns
    float32 (n)."""
    q = _array("query", query, np.float32, _FLOAT_KINDS).tolist()
    dim = len(q)
    c = np.asarray(codes)
    if c.ndim != 2 or c.shape[1] != dim or c.dtype != np.int8:
        raise ValueError(f"codes must be an int8 array of shape (n, {dim}), got {c.dtype} {c.shape}")
    sc = _array("scales", scales, np.float32, _FLOAT_KINDS, c.shape[0]).tolist()
    if not all(math.isfinite(x) for x in q):
        raise ValueError("query must be finite")
    top = max((abs(x) for x in q), default=0.0)
    if top == 0.0:
        return np.zeros(len(sc), np.float32)
    qs = top / QUERY_STEPS
    qc = [max(-QUERY_STEPS, min(QUERY_STEPS, round(x / qs))) for x in q]
    out = [_f32(float(sum(a * b for a, b in zip(row, qc, strict=True))) * scale * qs)
           for row, scale in zip(c.tolist(), sc, strict=True)]
    return np.array(out, np.float32)
