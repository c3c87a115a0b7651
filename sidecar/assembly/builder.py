"""BuildContext, step by step: scope check -> hard zone (must fit, never cut) -> candidates from
every source -> fastpath.select (rank, dedup, greedy pack) -> render in a stable order."""

from __future__ import annotations

import hashlib
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial

import numpy as np

import fastpath
from sidecar.assembly.budget import Budget
from sidecar.assembly.candidates import (
    CACHE_AWARE_ORDER,
    DROP_DUPLICATE,
    DROP_LOW_SCORE,
    DROP_OVER_BUDGET,
    SOFT_BUDGET_FIELDS,
    SOFT_WIRE,
    BuildInput,
    CandidateBatch,
    CandidateSource,
    Section,
    SoftCategory,
    SourceDrop,
    query_texts,
)
from sidecar.assembly.prompt_cache import PromptCache, PromptMemory, prompt_head
from sidecar.assembly.session_recall import KEEP_COVER, RECALLED, SessionRecall, leave_out, recall_covered
from sidecar.clock import now_ms
from sidecar.domain import Category, Fact, Role, Scope
from sidecar.errors import FailedPrecondition, InvalidArgument
from sidecar.index.embedders import Embedder
from sidecar.services.sessions import SessionService
from sidecar.store.cache import SessionView
from sidecar.text import query_terms
from sidecar.tokens import CL100K, TokenCounter, count_tokens_cached
from sidecar.tokens import counter as token_counter

# Proto numbers (kept here so the assembly does not import the generated stubs).
CATEGORY_SYSTEM_AND_TOOLS, CATEGORY_SESSION_STATE = Category.SYSTEM_AND_TOOLS, Category.SESSION_STATE
KNOWLEDGE_MATCHED, KNOWLEDGE_NO_MATCH, KNOWLEDGE_NOT_CONSULTED = 1, 2, 3
_STATUS_TO_DROP = {fastpath.OVER_BUDGET: DROP_OVER_BUDGET, fastpath.DUPLICATE: DROP_DUPLICATE,
                   fastpath.LOW_SCORE: DROP_LOW_SCORE}

HEADERS: dict[Section, str] = {
    Section.TOOLS: "## Tools",
    Section.PINNED_CONSTRAINTS: "## Constraints from the user (verbatim)",
    Section.SESSION_STATE: "## Session state (confirmed)",
    Section.MEMORIES: "## What we know about the user",
    Section.KNOWLEDGE: "## Knowledge base",
    Section.SESSION_RECALL: "## Recalled for this session",
    Section.SUMMARY: "## Summary of earlier turns",
    Section.RECENT_MESSAGES: "## Recent messages",
    Section.TOOL_OBSERVATIONS: "## Tool observations",
    Section.QUERY: "## Current query",
}
# A header costs its tokens plus the blank line before it; counted once at import.
HEADER_TOKENS = {s: count_tokens_cached("\n" + h + "\n") for s, h in HEADERS.items()}
SOFT_SECTIONS = (Section.MEMORIES, Section.KNOWLEDGE, Section.SUMMARY, Section.RECENT_MESSAGES,
                 Section.TOOL_OBSERVATIONS)
DEFAULT_MAX_DROPPED = 32
SOFT_HEADER_RESERVE = sum(HEADER_TOKENS[s] for s in SOFT_SECTIONS)
# Per tokenizer: its HEADER_TOKENS and SOFT_HEADER_RESERVE (another tokenizer's counted on its first call).
_HEADERS_BY_COUNTER: dict[TokenCounter, tuple[dict[Section, int], int]] = {CL100K: (HEADER_TOKENS, SOFT_HEADER_RESERVE)}


def headers_in(counter: TokenCounter) -> tuple[dict[Section, int], int]:
    """(HEADER_TOKENS, SOFT_HEADER_RESERVE) counted by `counter`."""
    held = _HEADERS_BY_COUNTER.get(counter)
    if held is None:
        tokens = {s: counter.count("\n" + h + "\n") for s, h in HEADERS.items()}
        held = _HEADERS_BY_COUNTER[counter] = (tokens, sum(tokens[s] for s in SOFT_SECTIONS))
    return held


@dataclass(frozen=True, slots=True)
class ToolSpec:
    name: str
    description: str
    schema_json: str

    @property
    def rendered(self) -> str:
        head = f"- {self.name}: {self.description}" if self.description else f"- {self.name}"
        return f"{head}\n  {self.schema_json}" if self.schema_json else head


