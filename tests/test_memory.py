"""Long-term memory through the real server: extraction after the turn, filters, supersede,
CRUD with history, isolation, forget-user, restart."""

import random

import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from tests.grpc_assert import expect_status


def _turn(stub, scope, sid, *texts, role=pb.ROLE_USER):
    msgs = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=role, text=t) for t in texts])).messages
    jobs = stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid,
                                                message_ids=[m.message_id for m in msgs])).job_ids
    done = stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs, timeout_ms=20000))
    assert done.all_finished and all(j.status == pb.JOB_STATUS_DONE for j in done.jobs), done
    return msgs, done.jobs


def _memories(stub, scope, inactive=False):
    return stub.ListMemories(pb.ListMemoriesRequest(scope=scope, include_inactive=inactive, page_size=500)).memories


def test_pipeline_preference_supersede_secret_smalltalk(stub, scope, session_id):
    first, _ = _turn(stub, scope, session_id, "以后默认查测试环境")
    [m1] = _memories(stub, scope)
    assert m1.type == pb.MEMORY_TYPE_PREFERENCE and m1.authority == pb.AUTHORITY_USER_STATED
    assert list(m1.source_message_ids) == [first[0].message_id] and m1.confidence >= 0.7

    second, _ = _turn(stub, scope, session_id, "以后默认查生产环境")
    active = _memories(stub, scope)
    assert [m.content for m in active] == ["以后默认查生产环境"]
    everything = {m.memory_id: m for m in _memories(stub, scope, inactive=True)}
    old = everything[m1.memory_id]
    assert old.status == pb.MEMORY_STATUS_SUPERSEDED and old.superseded_by == active[0].memory_id
    history = stub.GetMemoryHistory(pb.GetMemoryHistoryRequest(scope=scope, memory_id=m1.memory_id)).changes
    assert [c.action for c in history] == ["create", "supersede"]

    _, jobs = _turn(stub, scope, session_id, "以后默认用这个密码登录：Hunter2xyz!9q", "好的", "ok thanks")
    result = jobs[0].result
    assert result["rejected_secret"] == "1" and result["skipped_low_information_turns"] == "2"
    texts = [m.content for m in _memories(stub, scope, inactive=True)]
    assert not any("Hunter2" in t for t in texts) and len(texts) == 2

    # Saying the same thing again merges instead of storing twice.
    again, _ = _turn(stub, scope, session_id, "以后默认查生产环境")
    [merged] = _memories(stub, scope)
    assert set(merged.source_message_ids) == {second[0].message_id, again[0].message_id}


def test_commit_turn_without_ids_takes_uncommitted_messages(stub, scope, session_id):
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=session_id, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="I prefer concise answers with the commands first.")]))
    jobs = stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=session_id)).job_ids
    assert len(jobs) >= 1
    stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs))
    assert [m.subject for m in _memories(stub, scope)] == ["answer_style"]
    assert not stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=session_id)).job_ids
    job = stub.GetJobStatus(pb.GetJobStatusRequest(scope=scope, job_id=jobs[0]))
    assert job.status == pb.JOB_STATUS_DONE and job.kind == "extract_memories"
    expect_status(lambda: stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=session_id,
                                                                message_ids=["msg_nope"])),
                  grpc.StatusCode.NOT_FOUND, "message_ids[0]")
    other = pb.Scope(tenant_id=scope.tenant_id, user_id="eve")
    expect_status(lambda: stub.GetJobStatus(pb.GetJobStatusRequest(scope=other, job_id=jobs[0])),
                  grpc.StatusCode.NOT_FOUND)


