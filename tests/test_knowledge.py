"""Knowledge base and graph facts through the real server: versions, ACL, grounding, multi-hop,
restart, conflicts with memory."""

import grpc

from sidecar.api import context_service_pb2 as pb
from sidecar.app import Sidecar
from tests.grpc_assert import expect_status

RUNBOOK_V1 = """# Payment API runbook
## Restart procedure
To restart payment-api, drain traffic at the load balancer first, then run a rolling restart with
kubectl rollout restart deployment/payment-api in the payments namespace. Wait for readiness.
## Dependencies
payment-api depends on payment-db and payment-api calls fraud-service.
"""
RUNBOOK_V2 = """# Payment API runbook
## Restart procedure
Restarts of payment-api are done only by the release bot: open a change ticket and let the bot
perform a blue-green switch. Manual rollout restarts are forbidden since version 2.
"""


def _ingest(stub, scope, doc_id, text, roles=(), title="Payment API runbook", **kw):
    r = stub.IngestDocument(pb.IngestDocumentRequest(scope=scope, doc_id=doc_id, title=title, text=text,
                                                     format=pb.DOCUMENT_FORMAT_MARKDOWN, allowed_roles=list(roles),
                                                     **kw))
    done = stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=[r.job_id], timeout_ms=30000))
    assert done.all_finished and done.jobs[0].status == pb.JOB_STATUS_DONE, done
    return r


def _search(stub, scope, query, roles=(), k=5):
    return stub.SearchKnowledge(pb.SearchKnowledgeRequest(scope=scope, query=query, roles=list(roles), k=k))


def test_versions_live_rollback(stub, scope):
    v1 = _ingest(stub, scope, "runbook-pay", RUNBOOK_V1)
    assert v1.version == 1 and v1.chunk_count >= 2
    hits = _search(stub, scope, "how do I restart payment-api?").hits
    assert hits and "rolling restart" in hits[0].text and hits[0].source.startswith("kb:runbook-pay@v1#")
    v2 = _ingest(stub, scope, "runbook-pay", RUNBOOK_V2)
    assert v2.version == 2
    for _ in range(3):
        hits = _search(stub, scope, "restart payment-api rolling restart kubectl", k=10).hits
        assert hits and all(h.version == 2 for h in hits)
        assert not any("kubectl rollout restart" in h.text for h in hits)
    versions = stub.ListDocumentVersions(pb.ListDocumentVersionsRequest(scope=scope, doc_id="runbook-pay")).versions
    assert [(v.version, v.live, v.indexed) for v in versions] == [(1, False, True), (2, True, True)]
    stub.SetLiveVersion(pb.SetLiveVersionRequest(scope=scope, doc_id="runbook-pay", version=1))
    hits = _search(stub, scope, "restart payment-api rolling restart kubectl").hits
    assert hits[0].version == 1 and "kubectl rollout restart" in hits[0].text
    expect_status(lambda: stub.SetLiveVersion(pb.SetLiveVersionRequest(scope=scope, doc_id="runbook-pay", version=9)),
                  grpc.StatusCode.NOT_FOUND, "version 9")


def test_acl_and_tenant_isolation(stub, scope):
    _ingest(stub, scope, "sre-only", "# Break glass\nThe production break-glass password rotation runbook for "
            "ledger-db lives in the vault under sre/breakglass.", roles=["sre"], title="Break glass")
    _ingest(stub, scope, "public", "# Onboarding\nNew developers start with the ledger-db schema overview.",
            title="Onboarding")
    q = "ledger-db break-glass rotation runbook"
    dev = _search(stub, scope, q, roles=["developer"], k=10).hits
    assert dev and all(h.doc_id == "public" for h in dev)
    sre = _search(stub, scope, q, roles=["sre"], k=10).hits
    assert sre[0].doc_id == "sre-only"
    other = pb.Scope(tenant_id=scope.tenant_id + "-other", user_id="x")
    assert not _search(stub, other, q, roles=["sre"]).hits
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    ctx = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=q, roles=["developer"]))
    assert not [it for s in ctx.sections for it in s.items if "sre-only" in it.source]


