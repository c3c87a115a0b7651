"""Knowledge chunks and graph facts as BuildContext candidates (category rag_or_graph), the
grounding signal (MATCHED / NO_MATCH), and the rule that official knowledge beats a personal
memory on the same subject."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

import fastpath
from sidecar.assembly.candidates import (
    BuildInput,
    CandidateBatch,
    Section,
    SoftCategory,
    SourceDrop,
    client_vector_of,
)
from sidecar.domain import Category
from sidecar.knowledge.graph import EdgeIndex, render_path
from sidecar.knowledge.index import ChunkEntry, TenantKnowledge
from sidecar.knowledge.service import KnowledgeService
from sidecar.text import NO_TERMS, query_terms, term_ids, terms
from sidecar.tokens import count_tokens_cached

TOP_K = 8
# Knowledge is official and versioned: it outranks memories and messages of equal relevance.
KNOWLEDGE_BONUS = 0.1
GRAPH_RELEVANCE = 0.35
# A memory talks about the subject of a knowledge chunk when their vectors are this close, or when
# most of the memory's content terms (at least CONFLICT_MIN_SHARED) appear in the chunk.
CONFLICT_COSINE = 0.45
CONFLICT_CONTAINMENT = 0.6
CONFLICT_MIN_SHARED = 3
SAME_STATEMENT_COSINE = 0.9
CONTAINMENT_FLOOR = 0.2
# Only the strongest candidates take part: they are the ones that would be packed.
CONFLICT_MAX_CHUNKS = 8
CONFLICT_MAX_MEMORIES = 32
DROP_CONFLICT_WITH_KNOWLEDGE = 7
MAX_CACHED_ITEMS = 1 << 16
MAX_CACHED_NEIGHBOURHOODS = 1024  # per tenant
MAX_KEPT_VERDICTS = 1024  # knowledge_beats_memory's, across tenants (keyed by the hash of what was judged)
GraphItems = tuple[list[str], list[str], list[int], list[bytes], list[float]]


def chunk_prefix(title: str, heading: str) -> str:
    if not heading:
        return f"[{title}]"
    # A markdown document's first heading usually is its title: say it once.
    return f"[{heading}]" if heading == title or heading.startswith(title + " > ") else f"[{title} > {heading}]"


class KnowledgeSource:
    name = "knowledge"

    def __init__(self, knowledge: KnowledgeService) -> None:
        self.knowledge = knowledge
        # tenant -> (graph version, (seed entities, validity interval) -> items); see _neighbourhood
        self._graphs: dict[str, tuple[int, dict[tuple, GraphItems]]] = {}

    @staticmethod
    def _item(tk: TenantKnowledge, e: ChunkEntry) -> tuple[str, str, int, bytes]:
        """(source tag, text, tokens, ContextItem bytes) of a chunk: a chunk comes back call after call,
        and its item never changes while its entry is the same object."""
        held = tk.items.get(e.chunk.key)
        if held is not None and held[0] is e:
            return held[1:]
        prefix = chunk_prefix(e.title, e.chunk.heading)
        source, text, tokens = f"kb:{e.chunk.key}", f"{prefix} {e.chunk.text}", count_tokens_cached(prefix) + e.chunk.tokens + 1
        body = fastpath.encode_item(source, Category.RAG_OR_GRAPH, tokens, text, 0, 0, ())
        if len(tk.items) >= MAX_CACHED_ITEMS:
            tk.items.clear()
        tk.items[e.chunk.key] = (e, source, text, tokens, body)
        return source, text, tokens, body

    def query_texts(self, inp: BuildInput) -> list[str]:
        """The query, embedded for the tenant's chunks unless the client sent its vector."""
        if (inp.budget.rag_or_graph <= 0 or not inp.query or client_vector_of(inp.query_embedding, self.knowledge.embedder.dim) is not None
                or not self.knowledge.tenant(inp.scope.tenant_id).entries):
            return []
        return [inp.query]

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        kb = CandidateBatch(category=SoftCategory.RAG_OR_GRAPH, section=Section.KNOWLEDGE)
        if inp.budget.rag_or_graph <= 0:
            return [kb]
        tk = self.knowledge.tenant(inp.scope.tenant_id)
        graph = self.knowledge.graph(inp.scope.tenant_id)
        if not tk.entries and not len(graph):
            return [kb]
        if tk.entries and inp.query:
            vector = client_vector_of(inp.query_embedding, self.knowledge.embedder.dim)
            hits, matched = self.knowledge.search_vector(inp.scope.tenant_id, inp.roles, inp.query, vector, TOP_K)
            kb.knowledge_matched = matched
            hits = [(h, e) for h, e in hits if h.score >= self.knowledge.relevance_threshold]
            kb.bodies = []
            for h, e in hits:
                source, text, tokens, body = self._item(tk, e)
                kb.texts.append(text)
                kb.tokens.append(tokens)
                kb.sources.append(source)
                kb.bodies.append(body)
                kb.relevance.append(h.score + KNOWLEDGE_BONUS)
            n = len(hits)
            kb.age_s, kb.priority = [0.0] * n, [0.2] * n
            kb.term_ids = [e.term_ids for _, e in hits]
            kb.vectors = (np.stack([h.vector for h, _ in hits]) if hits
                          else np.zeros((0, self.knowledge.embedder.dim), np.float32))
        self._graph_candidates(inp, graph, kb)
        if not inp.counter.stored and len(kb):
            # Another tokenizer: each chunk's and path's line counted in it (once per text, as stored counts are:
            # the text and its newline); the builder encodes the packed items' bytes with those counts.
            kb.tokens, kb.bodies = [inp.counter.cached(t) + 1 for t in kb.texts], None
        return [kb]

    def _graph_candidates(self, inp: BuildInput, graph: EdgeIndex, kb: CandidateBatch) -> None:
        """A compact neighbourhood of the entities named in the query or the confirmed state."""
        if not len(graph):
            return
        named = set(query_terms(inp.query)) | {t.strip().lower() for t in inp.query.split()}
        for fact in inp.view.confirmed.values():
            named.add(fact.value.strip().lower())
        seeds = tuple(e for e in sorted(named) if graph.has_entity(e))
        if not seeds:
            return
        sources, texts, tokens, bodies, relevance = self._neighbourhood(inp.scope.tenant_id, graph, seeds, inp.now_ms)
        dim = self.knowledge.embedder.dim
        if kb.vectors is None:
            kb.vectors, kb.term_ids = np.zeros((0, dim), np.float32), []
        kb.vectors = np.concatenate([kb.vectors, np.zeros((len(sources), dim), np.float32)])
        kb.term_ids += [NO_TERMS] * len(sources)
        kb.sources += sources
        kb.texts += texts
        kb.tokens += tokens
        if kb.bodies is not None:
            kb.bodies += bodies
        kb.relevance += relevance
        kb.age_s += [0.0] * len(sources)
        kb.priority += [0.2] * len(sources)

    def _neighbourhood(self, tenant_id: str, graph: EdgeIndex, seeds: tuple[str, ...], at_ms: int) -> GraphItems:
        """The neighbourhood's paths as items (sources, texts, tokens, ContextItem bytes, relevance), kept
        while the graph and the validity of its edges are unchanged: the same entities come back turn
        after turn."""
        with self.knowledge._lock:  # edges change under this lock
            version, key = graph.version, (seeds, graph.interval(at_ms))
        cached_version, held = self._graphs.get(tenant_id, (0, {}))
        if cached_version != version or len(held) >= MAX_CACHED_NEIGHBOURHOODS:
            held = {}
            self._graphs[tenant_id] = (version, held)
        items = held.get(key)
        if items is None:
            with self.knowledge._lock:
                if graph.version != version:  # changed meanwhile: items of the new graph, not kept
                    held = {}
                paths = graph.neighbourhood(seeds, max_hops=2, limit=20, at_ms=at_ms)
            texts = [render_path(p) for p in paths]
            tokens = [count_tokens_cached(t) + 1 for t in texts]
            sources = ["graph:" + "+".join(str(e.edge_id) for e in p.edges) for p in paths]
            bodies = [fastpath.encode_item(s, Category.RAG_OR_GRAPH, n, t, 0, 0, ())
                      for s, t, n in zip(sources, texts, tokens, strict=True)]
            items = held[key] = (sources, texts, tokens, bodies, [GRAPH_RELEVANCE / len(p.edges) for p in paths])
        return items


