"""ImportSessions (issue #32, bulk ingest): past conversations stored as new sessions in one call and
one transaction store what CreateSession, AppendMessages and CommitTurn of each session store; a bad
field anywhere, a taken id or a failed write stores nothing; the user's timeline follows the
sessions' dates whatever their order in the call."""

from __future__ import annotations

import datetime as dt

import grpc
import numpy as np
import pytest

from sidecar.api import context_service_pb2 as pb
from sidecar.domain import Scope
from sidecar.memory.episodic.columns import StrLookup
from sidecar.memory.episodic.snapshots import unpack
from sidecar.services import limits
from tests.grpc_assert import expect_status
from tests.test_bulk_ingest import QUESTIONS, SESSIONS, _FailingInsert, _messages, _replay, _stored
from tests.test_memory import _memories as listed_memories


def _past(day: int, turns: list[str], **kw) -> pb.ImportedSession:
    return pb.ImportedSession(session_id=f"s{day}", messages=_messages(turns, day), **kw)


def _import(stub, scope: pb.Scope, sessions: list[pb.ImportedSession], **kw) -> pb.ImportSessionsResponse:
    return stub.ImportSessions(pb.ImportSessionsRequest(scope=scope, sessions=sessions, **kw))


def _wait(stub, scope: pb.Scope) -> None:
    while not stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, timeout_ms=30_000)).all_finished:
        pass


def test_an_import_stores_what_a_replay_of_each_session_stores(fresh_server):
    stub = fresh_server.stub
    imported, replayed = (pb.Scope(tenant_id="import", user_id=u) for u in ("imported", "replayed"))
    # Given newest first: the timeline still follows the dates.
    answer = _import(stub, imported, [_past(day, turns) for day, turns in reversed(list(enumerate(SESSIONS)))])
    _wait(stub, imported)
    _replay(stub, replayed, whole=True)
    got, want = _stored(stub, imported), _stored(stub, replayed)
    messages, memories, recalled = got
    assert len(messages) == sum(map(len, SESSIONS)) and memories and any(recalled)
    assert "sk-live" not in repr(got)  # masked before anything was stored
    assert got == want
    # The answer: each session in request order with its message ids, secrets and jobs.
    assert [s.session.session_id for s in answer.sessions] == ["s2", "s1", "s0"]
    assert [len(s.message_ids) for s in answer.sessions] == [len(t) for t in reversed(SESSIONS)]
    assert [(m.message_index, m.kind) for m in answer.sessions[1].masked] == [(4, "openai_key")]
    assert all(len(s.job_ids) == 1 for s in answer.sessions)  # short sessions: nothing to summarise
    assert answer.sessions[2].session.created_at_ms == _messages(SESSIONS[0], 0)[0].client_timestamp_ms
    # The recall index holds the turns in timeline order, as a rebuild from rows would.
    state = fresh_server.app.episodic._users[("import", "imported")]
    assert list(state.ids) == [m.message_id for m in fresh_server.app.store.list_user_messages(
        Scope("import", "imported"), [1, 2])]


def test_imported_sessions_are_closed_or_open_as_asked(stub, scope):
    answer = _import(stub, scope, [_past(0, ["done"], closed=True), _past(1, ["going on"], title="t")])
    closed, open_ = (s.session for s in answer.sessions)
    assert closed.status == pb.SESSION_STATUS_CLOSED and closed.closed_at_ms > 0
    assert open_.status == pb.SESSION_STATUS_OPEN and open_.title == "t" and open_.message_count == 1
    expect_status(lambda: stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id="s0",
                                                                       messages=_messages(["more"], 0))),
                  grpc.StatusCode.FAILED_PRECONDITION, "closed")
    more = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id="s1", messages=_messages(["more"], 1)))
    assert [m.seq for m in more.messages] == [2]
    pins = _import(stub, scope, [_past(2, ["Never restart the production database."])])
    listed = stub.ListPinned(pb.ListPinnedRequest(scope=scope, session_id="s2")).pinned
    assert [p.message_id for p in listed] == list(pins.sessions[0].message_ids)


