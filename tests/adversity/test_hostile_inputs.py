"""Valid but hostile inputs: every write and read of a turn with texts people really send (a 256 KiB
paste, thousands of distinct words, a pasted log, CJK, emoji, mixed scripts), each on a fresh user
and on a user with history. No call may answer INTERNAL, a write stores exactly once, and the
episodic index stays in step with the rows (the long turn is recallable from another session)."""

from __future__ import annotations

import random
import string

import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from sidecar.domain import Scope
from sidecar.services import limits

from .harness import all_messages, code_of


def _distinct_words(rng: random.Random, n: int) -> str:
    """n distinct made-up words: each one a new term for the index."""
    seen: set[str] = set()
    while len(seen) < n:
        seen.add("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 11))))
    return " ".join(sorted(seen, key=lambda _: rng.random()))


def _log(rng: random.Random, lines: int) -> str:
    out = ["Traceback (most recent call last):", '  File "/srv/app/worker.py", line 88, in run']
    for i in range(lines):
        out.append(f"2026-12-05T10:{i % 60:02d}:{rng.randint(0, 59):02d}.{rng.randint(0, 999):03d}Z ERROR "
                   f"pool-{rng.randint(1, 9)} req={rng.getrandbits(64):016x} upstream timeout after "
                   f"{rng.randint(100, 9000)}ms host=10.0.{rng.randint(0, 255)}.{rng.randint(0, 255)}")
    return "\n".join(out)


def hostile_texts() -> dict[str, str]:
    rng = random.Random(30)
    cjk = "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(3000))
    emoji = "".join(rng.choice("😀🚀🔥👍🏽👨‍👩‍👧‍👦🇨🇳🇺🇸✅❌⚠️🧪") for _ in range(4000))
    mixed = " ".join(rng.choice(["Привет", "мир", "مرحبا", "नमस्ते", "שלום", "こんにちは", "안녕하세요", "e\u0301",
                                 "Z\u0351\u0352a\u0353lgo", "\u200bzero\u200dwidth", "ñandú", "restart 生产 instance"])
                     for _ in range(3000))
    huge = _distinct_words(rng, 20_000)
    huge = huge[: limits.MAX_MESSAGE_TEXT - 64]
    return {
        "distinct_6k": _distinct_words(rng, 800)[:6116],  # the public-benchmark turn that broke term_df
        "distinct_thousands": _distinct_words(rng, 5000),
        "huge_256k": huge,
        "pasted_log": _log(rng, 1500),
        "cjk": cjk,
        "emoji": emoji,
        "mixed_scripts": mixed,
    }


TEXTS = hostile_texts()


def _with_history(stub, scope) -> None:
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER if i % 2 == 0 else pb.ROLE_ASSISTANT,
                      text=f"we moved the payment api to region {i} and the cache warmed up in {i} minutes")
        for i in range(40)]))


@pytest.mark.parametrize("history", [False, True], ids=["fresh_user", "user_with_history"])
@pytest.mark.parametrize("name", sorted(TEXTS))
def test_hostile_text_through_every_turn_call(shared_server, stub, scope, name, history):
    text = TEXTS[name]
    internal: list[str] = []

    def call(label, fn):
        try:
            return fn()
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.INTERNAL:
                internal.append(f"{label}: {e.details()}")
                return None
            raise AssertionError(f"{label} answered {code_of(e)}: {e.details()}") from e

    if history:
        _with_history(stub, scope)
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    appended = call("AppendMessages", lambda: stub.AppendMessages(pb.AppendMessagesRequest(
        scope=scope, session_id=sid, messages=[pb.NewMessage(role=pb.ROLE_USER, text=text, idempotency_key="k1"),
                                               pb.NewMessage(role=pb.ROLE_ASSISTANT, text=text[: len(text) // 2])])))
    # A retry of the same batch stores nothing new.
    call("AppendMessages retry", lambda: stub.AppendMessages(pb.AppendMessagesRequest(
        scope=scope, session_id=sid, messages=[pb.NewMessage(role=pb.ROLE_USER, text=text, idempotency_key="k1")])))
    run = stub.StartRun(pb.StartRunRequest(scope=scope, session_id=sid, goal="triage")).run_id
    call("RecordToolResult", lambda: stub.RecordToolResult(pb.RecordToolResultRequest(
        scope=scope, session_id=sid, run_id=run, tool_name="logs", call_id="c1", full_text=text)))
    call("AddRunNote", lambda: stub.AddRunNote(pb.AddRunNoteRequest(
        scope=scope, session_id=sid, run_id=run,
        text=text.encode()[: limits.MAX_RUN_TEXT].decode(errors="ignore"))))
    for budget in (4000, 16000):
        call(f"BuildContext {budget}", lambda budget=budget: stub.BuildContext(pb.BuildContextRequest(
            scope=scope, session_id=sid, run_id=run, query=text[:300], budget=pb.Budget(max_input=budget))))
    commit = call("CommitTurn", lambda: stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid)))
    if commit is not None:
        call("WaitForJobs", lambda: stub.WaitForJobs(pb.WaitForJobsRequest(
            scope=scope, job_ids=list(commit.job_ids), timeout_ms=60_000)))
    call("SearchMemories", lambda: stub.SearchMemories(pb.SearchMemoriesRequest(scope=scope, query=text[:2000])))
    # Another session's context can be built, and the long turn is ranked for a query with its words:
    # the index took it whole.
    other = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    query = " ".join(text.split()[:12])[:300]
    call("BuildContext other session", lambda: stub.BuildContext(pb.BuildContextRequest(
        scope=scope, session_id=other, query=query, budget=pb.Budget(max_input=16_000))))
    assert internal == []
    assert appended is not None and len(appended.messages) == 2
    assert len(all_messages(stub, scope, sid)) == 2
    app, owner = shared_server.app, Scope(scope.tenant_id, scope.user_id)
    assert app.episodic.indexed(owner) == (40 if history else 0) + 2
    if name not in ("emoji", "cjk"):  # no lexical terms to search by
        state, rows, _ = app.episodic.search(owner, query, other, 100_000)
        assert appended.messages[0].message_id in {state.ids[r] for r in rows[:5]}, name


def test_a_failed_index_update_fails_no_write_and_is_rebuilt_from_rows(shared_server, stub, scope, monkeypatch):
    app, owner = shared_server.app, Scope(scope.tenant_id, scope.user_id)
    _with_history(stub, scope)
    assert app.episodic.indexed(owner) == 40
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id

    def broken(texts):
        raise MemoryError("embedder out of memory")

    monkeypatch.setattr(app.episodic.embedder, "embed", broken)
    stored = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="the quarzite migration finished on node seven")])).messages
    assert len(stored) == 1 and app.episodic.indexed(owner) == 0  # the half-updated index was dropped
    monkeypatch.undo()
    other = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    ctx = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=other, query="quarzite migration"))
    assert f"message:{stored[0].message_id}" in {i.source for s in ctx.sections for i in s.items}
    assert app.episodic.indexed(owner) == 41
