"""Input validation shared by the fastpath extension modules (declared in _common.pxd).

The Python-level wrappers of every module check and convert their arguments with these helpers
before handing raw buffers to nogil kernels; errors name the caller's argument.
"""

from libc.stdint cimport INT64_MAX, int64_t

cimport numpy as cnp

import numpy as np

cnp.import_array()

_FLOAT_KINDS = "biuf"
_INT_KINDS = "biu"


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
    if v > INT64_MAX:
        return INT64_MAX
    return v


cdef list _text_list(object texts, str name="texts"):
    if isinstance(texts, str):
        raise TypeError(f"{name} must be a sequence of str, not a single str")
    return texts if type(texts) is list else list(texts)


cdef int _check_rows(str name, cnp.ndarray rows, Py_ssize_t n, Py_ssize_t index=-1) except -1:
    cdef const int64_t* p = <const int64_t*>_ptr(rows)
    cdef Py_ssize_t j
    for j in range(cnp.PyArray_DIM(rows, 0)):
        if p[j] < 0 or p[j] >= n:
            raise ValueError(f"{_label(name, index)} holds row {p[j]}, outside 0-{n - 1}")
    return 0
