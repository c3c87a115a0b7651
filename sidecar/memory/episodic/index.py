"""The per-user index (_UserIndex): each turn's text, terms, postings, dense vector (int8), same-session
neighbours and per-turn features, grown by add(), cut by compacted(), saved and restored by
freeze() / restore(). The ranking methods come from the mixins: WindowScoring (lexical.py),
QueryExpansion (expansion.py), Priors (priors.py) and Fusion (scoring.py)."""

from __future__ import annotations

import itertools
import mmap
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import TYPE_CHECKING

import numpy as np

import fastpath
from sidecar.domain import Category, Message, Role
from sidecar.index.embedders import Embedder
from sidecar.index.int8 import quantize_rows
from sidecar.memory.episodic.columns import StrColumn, StrLookup
from sidecar.memory.episodic.dates import _day_item, day_number, render_turn, utc_day
from sidecar.memory.episodic.expansion import QueryExpansion
from sidecar.memory.episodic.lexical import WindowScoring, _decay
from sidecar.memory.episodic.priors import Priors
from sidecar.memory.episodic.proximity import Proximity
from sidecar.memory.episodic.scoring import Fusion
from sidecar.memory.episodic.snapshots import pack, unpack
from sidecar.memory.episodic.terms import terms
from sidecar.memory.episodic.updates import Updates
from sidecar.tokens import count_lines

if TYPE_CHECKING:
    from sidecar.memory.episodic.ranking import Ranking

INDEXED_ROLES = (Role.USER, Role.ASSISTANT)  # tool output and system text are not conversation memory
_SERIALS = itertools.count()
# Per-row arrays of _UserIndex that a compaction copies as they are (session_of and nbr are renumbered).
_ROW_ARRAYS = ("codes", "scales", "tokens", "timestamps", "seqs", "roles", "speaker_of", "year_month", "day_of", "position",
               "doc_len", "voice", "proper", "exact", "simhash")


