"""BuildContext through the real server: budgets, hard zone, dedup, order, prefix hash, render."""

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastpath
from sidecar import tokens
from sidecar.api import context_service_pb2 as pb
from sidecar.assembly.builder import _keep_history_whole
from sidecar.assembly.candidates import CandidateBatch, Section, SoftCategory
from tests.grpc_assert import expect_status

RULES = "You are OpsPilot. Read-only unless a human approves a write."
TOOLS = [pb.ToolSchema(name="query_logs", description="Query service logs",
                       schema_json='{"serviceId":"string","env":"string","timeRange":"string"}')]


def _append(stub, scope, sid, *texts, role=pb.ROLE_USER):
    return stub.AppendMessages(pb.AppendMessagesRequest(
        scope=scope, session_id=sid, messages=[pb.NewMessage(role=role, text=t) for t in texts])).messages


def _build(stub, scope, sid, **kw):
    kw.setdefault("system_rules", RULES)
    kw.setdefault("tools", TOOLS)
    return stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, **kw))


def _section(resp, kind):
    return next((s for s in resp.sections if s.kind == kind), pb.Section())


@pytest.mark.parametrize("layout", [pb.LAYOUT_CACHE_AWARE, pb.LAYOUT_CLASSIC])
def test_recent_messages_in_conversational_order_newest_kept(stub, scope, session_id, layout):
    sent = _append(stub, scope, session_id, *[f"turn {i}: checking payment-api shard {i}" for i in range(40)])
    resp = _build(stub, scope, session_id, query="what next?", budget=pb.Budget(recent_messages=120), layout=layout)
    items = _section(resp, pb.SECTION_KIND_RECENT_MESSAGES).items
    ids = [it.source for it in items]
    assert ids[-1] == f"message:{sent[-1].message_id}"  # the newest turn is always there
    seqs = [next(m.seq for m in sent if f"message:{m.message_id}" == s) for s in ids]
    assert seqs == sorted(seqs) and seqs == list(range(seqs[0], 40 + 1))  # contiguous tail, in order
    assert sum(it.tokens for it in items) <= 120
    if layout == pb.LAYOUT_CACHE_AWARE:
        return  # its window holds only what the budget does (test_prompt_cache.py)
    dropped = {d.source: d.reason for d in resp.dropped}
    # Turns just outside the budget are reported; far older ones are left to the rolling summary.
    assert f"message:{sent[39 - len(items)].message_id}" in dropped
    assert set(dropped.values()) == {pb.DROP_REASON_OVER_BUDGET}


def test_sections_come_stable_first(stub, scope, session_id):
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=session_id, facts=[
        pb.FactInput(key="env", value="production", provenance=pb.PROVENANCE_USER_CONFIRMED),
        pb.FactInput(key="service", value="payment-api", provenance=pb.PROVENANCE_MODEL_INFERRED)]))
    _append(stub, scope, session_id, "查一下生产环境 payment-api 的错误日志")
    resp = _build(stub, scope, session_id, query="它的错误日志呢", render=pb.RENDER_MODE_TEXT)
    kinds = [s.kind for s in resp.sections]
    assert kinds == [pb.SECTION_KIND_SYSTEM_RULES, pb.SECTION_KIND_TOOLS, pb.SECTION_KIND_SESSION_STATE,
                     pb.SECTION_KIND_RECENT_MESSAGES, pb.SECTION_KIND_QUERY]
    state = _section(resp, pb.SECTION_KIND_SESSION_STATE)
    assert [it.text for it in state.items] == ["env: production"]  # the model's guess is not state
    assert resp.rendered_text.startswith(RULES) and resp.rendered_text.rstrip().endswith("它的错误日志呢")
    assert tokens.count_tokens(resp.rendered_text) <= resp.total_tokens <= resp.total_budget


