"""Store contract: every backend (DuckDB, PostgreSQL) passes the same tests, calling the backend's
methods directly with domain objects.

PostgreSQL: set SIDECAR_TEST_PG_DSN (default: host=127.0.0.1 port=5432 dbname=test user=postgres,
an admin role). Each test module gets its own schema, owned by an ordinary role (no superuser, no
BYPASSRLS) that the store connects as, so row-level security is really enforced while the contract
runs; the schema is dropped at teardown. When PostgreSQL is unreachable the postgres cases are
skipped with a loud reason.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections.abc import Iterator

import pytest

from sidecar.domain import (
    Authority,
    DocumentVersion,
    Fact,
    FactChange,
    FactStatus,
    GraphEdge,
    Job,
    JobStatus,
    KnowledgeChunk,
    Memory,
    MemoryChange,
    MemoryStatus,
    MemoryType,
    NewMessage,
    PinnedConstraint,
    Provenance,
    Role,
    Run,
    RunCheckpoint,
    RunNote,
    RunStatus,
    Scope,
    Session,
    SessionStatus,
    SessionSummary,
    SubSessionResult,
    ToolCall,
    ToolResult,
    ToolStatus,
)
from sidecar.errors import AlreadyExists
from sidecar.store import schema as duck_schema
from sidecar.store.duckdb_store import USER_TABLES as DUCK_USER_TABLES
from sidecar.store.duckdb_store import DuckDBStore
from sidecar.store.records import SessionImport, plan_append
from tests.pg import pg_app_dsn, pg_throwaway_schema

BACKENDS = ["duckdb", "postgres"]


@pytest.fixture(scope="module")
def pg_schema() -> Iterator[str]:
    with pg_throwaway_schema("t_contract") as name:
        yield name


def open_backend(kind: str, request, tmp_path_factory):
    if kind == "duckdb":
        return DuckDBStore(str(tmp_path_factory.mktemp("contract") / "store.duckdb"))
    from sidecar.store.postgres_store import PostgresStore

    schema = request.getfixturevalue("pg_schema")
    store = PostgresStore(pg_app_dsn(), schema=schema, max_size=8)
    assert store.rls_enforced, "the contract must run with RLS enforced"
    return store


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request, tmp_path_factory):
    store = open_backend(request.param, request, tmp_path_factory)
    yield store
    store.close()


_n = itertools.count(1)


@pytest.fixture
def scope() -> Scope:
    """A tenant of its own per test: tests sharing the module's store never see each other."""
    return Scope(f"tenant-{next(_n)}-{uuid.uuid4().hex[:6]}", "alice")


def new_session(store, scope: Scope, sid: str = "s1", created: int = 1000, **kw) -> Session:
    session = Session(tenant_id=scope.tenant_id, user_id=scope.user_id, session_id=sid, title=kw.pop("title", "T"),
                      status=SessionStatus.OPEN, created_at_ms=created, updated_at_ms=created, **kw)
    store.create_session(scope, session)
    return session


def msgs(*texts: str, key: str = "") -> list[NewMessage]:
    return [NewMessage(role=Role.USER, text=t, idempotency_key=key) for t in texts]


def counts(n: int) -> list[tuple[int, int]]:
    return [(3, 5)] * n


def fact(key: str, value: str, status=FactStatus.CONFIRMED, version=1, at=10) -> Fact:
    return Fact(key=key, value=value, provenance=Provenance.USER_CONFIRMED, source="user", updated_at_ms=at,
                status=status, version=version, tokens=2)


def memory(mid: str, content: str = "likes tea", **kw) -> Memory:
    base = dict(memory_id=mid, type=MemoryType.PREFERENCE, content=content, subject="drinks",
                source_message_ids=["msg_1", "msg_2"], confidence=0.75, authority=Authority.USER_STATED,
                created_at_ms=100, updated_at_ms=100)
    base.update(kw)
    return Memory(**base)


def job(scope: Scope, jid: str, created: int = 1, kind: str = "extract") -> Job:
    return Job(job_id=jid, tenant_id=scope.tenant_id, user_id=scope.user_id, kind=kind, payload={"a": [1, 2]},
               status=JobStatus.QUEUED, attempts=0, error="", done_items=0, total_items=3, created_at_ms=created,
               updated_at_ms=created)


def drain_jobs(store) -> None:
    """Claim and finish whatever other tests of the module left queued."""
    while (j := store.claim_job(0)) is not None:
        j.status = JobStatus.DONE
        store.finish_job(j)


# ---------------------------------------------------------------------------- schema
def test_schema_is_at_latest_version(backend):
    assert backend.schema_version() == duck_schema.LATEST_VERSION


def test_pg_migrations_mirror_duckdb_versions():
    from sidecar.store import pg_schema

    assert [(v, d) for v, d, _ in pg_schema.MIGRATIONS] == [(v, d) for v, d, _ in duck_schema.MIGRATIONS]
    assert pg_schema.USER_TABLES == DUCK_USER_TABLES


# ---------------------------------------------------------------------------- sessions
def test_sessions_create_get_list_close(backend, scope):
    assert backend.get_session(scope, "nope") is None
    new_session(backend, scope, "s1", 1000, metadata={"b": "2", "a": "1"}, task="deploy", parent_session_id="p0")
    new_session(backend, scope, "s2", 2000)
    new_session(backend, scope, "s3", 2000)
    got = backend.get_session(scope, "s1")
    assert got == Session(tenant_id=scope.tenant_id, user_id="alice", session_id="s1", title="T",
                          status=SessionStatus.OPEN, created_at_ms=1000, updated_at_ms=1000, closed_at_ms=0,
                          parent_session_id="p0", task="deploy", metadata={"a": "1", "b": "2"}, message_count=0)
    listed = backend.list_sessions(scope, limit=10, offset=0, include_closed=False)
    assert [s.session_id for s in listed] == ["s3", "s2", "s1"]  # created desc, then id desc
    assert [s.session_id for s in backend.list_sessions(scope, limit=1, offset=1, include_closed=False)] == ["s2"]
    backend.close_session(scope, "s2", 5000)
    closed = backend.get_session(scope, "s2")
    assert (closed.status, closed.closed_at_ms, closed.updated_at_ms) == (SessionStatus.CLOSED, 5000, 5000)
    assert [s.session_id for s in backend.list_sessions(scope, limit=10, offset=0, include_closed=False)] == [
        "s3", "s1"]
    assert len(backend.list_sessions(scope, limit=10, offset=0, include_closed=True)) == 3
    with pytest.raises(Exception):  # noqa: B017 - each backend raises its own constraint error
        new_session(backend, scope, "s1")


def test_session_stats_follow_messages(backend, scope):
    new_session(backend, scope, "s1", 1000)
    backend.append_messages(scope, "s1", msgs("a", "b"), counts(2), now_ms=7000)
    s = backend.get_session(scope, "s1")
    assert (s.message_count, s.updated_at_ms) == (2, 7000)
    assert backend.list_sessions(scope, limit=5, offset=0, include_closed=True)[0].message_count == 2


