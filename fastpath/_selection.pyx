"""Compiled selection: fused scoring, ranking order, dedup, greedy budget packing, select, arrange.

The semantics are specified by ``fastpath.reference.selection``; every routine here must return
exactly what its reference twin returns, floats bit for bit. The nogil kernels are declared in
_selection.pxd so other Cython modules can cimport them.
"""

from libc.math cimport NAN, exp, isnan
from libc.stdint cimport INT64_MAX, int8_t, int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset

cimport numpy as cnp

from fastpath._common cimport _FLOAT_KINDS, _INT_KINDS, _arr, _check_rows, _empty, _int64_clamped, _ptr

import math

import numpy as np

from fastpath.reference.selection import Selection

cnp.import_array()

cdef extern from *:
    """
    #include <stdint.h>
    #if defined(_MSC_VER)
    #include <intrin.h>
    #define FP_POPCOUNT(x) ((int)__popcnt64(x))
    #else
    #define FP_POPCOUNT(x) __builtin_popcountll(x)
    #endif

    /* First k with popcount(h ^ ks[k]) <= maxh, else -1. This scan is the O(n * kept) part of dedup. */
    static Py_ssize_t fp_near_scan_generic(const uint64_t *ks, Py_ssize_t nk, uint64_t h, int maxh) {
        for (Py_ssize_t k = 0; k < nk; k++) {
            if (FP_POPCOUNT(h ^ ks[k]) <= maxh) return k;
        }
        return -1;
    }

    #if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    /* The x86-64 baseline has no POPCNT instruction (the builtin becomes a libgcc call), so compile
       a second copy for CPUs that have it and pick one at run time. */
    __attribute__((target("popcnt")))
    static Py_ssize_t fp_near_scan_hw(const uint64_t *ks, Py_ssize_t nk, uint64_t h, int maxh) {
        for (Py_ssize_t k = 0; k < nk; k++) {
            if (__builtin_popcountll(h ^ ks[k]) <= maxh) return k;
        }
        return -1;
    }
    static int fp_have_popcnt = -1;
    static Py_ssize_t fp_near_scan(const uint64_t *ks, Py_ssize_t nk, uint64_t h, int maxh) {
        if (fp_have_popcnt < 0) {
            __builtin_cpu_init();
            fp_have_popcnt = __builtin_cpu_supports("popcnt") ? 1 : 0;
        }
        return fp_have_popcnt ? fp_near_scan_hw(ks, nk, h, maxh) : fp_near_scan_generic(ks, nk, h, maxh);
    }
    #else
    #define fp_near_scan fp_near_scan_generic
    #endif
    """
    Py_ssize_t fp_near_scan(const uint64_t* ks, Py_ssize_t nk, uint64_t h, int maxh) nogil
    int fp_popcount "FP_POPCOUNT"(uint64_t x) nogil


SELECTED = ST_SELECTED
OVER_BUDGET = ST_OVER_BUDGET
DUPLICATE = ST_DUPLICATE
LOW_SCORE = ST_LOW_SCORE

cdef double LN2 = 0.6931471805599453
cdef Py_ssize_t _SORT_RUN = 24


# --------------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------------

cdef int _hamming_arg(object max_hamming) except -2:
    # Anything >= 64 behaves like 64 and anything negative disables the near check.
    cdef int64_t mh = _int64_clamped("max_hamming", max_hamming, -1)
    return <int>(64 if mh > 64 else mh)


cdef int _check_permutation(Py_ssize_t n, const int64_t* order) except -1:
    cdef uint8_t* seen = <uint8_t*>calloc(n + 1, 1)
    cdef Py_ssize_t k
    cdef int64_t i
    cdef bint bad = False
    if seen == NULL:
        raise MemoryError()
    with nogil:
        for k in range(n):
            i = order[k]
            if i < 0 or i >= n or seen[i]:
                bad = True
                break
            seen[i] = 1
    free(seen)
    if bad:
        raise ValueError("order must be a permutation of range(n)")
    return 0


