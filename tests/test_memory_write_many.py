"""MemoryService.write_many: an extraction job's candidates decided as writes one after another would
be (merged into a memory written just before, superseding one, outranked, rejected), stored in one
transaction: all or none, and a retry after a failed commit writes each once."""

from __future__ import annotations

import pytest

from sidecar.app import Sidecar
from sidecar.domain import Authority, MemoryStatus, MemoryType, Scope
from sidecar.memory.service import MemoryInput
from sidecar.textmodel import Turn

SCOPE = Scope("t", "u")
P, S = MemoryType.PREFERENCE, MemoryType.SEMANTIC

STORED = [
    MemoryInput(S, "The payment-api runs in the eu-west-1 region", subject="payment-api region",
                source_message_ids=["m0"]),
    MemoryInput(P, "Answers should be short and in English", subject="answer style", source_message_ids=["m1"]),
]

# One job's candidates: each kind of decision, several of them about what the same job wrote before.
JOB = [
    MemoryInput(P, "I prefer dark mode in every editor", subject="editor theme", source_message_ids=["m2"]),
    MemoryInput(P, "I prefer dark mode in every editor", subject="editor theme", source_message_ids=["m3"]),
    MemoryInput(P, "I prefer light mode in every editor now", subject="editor theme", source_message_ids=["m4"]),
    MemoryInput(S, "The payment-api runs in the eu-west-1 region", subject="payment-api region",
                source_message_ids=["m5"]),
    MemoryInput(P, "Answers may be long when I ask for detail", subject="answer style",
                authority=Authority.INFERRED, source_message_ids=["m6"]),
    MemoryInput(S, "The staging password is Hunter2-Xq9!vT7#", source_message_ids=["m7"]),
    MemoryInput(S, "The payment-api moved to the us-east-2 region", subject="payment-api region",
                source_message_ids=["m8"]),
    MemoryInput(S, "Deploys of the ledger service need a second reviewer", subject="ledger deploys",
                source_message_ids=["m9"]),
]


def _app(tmp_path, name: str) -> Sidecar:
    app = Sidecar(str(tmp_path / f"{name}.duckdb"))
    for inp in STORED:
        app.memories.write(SCOPE, inp)
    return app


def _stored(app: Sidecar) -> list[tuple]:
    """Every row and its history, ids replaced by contents (ids are random)."""
    rows = [m for m, _ in app.store.memories_with_embeddings(SCOPE)]
    content = {m.memory_id: m.content for m in rows}
    return sorted((m.content, m.type, m.subject, m.status, content.get(m.superseded_by, ""),
                   tuple(m.source_message_ids), round(m.confidence, 6), m.authority,
                   tuple(h.action for h in app.store.memory_history(SCOPE, m.memory_id))) for m in rows)


def _state(app: Sidecar) -> tuple:
    state = app.memories.user(SCOPE)
    active = sorted((m.content, tuple(m.source_message_ids)) for m in state.active.values())
    return active, sorted(len(v) for v in state.superseded.values() if v)


def _outcomes(results) -> list[tuple[str, str, str]]:
    return [(r.outcome, r.reason, r.memory.content if r.memory else "") for r in results]


def test_a_jobs_candidates_are_decided_as_one_write_after_another(tmp_path):
    one_by_one, batched = _app(tmp_path, "one"), _app(tmp_path, "batched")
    try:
        singly = [one_by_one.memories.write(SCOPE, inp) for inp in JOB]
        together = batched.memories.write_many(SCOPE, JOB)
        assert _outcomes(together) == _outcomes(singly)
        assert [o for o, _, _ in _outcomes(together)] == [
            "created", "merged", "superseded_older", "merged", "rejected", "rejected", "superseded_older",
            "created"]
        assert _stored(batched) == _stored(one_by_one)
        assert _state(batched) == _state(one_by_one)
        # The state is the stored rows: a reload reads the same.
        batched.memories.invalidate(SCOPE)
        assert _state(batched) == _state(one_by_one)
    finally:
        one_by_one.close()
        batched.close()


def test_a_failed_commit_stores_none_and_the_retry_writes_each_once(tmp_path):
    app = _app(tmp_path, "fail")
    try:
        before_rows, before_state = _stored(app), _state(app)
        put = app.store.put_memories
        calls: list[int] = []

        def failing(scope, rows, changes):
            calls.append(len(rows))
            raise OSError("disk full")

        app.store.put_memories = failing
        with pytest.raises(OSError):
            app.memories.write_many(SCOPE, JOB)
        assert len(calls) == 1  # the whole job in one transaction
        assert _stored(app) == before_rows and _state(app) == before_state
        app.store.put_memories = put
        retried = app.memories.write_many(SCOPE, JOB)
        assert [r.outcome for r in retried][:3] == ["created", "merged", "superseded_older"]
        dark = [m for m, _ in app.store.memories_with_embeddings(SCOPE) if m.content.startswith("I prefer dark")]
        assert len(dark) == 1 and dark[0].status == MemoryStatus.SUPERSEDED
        assert dark[0].source_message_ids == ["m2", "m3"]
    finally:
        app.close()


def test_an_extraction_job_stores_its_memories_in_one_transaction(tmp_path):
    app = Sidecar(str(tmp_path / "job.duckdb"))
    try:
        put = app.store.put_memories
        calls: list[int] = []

        def counted(scope, rows, changes):
            calls.append(len(rows))
            return put(scope, rows, changes)

        app.store.put_memories = counted
        counts = app.extraction.run(SCOPE, [
            Turn("m1", "user", "I prefer answers in bullet points."),
            Turn("m2", "user", "I always use vim for editing config files."),
            Turn("m3", "user", "My team owns the ledger service and the payment-api."),
        ])
        written = sum(counts[k] for k in ("created", "merged", "superseded_older"))
        assert written >= 2 and calls == [written]
        assert len(app.store.memories_with_embeddings(SCOPE)) == written
    finally:
        app.close()
