"""The sidecar's object graph: one store, the services over it, the job worker. The gRPC servicer
holds one Sidecar; tests and benches build one directly."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from sidecar.assembly.builder import ContextBuilder
from sidecar.assembly.message_source import MessageSource
from sidecar.compress.service import SUMMARY_JOB, CompressionService, CompressionSettings
from sidecar.compress.sources import SummarySource, ToolObservationSource, pinned_items
from sidecar.index.embedders import Embedder, make_embedder
from sidecar.jobs import JobWorker, requeue_interrupted
from sidecar.knowledge.service import INDEX_JOB, KnowledgeService
from sidecar.knowledge.source import KnowledgeSource, knowledge_beats_memory
from sidecar.llm import ChatClient
from sidecar.memory.extract import Extractor, LLMExtractor, RuleBasedExtractor
from sidecar.memory.pipeline import EXTRACT_JOB, ExtractionPipeline
from sidecar.memory.service import MemoryService
from sidecar.memory.source import MemorySource
from sidecar.services.facts import FactService
from sidecar.services.runs import RunService
from sidecar.services.sessions import SessionService
from sidecar.services.turns import TurnService
from sidecar.store import open_store

log = logging.getLogger("sidecar")


@dataclass(frozen=True, slots=True)
class Settings:
    embedder: str = "hash"
    min_confidence: float = 0.7
    job_poll_s: float = 1.0
    compression: CompressionSettings = CompressionSettings()
    knowledge_threshold: float = 0.2


def default_extractor() -> Extractor:
    """The rule-based extractor, or an LLM one when SIDECAR_LLM_BASE_URL points at an endpoint."""
    client = ChatClient.from_env()
    return LLMExtractor(client, fallback=RuleBasedExtractor()) if client else RuleBasedExtractor()


class Sidecar:
    def __init__(self, db_path: str, settings: Settings = Settings(), *, embedder: Embedder | None = None,
                 extractor: Extractor | None = None) -> None:
        self.settings = settings
        self.store = open_store(db_path)
        self.embedder = embedder or make_embedder(settings.embedder)
        self.sessions = SessionService(self.store)
        self.facts = FactService(self.sessions)
        self.runs = RunService(self.sessions)
        self.memories = MemoryService(self.store, self.embedder, on_forget=[self._evict_user])
        self.extraction = ExtractionPipeline(self.store, self.memories, extractor or default_extractor(),
                                             min_confidence=settings.min_confidence)
        self.compression = CompressionService(self.sessions, self.facts, settings.compression)
        self.worker = JobWorker(self.store, {EXTRACT_JOB: self.extraction.handle,
                                             SUMMARY_JOB: self.compression.handle_summary_job},
                                poll_s=settings.job_poll_s)
        # A sub-agent's chatter is not the user's word: its turns are summarised, never made memories.
        self.turns = TurnService(self.sessions, self.worker, [EXTRACT_JOB, SUMMARY_JOB],
                                 subsession_job_kinds=[SUMMARY_JOB])
        index_dir = None if db_path == ":memory:" else Path(db_path).with_suffix(".indexes")
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
            pinned=pinned_items, resolvers=[knowledge_beats_memory(self.knowledge)])
        requeue_interrupted(self.store)
        self.worker.start()
        self.kb_worker.start()
        threading.Thread(target=self.knowledge.warm_up, name="kb-warm-up", daemon=True).start()

    def queue_depth(self) -> float:
        return float(self.store.queue_depth())

    def _evict_user(self, scope) -> dict[str, int]:
        self.store.evict_user(scope)
        return {}

    def close(self) -> None:
        self.worker.stop()
        self.kb_worker.stop()
        self.knowledge.save()
        self.store.close()
