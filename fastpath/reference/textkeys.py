"""Reference text keys: tokenize, FNV-1a, exact keys and SimHash (text_keys), the hashed embedding.

Tokenization: the text is lowercased with ``str.lower()``; then each character is, in this order of
tests:

* a CJK single token if its code point is in U+3040-U+30FF (kana), U+3400-U+4DBF, U+4E00-U+9FFF,
  U+F900-U+FAFF or U+20000-U+2FFFF (CJK ideographs);
* a word character if ``ch.isalnum() or ch == "_"``; consecutive word characters form one token;
* a separator otherwise.

So ``"Hello, World_1 中文"`` gives ``["hello", "world_1", "中", "文"]`` and ``"ab中cd"`` gives
``["ab", "中", "cd"]``.

Hash: FNV-1a 64-bit over the UTF-8 bytes of a feature string (offset 0xcbf29ce484222325,
prime 0x100000001b3, arithmetic mod 2**64).

* ``exact`` key: hash of the tokens joined by single spaces; no tokens gives 0, and a hash that
  happens to be 0 becomes 1 (0 means "no key").
* ``simhash``: features are the token bigrams ``"a b"`` when there are >= 2 tokens, else the single
  token; 64-bit SimHash of the feature hashes (bit b set iff more features have it set than not);
  no tokens gives 0, a result of 0 from real features becomes 1.
* ``hash_embed``: per token position t, in this order: ``"w:"+tok`` (weight 1.0), then
  ``"b:"+prev+" "+tok`` if t > 0 (0.5), then, for tokens of >= 4 characters (always word tokens,
  CJK tokens are single characters), each character trigram of ``"<"+tok+">"`` as ``"c:"+tri`` (0.3).
  Feature hash h adds ``sign*weight`` to ``vec[h % dim]`` (sign -1 iff bit 63 of h is set),
  accumulated in float64; the vector is divided by the square root of its sum of squares (summed in
  index order) and cast to float32; an all-zero vector stays zero.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from fastpath.reference import scripts
from fastpath.reference._common import MASK64, _int, _texts

__all__ = ["FNV_OFFSET", "FNV_PRIME", "WordTable", "tokenize", "fnv1a64", "text_keys", "hash_embed",
           "word_vector_sums", "word_terms", "has_token_run", "NeedleSet"]

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def _is_cjk(cp: int) -> bool:
    return (0x3040 <= cp <= 0x30FF or 0x3400 <= cp <= 0x4DBF or 0x4E00 <= cp <= 0x9FFF
            or 0xF900 <= cp <= 0xFAFF or 0x20000 <= cp <= 0x2FFFF)


def tokenize(text: str) -> list[str]:
    """Tokens of ``text`` (see module docstring)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    tokens: list[str] = []
    word: list[str] = []
    for ch in text.lower():
        if _is_cjk(ord(ch)):
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(ch)
        elif ch.isalnum() or ch == "_":
            word.append(ch)
        elif word:
            tokens.append("".join(word))
            word = []
    if word:
        tokens.append("".join(word))
    return tokens


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64-bit hash of ``data``."""
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & MASK64
    return h


def _fnv(s: str) -> int:
    return fnv1a64(s.encode("utf-8"))


def _simhash(features: list[str]) -> int:
    if not features:
        return 0
    v = [0] * 64
    for f in features:
        h = _fnv(f)
        for b in range(64):
            v[b] += 1 if (h >> b) & 1 else -1
    out = 0
    for b in range(64):
        if v[b] > 0:
            out |= 1 << b
    return out or 1


def text_keys(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """(exact key, simhash) per text, both uint64[n]."""
    exact: list[int] = []
    sims: list[int] = []
    for text in _texts(texts):
        toks = tokenize(text)
        exact.append((_fnv(" ".join(toks)) or 1) if toks else 0)
        feats = [a + " " + b for a, b in zip(toks, toks[1:], strict=False)] if len(toks) >= 2 else toks
        sims.append(_simhash(feats))
    return np.array(exact, dtype=np.uint64), np.array(sims, dtype=np.uint64)


def _embed_features(toks: list[str]) -> list[tuple[str, float]]:
    feats: list[tuple[str, float]] = []
    for t, tok in enumerate(toks):
        feats.append(("w:" + tok, 1.0))
        if t > 0:
            feats.append(("b:" + toks[t - 1] + " " + tok, 0.5))
        if len(tok) >= 4:
            padded = "<" + tok + ">"
            for k in range(len(padded) - 2):
                feats.append(("c:" + padded[k:k + 3], 0.3))
    return feats


def hash_embed(texts: Sequence[str], dim: int) -> np.ndarray:
    """Model-free L2-normalised hashed bag-of-features embedding; float32[n, dim]."""
    d = _int("dim", dim)
    if d < 1:
        raise ValueError(f"dim must be >= 1, got {d}")
    rows: list[list[float]] = []
    for text in _texts(texts):
        vec = [0.0] * d
        for feat, weight in _embed_features(tokenize(text)):
            h = _fnv(feat)
            sign = 1.0 if (h >> 63) & 1 == 0 else -1.0
            vec[h % d] += sign * weight
        ss = 0.0
        for x in vec:
            ss += x * x
        if ss > 0.0:
            norm = math.sqrt(ss)
            vec = [x / norm for x in vec]
        rows.append(vec)
    # float64 -> float32 rounding of the finished row is the only numpy step (output packaging).
    return np.array(rows, dtype=np.float32).reshape(len(rows), d)


# word_vector_sums: a text's words are the matches of _WORD_RE in the lowercased text ("don't" is
# one word), in order; each word the table holds adds its row of `weighted` to the text's sum,
# accumulated in float32 in that order (the result is exact, bit for bit).
_WORD_RE = re.compile(r"[a-z]+(?:'[a-z]+)?")


class WordTable:
    """A vocabulary: word -> row of the weighted vectors."""

    def __init__(self, index: Mapping[str, int]) -> None:
        self.rows = {w: _int("index value", r) for w, r in index.items()
                     if isinstance(w, str) and _WORD_RE.fullmatch(w)}
        for w, r in self.rows.items():
            if r < 0:
                raise ValueError(f"index[{w!r}] must be a row number >= 0")
        self.size = len(self.rows)


def word_vector_sums(texts: Sequence[str], table: WordTable, weighted: np.ndarray) -> np.ndarray:
    """float32[n, dim]: each text's words' rows of `weighted` summed (zero for a text with none)."""
    items = _texts(texts)
    if not isinstance(table, WordTable):
        raise TypeError("table must be a WordTable")
    if not isinstance(weighted, np.ndarray) or weighted.dtype != np.float32 or weighted.ndim != 2:
        raise TypeError("weighted must be a float32[rows, dim] array")
    out = np.zeros((len(items), weighted.shape[1]), np.float32)
    for k, text in enumerate(items):
        for word in _WORD_RE.findall(text.lower()):
            row = table.rows.get(word)
            if row is None:
                continue
            if row >= len(weighted):
                raise ValueError(f"the table's row {row} is outside weighted ({len(weighted)} rows)")
            out[k] += weighted[row]
    return out


# word_terms: a text's words are the matches of scripts.term_word_re() in the lowercased text (a run
# of letters, digits and marks with an optional apostrophe, written "'", and letters after it, one CJK
# or Hangul character, or a run of Thai, Lao, Myanmar or Khmer giving its pairs of characters), in order.
def word_terms(text: str, cache: dict[str, str], miss: Callable[[str], str]) -> list[str]:
    """The truthy cache[w] of each word w of the lowercased text, in order; a word not in the cache is
    put there as miss(w) first (a str)."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if not isinstance(cache, dict):
        raise TypeError(f"cache must be a dict, got {type(cache).__name__}")
    out = []
    for found in scripts.term_word_re().findall(text.lower()):
        for word in scripts.pairs(found) if scripts.is_pair_run(found) else (scripts.as_typed(found),):
            _add_term(word, cache, miss, out)
    return out


