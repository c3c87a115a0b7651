"""Compiled dense scores over int8 rows (episodic recall's turn vectors: a quarter of float32's memory).

The semantics are specified by ``fastpath.reference.int8``; int8_dot must return exactly what its
reference twin returns, floats bit for bit.
"""

from libc.math cimport fabs, llrint
from libc.stdint cimport int8_t, int16_t, int64_t

cimport numpy as cnp

from fastpath._common cimport _FLOAT_KINDS, _arr, _empty, _ptr

import math

import numpy as np

cnp.import_array()


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