@dataclass(slots=True)
class BuildRequest:
    session_id: str
    run_id: str = ""
    query: str = ""
    system_rules: str = ""
    tools: Sequence[ToolSpec] = ()
    budget: Budget = field(default_factory=Budget)
    roles: tuple[str, ...] = ()
    query_embedding: np.ndarray | None = None
    debug: bool = False
    min_score: float = float("-inf")
    max_dropped: int = 0
    cache_aware: bool = True  # proto Layout: LAYOUT_CACHE_AWARE, else LAYOUT_CLASSIC
    tokenizer: str = ""  # what counts this call's tokens (sidecar.tokens.COUNTERS; "": cl100k_base)
    asked_at_ms: int = 0  # when the query was asked, for the dates it names relative to then (0: now)


@dataclass(slots=True)
class Item:
    source: str
    category: int  # proto Category
    score: float
    tokens: int
    text: str
    role: int = 0
    timestamp_ms: int = 0
    source_message_ids: tuple[str, ...] = ()
    order_key: float = 0.0


@dataclass(slots=True)
class Usage:
    category: int
    budget: int
    used: int
    candidates: int
    selected: int
    flowed_in: int


@dataclass(slots=True)
class Dropped:
    source: str
    category: int
    reason: int
    score: float
    tokens: int
    kept_source: str = ""


@dataclass(slots=True)
class PackedSection:
    """A section ready for the wire: its items' ContextItem bytes (no score) and scores, in render
    order. Item objects are built only when asked for (text rendering, in-process callers)."""

    kind: Section
    tokens: int
    bodies: list[bytes]
    scores: list[float]
    build_items: Callable[[], list[Item]]
    _items: list[Item] | None = None
    item_tokens: list[int] | None = None  # each item's tokens, in order (what the prompt cache report sums)
    item_sources: list[str] | None = None  # each item's source tag, in order (what a kept recall leaves out)

    @classmethod
    def of_items(cls, kind: Section, items: list[Item]) -> PackedSection:
        bodies = [fastpath.encode_item(it.source, it.category, it.tokens, it.text, it.role, it.timestamp_ms,
                                       it.source_message_ids) for it in items]
        return cls(kind, sum(it.tokens for it in items), bodies, [it.score for it in items], lambda: items, items,
                   [it.tokens for it in items], [it.source for it in items])

    @property
    def items(self) -> list[Item]:
        if self._items is None:
            self._items = self.build_items()
        return self._items

    def wire(self) -> bytes:
        """One BuildContextResponse.sections entry."""
        return fastpath.encode_section(self.kind, self.bodies, self.scores, self.tokens)


@dataclass(slots=True)
class BuildResult:
    packed: list[PackedSection]
    usage: list[Usage]
    hard_zone_tokens: int
    soft_zone_tokens: int
    total_budget: int
    dropped: list[Dropped]
    drop_counts: dict[int, int]
    stable_prefix_hash: str
    stable_prefix_tokens: int
    knowledge_status: int
    timings: list[tuple[str, int]]
    debug: bool = False
    cache: PromptCache | None = None  # what of this prompt repeats the session's previous one
    token_counter: str = CL100K.name  # what counted every token of it
    # What provider renderings read beside the items: the request's tools and the session as read for this
    # call (its messages' tool calls, its tool results' call ids).
    tools: Sequence[ToolSpec] = ()
    view: SessionView | None = None

    @property
    def total_tokens(self) -> int:
        return self.hard_zone_tokens + self.soft_zone_tokens

    @property
    def sections(self) -> list[tuple[Section, list[Item]]]:
        return [(p.kind, p.items) for p in self.packed]


@dataclass(frozen=True, slots=True)
class Weights:
    """Score fusion: relevance + recency decay + priority (DESIGN.md §5)."""

    relevance: float = 1.0
    recency: float = 0.5
    priority: float = 1.0
    half_life_s: float = 7 * 24 * 3600.0
    max_hamming: int = 3


PinnedProvider = Callable[[Scope, SessionView], list[Item]]


