"""Lexical terms shared by the lexical scorers of memories and knowledge: lowercased words of any
script (joined by "-" or ".": "payment-api", "v1.2"), single CJK and Hangul characters and pairs of
Thai, Lao, Myanmar or Khmer characters (fastpath.reference.scripts), with a light English suffix
strip so "restarts"/"restarted" meet "restart"."""

from __future__ import annotations

import re
from collections.abc import Iterable
from functools import lru_cache

import numpy as np

from fastpath import fnv1a64
from fastpath.reference import scripts

_WORD_CHARS = scripts.char_class(scripts.WORD) + "_"
_TERM_RE = re.compile(f"[{_WORD_CHARS}]+(?:[-.][{_WORD_CHARS}]+)*|[{scripts.char_class(scripts.SINGLE)}]"
                      f"|[{scripts.char_class(scripts.PAIR)}]+")
_PAIR_FIRST, _PAIR_LAST = scripts.PAIR_RANGES[0][0], scripts.PAIR_RANGES[-1][1]
# The same terms of an ASCII text, found faster: a small class matches what the large one would.
_ASCII_TERM_RE = re.compile(r"[0-9a-z_]+(?:[-.][0-9a-z_]+)*")
# Indexes saved with their terms (the knowledge index file) name the rule that made them: a file of
# another rule is rebuilt from the rows. 2: words of every script (1: ASCII words and CJK only).
TERMS_VERSION = 2
_SUFFIXES = ("ing", "ed", "es", "s")
STOPWORDS = frozenset(
    "a an the and or but if then of to in on at by for with from as is are was were be been being do does did "
    "i you he she it we they me my your our their this that these those what which who whom how when where why "
    "can could would should will shall may might must not no yes so than too very just about into over under "
    "again there here all any some such only own same other its his her them us am has have had having "
    "的 了 是 在 我 你 他 她 它 们 这 那 和 与 就 也 都 吗 呢 吧 啊 一 个".split()
)


@lru_cache(maxsize=1 << 16)  # words repeat: a user's memories are indexed again whenever their state is rebuilt
def stem(word: str) -> str:
    if len(word) > 4 and not word.isdigit():
        for suffix in _SUFFIXES:
            if word.endswith(suffix) and len(word) - len(suffix) >= 3:
                return word[: -len(suffix)]
    return word


def terms(text: str) -> list[str]:
    """Content terms of a text, in order (stopwords removed, stemmed)."""
    low = text.lower()
    if low.isascii():
        return [stem(t) for t in _ASCII_TERM_RE.findall(low) if t not in STOPWORDS]
    out: list[str] = []
    for t in _TERM_RE.findall(low):
        if _PAIR_FIRST <= ord(t[0]) <= _PAIR_LAST and scripts.is_pair_run(t):
            out += scripts.pairs(t)
        elif t not in STOPWORDS:
            out.append(stem(t))
    return out


# One BuildContext tokenises its query in several sources (memories, knowledge, graph): once is
# enough. Bounded like the builder's key cache; long texts are not kept.
_QUERY_TERMS: dict[str, tuple[str, ...]] = {}
_QUERY_TERMS_MAX, _QUERY_MAX_CHARS = 4096, 2048


def query_terms(query: str) -> tuple[str, ...]:
    """terms() of a query, memoised."""
    cached = _QUERY_TERMS.get(query)
    if cached is None:
        cached = tuple(terms(query))
        if len(query) <= _QUERY_MAX_CHARS:
            if len(_QUERY_TERMS) >= _QUERY_TERMS_MAX:
                _QUERY_TERMS.clear()
            _QUERY_TERMS[query] = cached
    return cached


NO_TERMS = np.zeros(0, np.uint64)


def term_ids(words: Iterable[str]) -> np.ndarray:
    """A term set as sorted unique 64-bit ids (FNV-1a, stable across processes, so persisted index
    entries keep theirs), so the overlaps of many pairs come from one vectorised call."""
    return np.unique(np.fromiter((fnv1a64(w.encode()) for w in words), np.uint64))
