"""A long recalled turn packed as its best passage (sidecar/memory/episodic/passages.py): the pieces a
turn is cut into, the run of them that covers the query, and the passage as packed."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.memory.episodic.passages import (
    ELLIPSIS,
    best_passage,
    best_window,
    found_in,
    lowered,
    passage_cap,
    pieces,
    split_label,
)
from sidecar.tokens import count_line

FILLER = [f"Sentence {i} is about the weather in town number {i}." for i in range(120)]
NEEDLE = "The script has Andy wearing a bright yellow raincoat and rubber boots."


def test_a_turn_that_fits_is_not_cut():
    text = "assistant: " + " ".join(FILLER[:5])
    assert best_passage(text, count_line(text), 200, {"andi": 1.0}) is None
    assert best_passage(text, 10_000, 0, {"andi": 1.0}) is None  # no cap: whole turns only


def test_the_passage_covers_the_query_keeps_the_label_and_says_where_it_was_cut():
    body = " ".join([*FILLER[:60], NEEDLE, *FILLER[60:]])
    text = "[8 May 2023] assistant: " + body
    passage = best_passage(text, count_line(text), 120, {"andy": 2.0, "wear": 1.5, "raincoat": 3.0})
    assert passage is not None
    assert passage.startswith("[8 May 2023] assistant: " + ELLIPSIS + " ") and passage.endswith(" " + ELLIPSIS)
    assert NEEDLE in passage
    inner = passage[len("[8 May 2023] assistant: " + ELLIPSIS + " "):-len(" " + ELLIPSIS)]
    assert inner in body  # one contiguous run of the turn, as written
    assert count_line(passage) <= 130  # about the cap: sizes are estimated from characters per token


def test_no_query_term_in_the_turn_packs_its_opening():
    text = "Ann: " + " ".join(FILLER)
    passage = best_passage(text, count_line(text), 100, {"zebra": 1.0})
    assert passage is not None and passage.startswith("Ann: Sentence 0 is") and passage.endswith(ELLIPSIS)
    assert ELLIPSIS not in passage[:-1]


def test_the_heavier_term_wins_and_ties_go_to_the_earliest_run():
    sizes = [10] * 6
    found = [set(), {"rare"}, set(), {"common"}, set(), {"rare"}]
    assert best_window(sizes, found, {"rare": 3.0, "common": 1.0}, 10) == (1, 2)
    assert best_window(sizes, found, {"rare": 3.0, "common": 1.0}, 30) == (1, 4)  # both terms
    assert best_window(sizes, [set()] * 6, {"rare": 3.0}, 20) == (0, 2)
    assert best_window([50, 5], [set(), set()], {}, 10) == (0, 1)  # at least one piece, even too long


def _windows(sizes, found, weight, most):
    """best_window as specified: from each piece, the longest run that fits, scored afresh."""
    best, best_at = -1.0, (0, min(1, len(sizes)))
    for first in range(len(sizes)):
        last = first + 1
        while last < len(sizes) and sum(sizes[first:last + 1]) <= most:
            last += 1
        score = sum(weight[t] for t in set().union(*found[first:last]))
        if score > best + 1e-9:
            best, best_at = score, (first, last)
    return best_at


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.sets(st.sampled_from("abcde"), max_size=3)), min_size=1, max_size=25),
       st.integers(1, 120))
def test_the_sliding_window_equals_scoring_every_run(pieces_, most):
    weight = {"a": 1.0, "b": 2.0, "c": 0.5, "d": 4.0, "e": 1.5}
    sizes, found = [s for s, _ in pieces_], [f for _, f in pieces_]
    assert best_window(sizes, found, weight, most) == _windows(sizes, found, weight, most)


def test_pieces_are_sentences_and_lines_and_long_ones_are_cut_at_blanks():
    body = "First one here. Second!  Third?\nA line\n\n中文句子。第二句。 Last bit"
    assert [body[a:b] for a, b in pieces(body, 400)] == [
        "First one here.", "Second!", "Third?", "A line", "中文句子。", "第二句。", "Last bit"]
    log = "ERROR db timeout " * 40
    spans = pieces(log, 50)
    assert all(b - a <= 50 for a, b in spans) and len(spans) > 10
    assert " ".join(log[a:b] for a, b in spans) == log.strip()  # cut at blanks, nothing lost
    assert [b - a for a, b in pieces("x" * 100, 30)] == [30, 30, 30, 10]  # no blank: cut anyway


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab .!?\n。中 İ")), max_size=300), st.integers(1, 60))
def test_pieces_are_in_order_inside_the_body_and_within_bounds(body, most):
    spans = pieces(body, most)
    assert all(0 <= a < b <= len(body) for a, b in spans)
    assert all(b1 <= a2 for (_, b1), (a2, _) in itertools.pairwise(spans))
    assert all(b - a <= most for a, b in spans)
    covered = {i for a, b in spans for i in range(a, b)}
    assert all(body[i].isspace() or i in covered for i in range(len(body)) if body[i] not in "。")


def test_stems_are_found_at_word_starts():
    body = "Hobbies: I baked bread. Go to the goal. The bakery is closed. 我喜欢面包。"
    low = lowered(body)
    spans = pieces(body, 400)
    found = found_in(low, spans, {"hobby": 1.0, "bak": 1.0, "go": 1.0, "ake": 1.0, "面": 1.0})
    assert found == [{"hobby", "bak"},  # "Hobbies", "baked"; "ake" is inside a word
                     {"go"},  # "Go", not "goal": a short stem is a whole word
                     {"bak"}, {"面"}]
    assert lowered("İstanbul Ünal") == "İstanbul ünal"  # positions kept where lower() would grow


def test_the_cap_follows_the_budget():
    assert passage_cap(2000, 0.125, 96) == 250
    assert passage_cap(400, 0.125, 96) == 96
    assert passage_cap(2000, 0.0, 96) == 0
    assert split_label("[8 May 2023] Ann: hi: there") == len("[8 May 2023] Ann: ")
    assert split_label("no label here") == 0


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab cd.!?\n。中文 İ🙂x")), min_size=1, max_size=2000),
       st.integers(1, 400), st.sets(st.sampled_from(["ab", "cd", "中", "x", "ı"]), max_size=3))
def test_a_passage_is_the_label_and_one_run_of_the_turn_and_never_longer(body, cap, asked):
    text = "user: " + body
    tokens = count_line(text)
    passage = best_passage(text, tokens, cap, dict.fromkeys(asked, 1.0))
    if passage is None:
        return
    assert passage.startswith("user: ")
    inner = passage[len("user: "):]
    inner = inner.removeprefix(ELLIPSIS + " ").removesuffix(" " + ELLIPSIS)
    assert inner and inner in body
    assert count_line(passage) <= tokens + 2  # at most the two ellipses more than the whole turn
