"""Terms of turns and queries: the word pattern, a compact English stemmer (suffix rules, irregular
forms, a dropped final "e"), the question words a query may leave out, and the pattern of the
speakers' names."""

from __future__ import annotations

import re
from functools import lru_cache

import fastpath
from fastpath.reference import scripts
from sidecar.text import STOPWORDS

_WORD_RE = scripts.term_word_re()  # the index's words, in every script (fastpath.reference.scripts)
_VOWEL_RE = re.compile(r"[aeiouy]")
# Porter-like suffix rules, longest first: (suffix, replacement, minimum stem length).
_RULES = (("ational", "ate", 3), ("iveness", "ive", 3), ("fulness", "ful", 3), ("ization", "ize", 3),
          ("ations", "ate", 3), ("ation", "ate", 3), ("nesses", "", 3), ("ness", "", 3), ("ments", "", 4),
          ("ment", "", 4), ("ships", "", 3), ("ship", "", 3), ("ists", "", 3), ("ist", "", 3), ("ions", "", 3),
          ("ion", "", 3), ("ingly", "", 3), ("edly", "", 3), ("ies", "y", 2), ("ied", "y", 2), ("ing", "", 3),
          ("ers", "", 3), ("er", "", 3), ("ed", "", 3), ("ly", "", 4), ("es", "", 3), ("s", "", 3))
_DOUBLE = frozenset("bdfgmnprt")


# Irregular forms a suffix rule cannot reach, to the word their regular forms stem to.
_IRREGULAR = {
    "went": "go", "gone": "go", "going": "go", "goes": "go", "bought": "buy", "ran": "run", "swam": "swim",
    "children": "child", "kids": "kid", "taught": "teach", "made": "make", "took": "take", "taken": "take",
    "saw": "see", "seen": "see", "met": "meet", "felt": "feel", "won": "win", "wrote": "write",
    "written": "write", "began": "begin", "begun": "begin", "built": "build", "caught": "catch",
    "brought": "bring", "thought": "think", "found": "find", "gave": "give", "given": "give", "got": "get",
    "gotten": "get", "held": "hold", "kept": "keep", "left": "leave", "lost": "lose", "paid": "pay",
    "sang": "sing", "sung": "sing", "sold": "sell", "spent": "spend", "told": "tell", "flew": "fly",
    "ate": "eat", "eaten": "eat", "drew": "draw", "drawn": "draw", "grew": "grow", "grown": "grow",
    "knew": "know", "known": "know", "rode": "ride", "ridden": "ride", "fell": "fall", "fallen": "fall",
    "women": "woman", "men": "man", "people": "person", "mice": "mouse", "feet": "foot", "teeth": "tooth",
}
_STEM_E = True  # drop a final "e" after the rules: "hike"/"hiking", "dance"/"dancer" meet


_INFLECTIONS = frozenset(("s", "es", "ed", "ing", "ies", "ied"))


@lru_cache(maxsize=1 << 16)  # a user's words repeat: turns at ingest, questions and names per call
def stem(word: str) -> str:
    """A compact English stemmer: "painting"/"painted"/"paints"/"paintings" -> "paint", "hobbies" ->
    "hobby", "hike"/"hiking"/"hiked" -> "hik", "went" -> "go". A word's inflection comes off first and
    its stem is stemmed again, so "vacationed" meets "vacation" and "weddings" meets "wedding"."""
    word = _IRREGULAR.get(word, word)
    if len(word) <= 3 or not word.isascii() or word.isdigit():
        return word
    if word.endswith("'s"):
        word = word[:-2]
    out, suffix = _strip_suffix(word)
    if suffix in _INFLECTIONS:
        out = _strip_suffix(out)[0]
    if _STEM_E and len(out) > 3 and out.endswith("e") and not out.endswith("ee"):
        out = out[:-1]
    return out


def _strip_suffix(word: str) -> tuple[str, str]:
    """(the word without the first of _RULES' suffixes that applies, that suffix; "" when none does)."""
    for suffix, repl, min_len in _RULES:
        if word.endswith(suffix) and len(word) - len(suffix) >= min_len:
            base = word[: -len(suffix)]
            if not _VOWEL_RE.search(base):
                continue
            if suffix == "s" and base.endswith(("s", "u")):
                continue  # "dress", "campus": no plural's "s"
            if suffix in ("ion", "ions") and not base.endswith(("t", "s")):
                continue  # "adoption" -> "adopt", "discussion" -> "discuss"; not "onion", "region"
            if suffix == "ly" and base.endswith("i"):
                continue  # "family", "daily": not an adverb
            if suffix in ("er", "ers") and base.endswith("e"):
                continue  # "career", "volunteers": not "car", "volunt" (so "volunteering" meets "volunteer")
            if suffix in ("es",) and not base.endswith(("sh", "ch", "x", "s", "z")):
                base = word[:-1]  # "games" -> "game", "wishes" -> "wish"
            if suffix in ("ing", "ed", "er", "ers") and len(base) > 3 and base[-1] == base[-2] and base[-1] in _DOUBLE:
                base = base[:-1]  # "running" -> "run"
            return base + repl, suffix
    return word, ""


# Words of how a question is asked, not of what it is about.
QUESTION_WORDS = frozenset(stem(w) for w in (
    "kind type likely would think thing things something ever many much often long did does "
    "doing get got go went say said mention mentioned tell told"
).split())


def terms(text: str, *, stemmed: bool = True) -> list[str]:
    if stemmed:
        if len(_TERMS) > _TERMS_MAX:  # a bound on what hostile text can make it hold
            _TERMS.clear()
        return fastpath.word_terms(text, _TERMS, _stemmed_term)  # the words of _WORD_RE, each looked up once
    words = [w.split("'")[0] for found in _WORD_RE.findall(text.lower())
             for w in (scripts.pairs(found) if scripts.is_pair_run(found) else (scripts.as_typed(found),))]
    return [w for w in words if w and w not in STOPWORDS]


# A word's stemmed term, by the word (fastpath.word_terms fills it from _stemmed_term).
_TERMS: dict[str, str] = {}
_TERMS_MAX = 1 << 16


def _stemmed_term(word: str) -> str:
    """A matched word's stemmed term: "" for a stopword (what it says before an apostrophe)."""
    w = word.split("'")[0]
    return stem(w) if w and w not in STOPWORDS else ""


@lru_cache(maxsize=256)
def names_pattern(names: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(re.escape(n) for n in sorted(names, key=len, reverse=True))
                      + r")(?:['\u2019]s)?\b\s*", re.I)
