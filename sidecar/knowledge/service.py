"""The tenant's knowledge base: versioned documents chunked at ingest, indexed by their own job,
role-filtered in the index, searched hybrid; graph facts with multi-hop queries."""

from __future__ import annotations

import hashlib
import itertools
import logging
import re
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from sidecar import tokens
from sidecar.clock import now_ms
from sidecar.domain import DocumentVersion, GraphEdge, Job, KnowledgeChunk, Scope
from sidecar.errors import InvalidArgument, NotFound
from sidecar.ids import check_id, check_text
from sidecar.index.embedders import Embedder, client_vector
from sidecar.jobs import JobWorker, new_job
from sidecar.knowledge.chunking import chunk_document
from sidecar.knowledge.graph import EdgeIndex
from sidecar.knowledge.graph import Path as GraphPath
from sidecar.knowledge.index import ChunkEntry, TenantKnowledge
from sidecar.knowledge.relations import extract_relations
from sidecar.secrets import mask

log = logging.getLogger("sidecar.knowledge")

INDEX_JOB = "index_document"
MAX_DOC_TEXT = 16 * 1024 * 1024
EMBED_BATCH = 256
FORMAT_MARKDOWN = 2
_ROLE_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")
_GENERATIONS = itertools.count(1)


def edge_id_for(subject: str, relation: str, obj: str) -> str:
    return "e_" + hashlib.blake2b(f"{subject}\x00{relation}\x00{obj}".encode(), digest_size=8).hexdigest()