# ---------------------------------------------------------------------------- messages
def test_append_and_ranges(backend, scope):
    new_session(backend, scope)
    first = backend.append_messages(scope, "s1", msgs("m1", "m2", "m3"), [(1, 2), (3, 4), (5, 6)], now_ms=50)
    assert [m.seq for m in first] == [1, 2, 3]
    assert [(m.tokens, m.line_tokens) for m in first] == [(1, 2), (3, 4), (5, 6)]
    assert all(m.created_at_ms == 50 and m.timestamp_ms == 50 and m.session_id == "s1" for m in first)
    more = backend.append_messages(scope, "s1", [
        NewMessage(role=Role.TOOL, text="out", tool_name="grep", tool_call_id="c1", client_timestamp_ms=42,
                   speaker="bot")], counts(1), now_ms=60)
    assert more[0].seq == 4 and more[0].timestamp_ms == 42 and more[0].created_at_ms == 60
    stored = backend.list_messages(scope, "s1")
    assert [m.text for m in stored] == ["m1", "m2", "m3", "out"]
    assert stored[3] == more[0] and stored[0] == first[0]
    assert [m.seq for m in backend.list_messages(scope, "s1", newest=2)] == [3, 4]
    assert [m.seq for m in backend.list_messages(scope, "s1", newest=10)] == [1, 2, 3, 4]
    assert [m.seq for m in backend.list_messages(scope, "s1", from_seq=2)] == [2, 3, 4]
    assert [m.seq for m in backend.list_messages(scope, "s1", from_seq=2, to_seq=3)] == [2, 3]
    assert [m.seq for m in backend.list_messages(scope, "s1", to_seq=2)] == [1, 2]
    assert backend.list_messages(scope, "other") == []
    # sequence numbers are per session
    new_session(backend, scope, "s2")
    assert [m.seq for m in backend.append_messages(scope, "s2", msgs("x"), counts(1), 1)] == [1]


def test_user_timeline_over_sessions_and_its_newest_part(backend, scope):
    new_session(backend, scope, "late", created=2000)
    new_session(backend, scope, "early", created=1000)
    backend.append_messages(scope, "late", msgs("l1", "l2"), counts(2), now_ms=5)
    backend.append_messages(scope, "early", msgs("e1", "e2", "e3"), counts(3), now_ms=6)
    backend.append_messages(scope, "early", [NewMessage(role=Role.TOOL, text="tool out")], counts(1), now_ms=7)
    user = [int(Role.USER)]
    assert [m.text for m in backend.list_user_messages(scope, user)] == ["e1", "e2", "e3", "l1", "l2"]
    assert [m.text for m in backend.list_user_messages(scope, user, newest=3)] == ["e3", "l1", "l2"]
    assert [m.text for m in backend.list_user_messages(scope, user, newest=9)] == ["e1", "e2", "e3", "l1", "l2"]
    assert backend.list_user_messages(Scope(scope.tenant_id, "someone-else"), user) == []
    new_session(backend, scope, "child", created=3000, parent_session_id="late")
    backend.append_messages(scope, "child", msgs("c1"), counts(1), now_ms=8)
    assert [m.text for m in backend.list_user_messages(scope, user)] == ["e1", "e2", "e3", "l1", "l2"]  # no sub-session
    # The last session in that order holding a message (sub-sessions, empty and excluded ones aside).
    new_session(backend, scope, "empty", created=4000)
    assert backend.newest_session_with_messages(scope, []) == (2000, "late")
    assert backend.newest_session_with_messages(scope, ["late"]) == (1000, "early")
    assert backend.newest_session_with_messages(scope, ["late", "early"]) is None
    assert backend.newest_session_with_messages(Scope(scope.tenant_id, "someone-else"), []) is None


def test_idempotency_keys(backend, scope):
    new_session(backend, scope)
    a = backend.append_messages(scope, "s1", [NewMessage(Role.USER, "hi", idempotency_key="k1")], counts(1), 10)
    again = backend.append_messages(scope, "s1", [
        NewMessage(Role.USER, "hi", idempotency_key="k1"), NewMessage(Role.USER, "new", idempotency_key="k2"),
        NewMessage(Role.USER, "new dup", idempotency_key="k2"), NewMessage(Role.USER, "no key")], counts(4), 20)
    assert again[0] == a[0]
    assert again[1].seq == 2 and again[2] == again[1]  # a key repeated inside a batch is stored once
    assert again[3].seq == 3
    assert [(m.text, m.idempotency_key) for m in backend.list_messages(scope, "s1")] == [
        ("hi", "k1"), ("new", "k2"), ("no key", "")]
    # keys are per session
    new_session(backend, scope, "s2")
    other = backend.append_messages(scope, "s2", [NewMessage(Role.USER, "hi", idempotency_key="k1")], counts(1), 30)
    assert other[0].message_id != a[0].message_id and other[0].seq == 1


def test_batch_is_atomic(backend, scope, monkeypatch):
    new_session(backend, scope)
    backend.append_messages(scope, "s1", msgs("before"), counts(1), 1)
    real = type(backend)._insert_many

    def boom(c, table, *args, **kw):
        real(c, table, *args, **kw)
        if table == "messages":
            raise RuntimeError("disk on fire")

    monkeypatch.setattr(backend, "_insert_many", boom)
    with pytest.raises(RuntimeError):
        backend.append_messages(scope, "s1", msgs("x", "y", "z"), counts(3), 2)
    monkeypatch.undo()
    assert [m.text for m in backend.list_messages(scope, "s1")] == ["before"]
    after = backend.append_messages(scope, "s1", msgs("after"), counts(1), 3)
    assert after[0].seq == 2  # no gap left by the rolled-back batch


def _imported(scope: Scope, sid: str, created: int, *texts: str, closed: bool = False) -> SessionImport:
    """A session of an import: its row, its messages planned from seq 1, an extraction job, a pin."""
    session = Session(tenant_id=scope.tenant_id, user_id=scope.user_id, session_id=sid, title=f"past {sid}",
                      status=SessionStatus.CLOSED if closed else SessionStatus.OPEN, created_at_ms=created,
                      updated_at_ms=9000, closed_at_ms=9000 if closed else 0)
    plan = plan_append(scope, sid, msgs(*texts), counts(len(texts)), [(0, f"never touch {sid}", 4)], 9000, {}, 1)
    return SessionImport(session, plan, [job(scope, f"job-{scope.tenant_id}-{sid}", created)])