cdef int _check_tokens(Py_ssize_t n, const int32_t* tokens) except -1:
    cdef Py_ssize_t i
    cdef bint bad = False
    with nogil:
        for i in range(n):
            if tokens[i] < 0:
                bad = True
                break
    if bad:
        raise ValueError("tokens must be >= 0")
    return 0


# --------------------------------------------------------------------------------------------------
# Kernels (nogil, raw buffers; see _selection.pxd)
# --------------------------------------------------------------------------------------------------

cdef void fuse_kernel(Py_ssize_t n, const double* rel, const double* age, const double* pri,
                      double w_rel, double w_rec, double w_pri, double half_life,
                      double* out) noexcept nogil:
    cdef Py_ssize_t i
    cdef double a, r
    for i in range(n):
        a = age[i]
        if a < 0.0:  # same as Python's max(a, 0.0), NaN included
            a = 0.0
        if half_life <= 0.0:
            r = 1.0
        else:
            r = exp(-a * LN2 / half_life)
        out[i] = (w_rel * rel[i] + w_rec * r) + w_pri * pri[i]


cdef inline bint _before(ScoreIdx x, ScoreIdx y) noexcept nogil:
    # Total order: score descending, then index ascending, so the result equals a stable sort.
    return x.s > y.s or (x.s == y.s and x.i < y.i)


cdef int order_kernel(Py_ssize_t n, const double* scores, int64_t* order, ScoreIdx* scratch) noexcept nogil:
    cdef ScoreIdx* a = scratch
    cdef ScoreIdx* b = scratch + n
    cdef ScoreIdx* src
    cdef ScoreIdx* dst
    cdef ScoreIdx* tmp
    cdef ScoreIdx x
    cdef Py_ssize_t i, j, lo, mid, hi, p, q, k, width
    for i in range(n):
        if isnan(scores[i]):
            return -1
        a[i].s = scores[i]
        a[i].i = i
    # Bottom-up merge sort over insertion-sorted runs: pairs (score, index) sit together in memory.
    lo = 0
    while lo < n:
        hi = lo + _SORT_RUN if lo + _SORT_RUN < n else n
        for i in range(lo + 1, hi):
            x = a[i]
            j = i - 1
            while j >= lo and _before(x, a[j]):
                a[j + 1] = a[j]
                j -= 1
            a[j + 1] = x
        lo = hi
    src = a
    dst = b
    width = _SORT_RUN
    while width < n:
        lo = 0
        while lo < n:
            mid = lo + width if lo + width < n else n
            hi = lo + 2 * width if lo + 2 * width < n else n
            p = lo
            q = mid
            k = lo
            while p < mid and q < hi:
                if _before(src[q], src[p]):
                    dst[k] = src[q]
                    q += 1
                else:
                    dst[k] = src[p]
                    p += 1
                k += 1
            while p < mid:
                dst[k] = src[p]
                p += 1
                k += 1
            while q < hi:
                dst[k] = src[q]
                q += 1
                k += 1
            lo = hi
        tmp = src
        src = dst
        dst = tmp
        width *= 2
    for i in range(n):
        order[i] = src[i].i
    return 0


cdef inline uint64_t _mix(uint64_t k) noexcept nogil:
    return k * 0x9E3779B97F4A7C15ULL


# Pigeonhole index for the near-duplicate check. If popcount(a ^ b) <= m then, of m + 1 disjoint bit
# blocks, at least one is identical in a and b; so only kept hashes sharing some block with the
# query need a popcount, instead of every kept hash. Used for 0 <= m <= _PIGEON_MAX_M; wider
# thresholds mean narrow blocks and long chains, and the plain linear scan is better there.
cdef enum:
    _PIGEON_MAX_M = 7

ctypedef struct NearIndex:
    int nblk
    int shift[_PIGEON_MAX_M + 1]
    uint64_t mask[_PIGEON_MAX_M + 1]
    Py_ssize_t n, cap, bits
    uint64_t* keys  # [nblk * cap] block value per slot
    int64_t* head  # [nblk * cap] first kept position with that block value, -1 = empty slot
    int64_t* tail  # [nblk * cap] last one, for appending in kept order
    int64_t* nxt  # [nblk * n] next kept position in the same chain, -1 = end


