"""Protobuf <-> domain conversion. Enums share numbers, so conversion is a cast plus validation."""

from __future__ import annotations

import numpy as np

import fastpath
from sidecar.api import context_service_pb2 as pb
from sidecar.assembly.budget import BUDGET_FIELDS, DEFAULT_BUDGET, Budget
from sidecar.assembly.builder import BuildRequest, ToolSpec
from sidecar.assembly.provider_render import Provider, check_tools, render_provider
from sidecar.assembly.render import render_chat_indexed, render_text
from sidecar.domain import (
    Fact,
    FactChange,
    Message,
    NewMessage,
    Role,
    Run,
    RunCheckpoint,
    Scope,
    Session,
    ToolCall,
    enum_value,
)
from sidecar.errors import InvalidArgument
from sidecar.ids import check_timestamp
from sidecar.services.pinned import ShownPin


def scope(request, *, user_required: bool = True) -> Scope:
    if not request.HasField("scope"):
        raise InvalidArgument("scope is required")
    return Scope.checked(request.scope.tenant_id, request.scope.user_id, user_required=user_required)


def session(s: Session) -> pb.Session:
    return pb.Session(
        session_id=s.session_id, title=s.title, status=int(s.status), created_at_ms=s.created_at_ms,
        updated_at_ms=s.updated_at_ms, closed_at_ms=s.closed_at_ms, parent_session_id=s.parent_session_id,
        task=s.task, metadata=s.metadata, message_count=s.message_count,
    )


def new_messages(msgs, field: str = "messages") -> list[NewMessage]:
    return [
        NewMessage(role=enum_value(Role, m.role, f"{field}[{i}].role"), text=m.text, tool_name=m.tool_name,
                   tool_call_id=m.tool_call_id, client_timestamp_ms=m.client_timestamp_ms,
                   idempotency_key=m.idempotency_key, speaker=m.speaker,
                   tool_calls=tuple(ToolCall(c.id, c.name, c.arguments_json) for c in m.tool_calls))
        for i, m in enumerate(msgs)
    ]


def message(m: Message) -> pb.Message:
    return pb.Message(
        message_id=m.message_id, session_id=m.session_id, seq=m.seq, role=int(m.role), text=m.text,
        tool_name=m.tool_name, tool_call_id=m.tool_call_id, timestamp_ms=m.timestamp_ms,
        created_at_ms=m.created_at_ms, tokens=m.tokens, idempotency_key=m.idempotency_key, speaker=m.speaker,
        tool_calls=[pb.ToolCall(id=c.id, name=c.name, arguments_json=c.arguments_json) for c in m.tool_calls],
    )


def fact(f: Fact) -> pb.Fact:
    return pb.Fact(key=f.key, value=f.value, provenance=int(f.provenance), source=f.source,
                   updated_at_ms=f.updated_at_ms, status=int(f.status), version=f.version, tokens=f.tokens)


def fact_change(c: FactChange) -> pb.FactChange:
    return pb.FactChange(fact=fact(c.fact), action=c.action, reason=c.reason)


def run(r: Run) -> pb.Run:
    return pb.Run(run_id=r.run_id, session_id=r.session_id, status=int(r.status), goal=r.goal, reason=r.reason,
                  created_at_ms=r.created_at_ms, updated_at_ms=r.updated_at_ms, checkpoint_count=r.checkpoint_count)


def checkpoint(c: RunCheckpoint) -> pb.RunCheckpoint:
    return pb.RunCheckpoint(checkpoint_id=c.checkpoint_id, run_id=c.run_id, seq=c.seq, state=c.state,
                            pending_step=c.pending_step, created_at_ms=c.created_at_ms)


def budget(request_budget, present: bool) -> Budget:
    if not present:
        return DEFAULT_BUDGET
    return Budget.from_overrides({name: getattr(request_budget, name) for name in BUDGET_FIELDS
                                  if request_budget.HasField(name)})


def build_request(request) -> BuildRequest:
    for i, t in enumerate(request.tools):
        if not t.name:
            raise InvalidArgument(f"tools[{i}].name is required")
    if request.min_score != request.min_score:  # NaN
        raise InvalidArgument("min_score must be a number")
    if request.render not in (pb.RENDER_MODE_UNSPECIFIED, pb.RENDER_MODE_TEXT, pb.RENDER_MODE_CHAT, *Provider):
        raise InvalidArgument(f"render must be a RenderMode (got {request.render})")
    check_timestamp(request.asked_at_ms, "asked_at_ms")
    if request.layout not in (pb.LAYOUT_CACHE_AWARE, pb.LAYOUT_CLASSIC):
        raise InvalidArgument(f"layout must be a Layout (got {request.layout})")
    tools = [ToolSpec(t.name, t.description, t.schema_json) for t in request.tools]
    if request.render in tuple(Provider):
        check_tools(tools)
    return BuildRequest(
        session_id=request.session_id, run_id=request.run_id, query=request.query,
        system_rules=request.system_rules,
        tools=tools,
        budget=budget(request.budget, request.HasField("budget")), roles=tuple(request.roles),
        query_embedding=np.asarray(request.query_embedding, np.float32) if request.query_embedding else None,
        debug=request.debug, min_score=request.min_score if request.min_score else float("-inf"),
        max_dropped=max(request.max_dropped, 0), cache_aware=request.layout == pb.LAYOUT_CACHE_AWARE,
        tokenizer=request.tokenizer, asked_at_ms=request.asked_at_ms,
    )