class ContextBuilder:
    def __init__(self, sessions: SessionService, sources: Sequence[CandidateSource],
                 pinned: PinnedProvider | None = None, weights: Weights = Weights(),
                 resolvers: Sequence[Callable[[list[CandidateBatch]], None]] = (),
                 query_embedder: Embedder | None = None) -> None:
        self.sessions = sessions
        self.sources = list(sources)
        self.pinned = pinned
        self.weights = weights
        # Cross-source rules applied to the candidates before selection (knowledge beats memory).
        self.resolvers = list(resolvers)
        # The model the sources embed the query with, which keeps recent texts (MiniLMEmbedder): what they
        # will embed goes through it in one batch. None: the built-in embedder, for which a batch saves nothing.
        self.query_embedder = query_embedder
        self.clock: Callable[[], int] = now_ms  # the time a call is built at (bench/recall.py --live sets it)
        self.prompts = PromptMemory()
        self.session_recall = SessionRecall()
        # What a session's kept recall depends on beyond the session itself: each part is called with the
        # scope (the app adds the user's memories' and recall index's generations, the tenant's knowledge's).
        self.recall_epoch: list[Callable[[Scope], object]] = []
        # Given the stage timings of each build (sidecar.tracing turns them into spans); None: nothing to do.
        self.stage_observer: Callable[[list[tuple[str, int]]], None] | None = None

    def build(self, scope: Scope, req: BuildRequest) -> BuildResult:
        clock = _StageClock()
        counter = token_counter(req.tokenizer)  # an unknown name is INVALID_ARGUMENT, before anything is read
        view = self.sessions.view(scope, req.session_id)
        if req.query_embedding is not None and not np.all(np.isfinite(req.query_embedding)):
            raise InvalidArgument("query_embedding holds a NaN or infinite value")
        budget = req.budget
        header_tokens, soft_header_reserve = headers_in(counter)
        clock.lap("scope")

        hard, prefix_hash, prefix_tokens = self._hard_zone(scope, view, req, counter, header_tokens)
        hard_tokens = sum(it.tokens for _, items in hard for it in items)
        hard_tokens += sum(header_tokens[s] for s, items in hard if items and s in header_tokens)
        if hard_tokens > budget.total:
            raise FailedPrecondition(
                f"hard zone (system rules, tools, pinned constraints, session state, query) is {hard_tokens} tokens; "
                f"budget.max_input - budget.reserved_for_output is {budget.total}"
                + _pinned_hint(dict(hard)[Section.PINNED_CONSTRAINTS]))
        clock.lap("hard_zone")

        now = self.clock()
        inp = BuildInput(scope=scope, view=view, run_id=req.run_id, query=req.query,
                         query_terms=frozenset(query_terms(req.query)), query_embedding=req.query_embedding, roles=req.roles,
                         budget=budget, now_ms=now, cache_aware=req.cache_aware, counter=counter,
                         asked_at_ms=req.asked_at_ms or now)
        if self.query_embedder is not None and inp.query:
            self._embed_query_texts(self.query_embedder, inp)
        batches = [b for src in self.sources for b in src.candidates(inp)]
        for resolve in self.resolvers:
            resolve(batches)
        key = (scope.tenant_id, scope.user_id, req.session_id)
        kept = epoch = None
        soft_total = max(budget.total - hard_tokens - soft_header_reserve, 0)
        if req.cache_aware:
            epoch = self._recall_epoch(scope, view, req)
            kept = self.session_recall.get(key, epoch)
            if kept is not None and kept.tokens + header_tokens[Section.SESSION_RECALL] > soft_total:
                kept = None  # the hard zone grew (a longer query): it no longer fits, so it is made again
        clock.lap("candidates")

        max_dropped = (1 << 30) if req.debug and not req.max_dropped else (req.max_dropped or DEFAULT_MAX_DROPPED)
        ask = _question_key(req) if req.cache_aware else b""  # only a kept block asks for it
        # This call's own recall; with a kept block it is needed only for a question the block has not served yet.
        own = None if kept is not None and kept.serves(ask) else self._select(
            batches, budget, soft_total, req.min_score, max_dropped, clock, whole_history=req.cache_aware)
        selected = own
        if kept is not None:  # shown first; this call recalls only what it lacks, within what is left
            leave_out(batches, kept)
            selected = self._select(
                batches, replace(budget, memories=max(budget.memories - kept.by_section.get(Section.MEMORIES, 0), 0),
                                 rag_or_graph=max(budget.rag_or_graph - kept.by_section.get(Section.KNOWLEDGE, 0), 0)),
                max(soft_total - kept.tokens - header_tokens[Section.SESSION_RECALL], 0), req.min_score, max_dropped,
                clock, whole_history=True)
            # A block made for another question may not hold what this one needs: it stays only while it and
            # what is recalled after it show most of the call's own recall, else it is made again from that.
            if own is not None and recall_covered(own[0], kept, selected[0]) < KEEP_COVER:
                kept, selected = None, own
            else:
                kept.served(ask)
        soft_sections, usage, dropped, drop_counts, soft_tokens = selected
        if req.cache_aware:
            if kept is None:  # this call's recall is the session's, from now until the epoch changes
                kept = self.session_recall.keep(key, epoch, soft_sections)
                kept.served(ask)
                soft_sections = [PackedSection.of_items(p.kind, []) if p.kind in RECALLED else p for p in soft_sections]
                soft_tokens -= kept.tokens
            if kept.bodies:
                soft_sections.append(PackedSection(Section.SESSION_RECALL, kept.tokens, kept.bodies, kept.scores,
                                                   lambda: kept.items))
                soft_tokens += kept.tokens

        packed = [PackedSection.of_items(s, items) for s, items in hard] + soft_sections
        packed.sort(key=_render_rank if req.cache_aware else _kind)
        soft_tokens += sum(header_tokens[p.kind] for p in soft_sections if p.bodies)
        cache = self.prompts.compare((scope.tenant_id, scope.user_id, req.session_id), packed, header_tokens,
                                     prompt_head(view))
        clock.lap("render")
        laps = clock.laps
        if self.stage_observer is not None:
            self.stage_observer(laps)
        return BuildResult(
            packed=packed, usage=usage, hard_zone_tokens=hard_tokens, soft_zone_tokens=soft_tokens,
            total_budget=budget.total, dropped=dropped, drop_counts=drop_counts, stable_prefix_hash=prefix_hash,
            stable_prefix_tokens=prefix_tokens, knowledge_status=_knowledge_status(batches), timings=laps,
            debug=req.debug, cache=cache, token_counter=counter.name, tools=req.tools, view=view)

    def forget_user(self, scope: Scope) -> dict[str, int]:
        """What the builder keeps of a user's prompts goes (a deletion or ForgetUser): kept recall quotes
        their past turns and memories."""
        self.prompts.drop_user(scope.tenant_id, scope.user_id)
        return {"session_recall": self.session_recall.drop_user(scope.tenant_id, scope.user_id)}

    def _recall_epoch(self, scope: Scope, view: SessionView, req: BuildRequest) -> tuple:
        summary = view.summary
        # The tokenizer too: kept items carry their counts in it.
        return (summary.covered_until_seq if summary is not None else 0, req.roles, req.budget, req.min_score,
                req.tokenizer,
                *(part(scope) for part in self.recall_epoch))

    def _embed_query_texts(self, embedder: Embedder, inp: BuildInput) -> None:
        """What the sources will embed (the query as asked for memories and knowledge, without the
        speakers' names for past turns) goes through the model in one batch: two short texts cost ~12 ms
        on one torch thread against ~21 ms one by one. Each source then finds its vector in the model's
        cache of recent texts."""
        texts = list(dict.fromkeys(t for src in self.sources for t in query_texts(src, inp)))
        if len(texts) > 1:
            embedder.embed(texts)

    # ------------------------------------------------------------------ hard zone
    def _hard_zone(self, scope: Scope, view: SessionView, req: BuildRequest, counter: TokenCounter,
                   header_tokens: dict[Section, int]) -> tuple[list[tuple[Section, list[Item]]], str, int]:
        budget = req.budget
        count = counter.cached  # cl100k: count_tokens_cached itself
        rules = [Item("system:rules", CATEGORY_SYSTEM_AND_TOOLS, 0.0, count(req.system_rules),
                      req.system_rules)] if req.system_rules else []
        tools = [Item(f"tool_schema:{t.name}", CATEGORY_SYSTEM_AND_TOOLS, 0.0, count(t.rendered) + 1,
                      t.rendered) for t in req.tools]
        system_tokens = sum(i.tokens for i in rules + tools) + (header_tokens[Section.TOOLS] if tools else 0)
        if system_tokens > budget.system_and_tools:
            raise FailedPrecondition(
                f"system_and_tools block (system_rules + tools) is {system_tokens} tokens; "
                f"budget.system_and_tools is {budget.system_and_tools}")

        pinned = self.pinned(scope, view) if self.pinned else []
        # Cache-aware: state grows by appending, a changed fact re-stated after the others (by the time it
        # was last stated); classic: by key.
        confirmed = sorted(view.confirmed.items(), key=_stated_order if req.cache_aware else _by_key)
        facts = [Item(f"fact:{key}", CATEGORY_SESSION_STATE, 0.0, f.tokens + 1, f.rendered,
                      timestamp_ms=f.updated_at_ms)
                 for key, f in confirmed]
        if not counter.stored:  # pins and facts keep cl100k counts of their line (count + 1)
            for it in pinned + facts:
                it.tokens = counter.plus_newline(it.text, it.tokens)
        if view.session.task:
            # A sub-agent's task is the parent agent's word, not confirmed state (its fact is a
            # candidate), yet the child must always see it: from the session, labelled as such.
            task = f"task (handed over by the parent agent): {view.session.task}"
            facts.insert(0, Item(f"task:{view.session.session_id}", CATEGORY_SESSION_STATE, 0.0,
                                 count(task) + 1, task, timestamp_ms=view.session.created_at_ms))
        state_tokens = sum(i.tokens for i in pinned + facts)
        state_tokens += (header_tokens[Section.PINNED_CONSTRAINTS] if pinned else 0)
        state_tokens += (header_tokens[Section.SESSION_STATE] if facts else 0)
        if state_tokens > budget.session_state:
            raise FailedPrecondition(
                f"session_state block (confirmed facts + pinned constraints) is {state_tokens} tokens; "
                f"budget.session_state is {budget.session_state}" + _pinned_hint(pinned))

        query = [Item("query", 0, 0.0, count(req.query), req.query)] if req.query else []
        hard = [(Section.SYSTEM_RULES, rules), (Section.TOOLS, tools), (Section.PINNED_CONSTRAINTS, pinned),
                (Section.SESSION_STATE, facts), (Section.QUERY, query)]
        digest = hashlib.blake2b(digest_size=16)
        for section, items in hard[:4]:  # everything but the query is the stable prefix
            for it in items:
                digest.update(f"{int(section)}\x00{it.text}\x01".encode())
        prefix_tokens = system_tokens + state_tokens
        return hard, digest.hexdigest(), prefix_tokens

    # ------------------------------------------------------------------ soft zone
    def _select(self, batches: list[CandidateBatch], budget: Budget, soft_total: int, min_score: float,
                max_dropped: int, clock: _StageClock, whole_history: bool = False
                ) -> tuple[list[PackedSection], list[Usage], list[Dropped], dict[int, int], int]:
        live = [b for b in batches if len(b)]
        for b in live:
            if b.exact_keys is None:  # sources that did not precompute their keys
                b.exact_keys, b.simhashes = _text_keys(b.texts)
        sizes = [len(b) for b in live]
        offsets = [0, *itertools.accumulate(sizes)]
        cat_ids = np.array([int(b.category) for b in live], np.int32)
        category = np.repeat(cat_ids, sizes)
        join = lambda attr, dtype: (np.concatenate([np.asarray(getattr(b, attr), dtype) for b in live])  # noqa: E731
                                    if live else np.zeros(0, dtype))
        tokens = join("tokens", np.int32)
        exact, sim = join("exact_keys", np.uint64), join("simhashes", np.uint64)
        if whole_history:
            _keep_history_whole(live, offsets, exact, sim, self.weights.max_hamming)
        relevance, age, priority = join("relevance", np.float64), join("age_s", np.float64), join("priority", np.float64)
        cat_budget = np.array([getattr(budget, f) for f in SOFT_BUDGET_FIELDS], np.int64)
        clock.lap("features")

        w = self.weights
        at = _kept(live, offsets)
        pick = (lambda a: a) if at is None else (lambda a: a[at])  # noqa: E731
        sel = fastpath.select(pick(relevance), pick(age), pick(priority), pick(tokens), pick(category), pick(exact),
                              pick(sim), cat_budget, soft_total,
                              w_relevance=w.relevance, w_recency=w.recency, w_priority=w.priority,
                              half_life_s=w.half_life_s, max_hamming=w.max_hamming, min_score=min_score,
                              flow_unused=budget.flow_unused)
        if at is not None:
            sel = _widen(sel, at, len(tokens))
        _rescore(live, offsets, sel)
        clock.lap("select")

        starts = np.asarray(offsets[:-1], np.int64)
        soft_sections = _pack_sections(live, sel, starts, tokens)
        dropped, counts = _drops(live, batches, sel, starts, tokens, max_dropped)
        n_cat = len(SOFT_CATEGORIES)
        considered = np.bincount(pick(category), minlength=n_cat)
        picked = np.bincount(category[sel.selected_in_order], minlength=n_cat)
        budgets, used, flowed = sel.effective_budget.tolist(), sel.used.tolist(), sel.flowed_in.tolist()
        considered_n, picked_n = considered.tolist(), picked.tolist()
        usage = [Usage(SOFT_WIRE[c], budgets[c], used[c], considered_n[c], picked_n[c], flowed[c])
                 for c in range(n_cat)]
        return soft_sections, usage, dropped, counts, int(sel.used.sum())


