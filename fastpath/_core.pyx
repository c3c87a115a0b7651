"""Compiled hot path of Context Sidecar: fused scoring, ranking, dedup, budget packing, text keys.

The semantics are specified by ``fastpath.reference`` (see its module docstring); every routine here
must return exactly what its reference twin returns, floats bit for bit. The Python-level wrappers
validate and convert inputs, then hand raw contiguous buffers to nogil kernels (declared in
_core.pxd so other Cython modules can cimport them).
"""

from libc.math cimport NAN, exp, fabs, isinf, isnan, llrint, log, sqrt
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcpy, memset

cimport numpy as cnp

import math

import numpy as np

from fastpath.reference import Selection

cnp.import_array()

cdef extern from *:
    """
    #include <stdint.h>
    /* Bit-identical floats with the reference need plain IEEE mul-then-add: forbid contraction into
       FMA, which GCC otherwise does across statements on FMA-capable targets (aarch64, -march=...). */
    #if defined(__clang__)
    #pragma STDC FP_CONTRACT OFF
    #elif defined(__GNUC__)
    #pragma GCC optimize ("fp-contract=off")
    #endif

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

cdef extern from "Python.h":
    Py_UCS4* PyUnicode_AsUCS4(object u, Py_UCS4* buffer, Py_ssize_t buflen, int copy_null) except NULL
    Py_ssize_t PyUnicode_GET_LENGTH(object u)
    # A pure table lookup, safe without the GIL; it is exactly what str.isalnum() tests per character.
    bint fp_isalnum "Py_UNICODE_ISALNUM"(uint32_t ch) nogil

SELECTED = ST_SELECTED
OVER_BUDGET = ST_OVER_BUDGET
DUPLICATE = ST_DUPLICATE
LOW_SCORE = ST_LOW_SCORE

cdef double LN2 = 0.6931471805599453
cdef uint64_t _FNV_OFFSET = 0xCBF29CE484222325ULL
cdef uint64_t _FNV_PRIME = 0x100000001B3ULL
cdef int64_t _INT64_MAX = 0x7FFFFFFFFFFFFFFFLL
cdef Py_ssize_t _SORT_RUN = 24

# --------------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------------

cdef str _FLOAT_KINDS = "biuf"
cdef str _INT_KINDS = "biu"


cdef inline str _label(str name, Py_ssize_t index):
    """name, or name[index] for one array of a list (formatted only for an error message)."""
    return name if index < 0 else f"{name}[{index}]"


cdef cnp.ndarray _arr(str name, object x, int typenum, object dtype, str kinds, Py_ssize_t n, Py_ssize_t index=-1):
    """x as a behaved contiguous 1-D array of dtype (typenum); ValueError naming `name` (or
    name[index]) otherwise."""
    cdef cnp.ndarray a = <cnp.ndarray>x if type(x) is np.ndarray else np.asarray(x)  # no call for an array
    if cnp.PyArray_NDIM(a) != 1:
        raise ValueError(f"{_label(name, index)} must be 1-D, got shape {np.shape(x)}")
    if n >= 0 and cnp.PyArray_DIM(a, 0) != n:
        raise ValueError(f"{_label(name, index)} must have length {n}, got {cnp.PyArray_DIM(a, 0)}")
    # Fast path: already the right native type and contiguous (the service's normal case).
    if (cnp.PyArray_TYPE(a) == typenum and cnp.PyArray_ISBEHAVED_RO(a)
            and cnp.PyArray_IS_C_CONTIGUOUS(a)):
        return a
    if a.dtype.kind not in kinds and a.size:  # an empty list arrives as float64; let it through
        raise ValueError(f"{_label(name, index)} has unsupported dtype {a.dtype}")
    target = np.dtype(dtype)
    if a.dtype != target and target.kind == "i" and a.size and not np.can_cast(a.dtype, target):
        # Narrowing integer casts would wrap silently; refuse values that do not fit.
        info = np.iinfo(target)
        if a.min() < info.min or a.max() > info.max:
            raise ValueError(f"{_label(name, index)} has values outside the range of {target}")
    return np.ascontiguousarray(a, dtype=target)


cdef int64_t _int64_clamped(str name, object x, int64_t lo) except? -2:
    """Python integer clamped to [lo, INT64_MAX] (the reference saturates the same way)."""
    try:
        v = int(x.__index__())
    except (AttributeError, TypeError):
        raise ValueError(f"{name} must be an integer, got {x!r}") from None
    if v < lo:
        return lo
    if v > _INT64_MAX:
        return _INT64_MAX
    return v


cdef int _hamming_arg(object max_hamming) except -2:
    # Anything >= 64 behaves like 64 and anything negative disables the near check.
    cdef int64_t mh = _int64_clamped("max_hamming", max_hamming, -1)
    return <int>(64 if mh > 64 else mh)


cdef inline void* _ptr(cnp.ndarray a) noexcept nogil:
    # Raw data pointers instead of typed memoryviews: select() touches ~15 arrays per call and
    # acquiring a memoryview costs about a microsecond each, a sizeable share of the whole call.
    return cnp.PyArray_DATA(a)


cdef inline cnp.ndarray _empty(Py_ssize_t n, int typenum):
    cdef cnp.npy_intp dims[1]
    dims[0] = n
    return <cnp.ndarray>cnp.PyArray_EMPTY(1, dims, typenum, 0)


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
# Kernels (nogil, raw buffers; see _core.pxd)
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
        budget = _INT64_MAX if carry > _INT64_MAX - own else own + carry
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


# --------------------------------------------------------------------------------------------------
# Text keys
# --------------------------------------------------------------------------------------------------

ctypedef struct TextBuf:
    uint32_t* cps  # lowered text as code points (Py_UCS4; plain ints avoid Cython's char semantics)
    Py_ssize_t* starts  # token t spans cps[starts[t]:ends[t]]
    Py_ssize_t* ends
    Py_ssize_t cap


cdef int _ensure(TextBuf* tb, Py_ssize_t need) except -1:
    cdef Py_ssize_t cap = tb.cap if tb.cap else 64
    cdef void* p
    if need <= tb.cap:
        return 0
    while cap < need:
        cap *= 2
    p = realloc(tb.cps, cap * sizeof(uint32_t))
    if p == NULL:
        raise MemoryError()
    tb.cps = <uint32_t*>p
    p = realloc(tb.starts, cap * sizeof(Py_ssize_t))
    if p == NULL:
        raise MemoryError()
    tb.starts = <Py_ssize_t*>p
    p = realloc(tb.ends, cap * sizeof(Py_ssize_t))
    if p == NULL:
        raise MemoryError()
    tb.ends = <Py_ssize_t*>p
    tb.cap = cap
    return 0


cdef void _release(TextBuf* tb) noexcept:
    free(tb.cps)
    free(tb.starts)
    free(tb.ends)
    tb.cps = NULL
    tb.starts = NULL
    tb.ends = NULL
    tb.cap = 0


cdef inline bint _is_cjk(uint32_t c) noexcept nogil:
    return ((0x3040 <= c <= 0x30FF) or (0x3400 <= c <= 0x4DBF) or (0x4E00 <= c <= 0x9FFF)
            or (0xF900 <= c <= 0xFAFF) or (0x20000 <= c <= 0x2FFFF))


cdef inline bint _is_word(uint32_t c) noexcept nogil:
    if c < 128:  # ASCII fast path; identical to str.isalnum() there
        return (c - 97 < 26) or (c - 65 < 26) or (c - 48 < 10) or c == 95
    return fp_isalnum(c)


cdef Py_ssize_t _tokenize(const uint32_t* cps, Py_ssize_t n, Py_ssize_t* starts,
                          Py_ssize_t* ends) noexcept nogil:
    cdef Py_ssize_t i, nt = 0
    cdef bint in_word = False
    cdef uint32_t c
    for i in range(n):
        c = cps[i]
        if _is_cjk(c):
            if in_word:
                ends[nt] = i
                nt += 1
                in_word = False
            starts[nt] = i
            ends[nt] = i + 1
            nt += 1
        elif _is_word(c):
            if not in_word:
                starts[nt] = i
                in_word = True
        elif in_word:
            ends[nt] = i
            nt += 1
            in_word = False
    if in_word:
        ends[nt] = n
        nt += 1
    return nt


cdef list _text_list(object texts, str name="texts"):
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a sequence of str, not a single str")
    return texts if type(texts) is list else list(texts)


cdef Py_ssize_t _prepare(object text, Py_ssize_t k, TextBuf* tb) except -1:
    """Lowercase `text` (Python's own str.lower, for exact Unicode semantics), tokenize into tb."""
    if not isinstance(text, str):
        raise TypeError(f"texts[{k}] must be str, got {type(text).__name__}")
    low = text.lower()
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(low)
    _ensure(tb, n + 1)
    if n:
        PyUnicode_AsUCS4(low, <Py_UCS4*>tb.cps, tb.cap, 0)
    return _tokenize(tb.cps, n, tb.starts, tb.ends)


cdef inline uint64_t _fb(uint64_t h, uint64_t byte) noexcept nogil:
    return (h ^ byte) * _FNV_PRIME


cdef inline uint64_t _fcp(uint64_t h, uint32_t c) noexcept nogil:
    # FNV-1a continued over the UTF-8 encoding of one code point (tokens never hold surrogates).
    if c < 0x80:
        return _fb(h, c)
    if c < 0x800:
        h = _fb(h, 0xC0 | (c >> 6))
        return _fb(h, 0x80 | (c & 0x3F))
    if c < 0x10000:
        h = _fb(h, 0xE0 | (c >> 12))
        h = _fb(h, 0x80 | ((c >> 6) & 0x3F))
        return _fb(h, 0x80 | (c & 0x3F))
    h = _fb(h, 0xF0 | (c >> 18))
    h = _fb(h, 0x80 | ((c >> 12) & 0x3F))
    h = _fb(h, 0x80 | ((c >> 6) & 0x3F))
    return _fb(h, 0x80 | (c & 0x3F))


cdef inline uint64_t _fspan(uint64_t h, const uint32_t* cps, Py_ssize_t s, Py_ssize_t e) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(s, e):
        h = _fcp(h, cps[i])
    return h


cdef uint64_t fnv_bytes(uint64_t h, const unsigned char* data, Py_ssize_t n) noexcept nogil:
    cdef Py_ssize_t i
    for i in range(n):
        h = _fb(h, data[i])
    return h


# _BIT_VOTES[x][k] = +1 if bit k of byte x is set else -1: SimHash votes a byte at a time, which the
# compiler turns into vector adds (a per-bit shift loop does not vectorise on baseline x86-64).
cdef int32_t _BIT_VOTES[256][8]


cdef void _init_bit_votes() noexcept:
    cdef int x, k
    for x in range(256):
        for k in range(8):
            _BIT_VOTES[x][k] = 1 if (x >> k) & 1 else -1


_init_bit_votes()


cdef inline void _sim_add(int32_t* v, uint64_t h) noexcept nogil:
    cdef int j, k
    cdef const int32_t* row
    for j in range(8):
        row = _BIT_VOTES[(h >> (8 * j)) & 0xFF]
        for k in range(8):
            v[8 * j + k] += row[k]


cdef void _keys_one(const uint32_t* cps, const Py_ssize_t* st, const Py_ssize_t* en, Py_ssize_t nt,
                    uint64_t* exact, uint64_t* sim) noexcept nogil:
    cdef Py_ssize_t t
    cdef uint64_t h, prev, cur, out = 0
    cdef int32_t v[64]
    cdef int b
    if nt == 0:
        exact[0] = 0
        sim[0] = 0
        return
    h = _FNV_OFFSET
    for t in range(nt):
        if t:
            h = _fb(h, 32)
        h = _fspan(h, cps, st[t], en[t])
    exact[0] = h if h != 0 else 1
    memset(v, 0, sizeof(v))
    prev = _fspan(_FNV_OFFSET, cps, st[0], en[0])
    if nt == 1:
        _sim_add(v, prev)
    for t in range(1, nt):
        # "a b" = FNV continued from hash("a") over " b"; hash("b") alone seeds the next bigram.
        _sim_add(v, _fspan(_fb(prev, 32), cps, st[t], en[t]))
        prev = _fspan(_FNV_OFFSET, cps, st[t], en[t])
    for b in range(64):
        if v[b] > 0:
            out |= (<uint64_t>1) << b
    sim[0] = out if out != 0 else 1


cdef inline void _acc(double* vec, uint64_t dim, uint64_t h, double weight) noexcept nogil:
    cdef double sign = 1.0 if (h >> 63) == 0 else -1.0
    vec[h % dim] += sign * weight


cdef uint64_t _HW = fnv_bytes(_FNV_OFFSET, <const unsigned char*>b"w:", 2)
cdef uint64_t _HB = fnv_bytes(_FNV_OFFSET, <const unsigned char*>b"b:", 2)
cdef uint64_t _HC = fnv_bytes(_FNV_OFFSET, <const unsigned char*>b"c:", 2)


cdef void _embed_one(const uint32_t* cps, const Py_ssize_t* st, const Py_ssize_t* en, Py_ssize_t nt,
                     double* vec, Py_ssize_t dim, float* out) noexcept nogil:
    cdef Py_ssize_t t, s, e, i
    cdef uint64_t h, d = <uint64_t>dim
    cdef double ss = 0.0, norm
    memset(vec, 0, dim * sizeof(double))
    for t in range(nt):
        s = st[t]
        e = en[t]
        _acc(vec, d, _fspan(_HW, cps, s, e), 1.0)
        if t > 0:
            h = _fspan(_fb(_fspan(_HB, cps, st[t - 1], en[t - 1]), 32), cps, s, e)
            _acc(vec, d, h, 0.5)
        if e - s >= 4:
            # Trigrams of "<" + tok + ">": the leading "<ab", the inner ones, the trailing "yz>".
            _acc(vec, d, _fcp(_fcp(_fb(_HC, 60), cps[s]), cps[s + 1]), 0.3)
            for i in range(s, e - 2):
                _acc(vec, d, _fcp(_fcp(_fcp(_HC, cps[i]), cps[i + 1]), cps[i + 2]), 0.3)
            _acc(vec, d, _fb(_fcp(_fcp(_HC, cps[e - 2]), cps[e - 1]), 62), 0.3)
    # Sum of squares in index order (the compiler may not reassociate it) to match the reference.
    for i in range(dim):
        ss += vec[i] * vec[i]
    if ss > 0.0:
        norm = sqrt(ss)
        for i in range(dim):
            out[i] = <float>(vec[i] / norm)
    else:
        memset(out, 0, dim * sizeof(float))


def tokenize(text):
    """Tokens of `text` (rules in the fastpath.reference docstring); list[str]."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    cdef TextBuf tb
    memset(&tb, 0, sizeof(tb))
    cdef Py_ssize_t nt, t
    try:
        nt = _prepare(text, 0, &tb)
        low = text.lower()
        return [low[tb.starts[t]:tb.ends[t]] for t in range(nt)]
    finally:
        _release(&tb)


def fnv1a64(data):
    """FNV-1a 64-bit hash of a bytes-like object."""
    cdef const unsigned char[::1] mv = memoryview(data).cast("B")
    if mv.shape[0] == 0:
        return _FNV_OFFSET
    return fnv_bytes(_FNV_OFFSET, &mv[0], mv.shape[0])


def text_keys(texts):
    """(exact key uint64[n], simhash uint64[n]) per text; see fastpath.reference.text_keys."""
    cdef list items = _text_list(texts)
    cdef Py_ssize_t n = len(items), k, nt
    cdef cnp.ndarray exact = _empty(n, cnp.NPY_UINT64)
    cdef cnp.ndarray sim = _empty(n, cnp.NPY_UINT64)
    cdef uint64_t* ex = <uint64_t*>_ptr(exact)
    cdef uint64_t* sh = <uint64_t*>_ptr(sim)
    cdef TextBuf tb
    memset(&tb, 0, sizeof(tb))
    try:
        for k in range(n):
            nt = _prepare(items[k], k, &tb)
            _keys_one(tb.cps, tb.starts, tb.ends, nt, ex + k, sh + k)
    finally:
        _release(&tb)
    return exact, sim


def hash_embed(texts, dim):
    """Model-free hashed bag-of-features embedding, L2-normalised; float32[n, dim]."""
    cdef int64_t d = _int64_clamped("dim", dim, -1)
    if d < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    cdef list items = _text_list(texts)
    cdef Py_ssize_t n = len(items), k, nt
    cdef cnp.npy_intp dims[2]
    dims[0] = n
    dims[1] = d
    cdef cnp.ndarray out = <cnp.ndarray>cnp.PyArray_EMPTY(2, dims, cnp.NPY_FLOAT32, 0)
    cdef float* op = <float*>_ptr(out)
    cdef double* vec = <double*>malloc(d * sizeof(double))
    if vec == NULL:
        raise MemoryError()
    cdef TextBuf tb
    memset(&tb, 0, sizeof(tb))
    try:
        for k in range(n):
            nt = _prepare(items[k], k, &tb)
            _embed_one(tb.cps, tb.starts, tb.ends, nt, vec, d, op + k * d)
    finally:
        _release(&tb)
        free(vec)
    return out


# ------------------------------------------------------------------------------ wire encoding
cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object u, Py_ssize_t* size) except NULL
    object PyBytes_FromStringAndSize(const char* v, Py_ssize_t n)
    char* PyBytes_AS_STRING(object b)
    Py_ssize_t PyBytes_GET_SIZE(object b)


cdef inline Py_ssize_t _varint_len(uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline char* _put_varint(char* p, uint64_t v) noexcept nogil:
    while v >= 0x80:
        p[0] = <char>((v & 0x7F) | 0x80)
        p += 1
        v >>= 7
    p[0] = <char>v
    return p + 1


cdef inline Py_ssize_t _int_field_len(uint64_t v) noexcept nogil:
    return 0 if v == 0 else 1 + _varint_len(v)  # every tag used here fits one byte


cdef inline char* _put_int_field(char* p, int tag, uint64_t v) noexcept nogil:
    if v == 0:
        return p
    p[0] = <char>tag
    return _put_varint(p + 1, v)


cdef inline char* _put_bytes_field(char* p, int tag, const char* data, Py_ssize_t n) noexcept nogil:
    p[0] = <char>tag
    p = _put_varint(p + 1, <uint64_t>n)
    memcpy(p, data, n)
    return p + n


def encode_item(str source, int64_t category, int64_t tokens, str text, int64_t role, int64_t timestamp_ms,
                source_message_ids):
    """Wire bytes of a ContextItem without its score; see fastpath.reference ("Wire encoding")."""
    cdef Py_ssize_t ns, nt, nm, total, k
    cdef const char* s = PyUnicode_AsUTF8AndSize(source, &ns)
    cdef const char* t = PyUnicode_AsUTF8AndSize(text, &nt)
    cdef tuple ids = tuple(source_message_ids)
    total = (1 + _varint_len(ns) + ns if ns else 0) + (1 + _varint_len(nt) + nt if nt else 0)
    total += _int_field_len(<uint64_t>category) + _int_field_len(<uint64_t>tokens)
    total += _int_field_len(<uint64_t>role) + _int_field_len(<uint64_t>timestamp_ms)
    for mid in ids:
        if not isinstance(mid, str):
            raise TypeError(f"source_message_ids holds a {type(mid).__name__}, not str")
        PyUnicode_AsUTF8AndSize(mid, &nm)
        total += 1 + _varint_len(nm) + nm
    out = PyBytes_FromStringAndSize(NULL, total)
    cdef char* p = PyBytes_AS_STRING(out)
    if ns:
        p = _put_bytes_field(p, 0x0A, s, ns)
    p = _put_int_field(p, 0x10, <uint64_t>category)
    p = _put_int_field(p, 0x20, <uint64_t>tokens)
    if nt:
        p = _put_bytes_field(p, 0x2A, t, nt)
    p = _put_int_field(p, 0x30, <uint64_t>role)
    p = _put_int_field(p, 0x38, <uint64_t>timestamp_ms)
    for mid in ids:
        s = PyUnicode_AsUTF8AndSize(mid, &nm)
        p = _put_bytes_field(p, 0x42, s, nm)
    return out


cdef inline uint32_t _float_bits(double x) noexcept nogil:
    """x rounded to float32 (to nearest, beyond its range to infinity), as its bit pattern."""
    cdef float f = <float>x
    cdef uint32_t bits
    memcpy(&bits, &f, 4)
    return bits


cdef inline char* _put_fixed32(char* p, int tag, uint32_t bits) noexcept nogil:
    p[0] = <char>tag
    p[1] = <char>(bits & 0xFF)  # fixed32 is little-endian on the wire, whatever the host
    p[2] = <char>((bits >> 8) & 0xFF)
    p[3] = <char>((bits >> 16) & 0xFF)
    p[4] = <char>(bits >> 24)
    return p + 5


def encode_section(int64_t kind, bodies, scores, int64_t tokens):
    """Wire bytes of one BuildContextResponse.sections entry; see fastpath.reference."""
    cdef list items = bodies if type(bodies) is list else list(bodies)
    cdef Py_ssize_t n = len(items), k, inner, nb
    cdef cnp.ndarray sc = _arr("scores", scores, cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, n)
    cdef const double* sp = <const double*>_ptr(sc)
    cdef char* p
    cdef uint32_t* fbits = <uint32_t*>malloc((n + 1) * sizeof(uint32_t))
    if fbits == NULL:
        raise MemoryError()
    try:
        inner = _int_field_len(<uint64_t>kind) + _int_field_len(<uint64_t>tokens)
        for k in range(n):
            body = items[k]
            if type(body) is not bytes:
                raise TypeError(f"bodies[{k}] is a {type(body).__name__}, not bytes")
            fbits[k] = _float_bits(sp[k])
            nb = PyBytes_GET_SIZE(body) + (5 if fbits[k] else 0)
            inner += 1 + _varint_len(nb) + nb
        out = PyBytes_FromStringAndSize(NULL, 1 + _varint_len(inner) + inner)
        p = PyBytes_AS_STRING(out)
        p[0] = <char>0x0A
        p = _put_varint(p + 1, <uint64_t>inner)
        p = _put_int_field(p, 0x08, <uint64_t>kind)
        for k in range(n):
            body = items[k]
            nb = PyBytes_GET_SIZE(body)
            p[0] = <char>0x12
            p = _put_varint(p + 1, <uint64_t>(nb + (5 if fbits[k] else 0)))
            memcpy(p, PyBytes_AS_STRING(body), nb)
            p += nb
            if fbits[k]:
                p = _put_fixed32(p, 0x1D, fbits[k])
        _put_int_field(p, 0x18, <uint64_t>tokens)
        return out
    finally:
        free(fbits)


# --------------------------------------------------------------------------------------------------
# Set overlaps (the knowledge-beats-memory rule compares each memory's terms with each chunk's)
# --------------------------------------------------------------------------------------------------

cdef list _id_sets(str name, object sets):
    cdef list out = []
    cdef cnp.ndarray a
    cdef const uint64_t* p
    cdef Py_ssize_t k, i, n
    for k, x in enumerate(sets):
        if (type(x) is np.ndarray and cnp.PyArray_NDIM(<cnp.ndarray>x) == 1
                and cnp.PyArray_TYPE(<cnp.ndarray>x) == cnp.NPY_UINT64 and cnp.PyArray_ISBEHAVED_RO(<cnp.ndarray>x)
                and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray>x)):
            a = <cnp.ndarray>x  # the normal case: no name to format, nothing to convert
        else:
            a = _arr(f"{name}[{k}]", x, cnp.NPY_UINT64, np.uint64, _INT_KINDS, -1)
        p = <const uint64_t*>_ptr(a)
        n = cnp.PyArray_DIM(a, 0)
        for i in range(1, n):
            if p[i] <= p[i - 1]:
                raise ValueError(f"{name}[{k}] must be sorted and unique (text.term_ids)")
        out.append(a)
    return out


def overlap_counts(a_sets, b_sets):
    """int32[len(a_sets), len(b_sets)]: |a_sets[r] & b_sets[c]| for sorted unique uint64 id arrays,
    by a merge walk of each pair."""
    cdef list a = _id_sets("a_sets", a_sets), b = _id_sets("b_sets", b_sets)
    cdef Py_ssize_t na = len(a), nb = len(b), r, c, i, j, la, lb
    cdef cnp.npy_intp dims[2]
    dims[0], dims[1] = na, nb
    cdef cnp.ndarray out = <cnp.ndarray>cnp.PyArray_ZEROS(2, dims, cnp.NPY_INT32, 0)
    cdef int32_t* o = <int32_t*>_ptr(out)
    cdef const uint64_t* pa
    cdef const uint64_t* pb
    cdef int32_t shared
    for r in range(na):
        pa = <const uint64_t*>_ptr(<cnp.ndarray>a[r])
        la = cnp.PyArray_DIM(<cnp.ndarray>a[r], 0)
        for c in range(nb):
            pb = <const uint64_t*>_ptr(<cnp.ndarray>b[c])
            lb = cnp.PyArray_DIM(<cnp.ndarray>b[c], 0)
            o[r * nb + c] = _shared(pa, la, pb, lb)
    return out


cdef inline int32_t _shared(const uint64_t* pa, Py_ssize_t la, const uint64_t* pb, Py_ssize_t lb) noexcept nogil:
    """|a & b| of two sorted unique id arrays, by a merge walk."""
    cdef Py_ssize_t i = 0, j = 0
    cdef int32_t shared = 0
    while i < la and j < lb:
        if pa[i] < pb[j]:
            i += 1
        elif pa[i] > pb[j]:
            j += 1
        else:
            shared += 1
            i += 1
            j += 1
    return shared


cdef cnp.ndarray _matrix32(str name, object x, Py_ssize_t rows, Py_ssize_t cols):
    """x as a C-contiguous float32 matrix; ValueError naming `name` when its shape is not (rows, cols)
    (cols < 0: any)."""
    cdef cnp.ndarray a = np.ascontiguousarray(x, dtype=np.float32)
    if cnp.PyArray_NDIM(a) != 2 or cnp.PyArray_DIM(a, 0) != rows or (cols >= 0 and cnp.PyArray_DIM(a, 1) != cols):
        raise ValueError(f"{name} must have shape ({rows}, {cols if cols >= 0 else 'dim'}), got {np.shape(x)}")
    return a


def best_matches(cos, a_sets, b_sets, double floor, int min_shared, double share_scale):
    """For each row r: the column c that matches it best, with that match's score and cosine.

    cos is float32[len(a_sets), len(b_sets)] (e.g. a_vecs @ b_vecs.T); share[r, c] =
    |a_sets[r] & b_sets[c]| / max(len(a_sets[r]), 1) when cos[r, c] >= floor and the overlap is at
    least min_shared, else 0; score = max(cos, share * share_scale), in double. Returns
    (best int64[n_a], score float64[n_a], cos float64[n_a]); best is the first column of the highest
    score, -1 when there are no columns."""
    cdef list a = _id_sets("a_sets", a_sets), b = _id_sets("b_sets", b_sets)
    cdef Py_ssize_t na = len(a), nb = len(b), r, c, la
    cdef cnp.ndarray m = _matrix32("cos", cos, na, nb)
    cdef cnp.ndarray best = _empty(na, cnp.NPY_INT64)
    cdef cnp.ndarray score = _empty(na, cnp.NPY_FLOAT64)
    cdef cnp.ndarray cosine = _empty(na, cnp.NPY_FLOAT64)
    cdef int64_t* pbest = <int64_t*>_ptr(best)
    cdef double* pscore = <double*>_ptr(score)
    cdef double* pcos = <double*>_ptr(cosine)
    cdef const float* pm = <const float*>_ptr(m)
    cdef const uint64_t* ta
    cdef int32_t shared
    cdef double x, s, share, NEG_INF = -math.inf
    for r in range(na):
        ta = <const uint64_t*>_ptr(<cnp.ndarray>a[r])
        la = cnp.PyArray_DIM(<cnp.ndarray>a[r], 0)
        pbest[r], pscore[r], pcos[r] = -1, NEG_INF, 0.0
        for c in range(nb):
            x = <double>pm[r * nb + c]
            s = x
            if x >= floor:
                shared = _shared(ta, la, <const uint64_t*>_ptr(<cnp.ndarray>b[c]), cnp.PyArray_DIM(<cnp.ndarray>b[c], 0))
                if shared >= min_shared:
                    share = <double>shared / <double>(la if la > 0 else 1)
                    if share * share_scale > s:
                        s = share * share_scale
            if s > pscore[r]:
                pbest[r], pscore[r], pcos[r] = c, s, x
    return best, score, cosine


cdef inline bint _ranks_before(float fa, int64_t ra, float fb, int64_t rb) noexcept nogil:
    """(fused descending, row ascending): the order of fused_top_k's result."""
    return fa > fb or (fa == fb and ra < rb)


cdef void _sift_down(float* hf, int64_t* hr, Py_ssize_t size, Py_ssize_t i) noexcept nogil:
    """Restore the heap below i; the root is the entry that ranks last (the first to give way)."""
    cdef Py_ssize_t child, last
    cdef float tf
    cdef int64_t tr
    while True:
        child, last = 2 * i + 1, i
        if child < size and _ranks_before(hf[last], hr[last], hf[child], hr[child]):
            last = child
        if child + 1 < size and _ranks_before(hf[last], hr[last], hf[child + 1], hr[child + 1]):
            last = child + 1
        if last == i:
            return
        tf, tr = hf[i], hr[i]
        hf[i], hr[i] = hf[last], hr[last]
        hf[last], hr[last] = tf, tr
        i = last


cdef inline void _heap_offer(float* hf, int64_t* hr, Py_ssize_t* size, Py_ssize_t k, float f,
                             int64_t i) noexcept nogil:
    """Keep the k best (f, i) offered so far: fill, heapify once full, then replace the root (the
    entry that ranks last) whenever a better one comes."""
    cdef Py_ssize_t m
    if size[0] < k:
        hf[size[0]], hr[size[0]] = f, i
        size[0] += 1
        if size[0] == k:
            for m in range(k // 2 - 1, -1, -1):
                _sift_down(hf, hr, k, m)
    elif k > 0 and _ranks_before(f, i, hf[0], hr[0]):
        hf[0], hr[0] = f, i
        _sift_down(hf, hr, k, 0)


cdef inline void _heap_close(float* hf, int64_t* hr, Py_ssize_t size, Py_ssize_t k) noexcept nogil:
    """Heapify a heap that was never filled to k (a full one already is)."""
    cdef Py_ssize_t m
    if size < k:
        for m in range(size // 2 - 1, -1, -1):
            _sift_down(hf, hr, size, m)


cdef void _heap_drain(float* hf, int64_t* hr, Py_ssize_t size, int64_t* rows, float* scores) noexcept nogil:
    """Empty the heap into rows/scores in rank order: popping yields the last-ranked entry first,
    so the output fills from the back."""
    cdef Py_ssize_t m = size
    while m > 0:
        m -= 1
        rows[m], scores[m] = hr[0], hf[0]
        hf[0], hr[0] = hf[m], hr[m]
        _sift_down(hf, hr, m, 0)


def fused_top_k(dense, lexical, prior, alive, double w, double half, Py_ssize_t k):
    """The k best rows of a hybrid index by fused score, in one pass without temporaries.

    All arithmetic in float32: lex = lexical / (lexical + half); fused = (w * dense + (1 - w) * lex)
    + prior. Rows that are not alive or whose fused score is not finite are skipped. Returns
    (rows int64[m], fused float32[m], lex float32[m]), m = min(k, eligible rows), ordered by fused
    descending, ties by row ascending. lexical must be >= 0 and half > 0."""
    cdef cnp.ndarray d = _arr("dense", dense, cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS, -1)
    cdef Py_ssize_t n = cnp.PyArray_DIM(d, 0), i, m = 0, size = 0
    cdef cnp.ndarray lx = _arr("lexical", lexical, cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS, n)
    cdef cnp.ndarray pr = _arr("prior", prior, cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS, n)
    cdef cnp.ndarray al = _arr("alive", alive, cnp.NPY_BOOL, np.bool_, "biu", n)
    if not half > 0:
        raise ValueError(f"half must be > 0, got {half}")
    cdef const float* pd = <const float*>_ptr(d)
    cdef const float* pl = <const float*>_ptr(lx)
    cdef const float* pp = <const float*>_ptr(pr)
    cdef const uint8_t* pa = <const uint8_t*>_ptr(al)
    cdef float w32 = <float>w, omw32 = <float>(1.0 - w), h32 = <float>half, l, f
    cdef bint bad = False
    if k < 0:
        k = 0
    cdef float* hf = <float*>malloc((k if k < n else n) * sizeof(float) + 1)
    cdef int64_t* hr = <int64_t*>malloc((k if k < n else n) * sizeof(int64_t) + 1)
    cdef cnp.ndarray rows, fused, lex
    cdef int64_t* prows
    cdef float* pfused
    cdef float* plex
    try:
        if hf == NULL or hr == NULL:
            raise MemoryError()
        with nogil:
            for i in range(n):
                if not pl[i] >= 0:  # also NaN
                    bad = True
                    break
                if not pa[i] or k == 0:
                    continue
                l = pl[i] / (pl[i] + h32)
                f = (w32 * pd[i] + omw32 * l) + pp[i]
                if isnan(f) or isinf(f):
                    continue
                _heap_offer(hf, hr, &size, k, f, i)
            if not bad:
                _heap_close(hf, hr, size, k)
        if bad:
            raise ValueError("lexical must be >= 0")
        rows = _empty(size, cnp.NPY_INT64)
        fused = _empty(size, cnp.NPY_FLOAT32)
        lex = _empty(size, cnp.NPY_FLOAT32)
        prows, pfused, plex = <int64_t*>_ptr(rows), <float*>_ptr(fused), <float*>_ptr(lex)
        with nogil:
            _heap_drain(hf, hr, size, prows, pfused)
            for m in range(size):
                plex[m] = pl[prows[m]] / (pl[prows[m]] + h32)
        return rows, fused, lex
    finally:
        free(hf)
        free(hr)


cdef enum:
    _TOUCHED = 1  # the row holds a query term
    _PICKED = 2  # the row is a candidate


cdef inline void _add_lanes(float* s, const float* a, const float* b) noexcept nogil:
    # Eight independent running sums (constant indices: the compiler keeps them in registers).
    s[0] += a[0] * b[0]
    s[1] += a[1] * b[1]
    s[2] += a[2] * b[2]
    s[3] += a[3] * b[3]
    s[4] += a[4] * b[4]
    s[5] += a[5] * b[5]
    s[6] += a[6] * b[6]
    s[7] += a[7] * b[7]


cdef inline float _dot32(const float* a, const float* b, Py_ssize_t dim) noexcept nogil:
    """float32 dot product of a and b padded with zeros to a multiple of 8: element j goes to
    running sum j % 8, the sums are then added pairwise. A fixed order the reference repeats, and
    independent adds that pipeline."""
    cdef float s[8]
    cdef float ta[8]
    cdef float tb[8]
    cdef Py_ssize_t j = 0, t
    for t in range(8):
        s[t] = 0.0
    while j + 8 <= dim:
        _add_lanes(s, a + j, b + j)
        j += 8
    if j < dim:
        for t in range(8):
            ta[t] = a[j + t] if j + t < dim else 0.0
            tb[t] = b[j + t] if j + t < dim else 0.0
        _add_lanes(s, ta, tb)
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))


def hybrid_top_k(term_rows, term_weights, dense_rows, vectors, query, prior, alive, double w, double half,
                 Py_ssize_t k, Py_ssize_t lexical_k):
    """The k best rows of a graph-searched hybrid index: lexical scoring, candidate union, fusion and
    ranking in one pass. See fastpath.reference.hybrid_top_k for the exact rule."""
    cdef cnp.ndarray al = _arr("alive", alive, cnp.NPY_BOOL, np.bool_, "biu", -1)
    cdef Py_ssize_t n = cnp.PyArray_DIM(al, 0)
    cdef cnp.ndarray pr = _arr("prior", prior, cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS, n)
    cdef cnp.ndarray dr = _arr("dense_rows", dense_rows, cnp.NPY_INT64, np.int64, _INT_KINDS, -1)
    cdef cnp.ndarray q = None if query is None else _arr("query", query, cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS, -1)
    cdef Py_ssize_t dim = 0 if q is None else cnp.PyArray_DIM(q, 0)
    cdef cnp.ndarray vecs = _matrix32("vectors", vectors, n, dim if q is not None else -1)
    if not half > 0:
        raise ValueError(f"half must be > 0, got {half}")
    if len(term_rows) != len(term_weights):
        raise ValueError(f"term_weights must have length {len(term_rows)}, got {len(term_weights)}")
    cdef list t_rows = [], t_weights = []
    cdef Py_ssize_t t, j, m, size = 0, n_cand = 0, total = 0, n_dense = cnp.PyArray_DIM(dr, 0)
    cdef cnp.ndarray rows_t, weights_t
    for t in range(len(term_rows)):
        rows_t = _arr("term_rows", term_rows[t], cnp.NPY_INT64, np.int64, _INT_KINDS, -1, t)
        weights_t = _arr("term_weights", term_weights[t], cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS,
                         cnp.PyArray_DIM(rows_t, 0), t)
        _check_rows("term_rows", rows_t, n, t)
        _check_non_negative("term_weights", weights_t, t)
        t_rows.append(rows_t)
        t_weights.append(weights_t)
        total += cnp.PyArray_DIM(rows_t, 0)
    _check_rows("dense_rows", dr, n)
    if k < 0:
        k = 0
    if lexical_k < 0:
        lexical_k = 0
    cdef const uint8_t* pa = <const uint8_t*>_ptr(al)
    cdef const float* pp = <const float*>_ptr(pr)
    cdef const int64_t* pdr = <const int64_t*>_ptr(dr)
    cdef const float* pq = NULL
    if q is not None:
        pq = <const float*>_ptr(q)
    cdef const float* pv = <const float*>_ptr(vecs)
    cdef const int64_t* prt
    cdef const float* pwt
    cdef int64_t r
    cdef float h32 = <float>half, w32 = <float>w, omw32 = <float>(1.0 - w), l, f, d
    cdef float* raw = <float*>malloc(n * sizeof(float) + 1)
    cdef uint8_t* state = <uint8_t*>calloc(n + 1, 1)
    cdef int64_t* touched = <int64_t*>malloc(total * sizeof(int64_t) + 1)
    cdef Py_ssize_t n_touched = 0, cap = lexical_k + n_dense
    cdef float* hf = <float*>malloc(cap * sizeof(float) + 1)
    cdef int64_t* hr = <int64_t*>malloc(cap * sizeof(int64_t) + 1)
    cdef int64_t* cand = <int64_t*>malloc(cap * sizeof(int64_t) + 1)
    cdef cnp.ndarray out_rows, out_fused, out_dense, out_lex
    cdef int64_t* po
    cdef float* pf
    cdef float* pd
    cdef float* pl
    try:
        if raw == NULL or state == NULL or touched == NULL or hf == NULL or hr == NULL or cand == NULL:
            raise MemoryError()
        for t in range(len(t_rows)):
            prt = <const int64_t*>_ptr(<cnp.ndarray>t_rows[t])
            pwt = <const float*>_ptr(<cnp.ndarray>t_weights[t])
            m = cnp.PyArray_DIM(<cnp.ndarray>t_rows[t], 0)
            with nogil:
                for j in range(m):
                    r = prt[j]
                    if state[r] & _TOUCHED:
                        raw[r] += pwt[j]
                    else:  # raw is not zeroed: set on a row's first posting, as 0 + x
                        state[r] |= _TOUCHED
                        raw[r] = <float>0.0 + pwt[j]
                        touched[n_touched] = r
                        n_touched += 1
        with nogil:
            # The lexical list: the best lexical_k live rows with a positive squashed score.
            for j in range(n_touched):
                r = touched[j]
                if pa[r]:
                    l = raw[r] / (raw[r] + h32)
                    if l > 0:
                        _heap_offer(hf, hr, &size, lexical_k, l, r)
            _heap_close(hf, hr, size, lexical_k)
            for j in range(size):
                cand[j] = hr[j]
                state[hr[j]] |= _PICKED
            n_cand = size
            for j in range(n_dense):  # the dense list: live rows not already in
                r = pdr[j]
                if pa[r] and not state[r] & _PICKED:
                    state[r] |= _PICKED
                    cand[n_cand] = r
                    n_cand += 1
            size = 0
            for j in range(n_cand):
                r = cand[j]
                l = raw[r] / (raw[r] + h32) if state[r] & _TOUCHED else 0.0
                d = _dot32(pv + r * dim, pq, dim) if pq != NULL else 0.0
                f = (w32 * d + omw32 * l) + pp[r]
                if not (isnan(f) or isinf(f)):
                    _heap_offer(hf, hr, &size, k, f, r)
            _heap_close(hf, hr, size, k)
        out_rows, out_fused = _empty(size, cnp.NPY_INT64), _empty(size, cnp.NPY_FLOAT32)
        out_dense, out_lex = _empty(size, cnp.NPY_FLOAT32), _empty(size, cnp.NPY_FLOAT32)
        po, pf = <int64_t*>_ptr(out_rows), <float*>_ptr(out_fused)
        pd, pl = <float*>_ptr(out_dense), <float*>_ptr(out_lex)
        with nogil:
            _heap_drain(hf, hr, size, po, pf)
            for j in range(size):
                r = po[j]
                pl[j] = raw[r] / (raw[r] + h32) if state[r] & _TOUCHED else 0.0
                pd[j] = _dot32(pv + r * dim, pq, dim) if pq != NULL else 0.0
        return out_rows, out_fused, out_dense, out_lex
    finally:
        free(raw)
        free(state)
        free(touched)
        free(hf)
        free(hr)
        free(cand)


cdef int _check_non_negative(str name, cnp.ndarray values, Py_ssize_t index=-1) except -1:
    cdef const float* p = <const float*>_ptr(values)
    cdef Py_ssize_t j
    for j in range(cnp.PyArray_DIM(values, 0)):
        if not p[j] >= 0:  # also NaN
            raise ValueError(f"{_label(name, index)} must be >= 0")
    return 0


cdef int _check_rows(str name, cnp.ndarray rows, Py_ssize_t n, Py_ssize_t index=-1) except -1:
    cdef const int64_t* p = <const int64_t*>_ptr(rows)
    cdef Py_ssize_t j
    for j in range(cnp.PyArray_DIM(rows, 0)):
        if p[j] < 0 or p[j] >= n:
            raise ValueError(f"{_label(name, index)} holds row {p[j]}, outside 0-{n - 1}")
    return 0


def window_bm25(term_rows, term_tfs, nbr, decay, norm, idf, groups, double k1):
    """BM25 of each row's window for groups of terms; see fastpath.reference.window_bm25 for the
    exact rule. Sparse: a term's counts touch only its postings' rows and their neighbours; any
    other row adds exactly 0 to a group's sum, unless its denominator is 0 or NaN (summed densely)."""
    cdef cnp.ndarray nm = _arr("norm", norm, cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS, -1)
    cdef Py_ssize_t n = cnp.PyArray_DIM(nm, 0)
    cdef cnp.ndarray dc = _arr("decay", decay, cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS, -1)
    cdef Py_ssize_t w = cnp.PyArray_DIM(dc, 0)
    cdef cnp.ndarray nb = np.asarray(nbr)
    if cnp.PyArray_NDIM(nb) != 2 or cnp.PyArray_DIM(nb, 0) != n or cnp.PyArray_DIM(nb, 1) != w or (
            nb.size and nb.dtype.kind not in _INT_KINDS):
        raise ValueError(f"nbr must be an integer array of shape ({n}, {w}), got {nb.dtype} {np.shape(nbr)}")
    if not (cnp.PyArray_TYPE(nb) == cnp.NPY_INT32 and cnp.PyArray_IS_C_CONTIGUOUS(nb)):
        if nb.size and (nb.min() < -1 or nb.max() >= n):  # before a narrowing cast could wrap a value
            raise ValueError(f"nbr holds a row outside -1-{n - 1}")
        nb = np.ascontiguousarray(nb, dtype=np.int32)
    cdef const int32_t* pnb = <const int32_t*>_ptr(nb)
    cdef Py_ssize_t i
    for i in range(n * w):
        if pnb[i] < -1 or pnb[i] >= n:
            raise ValueError(f"nbr holds a row outside -1-{n - 1}")
    _check_non_negative("decay", dc)
    if len(term_rows) != len(term_tfs):
        raise ValueError(f"term_tfs must have length {len(term_rows)}, got {len(term_tfs)}")
    cdef Py_ssize_t n_terms = len(term_rows), n_groups = len(groups)
    cdef cnp.ndarray idfs = _arr("idf", idf, cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS, n_terms)
    cdef const float* pidf = <const float*>_ptr(idfs)
    cdef Py_ssize_t t, g, j, c, m, r, q, total = 0, cap, size = 0
    for t in range(n_terms):
        if not (pidf[t] >= 0 and pidf[t] < math.inf):
            raise ValueError("idf must be finite and >= 0")
    cdef list slots = [], t_rows = [], t_tfs = []
    cdef cnp.ndarray arr
    for g in range(n_groups):
        arr = _arr("groups", groups[g], cnp.NPY_INT64, np.int64, _INT_KINDS, -1, g)
        _check_rows("groups", arr, n_terms, g)
        slots.append(arr)
    # The groups' term indices end to end, group g at gstart[g]:gstart[g + 1] (read without the GIL).
    cdef cnp.ndarray all_slots = np.concatenate(slots) if slots else np.zeros(0, np.int64)
    cdef cnp.ndarray gstart = np.zeros(n_groups + 1, np.int64)
    np.cumsum([len(a) for a in slots], out=gstart[1:])
    cdef const int64_t* ps = <const int64_t*>_ptr(all_slots)
    cdef const int64_t* pg = <const int64_t*>_ptr(gstart)
    for t in range(n_terms):
        arr = _arr("term_rows", term_rows[t], cnp.NPY_INT64, np.int64, _INT_KINDS, -1, t)
        _check_rows("term_rows", arr, n, t)
        t_rows.append(arr)
        arr = _arr("term_tfs", term_tfs[t], cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS,
                   cnp.PyArray_DIM(<cnp.ndarray>t_rows[t], 0), t)
        _check_non_negative("term_tfs", arr, t)
        t_tfs.append(arr)
        total += cnp.PyArray_DIM(arr, 0)
    cdef cnp.npy_intp dims[2]
    dims[0], dims[1] = n_groups, n
    cdef cnp.ndarray out = <cnp.ndarray>cnp.PyArray_ZEROS(2, dims, cnp.NPY_FLOAT32, 0)
    cdef float* po = <float*>_ptr(out)
    cdef const float* pn = <const float*>_ptr(nm)
    cdef const float* pd = <const float*>_ptr(dc)
    cdef const int64_t* prt
    cdef const float* ptf
    cdef float k1p = <float>(k1 + 1.0), k1f = <float>k1, weight, acc
    cap = total * (w + 1)
    cdef double* tw = <double*>malloc(n * sizeof(double) + 1)
    cdef uint8_t* mark = <uint8_t*>calloc(n + 1, 1)
    cdef int64_t* hit_row = <int64_t*>malloc(cap * sizeof(int64_t) + 1)
    cdef float* hit_sat = <float*>malloc(cap * sizeof(float) + 1)
    cdef Py_ssize_t* start = <Py_ssize_t*>malloc((n_terms + 1) * sizeof(Py_ssize_t))
    try:
        if tw == NULL or mark == NULL or hit_row == NULL or hit_sat == NULL or start == NULL:
            raise MemoryError()
        # Each term's touched rows and their saturated counts, term after term in one buffer.
        for t in range(n_terms):
            prt, ptf = <const int64_t*>_ptr(<cnp.ndarray>t_rows[t]), <const float*>_ptr(<cnp.ndarray>t_tfs[t])
            m = cnp.PyArray_DIM(<cnp.ndarray>t_rows[t], 0)
            start[t] = size
            with nogil:
                for j in range(m):  # each row's own tf first
                    if ptf[j] > 0:
                        r = prt[j]
                        if mark[r]:  # a row listed twice in one term's postings
                            tw[r] += <double>ptf[j]
                        else:
                            mark[r] = 1
                            tw[r] = <double>ptf[j]
                            hit_row[size] = r
                            size += 1
                for j in range(m):  # then its neighbours, decayed: a row that is my c-th has me as its (w-1-c)-th
                    for c in range(w):
                        r = pnb[prt[j] * w + c]
                        weight = ptf[j] * pd[w - 1 - c]
                        if r >= 0 and weight > 0:
                            if not mark[r]:
                                mark[r] = 1
                                tw[r] = 0.0
                                hit_row[size] = r
                                size += 1
                            tw[r] += <double>weight
                for j in range(start[t], size):
                    r = hit_row[j]
                    mark[r] = 0
                    hit_sat[j] = _saturate(<float>tw[r], k1p, k1f, pn[r])
        start[n_terms] = size
        with nogil:
            for g in range(n_groups):
                for q in range(pg[g], pg[g + 1]):
                    t = ps[q]
                    for j in range(start[t], start[t + 1]):
                        r = hit_row[j]
                        po[g * n + r] = po[g * n + r] + pidf[t] * hit_sat[j]
        # A row whose denominator is 0 or NaN gets 0 / 0 = NaN (or NaN) from an untouched term too:
        # those rows are summed densely, term by term in group order.
        for r in range(n):
            if k1f * pn[r] > 0:
                continue
            for g in range(n_groups):
                acc = 0.0
                for q in range(pg[g], pg[g + 1]):
                    t = ps[q]
                    acc = acc + pidf[t] * _window_sat(t, r, start, hit_row, hit_sat, k1p, k1f, pn[r])
                po[g * n + r] = acc
        for j in range(n_groups * n):  # one NaN, whatever its sign or payload (as the reference)
            if isnan(po[j]):
                po[j] = NAN
        return out
    finally:
        free(tw)
        free(mark)
        free(hit_row)
        free(hit_sat)
        free(start)


cdef inline float _window_sat(Py_ssize_t t, Py_ssize_t r, const Py_ssize_t* start, const int64_t* hit_row,
                              const float* hit_sat, float k1p, float k1f, float norm) noexcept nogil:
    """Term t's saturated count at row r: the stored one when t touched r, else that of a count of 0."""
    cdef Py_ssize_t j
    for j in range(start[t], start[t + 1]):
        if hit_row[j] == r:
            return hit_sat[j]
    return _saturate(0.0, k1p, k1f, norm)


cdef inline float _saturate(float x, float k1p, float k1f, float norm) noexcept nogil:
    """BM25 saturation of a window count x, each step rounded to float32 (the reference's rule)."""
    return (x * k1p) / (x + k1f * norm)


def cooccurring_terms(term_rows, term_ptr, term_at, term_df, double n_rows, Py_ssize_t min_count, exclude,
                      Py_ssize_t k):
    """The k terms said most with some query terms, by positive PMI; see
    fastpath.reference.cooccurring_terms for the exact rule. Only the rows of the query terms are read."""
    cdef cnp.ndarray ptr, at, df, ex
    ptr, at, df, ex = _term_table(term_ptr, term_at, term_df, exclude, n_rows)
    cdef Py_ssize_t n = cnp.PyArray_DIM(ptr, 0) - 1, size = cnp.PyArray_DIM(df, 0)
    cdef const int64_t* pp = <const int64_t*>_ptr(ptr)
    cdef const int32_t* pa = <const int32_t*>_ptr(at)
    cdef const int32_t* pdf = <const int32_t*>_ptr(df)
    cdef const int64_t* pex = <const int64_t*>_ptr(ex)
    cdef Py_ssize_t i, j, e, r, v, nt, n_acc = 0, m, minc = min_count if min_count > 1 else 1
    cdef list rows_list = []
    cdef cnp.ndarray arr
    for i in range(len(term_rows)):
        arr = _arr("term_rows", term_rows[i], cnp.NPY_INT64, np.int64, _INT_KINDS, -1, i)
        _check_rows("term_rows", arr, n, i)
        rows_list.append(arr)
    cdef int32_t* together = <int32_t*>calloc(size + 1, sizeof(int32_t))
    cdef int64_t* touched = <int64_t*>malloc((size + 1) * sizeof(int64_t))
    cdef double* acc = <double*>calloc(size + 1, sizeof(double))
    cdef uint8_t* in_acc = <uint8_t*>calloc(size + 1, 1)
    cdef int64_t* acc_ids = <int64_t*>malloc((size + 1) * sizeof(int64_t))
    cdef const int64_t* prow
    cdef double share, gain
    cdef bint failed = False
    try:
        if together == NULL or touched == NULL or acc == NULL or in_acc == NULL or acc_ids == NULL:
            raise MemoryError()
        for i in range(len(rows_list)):
            prow, m = <const int64_t*>_ptr(<cnp.ndarray>rows_list[i]), cnp.PyArray_DIM(<cnp.ndarray>rows_list[i], 0)
            nt = 0
            with nogil:
                for j in range(m):
                    r = prow[j]
                    for e in range(pp[r], pp[r + 1]):
                        v = pa[e]
                        if v < 0 or v >= size:
                            failed = True
                            break
                        if together[v] == 0:
                            touched[nt] = v
                            nt += 1
                        together[v] += 1
                    if failed:
                        break
            if failed:
                raise ValueError(f"term_at holds term {v}, outside 0-{size - 1}")
            # Each term gains once per query term, so the order of the terms within one does not matter.
            for j in range(nt):
                v = touched[j]
                if together[v] >= minc:
                    if pdf[v] < 1:
                        raise ValueError(f"term_df[{v}] must be >= 1 (the term is in term_at)")
                    share = <double>together[v] / <double>m
                    gain = log(n_rows * share / <double>pdf[v])
                    acc[v] += (gain if gain > 0.0 else 0.0) * share
                    if not in_acc[v]:
                        in_acc[v] = 1
                        acc_ids[n_acc] = v
                        n_acc += 1
                together[v] = 0
        for j in range(cnp.PyArray_DIM(ex, 0)):
            if 0 <= pex[j] < size:
                acc[pex[j]] = 0.0
        return _ranked(acc, touched, _top_k(acc, acc_ids, n_acc, k, touched, True, True))
    finally:
        free(together)
        free(touched)
        free(acc)
        free(in_acc)
        free(acc_ids)


def feedback_terms(rows, term_ptr, term_at, term_df, double n_rows, Py_ssize_t min_df, exclude, Py_ssize_t k):
    """The k terms most characteristic of some rows, by summed idf; see fastpath.reference.feedback_terms
    for the exact rule. Only the given rows are read."""
    cdef cnp.ndarray ptr, at, df, ex
    ptr, at, df, ex = _term_table(term_ptr, term_at, term_df, exclude, n_rows)
    cdef cnp.ndarray rw = _arr("rows", rows, cnp.NPY_INT64, np.int64, _INT_KINDS, -1)
    cdef Py_ssize_t n = cnp.PyArray_DIM(ptr, 0) - 1, size = cnp.PyArray_DIM(df, 0)
    cdef const int64_t* pp = <const int64_t*>_ptr(ptr)
    cdef const int32_t* pa = <const int32_t*>_ptr(at)
    cdef const int32_t* pdf = <const int32_t*>_ptr(df)
    cdef const int64_t* pex = <const int64_t*>_ptr(ex)
    cdef const int64_t* prw = <const int64_t*>_ptr(rw)
    cdef Py_ssize_t j, e, r, v, d, n_acc = 0, mind = min_df if min_df > 1 else 1
    _check_rows("rows", rw, n)
    # flag: 0 unseen, 1 gaining (its id in order[]), 2 excluded or below min_df.
    cdef uint8_t* flag = <uint8_t*>calloc(size + 1, 1)
    cdef double* acc = <double*>calloc(size + 1, sizeof(double))
    cdef int64_t* order = <int64_t*>malloc((size + 1) * sizeof(int64_t))
    cdef int64_t* top = <int64_t*>malloc((size + 1) * sizeof(int64_t))
    cdef bint failed = False
    try:
        if flag == NULL or acc == NULL or order == NULL or top == NULL:
            raise MemoryError()
        for j in range(cnp.PyArray_DIM(ex, 0)):
            if 0 <= pex[j] < size:
                flag[pex[j]] = 2
        with nogil:
            for j in range(cnp.PyArray_DIM(rw, 0)):
                r = prw[j]
                for e in range(pp[r], pp[r + 1]):
                    v = pa[e]
                    if v < 0 or v >= size:
                        failed = True
                        break
                    if flag[v] == 2:
                        continue
                    d = pdf[v]
                    if d < mind:
                        flag[v] = 2
                        continue
                    if flag[v] == 0:
                        flag[v] = 1
                        order[n_acc] = v
                        n_acc += 1
                    acc[v] += log(1.0 + (n_rows - <double>d + 0.5) / (<double>d + 0.5))
                if failed:
                    break
        if failed:
            raise ValueError(f"term_at holds term {v}, outside 0-{size - 1}")
        return _ranked(acc, top, _top_k(acc, order, n_acc, k, top, False, False))
    finally:
        free(flag)
        free(acc)
        free(order)
        free(top)


cdef tuple _term_table(term_ptr, term_at, term_df, exclude, double n_rows):
    """(term_ptr int64, term_at int32, term_df int32, exclude int64) arrays, checked: the row pointers
    rise from 0 to at most len(term_at) and the row count is not negative."""
    cdef cnp.ndarray ptr = _arr("term_ptr", term_ptr, cnp.NPY_INT64, np.int64, _INT_KINDS, -1)
    cdef cnp.ndarray at = _arr("term_at", term_at, cnp.NPY_INT32, np.int32, _INT_KINDS, -1)
    cdef cnp.ndarray df = _arr("term_df", term_df, cnp.NPY_INT32, np.int32, _INT_KINDS, -1)
    cdef cnp.ndarray ex = _arr("exclude", exclude, cnp.NPY_INT64, np.int64, _INT_KINDS, -1)
    cdef Py_ssize_t r, n = cnp.PyArray_DIM(ptr, 0) - 1, n_at = cnp.PyArray_DIM(at, 0)
    cdef const int64_t* pp = <const int64_t*>_ptr(ptr)
    if not n_rows >= 0:
        raise ValueError(f"n_rows must be >= 0, got {n_rows}")
    if n < 0:
        raise ValueError("term_ptr must rise from 0 to at most len(term_at)")
    for r in range(n):
        if not (0 <= pp[r] <= pp[r + 1] <= n_at):
            raise ValueError("term_ptr must rise from 0 to at most len(term_at)")
    return ptr, at, df, ex


cdef inline bint _ahead(const double* acc, int64_t a, int64_t b, bint id_ties) noexcept nogil:
    """a before b: the higher value, then (id_ties) the lower id; otherwise b, met first, stays ahead."""
    return acc[a] > acc[b] or (id_ties and acc[a] == acc[b] and a < b)


cdef Py_ssize_t _top_k(const double* acc, const int64_t* ids, Py_ssize_t m, Py_ssize_t k, int64_t* top,
                       bint positive_only, bint id_ties) noexcept nogil:
    """The k best of ids[0:m] by acc into top (a buffer other than ids), best first; returns how many.
    positive_only: an id whose value is not > 0 never counts."""
    cdef Py_ssize_t j, e, nt = 0
    cdef int64_t v
    for j in range(m if k > 0 else 0):
        v = ids[j]
        if (positive_only and not acc[v] > 0) or (nt == k and not _ahead(acc, v, top[k - 1], id_ties)):
            continue
        e = nt if nt < k else k - 1
        while e > 0 and _ahead(acc, v, top[e - 1], id_ties):
            top[e] = top[e - 1]
            e -= 1
        top[e] = v
        if nt < k:
            nt += 1
    return nt


cdef tuple _ranked(const double* acc, const int64_t* top, Py_ssize_t nt):
    """(ids int64[nt], values float64[nt]) of top[0:nt]."""
    cdef cnp.ndarray out_ids = _empty(nt, cnp.NPY_INT64), out_values = _empty(nt, cnp.NPY_FLOAT64)
    cdef Py_ssize_t j
    for j in range(nt):
        (<int64_t*>_ptr(out_ids))[j] = top[j]
        (<double*>_ptr(out_values))[j] = acc[top[j]]
    return out_ids, out_values


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


def encode_dropped(sources, categories, reasons, scores, tokens, kept_sources):
    """Wire bytes of BuildContextResponse.dropped entries, one per index; see fastpath.reference."""
    cdef list src = _str_list("sources", sources), kept = _str_list("kept_sources", kept_sources)
    cdef Py_ssize_t n = len(src), k, total = 0, ns, nk
    if len(kept) != n:
        raise ValueError(f"kept_sources must have length {n}, got {len(kept)}")
    cdef cnp.ndarray cat = _arr("categories", categories, cnp.NPY_INT64, np.int64, _INT_KINDS, n)
    cdef cnp.ndarray rea = _arr("reasons", reasons, cnp.NPY_INT64, np.int64, _INT_KINDS, n)
    cdef cnp.ndarray tok = _arr("tokens", tokens, cnp.NPY_INT64, np.int64, _INT_KINDS, n)
    cdef cnp.ndarray sc = _arr("scores", scores, cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, n)
    cdef const int64_t* pc = <const int64_t*>_ptr(cat)
    cdef const int64_t* pr = <const int64_t*>_ptr(rea)
    cdef const int64_t* pt = <const int64_t*>_ptr(tok)
    cdef const double* ps = <const double*>_ptr(sc)
    cdef const char* s
    cdef const char* q
    cdef char* p
    cdef uint32_t bits
    cdef Py_ssize_t* inner = <Py_ssize_t*>malloc((n + 1) * sizeof(Py_ssize_t))
    if inner == NULL:
        raise MemoryError()
    try:
        for k in range(n):
            PyUnicode_AsUTF8AndSize(src[k], &ns)
            PyUnicode_AsUTF8AndSize(kept[k], &nk)
            inner[k] = ((1 + _varint_len(ns) + ns if ns else 0) + (1 + _varint_len(nk) + nk if nk else 0)
                        + _int_field_len(<uint64_t>pc[k]) + _int_field_len(<uint64_t>pr[k])
                        + _int_field_len(<uint64_t>pt[k]) + (5 if _float_bits(ps[k]) else 0))
            total += 1 + _varint_len(inner[k]) + inner[k]
        out = PyBytes_FromStringAndSize(NULL, total)
        p = PyBytes_AS_STRING(out)
        for k in range(n):
            s = PyUnicode_AsUTF8AndSize(src[k], &ns)
            q = PyUnicode_AsUTF8AndSize(kept[k], &nk)
            p[0] = <char>0x3A
            p = _put_varint(p + 1, <uint64_t>inner[k])
            if ns:
                p = _put_bytes_field(p, 0x0A, s, ns)
            p = _put_int_field(p, 0x10, <uint64_t>pc[k])
            p = _put_int_field(p, 0x18, <uint64_t>pr[k])
            bits = _float_bits(ps[k])
            if bits:
                p = _put_fixed32(p, 0x25, bits)
            p = _put_int_field(p, 0x28, <uint64_t>pt[k])
            if nk:
                p = _put_bytes_field(p, 0x32, q, nk)
        return out
    finally:
        free(inner)


cdef list _str_list(str name, object xs):
    """_text_list with every element checked here (encode_dropped has no per-text pass of its own)."""
    cdef list out = _text_list(xs, name)
    for k, x in enumerate(out):
        if not isinstance(x, str):
            raise TypeError(f"{name}[{k}] must be str, got {type(x).__name__}")
    return out


# --------------------------------------------------------------------------------------------------
# Dense scores over int8 rows (episodic recall's turn vectors: a quarter of float32's memory)
# --------------------------------------------------------------------------------------------------

cdef enum:
    _QUERY_STEPS = 32767  # the query is scaled to int16, so each product is exact in int32

cdef extern from *:
    """
    /* One int8 row's exact integer dot product with an int16 query. Sums of 256 products fit an
       int32 (256 * 128 * 32767 < 2^31), which the compiler turns into SIMD multiply-adds; integer
       sums are exact in any order, so every copy gives the reference's result. */
    #define FP_INT8_CHUNK 256
    #define FP_INT8_ROW_DOT_BODY \
        int64_t total = 0; \
        for (Py_ssize_t start = 0; start < dim; start += FP_INT8_CHUNK) { \
            Py_ssize_t stop = start + FP_INT8_CHUNK < dim ? start + FP_INT8_CHUNK : dim; \
            int32_t acc = 0; \
            for (Py_ssize_t k = start; k < stop; k++) acc += (int32_t)(int16_t)row[k] * (int32_t)qc[k]; \
            total += acc; \
        } \
        return total;

    static int64_t fp_int8_row_dot_generic(const int8_t *row, const int16_t *qc, Py_ssize_t dim) {
        FP_INT8_ROW_DOT_BODY
    }

    #if defined(__GNUC__) && defined(__x86_64__)
    /* The x86-64 baseline (SSE2) widens int8 slowly; a second copy for CPUs with AVX2, picked at run
       time (as fp_near_scan does for POPCNT), reads a row about twice as fast. */
    __attribute__((target("avx2")))
    static int64_t fp_int8_row_dot_avx2(const int8_t *row, const int16_t *qc, Py_ssize_t dim) {
        FP_INT8_ROW_DOT_BODY
    }
    static int fp_have_avx2 = -1;
    static int64_t fp_int8_row_dot(const int8_t *row, const int16_t *qc, Py_ssize_t dim) {
        if (fp_have_avx2 < 0) {
            __builtin_cpu_init();
            fp_have_avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
        }
        return fp_have_avx2 ? fp_int8_row_dot_avx2(row, qc, dim) : fp_int8_row_dot_generic(row, qc, dim);
    }
    #else
    #define fp_int8_row_dot fp_int8_row_dot_generic
    #endif
    """
    int64_t fp_int8_row_dot(const int8_t* row, const int16_t* qc, Py_ssize_t dim) nogil


cdef void _int8_dot_kernel(Py_ssize_t n, Py_ssize_t dim, const int8_t* codes, const float* scales,
                           const int16_t* qc, double qs, float* out) noexcept nogil:
    cdef Py_ssize_t r
    for r in range(n):
        out[r] = <float>((<double>fp_int8_row_dot(codes + r * dim, qc, dim) * <double>scales[r]) * qs)


def int8_dot(codes, scales, query):
    """Each int8 row's dot product with a float32 query (scaled to int16), times the row's scale; see
    fastpath.reference.int8_dot for the exact rule. float32[n]."""
    cdef cnp.ndarray q = _arr("query", query, cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS, -1)
    cdef Py_ssize_t dim = cnp.PyArray_DIM(q, 0), k
    cdef cnp.ndarray c = np.asarray(codes)
    if cnp.PyArray_NDIM(c) != 2 or cnp.PyArray_DIM(c, 1) != dim or cnp.PyArray_TYPE(c) != cnp.NPY_INT8:
        raise ValueError(f"codes must be an int8 array of shape (n, {dim}), got {c.dtype} {np.shape(codes)}")
    if not cnp.PyArray_IS_C_CONTIGUOUS(c):
        c = np.ascontiguousarray(c)
    cdef Py_ssize_t n = cnp.PyArray_DIM(c, 0)
    cdef cnp.ndarray sc = _arr("scales", scales, cnp.NPY_FLOAT32, np.float32, _FLOAT_KINDS, n)
    cdef const float* pq = <const float*>_ptr(q)
    cdef double top = 0.0, x
    for k in range(dim):
        x = fabs(pq[k])
        if not x < math.inf:
            raise ValueError("query must be finite")
        if x > top:
            top = x
    cdef cnp.ndarray out = np.zeros(n, np.float32)
    if top == 0.0:
        return out
    cdef double qs = top / _QUERY_STEPS
    cdef cnp.ndarray qcodes = _empty(dim, cnp.NPY_INT16)
    cdef int16_t* pqc = <int16_t*>_ptr(qcodes)
    for k in range(dim):
        pqc[k] = <int16_t>max(-_QUERY_STEPS, min(_QUERY_STEPS, llrint(pq[k] / qs)))
    cdef const int8_t* pc = <const int8_t*>_ptr(c)
    cdef const float* ps = <const float*>_ptr(sc)
    cdef float* po = <float*>_ptr(out)
    with nogil:
        _int8_dot_kernel(n, dim, pc, ps, pqc, qs, po)
    return out
