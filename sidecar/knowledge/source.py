"""Knowledge chunks and graph facts as BuildContext candidates (category rag_or_graph), the
grounding signal (MATCHED / NO_MATCH), and the rule that official knowledge beats a personal
memory on the same subject."""

from __future__ import annotations

import numpy as np

from sidecar.assembly.candidates import BuildInput, CandidateBatch, Section, SoftCategory, SourceDrop
from sidecar.knowledge.graph import render_path
from sidecar.knowledge.service import KnowledgeService
from sidecar.memory.filters import near_duplicate
from sidecar.text import term_set, terms
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
DROP_CONFLICT_WITH_KNOWLEDGE = 7


def chunk_prefix(title: str, heading: str) -> str:
    return f"[{title} > {heading}]" if heading else f"[{title}]"


class KnowledgeSource:
    name = "knowledge"

    def __init__(self, knowledge: KnowledgeService) -> None:
        self.knowledge = knowledge

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        kb = CandidateBatch(category=SoftCategory.RAG_OR_GRAPH, section=Section.KNOWLEDGE)
        if inp.budget.rag_or_graph <= 0:
            return [kb]
        tk = self.knowledge.tenant(inp.scope.tenant_id)
        graph = self.knowledge.graph(inp.scope.tenant_id)
        if not tk.entries and not len(graph):
            return [kb]
        if tk.entries and inp.query:
            vector = (inp.query_embedding if inp.query_embedding is not None
                      and inp.query_embedding.shape == (self.knowledge.embedder.dim,) else None)
            hits, matched = self.knowledge.search_vector(inp.scope.tenant_id, inp.roles, inp.query, vector, TOP_K)
            kb.knowledge_matched = matched
            hits = [(h, e) for h, e in hits if h.score >= self.knowledge.relevance_threshold]
            for h, e in hits:
                prefix = chunk_prefix(e.title, e.chunk.heading)
                kb.texts.append(f"{prefix} {e.chunk.text}")
                kb.tokens.append(count_tokens_cached(prefix) + e.chunk.tokens + 1)
                kb.sources.append(f"kb:{e.chunk.key}")
                kb.relevance.append(h.score + KNOWLEDGE_BONUS)
            n = len(hits)
            kb.age_s, kb.priority = [0.0] * n, [0.2] * n
        self._graph_candidates(inp, graph, kb)
        return [kb]

    def _graph_candidates(self, inp: BuildInput, graph, kb: CandidateBatch) -> None:
        """A compact neighbourhood of the entities named in the query or the confirmed state."""
        if not len(graph):
            return
        named = set(terms(inp.query)) | {t.strip().lower() for t in inp.query.split()}
        for fact in inp.view.confirmed.values():
            named.add(fact.value.strip().lower())
        seeds = [e for e in sorted(named) if graph.has_entity(e)]
        if not seeds:
            return
        with self.knowledge._lock:
            paths = graph.neighbourhood(seeds, max_hops=2, limit=20, at_ms=inp.now_ms)
        for p in paths:
            text = render_path(p)
            kb.texts.append(text)
            kb.tokens.append(count_tokens_cached(text) + 1)
            kb.sources.append("graph:" + "+".join(str(e.edge_id) for e in p.edges))
            kb.relevance.append(GRAPH_RELEVANCE / len(p.edges))
            kb.age_s.append(0.0)
            kb.priority.append(0.2)


def knowledge_beats_memory(knowledge: KnowledgeService):
    """Resolver run on all batches before selection: a memory on the subject of a packed-candidate
    knowledge chunk is taken out and reported as conflict_with_knowledge."""

    def resolve(batches: list[CandidateBatch]) -> None:
        kb = [(b, i) for b in batches if b.section == Section.KNOWLEDGE for i, s in enumerate(b.sources)
              if s.startswith("kb:")]
        memories = [b for b in batches if b.category == SoftCategory.MEMORIES and len(b)]
        if not kb or not memories:
            return
        kb_bodies = [b.texts[i].split("] ", 1)[-1] for b, i in kb]
        kb_vecs = knowledge.embedder.embed(kb_bodies)
        kb_terms = [term_set(body) for body in kb_bodies]
        for mb in memories:
            mine = [j for j, s in enumerate(mb.sources) if s.startswith("memory:")]
            if not mine:
                continue
            contents = [mb.texts[j].removeprefix("- ") for j in mine]
            sims = knowledge.embedder.embed(contents) @ kb_vecs.T
            out = set()
            for row, j in enumerate(mine):
                mterms = term_set(contents[row])
                overlap = [len(mterms & kt) for kt in kb_terms]
                scores = [max(float(sims[row, c]), (o / len(mterms) if mterms and o >= CONFLICT_MIN_SHARED else 0.0)
                              * CONFLICT_COSINE / CONFLICT_CONTAINMENT) for c, o in enumerate(overlap)]
                best = int(np.argmax(scores))
                b, i = kb[best]
                if scores[best] >= CONFLICT_COSINE and not near_duplicate(contents[row], kb_bodies[best]):
                    out.add(j)
                    mb.dropped.append(SourceDrop(mb.sources[j], mb.category, DROP_CONFLICT_WITH_KNOWLEDGE,
                                                 int(mb.tokens[j]), kept_source=b.sources[i]))
            mb.remove(out)

    return resolve
