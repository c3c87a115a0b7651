"""What a lexical term is in every script: the one definition the lexical indexes share (episodic
recall's fastpath.word_terms and its twin, sidecar.text's terms of memories and knowledge).

Each character of a lowercased text is, by its code point:

* WORD: an ASCII letter or digit, or above ASCII a letter, digit or combining mark (``isalnum()`` or
  Unicode category M*) of a script that puts spaces between words (Latin with its accents, Cyrillic,
  Greek, Arabic, Hebrew, Devanagari...): consecutive WORD characters are one word ("münchen",
  "москве", "हूँ" with its vowel signs);
* SINGLE: a CJK ideograph, kana or Hangul syllable: a term of its own, as those scripts run words
  together (U+3040-U+30FF, U+3400-U+4DBF, U+4E00-U+9FFF, U+F900-U+FAFF, the Hangul syllables
  U+AC00-U+D7A3, and above the BMP U+20000-U+3FFFF);
* PAIR: a letter or mark of Thai, Lao, Myanmar or Khmer, scripts without spaces whose single letters
  say little: a run of them gives its overlapping pairs of characters ("กรุง" -> "กร", "รุ", "ุง");
* SEPARATOR: anything else (blanks, punctuation, symbols, emoji, other characters above the BMP).
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

SEPARATOR, WORD, SINGLE, PAIR = 0, 1, 2, 3
BMP = 0x10000
SINGLE_RANGES = ((0x3040, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xAC00, 0xD7A3))
ASTRAL_SINGLE = (0x20000, 0x3FFFF)
PAIR_RANGES = ((0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF))


@lru_cache(maxsize=1)
def kinds() -> bytes:
    """The kind of each BMP code point (bytes of 65,536; built once, ~40 ms)."""
    out = bytearray(BMP)
    for cp in (*range(0x30, 0x3A), *range(0x61, 0x7B)):
        out[cp] = WORD
    for cp in range(0x80, BMP):
        ch = chr(cp)
        if ch.isalnum() or unicodedata.category(ch)[0] == "M":
            out[cp] = WORD
    for lo, hi in PAIR_RANGES:
        for cp in range(lo, hi + 1):
            out[cp] = PAIR if out[cp] == WORD else SEPARATOR
    for lo, hi in SINGLE_RANGES[:4]:  # every code point of the CJK ranges, as the lexical index always took them
        out[lo:hi + 1] = bytes([SINGLE]) * (hi + 1 - lo)
    lo, hi = SINGLE_RANGES[4]
    for cp in range(lo, hi + 1):
        out[cp] = SINGLE if out[cp] == WORD else SEPARATOR
    return bytes(out)


def kind(cp: int) -> int:
    """The kind of any code point."""
    if cp < BMP:
        return kinds()[cp]
    return SINGLE if ASTRAL_SINGLE[0] <= cp <= ASTRAL_SINGLE[1] else SEPARATOR


@lru_cache(maxsize=4)
def char_class(of: int, ascii_too: bool = True) -> str:
    """The code points of one kind as the inside of a regex character class ("0-9a-z\\u00aa..."),
    ASCII ones left out unless ascii_too."""
    table = kinds()
    parts: list[str] = []
    cp = 0 if ascii_too else 0x80
    while cp < BMP:
        if table[cp] != of:
            cp += 1
            continue
        end = cp
        while end + 1 < BMP and table[end + 1] == of:
            end += 1
        parts.append(_escaped(cp) if end == cp else f"{_escaped(cp)}-{_escaped(end)}")
        cp = end + 1
    if of == SINGLE:
        parts.append(f"{_escaped(ASTRAL_SINGLE[0])}-{_escaped(ASTRAL_SINGLE[1])}")
    return "".join(parts)


def _escaped(cp: int) -> str:
    return f"\\U{cp:08x}" if cp >= BMP else f"\\u{cp:04x}"


APOSTROPHES = "'\u2019"  # "'", and the typographic one phones and editors write ("don’t")


@lru_cache(maxsize=1)
def term_word_re() -> re.Pattern[str]:
    """The words of episodic recall's index in a lowercased text: a run of WORD characters with an
    optional apostrophe and the letters after it ("don't": no digits after it), a SINGLE character, or
    a run of PAIR characters (pairs()). A word's typographic apostrophe is read as "'" (as_typed())."""
    word, letter = char_class(WORD), "a-z" + char_class(WORD, ascii_too=False)
    return re.compile(f"[{word}]+(?:[{APOSTROPHES}][{letter}]+)?|[{char_class(SINGLE)}]|[{char_class(PAIR)}]+")


_TYPOGRAPHIC = str.maketrans({"\u2019": "'"})


def as_typed(word: str) -> str:
    """A word (or any text) with its typographic apostrophes written "'"."""
    return word.translate(_TYPOGRAPHIC)


def pairs(run: str) -> list[str]:
    """A run of PAIR characters as its terms: its overlapping pairs (a single character alone)."""
    return [run] if len(run) < 2 else [run[i:i + 2] for i in range(len(run) - 1)]


def is_pair_run(word: str) -> bool:
    """Whether a match of term_word_re (or of sidecar.text's pattern) is a run of PAIR characters."""
    return kind(ord(word[0])) == PAIR
