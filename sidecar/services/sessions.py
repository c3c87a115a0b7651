"""Sessions and their messages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sidecar import tokens
from sidecar.clock import now_ms
from sidecar.compress.constraints import detect_constraints
from sidecar.domain import Message, NewMessage, Role, Scope, Session, SessionStatus, render_message_line
from sidecar.errors import AlreadyExists, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from sidecar.ids import check_id, check_text, new_id
from sidecar.secrets import Masked, mask
from sidecar.services import limits
from sidecar.store.cache import CachingStore, SessionView


def decode_page_token(token: str) -> int:
    if not token:
        return 0
    if not token.isdigit() or len(token) > 12:
        raise InvalidArgument("page_token is not a token this server issued")
    return int(token)


def check_page_size(size: int) -> int:
    if size < 0 or size > limits.MAX_PAGE_SIZE:
        raise InvalidArgument(f"page_size must be 0-{limits.MAX_PAGE_SIZE} (got {size})")
    return size or 50


class SessionService:
    def __init__(self, store: CachingStore, *, max_session_messages: int = limits.MAX_SESSION_MESSAGES) -> None:
        self.store = store
        self.max_session_messages = max_session_messages

    # ------------------------------------------------------------------ lookups shared by every service
    def view(self, scope: Scope, session_id: str) -> SessionView:
        """The session of this user, or NOT_FOUND (also when it belongs to someone else)."""
        check_id(session_id, "session_id")
        view = self.store.session_view(scope, session_id)
        if view is None:
            raise NotFound(f"session_id {session_id!r} not found for this tenant and user")
        return view

    def open_view(self, scope: Scope, session_id: str) -> SessionView:
        view = self.view(scope, session_id)
        if view.session.status != SessionStatus.OPEN:
            raise FailedPrecondition(f"session_id {session_id!r} is closed")
        return view

    # ------------------------------------------------------------------ sessions
    def create(self, scope: Scope, session_id: str, title: str, metadata: dict[str, str], *,
               parent_session_id: str = "", task: str = "") -> Session:
        check_id(session_id, "session_id", required=False)
        check_text(title, "title", limits.MAX_TITLE)
        if len(metadata) > limits.MAX_METADATA_ENTRIES:
            raise InvalidArgument(f"metadata has {len(metadata)} entries; the limit is {limits.MAX_METADATA_ENTRIES}")
        for k, v in metadata.items():
            check_text(k, "metadata key", 256, required=True)
            check_text(v, f"metadata[{k!r}]", limits.MAX_METADATA_VALUE)
        session_id = session_id or new_id("ses")
        if self.store.get_session(scope, session_id) is not None:
            raise AlreadyExists(f"session_id {session_id!r} already exists")
        at = now_ms()
        session = Session(tenant_id=scope.tenant_id, user_id=scope.user_id, session_id=session_id, title=title,
                          status=SessionStatus.OPEN, created_at_ms=at, updated_at_ms=at,
                          parent_session_id=parent_session_id, task=task, metadata=dict(metadata))
        self.store.create_session(scope, session)
        return session

    def get(self, scope: Scope, session_id: str) -> Session:
        return self.view(scope, session_id).session

    def list(self, scope: Scope, page_size: int, page_token: str, include_closed: bool) -> tuple[list[Session], str]:
        size = check_page_size(page_size)
        offset = decode_page_token(page_token)
        rows = self.store.list_sessions(scope, limit=size + 1, offset=offset, include_closed=include_closed)
        next_token = str(offset + size) if len(rows) > size else ""
        return rows[:size], next_token

    def close(self, scope: Scope, session_id: str) -> Session:
        view = self.view(scope, session_id)
        if view.session.status == SessionStatus.OPEN:
            self.store.close_session(scope, session_id, now_ms())
        return self.get(scope, session_id)

    # ------------------------------------------------------------------ messages
    def append(self, scope: Scope, session_id: str, messages: Sequence[NewMessage]) -> list[Message]:
        return self.append_masked(scope, session_id, messages)[0]

    def append_masked(self, scope: Scope, session_id: str,
                      messages: Sequence[NewMessage]) -> tuple[list[Message], list[tuple[int, Masked]]]:
        """Store a batch with every secret masked before anything is stored, counted or indexed;
        also returns what was masked, by the message's index in the batch."""
        check_id(session_id, "session_id")
        if not messages:
            raise InvalidArgument("messages must hold at least one message")
        if len(messages) > limits.MAX_BATCH_MESSAGES:
            raise ResourceExhausted(
                f"messages holds {len(messages)} messages; the limit per call is {limits.MAX_BATCH_MESSAGES}")
        for i, m in enumerate(messages):
            check_text(m.text, f"messages[{i}].text", limits.MAX_MESSAGE_TEXT)
            check_text(m.tool_name, f"messages[{i}].tool_name", 256)
            check_text(m.speaker, f"messages[{i}].speaker", 256)
            check_id(m.tool_call_id, f"messages[{i}].tool_call_id", required=False)
            check_id(m.idempotency_key, f"messages[{i}].idempotency_key", required=False)
            if m.client_timestamp_ms < 0:
                raise InvalidArgument(f"messages[{i}].client_timestamp_ms must not be negative")
        view = self.open_view(scope, session_id)
        if view.session.message_count + len(messages) > self.max_session_messages:
            raise ResourceExhausted(
                f"session_id {session_id!r} holds {view.session.message_count} messages; the cap is "
                f"{self.max_session_messages} per session")
        masked: list[tuple[int, Masked]] = []
        clean: list[NewMessage] = []
        for i, m in enumerate(messages):
            text, found = mask(m.text)
            masked += [(i, f) for f in found]
            clean.append(replace(m, text=text) if found else m)
        messages = clean
        # Counted once here; every later read uses the stored counts.
        counts = list(zip(tokens.count_many([m.text for m in messages]),
                          tokens.count_many([render_message_line(m.role, m.speaker, m.text) for m in messages]),
                          strict=True))
        # Explicit user prohibitions and requirements are pinned verbatim at ingest (hard zone).
        pinned = [(i, text, tokens.count_tokens(text) + 1)
                  for i, m in enumerate(messages) if m.role == Role.USER for text in detect_constraints(m.text)]
        return self.store.append_messages(scope, session_id, messages, counts, now_ms(), pinned), masked

    def list_messages(self, scope: Scope, session_id: str, newest: int, from_seq: int, to_seq: int) -> list[Message]:
        self.view(scope, session_id)
        if newest < 0 or newest > limits.MAX_LIST_NEWEST:
            raise InvalidArgument(f"newest must be 0-{limits.MAX_LIST_NEWEST} (got {newest})")
        if from_seq < 0 or to_seq < 0:
            raise InvalidArgument("from_seq and to_seq must not be negative")
        if to_seq and from_seq > to_seq:
            raise InvalidArgument(f"from_seq {from_seq} is after to_seq {to_seq}")
        if newest == 0 and from_seq == 0 and to_seq == 0:
            newest = 100  # no selector given: the newest 100, the common case
        return self.store.list_messages(scope, session_id, newest=newest, from_seq=from_seq, to_seq=to_seq)
