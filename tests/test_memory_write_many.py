"""MemoryService.write_many: an extraction job's candidates decided as writes one after another would
be (merged into a memory written just before, superseding one, outranked, rejected), stored in one
transaction: all or none, and a retry after a failed commit writes each once."""

from __future__ import annotations

from dataclasses import replace

import duckdb
import pytest

from sidecar import jobs as jobs_module
from sidecar.app import Sidecar
from sidecar.domain import Authority, JobStatus, MemoryChange, MemoryStatus, MemoryType, Scope
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
    said = {m.message_id: m.text for m in app.store.get_user_messages(
        SCOPE, sorted({i for m in rows for i in m.source_message_ids}))}
    return sorted((m.content, m.type, m.subject, m.status, content.get(m.superseded_by, ""),
                   tuple(said.get(i, i) for i in m.source_message_ids), round(m.confidence, 6), m.authority,
                   tuple(h.action for h in app.store.memory_history(SCOPE, m.memory_id))) for m in rows)


def _state(app: Sidecar) -> tuple:
    state = app.memories.user(SCOPE)
    active = sorted((m.content, tuple(m.source_message_ids)) for m in state.active.values())
    return active, sorted(len(v) for v in state.superseded.values() if v)


def _count_puts(app: Sidecar) -> list[int]:
    """The rows of each put_memories call (each one transaction) the app makes from now on."""
    put, calls = app.store.put_memories, []

    def counted(scope, rows, changes):
        calls.append(len(rows))
        return put(scope, rows, changes)

    app.store.put_memories = counted
    return calls


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
        calls = _count_puts(app)
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


def test_a_create_of_a_stored_memory_id_fails_whole_and_stores_nothing(tmp_path):
    """DuckDB deletes no row before inserting a memory the write created (a statement each): were that
    id stored after all, the primary key fails the whole write rather than leaving two rows."""
    app = _app(tmp_path, "pk")
    try:
        before = _stored(app)
        (stored, blob), (other, other_blob) = app.store.memories_with_embeddings(SCOPE)[:2]
        twin, edited = replace(stored, content="changed"), replace(other, content="edited too")
        with pytest.raises(duckdb.ConstraintException):
            app.store.put_memories(SCOPE, [(edited, other_blob), (twin, blob)],
                                   [MemoryChange(edited, "update", "", 1), MemoryChange(twin, "create", "", 1)])
        assert _stored(app) == before
    finally:
        app.close()


def _paused(app: Sidecar) -> None:
    """The app's worker thread stopped, its batches run by the test (claimed together, as an import's are)."""
    app.worker.stop()
    app.worker._stop.clear()  # a stopping worker ends its batch after the job it is running


def _import(app: Sidecar, sessions: list[list[str]]) -> list[str]:
    """Sessions of user turns imported whole; returns their job ids."""
    from sidecar.domain import NewMessage, Role
    from sidecar.services.imports import PastSession

    imported = app.imports.import_sessions(SCOPE, [
        PastSession([NewMessage(role=Role.USER, text=t, client_timestamp_ms=1_700_000_000_000 + 86_400_000 * i)
                     for t in texts], session_id=f"s{i}", closed=True) for i, texts in enumerate(sessions)])
    return [j for s in imported for j in s.job_ids]


SESSIONS = [
    ["I prefer answers in bullet points.", "My team owns the ledger service."],
    ["I prefer answers in bullet points.", "I always use vim for editing config files."],
    ["I prefer answers as short paragraphs now.", "The staging password is Hunter2-Xq9!vT7#"],
]