def test_add_search_update_delete_history(stub, scope):
    add = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                             content="Our payment-api runs on k8s-prod-3 in eu-west-1"))
    assert add.outcome == pb.WRITE_OUTCOME_CREATED and add.memory.confidence == 1.0
    stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_HABIT, content="Checks Grafana every morning"))
    hits = stub.SearchMemories(pb.SearchMemoriesRequest(scope=scope, query="where does payment-api run?")).hits
    assert hits[0].memory.memory_id == add.memory.memory_id and hits[0].lexical_score > 0
    only_habits = stub.SearchMemories(pb.SearchMemoriesRequest(scope=scope, query="payment-api grafana",
                                                               types=[pb.MEMORY_TYPE_HABIT])).hits
    assert [h.memory.type for h in only_habits] == [pb.MEMORY_TYPE_HABIT]
    dup = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                             content="our payment-api runs on k8s-prod-3 in eu-west-1."))
    assert dup.outcome == pb.WRITE_OUTCOME_MERGED and dup.memory.memory_id == add.memory.memory_id

    upd = stub.UpdateMemory(pb.UpdateMemoryRequest(scope=scope, memory_id=add.memory.memory_id,
                                                   content="Our payment-api runs on k8s-prod-4 in eu-central-1"))
    assert "k8s-prod-4" in upd.content
    hits = stub.SearchMemories(pb.SearchMemoriesRequest(scope=scope, query="k8s-prod-4")).hits
    assert hits[0].memory.memory_id == add.memory.memory_id
    actions = [c.action for c in stub.GetMemoryHistory(pb.GetMemoryHistoryRequest(
        scope=scope, memory_id=add.memory.memory_id)).changes]
    assert actions == ["create", "merge", "update"]

    stub.DeleteMemory(pb.DeleteMemoryRequest(scope=scope, memory_id=add.memory.memory_id))
    assert all(h.memory.memory_id != add.memory.memory_id for h in stub.SearchMemories(
        pb.SearchMemoriesRequest(scope=scope, query="payment-api k8s-prod-4")).hits)
    tomb = stub.GetMemoryHistory(pb.GetMemoryHistoryRequest(scope=scope, memory_id=add.memory.memory_id)).changes
    assert [(c.action, c.memory.content) for c in tomb] == [("delete", "")]
    expect_status(lambda: stub.DeleteMemory(pb.DeleteMemoryRequest(scope=scope, memory_id=add.memory.memory_id)),
                  grpc.StatusCode.NOT_FOUND, "memory_id")


def _add(stub, scope, mtype, content, subject=""):
    return stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=mtype, content=content, subject=subject))


def _expect_both_current(stub, scope, first, second):
    assert first.outcome == second.outcome == pb.WRITE_OUTCOME_CREATED and not second.superseded_id
    assert {m.memory_id for m in _memories(stub, scope)} == {first.memory.memory_id, second.memory.memory_id}


@pytest.mark.parametrize(("mtype", "contents", "subject"), [
    (pb.MEMORY_TYPE_PREFERENCE, ["default env is staging", "default env is production"], "default_env"),
    (pb.MEMORY_TYPE_PREFERENCE, ["我默认看生产环境", "我改主意了，默认看测试环境", "默认环境是预发环境"], "default_env"),
    (pb.MEMORY_TYPE_SEMANTIC, ["My manager is Alice", "My manager is Bob"], "manager"),
    (pb.MEMORY_TYPE_SEMANTIC, ["我的经理是张三", "我的经理是李四"], "经理"),
    (pb.MEMORY_TYPE_SEMANTIC, ["I live in Boston", "I moved to Denver"], "location"),
    (pb.MEMORY_TYPE_SEMANTIC, ["我住在北京", "我搬到深圳了"], "location"),
], ids=["env-en", "env-zh", "manager-en", "manager-zh", "location-en", "location-zh"])
def test_add_memory_without_subject_supersedes_on_the_derived_one(stub, scope, mtype, contents, subject):
    """The proto derives the subject from the content when none is given: the extractor's rule, so a
    later contradicting AddMemory supersedes the earlier one as an extracted memory would."""
    first = _add(stub, scope, mtype, contents[0])
    assert first.outcome == pb.WRITE_OUTCOME_CREATED and first.memory.subject == subject
    previous = first.memory.memory_id
    for content in contents[1:]:
        answer = _add(stub, scope, mtype, content)
        assert answer.outcome == pb.WRITE_OUTCOME_SUPERSEDED_OLDER, content
        assert answer.superseded_id == previous and answer.memory.subject == subject
        previous = answer.memory.memory_id
    [active] = _memories(stub, scope)
    assert (active.content, active.memory_id) == (contents[-1], previous)
    older = [m for m in _memories(stub, scope, inactive=True) if m.memory_id != previous]
    assert len(older) == len(contents) - 1 and all(m.status == pb.MEMORY_STATUS_SUPERSEDED for m in older)