def test_import_sessions_stores_them_whole_in_the_timeline(backend, scope):
    drain_jobs(backend)
    new_session(backend, scope, "now", created=5000)
    backend.append_messages(scope, "now", msgs("today"), counts(1), 5001)
    backend.import_sessions(scope, [_imported(scope, "b", 2000, "b1", "b2", closed=True),
                                    _imported(scope, "a", 1000, "a1")])
    user = [int(Role.USER)]
    assert [m.text for m in backend.list_user_messages(scope, user)] == ["a1", "b1", "b2", "today"]
    b = backend.get_session(scope, "b")
    assert (b.status, b.closed_at_ms, b.created_at_ms, b.message_count) == (SessionStatus.CLOSED, 9000, 2000, 2)
    assert [(m.seq, m.text) for m in backend.list_messages(scope, "b")] == [(1, "b1"), (2, "b2")]
    assert [p.text for p in backend.list_pinned(scope, "a")] == ["never touch a"]
    assert backend.commit_watermark(scope, "b") == 2
    claimed = backend.claim_jobs(0, limit=10)
    assert sorted(j.job_id for j in claimed) == sorted(f"job-{scope.tenant_id}-{s}" for s in "ab")
    for j in claimed:
        j.status = JobStatus.DONE
    backend.finish_jobs(claimed)
    # An open imported session takes more messages after its own.
    assert [m.seq for m in backend.append_messages(scope, "a", msgs("a2"), counts(1), 9001)] == [2]


def test_import_sessions_is_all_or_nothing(backend, scope, monkeypatch):
    drain_jobs(backend)
    new_session(backend, scope, "taken")
    with pytest.raises(AlreadyExists, match="taken"):
        backend.import_sessions(scope, [_imported(scope, "fresh", 1, "x"), _imported(scope, "taken", 2, "y")])
    real = type(backend)._insert_many

    def boom(c, table, *args, **kw):
        real(c, table, *args, **kw)
        if table == "jobs":  # the last rows of an import
            raise RuntimeError("disk on fire")

    monkeypatch.setattr(backend, "_insert_many", boom)
    with pytest.raises(RuntimeError):
        backend.import_sessions(scope, [_imported(scope, "fresh", 1, "x", "y")])
    monkeypatch.undo()
    assert backend.get_session(scope, "fresh") is None
    assert backend.list_user_messages(scope, [int(Role.USER)]) == []
    assert backend.list_pinned(scope, "fresh") == [] and backend.commit_watermark(scope, "fresh") == 0
    assert backend.claim_jobs(0, limit=10) == []
    backend.import_sessions(scope, [_imported(scope, "fresh", 1, "x", "y")])
    assert [m.seq for m in backend.list_messages(scope, "fresh")] == [1, 2]
    drain_jobs(backend)


def test_concurrent_appends_get_unique_contiguous_seqs(backend, scope):
    new_session(backend, scope)
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            for i in range(10):
                backend.append_messages(scope, "s1", msgs(f"w{w}-{i}a", f"w{w}-{i}b"), counts(2), i)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stored = backend.list_messages(scope, "s1")
    assert [m.seq for m in stored] == list(range(1, 81))
    for w in range(4):  # each batch kept its two messages adjacent
        for i in range(10):
            a = next(m.seq for m in stored if m.text == f"w{w}-{i}a")
            assert stored[a].text == f"w{w}-{i}b"


def test_get_messages_by_id(backend, scope):
    new_session(backend, scope)
    out = backend.append_messages(scope, "s1", msgs("a", "b", "c"), counts(3), 1)
    ids = [out[2].message_id, out[0].message_id, "msg_missing"]
    assert [m.text for m in backend.get_messages(scope, "s1", ids)] == ["a", "c"]
    assert backend.get_messages(scope, "s1", []) == []
    assert backend.get_messages(scope, "s2", ids) == []
    new_session(backend, scope, "s0")
    other = backend.append_messages(scope, "s0", msgs("z"), counts(1), 2)
    wanted = [*ids, other[0].message_id]
    assert [(m.session_id, m.text) for m in backend.get_user_messages(scope, wanted)] == [
        ("s0", "z"), ("s1", "a"), ("s1", "c")]
    assert backend.get_user_messages(Scope(scope.tenant_id, "bob"), wanted) == []
    assert backend.get_user_messages(scope, []) == []
    assert backend.stored_message_ids(scope, wanted) == {out[0].message_id, out[2].message_id, other[0].message_id}
    assert backend.stored_message_ids(Scope(scope.tenant_id, "bob"), wanted) == set()
    assert backend.stored_message_ids(scope, []) == set()
    backend.delete_messages(scope, "s1", [out[0].message_id])
    assert backend.stored_message_ids(scope, wanted) == {out[2].message_id, other[0].message_id}


def test_user_message_ids(backend, scope):
    new_session(backend, scope, "s2", created=5)
    new_session(backend, scope, "s1", created=5)  # the same millisecond: by id
    new_session(backend, scope, "s0", created=9)
    late = backend.append_messages(scope, "s0", msgs("e"), counts(1), now_ms=5)
    two = backend.append_messages(scope, "s2", msgs("c", "d"), counts(2), now_ms=6)
    one = backend.append_messages(scope, "s1", [NewMessage(role=Role.TOOL, text="a", tool_call_id="c1"),
                                                NewMessage(role=Role.USER, text="b")], counts(2), now_ms=7)
    assert backend.user_message_ids(scope) == [m.message_id for m in one + two + late]
    assert backend.user_message_ids(Scope(scope.tenant_id, "bob")) == []
    backend.delete_messages(scope, "s2", [two[0].message_id])
    assert backend.user_message_ids(scope) == [m.message_id for m in one + two[1:] + late]


def test_tool_calls_round_trip(backend, scope):
    new_session(backend, scope)
    calls = (ToolCall("call_1", "query_logs", '{"service": "payment-api", "note": "ünïcode"}'), ToolCall("c:2", "noop"))
    out = backend.append_messages(scope, "s1", [
        NewMessage(role=Role.USER, text="why 5xx?"),
        NewMessage(role=Role.ASSISTANT, text="", tool_calls=calls, idempotency_key="k1")], counts(2), now_ms=5)
    assert out[1].tool_calls == calls and out[0].tool_calls == ()
    assert backend.list_messages(scope, "s1") == out
    assert backend.get_messages(scope, "s1", [out[1].message_id]) == [out[1]]
    assert backend.list_user_messages(scope, [int(Role.ASSISTANT)])[0].tool_calls == calls
    replayed = backend.append_messages(scope, "s1", [NewMessage(role=Role.ASSISTANT, text="", tool_calls=calls,
                                                                idempotency_key="k1")], counts(1), now_ms=6)
    assert replayed == [out[1]]


