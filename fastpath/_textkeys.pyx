"""Compiled text keys: tokenize, FNV-1a, exact keys and SimHash (text_keys), the hashed embedding,
and the sums of a text's word vectors (WordTable, word_vector_sums).

The semantics are specified by ``fastpath.reference.textkeys``; every routine here must return
exactly what its reference twin returns, floats bit for bit. fnv_bytes is declared in _textkeys.pxd
so other Cython modules can cimport it.
"""

from libc.math cimport sqrt
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memset

import numpy as np

cimport numpy as cnp

from fastpath._common cimport _empty, _int64_clamped, _ptr, _text_list

cnp.import_array()


cdef extern from "Python.h":
    Py_UCS4* PyUnicode_AsUCS4(object u, Py_UCS4* buffer, Py_ssize_t buflen, int copy_null) except NULL
    object PyUnicode_FromKindAndData(int kind, const void* buffer, Py_ssize_t size)
    Py_ssize_t PyUnicode_GET_LENGTH(object u)
    # A pure table lookup, safe without the GIL; it is exactly what str.isalnum() tests per character.
    bint fp_isalnum "Py_UNICODE_ISALNUM"(uint32_t ch) nogil


cdef uint64_t _FNV_OFFSET = 0xCBF29CE484222325ULL
cdef uint64_t _FNV_PRIME = 0x100000001B3ULL


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


cdef Py_ssize_t _lowered(object text, Py_ssize_t k, TextBuf* tb) except -1:
    """`text` lowercased (Python's own str.lower, for exact Unicode semantics) into tb.cps; its length."""
    if not isinstance(text, str):
        raise TypeError(f"texts[{k}] must be str, got {type(text).__name__}")
    low = text.lower()
    cdef Py_ssize_t n = PyUnicode_GET_LENGTH(low)
    _ensure(tb, n + 1)
    if n:
        PyUnicode_AsUCS4(low, <Py_UCS4*>tb.cps, tb.cap, 0)
    return n


cdef Py_ssize_t _prepare(object text, Py_ssize_t k, TextBuf* tb) except -1:
    """Lowercase `text` into tb and tokenize it there; the number of tokens."""
    cdef Py_ssize_t n = _lowered(text, k, tb)
    return _tokenize(tb.cps, n, tb.starts, tb.ends)


# A batch's texts are lowered (which needs the GIL) a chunk at a time, and each chunk is then read
# without the GIL, so another thread runs meanwhile (an import's jobs while its turns are indexed).
cdef Py_ssize_t CHUNK_CHARS = 1 << 16
# A smaller chunk (a query, a few turns) is read holding the GIL: getting it back can wait a switch
# interval (5 ms) behind another thread, far more than such a chunk costs.
cdef Py_ssize_t RELEASE_CHARS = 1 << 14


cdef Py_ssize_t _load_chunk(list items, Py_ssize_t lo, TextBuf* tb, Py_ssize_t** off, Py_ssize_t* off_cap) except -1:
    """Texts items[lo:hi] lowered into tb.cps back to back, text lo + j at (*off)[j]:(*off)[j + 1]: as
    many as CHUNK_CHARS holds, at least one; returns hi. tb.starts/ends hold any one text's tokens."""
    cdef Py_ssize_t n = len(items), hi = lo, total = 0, length
    cdef void* p
    cdef object low
    while hi < n and (hi == lo or total < CHUNK_CHARS):
        if not isinstance(items[hi], str):
            raise TypeError(f"texts[{hi}] must be str, got {type(items[hi]).__name__}")
        low = items[hi].lower()
        length = PyUnicode_GET_LENGTH(low)
        _ensure(tb, total + length + 1)
        if hi - lo + 2 > off_cap[0]:
            off_cap[0] = 2 * (hi - lo + 2)
            p = realloc(off[0], off_cap[0] * sizeof(Py_ssize_t))
            if p == NULL:
                raise MemoryError()
            off[0] = <Py_ssize_t*>p
        off[0][hi - lo] = total
        if length:
            PyUnicode_AsUCS4(low, <Py_UCS4*>(tb.cps + total), tb.cap - total, 0)
        total += length
        hi += 1
    off[0][hi - lo] = total
    return hi


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