@pytest.mark.parametrize(("mtype", "a", "b"), [
    # Preferences about different things: the key is what follows the cue ("tea" vs "hiking").
    (pb.MEMORY_TYPE_PREFERENCE, "I like tea", "I like hiking"),
    (pb.MEMORY_TYPE_PREFERENCE, "我喜欢喝茶", "我喜欢爬山"),
    (pb.MEMORY_TYPE_SEMANTIC, "My manager is Alice", "My mentor is Bob"),
    (pb.MEMORY_TYPE_SEMANTIC, "My manager is Alice", "I live in Boston"),
    # Owning two production things: the environment is not what is owned.
    (pb.MEMORY_TYPE_SEMANTIC, "Owns the production billing cache", "Owns the production refund queue"),
    # No cue at all: no key (a key from the leading words, "works_payment_api", would collide).
    (pb.MEMORY_TYPE_SEMANTIC, "Works on payment api retries", "Works on payment api dashboards"),
    # Episodes are events: a second incident on payment-api does not undo the first.
    (pb.MEMORY_TYPE_EPISODE, "payment-api 5xx after a config push, fixed by rollback",
     "payment-api 5xx after a node drain, fixed by scaling out"),
], ids=["like-en", "like-zh", "manager-mentor", "manager-location", "owns-env", "no-cue", "episodes"])
def test_add_memory_without_subject_keeps_unrelated_memories(stub, scope, mtype, a, b):
    _expect_both_current(stub, scope, _add(stub, scope, mtype, a), _add(stub, scope, mtype, b))


def test_derived_subjects_conflict_only_within_a_type(stub, scope):
    pref = _add(stub, scope, pb.MEMORY_TYPE_PREFERENCE, "default env is staging")
    fact = _add(stub, scope, pb.MEMORY_TYPE_SEMANTIC, "default env is production")
    assert pref.memory.subject == fact.memory.subject == "default_env"
    _expect_both_current(stub, scope, pref, fact)


def test_add_memory_given_subject_wins_over_the_derived_one(stub, scope):
    alice = _add(stub, scope, pb.MEMORY_TYPE_SEMANTIC, "My manager is Alice", subject="Reports To")
    bob = _add(stub, scope, pb.MEMORY_TYPE_SEMANTIC, "My manager is Bob")
    assert (alice.memory.subject, bob.memory.subject) == ("reports to", "manager")
    assert bob.outcome == pb.WRITE_OUTCOME_CREATED and len(_memories(stub, scope)) == 2
    carol = _add(stub, scope, pb.MEMORY_TYPE_SEMANTIC, "Carol now", subject="reports to")
    assert carol.outcome == pb.WRITE_OUTCOME_SUPERSEDED_OLDER and carol.superseded_id == alice.memory.memory_id


def test_expired_never_recalled_but_listed_with_flag(stub, scope):
    stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                       content="Temporary freeze on payment-api deploys", expires_at_ms=1000))
    assert not stub.SearchMemories(pb.SearchMemoriesRequest(scope=scope, query="payment-api deploys freeze")).hits
    assert not _memories(stub, scope)
    [m] = _memories(stub, scope, inactive=True)
    assert m.expired


def test_memory_errors(stub, scope):
    cases = [
        (pb.AddMemoryRequest(scope=scope, content="x"), "type"),
        (pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_HABIT, content=""), "content"),
        (pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_HABIT, content="x", confidence=1.5), "confidence"),
        (pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_HABIT, content="key sk-abcdef1234567890abcdef1234"),
         "secret"),
        (pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_HABIT, content="x", embedding=[1.0, 2.0]),
         "embedding"),
    ]
    for req, fragment in cases:
        expect_status(lambda req=req: stub.AddMemory(req), grpc.StatusCode.INVALID_ARGUMENT, fragment)
    assert not _memories(stub, scope, inactive=True)
    expect_status(lambda: stub.SearchMemories(pb.SearchMemoriesRequest(scope=scope, query="x", top_k=500)),
                  grpc.StatusCode.INVALID_ARGUMENT, "top_k")
    expect_status(lambda: stub.UpdateMemory(pb.UpdateMemoryRequest(scope=scope, memory_id="mem_x", content="y")),
                  grpc.StatusCode.NOT_FOUND, "memory_id")