def build_response_bytes(result, render_mode: int) -> bytes:
    """The serialised BuildContextResponse: its small fields through protobuf, then the sections
    and the dropped list as wire bytes (fastpath.encode_section, encode_dropped). Concatenated
    messages merge, so this is exactly the response protobuf would have written, field order aside."""
    resp = pb.BuildContextResponse(
        hard_zone_tokens=result.hard_zone_tokens, soft_zone_tokens=result.soft_zone_tokens,
        total_tokens=result.total_tokens, total_budget=result.total_budget,
        stable_prefix_hash=result.stable_prefix_hash, stable_prefix_tokens=result.stable_prefix_tokens,
        knowledge_status=result.knowledge_status, token_counter=result.token_counter,
    )
    for u in result.usage:
        resp.usage.add(category=u.category, budget=u.budget, used=u.used, candidates=u.candidates,
                       selected=u.selected, flowed_in=u.flowed_in)
    for reason, count in sorted(result.drop_counts.items()):
        resp.dropped_counts.add(reason=reason, count=count)
    if result.debug:
        for stage, micros in result.timings:
            resp.timings.add(stage=stage, micros=micros)
    chat_index: dict[int, int] = {}
    if render_mode == pb.RENDER_MODE_TEXT:
        resp.rendered_text = render_text(result)
    elif render_mode == pb.RENDER_MODE_CHAT:
        messages, chat_index = render_chat_indexed(result)
        for role, content in messages:
            resp.chat_messages.add(role=role, content=content)
    elif render_mode in tuple(Provider):
        resp.provider_request_json = render_provider(result, Provider(render_mode), tools=result.tools,
                                                     view=result.view)
    if result.cache is not None:
        resp.cache_prefix_tokens = result.cache.prefix_tokens
        for d in result.cache.digests:
            resp.section_digests.add(kind=int(d.kind), hash=d.hash, tokens=d.tokens)
        for kind, tokens in result.cache.breakpoints:
            resp.cache_breakpoints.add(after=int(kind), prefix_tokens=tokens,
                                       chat_message_index=chat_index.get(int(kind), -1))
    return resp.SerializeToString() + b"".join([p.wire() for p in result.packed if p.bodies]) + _dropped_bytes(result.dropped)


def _dropped_bytes(dropped) -> bytes:
    """The dropped list as wire bytes (a protobuf message per entry costs more than choosing them)."""
    if not dropped:
        return b""
    return fastpath.encode_dropped([d.source for d in dropped], [d.category for d in dropped],
                                   [d.reason for d in dropped], [d.score for d in dropped],
                                   [d.tokens for d in dropped], [d.kept_source for d in dropped])


def build_response(result, render_mode: int) -> pb.BuildContextResponse:
    """The response as a message, for in-process callers (the server sends the bytes)."""
    return pb.BuildContextResponse.FromString(build_response_bytes(result, render_mode))


def memory(m) -> pb.Memory:
    from sidecar.clock import now_ms

    return pb.Memory(memory_id=m.memory_id, type=int(m.type), content=m.content,
                     source_message_ids=m.source_message_ids, confidence=m.confidence, authority=int(m.authority),
                     created_at_ms=m.created_at_ms, updated_at_ms=m.updated_at_ms, expires_at_ms=m.expires_at_ms,
                     status=int(m.status), superseded_by=m.superseded_by, subject=m.subject,
                     expired=m.expired(now_ms()))


def memory_types(values, field: str) -> list:
    from sidecar.domain import MemoryType

    return [enum_value(MemoryType, v, f"{field}[{i}]") for i, v in enumerate(values)]


def job(j) -> pb.Job:
    return pb.Job(job_id=j.job_id, kind=j.kind, status=int(j.status), attempts=j.attempts, error=j.error,
                  done_items=j.done_items, total_items=j.total_items, created_at_ms=j.created_at_ms,
                  updated_at_ms=j.updated_at_ms, result=j.result)


def run_note(n) -> pb.RunNote:
    return pb.RunNote(note_id=n.note_id, run_id=n.run_id, text=n.text, tokens=n.tokens, is_summary=n.is_summary,
                      folded_note_ids=n.folded_note_ids, created_at_ms=n.created_at_ms)


def pinned(p: ShownPin) -> pb.PinnedConstraint:
    c = p.constraint
    return pb.PinnedConstraint(
        pin_id=c.pin_id, text=c.text, tokens=c.tokens, message_id=c.message_id, session_id=c.session_id,
        created_at_ms=c.created_at_ms, inherited=p.inherited, merged_pin_ids=p.merged_pin_ids,
        unpinned_at_ms=c.unpinned_at_ms, unpinned_by=c.unpinned_by, unpin_reason=c.unpin_reason,
    )


def document_version(d) -> pb.DocumentVersion:
    return pb.DocumentVersion(doc_id=d.doc_id, version=d.version, title=d.title, chunk_count=d.chunk_count,
                              live=d.live, allowed_roles=d.allowed_roles, created_at_ms=d.created_at_ms,
                              indexed=d.indexed, metadata=d.metadata)


def edge(e) -> pb.Edge:
    return pb.Edge(edge_id=str(e.edge_id), subject=e.subject, relation=e.relation, object=e.object, source=e.source,
                   valid_from_ms=e.valid_from_ms, valid_to_ms=e.valid_to_ms)
