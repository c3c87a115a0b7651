# Shared by every fastpath extension module (cimport fastpath._common): the build rule that keeps
# float results bit-identical with fastpath.reference, and the input validation of the Python-level
# wrappers. The inline helpers are compiled into each module that cimports them.

from libc.stdint cimport int64_t

cimport numpy as cnp

# Verbatim C in a .pxd lands in every module that cimports it, ahead of that module's own functions.
cdef extern from *:
    """
    /* Bit-identical floats with the reference need plain IEEE mul-then-add: forbid contraction into
       FMA, which GCC otherwise does across statements on FMA-capable targets (aarch64, -march=...). */
    #if defined(__clang__)
    #pragma STDC FP_CONTRACT OFF
    #elif defined(__GNUC__)
    #pragma GCC optimize ("fp-contract=off")
    #endif
    """

# The dtype kinds an argument may arrive as before conversion: numbers for float arrays, integers
# (and bools) for integer arrays.
cdef str _FLOAT_KINDS
cdef str _INT_KINDS


cdef inline str _label(str name, Py_ssize_t index):
    """name, or name[index] for one array of a list (formatted only for an error message)."""
    return name if index < 0 else f"{name}[{index}]"


cdef inline void* _ptr(cnp.ndarray a) noexcept nogil:
    # Raw data pointers instead of typed memoryviews: select() touches ~15 arrays per call and
    # acquiring a memoryview costs about a microsecond each, a sizeable share of the whole call.
    return cnp.PyArray_DATA(a)


cdef inline cnp.ndarray _empty(Py_ssize_t n, int typenum):
    cdef cnp.npy_intp dims[1]
    dims[0] = n
    return <cnp.ndarray>cnp.PyArray_EMPTY(1, dims, typenum, 0)


# x as a behaved contiguous 1-D array of dtype (typenum); ValueError naming `name` (or name[index]).
cdef cnp.ndarray _arr(str name, object x, int typenum, object dtype, str kinds, Py_ssize_t n,
                      Py_ssize_t index=*)

# Python integer clamped to [lo, INT64_MAX] (the reference saturates the same way).
cdef int64_t _int64_clamped(str name, object x, int64_t lo) except? -2

# texts as a list; TypeError for a single str (its elements are checked where they are read).
cdef list _text_list(object texts, str name=*)

# ValueError unless every int64 in rows is in 0..n-1.
cdef int _check_rows(str name, cnp.ndarray rows, Py_ssize_t n, Py_ssize_t index=*) except -1
