"""Prompts that providers cache: the cache-aware layout (stable, then growing, then per call), state
that grows by appending, a history window that moves in blocks, a summary that folds in blocks, and
the response's cache report (cache_prefix_tokens, section digests, breakpoints)."""

from __future__ import annotations

from sidecar.api import context_service_pb2 as pb

RULES = "You are OpsPilot. Never restart production without approval."
TOOLS = [pb.ToolSchema(name="restart", description="Restart a service", schema_json='{"type":"object"}')]
CACHE_ORDER = [pb.SECTION_KIND_SYSTEM_RULES, pb.SECTION_KIND_TOOLS, pb.SECTION_KIND_PINNED_CONSTRAINTS,
               pb.SECTION_KIND_SESSION_STATE, pb.SECTION_KIND_SESSION_RECALL, pb.SECTION_KIND_SUMMARY, pb.SECTION_KIND_RECENT_MESSAGES,
               pb.SECTION_KIND_MEMORIES, pb.SECTION_KIND_KNOWLEDGE, pb.SECTION_KIND_TOOL_OBSERVATIONS,
               pb.SECTION_KIND_QUERY]


def _build(stub, scope, sid, **kw):
    kw.setdefault("system_rules", RULES)
    kw.setdefault("tools", TOOLS)
    return stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, **kw))


def _say(stub, scope, sid, *texts):
    return stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER if i % 2 == 0 else pb.ROLE_ASSISTANT, text=t)
        for i, t in enumerate(texts)])).messages


def _kinds(resp):
    return [s.kind for s in resp.sections if s.items]


def test_cache_aware_layout_keeps_the_sessions_recall_and_puts_new_recall_after_the_history(
        stub, scope, session_id):
    _say(stub, scope, session_id, "Never restart the payment primary.", "Understood.",
         "I prefer short answers.", "Noted.")
    stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                       content="The payment api runs in eu-west-1"))
    run = stub.StartRun(pb.StartRunRequest(scope=scope, session_id=session_id, goal="triage")).run_id
    stub.RecordToolResult(pb.RecordToolResultRequest(scope=scope, session_id=session_id, run_id=run,
                                                     tool_name="grep", call_id="c1", full_text="3 errors"))
    query = "where does the payment api run?"
    first = _build(stub, scope, session_id, run_id=run, query=query, render=pb.RENDER_MODE_CHAT)
    kinds = _kinds(first)
    assert kinds == [k for k in CACHE_ORDER if k in kinds] and pb.SECTION_KIND_SESSION_RECALL in kinds
    assert kinds.index(pb.SECTION_KIND_SESSION_RECALL) < kinds.index(pb.SECTION_KIND_RECENT_MESSAGES)
    # Chat: the system message holds the stable part (with the session's recall), then the conversation.
    roles = [m.role for m in first.chat_messages]
    assert roles[0] == "system" and roles[-1] == "user" and first.chat_messages[-1].content == query
    assert "eu-west-1" in first.chat_messages[0].content
    # A tool result is part of the history, where it was recorded, as it was recorded.
    tool = [m for m in first.chat_messages if m.role == "tool"]
    assert len(tool) == 1 and tool[0].content.startswith("[grep ok, tool:") and "3 errors" in tool[0].content
    # A later call keeps the recall as it was; what it recalls beyond it comes after the conversation.
    job = stub.IngestDocument(pb.IngestDocumentRequest(
        scope=pb.Scope(tenant_id=scope.tenant_id), doc_id="rb",
        text="Rotate the gateway certificate with the rotate-certs job.")).job_id
    stub.WaitForJobs(pb.WaitForJobsRequest(scope=pb.Scope(tenant_id=scope.tenant_id), job_ids=[job]))
    again = _build(stub, scope, session_id, run_id=run, query=query)  # the knowledge changed: made again
    later = _build(stub, scope, session_id, run_id=run, query="how do I rotate the gateway certificate?",
                   render=pb.RENDER_MODE_CHAT)
    digests = lambda r: {d.kind: d.hash for d in r.section_digests}  # noqa: E731
    assert digests(later)[pb.SECTION_KIND_SESSION_RECALL] == digests(again)[pb.SECTION_KIND_SESSION_RECALL]
    kinds = _kinds(later)
    assert kinds.index(pb.SECTION_KIND_RECENT_MESSAGES) < kinds.index(pb.SECTION_KIND_KNOWLEDGE)
    assert "rotate-certs" in later.chat_messages[-2].content and "rotate-certs" not in later.chat_messages[0].content
    classic = _build(stub, scope, session_id, run_id=run, query=query, layout=pb.LAYOUT_CLASSIC)
    assert _kinds(classic) == sorted(_kinds(classic))  # proto order: memories before the conversation
    assert pb.SECTION_KIND_MEMORIES in _kinds(classic) and pb.SECTION_KIND_TOOL_OBSERVATIONS in _kinds(classic)