cdef int _near_init(NearIndex* ni, Py_ssize_t n, int m) noexcept nogil:
    cdef int b, off = 0, w
    cdef Py_ssize_t q
    ni.nblk = m + 1
    for b in range(ni.nblk):
        w = 64 // ni.nblk + (1 if b < 64 % ni.nblk else 0)
        ni.shift[b] = off
        ni.mask[b] = 0xFFFFFFFFFFFFFFFFULL if w == 64 else ((<uint64_t>1) << w) - 1
        off += w
    ni.n = n
    ni.cap = 16
    ni.bits = 4
    while ni.cap < 2 * n:
        ni.cap *= 2
        ni.bits += 1
    ni.keys = <uint64_t*>malloc(ni.nblk * ni.cap * sizeof(uint64_t))
    ni.head = <int64_t*>malloc(ni.nblk * ni.cap * sizeof(int64_t))
    ni.tail = <int64_t*>malloc(ni.nblk * ni.cap * sizeof(int64_t))
    ni.nxt = <int64_t*>malloc((ni.nblk * n + 1) * sizeof(int64_t))
    if ni.keys == NULL or ni.head == NULL or ni.tail == NULL or ni.nxt == NULL:
        return -1
    for q in range(ni.nblk * ni.cap):
        ni.head[q] = -1
    return 0


cdef void _near_free(NearIndex* ni) noexcept nogil:
    free(ni.keys)
    free(ni.head)
    free(ni.tail)
    free(ni.nxt)


cdef inline Py_ssize_t _near_slot(NearIndex* ni, int b, uint64_t v) noexcept nogil:
    # Slot holding block value v of block b, or the empty slot where it would go.
    cdef Py_ssize_t base = b * ni.cap
    cdef Py_ssize_t slot = <Py_ssize_t>(_mix(v + <uint64_t>b) >> (64 - ni.bits))
    while ni.head[base + slot] >= 0 and ni.keys[base + slot] != v:
        slot = (slot + 1) & (ni.cap - 1)
    return base + slot


cdef Py_ssize_t _near_find(NearIndex* ni, const uint64_t* ksim, uint64_t h, int m) noexcept nogil:
    """Smallest kept position kp with popcount(h ^ ksim[kp]) <= m, or -1."""
    cdef Py_ssize_t best = -1
    cdef int64_t kp
    cdef int b
    for b in range(ni.nblk):
        kp = ni.head[_near_slot(ni, b, (h >> ni.shift[b]) & ni.mask[b])]
        # Chains are in kept order, so the first hit of a chain is that chain's best.
        while kp >= 0 and (best < 0 or kp < best):
            if fp_popcount(h ^ ksim[kp]) <= m:
                best = kp
                break
            kp = ni.nxt[b * ni.n + kp]
    return best


cdef void _near_add(NearIndex* ni, uint64_t h, int64_t kp) noexcept nogil:
    cdef int b
    cdef Py_ssize_t slot
    cdef uint64_t v
    for b in range(ni.nblk):
        v = (h >> ni.shift[b]) & ni.mask[b]
        slot = _near_slot(ni, b, v)
        ni.nxt[b * ni.n + kp] = -1
        if ni.head[slot] < 0:
            ni.keys[slot] = v
            ni.head[slot] = kp
        else:
            ni.nxt[b * ni.n + ni.tail[slot]] = kp
        ni.tail[slot] = kp