def knowledge_beats_memory(knowledge: KnowledgeService):
    """Resolver run on all batches before selection: a memory on the subject of a knowledge chunk
    is taken out and reported as conflict_with_knowledge. Uses the vectors and term sets the
    sources attached (computed at index time), so it costs a small matrix product per call; the
    verdicts on the same candidates (the same question again, as in an agent's tool loop) are kept."""
    kept: OrderedDict[int, list[tuple[int, int]]] = OrderedDict()
    lock = threading.Lock()

    def conflicts(mb: CandidateBatch, mine: list[int], refs: list[tuple[CandidateBatch, int]]) -> list[tuple[int, int]]:
        """(index in mine, index in refs) of each memory on the subject of a chunk, and that chunk."""
        # A verdict depends on the candidates' vectors and terms, in this order: a source (its id) with its
        # text pins both (a memory's vector is set with its text, a chunk's by its document version). Kept
        # by their hash: no text outlives its memory here (a deleted memory, a forgotten user).
        key = hash((tuple((mb.sources[j], mb.texts[j]) for j in mine), tuple((b.sources[i], b.texts[i]) for b, i in refs)))
        with lock:
            found = kept.get(key)
            if found is not None:
                kept.move_to_end(key)
                return found
        kb_vecs = np.concatenate([_vectors_of(knowledge, b, at) for b, at in _per_batch(refs)])
        sims = _vectors_of(knowledge, mb, mine) @ kb_vecs.T
        # Term containment (share of the memory's terms found in the chunk), scaled so that
        # CONFLICT_CONTAINMENT counts like CONFLICT_COSINE; only for pairs already somewhat close
        # (the rest cannot be on the same subject). The best chunk per memory, in one compiled pass.
        best, scores, cosines = fastpath.best_matches(sims, [_terms_of(mb, j) for j in mine],
                                                      [_terms_of(b, i) for b, i in refs], CONTAINMENT_FLOOR,
                                                      CONFLICT_MIN_SHARED, CONFLICT_COSINE / CONFLICT_CONTAINMENT)
        # Saying the same thing is no conflict: fastpath's dedup keeps the better of the two.
        rows = np.flatnonzero((scores >= CONFLICT_COSINE) & (cosines < SAME_STATEMENT_COSINE)).tolist()
        found = [(row, int(best[row])) for row in rows]
        with lock:
            kept[key] = found
            while len(kept) > MAX_KEPT_VERDICTS:
                kept.popitem(last=False)
        return found

    def resolve(batches: list[CandidateBatch]) -> None:
        kb = [b for b in batches if b.section == Section.KNOWLEDGE and len(b)]
        memories = [b for b in batches if b.category == SoftCategory.MEMORIES and len(b)]
        if not kb or not memories:
            return
        refs = _first_chunks(kb)
        if not refs:
            return
        for mb in memories:
            mine = _top_memories(mb)
            if not mine:
                continue
            out = set()
            for row, ref in conflicts(mb, mine, refs):
                j, (b, i) = mine[row], refs[ref]
                out.add(j)
                mb.dropped.append(SourceDrop(mb.sources[j], mb.category, DROP_CONFLICT_WITH_KNOWLEDGE,
                                             int(mb.tokens[j]), kept_source=b.sources[i]))
            mb.exclude(out)

    return resolve


