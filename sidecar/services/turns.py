"""CommitTurn: the after-turn work is enqueued as durable jobs; the call returns at once."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.domain import Message, Scope
from sidecar.errors import InvalidArgument, NotFound, ResourceExhausted
from sidecar.ids import check_id
from sidecar.jobs import JobWorker, new_job
from sidecar.services.sessions import SessionService

MAX_COMMIT_MESSAGES = 1000


class TurnService:
    def __init__(self, sessions: SessionService, worker: JobWorker, job_kinds: Sequence[str], *,
                 subsession_job_kinds: Sequence[str] = ()) -> None:
        self.sessions = sessions
        self.store = sessions.store
        self.worker = worker
        self.job_kinds = list(job_kinds)
        self.subsession_job_kinds = list(subsession_job_kinds)

    def commit(self, scope: Scope, session_id: str, message_ids: Sequence[str]) -> list[str]:
        view = self.sessions.view(scope, session_id)
        if len(message_ids) > MAX_COMMIT_MESSAGES:
            raise ResourceExhausted(f"message_ids holds {len(message_ids)} ids; the limit is {MAX_COMMIT_MESSAGES}")
        if message_ids:
            for i, mid in enumerate(message_ids):
                check_id(mid, f"message_ids[{i}]")
            cached = {m.message_id: m for m in view.messages}
            missing = [m for m in message_ids if m not in cached]
            found = {m.message_id: m for m in self.store.get_messages(scope, session_id, missing)}
            messages: list[Message] = []
            for i, mid in enumerate(message_ids):
                m = cached.get(mid) or found.get(mid)
                if m is None:
                    raise NotFound(f"message_ids[{i}] {mid!r} is not a message of session {session_id!r}")
                messages.append(m)
        else:
            since = self.store.commit_watermark(scope, session_id)
            messages = self.store.list_messages(scope, session_id, from_seq=since + 1)
        if not messages:
            if message_ids:
                raise InvalidArgument("message_ids holds no message")
            return []
        ids = [m.message_id for m in messages]
        kinds = self.subsession_job_kinds if view.session.parent_session_id else self.job_kinds
        jobs = [new_job(scope, kind, {"session_id": session_id, "message_ids": ids}, total_items=len(ids))
                for kind in kinds]
        self.store.commit_turn(scope, session_id, max(m.seq for m in messages), jobs)
        self.worker.notify()
        return [j.job_id for j in jobs]
