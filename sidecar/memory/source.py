"""Long-term memories as BuildContext candidates (category memories, source tag memory:<id>).
The user's preferences always compete; other memories only when they match the query."""

from __future__ import annotations

import numpy as np

import fastpath
from sidecar.assembly.candidates import (
    BuildInput,
    CandidateBatch,
    ItemMeta,
    Section,
    SoftCategory,
    SourceDrop,
)
from sidecar.domain import Category, Memory, MemoryType
from sidecar.memory.recall import AUTHORITY_BONUS, UserMemories
from sidecar.memory.service import MemoryService, render_memory

TOP_K = 24
MIN_RELEVANCE = 0.12
PREFERENCE_FLOOR = 0.3
MAX_PREFERENCES = 8  # the user's strongest, newest preferences compete on every call
DROP_EXPIRED, DROP_SUPERSEDED = 5, 6


class MemorySource:
    name = "memories"

    def __init__(self, memories: MemoryService) -> None:
        self.memories = memories

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        batch = CandidateBatch(category=SoftCategory.MEMORIES, section=Section.MEMORIES)
        if inp.budget.memories <= 0:
            return [batch]
        with self.memories._lock:
            state = self.memories.user(inp.scope)
            if not state.active:
                return [batch]
            vector = (inp.query_embedding if inp.query_embedding is not None and
                      inp.query_embedding.shape == (self.memories.embedder.dim,)
                      else self.memories.embedder.embed([inp.query])[0] if inp.query else None)
            hits = {h.memory.memory_id: h for h in state.search(vector, inp.query, TOP_K, now_ms=inp.now_ms,
                                                                  include_expired=True)}
            prefs = state.top_preferences(MAX_PREFERENCES)
            pref_vectors = {m.memory_id: state.index.vector(m.memory_id) for m in prefs if m.memory_id not in hits}
            # Only the candidates' predecessors, not a copy of the user's whole supersession map.
            superseded = {key: tuple(state.superseded[key]) for key in (*hits, *(m.memory_id for m in prefs))
                          if key in state.superseded}
        picked, vectors = [], []
        for h in hits.values():
            if h.memory.expired(inp.now_ms):
                batch.dropped.append(SourceDrop(f"memory:{h.memory.memory_id}", SoftCategory.MEMORIES, DROP_EXPIRED,
                                                h.memory.tokens))
            elif h.memory.type == MemoryType.PREFERENCE:
                picked.append((h.memory, max(h.score, PREFERENCE_FLOOR + AUTHORITY_BONUS[h.memory.authority])))
                vectors.append(h.vector)
            elif h.score >= MIN_RELEVANCE:
                picked.append((h.memory, h.score))
                vectors.append(h.vector)
        for m in prefs:
            if m.memory_id not in hits and not m.expired(inp.now_ms):
                picked.append((m, PREFERENCE_FLOOR + AUTHORITY_BONUS[m.authority]))
                vectors.append(pref_vectors[m.memory_id])
        for m, _ in picked:
            for old in superseded.get(m.memory_id, ()):
                batch.dropped.append(SourceDrop(f"memory:{old}", SoftCategory.MEMORIES, DROP_SUPERSEDED, 0,
                                                kept_source=f"memory:{m.memory_id}"))
        batch.texts = [render_memory(m.content) for m, _ in picked]
        batch.sources = [f"memory:{m.memory_id}" for m, _ in picked]
        batch.tokens = [m.tokens for m, _ in picked]
        batch.relevance = [score for _, score in picked]
        batch.age_s = [max(inp.now_ms - m.updated_at_ms, 0) / 1000.0 for m, _ in picked]
        batch.priority = [0.1 * m.confidence for m, _ in picked]
        # One copy of all the rows (np.stack would add an axis to each vector first).
        batch.vectors = np.concatenate(vectors).reshape(len(vectors), -1) if vectors else None
        metas = [(0, m.updated_at_ms, None, tuple(m.source_message_ids)) for m, _ in picked]
        with self.memories._lock:  # under the lock: a write drops a memory's cached bytes
            batch.term_ids = [state.term_ids(m.memory_id) for m, _ in picked]
            batch.bodies = [state.bodies.get(m.memory_id) or _body(state, m, meta)
                            for (m, _), meta in zip(picked, metas, strict=True)]
        batch.meta = metas.__getitem__
        return [batch]


def _body(state: UserMemories, m: Memory, meta: ItemMeta) -> bytes:
    """The memory's ContextItem wire bytes, made once per version of it."""
    role, ts, _, message_ids = meta
    body = state.bodies[m.memory_id] = fastpath.encode_item(f"memory:{m.memory_id}", Category.MEMORIES, m.tokens,
                                                            render_memory(m.content), role, ts, message_ids)
    return body
