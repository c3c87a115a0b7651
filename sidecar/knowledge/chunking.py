"""Split a document into token-bounded chunks for retrieval.

Markdown is split into sections on ATX headings (``#`` .. ``######``, ignored inside fenced code)
and each chunk carries its heading path ("Runbook > Restart payment-api"); plain text is one
section without a heading. Within a section whole paragraphs are packed up to ``max_tokens``; a
longer paragraph is split on sentence boundaries and a longer sentence into character windows.
Consecutive chunks of a section repeat up to ``overlap_tokens`` of the previous chunk's trailing
sentences so a fact cut at a boundary is still whole in one chunk.

Chunk text is a slice of the input (paragraphs joined by a blank line), so ``Chunk.tokens`` is
``count_tokens(Chunk.text)`` and never exceeds ``max_tokens``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

# A single code point is at most 4 byte-level BPE tokens, so any budget from here on can always
# make progress with one-character windows.
MIN_MAX_TOKENS = 8
HEADING_SEPARATOR = " > "
PARAGRAPH_SEPARATOR = "\n\n"

# ASCII terminators only count before whitespace so "payment-api.v2" and "3.14" stay whole; CJK
# terminators end a sentence right away. Closing quotes/brackets stay with their sentence.
_SENTENCE_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)|[。！？]+[\"'”’)\]」』]*|\n")
_BLANK_LINE = re.compile(r"\n[ \t\r\f\v]*\n")
_ATX_HEADING = re.compile(r" {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t\r]*")
_FENCE_OPEN = re.compile(r" {0,3}(`{3,}|~{3,})")
_FENCE_CLOSE = re.compile(r" {0,3}(`{3,}|~{3,})[ \t\r]*")

Span = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Chunk:
    index: int
    heading: str
    text: str
    tokens: int


class _Piece(NamedTuple):
    """A stripped span of the input that is packed as a unit; ``para`` groups pieces that are joined
    without a paragraph separator."""

    start: int
    end: int
    para: int
    tokens: int
    whole_paragraph: bool


def chunk_document(
    text: str,
    *,
    markdown: bool,
    max_tokens: int = 400,
    overlap_tokens: int = 40,
    count_tokens: Callable[[str], int],
) -> list[Chunk]:
    if max_tokens < MIN_MAX_TOKENS:
        raise ValueError(f"max_tokens must be at least {MIN_MAX_TOKENS}, got {max_tokens}")
    if overlap_tokens < 0:
        raise ValueError(f"overlap_tokens must be >= 0, got {overlap_tokens}")
    # Overlap above half the budget would leave chunks mostly repeated text (and the default of 40
    # must not break a small max_tokens), so it is capped rather than rejected.
    packer = _Packer(text, max_tokens, min(overlap_tokens, max_tokens // 2), count_tokens)
    sections = _markdown_sections(text) if markdown else [("", _plain_paragraphs(text))]
    chunks: list[Chunk] = []
    for heading, paragraphs in sections:
        for body, tokens in packer.pack(paragraphs):
            chunks.append(Chunk(index=len(chunks), heading=heading, text=body, tokens=tokens))
    return chunks


def sentence_spans(text: str, start: int = 0, end: int | None = None) -> list[Span]:
    """Stripped, non-empty sentence spans of ``text[start:end]``, in order."""
    end = len(text) if end is None else end
    spans: list[Span] = []
    pos = start
    for match in _SENTENCE_END.finditer(text, start, end):
        _append_stripped(spans, text, pos, match.end())
        pos = match.end()
    _append_stripped(spans, text, pos, end)
    return spans


def split_sentences(text: str) -> list[str]:
    return [text[s:e] for s, e in sentence_spans(text)]


def _append_stripped(spans: list[Span], text: str, start: int, end: int) -> None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if start < end:
        spans.append((start, end))


def _plain_paragraphs(text: str) -> list[Span]:
    spans: list[Span] = []
    pos = 0
    for match in _BLANK_LINE.finditer(text):
        _append_stripped(spans, text, pos, match.start())
        pos = match.end()
    _append_stripped(spans, text, pos, len(text))
    return spans


def _markdown_sections(text: str) -> list[tuple[str, list[Span]]]:
    """(heading path, paragraph spans) per section, found in one pass over the lines. Heading lines
    are not part of any paragraph; blank lines inside a fenced code block do not end a paragraph."""
    sections: list[tuple[str, list[Span]]] = []
    path: list[tuple[int, str]] = []
    heading = ""
    paragraphs: list[Span] = []
    para_start = -1
    para_end = 0
    fence: tuple[str, int] | None = None
    line_start = 0
    for line in text.split("\n"):
        line_end = line_start + len(line)
        next_start = line_end + 1
        if fence is None:
            match = _ATX_HEADING.fullmatch(line) if line.lstrip(" ").startswith("#") else None
            if match is not None or not line.strip():
                if para_start >= 0:
                    _append_stripped(paragraphs, text, para_start, para_end)
                    para_start = -1
                if match is not None:
                    if paragraphs:
                        sections.append((heading, paragraphs))
                        paragraphs = []
                    level = len(match.group(1))
                    while path and path[-1][0] >= level:
                        path.pop()
                    path.append((level, (match.group(2) or "").strip()))
                    heading = HEADING_SEPARATOR.join(title for _, title in path if title)
                line_start = next_start
                continue
            opening = _FENCE_OPEN.match(line)
            if opening is not None:
                fence = (opening.group(1)[0], len(opening.group(1)))
        else:
            closing = _FENCE_CLOSE.fullmatch(line)
            if closing is not None and closing.group(1)[0] == fence[0] and len(closing.group(1)) >= fence[1]:
                fence = None
        if para_start < 0:
            para_start = line_start
        para_end = line_end
        line_start = next_start
    if para_start >= 0:
        _append_stripped(paragraphs, text, para_start, para_end)
    if paragraphs:
        sections.append((heading, paragraphs))
    return sections


class _Packer:
    def __init__(self, text: str, max_tokens: int, overlap_tokens: int, count: Callable[[str], int]) -> None:
        self.text = text
        self.max_tokens = max_tokens
        self.overlap_tokens = overlap_tokens
        self.count = count

    def pack(self, paragraphs: list[Span]) -> list[tuple[str, int]]:
        """(chunk text, tokens) for one section."""
        pieces = self._pieces(paragraphs)
        out: list[tuple[str, int]] = []
        overlap: list[_Piece] = []
        i = 0
        while i < len(pieces):
            current = list(overlap)
            # The first new piece always goes in (shedding overlap to make room), so every round
            # advances; later pieces go in while the estimate stays within budget.
            while current and _estimate(current) + _join_cost(current, pieces[i]) > self.max_tokens:
                current.pop(0)
            added = 0
            estimate = _estimate(current)
            while i < len(pieces):
                cost = _join_cost(current, pieces[i])
                if added and estimate + cost > self.max_tokens:
                    break
                current.append(pieces[i])
                estimate += cost
                i += 1
                added += 1
            # The estimate sums separately counted pieces; BPE merges across a join can differ, so
            # the real count decides: give back new pieces first, then shed overlap.
            while True:
                body = self._render(current)
                tokens = self.count(body)
                if tokens <= self.max_tokens or len(current) == 1:
                    break
                if added > 1:
                    current.pop()
                    i -= 1
                    added -= 1
                else:
                    current.pop(0)
            out.append((body, tokens))
            overlap = self._trailing(current) if self.overlap_tokens else []
        return out

    def _pieces(self, paragraphs: list[Span]) -> list[_Piece]:
        text, count, limit = self.text, self.count, self.max_tokens
        pieces: list[_Piece] = []
        for para, (start, end) in enumerate(paragraphs):
            tokens = count(text[start:end])
            if tokens <= limit:
                pieces.append(_Piece(start, end, para, tokens, True))
                continue
            for s, e in sentence_spans(text, start, end):
                n = count(text[s:e])
                if n <= limit:
                    pieces.append(_Piece(s, e, para, n, False))
                else:
                    pieces.extend(_Piece(ws, we, para, wn, False) for ws, we, wn in self._windows(s, e))
        return pieces

    def _windows(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """Character windows of one over-long sentence, each within budget, preferring to cut at
        whitespace. Sizes come from the running characters-per-token ratio, so each window costs
        about one or two counts rather than a binary search."""
        text, count, limit = self.text, self.count, self.max_tokens
        windows: list[tuple[int, int, int]] = []
        sample = text[start : min(end, start + 8 * limit)]
        chars_per_token = len(sample) / max(1, count(sample))
        pos = start
        while pos < end:
            while pos < end and text[pos].isspace():
                pos += 1
            if pos >= end:
                break
            size = max(1, min(end - pos, int(limit * chars_per_token * 0.9)))
            if pos + size < end:
                # Cut after the last whitespace in the back half of the window, if there is one.
                cut = _last_whitespace(text, pos + size // 2, pos + size)
                if cut > 0:
                    size = cut - pos
            while True:
                spans: list[Span] = []
                _append_stripped(spans, text, pos, pos + size)
                s, e = spans[0]
                n = count(text[s:e])
                if n <= limit or size == 1:
                    break
                size = max(1, min(size - 1, int(size * limit / n * 0.9)))
            windows.append((s, e, n))
            chars_per_token = max(chars_per_token * 0.5, (e - s) / max(1, n))
            pos = pos + size
        return windows

    def _trailing(self, chunk: list[_Piece]) -> list[_Piece]:
        """The longest run of trailing sentences of a chunk within the overlap budget."""
        text, count = self.text, self.count
        tail: list[_Piece] = []
        used = 0
        for piece in reversed(chunk):
            if piece.whole_paragraph:
                spans = sentence_spans(text, piece.start, piece.end)
                candidates = [(s, e, None) for s, e in spans]
            else:
                candidates = [(piece.start, piece.end, piece.tokens)]
            for s, e, n in reversed(candidates):
                n = count(text[s:e]) if n is None else n
                cost = n + (1 if tail and tail[-1].para != piece.para else 0)
                if used + cost > self.overlap_tokens:
                    tail.reverse()
                    return tail
                tail.append(_Piece(s, e, piece.para, n, False))
                used += cost
        tail.reverse()
        return tail

    def _render(self, pieces: list[_Piece]) -> str:
        # Pieces are contiguous in document order, so each paragraph's run is one slice.
        parts: list[str] = []
        run_start = pieces[0].start
        for prev, piece in zip(pieces, pieces[1:], strict=False):
            if piece.para != prev.para:
                parts.append(self.text[run_start : prev.end])
                run_start = piece.start
        parts.append(self.text[run_start : pieces[-1].end])
        return PARAGRAPH_SEPARATOR.join(parts)


def _join_cost(current: list[_Piece], piece: _Piece) -> int:
    # A paragraph separator is about one token; within a paragraph the original spacing merges
    # into the next word's token.
    return piece.tokens + (1 if current and current[-1].para != piece.para else 0)


def _estimate(pieces: list[_Piece]) -> int:
    return sum(p.tokens for p in pieces) + sum(
        1 for a, b in zip(pieces, pieces[1:], strict=False) if a.para != b.para
    )


def _last_whitespace(text: str, lo: int, hi: int) -> int:
    """Index just after the last whitespace in text[lo:hi], or 0 when there is none."""
    for i in range(hi - 1, lo - 1, -1):
        if text[i].isspace():
            return i + 1
    return 0