# ---------------------------------------------------------------------------- facts
def test_facts_and_history(backend, scope):
    new_session(backend, scope, created=5)
    env1, region = fact("env", "prod"), fact("region", "eu", FactStatus.CANDIDATE)
    backend.write_facts(scope, "s1", [env1, region], [], [FactChange(env1, "add", "user said"),
                                                           FactChange(region, "propose", "")], at_ms=100)
    assert backend.get_facts(scope, "s1") == [env1, region]
    assert backend.get_session(scope, "s1").updated_at_ms == 100
    env2 = fact("env", "staging", version=2, at=200)
    cand = fact("env", "dev", FactStatus.CANDIDATE, version=3, at=200)
    backend.write_facts(scope, "s1", [env2, cand], [("region", int(FactStatus.CANDIDATE))],
                        [FactChange(env2, "update", "corrected"), FactChange(region, "reject", "stale")], at_ms=200)
    assert backend.get_facts(scope, "s1") == [env2, cand]  # ordered by key, status
    backend.write_facts(scope, "s1", [], [("env", int(FactStatus.CANDIDATE))], [], at_ms=300)
    assert backend.get_facts(scope, "s1") == [env2]
    hist = backend.fact_history(scope, "s1", "env")
    assert [(h.fact.value, h.fact.version, h.action, h.reason, h.fact.updated_at_ms) for h in hist] == [
        ("prod", 1, "add", "user said", 100), ("staging", 2, "update", "corrected", 200)]
    assert [h.action for h in backend.fact_history(scope, "s1", "region")] == ["propose", "reject"]
    assert backend.fact_history(scope, "s1", "none") == [] and backend.get_facts(scope, "s9") == []


# ---------------------------------------------------------------------------- runs
def test_runs_and_checkpoints(backend, scope):
    assert backend.get_run(scope, "r1") is None and backend.last_checkpoint(scope, "r1") is None
    run = Run(run_id="r1", session_id="s1", status=RunStatus.RUNNING, goal="ship", reason="", created_at_ms=1,
              updated_at_ms=1)
    backend.create_run(scope, run)
    assert backend.get_run(scope, "r1") == run
    for seq in (1, 2):
        backend.add_checkpoint(scope, RunCheckpoint(checkpoint_id=f"ck{seq}", run_id="r1", seq=seq,
                                                    state=bytes([0, 255, seq]), pending_step=f"step{seq}",
                                                    created_at_ms=10 * seq))
    last = backend.last_checkpoint(scope, "r1")
    assert last == RunCheckpoint("ck2", "r1", 2, b"\x00\xff\x02", "step2", 20) and isinstance(last.state, bytes)
    run.status, run.reason, run.updated_at_ms = RunStatus.INTERRUPTED, "user left", 99
    run.goal = "ignored by update"
    backend.update_run(scope, run)
    got = backend.get_run(scope, "r1")
    assert (got.status, got.reason, got.updated_at_ms, got.goal, got.checkpoint_count) == (
        RunStatus.INTERRUPTED, "user left", 99, "ship", 2)


# ---------------------------------------------------------------------------- jobs
def test_jobs_queue(backend, scope):
    drain_jobs(backend)
    backend.enqueue_jobs([job(scope, f"{scope.tenant_id}-j2", created=20),
                          job(scope, f"{scope.tenant_id}-j1", created=10)])
    other = Scope(scope.tenant_id, "bob")
    backend.enqueue_jobs([job(other, f"{scope.tenant_id}-j3", created=30)])
    j1 = backend.get_job(scope, f"{scope.tenant_id}-j1")
    assert j1 == job(scope, f"{scope.tenant_id}-j1", created=10)
    assert backend.get_job(other, f"{scope.tenant_id}-j1") is None  # scoped
    assert [j.job_id for j in backend.unfinished_jobs(scope)] == [f"{scope.tenant_id}-j1", f"{scope.tenant_id}-j2"]
    # Several at once, in the order asked (once per id asked); another user's and unknown ids left out.
    asked = [f"{scope.tenant_id}-j2", f"{scope.tenant_id}-j3", "nope", f"{scope.tenant_id}-j1", f"{scope.tenant_id}-j2"]
    assert backend.get_jobs(scope, asked) == [backend.get_job(scope, asked[i]) for i in (0, 3, 4)]
    assert backend.get_jobs(other, asked) == [backend.get_job(other, f"{scope.tenant_id}-j3")]
    assert backend.get_jobs(scope, []) == []

    claimed = backend.claim_job(now_ms=500)  # oldest first, across users
    assert claimed.job_id == f"{scope.tenant_id}-j1"
    assert (claimed.status, claimed.attempts, claimed.updated_at_ms, claimed.payload) == (
        JobStatus.RUNNING, 1, 500, {"a": [1, 2]})
    assert backend.get_job(scope, claimed.job_id) == claimed
    claimed.status, claimed.done_items, claimed.updated_at_ms = JobStatus.DONE, 3, 600
    claimed.result, claimed.error = {"memories": "2"}, ""
    backend.finish_job(claimed)
    assert backend.get_job(scope, claimed.job_id) == claimed
    assert [j.job_id for j in backend.unfinished_jobs(scope)] == [f"{scope.tenant_id}-j2"]

    second = backend.claim_job(now_ms=700)
    third = backend.claim_job(now_ms=700)
    assert (second.job_id, third.job_id, third.user_id) == (f"{scope.tenant_id}-j2", f"{scope.tenant_id}-j3", "bob")
    assert backend.claim_job(now_ms=800) is None
    assert backend.requeue_running_jobs() == 2
    again = backend.get_job(scope, second.job_id)
    assert (again.status, again.attempts) == (JobStatus.QUEUED, 1)
    retried = backend.claim_job(now_ms=900)
    assert retried.attempts == 2
    retried.status = JobStatus.DONE
    backend.finish_job(retried)
    failed = backend.claim_job(now_ms=900)
    failed.status, failed.error = JobStatus.FAILED, "boom"
    backend.finish_job(failed)
    assert backend.get_job(other, failed.job_id).error == "boom"
    drain_jobs(backend)
    assert backend.requeue_running_jobs() == 0


def test_jobs_claimed_and_finished_in_batches(backend, scope):
    """claim_jobs takes the oldest N in claim_job's order; finish_jobs writes each job's own outcome,
    attempts included (a job given back unrun keeps the attempts it had)."""
    drain_jobs(backend)
    ids = [f"{scope.tenant_id}-b{i}" for i in range(5)]
    backend.enqueue_jobs([job(scope, jid, created=100 - i) for i, jid in enumerate(ids)])  # newest first
    backend.enqueue_jobs([job(scope, f"{scope.tenant_id}-other", created=1, kind="index")])
    batch = backend.claim_jobs(50, ["extract"], 3)
    assert [j.job_id for j in batch] == ids[::-1][:3]  # oldest first, only the kinds asked for
    assert all((j.status, j.attempts, j.updated_at_ms) == (JobStatus.RUNNING, 1, 50) for j in batch)
    assert [backend.get_job(scope, j.job_id) for j in batch] == batch
    done, failed, unrun = batch
    done.status, done.result, done.done_items, done.updated_at_ms = JobStatus.DONE, {"n": "1"}, 3, 60
    failed.status, failed.error, failed.updated_at_ms = JobStatus.FAILED, "boom", 61
    unrun.status, unrun.attempts = JobStatus.QUEUED, 0
    backend.finish_jobs(batch)
    assert [backend.get_job(scope, j.job_id) for j in batch] == batch
    rest = backend.claim_jobs(70, ["extract"], 10)
    assert [j.job_id for j in rest] == [unrun.job_id, *ids[::-1][3:]]
    assert rest[0].attempts == 1
    assert backend.claim_jobs(70, ["extract"], 10) == []
    backend.finish_jobs([])
    drain_jobs(backend)
    backend.requeue_running_jobs()
    drain_jobs(backend)


