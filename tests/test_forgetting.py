"""Forgetting is what users mean: a deleted memory's source turns leave recall in other sessions (their
own session keeps them as history), also after a restart, and a deleted session or message leaves
nothing behind in any later context."""

from __future__ import annotations

import re

import grpc

from sidecar.api import context_service_pb2 as pb
from sidecar.compress.constraints import constraint_key
from sidecar.memory.episodic import names_pattern
from sidecar.tokens import _head_cost, _newline_cost, count_line, count_tokens_cached
from tests.adversity.harness import all_memories, duckdb_sql, scan_objects, table_mentions
from tests.conftest import Running
from tests.grpc_assert import expect_status


def _append(stub, scope, sid, *texts):
    return stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER if i % 2 == 0 else pb.ROLE_ASSISTANT, text=t)
        for i, t in enumerate(texts)])).messages


def _sources(stub, scope, sid, query):
    ctx = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=query))
    return {i.source for s in ctx.sections for i in s.items}


def _committed(stub, scope, sid):
    jobs = list(stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid)).job_ids)
    assert stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs, timeout_ms=30_000)).all_finished


def test_deleted_memory_takes_its_source_turns_out_of_recall(tmp_path):
    db = str(tmp_path / "forget.duckdb")
    running = Running(db)
    stub, scope = running.stub, pb.Scope(tenant_id="t-forget", user_id="alice")
    first = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    said = _append(stub, scope, first, "We run the billing jobs on the staging cluster every night.",
                   "Noted, nightly billing jobs go to staging.",
                   "我改主意了，默认看测试环境", "好的，以后默认看测试环境。")
    _committed(stub, scope, first)
    pref = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE,
                                              content="默认看测试环境", source_message_ids=[said[2].message_id]))
    billing = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                                 content="Billing jobs run nightly on staging",
                                                 source_message_ids=[said[0].message_id]))
    later = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    billing_turn = f"message:{said[0].message_id}"
    assert billing_turn in _sources(stub, scope, later, "where do the nightly billing jobs run?")
    # The user deletes what was learnt (extracted after the turn or added by the agent).
    learnt = all_memories(stub, scope)
    assert {pref.memory.memory_id, billing.memory.memory_id} <= {m.memory_id for m in learnt}
    for memory in learnt:
        stub.DeleteMemory(pb.DeleteMemoryRequest(scope=scope, memory_id=memory.memory_id))
    assert _text_caches() == []
    for query in ("where do the nightly billing jobs run?", "我默认看哪个环境？", "billing staging 测试环境"):
        got = _sources(stub, scope, later, query)
        assert not {f"message:{m.message_id}" for m in said[:1] + said[2:3]} & got, query
        assert not any(s.startswith("memory:") for s in got)
    # The session it was said in keeps its history.
    assert billing_turn in _sources(stub, scope, first, "where do the nightly billing jobs run?")
    running.stop()
    again = Running(db)  # rebuilt from rows: the exclusions are stored, not only in memory
    try:
        got = _sources(again.stub, scope, later, "where do the nightly billing jobs run?")
        assert billing_turn not in got
        assert not [m for m in all_memories(again.stub, scope) if "Billing" in m.content or "测试环境" in m.content]
    finally:
        again.stop()


def _residue(running, mark: str) -> list[str]:
    needles = re.compile(mark)
    return table_mentions(duckdb_sql(running.app), needles, mark) + scan_objects(running.app, needles)


def _text_caches() -> list[str]:
    """The process-wide caches keyed by text, which a deletion empties (they cannot be searched)."""
    return [f"{f.__name__} holds {f.cache_info().currsize} texts"
            for f in (count_tokens_cached, _head_cost, _newline_cost, constraint_key, names_pattern)
            if f.cache_info().currsize]


def test_delete_messages_takes_the_turns_and_what_was_learnt_only_from_them(fresh_server):
    stub, scope = fresh_server.stub, pb.Scope(tenant_id="t-delmsg", user_id="alice")
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    said = _append(stub, scope, sid, "I prefer the zorbquill dashboard for latency checks.",
                   "Noted: the zorbquill dashboard.", "Never restart the zorbquill primary.",
                   "Understood.", "The payment api runs in eu-west-1.", "Good to know.")
    _committed(stub, scope, sid)
    other = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    assert f"message:{said[0].message_id}" in _sources(stub, scope, other, "which dashboard for latency?")
    doomed = [m.message_id for m in said[:4]]
    deleted = dict(stub.DeleteMessages(pb.DeleteMessagesRequest(scope=scope, session_id=sid, message_ids=doomed)).deleted)
    assert deleted["messages"] == 4 and deleted["pinned_constraints"] == 1
    assert _text_caches() == []
    left = stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=sid, from_seq=1)).messages
    assert [m.message_id for m in left] == [said[4].message_id, said[5].message_id]
    for s in (other, sid):
        got = _sources(stub, scope, s, "which dashboard for latency? which primary must not restart?")
        assert not {f"message:{m}" for m in doomed} & got
    assert not [m for m in all_memories(stub, scope, include_inactive=True) if "zorbquill" in m.content]
    assert _residue(fresh_server, "zorbquill") == []
    expect_status(lambda: stub.DeleteMessages(pb.DeleteMessagesRequest(scope=scope, session_id=sid,
                                                                       message_ids=doomed[:1])),
                  grpc.StatusCode.NOT_FOUND, "message_ids[0]")
    expect_status(lambda: stub.DeleteMessages(pb.DeleteMessagesRequest(scope=scope, session_id=sid)),
                  grpc.StatusCode.INVALID_ARGUMENT, "message_ids")