def test_prefix_hash_stable_until_state_changes(stub, scope, session_id):
    _append(stub, scope, session_id, "first question")
    a = _build(stub, scope, session_id, query="q1")
    _append(stub, scope, session_id, "second question")
    b = _build(stub, scope, session_id, query="q2")
    assert a.stable_prefix_hash == b.stable_prefix_hash and a.stable_prefix_tokens == b.stable_prefix_tokens
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=session_id, facts=[
        pb.FactInput(key="env", value="staging", provenance=pb.PROVENANCE_USER_CONFIRMED)]))
    c = _build(stub, scope, session_id, query="q3")
    assert c.stable_prefix_hash != b.stable_prefix_hash
    d = _build(stub, scope, session_id, query="q4", system_rules=RULES + " Be brief.")
    assert d.stable_prefix_hash != c.stable_prefix_hash


def test_duplicates_removed_and_reported_in_the_classic_layout(stub, scope, session_id):
    old = _append(stub, scope, session_id, "Please check the payment-api error rate in production")[0]
    _append(stub, scope, session_id, "something else entirely")
    new = _append(stub, scope, session_id, "Please check the payment-api error rate in production")[0]
    resp = _build(stub, scope, session_id, query="?", layout=pb.LAYOUT_CLASSIC)
    sources = [it.source for it in _section(resp, pb.SECTION_KIND_RECENT_MESSAGES).items]
    assert f"message:{new.message_id}" in sources and f"message:{old.message_id}" not in sources
    dup = next(d for d in resp.dropped if d.source == f"message:{old.message_id}")
    assert dup.reason == pb.DROP_REASON_DUPLICATE and dup.kept_source == f"message:{new.message_id}"


def test_cache_aware_history_keeps_a_repeated_message(stub, scope, session_id):
    """A message said twice is two events; dropping the older one would leave a hole that moves the
    prompt's prefix on the next call."""
    said = _append(stub, scope, session_id, "calling get_metrics for refund-worker", "ok", "calling get_metrics for refund-worker")
    first = _build(stub, scope, session_id, query="?")
    sources = [it.source for it in _section(first, pb.SECTION_KIND_RECENT_MESSAGES).items]
    assert sources == [f"message:{m.message_id}" for m in said]
    _append(stub, scope, session_id, "calling get_metrics for refund-worker")
    second = _build(stub, scope, session_id, query="?")
    assert [it.source for it in _section(second, pb.SECTION_KIND_RECENT_MESSAGES).items][:3] == sources
    assert not second.dropped


def test_cache_aware_other_candidates_repeating_the_history_are_dropped():
    memories = CandidateBatch(SoftCategory.MEMORIES, Section.MEMORIES,
                              texts=["user: the invoice run failed at 02:00 UTC on ledger-db",
                                     "user: the invoice run failed at 02:00 UTC on ledger-db!", "prefers short answers"],
                              sources=["memory:1", "memory:2", "memory:3"], tokens=[12, 13, 4])
    history = CandidateBatch(SoftCategory.RECENT_MESSAGES, Section.RECENT_MESSAGES,
                             texts=["user: the invoice run failed at 02:00 UTC on ledger-db", "assistant: looking"],
                             sources=["message:a", "message:b"], tokens=[12, 3])
    live = [memories, history]  # the history first in the walk wherever it stands
    for b in live:
        b.exact_keys, b.simhashes = fastpath.text_keys(list(b.texts))
    exact = np.concatenate([b.exact_keys for b in live])
    sim = np.concatenate([b.simhashes for b in live])
    _keep_history_whole(live, [0, 3, 5], exact, sim, max_hamming=3)
    assert memories.excluded == {0, 1}
    assert [(d.source, d.reason, d.kept_source) for d in memories.dropped] == [
        ("memory:1", pb.DROP_REASON_DUPLICATE, "message:a"), ("memory:2", pb.DROP_REASON_DUPLICATE, "message:a")]
    assert not exact[3:].any() and not sim[3:].any() and exact[:3].all()
    assert history.exact_keys.any()  # the batch's (the tail's) keys are left as they are


def test_low_score_and_debug_timings(stub, scope, session_id):
    _append(stub, scope, session_id, *[f"line {i} about order-service" for i in range(60)])
    resp = _build(stub, scope, session_id, query="?", min_score=0.9, debug=True)
    reasons = {d.reason for d in resp.dropped}
    assert pb.DROP_REASON_LOW_SCORE in reasons
    assert all(it.score >= 0.9 for it in _section(resp, pb.SECTION_KIND_RECENT_MESSAGES).items)
    stages = [t.stage for t in resp.timings]
    assert {"hard_zone", "candidates", "select", "render"} <= set(stages)
    assert not _build(stub, scope, session_id, query="?").timings


