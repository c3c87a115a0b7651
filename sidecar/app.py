"""The sidecar's object graph: one store, the services over it, the job worker. The gRPC servicer
holds one Sidecar; tests and benches build one directly."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sidecar.assembly.builder import ContextBuilder
from sidecar.assembly.message_source import MessageSource
from sidecar.index.embedders import Embedder, make_embedder
from sidecar.jobs import JobWorker
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
        self.worker = JobWorker(self.store, {EXTRACT_JOB: self.extraction.handle}, poll_s=settings.job_poll_s)
        self.turns = TurnService(self.sessions, self.worker, [EXTRACT_JOB])
        self.builder = ContextBuilder(self.sessions, [MessageSource(), MemorySource(self.memories)])
        self.worker.start()

    def _evict_user(self, scope) -> dict[str, int]:
        self.store.evict_user(scope)
        return {}

    def close(self) -> None:
        self.worker.stop()
        self.store.close()
