"""ImportSessions: a user's past conversations (history from another system, a replay) stored as
new sessions in one transaction: each session as CreateSession, AppendMessages of all its messages
and CommitTurn of them would store it, without a call and a commit per step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sidecar.clock import now_ms
from sidecar.domain import Message, NewMessage, Scope, Session, SessionStatus
from sidecar.errors import InvalidArgument, ResourceExhausted
from sidecar.ids import new_id
from sidecar.secrets import Masked
from sidecar.services import limits
from sidecar.services.sessions import SessionService, check_messages, check_session_fields, prepare_many
from sidecar.services.turns import TurnService
from sidecar.store.records import SessionImport, plan_append


@dataclass(frozen=True, slots=True)
class PastSession:
    """One conversation to import."""

    messages: Sequence[NewMessage]
    session_id: str = ""
    title: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    closed: bool = False


@dataclass(frozen=True, slots=True)
class ImportedSession:
    session: Session
    messages: list[Message]
    masked: list[tuple[int, Masked]]  # (message index within the session, what was masked)
    job_ids: list[str]


class ImportService:
    def __init__(self, sessions: SessionService, turns: TurnService, view_jobs: Sequence[str] = ()) -> None:
        self.sessions = sessions
        self.turns = turns
        self.store = sessions.store
        self.view_jobs = frozenset(view_jobs)  # job kinds that read their session's view (cached at import)

    def import_sessions(self, scope: Scope, past: Sequence[PastSession]) -> list[ImportedSession]:
        """Check everything first (a bad field anywhere stores nothing), then store every session, its
        messages, pinned constraints, commit watermark and after-turn jobs in one transaction."""
        check_import(past, self.sessions.max_session_messages)
        at = now_ms()
        ids = [p.session_id or new_id("ses") for p in past]
        # The timeline orders sessions by creation: an imported one began with its first message.
        began = [next((m.client_timestamp_ms for m in p.messages if m.client_timestamp_ms), 0) or at for p in past]
        batch: list[SessionImport] = []
        out: list[ImportedSession | None] = [None] * len(past)
        # In timeline order, so the after-turn jobs are claimed in it: a later statement supersedes an
        # earlier one as it would have, had the sessions been committed as they happened.
        order = sorted(range(len(past)), key=lambda i: (began[i], ids[i]))
        for i, prepared in zip(order, prepare_many([past[i].messages for i in order]), strict=True):
            p, sid = past[i], ids[i]
            session = Session(tenant_id=scope.tenant_id, user_id=scope.user_id, session_id=sid, title=p.title,
                              status=SessionStatus.CLOSED if p.closed else SessionStatus.OPEN, created_at_ms=began[i],
                              updated_at_ms=at, closed_at_ms=at if p.closed else 0, metadata=dict(p.metadata),
                              message_count=len(p.messages))
            plan = plan_append(scope, sid, prepared.messages, prepared.counts, prepared.pinned, at, {}, 1)
            jobs = self.turns.whole_session_jobs(scope, sid, plan.out)
            batch.append(SessionImport(session, plan, jobs, cache_view=any(j.kind in self.view_jobs for j in jobs)))
            out[i] = ImportedSession(session, plan.out, prepared.masked, [j.job_id for j in jobs])
        self.store.import_sessions(scope, batch)  # AlreadyExists when an id is taken: nothing stored
        self.turns.worker.notify()
        return [o for o in out if o is not None]


def check_import(past: Sequence[PastSession], max_session_messages: int) -> None:
    if not past:
        raise InvalidArgument("sessions must hold at least one session")
    if len(past) > limits.MAX_IMPORT_SESSIONS:
        raise ResourceExhausted(
            f"sessions holds {len(past)} sessions; the limit per call is {limits.MAX_IMPORT_SESSIONS}")
    total = sum(len(p.messages) for p in past)
    if total > limits.MAX_IMPORT_MESSAGES:
        raise ResourceExhausted(
            f"sessions hold {total} messages in all; the limit per call is {limits.MAX_IMPORT_MESSAGES}")
    seen: dict[str, int] = {}
    for i, p in enumerate(past):
        at = f"sessions[{i}]."
        check_session_fields(p.session_id, p.title, p.metadata, at)
        if p.session_id and (j := seen.setdefault(p.session_id, i)) != i:
            raise InvalidArgument(f"{at}session_id {p.session_id!r} is also sessions[{j}]'s")
        if not p.messages:
            raise InvalidArgument(f"{at}messages must hold at least one message")
        if len(p.messages) > max_session_messages:
            raise ResourceExhausted(
                f"{at}messages holds {len(p.messages)} messages; the cap is {max_session_messages} per session")
        check_messages(p.messages, f"{at}messages")
