"""Relative dates (issue #32, temporal questions): "two weeks ago", "last Saturday", "in the past
month" resolved against the time of asking into spans of days; the turns told then rank first, over
gRPC with BuildContext's asked_at_ms; a duration asked for names no date."""

from __future__ import annotations

import datetime as dt

import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from sidecar.memory.episodic import DEFAULT_RANKING
from sidecar.memory.episodic.relative_dates import relative_dates, relative_spans
from sidecar.memory.episodic.terms import terms
from tests.grpc_assert import expect_status
from tests.test_episodic import DAY_MS, _index

TUESDAY = dt.datetime(2023, 5, 30, 20, 0, tzinfo=dt.UTC)  # asked on Tuesday 30 May 2023
ASKED_MS = int(TUESDAY.timestamp() * 1000)


def _dates(query: str, asked_ms: int = ASKED_MS) -> list[tuple[str, str]]:
    epoch = dt.date(1970, 1, 1)
    return [(str(epoch + dt.timedelta(a)), str(epoch + dt.timedelta(b))) for a, b in relative_spans(query, asked_ms)]


@pytest.mark.parametrize(("query", "spans"), [
    ("What did I cook two weeks ago?", [("2023-05-14", "2023-05-18")]),
    ("I mentioned cooking something a couple of days ago", [("2023-05-28", "2023-05-28")]),
    ("What did I buy 10 days ago?", [("2023-05-17", "2023-05-23")]),
    ("a month ago", [("2023-04-26", "2023-05-04")]),
    ("Who came with me last Saturday?", [("2023-05-27", "2023-05-27")]),
    ("What game did I beat last weekend?", [("2023-05-27", "2023-05-28")]),
    ("How much did I run last week?", [("2023-05-22", "2023-05-28")]),
    ("What did I finish last month?", [("2023-04-01", "2023-04-30")]),
    ("Where did I travel last year?", []),  # years back: told any time
    ("What hobby did I start a few years ago?", []),
    ("How many times did I bake in the past two weeks?", [("2023-05-16", "2023-05-30")]),
    ("How much did I spend in the last four months?", [("2023-01-30", "2023-05-30")]),
    ("How many weddings have I attended this year?", [("2023-01-01", "2023-05-30")]),
    ("What did I eat yesterday?", [("2023-05-29", "2023-05-29")]),
    ("the day before yesterday", [("2023-05-28", "2023-05-28")]),
    ("two weeks ago, and last Saturday", [("2023-05-14", "2023-05-18"), ("2023-05-27", "2023-05-27")]),
    # A duration asked for, a plan, a vague time: no date.
    ("How many days ago did I attend the service?", []),
    ("Any ideas for this weekend?", []),
    ("What have I been reading recently?", []),
    ("What was my previous occupation?", []),
    ("Who won the last game?", []),
    # Chinese: the same spans.
    ("我三天前做了什么菜？", [("2023-05-26", "2023-05-28")]),
    ("两周前我去了哪里？", [("2023-05-14", "2023-05-18")]),
    ("一个月前", [("2023-04-26", "2023-05-04")]),
    ("十天前我买了什么？", [("2023-05-17", "2023-05-23")]),
    ("上周六谁和我一起？", [("2023-05-27", "2023-05-27")]),  # the Saturday of last week
    ("上星期天", [("2023-05-28", "2023-05-28")]),
    ("上周末玩了什么游戏？", [("2023-05-27", "2023-05-28")]),
    ("上周天气很好", [("2023-05-22", "2023-05-28")]),  # last week's weather (天气), not a Sunday
    ("上个月", [("2023-04-01", "2023-04-30")]),
    ("过去两周我烤了几次？", [("2023-05-16", "2023-05-30")]),
    ("最近三个月花了多少钱？", [("2023-03-01", "2023-05-30")]),
    ("今年参加了几场婚礼？", [("2023-01-01", "2023-05-30")]),
    ("昨天吃了什么？", [("2023-05-29", "2023-05-29")]),
    ("前天", [("2023-05-28", "2023-05-28")]),
    ("你最近在读什么书？", []),  # recently: no date
    ("去年我去哪儿旅行了？", []),  # years back
    ("以前的工作是什么？", []),  # before, in general
])
def test_relative_dates_resolve_against_the_time_of_asking(query, spans):
    assert _dates(query) == spans


