"""PostgreSQL only: tenant isolation enforced by the DATABASE (row-level security), and the change
feed for replicas (change_log + LISTEN/NOTIFY with a polling fallback).

Raw SQL here runs as the same ordinary role the store uses (it owns the tables; FORCE ROW LEVEL
SECURITY makes the policies apply to it). Skipped loudly when PostgreSQL is unreachable.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator

import pytest

from sidecar.domain import MemoryChange, NewMessage, Role, Scope
from sidecar.store.change_feed import Change, ChangeFeed
from sidecar.store.pg_schema import LATEST_VERSION, TENANT_TABLES, USER_TABLES
from tests.pg import pg_admin, pg_app_dsn, pg_create_schema, pg_drop_schema, pg_throwaway_schema
from tests.test_store_contract import (
    _populate,
    counts,
    doc,
    drain_jobs,
    kb_job,
    memory,
    msgs,
    new_session,
)

psycopg = pytest.importorskip("psycopg", reason="!!!!! POSTGRES BACKEND NOT TESTED: psycopg is not installed !!!!!")

A, A_BOB, B = Scope("tenant-a", "alice"), Scope("tenant-a", "bob"), Scope("tenant-b", "alice")


@pytest.fixture(scope="module")
def schema() -> Iterator[str]:
    with pg_throwaway_schema("t_rls") as name:
        yield name


@pytest.fixture(scope="module")
def store(schema):
    from sidecar.store.postgres_store import PostgresStore

    s = PostgresStore(pg_app_dsn(), schema=schema)
    assert s.rls_enforced
    for scope in (A, A_BOB, B):
        _populate(s, scope)
        for t in (scope.tenant_id,):
            if not s.document_versions(t):
                s.add_document_version(t, doc("handbook"), [], kb_job(t, f"{t}-kb"))
    drain_jobs(s)
    yield s
    s.close()


@pytest.fixture
def raw(schema, store) -> Iterator[psycopg.Connection]:
    """A plain connection as the app role, outside the store: what any SQL client could do."""
    conn = psycopg.connect(pg_app_dsn(), autocommit=False)
    conn.execute(f"SET search_path TO {schema}")
    conn.commit()
    yield conn
    conn.rollback()
    conn.close()


def as_scope(conn, scope: Scope | None, system: bool = False) -> None:
    if scope is not None:
        conn.execute("SELECT set_config('sidecar.tenant_id', %s, true), set_config('sidecar.user_id', %s, true)",
                     [scope.tenant_id, scope.user_id])
    if system:
        conn.execute("SELECT set_config('sidecar.system', 'on', true)")


# ---------------------------------------------------------------------------- row-level security
def test_every_user_table_has_forced_rls(raw):
    rows = raw.execute("SELECT relname, relrowsecurity, relforcerowsecurity FROM pg_class c JOIN pg_namespace n "
                       "ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND relkind = 'r'").fetchall()
    flags = {r[0]: (r[1], r[2]) for r in rows}
    for table in (*USER_TABLES, *TENANT_TABLES, "change_log"):
        assert flags[table] == (True, True), table
    owner = raw.execute("SELECT tableowner = current_user FROM pg_tables WHERE tablename = 'memories' "
                        "AND schemaname = current_schema()").fetchone()[0]
    assert owner, "the test role owns the tables: only FORCE makes RLS apply to it"


def test_select_without_where_returns_only_the_scope(raw):
    as_scope(raw, A)
    rows = raw.execute("SELECT tenant_id, user_id, memory_id FROM memories").fetchall()
    assert rows == [("tenant-a", "alice", "mem-alice")]
    for table in USER_TABLES:
        owners = set(raw.execute(f"SELECT DISTINCT tenant_id, user_id FROM {table}").fetchall())
        assert owners <= {("tenant-a", "alice")}, table
    assert raw.execute("SELECT count(*) FROM messages").fetchone()[0] == 2
    # tenant-shared tables: the tenant only
    assert raw.execute("SELECT DISTINCT tenant_id FROM kb_documents").fetchall() == [("tenant-a",)]
    raw.rollback()
    as_scope(raw, B)
    assert raw.execute("SELECT tenant_id, user_id FROM memories").fetchall() == [("tenant-b", "alice")]


def test_no_settings_means_no_rows(raw):
    for table in (*USER_TABLES, *TENANT_TABLES, "change_log"):
        assert raw.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
    raw.rollback()
    # settings are transaction-local: after a scoped transaction ends, nothing is visible again
    as_scope(raw, A)
    assert raw.execute("SELECT count(*) FROM memories").fetchone()[0] == 1
    raw.commit()
    assert raw.execute("SELECT count(*) FROM memories").fetchone()[0] == 0


def test_system_setting_sees_all_users(raw):
    as_scope(raw, None, system=True)
    assert raw.execute("SELECT count(DISTINCT (tenant_id, user_id)) FROM memories").fetchone()[0] == 3


def test_writes_for_another_scope_are_refused(raw):
    as_scope(raw, A)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        raw.execute("INSERT INTO sessions VALUES ('tenant-b', 'alice', 'evil', 't', 1, 0, 0, 0, '', '', '{}')")
    raw.rollback()
    as_scope(raw, A)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        raw.execute("INSERT INTO memories SELECT 'tenant-a', 'bob', 'evil', type, content, subject, "
                    "source_message_ids, confidence, authority, created_at_ms, updated_at_ms, expires_at_ms, status, "
                    "superseded_by, tokens, embedding FROM memories")
    raw.rollback()
    as_scope(raw, A)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        raw.execute("UPDATE memories SET tenant_id = 'tenant-b'")  # moving a row out of the scope
    raw.rollback()
    as_scope(raw, A)
    # other scopes' rows are invisible to UPDATE and DELETE too
    assert raw.execute("DELETE FROM memories WHERE tenant_id = 'tenant-b'").rowcount == 0
    assert raw.execute("UPDATE messages SET text = 'x' WHERE user_id = 'bob'").rowcount == 0
    raw.rollback()
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        raw.execute("INSERT INTO kb_documents VALUES ('tenant-a', 'x', 1, 't', 1, '[]', '{}', 0, true, false, 0)")
    raw.rollback()


def test_store_reads_are_scoped_by_the_database(store, monkeypatch):
    """Even a store query that forgot its WHERE clause cannot leak: RLS filters it."""
    rows = store._query(A, "SELECT tenant_id, user_id FROM memories")
    assert rows == [("tenant-a", "alice")]
    assert store._query(None, "SELECT count(*) FROM memories")[0][0] == 0


def test_superuser_store_reports_rls_not_enforced():
    from sidecar.store.postgres_store import PostgresStore

    admin = pg_admin()
    name = pg_create_schema(admin, "t_super")
    try:
        s = PostgresStore(admin.info.dsn, schema=name)  # the admin role: superuser
        assert s.rls_enforced is False
        assert s.schema_version() == LATEST_VERSION
        s.migrate()  # idempotent
        s.close()
    finally:
        pg_drop_schema(admin, name)
        admin.close()


# ---------------------------------------------------------------------------- seq numbers across processes
def _append_worker(dsn: str, schema: str, worker: int, n: int) -> None:
    from sidecar.store.postgres_store import PostgresStore

    s = PostgresStore(dsn, schema=schema, min_size=1, max_size=2)
    scope = Scope("tenant-mp", "u")
    for i in range(n):
        s.append_messages(scope, "s1", msgs(f"p{worker}-{i}a", f"p{worker}-{i}b"), counts(2), i)
    s.close()


def test_concurrent_appenders_in_several_processes(store, schema):
    scope = Scope("tenant-mp", "u")
    new_session(store, scope)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_append_worker, args=(pg_app_dsn(), schema, w, 15)) for w in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    stored = store.list_messages(scope, "s1")
    assert [m.seq for m in stored] == list(range(1, 91))
    by_text = {m.text: m.seq for m in stored}
    assert all(by_text[f"p{w}-{i}b"] == by_text[f"p{w}-{i}a"] + 1 for w in range(3) for i in range(15))


# ---------------------------------------------------------------------------- change feed
def test_writes_append_changes(store):
    scope = Scope("tenant-cf", "carol")
    start = store.current_change_seq()
    new_session(store, scope)
    store.append_messages(scope, "s1", msgs("hello"), counts(1), 1)
    store.append_messages(scope, "s1", [], [], 1)  # nothing stored: no change
    m = memory("m-cf")
    store.put_memories(scope, [(m, b"")], [MemoryChange(m, "add", "", 1)])
    store.delete_memory(scope, "m-cf", MemoryChange(memory("m-cf", ""), "delete", "", 2))
    got = store.changes_since(start)
    assert [(c.tenant_id, c.user_id, c.kind, c.key) for c in got] == [
        ("tenant-cf", "carol", "message", "s1"), ("tenant-cf", "carol", "memory", "m-cf"),
        ("tenant-cf", "carol", "memory_delete", "m-cf")]
    assert [c.seq for c in got] == sorted(c.seq for c in got) and got[0].seq > start
    assert store.current_change_seq() == got[-1].seq
    assert store.changes_since(got[0].seq, limit=1) == [got[1]]
    assert all(isinstance(c, Change) and c.at_ms > 1_600_000_000_000 for c in got)

    store.forget_user(scope)
    after = store.changes_since(start)
    assert [(c.kind, c.key, c.user_id) for c in after] == [("forget", "", "carol")]  # earlier ones purged


class Collector:
    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.arrived = threading.Condition()

    def __call__(self, batch: list[Change]) -> None:
        with self.arrived:
            self.changes.extend(batch)
            self.arrived.notify_all()

    def wait_for(self, pred, timeout: float) -> bool:
        with self.arrived:
            return self.arrived.wait_for(lambda: pred(self.changes), timeout)


def test_notify_reaches_the_feed_quickly(store):
    """With a 30 s poll interval, only the NOTIFY can deliver within the bound."""
    scope = Scope("tenant-notify", "dave")
    new_session(store, scope)
    sink = Collector()
    feed = ChangeFeed(store, sink, poll_interval_ms=30_000).start()
    try:
        assert feed.listening.wait(5)
        time.sleep(0.2)  # let the first (empty) drain finish so the feed is waiting on LISTEN
        delays, after_commit = [], []
        for i in range(5):
            t0 = time.perf_counter()
            store.append_messages(scope, "s1", msgs(f"n{i}"), counts(1), i)
            t1 = time.perf_counter()
            assert sink.wait_for(lambda ch, i=i: len([c for c in ch if c.tenant_id == "tenant-notify"]) > i, 2.0)
            t2 = time.perf_counter()
            delays.append((t2 - t0) * 1000)
            after_commit.append((t2 - t1) * 1000)
        print(f"\nNOTIFY -> callback delay (ms), write start to callback: "
              f"{', '.join(f'{d:.2f}' for d in delays)}; after the write returned: "
              f"{', '.join(f'{d:.2f}' for d in after_commit)}; max {max(delays):.2f}")
        assert max(delays) < 1000
        assert feed.notifications >= 5
    finally:
        feed.close(timeout=35)


def test_missed_notification_is_recovered_by_polling(store):
    scope = Scope("tenant-miss", "erin")
    new_session(store, scope)
    sink = Collector()
    # 1. a change whose NOTIFY never comes (inserted without pg_notify): the poll finds it
    feed = ChangeFeed(store, sink, poll_interval_ms=250).start()
    try:
        assert feed.listening.wait(5)
        with store._tx(scope) as cur:
            cur.execute("INSERT INTO change_log (tenant_id, user_id, kind, key) VALUES (%s, %s, 'message', 's1')",
                        [scope.tenant_id, scope.user_id])
        t0 = time.perf_counter()
        assert sink.wait_for(lambda ch: any(c.tenant_id == "tenant-miss" for c in ch), 3.0)
        print(f"\nchange without NOTIFY recovered by polling after {(time.perf_counter() - t0) * 1000:.0f} ms "
              f"(poll interval 250 ms)")
        cursor = feed.cursor
    finally:
        feed.close()
    # 2. the feed (callback) is not running while writes happen: a new feed from the old cursor
    #    catches up, in order, with nothing lost
    for i in range(3):
        store.append_messages(scope, "s1", msgs(f"offline {i}"), counts(1), i)
    later = Collector()
    feed = ChangeFeed(store, later, since=cursor, poll_interval_ms=60_000, listen=False).start()
    try:
        assert later.wait_for(lambda ch: len([c for c in ch if c.tenant_id == "tenant-miss"]) >= 3, 3.0)
        mine = [c for c in later.changes if c.tenant_id == "tenant-miss"]
        assert [c.kind for c in mine] == ["message"] * 3 and all(c.seq > cursor for c in mine)
    finally:
        feed.close(timeout=65)


def test_callback_failure_redelivers(store):
    scope = Scope("tenant-retry", "fay")
    new_session(store, scope)
    seen: list[list[int]] = []
    ok = threading.Event()

    def flaky(batch: list[Change]) -> None:
        seen.append([c.seq for c in batch])
        if len(seen) == 1:
            raise RuntimeError("replica busy")
        ok.set()

    feed = ChangeFeed(store, flaky, poll_interval_ms=100).start()
    try:
        assert feed.listening.wait(5)
        store.append_messages(scope, "s1", msgs("x"), counts(1), 1)
        assert ok.wait(5)
        assert seen[0] == seen[1][: len(seen[0])]  # the failed batch came again
    finally:
        feed.close()


def test_concurrent_writers_feed_misses_nothing_and_stays_ordered(store):
    """change_log seq order is commit order: a cursor-following reader never skips a change even
    while several writers commit at once."""
    sink = Collector()
    feed = ChangeFeed(store, sink, poll_interval_ms=50).start()
    scopes = [Scope("tenant-race", f"u{w}") for w in range(4)]
    for s in scopes:
        new_session(store, s)

    def writer(s: Scope) -> None:
        for i in range(25):
            store.append_messages(s, "s1", [NewMessage(Role.USER, f"{i}")], counts(1), i)

    try:
        threads = [threading.Thread(target=writer, args=(s,)) for s in scopes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sink.wait_for(lambda ch: len([c for c in ch if c.tenant_id == "tenant-race"]) >= 100, 10)
    finally:
        feed.close()
    delivered = [c.seq for c in sink.changes]
    assert delivered == sorted(delivered) and len(delivered) == len(set(delivered))
    everything = [c.seq for c in store.changes_since(0, limit=100_000) if c.tenant_id == "tenant-race"]
    assert [s for s in delivered if s in set(everything)] == everything
