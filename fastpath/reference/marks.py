"""Reference turn marks: what a turn says of its speaker (voice) and the words it capitalises inside
its sentences (capitalised), as regular expressions.

* ``voice``: the matches of ``_PERSON_RE`` (case-insensitive; the first of its alternatives that ends
  at a word boundary wins, so "I'm" is "I"), counted as first-person words ("I", "my", "we", "us",
  ...) or second-person ones ("you", "your", ...), and in Chinese each 我 first-person, each 你 or 您
  second-person: +1 when more first-person, -1 when more second-person, else 0. A word character is
  ``ch.isalnum() or ch == "_"``; under IGNORECASE "i" also matches "İ" and "ı", and "s" matches "ſ".
* ``capitalised``: an ASCII capital and the ASCII lower-case letters after it (at least one), where
  the character before the capital is no word character, the text does not start there, and no
  sentence ends just before it (".", "!" or "?" and a white space, or those and an opening ``"``);
  each such word lowercased, once, in the order first met.
"""

from __future__ import annotations

import re

__all__ = ["capitalised", "voice"]

# A word's first letter is looked for first, so the boundary and the alternatives are tried only where
# one stands.
_PERSON_RE = re.compile(r"(?=[imouwy])\b(i|i'm|i've|i'd|i'll|me|my|mine|myself|we|we're|we've|us|our|ours"
                        r"|(you|your|you're|you've|you'd|you'll|yours|yourself))\b", re.I)
# The capital is matched first and what stands before it checked behind it, so re skips to capitals
# instead of trying every position.
_CAPITAL_RE = re.compile(r"[A-Z](?<!\w[A-Z])(?<![.!?]\s[A-Z])(?<![.!?]\s\"[A-Z])(?<!^[A-Z])[a-z]+")


def voice(text: str) -> int:
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    found = _PERSON_RE.findall(text)  # (word, the word if second-person else "") each
    other = sum(1 for _, second in found if second)
    own = len(found) - other + text.count("我")
    other += text.count("你") + text.count("您")
    return (own > other) - (other > own)


def capitalised(text: str) -> tuple[str, ...]:
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    return tuple(dict.fromkeys(w.lower() for w in _CAPITAL_RE.findall(text)))