@pytest.mark.parametrize(("query", "left"), [
    ("What did I cook two weeks ago?", ["cook"]),
    ("I mentioned cooking something for my friend a couple of days ago. What was it?",
     ["ment", "cook", "someth", "friend"]),
    ("How many times did I bake in the past two weeks?", ["many", "tim", "bak"]),
    ("two weeks ago, and last Saturday I met Sam", ["meet", "sam"]),
    ("How many days ago did I attend the service?", ["many", "day", "ago", "attend", "servic"]),  # no date named
    ("我三天前做了什么菜？", ["做", "什", "么", "菜"]),
])
def test_the_words_naming_a_relative_time_come_out_of_the_query(query, left):
    assert terms(relative_dates(query, ASKED_MS).without_phrases(query)) == left


def test_a_long_query_naming_thousands_of_times_is_read_whole():
    """Valid but hostile: a pasted log of "yesterday"s. Every phrase is found once (the overlap check
    bisects the phrases read so far), each distinct span is kept once, and all the words go."""
    query = "What did I cook yesterday, two weeks ago and in the past two weeks? " * 5000
    dates = relative_dates(query, ASKED_MS)
    assert len(dates.phrases) == 15_000 and len(dates.spans) == 3
    assert all(a[1] <= b[0] for a, b in zip(dates.phrases, dates.phrases[1:], strict=False))
    assert set(terms(dates.without_phrases(query))) == {"cook"}


def test_a_span_never_runs_past_the_time_of_asking():
    sunday = int(dt.datetime(2023, 5, 28, 9, 0, tzinfo=dt.UTC).timestamp() * 1000)
    assert _dates("What did I do this week?", sunday) == [("2023-05-22", "2023-05-28")]
    assert _dates("last Sunday", sunday) == [("2023-05-21", "2023-05-21")]  # today is not "last" Sunday


def test_turns_told_then_rank_first():
    asked_day = ASKED_MS // DAY_MS
    same = [("Ann", "I cooked a big pot of chili for my friends."), ("Bob", "Sounds great.")]
    state = _index([((asked_day - 60) * DAY_MS, same), ((asked_day - 15) * DAY_MS, same),
                    ((asked_day - 3) * DAY_MS, same)])
    query = "What did I cook two weeks ago?"
    score = state.rank(query, None, "", DEFAULT_RANKING, relative_spans(query, ASKED_MS))
    assert score[2] > score[0] and score[2] > score[4]
    assert score[2] / score[0] == pytest.approx(1.0 + DEFAULT_RANKING.relative_boost)
    flat = state.rank(query, None, "", DEFAULT_RANKING)  # no time of asking given to the index: no prior
    assert flat[2] == pytest.approx(flat[0])


def _told(days_ago: int, text: str) -> pb.ImportedSession:
    """A session of one user turn and its reply, that many days before the time of asking."""
    at = (ASKED_MS // DAY_MS - days_ago) * DAY_MS + 3_600_000
    return pb.ImportedSession(session_id=f"d{days_ago}", closed=True, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text=text, client_timestamp_ms=at),
        pb.NewMessage(role=pb.ROLE_ASSISTANT, text="Nice, enjoy it!", client_timestamp_ms=at + 1000)])


def _first_recalled(stub, scope, query: str, asked_at_ms: int) -> str:
    """The text of the best-scored past turn the query recalls under a budget of about two turns."""
    asking = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id  # a question a session
    budget = pb.Budget(max_input=200, reserved_for_output=0, system_and_tools=0, session_state=0,
                       recent_messages=0, memories=60, rag_or_graph=0, tool_observations=0, flow_unused=True)
    resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=asking, query=query, budget=budget,
                                                    asked_at_ms=asked_at_ms))
    turns = [it for s in resp.sections for it in s.items if it.source.startswith("message:")]
    return max(turns, key=lambda it: it.score).text


def test_build_context_reads_relative_dates_from_asked_at(stub, scope):
    stub.ImportSessions(pb.ImportSessionsRequest(scope=scope, sessions=[
        _told(60, "I bought a new kettle for the kitchen."),
        _told(30, "I bought a new toaster for the kitchen."),
        _told(10, "I bought a new blender for the kitchen.")]))
    first = lambda query: _first_recalled(stub, scope, query, ASKED_MS)  # noqa: E731
    assert "blender" in first("What did I buy for the kitchen 10 days ago?")
    assert "kettle" in first("What did I buy for the kitchen two months ago?")
    assert "toaster" in first("What did I buy for the kitchen a month ago?")
    assert "blender" in first("What did I buy for the kitchen?")  # no time named: the newest


