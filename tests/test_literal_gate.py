"""The literal gate (sidecar.literal_gate) never changes a regex's answer: every text a pattern
matches holds one of the pattern's necessary literals, case folding included, for the rules it
guards (constraint detection), the extractor's cue lists and patterns built to be awkward."""

from __future__ import annotations

import re
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.compress import constraints
from sidecar.literal_gate import (
    _TO_ASCII,
    GatedPattern,
    can_match_ascii,
    necessary_literal_sets,
    necessary_literals,
)
from sidecar.memory import extract

GUARDED = {
    "extract.any_cue": extract._ANY_CUE_RE, "extract.episode_cue": extract._EPISODE_CUE_RE,
    **{f"constraints.{i}": rx for i, rx in enumerate(
        [*constraints._CN_RULES, *constraints._EN_RULES, *constraints._PERMISSION_RULES])},
}
AWKWARD = [re.compile(p, f) for p, f in [
    (r"\bfoo\s+(?:bar|baz)+\b", re.I), (r"(?<!x)ab(?=c)c", 0), (r"x{2,}yz|w+yz", re.I), (r"(?:ab)?cd", 0),
    (r"\bincident\b|sev[-\s]?[0-4]", re.I), (r"(?:a|b)(?:cc|dd)", re.I), (r"caf\u00e9", re.I), (r"ß", re.I),
]]


def test_the_letters_ignorecase_matches_outside_ascii_are_all_mapped():
    beyond = {chr(i) for i in range(128, sys.maxunicode + 1) if re.match("[a-z]", chr(i), re.I)}
    assert beyond == {chr(k) for k in _TO_ASCII}
    for ch, letter in _TO_ASCII.items():
        assert re.fullmatch(letter, chr(ch), re.I)


@pytest.mark.parametrize(("pattern", "flags", "literals"), [
    (r"\bfoo\s+(?:bar|baz)\b", re.I, {"foo"}),
    (r"\bi\s+(?:usually|always)\b", re.I, {"usually", "always"}),
    (r"(?:ab)?cd", 0, {"cd"}),
    (r"Root[\s-]?Cause", re.I, {"cause"}),
    (r"a*|b", 0, None),
    (r"(?i:x)yz", 0, None),  # case toggled inside: no gate
    (r"\u00c9t\u00e9", re.I, None),  # a cased non-ASCII letter: no gate
    (r"禁止|严禁", 0, {"禁止", "严禁"}),
])
def test_literals_read_off_a_pattern(pattern, flags, literals):
    found = necessary_literals(re.compile(pattern, flags))
    assert (set(found) if found is not None else None) == literals


@pytest.mark.parametrize(("pattern", "flags", "gates"), [
    (r"\bthe\s+fix\s+was\b", re.I, [{"the"}, {"fix"}, {"was"}]),  # all three: "fix" rules out most texts
    (r"\bi\s+(?:usually|always)\b", re.I, [{"usually", "always"}, {"i"}]),  # the rarer first
    (r"(?:ab)?cd", 0, [{"cd"}]),
    (r"a*|b", 0, []),
    (r"\u00c9t\u00e9", re.I, []),
    (r"我们(?:用|使用)\w+", 0, [{"我们"}, {"用", "使用"}]),
])
def test_literal_sets_read_off_a_pattern(pattern, flags, gates):
    assert [set(g) for g in necessary_literal_sets(re.compile(pattern, flags))] == gates


def test_a_pattern_needing_a_non_ascii_literal_cannot_match_ascii_text():
    assert not can_match_ascii(necessary_literal_sets(re.compile(r"禁止\s*restart")))
    assert can_match_ascii(necessary_literal_sets(re.compile(r"禁止|never", re.I)))
    rule = GatedPattern(re.compile(r"不要|严禁"))
    assert not rule.ascii_ok and rule.search("不要重启") and not rule.search("do not restart")


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_every_guarded_pattern_has_a_gate(name):
    assert GatedPattern(GUARDED[name]).gates


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
@pytest.mark.parametrize("rx", [*GUARDED.values(), *AWKWARD], ids=[*GUARDED, *(p.pattern for p in AWKWARD)])
def test_a_text_the_pattern_matches_passes_its_gate(rx, data):
    gated = GatedPattern(rx)
    try:
        strategy = st.from_regex(rx)
    except Exception:  # lookbehinds: hypothesis cannot generate them; the corpus test covers these
        strategy = st.from_regex(re.compile(re.sub(r"\(\?<[!=](?:[^()]|\([^()]*\))*\)", "", rx.pattern), rx.flags))
    text = data.draw(strategy)
    noise = data.draw(st.sampled_from(["", "İ", "ſ", "\u212a", "Ünïcödé ", "日本"]))
    for variant in (text, noise + text, text.upper(), text.swapcase() + noise):
        assert _span(gated.search(variant)) == _span(rx.search(variant)), variant


def _span(m: re.Match[str] | None) -> tuple[int, int] | None:
    return m.span() if m else None


CORPUS = [
    "Please don't restart prod.", "I DON\u2019T want anyone touching staging", "INCİDENT on the api", "ſev-1 fired",
    "the \u212aafka outage was caused by a bad config", "我们的服务不要重启", "you may now deploy the fix",
    "I usually jog every morning", "Never mind.", "Only use the read replica", "no writes during the freeze",
    "It's okay to reboot staging now", "根因是配置错误", "The fix was to roll back", "what do you think?",
]


@pytest.mark.parametrize("name", sorted(GUARDED))
def test_the_gate_answers_as_the_pattern_on_a_corpus(name):
    rx = GUARDED[name]
    gated = GatedPattern(rx)
    for text in CORPUS + [t.lower() for t in CORPUS] + [t.upper() for t in CORPUS]:
        assert bool(gated.search(text)) == bool(rx.search(text)), text
