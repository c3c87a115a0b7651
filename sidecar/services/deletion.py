"""DeleteMessages and DeleteSession: the rows, what the session made of them, the memories learnt
only from them, and every in-process copy (the session's cached view, the user's recall index,
kept rankings). Deletion really deletes: nothing of it reaches a later context."""

from __future__ import annotations

from collections.abc import Sequence

from sidecar import text_caches
from sidecar.assembly.builder import ContextBuilder
from sidecar.domain import Scope
from sidecar.errors import InvalidArgument, NotFound
from sidecar.ids import check_id
from sidecar.memory.episodic import EpisodicSource
from sidecar.memory.service import MemoryService
from sidecar.services import limits
from sidecar.services.sessions import SessionService


class DeletionService:
    def __init__(self, sessions: SessionService, memories: MemoryService, episodic: EpisodicSource,
                 builder: ContextBuilder) -> None:
        self.sessions = sessions
        self.builder = builder
        self.store = sessions.store
        self.memories = memories
        self.episodic = episodic

    def delete_messages(self, scope: Scope, session_id: str, message_ids: Sequence[str]) -> dict[str, int]:
        if not message_ids or len(message_ids) > limits.MAX_BATCH_MESSAGES:
            raise InvalidArgument(f"message_ids must hold 1-{limits.MAX_BATCH_MESSAGES} ids (got {len(message_ids)})")
        for i, mid in enumerate(message_ids):
            check_id(mid, f"message_ids[{i}]")
        self.sessions.view(scope, session_id)
        found = {m.message_id for m in self.store.get_messages(scope, session_id, list(message_ids))}
        for i, mid in enumerate(message_ids):
            if mid not in found:
                raise NotFound(f"message_ids[{i}] {mid!r} is not a message of session {session_id!r}")
        counts = self.store.delete_messages(scope, session_id, sorted(found))
        return self._after(scope, found, counts)

    def delete_session(self, scope: Scope, session_id: str) -> dict[str, int]:
        self.sessions.view(scope, session_id)
        counts, message_ids = self.store.delete_session(scope, session_id)
        return self._after(scope, set(message_ids), counts)

    def _after(self, scope: Scope, message_ids: set[str], counts: dict[str, int]) -> dict[str, int]:
        # The rows are gone: now every derived copy. The user's recall index is rebuilt from rows on
        # next use (it holds the deleted turns' text and terms).
        counts["memories"] = self.memories.drop_sources(scope, message_ids) if message_ids else 0
        counts["episodic_index"] = self.episodic.indexed(scope)
        self.episodic.drop_user(scope)
        self.store.evict_user(scope)  # the session's view, and its sub-sessions'
        text_caches.clear(self.memories.embedder)
        counts.update(self.builder.forget_user(scope))
        return counts
