"""What a user's next question would otherwise pay is made at ingest: an import leaves the user's
recall index with its ranking caches, and the job worker reads a user's turn marks again once an
extraction job has written memories (its settle hook), so the next BuildContext reads no rows."""

from __future__ import annotations

import pytest

from sidecar.app import Sidecar
from sidecar.assembly.builder import BuildRequest
from sidecar.domain import MemoryType, NewMessage, Role, Scope
from sidecar.memory.service import MemoryInput, _turn_marks
from sidecar.services.imports import PastSession

SCOPE = Scope("t-ready", "ann")


@pytest.fixture
def app(tmp_path):
    app = Sidecar(str(tmp_path / "ready.duckdb"))
    yield app
    app.close()


def _texts(app: Sidecar, scope: Scope, query: str) -> list[str]:
    sid = app.sessions.create(scope, "", "", {}).session_id
    result = app.builder.build(scope, BuildRequest(session_id=sid, query=query))
    return [it.text for section in result.packed for it in section.build_items()]


def test_an_import_leaves_the_users_ranking_caches_made(app):
    turns = [f"I planted {plant} in the garden on day {k}." for k, plant in enumerate(["basil", "mint", "tomatoes"] * 8)]
    app.imports.import_sessions(SCOPE, [PastSession([NewMessage(role=Role.USER, text=t, client_timestamp_ms=k + 1)
                                                     for k, t in enumerate(turns[j:j + 4])], session_id=f"s{j}")
                                        for j in range(0, len(turns), 4)])
    index = app.episodic._users[(SCOPE.tenant_id, SCOPE.user_id)]
    assert {"win", "prior", "nbr_rows"} <= set(index._current_caches())
    assert index._said_upto == len(index.words)  # the word-vector stems the user says, all counted
    assert any("mint" in t for t in _texts(app, SCOPE, "When did I plant mint?"))


def test_after_an_extraction_job_the_next_build_reads_no_memory_rows(app, monkeypatch):
    for text in ("By default show me the production dashboards.",
                 "Changed my mind: by default show me the staging dashboards."):
        sid = app.sessions.create(SCOPE, "", "", {}).session_id
        app.sessions.append(SCOPE, sid, [NewMessage(role=Role.USER, text=text),
                                         NewMessage(role=Role.ASSISTANT, text="Noted.")])
        jobs = app.turns.commit(SCOPE, sid, [])
        assert app.worker.wait(SCOPE, jobs, 30)[1]
    state = app.memories._users[(SCOPE.tenant_id, SCOPE.user_id)]
    rows = app.store.list_memories(SCOPE, limit=100, offset=0, types=[], include_inactive=True, now_ms=0)
    assert state.turn_marks and state.turn_marks == _turn_marks(rows)  # made by the worker, as a reader would

    def no_read(*args, **kwargs):
        raise AssertionError("BuildContext read the user's memory rows")

    monkeypatch.setattr(app.store, "list_memories", no_read)
    monkeypatch.setattr(app.store, "memories_with_embeddings", no_read)
    texts = _texts(app, SCOPE, "Which dashboards do I see by default?")
    assert any(t.startswith("[superseded on") and "production" in t for t in texts)


def test_marks_read_while_a_write_lands_are_not_kept(app, monkeypatch):
    """The marks are read from the rows outside the lock: a write landing meanwhile drops them, and the
    read, older than the write, must not put them back."""
    sid = app.sessions.create(SCOPE, "", "", {}).session_id
    first, second = app.sessions.append(SCOPE, sid, [
        NewMessage(role=Role.USER, text="By default show me the production dashboards."),
        NewMessage(role=Role.USER, text="Changed my mind: by default show me the staging dashboards.")])
    app.memories.add(SCOPE, MemoryInput(MemoryType.PREFERENCE, "Default environment: production", "default_env",
                                        [first.message_id]))
    app.memories.add(SCOPE, MemoryInput(MemoryType.PREFERENCE, "Default environment: staging", "default_env",
                                        [second.message_id]))
    state = app.memories.user(SCOPE)
    state.turn_marks = None
    read = app.store.list_memories

    def read_then_write(*args, **kwargs):
        rows = read(*args, **kwargs)  # the rows before the write below
        app.memories.add(SCOPE, MemoryInput(MemoryType.PREFERENCE, "Default environment: qa", "default_env", []))
        return rows

    monkeypatch.setattr(app.store, "list_memories", read_then_write)
    stale = app.memories.superseded_turns(SCOPE)
    assert "staging" in next(iter(stale.values())).by and state.turn_marks is None
    monkeypatch.setattr(app.store, "list_memories", read)
    assert "qa" in next(iter(app.memories.superseded_turns(SCOPE).values())).by