def test_delete_session_takes_it_whole_with_its_sub_sessions(fresh_server):
    stub, scope = fresh_server.stub, pb.Scope(tenant_id="t-delses", user_id="alice")
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    _append(stub, scope, sid, "Our blentrix cluster runs the search index.", "Noted, blentrix runs search.",
            "Don't drop the blentrix snapshots.", "Understood.")
    s = dict(scope=scope, session_id=sid)
    stub.UpsertFacts(pb.UpsertFactsRequest(**s, facts=[pb.FactInput(key="cluster", value="blentrix-7",
                                                                     provenance=pb.PROVENANCE_USER_CONFIRMED)]))
    run = stub.StartRun(pb.StartRunRequest(**s, goal="blentrix triage")).run_id
    stub.RecordToolResult(pb.RecordToolResultRequest(**s, run_id=run, tool_name="grep", call_id="c",
                                                     full_text="blentrix: 3 errors"))
    stub.AddRunNote(pb.AddRunNoteRequest(**s, run_id=run, text="blentrix node 2 is slow"))
    child = stub.CreateSubSession(pb.CreateSubSessionRequest(scope=scope, parent_session_id=sid,
                                                             task="check blentrix snapshots")).session_id
    _append(stub, scope, child, "blentrix snapshot list looks fine")
    _committed(stub, scope, sid)
    keep = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    kept = _append(stub, scope, keep, "The payment api runs in eu-west-1.")
    assert any(x.startswith("message:") for x in _sources(stub, scope, keep, "what does the blentrix cluster run?"))
    deleted = dict(stub.DeleteSession(pb.DeleteSessionRequest(scope=scope, session_id=sid, idempotency_key="d")).deleted)
    assert deleted["sessions"] == 2 and deleted["messages"] == 5 and deleted["facts"] >= 2
    assert _text_caches() == []
    for gone in (sid, child):
        expect_status(lambda gone=gone: stub.GetSession(pb.GetSessionRequest(scope=scope, session_id=gone)),
                      grpc.StatusCode.NOT_FOUND)
    assert not {x for x in _sources(stub, scope, keep, "what does the blentrix cluster run?")
                if x.startswith(("message:", "memory:"))} - {f"message:{kept[0].message_id}"}
    assert _residue(fresh_server, "blentrix") == []
    # A retry of the delete answers as the first time; the other session is untouched.
    again = stub.DeleteSession(pb.DeleteSessionRequest(scope=scope, session_id=sid, idempotency_key="d"))
    assert dict(again.deleted) == deleted
    assert len(stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=keep, from_seq=1)).messages) == 1


def test_a_superseded_memorys_turn_is_marked_and_ranks_below_the_current_one(fresh_server):
    stub, scope = fresh_server.stub, pb.Scope(tenant_id="t-supersede", user_id="alice")
    first = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    old = _append(stub, scope, first, "By default show me the production environment dashboards.", "Sure.")
    stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE, subject="default_env",
                                       content="Default environment: production",
                                       source_message_ids=[old[0].message_id]))
    second = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    new = _append(stub, scope, second, "Changed my mind: by default show me the staging environment dashboards.",
                  "Noted.")
    out = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE, subject="default_env",
                                             content="Default environment: staging",
                                             source_message_ids=[new[0].message_id]))
    assert out.outcome == pb.WRITE_OUTCOME_SUPERSEDED_OLDER
    later = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    ctx = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=later, query="which environment dashboards "
                                                   "do I see by default?", debug=True))
    items = {i.source: i for s in ctx.sections for i in s.items}
    was, now = items[f"message:{old[0].message_id}"], items[f"message:{new[0].message_id}"]
    assert was.text.startswith("[superseded on ") and "by: Default environment: staging]" in was.text
    assert "production environment" in was.text and not now.text.startswith("[superseded")
    assert was.score < now.score
    # The marked text is counted as packed, once: asked again, the same item and count.
    assert was.tokens == count_line(was.text)
    again = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=later, query="which environment dashboards "
                                                     "do I see by default?", debug=True))
    repeat = {i.source: i for s in again.sections for i in s.items}[was.source]
    assert (repeat.text, repeat.tokens) == (was.text, was.tokens)
