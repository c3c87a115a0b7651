"""The sidecar's object graph: one store, the services over it, the job worker. The gRPC servicer
holds one Sidecar; tests and benches build one directly."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from sidecar import text_caches
from sidecar.assembly.builder import ContextBuilder
from sidecar.assembly.message_source import MessageSource
from sidecar.assembly.prompt_cache import prompt_head
from sidecar.compress.service import SUMMARY_JOB, CompressionService, CompressionSettings
from sidecar.compress.sources import SummarySource, ToolObservationSource, pinned_items
from sidecar.compress.summarize import ExtractiveSummarizer, LLMSummarizer, Summarizer
from sidecar.domain import Scope
from sidecar.idempotency import Idempotency
from sidecar.index.embedders import Embedder, HashEmbedder, make_embedder
from sidecar.index.word_vectors import StaticEmbedder
from sidecar.jobs import JobWorker, requeue_interrupted
from sidecar.knowledge.service import INDEX_JOB, KnowledgeService
from sidecar.knowledge.source import KnowledgeSource, knowledge_beats_memory
from sidecar.llm import ChatClient
from sidecar.memory.episodic import MAX_SNAPSHOT_BYTES, MAX_TOTAL_TURNS, EpisodicSource
from sidecar.memory.extract import Extractor, LLMExtractor, RuleBasedExtractor
from sidecar.memory.pipeline import EXTRACT_JOB, ExtractionPipeline
from sidecar.memory.service import MemoryService
from sidecar.memory.source import MemorySource
from sidecar.services.deletion import DeletionService
from sidecar.services.facts import FactService
from sidecar.services.imports import ImportService
from sidecar.services.pinned import PinnedService
from sidecar.services.runs import RunService
from sidecar.services.sessions import SessionService
from sidecar.services.turns import TurnService
from sidecar.store import is_postgres, open_store
from sidecar.store.cache import MAX_CACHED_VIEW_MESSAGES
from sidecar.store.duckdb_store import DEFAULT_MEMORY_LIMIT

log = logging.getLogger("sidecar")

# After-turn jobs claimed per transaction (sidecar.jobs); indexing jobs are long, claimed one at a time.
JOB_BATCH = 64

# Change kinds keyed by a session id: the cached view of that session is stale.
SESSION_CHANGES = frozenset({"message", "facts", "session", "tool_result", "run_notes", "summary", "subsession"})


@dataclass(frozen=True, slots=True)
class Settings:
    embedder: str = "hash"
    min_confidence: float = 0.7
    job_poll_s: float = 1.0
    compression: CompressionSettings = CompressionSettings()
    knowledge_threshold: float = 0.2
    feed_poll_ms: int = 500
    index_save_every_s: float = 30.0
    # Memory bounds of the in-process caches (a pod has a memory limit): messages held by the cached
    # session views, and past turns held by the episodic index over all users.
    cache_messages: int = MAX_CACHED_VIEW_MESSAGES
    episodic_turns: int = MAX_TOTAL_TURNS
    episodic_snapshot_bytes: int = MAX_SNAPSHOT_BYTES  # users' saved episodic indexes beside a DuckDB file
    episodic_snapshot_dir: str = ""  # where they are saved instead (needed for any on PostgreSQL)
    duckdb_memory: str = DEFAULT_MEMORY_LIMIT  # DuckDB's buffer pool


def default_extractor() -> Extractor:
    """The rule-based extractor, or an LLM one when SIDECAR_LLM_BASE_URL points at an endpoint."""
    client = ChatClient.from_env()
    return LLMExtractor(client, fallback=RuleBasedExtractor()) if client else RuleBasedExtractor()


def default_summarizer() -> Summarizer:
    """The extractive summarizer, or an LLM one (falling back to extractive) when an endpoint is set."""
    client = ChatClient.from_env()
    return LLMSummarizer(client, fallback=ExtractiveSummarizer()) if client else ExtractiveSummarizer()


class Sidecar:
    def __init__(self, db_path: str, settings: Settings = Settings(), *, embedder: Embedder | None = None,
                 extractor: Extractor | None = None, summarizer: Summarizer | None = None) -> None:
        self.settings = settings
        self.store = open_store(db_path, cache_messages=settings.cache_messages,
                                duckdb_memory=settings.duckdb_memory)
        self.embedder = embedder or make_embedder(settings.embedder)
        self.sessions = SessionService(self.store)
        self.idempotency = Idempotency(self.store)
        self.facts = FactService(self.sessions)
        self.runs = RunService(self.sessions)
        self.pinned = PinnedService(self.sessions)
        self.memories = MemoryService(self.store, self.embedder, on_forget=[self._evict_user])
        self.extraction = ExtractionPipeline(self.store, self.memories, extractor or default_extractor(),
                                             min_confidence=settings.min_confidence)
        self.compression = CompressionService(self.sessions, self.facts, self.runs, settings.compression,
                                              summarizer or default_summarizer())
        self.worker = JobWorker(self.store, {EXTRACT_JOB: self.extraction.handle,
                                             SUMMARY_JOB: self.compression.handle_summary_job},
                                poll_s=settings.job_poll_s, batch=JOB_BATCH,
                                prefetch={EXTRACT_JOB: self.extraction.prefetch},
                                settle={EXTRACT_JOB: self.extraction.settle},
                                commit={EXTRACT_JOB: self.extraction.commit})
        # A sub-agent's chatter is not the user's word: its turns are summarised, never made memories.
        self.turns = TurnService(self.sessions, self.worker, [EXTRACT_JOB, SUMMARY_JOB],
                                 subsession_job_kinds=[SUMMARY_JOB],
                                 needed_by_whole_session={SUMMARY_JOB: self.compression.may_fold})
        index_dir = None if db_path == ":memory:" or is_postgres(db_path) else Path(db_path).with_suffix(".indexes")
        self.knowledge = KnowledgeService(self.store, self.embedder, index_dir,
                                          relevance_threshold=settings.knowledge_threshold)
        # Indexing has its own worker so a large document never delays memory extraction.
        self.kb_worker = JobWorker(self.store, {INDEX_JOB: self.knowledge.handle_index_job},
                                   poll_s=settings.job_poll_s, name="kb-indexer")
        self.knowledge.worker = self.kb_worker
        self.builder = ContextBuilder(
            self.sessions,
            [MessageSource(), SummarySource(), ToolObservationSource(self.store), MemorySource(self.memories),
             KnowledgeSource(self.knowledge)],
            pinned=partial(pinned_items, self.pinned), resolvers=[knowledge_beats_memory(self.knowledge)],
            query_embedder=None if isinstance(self.embedder, HashEmbedder) else self.embedder)
        # Episodic recall: the user's past turns from other sessions, indexed as they are appended.
        self.episodic = EpisodicSource(self.store, max_total_turns=settings.episodic_turns,
                                       max_snapshot_bytes=settings.episodic_snapshot_bytes,
                                       snapshots_in=settings.episodic_snapshot_dir)
        if not isinstance(self.embedder, HashEmbedder):  # a model: past turns ranked with its cosine too
            self.episodic.use_model(self.embedder)
        self.builder.sources.append(self.episodic)
        self.compression.head_moved = lambda scope, view: self.builder.prompts.head_moved(
            (scope.tenant_id, scope.user_id, view.session.session_id), prompt_head(view))
        self.store.append_listeners.append(self.episodic.on_append)
        # An import's jobs start while its turns are indexed: what either does off the GIL (DuckDB's
        # writes, the index's compiled loops) runs beside the other.
        self.store.import_listeners.append(lambda scope, imported: self.worker.notify())
        self.store.import_listeners.append(self.episodic.on_import)
        self.memories.on_forget(self.episodic.forget)
        self.memories.on_delete(self.episodic.exclude)
        self.episodic.superseded_turns = self.memories.superseded_turns
        self.builder.recall_epoch += [self.memories.generation, self.episodic.generation,
                                      lambda scope: self.knowledge.generation(scope.tenant_id)]
        self.memories.on_delete(lambda scope, ids: text_caches.clear(self.embedder))
        self.memories.on_delete(lambda scope, ids: self.builder.forget_user(scope))
        self.memories.on_forget(self._clear_text_caches)
        self.memories.on_forget(self.builder.forget_user)
        self.imports = ImportService(self.sessions, self.turns, view_jobs=[SUMMARY_JOB])
        self.deletion = DeletionService(self.sessions, self.memories, self.episodic, self.builder)
        requeue_interrupted(self.store)
        self.worker.start()
        self.kb_worker.start()
        self.knowledge.start_saver(settings.index_save_every_s)
        self._episodic_warm_up = threading.Thread(target=self.episodic.warm_up, name="episodic-warm-up", daemon=True)
        self._warm_ups = (threading.Thread(target=self.knowledge.warm_up, name="kb-warm-up", daemon=True),
                          self._episodic_warm_up)
        for thread in self._warm_ups:
            thread.start()
        self.feed = self._follow_other_replicas()

    def wait_warm_up(self, timeout_s: float) -> bool:
        """Wait, at most timeout_s in all, for the start-up work (word tables, index loads) run on
        background threads; whether it finished. Calls served meanwhile compete with it for the GIL."""
        deadline = time.monotonic() + timeout_s
        for thread in self._warm_ups:
            thread.join(max(deadline - time.monotonic(), 0.0))
        return not any(thread.is_alive() for thread in self._warm_ups)

    @property
    def queries_hold_the_gil(self) -> bool:
        """True when queries are embedded by the compiled hash and the static word vectors
        (microseconds, under the GIL). A model embeds in torch (milliseconds with the GIL released),
        which threads can overlap."""
        return self.embedder.name == HashEmbedder.name and isinstance(self.episodic.embedder, StaticEmbedder)

    def _follow_other_replicas(self):
        """On a shared PostgreSQL store, other replicas' writes arrive through the change feed and
        evict or refresh this process's caches and indexes."""
        backend = self.store.backend
        if not hasattr(backend, "changes_since"):
            return None
        from sidecar.store.change_feed import ChangeFeed

        # From where the episodic snapshots were checked at start, so no change between is missed.
        feed = ChangeFeed(backend, self._apply_changes, poll_interval_ms=self.settings.feed_poll_ms,
                          since=self.episodic.feed_from)
        feed.start()
        return feed

    def _apply_changes(self, changes) -> None:
        own = self.store.backend.origin
        for c in changes:
            if c.origin == own:
                continue
            scope = Scope(c.tenant_id, c.user_id)
            if c.kind in SESSION_CHANGES:
                self.store.evict_session(scope, c.key)
                if c.kind == "message":
                    self.episodic.forget(scope)  # rebuilt from rows with the other replica's turns
            elif c.kind in ("memory", "memory_delete"):
                self.memories.invalidate(scope)
                if c.kind == "memory_delete":
                    self.episodic.forget(scope)  # its source turns may have left recall
            elif c.kind == "recall":
                self.episodic.forget(scope)  # rebuilt from rows without the excluded turns
            elif c.kind == "forget":
                self.memories.invalidate(scope)
                self.episodic.forget(scope)
                self.store.evict_user(scope)
            elif c.kind in ("kb_document", "kb_edges"):
                self.knowledge.refresh(c.tenant_id, graph=c.kind == "kb_edges")

    def queue_depth(self) -> float:
        return float(self.store.queue_depth())

    def _clear_text_caches(self, scope) -> dict[str, int]:
        text_caches.clear(self.embedder)
        return {}

    def _evict_user(self, scope) -> dict[str, int]:
        self.store.evict_user(scope)
        return {}

    def close(self) -> None:
        if self.feed is not None:
            self.feed.close()
        self.worker.stop()
        self.kb_worker.stop()
        self.knowledge.stop_saver()
        # Its numpy work must not outlive the interpreter (a daemon thread inside BLAS at exit can crash
        # it); told to stop, it ends within one block (~30 ms).
        self.episodic.close(self.feed.cursor if self.feed is not None else None)
        self._episodic_warm_up.join(timeout=10)
        self.knowledge.save()
        self.store.close()