def test_a_long_session_is_summarised_after_its_import(stub, scope):
    long_turns = [f"Step {i}: the deploy of service {i} to the cluster finished after a long migration " * 12
                  for i in range(40)]
    answer = _import(stub, scope, [_past(0, long_turns), _past(1, ["short"])])
    assert [len(s.job_ids) for s in answer.sessions] == [2, 1]  # memories and summary; memories only
    _wait(stub, scope)
    jobs = [stub.GetJobStatus(pb.GetJobStatusRequest(scope=scope, job_id=j)) for j in answer.sessions[0].job_ids]
    assert {j.status for j in jobs} == {pb.JOB_STATUS_DONE}
    assert any(j.result.get("folded", "0") != "0" for j in jobs)


@pytest.mark.parametrize(("sessions", "code", "named"), [
    ([], grpc.StatusCode.INVALID_ARGUMENT, "sessions must hold"),
    ([pb.ImportedSession(session_id="a")], grpc.StatusCode.INVALID_ARGUMENT, "sessions[0].messages"),
    ([_past(0, ["x"]), pb.ImportedSession(session_id="s0", messages=_messages(["y"], 1))],
     grpc.StatusCode.INVALID_ARGUMENT, "sessions[1].session_id"),
    ([_past(0, ["x"]), pb.ImportedSession(session_id="b", messages=[pb.NewMessage(role=pb.ROLE_USER, text="ok"),
                                                                    pb.NewMessage(role=pb.ROLE_USER, text="x" * (limits.MAX_MESSAGE_TEXT + 1))])],
     grpc.StatusCode.INVALID_ARGUMENT, "sessions[1].messages[1].text"),
    ([pb.ImportedSession(session_id="b", messages=[pb.NewMessage(role=99, text="x")])],
     grpc.StatusCode.INVALID_ARGUMENT, "sessions[0].messages[0].role"),
    ([pb.ImportedSession(session_id="bad id!", messages=_messages(["x"], 0))],
     grpc.StatusCode.INVALID_ARGUMENT, "sessions[0].session_id"),
    ([pb.ImportedSession(session_id="b", title="t" * (limits.MAX_TITLE + 1), messages=_messages(["x"], 0))],
     grpc.StatusCode.INVALID_ARGUMENT, "sessions[0].title"),
    ([pb.ImportedSession(messages=_messages(["x"], 0))] * (limits.MAX_IMPORT_SESSIONS + 1),
     grpc.StatusCode.RESOURCE_EXHAUSTED, "sessions holds"),
    ([pb.ImportedSession(session_id=f"s{i}", messages=_messages(["x"] * 1001, 0)) for i in range(10)],
     grpc.StatusCode.RESOURCE_EXHAUSTED, "10010 messages"),
])
def test_a_bad_import_names_its_field_and_stores_nothing(stub, scope, sessions, code, named):
    expect_status(lambda: _import(stub, scope, sessions), code, named)
    listed = stub.ListSessions(pb.ListSessionsRequest(scope=scope, include_closed=True)).sessions
    assert list(listed) == []


def test_a_taken_session_id_stores_nothing(stub, scope):
    stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="s1"))
    expect_status(lambda: _import(stub, scope, [_past(0, ["x"]), _past(1, ["y"])]),
                  grpc.StatusCode.ALREADY_EXISTS, "'s1'")
    listed = stub.ListSessions(pb.ListSessionsRequest(scope=scope, include_closed=True)).sessions
    assert [s.session_id for s in listed] == ["s1"]