cdef void _keys_chunk(TextBuf* tb, const Py_ssize_t* off, Py_ssize_t m, uint64_t* exact,
                      uint64_t* sim) noexcept nogil:
    """text_keys of a chunk's m texts (_load_chunk)."""
    cdef Py_ssize_t j, nt
    for j in range(m):
        nt = _tokenize(tb.cps + off[j], off[j + 1] - off[j], tb.starts, tb.ends)
        _keys_one(tb.cps + off[j], tb.starts, tb.ends, nt, exact + j, sim + j)


cdef void _embed_chunk(TextBuf* tb, const Py_ssize_t* off, Py_ssize_t m, double* vec, Py_ssize_t dim,
                       float* out) noexcept nogil:
    """hash_embed of a chunk's m texts (_load_chunk)."""
    cdef Py_ssize_t j, nt
    for j in range(m):
        nt = _tokenize(tb.cps + off[j], off[j + 1] - off[j], tb.starts, tb.ends)
        _embed_one(tb.cps + off[j], tb.starts, tb.ends, nt, vec, dim, out + j * dim)


def tokenize(text):
    """Tokens of `text` (rules in the fastpath.reference.textkeys docstring); list[str]."""
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
    cdef Py_ssize_t n = len(items)
    cdef cnp.ndarray exact = _empty(n, cnp.NPY_UINT64)
    cdef cnp.ndarray sim = _empty(n, cnp.NPY_UINT64)
    cdef uint64_t* ex = <uint64_t*>_ptr(exact)
    cdef uint64_t* sh = <uint64_t*>_ptr(sim)
    cdef TextBuf tb
    cdef Py_ssize_t* off = NULL
    cdef Py_ssize_t off_cap = 0, lo = 0, hi
    memset(&tb, 0, sizeof(tb))
    try:
        while lo < n:
            hi = _load_chunk(items, lo, &tb, &off, &off_cap)
            if off[hi - lo] >= RELEASE_CHARS:
                with nogil:
                    _keys_chunk(&tb, off, hi - lo, ex + lo, sh + lo)
            else:
                _keys_chunk(&tb, off, hi - lo, ex + lo, sh + lo)
            lo = hi
    finally:
        _release(&tb)
        free(off)
    return exact, sim


def hash_embed(texts, dim):
    """Model-free hashed bag-of-features embedding, L2-normalised; float32[n, dim]."""
    cdef int64_t d = _int64_clamped("dim", dim, -1)
    if d < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    cdef list items = _text_list(texts)
    cdef Py_ssize_t n = len(items)
    cdef cnp.npy_intp dims[2]
    dims[0] = n
    dims[1] = d
    cdef cnp.ndarray out = <cnp.ndarray>cnp.PyArray_EMPTY(2, dims, cnp.NPY_FLOAT32, 0)
    cdef float* op = <float*>_ptr(out)
    cdef double* vec = <double*>malloc(d * sizeof(double))
    if vec == NULL:
        raise MemoryError()
    cdef TextBuf tb
    cdef Py_ssize_t* off = NULL
    cdef Py_ssize_t off_cap = 0, lo = 0, hi
    memset(&tb, 0, sizeof(tb))
    try:
        while lo < n:
            hi = _load_chunk(items, lo, &tb, &off, &off_cap)
            if off[hi - lo] >= RELEASE_CHARS:
                with nogil:
                    _embed_chunk(&tb, off, hi - lo, vec, d, op + lo * d)
            else:
                _embed_chunk(&tb, off, hi - lo, vec, d, op + lo * d)
            lo = hi
    finally:
        _release(&tb)
        free(off)
        free(vec)
    return out


