# C-level API of fastpath._textkeys, for other Cython modules (cimport fastpath._textkeys).

from libc.stdint cimport uint64_t


# FNV-1a 64-bit continued from h over data[0:n] (start from 0xCBF29CE484222325 for a fresh hash).
cdef uint64_t fnv_bytes(uint64_t h, const unsigned char* data, Py_ssize_t n) noexcept nogil
