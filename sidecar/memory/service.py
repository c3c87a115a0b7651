"""Long-term memory: the write path (filters -> merge near-duplicates -> supersede conflicts ->
store + index in the same call), recall, user edits, deletion and forget-user."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import numpy as np

from sidecar import tokens
from sidecar.clock import now_ms
from sidecar.domain import Authority, Memory, MemoryChange, MemoryStatus, MemoryType, Scope
from sidecar.errors import FailedPrecondition, InvalidArgument, NotFound
from sidecar.ids import check_id, check_text, new_id
from sidecar.index.embedders import Embedder, client_vector
from sidecar.index.hybrid import HybridIndex
from sidecar.memory.extract import derive_subject
from sidecar.memory.filters import near_duplicate
from sidecar.memory.recall import ScoredMemory, SupersededTurn, UserMemories, scope_key
from sidecar.secrets import contains_secret, looks_like_raw_log
from sidecar.services.sessions import check_page_size, decode_page_token
from sidecar.unlocked_loads import STRIPES, ChangeSerials

MAX_CONTENT = 8 * 1024
# Cosine above which two memories are the same statement (merged, not stored twice).
MERGE_COSINE = 0.92


@dataclass(slots=True)
class MemoryInput:
    type: MemoryType
    content: str
    subject: str = ""
    source_message_ids: Sequence[str] = ()
    confidence: float = 1.0
    authority: Authority = Authority.USER_STATED
    expires_at_ms: int = 0
    embedding: np.ndarray | None = None
    # When it was said (its newest source turn's time; an imported history's turns are dated in the
    # past); 0: now. A statement said before the memory it would replace is kept as that memory's
    # history instead of superseding it.
    said_at_ms: int = 0


@dataclass(slots=True)
class WriteResult:
    outcome: str  # "created" | "merged" | "superseded_older" | "superseded_by_newer" | "rejected"
    memory: Memory | None
    superseded_id: str = ""
    reason: str = ""


def normalise_subject(subject: str) -> str:
    return " ".join(subject.lower().split())[:128]


def memory_subject(inp: MemoryInput) -> str:
    """The given subject, or the one the extractor would give the content (proto: "derived from the
    content when empty"), so an AddMemory without one still supersedes what it contradicts."""
    return normalise_subject(inp.subject) or normalise_subject(derive_subject(inp.content, inp.type.name.lower()))


def render_memory(content: str) -> str:
    return f"- {content}"


def _turn_marks(memories: Sequence[Memory]) -> dict[str, SupersededTurn]:
    """MemoryService.superseded_turns of a user with these memory rows (all of them, any status), read
    newest first whatever order they come in: a turn two superseded memories were learnt from keeps the
    mark of the one updated longest ago."""
    rows = {m.memory_id: m for m in sorted(memories, key=lambda m: (-m.updated_at_ms, m.memory_id))}
    marks: dict[str, SupersededTurn] = {}
    for m in rows.values():
        current, hops = rows.get(m.superseded_by), 0
        while current is not None and current.status == MemoryStatus.SUPERSEDED and hops < 64:
            current, hops = rows.get(current.superseded_by), hops + 1
        if m.status != MemoryStatus.SUPERSEDED or current is None or current.status != MemoryStatus.ACTIVE:
            continue
        # Dated when its successor was said: an imported history's statements were superseded then.
        mark = SupersededTurn(rows[m.superseded_by].created_at_ms, current.content, frozenset(current.source_message_ids))
        marks.update((mid, mark) for mid in m.source_message_ids if mid not in mark.current_sources)
    return marks


class MemoryService:
    def __init__(self, store, embedder: Embedder, *, on_forget=None) -> None:
        self.store = store
        self.embedder = embedder
        self._users: dict[tuple[str, str], UserMemories] = {}
        self._lock = threading.RLock()  # the users' in-memory state; held only for in-memory work
        self._writer_locks = [threading.Lock() for _ in range(STRIPES)]  # by user, across a write
        # Bumped (under _lock) by every change of a user's rows or state: see user().
        self._changes = ChangeSerials()
        self._on_forget = list(on_forget or [])
        self._on_delete: list = []

    def on_forget(self, hook) -> None:
        """Register another holder of the user's derived data; ForgetUser calls hook(scope) -> counts."""
        self._on_forget.append(hook)

    def on_delete(self, hook) -> None:
        """Register a holder of source turns; DeleteMemory calls hook(scope, source message ids)."""
        self._on_delete.append(hook)

    # ------------------------------------------------------------------ state
    def user(self, scope: Scope) -> UserMemories:
        """The user's memory state, loaded from rows on first use. The load (a database read, then the
        index) runs without the lock, so calls for other users do not wait behind it; it is kept only
        if no change of the user's stripe landed meanwhile (a write, a deletion, a forget), else read
        again (ChangeSerials.load)."""
        key = scope_key(scope)

        def keep(loaded: UserMemories) -> UserMemories:
            self._users[key] = loaded
            return loaded

        return self._changes.load(self._lock, key, lambda: self._users.get(key), lambda: partial(self._load, scope),
                                  keep, lambda: keep(self._load(scope)))

    def _load(self, scope: Scope) -> UserMemories:
        """The user's state from their rows, in one query: the active rows, who superseded whom, the
        turn marks."""
        state = UserMemories(HybridIndex(self.embedder.dim))
        rows = self.store.memories_with_embeddings(scope)
        active = [row for row in rows if row[0].status == MemoryStatus.ACTIVE]
        for (memory, _), vector in zip(active, self._stored_vectors(active), strict=True):
            state.add(memory, vector)
        for memory, _ in rows:
            if memory.status == MemoryStatus.SUPERSEDED:
                state.superseded.setdefault(memory.superseded_by, []).append(memory.memory_id)
        state.turn_marks = _turn_marks([m for m, _ in rows]) if state.superseded else {}
        return state

    def _stored_vectors(self, rows: Sequence[tuple[Memory, bytes]]) -> list[np.ndarray]:
        """The rows' vectors; those of another dimension (written under another embedder, e.g. before
        `serve --embedder minilm`) are embedded again from their content, in memory: the rows keep
        theirs, so switching back costs nothing."""
        vectors = [np.frombuffer(blob, np.float32) for _, blob in rows]
        stale = [i for i, v in enumerate(vectors) if v.shape != (self.embedder.dim,)]
        if stale:
            fresh = self.embedder.embed([rows[i][0].content for i in stale])
            for i, v in zip(stale, fresh, strict=True):
                vectors[i] = v
        return vectors

    def _vector(self, text: str, given: np.ndarray | None) -> np.ndarray:
        if given is not None:
            return given
        return self.embedder.embed([text])[0]

    # ------------------------------------------------------------------ write path
    def write(self, scope: Scope, inp: MemoryInput) -> WriteResult:
        """Store one candidate that passed the filters: merge, supersede or create."""
        return self.write_many(scope, [inp])[0]

    def write_many(self, scope: Scope, inputs: Sequence[MemoryInput], *,
                   learnt_from_turns: bool = False) -> list[WriteResult]:
        """Store candidates (an extraction batch's) as write() would one after another, each merged into
        or superseding the user's memories and those written before it, in one transaction: all
        stored or none. The user's state takes them once they are stored (no reader sees one before).
        `learnt_from_turns`: the candidates' source turns are read again under the writer lock, and
        those deleted meanwhile (DeleteMessages, DeleteSession, ForgetUser) are left out of the
        sources; a candidate none of whose sources is left is not stored. Deletions hold the same lock
        to drop what was learnt from their turns, so a deleted turn's memory is never left behind."""
        results = [_rejected(inp) for inp in inputs]
        wanted = [i for i, r in enumerate(results) if r is None]
        if not wanted:
            return [r for r in results if r is not None]
        vectors = {i: self._vector(inputs[i].content, inputs[i].embedding) for i in wanted}
        with self._writer(scope):
            kept = self._live_sources(scope, [inputs[i] for i in wanted]) if learnt_from_turns else None
            state = self.user(scope)
            pending = _Pending()
            for j, i in enumerate(wanted):
                inp = inputs[i] if kept is None else kept[j]
                if inp is None:
                    results[i] = WriteResult("rejected", None, reason="source_deleted")
                    continue
                results[i] = self._decide(state, pending, inp, vectors[i], now_ms())
            if pending.rows:
                self.store.put_memories(scope, list(pending.rows.values()), pending.changes)
                self._apply(scope, pending.apply)
        return [r for r in results if r is not None]  # each one rejected or decided

    def _live_sources(self, scope: Scope, inputs: Sequence[MemoryInput]) -> list[MemoryInput | None]:
        """Each input with only its source turns that are still stored; None where none is left."""
        wanted = sorted({i for inp in inputs for i in inp.source_message_ids})
        alive = self.store.stored_message_ids(scope, wanted)
        out: list[MemoryInput | None] = []
        for inp in inputs:
            left = [i for i in inp.source_message_ids if i in alive]
            out.append(inp if len(left) == len(inp.source_message_ids) else
                       replace(inp, source_message_ids=left) if left else None)
        return out

    def _decide(self, state: UserMemories, pending: _Pending, inp: MemoryInput, vector: np.ndarray,
                at: int) -> WriteResult:
        """One candidate's write, added to `pending`: merged into a near duplicate, or created, superseding
        the active memories of its type and subject; or, said before one of them (an imported history),
        stored as already superseded by the newest."""
        subject = memory_subject(inp)
        said = min(inp.said_at_ms, at) if inp.said_at_ms > 0 else at
        with self._lock:
            twin = self._near_duplicate(state, pending, inp, vector, at)
            twin_blob = pending.blob(twin.memory_id) or self._blob(state, twin.memory_id) if twin is not None else b""
            older = pending.same_subject(state, inp.type, subject) if subject and twin is None else []
            # Said (or said again, or edited) since: only a statement dated by its turns can be older than
            # what is stored (an AddMemory is said now, whatever another replica's clock wrote).
            newer = [o for o in older if o.updated_at_ms > said] if inp.said_at_ms > 0 else []
            older_blobs = [] if newer else [pending.blob(o.memory_id) or self._blob(state, o.memory_id) for o in older]
        if twin is not None:
            merged = replace(
                twin, source_message_ids=sorted(set(twin.source_message_ids) | set(inp.source_message_ids)),
                confidence=min(1.0, max(twin.confidence, inp.confidence) + 0.05),
                authority=min(twin.authority, inp.authority), updated_at_ms=max(twin.updated_at_ms, said),
                expires_at_ms=max(twin.expires_at_ms, inp.expires_at_ms) if twin.expires_at_ms else 0)
            pending.put(merged, twin_blob, MemoryChange(merged, "merge", "near duplicate of a new statement", at))
            pending.ops.append(lambda st: st.refresh(merged))
            return WriteResult("merged", merged)

        if any(o.authority == Authority.USER_STATED for o in older) and inp.authority == Authority.INFERRED:
            return WriteResult("rejected", None, reason="outranked_by_user_stated")
        memory = Memory(memory_id=new_id("mem"), type=inp.type, content=inp.content, subject=subject,
                        source_message_ids=sorted(set(inp.source_message_ids)), confidence=inp.confidence,
                        authority=inp.authority, created_at_ms=said, updated_at_ms=said,
                        expires_at_ms=inp.expires_at_ms,
                        tokens=tokens.count_line(render_memory(inp.content)))
        blob = vector.astype(np.float32).tobytes()
        if newer:
            return self._said_before(pending, memory, blob, max(newer, key=lambda o: (o.updated_at_ms, o.memory_id)), at)
        pending.put(memory, blob, MemoryChange(memory, "create", "", at), vector)
        for o, old_blob in zip(older, older_blobs, strict=True):
            old = replace(o, status=MemoryStatus.SUPERSEDED, superseded_by=memory.memory_id, updated_at_ms=at)
            pending.put(old, old_blob, MemoryChange(old, "supersede", f"replaced by {memory.memory_id} on {subject!r}", at))

        def supersede(st: UserMemories) -> None:
            for o in older:
                st.remove(o.memory_id)
                st.mark_superseded(memory.memory_id, o.memory_id)
            st.add(memory, vector)

        pending.ops.append(supersede)
        if older:
            return WriteResult("superseded_older", memory, superseded_id=older[0].memory_id)
        return WriteResult("created", memory)

    @staticmethod
    def _said_before(pending: _Pending, memory: Memory, blob: bytes, current: Memory, at: int) -> WriteResult:
        """A statement said before the active memory `current` of its subject (a history imported after
        the user said something newer): stored as current's history, superseded by it on arrival."""
        pending.put(memory, blob, MemoryChange(memory, "create", "", at))
        old = replace(memory, status=MemoryStatus.SUPERSEDED, superseded_by=current.memory_id, updated_at_ms=at)
        pending.put(old, blob, MemoryChange(old, "supersede", f"said before {current.memory_id} on {memory.subject!r}", at))
        pending.ops.append(lambda st: st.mark_superseded(current.memory_id, memory.memory_id))
        return WriteResult("superseded_by_newer", old, superseded_id=current.memory_id)

    # A write holds its user's writer lock, not self._lock, across the database call: a commit (an
    # fsync) must not stall BuildContext and searches of other users. Writers of one user are
    # serialised, so decisions (merge, supersede) see every earlier write of that user.
    def _writer(self, scope: Scope) -> threading.Lock:
        return self._writer_locks[self._changes.stripe(scope_key(scope))]

    def _apply(self, scope: Scope, change: Callable[[UserMemories], None]) -> None:
        """A committed change, applied to the user's state if it is loaded. A state loaded while the
        write was in flight may already hold it: every change is idempotent."""
        key = scope_key(scope)
        with self._lock:
            self._changes.changed(key)
            state = self._users.get(key)
            if state is not None:
                change(state)

    @staticmethod
    def _blob(state: UserMemories, memory_id: str) -> bytes:
        return state.index.vector(memory_id).astype(np.float32).tobytes()

    @staticmethod
    def _near_duplicate(state: UserMemories, pending: _Pending, inp: MemoryInput, vector: np.ndarray,
                        at: int) -> Memory | None:
        """The active memory of the candidate's type that says the same (as `pending` leaves it): the
        user's stored ones first, in search order, then those created before it in the same write."""
        for hit in state.search(vector, inp.content, 5, now_ms=at, include_expired=True):
            m = pending.current(hit.memory)
            if (m.status == MemoryStatus.ACTIVE and m.type == inp.type
                    and (hit.dense >= MERGE_COSINE or near_duplicate(m.content, inp.content))):
                return m
        for m, v in pending.created():
            if m.type == inp.type and (float(v @ vector) >= MERGE_COSINE or near_duplicate(m.content, inp.content)):
                return m
        return None

    # ------------------------------------------------------------------ API
    def add(self, scope: Scope, inp: MemoryInput) -> WriteResult:
        check_text(inp.content, "content", MAX_CONTENT, required=True)
        check_text(inp.subject, "subject", 256)
        if not 0.0 <= inp.confidence <= 1.0:
            raise InvalidArgument(f"confidence must be within 0-1 (got {inp.confidence})")
        if inp.expires_at_ms < 0:
            raise InvalidArgument("expires_at_ms must not be negative")
        for i, mid in enumerate(inp.source_message_ids):
            check_id(mid, f"source_message_ids[{i}]")
        if inp.embedding is not None:
            inp.embedding = client_vector(inp.embedding, self.embedder.dim, "embedding")
        result = self.write(scope, inp)
        if result.outcome == "rejected":
            raise InvalidArgument(f"content was rejected: {result.reason.replace('_', ' ')}")
        return result

    def search(self, scope: Scope, query: str, embedding: Sequence[float] | None, types: Sequence[MemoryType],
               top_k: int, min_score: float) -> list[ScoredMemory]:
        check_text(query, "query", 64 * 1024)
        if top_k < 0 or top_k > 100:
            raise InvalidArgument(f"top_k must be 0-100 (got {top_k})")
        vector = (client_vector(embedding, self.embedder.dim, "query_embedding") if embedding
                  else self.embedder.embed([query])[0] if query.strip() else None)
        if vector is None and not query.strip():
            raise InvalidArgument("query or query_embedding is required")
        state = self.user(scope)
        with self._lock:
            return state.search(vector, query, top_k or 10, now_ms=now_ms(), types=types,
                                           min_score=min_score if min_score else float("-inf"))

    def list(self, scope: Scope, page_size: int, page_token: str, types: Sequence[MemoryType],
             include_inactive: bool) -> tuple[list[Memory], str]:
        size = check_page_size(page_size)
        offset = decode_page_token(page_token)
        rows = self.store.list_memories(scope, limit=size + 1, offset=offset, types=[int(t) for t in types],
                                        include_inactive=include_inactive, now_ms=now_ms())
        return rows[:size], (str(offset + size) if len(rows) > size else "")

    def get(self, scope: Scope, memory_id: str) -> Memory:
        check_id(memory_id, "memory_id")
        memory = self.store.get_memory(scope, memory_id)
        if memory is None:
            raise NotFound(f"memory_id {memory_id!r} not found for this tenant and user")
        return memory

    def update(self, scope: Scope, memory_id: str, *, content: str | None, confidence: float | None,
               expires_at_ms: int | None, type_: MemoryType | None) -> Memory:
        if content is not None:
            check_text(content, "content", MAX_CONTENT, required=True)
            if contains_secret(content):
                raise InvalidArgument("content was rejected: secret")
        if confidence is not None and not 0.0 <= confidence <= 1.0:
            raise InvalidArgument(f"confidence must be within 0-1 (got {confidence})")
        if expires_at_ms is not None and expires_at_ms < 0:
            raise InvalidArgument("expires_at_ms must not be negative")
        at = now_ms()
        with self._writer(scope):
            current = self.get(scope, memory_id)
            if current.status != MemoryStatus.ACTIVE:
                raise FailedPrecondition(f"memory_id {memory_id!r} is {current.status.name.lower()}; only an "
                                         "active memory can be edited")
            new_content = current.content if content is None else content
            updated = replace(
                current, content=new_content, confidence=current.confidence if confidence is None else confidence,
                expires_at_ms=current.expires_at_ms if expires_at_ms is None else expires_at_ms,
                type=current.type if type_ is None else type_, updated_at_ms=at, authority=Authority.USER_STATED,
                tokens=tokens.count_line(render_memory(new_content)))
            vector = self.embedder.embed([new_content])[0]
            self.store.put_memories(scope, [(updated, vector.tobytes())],
                                    [MemoryChange(updated, "update", "edited by the user", at)])
            self._apply(scope, lambda st: (st.remove(memory_id), st.add(updated, vector)))
            return updated

    def delete(self, scope: Scope, memory_id: str) -> None:
        with self._writer(scope):
            current = self.get(scope, memory_id)
            # Forgetting is what the user means: the turns it was learnt from leave recall with it
            # (their own session keeps them as history).
            sources = set(current.source_message_ids)
            self._remove(scope, current, "deleted by the user", sources)
            for hook in self._on_delete:
                hook(scope, sources)

    def _remove(self, scope: Scope, current: Memory, reason: str, unrecall: set[str]) -> None:
        at = now_ms()
        tombstone = replace(current, content="", subject="", source_message_ids=[],
                            status=MemoryStatus.DELETED, updated_at_ms=at)
        self.store.delete_memory(scope, current.memory_id, MemoryChange(tombstone, "delete", reason, at),
                                 sorted(unrecall))
        self.invalidate(scope)  # rebuilt from rows: no word or subject of the deleted one lingers in the index

    def drop_sources(self, scope: Scope, message_ids: set[str]) -> int:
        """Deleted turns take with them the memories learnt only from them; an active memory with
        other sources too keeps those. Returns the memories deleted."""
        gone = 0
        with self._writer(scope):
            blobs = {m.memory_id: blob for m, blob in self.store.active_memories_with_embeddings(scope)}
            rows = self.store.list_memories(scope, limit=1_000_000, offset=0, types=[], include_inactive=True,
                                            now_ms=0)
            for m in rows:
                sources = set(m.source_message_ids)
                if not sources & message_ids:
                    continue
                if sources <= message_ids:
                    self._remove(scope, m, "its source turns were deleted", set())
                    gone += 1
                elif m.memory_id in blobs:
                    kept = replace(m, source_message_ids=sorted(sources - message_ids), updated_at_ms=now_ms())
                    self.store.put_memories(scope, [(kept, blobs[m.memory_id])],
                                            [MemoryChange(kept, "update", "some source turns were deleted",
                                                          kept.updated_at_ms)])
                    self._apply(scope, lambda st, kept=kept: st.refresh(kept))
        return gone

    def generation(self, scope: Scope) -> tuple[int, int]:
        """Changes whenever the user's memories change (a write, an edit, a deletion, a reload) or one
        expires."""
        state = self.user(scope)
        return state.generation, state.expiry_interval(now_ms())

    def superseded_turns(self, scope: Scope) -> dict[str, SupersededTurn]:
        """The source turns of the user's superseded memories (those not also sources of the memory that
        replaced them), with the date and content of the current one, so recall can mark them."""
        state = self.user(scope)
        marks, generation = state.turn_marks, state.generation
        if marks is not None:
            return marks
        marks = _turn_marks(self.store.list_memories(
            scope, limit=1_000_000, offset=0, types=[], include_inactive=True, now_ms=0)) if state.superseded else {}
        with self._lock:
            if state.generation == generation:  # kept only if no write landed while the rows were read
                state.turn_marks = marks
        return marks

    def history(self, scope: Scope, memory_id: str) -> list[MemoryChange]:
        check_id(memory_id, "memory_id")
        changes = self.store.memory_history(scope, memory_id)
        if not changes:
            raise NotFound(f"memory_id {memory_id!r} not found for this tenant and user")
        return changes

    def invalidate(self, scope: Scope) -> None:
        """Drop the user's in-process state (another replica wrote); rebuilt from rows on next use."""
        key = scope_key(scope)
        with self._lock:
            self._changes.changed(key)
            self._users.pop(key, None)

    def forget_user(self, scope: Scope) -> dict[str, int]:
        with self._writer(scope), self._lock:
            self._changes.changed(scope_key(scope))
            state = self._users.pop(scope_key(scope), None)
            index_entries = len(state.index) if state else len(self.store.active_memories_with_embeddings(scope))
            counts = self.store.forget_user(scope)
            counts["memory_index"] = index_entries
            for hook in self._on_forget:
                counts.update(hook(scope))
            return counts

    def entry_count(self) -> float:
        with self._lock:
            return float(sum(len(u.index) for u in self._users.values()))

    def indexed_ids(self, scope: Scope) -> list[str]:
        state = self.user(scope)
        with self._lock:
            return sorted(state.index.keys())


def _rejected(inp: MemoryInput) -> WriteResult | None:
    """A candidate no memory may hold: a secret, or a pasted log."""
    if contains_secret(inp.content):
        return WriteResult("rejected", None, reason="secret")
    if looks_like_raw_log(inp.content):
        return WriteResult("rejected", None, reason="raw_log")
    return None


class _Pending:
    """What a write_many has decided and not stored yet: each memory's row as it will be stored (its
    latest version), every change in order for the history, and the state's updates once stored."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[Memory, bytes]] = {}
        self.changes: list[MemoryChange] = []
        self.ops: list[Callable[[UserMemories], None]] = []
        self._new: dict[str, np.ndarray] = {}  # memories created in this write: their vectors

    def put(self, memory: Memory, blob: bytes, change: MemoryChange, new_vector: np.ndarray | None = None) -> None:
        self.rows[memory.memory_id] = (memory, blob)
        self.changes.append(change)
        if new_vector is not None:
            self._new[memory.memory_id] = new_vector

    def current(self, memory: Memory) -> Memory:
        row = self.rows.get(memory.memory_id)
        return row[0] if row is not None else memory

    def blob(self, memory_id: str) -> bytes:
        row = self.rows.get(memory_id)
        return row[1] if row is not None else b""

    def created(self) -> list[tuple[Memory, np.ndarray]]:
        """The memories this write created that are still active, oldest first, with their vectors."""
        return [(m, v) for i, v in self._new.items() if (m := self.rows[i][0]).status == MemoryStatus.ACTIVE]

    def same_subject(self, state: UserMemories, type_: MemoryType, subject: str) -> list[Memory]:
        """state.same_subject as this write leaves it: the stored ones still active, then those it created."""
        stored = [m for o in state.same_subject(type_, subject) if (m := self.current(o)).status == MemoryStatus.ACTIVE]
        return stored + [m for m, _ in self.created() if m.type == type_ and m.subject == subject]

    def apply(self, state: UserMemories) -> None:
        for op in self.ops:
            op(state)