def test_an_import_that_fails_to_store_leaves_nothing_and_its_retry_stores_it_once(fresh_server, monkeypatch):
    stub, app = fresh_server.stub, fresh_server.app
    scope = pb.Scope(tenant_id="import", user_id="atomic")
    past = [_past(day, turns) for day, turns in enumerate(SESSIONS)]
    backend = app.store.backend
    monkeypatch.setattr(backend, "_insert_many", _FailingInsert(backend._insert_many, "jobs"))
    expect_status(lambda: _import(stub, scope, past, idempotency_key="import-1"), grpc.StatusCode.INTERNAL)
    owner = Scope("import", "atomic")
    assert backend.list_user_messages(owner, [1, 2]) == [] and backend.get_session(owner, "s0") is None
    assert app.episodic.indexed(owner) == 0
    monkeypatch.undo()
    first = _import(stub, scope, past, idempotency_key="import-1")
    again = _import(stub, scope, past, idempotency_key="import-1")
    assert again == first
    assert len(backend.list_user_messages(owner, [1, 2])) == sum(map(len, SESSIONS))
    expect_status(lambda: _import(stub, scope, past[:1], idempotency_key="import-1"),
                  grpc.StatusCode.FAILED_PRECONDITION, "idempotency_key")


@pytest.mark.parametrize("with_history", [False, True], ids=["new user", "user with history"])
def test_hostile_but_valid_histories_import_and_are_recalled(stub, scope, with_history):
    if with_history:
        _import(stub, scope, [_past(0, ["I keep bees on the roof of the bakery."])])
    log = "\n".join(f"2026-12-05T10:{i % 60:02d}:00Z ERROR pool-{i} connection reset by peer (errno 104)"
                    for i in range(2000))
    words = " ".join(f"w{i}x{i * 7919 % 10007}" for i in range(5000))
    huge = ("lorem ipsum dolor " * 15_000)[:limits.MAX_MESSAGE_TEXT - 10]
    cjk = "不要在周五重启生产数据库。我喜欢喝乌龙茶 🍵🐝，周末去爬山 🏔️。" * 50
    _import(stub, scope, [_past(5, [log, "Looks like the pool is exhausted."]), _past(6, [words, huge]),
                          _past(7, [cjk, "好的，记住了 👍"])])
    asking = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    for query in ("connection reset by peer", "乌龙茶", "bees on the roof"):
        resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=asking, query=query))
        texts = " ".join(it.text for s in resp.sections for it in s.items)
        if query != "bees on the roof" or with_history:
            assert query in texts


def test_an_imports_extraction_jobs_read_their_messages_in_one_query(fresh_server, monkeypatch):
    stub, backend = fresh_server.stub, fresh_server.app.store.backend
    reads: list[str] = []
    for name in ("get_messages", "get_user_messages"):
        real = getattr(backend, name)
        monkeypatch.setattr(backend, name, lambda *a, _real=real, _name=name: reads.append(_name) or _real(*a))
    scope = pb.Scope(tenant_id="import", user_id="batched")
    _import(stub, scope, [_past(day, turns) for day, turns in enumerate(SESSIONS)])
    _wait(stub, scope)
    assert reads == ["get_user_messages"]
    memories = stub.ListMemories(pb.ListMemoriesRequest(scope=scope, page_size=100)).memories
    assert {"I prefer concise answers with code first.", "I always run the integration tests before merging."} <= {
        m.content for m in memories}


def test_a_failed_prefetch_leaves_each_job_to_read_for_itself(fresh_server, monkeypatch):
    stub, backend = fresh_server.stub, fresh_server.app.store.backend

    def broken(*args):
        raise RuntimeError("connection lost")

    monkeypatch.setattr(backend, "get_user_messages", broken)
    scope = pb.Scope(tenant_id="import", user_id="unbatched")
    _import(stub, scope, [_past(day, turns) for day, turns in enumerate(SESSIONS)])
    _wait(stub, scope)
    memories = stub.ListMemories(pb.ListMemoriesRequest(scope=scope, page_size=100)).memories
    assert "I prefer concise answers with code first." in {m.content for m in memories}


