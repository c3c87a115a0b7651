"""CommitTurn: the after-turn work is enqueued as durable jobs; the call returns at once."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sidecar.domain import Job, Message, Scope
from sidecar.errors import InvalidArgument, NotFound, ResourceExhausted
from sidecar.ids import check_id
from sidecar.jobs import JobWorker, new_job
from sidecar.services.sessions import SessionService

MAX_COMMIT_MESSAGES = 1000


class TurnService:
    def __init__(self, sessions: SessionService, worker: JobWorker, job_kinds: Sequence[str], *,
                 subsession_job_kinds: Sequence[str] = (),
                 needed_by_whole_session: dict[str, Callable[[Sequence[Message]], bool]] | None = None) -> None:
        self.sessions = sessions
        self.store = sessions.store
        self.worker = worker
        self.job_kinds = list(job_kinds)
        self.subsession_job_kinds = list(subsession_job_kinds)
        # Kinds a whole session committed at once (an import) needs only when its predicate holds.
        self.needed_by_whole_session = dict(needed_by_whole_session or {})

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
        jobs = self.jobs_for(scope, session_id, [m.message_id for m in messages],
                             subsession=bool(view.session.parent_session_id))
        self.store.commit_turn(scope, session_id, max(m.seq for m in messages), jobs)
        self.worker.notify()
        return [j.job_id for j in jobs]

    def jobs_for(self, scope: Scope, session_id: str, message_ids: list[str], *, subsession: bool = False) -> list[Job]:
        """The after-turn jobs of these committed messages of a session."""
        kinds = self.subsession_job_kinds if subsession else self.job_kinds
        return [new_job(scope, kind, {"session_id": session_id, "message_ids": message_ids},
                        total_items=len(message_ids)) for kind in kinds]

    def whole_session_jobs(self, scope: Scope, session_id: str, messages: Sequence[Message]) -> list[Job]:
        """The after-turn jobs of a new top-level session committed whole (an import)."""
        ids = [m.message_id for m in messages]
        return [j for j in self.jobs_for(scope, session_id, ids)
                if (needed := self.needed_by_whole_session.get(j.kind)) is None or needed(messages)]
