"""Compiled turn marks: a turn's voice and the words it capitalises inside its sentences, read in one
pass over the text's code points instead of by regular expressions.

The semantics are specified by ``fastpath.reference.marks``; both routines must return exactly what
their reference twins return, on any text.
"""

from libc.stdint cimport uint8_t, uint32_t


cdef extern from "Python.h":
    int fp_kind "PyUnicode_KIND"(object u)
    const void* fp_data "PyUnicode_DATA"(object u)
    uint32_t fp_read "PyUnicode_READ"(int kind, const void* data, Py_ssize_t i) nogil
    # Pure table lookups: what re's \w (with "_") and \s test per character of a str pattern.
    bint fp_isalnum "Py_UNICODE_ISALNUM"(uint32_t ch) nogil
    bint fp_isspace "Py_UNICODE_ISSPACE"(uint32_t ch) nogil


# The person words in the order the reference pattern tries them; the first 15 are first-person.
_PERSON_WORDS = tuple(w.encode() for w in (
    "i", "i'm", "i've", "i'd", "i'll", "me", "my", "mine", "myself", "we", "we're", "we've", "us", "our", "ours",
    "you", "your", "you're", "you've", "you'd", "you'll", "yours", "yourself"))
cdef enum:
    N_WORDS = 23
    FIRST_PERSON = 15
cdef const char* _word[N_WORDS]
cdef Py_ssize_t _word_len[N_WORDS]
cdef uint8_t _ascii_word[128]  # re's \w of an ASCII character
cdef Py_ssize_t _k
for _k in range(N_WORDS):
    _word[_k] = <const char*>(<bytes>_PERSON_WORDS[_k])
    _word_len[_k] = len(_PERSON_WORDS[_k])
for _k in range(128):
    _ascii_word[_k] = chr(_k).isalnum() or _k == 95


cdef inline bint _is_word(uint32_t c) noexcept nogil:
    return _ascii_word[c] if c < 128 else fp_isalnum(c)


cdef inline uint32_t _folded(uint32_t c) noexcept nogil:
    """c as re's IGNORECASE compares it to the pattern's ASCII lower-case letters: an ASCII capital
    lowered, "İ" and "ı" as "i", "ſ" as "s"; any other character as it is."""
    if 65 <= c <= 90:
        return c + 32
    if c == 0x130 or c == 0x131:
        return 105
    return 115 if c == 0x17F else c


cdef inline bint _opens_person_word(uint32_t f) noexcept nogil:
    return f == 105 or f == 109 or f == 111 or f == 117 or f == 119 or f == 121  # i m o u w y (folded)


cdef Py_ssize_t _person_at(int kind, const void* data, Py_ssize_t at, Py_ssize_t n, Py_ssize_t* which) noexcept nogil:
    """The length of the first person word matching at `at` and ending at a word boundary (0: none);
    its index in _PERSON_WORDS in *which."""
    cdef Py_ssize_t k, j, length
    for k in range(N_WORDS):
        length = _word_len[k]
        if at + length > n:
            continue
        j = 0
        while j < length and _folded(fp_read(kind, data, at + j)) == <uint8_t>_word[k][j]:
            j += 1
        if j == length and (at + length == n or not _is_word(fp_read(kind, data, at + length))):
            which[0] = k
            return length
    return 0


def voice(text):
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    cdef int kind = fp_kind(text)
    cdef const void* data = fp_data(text)
    cdef Py_ssize_t n = len(text), i = 0, own = 0, other = 0, length, which = 0
    cdef uint32_t c
    cdef bint after_word = False  # whether text[i - 1] is a word character
    while i < n:
        c = fp_read(kind, data, i)
        if c == 0x6211:  # 我
            own += 1
        elif c == 0x4F60 or c == 0x60A8:  # 你 您
            other += 1
        # A person word's first letter, at a word's start.
        if not after_word and _opens_person_word(_folded(c)):
            length = _person_at(kind, data, i, n, &which)
            if length:
                if which < FIRST_PERSON:
                    own += 1
                else:
                    other += 1
                i += length
                after_word = True  # each person word ends in a letter
                continue
        after_word = _is_word(c)
        i += 1
    return (own > other) - (other > own)


cdef inline bint _ends_sentence(uint32_t c) noexcept nogil:
    return c == 46 or c == 33 or c == 63  # . ! ?


def capitalised(text):
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    cdef int kind = fp_kind(text)
    cdef const void* data = fp_data(text)
    cdef Py_ssize_t n = len(text), i = 1, j
    cdef uint32_t c, before
    cdef list out = []
    cdef set seen = set()
    cdef str word
    while i < n:  # not at the text's start
        c = fp_read(kind, data, i)
        if 65 <= c <= 90:
            before = fp_read(kind, data, i - 1)
            if not (_is_word(before)
                    or (i >= 2 and fp_isspace(before) and _ends_sentence(fp_read(kind, data, i - 2)))
                    or (i >= 3 and before == 34 and fp_isspace(fp_read(kind, data, i - 2))
                        and _ends_sentence(fp_read(kind, data, i - 3)))):
                j = i + 1
                while j < n and 97 <= fp_read(kind, data, j) <= 122:
                    j += 1
                if j > i + 1:
                    word = text[i:j].lower()
                    if word not in seen:
                        seen.add(word)
                        out.append(word)
                    i = j
                    continue
        i += 1
    return tuple(out)