def test_kill9_during_imports_leaves_each_whole_or_absent(spawn):
    """The process killed while imports are in flight: after a restart each import is there whole
    (every session, every message, its jobs run) or not at all; a retry of one that was not
    acknowledged stores it (or finds it there whole: ALREADY_EXISTS)."""
    import threading
    import time

    db = "kill.duckdb"
    proc = spawn(db_name=db)
    scope = pb.Scope(tenant_id="import", user_id="killed")
    texts = [f"Turn {k}: the migration of shard {k} finished after a long night of copying rows." * 8
             for k in range(40)]

    def request(n: int) -> pb.ImportSessionsRequest:
        return pb.ImportSessionsRequest(scope=scope, idempotency_key=f"imp-{n}", sessions=[
            pb.ImportedSession(session_id=f"i{n}-s{k}", messages=_messages(texts, n * 10 + k)) for k in range(5)])

    acked: list[int] = []
    sent: list[int] = []

    def load(stub) -> None:
        for n in range(1000):
            sent.append(n)
            try:
                stub.ImportSessions(request(n), timeout=30)
            except grpc.RpcError:
                return
            acked.append(n)

    worker = threading.Thread(target=load, args=(proc.stub,), daemon=True)
    worker.start()
    deadline = time.monotonic() + 30
    while len(acked) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.05)
    proc.kill9()
    worker.join(10)
    assert len(acked) >= 3 and len(sent) == len(acked) + 1  # one import was in flight

    again = spawn(db_name=db)
    stub = again.stub
    listed = {s.session_id: s.message_count for s in
              stub.ListSessions(pb.ListSessionsRequest(scope=scope, include_closed=True, page_size=500)).sessions}
    for n in sent:
        present = [listed.get(f"i{n}-s{k}") for k in range(5)]
        if n in acked:
            assert present == [len(texts)] * 5, (n, present)
        else:
            assert present in ([None] * 5, [len(texts)] * 5), (n, present)  # whole or absent
            try:
                stub.ImportSessions(request(n), timeout=30)
            except grpc.RpcError as e:  # landed whole before the kill, its answer not yet recorded
                assert e.code() == grpc.StatusCode.ALREADY_EXISTS and present == [len(texts)] * 5, e.details()
    _wait(stub, scope)
    total = len(stub.ListSessions(pb.ListSessionsRequest(scope=scope, include_closed=True, page_size=500)).sessions)
    assert total == 5 * len(sent)  # each import once, the retried ones included
    stored = stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=f"i{acked[0]}-s4", newest=100)).messages
    assert [m.text for m in stored] == texts


def test_a_session_whose_summary_job_reads_its_view_is_cached_as_a_load_would_make_it(fresh_server, monkeypatch):
    """The view kept at import equals the one loaded from rows, pins included; the summary job then
    reads it without a load (no session row read), and its fold is what it was."""
    app, stub = fresh_server.app, fresh_server.stub
    scope = pb.Scope(tenant_id="t", user_id="viewed")
    long_turns = [f"Step {i}: the deploy of service {i} to the cluster finished after a long migration " * 12
                  for i in range(40)] + ["Never restart the production database without a ticket."]
    loads = []
    original = app.store.backend.get_session
    monkeypatch.setattr(app.store.backend, "get_session", lambda *a: loads.append(a) or original(*a))
    answer = _import(stub, scope, [_past(0, long_turns), _past(1, ["short"])])
    _wait(stub, scope)
    assert loads == []  # the summary job found its view cached
    own = Scope("t", "viewed")
    long_id, short_id = (s.session.session_id for s in answer.sessions)
    kept = app.store._cached(own, long_id)
    assert kept is not None and app.store._cached(own, short_id) is None  # no job reads the short one's view
    assert kept.pinned and kept.summary is not None  # the prohibition pinned; the job folded into the summary
    app.store.evict_user(own)
    loaded = app.store.session_view(own, long_id)
    assert loads and loaded is not kept
    assert (loaded.session, loaded.messages, loaded.pinned) == (kept.session, kept.messages, kept.pinned)
    assert (loaded.summary, loaded.tool_results, loaded.notes, loaded.subsession_results, loaded.confirmed) == \
        (kept.summary, kept.tool_results, kept.notes, kept.subsession_results, kept.confirmed)


