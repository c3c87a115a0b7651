"""Layered compression through the real server: pinned constraints, rolling summary, tool-result
views, secrets, run notes, sub-agent isolation."""

import grpc

from sidecar import tokens
from sidecar.api import context_service_pb2 as pb
from tests.grpc_assert import expect_status
from tests.ops_session import ENVS, SERVICES, ops_turns

ROLE = {"user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT}


def _section(resp, kind):
    return next((s for s in resp.sections if s.kind == kind), pb.Section())


def _build(stub, scope, sid, **kw):
    return stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, system_rules="You are OpsPilot.",
                                                    **kw))


def _commit(stub, scope, sid):
    jobs = stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid)).job_ids
    assert stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs, timeout_ms=30000)).all_finished


def test_500_turns_keep_every_prohibition_verbatim_and_entities_in_summary(stub, scope, session_id):
    turns, placed = ops_turns()
    seen: list[str] = []
    budgets = [pb.Budget(recent_messages=300), pb.Budget(recent_messages=2000, max_input=6000),
               pb.Budget(recent_messages=0, memories=0, rag_or_graph=0, tool_observations=0, max_input=2500,
                         reserved_for_output=200)]
    for start in range(0, len(turns), 25):
        batch = turns[start:start + 25]
        stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=session_id, messages=[
            pb.NewMessage(role=ROLE[r], text=t) for r, t in batch]))
        seen += [placed[i] for i in range(start, start + len(batch)) if i in placed]
        _commit(stub, scope, session_id)
        for budget in budgets:
            resp = _build(stub, scope, session_id, query="what should we do next?", budget=budget)
            pinned = [it.text for it in _section(resp, pb.SECTION_KIND_PINNED_CONSTRAINTS).items]
            assert pinned == seen, f"after turn {start + len(batch)}: {set(seen) - set(pinned)} missing"
            assert resp.total_tokens <= resp.total_budget
    resp = _build(stub, scope, session_id, query="status?", budget=pb.Budget(recent_messages=3000))
    summary = _section(resp, pb.SECTION_KIND_SUMMARY).items
    assert summary and summary[0].source.startswith("summary:")
    text = summary[0].text
    folded = [t for _, t in turns[:300]]
    for name in SERVICES + ENVS:
        if any(name in t for t in folded):
            assert name in text, f"{name} lost from the summary"
    assert "connection pool exhausted" in text
    # The summary is one item that stands for many messages.
    assert len(summary[0].source_message_ids) > 20
    # What it folds in is not dropped; the messages after it are packed or listed as dropped, none missing.
    full = _build(stub, scope, session_id, query="status?", budget=pb.Budget(recent_messages=3000), debug=True)
    folded = {f"message:{m}" for m in _section(full, pb.SECTION_KIND_SUMMARY).items[0].source_message_ids}
    dropped = {d.source for d in full.dropped if d.category == pb.CATEGORY_RECENT_MESSAGES}
    packed = {it.source for it in _section(full, pb.SECTION_KIND_RECENT_MESSAGES).items}
    order = [f"message:{m.message_id}" for m in stub.ListMessages(pb.ListMessagesRequest(
        scope=scope, session_id=session_id, from_seq=1)).messages]
    shown = dropped | packed
    assert not folded & dropped and set(order[min(map(order.index, shown)):]) == shown


