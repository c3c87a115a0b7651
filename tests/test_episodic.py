"""Episodic recall through a real in-process server: an old session's turn is recalled in a new
session, users are isolated, the current session is not duplicated, forget drops the index, and
bench/recall.py's metric on a tiny LoCoMo-format file."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from sidecar.api import context_service_pb2_grpc as pb_grpc
from sidecar.domain import Scope
from sidecar.memory.episodic import EpisodicSource, stem, terms
from sidecar.server import build_server

ROOT = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(ROOT / "bench"))
import recall  # noqa: E402  (bench/ is not a package)


class EpisodicRunning:
    """Like conftest.Running, with the episodic source wired in as bench/recall.py does."""

    def __init__(self, db_path: str) -> None:
        self.app = recall.make_app(db_path)
        self.source = next(s for s in self.app.builder.sources if isinstance(s, EpisodicSource))
        self.server, port, _ = build_server(self.app, listen="127.0.0.1:0", uds=None, auth_token=None)
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.ContextServiceStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.server.stop(grace=1).wait()
        self.app.close()


@pytest.fixture(scope="module")
def running(tmp_path_factory) -> Iterator[EpisodicRunning]:
    r = EpisodicRunning(str(tmp_path_factory.mktemp("episodic") / "e.duckdb"))
    yield r
    r.stop()


_users = iter(range(10**6))


@pytest.fixture
def user() -> pb.Scope:
    return pb.Scope(tenant_id=f"ep-{os.getpid()}", user_id=f"u{next(_users)}")


def session(stub, scope: pb.Scope, turns: list[tuple[str, str]]) -> tuple[str, list[str]]:
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    ids = []
    for speaker, text in turns:
        role = pb.ROLE_USER if speaker == "Ann" else pb.ROLE_ASSISTANT
        msg = pb.NewMessage(role=role, text=text, speaker=speaker, client_timestamp_ms=1_683_552_960_000)
        ids += [m.message_id for m in stub.AppendMessages(
            pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[msg])).messages]
    return sid, ids


def build(stub, scope: pb.Scope, sid: str, query: str) -> list[pb.ContextItem]:
    resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=query))
    return [it for s in resp.sections for it in s.items]


OLD = [("Ann", "I adopted a tortoise called Shelly last spring."), ("Bob", "That is lovely, how old is she?"),
       ("Ann", "About forty years, the vet said."), ("Bob", "Wow. Anything new at work?"),
       ("Ann", "I switched to the night shift at the bakery.")]


def test_old_turn_is_recalled_in_a_new_session(running, user):
    _, ids = session(running.stub, user, OLD)
    new_sid, _ = session(running.stub, user, [])
    items = build(running.stub, user, new_sid, "What is the name of Ann's tortoise?")
    episodic = [it for it in items if it.category == pb.CATEGORY_MEMORIES and it.source.startswith("message:")]
    assert f"message:{ids[0]}" in [it.source for it in episodic]
    hit = next(it for it in episodic if it.source == f"message:{ids[0]}")
    assert hit.text == "Ann: I adopted a tortoise called Shelly last spring."
    assert list(hit.source_message_ids) == [ids[0]]
    from sidecar.tokens import count_tokens
    assert hit.tokens == count_tokens(hit.text)
    # The date is one header item per day, rendered just before that day's turns.
    memories = [it for it in items if it.category == pb.CATEGORY_MEMORIES]
    header = next(it for it in memories if it.source == "date:20230508")
    assert header.text == "[8 May 2023]" and not header.source_message_ids
    assert memories.index(header) < memories.index(hit)
    assert sum(it.source.startswith("date:") for it in memories) == 1


def test_users_are_isolated(running, user):
    other = pb.Scope(tenant_id=user.tenant_id, user_id=user.user_id + "-other")
    _, other_ids = session(running.stub, other, [("Ann", "My secret locker code is walrus-42.")])
    sid, _ = session(running.stub, user, [("Ann", "hello")])
    items = build(running.stub, user, sid, "what is my secret locker code walrus-42")
    assert not any(other_ids[0] in it.source or other_ids[0] in it.source_message_ids for it in items)
    assert not any("walrus" in it.text for it in items if it.source != "query")
    # The same text in another tenant is not visible either.
    stranger = pb.Scope(tenant_id=user.tenant_id + "-x", user_id=user.user_id)
    sid_x, _ = session(running.stub, stranger, [])
    assert not any("walrus" in it.text for it in build(running.stub, stranger, sid_x, "walrus-42 locker code")
                   if it.source != "query")


def test_current_session_messages_are_not_duplicated(running, user):
    sid, ids = session(running.stub, user, OLD)
    items = build(running.stub, user, sid, "tortoise Shelly")
    sources = [it.source for it in items]
    assert f"message:{ids[0]}" in sources  # as a recent message
    assert len(sources) == len(set(sources))
    assert all(it.category == pb.CATEGORY_RECENT_MESSAGES for it in items if it.source.startswith("message:"))


def test_forget_drops_the_index(running, user):
    session(running.stub, user, OLD)
    scope = Scope(user.tenant_id, user.user_id)
    assert running.source.indexed(scope) == len(OLD)
    deleted = running.stub.ForgetUser(pb.ForgetUserRequest(scope=user)).deleted
    assert deleted["episodic_index"] == len(OLD)
    assert running.source.indexed(scope) == 0
    sid, _ = session(running.stub, user, [])
    assert not any("tortoise" in it.text for it in build(running.stub, user, sid, "tortoise Shelly")
                   if it.source != "query")


def test_index_is_rebuilt_from_rows(running, user):
    _, ids = session(running.stub, user, OLD)
    scope = Scope(user.tenant_id, user.user_id)
    running.source._users.clear()  # as after a restart: the next call loads the user from rows
    sid, _ = session(running.stub, user, [])
    assert running.source.indexed(scope) == 0
    assert f"message:{ids[4]}" in [it.source for it in build(running.stub, user, sid, "night shift bakery")]
    assert running.source.indexed(scope) == len(OLD)


def test_index_memory_is_bounded(running, user, monkeypatch):
    """A user's index keeps their newest turns once it passes its cap; all users together stay under
    the total (least recently used evicted, rebuilt from rows when they come back)."""
    src = running.source
    monkeypatch.setattr(src, "max_turns_per_user", 8)
    monkeypatch.setattr(src, "max_total_turns", 12)
    scope = Scope(user.tenant_id, user.user_id)
    turns = [("Ann", f"note number {i} about topic{i}") for i in range(11)]
    _, ids = session(running.stub, user, turns)
    assert 6 <= src.indexed(scope) <= 8  # compacted to the newest three quarters, then grew again
    sid, _ = session(running.stub, user, [])
    recalled = [it.source for it in build(running.stub, user, sid, "note number topic10")]
    assert f"message:{ids[10]}" in recalled and f"message:{ids[0]}" not in recalled
    other = pb.Scope(tenant_id=user.tenant_id, user_id=user.user_id + "-b")
    session(running.stub, other, turns[:8])
    assert src.indexed_total() <= 12 and src.indexed(Scope(other.tenant_id, other.user_id)) == 8


def test_concepts_expand_category_words(running, user):
    _, ids = session(running.stub, user, [("Ann", "We took the kids camping by the lake."),
                                          ("Bob", "Nice! The weather was good?"),
                                          ("Ann", "Perfect, and we grilled corn."),
                                          ("Bob", "I just repaired my bike."),
                                          ("Ann", "My boss gave me a raise at the office.")])
    new_sid, _ = session(running.stub, user, [])
    source = running.source
    scope = Scope(user.tenant_id, user.user_id)
    state, rows, _ = source.search(scope, "What activities has Ann done with her family?", new_sid, 10_000)
    assert state.ids[int(rows[0])] == ids[0]  # no query word in the turn: "activities"/"family" -> camping, kids


def test_sparse_window_bm25_matches_the_dense_form():
    import numpy as np

    from sidecar.domain import Message, Role
    from sidecar.memory.episodic import _UserIndex

    state = _UserIndex(dim=16, window=4)
    texts = ["tortoise eats dandelions", "a blue vase", "tortoise shell", "the garden", "vase of dandelions",
             "bakery night shift", "tortoise tortoise"]
    state.add([Message(f"m{i}", "s1" if i < 4 else "s2", i, Role.USER, t, "", "", 1_683_552_960_000 + i, 0, 0, 0)
               for i, t in enumerate(texts)], None, True)
    decay = np.array([0.7 ** k for k in range(4, 0, -1)] + [0.7 ** k for k in range(1, 5)], np.float32)
    q = terms("tortoise dandelions vase")
    got = state.window_bm25(q, decay, 1.2, 0.75)
    n = len(texts)
    gather = np.where(state.nbr[:n] < 0, n, state.nbr[:n])
    lens = np.append(state.doc_len[:n], 0)
    win_len = lens[:n] + lens[gather] @ decay
    norm = 1.2 * (1 - 0.75 + 0.75 * win_len / win_len.mean())
    want = np.zeros(n)
    for t in q:
        rows, tfs = state.postings[t]
        tf = np.zeros(n + 1)
        tf[rows] = tfs
        tw = tf[:n] + tf[gather] @ decay
        want += np.log1p((n - len(rows) + 0.5) / (len(rows) + 0.5)) * tw * 2.2 / (tw + norm)
    assert np.allclose(got, want, rtol=1e-5)
    assert got[3] > 0  # "the garden" scores through its neighbours only


def test_stemming():
    assert stem("painting") == stem("painted") == stem("paints") == "paint"
    assert stem("hobbies") == "hobby"
    assert terms("Running to the games!") == ["run", "game"]


TINY = [{
    "sample_id": "tiny",
    "conversation": {
        "speaker_a": "Ann", "speaker_b": "Bob",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a tortoise called Shelly."},
            {"speaker": "Bob", "dia_id": "D1:2", "text": "Lovely! What does she eat?"},
            {"speaker": "Ann", "dia_id": "D1:3", "text": "Mostly dandelions from the garden.",
             "img_url": ["x"], "blip_caption": "a tortoise eating a yellow flower"},
        ],
        "session_2_date_time": "10:00 am on 20 June, 2023",
        "session_2": [
            {"speaker": "Bob", "dia_id": "D2:1", "text": "How is the pottery class going?"},
            {"speaker": "Ann", "dia_id": "D2:2", "text": "Great, I made a blue vase for my mother."},
        ],
        "session_3_date_time": "9:00 am on 1 July, 2023",  # a date without a session: ignored
    },
    "qa": [
        {"question": "What is the name of Ann's tortoise?", "answer": "Shelly", "evidence": ["D1:1"], "category": 4},
        {"question": "What does Shelly eat and what did Ann make?", "answer": "dandelions; a vase",
         "evidence": ["D1:03; D2:2", "D9:9", "X7"], "category": 1},
        {"question": "When did Ann make a vase?", "answer": "June 2023", "evidence": ["D:2:2"], "category": 2},
        {"question": "Is Bob a cat?", "adversarial_answer": "no", "evidence": [], "category": 5},
    ],
}]


def test_recall_metric_on_a_tiny_file(running, tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    convs = recall.load(json.loads(path.read_text()))
    conv = convs[0]
    conv.index = 900 + os.getpid() % 1000  # its own user on the shared server
    assert list(conv.sessions) == [1, 2]
    assert conv.sessions[1][2].text.endswith(" [image: a tortoise eating a yellow flower]")
    assert [q.evidence for q in conv.questions] == [["D1:1"], ["D1:3", "D2:2"], ["D2:2"]]
    issues = {k: sorted(v) for k, v in conv.issues.items()}
    assert issues["split"] == ["D1:03; D2:2"]
    assert issues["dangling"] == ["D9:9"]
    assert issues["malformed"] == ["X7"]
    assert sorted(issues["repaired"]) == ["D1:03", "D:2:2"]

    figures = recall.evaluate(running.stub, convs, (2000, 4000), commit="session", log=lambda *_: None)
    assert figures["questions"] == 3
    # The whole conversation fits in 2k tokens: every evidence turn is in the context, and in recency's.
    assert figures["recall"] == {"2000": 1.0, "4000": 1.0}
    assert figures["all_evidence"]["2000"] == 1.0
    assert figures["recency"]["2000"] == 1.0
    assert figures["evidence_issues"]["dangling"] == 1 and figures["evidence_issues"]["malformed"] == 1
    assert set(figures["by_category"]) == {"1", "2", "4"}
    assert figures["build_p50_ms"] > 0


def test_recency_baseline_skips_what_does_not_fit():
    conv = recall.load(TINY)[0]
    assert recall.recency_ids(conv, 0) == set()
    newest = recall.recency_ids(conv, 25)
    assert "D2:2" in newest and "D1:1" not in newest
