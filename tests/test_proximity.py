"""Term proximity (sidecar/memory/episodic/proximity.py): a turn saying the query's neighbouring terms
close together ranks above one saying the same words apart, in process and over gRPC; the turns read
again per query are bounded, and hostile long turns neither crash nor slow a call without bound."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_episodic import MAY_8, _index

from sidecar.memory.episodic import DEFAULT_RANKING
from sidecar.memory.episodic.proximity import close_counts, pair_key, query_pairs

DAY_MS = 86_400_000
# The same words, the asked pair ("high school") together in the first and apart in the second.
CLOSE = "my high school friends planned a reunion dinner downtown near the old brick"
APART = "my high friends planned a reunion dinner downtown near the old brick school"
QUESTION = "Should I go to my high school reunion?"


def test_query_pairs_are_neighbouring_terms_each_once():
    assert query_pairs(["high", "school", "reunion"]) == [("high", "school"), ("school", "reunion")]
    assert query_pairs(["high", "school", "high", "school"]) == [("high", "school")]  # either order, once
    assert query_pairs(["tea", "tea"]) == [] and query_pairs(["tea"]) == []


def test_close_counts_count_each_occurrence_near_the_other():
    seq = "a x b y z w b a".split()
    # a@0 with b@2, a@7 with b@6; a@0-b@6 and a@7-b@2 are too far; x@1 and w@5 are four apart.
    assert close_counts(seq, [("a", "b"), ("x", "w"), ("a", "q")], 3) == [2, 0, 0]
    assert close_counts(seq, [("x", "w")], 4) == [1]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from("abcd"), max_size=40), st.integers(0, 6))
def test_close_counts_equal_counting_every_pair_of_positions(seq, gap):
    pairs = [("a", "b"), ("c", "d"), ("a", "c")]
    plain = [sum(1 for i, s in enumerate(seq) for j, t in enumerate(seq) if s == x and t == y and abs(i - j) <= gap)
             for x, y in pairs]
    assert close_counts(seq, pairs, gap) == plain


def _two_sessions(first: str, second: str):
    return _index([(MAY_8, [("Ann", first), ("Bob", "Nice.")]), (MAY_8 + DAY_MS, [("Ann", second), ("Bob", "Nice.")])])


def test_a_turn_saying_the_asked_words_together_ranks_first():
    state = _two_sessions(APART, CLOSE)  # the close one second: a tie would put the first ahead
    r = DEFAULT_RANKING
    near = state.rank(QUESTION, None, "", r)
    flat = state.rank(QUESTION, None, "", replace(r, proximity_weight=0.0))
    assert flat[2] == pytest.approx(flat[0])  # the same words: without proximity, the same score
    assert near[2] > near[0]
    postings = state.proximity_postings(["high", "school", "reunion"], flat, r)
    assert list(postings) == [pair_key("high", "school"), pair_key("school", "reunion")]
    rows, counts = postings[pair_key("high", "school")]
    assert rows.tolist() == [2] and counts.tolist() == [1.0]
    assert postings[pair_key("school", "reunion")][0].tolist() == [2]  # school@1, reunion@4 in CLOSE


def test_the_turns_read_again_are_bounded_and_read_best_first():
    state = _two_sessions(CLOSE, CLOSE)
    r = replace(DEFAULT_RANKING, proximity_chars=len(state.texts[0]) + 5)  # room for one of the two
    score = state.rank(QUESTION, None, "", replace(r, proximity_weight=0.0))
    score[2] *= 2  # the second session's turn scored higher: it is the one read
    rows, _ = state.proximity_postings(["high", "school"], score, r)[pair_key("high", "school")]
    assert rows.tolist() == [2]
    assert state.proximity_postings(["high", "school"], score, replace(r, proximity_chars=10)) == {}


def test_served_recall_packs_the_turn_saying_the_words_together_and_survives_hostile_turns(tmp_path):
    """Over gRPC, a user whose history says "high" and "school" apart in several turns and together in
    one: under a budget that holds one turn, that one is packed (a turn saying the other words more
    often was packed before). Then a pasted log of 6.6 KB repeating the asked words (every pair close,
    hundreds of times), read again, and one of 250 KB, over the bound: the next question is answered
    from the logs, on the same user."""
    from conftest import Running

    from sidecar.api import context_service_pb2 as pb

    running = Running(str(tmp_path / "near.duckdb"))
    try:
        stub = running.stub
        scope = pb.Scope(tenant_id="t", user_id="ann")

        def tell(text: str, day: int) -> None:
            sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
            stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
                pb.NewMessage(role=pb.ROLE_USER, text=text, client_timestamp_ms=1_683_504_000_000 + day * DAY_MS)]))

        def ask(question: str, tokens: int) -> list[pb.ContextItem]:
            sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
            resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=question, budget=pb.Budget(
                max_input=tokens + 200, reserved_for_output=0, memories=tokens, recent_messages=0, flow_unused=False)))
            return [it for s in resp.sections for it in s.items if it.source.startswith("message:")]

        # Saying "reunion" twice and "school reunion" together, but "high" apart: more of the words,
        # fewer of the pairs (the hashed n-grams of the dense part already favour CLOSE over APART).
        apart = "my high friends planned a reunion dinner downtown near the old school reunion"
        for day, place in enumerate(("uptown", "midtown", "crosstown")):  # no two alike (dedup)
            tell(apart.replace("downtown", place), day)
        tell(CLOSE, 3)
        assert [it.text for it in ask(QUESTION, 30)] == ["user: " + CLOSE]

        tell("ERROR high school reunion timeout at node 7\n" * 150, 4)  # 6.6 KB: read again
        tell("WARN high school reunion retry\n" * 8_000, 5)  # ~250 KB: over the bound, not read again
        recalled = ask("Which high school reunion logs say timeout?", 1500)
        assert "timeout" in max(recalled, key=lambda it: it.score).text
    finally:
        running.stop()