def test_a_batch_of_extraction_jobs_stores_a_users_memories_in_one_transaction(tmp_path, monkeypatch):
    """The worker's batch stages each job's memories and stores them once it has run, one transaction a
    user: the same memories, history and job results as the jobs writing one after another."""
    monkeypatch.setattr(jobs_module, "BATCH_SECONDS", 600.0)  # a cold start's first job must not cut the batch
    batched = Sidecar(str(tmp_path / "batched.duckdb"))
    one_by_one = Sidecar(str(tmp_path / "one.duckdb"))
    try:
        calls = _count_puts(batched)
        _paused(batched)
        ids = _import(batched, SESSIONS)
        batched.worker._run_batch(batched.store.claim_jobs(2**62, ["extract_memories"], 64))
        jobs = [j for j in batched.store.get_jobs(SCOPE, ids) if j.kind == "extract_memories"]
        assert len(jobs) == 3 and all(j.status == JobStatus.DONE for j in jobs) and len(calls) == 1

        # The same sessions' jobs run one at a time (each job its own batch, so its own transaction).
        _paused(one_by_one)
        ids_one = _import(one_by_one, SESSIONS)
        while claimed := one_by_one.store.claim_jobs(2**62, ["extract_memories"], 1):
            one_by_one.worker._run_batch(claimed)
        assert _stored(batched) == _stored(one_by_one)
        results = lambda app, ids: sorted(tuple(sorted(j.result.items())) for j in app.store.get_jobs(SCOPE, ids)  # noqa: E731
                                          if j.kind == "extract_memories")
        assert results(batched, ids) == results(one_by_one, ids_one)
        assert any(dict(r).get("merged") == "1" for r in results(batched, ids))
        assert any(dict(r).get("superseded_older") == "1" for r in results(batched, ids))
    finally:
        batched.close()
        one_by_one.close()


def test_a_failed_batch_commit_stores_nothing_and_the_jobs_run_again(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs_module, "BATCH_SECONDS", 600.0)
    app = Sidecar(str(tmp_path / "retry.duckdb"))
    try:
        put = app.store.put_memories

        def failing(scope, rows, changes):
            app.store.put_memories = put  # once
            raise OSError("disk full")

        app.store.put_memories = failing
        _paused(app)
        ids = _import(app, SESSIONS)
        app.worker._run_batch(app.store.claim_jobs(2**62, ["extract_memories"], 64))
        jobs = [j for j in app.store.get_jobs(SCOPE, ids) if j.kind == "extract_memories"]
        assert all(j.status == JobStatus.QUEUED and j.error == "OSError: disk full" for j in jobs)
        assert app.store.memories_with_embeddings(SCOPE) == [] and not app.memories.user(SCOPE).active
        app.worker._run_batch(app.store.claim_jobs(2**62, ["extract_memories"], 64))
        assert all(j.status == JobStatus.DONE for j in app.store.get_jobs(SCOPE, ids) if j.kind == "extract_memories")
        bullets = [m for m, _ in app.store.memories_with_embeddings(SCOPE) if "bullet points" in m.content]
        assert len(bullets) == 1 and bullets[0].confidence == pytest.approx(0.95)  # merged once, not twice
    finally:
        app.close()


@pytest.mark.parametrize("deletion", ["session", "user"])
def test_a_turn_deleted_while_its_job_waits_to_commit_leaves_no_memory(tmp_path, monkeypatch, deletion):
    """A batch's memories are stored after its jobs ran: turns deleted in between (DeleteSession,
    ForgetUser) are read again under the writer lock, and nothing learnt only from them is stored."""
    monkeypatch.setattr(jobs_module, "BATCH_SECONDS", 600.0)
    app = Sidecar(str(tmp_path / "race.duckdb"))
    try:
        _paused(app)
        ids = _import(app, SESSIONS)
        commit = app.worker.commit["extract_memories"]

        def delete_then_commit(jobs):
            if deletion == "session":
                app.deletion.delete_session(SCOPE, "s1")
            else:
                app.memories.forget_user(SCOPE)
            return commit(jobs)

        app.worker.commit["extract_memories"] = delete_then_commit
        app.worker._run_batch(app.store.claim_jobs(2**62, ["extract_memories"], 64))
        stored = [m for m, _ in app.store.memories_with_embeddings(SCOPE)]
        alive = {m.message_id for m in app.store.get_user_messages(
            SCOPE, sorted({i for m in stored for i in m.source_message_ids}))}
        assert all(set(m.source_message_ids) <= alive and m.source_message_ids for m in stored)
        assert not any("vim" in m.content for m in stored)  # said only in the deleted session
        results = [j.result for j in app.store.get_jobs(SCOPE, ids) if j.kind == "extract_memories"]
        if deletion == "user":  # its jobs went with it
            assert stored == [] and not app.memories.user(SCOPE).active and results == []
        else:
            [bullets] = [m for m in stored if "bullet points" in m.content]  # said in s0 too: kept, its s0 source only
            assert len(bullets.source_message_ids) == 1
            assert any("ledger" in m.content for m in stored)
            assert sum(int(r.get("rejected_source_deleted", 0)) for r in results) >= 1
    finally:
        app.close()


