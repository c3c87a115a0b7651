"""Sessions and their messages."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sidecar import tokens
from sidecar.clock import now_ms
from sidecar.compress.constraints import detect_constraints
from sidecar.domain import Message, NewMessage, Role, Scope, Session, SessionStatus, render_message_line
from sidecar.errors import FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from sidecar.ids import check_id, check_text, check_timestamp, new_id
from sidecar.secrets import Masked, mask
from sidecar.services import limits
from sidecar.store.cache import CachingStore, SessionView

MAX_TOOL_CALLS = 128  # per assistant message (models make a handful in parallel)


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
        check_session_fields(session_id, title, metadata)
        session_id = session_id or new_id("ses")
        at = now_ms()
        session = Session(tenant_id=scope.tenant_id, user_id=scope.user_id, session_id=session_id, title=title,
                          status=SessionStatus.OPEN, created_at_ms=at, updated_at_ms=at,
                          parent_session_id=parent_session_id, task=task, metadata=dict(metadata))
        self.store.create_session(scope, session)  # AlreadyExists when the id is taken
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
        check_messages(messages)
        view = self.open_view(scope, session_id)
        if view.session.message_count + len(messages) > self.max_session_messages:
            raise ResourceExhausted(
                f"session_id {session_id!r} holds {view.session.message_count} messages; the cap is "
                f"{self.max_session_messages} per session")
        batch = prepare(messages)
        return self.store.append_messages(scope, session_id, batch.messages, batch.counts, now_ms(),
                                          batch.pinned), batch.masked

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


def check_session_fields(session_id: str, title: str, metadata: dict[str, str], field: str = "") -> None:
    """A new session's id (optional), title and metadata; `field` prefixes the names in errors."""
    check_id(session_id, f"{field}session_id", required=False)
    check_text(title, f"{field}title", limits.MAX_TITLE)
    if len(metadata) > limits.MAX_METADATA_ENTRIES:
        raise InvalidArgument(
            f"{field}metadata has {len(metadata)} entries; the limit is {limits.MAX_METADATA_ENTRIES}")
    for k, v in metadata.items():
        check_text(k, f"{field}metadata key", 256, required=True)
        check_text(v, f"{field}metadata[{k!r}]", limits.MAX_METADATA_VALUE)


def check_messages(messages: Sequence[NewMessage], field: str = "messages") -> None:
    """Every message's fields, named as `field`[i] in errors."""
    for i, m in enumerate(messages):
        at = f"{field}[{i}]"
        check_text(m.text, f"{at}.text", limits.MAX_MESSAGE_TEXT)
        check_text(m.tool_name, f"{at}.tool_name", 256)
        check_text(m.speaker, f"{at}.speaker", 256)
        check_id(m.tool_call_id, f"{at}.tool_call_id", required=False)
        check_id(m.idempotency_key, f"{at}.idempotency_key", required=False)
        check_timestamp(m.client_timestamp_ms, f"{at}.client_timestamp_ms")
        if m.tool_calls:
            check_tool_calls(m, at)


@dataclass(frozen=True, slots=True)
class PreparedBatch:
    """Checked messages made ready to store: secrets masked, tokens counted, constraints found."""

    messages: list[NewMessage]
    masked: list[tuple[int, Masked]]  # (index in the batch, what was masked)
    counts: list[tuple[int, int]]  # (text tokens, line tokens) per message
    pinned: list[tuple[int, str, int]]  # (index in the batch, constraint, its tokens)


def prepare(messages: Sequence[NewMessage]) -> PreparedBatch:
    """Mask every secret before anything is stored, counted or indexed; count each message once
    (every later read uses the stored counts); find the user's explicit prohibitions and
    requirements, pinned verbatim at ingest (hard zone)."""
    return prepare_many([messages])[0]


def prepare_many(batches: Sequence[Sequence[NewMessage]]) -> list[PreparedBatch]:
    """prepare() of each batch (an import's sessions): a long batch's tokens are counted on the counting
    thread (tokens.count_aside) while this one masks the batches after it and finds constraints."""
    masked_batches = [_masked(messages) for messages in batches]
    counting = [tokens.count_aside([m.text for m in clean]) for clean, _ in masked_batches]
    pinned = [[(i, text, tokens.count_tokens(text) + 1)
               for i, m in enumerate(clean) if m.role == Role.USER for text in detect_constraints(m.text)]
              for clean, _ in masked_batches]
    # Taken last first: the counting thread works from the first batch, this one from the last.
    alone = [counted() for counted in reversed(counting)][::-1]
    return [PreparedBatch(clean, masked, [(n, tokens.count_prefixed(render_message_line(m.role, m.speaker, ""), m.text, n))
                                          for m, n in zip(clean, counts, strict=True)], pins)
            for (clean, masked), counts, pins in zip(masked_batches, alone, pinned, strict=True)]


def _masked(messages: Sequence[NewMessage]) -> tuple[list[NewMessage], list[tuple[int, Masked]]]:
    """The messages with every secret masked (text and tool call arguments), and what was masked."""
    masked: list[tuple[int, Masked]] = []
    clean: list[NewMessage] = []
    for i, m in enumerate(messages):
        text, found = mask(m.text)
        args = [mask_arguments(c.arguments_json) for c in m.tool_calls]  # what a call passes is stored too
        in_args = [f for _, more in args for f in more]
        masked += [(i, f) for f in found + in_args]
        calls = tuple(replace(c, arguments_json=a) for c, (a, _) in zip(m.tool_calls, args, strict=True))
        clean.append(replace(m, text=text, tool_calls=calls) if found or in_args else m)
    return clean, masked


def check_tool_calls(m: NewMessage, field: str) -> None:
    """An assistant message's tool calls: ids that a tool result can name (distinct), a tool name and
    arguments that are a JSON object (what each provider's request takes)."""
    if m.role != Role.ASSISTANT:
        raise InvalidArgument(f"{field}.tool_calls: only an assistant message makes tool calls (role is {m.role.name})")
    if len(m.tool_calls) > MAX_TOOL_CALLS:
        raise InvalidArgument(f"{field}.tool_calls holds {len(m.tool_calls)} calls; the limit is {MAX_TOOL_CALLS}")
    seen: set[str] = set()
    for j, c in enumerate(m.tool_calls):
        at = f"{field}.tool_calls[{j}]"
        check_id(c.id, f"{at}.id")
        if c.id in seen:
            raise InvalidArgument(f"{at}.id {c.id!r} repeats an earlier call's id")
        seen.add(c.id)
        check_text(c.name, f"{at}.name", 256, required=True)
        check_text(c.arguments_json, f"{at}.arguments_json", limits.MAX_MESSAGE_TEXT)
        if c.arguments_json and not isinstance(_json_or_none(c.arguments_json), dict):
            raise InvalidArgument(f"{at}.arguments_json must be a JSON object's text (or empty)")


def mask_arguments(arguments_json: str) -> tuple[str, list[Masked]]:
    """A tool call's arguments with their secrets masked. The detector reads JSON's quoted values, so the
    text is masked whole; should a placeholder ever break the JSON, the masked text is kept as one string
    (a secret is never stored to keep the structure)."""
    text, found = mask(arguments_json)
    if found and not isinstance(_json_or_none(text), dict):
        text = json.dumps({"masked_arguments": text}, ensure_ascii=False)
    return text, found


def _json_or_none(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return None