def _index_of(app, scope: pb.Scope):
    return app.episodic._users[(scope.tenant_id, scope.user_id)]


def _recall(app, scope: pb.Scope) -> list[tuple[list[str], list[float]]]:
    """Each question's recalled texts, best first, and their scores."""
    out = []
    for q in QUESTIONS:
        state, rows, scores = app.episodic.search(Scope(scope.tenant_id, scope.user_id), q, "", 4000)
        out.append(([state.texts[r] for r in rows.tolist()], scores.tolist()))
    return out


def test_a_history_imported_session_by_session_is_indexed_as_one_imported_at_once(fresh_server, monkeypatch):
    """Sessions imported one call each, in date order, are added to the user's recall index in memory
    (no rebuild from rows after the first); the index ranks as one built from rows. A session dated
    before the user's others (an out-of-order import, or history imported after a live session)
    rebuilds the index in timeline order."""
    stub, app = fresh_server.stub, fresh_server.app
    reads: list[str] = []
    rows_of = app.store.list_user_messages

    def counted(s, roles, newest=None):
        reads.append(s.user_id)
        return rows_of(s, roles, newest)

    monkeypatch.setattr(app.store, "list_user_messages", counted)
    by_session, at_once, backwards = (pb.Scope(tenant_id="import-steps", user_id=u) for u in ("steps", "once", "back"))
    days = [*enumerate(SESSIONS), *((day + 3, [t.replace("I", "We") for t in turns]) for day, turns in enumerate(SESSIONS))]
    for day, turns in days:
        _import(stub, by_session, [_past(day, turns)])
    assert reads == []  # the first import was the user's whole history: indexed as imported, not read back
    _import(stub, at_once, [_past(day, turns) for day, turns in days])
    for day, turns in reversed(days):  # each before the others: rebuilt every time after the first
        _import(stub, backwards, [_past(day, turns)])
    assert reads.count("back") == len(days) - 1 and "once" not in reads
    for scope in (by_session, at_once, backwards):
        state = _index_of(app, scope)
        assert list(state.ids) == [m.message_id for m in rows_of(Scope(scope.tenant_id, scope.user_id), [1, 2])]
    assert _recall(app, by_session) == _recall(app, at_once) == _recall(app, backwards)
    # A live session (created now), then a past one imported: it sorts before the live one, so the
    # index is rebuilt in timeline order.
    live = stub.CreateSession(pb.CreateSessionRequest(scope=by_session)).session_id
    stub.AppendMessages(pb.AppendMessagesRequest(scope=by_session, session_id=live, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="Today I repotted the basil.")]))
    reads.clear()
    _import(stub, by_session, [_past(9, ["Last year I grew tomatoes on the balcony."])])
    assert reads == ["steps"]
    state = _index_of(app, by_session)
    assert list(state.ids) == [m.message_id for m in rows_of(Scope("import-steps", "steps"), [1, 2])]


def _rebuilt(app, scope: pb.Scope):
    """The user's index built again from rows, as a restart would build it."""
    own = Scope(scope.tenant_id, scope.user_id)
    app.episodic.drop_user(own)
    app.episodic._user(own, warm=True)
    return _index_of(app, scope)