def test_grounding_matched_and_no_match(stub, scope):
    _ingest(stub, scope, "runbook-pay", RUNBOOK_V1)
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    matched = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid,
                                                       query="what are the steps to restart the payment api?"))
    assert matched.knowledge_status == pb.KNOWLEDGE_STATUS_MATCHED
    kb = [it for s in matched.sections if s.kind in (pb.SECTION_KIND_KNOWLEDGE, pb.SECTION_KIND_SESSION_RECALL)
          for it in s.items if it.source.startswith("kb:")]
    assert any(it.source.startswith("kb:runbook-pay@v1#") for it in kb)
    miss = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid,
                                                    query="what is the capital of France?"))
    assert miss.knowledge_status == pb.KNOWLEDGE_STATUS_NO_MATCH
    assert _search(stub, scope, "favourite pizza topping").status == pb.KNOWLEDGE_STATUS_NO_MATCH
    empty = pb.Scope(tenant_id=scope.tenant_id + "-empty", user_id="u")
    sid2 = stub.CreateSession(pb.CreateSessionRequest(scope=empty)).session_id
    none = stub.BuildContext(pb.BuildContextRequest(scope=empty, session_id=sid2, query="restart payment api"))
    assert none.knowledge_status == pb.KNOWLEDGE_STATUS_NOT_CONSULTED


def test_multi_hop_paths_and_cycles(stub, scope):
    _ingest(stub, scope, "deps", "# Dependencies\ncheckout-web calls payment-api. payment-api depends on payment-db. "
            "payment-db depends on storage-cluster.", title="Service map")
    # a cycle: storage-cluster depends on checkout-web (made up, to prove cycles end)
    stub.UpsertEdges(pb.UpsertEdgesRequest(scope=scope, edges=[
        pb.Edge(subject="storage-cluster", relation="depends_on", object="checkout-web", source="message:m1")]))
    impact = stub.QueryGraph(pb.QueryGraphRequest(scope=scope, entity="storage-cluster", max_hops=3,
                                                  direction=pb.GRAPH_DIRECTION_INCOMING)).paths
    chains = [list(p.entities) for p in impact]
    assert ["storage-cluster", "payment-db", "payment-api", "checkout-web"] in chains
    assert all(len(set(c)) == len(c) and len(c) <= 4 for c in chains)
    three = next(p for p in impact if len(p.edges) == 3 and p.entities[-1] == "checkout-web")
    assert [e.source.split("#")[0] for e in three.edges] == ["kb:deps@v1"] * 3
    outgoing = stub.QueryGraph(pb.QueryGraphRequest(scope=scope, entity="checkout-web", max_hops=3)).paths
    assert ["checkout-web", "payment-api", "payment-db", "storage-cluster"] in [list(p.entities) for p in outgoing]
    expect_status(lambda: stub.QueryGraph(pb.QueryGraphRequest(scope=scope, entity="x", max_hops=4)),
                  grpc.StatusCode.INVALID_ARGUMENT, "max_hops")
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    ctx = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query="what breaks if payment-db is down?"))
    graph = [it for s in ctx.sections for it in s.items if it.source.startswith("graph:")]
    assert graph and any("payment-api --depends_on--> payment-db" in it.text or "payment-db" in it.text for it in graph)
    n = stub.DeleteEdges(pb.DeleteEdgesRequest(scope=scope, edge_ids=[impact[0].edges[0].edge_id])).deleted
    assert n == 1


def test_knowledge_beats_conflicting_memory(stub, scope):
    _ingest(stub, scope, "runbook-pay", RUNBOOK_V2)
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    mem = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                             content="To restart payment-api I just do a manual rollout restart")).memory
    ctx = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query="how do I restart payment-api?"))
    sources = [it.source for s in ctx.sections for it in s.items]
    assert f"memory:{mem.memory_id}" not in sources
    conflict = next(d for d in ctx.dropped if d.source == f"memory:{mem.memory_id}")
    assert conflict.reason == pb.DROP_REASON_CONFLICT_WITH_KNOWLEDGE and conflict.kept_source.startswith("kb:")

    def verdict(query: str) -> list[tuple[str, str]]:
        ctx = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=query))
        return [(d.source, d.kept_source) for d in ctx.dropped if d.reason == pb.DROP_REASON_CONFLICT_WITH_KNOWLEDGE]

    assert verdict("how do I restart payment-api?") == [(conflict.source, conflict.kept_source)]  # kept: the same
    # The memory's text changes (its id may stay): judged again, on what it says now.
    new = stub.UpdateMemory(pb.UpdateMemoryRequest(scope=scope, memory_id=mem.memory_id,
                                                   content="I restart payment api pods on Fridays for fun"))
    assert verdict("how do I restart payment-api?") == []
    stub.UpdateMemory(pb.UpdateMemoryRequest(scope=scope, memory_id=new.memory_id,
                                             content="To restart payment-api I just do a manual rollout restart"))
    assert [k for _, k in verdict("how do I restart payment-api?")] == [conflict.kept_source]


