"""The OpsPilot demo (issue #8), end to end against a running sidecar:

    python -m sidecar demo [--address HOST:PORT] [--auth-token T] [--tls-ca PEM]   (default 127.0.0.1:50051)

A tenant's runbooks are ingested (one SRE-only, plus a service-dependency doc so graph facts exist),
a user who prefers concise answers and forbids restarting production works a payment-api 5xx
incident over several turns with tool calls, facts carry provenance (a model guess stays a candidate
until a tool confirms it), the run pauses for human approval of a staging restart and resumes, and
the assembled context is printed section by section with source tags, scores and tokens, plus the
dropped report and the knowledge status. Each run uses its own tenant unless --tenant is given. The
token comes from --auth-token or SIDECAR_AUTH_TOKEN, as the sidecar's own does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid

import grpc

from sidecar.api import context_service_pb2 as pb
from sidecar.api import context_service_pb2_grpc as pb_grpc

RUNBOOK_5XX = """# payment-api 5xx runbook

## Symptoms
payment-api returns HTTP 500/503 to checkout-web; the error rate on the payments dashboard rises above 1%.

## First checks
Query the payment-api logs with level=ERROR in the incident's environment for the last 30 minutes.
Look for "pool exhausted" and upstream timeouts to payment-db. Compare the error rate with the last deploy marker.

## Mitigation
If the errors started with a deploy, roll back with the release pipeline. If the connection pool is exhausted,
raise the pool size in staging first and verify before touching production.
"""

RUNBOOK_RESTART = """# Production restart procedure (SRE only)

## Approval
Restarting any production instance needs explicit approval from the incident commander, recorded in the ticket.

## Staging first
Restart the staging instance first, watch the error rate for 10 minutes, then ask for production approval.
"""

DEPENDENCIES = """# Service dependencies

## payment-api
payment-api depends on payment-db. payment-api calls risk-service. checkout-web calls payment-api.

