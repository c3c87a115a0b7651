"""A user's memory state and recall index are loaded (from rows or a snapshot) without holding their
service's lock: calls for other users do not wait behind the read, and a change that lands while the
rows are read (a write, a deletion, new turns, a forget) is never lost or undone by the load that was
in flight."""

from __future__ import annotations

import threading

import pytest

from sidecar.app import Sidecar
from sidecar.domain import MemoryType, NewMessage, Role, Scope
from sidecar.memory.episodic import source as episodic_source
from sidecar.memory.service import MemoryInput
from sidecar.services.imports import PastSession

ANN, BOB = Scope("t-load", "ann"), Scope("t-load", "bob")
WAIT_S = 10.0


@pytest.fixture
def app(tmp_path):
    app = Sidecar(str(tmp_path / "load.duckdb"))
    yield app
    app.close()


def _add(app: Sidecar, scope: Scope, text: str) -> str:
    return app.memories.add(scope, MemoryInput(type=MemoryType.SEMANTIC, content=text)).memory.memory_id


def _hold_read(app: Sidecar, monkeypatch, scope: Scope, during=None, method: str = "memories_with_embeddings"
               ) -> tuple[threading.Event, threading.Event]:
    """Patch the store so that `scope`'s first read by `method`, once its rows are read, signals
    `reading` and waits for `go` (running `during()` first, if given) before it returns them."""
    reading, go = threading.Event(), threading.Event()
    real = getattr(app.store, method)

    def read(s: Scope, *args):
        rows = real(s, *args)
        if s == scope and not reading.is_set():
            reading.set()
            if during is not None:
                during()
            assert go.wait(WAIT_S)
        return rows

    monkeypatch.setattr(app.store, method, read)
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


def _say(app: Sidecar, scope: Scope, *texts: str) -> list[str]:
    sid = app.sessions.create(scope, "", "", {}).session_id
    return [m.message_id for m in app.sessions.append(scope, sid, [NewMessage(role=Role.USER, text=t) for t in texts])]


def _recalled(app: Sidecar, scope: Scope, query: str) -> list[str]:
    state, rows, _ = app.episodic.search(scope, query, "", 4000)
    return [state.texts[r].split(": ", 1)[1] for r in rows.tolist()]  # without the speaker


def _bob_recalls_meanwhile(app: Sidecar, reading: threading.Event, go: threading.Event) -> None:
    """Once Ann's read is held, Bob's recall completes; then Ann's read goes on."""
    assert reading.wait(WAIT_S)
    other, found = _in_thread(lambda: _recalled(app, BOB, "payment service deploy"))
    other.join(WAIT_S)
    assert not other.is_alive() and found[0] == ["I deploy the payment service on Fridays."]
    go.set()


RIVER = ["I kayaked down the Colorado river last June.", "My kayak is a red Perception Pescador."]


@pytest.mark.parametrize("source", ["rows", "snapshot"])
def test_a_cold_users_recall_index_load_does_not_hold_up_other_users(app, monkeypatch, source):
    _say(app, ANN, *RIVER)
    _say(app, BOB, "I deploy the payment service on Fridays.")
    assert _recalled(app, BOB, "payment service deploy")  # Bob is in memory
    if source == "rows":
        app.episodic.drop_user(ANN)
        reading, go = _hold_read(app, monkeypatch, ANN, method="list_user_messages")
    else:
        app.episodic.evict(ANN)  # saved: restored on the next call, held once its file is mapped
        reading, go = threading.Event(), threading.Event()
        real = episodic_source.map_snapshot

        def mapped(path):
            out = real(path)
            reading.set()
            assert go.wait(WAIT_S)
            return out
        monkeypatch.setattr(episodic_source, "map_snapshot", mapped)
    loader, loaded = _in_thread(lambda: _recalled(app, ANN, "kayak river"))
    _bob_recalls_meanwhile(app, reading, go)
    loader.join(WAIT_S)
    assert sorted(loaded[0]) == sorted(RIVER)


def test_an_imports_index_build_does_not_hold_up_other_users(app, monkeypatch):
    """ImportSessions builds the user's recall index (from the imported turns once the store says they
    are all the user has; else from rows); other users' recall goes on meanwhile, and the import's
    user is in memory, caches made."""
    _say(app, BOB, "I deploy the payment service on Fridays.")
    assert _recalled(app, BOB, "payment service deploy")
    reading, go = _hold_read(app, monkeypatch, ANN, method="user_message_ids")
    importer, _ = _in_thread(lambda: app.imports.import_sessions(
        ANN, [PastSession(messages=[NewMessage(role=Role.USER, text=t) for t in RIVER])]))
    _bob_recalls_meanwhile(app, reading, go)
    importer.join(WAIT_S)
    assert not importer.is_alive() and app.episodic.indexed(ANN) == 2
    state = app.episodic._users[(ANN.tenant_id, ANN.user_id)]
    assert len(state._nbr_rows) == 2  # warmed before it was kept
    assert sorted(_recalled(app, ANN, "kayak river")) == sorted(RIVER)


@pytest.mark.parametrize("change", ["append", "exclude", "forget"])
def test_a_change_landing_during_a_recall_index_load_is_kept(app, monkeypatch, change):
    ids = _say(app, ANN, *RIVER)
    learnt = app.memories.add(ANN, MemoryInput(type=MemoryType.EPISODE, content=RIVER[0],
                                               source_message_ids=[ids[0]])).memory.memory_id
    app.episodic.drop_user(ANN)

    def during():
        def act():
            if change == "append":
                _say(app, ANN, "Next summer I will kayak the Snake river.")
            elif change == "exclude":  # forgetting a memory takes the turn it was learnt from out of recall
                app.memories.delete(ANN, learnt)
            else:
                app.memories.forget_user(ANN)
        thread, _ = _in_thread(act)
        thread.join(WAIT_S)
        assert not thread.is_alive()  # the change did not wait for the load

    reading, go = _hold_read(app, monkeypatch, ANN, during, method="list_user_messages")
    go.set()
    recalled = _recalled(app, ANN, "kayak river")
    assert reading.is_set()
    expected = {"append": [*RIVER, "Next summer I will kayak the Snake river."], "exclude": RIVER[1:], "forget": []}
    assert sorted(recalled) == sorted(expected[change])
