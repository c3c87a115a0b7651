import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.memory.extract import MemoryCandidate, RuleBasedExtractor
from sidecar.memory.filters import (
    filter_candidates,
    is_low_information,
    near_duplicate,
    normalize_for_dedup,
)
from sidecar.textmodel import (
    _LONGEST_SMALL_TALK,
    _NOT_PHRASE_RE,
    _REPEAT_RE,
    _SMALL_TALK,
    _SPLIT_SMALL_TALK_RE,
    Turn,
    is_small_talk,
    meaningful_chars,
)


def cand(content: str, confidence: float = 0.9, ids: list[str] | None = None) -> MemoryCandidate:
    return MemoryCandidate("preference", content, "answer_style", confidence, "USER_STATED", ids or ["m1"])


@pytest.mark.parametrize(
    "text",
    [
        "嗯",
        "好的",
        "ok",
        "OK!",
        "thanks",
        "Thank you!",
        "谢谢",
        "收到",
        "hi",
        "👍👍",
        "🙂",
        "ok, thanks!",
        "好的，谢谢",
        "嗯嗯嗯",
        "哈哈哈哈",
        "ab",
        "  ",
        "",
        "...",
    ],
)
def test_low_information(text: str) -> None:
    assert is_low_information(text)


@pytest.mark.parametrize(
    "text",
    [
        "I prefer concise answers",
        "以后默认查测试环境",
        "ok, restart payment-api",
        "谢谢，以后用中文回答",
        "use vim",
    ],
)
def test_not_low_information(text: str) -> None:
    assert not is_low_information(text)


def test_meaningful_characters_are_exactly_isalnum() -> None:
    """The regexes that scan for meaningful characters agree with str.isalnum on every code point."""
    every = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c < 0xE000)
    assert meaningful_chars(every) == sum(1 for ch in every if ch.isalnum())
    assert _NOT_PHRASE_RE.sub("", every) == "".join(ch for ch in every if ch.isalnum() or ch == " ")


@pytest.mark.parametrize(("text", "small_talk"), [
    ("thanks! " * 30, True), ("ok " * 40, True), ("o" * 200 + "k", True), ("okkkkkkkkkkkkkkkkkkkkkkk", True),
    ("嗯" * 100, True), ("ok" * 40, False), ("好的" * 50, False), ("ok " * 5 + "deploy now", False)])
def test_small_talk_of_any_length(text: str, small_talk: bool) -> None:
    """Repeats of one character collapse however long the text is; a part that is no small talk counts."""
    assert len(text) > _LONGEST_SMALL_TALK
    assert is_small_talk(text) is small_talk


def test_each_reason_in_order() -> None:
    log = "2024-01-15 10:00:01 ERROR a\n2024-01-15 10:00:02 ERROR b\n2024-01-15 10:00:03 INFO c"
    cands = [
        cand("I prefer concise answers"),
        cand("好的"),
        cand("my password: hunter2 for prod"),
        cand(log),
        cand("maybe shorter answers", confidence=0.55),
        cand("ok", confidence=0.1),  # several failures: the first check's reason wins
        cand("password: hunter2", confidence=0.1),
    ]
    result = filter_candidates(cands)
    assert [c.content for c in result.accepted] == ["I prefer concise answers"]
    assert [r for _, r in result.rejected] == [
        "low_information",
        "secret",
        "raw_log",
        "low_confidence",
        "low_information",
        "secret",
    ]
    assert [c for c, _ in result.rejected] == cands[1:]


def test_min_confidence_is_configurable() -> None:
    c = cand("maybe shorter answers", confidence=0.55)
    assert filter_candidates([c], min_confidence=0.5).accepted == [c]
    assert filter_candidates([c]).rejected == [(c, "low_confidence")]


def test_small_talk_source_turn_rejects() -> None:
    c = cand("Prefers concise answers", ids=["m7"])
    assert filter_candidates([c], source_texts={"m7": "ok 👍"}).rejected == [(c, "low_information")]
    assert filter_candidates([c], source_texts={"m7": "I prefer concise answers"}).accepted == [c]
    assert filter_candidates([c], source_texts={}).accepted == [c]


def test_extractor_output_through_filter() -> None:
    turns = [
        Turn("1", "user", "I prefer concise answers."),
        Turn("2", "user", "From now on the staging password: Sup3rS3cret!"),
        Turn("3", "user", "maybe I'd like tables"),
    ]
    result = filter_candidates(RuleBasedExtractor().extract(turns))
    assert [c.source_message_ids for c in result.accepted] == [["1"]]
    assert sorted(r for _, r in result.rejected) == ["low_confidence", "secret"]


def test_normalize_for_dedup() -> None:
    assert normalize_for_dedup("  Hello,   World!! ") == "hello world"
    assert normalize_for_dedup("以后 默认，查测试环境。") == "以后默认查测试环境"
    assert normalize_for_dedup("Ｆｕｌｌｗｉｄｔｈ ＡＢＣ") == "fullwidth abc"
    assert normalize_for_dedup("foo_db is down") == "foo db is down"


@pytest.mark.parametrize(
    ("a", "b", "dup"),
    [
        ("I prefer concise answers", "i prefer concise answers!", True),
        ("I prefer concise answers", "I prefer concise answers, please", True),  # Jaccard 4/5
        ("I prefer concise answers", "I prefer concise answers in English please", False),
        ("Prefers concise answers in English", "prefers concise answers in english.", True),
        ("the user prefers concise short answers always", "the user prefers concise short answers", True),
        ("以后默认查测试环境", "以后默认查测试环境。", True),
        ("以后默认查测试环境", "以后默认查生产环境", False),
        ("We use postgres 15", "We use mysql 8", False),
        ("", "", True),
        ("", "x", False),
    ],
)
def test_near_duplicate(a: str, b: str, dup: bool) -> None:
    assert near_duplicate(a, b) is dup
    assert near_duplicate(b, a) is dup


def _small_talk_as_specified(text: str) -> bool:
    """is_small_talk read literally, the whole text at every step (what the early exits must equal)."""
    norm = unicodedata.normalize("NFKC", text).lower().strip()
    if not norm or meaningful_chars(norm) == 0:
        return True

    def phrase(p: str) -> bool:
        core = _NOT_PHRASE_RE.sub("", p).strip()
        return any(form in _SMALL_TALK for form in (core, _REPEAT_RE.sub(r"\1", core), _REPEAT_RE.sub(r"\1\1", core)))

    if phrase(norm):
        return True
    parts = [p for p in _SPLIT_SMALL_TALK_RE.split(norm) if meaningful_chars(p)]
    return bool(parts) and all(phrase(p) for p in parts)


_PIECES = st.sampled_from(sorted(_SMALL_TALK) + ["deploy", "prod", "a", "z", "哈", "👍", "_", " ", ", ", "!", "\n",
                                                  "…", "ＯＫ", "ｏｋ", "kk", "o", "k", "。", "-", "1"])


@settings(max_examples=3000, deadline=None)
@given(st.lists(_PIECES, max_size=40).map("".join) | st.text(max_size=120)
       | st.tuples(_PIECES, st.integers(1, 200)).map(lambda p: p[0] * p[1]))
def test_small_talk_and_low_information_equal_their_whole_text_reading(text: str) -> None:
    """The early exits (a long turn's head, its first part, its third meaningful character) change no answer."""
    assert is_small_talk(text) is _small_talk_as_specified(text)
    assert is_low_information(text) is (meaningful_chars(text) < 3 or _small_talk_as_specified(text))
