"""A write stuck in its database commit must not stall reads of other sessions or users: the
backend call is held open with an event, and BuildContext and SearchMemories for someone else
still answer. Deterministic: no timing thresholds, only whether the read finishes while the
write is provably still inside the database."""

from __future__ import annotations

import threading

import pytest

from sidecar.app import Sidecar
from sidecar.assembly.builder import BuildRequest
from sidecar.domain import MemoryType, NewMessage, Role, Scope
from sidecar.memory.service import MemoryInput

HELD_S = 20.0  # the write is released by the test long before this; a read that waits this long failed


@pytest.fixture
def app(tmp_path):
    a = Sidecar(str(tmp_path / "w.duckdb"))
    yield a
    a.close()


def hold(obj, name: str):
    """Wrap obj.name so that the call blocks inside until released; returns (entered, release)."""
    original = getattr(obj, name)
    entered, release = threading.Event(), threading.Event()

    def held(*args, **kwargs):
        entered.set()
        assert release.wait(HELD_S)
        return original(*args, **kwargs)

    setattr(obj, name, held)
    return entered, release


def in_thread(fn) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def read_while_held(entered: threading.Event, release: threading.Event, writer: threading.Thread, read) -> None:
    assert entered.wait(HELD_S), "the write never reached the database"
    done = threading.Event()
    result = []
    in_thread(lambda: (result.append(read()), done.set()))
    finished = done.wait(HELD_S)
    still_writing = writer.is_alive()
    release.set()
    writer.join(HELD_S)
    assert finished and still_writing, "the read waited for another session's commit"
    assert result[0] is not None


def test_build_context_does_not_wait_for_another_sessions_append(app):
    alice, bob = Scope("t", "alice"), Scope("t", "bob")
    a_sid = app.sessions.create(alice, "a", "", {}).session_id
    b_sid = app.sessions.create(bob, "b", "", {}).session_id
    app.sessions.append(alice, a_sid, [NewMessage(role=Role.USER, text="the payment-api returns 5xx")])
    app.sessions.append(bob, b_sid, [NewMessage(role=Role.USER, text="warm up")])
    app.builder.build(alice, BuildRequest(session_id=a_sid, query="5xx"))  # views and indexes loaded
    entered, release = hold(app.store.backend, "append_messages")
    writer = in_thread(lambda: app.sessions.append(bob, b_sid, [NewMessage(role=Role.USER, text="more")]))
    read_while_held(entered, release, writer,
                    lambda: app.builder.build(alice, BuildRequest(session_id=a_sid, query="payment-api 5xx")))
    # the held write landed, in the cache too
    assert [m.text for m in app.store.list_messages(bob, b_sid)] == ["warm up", "more"]


def test_memory_reads_do_not_wait_for_another_users_memory_write(app):
    alice, bob = Scope("t", "alice"), Scope("t", "bob")
    app.memories.write(alice, MemoryInput(MemoryType.PREFERENCE, "Prefers concise answers", subject="style"))
    app.memories.write(bob, MemoryInput(MemoryType.SEMANTIC, "Works on the ledger service"))
    entered, release = hold(app.store, "put_memories")
    writer = in_thread(lambda: app.memories.write(bob, MemoryInput(MemoryType.SEMANTIC, "Owns the payment-db")))
    read_while_held(entered, release, writer, lambda: app.memories.search(alice, "concise", None, (), 5, 0.0))
    assert any("payment-db" in h.memory.content for h in app.memories.search(bob, "payment-db", None, (), 5, 0.0))
