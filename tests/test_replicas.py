"""Two sidecar processes on one PostgreSQL schema: what one writes the other serves; caches and
indexes follow the change feed; kill -9 of one replica loses no acknowledged write."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from tests.pg import pg_admin, pg_create_schema, pg_drop_schema, pg_url


@pytest.fixture
def pg_store() -> Iterator[str]:
    admin = pg_admin()
    schema = pg_create_schema(admin, "t_replicas")
    try:
        yield pg_url(schema)
    finally:
        pg_drop_schema(admin, schema)
        admin.close()


def _until(predicate, timeout: float = 10.0) -> float:
    """Seconds until predicate() holds (fails the test after timeout)."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, "replica did not catch up in time"
        time.sleep(0.02)
    return time.monotonic() - start


def test_write_on_one_read_on_the_other(spawn, pg_store):
    a = spawn(db_name="a.duckdb", extra=["--store", pg_store])
    b = spawn(db_name="b.duckdb", extra=["--store", pg_store])
    s = pb.Scope(tenant_id="t", user_id="alice")
    sid = a.stub.CreateSession(pb.CreateSessionRequest(scope=s)).session_id
    a.stub.AppendMessages(pb.AppendMessagesRequest(scope=s, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="first turn on replica A")]))
    # B serves the session (and caches it) ...
    ctx = b.stub.BuildContext(pb.BuildContextRequest(scope=s, session_id=sid, query="?"))
    assert "first turn on replica A" in [it.text.split(": ", 1)[-1] for sec in ctx.sections for it in sec.items]
    # ... then A appends again: B's cached view must be evicted by the change feed.
    a.stub.AppendMessages(pb.AppendMessagesRequest(scope=s, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="second turn on replica A")]))

    def b_sees_second() -> bool:
        c = b.stub.BuildContext(pb.BuildContextRequest(scope=s, session_id=sid, query="?", render=pb.RENDER_MODE_TEXT))
        return "second turn on replica A" in c.rendered_text

    message_delay = _until(b_sees_second)

    b.stub.SearchMemories(pb.SearchMemoriesRequest(scope=s, query="dashboards"))  # B loads alice's memories
    a.stub.AddMemory(pb.AddMemoryRequest(scope=s, type=pb.MEMORY_TYPE_PREFERENCE,
                                         content="Prefers Grafana dashboards over raw logs"))
    memory_delay = _until(lambda: bool(b.stub.SearchMemories(pb.SearchMemoriesRequest(
        scope=s, query="grafana dashboards")).hits))
    print(f"replica catch-up: message {message_delay * 1000:.0f} ms, memory {memory_delay * 1000:.0f} ms")
    assert memory_delay < 5 and message_delay < 5

    a.stub.ForgetUser(pb.ForgetUserRequest(scope=s))
    _until(lambda: not b.stub.SearchMemories(pb.SearchMemoriesRequest(scope=s, query="grafana dashboards")).hits)
    with pytest.raises(grpc.RpcError) as e:
        b.stub.GetSession(pb.GetSessionRequest(scope=s, session_id=sid))
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_an_import_on_one_is_recalled_by_the_other(spawn, pg_store):
    a = spawn(db_name="a.duckdb", extra=["--store", pg_store])
    b = spawn(db_name="b.duckdb", extra=["--store", pg_store])
    s = pb.Scope(tenant_id="t", user_id="bob")
    asking = b.stub.CreateSession(pb.CreateSessionRequest(scope=s, session_id="asking")).session_id
    query = "which kiln did I buy for pottery?"

    def b_recalls_the_kiln() -> bool:
        c = b.stub.BuildContext(pb.BuildContextRequest(scope=s, session_id=asking, query=query,
                                                       render=pb.RENDER_MODE_TEXT))
        return "Skutt kiln" in c.rendered_text

    assert not b_recalls_the_kiln()  # B has built bob's (empty) recall index
    a.stub.ImportSessions(pb.ImportSessionsRequest(scope=s, sessions=[pb.ImportedSession(
        session_id="past", closed=True, messages=[
            pb.NewMessage(role=pb.ROLE_USER, text="I bought a Skutt kiln for my pottery studio.",
                          client_timestamp_ms=1_700_000_000_000),
            pb.NewMessage(role=pb.ROLE_ASSISTANT, text="Great choice for a home studio.",
                          client_timestamp_ms=1_700_000_001_000)])]))
    assert _until(b_recalls_the_kiln) < 5


def test_kill9_one_replica_under_load_loses_nothing(spawn, pg_store):
    a = spawn(db_name="a.duckdb", extra=["--store", pg_store])
    b = spawn(db_name="b.duckdb", extra=["--store", pg_store])
    s = pb.Scope(tenant_id="t", user_id="bob")
    sid = a.stub.CreateSession(pb.CreateSessionRequest(scope=s)).session_id
    acked: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set():
            try:
                out = a.stub.AppendMessages(pb.AppendMessagesRequest(scope=s, session_id=sid, messages=[
                    pb.NewMessage(role=pb.ROLE_USER, text=f"load {i}", idempotency_key=f"k{i}")]), timeout=5)
            except (grpc.RpcError, ValueError):  # ValueError: kill9 closed the channel between two calls
                return
            acked.extend(m.text for m in out.messages)
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    time.sleep(1.0)
    a.kill9()
    stop.set()
    t.join(10)
    assert len(acked) > 10
    stored = b.stub.ListMessages(pb.ListMessagesRequest(scope=s, session_id=sid, newest=10000)).messages
    texts = [m.text for m in stored]
    assert set(acked) <= set(texts) and len(texts) == len(set(texts))
    assert [m.seq for m in stored] == list(range(1, len(stored) + 1))
    # B keeps serving writes and reads.
    b.stub.AppendMessages(pb.AppendMessagesRequest(scope=s, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="after the crash")]))
    assert b.stub.BuildContext(pb.BuildContextRequest(scope=s, session_id=sid, query="?")).total_tokens > 0
