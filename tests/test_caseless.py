"""CaselessPattern answers as its IGNORECASE pattern does, on any text."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastpath.reference.marks import _PERSON_RE
from sidecar.caseless import CaselessPattern, alternatives
from sidecar.compress.summarize import _DECISION, _ERROR, _NUMBER
from sidecar.memory.extract import _ANY_CUE_RE, _EPISODE_CUE_RE

# Besides the patterns in use, one whose "|" sit inside sets, escapes and groups.
TRICKY = re.compile(r"\bprefer\b|[]|]like|our\|team|(?:usually|every)\s+morning|[^]|a-z]?out\b|k", re.I)
PATTERNS = [_ANY_CUE_RE, _EPISODE_CUE_RE, _PERSON_RE, TRICKY, _DECISION.rx, _NUMBER.rx, _ERROR.rx]
# Texts made of the patterns' own words in any case, beside what folds oddly (dotless i, long s,
# the Kelvin sign), CJK cues and emoji.
WORDS = st.sampled_from(["I", "i'm", "We", "YOU", "your", "prefer", "Like", "usually", "Every", "morning", "our",
                         "team", "owns", "JIRA-12", "30ms", "v1.2", "504", "Timed out", "Rolled back", "Incident", "outage", "SEV-1", "p1", "paged", "root", "cause", "Fixed",
                         "by", "turned", "out", "]like", "|", "our|team", "]out", "ı", "ſ", "K", "\u212a", "故障", "我习惯", "以后", "😀", "'", "-",
                         " ", "  ", "\n", ".", "?"])
TEXTS = st.lists(WORDS, max_size=30).map(" ".join) | st.text(max_size=60)


@settings(max_examples=1000, deadline=None)
@given(TEXTS)
def test_it_finds_what_the_pattern_finds_where_it_finds_it(text):
    for rx in PATTERNS:
        p = CaselessPattern(rx)
        assert p.found(text) == (rx.search(text) is not None)
        assert [m.span() for m in p.finditer(text)] == [m.span() for m in rx.finditer(text)]  # so findall's groups
        assert [_lowered(g) for g in p.findall(text)] == [_lowered(g) for g in rx.findall(text)]
        assert [m.span() for m in p.finditer(text)] == [m.span() for m in rx.finditer(text)]
        assert [m.lastindex for m in p.finditer(text)] == [m.lastindex for m in rx.finditer(text)]


def _lowered(groups: str | tuple[str, ...]) -> tuple[str, ...]:
    """findall's groups as a case-blind comparison sees them (on ASCII text they are the lowered text's)."""
    return tuple(g.lower() for g in ((groups,) if isinstance(groups, str) else groups))


@pytest.mark.parametrize("pattern", ["Foo", r"[A-Z]x", "k\u212a", "ſ", r"(?:bar|Baz)"])
def test_a_pattern_with_a_letter_lowering_could_miss_is_refused(pattern):
    with pytest.raises(ValueError):
        CaselessPattern(re.compile(pattern, re.I))


def test_a_pattern_that_ignores_no_case_is_refused():
    with pytest.raises(ValueError):
        CaselessPattern(re.compile("foo"))


def test_found_asks_each_top_level_alternative_behind_its_gate():
    assert alternatives(TRICKY) == [r"\bprefer\b", "[]|]like", r"our\|team", r"(?:usually|every)\s+morning",
                                    r"[^]|a-z]?out\b", "k"]
    assert len(alternatives(_ANY_CUE_RE)) > 40 and "|".join(alternatives(_ANY_CUE_RE)) == _ANY_CUE_RE.pattern
    # A split that would not parse as the pattern does (re factors out a common prefix) keeps it whole.
    assert alternatives(re.compile("ab|ac", re.I)) == ["ab|ac"] and alternatives(_PERSON_RE) == [_PERSON_RE.pattern]
    assert alternatives(re.compile(r"(x)y|z\1", re.I)) == [r"(x)y|z\1"]  # "z\1" alone refers to no group
