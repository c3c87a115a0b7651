"""A user's memory state is loaded from their rows without holding the service's lock: calls for
other users do not wait behind the read, and a change that lands while the rows are read (a write,
a deletion, a forget) is never lost or undone by the load that was in flight."""

from __future__ import annotations

import threading

import pytest

from sidecar.app import Sidecar
from sidecar.domain import MemoryType, Scope
from sidecar.memory.service import MemoryInput

ANN, BOB = Scope("t-load", "ann"), Scope("t-load", "bob")
WAIT_S = 10.0


@pytest.fixture
def app(tmp_path):
    app = Sidecar(str(tmp_path / "load.duckdb"))
    yield app
    app.close()


def _add(app: Sidecar, scope: Scope, text: str) -> str:
    return app.memories.add(scope, MemoryInput(type=MemoryType.SEMANTIC, content=text)).memory.memory_id


def _hold_read(app: Sidecar, monkeypatch, scope: Scope, during=None) -> tuple[threading.Event, threading.Event]:
    """Patch the store so that `scope`'s memory read, once its rows are read, signals `reading` and
    waits for `go` (running `during()` first, if given) before it returns them."""
    reading, go = threading.Event(), threading.Event()
    real = app.store.memories_with_embeddings

    def read(s: Scope):
        rows = real(s)
        if s == scope and not reading.is_set():
            reading.set()
            if during is not None:
                during()
            assert go.wait(WAIT_S)
        return rows

    monkeypatch.setattr(app.store, "memories_with_embeddings", read)
    return reading, go


def _in_thread(fn) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    thread.start()
    return thread, out


def test_a_cold_users_load_does_not_hold_up_other_users(app, monkeypatch):
    _add(app, ANN, "Ann's dog Rex eats salmon kibble.")
    _add(app, BOB, "Bob deploys the payment service on Fridays.")
    app.memories.search(BOB, "payment service", None, [], 5, 0.0)  # Bob is in memory
    app.memories.invalidate(ANN)  # Ann is not
    reading, go = _hold_read(app, monkeypatch, ANN)
    loader, loaded = _in_thread(lambda: app.memories.user(ANN))
    assert reading.wait(WAIT_S)
    # While Ann's rows are being read: Bob searches, writes and is forgotten about nothing of Ann's.
    other, found = _in_thread(lambda: app.memories.search(BOB, "payment service", None, [], 5, 0.0))
    other.join(WAIT_S)
    assert not other.is_alive() and [h.memory.content for h in found[0]] == ["Bob deploys the payment service on Fridays."]
    writer, _ = _in_thread(lambda: _add(app, BOB, "Bob's on-call week starts on Monday."))
    writer.join(WAIT_S)
    assert not writer.is_alive()
    go.set()
    loader.join(WAIT_S)
    assert [m.content for m in loaded[0].active.values()] == ["Ann's dog Rex eats salmon kibble."]


@pytest.mark.parametrize("change", ["delete", "forget", "write"])
def test_a_change_landing_during_a_load_is_kept(app, monkeypatch, change):
    kept = _add(app, ANN, "Ann's dog Rex eats salmon kibble.")
    gone = _add(app, ANN, "Ann keeps her bicycle in the basement.")
    app.memories.invalidate(ANN)
    written: list[str] = []

    def during():  # runs on another thread while the loader holds the rows read before it
        def act():
            if change == "delete":
                app.memories.delete(ANN, gone)
            elif change == "forget":
                app.memories.forget_user(ANN)
            else:
                written.append(_add(app, ANN, "Ann moved to Denver in May."))
        thread, _ = _in_thread(act)
        thread.join(WAIT_S)
        assert not thread.is_alive()  # the change did not wait for the load

    reading, go = _hold_read(app, monkeypatch, ANN, during)
    go.set()
    state = app.memories.user(ANN)
    assert reading.is_set()
    expected = {"delete": {kept}, "forget": set(), "write": {kept, gone, *written}}[change]
    assert set(state.active) == expected
    assert set(app.memories.user(ANN).active) == expected
    hits = {h.memory.memory_id for h in app.memories.search(ANN, "bicycle basement", None, [], 10, 0.0)}
    assert (gone in hits) == (change == "write")


def test_concurrent_first_calls_of_one_user_share_one_state(app):
    _add(app, ANN, "Ann's dog Rex eats salmon kibble.")
    app.memories.invalidate(ANN)
    states: list = []
    threads = [threading.Thread(target=lambda: states.append(app.memories.user(ANN))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert len(states) == 8 and all(s is states[0] for s in states)
    assert states[0] is app.memories.user(ANN)
