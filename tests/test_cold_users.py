"""A user loaded cold (evicted from memory, or after a restart: restored from snapshots and their memory
rows) gets exactly the BuildContext a user still in memory gets: the same items, scores and drops."""

from __future__ import annotations

from sidecar.app import Sidecar
from sidecar.assembly.builder import BuildRequest, BuildResult
from sidecar.clock import now_ms
from sidecar.domain import MemoryType, NewMessage, Role, Scope
from sidecar.memory.service import MemoryInput

SCOPE = Scope("t-cold", "ann")
QUERIES = ("What did I say about the guitar concert?", "Which environment do I want by default?",
           "What does my dog eat?")


def _fill(app: Sidecar) -> None:
    """Sessions of turns and memories (one superseded, one deleted)."""
    turns = {"s0": ["I went to a guitar concert in Lisbon with my sister.", "That sounds like fun, who played?",
                    "By default show me the production dashboards.", "Sure, production it is."],
             "s1": ["My dog Rex only eats salmon kibble.", "Noted: salmon kibble for Rex.",
                    "Changed my mind: show me the staging dashboards by default.", "Staging it is."],
             "s2": ["The guitar concert was loud, my ears rang all night.", "Earplugs help next time.",
                    "I keep my passwords in a paper notebook.", "A password manager is safer."]}
    ids: dict[str, list[str]] = {}
    for k, texts in turns.items():
        sid = app.sessions.create(SCOPE, k, "", {}).session_id
        out = app.sessions.append(SCOPE, sid, [NewMessage(role=Role.USER if i % 2 == 0 else Role.ASSISTANT, text=t,
                                                          client_timestamp_ms=1_684_000_000_000 + j * 86_400_000 + i)
                                               for j, (i, t) in enumerate(enumerate(texts))])
        ids[k] = [m.message_id for m in out]
    app.memories.add(SCOPE, MemoryInput(MemoryType.PREFERENCE, "Default environment: production", "default_env",
                                        [ids["s0"][2]]))
    app.memories.add(SCOPE, MemoryInput(MemoryType.PREFERENCE, "Default environment: staging", "default_env",
                                        [ids["s1"][2]]))
    app.memories.add(SCOPE, MemoryInput(MemoryType.SEMANTIC, "Ann's dog Rex eats salmon kibble", "dog_food",
                                        [ids["s1"][0]]))
    gone = app.memories.add(SCOPE, MemoryInput(MemoryType.SEMANTIC, "Ann keeps passwords in a notebook", "passwords",
                                               [ids["s2"][2]]))
    app.memories.delete(SCOPE, gone.memory.memory_id)  # its source turn leaves recall


def _built(app: Sidecar) -> list:
    """The contexts of QUERIES asked in a session opened now (what a session showed before changes them)."""
    sid = app.sessions.create(SCOPE, "", "", {}).session_id
    out = []
    for query in QUERIES:
        result: BuildResult = app.builder.build(SCOPE, BuildRequest(session_id=sid, query=query))
        out.append(([(kind, [(i.source, i.text, i.score, i.tokens, i.order_key) for i in items])
                     for kind, items in result.sections],
                    [(d.source, d.reason, d.score, d.kept_source) for d in result.dropped], result.total_tokens))
    return out


def _cold(app: Sidecar) -> None:
    app.episodic.evict(SCOPE)
    app.memories.invalidate(SCOPE)
    app.store.evict_user(SCOPE)
    app.builder.forget_user(SCOPE)


def test_a_cold_loaded_user_builds_the_same_context_as_a_warm_one(tmp_path):
    db = str(tmp_path / "cold.duckdb")
    app = Sidecar(db)
    try:
        _fill(app)
        at = now_ms()
        app.builder.clock = lambda: at  # recency scores must not drift between calls
        _cold(app)
        rebuilt = _built(app)  # the index built from rows
        warm = _built(app)
        texts = [text for sections, _, _ in warm for _, items in sections for _, text, *_ in items]
        assert warm == rebuilt and any(t.startswith("[superseded on") for t in texts)  # a marked turn recalled
        assert not any("notebook" in t for t in texts)  # the deleted memory's turn never is
        for _ in range(2):  # restored from its snapshot, then from a snapshot of the restored index
            _cold(app)
            assert _built(app) == warm
    finally:
        app.close()
    again = Sidecar(db)  # a restart: restored from the snapshot saved at close
    again.builder.clock = lambda: at
    try:
        assert again.episodic._snapshots
        assert _built(again) == warm
    finally:
        again.close()