def test_the_sessions_recall_is_made_again_when_what_it_came_from_changes(stub, scope, session_id):
    _say(stub, scope, session_id, "hello", "hi")
    fact = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                              content="The payment api runs in eu-west-1")).memory
    recall = lambda: [i.text for s in _build(stub, scope, session_id, query="where does the payment api run?")  # noqa: E731
                      .sections if s.kind == pb.SECTION_KIND_SESSION_RECALL for i in s.items]
    assert any("eu-west-1" in t for t in recall())
    stub.UpdateMemory(pb.UpdateMemoryRequest(scope=scope, memory_id=fact.memory_id,
                                             content="The payment api runs in us-east-2"))
    now = recall()
    assert any("us-east-2" in t for t in now) and not any("eu-west-1" in t for t in now)
    stub.DeleteMemory(pb.DeleteMemoryRequest(scope=scope, memory_id=fact.memory_id))
    assert not any("payment api" in t for t in recall())


def test_state_grows_by_appending(stub, scope, session_id):
    def upsert(key, value):
        stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=session_id, facts=[
            pb.FactInput(key=key, value=value, provenance=pb.PROVENANCE_USER_CONFIRMED)]))

    for key, value in (("zone", "eu-west-1"), ("env", "staging"), ("approver", "alice")):
        upsert(key, value)
    state = lambda **kw: [i.source for s in _build(stub, scope, session_id, **kw).sections  # noqa: E731
                          if s.kind == pb.SECTION_KIND_SESSION_STATE for i in s.items]
    assert state() == ["fact:zone", "fact:env", "fact:approver"]
    upsert("env", "production")  # re-stated after the others, not sorted into the middle
    assert state() == ["fact:zone", "fact:approver", "fact:env"]
    assert state(layout=pb.LAYOUT_CLASSIC) == ["fact:approver", "fact:env", "fact:zone"]


def test_the_response_says_what_repeats_the_previous_prompt(stub, scope, session_id):
    _say(stub, scope, session_id, *[f"step {i}: checked shard {i} of the payment api" for i in range(6)])
    first = _build(stub, scope, session_id, query="status?", render=pb.RENDER_MODE_CHAT)
    assert first.cache_prefix_tokens == 0  # nothing to compare with yet
    again = _build(stub, scope, session_id, query="status?", render=pb.RENDER_MODE_CHAT)
    assert again.cache_prefix_tokens == again.total_tokens == sum(d.tokens for d in again.section_digests)
    _say(stub, scope, session_id, "step 6: shard 6 is fine", "noted")
    grown = _build(stub, scope, session_id, query="and now?", render=pb.RENDER_MODE_CHAT)
    digests = {d.kind: d.hash for d in again.section_digests}
    same = [d.kind for d in grown.section_digests if digests.get(d.kind) == d.hash]
    assert pb.SECTION_KIND_SYSTEM_RULES in same and pb.SECTION_KIND_TOOLS in same
    history = {d.kind: d.tokens for d in grown.section_digests}[pb.SECTION_KIND_RECENT_MESSAGES]
    stable = sum(d.tokens for d in grown.section_digests if d.kind in (
        pb.SECTION_KIND_SYSTEM_RULES, pb.SECTION_KIND_TOOLS))
    # The whole old history is shared: only the two new messages and the query differ.
    assert stable + history - 30 < grown.cache_prefix_tokens < stable + history
    points = {b.after: b for b in grown.cache_breakpoints}
    assert set(points) == {pb.SECTION_KIND_TOOLS, pb.SECTION_KIND_RECENT_MESSAGES}
    assert points[pb.SECTION_KIND_TOOLS].prefix_tokens == stable
    assert points[pb.SECTION_KIND_TOOLS].chat_message_index == 0
    last = points[pb.SECTION_KIND_RECENT_MESSAGES].chat_message_index
    assert grown.chat_messages[last].content.startswith("noted")