cdef int dedup_kernel(Py_ssize_t n, const int64_t* order, const uint64_t* exact, const uint64_t* simh,
                      const uint8_t* eligible, int max_hamming, int64_t* dup_of) noexcept nogil:
    cdef Py_ssize_t cap = 16, bits = 4, p, slot = 0, nk = 0, found
    cdef int64_t i, j
    cdef uint64_t k, h
    cdef bint pigeon = 0 <= max_hamming <= _PIGEON_MAX_M
    cdef NearIndex ni
    memset(&ni, 0, sizeof(ni))
    while cap < 2 * n:
        cap *= 2
        bits += 1
    # Open-addressing table of kept exact keys (kept keys are distinct and non-zero; 0 marks empty).
    cdef uint64_t* tkeys = <uint64_t*>calloc(cap, sizeof(uint64_t))
    cdef int64_t* tvals = <int64_t*>malloc(cap * sizeof(int64_t))
    # Simhashes of kept items, contiguous and in kept order (kept position kp -> item kidx[kp]).
    cdef uint64_t* ksim = <uint64_t*>malloc((n + 1) * sizeof(uint64_t))
    cdef int64_t* kidx = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    cdef int rc = 0
    if tkeys == NULL or tvals == NULL or ksim == NULL or kidx == NULL:
        rc = -1
    elif pigeon and _near_init(&ni, n, max_hamming) != 0:
        rc = -1
    if rc == 0:
        for p in range(n):
            dup_of[p] = -1
        for p in range(n):
            i = order[p]
            if not eligible[i]:
                continue
            k = exact[i]
            if k != 0:
                slot = <Py_ssize_t>(_mix(k) >> (64 - bits))
                j = -1
                while tkeys[slot] != 0:
                    if tkeys[slot] == k:
                        j = tvals[slot]
                        break
                    slot = (slot + 1) & (cap - 1)
                if j >= 0:
                    dup_of[i] = j
                    continue
            h = simh[i]
            if max_hamming >= 0 and h != 0:
                if pigeon:
                    found = _near_find(&ni, ksim, h, max_hamming)
                else:
                    found = fp_near_scan(ksim, nk, h, max_hamming)
                if found >= 0:
                    dup_of[i] = kidx[found]
                    continue
            if k != 0:
                tkeys[slot] = k  # slot is the empty slot where the probe above stopped
                tvals[slot] = i
            if h != 0:
                ksim[nk] = h
                kidx[nk] = i
                if pigeon:
                    _near_add(&ni, h, nk)
                nk += 1
    _near_free(&ni)
    free(tkeys)
    free(tvals)
    free(ksim)
    free(kidx)
    return rc


cdef int pack_kernel(Py_ssize_t n, Py_ssize_t ncat, const int64_t* order, const int32_t* tokens,
                     const int32_t* category, const uint8_t* eligible, const int64_t* cat_budget,
                     int64_t total_budget, bint flow_unused, uint8_t* selected, int64_t* used,
                     int64_t* effective, int64_t* flowed) noexcept nogil:
    cdef Py_ssize_t p, c, b
    cdef int64_t i, t, budget, u, carry = 0, own
    cdef int64_t remaining = total_budget if total_budget > 0 else 0
    # Counting sort of the ranking into per-category buckets: O(n + ncat) instead of O(n * ncat).
    cdef Py_ssize_t* start = <Py_ssize_t*>calloc(ncat + 2, sizeof(Py_ssize_t))
    cdef int64_t* bucket = <int64_t*>malloc((n + 1) * sizeof(int64_t))
    if start == NULL or bucket == NULL:
        free(start)
        free(bucket)
        return -1
    for p in range(n):
        selected[p] = 0
    for p in range(n):
        i = order[p]
        c = category[i]
        if eligible[i] and 0 <= c < ncat:
            start[c + 2] += 1
    for c in range(ncat):
        start[c + 2] += start[c + 1]
    for p in range(n):
        i = order[p]
        c = category[i]
        if eligible[i] and 0 <= c < ncat:
            bucket[start[c + 1]] = i
            start[c + 1] += 1
    # Now bucket[start[c] : start[c + 1]] holds category c's items in ranking order.
    for c in range(ncat):
        own = cat_budget[c] if cat_budget[c] > 0 else 0
        budget = INT64_MAX if carry > INT64_MAX - own else own + carry
        flowed[c] = carry
        effective[c] = budget
        u = 0
        for b in range(start[c], start[c + 1]):
            i = bucket[b]
            t = tokens[i]
            # Skip what does not fit and keep going: smaller items further down may still fit.
            if t <= budget - u and t <= remaining:
                selected[i] = 1
                u += t
                remaining -= t
        used[c] = u
        carry = budget - u if flow_unused else 0
    free(start)
    free(bucket)
    return 0