def test_concurrent_claims_never_share_a_job(backend, scope):
    drain_jobs(backend)
    backend.enqueue_jobs([job(scope, f"{scope.tenant_id}-c{i}", created=i) for i in range(40)])
    got: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while (j := backend.claim_job(1)) is not None:
            with lock:
                got.append(j.job_id)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(f"{scope.tenant_id}-c{i}" for i in range(40))
    assert backend.requeue_running_jobs() == 40
    drain_jobs(backend)


# ---------------------------------------------------------------------------- memories
def test_memories_put_get_list_history(backend, scope):
    m1, m2 = memory("m1", created_at_ms=100, updated_at_ms=100), memory("m2", "reads runbooks", type=MemoryType.HABIT,
                                                                        created_at_ms=200, updated_at_ms=300)
    m3 = memory("m3", "expires", expires_at_ms=1000, created_at_ms=300, updated_at_ms=200)
    backend.put_memories(scope, [(m1, b"\x01\x02"), (m2, b"\x03"), (m3, b"")],
                         [MemoryChange(m1, "add", "r1", 100), MemoryChange(m2, "add", "", 200)])
    assert backend.get_memory(scope, "m1") == m1 and backend.get_memory(scope, "nope") is None
    ids = lambda ms: [m.memory_id for m in ms]  # noqa: E731
    kw = dict(limit=10, offset=0, include_inactive=False)
    assert ids(backend.list_memories(scope, types=[], now_ms=500, **kw)) == ["m2", "m3", "m1"]  # updated desc
    assert ids(backend.list_memories(scope, types=[], now_ms=1000, **kw)) == ["m2", "m1"]  # m3 expired
    assert ids(backend.list_memories(scope, types=[int(MemoryType.HABIT)], now_ms=1, **kw)) == ["m2"]
    assert ids(backend.list_memories(scope, types=[1, 3], now_ms=1, limit=1, offset=1, include_inactive=False)) == [
        "m3"]

    # replace m1: superseded by m4
    m1b = memory("m1", created_at_ms=100, updated_at_ms=400, status=MemoryStatus.SUPERSEDED, superseded_by="m4",
                 confidence=0.5)
    m4 = memory("m4", "likes green tea", created_at_ms=400, updated_at_ms=400, tokens=4)
    backend.put_memories(scope, [(m1b, b"\x01\x02"), (m4, b"\x09" * 16)],
                         [MemoryChange(m1b, "supersede", "newer", 400), MemoryChange(m4, "add", "", 400)])
    assert backend.get_memory(scope, "m1") == m1b
    assert ids(backend.list_memories(scope, types=[], now_ms=2000, **kw)) == ["m4", "m2"]
    assert ids(backend.list_memories(scope, types=[], now_ms=2000, limit=10, offset=0, include_inactive=True)) == [
        "m1", "m4", "m2", "m3"]
    active = backend.active_memories_with_embeddings(scope)
    assert [(m.memory_id, e) for m, e in active] == [("m2", b"\x03"), ("m3", b""), ("m4", b"\x09" * 16)]
    assert all(isinstance(e, bytes) for _, e in active) and active[2][0] == m4
    assert [(m.memory_id, m.status, m.superseded_by, e) for m, e in backend.memories_with_embeddings(scope)] == [
        ("m1", MemoryStatus.SUPERSEDED, "m4", b"\x01\x02"), ("m2", MemoryStatus.ACTIVE, "", b"\x03"),
        ("m3", MemoryStatus.ACTIVE, "", b""), ("m4", MemoryStatus.ACTIVE, "", b"\x09" * 16)]

    hist = backend.memory_history(scope, "m1")
    assert [(h.action, h.reason, h.at_ms, h.memory.status, h.memory.confidence) for h in hist] == [
        ("add", "r1", 100, MemoryStatus.ACTIVE, 0.75), ("supersede", "newer", 400, MemoryStatus.SUPERSEDED, 0.5)]
    # history rows carry at_ms as created/updated and 0 tokens, as the reference backend does
    assert (hist[1].memory.created_at_ms, hist[1].memory.updated_at_ms, hist[1].memory.tokens) == (400, 400, 0)
    assert hist[1].memory.source_message_ids == ["msg_1", "msg_2"] and hist[1].memory.superseded_by == "m4"


def test_memory_history_order_within_and_across_batches(backend, scope):
    m = memory("h1")
    changes = [MemoryChange(memory("h1", f"v{i}"), f"a{i}", "", 50 - i) for i in range(5)]  # at_ms decreasing
    backend.put_memories(scope, [(m, b"")], changes[:3])
    backend.put_memories(scope, [(m, b"")], changes[3:])
    assert [h.action for h in backend.memory_history(scope, "h1")] == ["a0", "a1", "a2", "a3", "a4"]


def test_delete_memory_leaves_only_a_tombstone(backend, scope):
    m = memory("d1", "secret stuff")
    backend.put_memories(scope, [(m, b"\x01")], [MemoryChange(m, "add", "", 1)])
    tomb = MemoryChange(memory("d1", "", subject="", source_message_ids=[], status=MemoryStatus.DELETED),
                        "delete", "user asked", 5)
    backend.delete_memory(scope, "d1", tomb)
    assert backend.get_memory(scope, "d1") is None
    hist = backend.memory_history(scope, "d1")
    assert [(h.action, h.reason, h.memory.content, h.memory.status, h.at_ms) for h in hist] == [
        ("delete", "user asked", "", MemoryStatus.DELETED, 5)]
    assert backend.active_memories_with_embeddings(scope) == []


# ---------------------------------------------------------------------------- commit watermark
def test_commit_turn_watermark_and_jobs(backend, scope):
    new_session(backend, scope)
    assert backend.commit_watermark(scope, "s1") == 0
    backend.commit_turn(scope, "s1", 4, [job(scope, f"{scope.tenant_id}-t1")])
    assert backend.commit_watermark(scope, "s1") == 4
    backend.commit_turn(scope, "s1", 2, [])  # never moves back
    assert backend.commit_watermark(scope, "s1") == 4
    backend.commit_turn(scope, "s1", 9, [job(scope, f"{scope.tenant_id}-t2", created=2)])
    assert backend.commit_watermark(scope, "s1") == 9 and backend.commit_watermark(scope, "s2") == 0
    assert [j.job_id for j in backend.unfinished_jobs(scope)] == [f"{scope.tenant_id}-t1", f"{scope.tenant_id}-t2"]
    drain_jobs(backend)