## payment-db
payment-db is backed by pg-cluster-3.
"""

LOG_EXCERPT = """2026-11-03T10:02:11Z INFO  payment-api request POST /v1/charge 200 83ms
2026-11-03T10:02:14Z ERROR payment-api pool exhausted (size=50, waiting=212) acquiring payment-db connection
2026-11-03T10:02:14Z ERROR payment-api 503 POST /v1/charge 2011ms upstream=payment-db
2026-11-03T10:02:15Z WARN  payment-api retrying payment-db connect (attempt 3)
2026-11-03T10:02:16Z ERROR payment-api 500 POST /v1/refund 1507ms: timeout acquiring connection
2026-11-03T10:02:18Z INFO  payment-api healthcheck ok"""

RULES = ("You are OpsPilot, an operations assistant. You may query logs, metrics and traces. Any write action "
         "(restart, scale, rollback, config change) needs explicit human approval. Cite the evidence you used "
         "and say so when the knowledge base has no answer.")
TOOLS = [pb.ToolSchema(name="query_logs", description="Query a service's logs",
                       schema_json='{"serviceId":"string","env":"string","timeRange":"string","level":"string"}'),
         pb.ToolSchema(name="restart_service", description="Restart a service instance (needs human approval)",
                       schema_json='{"serviceId":"string","env":"string"}')]


def _short(text: str, width: int = 96) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _name(enum, value: int, prefix: str) -> str:
    return enum.Name(value).removeprefix(prefix)


def run_demo(stub: pb_grpc.ContextServiceStub, tenant: str, user: str, out=print) -> int:
    kb_scope = pb.Scope(tenant_id=tenant)
    scope = pb.Scope(tenant_id=tenant, user_id=user)

    out(f"== OpsPilot demo: tenant {tenant}, user {user}")
    # -- the tenant's knowledge base
    jobs = []
    for doc_id, title, text, roles in (("rb-payment-5xx", "payment-api 5xx runbook", RUNBOOK_5XX, []),
                                       ("rb-prod-restart", "Production restart procedure", RUNBOOK_RESTART, ["sre"]),
                                       ("svc-deps", "Service dependencies", DEPENDENCIES, [])):
        r = stub.IngestDocument(pb.IngestDocumentRequest(scope=kb_scope, doc_id=doc_id, title=title, text=text,
                                                         format=pb.DOCUMENT_FORMAT_MARKDOWN, allowed_roles=roles))
        jobs.append(r.job_id)
        out(f"ingested {doc_id} v{r.version}: {r.chunk_count} chunks, roles {roles or ['(whole tenant)']}")
    waited = stub.WaitForJobs(pb.WaitForJobsRequest(scope=kb_scope, job_ids=jobs, timeout_ms=30_000))
    edges = sum(int(j.result.get("edges", "0")) for j in waited.jobs)
    out(f"indexing finished: {waited.all_finished}; graph edges extracted: {edges}")
    paths = stub.QueryGraph(pb.QueryGraphRequest(scope=kb_scope, entity="payment-api", max_hops=2)).paths
    for p in paths[:4]:
        out("  graph: " + " -> ".join(p.entities) + "  [" + ", ".join(e.relation for e in p.edges) + "]")

    # -- the user's long-term memory: a stated preference, and one extracted from a committed turn
    pref = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE,
                                              content="Prefers concise answers: conclusion first, then evidence.",
                                              subject="answer_style"))
    out(f"memory {pref.memory.memory_id}: {_name(pb.WriteOutcome, pref.outcome, 'WRITE_OUTCOME_')} "
        f"'{pref.memory.content}'")
    onboarding = stub.CreateSession(pb.CreateSessionRequest(scope=scope, title="onboarding")).session_id
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=onboarding, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="I usually check the payments dashboard in grafana first."),
        pb.NewMessage(role=pb.ROLE_ASSISTANT, text="Noted, I will link the payments dashboard first.")]))
    commit = stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=onboarding))
    done = stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=list(commit.job_ids), timeout_ms=30_000))
    for j in done.jobs:
        if j.kind == "extract_memories":
            out(f"CommitTurn -> extract_memories job: {dict(sorted(j.result.items()))}")

    # -- the incident, turn by turn
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, title="payment-api 5xx in prod")).session_id
    out(f"\n== session {sid}: payment-api 5xx incident in production")

    def say(role, text, **kw):
        m = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
            pb.NewMessage(role=role, text=text, **kw)])).messages[0]
        out(f"  [{_name(pb.Role, role, 'ROLE_').lower():9}] {_short(text, 110)}")
        return m

    first = say(pb.ROLE_USER, "生产环境的 payment-api 从 10:00 开始大量 5xx，帮我查一下。不要重启生产实例。")
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=sid, facts=[
        pb.FactInput(key="service", value="payment-api", provenance=pb.PROVENANCE_USER_CONFIRMED,
                     source=first.message_id),
        pb.FactInput(key="env", value="production", provenance=pb.PROVENANCE_USER_CONFIRMED,
                     source=first.message_id)]))
    say(pb.ROLE_ASSISTANT, "Checking payment-api errors in production for the last 30 minutes.")
    run = stub.StartRun(pb.StartRunRequest(scope=scope, session_id=sid, goal="find the cause of payment-api 5xx"))
    out(f"run {run.run_id} started: {_name(pb.RunStatus, run.status, 'RUN_STATUS_')}")
    say(pb.ROLE_ASSISTANT, 'query_logs {"serviceId":"payment-api","env":"production","level":"ERROR"}',
        tool_name="query_logs", tool_call_id="call-1")
    ref = stub.RecordToolResult(pb.RecordToolResultRequest(scope=scope, session_id=sid, run_id=run.run_id,
                                                           tool_name="query_logs", call_id="call-1",
                                                           full_text=LOG_EXCERPT, status=pb.TOOL_STATUS_OK))
    out(f"tool result tool:{ref.tool_result_id}: {ref.lines} lines, {ref.tokens} tokens")

    # provenance: a model guess is only a candidate until a tool verifies it
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=sid, facts=[
        pb.FactInput(key="hypothesis", value="payment-db connection pool exhausted",
                     provenance=pb.PROVENANCE_MODEL_INFERRED, source=f"tool:{ref.tool_result_id}")]))
    state = stub.GetSessionState(pb.GetSessionStateRequest(scope=scope, session_id=sid))
    out("state after the model's guess: confirmed " + ", ".join(f"{f.key}={f.value}" for f in state.confirmed)
        + " | candidates " + ", ".join(f"{f.key}={f.value} ({_name(pb.Provenance, f.provenance, 'PROVENANCE_')})"
                                       for f in state.candidates))
    say(pb.ROLE_USER, "它的错误日志呢？ Are those pool errors new since the deploy?")
    metrics = stub.RecordToolResult(pb.RecordToolResultRequest(
        scope=scope, session_id=sid, run_id=run.run_id, tool_name="query_metrics", call_id="call-2",
        full_text="payment_db_pool_in_use{service=\"payment-api\",env=\"production\"} 50/50 since 10:01:58Z "
                  "(deploy 4812 at 10:01:40Z)", status=pb.TOOL_STATUS_OK))
    confirmed = stub.ConfirmFact(pb.ConfirmFactRequest(scope=scope, session_id=sid, key="hypothesis",
                                                       confirmed_by=pb.PROVENANCE_TOOL_VERIFIED,
                                                       source=f"tool:{metrics.tool_result_id}"))
    out(f"fact {confirmed.key} confirmed by {_name(pb.Provenance, confirmed.provenance, 'PROVENANCE_')} "
        f"(tool:{metrics.tool_result_id}), status {_name(pb.FactStatus, confirmed.status, 'FACT_STATUS_')}")
    stub.AddRunNote(pb.AddRunNoteRequest(scope=scope, session_id=sid, run_id=run.run_id,
                                         text="Confirmed: payment-api (production) pool to payment-db exhausted "
                                              "since deploy 4812."))

    # -- human approval: the run pauses with the pending step, then resumes
    say(pb.ROLE_ASSISTANT, "Proposal: restart payment-api in staging with a larger pool to verify the fix. "
                           "Waiting for your approval.")
    pending = json.dumps({"tool": "restart_service", "args": {"serviceId": "payment-api", "env": "staging"}})
    cp = stub.Checkpoint(pb.CheckpointRequest(scope=scope, session_id=sid, run_id=run.run_id,
                                              state=b'{"step": 3, "plan": ["logs", "metrics", "restart-staging"]}',
                                              pending_step=pending))
    paused = stub.UpdateRun(pb.UpdateRunRequest(scope=scope, session_id=sid, run_id=run.run_id,
                                                status=pb.RUN_STATUS_INTERRUPTED, reason="awaiting human approval"))
    out(f"checkpoint #{cp.seq} stored; run {run.run_id} {_name(pb.RunStatus, paused.status, 'RUN_STATUS_')} "
        f"({paused.reason}); pending step {pending}")
    say(pb.ROLE_USER, "Approved: restart staging only.")
    resumed = stub.ResumeRun(pb.ResumeRunRequest(scope=scope, session_id=sid, run_id=run.run_id))
    out(f"run {resumed.run.run_id} resumed: {_name(pb.RunStatus, resumed.run.status, 'RUN_STATUS_')}, "
        f"checkpoint #{resumed.checkpoint.seq} pending step {resumed.checkpoint.pending_step}")

    # -- the assembled context of the next model call
    req = pb.BuildContextRequest(scope=scope, session_id=sid, run_id=run.run_id,
                                 query="它的错误日志呢？ payment-api 5xx in production: may I restart the production instance?",
                                 system_rules=RULES, tools=TOOLS, roles=["sre"], max_dropped=20,
                                 # tight soft budgets so the dropped report has something to say
                                 budget=pb.Budget(memories=80, rag_or_graph=160, tool_observations=320,
                                                  flow_unused=False))
    ctx = stub.BuildContext(req)
    out(f"\n== BuildContext (roles [sre]): {ctx.total_tokens}/{ctx.total_budget} tokens "
        f"(hard {ctx.hard_zone_tokens}, soft {ctx.soft_zone_tokens}), stable prefix {ctx.stable_prefix_tokens} "
        f"tokens {ctx.stable_prefix_hash[:12]}")
    for section in ctx.sections:
        out(f"-- {_name(pb.SectionKind, section.kind, 'SECTION_KIND_')} ({section.tokens} tokens)")
        for item in section.items:
            out(f"   {item.source:<44} score {item.score:6.3f} {item.tokens:5d} tok  {_short(item.text, 70)}")
    out("-- usage: " + "; ".join(f"{_name(pb.Category, u.category, 'CATEGORY_')} {u.used}/{u.budget} "
                                 f"({u.selected}/{u.candidates})" for u in ctx.usage))
    out("-- dropped: " + (", ".join(f"{_name(pb.DropReason, c.reason, 'DROP_REASON_')}={c.count}"
                                    for c in ctx.dropped_counts) or "none"))
    for d in ctx.dropped[:10]:
        kept = f" (kept {d.kept_source})" if d.kept_source else ""
        out(f"   {d.source:<44} {_name(pb.DropReason, d.reason, 'DROP_REASON_'):<24} score {d.score:6.3f} "
            f"{d.tokens:5d} tok{kept}")
    out(f"-- knowledge_status: {_name(pb.KnowledgeStatus, ctx.knowledge_status, 'KNOWLEDGE_STATUS_')}")

    # the same call for a caller without the sre role: the SRE-only runbook is never a candidate
    other = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, run_id=run.run_id,
                                                     query=req.query, system_rules=RULES, tools=TOOLS,
                                                     roles=["support"]))
    kb_support = sorted({i.source.split("@")[0] for s in other.sections for i in s.items if i.source.startswith("kb:")})
    out(f"roles [support] see documents: {', '.join(kb_support) or 'none'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sidecar demo", description="OpsPilot demo against a running "
                                     "Context Sidecar")
    parser.add_argument("--address", default="127.0.0.1:50051", help="sidecar HOST:PORT (default 127.0.0.1:50051)")
    parser.add_argument("--tenant", default="", help="tenant id (default: a fresh opspilot-<hex> per run)")
    parser.add_argument("--user", default="alice")
    parser.add_argument("--auth-token", default=os.environ.get("SIDECAR_AUTH_TOKEN", ""),
                        help="bearer token, when the sidecar requires one (env SIDECAR_AUTH_TOKEN)")
    parser.add_argument("--tls-ca", default="", help="PEM certificate to trust: connect over TLS (a sidecar "
                        "served with --tls-cert)")
    parser.add_argument("--connect-timeout", type=float, default=10.0, help="seconds to wait for the sidecar")
    args = parser.parse_args(argv)
    tenant = args.tenant or f"opspilot-{uuid.uuid4().hex[:8]}"
    if args.tls_ca:
        try:
            with open(args.tls_ca, "rb") as f:
                trusted = f.read()
        except OSError as e:
            print(f"cannot read --tls-ca {args.tls_ca}: {e.strerror}", file=sys.stderr)
            return 2
        channel = grpc.secure_channel(args.address, grpc.ssl_channel_credentials(root_certificates=trusted))
    else:
        channel = grpc.insecure_channel(args.address)
    try:
        grpc.channel_ready_future(channel).result(timeout=args.connect_timeout)
    except grpc.FutureTimeoutError:
        print(f"no sidecar answering on {args.address}; start one with `python -m sidecar serve` "
              "(one serving TLS needs --tls-ca)", file=sys.stderr)
        return 2
    if args.auth_token:
        token = args.auth_token
        channel = grpc.intercept_channel(channel, _BearerInterceptor(token))
    try:
        return run_demo(pb_grpc.ContextServiceStub(channel), tenant, args.user)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.UNAUTHENTICATED:
            print(f"the sidecar on {args.address} answered UNAUTHENTICATED ({e.details()}): set SIDECAR_AUTH_TOKEN "
                  "or pass --auth-token with the token it was started with", file=sys.stderr)
            return 2
        print(f"demo failed: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    finally:
        channel.close()


class _BearerInterceptor(grpc.UnaryUnaryClientInterceptor):
    def __init__(self, token: str) -> None:
        self.metadata = (("authorization", f"Bearer {token}"),)

    def intercept_unary_unary(self, continuation, client_call_details, request):
        details = client_call_details._replace(metadata=tuple(client_call_details.metadata or ()) + self.metadata) \
            if hasattr(client_call_details, "_replace") else client_call_details
        return continuation(details, request)


if __name__ == "__main__":
    raise SystemExit(main())