def test_a_new_users_import_is_indexed_from_its_turns_as_rows_would_index_it(fresh_server):
    stub, app = fresh_server.stub, fresh_server.app
    scope = pb.Scope(tenant_id="import-whole", user_id="new")
    hostile = ["数据库 restart 禁止 😀 " * 300, "ERROR pod-7 OOMKilled\n" * 400, "I told you: my DB is Postgres."]
    # Given newest first, a session of tool output between them: the index holds the turns in timeline order.
    _import(stub, scope, [_past(3, hostile), _past(0, SESSIONS[0]), _past(1, SESSIONS[1], closed=True)])
    built = _index_of(app, scope)
    assert len(built) == len(hostile) + len(SESSIONS[0]) + len(SESSIONS[1])
    meta, recalled = app.episodic._meta(), _recall(app, scope)
    frozen = _saved(built, meta)
    rebuilt = _rebuilt(app, scope)
    assert recalled and _recall(app, scope) == recalled and _saved(rebuilt, meta) == frozen


def _saved(state, meta: tuple) -> dict:
    """What the index saves (its snapshot's state) in comparable form: arrays and lookups as lists."""
    def plain(x):
        if isinstance(x, np.ndarray):
            return (str(x.dtype), x.tolist())
        if isinstance(x, StrLookup):
            return plain(x.column.tolist()), plain(x._slots)
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [plain(v) for v in x]
        return x

    return plain(unpack(state.freeze(meta)))


def test_an_import_whose_turn_is_deleted_before_it_is_indexed_is_indexed_without_it(fresh_server):
    """A deletion that lands between the import's commit and its indexing: the imported turns are no
    longer the user's messages, so the index is read from rows."""
    stub, app = fresh_server.stub, fresh_server.app
    scope = pb.Scope(tenant_id="import-whole", user_id="raced")
    own = Scope(scope.tenant_id, scope.user_id)
    index_import = app.episodic.on_import
    deleted: list[str] = []

    def deleting_first(s, batch):
        victim = batch[0].plan.out[2]
        app.deletion.delete_messages(s, victim.session_id, [victim.message_id])
        deleted.append(victim.message_id)
        index_import(s, batch)

    app.store.import_listeners[app.store.import_listeners.index(index_import)] = deleting_first
    try:
        _import(stub, scope, [_past(day, turns) for day, turns in enumerate(SESSIONS)])
    finally:
        app.store.import_listeners[app.store.import_listeners.index(deleting_first)] = index_import
    state = _index_of(app, scope)
    assert deleted and deleted[0] not in state.known and len(state) == sum(map(len, SESSIONS)) - 1
    assert list(state.ids) == [m.message_id for m in app.store.list_user_messages(own, [1, 2])]


def test_sessions_of_one_millisecond_are_indexed_in_the_databases_order(fresh_server, monkeypatch):
    """Two imported sessions that began in the same millisecond: the index takes the order the database
    gives their rows (by id, in its collation), not read back."""
    stub, app = fresh_server.stub, fresh_server.app
    reads: list[str] = []
    rows_of = app.store.list_user_messages
    monkeypatch.setattr(app.store, "list_user_messages", lambda s, roles, newest=None: reads.append(s.user_id)
                        or rows_of(s, roles, newest))
    scope = pb.Scope(tenant_id="import-whole", user_id="same-ms")
    twins = [pb.ImportedSession(session_id=sid, messages=_messages(turns, 0)) for sid, turns in (("b", SESSIONS[1]),
                                                                                                 ("A", SESSIONS[0]))]
    _import(stub, scope, twins)
    assert reads == []
    assert list(_index_of(app, scope).ids) == [m.message_id for m in rows_of(Scope("import-whole", "same-ms"), [1, 2])]


def _memories(stub, scope: pb.Scope, inactive: bool = False) -> dict[str, pb.Memory]:
    """tests/test_memory.py's listing, by content."""
    return {m.content: m for m in listed_memories(stub, scope, inactive)}


