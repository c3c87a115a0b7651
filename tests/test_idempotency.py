"""Every write RPC takes an idempotency key: a retry returns the first answer and writes nothing; the
same key with another request is FAILED_PRECONDITION; unknown job ids are NOT_FOUND."""

from __future__ import annotations

import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from sidecar.idempotency import IDEMPOTENT_METHODS
from tests.grpc_assert import expect_status

WRITE_PREFIXES = ("Create", "Close", "Append", "Upsert", "Confirm", "Reject", "Start", "Update", "Checkpoint",
                  "Resume", "Record", "Add", "Complete", "Commit", "Delete", "Forget", "Ingest", "SetLive", "Unpin",
                  "Import")


def test_every_write_rpc_takes_an_idempotency_key():
    service = pb.DESCRIPTOR.services_by_name["ContextService"]
    writes = {m.name for m in service.methods if m.name.startswith(WRITE_PREFIXES)}
    assert len(writes) >= 25
    assert writes == set(IDEMPOTENT_METHODS)


def _twice(call, request):
    first = call(request)
    again = call(request)
    assert again == first
    return first


def test_retried_writes_return_the_first_answer_and_write_nothing(stub, scope, session_id):
    s = dict(scope=scope, session_id=session_id)
    # Facts: one history entry, not two.
    _twice(stub.UpsertFacts, pb.UpsertFactsRequest(**s, idempotency_key="f1", facts=[
        pb.FactInput(key="env", value="prod", provenance=pb.PROVENANCE_USER_CONFIRMED)]))
    assert len(stub.GetFactHistory(pb.GetFactHistoryRequest(**s, key="env")).changes) == 1
    # A run, its note and a tool result.
    run = _twice(stub.StartRun, pb.StartRunRequest(**s, run_id="r1", goal="triage", idempotency_key="r1"))
    _twice(stub.AddRunNote, pb.AddRunNoteRequest(**s, run_id=run.run_id, text="checked the pool",
                                                 idempotency_key="n1"))
    assert len(stub.ListRunNotes(pb.ListRunNotesRequest(**s, run_id=run.run_id)).notes) == 1
    ref = _twice(stub.RecordToolResult, pb.RecordToolResultRequest(
        **s, run_id=run.run_id, tool_name="grep", call_id="c1", full_text="3 errors", idempotency_key="t1"))
    assert stub.GetToolResult(pb.GetToolResultRequest(**s, tool_result_id=ref.tool_result_id)).full_text == "3 errors"
    # Messages: a request-level key replays the whole answer.
    appended = _twice(stub.AppendMessages, pb.AppendMessagesRequest(**s, idempotency_key="a1", messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="I prefer answers in English")]))
    assert len(stub.ListMessages(pb.ListMessagesRequest(**s, from_seq=1)).messages) == 1
    commit = _twice(stub.CommitTurn, pb.CommitTurnRequest(**s, idempotency_key="c1"))
    assert stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=list(commit.job_ids),
                                                  timeout_ms=30_000)).all_finished
    # Long-term memory.
    added = _twice(stub.AddMemory, pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                                       content="The team's on-call rota changes on Mondays",
                                                       idempotency_key="m1"))
    rows = stub.ListMemories(pb.ListMemoriesRequest(scope=scope)).memories
    assert [m.memory_id for m in rows if m.content.startswith("The team's on-call")] == [added.memory.memory_id]
    # A session created without an id: the retry names the same one.
    created = _twice(stub.CreateSession, pb.CreateSessionRequest(scope=scope, title="t", idempotency_key="s1"))
    ids = [x.session_id for x in stub.ListSessions(pb.ListSessionsRequest(scope=scope)).sessions]
    assert ids.count(created.session_id) == 1 and len(ids) == 2
    assert appended.messages[0].text == "I prefer answers in English"


