"""Bulk ingest (issue #32): a whole session in one AppendMessages and one CommitTurn stores exactly
what the same session sent a message at a time stores (messages, memories, what is recalled), the
after-turn jobs run in claimed batches, and a batch that fails to store leaves nothing behind."""

from __future__ import annotations

import grpc
import pytest

from sidecar import jobs as jobs_module
from sidecar.api import context_service_pb2 as pb
from sidecar.domain import Job, JobStatus, Scope
from sidecar.jobs import JobWorker, new_job
from sidecar.store.duckdb_store import DuckDBStore
from sidecar.tokens import count_lines
from tests.grpc_assert import expect_status

DAY_MS = 86_400_000
START_MS = 1_700_000_000_000
# Sessions of a user's past (user, assistant turns alternating), with preferences, an incident and its
# fix, small talk and a secret: each stage of extraction has something to do.
SESSIONS = [
    ["I prefer concise answers with code first.", "Noted, I will keep answers short.",
     "The payment-api deploy to production failed with a timeout.", "Rolling back fixed it: the old image is live.",
     "ok thanks!", "You're welcome."],
    ["My tortoise Shelly is forty years old and loves strawberries.", "What a long-lived pet!",
     "I always run the integration tests before merging.", "A good habit.",
     "my api key is sk-live-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c", "Please rotate that key."],
    ["I switched to the night shift at the bakery last week.", "How are the new hours treating you?",
     "Tiring, but I like baking sourdough at 3am.", "Sourdough at dawn sounds lovely.",
     "Remember that I am allergic to peanuts.", "I will remember the peanut allergy."],
]
QUESTIONS = ["what do I bake at night?", "how old is my tortoise?", "what failed in production?"]


def _messages(turns: list[str], day: int) -> list[pb.NewMessage]:
    return [pb.NewMessage(role=pb.ROLE_USER if i % 2 == 0 else pb.ROLE_ASSISTANT, text=text,
                          client_timestamp_ms=START_MS + day * DAY_MS + i * 1000) for i, text in enumerate(turns)]


def _replay(stub, scope: pb.Scope, whole: bool) -> None:
    """The sessions in date order, each committed once: appended whole, or a message per call."""
    for day, turns in enumerate(SESSIONS):
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id=f"s{day}")).session_id
        batches = [_messages(turns, day)] if whole else [[m] for m in _messages(turns, day)]
        for batch in batches:
            stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=batch))
        stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid))
    while not stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, timeout_ms=30_000)).all_finished:
        pass


def _stored(stub, scope: pb.Scope) -> tuple[list, list, list]:
    """What the user's replay left, with ids replaced by (session, seq): the messages, the memories and
    what each question recalls."""
    where: dict[str, tuple[str, int]] = {}
    messages = []
    for day in range(len(SESSIONS)):
        for m in stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=f"s{day}", newest=100)).messages:
            where[m.message_id] = (f"s{day}", m.seq)
            messages.append((f"s{day}", m.seq, m.role, m.text, m.tokens, m.timestamp_ms))
    memories = sorted((m.type, m.content, m.subject, round(m.confidence, 6), m.authority,
                       tuple(where[i] for i in m.source_message_ids))
                      for m in stub.ListMemories(pb.ListMemoriesRequest(scope=scope, page_size=100)).memories)
    asked = stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="asking")).session_id
    recalled = []
    for question in QUESTIONS:
        resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=asked, query=question,
                                                        render=pb.RENDER_MODE_TEXT))
        recalled.append([(s.kind, it.category, it.text, it.tokens, round(it.score, 5), _source(it.source, where),
                          [where[i] for i in it.source_message_ids]) for s in resp.sections for it in s.items])
    return messages, memories, recalled


def _source(source: str, where: dict[str, tuple[str, int]]) -> object:
    """An item's source without the ids each replay drew: a message by (session, seq), a memory by kind."""
    kind, _, rest = source.partition(":")
    return where.get(rest, kind)