cdef inline bint _is_az(uint32_t c) noexcept nogil:
    return c - 97 < 26


cdef inline bint _is_az09(uint32_t c) noexcept nogil:
    return (c - 97 < 26) or (c - 48 < 10)


cdef inline Py_ssize_t _word_end(const uint32_t* cps, Py_ssize_t i, Py_ssize_t n, bint digits) noexcept nogil:
    """Where the word starting at cps[i] ends: its run of [a-z] ([0-9a-z] with `digits`), then a "'"
    and the letters after it where a letter follows ("don't", "rock'n" of "rock'n'roll")."""
    while i < n and (_is_az09(cps[i]) if digits else _is_az(cps[i])):
        i += 1
    if i + 1 < n and cps[i] == 39 and _is_az(cps[i + 1]):  # 39: "'"
        i += 2
        while i < n and _is_az(cps[i]):
            i += 1
    return i


cdef class WordTable:
    """A vocabulary (word -> row) as an open-addressing table over the words' ASCII bytes, so a text's
    words are found without a str made per word. Words that [a-z]+('[a-z]+)? cannot match are left
    out: no text's word could find them."""

    cdef bytes _chars
    cdef const unsigned char* _chars_at  # _chars' bytes, read without the GIL
    cdef int64_t* _offsets  # entry e spans _chars[_offsets[e]:_offsets[e + 1]]
    cdef int64_t* _rows  # entry e's row
    cdef int64_t* _slots  # -1 empty, else an entry
    cdef uint64_t _mask
    cdef readonly Py_ssize_t size

    def __cinit__(self, index):
        cdef list words = [w for w in index if isinstance(w, str) and _matchable(w)]
        cdef Py_ssize_t n = len(words), e, s
        cdef uint64_t cap = 16, h, slot
        cdef const unsigned char* chars
        while cap < <uint64_t>(2 * n + 2):
            cap *= 2
        self._offsets = <int64_t*>malloc((n + 1) * sizeof(int64_t))
        self._rows = <int64_t*>malloc((n + 1) * sizeof(int64_t))
        self._slots = <int64_t*>malloc(cap * sizeof(int64_t))
        if self._offsets == NULL or self._rows == NULL or self._slots == NULL:
            raise MemoryError()
        self._chars = "".join(words).encode("ascii")
        self._chars_at = self._chars
        self._mask = cap - 1
        self.size = n
        chars = self._chars
        self._offsets[0] = 0
        for s in range(<Py_ssize_t>cap):
            self._slots[s] = -1
        for e in range(n):
            self._offsets[e + 1] = self._offsets[e] + len(words[e])
            self._rows[e] = _int64_clamped("index value", index[words[e]], -1)
            if self._rows[e] < 0:
                raise ValueError(f"index[{words[e]!r}] must be a row number >= 0")
            h = fnv_bytes(_FNV_OFFSET, chars + self._offsets[e], self._offsets[e + 1] - self._offsets[e])
            slot = h & self._mask
            while self._slots[slot] >= 0:
                slot = (slot + 1) & self._mask
            self._slots[slot] = e

    def __dealloc__(self):
        free(self._offsets)
        free(self._rows)
        free(self._slots)

    cdef int64_t find(self, const uint32_t* cps, Py_ssize_t s, Py_ssize_t e) noexcept nogil:
        """The row of the word cps[s:e] (ASCII), or -1."""
        cdef uint64_t slot = _fspan(_FNV_OFFSET, cps, s, e) & self._mask
        cdef int64_t entry, at
        cdef Py_ssize_t i
        cdef const unsigned char* chars = self._chars_at
        while True:
            entry = self._slots[slot]
            if entry < 0:
                return -1
            at = self._offsets[entry]
            if self._offsets[entry + 1] - at == e - s:
                for i in range(e - s):
                    if chars[at + i] != cps[s + i]:
                        break
                else:
                    return self._rows[entry]
            slot = (slot + 1) & self._mask