def test_hard_zone_overflow_names_block_size_and_budget(stub, scope, session_id):
    big_rules = "Never restart production without approval. " * 800
    n = tokens.count_tokens(big_rules)
    expect_status(lambda: _build(stub, scope, session_id, system_rules=big_rules, tools=[]),
                  grpc.StatusCode.FAILED_PRECONDITION, "system_and_tools", str(n), "4000")
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=session_id, facts=[
        pb.FactInput(key=f"k{i}", value="payment-api in production " * 10, provenance=pb.PROVENANCE_TOOL_VERIFIED)
        for i in range(40)]))
    expect_status(lambda: _build(stub, scope, session_id), grpc.StatusCode.FAILED_PRECONDITION,
                  "session_state", "budget.session_state is 1000")
    expect_status(lambda: _build(stub, scope, session_id, budget=pb.Budget(session_state=100000, max_input=3000)),
                  grpc.StatusCode.FAILED_PRECONDITION, "hard zone", "1500")


def test_bad_budget_and_unknown_session(stub, scope, session_id):
    expect_status(lambda: _build(stub, scope, session_id, budget=pb.Budget(memories=-1)),
                  grpc.StatusCode.INVALID_ARGUMENT, "budget.memories")
    expect_status(lambda: _build(stub, scope, session_id, budget=pb.Budget(max_input=100, reserved_for_output=100)),
                  grpc.StatusCode.INVALID_ARGUMENT, "budget.reserved_for_output")
    expect_status(lambda: _build(stub, scope, "nope"), grpc.StatusCode.NOT_FOUND, "session_id")
    expect_status(lambda: _build(stub, scope, session_id, tools=[pb.ToolSchema(description="x")]),
                  grpc.StatusCode.INVALID_ARGUMENT, "tools[0].name")
    expect_status(lambda: _build(stub, scope, session_id, render=7), grpc.StatusCode.INVALID_ARGUMENT, "render")


def test_chat_render(stub, scope, session_id):
    _append(stub, scope, session_id, "is payment-api down?")
    _append(stub, scope, session_id, "Checking the logs now.", role=pb.ROLE_ASSISTANT)
    resp = _build(stub, scope, session_id, query="and now?", render=pb.RENDER_MODE_CHAT)
    roles = [m.role for m in resp.chat_messages]
    assert roles == ["system", "user", "assistant", "user"]
    assert resp.chat_messages[1].content == "is payment-api down?"
    assert resp.chat_messages[-1].content == "and now?"


_texts = st.lists(st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0,
                          max_size=300), min_size=1, max_size=40)
_budget = st.integers(min_value=0, max_value=3000)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=_texts, recent=_budget, total=st.integers(min_value=200, max_value=8000), flow=st.booleans())
def test_budgets_never_exceeded(stub, scope, texts, recent, total, flow):
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    stored = len(_append(stub, scope, sid, *texts))
    budget = pb.Budget(max_input=total + 100, reserved_for_output=100, recent_messages=recent, flow_unused=flow)
    try:
        resp = _build(stub, scope, sid, query="status?", budget=budget, render=pb.RENDER_MODE_TEXT, max_dropped=100000)
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION  # only when the hard zone alone is too big
        return
    assert resp.total_tokens <= resp.total_budget == total
    assert tokens.count_tokens(resp.rendered_text) <= resp.total_budget
    for section in resp.sections:
        assert section.tokens == sum(it.tokens for it in section.items)
    for u in resp.usage:
        assert u.used <= u.budget
        if not flow:
            assert u.flowed_in == 0
    recent_usage = next(u for u in resp.usage if u.category == pb.CATEGORY_RECENT_MESSAGES)
    assert recent_usage.budget == recent  # the first category never receives flow
    packed = sum(it.tokens for it in _section(resp, pb.SECTION_KIND_RECENT_MESSAGES).items)
    assert packed == recent_usage.used <= recent
    selected = len(_section(resp, pb.SECTION_KIND_RECENT_MESSAGES).items)
    recent_dropped = [d for d in resp.dropped if d.category == pb.CATEGORY_RECENT_MESSAGES]
    assert recent_usage.selected == selected and recent_usage.candidates <= stored
    # Every message is packed or listed as dropped: by the selection (a candidate), or before it, where
    # the history window leaves it out (no turn committed, so no summary folds it in).
    assert selected + len(recent_dropped) == stored
    assert {d.source for d in recent_dropped} | {it.source for it in
                                                 _section(resp, pb.SECTION_KIND_RECENT_MESSAGES).items} == {
        f"message:{m.message_id}" for m in stub.ListMessages(pb.ListMessagesRequest(
            scope=scope, session_id=sid, from_seq=1)).messages}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(["db 连接", "pool", "- memory", "[kb] chunk", "", "é", "x" * 300]),
                         min_size=1, max_size=6).map(" ".join), min_size=1, max_size=12))