@dataclass
class _UserIndex(Fusion, Priors, Proximity, QueryExpansion, Updates, WindowScoring):  # not slots: the arrays are set in __post_init__
    dim: int
    cap: int = 256
    window: int = 4
    dated: bool = True  # the date is part of each turn's text (else: one header item per day)
    context: int = 0  # previous same-session turns embedded with each turn (0: the turn alone)
    context_chars: int = 400  # of each previous turn, the last this many characters
    context_mix: float = 0.5  # share of the contextual vector in each row of `vectors` (with context > 0)
    ids: list[str] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)
    texts: list[str] | StrColumn = field(default_factory=list)  # a StrColumn while restored (until _thaw)
    row_terms: list[tuple[str, ...]] = field(default_factory=list)  # distinct terms of each turn
    row_tfs: list[tuple[int, ...]] = field(default_factory=list)  # their counts: postings rebuild without re-parsing
    row_caps: list[tuple[str, ...]] = field(default_factory=list)  # words each turn capitalises (for `proper`)
    known: set[str] = field(default_factory=set)
    session_rows: dict[str, list[int]] = field(default_factory=dict)
    speakers: dict[str, int] = field(default_factory=dict)  # lowercased name -> speaker id
    postings: _Postings = field(init=False)  # term -> (rows, counts), made in __post_init__
    arrays: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    vocab: dict[str, int] = field(default_factory=dict)  # term -> id, for co-occurrence counts (empty while restored)
    words: list[str] | StrColumn = field(default_factory=list)  # id -> term (a StrColumn while restored)
    total_len: float = 0.0
    # yyyymmdd -> its header item: text, tokens, exact key, simhash, source tag, ContextItem bytes, time
    day_items: dict[int, tuple[str, int, int, int, str, bytes, int]] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)  # each turn's source tag, message:<id>
    # Each turn's ContextItem wire bytes, made the first time it is a candidate (None before), never
    # changed (a turn's text, tokens, role and time are fixed).
    bodies: list[bytes | None] = field(default_factory=list)
    # Turns that must not be recalled (a deleted memory's sources, store.recall_exclusions): kept as
    # neighbours of their session's turns, never ranked themselves.
    hidden: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.serial = next(_SERIALS)  # names this index in _RankedCache (never reused, unlike id())
        self.postings = _Postings(self.vocab, np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float32))
        # A restored index (restore()) keeps its postings, per-turn terms and capitalised words in the
        # compact arrays it was saved as until a turn is added or it is compacted (_thaw).
        self._frozen: dict | None = None
        self._lookup: StrLookup | None = None  # a restored index's terms -> ids (vocab, until _thaw)
        self._win_key: tuple | None = None  # (rows, decay) the cached window length norm is for
        self._win_norm = np.zeros(0, np.float32)
        self._said_mask = np.zeros(0, bool)  # _said(): by table row (_stem_vectors), whether the user says the stem
        self._said_upto = 0  # words counted into it
        self._prior_key: tuple | None = None  # (rows, knobs) the cached per-turn prior is for
        self._prior = np.ones(0)
        self._nbr_rows = np.zeros((0, 2 * self.window), np.int32)  # _neighbour_rows(), for this many rows
        self.term_df = np.zeros(256, np.int32)  # turns holding each term id
        # Each turn's distinct term ids: term_at[term_ptr[row]:term_ptr[row + 1]].
        self.term_at = np.zeros(4096, np.int32)
        self.term_ptr = np.zeros(self.cap + 1, np.int64)
        # Each turn's vector, mixed once here with its contextual vector (the turn embedded with its
        # `context` previous turns): (1 - mix) * v.q + mix * c.q == ((1 - mix) * v + mix * c).q, so a
        # query reads one matrix, not two. Kept as int8 with a scale per row (sidecar.index.int8): at 384
        # dimensions a 600-turn user's is ~0.23 MB, read in full by each query (float32: ~0.9 MB).
        self.codes = np.zeros((self.cap, self.dim), np.int8)
        self.scales = np.zeros(self.cap, np.float32)
        self.name_words: tuple[str, ...] = ()  # the speakers' names, word by word (replaced, never mutated)
        self.tokens = np.zeros(self.cap, np.int32)
        self.timestamps = np.zeros(self.cap, np.int64)
        self.seqs = np.zeros(self.cap, np.int64)
        self.roles = np.zeros(self.cap, np.int8)
        self.speaker_of = np.full(self.cap, -1, np.int32)
        self.session_of = np.zeros(self.cap, np.int32)
        self.year_month = np.zeros(self.cap, np.int32)  # year * 100 + month of the session's first turn
        self.day_of = np.zeros(self.cap, np.int32)  # yyyymmdd of the turn
        self.position = np.zeros(self.cap, np.int32)  # the turn's index in its session
        self.doc_len = np.zeros(self.cap, np.float32)
        self.voice = np.zeros(self.cap, np.int8)  # +1 the turn speaks of the speaker, -1 of the listener
        self.proper = np.zeros(self.cap, bool)  # the turn names someone or something other than a speaker
        self.exact = np.zeros(self.cap, np.uint64)
        self.simhash = np.zeros(self.cap, np.uint64)
        # Row of the k-th neighbour in the same session (-1 none): columns -W..-1, +1..+W.
        self.nbr = np.full((self.cap, 2 * self.window), -1, np.int32)

    def __len__(self) -> int:
        return len(self.ids)

    def hide(self, message_ids: set[str]) -> None:
        self.hidden = self.hidden | (message_ids & self.known)  # replaced, never mutated: rank() may read it

    def without_hidden(self, score: np.ndarray) -> np.ndarray:
        if self.hidden:
            score[[row for row, mid in enumerate(self.ids) if mid in self.hidden]] = 0.0
        return score

    def _grow(self, need: int) -> None:
        if need <= self.cap:
            return
        cap = max(need, self.cap * 2)
        for name in (*_ROW_ARRAYS, "session_of", "nbr"):
            old = getattr(self, name)
            new = np.full((cap, *old.shape[1:]), -1 if name in ("nbr", "speaker_of") else 0, old.dtype)
            new[: self.cap] = old[: self.cap]
            setattr(self, name, new)
        self.cap = cap

    def add(self, messages: Sequence[Message], embedder: Embedder, stemmed: bool) -> int:
        fresh = [m for m in messages if m.role in INDEXED_ROLES and m.message_id not in self.known and m.text]
        if not fresh:
            return 0
        self._thaw()
        texts = [render_turn(m.speaker, m.role, m.text, m.timestamp_ms, dated=self.dated) for m in fresh]
        start = len(self.ids)
        self._grow(start + len(fresh))
        end = start + len(fresh)
        # Counted once here, for exactly the line that is packed: its text and the newline after it.
        # Undated, that line is the message's own, whose tokens were counted when it was stored.
        self.tokens[start:end] = count_lines(texts, None if self.dated else [m.line_tokens for m in fresh])
        body = [m.text for m in fresh]
        own = embedder.embed(body)
        self.exact[start:end], self.simhash[start:end] = fastpath.text_keys(texts)
        session_ids = {sid: i for i, sid in enumerate(self.session_rows)}
        speakers = len(self.speakers)
        for j, (m, text) in enumerate(zip(fresh, texts, strict=True)):
            row = start + j
            self.ids.append(m.message_id)
            self.sources.append(f"message:{m.message_id}")
            self.bodies.append(None)
            self.known.add(m.message_id)
            self.sessions.append(m.session_id)
            self.texts.append(text)
            self.timestamps[row] = m.timestamp_ms
            day = day_number(m.timestamp_ms)
            self.day_of[row] = day
            if not self.dated and day not in self.day_items:
                self.day_items[day] = _day_item(day, m.timestamp_ms)
            self.seqs[row] = m.seq
            self.roles[row] = int(m.role)
            name = (m.speaker or m.role.label).lower()
            self.speaker_of[row] = self.speakers.setdefault(name, len(self.speakers))
            rows = self.session_rows.get(m.session_id)
            if rows is None:
                rows = self.session_rows[m.session_id] = []
                session_ids[m.session_id] = len(session_ids)
                day = utc_day(m.timestamp_ms)
                self.year_month[row] = day.year * 100 + day.month
            else:
                self.year_month[row] = self.year_month[rows[0]]
            self.session_of[row] = session_ids[m.session_id]
            w = self.window
            for k in range(1, min(w, len(rows)) + 1):
                prev = rows[-k]
                self.nbr[row, w - k] = prev  # my k-th previous turn
                self.nbr[prev, w + k - 1] = row  # I am its k-th next turn
            self.position[row] = len(rows)
            rows.append(row)
            words = terms(m.text, stemmed=stemmed)
            counts = Counter(words)  # in the order each term first occurs
            self.row_terms.append(tuple(counts))
            self.row_tfs.append(tuple(counts.values()))
            self.doc_len[row] = len(words)
            self.voice[row] = fastpath.voice(m.text)
            self.row_caps.append(fastpath.capitalised(m.text))
            self.total_len += len(words)
        self._post_rows(start, end)
        # A new speaker's name (or a nickname it starts with: "Mel") is no proper noun in any turn.
        self._mark_proper(0 if len(self.speakers) > speakers else start)
        if len(self.speakers) > speakers:
            self.name_words = tuple(dict.fromkeys(w for name in self.speakers for w in name.split()))
        if self.context > 0 and self.context_mix > 0:
            ctx = []
            for row in range(start, end):
                prev = [int(self.nbr[row, self.window - k]) for k in range(min(self.context, self.window), 0, -1)]
                ctx.append("\n".join([*(self.texts[p][-self.context_chars:] for p in prev if p >= 0), texts[row - start]]))
            mix = np.float32(self.context_mix)
            own = (np.float32(1.0) - mix) * own + mix * embedder.embed(ctx)
        self.codes[start:end], self.scales[start:end] = quantize_rows(own)
        return len(fresh)

    def _mark_proper(self, first: int) -> None:
        names = [w for name in self.speakers for w in name.split()]
        for row in range(first, len(self.ids)):
            self.proper[row] = any(not any(name.startswith(c) for name in names) for c in self.row_caps[row])

    def item_bodies(self, rows: list[int]) -> list[bytes]:
        """The ContextItem bytes of these turns (made for those that have none yet)."""
        got = _pick(self.bodies, rows)
        if None in got:
            for j, row in enumerate(rows):
                if got[j] is None:
                    got[j] = self.bodies[row] = fastpath.encode_item(
                        self.sources[row], Category.MEMORIES, int(self.tokens[row]), self.texts[row],
                        int(self.roles[row]), int(self.timestamps[row]), (self.ids[row],))
        return got  # type: ignore[return-value]  # no None left

    def _post_rows(self, start: int, end: int) -> None:
        """Add rows start..end to the postings: one by one (_post), or, into an index that has none
        yet (built from rows, compacted), all at once as the arrays a restored index keeps, whose
        lists _Postings makes for a term when a later turn adds to it."""
        if start or self.words:
            for row in range(start, end):
                self._post(row)
            return
        vocab = self.vocab  # empty, as `words` is
        said = list(itertools.chain.from_iterable(self.row_terms[:end]))
        vocab.update(zip(dict.fromkeys(said), itertools.count()))  # ids in the order terms are first said
        self.words.extend(vocab)
        lens = np.fromiter(map(len, self.row_terms[:end]), np.int64, end)
        at = np.fromiter(map(vocab.__getitem__, said), np.int32, len(said))
        self.term_at = np.concatenate([at, np.zeros(max(len(at), 4096), np.int32)])
        self.term_ptr = np.zeros(max(end + 1, len(self.term_ptr)), np.int64)
        np.cumsum(lens, out=self.term_ptr[1:end + 1])
        size = len(self.words)
        counts = np.bincount(at, minlength=size)
        self.term_df = np.zeros(max(size, len(self.term_df)), np.int32)
        self.term_df[:size] = counts
        order = np.argsort(at, kind="stable")  # by term, rows rising within one
        post_ptr = np.zeros(size + 1, np.int64)
        np.cumsum(counts, out=post_ptr[1:])
        rows = np.repeat(np.arange(end, dtype=np.int64), lens)[order]
        tfs = np.fromiter(itertools.chain.from_iterable(self.row_tfs[:end]), np.float32, len(said))[order]
        self.postings = _Postings(vocab, post_ptr, rows, tfs)
        self.arrays = {}

    def _post(self, row: int) -> None:
        """Add a row's term counts (row_terms, row_tfs) to the postings (rows in order)."""
        ids: list[int] = []
        for t, tf in zip(self.row_terms[row], self.row_tfs[row], strict=True):
            posting = self.postings.get(t)
            if posting is None:
                posting = self.postings[t] = ([], [])
                self.vocab[t] = len(self.words)
                self.words.append(t)
            posting[0].append(row)
            posting[1].append(tf)
            self.arrays.pop(t, None)
            ids.append(self.vocab[t])
        start = int(self.term_ptr[row])
        end = start + len(ids)
        if end > len(self.term_at):
            self.term_at = np.concatenate([self.term_at, np.zeros(max(end, len(self.term_at)), np.int32)])
        if row + 2 > len(self.term_ptr):
            self.term_ptr = np.concatenate([self.term_ptr, np.zeros(max(row + 2, len(self.term_ptr)), np.int64)])
        self.term_at[start:end] = ids
        self.term_ptr[row + 1] = end
        if len(self.words) > len(self.term_df):  # one turn may bring any number of new terms
            grown = np.zeros(max(len(self.words), 2 * len(self.term_df)), np.int32)
            grown[: len(self.term_df)] = self.term_df
            self.term_df = grown
        self.term_df[ids] += 1

    def compacted(self, start: int) -> _UserIndex:
        """The same index without rows before `start`, from what is already in memory (no rows read,
        no text parsed, embedded or counted again), so dropping a user's oldest turns costs
        milliseconds, not a rebuild. A kept turn keeps its place in its session (position and the
        session's month); a neighbour that was dropped is no neighbour any more."""
        self._thaw()
        n = len(self) - start
        out = _UserIndex(dim=self.dim, cap=max(n, 1), window=self.window, dated=self.dated, context=self.context,
                         context_chars=self.context_chars, context_mix=self.context_mix)
        for name in _ROW_ARRAYS:
            getattr(out, name)[:n] = getattr(self, name)[start:len(self)]
        nbr = self.nbr[start:len(self)] - start
        out.nbr[:n] = np.where(nbr < 0, -1, nbr)  # dropped rows (and "none") become -1
        out.ids, out.sessions, out.texts = self.ids[start:], self.sessions[start:], self.texts[start:]
        out.row_terms, out.row_tfs, out.row_caps = self.row_terms[start:], self.row_tfs[start:], self.row_caps[start:]
        out.known = set(out.ids)
        out.speakers, out.name_words = dict(self.speakers), self.name_words
        session_ids: dict[str, int] = {}
        for row, sid in enumerate(out.sessions):
            out.session_rows.setdefault(sid, []).append(row)
            out.session_of[row] = session_ids.setdefault(sid, len(session_ids))
        out._post_rows(0, n)
        out.total_len = float(out.doc_len[:n].sum())
        days = set(out.day_of[:n].tolist())
        out.day_items = {d: item for d, item in self.day_items.items() if d in days}
        out.sources, out.bodies = self.sources[start:], self.bodies[start:]
        out.hidden = self.hidden & out.known
        return out

    def freeze(self, meta: tuple, ranking: Ranking | None = None) -> bytes:
        """The index as a snapshot file's bytes (snapshots.pack, for EpisodicSource's snapshots): arrays
        and columns of texts and terms that restore() maps rather than makes an object per turn or term
        of; `meta` (what it was built with) must match for it to be restored. The lazy ranking caches
        that are current go with it, made first for `ranking` if given (so the first query after a
        restore need not make them); the items' bytes do not."""
        n = len(self.ids)
        if ranking is not None:
            self.warm(ranking)
        state = {
            "meta": meta, "n": n, "ids": self.ids, "sessions": self.sessions,
            "texts": self.texts if isinstance(self.texts, StrColumn) else StrColumn.of(self.texts),
            "session_rows": self.session_rows, "speakers": self.speakers, "name_words": self.name_words,
            "day_items": self.day_items, "total_len": self.total_len, "words": self._words_lookup(),
            "hidden": self.hidden, "said": self._said(), "caches": self._current_caches(), **self._postings_frozen(),
            "term_df": self.term_df[:len(self.words)], "term_at": self.term_at[:int(self.term_ptr[n])],
            "term_ptr": self.term_ptr[:n + 1],
            **{name: getattr(self, name)[:n] for name in (*_ROW_ARRAYS, "session_of", "nbr")},
        }
        return pack(state)

    def warm(self, ranking: Ranking) -> None:
        """Make the lazy ranking caches for `ranking` now (the turn prior, the window norm, the
        neighbour rows, the mask of the word-vector stems the user says), so the next query does not:
        after an import, before a snapshot is saved."""
        if not len(self.ids):
            return
        self._turn_prior(ranking)
        self._window_norm(_decay(ranking.prev_decay, ranking.next_decay, ranking.neighbours, self.window), ranking.b)
        self._neighbour_rows()
        if ranking.similar_terms > 0:
            self._said()

    def _postings_frozen(self) -> dict[str, np.ndarray | str]:
        """The postings, per-turn term counts and capitalised words as the compact arrays restore() keeps
        until _thaw (a term's rows and counts: post_rows / post_tfs[post_ptr[id]:post_ptr[id + 1]])."""
        if self._frozen is not None:
            return self._frozen
        n = len(self.ids)
        lists = self.posting_lists().values()
        sizes = [len(rows) for rows, _ in lists]
        total = sum(sizes)
        return {
            "caps": "\x1e".join("\x1f".join(c) for c in self.row_caps),
            "term_tf": np.fromiter(itertools.chain.from_iterable(self.row_tfs), np.int32, int(self.term_ptr[n])),
            "post_ptr": np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]),
            "post_rows": np.fromiter(itertools.chain.from_iterable(rows for rows, _ in lists), np.int64, total),
            # float32, as _arrays hands them to the ranking: a restored index slices them, no conversion
            "post_tfs": np.fromiter(itertools.chain.from_iterable(tfs for _, tfs in lists), np.float32, total),
        }

    def posting_lists(self) -> dict[str, tuple[list[int], list[int]]]:
        """Every term's (rows, counts) lists, in term id order (those _Postings has not made yet, made
        now); for an index that is not restored, or thawed."""
        return {w: self.postings[w] for w in self.words}

    def _words_lookup(self) -> StrLookup:
        return self._lookup if self._lookup is not None else StrLookup.of(StrColumn.of(self.words))

    def _current_caches(self) -> dict[str, tuple]:
        """The lazy ranking caches that are current (for this many rows)."""
        n = len(self.ids)
        out: dict[str, tuple] = {}
        if self._win_key is not None and self._win_key[0] == n:
            out["win"] = (self._win_key, self._win_norm)
        if self._prior_key is not None and self._prior_key[0] == n:
            out["prior"] = (self._prior_key, self._prior)
        if len(self._nbr_rows) == n:
            out["nbr_rows"] = (self._nbr_rows,)
        return out

    @classmethod
    def restore(cls, blob: bytes | memoryview | mmap.mmap, meta: tuple) -> _UserIndex | None:
        """An index saved by freeze() with this `meta`, else None. Its arrays are views of `blob` (kept
        alive by them; read-only where it is: what add() changes in place is copied first, by _thaw)."""
        state = unpack(blob)
        if not isinstance(state, dict) or state.get("meta") != meta:
            return None
        dim, window, dated, context, context_chars, context_mix = meta[1:7]
        n = state["n"]
        out = cls(dim=dim, cap=1, window=window, dated=dated, context=context, context_chars=context_chars,
                  context_mix=context_mix)
        out.cap = n
        for name in (*_ROW_ARRAYS, "session_of", "nbr", "term_df", "term_at", "term_ptr"):
            setattr(out, name, state[name])
        out.ids, out.sessions, out.texts = state["ids"], state["sessions"], state["texts"]
        out.session_rows, out.speakers, out.name_words = state["session_rows"], state["speakers"], state["name_words"]
        out.day_items, out.total_len = state["day_items"], state["total_len"]
        out._lookup = state["words"]
        out.words = out._lookup.column
        out.known, out.hidden = set(out.ids), state["hidden"]
        out.sources = ["message:" + mid for mid in out.ids]
        out.bodies = [None] * n
        out._said_mask, out._said_upto = state["said"], len(out.words)
        caches = state["caches"]
        if "win" in caches:
            out._win_key, out._win_norm = caches["win"]
        if "prior" in caches:
            out._prior_key, out._prior = caches["prior"]
        if "nbr_rows" in caches:
            (out._nbr_rows,) = caches["nbr_rows"]
        out._frozen = {k: state[k] for k in ("caps", "term_tf", "post_ptr", "post_rows", "post_tfs")}
        return out

    def _thaw(self) -> None:
        """Make the postings, per-turn terms, capitalised words and texts of a restored index Python lists
        again, as add() and compacted() extend and read them, and the arrays add() changes in place its own."""
        f = self._frozen
        if f is None:
            return
        n = len(self.ids)
        words = self.words = list(self.words)
        self.vocab = dict(zip(words, range(len(words)), strict=True))
        self._lookup = None
        self.postings = _Postings(self.vocab, f["post_ptr"], f["post_rows"], f["post_tfs"])
        tp, tf = self.term_ptr.tolist(), f["term_tf"].tolist()
        said = np.array(words, dtype=object)[self.term_at[:tp[n]]].tolist()  # each turn's terms, turn after turn
        self.row_terms = [tuple(said[tp[r]:tp[r + 1]]) for r in range(n)]
        self.row_tfs = [tuple(tf[tp[r]:tp[r + 1]]) for r in range(n)]
        self.row_caps = [tuple(c.split("\x1f")) if c else () for c in f["caps"].split("\x1e")] if n else []
        self.texts = list(self.texts)
        self.term_df, self._said_mask = np.array(self.term_df), np.array(self._said_mask)
        self.arrays = {}
        self._frozen = None

    def _arrays(self, t: str) -> tuple[np.ndarray, np.ndarray] | None:
        arrays = self.arrays.get(t)
        if arrays is None and self._frozen is not None:
            tid = self._term_id(t)
            if tid is None:
                return None
            f = self._frozen
            lo, hi = int(f["post_ptr"][tid]), int(f["post_ptr"][tid + 1])
            arrays = self.arrays[t] = (f["post_rows"][lo:hi], f["post_tfs"][lo:hi])
        elif arrays is None:
            arrays = self.postings.arrays(t)
            if arrays is None:
                return None
            self.arrays[t] = arrays
        return arrays

    def _neighbour_rows(self) -> np.ndarray:
        """nbr with "none" (-1) pointing at row n, the sentinel; kept until turns are added."""
        n = len(self.ids)
        if len(self._nbr_rows) != n:
            nbr = self.nbr[:n]
            self._nbr_rows = np.where(nbr < 0, n, nbr)
        return self._nbr_rows

    def _term_id(self, t: str) -> int | None:
        return self._lookup.get(t) if self._lookup is not None else self.vocab.get(t)

    def _term_ids(self, wanted: set[str]) -> list[int]:
        """The ids of those of these terms this user says."""
        return [i for t in wanted if (i := self._term_id(t)) is not None]