def _first_chunks(kb: list[CandidateBatch]) -> list[tuple[CandidateBatch, int]]:
    """The first CONFLICT_MAX_CHUNKS knowledge chunks (graph facts are not statements to conflict with)."""
    refs = []
    for b in kb:
        for i, source in enumerate(b.sources):
            if source.startswith("kb:"):
                refs.append((b, i))
                if len(refs) == CONFLICT_MAX_CHUNKS:
                    return refs
    return refs


def _top_memories(mb: CandidateBatch) -> list[int]:
    """The CONFLICT_MAX_MEMORIES most relevant stored memories of a batch (recalled turns are not
    memories: they are what was said, not a claim)."""
    out = []
    for j in np.argsort(-np.asarray(mb.relevance, np.float64), kind="stable").tolist():
        if mb.sources[j].startswith("memory:") and j not in mb.excluded:
            out.append(j)
            if len(out) == CONFLICT_MAX_MEMORIES:
                break
    return out


def _body(text: str) -> str:
    """A candidate's statement without its rendering prefix ("- ", "[title > heading] ")."""
    return text.removeprefix("- ").split("] ", 1)[-1] if text.startswith("[") else text.removeprefix("- ")


def _per_batch(refs: list[tuple[CandidateBatch, int]]) -> list[tuple[CandidateBatch, list[int]]]:
    """Consecutive refs grouped by batch, in order."""
    out: list[tuple[CandidateBatch, list[int]]] = []
    for b, i in refs:
        if not out or out[-1][0] is not b:
            out.append((b, []))
        out[-1][1].append(i)
    return out


def _vectors_of(knowledge: KnowledgeService, b: CandidateBatch, at: list[int]) -> np.ndarray:
    """The vectors the batch attached for these candidates; the missing ones embedded in one call."""
    if b.vectors is None:
        return knowledge.embedder.embed([_body(b.texts[i]) for i in at])
    rows = b.vectors
    out = np.array(rows[at] if isinstance(rows, np.ndarray) else [rows[i] for i in at], np.float32)
    missing = np.flatnonzero(~out.any(axis=1)).tolist()
    if missing:
        out[missing] = knowledge.embedder.embed([_body(b.texts[at[r]]) for r in missing])
    return out


def _terms_of(b: CandidateBatch, i: int) -> np.ndarray:
    held = b.term_ids[i] if b.term_ids is not None else NO_TERMS
    return held if len(held) else term_ids(terms(_body(b.texts[i])))