# ---------------------------------------------------------------------------- forget / isolation
def tool_result(tid: str, session_id: str = "s1", created: int = 1, full: str = "full output") -> ToolResult:
    return ToolResult(tool_result_id=tid, session_id=session_id, run_id="r1", tool_name="grep", call_id="c1",
                      status=ToolStatus.OK, tokens=9, lines=3, view_text="view", view_tokens=2, brief_text="brief",
                      brief_tokens=1, created_at_ms=created, full_text=full)


def note(nid: str, seq: int, run_id: str = "r1", **kw) -> RunNote:
    base = dict(note_id=nid, session_id="s1", run_id=run_id, seq=seq, text=f"note {nid}", tokens=2,
                is_summary=False, folded_note_ids=[], created_at_ms=seq)
    base.update(kw)
    return RunNote(**base)


def _populate(store, scope: Scope) -> None:
    new_session(store, scope)
    store.append_messages(scope, "s1", msgs("a", "never deploy on friday"), counts(2), 1,
                          [(1, "never deploy on friday", 5)])
    store.insert_tool_result(scope, tool_result("tr1"))
    store.write_run_notes(scope, [note("n1", 1)])
    store.put_summary(scope, SessionSummary("s1", "sum", 1, ["m"], 2, "{}", 3))
    new_session(store, scope, "child")
    store.add_subsession_result(scope, SubSessionResult("s1", "child", "task", "done", 1, 4), 4)
    f = fact("env", "prod")
    store.write_facts(scope, "s1", [f], [], [FactChange(f, "add", "")], 2)
    store.create_run(scope, Run("r1", "s1", RunStatus.RUNNING, "g", "", 1, 1))
    store.add_checkpoint(scope, RunCheckpoint("c1", "r1", 1, b"x", "", 1))
    m = memory(f"mem-{scope.user_id}")
    store.put_memories(scope, [(m, b"e")], [MemoryChange(m, "add", "", 1), MemoryChange(m, "update", "", 2)])
    store.commit_turn(scope, "s1", 2, [job(scope, f"{scope.tenant_id}-{scope.user_id}-job")])
    store.put_idempotent(scope, "AddMemory", "k1", "h", b"answer", 5)
    store.add_recall_exclusions(scope, ["m1"], "memory_deleted", 5)


def test_forget_user_counts_and_isolation(backend, scope):
    drain_jobs(backend)
    bob = Scope(scope.tenant_id, "bob")
    _populate(backend, scope)
    _populate(backend, bob)
    drain_jobs(backend)
    expected = {
        "sessions": 2, "messages": 2, "facts": 1, "fact_history": 1, "runs": 1, "run_checkpoints": 1, "jobs": 1,
        "memories": 1, "memory_history": 2, "turn_commits": 1, "tool_results": 1, "run_notes": 1,
        "session_summaries": 1, "pinned_constraints": 1, "subsession_results": 1, "idempotency_keys": 1,
        "recall_exclusions": 1}
    assert set(expected) == set(DUCK_USER_TABLES)
    assert backend.forget_user(scope) == expected
    assert backend.get_session(scope, "s1") is None and backend.list_messages(scope, "s1") == []
    assert backend.get_facts(scope, "s1") == [] and backend.get_run(scope, "r1") is None
    assert backend.memory_history(scope, "mem-alice") == [] and backend.commit_watermark(scope, "s1") == 0
    assert backend.get_session(bob, "s1").message_count == 2 and len(backend.get_facts(bob, "s1")) == 1
    assert backend.get_memory(bob, "mem-bob") is not None
    assert backend.forget_user(scope) == dict.fromkeys(DUCK_USER_TABLES, 0)
    # a forgotten user starts again at seq 1
    new_session(backend, scope)
    assert backend.append_messages(scope, "s1", msgs("again"), counts(1), 3)[0].seq == 1


def test_scopes_never_see_each_other(backend, scope):
    _populate(backend, scope)
    for intruder in (Scope(scope.tenant_id, "mallory"), Scope(scope.tenant_id + "x", "alice"),
                     Scope("other-tenant", scope.user_id)):
        assert backend.get_session(intruder, "s1") is None
        assert backend.list_sessions(intruder, limit=10, offset=0, include_closed=True) == []
        assert backend.list_messages(intruder, "s1") == [] and backend.get_facts(intruder, "s1") == []
        assert backend.fact_history(intruder, "s1", "env") == [] and backend.get_run(intruder, "r1") is None
        assert backend.last_checkpoint(intruder, "r1") is None and backend.get_memory(intruder, "mem-alice") is None
        assert backend.list_memories(intruder, limit=10, offset=0, types=[], include_inactive=True, now_ms=0) == []
        assert backend.unfinished_jobs(intruder) == [] and backend.commit_watermark(intruder, "s1") == 0
        assert backend.list_pinned(intruder, "s1") == [] and backend.get_tool_result(intruder, "tr1") is None
        assert backend.recent_tool_results(intruder, "s1", 10) == [] and backend.list_run_notes(intruder, "s1") == []
        assert backend.get_summary(intruder, "s1") is None and backend.list_subsession_results(intruder, "s1") == []
        assert backend.memories_with_embeddings(intruder) == [] and backend.active_memories_with_embeddings(intruder) == []
    drain_jobs(backend)


# ---------------------------------------------------------------------------- compression layers
def test_pinned_constraints_stored_with_their_message(backend, scope):
    new_session(backend, scope)
    first = backend.append_messages(scope, "s1", [NewMessage(Role.USER, "never rm -rf", idempotency_key="k")],
                                    counts(1), 10, [(0, "never rm -rf", 4)])
    assert backend.list_pinned(scope, "s1") == [PinnedConstraint(first[0].message_id, 0, "never rm -rf", 4, 10, session_id="s1")]
    # a replayed message (same idempotency key) does not pin again; idx counts the batch's pins
    out = backend.append_messages(scope, "s1", [NewMessage(Role.USER, "never rm -rf", idempotency_key="k"),
                                                NewMessage(Role.USER, "always use staging")], counts(2), 20,
                                  [(0, "never rm -rf", 4), (1, "always use staging", 3)])
    assert backend.list_pinned(scope, "s1") == [
        PinnedConstraint(first[0].message_id, 0, "never rm -rf", 4, 10, session_id="s1"),
        PinnedConstraint(out[1].message_id, 1, "always use staging", 3, 20, session_id="s1")]
    assert backend.list_pinned(scope, "other") == []


