"""Long-term memories as BuildContext candidates (category memories, source tag memory:<id>).
The user's preferences always compete; other memories only when they match the query. In a
sub-agent's session nothing competes by default: memories reach it only by relevance to its task
and query (the parent agent hands over what it must know)."""

from __future__ import annotations

from itertools import chain
from typing import NamedTuple

import numpy as np

import fastpath
from sidecar.assembly.candidates import (
    BuildInput,
    CandidateBatch,
    ItemMeta,
    Section,
    SoftCategory,
    SourceDrop,
    client_vector_of,
)
from sidecar.domain import Category, Memory, MemoryType
from sidecar.memory.recall import AUTHORITY_BONUS, UserMemories, best_first
from sidecar.memory.service import MemoryService, render_memory
from sidecar.text import query_terms, term_ids

TOP_K = 24
MIN_RELEVANCE = 0.12
PREFERENCE_FLOOR = 0.3
MAX_PREFERENCES = 8  # the user's strongest, newest preferences compete on every call
DROP_EXPIRED, DROP_SUPERSEDED = 5, 6


class MemorySource:
    name = "memories"

    def __init__(self, memories: MemoryService) -> None:
        self.memories = memories

    def query_texts(self, inp: BuildInput) -> list[str]:
        """The query, embedded for the user's memories (if any) unless the client sent its vector."""
        query = _query(inp)
        if inp.budget.memories <= 0 or not query or self._client_vector(inp) is not None:
            return []
        return [query] if self.memories.user(inp.scope).active else []

    def _client_vector(self, inp: BuildInput) -> np.ndarray | None:
        # A client's vector embeds its query alone, not a sub-agent's task with it.
        if inp.view.session.parent_session_id:
            return None
        return client_vector_of(inp.query_embedding, self.memories.embedder.dim)

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        batch = CandidateBatch(category=SoftCategory.MEMORIES, section=Section.MEMORIES)
        if inp.budget.memories <= 0:
            return [batch]
        now = inp.now_ms
        state = self.memories.user(inp.scope)  # loaded (if need be) before the lock: see MemoryService.user
        with self.memories._lock:
            if not state.active:
                return [batch]
            query, sub_agent = _query(inp), bool(inp.view.session.parent_session_id)
            vector = self._client_vector(inp)
            if vector is None and query:
                vector = self.memories.embedder.embed([query])[0]
            picked: dict[str, tuple[Memory, float]] = {}
            # The index's keys and scores in UserMemories.search's order, without a hit object per memory.
            keys, scores = state.index.ranked(vector, query_terms(query), TOP_K)
            for key, score in sorted(zip(keys, scores, strict=True), key=lambda h: best_first(h[1], h[0])):
                m = state.active.get(key)
                if m is None:
                    continue
                if m.expired(now):
                    batch.dropped.append(SourceDrop(f"memory:{m.memory_id}", SoftCategory.MEMORIES, DROP_EXPIRED,
                                                    inp.counter.of_line(render_memory(m.content), m.tokens)))
                elif m.type == MemoryType.PREFERENCE and not sub_agent:
                    picked[key] = (m, max(score, PREFERENCE_FLOOR + AUTHORITY_BONUS[m.authority]))
                elif score >= MIN_RELEVANCE:
                    picked[key] = (m, score)
            for m in () if sub_agent else state.top_preferences(MAX_PREFERENCES):
                if m.memory_id not in picked and not m.expired(now):
                    picked[m.memory_id] = (m, PREFERENCE_FLOOR + AUTHORITY_BONUS[m.authority])
            for key in picked:
                for old in state.superseded.get(key, ()):
                    batch.dropped.append(SourceDrop(f"memory:{old}", SoftCategory.MEMORIES, DROP_SUPERSEDED, 0,
                                                    kept_source=f"memory:{key}"))
            # Under the lock: a write drops a memory's prepared row.
            rows = [state.prepared.get(key) or _prepare(state, m) for key, (m, _) in picked.items()]
        if not rows:
            return [batch]
        texts, sources, tokens, term_arrays, bodies, metas, vectors, priority, updated, keys = zip(*rows, strict=True)
        batch.texts, batch.sources, batch.tokens, batch.priority = texts, sources, tokens, priority
        # fromiter over the flattened pairs: np.array of a tuple of tuples inspects every element.
        batch.exact_keys, batch.simhashes = np.fromiter(chain.from_iterable(keys), np.uint64,
                                                        2 * len(keys)).reshape(len(keys), 2).T
        batch.term_ids, batch.bodies = list(term_arrays), bodies
        batch.relevance = [score for _, score in picked.values()]
        # Counted to the time of asking: a replayed history's memories are as old as they were then.
        asked = inp.asked_at_ms or now
        batch.age_s = [max(asked - t, 0) / 1000.0 for t in updated]
        batch.vectors = vectors  # the rows as indexed; only the knowledge resolver reads a few of them
        batch.meta = metas.__getitem__
        if not inp.counter.stored:  # another tokenizer: counted (once per text) in it; the builder makes the bytes
            batch.tokens, batch.bodies = [inp.counter.line(t) for t in texts], None
        return [batch]


class PreparedMemory(NamedTuple):
    """What a candidate needs of one memory that does not change until the memory does."""

    text: str
    source: str
    tokens: int
    term_ids: np.ndarray
    body: bytes  # its ContextItem wire bytes
    meta: ItemMeta
    vector: np.ndarray
    priority: float
    updated_at_ms: int
    dedup_keys: tuple[int, int]  # (exact key, simhash) of the text, as fastpath.text_keys makes them


def _prepare(state: UserMemories, m: Memory) -> PreparedMemory:
    text, source = render_memory(m.content), f"memory:{m.memory_id}"
    meta: ItemMeta = (0, m.updated_at_ms, None, tuple(m.source_message_ids))
    body = fastpath.encode_item(source, Category.MEMORIES, m.tokens, text, *meta[:2], meta[3])
    exact, simhash = fastpath.text_keys([text])
    # Its terms are those the index holds for it (terms(content), made when it was indexed).
    prepared = state.prepared[m.memory_id] = PreparedMemory(
        text, source, m.tokens, term_ids(state.index.terms(m.memory_id)), body, meta, state.index.vector(m.memory_id),
        0.1 * m.confidence, m.updated_at_ms, (int(exact[0]), int(simhash[0])))
    return prepared


def _query(inp: BuildInput) -> str:
    """What memories are ranked by: the query, and in a sub-agent's session its task too."""
    task = inp.view.session.task if inp.view.session.parent_session_id else ""
    return f"{inp.query} {task}".strip() if task else inp.query
