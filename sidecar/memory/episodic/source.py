"""EpisodicSource: the CandidateSource over a user's past turns. It keeps one _UserIndex per
(tenant, user) in memory within bounds, current through the store's append listener, saved and
restored through snapshots, dropped on forget; and turns a query's ranking into a candidate batch
(turns, day headers, superseded marks)."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np

import fastpath
from sidecar.assembly.candidates import (
    BuildInput,
    CandidateBatch,
    ItemMeta,
    Section,
    SoftCategory,
    client_vector_of,
)
from sidecar.domain import Category, Message, Role, Scope
from sidecar.index.embedders import Embedder
from sidecar.index.word_vectors import StaticEmbedder
from sidecar.memory.episodic.cache import _RankedCache
from sidecar.memory.episodic.dates import date_label, query_days
from sidecar.memory.episodic.expansion import _stem_vectors, precompute_similar
from sidecar.memory.episodic.index import INDEXED_ROLES, _pick, _UserIndex
from sidecar.memory.episodic.passages import best_passage, passage_cap, pieces
from sidecar.memory.episodic.ranking import DEFAULT_RANKING, MODEL_RANKING, Ranking, _index_knobs
from sidecar.memory.episodic.relative_dates import RelativeDates, relative_dates
from sidecar.memory.episodic.scoring import _best_first
from sidecar.memory.episodic.snapshots import (
    MAX_SNAPSHOT_BYTES,
    SAVE_AT_CLOSE_S,
    SNAPSHOT_VERSION,
    _open_snapshots,
    _snapshot_name,
    backend_of,
    log,
    map_snapshot,
    snapshot_dir,
    store_identity,
    write_mark,
)
from sidecar.memory.episodic.terms import _WORD_RE, names_pattern, terms
from sidecar.memory.episodic.updates import asks_before
from sidecar.memory.recall import SupersededTurn
from sidecar.store.records import SessionImport
from sidecar.tokens import count_line
from sidecar.unlocked_loads import ChangeSerials

MAX_USERS = 2048  # users kept in memory; an evicted one is rebuilt from rows on its next call
# Memory bounds. A user's index holds their newest MAX_TURNS_PER_USER turns: past that it is rebuilt
# from the newest three quarters (older turns live on in extracted memories and summaries). All
# users together hold at most MAX_TOTAL_TURNS; the least recently used go first.
MAX_TURNS_PER_USER = 4096
MAX_TOTAL_TURNS = 262_144
# An import of at most this many turns, all after the user's other sessions, is added to the user's
# index in memory (holding the lock, as an append of as many does); a larger one is rebuilt without it.
IMPORT_ADDED_MAX = 1000
PASSAGES_KEPT = 4096  # long turns whose pieces, and packed texts (passages, marks) whose token counts, are kept


class EpisodicSource:
    """CandidateSource over every past turn of the user; the current session is MessageSource's."""

    name = "episodic"

    def __init__(self, store, embedder: Embedder | None = None, *, ranking: Ranking = DEFAULT_RANKING,
                 max_users: int = MAX_USERS, max_turns_per_user: int = MAX_TURNS_PER_USER,
                 max_total_turns: int = MAX_TOTAL_TURNS, max_snapshot_bytes: int = MAX_SNAPSHOT_BYTES,
                 snapshots_in: str = "") -> None:
        self.store = store
        # Static word vectors joined with hashed n-grams (no model); the app's model embedder in the
        # optional model profile (use_model), whose space a client's query_embedding is in.
        self.embedder: Embedder = embedder or StaticEmbedder()
        self.dim = self.embedder.dim
        self.takes_client_vectors = False
        self.ranking = ranking
        self.max_users = max_users
        self.max_turns_per_user = max(min(max_turns_per_user, max_total_turns), 4)
        self.max_total_turns = max(max_total_turns, self.max_turns_per_user)
        self._users: OrderedDict[tuple[str, str], _UserIndex] = OrderedDict()
        self._ranked = _RankedCache()
        # Long turns' pieces, (index serial, row, piece size) -> offsets, and the token counts of the
        # texts a turn is packed as (a passage, a superseded mark), (index serial, row, length, hash)
        # -> tokens (_counted): offsets and counts, never text.
        self._pieces: OrderedDict[tuple[int, int, int], list[tuple[int, int]]] = OrderedDict()
        self._line_tokens: dict[tuple[int, int, int, int], int] = {}
        self._lock = threading.RLock()
        # Bumped (under _lock) by every change of a user's turns or index: see _user().
        self._changes = ChangeSerials()
        self._closing = threading.Event()
        # Users' indexes saved when they leave memory (evicted, or the process closing) and restored
        # on their next call instead of rebuilt from rows; names of the files that are current.
        # On PostgreSQL (snapshots_in given) users changed while no process of this directory ran
        # lose theirs at the start; feed_from is where this replica's change feed takes over.
        self.max_snapshot_bytes = max_snapshot_bytes
        directory = snapshot_dir(store, snapshots_in) if max_snapshot_bytes else None
        self._store_identity = store_identity(store) if directory is not None else ""
        opened = _open_snapshots(directory, self._store_identity,
                                 getattr(backend_of(store), "users_changed_since", None))
        self._snapshot_dir, self._snapshots, self.feed_from = opened.directory, opened.current, opened.feed_from
        self._snapshot_lock = opened.lock
        # The app's MemoryService.superseded_turns: turns a superseded memory was learnt from are
        # marked when recalled and never outrank the current memory's turns.
        self.superseded_turns: Callable[[Scope], dict[str, SupersededTurn]] | None = None

    def warm_up(self) -> None:
        """Build the per-stem word vectors (~0.3 s) and every stem's similar stems (~1 s) at start-up
        rather than in the first queries."""
        r = self.ranking
        if r.similar_terms > 0:
            _stem_vectors()
        if r.similar_terms > 0 and r.similar_weight > 0:
            precompute_similar(r.similar_min, self._closing.is_set)

    def close(self, change_seq: int | None = None) -> None:
        """Stop the warm-up (the app joins its thread before the process exits) and save the indexes
        of the users in memory (for at most SAVE_AT_CLOSE_S), so they are restored after a restart;
        `change_seq`: on PostgreSQL, the change every later one of which the next start must check."""
        self._closing.set()
        if self._snapshot_dir is None:
            return
        deadline = time.monotonic() + SAVE_AT_CLOSE_S
        with self._lock:
            for key, state in reversed(self._users.items()):  # the most recently used first
                if time.monotonic() > deadline:
                    break
                self._save(key, state)
            try:
                write_mark(self._snapshot_dir, self._store_identity, change_seq)
            except OSError:
                log.warning("episodic snapshots: could not mark them current; rebuilt from rows next start")
            # The directory is the next process's: nothing more is saved or deleted there by this one.
            self._snapshot_dir = None
            if self._snapshot_lock is not None:
                self._snapshot_lock.close()

    def use_model(self, embedder: Embedder, ranking: Ranking = MODEL_RANKING) -> None:
        """Rank with a model embedder and the ranking tuned for one; indexes are rebuilt from rows."""
        with self._lock:
            self.embedder, self.dim, self.ranking = embedder, embedder.dim, ranking
            self.takes_client_vectors = True
            self._changes.changed_all()
            self._users.clear()
            self._ranked.clear()

    def set_ranking(self, ranking: Ranking) -> None:
        """Rank with other knobs (tuning, bench/recall.py --offline). The users' indexes are rebuilt
        from rows only when the knobs an index is built with differ (_index_knobs); a model profile's
        rebuild embeds every turn again."""
        with self._lock:
            if _index_knobs(ranking) != _index_knobs(self.ranking):
                self._changes.changed_all()
                self._users.clear()
            self._ranked.clear()
            self.ranking = ranking

    # ------------------------------------------------------------------ upkeep
    def on_append(self, scope: Scope, session_id: str, messages: list[Message]) -> None:
        """store.append_listeners hook: index new turns of the user, loading them first if need be (a
        returning user's saved index is restored, and gains these turns as a user in memory does; without
        one it is built from rows, which hold them already: add() skips turns it has)."""
        if not any(m.role in INDEXED_ROLES for m in messages):
            return
        view = self.store.session_view(scope, session_id)  # cached: the append just loaded it
        if view is None or view.session.parent_session_id:
            return  # a sub-agent's turns reach other sessions only as its result summary
        try:
            self._user(scope)
        except Exception:
            log.exception("episodic index load failed for a user; rebuilt from rows on next use")
            self.drop_user(scope)
            return
        self._grow(scope, messages)

    def _grow(self, scope: Scope, messages: Sequence[Message]) -> bool:
        """Index the user's new turns into their index in memory; whether it was there."""
        key = (scope.tenant_id, scope.user_id)
        with self._lock:
            self._changes.changed(key)
            self._discard(key)  # the user's rows changed: a saved index lacks these turns
            state = self._users.get(key)
            if state is None:  # left memory meanwhile: its next load reads these turns from rows
                return False
            try:
                if state.add(messages, self.embedder, self.ranking.stem) and len(state) > self.max_turns_per_user:
                    # Keep the newest three quarters, so the next compaction is a quarter of the cap away.
                    self._users[key] = state.compacted(len(state) - self.max_turns_per_user * 3 // 4)
                    self._ranked.drop(state)
            except Exception:
                # The rows are committed: the call must not fail, and a half-updated index must not be
                # searched. Drop it; the user's next search rebuilds it from rows.
                log.exception("episodic index update failed for a user; rebuilt from rows on next use")
                self.drop_user(scope)
                return True
            self._bound(key)
            return True

    def on_import(self, scope: Scope, imported: Sequence[SessionImport] = ()) -> None:
        """store.import_listeners hook. Imported sessions may sit anywhere in the user's timeline (they
        are dated by their first message). Those that all come after the user's other sessions, of at
        most IMPORT_ADDED_MAX turns, are added to the user's index in memory as an append of as many
        would be (a history imported session by session costs each session's turns, not the whole
        history again). Otherwise the user's index is rebuilt from rows, in timeline order, as a
        restart would rebuild it, with its ranking caches (the user's next question often comes
        next), or, for a user with no other history, from the imported turns themselves (the same
        turns in the same order, not read back); without the lock, as a first call loads a user
        (_user), so other users' calls do not wait behind a large import's build."""
        if self._added_in_place(scope, imported):
            return
        key = (scope.tenant_id, scope.user_id)
        with self._lock:
            self._changes.changed(key)
            self._discard(key)
            state = self._users.pop(key, None)
            if state is not None:
                self._ranked.drop(state)
        try:
            self._user(scope, warm=True, imported=imported)
        except Exception:
            log.exception("episodic index rebuild failed for a user; rebuilt from rows on next use")
            self.drop_user(scope)

    def _added_in_place(self, scope: Scope, imported: Sequence[SessionImport]) -> bool:
        ordered = sorted(imported, key=lambda item: (item.session.created_at_ms, item.session.session_id))
        turns = [m for item in ordered for m in item.plan.out]
        if not turns or len(turns) > IMPORT_ADDED_MAX or (scope.tenant_id, scope.user_id) not in self._users:
            return False
        last = self.store.newest_session_with_messages(scope, [item.session.session_id for item in ordered])
        # Strictly later: sessions of the same millisecond are ordered by id in the database's collation.
        return (last is None or last[0] < ordered[0].session.created_at_ms) and self._grow(scope, turns)

    def generation(self, scope: Scope) -> tuple[int, int] | None:
        """Changes whenever the user's past turns are rebuilt or some leave recall (not when turns are
        added: a session's recalled turns come from other sessions)."""
        state = self._users.get((scope.tenant_id, scope.user_id))
        return (state.serial, len(state.hidden)) if state is not None else None

    def exclude(self, scope: Scope, message_ids: set[str]) -> None:
        """Stop recalling these turns of the user (their rows stay in their session's history). A
        snapshot holds the turns hidden when it was saved: it is deleted."""
        with self._lock:
            key = (scope.tenant_id, scope.user_id)
            self._changes.changed(key)
            self._discard(key)
            state = self._users.get(key)
            if state is not None:
                state.hide(message_ids)
                self._ranked.drop(state)

    def drop_user(self, scope: Scope) -> None:
        """Forget the user's in-memory index and its snapshot (rebuilt from rows when next needed)."""
        with self._lock:
            self._changes.changed((scope.tenant_id, scope.user_id))
            state = self._users.pop((scope.tenant_id, scope.user_id), None)
            if state is not None:
                self._ranked.drop(state)
            self._discard((scope.tenant_id, scope.user_id))

    def evict(self, scope: Scope) -> None:
        """Let the user's index go as the least recently used do (_bound): saved, their rows unchanged."""
        with self._lock:
            key = (scope.tenant_id, scope.user_id)
            state = self._users.pop(key, None)
            if state is not None:
                self._ranked.drop(state)
                self._save(key, state)

    def forget(self, scope: Scope) -> dict[str, int]:
        """ForgetUser hook: drop the user's index and its snapshot (their rows are deleted by the store)."""
        with self._lock:
            self._changes.changed((scope.tenant_id, scope.user_id))
            state = self._users.pop((scope.tenant_id, scope.user_id), None)
            if state is not None:
                self._ranked.drop(state)  # the rankings hold the user's questions
            self._discard((scope.tenant_id, scope.user_id))
            return {"episodic_index": len(state) if state else 0}

    def indexed(self, scope: Scope) -> int:
        with self._lock:
            state = self._users.get((scope.tenant_id, scope.user_id))
            return len(state) if state else 0

    def _user(self, scope: Scope, warm: bool = False, imported: Sequence[SessionImport] = ()) -> _UserIndex:
        """The user's index, loaded on first use (restored from its snapshot, or built from rows) without
        the lock, so calls for other users do not wait behind the read and the build; it is kept only if
        no change of the user's stripe landed meanwhile (turns appended, hidden, forgotten; the knobs
        changed), else loaded again (ChangeSerials.load). `warm`: a loaded index's ranking caches are
        made before it is kept, while no other call can see it (_UserIndex.warm). `imported`: sessions
        just stored; the first read builds the index from their turns when they are the user's whole
        history (_from_import), a read after a change made it stale reads rows."""
        key = (scope.tenant_id, scope.user_id)
        reads = 0

        def find() -> _UserIndex | None:
            state = self._users.get(key)
            if state is not None:
                self._users.move_to_end(key)
            return state

        def begin() -> Callable[[], tuple[_UserIndex, bool]]:
            nonlocal reads
            reads += 1
            read = partial(self._read, scope, self._snapshot_path(key), self.embedder, self.ranking, self._meta())
            if imported and reads == 1:
                read = partial(self._from_import, scope, imported, self.embedder, self.ranking, read)
            return partial(_warmed, read, self.ranking) if warm else read

        def keep(got: tuple[_UserIndex, bool]) -> _UserIndex:
            state, unreadable = got
            if unreadable:
                self._discard(key)  # it is rebuilt from rows until saved again
            self._install(key, state)
            return state

        return self._changes.load(self._lock, key, find, begin, keep, lambda: self._load(scope))

    def _load(self, scope: Scope) -> _UserIndex:
        """The user's index loaded and kept, all under the lock (held by the caller)."""
        key = (scope.tenant_id, scope.user_id)
        state, unreadable = self._read(scope, self._snapshot_path(key), self.embedder, self.ranking, self._meta())
        if unreadable:
            self._discard(key)
        self._install(key, state)
        return state

    def _read(self, scope: Scope, snapshot: Path | None, embedder: Embedder, ranking: Ranking, meta: tuple
              ) -> tuple[_UserIndex, bool]:
        """(the user's index: restored from `snapshot` if given and readable, else built from rows, whether
        the snapshot was unreadable); with these knobs, taken under the lock."""
        restored = self._restore(snapshot, meta) if snapshot is not None else None
        if restored is not None:
            return restored, False
        return self._from_rows(scope, embedder, ranking), snapshot is not None

    def _from_rows(self, scope: Scope, embedder: Embedder, ranking: Ranking) -> _UserIndex:
        # Read no more than the cap allows (a long history must not make this slower over time).
        return self._built(scope, self._rows(scope, self.max_turns_per_user + 1), embedder, ranking)

    def _from_import(self, scope: Scope, imported: Sequence[SessionImport], embedder: Embedder, ranking: Ranking,
                     read: Callable[[], tuple[_UserIndex, bool]]) -> tuple[_UserIndex, bool]:
        """The user's index from the turns of sessions just imported when they are all the user's
        stored messages, no other (what _rows would read, put in the order the database gives: asked
        after the change serial was taken, so a deletion or an append since the import is seen here or
        makes the load stale); else read()."""
        imported_messages = {m.message_id: m for item in imported for m in item.plan.out}
        stored = self.store.user_message_ids(scope)
        if (len(stored) != len(imported_messages) or not all(i in imported_messages for i in stored)
                or any(item.session.parent_session_id for item in imported)):
            return read()
        turns = [m for i in stored if (m := imported_messages[i]).role in INDEXED_ROLES]
        return self._built(scope, turns, embedder, ranking), False

    def _built(self, scope: Scope, turns: list[Message], embedder: Embedder, ranking: Ranking) -> _UserIndex:
        """The index of these turns of the user, in timeline order (past the cap, the newest of them)."""
        window, date_headers, context, context_chars, context_mix, stemmed = _index_knobs(ranking)
        state = _UserIndex(dim=embedder.dim, window=window, dated=not date_headers, context=context,
                           context_chars=context_chars, context_mix=context_mix)
        # Past the cap keep the newest three quarters, so the next compaction is a quarter of the cap away.
        if len(turns) > self.max_turns_per_user:
            turns = turns[-(self.max_turns_per_user * 3 // 4):]
        state.add(turns, embedder, stemmed)
        state.hide(self.store.recall_exclusions(scope))  # a snapshot holds them (exclude deletes it)
        return state

    def _install(self, key: tuple[str, str], state: _UserIndex) -> None:
        old = self._users.pop(key, None)
        if old is not None:
            self._ranked.drop(old)
        self._users[key] = state
        self._bound(key)

    def _bound(self, keep: tuple[str, str]) -> None:
        """Evict least recently used users past MAX_USERS or MAX_TOTAL_TURNS (never `keep`)."""
        total = sum(len(s) for s in self._users.values())
        while len(self._users) > 1 and (len(self._users) > self.max_users or total > self.max_total_turns):
            victim = next(iter(self._users))
            if victim == keep:
                self._users.move_to_end(victim)
                victim = next(iter(self._users))
            gone = self._users.pop(victim)
            self._ranked.drop(gone)
            self._save(victim, gone)
            total -= len(gone)

    # ------------------------------------------------------------------ snapshots
    def _meta(self) -> tuple:
        """What a saved index must have been built with to be restored (see _UserIndex.freeze)."""
        window, date_headers, context, context_chars, context_mix, stemmed = _index_knobs(self.ranking)
        return (SNAPSHOT_VERSION, self.dim, window, not date_headers, context, context_chars, context_mix,
                stemmed, self.embedder.name, self.max_turns_per_user)

    def _save(self, key: tuple[str, str], state: _UserIndex) -> None:
        """Save a user's index that leaves memory, unless its snapshot is current (held under the lock,
        like every change of _snapshots: a file is current exactly while its name is there)."""
        name = _snapshot_name(key)
        if self._snapshot_dir is None or name in self._snapshots or not len(state):
            return
        path = self._snapshot_dir / name
        try:
            tmp = path.with_suffix(".tmp")
            blob = state.freeze(self._meta(), self.ranking)
            tmp.write_bytes(blob)
            os.replace(tmp, path)
        except Exception:
            log.exception("episodic snapshot not saved; the user is rebuilt from rows on next use")
            return
        self._snapshots[name] = len(blob)
        # Bounded like the in-memory index: the oldest saved go first (their users rebuild from rows).
        while sum(self._snapshots.values()) > self.max_snapshot_bytes and self._snapshots:
            old, _ = self._snapshots.popitem(last=False)
            (self._snapshot_dir / old).unlink(missing_ok=True)

    def _snapshot_path(self, key: tuple[str, str]) -> Path | None:
        """The user's snapshot file while it is current (under the lock: see _save)."""
        name = _snapshot_name(key)
        if self._snapshot_dir is None or name not in self._snapshots:
            return None
        return self._snapshot_dir / name

    @staticmethod
    def _restore(path: Path, meta: tuple) -> _UserIndex | None:
        """The index saved in `path`; None where it is unreadable, of another build, or was deleted
        meanwhile (a load without the lock then finds its stripe's serial moved)."""
        try:
            return _UserIndex.restore(map_snapshot(path), meta)
        except FileNotFoundError:
            return None
        except Exception:
            log.exception("episodic snapshot unreadable; the user is rebuilt from rows")
            return None

    def _discard(self, key: tuple[str, str]) -> None:
        """The user's rows changed (or are gone): their snapshot, if any, is deleted."""
        name = _snapshot_name(key)
        if self._snapshot_dir is None or name not in self._snapshots:
            return
        self._snapshots.pop(name, None)
        (self._snapshot_dir / name).unlink(missing_ok=True)

    def indexed_total(self) -> int:
        with self._lock:
            return sum(len(s) for s in self._users.values())

    def _rows(self, scope: Scope, newest: int) -> list[Message]:
        # Sessions in creation order, turns in sequence order, so neighbours are conversational.
        return self.store.list_user_messages(scope, [int(Role.USER), int(Role.ASSISTANT)], newest)

    # ------------------------------------------------------------------ hot path
    def search(self, scope: Scope, query: str, exclude_session: str, budget_tokens: int,
               query_embedding: np.ndarray | None = None,
               relative: tuple[tuple[int, int], ...] = ()) -> tuple[_UserIndex, np.ndarray, np.ndarray]:
        """(index, rows best first, their relevance in (0, 1]) worth about budget * candidate_factor
        tokens; `relative`: the days the query names relative to its asking (relative_dates)."""
        r = self.ranking
        given = self._given(query_embedding)
        key = (scope.tenant_id, scope.user_id)
        relative = relative if r.relative_boost else ()
        # The same question again (an agent's tool loop rebuilds the context for one user message; a
        # caller tries another budget) over the same turns ranks them alike: its ranking is kept.
        memo = (query, exclude_session, r, query_embedding.tobytes() if given else None, relative)
        known = self._users.get(key)  # a peek without the lock, only to skip embedding for a kept ranking
        # The query vector (a model's: ~13 ms on one core) is taken outside the lock, so concurrent
        # calls for other users do not queue behind it; a model embedder keeps recent texts, so what the
        # builder embedded ahead (query_texts) or the memory source's embedding of the query is reused.
        text = self._query_text(key, query, given)
        qvec = None
        # Nothing to embed for when the user has no turns outside this session (a first session):
        # decided again under the lock, which embeds the query itself if turns arrived meanwhile.
        if known is not None and len(known) <= len(known.session_rows.get(exclude_session, ())):
            text = None
        if text is not None and (known is None or self._ranked.get(known, memo) is None):
            qvec = self.embedder.embed([text])[0]
        self._user(scope)  # loaded (if need be) before the lock
        with self._lock:
            state = self._users.get(key)
            if state is None:  # left memory again at once (another call's load evicted it)
                state = self._load(scope)
            empty = np.zeros(0, np.int64), np.zeros(0)
            own = len(state.session_rows.get(exclude_session, ()))
            if len(state) <= own or not query:  # nothing outside the current session to recall
                return state, *empty
            ranked = self._ranked.get(state, memo)
            if ranked is None:
                if given:
                    qvec = query_embedding
                elif qvec is None:  # a user's first call: loading the index costs far more
                    qvec = self.embedder.embed([_dense_query(query, state, r)])[0]
                ranked = _best_first(state.without_hidden(state.rank(query, qvec, exclude_session, r, relative)),
                                     r.max_candidates)
                self._ranked.put(state, memo, ranked)
        order, best = ranked
        if not len(order):
            return state, *empty
        # Keep only as many turns as could be packed (with slack for dedup and other categories); a
        # long turn is packed as its passage, no longer than the cap.
        cap = passage_cap(budget_tokens, r.passage_share, r.passage_min)
        cum = np.cumsum(np.minimum(state.tokens[order], cap) if cap else state.tokens[order])
        keep = int(np.searchsorted(cum, max(budget_tokens, 1) * r.candidate_factor, side="right")) + 1
        return state, order[:keep], best[:keep] / best[0]

    def _topic(self, state: _UserIndex, query: str, dates: RelativeDates) -> str:
        """What the query is ranked by: without the words of the times it names relative to its asking
        where turns were told then (the date prior lifts those), so "a couple of days ago" matches no
        turn about a couple; as asked where none were (its words are all there is to go on), where
        nothing else is left, or where the ranking has no date prior. Its callers ask only for a query
        that names such a time."""
        if not self.ranking.relative_boost or not state._told_near(dates.spans, self.ranking).any():
            return query
        rest = dates.without_phrases(query)
        return rest if terms(rest) else query

    def _given(self, query_embedding: np.ndarray | None) -> bool:
        """Whether the client's query vector is used (it is in a model's space, and of its size)."""
        return self.takes_client_vectors and client_vector_of(query_embedding, self.dim) is not None

    def _query_text(self, key: tuple[str, str], query: str, given: bool) -> str | None:
        """The text embedded for this query before the user's index is at hand: None when there is no
        query, the client's vector is used, or the speakers' names are to be left out of a user not
        loaded yet (then it is embedded once the index is loaded)."""
        r = self.ranking
        known = self._users.get(key)  # a peek without the lock: only its names (replaced whole) are read
        if not query or given or not (r.dense_query_names or known is not None):
            return None
        return _dense_query(query, known, r)

    def _searches(self, inp: BuildInput) -> bool:
        # A sub-session inherits only what was handed off, never the parent's (or any) history.
        return inp.budget.memories > 0 and bool(inp.query) and not inp.view.session.parent_session_id

    def query_texts(self, inp: BuildInput) -> list[str]:
        """What search() will embed for this call (see ContextBuilder.query_embedder)."""
        if not self._searches(inp):
            return []
        key, query = (inp.scope.tenant_id, inp.scope.user_id), inp.query
        if (dates := relative_dates(query, inp.asked_at_ms)).spans:
            known = self._users.get(key)  # a peek: a user not loaded yet has its query embedded by search()
            if known is None:
                return []
            query = self._topic(known, query, dates)
        text = self._query_text(key, query, self._given(inp.query_embedding))
        return [text] if text is not None else []

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        batch = CandidateBatch(category=SoftCategory.MEMORIES, section=Section.MEMORIES)
        budget = inp.budget.memories + (inp.budget.recent_messages if inp.budget.flow_unused else 0)
        if not self._searches(inp):
            return [batch]
        dates = relative_dates(inp.query, inp.asked_at_ms)
        query = self._topic(self._user(inp.scope), inp.query, dates) if dates.spans else inp.query
        state, rows, relevance = self.search(inp.scope, query, inp.view.session.session_id, budget,
                                             inp.query_embedding, dates.spans)
        if not len(rows):
            return [batch]
        row_list = rows.tolist()
        # Packed turns read as a timeline: order by time, then by sequence inside a session.
        keys = state.timestamps[rows].astype(np.float64) * 1000.0 + state.seqs[rows] % 1000
        batch.texts = _pick(state.texts, row_list)
        batch.sources = _pick(state.sources, row_list)
        batch.bodies = state.item_bodies(row_list)
        batch.order = keys
        batch.tokens = state.tokens[rows]
        batch.relevance = relevance
        # No recency bonus: which past turn is recalled is the ranking's to say (its date priors, and
        # a newer telling of a thing above an older one), and a bonus for last week's turns would
        # outweigh the relevance of last month's in a live user's recall.
        batch.age_s = np.full(len(rows), np.inf)
        batch.exact_keys = state.exact[rows]
        batch.simhashes = state.simhash[rows]
        cap = passage_cap(budget, self.ranking.passage_share, self.ranking.passage_min)
        if cap and int(batch.tokens.max()) > cap:
            self._cut_long(state, batch, row_list, query, budget, cap)
        marks = self.superseded_turns(inp.scope) if self.superseded_turns is not None else {}
        if marks:
            self._mark_superseded(state, batch, row_list, marks)
        headers: list[ItemMeta] = self._day_headers(state, batch, rows) if not state.dated else []
        batch.priority = np.zeros(len(batch.texts))
        batch.meta = partial(_turn_meta, state, row_list, headers, batch.order)
        # A question naming a day, or a time relative to its asking, asks about then, and one asking
        # for an earlier value about before: the newest telling of a thing is not the one it wants first.
        if self.ranking.update_min > 0 and not (dates.spans or query_days(inp.query) or asks_before(inp.query)):
            batch.rescore = partial(_newer_first, state, inp.query, rows, len(headers), self.ranking, self._lock)
        if not inp.counter.stored:  # another tokenizer: every item (turn, marked turn, day) is a line counted in it
            batch.tokens = np.array([inp.counter.line(t) for t in batch.texts], np.int32)
            batch.bodies = None  # the builder encodes the packed ones with these counts
        return [batch]

    def _cut_long(self, state: _UserIndex, batch: CandidateBatch, rows: list[int], query: str, budget: int,
                  cap: int) -> None:
        """The turns longer than the cap packed as their best passage (passages.py), the query's terms
        weighed by their idf among the user's turns."""
        r = self.ranking
        # Only turns that could be packed: those starting within the budget, counted with their passages
        # (a turn further down is packed only where dedup frees room; it stays whole).
        toks = np.asarray(batch.tokens)
        ahead = np.cumsum(np.minimum(toks, cap)) - np.minimum(toks, cap)
        long = np.flatnonzero((toks > cap) & (ahead < budget)).tolist()
        with self._lock:  # the index's term arrays and kept pieces are read (and cached) under the source's lock
            weight = state.idf_weights(state.query_terms(query, r)[0])
            cuts = [(j, best_passage(batch.texts[j], int(batch.tokens[j]), cap, weight,
                                     partial(self._pieces_of, state.serial, rows[j]))) for j in long]
        texts, bodies, toks = list(batch.texts), list(batch.bodies), np.array(batch.tokens, np.int32)
        for j, cut in cuts:
            if cut is None:
                continue
            counted = self._counted(state, rows[j], cut)
            if counted < toks[j]:  # never a passage that costs as much as the whole turn
                texts[j], toks[j], bodies[j] = cut, counted, _item_of(state, rows[j], cut, counted)
        batch.texts, batch.bodies, batch.tokens = texts, bodies, toks

    def _pieces_of(self, serial: int, row: int, body: str, most_chars: int) -> list[tuple[int, int]]:
        """passages.pieces of a long turn, kept for the PASSAGES_KEPT turns last cut (a turn recalled
        again, or at another budget, is not split again); only offsets are kept. Called under the lock."""
        key = (serial, row, most_chars)
        got = self._pieces.get(key)
        if got is None:
            got = self._pieces[key] = pieces(body, most_chars)
            if len(self._pieces) > PASSAGES_KEPT:
                self._pieces.popitem(last=False)
        else:
            self._pieces.move_to_end(key)
        return got

    def _mark_superseded(self, state: _UserIndex, batch: CandidateBatch, rows: list[int],
                         marks: dict[str, SupersededTurn]) -> None:
        """A recalled turn whose memory was superseded says so, with the date and what replaced it, and
        ranks at half its relevance and below every turn of the current memory among the candidates."""
        ids = _pick(state.ids, rows)
        hit = [j for j, i in enumerate(ids) if i in marks]
        if not hit:
            return
        at = {i: j for j, i in enumerate(ids)}
        relevance = np.array(batch.relevance, np.float64)
        texts, bodies, toks = list(batch.texts), list(batch.bodies), np.array(batch.tokens, np.int32)
        for j in hit:
            row = rows[j]
            mark = marks[ids[j]]
            current = [relevance[at[i]] for i in mark.current_sources if i in at]
            relevance[j] = min([relevance[j] * 0.5, *(0.99 * c for c in current)])
            texts[j] = f"[superseded on {date_label(mark.at_ms)[1:-1]} by: {mark.by}] {texts[j]}"
            toks[j] = self._counted(state, row, texts[j])
            bodies[j] = _item_of(state, row, texts[j], int(toks[j]))
        batch.relevance, batch.texts, batch.bodies, batch.tokens = relevance, texts, bodies, toks

    def _counted(self, state: _UserIndex, row: int, text: str) -> int:
        """count_line of a text a turn is packed as, counted once: the same question again (a tool loop,
        a retry) packs the same passages and marks."""
        key = (state.serial, row, len(text), hash(text))
        counted = self._line_tokens.get(key)
        if counted is None:
            if len(self._line_tokens) >= PASSAGES_KEPT:
                self._line_tokens.clear()
            counted = self._line_tokens[key] = count_line(text)
        return counted

    @staticmethod
    def _day_headers(state: _UserIndex, batch: CandidateBatch, rows: np.ndarray) -> list[ItemMeta]:
        """One "[8 May 2023]" item per day of the candidates, ahead of them: relevance and recency of
        the day's best turn (so it is packed before any of them) and an order key just before the
        day's first turn. A day's date costs its tokens once instead of on every turn. Returns the
        headers' item metadata."""
        days = state.day_of[rows]
        uniq, first, inverse = np.unique(days, return_index=True, return_inverse=True)
        min_age = np.full(len(uniq), np.inf)
        np.minimum.at(min_age, inverse, np.asarray(batch.age_s, np.float64))
        min_key = np.full(len(uniq), np.inf)
        np.minimum.at(min_key, inverse, batch.order)
        min_key -= 0.5
        texts, tokens, exact, simhash, sources, bodies, times = zip(*_pick(state.day_items, uniq.tolist()), strict=True)
        metas: list[ItemMeta] = [(0, t, k, ()) for t, k in zip(times, min_key.tolist(), strict=True)]
        batch.texts = [*texts, *batch.texts]
        batch.sources = [*sources, *batch.sources]
        batch.bodies = [*bodies, *batch.bodies]
        batch.order = np.concatenate([min_key, batch.order])
        batch.tokens = np.concatenate([np.array(tokens, np.int32), batch.tokens])
        batch.relevance = np.concatenate([np.asarray(batch.relevance, np.float64)[first], batch.relevance])
        batch.age_s = np.concatenate([min_age, batch.age_s])
        batch.exact_keys = np.concatenate([np.array(exact, np.uint64), batch.exact_keys])
        batch.simhashes = np.concatenate([np.array(simhash, np.uint64), batch.simhashes])
        return metas


def _item_of(state: _UserIndex, row: int, text: str, tokens: int) -> bytes:
    """The ContextItem bytes of a turn packed with another text (a passage, a superseded mark)."""
    return fastpath.encode_item(state.sources[row], Category.MEMORIES, tokens, text, int(state.roles[row]),
                                int(state.timestamps[row]), (state.ids[row],))


def _newer_first(state: _UserIndex, query: str, rows: np.ndarray, headers: int, r: Ranking, lock: threading.Lock,
                 packed: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Batch.rescore: among the packed turns (`packed`: their indices in the batch, ascending), a newer
    telling of the same thing scores above the older one (updates.py); `headers` day items come first
    in the batch, then the turns `rows`, best first."""
    out = np.array(scores, np.float64)
    # packed ascends, and the batch holds the turns best first: its first turns are the most relevant
    # (a large budget packs hundreds).
    first = int(np.searchsorted(packed, headers))
    turns = slice(first, first + r.update_window)
    compared = packed[turns]
    if len(compared) < 2:
        return out
    with lock:  # the index's term arrays are read (and cached) under the source's lock
        out[turns] = state.newer_first(state.query_terms(query, r)[0], rows[compared - headers], out[turns], r)
    return out


def _dense_query(query: str, state: _UserIndex | None, r: Ranking) -> str:
    """The query as embedded: without the speakers' names and their "'s" when r.dense_query_names is
    off ("What did Ann's dog eat?" -> "What did dog eat?"; the speaker boost has the names)."""
    if r.dense_query_names or state is None or not state.name_words:
        return query
    out = names_pattern(state.name_words).sub("", query).strip()
    return out if _WORD_RE.search(out.lower()) else query  # only names: the query as asked


def _turn_meta(state: _UserIndex, rows: list[int], headers: list[ItemMeta], order: np.ndarray, j: int) -> ItemMeta:
    """Item metadata of the j-th candidate (day headers first, then turns), made only when asked for."""
    if j < len(headers):
        return headers[j]
    row = rows[j - len(headers)]
    return int(state.roles[row]), int(state.timestamps[row]), float(order[j]), (state.ids[row],)


def _warmed(read: Callable[[], tuple[_UserIndex, bool]], ranking: Ranking) -> tuple[_UserIndex, bool]:
    got = read()
    got[0].warm(ranking)
    return got