def _add_term(word: str, cache: dict[str, str], miss: Callable[[str], str], out: list[str]) -> None:
    """Append the word's truthy term (cache[word], made by miss(word) the first time)."""
    term = cache.get(word)
    if term is None:
        term = miss(word)
        if not isinstance(term, str):
            raise TypeError(f"miss({word!r}) must return a str, got {type(term).__name__}")
        cache[word] = term
    if term:
        out.append(term)


_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/_-")


def has_token_run(text: str, length: int) -> bool:
    """Whether `text` holds `length` consecutive characters of [A-Za-z0-9+/_-]."""
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    run = 0
    if length <= 0:
        return True
    for ch in text:
        run = run + 1 if ch in _TOKEN_CHARS else 0
        if run >= length:
            return True
    return False


class NeedleSet:
    """Strings to look for in texts: found(text) is the set of those `text` holds."""

    def __init__(self, needles: Sequence[str]) -> None:
        self.needles = tuple(needles)
        for i, w in enumerate(self.needles):
            if not isinstance(w, str) or not w:
                raise TypeError(f"needles[{i}] must be a non-empty str")

    def found(self, text: str) -> frozenset[str]:
        if not isinstance(text, str):
            raise TypeError(f"text must be str, got {type(text).__name__}")
        return frozenset(w for w in self.needles if w in text)