def test_the_history_window_moves_in_blocks(stub, scope, session_id):
    budget = pb.Budget(recent_messages=400)
    starts = []
    for i in range(60):
        _say(stub, scope, session_id, f"turn {i}: the payment api shard {i} answered in {i * 7} ms today")
        resp = _build(stub, scope, session_id, query="latency?", budget=budget)
        history = [it.source for s in resp.sections if s.kind == pb.SECTION_KIND_RECENT_MESSAGES for it in s.items]
        starts.append(history[0])
    moves = sum(a != b for a, b in zip(starts, starts[1:], strict=False))
    assert 2 <= moves <= 60 // 6  # once the window is full it moves a quarter of it at once, not per message
    classic_moves = 0
    previous = None
    for i in range(3):
        _say(stub, scope, session_id, f"one more turn ({i}) about the payment api shard latency")
        resp = _build(stub, scope, session_id, query="latency?", budget=budget, layout=pb.LAYOUT_CLASSIC)
        first = next(it.source for s in resp.sections if s.kind == pb.SECTION_KIND_RECENT_MESSAGES for it in s.items)
        classic_moves += previous is not None and first != previous
        previous = first
    assert classic_moves == 2  # the classic window slides with every message


def test_the_summary_folds_in_blocks(stub, scope, session_id):
    texts = []
    for i in range(80):
        _say(stub, scope, session_id, f"turn {i}: we rotated the certificate on gateway node {i} and it took "
             f"{i % 9 + 2} minutes; the canary stayed green, error rates flat, p99 latency {100 + i} ms, "
             "no pages fired, the change ticket is closed and the runbook updated with the new expiry date",
             f"ok, noted for node {i}: certificate rotated, canary green, ticket closed")
        jobs = list(stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=session_id)).job_ids)
        stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs, timeout_ms=30_000))
        resp = _build(stub, scope, session_id, query="status?")
        summary = [it.text for s in resp.sections if s.kind == pb.SECTION_KIND_SUMMARY for it in s.items]
        texts.append(summary[0] if summary else "")
    changes = sum(a != b for a, b in zip(texts, texts[1:], strict=False))
    assert texts[-1] and 1 <= changes <= 80 // 4  # a fold per quarter window, not per turn


def _log(service: str, n: int, seed: int) -> str:
    return "\n".join(f"2026-12-05T10:{k % 60:02d}:{(k * seed) % 60:02d}Z {'ERROR' if k % 7 == 0 else 'INFO'} {service} "
                     f"req={k * 7919 + seed:010x} latency_ms={(k * 37 + seed) % 2400} status={502 if k % 7 == 0 else 200}"
                     for k in range(n))