cdef bint _matchable(str word):
    """Whether [a-z]+('[a-z]+)? matches the whole of `word`."""
    cdef Py_ssize_t i, n = len(word)
    cdef bint quote = False
    cdef Py_UCS4 c
    if n == 0 or not ("a" <= word[0] <= "z") or not ("a" <= word[n - 1] <= "z"):
        return False
    for i in range(n):
        c = word[i]
        if c == "'":
            if quote or not ("a" <= word[i + 1] <= "z"):
                return False
            quote = True
        elif not ("a" <= c <= "z"):
            return False
    return True


def word_vector_sums(texts, WordTable table not None, weighted):
    """float32[n, dim]: for each text, the rows of `weighted` of its words ([a-z]+('[a-z]+)? in the
    lowercased text, those in `table`) summed in the order they occur, in float32; zero for none."""
    cdef list items = _text_list(texts)
    if not isinstance(weighted, cnp.ndarray) or weighted.dtype != np.float32 or weighted.ndim != 2:
        raise TypeError("weighted must be a float32[rows, dim] array")
    cdef cnp.ndarray w = np.ascontiguousarray(weighted)
    cdef Py_ssize_t n = len(items), rows = w.shape[0], dim = w.shape[1]
    cdef cnp.npy_intp dims[2]
    dims[0] = n
    dims[1] = dim
    cdef cnp.ndarray out = <cnp.ndarray>cnp.PyArray_ZEROS(2, dims, cnp.NPY_FLOAT32, 0)
    cdef float* op = <float*>_ptr(out)
    cdef const float* wp = <const float*>_ptr(w)
    cdef TextBuf tb
    cdef Py_ssize_t* off = NULL
    cdef Py_ssize_t off_cap = 0, lo = 0, hi
    cdef int64_t bad = -1  # a row outside `weighted`
    memset(&tb, 0, sizeof(tb))
    try:
        while lo < n and bad < 0:
            hi = _load_chunk(items, lo, &tb, &off, &off_cap)
            if off[hi - lo] >= RELEASE_CHARS:
                with nogil:
                    bad = _sums_chunk(table, &tb, off, hi - lo, wp, rows, dim, op + lo * dim)
            else:
                bad = _sums_chunk(table, &tb, off, hi - lo, wp, rows, dim, op + lo * dim)
            lo = hi
        if bad >= 0:
            raise ValueError(f"the table's row {bad} is outside weighted ({rows} rows)")
    finally:
        _release(&tb)
        free(off)
    return out


cdef int64_t _sums_chunk(WordTable table, TextBuf* tb, const Py_ssize_t* off, Py_ssize_t m, const float* wp,
                         Py_ssize_t rows, Py_ssize_t dim, float* op) noexcept nogil:
    """word_vector_sums of a chunk's m texts (_load_chunk) into op; a row outside `wp` met, or -1."""
    cdef Py_ssize_t k, i, j, s, nc
    cdef int64_t row
    cdef const uint32_t* cps
    cdef const float* src
    cdef float* acc
    for k in range(m):
        cps = tb.cps + off[k]
        nc = off[k + 1] - off[k]
        acc = op + k * dim
        i = 0
        while i < nc:
            if not _is_az(cps[i]):
                i += 1
                continue
            s = i
            i = _word_end(cps, i, nc, False)
            row = table.find(cps, s, i)
            if row < 0:
                continue
            if row >= rows:
                return row
            src = wp + row * dim
            for j in range(dim):
                acc[j] += src[j]
    return -1


# The kind of each BMP code point (fastpath.reference.scripts.kinds), loaded at the first word_terms.
cdef bytes _kinds_table = None
cdef const unsigned char* _KINDS = NULL
cdef enum:
    _WORD = 1
    _SINGLE = 2
    _PAIR = 3