def test_isolation_randomized_searches(stub, scope):
    tenants = [scope.tenant_id + "-a", scope.tenant_id + "-b"]
    owners = {}
    for t in tenants:
        for u in ("u1", "u2"):
            s = pb.Scope(tenant_id=t, user_id=u)
            for i in range(15):
                m = stub.AddMemory(pb.AddMemoryRequest(
                    scope=s, type=pb.MEMORY_TYPE_SEMANTIC,
                    content=f"payment-api incident {i} handled in production by the on-call team {i % 3}")).memory
                owners[m.memory_id] = (t, u)
    rng = random.Random(5)
    words = "payment-api incident production on-call team handled 1 2 3 4 5".split()
    for _ in range(2000):
        t, u = rng.choice(tenants), rng.choice(["u1", "u2"])
        q = " ".join(rng.sample(words, 3))
        for h in stub.SearchMemories(pb.SearchMemoriesRequest(scope=pb.Scope(tenant_id=t, user_id=u), query=q,
                                                              top_k=20)).hits:
            assert owners[h.memory.memory_id] == (t, u)


def test_build_context_recalls_memories(stub, scope, session_id):
    stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE,
                                       content="Prefers concise answers", subject="answer_style"))
    new = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE,
                                             content="Prefers detailed answers with tables", subject="answer_style"))
    stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                       content="Owns the ledger-db migration project"))
    resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=session_id,
                                                    query="how is the ledger-db migration going?"))
    # A session's first call: what it recalls is the session's kept recall (cache-aware layout).
    section = next(s for s in resp.sections if s.kind == pb.SECTION_KIND_SESSION_RECALL)
    texts = [it.text for it in section.items]
    assert "- Owns the ledger-db migration project" in texts and "- Prefers detailed answers with tables" in texts
    assert "- Prefers concise answers" not in texts
    assert all(it.source.startswith("memory:") for it in section.items)
    superseded = [d for d in resp.dropped if d.reason == pb.DROP_REASON_SUPERSEDED]
    assert superseded and superseded[0].kept_source == f"memory:{new.memory.memory_id}"


def test_requests_and_reactions_compete_by_relevance_not_as_preferences(stub, scope, session_id):
    """Preferences compete on every call (scored at least PREFERENCE_FLOOR); what the user asked of a
    conversation ("I'd like to know...") or how they took a suggestion ("I like the idea of...") is kept
    as a fact that scores what it matches, so yesterday's requests do not outrank what a call is about."""
    pref = "I prefer concise answers with the commands first."
    _turn(stub, scope, session_id, pref)
    _turn(stub, scope, session_id, "I'd like to learn more about royalty rates for ebooks on Kindle.")
    _turn(stub, scope, session_id, "I like the idea of adding an ombre effect to my knitted blanket.")
    _turn(stub, scope, session_id, "I'd like to know more about sourdough starters.")
    kinds = {m.content: (m.type, m.subject) for m in _memories(stub, scope)}
    assert kinds.pop(pref) == (pb.MEMORY_TYPE_PREFERENCE, "answer_style")
    assert len(kinds) == 3 and all(t == pb.MEMORY_TYPE_SEMANTIC for t, _ in kinds.values())
    assert len({s for _, s in kinds.values()}) == 3  # none superseded another

    def memory_scores(query):
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=query))
        return {it.text[2:]: it.score for s in resp.sections for it in s.items if it.source.startswith("memory:")}

    unrelated = memory_scores("how do I rotate the nginx logs on the staging host?")
    assert all(unrelated[pref] > score for text, score in unrelated.items() if text != pref), unrelated
    related = memory_scores("what royalty rates does Kindle pay for ebooks?")
    assert related["I'd like to learn more about royalty rates for ebooks on Kindle."] > related[pref], related