def test_restart_index_agrees_with_rows_and_delete_leaves_nothing(spawn):
    proc = spawn(db_name="kb.duckdb")
    s = pb.Scope(tenant_id="t", user_id="u")
    _ingest(proc.stub, s, "runbook-pay", RUNBOOK_V1)
    _ingest(proc.stub, s, "other", "# Other\nThe order-service owns the checkout queue.", title="Other")
    before = _search(proc.stub, s, "restart payment-api").hits
    assert proc.terminate() == 0
    again = spawn(db_name="kb.duckdb")
    after = _search(again.stub, s, "restart payment-api").hits
    assert [h.source for h in after] == [h.source for h in before]
    deleted = again.stub.DeleteDocument(pb.DeleteDocumentRequest(scope=s, doc_id="runbook-pay"))
    assert deleted.versions_deleted == 1 and deleted.chunks_deleted >= 2
    assert all(h.doc_id != "runbook-pay" for h in _search(again.stub, s, "restart payment-api", k=20).hits)
    again.proc.kill()
    again.proc.wait()
    third = spawn(db_name="kb.duckdb")
    assert all(h.doc_id != "runbook-pay" for h in _search(third.stub, s, "restart payment-api", k=20).hits)
    assert [d.doc_id for d in third.stub.ListDocuments(pb.ListDocumentsRequest(scope=s)).documents] == ["other"]


def test_knowledge_errors(stub, scope):
    expect_status(lambda: stub.IngestDocument(pb.IngestDocumentRequest(scope=scope, doc_id="d", text="")),
                  grpc.StatusCode.INVALID_ARGUMENT, "text")
    expect_status(lambda: stub.IngestDocument(pb.IngestDocumentRequest(scope=scope, doc_id="bad id", text="x")),
                  grpc.StatusCode.INVALID_ARGUMENT, "doc_id")
    expect_status(lambda: stub.IngestDocument(pb.IngestDocumentRequest(
        scope=scope, doc_id="d", text="x", chunking=pb.ChunkingOptions(max_tokens=5))),
        grpc.StatusCode.INVALID_ARGUMENT, "chunking.max_tokens")
    expect_status(lambda: stub.IngestDocument(pb.IngestDocumentRequest(scope=scope, doc_id="d", text="x",
                                                                       allowed_roles=["a b"])),
                  grpc.StatusCode.INVALID_ARGUMENT, "allowed_roles[0]")
    expect_status(lambda: stub.ListDocumentVersions(pb.ListDocumentVersionsRequest(scope=scope, doc_id="nope")),
                  grpc.StatusCode.NOT_FOUND, "doc_id")
    expect_status(lambda: stub.SearchKnowledge(pb.SearchKnowledgeRequest(scope=scope, query="x", k=1000)),
                  grpc.StatusCode.INVALID_ARGUMENT, "k")


def test_unknown_document_format_is_rejected(stub, scope):
    expect_status(lambda: stub.IngestDocument(pb.IngestDocumentRequest(scope=scope, doc_id="d", text="x",
                                                                       format=2147483647)),
                  grpc.StatusCode.INVALID_ARGUMENT, "format")
    assert not stub.ListDocuments(pb.ListDocumentsRequest(scope=scope)).documents


def test_warm_up_after_close_is_quiet(tmp_path):
    """The start-up warm-up thread may run after a quick close: it must stop, not raise."""
    app = Sidecar(str(tmp_path / "closed.duckdb"))
    app.close()
    app.knowledge.warm_up()  # the store is closed: returns without an exception


