"""Secrets never travel: a credential typed in a message, a tool's output, a run note, a fact or a
document is masked (`[secret:kind#n]`) before anything is stored or indexed, so no other session's
context, no table and no in-process index ever holds it; AppendMessages reports what it masked."""

from __future__ import annotations

import re

from sidecar.api import context_service_pb2 as pb
from tests.adversity.harness import duckdb_sql, scan_objects, table_mentions

PASSWORD = "Hunter2-7741xq"
API_KEY = "sk-live-4fQ9zT2mW8rY1uK6pL3vB0nX"
PG_PASS = "s3cr3tPgPw0rd"


def test_secrets_are_masked_at_every_ingest_point(fresh_server):
    stub, scope = fresh_server.stub, pb.Scope(tenant_id="t-secret", user_id="alice")
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    s = dict(scope=scope, session_id=sid)
    out = stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text=f"my db password is {PASSWORD} and the API key {API_KEY}"),
        pb.NewMessage(role=pb.ROLE_ASSISTANT, text="Thanks, I will use them for the migration."),
        pb.NewMessage(role=pb.ROLE_USER, text=f"我的数据库密码是 {PASSWORD}，不要告诉别人")]))
    assert [(m.message_index, m.kind) for m in out.masked] == [(0, "password"), (0, "openai_key"), (2, "password")]
    assert out.messages[0].text == "my db password is [secret:password#1] and the API key [secret:openai_key#2]"
    assert "[secret:password#1]" in out.messages[2].text
    run = stub.StartRun(pb.StartRunRequest(**s, goal="migrate")).run_id
    stub.RecordToolResult(pb.RecordToolResultRequest(**s, run_id=run, tool_name="env", call_id="c",
                                                     full_text=f"DATABASE_URL=postgres://app:{PG_PASS}@db:5432/x"))
    stub.AddRunNote(pb.AddRunNoteRequest(**s, run_id=run, text=f"login works with password: {PASSWORD}"))
    stub.UpsertFacts(pb.UpsertFactsRequest(**s, facts=[pb.FactInput(key="db_password", value=f"password={PASSWORD}",
                                                                     provenance=pb.PROVENANCE_USER_CONFIRMED)]))
    stub.IngestDocument(pb.IngestDocumentRequest(scope=pb.Scope(tenant_id=scope.tenant_id), doc_id="setup",
                                                 text=f"Connect with the key {API_KEY} to the staging api."))
    jobs = list(stub.CommitTurn(pb.CommitTurnRequest(**s)).job_ids)
    assert stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs, timeout_ms=30_000)).all_finished
    # Another session, asked for the password and for something else: no secret in any answer.
    other = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    for query in ("what is my db password?", "数据库密码是什么", "plan the migration", "staging api key"):
        ctx = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=other, query=query,
                                                       render=pb.RENDER_MODE_TEXT))
        raw = ctx.SerializeToString()
        assert not any(secret.encode() in raw for secret in (PASSWORD, API_KEY, PG_PASS)), query
    own = stub.BuildContext(pb.BuildContextRequest(**s, run_id=run, query="what is my db password?",
                                                   render=pb.RENDER_MODE_TEXT))
    assert PASSWORD not in own.rendered_text and "[secret:password#1]" in own.rendered_text
    needles = re.compile("|".join(re.escape(x) for x in (PASSWORD, API_KEY, PG_PASS)))
    assert table_mentions(duckdb_sql(fresh_server.app), needles, PASSWORD) == []
    assert scan_objects(fresh_server.app, needles) == []