def test_a_tool_loop_shares_its_history_and_past_outputs_shrink_to_their_briefs(stub, scope, session_id):
    """Within a turn every model call repeats the previous one's history up to the turn's outputs (an
    earlier output of the turn gives way to its brief when both views do not fit); when the user speaks
    again the last turn's outputs are shown by their briefs, and the history's start moves only then."""
    s = dict(scope=scope, session_id=session_id)
    calls = []  # (turn, call in turn, history items as (source, text))
    recorded = []
    for turn in range(16):
        stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[
            pb.NewMessage(role=pb.ROLE_USER, text=f"turn {turn}: is payment-api-{turn % 3} healthy?")]))
        run = stub.StartRun(pb.StartRunRequest(**s, goal="check")).run_id
        for k in range(2):
            stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[
                pb.NewMessage(role=pb.ROLE_ASSISTANT, text=f"calling get_logs ({turn}.{k})", tool_name="get_logs")]))
            recorded.append(stub.RecordToolResult(pb.RecordToolResultRequest(
                **s, run_id=run, tool_name="get_logs", call_id=f"c{turn}.{k}",
                full_text=_log(f"payment-api-{turn % 3}", 60, turn * 2 + k))).tool_result_id)
            resp = _build(stub, scope, session_id, query="what do the logs say?")
            calls.append((turn, k, [(it.source, it.text) for sec in resp.sections
                                    if sec.kind == pb.SECTION_KIND_RECENT_MESSAGES for it in sec.items]))
        stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[
            pb.NewMessage(role=pb.ROLE_ASSISTANT, text=f"payment-api-{turn % 3}: healthy after turn {turn}")]))
        jobs = list(stub.CommitTurn(pb.CommitTurnRequest(**s)).job_ids)
        stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs, timeout_ms=30_000))
    for (turn, k, history), (_, _, before) in zip(calls[1:], calls, strict=False):
        if k == 1:  # the turn's second call repeats the first one's history, then adds to it
            output = next(i for i, (source, _) in enumerate(before) if source == f"tool:{recorded[2 * turn]}")
            assert history[:output] == before[:output]
            assert history[output][0] == before[output][0] and len(history) > len(before)
    starts = [(turn, k, history[0][0]) for turn, k, history in calls]
    moves = [(turn, k) for (turn, k, a), (_, _, b) in zip(starts[1:], starts, strict=False) if a != b]
    assert moves and all(k == 0 for _, k in moves)  # only when the user spoke
    texts = {source: text for source, text in calls[-1][2]}
    view = texts[f"tool:{recorded[-1]}"]  # the newest output as its view, the last turns' as their briefs
    briefs = [texts[f"tool:{r}"] for r in recorded[-6:-2] if f"tool:{r}" in texts]
    assert briefs and all(len(b) < len(view) for b in briefs)


def test_what_the_window_leaves_out_before_a_commit_is_listed_as_dropped(stub, scope, session_id):
    """No turn committed, so no summary: the messages and tool outputs the history window leaves out are
    listed as dropped (over budget), and every one of them is packed or listed."""
    s = dict(scope=scope, session_id=session_id)
    recorded = []
    for turn in range(12):
        stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[
            pb.NewMessage(role=pb.ROLE_USER, text=f"turn {turn}: is payment-api-{turn % 3} healthy?"),
            pb.NewMessage(role=pb.ROLE_ASSISTANT, text=f"calling get_logs ({turn})", tool_name="get_logs")]))
        recorded.append(stub.RecordToolResult(pb.RecordToolResultRequest(
            **s, tool_name="get_logs", call_id=f"c{turn}", full_text=_log(f"payment-api-{turn % 3}", 40, turn))
        ).tool_result_id)
    resp = _build(stub, scope, session_id, query="what do the logs say?", debug=True,
                  budget=pb.Budget(recent_messages=300, tool_observations=300))
    packed = {it.source for sec in resp.sections for it in sec.items}
    dropped = {d.source: d for d in resp.dropped}
    messages = [f"message:{m.message_id}" for m in stub.ListMessages(pb.ListMessagesRequest(**s, from_seq=1)).messages]
    outputs = [f"tool:{r}" for r in recorded]
    assert messages[0] in dropped and outputs[0] in dropped  # the oldest are outside the window
    assert dropped[messages[0]].reason == dropped[outputs[0]].reason == pb.DROP_REASON_OVER_BUDGET
    assert all(x in packed or x in dropped for x in messages + outputs)
    assert sum(c.count for c in resp.dropped_counts) == len(resp.dropped)  # debug lists every drop


