"""fastpath._marks (a turn's voice and capitalised words) agrees exactly with fastpath.reference.marks
on any text: person words in any case, the letters IGNORECASE folds ("İ", "ı", "ſ"), word boundaries
of any script, sentence ends before a capital."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastpath
from fastpath import reference as ref
from tests.fastpath_checks import IMPLS

PIECES = [*"iI'mMyYoOuUrRwWeEsSvVdDlLfF .!?\"\n\t\u3000\u00a0Abc-_1²ıİſK\u212aéÉ中😀我你您", "you", "You", "YOUR", "yours",
          "yourself", "I'm", "I've", "i'd", "I'll", "we're", "We've", "our", "ours", "us", "me", "mine", "myself", "my",
          "we", "Ann", "Mel", "Mr. Smith", "! \"Hi", "? Ok", "Chicago"]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=40).map("".join) | st.text(max_size=60)


@settings(max_examples=3000, deadline=None)
@given(TEXTS)
def test_marks_match_reference(text):
    assert fastpath.voice(text) == ref.voice(text)
    assert fastpath.capitalised(text) == ref.capitalised(text)


@IMPLS
def test_marks_of_plain_turns(impl):
    assert impl.voice("I started pottery, my kids love it.") == 1
    assert impl.voice("You started pottery? Your kids must love it!") == -1
    assert impl.voice("I hear you.") == 0 and impl.voice("") == 0
    assert impl.voice("İ said ıt to uſ") == 1  # IGNORECASE's extra "i" and "s"
    assert impl.voice("my_self you") == -1  # "my_self" is one word, no "my"
    assert impl.voice("我昨天去了医院，医生说我要多休息。") == 1 and impl.voice("你应该多休息，您说呢？") == -1
    assert impl.voice("我觉得你说得对") == 0 and impl.voice("我们 you you") == -1
    assert impl.capitalised('Hey Mel! We read "Charlotte\'s Web" in Chicago. Wow. Ok') == (
        "mel", "charlotte", "web", "chicago")
    # Not the text's first word, an all-capitals one, one after a sentence's end or inside a word.
    assert impl.capitalised("Ann met Ann and ANN at Zoo.\u3000Then xYz") == ("ann", "zoo")
    assert impl.capitalised("the Über café in Paris_Berlin, 中Tokyo") == ("paris",)


@IMPLS
def test_long_hostile_turns(impl):
    log = "\n".join(f"2026-12-05T23:{i % 60:02d} ERROR Pod-{i} OOMKilled. Restarting you and me" for i in range(500))
    assert impl.voice(log) == 0 and impl.capitalised(log) == ("pod",)
    assert impl.voice("我" * 10_000 + " my") == 1 and impl.capitalised("😀 Word " * 5_000) == ("word",)


@IMPLS
def test_marks_reject_what_is_not_text(impl):
    with pytest.raises(TypeError, match="must be str"):
        impl.voice(b"I")
    with pytest.raises(TypeError, match="must be str"):
        impl.capitalised(None)