class _Postings(dict):
    """A thawed index's postings, term -> (rows, counts) lists: a term's lists are made from the restored
    arrays (rows and counts of term id i: rows / tfs[ptr[i]:ptr[i + 1]]) when first read, so a returning
    user's first turn makes the lists of its own terms, not of every term the user ever said."""

    def __init__(self, vocab: dict[str, int], ptr: np.ndarray, rows: np.ndarray, tfs: np.ndarray) -> None:
        super().__init__()
        self._vocab, self._ptr, self._rows, self._tfs = vocab, ptr, rows, tfs

    def __missing__(self, term: str) -> tuple[list[int], list[int]]:
        span = self._span(term)
        if span is None:
            raise KeyError(term)
        rows, tfs = span
        lists = self[term] = (rows.tolist(), tfs.astype(np.int64).tolist())
        return lists

    def _span(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The term's rows and counts in the arrays; None for a term never said, or said only since they
        were made (its lists are in the dict)."""
        i = self._vocab.get(term)
        if i is None or i + 1 >= len(self._ptr):
            return None
        lo, hi = int(self._ptr[i]), int(self._ptr[i + 1])
        return self._rows[lo:hi], self._tfs[lo:hi]

    def get(self, term: str, default=None):  # type: ignore[override]  # dict.get skips __missing__
        try:
            return self[term]
        except KeyError:
            return default

    def arrays(self, term: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The term's (rows int64, counts float32) for ranking: its lists as arrays once made, else slices
        of the arrays (no lists made); None for a term never said."""
        lists = dict.get(self, term)
        if lists is not None:
            return np.asarray(lists[0], np.int64), np.asarray(lists[1], np.float32)
        return self._span(term)


def _pick(values: list | StrColumn, rows: list[int]) -> list:
    """[values[r] for r in rows], in one C call."""
    if isinstance(values, StrColumn):
        return values.pick(rows)
    if len(rows) > 1:
        return list(itemgetter(*rows)(values))
    return [values[rows[0]]] if rows else []
