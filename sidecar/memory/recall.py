"""Per-user memory state in process: the hybrid index, the active rows, the subject map used to
find conflicts, and who superseded whom. Built from rows on first use, updated on every write."""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from sidecar.domain import Authority, Memory, MemoryType, Scope
from sidecar.index.hybrid import HybridIndex
from sidecar.text import query_terms, terms

if TYPE_CHECKING:  # the source module imports this one
    from sidecar.memory.source import PreparedMemory

_GENERATIONS = itertools.count(1)
# A user-stated memory outranks an inferred one at equal relevance.
AUTHORITY_BONUS = {Authority.USER_STATED: 0.05, Authority.TOOL_VERIFIED: 0.03, Authority.INFERRED: 0.0}


@dataclass(frozen=True, slots=True)
class SupersededTurn:
    """A turn a superseded memory was learnt from: when it was superseded (its successor was said) and by what."""

    at_ms: int
    by: str  # the current memory's content
    current_sources: frozenset[str]  # the turns the current memory was learnt from


@dataclass(slots=True)
class ScoredMemory:
    memory: Memory
    score: float
    dense: float
    lexical: float
    vector: np.ndarray  # as indexed


@dataclass
class UserMemories:
    index: HybridIndex
    active: dict[str, Memory] = field(default_factory=dict)
    by_subject: dict[tuple[MemoryType, str], set[str]] = field(default_factory=dict)
    # successor id -> ids it superseded (so BuildContext can say why the old ones are absent)
    superseded: dict[str, list[str]] = field(default_factory=dict)
    # memory id -> what the BuildContext source (memory.source) derives from it once per version of
    # it (rendered text, wire bytes, term ids, ...); dropped on every change of that memory.
    prepared: dict[str, PreparedMemory] = field(default_factory=dict)
    _prefs: list[Memory] | None = None  # cache of top_preferences, dropped on every change
    # source turn id -> how a superseded memory learnt from it was replaced (MemoryService.superseded_turns),
    # dropped on every change
    turn_marks: dict[str, SupersededTurn] | None = None
    generation: int = field(default_factory=lambda: next(_GENERATIONS))  # a new serial on every change
    _expiries: tuple[int, list[int]] | None = None  # (generation, the active memories' expiry times, sorted)

    def add(self, memory: Memory, vector: np.ndarray) -> None:
        self._prefs = None
        self.turn_marks = None
        self.generation = next(_GENERATIONS)
        self.prepared.pop(memory.memory_id, None)
        self.active[memory.memory_id] = memory
        if memory.subject:
            self.by_subject.setdefault((memory.type, memory.subject), set()).add(memory.memory_id)
        self.index.add(memory.memory_id, vector, terms(memory.content), AUTHORITY_BONUS[memory.authority])

    def expiry_interval(self, now_ms: int) -> int:
        """How many of the active memories' expiry times have passed: changes when one expires."""
        if self._expiries is None or self._expiries[0] != self.generation:
            self._expiries = (self.generation, sorted(m.expires_at_ms for m in self.active.values() if m.expires_at_ms))
        return bisect_right(self._expiries[1], now_ms)

    def remove(self, memory_id: str) -> bool:
        memory = self.active.pop(memory_id, None)
        self.prepared.pop(memory_id, None)
        self._prefs = None
        self.turn_marks = None
        self.generation = next(_GENERATIONS)
        if memory is None:
            return False
        if memory.subject:
            self.by_subject.get((memory.type, memory.subject), set()).discard(memory_id)
        return self.index.remove(memory_id)

    def refresh(self, memory: Memory) -> None:
        """A changed row whose text and vector stay the same (a merge)."""
        self.active[memory.memory_id] = memory
        self.index.set_prior(memory.memory_id, AUTHORITY_BONUS[memory.authority])
        self.prepared.pop(memory.memory_id, None)
        self._prefs = None
        self.turn_marks = None
        self.generation = next(_GENERATIONS)

    def mark_superseded(self, successor: str, memory_id: str) -> None:
        """`memory_id` is no longer active: `successor` replaced it."""
        replaced = self.superseded.setdefault(successor, [])
        if memory_id not in replaced:
            replaced.append(memory_id)
        self.turn_marks = None
        self.generation = next(_GENERATIONS)

    def top_preferences(self, n: int) -> list[Memory]:
        """The n strongest, newest preferences, kept sorted on write (not scanned per call)."""
        if self._prefs is None:
            prefs = [m for m in self.active.values() if m.type == MemoryType.PREFERENCE]
            self._prefs = sorted(prefs, key=lambda m: (-m.confidence, -m.updated_at_ms, m.memory_id))
        return self._prefs[:n]

    def same_subject(self, type_: MemoryType, subject: str) -> list[Memory]:
        return [self.active[i] for i in sorted(self.by_subject.get((type_, subject), ())) if i in self.active]

    def search(self, vector: np.ndarray | None, query: str, k: int, *, now_ms: int,
               types: Sequence[MemoryType] = (), min_score: float = float("-inf"),
               include_expired: bool = False) -> list[ScoredMemory]:
        wanted = set(types)
        # The index ranks with the authority bonus as each row's prior; over-fetch only when type or
        # expiry filters run after it.
        filtered = bool(wanted) or not include_expired
        hits = self.index.search(vector, query_terms(query), k * 2 + 4 if filtered else k)
        out = []
        for h in hits:
            m = self.active.get(h.key)
            if m is None or (wanted and m.type not in wanted) or (m.expired(now_ms) and not include_expired):
                continue
            if h.score >= min_score:
                out.append(ScoredMemory(m, h.score, h.dense, h.lexical, h.vector))
        out.sort(key=lambda s: best_first(s.score, s.memory.memory_id))
        return out[:k]


def best_first(score: float, memory_id: str) -> tuple[float, str]:
    """The order of recalled memories: higher score first, ties by id."""
    return -score, memory_id


def scope_key(scope: Scope) -> tuple[str, str]:
    return scope.tenant_id, scope.user_id