def test_a_history_imported_after_a_newer_statement_is_its_history(stub, scope):
    """Memories are dated when they were said: an imported history's statements, older than what the
    user has said since, become that memory's history instead of replacing it, whatever the order of
    the sessions in the call."""
    live = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    said = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=live, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="Our production database is PostgreSQL now.")])).messages
    stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=live))
    _wait(stub, scope)
    [current] = _memories(stub, scope).values()
    assert current.created_at_ms == said[0].timestamp_ms
    past = [_past(1, ["Our production database is MySQL 8."]), _past(0, ["Our production database is Oracle."])]
    answer = _import(stub, scope, past)  # newest first
    _wait(stub, scope)
    assert list(_memories(stub, scope)) == [current.content]
    everything = _memories(stub, scope, inactive=True)
    for session, content in zip(answer.sessions, ("Our production database is MySQL 8.",
                                                  "Our production database is Oracle."), strict=True):
        old = everything[content]
        assert old.status == pb.MEMORY_STATUS_SUPERSEDED and old.superseded_by == current.memory_id
        assert list(old.source_message_ids) == list(session.message_ids)
        assert old.created_at_ms == session.session.created_at_ms  # when it was said
        changes = stub.GetMemoryHistory(pb.GetMemoryHistoryRequest(scope=scope, memory_id=old.memory_id)).changes
        assert [c.action for c in changes] == ["create", "supersede"]
    asking = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=asking,
                                                    query="Which production database do we run?"))
    packed = [it.source for s in resp.sections for it in s.items if it.source.startswith("memory:")]
    assert packed == [f"memory:{current.memory_id}"]
    superseded = {d.source for d in resp.dropped if d.reason == pb.DROP_REASON_SUPERSEDED}
    assert superseded == {f"memory:{everything[c].memory_id}" for c in everything if c != current.content}


def test_a_recalled_turn_of_an_imported_history_says_when_it_was_superseded(stub, scope):
    """The mark on a superseded statement's turn names the day its successor was said, not the day
    the history was imported."""
    past = [_past(0, ["Our production database is MySQL 8."]), _past(9, ["Our production database is Oracle now."])]
    _import(stub, scope, past)
    _wait(stub, scope)
    asking = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=asking, query="MySQL 8 production database"))
    [marked] = [it.text for s in resp.sections for it in s.items if "MySQL 8" in it.text and it.source.startswith("message:")]
    said = dt.datetime.fromtimestamp(past[1].messages[0].client_timestamp_ms / 1000, dt.UTC)
    assert marked.startswith(f"[superseded on {said.day} {said.strftime('%B')} {said.year} by: Our production database is Oracle now.]")


def test_an_imported_history_keeps_its_newest_statement_whatever_the_sessions_order(stub, scope):
    _import(stub, scope, [_past(2, ["From now on answer in Spanish."]), _past(1, ["From now on answer in German."])])
    _wait(stub, scope)
    assert list(_memories(stub, scope)) == ["From now on answer in Spanish."]
    newest = _memories(stub, scope)["From now on answer in Spanish."]
    older = _memories(stub, scope, inactive=True)["From now on answer in German."]
    assert older.superseded_by == newest.memory_id and older.created_at_ms < newest.created_at_ms


def test_a_memorys_recency_counts_to_the_time_of_asking(stub, scope):
    """A replayed history asked about at its own time of asking scores its memories as they scored
    then; asked about years later (the server's clock), they carry no recency."""
    _import(stub, scope, [_past(0, ["Our production database is MySQL 8."])])
    _wait(stub, scope)
    [memory] = _memories(stub, scope).values()

    def score(asked_at_ms: int) -> float:
        asking = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=asking, asked_at_ms=asked_at_ms,
                                                        query="Which production database do we run?"))
        [item] = [it for s in resp.sections for it in s.items if it.source == f"memory:{memory.memory_id}"]
        return item.score

    then, years_later = score(memory.created_at_ms + 3_600_000), score(0)
    assert then > years_later + 0.3