# --------------------------------------------------------------------------------------------------
# Ranking and packing: public API
# --------------------------------------------------------------------------------------------------

def fuse_scores(relevance, age_s, priority, double w_relevance, double w_recency, double w_priority,
                double half_life_s):
    """Fused score per item; float64[n]. See fastpath.reference.fuse_scores."""
    cdef cnp.ndarray rel = _arr("relevance", relevance, cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, -1)
    cdef Py_ssize_t n = cnp.PyArray_DIM(rel, 0)
    cdef cnp.ndarray age = _arr("age_s", age_s, cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, n)
    cdef cnp.ndarray pri = _arr("priority", priority, cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, n)
    cdef cnp.ndarray out = _empty(n, cnp.NPY_FLOAT64)
    with nogil:
        fuse_kernel(n, <double*>_ptr(rel), <double*>_ptr(age), <double*>_ptr(pri), w_relevance,
                    w_recency, w_priority, half_life_s, <double*>_ptr(out))
    return out


def ranking_order(scores):
    """Indices by score descending, ties by index ascending; int64[n]. NaN scores are rejected."""
    cdef cnp.ndarray s = _arr("scores", scores, cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, -1)
    cdef Py_ssize_t n = cnp.PyArray_DIM(s, 0)
    cdef cnp.ndarray out = _empty(n, cnp.NPY_INT64)
    cdef ScoreIdx* scratch = <ScoreIdx*>malloc((2 * n + 1) * sizeof(ScoreIdx))
    cdef int rc
    if scratch == NULL:
        raise MemoryError()
    with nogil:
        rc = order_kernel(n, <double*>_ptr(s), <int64_t*>_ptr(out), scratch)
    free(scratch)
    if rc != 0:
        raise ValueError("scores must not contain NaN")
    return out


def dedup(order, exact_key, simhash, eligible, max_hamming):
    """dup_of[i] = kept item that i duplicates, else -1; int64[n]. See fastpath.reference.dedup."""
    cdef cnp.ndarray o = _arr("order", order, cnp.NPY_INT64, np.int64, _INT_KINDS, -1)
    cdef Py_ssize_t n = cnp.PyArray_DIM(o, 0)
    cdef cnp.ndarray ex = _arr("exact_key", exact_key, cnp.NPY_UINT64, np.uint64, _INT_KINDS, n)
    cdef cnp.ndarray sh = _arr("simhash", simhash, cnp.NPY_UINT64, np.uint64, _INT_KINDS, n)
    cdef cnp.ndarray el = _arr("eligible", eligible, cnp.NPY_UINT8, np.uint8, _INT_KINDS, n)
    cdef int mh = _hamming_arg(max_hamming)
    cdef cnp.ndarray out = _empty(n, cnp.NPY_INT64)
    cdef int rc
    _check_permutation(n, <int64_t*>_ptr(o))
    with nogil:
        rc = dedup_kernel(n, <int64_t*>_ptr(o), <uint64_t*>_ptr(ex), <uint64_t*>_ptr(sh),
                          <uint8_t*>_ptr(el), mh, <int64_t*>_ptr(out))
    if rc != 0:
        raise MemoryError()
    return out


