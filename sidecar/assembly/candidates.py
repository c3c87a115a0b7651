"""Soft-zone candidates. A CandidateSource turns one kind of stored data into a CandidateBatch:
parallel lists (cheap to build, cheap to turn into the fastpath's numpy arrays)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sidecar.assembly.budget import Budget
from sidecar.domain import Category, Scope
from sidecar.store.cache import SessionView
from sidecar.tokens import CL100K, TokenCounter


class SoftCategory(enum.IntEnum):
    """Packing order when space is short; the value is the fastpath category id."""

    RECENT_MESSAGES = 0
    TOOL_OBSERVATIONS = 1
    MEMORIES = 2
    RAG_OR_GRAPH = 3

    @property
    def wire(self) -> Category:
        return Category[self.name]  # the proto Category of the same name


# Per SoftCategory value, looked up by index on the hot path (an enum property costs a microsecond).
SOFT_WIRE: tuple[Category, ...] = tuple(c.wire for c in SoftCategory)
SOFT_BUDGET_FIELDS: tuple[str, ...] = tuple(c.name.lower() for c in SoftCategory)  # Budget's field names


class Section(enum.IntEnum):
    """Render order (proto SectionKind numbers): stable parts first so prompt caches hit."""

    SYSTEM_RULES = 1
    TOOLS = 2
    PINNED_CONSTRAINTS = 3
    SESSION_STATE = 4
    MEMORIES = 5
    KNOWLEDGE = 6
    SUMMARY = 7
    RECENT_MESSAGES = 8
    TOOL_OBSERVATIONS = 9
    QUERY = 10
    SESSION_RECALL = 11  # cache-aware layout: the session's recall, kept (sidecar.assembly.session_recall)


# Render order of the cache-aware layout (proto Layout): what is stable (the session's recall changes only
# when the summary folds), then what only grows (summary, history), then what this call chose (memories,
# knowledge, run notes), then the query.
CACHE_AWARE_ORDER = (Section.SYSTEM_RULES, Section.TOOLS, Section.PINNED_CONSTRAINTS, Section.SESSION_STATE,
                     Section.SESSION_RECALL, Section.SUMMARY, Section.RECENT_MESSAGES, Section.MEMORIES,
                     Section.KNOWLEDGE, Section.TOOL_OBSERVATIONS, Section.QUERY)


@dataclass(slots=True)
class BuildInput:
    """What every source may look at for one call."""

    scope: Scope
    view: SessionView
    run_id: str
    query: str
    query_terms: frozenset[str]
    query_embedding: np.ndarray | None
    roles: tuple[str, ...]
    budget: Budget
    now_ms: int
    cache_aware: bool = True  # proto Layout: the history starts where the summary ends, in blocks
    # What counts every candidate's tokens (BuildContextRequest.tokenizer). Rows store cl100k counts; with any
    # other counter a source counts its texts through it (cached per text) and leaves `bodies` to the builder.
    counter: TokenCounter = CL100K
    asked_at_ms: int = 0  # when the query was asked (BuildContextRequest.asked_at_ms, else now_ms)


DROP_OVER_BUDGET, DROP_DUPLICATE, DROP_LOW_SCORE = 1, 2, 3  # proto DropReason


@dataclass(slots=True)
class SourceDrop:
    """An item a source left out before selection (acl, expired, superseded, ...)."""

    source: str
    category: SoftCategory
    reason: int  # proto DropReason
    tokens: int
    kept_source: str = ""


@dataclass(frozen=True, slots=True)
class DropRun:
    """Items a source left out for one reason, most relevant first, made into Dropped entries only
    as far as the response lists them: a run may be long (a session's messages before its history
    window) and is counted whole."""

    sources: Sequence[str]
    category: SoftCategory
    reason: int  # proto DropReason
    tokens: Sequence[int] | np.ndarray


ItemMeta = tuple[int, int, float | None, tuple[str, ...]]


@dataclass(slots=True)
class CandidateBatch:
    category: SoftCategory
    section: Section
    # Parallel sequences (lists or numpy arrays), one entry per candidate.
    texts: Sequence[str] = field(default_factory=list)
    sources: Sequence[str] = field(default_factory=list)
    tokens: Sequence[int] | np.ndarray = field(default_factory=list)
    relevance: Sequence[float] | np.ndarray = field(default_factory=list)
    age_s: Sequence[float] | np.ndarray = field(default_factory=list)
    priority: Sequence[float] | np.ndarray = field(default_factory=list)
    # Per-item metadata, asked only for the items that are packed: (proto Role or 0, timestamp_ms,
    # order key inside the section or None for best-score-first, message ids the item stands for).
    meta: Callable[[int], ItemMeta] | None = None
    # Each candidate's order key inside its section (None, or NaN for one item: best score first);
    # the builder orders by these, so a source whose meta gives order keys sets the same ones here.
    order: Sequence[float] | np.ndarray | None = None
    # Fast path for sources that keep them precomputed (messages, memories, knowledge chunks): each
    # candidate's ContextItem wire bytes (fastpath.encode_item, no score). With bodies set the
    # builder calls meta only for callers that ask for Item objects.
    bodies: Sequence[bytes] | None = None
    exact_keys: np.ndarray | None = None  # uint64; computed by the builder when None
    simhashes: np.ndarray | None = None
    # Optional per-candidate embeddings (a matrix, or a sequence of rows) and term ids
    # (text.term_ids), for cross-source rules (see knowledge.source).
    vectors: np.ndarray | Sequence[np.ndarray] | None = None
    term_ids: list[np.ndarray] | None = None
    dropped: list[SourceDrop] = field(default_factory=list)
    dropped_runs: list[DropRun] = field(default_factory=list)
    excluded: set[int] = field(default_factory=set)  # see exclude()
    # Set by a knowledge source: True/False when it was consulted, None otherwise.
    knowledge_matched: bool | None = None
    # Called once the selection is made, with the indices of this batch's packed candidates (ascending)
    # and their scores: returns the scores reported for them (what is packed no longer changes).
    rescore: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.texts)

    def exclude(self, indices: set[int]) -> None:
        """Take candidates out before selection (a source-level decision, e.g. a conflict). The
        builder masks them out of the fastpath's arrays, which is far cheaper than rebuilding every
        parallel sequence; they are neither packed nor listed among the selection's drops."""
        self.excluded = self.excluded | indices  # a new set: copies of a batch may share the old one


class CandidateSource(Protocol):
    """Plug-in point for every store of soft-zone material (messages, tools, memories, knowledge)."""

    name: str

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]: ...


def client_vector_of(query_embedding: np.ndarray | None, dim: int) -> np.ndarray | None:
    """The client's query_embedding when it has this size (the embedder's), else None."""
    return query_embedding if query_embedding is not None and query_embedding.shape == (dim,) else None


def query_texts(source: CandidateSource, inp: BuildInput) -> Sequence[str]:
    """The texts `source` will embed for this call with the app's embedder (a source may define
    query_texts(inp); ContextBuilder runs them through a model in one batch)."""
    named = getattr(source, "query_texts", None)
    return named(inp) if named is not None else ()