def test_statements_are_ordered_by_when_they_were_said_not_by_when_they_are_written(tmp_path):
    """Said newest first, in one batch or one write after another: the newest said stays active, the
    older ones are its history (said before it, superseded on arrival), merges keep the newest time."""
    day = 86_400_000
    said = [MemoryInput(S, "The ledger database is PostgreSQL 16", subject="ledger database",
                        source_message_ids=["n0"], said_at_ms=1_700_000_000_000 + 9 * day),
            MemoryInput(S, "The ledger database is MySQL 8", subject="ledger database",
                        source_message_ids=["n1"], said_at_ms=1_700_000_000_000 + 3 * day),
            MemoryInput(S, "The ledger database is Oracle", subject="ledger database",
                        source_message_ids=["n2"], said_at_ms=1_700_000_000_000 + 1 * day),
            MemoryInput(S, "The ledger database is PostgreSQL 16", subject="ledger database",
                        source_message_ids=["n3"], said_at_ms=1_700_000_000_000 + 2 * day)]
    one_by_one, batched = _app(tmp_path, "one"), _app(tmp_path, "batched")
    try:
        singly = [one_by_one.memories.write(SCOPE, inp) for inp in said]
        together = batched.memories.write_many(SCOPE, said)
        assert _outcomes(together) == _outcomes(singly)
        assert [o for o, _, _ in _outcomes(together)] == ["created", "superseded_by_newer", "superseded_by_newer",
                                                          "merged"]
        assert _stored(batched) == _stored(one_by_one)
        rows = {m.content: m for m, _ in batched.store.memories_with_embeddings(SCOPE)}
        current = rows["The ledger database is PostgreSQL 16"]
        assert current.status == MemoryStatus.ACTIVE and current.source_message_ids == ["n0", "n3"]
        assert current.created_at_ms == current.updated_at_ms == said[0].said_at_ms  # the older telling merged
        for content, inp in (("The ledger database is MySQL 8", said[1]), ("The ledger database is Oracle", said[2])):
            old = rows[content]
            assert (old.status, old.superseded_by, old.created_at_ms) == (
                MemoryStatus.SUPERSEDED, current.memory_id, inp.said_at_ms)
        for app in (batched, one_by_one):  # the state says who replaced whom, as the rows do
            by_content = {m.content: m.memory_id for m, _ in app.store.memories_with_embeddings(SCOPE)}
            assert sorted(app.memories.user(SCOPE).superseded[by_content[current.content]]) == sorted(
                by_content[c] for c in ("The ledger database is MySQL 8", "The ledger database is Oracle"))
        batched.memories.invalidate(SCOPE)
        assert _state(batched) == _state(one_by_one)
    finally:
        one_by_one.close()
        batched.close()


def test_a_statement_without_a_said_time_supersedes_whatever_another_clock_wrote(tmp_path, monkeypatch):
    """AddMemory (no said time) is said now: a memory a replica whose clock runs ahead wrote is still
    superseded by it, never kept above it."""
    import sidecar.memory.service as service

    app = Sidecar(str(tmp_path / "skew.duckdb"))
    try:
        real = service.now_ms
        monkeypatch.setattr(service, "now_ms", lambda: real() + 3_600_000)  # the other replica's clock
        ahead = app.memories.write(SCOPE, MemoryInput(S, "The ledger database is MySQL 8", subject="ledger database"))
        monkeypatch.setattr(service, "now_ms", real)
        added = app.memories.write(SCOPE, MemoryInput(S, "The ledger database is PostgreSQL 16", subject="ledger database"))
        assert (added.outcome, added.superseded_id) == ("superseded_older", ahead.memory.memory_id)
        assert [m.content for m in app.memories.user(SCOPE).active.values()] == ["The ledger database is PostgreSQL 16"]
    finally:
        app.close()