def greedy_pack(order, tokens, category, eligible, cat_budget, total_budget, bint flow_unused):
    """(selected uint8[n], used, effective_budget, flowed_in int64[ncat]); see the reference."""
    cdef cnp.ndarray o = _arr("order", order, cnp.NPY_INT64, np.int64, _INT_KINDS, -1)
    cdef Py_ssize_t n = cnp.PyArray_DIM(o, 0)
    cdef cnp.ndarray tok = _arr("tokens", tokens, cnp.NPY_INT32, np.int32, _INT_KINDS, n)
    cdef cnp.ndarray cat = _arr("category", category, cnp.NPY_INT32, np.int32, _INT_KINDS, n)
    cdef cnp.ndarray el = _arr("eligible", eligible, cnp.NPY_UINT8, np.uint8, _INT_KINDS, n)
    cdef cnp.ndarray cb = _arr("cat_budget", cat_budget, cnp.NPY_INT64, np.int64, _INT_KINDS, -1)
    cdef int64_t total = _int64_clamped("total_budget", total_budget, 0)
    cdef Py_ssize_t ncat = cnp.PyArray_DIM(cb, 0)
    _check_permutation(n, <int64_t*>_ptr(o))
    _check_tokens(n, <int32_t*>_ptr(tok))
    cdef cnp.ndarray sel = _empty(n, cnp.NPY_UINT8)
    cdef cnp.ndarray used = _empty(ncat, cnp.NPY_INT64)
    cdef cnp.ndarray eff = _empty(ncat, cnp.NPY_INT64)
    cdef cnp.ndarray flowed = _empty(ncat, cnp.NPY_INT64)
    cdef int rc
    with nogil:
        rc = pack_kernel(n, ncat, <int64_t*>_ptr(o), <int32_t*>_ptr(tok), <int32_t*>_ptr(cat),
                         <uint8_t*>_ptr(el), <int64_t*>_ptr(cb), total, flow_unused,
                         <uint8_t*>_ptr(sel), <int64_t*>_ptr(used), <int64_t*>_ptr(eff),
                         <int64_t*>_ptr(flowed))
    if rc != 0:
        raise MemoryError()
    return sel, used, eff, flowed


def select(relevance, age_s, priority, tokens, category, exact_key, simhash, cat_budget, total_budget,
           *, double w_relevance=1.0, double w_recency=1.0, double w_priority=1.0,
           double half_life_s=3600.0, max_hamming=3, double min_score=-math.inf, bint flow_unused=True):
    """Score, rank, dedup and pack candidates in one call; returns a Selection."""
    cdef cnp.ndarray rel = _arr("relevance", relevance, cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, -1)
    cdef Py_ssize_t n = cnp.PyArray_DIM(rel, 0)
    cdef cnp.ndarray age = _arr("age_s", age_s, cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, n)
    cdef cnp.ndarray pri = _arr("priority", priority, cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, n)
    cdef cnp.ndarray tok = _arr("tokens", tokens, cnp.NPY_INT32, np.int32, _INT_KINDS, n)
    cdef cnp.ndarray cat = _arr("category", category, cnp.NPY_INT32, np.int32, _INT_KINDS, n)
    cdef cnp.ndarray ex = _arr("exact_key", exact_key, cnp.NPY_UINT64, np.uint64, _INT_KINDS, n)
    cdef cnp.ndarray sh = _arr("simhash", simhash, cnp.NPY_UINT64, np.uint64, _INT_KINDS, n)
    cdef cnp.ndarray cb = _arr("cat_budget", cat_budget, cnp.NPY_INT64, np.int64, _INT_KINDS, -1)
    cdef int64_t total = _int64_clamped("total_budget", total_budget, 0)
    cdef int mh = _hamming_arg(max_hamming)
    cdef Py_ssize_t ncat = cnp.PyArray_DIM(cb, 0)
    _check_tokens(n, <int32_t*>_ptr(tok))

    cdef cnp.ndarray scores = _empty(n, cnp.NPY_FLOAT64)
    cdef cnp.ndarray order = _empty(n, cnp.NPY_INT64)
    cdef cnp.ndarray status = _empty(n, cnp.NPY_INT8)
    cdef cnp.ndarray dup_of = _empty(n, cnp.NPY_INT64)
    cdef cnp.ndarray used = _empty(ncat, cnp.NPY_INT64)
    cdef cnp.ndarray eff = _empty(ncat, cnp.NPY_INT64)
    cdef cnp.ndarray flowed = _empty(ncat, cnp.NPY_INT64)
    cdef double* sc = <double*>_ptr(scores)
    cdef int64_t* od = <int64_t*>_ptr(order)
    cdef int8_t* st = <int8_t*>_ptr(status)
    cdef int64_t* dp = <int64_t*>_ptr(dup_of)

    # One scratch block: sort pairs, two eligibility masks, the packed flags, the selected list.
    cdef size_t nbytes = (2 * n + 1) * sizeof(ScoreIdx) + (n + 1) * sizeof(int64_t) + 3 * (n + 1)
    cdef char* block = <char*>malloc(nbytes)
    if block == NULL:
        raise MemoryError()
    cdef ScoreIdx* pairs = <ScoreIdx*>block
    cdef int64_t* chosen = <int64_t*>(block + (2 * n + 1) * sizeof(ScoreIdx))
    cdef uint8_t* dedup_ok = <uint8_t*>(chosen + n + 1)
    cdef uint8_t* pack_ok = dedup_ok + n + 1
    cdef uint8_t* packed = pack_ok + n + 1
    cdef Py_ssize_t i, p, k = 0
    cdef int rc = 0
    with nogil:
        fuse_kernel(n, <double*>_ptr(rel), <double*>_ptr(age), <double*>_ptr(pri), w_relevance,
                    w_recency, w_priority, half_life_s, sc)
        if order_kernel(n, sc, od, pairs) != 0:
            rc = 1
        else:
            for i in range(n):
                if sc[i] < min_score:
                    st[i] = ST_LOW_SCORE
                    dedup_ok[i] = 0
                else:
                    st[i] = ST_OVER_BUDGET
                    dedup_ok[i] = 1
            if dedup_kernel(n, od, <uint64_t*>_ptr(ex), <uint64_t*>_ptr(sh), dedup_ok, mh, dp) != 0:
                rc = 2
            else:
                for i in range(n):
                    pack_ok[i] = dedup_ok[i] and dp[i] < 0
                    if dedup_ok[i] and dp[i] >= 0:
                        st[i] = ST_DUPLICATE
                if pack_kernel(n, ncat, od, <int32_t*>_ptr(tok), <int32_t*>_ptr(cat), pack_ok,
                               <int64_t*>_ptr(cb), total, flow_unused, packed, <int64_t*>_ptr(used),
                               <int64_t*>_ptr(eff), <int64_t*>_ptr(flowed)) != 0:
                    rc = 2
                else:
                    for p in range(n):
                        i = od[p]
                        if packed[i]:
                            st[i] = ST_SELECTED
                            chosen[k] = i
                            k += 1
    if rc != 0:
        free(block)
        if rc == 1:
            raise ValueError("scores must not contain NaN (check relevance, age_s, priority, weights)")
        raise MemoryError()
    cdef cnp.ndarray sel = _empty(k, cnp.NPY_INT64)
    if k:
        memcpy(_ptr(sel), chosen, k * sizeof(int64_t))
    free(block)
    return Selection(scores, order, status, dup_of, used, eff, flowed, sel)