def test_retried_knowledge_writes_are_tenant_wide(stub, scope):
    tenant = pb.Scope(tenant_id=scope.tenant_id)
    req = pb.IngestDocumentRequest(scope=tenant, doc_id="runbook", text="Restart the cache with care.",
                                   idempotency_key="d1")
    first = _twice(stub.IngestDocument, req)
    assert first.version == 1
    assert len(stub.ListDocumentVersions(pb.ListDocumentVersionsRequest(scope=tenant, doc_id="runbook")).versions) == 1
    edges = pb.UpsertEdgesRequest(scope=tenant, idempotency_key="e1", edges=[
        pb.Edge(subject="payment-api", relation="depends_on", object="payment-db")])
    assert _twice(stub.UpsertEdges, edges).edges[0].edge_id


def test_a_key_reused_for_another_request_is_refused_and_writes_nothing(stub, scope, session_id):
    s = dict(scope=scope, session_id=session_id)
    stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE, content="I like tea",
                                       idempotency_key="k"))
    expect_status(lambda: stub.AddMemory(pb.AddMemoryRequest(
        scope=scope, type=pb.MEMORY_TYPE_PREFERENCE, content="I like coffee", idempotency_key="k")),
        grpc.StatusCode.FAILED_PRECONDITION, "idempotency_key")
    assert [m.content for m in stub.ListMemories(pb.ListMemoriesRequest(scope=scope)).memories] == ["I like tea"]
    # The same key is free for another method, and for another user.
    stub.UpsertFacts(pb.UpsertFactsRequest(**s, idempotency_key="k", facts=[
        pb.FactInput(key="region", value="eu", provenance=pb.PROVENANCE_USER_CONFIRMED)]))
    bob = pb.Scope(tenant_id=scope.tenant_id, user_id="bob")
    out = stub.AddMemory(pb.AddMemoryRequest(scope=bob, type=pb.MEMORY_TYPE_PREFERENCE, content="I like coffee",
                                             idempotency_key="k"))
    assert out.memory.content == "I like coffee"
    expect_status(lambda: stub.AddMemory(pb.AddMemoryRequest(
        scope=scope, type=pb.MEMORY_TYPE_PREFERENCE, content="x", idempotency_key="k" * 129)),
        grpc.StatusCode.INVALID_ARGUMENT, "idempotency_key")


def test_a_failed_write_records_no_key(stub, scope, session_id):
    req = pb.AddRunNoteRequest(scope=scope, session_id=session_id, run_id="nope", text="x", idempotency_key="n")
    expect_status(lambda: stub.AddRunNote(req), grpc.StatusCode.NOT_FOUND)
    stub.StartRun(pb.StartRunRequest(scope=scope, session_id=session_id, run_id="nope", goal="g"))
    assert stub.AddRunNote(req).text == "x"  # the retry after the fix runs


@pytest.mark.parametrize("ids", [["job_unknown"], []])
def test_wait_for_unknown_jobs_is_not_found(stub, scope, ids):
    if ids:
        expect_status(lambda: stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=ids)),
                      grpc.StatusCode.NOT_FOUND, "job_ids[0]")
    else:  # no ids: every unfinished job of the scope, none here
        assert stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, timeout_ms=10)).all_finished


def test_wait_for_several_jobs_answers_in_the_order_asked(stub, scope, session_id):
    """The ids are read in one query: every job once per id asked, in that order; one unknown id is named."""
    msgs = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=session_id, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="From now on I prefer short answers.")])).messages
    ids = list(stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=session_id,
                                                    message_ids=[m.message_id for m in msgs])).job_ids)
    assert len(ids) >= 2
    asked = [*ids[::-1], ids[0]]
    done = stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=asked, timeout_ms=30000))
    assert done.all_finished and [j.job_id for j in done.jobs] == asked
    expect_status(lambda: stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=[ids[0], "job_unknown"])),
                  grpc.StatusCode.NOT_FOUND, "job_ids[1]")