def test_a_whole_session_stores_what_one_message_at_a_time_stores(fresh_server):
    stub = fresh_server.stub
    whole, one_by_one = (pb.Scope(tenant_id="bulk", user_id=u) for u in ("whole", "one-by-one"))
    _replay(stub, whole, whole=True)
    _replay(stub, one_by_one, whole=False)
    got_whole, got_single = _stored(stub, whole), _stored(stub, one_by_one)
    messages, memories, recalled = got_whole
    assert len(messages) == sum(map(len, SESSIONS))
    assert memories and any(recalled)
    assert "sk-live" not in repr(got_whole)  # masked before anything was stored
    assert got_whole == got_single


def test_recall_index_counts_each_turn_as_a_packed_line(fresh_server):
    """Undated turns reuse the line count stored with the message: the same count_line as counting anew."""
    scope = pb.Scope(tenant_id="bulk", user_id="counted")
    _replay(fresh_server.stub, scope, whole=True)
    state = fresh_server.app.episodic._users[("bulk", "counted")]
    assert not state.dated and len(state.texts) == sum(map(len, SESSIONS))
    assert list(state.tokens[:len(state.texts)]) == count_lines(list(state.texts))


class _FailingInsert:
    """A backend insert that fails on one table, after the batch's earlier inserts ran."""

    def __init__(self, insert_many, table: str) -> None:
        self.insert_many, self.table = insert_many, table

    def __call__(self, c, table, columns, rows):
        if table == self.table:
            raise RuntimeError(f"disk full writing {table}")
        return self.insert_many(c, table, columns, rows)


def test_a_batch_that_fails_to_store_leaves_nothing_behind(fresh_server, monkeypatch):
    stub, app = fresh_server.stub, fresh_server.app
    scope = pb.Scope(tenant_id="bulk", user_id="atomic")
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="s")).session_id
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=_messages(["kept"], 0)))
    # A user prohibition is pinned with its message: the pinned row is written after the messages.
    batch = _messages(["Never restart the production database without asking me.", "Understood.", "one more"], 1)
    backend = app.store.backend
    monkeypatch.setattr(backend, "_insert_many", _FailingInsert(backend._insert_many, "pinned_constraints"))
    expect_status(lambda: stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=batch,
                                                                       idempotency_key="retry-me")),
                  grpc.StatusCode.INTERNAL)
    listed = stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=sid, newest=100)).messages
    assert [m.text for m in listed] == ["kept"]
    assert app.store.backend.list_messages(Scope("bulk", "atomic"), sid, newest=100)[0].text == "kept"
    assert len(app.store.backend.list_messages(Scope("bulk", "atomic"), sid, newest=100)) == 1
    assert app.episodic.indexed(Scope("bulk", "atomic")) <= 1
    # The retry, once the disk is back, stores the batch whole, right after what was there.
    monkeypatch.undo()
    stored = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=batch,
                                                          idempotency_key="retry-me")).messages
    assert [m.seq for m in stored] == [2, 3, 4]
    again = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=batch,
                                                         idempotency_key="retry-me")).messages
    assert [m.message_id for m in again] == [m.message_id for m in stored]
    listed = stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=sid, newest=100)).messages
    assert [m.text for m in listed] == ["kept", *(m.text for m in batch)]
    pins = stub.ListPinned(pb.ListPinnedRequest(scope=scope, session_id=sid)).pinned
    assert [p.message_id for p in pins] == [stored[0].message_id]


@pytest.fixture
def store(tmp_path):
    s = DuckDBStore(str(tmp_path / "jobs.duckdb"))
    yield s
    s.close()


def _queued(store: DuckDBStore, n: int) -> list[Job]:
    scope = Scope("t", "u")
    made = [new_job(scope, "extract", {"i": i}) for i in range(n)]
    for i, job in enumerate(made):
        job.created_at_ms = i  # claim order
    store.enqueue_jobs(made)
    return made


