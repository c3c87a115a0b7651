"""The sidecar's object graph: one store, the services over it. The gRPC servicer holds one."""

from __future__ import annotations

import logging

from sidecar.assembly.builder import ContextBuilder
from sidecar.assembly.message_source import MessageSource
from sidecar.services.facts import FactService
from sidecar.services.runs import RunService
from sidecar.services.sessions import SessionService
from sidecar.store import open_store

log = logging.getLogger("sidecar")


class Sidecar:
    def __init__(self, db_path: str) -> None:
        self.store = open_store(db_path)
        self.sessions = SessionService(self.store)
        self.facts = FactService(self.sessions)
        self.runs = RunService(self.sessions)
        self.builder = ContextBuilder(self.sessions, [MessageSource()])

    def close(self) -> None:
        self.store.close()