def test_cached_dedup_keys_equal_the_computed_ones(texts):
    """The builder's cache of dedup keys answers exactly what fastpath.text_keys computes, before
    and after it is cleared for being full."""
    import numpy as np

    import fastpath
    from sidecar.assembly import builder

    want = fastpath.text_keys(texts)
    builder._TEXT_KEYS.clear()
    for _ in range(2):  # cold, then warm
        got = builder._text_keys(texts)
        assert all(np.array_equal(g, w) and g.dtype == np.uint64 for g, w in zip(got, want, strict=True))
    builder._TEXT_KEYS.update({f"filler{i}": (0, 0) for i in range(builder._TEXT_KEYS_MAX - len(builder._TEXT_KEYS))})
    got = builder._text_keys([*texts, "never seen"])  # full: cleared, then refilled
    assert np.array_equal(got[0][:-1], want[0]) and np.array_equal(got[1][:-1], want[1])
    assert len(builder._TEXT_KEYS) <= len(texts) + 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(max_size=60) | st.sampled_from(["payment-api 5xx since the deploy", "重启 生产 实例", "x" * 3000]),
                min_size=1, max_size=8))
def test_memoised_query_terms_equal_the_computed_ones(queries):
    """Sources share one tokenisation of the query: what the memo answers is terms() itself, cold,
    warm, after it is cleared for being full, and for a query too long to keep."""
    from sidecar import text

    text._QUERY_TERMS.clear()
    for _ in range(2):
        assert [text.query_terms(q) for q in queries] == [tuple(text.terms(q)) for q in queries]
    assert all(len(q) <= text._QUERY_MAX_CHARS for q in text._QUERY_TERMS)
    text._QUERY_TERMS.update({f"filler{i}": () for i in range(text._QUERY_TERMS_MAX - len(text._QUERY_TERMS))})
    assert text.query_terms("never seen: restarts") == ("never", "seen", "restart")  # full: cleared, then kept
    assert list(text._QUERY_TERMS) == ["never seen: restarts"]


def test_dropped_list_is_the_most_relevant_first_and_counts_all(stub, scope, session_id):
    """max_dropped cuts the list of dropped items after the highest-scored ones (best first, the
    cut list a prefix of the whole one); dropped_counts counts every drop, listed or not."""
    _append(stub, scope, session_id, *[f"turn {i}: payment-api shard {i} latency {i * 7} ms" for i in range(60)])
    _append(stub, scope, session_id, *["same line again"] * 4)
    budget = pb.Budget(recent_messages=150)
    # The classic layout's window slides by one message: more candidates than the budget, so more drops.
    classic = dict(budget=budget, layout=pb.LAYOUT_CLASSIC)
    full = _build(stub, scope, session_id, query="shard latency", max_dropped=100000, **classic)
    cut = _build(stub, scope, session_id, query="shard latency", max_dropped=5, **classic)
    scored = [(d.source, d.score) for d in full.dropped]
    assert len(scored) >= 8
    assert [s for _, s in scored] == sorted((s for _, s in scored), reverse=True)
    assert [(d.source, d.score) for d in cut.dropped] == scored[:5]
    assert sum(c.count for c in cut.dropped_counts) == sum(c.count for c in full.dropped_counts) == len(full.dropped)
    assert any(d.reason == pb.DROP_REASON_DUPLICATE for d in full.dropped)
