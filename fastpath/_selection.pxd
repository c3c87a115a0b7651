# C-level API of fastpath._selection, for other Cython modules that want the kernels without the
# Python-object wrappers (cimport fastpath._selection). All kernels are nogil and take raw contiguous
# buffers; they return 0 on success and -1 on allocation failure (or bad input where documented).

from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t


cdef enum:
    ST_SELECTED = 0
    ST_OVER_BUDGET = 1
    ST_DUPLICATE = 2
    ST_LOW_SCORE = 3


ctypedef struct ScoreIdx:
    double s
    int64_t i


cdef void fuse_kernel(Py_ssize_t n, const double* rel, const double* age, const double* pri,
                      double w_rel, double w_rec, double w_pri, double half_life,
                      double* out) noexcept nogil

# order[k] = k-th index by score desc, index asc; scratch needs 2*n ScoreIdx. -1 if a score is NaN.
cdef int order_kernel(Py_ssize_t n, const double* scores, int64_t* order, ScoreIdx* scratch) noexcept nogil

cdef int dedup_kernel(Py_ssize_t n, const int64_t* order, const uint64_t* exact, const uint64_t* simh,
                      const uint8_t* eligible, int max_hamming, int64_t* dup_of) noexcept nogil

cdef int pack_kernel(Py_ssize_t n, Py_ssize_t ncat, const int64_t* order, const int32_t* tokens,
                     const int32_t* category, const uint8_t* eligible, const int64_t* cat_budget,
                     int64_t total_budget, bint flow_unused, uint8_t* selected, int64_t* used,
                     int64_t* effective, int64_t* flowed) noexcept nogil
