"""In-process cache in front of a Store backend.

BuildContext must not wait on the database: a session's tail of messages (with token counts and
dedup keys) and its facts live here, loaded on first use and updated after every committed write,
so reads never see a state the database does not have.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np

import fastpath
from sidecar.domain import (
    Category,
    Fact,
    FactChange,
    FactStatus,
    Message,
    NewMessage,
    PinnedConstraint,
    RunNote,
    Scope,
    Session,
    SessionSummary,
    SubSessionResult,
    ToolResult,
)

MAX_CACHED_MESSAGES = 4096
MAX_CACHED_SESSIONS = 20_000
# Messages held by all cached views together: what keeps the cache's memory bounded when sessions
# pile up (least recently used views go first; an evicted view is reloaded on its next read).
MAX_CACHED_VIEW_MESSAGES = 100_000
MAX_CACHED_TOOL_RESULTS = 32
MESSAGE_LINE_EXTRA = 1  # the newline that separates a message line from the next one in a prompt

log = logging.getLogger("sidecar.store")

if TYPE_CHECKING:
    from sidecar.store.records import SessionImport
    from sidecar.tokens import TokenCounter


@dataclass(frozen=True, slots=True)
class MessageTail:
    """The newest MAX_CACHED_MESSAGES messages of a session with what the hot path needs of each,
    in parallel lists, precomputed once so BuildContext only slices. Never changed in place: an
    append publishes a new tail in one assignment, so BuildContext on another thread reads either
    the old tail or the new one, never lists half-extended."""

    messages: list[Message] = field(default_factory=list)  # oldest first
    lines: list[str] = field(default_factory=list)  # "role: text" as rendered in a prompt
    sources: list[str] = field(default_factory=list)  # "message:<id>"
    line_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    seqs: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    created: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # when each was stored
    # Each line as a ContextItem on the wire (fastpath.encode_item), so a packed message costs a
    # list lookup, not an encoding. Its tokens count the newline after the line, as the message
    # source does (MESSAGE_LINE_EXTRA).
    item_bodies: list[bytes] = field(default_factory=list)
    exact_keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    simhashes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))
    # Per other tokenizer a call asked for: its line_tokens and item_bodies, made on that first call and
    # extended on append (an encoding no call of the session asked for costs nothing).
    recounted: dict[TokenCounter, tuple[np.ndarray, list[bytes]]] = field(default_factory=dict)

    def counted(self, counter: TokenCounter) -> tuple[np.ndarray, list[bytes]]:
        """line_tokens and item_bodies in `counter`'s tokens (cl100k's: the stored ones)."""
        if counter.stored:
            return self.line_tokens, self.item_bodies
        held = self.recounted.get(counter)
        if held is None:  # one assignment: a reader on another thread sees it whole or not at all
            held = self.recounted[counter] = _recount(counter, self.messages, self.lines, self.sources)
        return held

    def extended(self, new: Sequence[Message]) -> MessageTail:
        lines = [m.rendered for m in new]
        exact, sim = fastpath.text_keys(lines)
        sources = [f"message:{m.message_id}" for m in new]
        bodies = _bodies(new, lines, sources, [m.line_tokens for m in new])
        cut = max(len(self.messages) + len(new) - MAX_CACHED_MESSAGES, 0)
        recounted = {}
        for counter, (tokens, held) in list(self.recounted.items()):  # a copy: a reader may add one meanwhile
            more_tokens, more = _recount(counter, new, lines, sources)
            recounted[counter] = (np.concatenate([tokens[cut:], more_tokens]), [*held[cut:], *more])
        return MessageTail(
            messages=[*self.messages[cut:], *new], lines=[*self.lines[cut:], *lines],
            sources=[*self.sources[cut:], *sources],
            line_tokens=np.concatenate([self.line_tokens[cut:], np.fromiter((m.line_tokens for m in new), np.int32)]),
            seqs=np.concatenate([self.seqs[cut:], np.fromiter((m.seq for m in new), np.int64)]),
            created=np.concatenate([self.created[cut:], np.fromiter((m.created_at_ms for m in new), np.int64)]),
            item_bodies=[*self.item_bodies[cut:], *bodies],
            exact_keys=np.concatenate([self.exact_keys[cut:], exact]),
            simhashes=np.concatenate([self.simhashes[cut:], sim]), recounted=recounted)


def _bodies(messages: Sequence[Message], lines: Sequence[str], sources: Sequence[str],
            line_tokens: Sequence[int]) -> list[bytes]:
    """The messages' ContextItem bytes, each charged its line's tokens and the newline after it."""
    return [fastpath.encode_item(src, Category.RECENT_MESSAGES, n + MESSAGE_LINE_EXTRA, line, m.role,
                                 m.timestamp_ms, (m.message_id,))
            for m, line, src, n in zip(messages, lines, sources, line_tokens, strict=True)]


def _recount(counter: TokenCounter, messages: Sequence[Message], lines: Sequence[str],
             sources: Sequence[str]) -> tuple[np.ndarray, list[bytes]]:
    """Line tokens (as Message.line_tokens counts them) and item bytes of messages in another tokenizer."""
    tokens = counter.count_many(list(lines))
    return np.array(tokens, np.int32), _bodies(messages, lines, sources, tokens)


@dataclass(slots=True)
class SessionView:
    """A session as the hot path sees it. Treat as read-only outside the cache. The cache never
    changes a container that a reader may hold (tail, facts, tool results, notes): it swaps in a
    new one, since BuildContext reads views on the event loop while writes land on pool threads."""

    session: Session
    tail: MessageTail = field(default_factory=MessageTail)  # read it once per call: see MessageTail
    confirmed: dict[str, Fact] = field(default_factory=dict)
    candidates: dict[str, Fact] = field(default_factory=dict)
    # Bumped on every change of the confirmed facts; the state hash is derived from it lazily.
    state_version: int = 0
    # Compression layers (issue #7), loaded with the view and kept current on write.
    pinned: list[PinnedConstraint] = field(default_factory=list)
    summary: SessionSummary | None = None
    tool_results: list[ToolResult] = field(default_factory=list)  # newest last, at most MAX_CACHED_TOOL_RESULTS
    # The history's items made of them (sidecar.assembly.message_source), kept with the view.
    history_items: dict = field(default_factory=dict)
    notes: dict[str, list[RunNote]] = field(default_factory=dict)  # run id -> notes, oldest first
    subsession_results: list[SubSessionResult] = field(default_factory=list)

    @property
    def messages(self) -> list[Message]:
        return self.tail.messages

    def add_messages(self, new: Sequence[Message]) -> None:
        if not new:
            return
        self.tail = self.tail.extended(new)
        self.session.message_count = new[-1].seq

    def set_facts(self, facts: Sequence[Fact]) -> None:
        self.confirmed, self.candidates = {}, {}
        self.apply_fact_changes(facts, ())

    def apply_fact_changes(self, upserts: Sequence[Fact], deletes: Sequence[tuple[str, int]]) -> None:
        # Copies, swapped in whole: a reader on another thread iterating the old dict never sees it change.
        by_status = {FactStatus.CONFIRMED: dict(self.confirmed), FactStatus.CANDIDATE: dict(self.candidates)}
        for key, status in deletes:
            by_status[FactStatus(status)].pop(key, None)
        for f in upserts:
            by_status[f.status][f.key] = f
        self.confirmed, self.candidates = by_status[FactStatus.CONFIRMED], by_status[FactStatus.CANDIDATE]
        self.state_version += 1


class CachingStore:
    """Implements the Store protocol by delegating to `backend`, caching hot session reads."""

    def __init__(self, backend: Any, *, max_view_messages: int = MAX_CACHED_VIEW_MESSAGES) -> None:
        self.backend = backend
        self.max_view_messages = max_view_messages
        self._views: OrderedDict[tuple[str, str, str], SessionView] = OrderedDict()
        self._view_messages = 0  # sum of len(view.messages) over the cached views
        self._lock = threading.RLock()  # the views; held only for in-memory work
        self._writer_locks = [threading.Lock() for _ in range(64)]  # by session, across a write
        # Called after every committed append with (scope, session_id, new messages): derived
        # indexes (episodic recall) stay current without polling the database.
        self.append_listeners: list[Callable[[Scope, str, list[Message]], None]] = []
        # Called after every committed import with the user's scope and the imported sessions.
        self.import_listeners: list[Callable[[Scope, Sequence[SessionImport]], None]] = []

    def __getattr__(self, name: str) -> Any:
        # Everything not cached here (runs, jobs, ...) goes straight to the backend.
        return getattr(self.backend, name)

    # ------------------------------------------------------------------ hot reads
    def session_view(self, scope: Scope, session_id: str) -> SessionView | None:
        key = (scope.tenant_id, scope.user_id, session_id)
        with self._lock:
            view = self._views.get(key)
            if view is not None:
                self._views.move_to_end(key)
                return view
            session = self.backend.get_session(scope, session_id)
            if session is None:
                return None
            view = SessionView(session=session)
            view.add_messages(self.backend.list_messages(scope, session_id, newest=MAX_CACHED_MESSAGES))
            view.session.message_count = session.message_count
            view.set_facts(self.backend.get_facts(scope, session_id))
            view.pinned = self.backend.list_pinned(scope, session_id)
            view.summary = self.backend.get_summary(scope, session_id)
            view.tool_results = self.backend.recent_tool_results(scope, session_id, MAX_CACHED_TOOL_RESULTS)
            for note in self.backend.list_run_notes(scope, session_id):
                view.notes.setdefault(note.run_id, []).append(note)
            view.subsession_results = self.backend.list_subsession_results(scope, session_id)
            self._views[key] = view
            self._view_messages += len(view.messages)
            self._trim()
            return view

    def _trim(self) -> None:
        # The newest view always stays, however big: the call that loaded it is using it.
        while len(self._views) > 1 and (len(self._views) > MAX_CACHED_SESSIONS
                                        or self._view_messages > self.max_view_messages):
            _, old = self._views.popitem(last=False)
            self._view_messages -= len(old.messages)

    def _drop_view(self, key: tuple[str, str, str]) -> None:
        view = self._views.pop(key, None)
        if view is not None:
            self._view_messages -= len(view.messages)

    @property
    def cached_view_messages(self) -> int:
        return self._view_messages

    def get_session(self, scope: Scope, session_id: str) -> Session | None:
        view = self.session_view(scope, session_id)
        return view.session if view else None

    def get_facts(self, scope: Scope, session_id: str) -> list[Fact]:
        view = self.session_view(scope, session_id)
        if view is None:
            return []
        return sorted([*view.confirmed.values(), *view.candidates.values()], key=lambda f: (f.key, f.status))

    def list_messages(self, scope: Scope, session_id: str, *, newest: int = 0, from_seq: int = 0,
                      to_seq: int = 0) -> list[Message]:
        view = self.session_view(scope, session_id)
        if view is None:
            return []
        cached = view.messages
        if newest > 0 and (newest <= len(cached) or len(cached) == view.session.message_count):
            return cached[-newest:]
        first_cached = cached[0].seq if cached else 1
        if newest <= 0 and max(from_seq, 1) >= first_cached:
            return [m for m in cached if m.seq >= from_seq and (to_seq <= 0 or m.seq <= to_seq)]
        return self.backend.list_messages(scope, session_id, newest=newest, from_seq=from_seq, to_seq=to_seq)

    def get_messages(self, scope: Scope, session_id: str, message_ids: Sequence[str]) -> list[Message]:
        """The messages of the session with these ids, in seq order: from its cached view when that
        holds them all (an after-turn job reads the turns just appended), else from the database."""
        with self._lock:
            view = self._cached(scope, session_id)
            cached = view.messages if view is not None else []
        wanted = set(message_ids)
        found = [m for m in cached if m.message_id in wanted]
        if len(found) == len(wanted):
            return found
        return self.backend.get_messages(scope, session_id, message_ids)

    # ------------------------------------------------------------------ writes (backend first, then cache)
    # A write holds its session's writer lock, never the cache lock, across the database call: a
    # commit (an fsync) must not stall BuildContext of other sessions. Writers of one session are
    # serialised, so the cache applies their changes in commit order. A view loaded while a write
    # is in flight may already hold it, so every apply below is idempotent.
    def _writer(self, scope: Scope, session_id: str) -> threading.Lock:
        return self._writer_locks[hash((scope.tenant_id, scope.user_id, session_id)) % len(self._writer_locks)]

    def create_session(self, scope: Scope, session: Session) -> None:
        self.backend.create_session(scope, session)
        # A new session holds nothing yet: its view is known without the queries a load makes (a
        # returning user's first question is usually in a new session). A view a concurrent write
        # loaded meanwhile stays.
        with self._lock:
            key = (scope.tenant_id, scope.user_id, session.session_id)
            if key not in self._views:
                self._views[key] = SessionView(session=replace(session))
                self._trim()

    def close_session(self, scope: Scope, session_id: str, at_ms: int) -> None:
        with self._writer(scope, session_id):
            self.backend.close_session(scope, session_id, at_ms)
            with self._lock:
                self._drop_view((scope.tenant_id, scope.user_id, session_id))

    def append_messages(self, scope: Scope, session_id: str, messages: Sequence[NewMessage],
                        token_counts: Sequence[tuple[int, int]], now_ms: int,
                        pinned: Sequence[tuple[int, str, int]] = ()) -> list[Message]:
        with self._writer(scope, session_id):
            self.session_view(scope, session_id)  # loaded before the write, so the append updates it
            stored = self.backend.append_messages(scope, session_id, messages, token_counts, now_ms, pinned)
            pins = self.backend.list_pinned(scope, session_id) if pinned else None
            with self._lock:
                view = self._cached(scope, session_id)
                if view is not None:
                    if pins is not None:
                        view.pinned = pins
                    last = view.messages[-1].seq if view.messages else 0
                    before = len(view.messages)
                    view.add_messages([m for m in stored if m.seq > last])
                    view.session.updated_at_ms = now_ms
                    self._view_messages += len(view.messages) - before
                    self._trim()
            _tell(self.append_listeners, scope, session_id, stored)
            return stored

    def import_sessions(self, scope: Scope, batch: Sequence[SessionImport]) -> None:
        """The backend's import_sessions. The view of a session marked cache_view is made from what was
        stored, as a load from rows would make it (the sessions are new: no facts, summary, tool
        results, notes or sub-agents yet); the others' are not cached: they are past conversations."""
        self.backend.import_sessions(scope, batch)
        kept = [(item, self.backend.list_pinned(scope, item.session.session_id) if item.plan.pinned_rows else [])
                for item in batch if item.cache_view]
        with self._lock:
            for item, pinned in kept:
                key = (scope.tenant_id, scope.user_id, item.session.session_id)
                if key in self._views:  # a call loaded it since the commit
                    continue
                view = SessionView(session=replace(item.session), pinned=pinned)
                view.add_messages(item.plan.out[-MAX_CACHED_MESSAGES:])
                view.session.message_count = item.session.message_count
                self._views[key] = view
                self._view_messages += len(view.messages)
            if kept:
                self._trim()
        _tell(self.import_listeners, scope, batch)

    def write_facts(self, scope: Scope, session_id: str, upserts: Sequence[Fact], deletes: Sequence[tuple[str, int]],
                    changes: Sequence[FactChange], at_ms: int) -> None:
        with self._writer(scope, session_id):
            self.backend.write_facts(scope, session_id, upserts, deletes, changes, at_ms)
            with self._lock:
                view = self._cached(scope, session_id)
                if view is not None:
                    view.apply_fact_changes(upserts, deletes)
                    view.session.updated_at_ms = at_ms

    def unpin_constraint(self, scope: Scope, session_id: str, message_id: str, idx: int, by: str, reason: str,
                         at_ms: int) -> bool:
        """Unpins one constraint (the backend's unpin_constraint) and shows it in the cached view: the
        row stays, with who and why, so history and BuildContext read the same list."""
        with self._writer(scope, session_id):
            hit = self.backend.unpin_constraint(scope, session_id, message_id, idx, by, reason, at_ms)
            if hit:
                with self._lock:
                    view = self._cached(scope, session_id)
                    if view is not None:
                        # A new list, not a change in place; a row already unpinned (a view loaded
                        # after the commit) keeps what it has.
                        view.pinned = [replace(p, unpinned_at_ms=at_ms, unpinned_by=by, unpin_reason=reason)
                                       if (p.message_id, p.idx) == (message_id, idx) and not p.unpinned_at_ms else p
                                       for p in view.pinned]
            return hit

    def _cached(self, scope: Scope, session_id: str) -> SessionView | None:
        return self._views.get((scope.tenant_id, scope.user_id, session_id))

    def insert_tool_result(self, scope: Scope, result: ToolResult) -> None:
        with self._writer(scope, result.session_id):
            self.backend.insert_tool_result(scope, result)
            with self._lock:
                view = self._cached(scope, result.session_id)
                if view is not None and all(t.tool_result_id != result.tool_result_id for t in view.tool_results):
                    # A new list, not an append: readers on other threads keep a whole one.
                    view.tool_results = [*view.tool_results, replace(result, full_text="")][-MAX_CACHED_TOOL_RESULTS:]

    def write_run_notes(self, scope: Scope, add: Sequence[RunNote], delete_ids: Sequence[str] = ()) -> None:
        with contextlib.ExitStack() as held:
            for lock in sorted({self._writer(scope, n.session_id) for n in add}, key=id):  # one order: no deadlock
                held.enter_context(lock)
            self.backend.write_run_notes(scope, add, delete_ids)
            gone = set(delete_ids)
            with self._lock:
                for note in add:
                    view = self._cached(scope, note.session_id)
                    if view is not None:
                        notes = [n for n in view.notes.get(note.run_id, [])
                                 if n.note_id not in gone and n.note_id != note.note_id]
                        view.notes = {**view.notes, note.run_id: sorted([*notes, note], key=lambda n: n.seq)}

    def put_summary(self, scope: Scope, summary: SessionSummary) -> None:
        with self._writer(scope, summary.session_id):
            self.backend.put_summary(scope, summary)
            with self._lock:
                view = self._cached(scope, summary.session_id)
                if view is not None:
                    view.summary = summary

    def add_subsession_result(self, scope: Scope, result: SubSessionResult, close_child_at_ms: int) -> None:
        with self._writer(scope, result.parent_session_id):
            self.backend.add_subsession_result(scope, result, close_child_at_ms)
            with self._lock:
                self._drop_view((scope.tenant_id, scope.user_id, result.child_session_id))
                view = self._cached(scope, result.parent_session_id)
                if view is not None and all(r.child_session_id != result.child_session_id
                                            for r in view.subsession_results):
                    view.subsession_results = [*view.subsession_results, result]

    def evict_session(self, scope: Scope, session_id: str) -> None:
        """Forget a cached view (another replica changed the session); the next read reloads it."""
        with self._lock:
            self._drop_view((scope.tenant_id, scope.user_id, session_id))

    def evict_user(self, scope: Scope) -> None:
        with self._lock:
            for key in [k for k in self._views if k[0] == scope.tenant_id and k[1] == scope.user_id]:
                self._drop_view(key)


def _tell(listeners: Sequence[Callable[..., None]], *args: Any) -> None:
    """Call each listener of a committed write; the rows are committed, so a derived index's failure
    is logged, never the write's."""
    for listener in listeners:
        try:
            listener(*args)
        except Exception:
            log.exception("listener %r failed", listener)