def test_the_summary_folds_what_tool_outputs_take_in_the_history(stub, scope, session_id):
    """Short messages with long tool outputs: what the history holds (the outputs' briefs) fills the
    summary window, so older turns fold although their own lines are short."""
    s = dict(scope=scope, session_id=session_id)
    for turn in range(14):
        stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[
            pb.NewMessage(role=pb.ROLE_USER, text=f"turn {turn}: any errors?"),
            pb.NewMessage(role=pb.ROLE_ASSISTANT, text="calling get_logs", tool_name="get_logs")]))
        run = stub.StartRun(pb.StartRunRequest(**s, goal="check")).run_id
        stub.RecordToolResult(pb.RecordToolResultRequest(**s, run_id=run, tool_name="get_logs", call_id=f"c{turn}",
                                                         full_text=_log("ledger-db", 80, turn)))
        stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[
            pb.NewMessage(role=pb.ROLE_ASSISTANT, text=f"ledger-db fine at turn {turn}")]))
        jobs = list(stub.CommitTurn(pb.CommitTurnRequest(**s)).job_ids)
        stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs, timeout_ms=30_000))
    resp = _build(stub, scope, session_id, query="status?")
    summary = [it.text for sec in resp.sections if sec.kind == pb.SECTION_KIND_SUMMARY for it in sec.items]
    assert summary and "any errors?" in summary[0]
    history = [it.text for sec in resp.sections if sec.kind == pb.SECTION_KIND_RECENT_MESSAGES for it in sec.items]
    assert not any("turn 0: any errors?" in t for t in history) and any("turn 13: any errors?" in t for t in history)


def test_the_turns_newest_output_keeps_its_view_once_the_history_is_full(stub, scope, session_id):
    """Past folds, with the history at its budget: the output the model just asked for is shown by its
    view as in the classic layout (paid from the tool observations' budget), not cut to a brief; the
    turn before's output is shown by its brief."""
    s = dict(scope=scope, session_id=session_id)
    recorded = []
    for turn in range(16):
        stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[
            pb.NewMessage(role=pb.ROLE_USER, text=f"turn {turn}: any errors on ledger-db?"),
            pb.NewMessage(role=pb.ROLE_ASSISTANT, text="calling get_logs", tool_name="get_logs")]))
        run = stub.StartRun(pb.StartRunRequest(**s, goal="check")).run_id
        recorded.append(stub.RecordToolResult(pb.RecordToolResultRequest(
            **s, run_id=run, tool_name="get_logs", call_id=f"c{turn}", full_text=_log("ledger-db", 90, turn))
        ).tool_result_id)
        if turn < 15:
            stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[
                pb.NewMessage(role=pb.ROLE_ASSISTANT, text=f"ledger-db fine at turn {turn}")]))
            jobs = list(stub.CommitTurn(pb.CommitTurnRequest(**s)).job_ids)
            stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs, timeout_ms=30_000))

    def shown(layout):
        resp = _build(stub, scope, session_id, query="what do the logs say?", layout=layout,
                      budget=pb.Budget(recent_messages=3000))  # a view over a quarter of the history's room
        return resp, {it.source: it for sec in resp.sections for it in sec.items}

    aware, items = shown(pb.LAYOUT_CACHE_AWARE)
    _, classic = shown(pb.LAYOUT_CLASSIC)
    assert pb.SECTION_KIND_SUMMARY in _kinds(aware)  # the history has folded
    newest, before = items[f"tool:{recorded[-1]}"], items[f"tool:{recorded[-2]}"]
    assert newest.text == classic[f"tool:{recorded[-1]}"].text
    assert newest.tokens > 3 * before.tokens
    history = [it.source for sec in aware.sections if sec.kind == pb.SECTION_KIND_RECENT_MESSAGES for it in sec.items]
    assert history[-1] == f"tool:{recorded[-1]}"  # after the call that asked for it


def test_a_fold_comes_early_when_the_next_prompt_changes_before_the_summary_anyway(stub, scope):
    """Two sessions with the same turns; in one a fact is confirmed after a model call, early and then
    late in the summary window. Its next prompt is sent again from the state on, so the late change
    folds the history there and then (the early one is too soon to fold); the other session folds only
    when the window is full."""
    first_summary = {}
    for name, fact_turns in (("plain", ()), ("facts", (8, 36))):
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, title=name)).session_id
        for i in range(45):
            _say(stub, scope, sid, f"turn {i}: gateway node {i} rotated its certificate in {i % 9 + 2} minutes, "
                 f"canary green, p99 {100 + i} ms, error rate flat, no pages, change ticket CHG-{4000 + i} closed; "
                 "the runbook now lists the new expiry date and the on-call rota was told in the channel",
                 f"noted for node {i}: rotated, canary green, ticket CHG-{4000 + i} closed, runbook updated")
            _build(stub, scope, sid, query="status?")
            if i in fact_turns:
                stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=sid, facts=[pb.FactInput(
                    key=f"rotated_{i}", value="yes", provenance=pb.PROVENANCE_USER_CONFIRMED)]))
            jobs = list(stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid)).job_ids)
            stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs, timeout_ms=30_000))
            resp = _build(stub, scope, sid, query="status?")
            if pb.SECTION_KIND_SUMMARY in _kinds(resp):
                first_summary.setdefault(name, i)
    assert first_summary.get("facts") == 36 < first_summary["plain"], first_summary