def test_the_worker_runs_a_batch_in_claim_order_and_each_job_gets_its_own_outcome(store):
    made = _queued(store, 5)
    ran: list[int] = []

    def handle(job: Job) -> dict[str, str]:
        ran.append(job.payload["i"])
        if job.payload["i"] == 2:
            raise ValueError("bad turn")
        return {"i": str(job.payload["i"])}

    scope = Scope("t", "u")
    worker = JobWorker(store, {"extract": handle}, poll_s=0.05, batch=64)
    worker.start()
    try:  # the failing job is retried until its attempts run out
        got, finished = worker.wait(scope, [j.job_id for j in made], 20)
    finally:
        worker.stop()
    assert finished
    assert ran == [0, 1, 2, 3, 4, *[2] * (jobs_module.MAX_ATTEMPTS - 1)]
    assert [(j.status, j.result, j.attempts) for j in got if j.payload["i"] != 2] == [
        (JobStatus.DONE, {"i": str(i)}, 1) for i in (0, 1, 3, 4)]
    assert (got[2].status, got[2].error, got[2].attempts) == (JobStatus.FAILED, "ValueError: bad turn",
                                                              jobs_module.MAX_ATTEMPTS)


def test_jobs_a_batch_did_not_reach_go_back_to_the_queue_as_they_were(store, monkeypatch):
    made = _queued(store, 4)
    monkeypatch.setattr(jobs_module, "BATCH_SECONDS", 0.0)  # the batch's time is up after its first job
    worker = JobWorker(store, {"extract": lambda job: {}}, batch=64)
    claimed = store.claim_jobs(1, ["extract"], 64)
    worker._run_batch(claimed)
    scope = Scope("t", "u")
    got = [store.get_job(scope, j.job_id) for j in made]
    assert [(j.status, j.attempts) for j in got] == [(JobStatus.DONE, 1)] + [(JobStatus.QUEUED, 0)] * 3
    assert [j.job_id for j in store.claim_jobs(2, ["extract"], 64)] == [j.job_id for j in made[1:]]


def test_a_batch_is_done_only_once_its_commit_stored_what_the_jobs_decided(store):
    """JobWorker commit: called once a batch with the jobs that ran; those whose part it could not
    store go back to the queue as a failed attempt, the others are done with the result it set."""
    made = _queued(store, 4)
    commits: list[list[int]] = []
    seen_done: list[int] = []

    def commit(jobs: list[Job]) -> list[tuple[Job, Exception]]:
        commits.append([j.payload["i"] for j in jobs])
        seen_done.extend(j.payload["i"] for j in jobs if store.get_job(Scope("t", "u"), j.job_id).status
                         == JobStatus.DONE)
        for j in jobs:
            j.result = {"stored": "yes"}
        # The first commit fails for job 1's part only; the whole hook fails once on its retry.
        if len(commits) == 1:
            return [(j, OSError("disk full")) for j in jobs if j.payload["i"] == 1]
        if len(commits) == 2:
            raise OSError("gone")
        return []

    worker = JobWorker(store, {"extract": lambda job: {"ran": "yes"}}, batch=64, commit={"extract": commit})
    worker._run_batch(store.claim_jobs(1, ["extract"], 64))
    scope = Scope("t", "u")
    got = [store.get_job(scope, j.job_id) for j in made]
    assert commits == [[0, 1, 2, 3]] and seen_done == []  # no job is done before its commit
    assert [(j.status, j.attempts) for j in got] == [
        (JobStatus.DONE, 1), (JobStatus.QUEUED, 1), (JobStatus.DONE, 1), (JobStatus.DONE, 1)]
    assert got[0].result == {"stored": "yes"} and got[1].error == "OSError: disk full"
    worker._run_batch(store.claim_jobs(2, ["extract"], 64))  # job 1 again: the hook raises
    assert commits[1] == [1] and store.get_job(scope, made[1].job_id).status == JobStatus.QUEUED
    worker._run_batch(store.claim_jobs(3, ["extract"], 64))
    job = store.get_job(scope, made[1].job_id)
    assert (job.status, job.attempts, job.result) == (JobStatus.DONE, 3, {"stored": "yes"})