def _question_key(req: BuildRequest) -> bytes:
    """A digest of what a call's recall depends on beyond the block's epoch (its query, time of asking
    and client vector): a kept block remembers the questions it served by these, never by their text."""
    h = hashlib.blake2b(req.query.encode("utf-8", "surrogatepass"), digest_size=16)
    h.update(int(req.asked_at_ms).to_bytes(8, "little", signed=True))
    if req.query_embedding is not None:
        h.update(np.ascontiguousarray(req.query_embedding).tobytes())
    return h.digest()


def _rescore(live: list[CandidateBatch], offsets: list[int], sel: fastpath.Selection) -> None:
    """The scores reported for each batch's packed candidates, where its source rescores them."""
    if not any(b.rescore is not None for b in live):
        return
    picked = np.sort(sel.selected_in_order)
    for k, b in enumerate(live):
        if b.rescore is None:
            continue
        lo, hi = np.searchsorted(picked, [offsets[k], offsets[k + 1]])
        mine = picked[lo:hi]
        if len(mine) > 1:
            sel.scores[mine] = b.rescore(mine - offsets[k], sel.scores[mine])


def _keep_history_whole(live: list[CandidateBatch], offsets: list[int], exact: np.ndarray, sim: np.ndarray,
                        max_hamming: int) -> None:
    """Cache-aware layout: deduplication never drops a history item (a message said twice is two events,
    two runs of a tool may return near-identical logs, and a hole would move the prompt's prefix). A
    candidate outside the history that repeats one (the same text, or a near duplicate as the selection
    judges it) is left out instead, and the history's keys are cleared in `exact` and `sim`, the
    selection's joined keys (`offsets`: each live batch's start in them)."""
    history = [k for k, b in enumerate(live) if b.section == Section.RECENT_MESSAGES]
    if not history:
        return
    n = len(exact)
    in_history = np.zeros(n, bool)
    for k in history:
        in_history[offsets[k]:offsets[k + 1]] = True
    if len(live) > len(history):
        # One compiled dedup walk with the history first: whatever another candidate duplicates, it is
        # found among the history's kept items before any other's.
        everything = np.arange(n, dtype=np.int64)
        order = np.concatenate([everything[in_history], everything[~in_history]])
        dup_of = fastpath.dedup(order, exact, sim, np.ones(n, np.uint8), max_hamming)
        starts = np.asarray(offsets[:-1], np.int64)
        for k, b in enumerate(live):
            if k in history:
                continue
            of = dup_of[offsets[k]:offsets[k + 1]]
            repeats = np.flatnonzero((of >= 0) & in_history[np.maximum(of, 0)]).tolist()
            if repeats:
                b.exclude(set(repeats))
                owner = np.searchsorted(starts, of[repeats], side="right") - 1
                b.dropped = [*b.dropped, *(
                    SourceDrop(b.sources[j], b.category, DROP_DUPLICATE, int(b.tokens[j]),
                               live[int(o)].sources[int(of[j]) - offsets[int(o)]])
                    for j, o in zip(repeats, owner.tolist(), strict=True))]
    exact[in_history] = 0  # the joined arrays are the selection's own: the tail's keys stay as they are
    sim[in_history] = 0