cdef void _load_kinds() except *:
    global _kinds_table, _KINDS
    from fastpath.reference import scripts
    table = scripts.kinds()
    if len(table) != 0x10000:
        raise ValueError("scripts.kinds() must hold one byte per BMP code point")
    _kinds_table = table
    _KINDS = _kinds_table


cdef inline int _kind(uint32_t c) noexcept nogil:
    """scripts.kind(c); ASCII tested without the table."""
    if c < 128:
        return _WORD if _is_az09(c) else 0
    if c < 0x10000:
        return _KINDS[c]
    return _SINGLE if 0x20000 <= c <= 0x3FFFF else 0


cdef inline bint _is_term_letter(uint32_t c) noexcept nogil:
    """What may follow a word's "'": [a-z], or a WORD character above ASCII."""
    return _is_az(c) if c < 128 else _kind(c) == _WORD


cdef inline Py_ssize_t _term_word_end(uint32_t* cps, Py_ssize_t i, Py_ssize_t n) noexcept nogil:
    """Where the word starting at cps[i] ends: its run of WORD characters, then an apostrophe and the
    letters after it where a letter follows (scripts.term_word_re); a typographic apostrophe is
    written as "'" in the buffer, so "don’t" is the word "don't"."""
    while i < n and _kind(cps[i]) == _WORD:
        i += 1
    if i + 1 < n and (cps[i] == 39 or cps[i] == 0x2019) and _is_term_letter(cps[i + 1]):
        cps[i] = 39  # "'"
        i += 2
        while i < n and _is_term_letter(cps[i]):
            i += 1
    return i


cdef inline int _add_term(const uint32_t* cps, Py_ssize_t s, Py_ssize_t e, dict cache, miss, list out) except -1:
    """Append the truthy term of the word cps[s:e] (cache[word], made by miss(word) the first time)."""
    word = PyUnicode_FromKindAndData(4, cps + s, e - s)  # 4: PyUnicode_4BYTE_KIND
    term = cache.get(word)
    if term is None:
        term = miss(word)
        if not isinstance(term, str):
            raise TypeError(f"miss({word!r}) must return a str, got {type(term).__name__}")
        cache[word] = term
    if term:
        out.append(term)
    return 0


def word_terms(text, dict cache not None, miss):
    """The truthy cache[w] of each word w of the lowercased text, in order; a word not in the cache is
    put there as miss(w) first (a str). Words as fastpath.reference.scripts defines them."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if _KINDS == NULL:
        _load_kinds()
    cdef TextBuf tb
    memset(&tb, 0, sizeof(tb))
    cdef Py_ssize_t n, i = 0, s, p
    cdef int k
    cdef list out = []
    try:
        n = _lowered(text, 0, &tb)
        while i < n:
            s = i
            k = _kind(tb.cps[i])
            if k == _WORD:
                i = _term_word_end(tb.cps, i, n)
                _add_term(tb.cps, s, i, cache, miss, out)
            elif k == _SINGLE:
                i += 1
                _add_term(tb.cps, s, i, cache, miss, out)
            elif k == _PAIR:
                while i < n and _kind(tb.cps[i]) == _PAIR:
                    i += 1
                if i - s < 2:
                    _add_term(tb.cps, s, i, cache, miss, out)
                else:
                    for p in range(s, i - 1):
                        _add_term(tb.cps, p, p + 2, cache, miss, out)
            else:
                i += 1
    finally:
        _release(&tb)
    return out


cdef inline bint _is_token_char(uint32_t c) noexcept nogil:
    return (c - 97 < 26) or (c - 65 < 26) or (c - 48 < 10) or c == 43 or c == 47 or c == 95 or c == 45  # + / _ -


def has_token_run(text, Py_ssize_t length):
    """Whether `text` holds `length` consecutive characters of [A-Za-z0-9+/_-]."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    cdef unicode t = text
    cdef Py_ssize_t n = len(t), i, run = 0
    if length <= 0:
        return True
    for i in range(n):
        if _is_token_char(t[i]):
            run += 1
            if run >= length:
                return True
        else:
            run = 0
    return False


