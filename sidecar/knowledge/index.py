"""The knowledge index of one tenant: one hybrid index per distinct ACL (set of allowed roles), so a
role filter is applied by choosing which indexes to search, never by a per-node callback, and a
chunk the caller may not see is never a hit. Persisted beside the database, caught up from rows."""

from __future__ import annotations

import logging
import pickle
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sidecar.domain import KnowledgeChunk
from sidecar.index.hybrid import Hit, HybridIndex
from sidecar.text import NO_TERMS, TERMS_VERSION, query_terms, term_ids, terms

log = logging.getLogger("sidecar.knowledge")

Acl = tuple[str, ...]  # sorted allowed roles; () = the whole tenant


@dataclass(slots=True)
class ChunkEntry:
    chunk: KnowledgeChunk
    title: str
    acl: Acl
    term_ids: np.ndarray = field(default_factory=lambda: NO_TERMS)  # filled when indexed; for the conflict rule


def visible(acl: Acl, roles: Iterable[str]) -> bool:
    return not acl or bool(set(acl) & set(roles))


def chunk_terms(entry: ChunkEntry) -> list[str]:
    return terms(f"{entry.title} {entry.chunk.heading} {entry.chunk.text}")


class TenantKnowledge:
    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.groups: dict[Acl, HybridIndex] = {}
        self.entries: dict[str, ChunkEntry] = {}  # chunk key -> entry (live, indexed chunks only)
        # chunk key -> (entry, source tag, text, tokens, ContextItem bytes) as BuildContext packs the
        # chunk (knowledge.source); not saved, dropped with the chunk.
        self.items: dict[str, tuple[ChunkEntry, str, str, int, bytes]] = {}
        self.lock = threading.RLock()

    def add(self, entries: Sequence[ChunkEntry], vectors: np.ndarray) -> None:
        with self.lock:
            self.remove([e.chunk.key for e in entries])
            by_acl: dict[Acl, list] = {}
            for entry, vec in zip(entries, vectors, strict=True):
                words = chunk_terms(entry)
                entry.term_ids = term_ids(words)
                by_acl.setdefault(entry.acl, []).append((entry.chunk.key, vec, words))
                self.entries[entry.chunk.key] = entry
            for acl, items in by_acl.items():
                group = self.groups.get(acl)
                if group is None:
                    group = self.groups[acl] = HybridIndex(self.dim, dense_weight=0.55)
                group.add_many(items)

    def remove(self, keys: Iterable[str]) -> int:
        n = 0
        with self.lock:
            for key in keys:
                self.items.pop(key, None)
                entry = self.entries.pop(key, None)
                if entry is not None:
                    self.groups[entry.acl].remove(key)
                    n += 1
        return n

    def search(self, vector: np.ndarray | None, query: str, roles: Sequence[str], k: int) -> list[tuple[Hit, ChunkEntry]]:
        qterms = query_terms(query)
        with self.lock:
            hits: list[tuple[Hit, ChunkEntry]] = []
            for acl, group in self.groups.items():
                if visible(acl, roles) and len(group):
                    hits += [(h, self.entries[h.key]) for h in group.search(vector, qterms, k)]
        hits.sort(key=lambda he: (-he[0].score, he[0].key))
        return hits[:k]

    def vector(self, key: str) -> np.ndarray | None:
        with self.lock:
            entry = self.entries.get(key)
            return None if entry is None else self.groups[entry.acl].vector(key)

    # ------------------------------------------------------------------ persistence
    def save(self, path: Path) -> None:
        with self.lock:
            tmp = path.with_suffix(".tmp")
            with tmp.open("wb") as f:
                pickle.dump({"dim": self.dim, "terms": TERMS_VERSION, "entries": self.entries, "groups": self.groups},
                            f, protocol=pickle.HIGHEST_PROTOCOL)
            tmp.replace(path)  # atomic: a crash leaves the old file or the new one

    @classmethod
    def load(cls, path: Path, dim: int) -> TenantKnowledge | None:
        try:
            with path.open("rb") as f:
                data = pickle.load(f)
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError) as e:
            log.warning("knowledge index %s unreadable (%s); rebuilding from rows", path, e)
            return None
        if data.get("dim") != dim or data.get("terms") != TERMS_VERSION:  # another embedder, or another word rule
            return None
        tk = cls(dim)
        tk.entries = data["entries"]
        tk.groups = data["groups"]
        return tk