def test_a_chinese_question_reads_its_relative_date_from_asked_at(stub, scope):
    stub.ImportSessions(pb.ImportSessionsRequest(scope=scope, sessions=[
        _told(60, "我给厨房买了一个新水壶。"), _told(30, "我给厨房买了一个新烤面包机。"),
        _told(10, "我给厨房买了一个新搅拌机。"), _told(2, "我给厨房买了一个新咖啡机。")]))
    first = lambda query: _first_recalled(stub, scope, query, ASKED_MS)  # noqa: E731
    assert "搅拌机" in first("我十天前给厨房买了什么？")
    assert "水壶" in first("我两个月前给厨房买了什么？")
    assert "烤面包机" in first("一个月前我给厨房买了什么？")


def test_a_relative_time_is_read_as_days_not_as_words_where_turns_were_told_then(stub, scope):
    """"A couple of days ago" names a day, not a couple: where turns were told then, the date prior
    finds them and the phrase's words rank nothing; where none were, its words are all there is."""
    stub.ImportSessions(pb.ImportSessionsRequest(scope=scope, sessions=[
        _told(40, "We have been a couple for a few days now, and days ago we said so."),
        _told(20, "I repainted the fence in the garden."),
        _told(2, "I baked banana bread for my friend's dinner party.")]))
    query = "I mentioned cooking something for my friend a couple of days ago. What was it?"
    assert "banana bread" in _first_recalled(stub, scope, query, ASKED_MS)
    # Asked a year later: no turn was told a couple of days before, so the phrase's words are matched.
    assert "couple" in _first_recalled(stub, scope, query, ASKED_MS + 365 * DAY_MS)
    asking = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    hostile = "what did I bake a couple of days ago? " * 6000  # ~230 KB of phrases: answered whole
    room = pb.Budget(max_input=120_000, reserved_for_output=0, system_and_tools=0, session_state=0,
                     recent_messages=0, memories=500, rag_or_graph=0, tool_observations=0, flow_unused=True)
    resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=asking, query=hostile, budget=room,
                                                    asked_at_ms=ASKED_MS, render=pb.RENDER_MODE_TEXT))
    assert "banana bread" in resp.rendered_text


@pytest.mark.parametrize("at", [-1, 253_402_300_800_000, 2**62])
def test_a_time_past_the_calendar_is_refused_naming_its_field_and_recall_keeps_working(stub, scope, at):
    """A timestamp past 9999-12-31 is no date: stored, it would break every later recall of the user."""
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="I like oolong tea.", client_timestamp_ms=ASKED_MS)]))
    bad = [pb.NewMessage(role=pb.ROLE_USER, text="ok"), pb.NewMessage(role=pb.ROLE_USER, text="x", client_timestamp_ms=at)]
    expect_status(lambda: stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=bad)),
                  grpc.StatusCode.INVALID_ARGUMENT, "messages[1].client_timestamp_ms")
    expect_status(lambda: stub.ImportSessions(pb.ImportSessionsRequest(scope=scope, sessions=[
        pb.ImportedSession(session_id="past", messages=bad)])), grpc.StatusCode.INVALID_ARGUMENT,
        "sessions[0].messages[1].client_timestamp_ms")
    asking = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    expect_status(lambda: stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=asking, query="tea",
                                                                   asked_at_ms=at)),
                  grpc.StatusCode.INVALID_ARGUMENT, "asked_at_ms")
    last = 253_402_300_799_999  # the calendar's last millisecond is a date
    resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=asking, query="what tea two weeks ago?",
                                                    asked_at_ms=last, render=pb.RENDER_MODE_TEXT))
    assert "oolong" in resp.rendered_text
    assert len(stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=sid, newest=10)).messages) == 1


def test_a_row_stored_past_the_calendar_does_not_break_recall(fresh_server):
    """A row an older version stored with such a timestamp (written here straight into the store)."""
    from sidecar.domain import NewMessage, Role, Scope

    stub, app = fresh_server.stub, fresh_server.app
    scope = pb.Scope(tenant_id="t", user_id="old-rows")
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    app.store.backend.append_messages(Scope("t", "old-rows"), sid, [
        NewMessage(Role.USER, "I like oolong tea.", client_timestamp_ms=2**62)], [(6, 8)], ASKED_MS)
    app.episodic.drop_user(Scope("t", "old-rows"))  # rebuilt from rows on the next question
    asking = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=asking, query="which tea do I like?",
                                                    render=pb.RENDER_MODE_TEXT))
    assert "oolong" in resp.rendered_text and "9999" in resp.rendered_text