def test_tool_result_trimmed_view_and_full_text(stub, scope, session_id):
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=session_id, facts=[
        pb.FactInput(key="service", value="payment-api", provenance=pb.PROVENANCE_USER_CONFIRMED)]))
    lines = []
    for i in range(5000):
        if i % 250 == 7:
            lines.append(f"2026-12-01T10:{i % 60:02d}:00Z ERROR payment-api upstream timeout id={i}")
        else:
            lines.append(f"2026-12-01T10:{i % 60:02d}:00Z INFO worker-{i % 17} heartbeat ok seq={i}")
    full = "\n".join(lines) + "\n"
    ref = stub.RecordToolResult(pb.RecordToolResultRequest(scope=scope, session_id=session_id, tool_name="query_logs",
                                                           call_id="c1", full_text=full))
    assert ref.lines == 5001 and ref.tokens == tokens.count_tokens(full)
    for budget in (4000, 900):  # the classic layout re-trims the latest result to each call's budget
        resp = _build(stub, scope, session_id, query="why 5xx?", budget=pb.Budget(tool_observations=budget),
                      layout=pb.LAYOUT_CLASSIC)
        [item] = _section(resp, pb.SECTION_KIND_TOOL_OBSERVATIONS).items
        assert item.source == f"tool:{ref.tool_result_id}" and item.tokens <= budget
        assert tokens.count_tokens(item.text) <= item.tokens
        errors = [ln for ln in lines if " ERROR " in ln]
        kept = [e for e in errors if e in item.text]
        assert len(kept) == len(errors) if budget == 4000 else len(kept) >= 5
        assert ref.tool_result_id in item.text and "omitted" in item.text
    back = stub.GetToolResult(pb.GetToolResultRequest(scope=scope, session_id=session_id,
                                                      tool_result_id=ref.tool_result_id))
    assert back.full_text == full
    expect_status(lambda: stub.GetToolResult(pb.GetToolResultRequest(scope=scope, session_id=session_id,
                                                                      tool_result_id="tool_x")),
                  grpc.StatusCode.NOT_FOUND, "tool_result_id")


def test_latest_tool_result_first(stub, scope, session_id):
    refs = [stub.RecordToolResult(pb.RecordToolResultRequest(
        scope=scope, session_id=session_id, tool_name=f"tool{i}", full_text=f"result {i}\n" * 400)).tool_result_id
        for i in range(3)]
    resp = _build(stub, scope, session_id, query="?", budget=pb.Budget(tool_observations=500),
                  layout=pb.LAYOUT_CLASSIC)
    items = _section(resp, pb.SECTION_KIND_TOOL_OBSERVATIONS).items
    assert items[0].source == f"tool:{refs[-1]}"
    # Cache-aware: every result in the history, in the order recorded, each as it was recorded.
    resp = _build(stub, scope, session_id, query="?")
    history = _section(resp, pb.SECTION_KIND_RECENT_MESSAGES).items
    assert [it.source for it in history] == [f"tool:{r}" for r in refs]


def test_secrets_never_reach_summary_pinned_or_tool_view(stub, scope, session_id):
    secret_turns = ["Do not share it: the prod password is Hunter2xyz!9q, never paste it anywhere.",
                    "my token is ghp_abcdefghijklmnopqrstuvwxyz0123456789 for the staging deploy of payment-api",
                    "以后默认用这个密码登录：Zz9!kQ2mW7pL"]
    turns, _ = ops_turns(400, seed=3)
    msgs = [pb.NewMessage(role=ROLE[r], text=t) for r, t in turns]
    for k, s in enumerate(secret_turns):
        msgs.insert(10 + k * 30, pb.NewMessage(role=pb.ROLE_USER, text=s))
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=session_id, messages=msgs))
    stub.RecordToolResult(pb.RecordToolResultRequest(
        scope=scope, session_id=session_id, tool_name="env_dump",
        full_text="\n".join([f"line {i}" for i in range(300)] + ["AWS_SECRET=AKIAABCDEFGHIJKLMNOP",
                                                                 "DB_PASSWORD: Hunter2xyz!9q"])))
    _commit(stub, scope, session_id)
    resp = _build(stub, scope, session_id, query="status", budget=pb.Budget(recent_messages=1500))
    for kind in (pb.SECTION_KIND_SUMMARY, pb.SECTION_KIND_PINNED_CONSTRAINTS, pb.SECTION_KIND_TOOL_OBSERVATIONS,
                 pb.SECTION_KIND_RECENT_MESSAGES):
        for it in _section(resp, kind).items:
            for needle in ("Hunter2xyz", "ghp_abcdefghij", "AKIAABCDEFGHIJKLMNOP", "Zz9!kQ2mW7pL"):
                assert needle not in it.text, (kind, it.text)
    assert _section(resp, pb.SECTION_KIND_SUMMARY).items
    pinned = [it.text for it in _section(resp, pb.SECTION_KIND_PINNED_CONSTRAINTS).items]
    assert any("[secret:password#1]" in p for p in pinned)  # masked at ingest, the rule kept