def test_forget_user_leaves_nothing(fresh_server):
    stub = fresh_server.stub
    alice, bob = pb.Scope(tenant_id="t", user_id="alice"), pb.Scope(tenant_id="t", user_id="bob")
    for s in (alice, bob):
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=s)).session_id
        _turn(stub, s, sid, "I prefer concise answers.", "Our prod cluster is k8s-prod-3 in eu-west-1.")
        stub.UpsertFacts(pb.UpsertFactsRequest(scope=s, session_id=sid, facts=[
            pb.FactInput(key="env", value="prod", provenance=pb.PROVENANCE_USER_CONFIRMED)]))
        stub.StartRun(pb.StartRunRequest(scope=s, session_id=sid))
    bob_before = [m.memory_id for m in _memories(stub, bob)]
    counts = stub.ForgetUser(pb.ForgetUserRequest(scope=alice)).deleted
    assert counts["memories"] == 2 and counts["memory_index"] == 2 and counts["messages"] == 2
    conn = fresh_server.app.store.backend._conn
    from sidecar.store.duckdb_store import USER_TABLES

    for table in USER_TABLES:
        left = conn.execute(f"SELECT count(*) FROM {table} WHERE tenant_id = 't' AND user_id = 'alice'").fetchone()[0]
        assert left == 0, table
        # and no row anywhere mentions her content
    assert fresh_server.app.memories.indexed_ids(pb.Scope(tenant_id="t", user_id="alice")) == []
    assert not stub.ListSessions(pb.ListSessionsRequest(scope=alice)).sessions
    assert [m.memory_id for m in _memories(stub, bob)] == bob_before
    assert len(fresh_server.app.memories.indexed_ids(bob)) == 2


def test_memories_and_queued_jobs_survive_kill9(spawn):
    proc = spawn(db_name="mem.duckdb")
    s = pb.Scope(tenant_id="t", user_id="u")
    sid = proc.stub.CreateSession(pb.CreateSessionRequest(scope=s)).session_id
    proc.stub.AddMemory(pb.AddMemoryRequest(scope=s, type=pb.MEMORY_TYPE_HABIT, content="Reads runbooks first"))
    jobs = []
    for i in range(30):
        msgs = proc.stub.AppendMessages(pb.AppendMessagesRequest(scope=s, session_id=sid, messages=[
            pb.NewMessage(role=pb.ROLE_USER, text=f"I prefer dashboards for service-{i} over raw logs")])).messages
        jobs += proc.stub.CommitTurn(pb.CommitTurnRequest(scope=s, session_id=sid,
                                                          message_ids=[msgs[0].message_id])).job_ids
    proc.kill9()  # some jobs are still queued or running

    again = spawn(db_name="mem.duckdb")
    done = again.stub.WaitForJobs(pb.WaitForJobsRequest(scope=s, job_ids=jobs, timeout_ms=60000))
    assert done.all_finished and all(j.status == pb.JOB_STATUS_DONE for j in done.jobs)
    mems = again.stub.ListMemories(pb.ListMemoriesRequest(scope=s, page_size=500)).memories
    contents = [m.content for m in mems]
    assert len(contents) == len(set(contents)), "a job ran twice in effect"
    assert "Reads runbooks first" in contents
    hits = again.stub.SearchMemories(pb.SearchMemoriesRequest(scope=s, query="runbooks")).hits
    assert hits and hits[0].memory.content == "Reads runbooks first"


def test_context_shows_a_memory_as_it_is_now(stub, scope, session_id):
    """BuildContext keeps each memory's item bytes; an edit or a delete must never show the old text."""
    def packed() -> list[str]:
        resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=session_id,
                                                        query="which dashboard for payment-api latency?"))
        return [i.text for s in resp.sections if s.kind in (pb.SECTION_KIND_MEMORIES, pb.SECTION_KIND_SESSION_RECALL)
                for i in s.items]

    add = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE,
                                             content="Prefers the Grafana dashboard for payment-api latency"))
    assert any("Grafana" in t for t in packed())
    stub.UpdateMemory(pb.UpdateMemoryRequest(scope=scope, memory_id=add.memory.memory_id,
                                             content="Prefers the Datadog dashboard for payment-api latency"))
    now = packed()
    assert any("Datadog" in t for t in now) and not any("Grafana" in t for t in now)
    stub.DeleteMemory(pb.DeleteMemoryRequest(scope=scope, memory_id=add.memory.memory_id))
    assert not any("dashboard" in t for t in packed())