class KnowledgeService:
    def __init__(self, store, embedder: Embedder, index_dir: Path | None, *, relevance_threshold: float = 0.2,
                 worker: JobWorker | None = None) -> None:
        self.store = store
        self.embedder = embedder
        self.index_dir = index_dir
        self.relevance_threshold = relevance_threshold
        self.worker = worker
        self._tenants: dict[str, TenantKnowledge] = {}
        self._graphs: dict[str, EdgeIndex] = {}
        self._lock = threading.RLock()
        self._dirty: set[str] = set()  # tenants whose index changed since it was last saved
        self._generations: dict[str, int] = {}  # tenant -> a serial of its last change (generation())
        self._closing = threading.Event()

    # ------------------------------------------------------------------ index state
    def _index_path(self, tenant_id: str) -> Path | None:
        if self.index_dir is None:
            return None
        return self.index_dir / f"{hashlib.sha1(tenant_id.encode()).hexdigest()[:16]}.kbindex"

    def tenant(self, tenant_id: str) -> TenantKnowledge:
        """The tenant's index: loaded from its file, then caught up with the rows (live chunks)."""
        with self._lock:
            tk = self._tenants.get(tenant_id)
            if tk is not None:
                return tk
            path = self._index_path(tenant_id)
            tk = (TenantKnowledge.load(path, self.embedder.dim) if path and path.exists() else None) \
                or TenantKnowledge(self.embedder.dim)
            self._catch_up(tenant_id, tk)
            self._tenants[tenant_id] = tk
            return tk

    def _catch_up(self, tenant_id: str, tk: TenantKnowledge) -> None:
        docs = {(d.doc_id, d.version): d for d in self.store.document_versions(tenant_id, live_only=True)}
        rows = self.store.chunks(tenant_id, live_only=True)
        wanted = {c.key for c in rows}
        stale = [k for k in list(tk.entries) if k not in wanted]
        tk.remove(stale)
        # A version ingested between the two reads has no document row here yet: its own job adds it.
        missing = [c for c in rows if c.key not in tk.entries and (c.doc_id, c.version) in docs]
        self._add_chunks(tk, [ChunkEntry(c, docs[(c.doc_id, c.version)].title,
                                         tuple(docs[(c.doc_id, c.version)].allowed_roles)) for c in missing])
        if stale or missing:
            log.info("knowledge index of %s caught up: +%d -%d chunks", tenant_id, len(missing), len(stale))

    def _add_chunks(self, tk: TenantKnowledge, entries: Sequence[ChunkEntry], progress=None) -> None:
        for start in range(0, len(entries), EMBED_BATCH):
            batch = entries[start:start + EMBED_BATCH]
            vectors = self.embedder.embed([f"{e.title}\n{e.chunk.heading}\n{e.chunk.text}" for e in batch])
            tk.add(batch, vectors)
            if progress:
                progress(start + len(batch))

    def save(self, only_dirty: bool = False) -> None:
        """Persist the indexes. The rows are the truth: a file older than them is caught up at start-up,
        so saving is batched (see save_every_s) rather than done after every document."""
        with self._lock:
            tenants = list(self._dirty) if only_dirty else list(self._tenants)
            self._dirty.difference_update(tenants)
        for tenant_id in tenants:
            self.save_tenant(tenant_id)

    def start_saver(self, every_s: float) -> None:
        def loop() -> None:
            while not self._closing.wait(every_s):
                self.save(only_dirty=True)

        threading.Thread(target=loop, name="kb-saver", daemon=True).start()

    def stop_saver(self) -> None:
        self._closing.set()

    def entry_count(self) -> float:
        with self._lock:
            return float(sum(len(tk.entries) for tk in self._tenants.values()))

    def warm_up(self) -> None:
        """Load and catch up every tenant's index (run in the background at start-up)."""
        try:
            for tenant_id in self.store.knowledge_tenants():
                if self._closing.is_set():
                    return
                self.tenant(tenant_id)
        except Exception:
            if not self._closing.is_set():
                raise
            # A close right after start-up shut the store under us: nothing left to warm.

    # ------------------------------------------------------------------ documents
    def ingest(self, scope: Scope, doc_id: str, title: str, text: str, fmt: int, roles: Sequence[str],
               metadata: dict[str, str], max_tokens: int, overlap: int, make_live: bool) -> tuple[int, int, str]:
        check_id(doc_id, "doc_id")
        check_text(title, "title", 1024)
        check_text(text, "text", MAX_DOC_TEXT, required=True)
        text, title = mask(text)[0], mask(title)[0]  # a manual's sample credentials are not kept either
        for i, role in enumerate(roles):
            if not _ROLE_RE.match(role):
                raise InvalidArgument(f"allowed_roles[{i}] {role[:40]!r} may only contain letters, digits and -_.:@")
        if max_tokens and not 32 <= max_tokens <= 4000:
            raise InvalidArgument(f"chunking.max_tokens must be 32-4000 (got {max_tokens})")
        if overlap < 0 or overlap >= (max_tokens or 400):
            raise InvalidArgument(f"chunking.overlap_tokens must be 0 to below max_tokens (got {overlap})")
        chunks = chunk_document(text, markdown=fmt == FORMAT_MARKDOWN, max_tokens=max_tokens or 400,
                                overlap_tokens=overlap if max_tokens else (overlap or 40), count_tokens=tokens.count_tokens)
        doc = DocumentVersion(doc_id=doc_id, version=0, title=title, format=fmt, allowed_roles=sorted(set(roles)),
                              metadata=dict(metadata), chunk_count=len(chunks), live=make_live, indexed=False,
                              created_at_ms=now_ms())
        job = new_job(scope, INDEX_JOB, {"doc_id": doc_id}, total_items=len(chunks))
        rows = [KnowledgeChunk(doc_id, 0, c.index, c.heading, c.text, c.tokens) for c in chunks]
        version = self.store.add_document_version(scope.tenant_id, doc, rows, job)
        if self.worker:
            self.worker.notify()
        return version, len(chunks), job.job_id

    def handle_index_job(self, job: Job) -> dict[str, str]:
        tenant_id, doc_id, version = job.tenant_id, job.payload["doc_id"], job.payload["version"]
        versions = {d.version: d for d in self.store.document_versions(tenant_id, doc_id)}
        doc = versions.get(version)
        if doc is None:
            return {"skipped": "document deleted"}
        chunks = self.store.chunks(tenant_id, doc_id, version)
        if doc.live:
            tk = self.tenant(tenant_id)
            tk.remove([k for k, e in list(tk.entries.items()) if e.chunk.doc_id == doc_id and e.chunk.version != version])
            entries = [ChunkEntry(c, doc.title, tuple(doc.allowed_roles)) for c in chunks]
            self._add_chunks(tk, entries, progress=lambda done: self.worker and self.worker.report_progress(
                job, done, len(chunks)))
        edges = self._extract_edges(doc, chunks)
        if edges:
            self.upsert_edges(Scope(tenant_id, ""), edges)
        self.store.mark_indexed(tenant_id, doc_id, version)
        self._dirty.add(tenant_id)
        self._changed(tenant_id)
        job.done_items = job.total_items = len(chunks)
        return {"chunks": str(len(chunks)), "edges": str(len(edges)), "live": str(doc.live).lower()}

    @staticmethod
    def _extract_edges(doc: DocumentVersion, chunks: Sequence[KnowledgeChunk]) -> list[GraphEdge]:
        out: dict[str, GraphEdge] = {}
        for c in chunks:
            for r in extract_relations(c.text):
                eid = edge_id_for(r.subject, r.relation, r.object)
                out.setdefault(eid, GraphEdge(eid, r.subject, r.relation, r.object, f"kb:{c.key}"))
        return list(out.values())

    def refresh(self, tenant_id: str, *, graph: bool) -> None:
        """Another replica changed the tenant's knowledge: catch the index up from the rows."""
        with self._lock:
            tk = self._tenants.get(tenant_id)
            if graph:
                self._graphs.pop(tenant_id, None)
        if tk is not None and not graph:
            self._catch_up(tenant_id, tk)
        self._changed(tenant_id)

    def _changed(self, tenant_id: str) -> None:
        with self._lock:
            self._generations[tenant_id] = next(_GENERATIONS)

    def generation(self, tenant_id: str) -> tuple[int, int, int]:
        """Changes whenever what the tenant's knowledge may answer changes: chunks, versions, edges, and
        an edge starting or ceasing to be valid."""
        graph = self._graphs.get(tenant_id)
        return (self._generations.get(tenant_id, 0), *((graph.version, graph.interval(now_ms())) if graph else (0, 0)))

    def save_tenant(self, tenant_id: str) -> None:
        path = self._index_path(tenant_id)
        tk = self._tenants.get(tenant_id)
        if path is not None and tk is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tk.save(path)

    def list_documents(self, scope: Scope) -> list[DocumentVersion]:
        return self.store.document_versions(scope.tenant_id, live_only=True)

    def versions(self, scope: Scope, doc_id: str) -> list[DocumentVersion]:
        check_id(doc_id, "doc_id")
        versions = self.store.document_versions(scope.tenant_id, doc_id)
        if not versions:
            raise NotFound(f"doc_id {doc_id!r} not found in this tenant")
        return versions

    def set_live(self, scope: Scope, doc_id: str, version: int) -> DocumentVersion:
        versions = {d.version: d for d in self.versions(scope, doc_id)}
        if version not in versions:
            raise NotFound(f"version {version} of doc_id {doc_id!r} not found (versions: {sorted(versions)})")
        self.store.set_live_version(scope.tenant_id, doc_id, version)
        doc = versions[version]
        tk = self.tenant(scope.tenant_id)
        tk.remove([k for k, e in list(tk.entries.items()) if e.chunk.doc_id == doc_id])
        self._add_chunks(tk, [ChunkEntry(c, doc.title, tuple(doc.allowed_roles))
                              for c in self.store.chunks(scope.tenant_id, doc_id, version)])
        self._dirty.add(scope.tenant_id)
        self._changed(scope.tenant_id)
        return next(d for d in self.store.document_versions(scope.tenant_id, doc_id) if d.version == version)

    def delete(self, scope: Scope, doc_id: str) -> tuple[int, int]:
        self.versions(scope, doc_id)
        versions, chunks = self.store.delete_document(scope.tenant_id, doc_id)
        tk = self.tenant(scope.tenant_id)
        tk.remove([k for k, e in list(tk.entries.items()) if e.chunk.doc_id == doc_id])
        with self._lock:
            self._graphs.pop(scope.tenant_id, None)
        self._dirty.add(scope.tenant_id)
        self._changed(scope.tenant_id)
        return versions, chunks

    # ------------------------------------------------------------------ retrieval
    def search(self, scope: Scope, roles: Sequence[str], query: str, embedding: Sequence[float] | None, k: int):
        check_text(query, "query", 64 * 1024)
        if k < 0 or k > 100:
            raise InvalidArgument(f"k must be 0-100 (got {k})")
        vector = client_vector(embedding, self.embedder.dim, "query_embedding") if embedding else None
        if vector is None and not query.strip():
            raise InvalidArgument("query or query_embedding is required")
        return self.search_vector(scope.tenant_id, roles, query, vector, k or 5)

    def search_vector(self, tenant_id: str, roles: Sequence[str], query: str, vector: np.ndarray | None, k: int):
        if vector is None and query:
            vector = self.embedder.embed([query])[0]
        hits = self.tenant(tenant_id).search(vector, query, roles, k)
        matched = bool(hits) and hits[0][0].score >= self.relevance_threshold
        return hits, matched

    # ------------------------------------------------------------------ graph
    def graph(self, tenant_id: str) -> EdgeIndex:
        with self._lock:
            g = self._graphs.get(tenant_id)
            if g is None:
                g = self._graphs[tenant_id] = EdgeIndex(self.store.edges(tenant_id))
            return g

    def upsert_edges(self, scope: Scope, edges: Sequence[GraphEdge]) -> list[GraphEdge]:
        out = []
        for i, e in enumerate(edges):
            for name, value in (("subject", e.subject), ("relation", e.relation), ("object", e.object)):
                check_text(value, f"edges[{i}].{name}", 256, required=True)
            check_text(e.source, f"edges[{i}].source", 512)
            if e.valid_to_ms and e.valid_from_ms and e.valid_to_ms <= e.valid_from_ms:
                raise InvalidArgument(f"edges[{i}].valid_to_ms must be after valid_from_ms")
            check_id(e.edge_id, f"edges[{i}].edge_id", required=False)
            subject, relation, obj = e.subject.strip().lower(), e.relation.strip().lower(), e.object.strip().lower()
            out.append(GraphEdge(e.edge_id or edge_id_for(subject, relation, obj), subject, relation, obj, e.source,
                                 e.valid_from_ms, e.valid_to_ms))
        # The same edge twice in one call (one edge_id, or one triple without an id) is one upsert:
        # the later one wins, as it would in two calls.
        out = list({e.edge_id: e for e in out}.values())
        self.store.upsert_edges(scope.tenant_id, out)
        g = self.graph(scope.tenant_id)
        with self._lock:
            for e in out:
                g.add(e)
        self._changed(scope.tenant_id)
        return out

    def delete_edges(self, scope: Scope, edge_ids: Sequence[str]) -> int:
        for i, eid in enumerate(edge_ids):
            check_id(eid, f"edge_ids[{i}]")
        n = self.store.delete_edges(scope.tenant_id, edge_ids)
        g = self.graph(scope.tenant_id)
        with self._lock:
            for eid in edge_ids:
                g.remove(eid)
        self._changed(scope.tenant_id)
        return n

    def query_graph(self, scope: Scope, entity: str, relations: Sequence[str], max_hops: int, direction: str,
                    at_ms: int) -> list[GraphPath]:
        check_text(entity, "entity", 256, required=True)
        if not 0 <= max_hops <= 3:
            raise InvalidArgument(f"max_hops must be 1-3 (got {max_hops})")
        g = self.graph(scope.tenant_id)
        with self._lock:
            return g.paths(entity.strip().lower(), relations=set(relations) or None, max_hops=max_hops or 1,
                           direction=direction, at_ms=at_ms or now_ms(), limit=500)
