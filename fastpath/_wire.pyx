"""Compiled wire encoding: ContextItem, Section and DroppedItem entries straight to protobuf bytes.

The byte layout is specified by ``fastpath.reference.wire``; every routine here must return exactly
the bytes its reference twin returns.
"""

from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy

cimport numpy as cnp

from fastpath._common cimport _FLOAT_KINDS, _INT_KINDS, _arr, _ptr, _text_list

import numpy as np

cnp.import_array()


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
    """Wire bytes of a ContextItem without its score; see fastpath.reference.wire."""
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
    """Wire bytes of one BuildContextResponse.sections entry; see fastpath.reference.wire."""
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


def encode_dropped(sources, categories, reasons, scores, tokens, kept_sources):
    """Wire bytes of BuildContextResponse.dropped entries, one per index; see fastpath.reference.wire."""
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