def test_unpin_keeps_the_constraint_with_who_and_why(backend, scope):
    new_session(backend, scope)
    m = backend.append_messages(scope, "s1", msgs("never rm -rf"), counts(1), 10, [(0, "never rm -rf", 4)])[0]
    assert not backend.unpin_constraint(scope, "s1", m.message_id, 7, "ops", "wrong idx", 11)
    assert not backend.unpin_constraint(Scope(scope.tenant_id, "mallory"), "s1", m.message_id, 0, "x", "y", 11)
    assert backend.unpin_constraint(scope, "s1", m.message_id, 0, "ops-lead", "cleanup is done", 12)
    assert not backend.unpin_constraint(scope, "s1", m.message_id, 0, "ops-lead", "again", 13)  # once
    assert backend.list_pinned(scope, "s1") == [PinnedConstraint(m.message_id, 0, "never rm -rf", 4, 10, 12,
                                                                 "ops-lead", "cleanup is done", "s1")]


def test_idempotency_keys_and_recall_exclusions(backend, scope):
    assert backend.get_idempotent(scope, "AddMemory", "k") is None
    backend.put_idempotent(scope, "AddMemory", "k", "h1", b"\x00first", 1)
    backend.put_idempotent(scope, "AddMemory", "k", "h2", b"second", 2)  # the first answer stays
    assert backend.get_idempotent(scope, "AddMemory", "k") == ("h1", b"\x00first")
    assert backend.get_idempotent(scope, "AddRunNote", "k") is None
    assert backend.get_idempotent(Scope(scope.tenant_id, "bob"), "AddMemory", "k") is None
    backend.add_recall_exclusions(scope, ["m1", "m2", "m1"], "memory_deleted", 1)
    backend.add_recall_exclusions(scope, ["m2", "m3"], "memory_deleted", 2)
    assert backend.recall_exclusions(scope) == {"m1", "m2", "m3"}
    assert backend.recall_exclusions(Scope(scope.tenant_id, "bob")) == set()