SOFT_CATEGORIES = tuple(SoftCategory)  # iterating an enum class is slow on the hot path
_SECTION_SLOT = {s: n for n, s in enumerate(SOFT_SECTIONS)}
EXCLUDED = -1  # status of a candidate a source excluded (CandidateBatch.exclude): never selected

# Dedup keys of texts seen recently: memories and knowledge chunks come back call after call, and
# hashing a chunk costs more than looking it up. Cleared when full (a dict's get/set are atomic).
_TEXT_KEYS: dict[str, tuple[int, int]] = {}
_TEXT_KEYS_MAX = 1 << 16


def _text_keys(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    known = [_TEXT_KEYS.get(t) for t in texts]
    missing = [i for i, k in enumerate(known) if k is None]
    if missing:
        if len(_TEXT_KEYS) + len(missing) > _TEXT_KEYS_MAX:
            _TEXT_KEYS.clear()
        exact, sim = fastpath.text_keys([texts[i] for i in missing])
        for i, e, h in zip(missing, exact.tolist(), sim.tolist(), strict=True):
            known[i] = _TEXT_KEYS[texts[i]] = (e, h)
    pairs = np.array(known, np.uint64).reshape(len(texts), 2)
    return pairs[:, 0].copy(), pairs[:, 1].copy()


def _kept(live: list[CandidateBatch], offsets: list[int]) -> np.ndarray | None:
    """Global indices of the candidates not excluded by their source, or None when none was."""
    if not any(b.excluded for b in live):
        return None
    keep = np.ones(offsets[-1], bool)
    for b, start in zip(live, offsets, strict=False):
        if b.excluded:
            keep[[start + j for j in b.excluded]] = False
    return np.flatnonzero(keep)


def _widen(sel: fastpath.Selection, at: np.ndarray, n: int) -> fastpath.Selection:
    """A selection over the kept candidates `at`, re-expressed over all n (the excluded: EXCLUDED)."""
    scores = np.zeros(n, np.float64)
    scores[at] = sel.scores
    status = np.full(n, EXCLUDED, np.int8)
    status[at] = sel.status
    dup_of = np.full(n, -1, np.int64)
    dup_of[at] = np.where(sel.dup_of >= 0, at[np.maximum(sel.dup_of, 0)], -1)
    return sel._replace(scores=scores, order=at[sel.order], status=status, dup_of=dup_of,
                        selected_in_order=at[sel.selected_in_order])


def _owners(starts: np.ndarray, indices: np.ndarray) -> tuple[list[int], list[int], list[int]]:
    """(global indices, batch numbers, indices inside the batch), located in one numpy call."""
    k = np.searchsorted(starts, indices, side="right") - 1
    return indices.tolist(), k.tolist(), (indices - starts[k]).tolist()


def _pack_sections(live: list[CandidateBatch], sel: fastpath.Selection, starts: np.ndarray,
                   tokens: np.ndarray) -> list[PackedSection]:
    """Packed items straight to wire bytes, each section in render order. Owners, sections, the order
    inside a section (the source's order key where it gave one, else best score first) and the
    tokens per section come from one compiled call; per item, Python only picks the bytes (made once
    by sources that keep them, e.g. recent messages) or encodes them."""
    picked = sel.selected_in_order
    ks, js, keys, rank, bounds, slot_tokens = fastpath.arrange(
        picked, starts, [_SECTION_SLOT[b.section] for b in live], [b.order for b in live], sel.scores, tokens,
        len(SOFT_SECTIONS))
    ks_l, js_l = ks.tolist(), js.tolist()
    score_list, token_list = sel.scores[picked].tolist(), tokens[picked].tolist()
    held = [b.bodies for b in live]
    if all(h is not None for h in held):  # every source kept its items' bytes
        bodies = [held[k][j] for k, j in zip(ks_l, js_l, strict=True)]
    else:
        bodies = []
        add = bodies.append
        encode = fastpath.encode_item
        for n, k in enumerate(ks_l):
            j = js_l[n]
            if held[k] is not None:
                add(held[k][j])
                continue
            b = live[k]
            role, ts, _, message_ids = _meta(b, j)
            add(encode(b.sources[j], SOFT_WIRE[b.category], token_list[n], b.texts[j], role, ts, message_ids))
    rows = rank.tolist()
    in_order = [bodies[n] for n in rows]
    ordered_scores = [score_list[n] for n in rows]
    ordered_tokens = [token_list[n] for n in rows]
    ordered_sources = [live[ks_l[n]].sources[js_l[n]] for n in rows]
    cut, per_section = bounds.tolist(), slot_tokens.tolist()
    picks = _Picks(live, ks_l, js_l, score_list, token_list, keys.tolist())
    return [PackedSection(kind, per_section[s], in_order[cut[s]:cut[s + 1]], ordered_scores[cut[s]:cut[s + 1]],
                          partial(picks.items, rows[cut[s]:cut[s + 1]]), None, ordered_tokens[cut[s]:cut[s + 1]],
                          ordered_sources[cut[s]:cut[s + 1]])
            for s, kind in enumerate(SOFT_SECTIONS)]


@dataclass(slots=True)
class _Picks:
    """The packed candidates of one call, turned into Item objects only when asked for."""

    live: list[CandidateBatch]
    ks: list[int]
    js: list[int]
    scores: list[float]
    tokens: list[int]
    keys: list[float]

    def items(self, rows: list[int]) -> list[Item]:
        out = []
        for n in rows:
            b, j = self.live[self.ks[n]], self.js[n]
            role, ts, _, message_ids = _meta(b, j)
            out.append(Item(b.sources[j], SOFT_WIRE[b.category], self.scores[n], self.tokens[n], b.texts[j], role,
                            ts, message_ids, self.keys[n]))
        return out


def _drops(live: list[CandidateBatch], batches: list[CandidateBatch], sel: fastpath.Selection, starts: np.ndarray,
           tokens: np.ndarray, max_dropped: int) -> tuple[list[Dropped], dict[int, int]]:
    """Every drop is counted; the highest-scored are listed (the long tail is usually noise)."""
    status = sel.status
    # The ranking already orders every candidate best first (ties by index): the dropped ones in it
    # are the list, highest score first. EXCLUDED ones are the sources' to report.
    ranked = sel.order[status[sel.order] > fastpath.SELECTED]
    by_code = np.bincount(status[ranked], minlength=len(_STATUS_TO_DROP) + 1).tolist()
    counts = {reason: by_code[code] for code, reason in _STATUS_TO_DROP.items() if by_code[code]}
    listed = ranked[:max_dropped]
    dup_of = sel.dup_of[listed].tolist()
    reasons = [_STATUS_TO_DROP[s] for s in status[listed].tolist()]
    kept_by = {}
    winners = [d for d in dup_of if d >= 0]
    if winners:
        kept_by = {i: live[k].sources[j] for i, k, j in zip(*_owners(starts, np.asarray(winners, np.int64)),
                                                             strict=True)}
    scores, token_list = sel.scores[listed].tolist(), tokens[listed].tolist()
    dropped = [Dropped(live[k].sources[j], SOFT_WIRE[live[k].category], reason, score, item_tokens, kept_by.get(d, ""))
               for (_, k, j), reason, d, score, item_tokens
               in zip(zip(*_owners(starts, listed), strict=True), reasons, dup_of, scores, token_list, strict=True)]
    for b in batches:
        for d in b.dropped:
            counts[d.reason] = counts.get(d.reason, 0) + 1
            if len(dropped) < max_dropped:
                dropped.append(Dropped(d.source, SOFT_WIRE[d.category], d.reason, 0.0, d.tokens, d.kept_source))
        for run in b.dropped_runs:
            counts[run.reason] = counts.get(run.reason, 0) + len(run.sources)
            room = max(max_dropped - len(dropped), 0)
            dropped += [Dropped(source, SOFT_WIRE[run.category], run.reason, 0.0, int(tokens), "")
                        for source, tokens in zip(run.sources[:room], run.tokens[:room], strict=True)]
    return dropped, counts


def _meta(b: CandidateBatch, j: int) -> tuple[int, int, float | None, tuple[str, ...]]:
    return b.meta(j) if b.meta else (0, 0, None, ())


def _pinned_hint(pinned: list[Item]) -> str:
    """What a hard-zone overflow message adds when pinned constraints are part of it: they only
    leave by Unpin, so the caller is told how many there are and how to review them."""
    if not pinned:
        return ""
    return (f"; {len(pinned)} pinned constraints take {sum(i.tokens for i in pinned)} tokens: review them with "
            "ListPinned and Unpin the ones that no longer apply")


def _kind(section: PackedSection) -> Section:
    return section.kind


_RENDER_POSITION = {s: n for n, s in enumerate(CACHE_AWARE_ORDER)}


def _render_rank(section: PackedSection) -> int:
    return _RENDER_POSITION[section.kind]


def _stated_order(entry: tuple[str, Fact]) -> tuple[int, str]:
    return entry[1].updated_at_ms, entry[0]


def _by_key(entry: tuple[str, Fact]) -> str:
    return entry[0]


def _knowledge_status(batches: list[CandidateBatch]) -> int:
    consulted = [b.knowledge_matched for b in batches if b.knowledge_matched is not None]
    if not consulted:
        return KNOWLEDGE_NOT_CONSULTED
    return KNOWLEDGE_MATCHED if any(consulted) else KNOWLEDGE_NO_MATCH


class _StageClock:
    """Per-stage microseconds (always measured for metrics; returned to the caller only with debug). A
    stage taken twice in one call (a second selection beside a kept recall block) is one lap, the sum."""

    def __init__(self) -> None:
        self._micros: dict[str, int] = {}  # stage -> microseconds, in the order stages were first taken
        self._last = time.perf_counter_ns()

    def lap(self, stage: str) -> None:
        now = time.perf_counter_ns()
        self._micros[stage] = self._micros.get(stage, 0) + (now - self._last) // 1000
        self._last = now

    @property
    def laps(self) -> list[tuple[str, int]]:
        return list(self._micros.items())


ROLE_LABELS = {int(r): r.label for r in Role}