cdef extern from "Python.h":
    bint PyUnicode_IS_ASCII(object u)
    const char* PyUnicode_AsUTF8AndSize(object u, Py_ssize_t* size) except NULL


cdef class NeedleSet:
    """Strings to look for in texts: found(text) is the set of those `text` holds. An ASCII text is read
    once, each position checked against the needles that start with its two characters (or its one,
    for a needle of one); another text is searched for each needle in turn."""

    cdef readonly tuple needles
    cdef bytes _chars  # the ASCII needles of two or more characters, back to back
    cdef int64_t* _offsets  # entry e spans _chars[_offsets[e]:_offsets[e + 1]]
    cdef int32_t* _which  # entry e is needles[_which[e]]
    cdef int32_t* _pair_start  # entries with first two characters (a, b): _pair_start[k]:_pair_start[k + 1], k = a * 128 + b
    cdef int32_t _single[128]  # the needle of one ASCII character, or -1

    def __cinit__(self, needles):
        cdef Py_ssize_t i, e, k, n_long = 0
        self.needles = tuple(needles)
        for i in range(len(self.needles)):
            if not isinstance(self.needles[i], str) or not self.needles[i]:
                raise TypeError(f"needles[{i}] must be a non-empty str")
        for k in range(128):
            self._single[k] = -1
        longs = sorted((ord(w[0]) * 128 + ord(w[1]), i) for i, w in enumerate(self.needles)
                       if len(w) >= 2 and w.isascii())
        n_long = len(longs)
        self._offsets = <int64_t*>malloc((n_long + 1) * sizeof(int64_t))
        self._which = <int32_t*>malloc((n_long + 1) * sizeof(int32_t))
        self._pair_start = <int32_t*>malloc((128 * 128 + 1) * sizeof(int32_t))
        if self._offsets == NULL or self._which == NULL or self._pair_start == NULL:
            raise MemoryError()
        self._chars = "".join(self.needles[i] for _, i in longs).encode("ascii")
        self._offsets[0] = 0
        for e in range(n_long):
            self._which[e] = longs[e][1]
            self._offsets[e + 1] = self._offsets[e] + len(self.needles[longs[e][1]])
        e = 0
        for k in range(128 * 128 + 1):
            while e < n_long and longs[e][0] < k:
                e += 1
            self._pair_start[k] = e
        for i, w in enumerate(self.needles):
            if len(w) == 1 and w.isascii() and self._single[ord(w)] < 0:
                self._single[ord(w)] = i

    def __dealloc__(self):
        free(self._offsets)
        free(self._which)
        free(self._pair_start)

    def found(self, text):
        """frozenset of the needles `text` holds."""
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        if not PyUnicode_IS_ASCII(text):
            return frozenset([w for w in self.needles if w in text])
        cdef Py_ssize_t n, i, e, m
        cdef const unsigned char* s = <const unsigned char*>PyUnicode_AsUTF8AndSize(text, &n)
        cdef const unsigned char* chars = self._chars
        cdef unsigned char a, b
        cdef int32_t k
        cdef Py_ssize_t total = len(self.needles)
        cdef bytearray seen = bytearray(total)
        cdef unsigned char* flags = seen
        for i in range(n):
            a = s[i]
            k = self._single[a]
            if k >= 0 and not flags[k]:
                flags[k] = 1
            if i + 1 >= n:
                break
            b = s[i + 1]
            for e in range(self._pair_start[a * 128 + b], self._pair_start[a * 128 + b + 1]):
                k = self._which[e]
                if flags[k]:
                    continue
                m = self._offsets[e + 1] - self._offsets[e]
                if i + m <= n and memcmp(s + i, chars + self._offsets[e], m) == 0:
                    flags[k] = 1
        return frozenset([self.needles[i] for i in range(total) if flags[i]])