@pytest.mark.parametrize("graph", [False, True], ids=["exact", "hnsw"])
def test_memory_source_ranks_as_search_does(tmp_path, graph):
    """BuildContext's memory source reads the index's keys and scores directly; what it proposes
    (memories over the relevance floor, best first, ties by id) is what SearchMemories ranks."""
    from sidecar.app import Sidecar
    from sidecar.assembly.budget import DEFAULT_BUDGET
    from sidecar.assembly.candidates import BuildInput
    from sidecar.domain import MemoryType, Scope
    from sidecar.memory.service import MemoryInput
    from sidecar.memory.source import MIN_RELEVANCE, TOP_K, MemorySource
    from sidecar.text import query_terms

    app = Sidecar(str(tmp_path / "m.duckdb"))
    try:
        scope = Scope("t", "u")
        sid = app.sessions.create(scope, "s", "", {}).session_id
        services, envs = ["payment-api", "ledger-db", "auth-gateway", "search-api"], ["prod", "staging", "qa"]
        for i in range(60):
            app.memories.write(scope, MemoryInput(
                MemoryType.SEMANTIC if i % 2 else MemoryType.EPISODE,
                f"{services[i % 4]} in {envs[i % 3]} failed over to replica {i} after incident INC-{100 + i}"))
        state = app.memories.user(scope)
        if graph:
            state.index.hnsw_threshold = 1
            state.index._build_hnsw()
        source = MemorySource(app.memories)
        for query in ("payment-api prod incident", "ledger-db replica", "staging failover", "nothing relevant"):
            inp = BuildInput(scope=scope, view=app.sessions.view(scope, sid), run_id="", query=query,
                             query_terms=frozenset(query_terms(query)), query_embedding=None, roles=(),
                             budget=DEFAULT_BUDGET, now_ms=2**40)
            [b] = source.candidates(inp)
            vector = app.memories.embedder.embed([query])[0]
            want = [(f"memory:{h.memory.memory_id}", h.score)
                    for h in state.search(vector, query, TOP_K, now_ms=2**40, include_expired=True)
                    if h.score >= MIN_RELEVANCE]
            assert list(zip(b.sources, b.relevance, strict=True)) == want, query
            assert (state.index._hnsw is not None) == graph
    finally:
        app.close()


def test_memory_candidates_carry_what_the_builder_would_compute(tmp_path):
    """The memory source hands over each memory's derived data made once per version of it: the
    dedup keys equal fastpath.text_keys of the packed text, the bytes encode that text, the vector is
    the indexed one; an edit makes them anew."""
    import numpy as np

    import fastpath
    from sidecar.app import Sidecar
    from sidecar.assembly.budget import DEFAULT_BUDGET
    from sidecar.assembly.candidates import BuildInput
    from sidecar.domain import MemoryType, Scope
    from sidecar.memory.service import MemoryInput
    from sidecar.memory.source import MemorySource
    from sidecar.text import query_terms

    app = Sidecar(str(tmp_path / "m.duckdb"))
    try:
        scope = Scope("t", "u")
        sid = app.sessions.create(scope, "s", "", {}).session_id
        for text in ("Prefers Grafana dashboards for payment-api", "payment-api runs on k8s-prod-3",
                     "payment-api owner is team-pay"):
            app.memories.write(scope, MemoryInput(MemoryType.SEMANTIC, text))
        source = MemorySource(app.memories)

        def batch():
            query = "payment-api dashboards"
            inp = BuildInput(scope=scope, view=app.sessions.view(scope, sid), run_id="", query=query,
                             query_terms=frozenset(query_terms(query)), query_embedding=None, roles=(),
                             budget=DEFAULT_BUDGET, now_ms=2**62)
            [b] = source.candidates(inp)
            exact, sim = fastpath.text_keys(list(b.texts))
            assert b.exact_keys.tolist() == exact.tolist() and b.simhashes.tolist() == sim.tolist()
            state = app.memories.user(scope)
            for j, src in enumerate(b.sources):
                assert b.texts[j].encode() in b.bodies[j] and src.encode() in b.bodies[j]
                assert np.array_equal(b.vectors[j], state.index.vector(src[len("memory:"):]))
            return b

        first = batch()
        assert len(first) == 3
        mid = first.sources[0][len("memory:"):]
        app.memories.update(scope, mid, content="Prefers Datadog dashboards for payment-api", confidence=None,
                            expires_at_ms=None, type_=None)
        again = batch()
        assert any("Datadog" in t for t in again.texts) and not any("Grafana" in t for t in again.texts)
    finally:
        app.close()
