"""Compiled ranking kernels of the indexes and the episodic ranker: set overlaps (overlap_counts,
best_matches), fused and hybrid top-k, windowed BM25, co-occurring and feedback terms, and newer tellings
first (newer_first).

The semantics are specified by ``fastpath.reference.ranking``; every routine here must return
exactly what its reference twin returns, floats bit for bit.
"""

from libc.math cimport NAN, isinf, isnan, log, log1p
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from libc.stdlib cimport calloc, free, malloc

cimport numpy as cnp

from fastpath._common cimport _FLOAT_KINDS, _INT_KINDS, _arr, _check_rows, _empty, _label, _ptr

import math

import numpy as np

cnp.import_array()


# Set overlaps: the knowledge-beats-memory rule compares each memory's terms with each chunk's.
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


def newer_first(postings, Py_ssize_t n_rows, rows, when, who, scores, double cover_min, double score_min):
    """Scores of packed turns, each newer telling of the same thing above the older ones it updates;
    see fastpath.reference.newer_first for the exact rule."""
    cdef Py_ssize_t bound = n_rows if n_rows > 0 else 1
    cdef cnp.ndarray rw = _arr("rows", rows, cnp.NPY_INT64, np.int64, _INT_KINDS, -1)
    _check_rows("rows", rw, bound)
    cdef Py_ssize_t m = cnp.PyArray_DIM(rw, 0), t = len(postings)
    cdef cnp.ndarray wh = _arr("when", when, cnp.NPY_INT64, np.int64, _INT_KINDS, m)
    cdef cnp.ndarray wo = _arr("who", who, cnp.NPY_INT64, np.int64, _INT_KINDS, m)
    cdef cnp.ndarray sc = _arr("scores", scores, cnp.NPY_FLOAT64, np.float64, _FLOAT_KINDS, m)
    cdef const int64_t* pr = <const int64_t*>_ptr(rw)
    cdef const int64_t* pw = <const int64_t*>_ptr(wh)
    cdef const int64_t* po = <const int64_t*>_ptr(wo)
    cdef const double* ps = <const double*>_ptr(sc)
    cdef cnp.ndarray out = _empty(m, cnp.NPY_FLOAT64)
    cdef double* pout = <double*>_ptr(out)
    cdef Py_ssize_t i, j, b, p, pj, lo, hi, mid, df
    for i in range(m):
        pout[i] = ps[i]
    if m == 0:
        return out
    cdef list lists = []
    cdef cnp.ndarray arr
    cdef const int64_t* pp
    for b in range(t):
        arr = _arr("postings", postings[b], cnp.NPY_INT64, np.int64, _INT_KINDS, -1, b)
        _check_rows("postings", arr, bound, b)
        pp = <const int64_t*>_ptr(arr)
        for i in range(1, cnp.PyArray_DIM(arr, 0)):
            if pp[i] <= pp[i - 1]:
                raise ValueError(f"postings[{b}] must be ascending and unique")
        lists.append(arr)
    if len(set(rw.tolist())) != m:
        raise ValueError("rows must be distinct")
    cdef uint8_t* said = <uint8_t*>calloc(m * t + 1, 1)
    cdef double* idf = <double*>malloc((t + 1) * sizeof(double))
    cdef double* mass = <double*>calloc(m, sizeof(double))
    cdef double* best = <double*>malloc(m * sizeof(double))
    cdef Py_ssize_t* by_place = <Py_ssize_t*>malloc(m * sizeof(Py_ssize_t))
    cdef Py_ssize_t* place = <Py_ssize_t*>malloc(m * sizeof(Py_ssize_t))
    cdef uint8_t* involved = <uint8_t*>calloc(m, 1)
    cdef double shared
    if not (said and idf and mass and best and by_place and place and involved):
        free(said); free(idf); free(mass); free(best); free(by_place); free(place); free(involved)
        raise MemoryError()
    try:
        for p in range(m):  # insertion sort by (when, row): the turns are few
            j = p
            while j > 0 and (pw[by_place[j - 1]] > pw[p] or (pw[by_place[j - 1]] == pw[p] and pr[by_place[j - 1]] > pr[p])):
                by_place[j] = by_place[j - 1]
                j -= 1
            by_place[j] = p
        for p in range(m):
            place[by_place[p]] = p
        for b in range(t):
            arr = <cnp.ndarray>lists[b]
            pp = <const int64_t*>_ptr(arr)
            df = cnp.PyArray_DIM(arr, 0)
            idf[b] = log1p((n_rows - df + 0.5) / (df + 0.5))
            for i in range(m):  # a binary search of the row in the term's postings
                lo, hi = 0, df
                while lo < hi:
                    mid = (lo + hi) // 2
                    if pp[mid] < pr[i]:
                        lo = mid + 1
                    else:
                        hi = mid
                said[i * t + b] = lo < df and pp[lo] == pr[i]
        for i in range(m):
            best[i] = ps[i]
            for b in range(t):
                if said[i * t + b]:
                    mass[i] += idf[b]
        with nogil:
            for pj in range(m):
                j = by_place[pj]
                for p in range(pj):
                    i = by_place[p]
                    if po[i] != po[j] or mass[i] <= 0.0 or mass[j] <= 0.0:
                        continue
                    shared = 0.0
                    for b in range(t):
                        if said[i * t + b] and said[j * t + b]:
                            shared += idf[b]
                    if shared >= (cover_min - 1e-9) * mass[i] and ps[j] >= score_min * ps[i]:
                        involved[i] = 1
                        involved[j] = 1
                        if best[i] > best[j]:
                            best[j] = best[i]
            for i in range(m):
                if involved[i]:
                    pout[i] = best[i] * (1.0 + 1e-7 * <double>(place[i] + 1))
    finally:
        free(said); free(idf); free(mass); free(best); free(by_place); free(place); free(involved)
    return out