def test_run_notes_fold_when_full(stub, scope, session_id):
    run = stub.StartRun(pb.StartRunRequest(scope=scope, session_id=session_id, goal="fix 5xx"))
    for i in range(20):
        stub.AddRunNote(pb.AddRunNoteRequest(scope=scope, session_id=session_id, run_id=run.run_id,
                                             text=f"step {i}: checked payment-api shard {i} in production"))
    notes = stub.ListRunNotes(pb.ListRunNotesRequest(scope=scope, session_id=session_id, run_id=run.run_id)).notes
    assert len(notes) <= 12 and notes[0].is_summary and len(notes[0].folded_note_ids) >= 8
    assert notes[-1].text.startswith("step 19")
    resp = _build(stub, scope, session_id, run_id=run.run_id, query="?")
    sources = [it.source for it in _section(resp, pb.SECTION_KIND_TOOL_OBSERVATIONS).items]
    assert f"note:{notes[-1].note_id}" in sources and f"note:{notes[0].note_id}" in sources
    expect_status(lambda: stub.AddRunNote(pb.AddRunNoteRequest(scope=scope, session_id=session_id, run_id="nope",
                                                               text="x")), grpc.StatusCode.NOT_FOUND, "run_id")


def test_sub_session_isolation(stub, scope, session_id):
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=session_id, facts=[
        pb.FactInput(key="env", value="production", provenance=pb.PROVENANCE_USER_CONFIRMED),
        pb.FactInput(key="incident", value="INC-7", provenance=pb.PROVENANCE_USER_CONFIRMED)]))
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=session_id, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="PARENT-ONLY: the customer escalated twice")]))
    child = stub.CreateSubSession(pb.CreateSubSessionRequest(scope=scope, parent_session_id=session_id,
                                                             task="Compare pool metrics", fact_keys=["env"]))
    assert child.parent_session_id == session_id
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=child.session_id, messages=[
        pb.NewMessage(role=pb.ROLE_ASSISTANT, text="CHILD-ONLY: pool max is 50, saturation at 10:02")]))
    child_ctx = _build(stub, scope, child.session_id, query="go", render=pb.RENDER_MODE_TEXT)
    assert "PARENT-ONLY" not in child_ctx.rendered_text and "INC-7" not in child_ctx.rendered_text
    assert "env: production" in child_ctx.rendered_text and "Compare pool metrics" in child_ctx.rendered_text
    parent_ctx = _build(stub, scope, session_id, query="go", render=pb.RENDER_MODE_TEXT)
    assert "CHILD-ONLY" not in parent_ctx.rendered_text
    done = stub.CompleteSubSession(pb.CompleteSubSessionRequest(scope=scope, session_id=child.session_id,
                                                                result_summary="Pool saturates at 50 connections"))
    parent_ctx = _build(stub, scope, session_id, query="go", render=pb.RENDER_MODE_TEXT)
    items = _section(parent_ctx, pb.SECTION_KIND_TOOL_OBSERVATIONS).items
    assert [it.source for it in items] == [done.source]
    assert "Pool saturates at 50" in parent_ctx.rendered_text and "CHILD-ONLY" not in parent_ctx.rendered_text
    expect_status(lambda: stub.CompleteSubSession(pb.CompleteSubSessionRequest(
        scope=scope, session_id=child.session_id, result_summary="again")), grpc.StatusCode.FAILED_PRECONDITION)
    expect_status(lambda: stub.CreateSubSession(pb.CreateSubSessionRequest(
        scope=scope, parent_session_id=session_id, task="x", fact_keys=["nope"])), grpc.StatusCode.NOT_FOUND,
        "fact_keys[0]")