def test_a_section_repeated_from_the_sessions_last_prompt_keeps_its_digest(monkeypatch):
    """Digests are those of the sections' bytes; a section whose items are those of the same section of
    the session's last prompt is not read again (another session's, or a changed one, is)."""
    from types import SimpleNamespace

    from sidecar.assembly import prompt_cache
    from sidecar.assembly.candidates import Section

    read: list[list[bytes]] = []
    digest = prompt_cache._digest
    monkeypatch.setattr(prompt_cache, "_digest", lambda bodies: read.append(bodies) or digest(bodies))

    def section(kind, *bodies):
        return SimpleNamespace(kind=kind, tokens=len(bodies), bodies=list(bodies), item_tokens=[1] * len(bodies))

    memory = prompt_cache.PromptMemory()
    rules, history = section(Section.SYSTEM_RULES, b"rules"), section(Section.RECENT_MESSAGES, b"a", b"b")
    first = memory.compare(("t", "u", "s"), [rules, history], {})
    assert [d.hash for d in first.digests] == [digest([b"rules"]), digest([b"a", b"b"])] and len(read) == 2
    grown = section(Section.RECENT_MESSAGES, b"a", b"b", b"c")
    again = memory.compare(("t", "u", "s"), [section(Section.SYSTEM_RULES, b"rules"), grown], {})
    assert [d.hash for d in again.digests] == [digest([b"rules"]), digest([b"a", b"b", b"c"])]
    assert read[2:] == [[b"a", b"b", b"c"]]  # the rules were not read again
    assert again.prefix_tokens == 1 + 2
    # The same bytes under another section kind, or in another session, are read.
    memory.compare(("t", "u", "s"), [section(Section.TOOLS, b"rules")], {})
    memory.compare(("t", "u", "other"), [section(Section.SYSTEM_RULES, b"rules")], {})
    assert read[3:] == [[b"rules"], [b"rules"]]


def test_a_later_question_gets_its_own_recall_though_the_session_kept_an_earlier_ones(stub, scope, session_id):
    for text in ("The payment api runs in eu-west-1 behind the edge proxy",
                 "The payment api retries a failed charge three times",
                 "The payment api timeout is 30 seconds for card charges",
                 "The payment api logs go to the payments-audit bucket",
                 "The payment api owner on call this week is Priya",
                 "The design team standup is at 9:30 in room Orion"):
        stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC, content=text))
    budget = pb.Budget(max_input=2000, memories=60, flow_unused=False)  # the same for every call, as an agent's are

    def recalled(query):
        resp = _build(stub, scope, session_id, query=query, budget=budget)
        kept = {d.kind: d.hash for d in resp.section_digests}.get(pb.SECTION_KIND_SESSION_RECALL)
        return [i.text for s in resp.sections if s.kind in (pb.SECTION_KIND_SESSION_RECALL, pb.SECTION_KIND_MEMORIES)
                for i in s.items], kept

    first, block = recalled("what do we know about the payment api?")
    assert sum("payment api" in t for t in first) >= 3 and not any("standup" in t for t in first)
    # The payment block fills the budget: kept as it was, the standup could not be recalled after it.
    later, remade = recalled("when is the design team standup?")
    assert any("Orion" in t for t in later) and remade != block
    # The same question again (a tool loop's next model call) keeps the block the last call made.
    again, kept = recalled("when is the design team standup?")
    assert again == later and kept == remade
    # Weighing the block took a second selection: each stage is still reported once, with its time.
    timed = _build(stub, scope, session_id, query="who owns the payment api this week?", budget=budget, debug=True)
    stages = [t.stage for t in timed.timings]
    assert len(stages) == len(set(stages)) and {"features", "select"} <= set(stages)
