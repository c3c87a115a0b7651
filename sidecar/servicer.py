"""ContextService: each method translates the request, calls one service, translates the answer.
Errors are mapped to status codes by the interceptor in server.py, not here."""

from __future__ import annotations

from sidecar import convert, metrics
from sidecar.api import context_service_pb2 as pb
from sidecar.api import context_service_pb2_grpc as pb_grpc
from sidecar.app import Sidecar
from sidecar.domain import (
    Authority,
    FactStatus,
    GraphEdge,
    MemoryType,
    Provenance,
    RunStatus,
    ToolStatus,
    enum_value,
)
from sidecar.errors import InvalidArgument, NotFound
from sidecar.idempotency import IDEMPOTENT_METHODS
from sidecar.ids import check_id
from sidecar.memory.service import MemoryInput
from sidecar.services.facts import FactInput
from sidecar.services.imports import PastSession


class ContextServicer(pb_grpc.ContextServiceServicer):
    def __init__(self, app: Sidecar) -> None:
        self.app = app

    # ------------------------------------------------------------------ sessions
    def CreateSession(self, request, context):
        s = self.app.sessions.create(convert.scope(request), request.session_id, request.title, dict(request.metadata))
        return convert.session(s)

    def GetSession(self, request, context):
        return convert.session(self.app.sessions.get(convert.scope(request), request.session_id))

    def ListSessions(self, request, context):
        sessions, token = self.app.sessions.list(convert.scope(request), request.page_size, request.page_token,
                                                 request.include_closed)
        return pb.ListSessionsResponse(sessions=[convert.session(s) for s in sessions], next_page_token=token)

    def CloseSession(self, request, context):
        return convert.session(self.app.sessions.close(convert.scope(request), request.session_id))

    def ImportSessions(self, request, context):
        past = [PastSession(messages=convert.new_messages(p.messages, f"sessions[{i}].messages"),
                            session_id=p.session_id, title=p.title, metadata=dict(p.metadata), closed=p.closed)
                for i, p in enumerate(request.sessions)]
        imported = self.app.imports.import_sessions(convert.scope(request), past)
        return pb.ImportSessionsResponse(sessions=[
            pb.ImportedSessionResult(
                session=convert.session(s.session), message_ids=[m.message_id for m in s.messages],
                masked=[pb.MaskedSecret(message_index=i, kind=f.kind, placeholder=f.placeholder) for i, f in s.masked],
                job_ids=s.job_ids)
            for s in imported])

    # ------------------------------------------------------------------ messages
    def AppendMessages(self, request, context):
        scope = convert.scope(request)
        stored, masked = self.app.sessions.append_masked(scope, request.session_id,
                                                         convert.new_messages(request.messages))
        return pb.AppendMessagesResponse(
            messages=[convert.message(m) for m in stored],
            masked=[pb.MaskedSecret(message_index=i, kind=f.kind, placeholder=f.placeholder) for i, f in masked])

    def DeleteMessages(self, request, context):
        return pb.DeleteMessagesResponse(deleted=self.app.deletion.delete_messages(
            convert.scope(request), request.session_id, list(request.message_ids)))

    def DeleteSession(self, request, context):
        return pb.DeleteSessionResponse(deleted=self.app.deletion.delete_session(convert.scope(request),
                                                                                  request.session_id))

    def ListMessages(self, request, context):
        msgs = self.app.sessions.list_messages(convert.scope(request), request.session_id, request.newest,
                                               request.from_seq, request.to_seq)
        return pb.ListMessagesResponse(messages=[convert.message(m) for m in msgs])

    # ------------------------------------------------------------------ facts
    def UpsertFacts(self, request, context):
        inputs = [FactInput(key=f.key, value=f.value,
                            provenance=enum_value(Provenance, f.provenance, f"facts[{i}].provenance"), source=f.source)
                  for i, f in enumerate(request.facts)]
        facts = self.app.facts.upsert(convert.scope(request), request.session_id, inputs)
        return pb.UpsertFactsResponse(facts=[convert.fact(f) for f in facts])

    def ConfirmFact(self, request, context):
        by = enum_value(Provenance, request.confirmed_by, "confirmed_by")
        return convert.fact(self.app.facts.confirm(convert.scope(request), request.session_id, request.key, by,
                                                   request.source))

    def RejectFact(self, request, context):
        which = FactStatus.CANDIDATE if request.which == 0 else enum_value(FactStatus, request.which, "which")
        return convert.fact(self.app.facts.reject(convert.scope(request), request.session_id, request.key, which,
                                                  request.reason))

    def GetSessionState(self, request, context):
        confirmed, candidates, digest = self.app.facts.state(convert.scope(request), request.session_id)
        return pb.SessionState(confirmed=[convert.fact(f) for f in confirmed],
                               candidates=[convert.fact(f) for f in candidates], state_hash=digest)

    def GetFactHistory(self, request, context):
        changes = self.app.facts.history(convert.scope(request), request.session_id, request.key)
        return pb.GetFactHistoryResponse(changes=[convert.fact_change(c) for c in changes])

    # ------------------------------------------------------------------ runs
    def StartRun(self, request, context):
        return convert.run(self.app.runs.start(convert.scope(request), request.session_id, request.run_id,
                                               request.goal))

    def UpdateRun(self, request, context):
        status = enum_value(RunStatus, request.status, "status")
        return convert.run(self.app.runs.update(convert.scope(request), request.session_id, request.run_id, status,
                                                request.reason))

    def GetRun(self, request, context):
        return convert.run(self.app.runs.get(convert.scope(request), request.session_id, request.run_id))

    def Checkpoint(self, request, context):
        cp = self.app.runs.checkpoint(convert.scope(request), request.session_id, request.run_id, request.state,
                                      request.pending_step)
        return convert.checkpoint(cp)

    def ResumeRun(self, request, context):
        run, cp = self.app.runs.resume(convert.scope(request), request.session_id, request.run_id)
        return pb.ResumeRunResponse(run=convert.run(run), checkpoint=convert.checkpoint(cp) if cp else None)

    # ------------------------------------------------------------------ working memory
    def BuildContext(self, request, context):
        result = self.app.builder.build(convert.scope(request), convert.build_request(request))
        metrics.observe_build(result)
        return convert.build_response_bytes(result, request.render)  # sent as is (see server.py)

    def CommitTurn(self, request, context):
        ids = self.app.turns.commit(convert.scope(request), request.session_id, list(request.message_ids))
        return pb.CommitTurnResponse(job_ids=ids)

    def GetJobStatus(self, request, context):
        scope = convert.scope(request, user_required=False)
        check_id(request.job_id, "job_id")
        job = self.app.store.get_job(scope, request.job_id)
        if job is None:
            raise NotFound(f"job_id {request.job_id!r} not found for this tenant and user")
        return convert.job(job)

    def WaitForJobs(self, request, context):
        scope = convert.scope(request, user_required=False)
        for i, jid in enumerate(request.job_ids):
            check_id(jid, f"job_ids[{i}]")
        if request.timeout_ms < 0 or request.timeout_ms > 120_000:
            raise InvalidArgument(f"timeout_ms must be 0-120000 (got {request.timeout_ms})")
        known = {j.job_id for j in self.app.store.get_jobs(scope, list(request.job_ids))}
        for i, jid in enumerate(request.job_ids):  # an unknown job is never "finished"
            if jid not in known:
                raise NotFound(f"job_ids[{i}] {jid!r} not found for this tenant and user")
        jobs, done = self.app.worker.wait(scope, list(request.job_ids), (request.timeout_ms or 10_000) / 1000)
        return pb.WaitForJobsResponse(jobs=[convert.job(j) for j in jobs], all_finished=done)

    # ------------------------------------------------------------------ long-term memory
    def AddMemory(self, request, context):
        inp = MemoryInput(
            type=enum_value(MemoryType, request.type, "type"), content=request.content, subject=request.subject,
            source_message_ids=list(request.source_message_ids),
            confidence=request.confidence if request.HasField("confidence") else 1.0,
            authority=(Authority.USER_STATED if request.authority == 0
                       else enum_value(Authority, request.authority, "authority")),
            expires_at_ms=request.expires_at_ms,
            embedding=list(request.embedding) if request.embedding else None)
        result = self.app.memories.add(convert.scope(request), inp)
        outcome = {"created": pb.WRITE_OUTCOME_CREATED, "merged": pb.WRITE_OUTCOME_MERGED,
                   "superseded_older": pb.WRITE_OUTCOME_SUPERSEDED_OLDER}[result.outcome]
        return pb.AddMemoryResponse(memory=convert.memory(result.memory), outcome=outcome,
                                    superseded_id=result.superseded_id)

    def SearchMemories(self, request, context):
        hits = self.app.memories.search(convert.scope(request), request.query, list(request.query_embedding),
                                        convert.memory_types(request.types, "types"), request.top_k,
                                        request.min_score)
        return pb.SearchMemoriesResponse(hits=[pb.ScoredMemory(memory=convert.memory(h.memory), score=h.score,
                                                               dense_score=h.dense, lexical_score=h.lexical)
                                               for h in hits])

    def ListMemories(self, request, context):
        rows, token = self.app.memories.list(convert.scope(request), request.page_size, request.page_token,
                                             convert.memory_types(request.types, "types"), request.include_inactive)
        return pb.ListMemoriesResponse(memories=[convert.memory(m) for m in rows], next_page_token=token)

    def UpdateMemory(self, request, context):
        m = self.app.memories.update(
            convert.scope(request), request.memory_id,
            content=request.content if request.HasField("content") else None,
            confidence=request.confidence if request.HasField("confidence") else None,
            expires_at_ms=request.expires_at_ms if request.HasField("expires_at_ms") else None,
            type_=enum_value(MemoryType, request.type, "type") if request.HasField("type") else None)
        return convert.memory(m)

    def DeleteMemory(self, request, context):
        self.app.memories.delete(convert.scope(request), request.memory_id)
        return pb.DeleteMemoryResponse(memory_id=request.memory_id)

    def ForgetUser(self, request, context):
        return pb.ForgetUserResponse(deleted=self.app.memories.forget_user(convert.scope(request)))

    def GetMemoryHistory(self, request, context):
        changes = self.app.memories.history(convert.scope(request), request.memory_id)
        return pb.GetMemoryHistoryResponse(changes=[
            pb.MemoryChange(memory=convert.memory(c.memory), action=c.action, reason=c.reason, at_ms=c.at_ms)
            for c in changes])

    # ------------------------------------------------------------------ compression layers
    def RecordToolResult(self, request, context):
        status = ToolStatus.OK if request.status == 0 else enum_value(ToolStatus, request.status, "status")
        r = self.app.compression.record_tool_result(convert.scope(request), request.session_id, request.run_id,
                                                    request.tool_name, request.call_id, request.full_text, status)
        return pb.ToolResultRef(tool_result_id=r.tool_result_id, tokens=r.tokens, lines=r.lines)

    def GetToolResult(self, request, context):
        r = self.app.compression.get_tool_result(convert.scope(request), request.session_id, request.tool_result_id)
        return pb.ToolResult(tool_result_id=r.tool_result_id, session_id=r.session_id, run_id=r.run_id,
                             tool_name=r.tool_name, call_id=r.call_id, full_text=r.full_text, status=int(r.status),
                             tokens=r.tokens, created_at_ms=r.created_at_ms)

    def AddRunNote(self, request, context):
        note = self.app.compression.add_run_note(convert.scope(request), request.session_id, request.run_id,
                                                 request.text)
        return convert.run_note(note)

    def ListRunNotes(self, request, context):
        notes = self.app.compression.list_run_notes(convert.scope(request), request.session_id, request.run_id)
        return pb.ListRunNotesResponse(notes=[convert.run_note(n) for n in notes])

    def ListPinned(self, request, context):
        pins = self.app.pinned.list(convert.scope(request), request.session_id, request.include_unpinned)
        return pb.ListPinnedResponse(pinned=[convert.pinned(p) for p in pins])

    def Unpin(self, request, context):
        return convert.pinned(self.app.pinned.unpin(convert.scope(request), request.session_id, request.pin_id,
                                                     request.by, request.reason))

    def CreateSubSession(self, request, context):
        child = self.app.compression.create_sub_session(convert.scope(request), request.parent_session_id,
                                                        request.session_id, request.task, list(request.fact_keys))
        return convert.session(child)

    def CompleteSubSession(self, request, context):
        r = self.app.compression.complete_sub_session(convert.scope(request), request.session_id,
                                                      request.result_summary)
        return pb.CompleteSubSessionResponse(parent_session_id=r.parent_session_id,
                                             source=f"subsession:{r.child_session_id}", tokens=r.tokens)

    # ------------------------------------------------------------------ knowledge base
    def IngestDocument(self, request, context):
        scope = convert.scope(request, user_required=False)
        if request.format not in (pb.DOCUMENT_FORMAT_UNSPECIFIED, pb.DOCUMENT_FORMAT_TEXT, pb.DOCUMENT_FORMAT_MARKDOWN):
            raise InvalidArgument(f"format must be a DocumentFormat (got {request.format})")
        version, chunks, job_id = self.app.knowledge.ingest(
            scope, request.doc_id, request.title, request.text, request.format, list(request.allowed_roles),
            dict(request.metadata), request.chunking.max_tokens, request.chunking.overlap_tokens,
            request.make_live if request.HasField("make_live") else True)
        return pb.IngestDocumentResponse(doc_id=request.doc_id, version=version, chunk_count=chunks, job_id=job_id)

    def ListDocuments(self, request, context):
        docs = self.app.knowledge.list_documents(convert.scope(request, user_required=False))
        return pb.ListDocumentsResponse(documents=[convert.document_version(d) for d in docs])

    def ListDocumentVersions(self, request, context):
        docs = self.app.knowledge.versions(convert.scope(request, user_required=False), request.doc_id)
        return pb.ListDocumentVersionsResponse(versions=[convert.document_version(d) for d in docs])

    def SetLiveVersion(self, request, context):
        return convert.document_version(self.app.knowledge.set_live(
            convert.scope(request, user_required=False), request.doc_id, request.version))

    def DeleteDocument(self, request, context):
        versions, chunks = self.app.knowledge.delete(convert.scope(request, user_required=False), request.doc_id)
        return pb.DeleteDocumentResponse(versions_deleted=versions, chunks_deleted=chunks)

    def SearchKnowledge(self, request, context):
        hits, matched = self.app.knowledge.search(convert.scope(request, user_required=False), list(request.roles),
                                                  request.query, list(request.query_embedding), request.k)
        return pb.SearchKnowledgeResponse(
            hits=[pb.KnowledgeHit(source=f"kb:{e.chunk.key}", doc_id=e.chunk.doc_id, version=e.chunk.version,
                                  chunk_index=e.chunk.chunk_index, title=e.title, heading=e.chunk.heading,
                                  text=e.chunk.text, score=h.score, tokens=e.chunk.tokens) for h, e in hits],
            status=pb.KNOWLEDGE_STATUS_MATCHED if matched else pb.KNOWLEDGE_STATUS_NO_MATCH)

    def UpsertEdges(self, request, context):
        if not request.edges or len(request.edges) > 1000:
            raise InvalidArgument(f"edges must hold 1-1000 edges (got {len(request.edges)})")
        edges = [GraphEdge(e.edge_id, e.subject, e.relation, e.object, e.source, e.valid_from_ms, e.valid_to_ms)
                 for e in request.edges]
        stored = self.app.knowledge.upsert_edges(convert.scope(request, user_required=False), edges)
        return pb.UpsertEdgesResponse(edges=[convert.edge(e) for e in stored])

    def DeleteEdges(self, request, context):
        return pb.DeleteEdgesResponse(deleted=self.app.knowledge.delete_edges(
            convert.scope(request, user_required=False), list(request.edge_ids)))

    def QueryGraph(self, request, context):
        direction = {0: "out", 1: "out", 2: "in", 3: "both"}.get(request.direction)
        if direction is None:
            raise InvalidArgument(f"direction must be a GraphDirection (got {request.direction})")
        paths = self.app.knowledge.query_graph(convert.scope(request, user_required=False), request.entity,
                                               list(request.relations), request.max_hops, direction, request.at_ms)
        return pb.QueryGraphResponse(paths=[pb.GraphPath(entities=p.entities, edges=[convert.edge(e) for e in p.edges])
                                            for p in paths])



def _retry_safe(name: str, method):
    """The write RPC `name` with its idempotency_key honoured (sidecar.idempotency)."""

    def call(self, request, context):
        scope = convert.scope(request, user_required=False)
        return self.app.idempotency.run(scope, name, request, lambda: method(self, request, context))

    call.__name__ = name
    call.__doc__ = method.__doc__
    return call


for _name in IDEMPOTENT_METHODS:
    setattr(ContextServicer, _name, _retry_safe(_name, getattr(ContextServicer, _name)))
