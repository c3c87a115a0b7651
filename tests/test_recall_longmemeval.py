"""bench/recall.py's LongMemEval reader, baselines and scorer on a tiny synthetic gzip file (the real
data lives outside the repo): the haystack replayed as its own user through an in-process server,
turn- and session-level recall beside BM25 and recency, the stratified sample and the written tables."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from sidecar.api import context_service_pb2_grpc as pb_grpc
from sidecar.domain import Role
from sidecar.server import build_server

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import recall  # noqa: E402  (bench/ is not a package)

FILLER = [("user", "Can you suggest a good recipe for banana bread?"),
          ("assistant", "Sure: mash three ripe bananas, mix in flour, sugar, butter and an egg, bake for an hour.")]


def record(qid: str, qtype: str, question: str, sessions: list[tuple[str, str, list[tuple[str, str, bool]]]],
           answers: list[str]) -> dict:
    """A LongMemEval record: sessions are (id, date, [(role, content, has_answer)])."""
    return {"question_id": qid, "question_type": qtype, "question": question, "answer": "-",
            "question_date": "2023/06/01 (Thu) 10:00",
            "haystack_session_ids": [s[0] for s in sessions], "haystack_dates": [s[1] for s in sessions],
            "haystack_sessions": [[{"role": r, "content": c, **({"has_answer": True} if h else {})} for r, c, h in s[2]]
                                  for s in sessions],
            "answer_session_ids": answers}


def filler(n: int) -> list[tuple[str, str, bool]]:
    return [(r, f"{c} (variant {n})", False) for r, c in FILLER]


DEGREE = [("user", "I graduated with a degree in Business Administration, which helps at work.", True),
          ("assistant", "Congratulations, that background is useful for project management.", False)]
TINY = [
    # The file lists the sessions out of date order (as the temporal-reasoning haystacks are).
    record("q1", "single-session-user", "What degree did I graduate with?",
           [("late", "2023/05/20 (Sat) 09:00", filler(1)), ("ans", "2023/05/02 (Tue) 08:00", DEGREE),
            ("early", "2023/05/10 (Wed) 12:30", filler(2))], ["ans"]),
    record("q2", "multi-session", "How many guitars do I own now?",
           [("a1", "2023/04/01 (Sat) 10:00", [("user", "I bought my first guitar, a Fender.", True)] + filler(3)),
            ("x", "2023/04/15 (Sat) 10:00", filler(4)),
            ("a2", "2023/05/01 (Mon) 10:00", [("user", "Today I got a second guitar, a Gibson.", True),
                                              ("assistant", "Two guitars now, nice!", False)])], ["a1", "a2"]),
    record("q3_abs", "multi-session", "How many violins do I own?", [("x", "2023/04/15 (Sat) 10:00", filler(5))], []),
]


def write_gz(path: Path, data: list[dict]) -> Path:
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(data, f)
    return path


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> Iterator[pb_grpc.ContextServiceStub]:
    app = recall.make_app(str(tmp_path_factory.mktemp("lme") / "e.duckdb"))
    server, port = build_server(app, listen="127.0.0.1:0", uds=None, auth_token=None)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    yield pb_grpc.ContextServiceStub(channel)
    channel.close()
    server.stop(grace=1).wait()
    app.close()


def test_reader_replays_each_haystack_in_date_order_without_abstention(tmp_path):
    raw = recall.read_data(write_gz(tmp_path / "lme.json.gz", TINY))
    assert recall.dataset_of(raw) == "longmemeval"
    convs = recall.load_longmemeval(raw)
    assert [c.user_id for c in convs] == ["q-q1", "q-q2"]  # q3_abs has no evidence: left out
    q1 = convs[0]
    assert q1.tenant == recall.LME_TENANT
    assert [q1.session_names[n] for n in sorted(q1.sessions)] == ["ans", "early", "late"]
    first, second = q1.sessions[1]
    assert (first.dia_id, first.role, first.speaker) == ("S1:1", Role.USER, "")
    assert second.role is Role.ASSISTANT and second.timestamp_ms - first.timestamp_ms == recall.TURN_GAP_MS
    assert first.timestamp_ms == recall.parse_date("2023/05/02 (Tue) 08:00")
    (q,) = q1.questions
    assert (q.category, q.evidence, q.sessions) == ("single-session-user", ["S1:1"], ["ans"])
    assert convs[1].questions[0].evidence == ["S1:1", "S3:1"] and convs[1].questions[0].sessions == ["a1", "a2"]
    assert q1.session_of()["S3:2"] == "late"


def test_the_reader_is_told_by_the_file(tmp_path):
    assert recall.dataset_of([{"conversation": {}, "qa": []}]) == "locomo"
    with pytest.raises(SystemExit, match="neither LoCoMo"):
        recall.dataset_of([{"x": 1}])


def test_stratified_sample_is_proportional_and_deterministic():
    convs = [recall.Conversation(i, ("user", "assistant"), {}, [recall.Question("?", t, ["S1:1"])], user=f"q{i}")
             for i, t in enumerate(["a"] * 6 + ["b"] * 3 + ["c"], 1)]
    picked = recall.stratified(convs, 5)
    assert Counter(c.questions[0].category for c in picked) == {"a": 3, "b": 1, "c": 1}  # c: at least one
    assert picked == recall.stratified(list(reversed(convs)), 5)[::-1]  # the same ones, in the file's order
    assert len(recall.stratified(convs, 2)) == 2 and recall.stratified(convs, 99) == convs


def test_quick_cut_keeps_the_evidence_sessions_and_the_newest_others(tmp_path):
    q2 = recall.load_longmemeval(recall.read_data(write_gz(tmp_path / "lme.json.gz", TINY)))[1]
    kept = recall.cut(q2, 1)
    assert sorted(kept.sessions) == [1, 3] and q2.sessions.keys() == {1, 2, 3}  # a1, a2; the original untouched
    assert sorted(recall.cut(q2, 6).sessions) == [1, 2, 3]  # room for the newest other session


def test_bm25_ranks_the_turn_sharing_rare_words_first():
    bm25 = recall.TurnBM25(["User: the cat sat", "User: a degree in business", "User: the the the"])
    s = bm25.scores("What degree did I get in business?")
    assert s[1] > 0 == s[0] == s[2]
    assert bm25.ranked("degree")[0] == 1
    assert bm25.ranked("nothing matches")[:3] == [2, 1, 0]  # ties newest first, as recency would fill


def test_turn_and_session_recall_beside_the_baselines(stub, tmp_path, monkeypatch):
    convs = recall.load_longmemeval(recall.read_data(write_gz(tmp_path / "lme.json.gz", TINY)))
    for c in convs:
        c.user = f"{c.user}-{os.getpid()}"  # its own users on a module-wide server
    degree = next(t for t in convs[0].turns() if t.dia_id == "S1:1")
    budget = recall.Packer(convs[0]).costs[0] + 30  # the evidence turn and a little more
    assert degree.dia_id not in recall.recency_ids(convs[0], budget)  # the newest filler comes first

    # The server runs in this process: its CPU is this process's.
    figures = recall.evaluate(stub, convs, (2000, budget), log=lambda *_: None, server_pid=os.getpid())
    big, small = "2000", str(budget)
    assert figures["questions"] == 2 and figures["by_category_n"] == {"multi-session": 1, "single-session-user": 1}
    # Both haystacks fit in 2k: every evidence turn and session is in each context.
    for key in ("recall", "bm25", "recency", "session_recall", "session_bm25", "session_recency"):
        assert figures[key][big] == 1.0, key
    assert figures["by_category_bm25"]["single-session-user"][small] == 1.0  # the degree turn, by its words
    assert figures["by_category_recency"]["single-session-user"][small] == 0.0
    assert figures["session_by_category_recency"]["single-session-user"][small] == 0.0
    assert figures["ingested_turns"] == sum(len(c.turns()) for c in convs) and figures["ingest_turns_per_s"] > 0
    assert figures["ingest_server_cpu_ms_per_turn"] > 0
    assert figures["build_ms_new_query"]["p50_ms"] > 0 and "halves" not in figures

    # The tables and plot as published, under their own names (LoCoMo's keep theirs).
    figures.update(yardstick_ms={"start": 1.0, "end": 1.0}, profile="default", dataset="longmemeval")
    results = tmp_path / "results"
    monkeypatch.setattr(recall, "RESULTS", results)
    recall.write_results(figures, "default", (2000, budget), "longmemeval")
    assert recall.results_stem("locomo", "model") == "recall-model"
    md = (results / "recall-longmemeval-default.md").read_text()
    assert "| all (2) | ours (default) | 100.0 |" in md and "| single-session-user (1) | ours (default) |" in md
    assert "Session level" in md and "turns/s" in md and "the server's CPU" in md
    assert json.loads((results / "recall-longmemeval-default.json").read_text())["session_bm25"][big] == 1.0
    drawn = importlib.util.find_spec("matplotlib") is not None  # the optional `plot` extra
    assert (results / "recall-longmemeval-default.png").exists() == drawn


def test_an_imported_replay_measures_what_a_committed_one_does(stub, tmp_path):
    """--commit import (ImportSessions of each history) and --commit session give the same figures."""
    runs = {}
    for mode in ("session", "import"):
        convs = recall.load_longmemeval(recall.read_data(write_gz(tmp_path / "lme.json.gz", TINY)))
        for c in convs:
            c.user = f"{c.user}-{mode}-{os.getpid()}"
        figures = recall.evaluate(stub, convs, (2000, 4000), commit=mode, log=lambda *_: None)
        runs[mode] = {k: figures[k] for k in ("recall", "session_recall", "ingested_turns", "memories_per_question")}
        assert figures["commit"] == mode and recall.INGEST_MODES[mode] in "\n".join(recall.run_notes(
            {**figures, "yardstick_ms": {"start": 1.0, "end": 1.0}}))
    assert runs["import"] == runs["session"]


def test_a_history_written_in_another_script_is_recalled_by_its_words(stub, tmp_path):
    """--script cyrillic: the same turns, questions and answers letter for letter in Cyrillic, their
    ids and evidence unchanged; the degree turn is still found by its words under a budget that holds
    little more than it."""
    convs = [recall.in_script(c, recall.SCRIPTS["cyrillic"])
             for c in recall.load_longmemeval(recall.read_data(write_gz(tmp_path / "lme.json.gz", TINY)))]
    for c in convs:
        c.user = f"{c.user}-cyrillic-{os.getpid()}"
    degree = next(t for t in convs[0].turns() if t.dia_id == "S1:1")
    assert degree.text.startswith("И градуатед шитх а дегрее") and convs[0].questions[0].evidence == ["S1:1"]
    assert convs[0].questions[0].text == "Шхат дегрее дид И градуате шитх?"
    budget = recall.Packer(convs[0]).costs[0] + 30
    figures = recall.evaluate(stub, convs, (budget,), commit="import", log=lambda *_: None)
    assert figures["by_category"]["single-session-user"][str(budget)] == 1.0


def test_model_profile_without_the_extra_fails_clearly(monkeypatch):
    monkeypatch.setattr(recall, "model_installed", lambda name: False)
    monkeypatch.setattr(sys, "argv", ["recall.py", "--dataset", "longmemeval", "--profile", "model", "--quick"])
    with pytest.raises(SystemExit, match="needs the 'model' extra"):
        recall.main()


def test_knowledge_updates_count_the_newest_telling_scored_first():
    board = recall.Board()
    update = recall.Question("How many stars for gold?", recall.UPDATE_CATEGORY, ["S2:1", "S9:3", "S12:1"])
    board.add_update_order(update, 4000, {"S2:1": 0.5, "S12:1": 0.9, "S9:3": 0.7})  # newest first
    board.add_update_order(update, 2000, {"S2:1": 0.9, "S12:1": 0.8})  # an older telling above it
    board.add_update_order(update, 1000, {"S12:1": 0.8})  # only one telling: nothing to order
    board.add_update_order(recall.Question("Where?", "multi-session", ["S1:1", "S2:1"]), 4000, {"S1:1": 1, "S2:1": 0})
    board.add("ours", recall.Conversation(1, ("a", "b"), {}, []), update, 4000, {"S12:1"}, {})
    out = board.summary((1000, 2000, 4000))
    assert out["update_newer_first"] == {"1000": 0.0, "2000": 0.0, "4000": 1.0}
    assert out["update_pairs"] == {"1000": 0, "2000": 1, "4000": 1}
    assert recall.turn_position("S12:1") > recall.turn_position("S9:3") > recall.turn_position("S2:1")
    assert "update_change_both" not in out


def test_knowledge_updates_asking_for_an_earlier_value_count_both_tellings_in_the_context():
    board = recall.Board()
    before = recall.Question("What was my previous goal?", recall.UPDATE_CATEGORY, ["S2:1", "S9:3"])
    board.add_update_order(before, 4000, {"S2:1": 0.9, "S9:3": 0.5})  # the older first: as it asks
    board.add_update_order(before, 2000, {"S9:3": 0.9})  # the newest alone: the earlier value is missing
    out = board.summary((2000, 4000))
    assert out["update_change_both"] == {"2000": 0.0, "4000": 1.0}
    assert out["update_change_questions"] == {"2000": 1, "4000": 1}
    assert "update_newer_first" not in out  # no question about the current value


def test_evidence_packed_as_a_passage_is_told_from_evidence_packed_whole():
    whole = {"S1:1": "assistant: A long answer. The part asked about. More of it.", "S1:2": "user: Short."}
    by_message = {"m1": "S1:1", "m2": "S1:2"}

    def response(*texts_by_id):
        items = [pb.ContextItem(source=f"message:{m}", text=t, source_message_ids=[m]) for m, t in texts_by_id]
        return pb.BuildContextResponse(sections=[pb.Section(items=items)])

    cut = response(("m1", "assistant: … The part asked about. …"), ("m2", "user: Short."))
    assert recall.passages_of(cut, by_message, whole) == {"S1:1"}
    marked = response(("m1", "[superseded on 8 May 2023 by: x] " + whole["S1:1"]))
    assert recall.passages_of(marked, by_message, whole) == set()  # the whole turn, marked
    assert recall.passages_of(response(("m1", "assistant: … The part …"), ("m1", whole["S1:1"])), by_message,
                              whole) == set()


def test_a_passage_or_memory_recalls_its_turn_only_if_it_keeps_the_answer_words_the_turn_says():
    whole = "We set the budget at $2,000 for influencers. The launch is on May 1st. Posts go out weekly."
    answer = recall.answer_words("$2,000")
    assert recall.keeps_answer(whole, whole, answer)
    assert recall.keeps_answer("… The budget at $2,000 for influencers. …", whole, answer)
    assert not recall.keeps_answer("… The launch is on May 1st. …", whole, answer)
    # An answer the turn does not say in words (a count, a paraphrase) cannot be cut out of it.
    assert recall.keeps_answer("… Posts go out weekly.", whole, recall.answer_words("three posts"))
    # A word is kept in its plural too ("tools" keeps an answer's "tool"), and a cut plural is still cut.
    tools = "Sen2Cor runs alone. The SIAC_GEE tools implement 6S. Both are tools for correction."
    six = recall.answer_words("The 6S algorithm is implemented in the SIAC_GEE tool.")
    assert recall.keeps_answer("… The SIAC_GEE tools implement 6S. …", tools, six)
    assert not recall.keeps_answer("Sen2Cor runs alone. …", tools, six)
    assert recall.answer_words("dollars classes stories bus analysis") == {"dollar", "class", "story", "bus", "analysis"}

    by_message = {"m1": "S1:1", "m2": "S1:2", "m3": "S1:3"}
    text_of = {"S1:1": whole, "S1:2": "Short.", "S1:3": whole}
    q = recall.Question("How much was the budget?", "single-session-assistant", ["S1:1", "S1:2"], answer="$2,000")
    kept = recall.answer_kept(q, text_of)
    items = [pb.ContextItem(source="message:m1", text="assistant: … The launch is on May 1st. …", source_message_ids=["m1"]),
             pb.ContextItem(source="message:m2", text="user: Short.", source_message_ids=["m2"]),
             pb.ContextItem(source="message:m3", text="assistant: … The launch is on May 1st. …", source_message_ids=["m3"]),
             pb.ContextItem(source="memory:x", text="- Launch on May 1st", source_message_ids=["m3"])]
    assert set(recall.evidence_scores(items, by_message)) == {"S1:1", "S1:2", "S1:3"}
    # The evidence turn whose passage lost the answer is not recalled; one that is no evidence is left as it is.
    assert set(recall.evidence_scores(items, by_message, kept=kept)) == {"S1:2", "S1:3"}
    # A memory of one of the turn's sentences recalls the turn only if it keeps the answer too.
    launch = pb.ContextItem(source="memory:y", text="- The launch is on May 1st.", source_message_ids=["m1"])
    assert set(recall.evidence_scores([*items, launch], by_message, kept=kept)) == {"S1:2", "S1:3"}
    budget = pb.ContextItem(source="memory:z", text="- Influencer budget: $2,000.", source_message_ids=["m1"])
    assert set(recall.evidence_scores([*items, budget], by_message, kept=kept)) == {"S1:1", "S1:2", "S1:3"}
    items[0] = pb.ContextItem(source="message:m1", text="assistant: … the budget at $2,000 …", source_message_ids=["m1"])
    assert set(recall.evidence_scores(items, by_message, kept=kept)) == {"S1:1", "S1:2", "S1:3"}