def test_the_same_edge_twice_in_one_call_is_one_upsert(stub, scope):
    """Once INTERNAL (a duplicate key inside one insert); now the later one wins, as in two calls."""
    same = [pb.Edge(subject="api", relation="calls", object="db", source=f"message:m{i}") for i in range(2)]
    named = [pb.Edge(edge_id="e1", subject="a", relation="calls", object=o) for o in ("b", "c")]
    stored = stub.UpsertEdges(pb.UpsertEdgesRequest(scope=scope, edges=same + named)).edges
    assert [(e.subject, e.object, e.source) for e in stored] == [("api", "db", "message:m1"), ("a", "c", "")]
    paths = stub.QueryGraph(pb.QueryGraphRequest(scope=scope, entity="a", max_hops=1)).paths
    assert [list(p.entities) for p in paths] == [["a", "c"]]


def test_packed_chunk_items_are_dropped_with_their_chunks(tmp_path):
    """BuildContext keeps each packed chunk's item bytes; a new live version or a deleted document drops
    them, so no text of a replaced or deleted chunk stays behind in the sidecar."""
    from sidecar.assembly.builder import BuildRequest
    from sidecar.domain import Scope

    app = Sidecar(str(tmp_path / "items.duckdb"))
    try:
        scope = Scope("t", "u")

        def ingest(text: str) -> None:
            *_, job_id = app.knowledge.ingest(scope, "runbook-pay", "Payment API runbook", text,
                                              pb.DOCUMENT_FORMAT_MARKDOWN, (), {}, 128, 0, True)
            assert app.worker.wait(scope, [job_id], 30)[1]

        ingest(RUNBOOK_V1)
        tk = app.knowledge.tenant("t")
        sid = app.sessions.create(scope, "s", "", {}).session_id
        request = BuildRequest(session_id=sid, query="how do I restart payment-api?")

        def packed_kb() -> set[str]:
            return {it.source[3:] for kind, items in app.builder.build(scope, request).sections for it in items
                    if it.source.startswith("kb:")}

        v1 = packed_kb()
        assert v1 and v1 <= set(tk.items)
        ingest(RUNBOOK_V2)
        v2 = packed_kb()
        assert v2 and not v2 & v1 and v2 <= set(tk.items) and not set(tk.items) & v1
        app.knowledge.delete(scope, "runbook-pay")
        assert not packed_kb() and not set(tk.items) & (v1 | v2)
    finally:
        app.close()


def test_graph_items_follow_edge_changes_and_validity(stub, scope):
    """BuildContext keeps a neighbourhood's items between calls; a changed or deleted edge, and an edge
    that starts or stops being valid, shows in the very next call."""
    import time

    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id

    def graph_texts() -> list[str]:
        ctx = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query="what does billing-api call?"))
        return sorted(it.text for s in ctx.sections for it in s.items if it.source.startswith("graph:"))

    now = int(time.time() * 1000)
    stub.UpsertEdges(pb.UpsertEdgesRequest(scope=scope, edges=[
        pb.Edge(edge_id="e-db", subject="billing-api", relation="calls", object="billing-db"),
        pb.Edge(edge_id="e-old", subject="billing-api", relation="calls", object="legacy-queue", valid_to_ms=now + 1500),
        pb.Edge(edge_id="e-new", subject="billing-api", relation="calls", object="event-bus", valid_from_ms=now + 1500)]))
    before = graph_texts()
    assert before == graph_texts() == ["billing-api --calls--> billing-db", "billing-api --calls--> legacy-queue"]
    stub.UpsertEdges(pb.UpsertEdgesRequest(scope=scope, edges=[
        pb.Edge(edge_id="e-db", subject="billing-api", relation="reads", object="billing-db")]))
    assert graph_texts() == ["billing-api --calls--> legacy-queue", "billing-api --reads--> billing-db"]
    time.sleep(max(0.0, (now + 1600) / 1000 - time.time()))
    assert graph_texts() == ["billing-api --calls--> event-bus", "billing-api --reads--> billing-db"]
    stub.DeleteEdges(pb.DeleteEdgesRequest(scope=scope, edge_ids=["e-db"]))
    assert graph_texts() == ["billing-api --calls--> event-bus"]