def arrange(picked, starts, slots, orders, scores, tokens, Py_ssize_t n_slots):
    """Where the packed candidates go and in what order; see fastpath.reference.arrange."""
    cdef cnp.ndarray pk = _arr("picked", picked, cnp.NPY_INT64, np.int64, _INT_KINDS, -1)
    cdef cnp.ndarray st = _arr("starts", starts, cnp.NPY_INT64, np.int64, _INT_KINDS, -1)
    cdef Py_ssize_t nb = cnp.PyArray_DIM(st, 0), m = cnp.PyArray_DIM(pk, 0)
    cdef cnp.ndarray sl = _arr("slots", slots, cnp.NPY_INT64, np.int64, _INT_KINDS, nb)
    cdef cnp.ndarray sc = _arr("scores", scores, cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, -1)
    cdef Py_ssize_t n = cnp.PyArray_DIM(sc, 0)
    cdef cnp.ndarray tk = _arr("tokens", tokens, cnp.NPY_INT32, np.int32, _INT_KINDS, n)
    if len(orders) != nb:
        raise ValueError(f"orders must have length {nb}, got {len(orders)}")
    if n_slots < 0:
        raise ValueError(f"n_slots must be >= 0, got {n_slots}")
    cdef const int64_t* pst = <const int64_t*>_ptr(st)
    cdef const int64_t* psl = <const int64_t*>_ptr(sl)
    cdef Py_ssize_t b, j, g, lo, hi, s, size
    for b in range(nb):
        if pst[b] < (0 if b == 0 else pst[b - 1]) or pst[b] > n or (b == 0 and pst[0] != 0):
            raise ValueError("starts must rise from 0 and stay within the candidates")
        if psl[b] < 0 or psl[b] >= n_slots:
            raise ValueError(f"slots[{b}] is {psl[b]}, outside 0-{n_slots - 1}")
    cdef list keyed = [None] * nb  # each batch's order keys as float64, or None
    cdef const double** pord = <const double**>malloc(nb * sizeof(double*) + 1)
    if pord == NULL:
        raise MemoryError()
    cdef cnp.ndarray ks = _empty(m, cnp.NPY_INT64), js = _empty(m, cnp.NPY_INT64)
    cdef cnp.ndarray keys = _empty(m, cnp.NPY_FLOAT64), rank = _empty(m, cnp.NPY_INT64)
    cdef cnp.ndarray bounds = _empty(n_slots + 1, cnp.NPY_INT64), slot_tokens = _empty(n_slots, cnp.NPY_INT64)
    cdef int64_t* pks = <int64_t*>_ptr(ks)
    cdef int64_t* pjs = <int64_t*>_ptr(js)
    cdef double* pkey = <double*>_ptr(keys)
    cdef int64_t* prank = <int64_t*>_ptr(rank)
    cdef int64_t* pb = <int64_t*>_ptr(bounds)
    cdef int64_t* pslot_tok = <int64_t*>_ptr(slot_tokens)
    cdef const int64_t* ppk = <const int64_t*>_ptr(pk)
    cdef const double* psc = <const double*>_ptr(sc)
    cdef const int32_t* ptk = <const int32_t*>_ptr(tk)
    cdef int64_t* grouped = <int64_t*>malloc(m * sizeof(int64_t) + 1)
    cdef int64_t* sub = <int64_t*>malloc(m * sizeof(int64_t) + 1)
    cdef double* neg = <double*>malloc(m * sizeof(double) + 1)
    cdef ScoreIdx* scratch = <ScoreIdx*>malloc((2 * m + 1) * sizeof(ScoreIdx))
    cdef double x
    cdef int rc = 0
    try:
        if grouped == NULL or sub == NULL or neg == NULL or scratch == NULL:
            raise MemoryError()
        for b in range(nb):
            size = (pst[b + 1] if b + 1 < nb else n) - pst[b]
            pord[b] = NULL
            if orders[b] is not None:
                keyed[b] = _arr(f"orders[{b}]", orders[b], cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, size)
                pord[b] = <const double*>_ptr(<cnp.ndarray>keyed[b])
        _check_rows("picked", pk, n)
        with nogil:
            for s in range(n_slots + 1):
                pb[s] = 0
            for s in range(n_slots):
                pslot_tok[s] = 0
            for j in range(m):
                g = ppk[j]
                lo, hi = 0, nb  # the last batch starting at or before g
                while hi - lo > 1:
                    b = (lo + hi) // 2
                    if pst[b] <= g:
                        lo = b
                    else:
                        hi = b
                b = lo
                pks[j], pjs[j] = b, g - pst[b]
                x = pord[b][g - pst[b]] if pord[b] != NULL else NAN
                pkey[j] = -psc[g] if isnan(x) else x
                pb[psl[b] + 1] += 1
                pslot_tok[psl[b]] += ptk[g]
            for s in range(n_slots):
                pb[s + 1] += pb[s]
            # Group the picks by slot (stable), then order each slot by key ascending, ties in
            # selection order: the ranking kernel on negated keys (score descending, index ascending).
            for s in range(n_slots):
                size = 0
                for j in range(m):
                    if psl[pks[j]] == s:
                        sub[size] = j
                        neg[size] = -pkey[j]
                        size += 1
                if size:
                    rc = order_kernel(size, neg, grouped, scratch)
                    if rc != 0:
                        break
                    for j in range(size):
                        prank[pb[s] + j] = sub[grouped[j]]
        if rc != 0:
            raise ValueError("scores must not contain NaN")
        return ks, js, keys, rank, bounds, slot_tokens
    finally:
        free(pord)
        free(grouped)
        free(sub)
        free(neg)
        free(scratch)