def test_tool_results(backend, scope):
    assert backend.get_tool_result(scope, "t1") is None
    for i in range(4):
        backend.insert_tool_result(scope, tool_result(f"t{i}", created=100 + i // 2, full=f"full {i}"))
    backend.insert_tool_result(scope, tool_result("tx", session_id="s2"))
    assert backend.get_tool_result(scope, "t2") == tool_result("t2", created=101, full="full 2")
    recent = backend.recent_tool_results(scope, "s1", 3)
    assert [t.tool_result_id for t in recent] == ["t1", "t2", "t3"]  # newest last
    assert all(t.full_text == "" for t in recent)  # without the full text
    assert recent[2] == tool_result("t3", created=101, full="")


def test_run_notes(backend, scope):
    backend.write_run_notes(scope, [note("a", 1), note("b", 2), note("c", 1, run_id="r0"), note("z", 1, session_id="s9")])
    assert [n.note_id for n in backend.list_run_notes(scope, "s1")] == ["c", "a", "b"]  # by run, seq
    folded = note("f", 3, is_summary=True, folded_note_ids=["a", "b"])
    backend.write_run_notes(scope, [folded], delete_ids=["a", "b", "missing"])
    assert backend.list_run_notes(scope, "s1") == [note("c", 1, run_id="r0"), folded]
    backend.write_run_notes(scope, [], delete_ids=["z"])
    assert backend.list_run_notes(scope, "s9") == []


def test_session_summary(backend, scope):
    assert backend.get_summary(scope, "s1") is None
    first = SessionSummary("s1", "they talked", 3, ["m1", "m2"], 2, '{"k": 1}', 50)
    backend.put_summary(scope, first)
    assert backend.get_summary(scope, "s1") == first
    second = SessionSummary("s1", "they talked more", 4, ["m3"], 5, "{}", 60)
    backend.put_summary(scope, second)
    assert backend.get_summary(scope, "s1") == second


def test_subsession_results_close_the_child(backend, scope):
    new_session(backend, scope, "parent")
    new_session(backend, scope, "kid")
    r1 = SubSessionResult("parent", "kid", "find logs", "found 3", 2, 70)
    backend.add_subsession_result(scope, r1, close_child_at_ms=80)
    kid = backend.get_session(scope, "kid")
    assert (kid.status, kid.closed_at_ms, kid.updated_at_ms) == (SessionStatus.CLOSED, 80, 80)
    r0 = SubSessionResult("parent", "kid2", "earlier", "x", 1, 60)
    backend.add_subsession_result(scope, r0, close_child_at_ms=90)  # child row need not exist
    assert backend.list_subsession_results(scope, "parent") == [r0, r1]
    assert backend.get_session(scope, "parent").status == SessionStatus.OPEN


def test_claim_job_by_kind(backend, scope):
    drain_jobs(backend)
    backend.enqueue_jobs([job(scope, f"{scope.tenant_id}-a", 1, "summarize"),
                          job(scope, f"{scope.tenant_id}-b", 2, "extract")])
    assert backend.claim_job(5, ["extract", "index"]).job_id == f"{scope.tenant_id}-b"
    assert backend.claim_job(5, ["index"]) is None
    assert backend.claim_job(5, None).job_id == f"{scope.tenant_id}-a"
    drain_jobs(backend)
    backend.requeue_running_jobs()
    drain_jobs(backend)


# ---------------------------------------------------------------------------- knowledge base (tenant-shared)
def doc(doc_id: str, live: bool = True, created: int = 1, **kw) -> DocumentVersion:
    base = dict(doc_id=doc_id, version=0, title=f"Doc {doc_id}", format=1, allowed_roles=["sre", "admin"],
                metadata={"team": "infra"}, chunk_count=0, live=live, indexed=False, created_at_ms=created)
    base.update(kw)
    return DocumentVersion(**base)


def kb_job(tenant: str, jid: str) -> Job:
    return Job(job_id=jid, tenant_id=tenant, user_id="", kind="index_document", payload={"doc": "d"},
               status=JobStatus.QUEUED, attempts=0, error="", done_items=0, total_items=0, created_at_ms=1,
               updated_at_ms=1)


def test_knowledge_documents_and_chunks(backend, scope):
    t = scope.tenant_id
    assert backend.document_versions(t) == [] and backend.chunks(t) == []
    ch = [KnowledgeChunk("d1", 0, i, f"H{i}", f"text {i}", 3) for i in range(3)]
    j1 = kb_job(t, f"{t}-kb1")
    assert backend.add_document_version(t, doc("d1"), ch, j1) == 1
    assert j1.payload["version"] == 1
    assert backend.add_document_version(t, doc("d1", created=2), ch[:2], kb_job(t, f"{t}-kb2")) == 2
    assert backend.add_document_version(t, doc("d1", live=False), ch[:1], kb_job(t, f"{t}-kb3")) == 3
    assert backend.add_document_version(t, doc("d0"), [], kb_job(t, f"{t}-kb4")) == 1
    vs = backend.document_versions(t, "d1")
    assert [(v.version, v.live, v.chunk_count, v.indexed) for v in vs] == [(1, False, 3, False), (2, True, 2, False),
                                                                           (3, False, 1, False)]
    assert vs[0].allowed_roles == ["admin", "sre"] and vs[0].metadata == {"team": "infra"}
    assert [(v.doc_id, v.version) for v in backend.document_versions(t, live_only=True)] == [("d0", 1), ("d1", 2)]
    assert backend.get_job(Scope(t, ""), f"{t}-kb1").payload == {"doc": "d", "version": 1}
    assert [c.key for c in backend.chunks(t, live_only=True)] == ["d1@v2#0", "d1@v2#1"]
    assert [c.key for c in backend.chunks(t, "d1", 1)] == ["d1@v1#0", "d1@v1#1", "d1@v1#2"]
    assert backend.chunks(t, "d1", 3) == [KnowledgeChunk("d1", 3, 0, "H0", "text 0", 3)]
    backend.set_live_version(t, "d1", 3)
    backend.mark_indexed(t, "d1", 3)
    assert [(v.version, v.live, v.indexed) for v in backend.document_versions(t, "d1", live_only=True)] == [
        (3, True, True)]
    assert t in backend.knowledge_tenants()
    # another tenant sees nothing
    assert backend.document_versions("other-" + t) == [] and backend.chunks("other-" + t) == []
    backend.upsert_edges(t, [GraphEdge("e1", "a", "uses", "b", "kb:d1@v3#0"),
                             GraphEdge("e2", "b", "runs_on", "c", "kb:d0@v1#0", 5, 9)])
    assert backend.delete_document(t, "d1") == (3, 6)
    assert backend.document_versions(t, "d1") == [] and backend.chunks(t, "d1") == []
    assert [e.edge_id for e in backend.edges(t)] == ["e2"]  # the document's edges went with it
    assert backend.delete_document(t, "nope") == (0, 0)
    drain_jobs(backend)


def test_graph_edges(backend, scope):
    t = scope.tenant_id
    backend.upsert_edges(t, [GraphEdge("e2", "b", "r", "c", "src"), GraphEdge("e1", "a", "r", "b", "src", 1, 2)])
    backend.upsert_edges(t, [GraphEdge("e2", "b", "r2", "d", "src2")])
    assert backend.edges(t) == [GraphEdge("e1", "a", "r", "b", "src", 1, 2), GraphEdge("e2", "b", "r2", "d", "src2")]
    assert backend.edges("x" + t) == []
    assert backend.delete_edges(t, ["e1", "missing"]) == 1
    assert backend.delete_edges("x" + t, ["e2"]) == 0
    assert [e.edge_id for e in backend.edges(t)] == ["e2"]


# ---------------------------------------------------------------------------- behind the cache
def test_caching_store_over_backend(backend, scope):
    from sidecar.store.cache import CachingStore

    cache = CachingStore(backend)
    _populate(backend, scope)
    view = cache.session_view(scope, "s1")
    assert [m.text for m in view.messages] == ["a", "never deploy on friday"]
    assert [p.text for p in view.pinned] == ["never deploy on friday"] and view.summary.text == "sum"
    assert [t.tool_result_id for t in view.tool_results] == ["tr1"] and list(view.notes) == ["r1"]
    assert [r.child_session_id for r in view.subsession_results] == ["child"]
    out = cache.append_messages(scope, "s1", msgs("c"), counts(1), 9, [(0, "c", 1)])
    assert out[0].seq == 3 and view.messages[-1].seq == 3 and len(view.pinned) == 2
    assert cache.get_facts(scope, "s1") == backend.get_facts(scope, "s1")
    drain_jobs(backend)


def test_a_taken_session_id_is_already_exists(backend, scope):
    """The primary key decides (no read before the write), and the first session stays as it was."""
    from sidecar.errors import AlreadyExists

    first = new_session(backend, scope, "dup", title="first")
    with pytest.raises(AlreadyExists, match="dup"):
        new_session(backend, scope, "dup", title="second")
    assert backend.get_session(scope, "dup").title == first.title
    new_session(backend, scope, "other")  # the store still takes writes


def test_a_new_sessions_view_needs_no_load(backend, scope):
    """A session just created is empty: its first read makes none of a load's queries, and what is
    written to it afterwards reaches the view as on a loaded one."""
    from sidecar.store.cache import CachingStore

    class Counting:
        def __init__(self, inner):
            self.inner, self.reads = inner, 0

        def __getattr__(self, name):
            if name in ("get_session", "list_messages", "get_facts", "list_pinned", "get_summary"):
                self.reads += 1
            return getattr(self.inner, name)

    spy = Counting(backend)
    cache = CachingStore(spy)
    new_session(cache, scope, "fresh")
    view = cache.session_view(scope, "fresh")
    assert spy.reads == 0 and view.session.session_id == "fresh" and not view.messages and not view.confirmed
    cache.append_messages(scope, "fresh", msgs("hello"), counts(1), 9, [])
    assert [m.text for m in cache.session_view(scope, "fresh").messages] == ["hello"]
    assert [m.text for m in CachingStore(backend).session_view(scope, "fresh").messages] == ["hello"]
    drain_jobs(backend)


def test_both_backends_implement_the_whole_protocol():
    import inspect

    from sidecar.store.base import Store
    from sidecar.store.duckdb_store import DuckDBStore
    from sidecar.store.postgres_store import PostgresStore

    wanted = {n for n, _ in inspect.getmembers(Store, inspect.isfunction) if not n.startswith("_")}
    assert len(wanted) > 50
    for backend in (DuckDBStore, PostgresStore):
        missing = [n for n in wanted if not callable(getattr(backend, n, None))]
        assert not missing, (backend.__name__, missing)
        for n in wanted:
            ours = list(inspect.signature(getattr(Store, n)).parameters)
            theirs = list(inspect.signature(getattr(backend, n)).parameters)
            assert ours == theirs, (backend.__name__, n, ours, theirs)


def test_session_cache_is_bounded_by_messages(tmp_path, scope):
    """Views are evicted least recently used first once they hold too many messages together; an
    evicted session reads back whole from the database."""
    from sidecar.store.cache import CachingStore

    store = CachingStore(DuckDBStore(str(tmp_path / "c.duckdb")), max_view_messages=25)
    try:
        for n in range(6):
            sid = f"s{n}"
            new_session(store, scope, sid)
            store.append_messages(scope, sid, msgs(*[f"m{n}-{i}" for i in range(10)]), counts(10), 2000)
            assert store.cached_view_messages <= 25
        assert store.cached_view_messages == sum(len(v.messages) for v in store._views.values())
        assert store._cached(scope, "s0") is None  # the oldest went first
        assert [m.text for m in store.list_messages(scope, "s0")] == [f"m0-{i}" for i in range(10)]
        store.append_messages(scope, "s0", msgs("later"), counts(1), 3000)
        assert store.list_messages(scope, "s0")[-1].text == "later" and store.cached_view_messages <= 25
    finally:
        store.close()
