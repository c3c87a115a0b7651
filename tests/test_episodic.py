"""Episodic recall through a real in-process server: an old session's turn is recalled in a new
session, users are isolated, the current session is not duplicated, forget drops the index, and
bench/recall.py's metric on a tiny LoCoMo-format file."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fastpath
from sidecar.api import context_service_pb2 as pb
from sidecar.api import context_service_pb2_grpc as pb_grpc
from sidecar.domain import Message, Role, Scope
from sidecar.index.embedders import HashEmbedder
from sidecar.index.int8 import quantize_rows
from sidecar.memory.episodic import DEFAULT_RANKING, EpisodicSource, stem, terms
from sidecar.memory.episodic.index import _UserIndex
from sidecar.server import build_server

ROOT = Path(__file__).resolve().parent.parent

sys.path.insert(0, str(ROOT / "bench"))
import recall  # noqa: E402  (bench/ is not a package)


class EpisodicRunning:
    """Like conftest.Running, with the episodic source wired in as bench/recall.py does."""

    def __init__(self, db_path: str) -> None:
        self.app = recall.make_app(db_path)
        self.source = next(s for s in self.app.builder.sources if isinstance(s, EpisodicSource))
        self.server, port = build_server(self.app, listen="127.0.0.1:0", uds=None, auth_token=None)
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
    assert hit.tokens == count_tokens(hit.text + "\n")  # and the newline that ends its line of the prompt
    # The date is one header item per day, rendered just before that day's turns.
    memories = [it for it in items if it.category == pb.CATEGORY_MEMORIES]
    header = next(it for it in memories if it.source == "date:20230508")
    assert header.text == "[8 May 2023]" and not header.source_message_ids
    assert memories.index(header) < memories.index(hit)
    assert sum(it.source.startswith("date:") for it in memories) == 1
    # What the section is charged is what its lines cost as rendered, joined by newlines.
    assert sum(it.tokens for it in memories) == count_tokens("\n".join(it.text for it in memories) + "\n")


def test_a_sub_session_recalls_no_history(running, user):
    _, ids = session(running.stub, user, OLD)
    parent, parent_ids = session(running.stub, user, [("Ann", "Shelly the tortoise hid under the sofa.")])
    child = running.stub.CreateSubSession(pb.CreateSubSessionRequest(scope=user, parent_session_id=parent,
                                                                     task="Find the tortoise"))
    recalled = [it.source for it in build(running.stub, user, child.session_id, "Where is Ann's tortoise Shelly?")
                if it.source.startswith("message:")]
    assert recalled == []  # neither the parent's turn nor an older session's: only what is handed off
    other, _ = session(running.stub, user, [])
    recalled = {it.source for it in build(running.stub, user, other, "Where is Ann's tortoise Shelly?")}
    assert {f"message:{ids[0]}", f"message:{parent_ids[0]}"} <= recalled  # a plain session does


def test_recalled_turns_render_within_their_budget(running, user):
    """The rendered prompt of a memories section filled with recalled turns and day headers fits the
    budget: each line counts the newline that separates it from the next."""
    from sidecar.tokens import count_tokens

    words = "tortoise bakery shift guitar lake concert garden recipe".split()
    for day in range(6):
        sid = running.stub.CreateSession(pb.CreateSessionRequest(scope=user)).session_id
        running.stub.AppendMessages(pb.AppendMessagesRequest(scope=user, session_id=sid, messages=[
            pb.NewMessage(role=pb.ROLE_USER, speaker="Ann", text=f"My {words[k % 8]} and the {words[(k + day) % 8]} again",
                          client_timestamp_ms=1_683_552_960_000 + day * 86_400_000 + k) for k in range(20)]))
    new_sid, _ = session(running.stub, user, [])
    for memories in (60, 150, 400):
        resp = running.stub.BuildContext(pb.BuildContextRequest(
            scope=user, session_id=new_sid, query="my tortoise and the bakery", render=pb.RENDER_MODE_TEXT,
            budget=pb.Budget(max_input=memories + 200, reserved_for_output=0, memories=memories, recent_messages=0,
                             flow_unused=False)))
        packed = [it for s in resp.sections if s.kind in (pb.SECTION_KIND_MEMORIES, pb.SECTION_KIND_SESSION_RECALL)
                  for it in s.items]
        assert len(packed) > 3 and any(it.source.startswith("date:") for it in packed)
        section = "\n".join(it.text for it in packed)
        assert count_tokens(section) <= sum(it.tokens for it in packed) <= memories
        assert count_tokens(resp.rendered_text) <= resp.total_budget


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


def test_a_first_session_embeds_no_query_for_recall(running, user, monkeypatch):
    """With no turns outside the session there is nothing to rank: the query is not embedded; once
    another session has turns, it is, and they are recalled."""
    sid, _ = session(running.stub, user, OLD)
    embedded: list[str] = []
    embed = running.source.embedder.embed
    monkeypatch.setattr(running.source.embedder, "embed", lambda texts: embedded.extend(texts) or embed(texts))
    build(running.stub, user, sid, "tortoise Shelly")
    build(running.stub, user, sid, "night shift")
    assert embedded == []
    _, ids = session(running.stub, user, [("Ann", "My tortoise Shelly hates the rain.")])
    assert f"message:{ids[0]}" in [it.source for it in build(running.stub, user, sid, "tortoise Shelly")]
    assert embedded


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


def _turns(n_sessions: int, per_session: int) -> list[Message]:
    words = "camping lake bakery shift guitar turtle painting soccer recipe garden hiking concert".split()
    out = []
    for s in range(n_sessions):
        for k in range(per_session):
            i = s * per_session + k
            day = 1_683_504_000_000 + s * 86_400_000 * 3  # a session every three days from 8 May 2023
            out.append(Message(f"m{i}", f"s{s}", k + 1, Role.USER if k % 2 == 0 else Role.ASSISTANT,
                               f"{words[i % 12]} and {words[(i * 5) % 12]} note{i % 7}", "", "", day + k * 60_000,
                               day, 0, 0, speaker="Ann" if k % 2 == 0 else "Bob"))
    return out


def test_turns_posted_at_once_equal_turns_posted_one_by_one():
    """An index built from rows posts all its turns at once (the arrays a restored index keeps); one
    grown turn by turn posts each into its lists: the same postings, term table and rankings."""
    turns, more = _turns(5, 9)[:36], _turns(5, 9)[36:]
    at_once, one_by_one = _UserIndex(dim=64, window=4), _UserIndex(dim=64, window=4)
    at_once.add(turns, HashEmbedder(64), True)
    for m in turns:
        one_by_one.add([m], HashEmbedder(64), True)
    assert at_once.words == one_by_one.words and at_once.vocab == one_by_one.vocab
    assert at_once.posting_lists() == one_by_one.posting_lists() and len(at_once.posting_lists()) > 10
    n = len(turns)
    end = int(at_once.term_ptr[n])
    assert np.array_equal(at_once.term_ptr[:n + 1], one_by_one.term_ptr[:n + 1])
    assert np.array_equal(at_once.term_at[:end], one_by_one.term_at[:end])
    size = len(at_once.words)
    assert np.array_equal(at_once.term_df[:size], one_by_one.term_df[:size])
    for q in ("When did Ann go hiking by the lake?", "guitar concert", "What did Bob bake?"):
        qvec = fastpath.hash_embed([q], 64)[0]
        assert np.array_equal(at_once.rank(q, qvec, "", DEFAULT_RANKING), one_by_one.rank(q, qvec, "", DEFAULT_RANKING))
    # And both keep growing alike.
    at_once.add(more, HashEmbedder(64), True)
    one_by_one.add(more, HashEmbedder(64), True)
    assert at_once.posting_lists() == one_by_one.posting_lists()


@pytest.mark.parametrize("dated", [False, True])
def test_compaction_equals_an_index_built_from_the_kept_turns(dated):
    """Dropping the oldest turns in memory (no rows read, nothing re-parsed) leaves exactly the index
    that adding the kept turns to an empty one builds, when the cut falls between sessions."""
    turns = _turns(6, 9)
    full, fresh = _UserIndex(dim=64, window=4, dated=dated), _UserIndex(dim=64, window=4, dated=dated)
    full.add(turns, HashEmbedder(full.dim), True)
    fresh.add(turns[18:], HashEmbedder(fresh.dim), True)
    full.item_bodies([0, 20, 25])
    small = full.compacted(18)
    assert small.ids == fresh.ids and small.texts == fresh.texts and small.known == fresh.known
    assert small.session_rows == fresh.session_rows and small.posting_lists() == fresh.posting_lists()
    assert small.total_len == fresh.total_len and small.day_items == fresh.day_items
    n = len(fresh)
    # Item bytes made before the cut are kept, and are those a fresh index makes.
    assert small.sources == fresh.sources and small.item_bodies(list(range(n))) == fresh.item_bodies(list(range(n)))
    for name in ("codes", "scales", "tokens", "timestamps", "seqs", "roles", "speaker_of", "session_of", "year_month",
                 "day_of", "position", "doc_len", "exact", "simhash", "nbr"):
        assert np.array_equal(getattr(small, name)[:n], getattr(fresh, name)[:n]), name
    q = fastpath.hash_embed(["guitar by the lake"], 64)[0]
    assert np.allclose(small.rank("guitar by the lake", q, "", DEFAULT_RANKING),
                       fresh.rank("guitar by the lake", q, "", DEFAULT_RANKING))
    small.add(_turns(7, 9)[-9:], HashEmbedder(small.dim), True)  # and it keeps growing like any index
    assert len(small) == n + 9 and small.nbr[n, 4] == n + 1


def test_contextual_vectors_embed_a_turn_with_its_previous_turn_and_survive_compaction():
    """With context=1 each turn's vector mixes its own embedding with that of its previous
    same-session turn and itself (a session's first turn alone), context_mix of the latter, so the
    cosine is the mix of the two cosines; a compaction keeps them; without context the turn alone."""
    turns = _turns(4, 5)
    state = _UserIndex(dim=64, window=4, dated=False, context=1, context_chars=400, context_mix=0.3)
    state.add(turns[:7], HashEmbedder(state.dim), True)
    state.add(turns[7:], HashEmbedder(state.dim), True)  # the previous turn may come from an earlier add
    n = len(state)
    expect = [state.texts[i] if state.position[i] == 0 else f"{state.texts[i - 1]}\n{state.texts[i]}"
              for i in range(n)]
    own, ctx = fastpath.hash_embed([m.text for m in turns], 64), fastpath.hash_embed(expect, 64)
    q = fastpath.hash_embed(["guitar by the lake"], 64)[0]
    mixed = 0.7 * own + 0.3 * ctx
    assert np.array_equal(state.codes[:n], quantize_rows(mixed)[0])  # kept as int8 (sidecar.index.int8)
    assert np.allclose(fastpath.int8_dot(state.codes[:n], state.scales[:n], q), mixed @ q, atol=0.01)
    assert not np.allclose(state.codes[:n], quantize_rows(own)[0], atol=2)  # the context is in it
    small = state.compacted(5)
    assert small.context_mix == 0.3 and np.array_equal(small.codes[:len(small)], state.codes[5:n])
    assert np.array_equal(small.scales[:len(small)], state.scales[5:n])
    for plain in (_UserIndex(dim=64, window=4, dated=False), _UserIndex(dim=64, window=4, dated=False, context=1,
                                                                        context_mix=0.0)):
        plain.add(turns, HashEmbedder(plain.dim), True)
        assert np.array_equal(plain.codes[:len(plain)], quantize_rows(own)[0])


def test_the_embedded_query_can_leave_the_speakers_names_out():
    from sidecar.memory.episodic.source import _dense_query

    state = _UserIndex(dim=64, window=4, dated=False)
    state.add(_turns(1, 2), HashEmbedder(state.dim), True)
    r = replace(DEFAULT_RANKING, dense_query_names=False)
    assert _dense_query("What did Ann's dog and bob eat?", state, r) == "What did dog and eat?"
    assert _dense_query("Ann?", state, r) == "Ann?"  # nothing left: the query as asked
    assert _dense_query("What did Ann's dog eat?", state, DEFAULT_RANKING) == "What did Ann's dog eat?"


def test_compaction_inside_a_session_cuts_its_neighbours():
    turns = _turns(2, 9)
    full = _UserIndex(dim=64, window=4, dated=False)
    full.add(turns, HashEmbedder(full.dim), True)
    small = full.compacted(4)  # the first session loses its first four turns
    assert small.ids[0] == "m4" and small.position[0] == 4  # its place in the session is kept
    assert (small.nbr[0, :4] == -1).all() and small.nbr[0, 4] == 1  # no previous turn any more; next is m5
    assert small.session_rows == {"s0": list(range(5)), "s1": list(range(5, 14))}
    assert all(r >= 0 for rows, _ in small.posting_lists().values() for r in rows)


def test_sparse_window_bm25_matches_the_dense_form():
    import numpy as np

    from sidecar.domain import Message, Role
    from sidecar.memory.episodic.index import _UserIndex

    state = _UserIndex(dim=16, window=4)
    texts = ["tortoise eats dandelions", "a blue vase", "tortoise shell", "the garden", "vase of dandelions",
             "bakery night shift", "tortoise tortoise"]
    state.add([Message(f"m{i}", "s1" if i < 4 else "s2", i, Role.USER, t, "", "", 1_683_552_960_000 + i, 0, 0, 0)
               for i, t in enumerate(texts)], HashEmbedder(state.dim), True)
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
    assert terms("Running to the games!") == ["run", "gam"]
    # A word's term: what it says before an apostrophe, stemmed, unless that is a stopword.
    text = "I'm sure Ann's dogs don't bark; we've 2 cats and O'Neil's 3 kittens. 你好 café"
    assert terms(text) == [stem(w) for w in terms(text, stemmed=False)] == [
        "sur", "ann", "dog", "don", "bark", "2", "cat", "o", "s", "3", "kitten", "好", "café"]
    # A final "e" goes, so the bare verb meets its -ing/-ed/-er forms.
    assert stem("hike") == stem("hiking") == stem("hiked") == stem("hikes")
    assert stem("dance") == stem("dancing") == stem("dancer") == stem("dancers")
    assert stem("family") == stem("families") == "family"  # "-ily" is not an adverb's "-ly"
    assert stem("went") == stem("going") == stem("go") and stem("kids") == stem("kid")
    assert stem("adoption") == stem("adopted") == "adopt" and stem("discussion") == "discuss"
    assert stem("onion") == "onion" and stem("region") == "region"
    # An inflection comes off first and what is left is stemmed again: the inflected form meets its word.
    assert stem("vacationed") == stem("vacation") == stem("vacations")
    assert stem("weddings") == stem("wedding") and stem("paintings") == stem("painting") == stem("paint")
    assert stem("mentioned") == stem("mention") and stem("feelings") == stem("feel")
    # A word ending in "ss" or "us" has no plural "s" to lose.
    assert stem("dress") == stem("dressed") == stem("dresses") == "dress"
    assert stem("class") == stem("classes") == "class" and stem("campus") == "campus"
    assert stem("mentorship") == stem("mentoring") == "mentor" and stem("artist") == stem("art")
    assert stem("free") == "free"
    # "-eer" is no agent "-er": "career" is not "car", and "volunteering" meets "volunteer".
    assert stem("career") == stem("careers") == "career" and stem("car") != stem("career")
    assert stem("volunteer") == stem("volunteers") == stem("volunteering") == stem("volunteered")
    assert stem("painter") == "paint" and stem("engineers") == "engineer"


def test_query_dates_and_days():
    import datetime as dt

    from sidecar.memory.episodic import query_dates, query_days

    assert query_days("What dish did Nate make on 9 November, 2022?") == {dt.date(2022, 11, 9)}
    assert query_dates("What dish did Nate make on 9 November, 2022?") == ({(2022, 11)}, set())
    assert query_days("What did she share on October 13, 2023?") == {dt.date(2023, 10, 13)}
    assert query_dates("What did she share on October 13, 2023?") == ({(2023, 10)}, set())
    assert query_days("Where was he between August 11 and August 15 2023?") == {dt.date(2023, 8, 11),
                                                                                  dt.date(2023, 8, 15)}
    assert query_days("the 13th of May 2023") == {dt.date(2023, 5, 13)}
    assert query_dates("in May, 2022") == ({(2022, 5)}, set())  # the comma no longer hides the year
    assert query_dates("What did they do in 2022?") == (set(), {2022})
    assert query_dates("I may go on 3 walks") == (set(), set()) and not query_days("I may go on 3 walks")
    assert not query_days("on 31 February 2023")  # not a day: ignored
    # Chinese: 年 / 月 / 日 (号), in digits or numerals; "三个月" is a duration, not March.
    assert query_days("我2023年5月8日做了什么？") == {dt.date(2023, 5, 8)}
    assert query_dates("我2023年5月8日做了什么？") == ({(2023, 5)}, set())
    assert query_days("十二月二十五日 2022年") == {dt.date(2022, 12, 25)}
    assert query_dates("我三月去了哪里？") == ({(0, 3)}, set()) and not query_days("我三月去了哪里？")
    assert query_dates("2022年我读了几本书？") == (set(), {2022})
    assert query_dates("三个月前") == (set(), set()) and query_dates("2023年二月三十日")[0] == {(2023, 2)}
    assert not query_days("2023年二月三十日")  # not a day: ignored


def _index(sessions: list[tuple[int, list[tuple[str, str]]]]):
    from sidecar.domain import Message, Role
    from sidecar.memory.episodic.index import _UserIndex

    state = _UserIndex(dim=16, window=4, dated=False)
    msgs, i = [], 0
    for day_ms, turns in sessions:
        sid = f"s{len(msgs)}-{day_ms}"
        for k, (speaker, text) in enumerate(turns):
            role = Role.USER if speaker == "Ann" else Role.ASSISTANT
            msgs.append(Message(f"m{i}", sid, k, role, text, "", "", day_ms + k * 1000, 0, 0, 0, speaker=speaker))
            i += 1
    state.add(msgs, HashEmbedder(state.dim), True)
    return state


DAY_MS = 86_400_000
MAY_8 = 1_683_504_000_000  # 8 May 2023 00:00 UTC


def test_a_named_day_ranks_the_turns_told_that_day_or_just_after():
    from sidecar.memory.episodic import DEFAULT_RANKING, Ranking

    same = [("Ann", "I baked a lemon cake for the party."), ("Bob", "Sounds tasty.")]
    state = _index([(MAY_8, same), (MAY_8 + 30 * DAY_MS, same), (MAY_8 + 60 * DAY_MS + 2 * DAY_MS, same)])
    # 7 July 2023 is two days before the third session: told in the days after, so it counts.
    score = state.rank("What cake did Ann bake on 7 July, 2023?", None, "", DEFAULT_RANKING)
    assert score[4] > score[2] and score[4] > score[0]
    # Near the day, and in the month named (9 July): both boosts; the other sessions neither.
    r = DEFAULT_RANKING
    assert score[4] / score[0] == pytest.approx((1.0 + r.day_boost) * (1.0 + r.date_boost))
    assert score[2] == pytest.approx(score[0])
    flat = state.rank("What cake did Ann bake on 7 July, 2023?", None, "", Ranking(day_boost=0.0, date_boost=0.0))
    assert flat[4] == pytest.approx(flat[0])


def test_session_openers_are_boosted():
    import numpy as np

    from sidecar.memory.episodic import Ranking

    turns = [("Ann", "Guess what, I joined a pottery class last week!"), ("Bob", "Nice, what did you make?"),
             ("Ann", "A bowl. The class is on Mondays and pottery is relaxing."), ("Bob", "Cool.")]
    state = _index([(MAY_8, turns)])
    q = "Which pottery class did Ann join?"
    plain = state.rank(q, None, "", Ranking(opener_boost=0.0))
    opener = state.rank(q, None, "", Ranking(opener_boost=0.4, opener_decay=0.3))
    # A session opens with its news: the k-th turn is worth 1 + 0.4 * 0.3 ** k of its plain score.
    assert np.allclose(opener / plain, 1.0 + 0.4 * 0.3 ** np.arange(4))
    assert opener[0] > opener[2] and plain[0] > 0


def test_a_possessive_names_the_speaker():
    from sidecar.memory.episodic import Ranking

    # Rows 0 and 3 say the same with mirrored neighbours: only who says it tells them apart.
    state = _index([(MAY_8, [("Ann", "My tortoise is called Shelly."), ("Bob", "Hi there."), ("Cy", "Hello."),
                             ("Bob", "My tortoise is called Shelly.")])])
    r = Ranking(opener_boost=0.0, speaker_boost=1.0)
    for q in ("What is Ann's tortoise called?", "What is Ann\u2019s tortoise called?", "What is Ann tortoise called?"):
        score = state.rank(q, None, "", r)
        assert score[0] / score[3] == pytest.approx(2.0), q
    flat = state.rank("What is Ann's tortoise called?", None, "", Ranking(opener_boost=0.0, speaker_boost=0.0))
    assert flat[0] == pytest.approx(flat[3])


def test_terms_said_with_the_query_terms_widen_it():
    from sidecar.memory.episodic import Ranking

    hikes = [("Ann", "Went hiking up the ridge trail, what a view."), ("Bob", "Nice."),
             ("Ann", "Another hike on the ridge trail this weekend."), ("Bob", "Cool.")]
    later = [("Ann", "The ridge trail at sunrise was unreal."), ("Bob", "Wow."), ("Ann", "I bought a new lamp.")]
    state = _index([(MAY_8, hikes), (MAY_8 + 30 * DAY_MS, later)])
    r = Ranking(assoc_terms=2, assoc_weight=0.5, opener_boost=0.0, similar_terms=0)
    names = {"ann", "bob"}
    # "trail" and "ridge" share both of the "hike" turns; the names and the query's own terms never count.
    assert sorted(state.associated(terms("Where did Ann hike?"), names, r)) == ["ridg", "trail"]
    assert state.associated(terms("What lamp did Ann buy?"), names, r) == []  # in one turn only: no pair
    q = "Where does Ann like to hike?"
    wide, plain = state.rank(q, None, "", r), state.rank(q, None, "", replace(r, assoc_terms=0))
    assert plain[4] == 0 < wide[4]  # the trail turn of a later session never says "hike"
    # A compacted index counts the same co-occurrences as one built from its rows.
    kept = state.compacted(2)
    assert kept.associated(terms(q), names, r) == _index([(MAY_8, hikes[2:]), (MAY_8 + 30 * DAY_MS, later)]
                                                         ).associated(terms(q), names, r)


def test_a_ranking_is_compared_with_the_first_question_by_question():
    base = {"per_question": {2000: [1.0, 0.5, 0.0, 1.0] * 50}}
    assert recall.against(base, base) == {"2000": {"better": 0, "worse": 0, "points": 0.0, "ci95": [0.0, 0.0]}}
    # Every question a little better: an interval clear of 0.
    lifted = {"per_question": {2000: [1.0, 1.0, 0.5, 1.0] * 50}}
    clear = recall.against(base, lifted)["2000"]
    assert (clear["better"], clear["worse"], clear["points"]) == (100, 0, 25.0) and 0 < clear["ci95"][0] < 25 < clear["ci95"][1]
    # Two questions up, one down among 200: a difference the questions cannot tell from chance.
    flipped = {"per_question": {2000: [1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 0.0, 1.0] + base["per_question"][2000][8:]}}
    flipped["per_question"][2000][3] = 0.0
    noise = recall.against(base, flipped)["2000"]
    assert (noise["better"], noise["worse"]) == (2, 1) and noise["ci95"][0] < 0 < noise["ci95"][1]
    assert recall.against(base, flipped)["2000"] == noise  # seeded: a rerun prints the same
    # Questions of a few conversations: resampled by conversation, as unseen conversations would differ.
    # Two conversations, one the same and one all better: the interval spans both.
    split = {"per_question": {2000: [1.0] * 100 + [0.0] * 100}, "conversation_of": [1] * 100 + [2] * 100}
    mixed = {"per_question": {2000: [1.0] * 200}}
    by_conv = recall.against(split, mixed)["2000"]
    assert by_conv["points"] == 50.0 and by_conv["ci95"][0] <= 0.0 and by_conv["ci95"][1] == 100.0
    assert 40 < recall.against({**split, "conversation_of": list(range(200))}, mixed)["2000"]["ci95"][0]
    # A figure's own interval: its questions resampled by conversation.
    assert recall.interval95([1.0] * 100 + [0.0] * 100, [1] * 100 + [2] * 100) == [0.0, 1.0]
    lo, hi = recall.interval95([1.0] * 150 + [0.0] * 50, list(range(200)))
    assert 0.65 < lo < 0.75 < hi < 0.85


def test_offline_mode_matches_the_grpc_metric(tmp_path):
    convs = recall.load(TINY)
    app, maps = recall.offline_app(tmp_path / "cache", convs)
    try:
        assert set(maps) == {1} and sorted(maps[1].values()) == ["D1:1", "D1:2", "D1:3", "D2:1", "D2:2"]
        figures = recall.offline_evaluate(app, convs, maps, (2000, 20))
        assert figures["questions"] == 3
        assert figures["recall"]["2000"] == 1.0 and figures["recall"]["20"] < 1.0
        # Each figure's spread over conversations like these: one conversation, so the interval is the figure.
        assert figures["recall_ci95"] == {"2000": [1.0, 1.0], "20": [figures["recall"]["20"]] * 2}
        # best_of: per question the better of the runs (an upper bound on picking between rankings).
        assert recall.best_of([figures, figures]) == figures["recall"]
        other = {"per_question": {2000: [0.0, 0.0, 0.0], 20: [1.0, 1.0, 0.0]}}
        assert recall.best_of([figures, other]) == {"2000": 1.0, "20": round(
            sum(max(a, b) for a, b in zip(figures["per_question"][20], [1.0, 1.0, 0.0], strict=True)) / 3, 4)}
        narrowed = recall.offline_evaluate(app, convs, maps, (2000,), recall.parse_ranking("neighbours=2,stem=false"))
        assert app.episodic.ranking.neighbours == 2 and not app.episodic.ranking.stem
        assert narrowed["recall"]["2000"] == 1.0
        # --live: each question asked, and the builder's clock read, a day after the last turn (LoCoMo
        # gives no time of asking); the clock is the server's again afterwards.
        clock, build, seen = app.builder.clock, app.builder.build, []
        app.builder.build = lambda scope, req: (seen.append((app.builder.clock(), req.asked_at_ms)), build(scope, req))[1]
        live = recall.offline_evaluate(app, convs, maps, (2000,), live=True)
        asked = max(t.timestamp_ms for t in convs[0].turns()) + recall.DAY_MS
        assert len(seen) == 3 and set(seen) == {(asked, asked)} and live["recall"]["2000"] == 1.0
        assert app.builder.clock is clock
    finally:
        app.close()
    # The cache is reused: no second replay.
    app, again = recall.offline_app(tmp_path / "cache", convs)
    app.close()
    assert again == maps


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
    # Asked one after another in one session at one budget, as an agent's calls come, too.
    assert figures["in_one_session"] == {"2000": 1.0, "4000": 1.0} and figures["in_one_session_questions"] == 3
    assert figures["evidence_issues"]["dangling"] == 1 and figures["evidence_issues"]["malformed"] == 1
    assert set(figures["by_category"]) == {"1", "2", "4"}
    assert figures["build_p50_ms"] > 0


def test_the_cache_bench_asks_a_users_questions_one_after_another_in_one_session(running, tmp_path):
    import cache  # bench/cache.py

    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(TINY))
    name = f"tiny-{os.getpid()}"
    calls, found = cache.questions_in_turn(running.stub, path, pb.LAYOUT_CACHE_AWARE, name, quick=False)
    assert len(calls) == 3 and found == 1.0  # the whole history fits: every question finds its evidence
    scope = pb.Scope(tenant_id="questions", user_id=f"asker-{name}")
    sessions = running.stub.ListSessions(pb.ListSessionsRequest(scope=scope)).sessions
    asked = [s for s in sessions if s.session_id not in ("s1", "s2")]  # the two imported ones aside
    history = running.stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=asked[0].session_id,
                                                                newest=100)).messages
    assert len(asked) == 1 and [m.text for m in history][::2] == [q.text for q in recall.load(TINY)[0].questions]
    ledger = cache.Ledger()
    ledger.session(calls)
    assert ledger.figures()["calls"] == 3


def test_recall_plot_is_a_png_and_is_skipped_without_matplotlib(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    figures = {"recall": {"2000": 0.92, "4000": 0.96}, "recency": {"2000": 0.09, "4000": 0.2}}
    path = tmp_path / "recall.png"
    assert recall.plot_recall(figures, "default", (2000, 4000), path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the `plot` extra were not installed
    assert not recall.plot_recall(figures, "default", (2000, 4000), tmp_path / "none.png")
    assert not (tmp_path / "none.png").exists()


def test_recency_baseline_skips_what_does_not_fit():
    conv = recall.load(TINY)[0]
    assert recall.recency_ids(conv, 0) == set()
    newest = recall.recency_ids(conv, 25)
    assert "D2:2" in newest and "D1:1" not in newest


def test_a_turn_in_the_first_person_outranks_one_about_the_listener():
    from fastpath import voice
    from sidecar.memory.episodic import Ranking

    assert voice("I started pottery, my kids love it.") == 1
    assert voice("You started pottery? Your kids must love it!") == -1
    assert voice("Pottery is relaxing.") == 0 and voice("I hear you.") == 0
    # Rows 0 and 2 share their words and mirrored neighbours: only whom they speak of differs.
    state = _index([(MAY_8, [("Ann", "I love my pottery class."), ("Bob", "Nice."),
                             ("Bob", "You love your pottery class.")])])
    r = Ranking(opener_boost=0.0, self_boost=0.2, other_penalty=0.2)
    score = state.rank("Who loves the pottery class?", None, "", r)
    assert score[0] / score[2] == pytest.approx(1.2 / 0.8)
    flat = state.rank("Who loves the pottery class?", None, "", Ranking(opener_boost=0.0, self_boost=0.0,
                                                                          other_penalty=0.0))
    assert flat[0] == pytest.approx(flat[2])
    # A compacted index keeps each turn's voice.
    assert state.compacted(1).voice[:2].tolist() == [0, -1]


def test_a_turn_naming_someone_or_something_is_boosted():
    from fastpath import capitalised
    from sidecar.memory.episodic import Ranking

    assert capitalised('Hey Mel! We read "Charlotte\'s Web" in Chicago. Wow. Ok') == ("mel", "charlotte", "web",
                                                                                     "chicago")
    # Rows 0 and 2 share their words and mirrored neighbours; "Mel" (Melanie's nickname) and a speaker's
    # name are no proper nouns, "Laura" is.
    state = _index([(MAY_8, [("Caroline", "Hey Mel, the shelter thanked Laura."), ("Melanie", "Nice."),
                             ("Melanie", "Hey Caroline, the shelter thanked laura.")])])
    assert state.proper[:3].tolist() == [True, False, False]
    r = Ranking(opener_boost=0.0, self_boost=0.0, other_penalty=0.0, proper_boost=0.15)
    score = state.rank("Who did the shelter thank?", None, "", r)
    assert score[0] / score[2] == pytest.approx(1.15)
    # A name is known as a speaker's once they speak: a turn before that is marked again.
    state.add([Message("late", f"s0-{MAY_8}", 3, Role.USER, "Hi all.", "", "", MAY_8 + 3000, 0, 0, 0,
                       speaker="Laura")], HashEmbedder(state.dim), True)
    assert not state.proper[0] and state.compacted(1).proper[:2].tolist() == [False, False]


def test_similar_words_widen_the_query():
    from sidecar.memory.episodic import Ranking, similar_rows, table_stems

    near = [table_stems(rows) for rows in similar_rows([stem("married"), "zzqx"], 0.4)]
    assert {"husband", "wif"} <= set(near[0]) and stem("married") not in near[0] and near[1] == ()
    turns = [("Ann", "My husband cooked dinner for us."), ("Bob", "Nice."), ("Ann", "Cool weather today."),
             ("Bob", "Sure."), ("Ann", "Sure."), ("Bob", "Yes."), ("Ann", "I bought a new lamp and a guitar.")]
    state = _index([(MAY_8, turns)])
    r = Ranking(opener_boost=0.0, assoc_terms=0)
    names = {"ann", "bob"}
    assert state.similar(terms("Is Ann married?"), names, r) == ["husband"]  # the user's words only
    assert state.similar(terms("Is Ann married?"), names, replace(r, similar_min=0.99)) == []
    q = "Is Ann married?"
    wide, plain = state.rank(q, None, "", r), state.rank(q, None, "", replace(r, similar_terms=0))
    assert plain.max() == 0 < wide[0] and int(np.argmax(wide)) == 0  # no shared word: bridged by meaning


def test_similar_stems_precomputed_for_the_whole_table_equal_those_asked_one_at_a_time():
    """The warm-up fills every stem's similar stems in blocks; each list is the one a query's word
    alone gets (a cosine floor no ranking uses here, so the shared lists are left alone)."""
    from sidecar.memory.episodic import expansion

    floor = 0.61
    keys = expansion._stem_vectors()[1]
    sample = keys[::97]
    try:
        alone = {t: expansion.similar_rows([t], floor)[0] for t in sample}
        for t in sample:
            del expansion._SIMILAR[t, floor]
        expansion.precompute_similar(floor)
        assert all((t, floor) in expansion._SIMILAR for t in keys)
        assert all(np.array_equal(expansion._SIMILAR[t, floor], alone[t]) for t in sample)
        assert sum(len(v) for v in alone.values()) > len(sample)  # the floor leaves lists to compare
    finally:
        for t in keys:
            expansion._SIMILAR.pop((t, floor), None)


def test_warm_up_stops_once_closed_and_the_app_waits_for_it(tmp_path):
    """The warm-up's numpy work must not outlive the process (a daemon thread inside BLAS at exit
    crashed a sidecar stopped within a second of its start): closed, it computes nothing more, and
    Sidecar.close() returns only once the thread is gone."""
    from sidecar import app as app_module
    from sidecar.memory.episodic import expansion

    floor = 0.77  # no ranking uses it: a list with this floor can only come from this warm-up
    source = EpisodicSource(None, ranking=replace(DEFAULT_RANKING, similar_min=floor))
    source.close()
    source.warm_up()
    assert not any(key[1] == floor for key in expansion._SIMILAR)
    sidecar = app_module.Sidecar(str(tmp_path / "warm.duckdb"))
    sidecar.close()
    assert not sidecar._episodic_warm_up.is_alive()


def test_a_question_for_kinds_of_things_is_told_apart():
    from sidecar.memory.episodic import asks_for_kinds

    kinds = ["What activities does Melanie partake in?", "Which cities has Jon visited?", "which countries?",
             "What kind of music does John like?", "What outdoor activities has John done with his colleagues?",
             "What animal do both Nate and Joanna like?", "What do Jon and Gina have in common?"]
    facts = ["What is Caroline's relationship status?", "What does Tim do to escape reality?", "What's new?",
             "How many turtles does Nate have?", "What was his answer?", "When did Ann move?", ""]
    assert [asks_for_kinds(q) for q in kinds] == [True] * len(kinds)
    assert [asks_for_kinds(q) for q in facts] == [False] * len(facts)


def test_a_question_for_kinds_gives_meaning_its_own_share():
    from sidecar.memory.episodic import Ranking

    state = _index([(MAY_8, [("Ann", "I went to Paris and Rome."), ("Bob", "Which one was best?"),
                             ("Ann", "Rome, for the food."), ("Bob", "I have not travelled much.")])])
    base = Ranking(opener_boost=0.0, assoc_terms=0, similar_terms=0, prf_docs=0, dense_weight=0.0)
    for q, kinds in (("Which cities has Ann visited?", True), ("Where did Ann go to eat?", False)):
        qvec = HashEmbedder(state.dim).embed([q])[0]
        lexical = state.rank(q, qvec, "", base)
        shared = state.rank(q, qvec, "", replace(base, kind_dense_weight=0.5))
        assert (not np.allclose(shared, lexical)) is kinds, q  # only a question for kinds mixes the cosine in



def test_a_question_asking_when_gives_meaning_its_own_share():
    from sidecar.memory.episodic import Ranking, asks_when

    assert [asks_when(q) for q in ("When did Ann move?", " when is the party", "How long has Bob lived here?")] \
        == [True] * 3
    assert [asks_when(q) for q in ("Whence?", "How many dogs?", "What did Ann say when Bob left?", "")] == [False] * 4
    state = _index([(MAY_8, [("Ann", "I moved to Paris."), ("Bob", "Which part?"), ("Ann", "Near the river.")])])
    base = Ranking(opener_boost=0.0, assoc_terms=0, similar_terms=0, prf_docs=0, dense_weight=0.5,
                   kind_dense_weight=0.5)
    for q, when in (("When did Ann move to Paris?", True), ("Why did Ann move to Paris?", False),
                    ("When did Ann visit both cities?", True)):  # asking when beats asking for kinds ("both")
        qvec = HashEmbedder(state.dim).embed([q])[0]
        plain = state.rank(q, qvec, "", base)
        lexical = state.rank(q, qvec, "", replace(base, dense_weight=0.0, kind_dense_weight=0.0))
        own = state.rank(q, qvec, "", replace(base, when_dense_weight=1e-9))  # ~lexical alone when asked when
        assert np.allclose(own, lexical) is when and np.allclose(own, plain) is not when, q

def test_feedback_from_the_best_turns_widens_the_query():
    from sidecar.memory.episodic import Ranking

    first = [("Ann", "My pottery class made a glazed bowl."), ("Bob", "Nice."), ("Ann", "I bought a new lamp.")]
    later = [("Ann", "The glazed bowl cracked in the kiln."), ("Bob", "Oh no."), ("Ann", "Cold weather today.")]
    state = _index([(MAY_8, first), (MAY_8 + 30 * DAY_MS, later)])
    r = Ranking(opener_boost=0.0, assoc_terms=0, similar_terms=0, prf_docs=1, prf_terms=4,
                prf_weight=0.5)
    q = "What pottery did Ann make?"
    wide, plain = state.rank(q, None, "", r), state.rank(q, None, "", replace(r, prf_docs=0))
    # The best turn's terms said elsewhere too ("glazed", "bowl") find the later turn that never says "pottery".
    assert plain[3] == 0 < wide[3] and int(np.argmax(wide)) == 0


def test_similar_words_follow_the_users_vocabulary_as_it_grows():
    from sidecar.domain import Message, Role
    from sidecar.memory.episodic import Ranking

    state = _index([(MAY_8, [("Ann", "Cool weather today."), ("Bob", "Sure.")])])
    r = Ranking(similar_terms=10, similar_min=0.4)
    q = terms("Is Ann married?")
    assert state.similar(q, {"ann", "bob"}, r) == []  # the user never said a word near "married"
    state.add([Message("m9", "s9", 0, Role.USER, "My husband cooked dinner.", "", "", MAY_8 + DAY_MS, 0, 0, 0,
                       speaker="Ann")], HashEmbedder(state.dim), True)
    assert state.similar(q, {"ann", "bob"}, r) == ["husband"]  # a word said since the last query counts
    assert state.compacted(1).similar(q, {"ann", "bob"}, r) == ["husband"]  # a compacted index has its own


def test_rank_after_more_turns_or_other_knobs_equals_a_fresh_index():
    """The per-turn prior and the window norms are cached between queries: turns added since, or other
    knobs, must give exactly what an index built from scratch gives."""
    turns = _turns(4, 6)
    q, query = fastpath.hash_embed(["guitar by the lake"], 64)[0], "guitar by the lake"
    grown = _UserIndex(dim=64, window=4, dated=False)
    grown.add(turns[:9], HashEmbedder(64), True)
    grown.rank(query, q, "", DEFAULT_RANKING)
    grown.add(turns[9:], HashEmbedder(64), True)
    assert np.array_equal(grown.rank(query, q, "", DEFAULT_RANKING), _fresh_rank(turns, query, q, DEFAULT_RANKING))
    other = replace(DEFAULT_RANKING, proper_boost=0.6, opener_boost=0.0, self_boost=0.5)
    assert np.array_equal(grown.rank(query, q, "", other), _fresh_rank(turns, query, q, other))
    assert not np.array_equal(grown.rank(query, q, "", other), grown.rank(query, q, "", DEFAULT_RANKING))


def _fresh_rank(turns: list[Message], query: str, q: np.ndarray, r) -> np.ndarray:
    state = _UserIndex(dim=64, window=4, dated=False)
    state.add(turns, HashEmbedder(64), True)
    return state.rank(query, q, "", r)


def test_the_same_question_over_the_same_turns_reuses_its_ranking(monkeypatch):
    """An agent's tool loop asks again with one user message: the ranking is kept while the user's turns
    are the same, for that question, current session and client vector only; a new turn ranks afresh."""
    turns = _turns(4, 6)
    store = _RowsStore(turns[:9])
    source = EpisodicSource(store, HashEmbedder(64))
    scope = Scope("t", "u")
    ranked = []
    rank = _UserIndex.rank
    monkeypatch.setattr(_UserIndex, "rank", lambda self, *a: ranked.append(a[0]) or rank(self, *a))
    query = "guitar by the lake"
    _, rows, rel = source.search(scope, query, "", 400)
    _, rows_again, rel_again = source.search(scope, query, "", 400)
    assert ranked == [query] and np.array_equal(rows, rows_again) and np.array_equal(rel, rel_again)
    _, more, _ = source.search(scope, query, "", 4000)  # another budget: the same ranking, cut later
    assert ranked == [query] and np.array_equal(more[:len(rows)], rows) and len(more) >= len(rows)
    source.search(scope, "where is the lake", "", 400)
    source.search(scope, query, turns[0].session_id, 400)  # another current session
    vec = np.ones(64, np.float32)
    source.takes_client_vectors = True
    source.search(scope, query, "", 400, vec)
    source.search(scope, query, "", 400, vec)
    source.search(scope, query, "", 400, -vec)
    assert len(ranked) == 5
    source.takes_client_vectors = False
    source.on_append(scope, turns[9].session_id, turns[9:])  # the user's turns grow: rank again
    _, grown, _ = source.search(scope, query, "", 4000)
    assert len(ranked) == 6
    fresh = EpisodicSource(_RowsStore(turns), HashEmbedder(64)).search(scope, query, "", 4000)[1]
    assert np.array_equal(grown, fresh)
    # Forgetting the user drops their rankings too (they hold the user's questions).
    assert any(query in key[1] for key in source._ranked._entries)
    source.forget(scope)
    assert not source._ranked._entries


def test_new_knobs_rebuild_a_users_index_only_when_it_is_built_with_them():
    """set_ranking (tuning): a knob that only weighs what an index holds keeps the index and ranks as a
    source built with it from the start; a knob the index is built with (its window, contextual
    vectors, stemming) rebuilds it from rows."""
    turns = _turns(4, 6)
    scope, query = Scope("t", "u"), "guitar by the lake"
    source = EpisodicSource(_RowsStore(turns), HashEmbedder(64))
    source.search(scope, query, "", 4000)
    index = source._users[("t", "u")]
    weights = dict(dense_weight=0.6, speaker_boost=0.2, prev_decay=0.3, opener_boost=0.1, similar_min=0.5)
    for knobs in (weights, dict(neighbours=2), dict(stem=False), dict(embed_context=0)):
        ranking = replace(DEFAULT_RANKING, **knobs)
        source.set_ranking(ranking)
        _, rows, rel = source.search(scope, query, "", 4000)
        kept = source._users[("t", "u")] is index
        assert kept == ("dense_weight" in knobs), knobs
        _, fresh_rows, fresh_rel = EpisodicSource(_RowsStore(turns), HashEmbedder(64), ranking=ranking).search(
            scope, query, "", 4000)
        assert np.array_equal(rows, fresh_rows) and np.allclose(rel, fresh_rel), knobs
        index = source._users[("t", "u")]


class _RowsStore:
    """The store calls EpisodicSource makes, over a list of turns."""

    def __init__(self, turns: list[Message]) -> None:
        self.turns = turns

    def list_user_messages(self, scope, roles, newest):
        return self.turns[-newest:]

    def recall_exclusions(self, scope):
        return set()

    def session_view(self, scope, session_id):
        from types import SimpleNamespace

        return SimpleNamespace(session=SimpleNamespace(parent_session_id=""))


def _told(sessions: list[tuple[str, str]]):
    """An index of one user's sessions a month apart, each one turn (speaker, text) and a reply."""
    return _index([(MAY_8 + k * 30 * DAY_MS, [(who, text), ("Bob", "Good to know.")])
                   for k, (who, text) in enumerate(sessions)])


def test_a_newer_telling_of_the_same_thing_scores_above_the_older_one():
    from sidecar.memory.episodic import DEFAULT_RANKING

    state = _told([("Ann", "I do yoga twice a week for my anxiety, it helps a lot with the stress."),
                   ("Ann", "Now I do yoga three times a week.")])
    q_terms = state.query_terms("How often do I do yoga?", DEFAULT_RANKING)[0]
    rows, scores = np.array([0, 2, 1, 3]), np.array([1.0, 0.8, 0.3, 0.2])
    lifted = state.newer_first(q_terms, rows, scores, DEFAULT_RANKING)
    # The newer telling (row 2) scores just above the older (row 0), which keeps its score; the
    # replies, which say nothing asked, keep theirs.
    assert lifted[1] > lifted[0] and lifted[0] == pytest.approx(1.0) and lifted[1] < 1.001
    assert lifted[2:].tolist() == [0.3, 0.2]
    # Too weak a match is no update (the newer must score half of the older at least).
    weak = np.array([1.0, 0.4, 0.3, 0.2])
    assert state.newer_first(q_terms, rows, weak, DEFAULT_RANKING).tolist() == weak.tolist()


def test_no_update_from_another_speaker_or_without_the_older_tellings_terms():
    from sidecar.memory.episodic import DEFAULT_RANKING

    q = "How often does Ann do yoga in the park?"
    rows, scores = np.array([0, 2]), np.array([1.0, 0.9])
    other = _told([("Ann", "I do yoga in the park twice a week."), ("Cat", "I do yoga in the park daily.")])
    q_terms = other.query_terms(q, DEFAULT_RANKING)[0]
    assert other.newer_first(q_terms, rows, scores, DEFAULT_RANKING).tolist() == [1.0, 0.9]
    # The newer turn says yoga but not the park the older one was matched on: another thing.
    narrower = _told([("Ann", "I do yoga in the park twice a week."), ("Ann", "I do yoga daily.")])
    assert narrower.newer_first(q_terms, rows, scores, DEFAULT_RANKING).tolist() == [1.0, 0.9]


def test_the_newest_of_three_tellings_scores_first():
    from sidecar.memory.episodic import DEFAULT_RANKING

    state = _told([("Ann", "My Starbucks gold level needs 400 stars."), ("Ann", "Correction: gold needs 125 stars."),
                   ("Ann", "Actually the gold level needs 120 stars.")])
    q_terms = state.query_terms("How many stars for the gold level?", DEFAULT_RANKING)[0]
    lifted = state.newer_first(q_terms, np.array([2, 0, 4]), np.array([1.0, 0.9, 0.8]), DEFAULT_RANKING)
    assert lifted[2] > lifted[0] > lifted[1] and lifted[1] == pytest.approx(0.9)  # rows 4 (newest), 2, 0


def test_a_question_asking_for_the_value_now_needs_no_now_in_the_newer_telling():
    from sidecar.memory.episodic import DEFAULT_RANKING

    state = _told([("Ann", "Any tips on weathering effects for my current project, a Mustang model?"),
                   ("Ann", "I wrapped that one up and switched to a pickup truck model.")])
    q_terms = state.query_terms("What vehicle model am I currently working on?", DEFAULT_RANKING)[0]
    assert "current" in q_terms  # the older telling is matched on it, the newer is not
    rows, scores = np.array([0, 2]), np.array([1.0, 0.65])
    lifted = state.newer_first(q_terms, rows, scores, DEFAULT_RANKING)
    assert lifted[1] > lifted[0] == pytest.approx(1.0)


def test_a_question_asking_for_an_earlier_value_is_told_apart():
    from sidecar.memory.episodic import asks_before

    for q in ("What was my previous goal for my Apex Legends level?", "What did I buy before the air fryer?",
              "How often did I play tennis previously? How often now?", "Where did I use to live?",
              "What was my level at first?", "What did I originally plan?"):
        assert asks_before(q), q
    for q in ("Where do I live?", "What model am I currently working on?", "How many titles are on my list?",
              "What was the beforehand plan?", "What have I used to edit my videos?"):
        assert not asks_before(q), q


def test_a_newer_telling_scores_first_in_the_built_context(running, user):
    """Over gRPC: both tellings are packed, the newer one with the higher score; a question asking
    where the user lived before keeps the order of relevance (the older, shorter match first)."""
    ids = []
    for k, text in enumerate(["I live in Boston.",  # the shorter: the better lexical match
                              "Since the move last month I live in Denver, in a flat near a park with my two cats."]):
        sid = running.stub.CreateSession(pb.CreateSessionRequest(scope=user)).session_id
        when = MAY_8 + k * 60 * DAY_MS
        msgs = [pb.NewMessage(role=pb.ROLE_USER, text=text, client_timestamp_ms=when),
                pb.NewMessage(role=pb.ROLE_ASSISTANT, text="Noted.", client_timestamp_ms=when + 1000)]
        ids.append(running.stub.AppendMessages(pb.AppendMessagesRequest(scope=user, session_id=sid, messages=msgs))
                   .messages[0].message_id)
    new_sid = running.stub.CreateSession(pb.CreateSessionRequest(scope=user)).session_id
    items = {it.source: it.score for it in build(running.stub, user, new_sid, "Where do I live?")}
    boston, denver = items[f"message:{ids[0]}"], items[f"message:{ids[1]}"]
    assert denver > boston
    other_sid = running.stub.CreateSession(pb.CreateSessionRequest(scope=user)).session_id  # no kept recall block
    items = {it.source: it.score for it in build(running.stub, user, other_sid, "Where did I live previously?")}
    boston, denver = items[f"message:{ids[0]}"], items[f"message:{ids[1]}"]
    assert boston > denver


def test_a_long_turn_is_packed_as_its_best_passage_under_a_small_budget(running, user):
    """Over gRPC: a long answer recalled under a small budget is packed as the run of its sentences
    about the question, naming the whole message; under a large one it is packed whole."""
    from sidecar.tokens import count_tokens

    script = " ".join([*(f"Scene {i}: the crew walks across set number {i} and talks about the lights." for i in range(60)),
                       "Andy enters wearing a bright yellow raincoat and rubber boots.",
                       *(f"Scene {i}: the camera pans over prop table {i} in silence." for i in range(60, 120))])
    sid = running.stub.CreateSession(pb.CreateSessionRequest(scope=user)).session_id
    msgs = [pb.NewMessage(role=pb.ROLE_USER, text="Write me a comedy script please.", client_timestamp_ms=MAY_8),
            pb.NewMessage(role=pb.ROLE_ASSISTANT, text=script, client_timestamp_ms=MAY_8 + 1000)]
    long_id = running.stub.AppendMessages(pb.AppendMessagesRequest(scope=user, session_id=sid, messages=msgs)
                                          ).messages[1].message_id
    new_sid = running.stub.CreateSession(pb.CreateSessionRequest(scope=user)).session_id
    whole_tokens = count_tokens("assistant: " + script)
    seen: dict[int, pb.ContextItem] = {}
    for memories, cut in ((800, True), (800, True), (20_000, False)):  # the same question again: the same item
        resp = running.stub.BuildContext(pb.BuildContextRequest(
            scope=user, session_id=new_sid, query="What was Andy wearing in the script you wrote?",
            budget=pb.Budget(max_input=memories + 400, reserved_for_output=0, memories=memories, recent_messages=0,
                             flow_unused=False)))
        item = next(it for s in resp.sections for it in s.items if it.source == f"message:{long_id}")
        assert list(item.source_message_ids) == [long_id]
        assert item.tokens == count_tokens(item.text + "\n")
        assert "Andy enters wearing a bright yellow raincoat" in item.text
        if cut:
            assert item.text.startswith("assistant: … ") and item.text.endswith(" …")
            assert item == seen.setdefault(memories, item)
            assert item.tokens <= memories * 0.125 * 1.2 < whole_tokens
        else:
            assert item.text == "assistant: " + script
    # In another tokenizer the passage is counted in it, and the prompt fits the budget there.
    from sidecar.tokens import counter

    resp = running.stub.BuildContext(pb.BuildContextRequest(
        scope=user, session_id=new_sid, query="What was Andy wearing in the script you wrote?", tokenizer="o200k_base",
        render=pb.RENDER_MODE_TEXT, budget=pb.Budget(max_input=1200, reserved_for_output=0, memories=800,
                                                     recent_messages=0, flow_unused=False)))
    item = next(it for s in resp.sections for it in s.items if it.source == f"message:{long_id}")
    o200k = counter("o200k_base")
    assert item.text.endswith(" …") and "yellow raincoat" in item.text and item.tokens == o200k.count_line(item.text)
    assert o200k.count(resp.rendered_text) <= resp.total_budget


@pytest.mark.parametrize("pasted", [
    "2026-11-03T10:02:11Z ERROR payment-api upstream timeout host=db-7 " * 3000,  # a log, ~200 KB on one line
    "x" * 200_000,  # no blank at all
    "数据库连接超时，支付服务返回五零三错误，请检查连接池配置。" * 2500,  # CJK, stops without blanks
    "🙂🔥 " * 25_000,  # emoji
])
def test_a_huge_pasted_turn_is_recalled_as_a_passage_within_the_budget(running, user, pasted):
    from sidecar.tokens import count_tokens

    sid = running.stub.CreateSession(pb.CreateSessionRequest(scope=user)).session_id
    msg = pb.NewMessage(role=pb.ROLE_USER, text="payment-api 支付 timeout 🔥 " + pasted, client_timestamp_ms=MAY_8)
    mid = running.stub.AppendMessages(pb.AppendMessagesRequest(scope=user, session_id=sid, messages=[msg])
                                      ).messages[0].message_id
    new_sid = running.stub.CreateSession(pb.CreateSessionRequest(scope=user)).session_id
    resp = running.stub.BuildContext(pb.BuildContextRequest(
        scope=user, session_id=new_sid, query="payment-api 支付 timeout 🔥", render=pb.RENDER_MODE_TEXT,
        budget=pb.Budget(max_input=1400, reserved_for_output=0, memories=1000, recent_messages=0, flow_unused=False)))
    item = next(it for s in resp.sections for it in s.items if it.source == f"message:{mid}")
    assert item.tokens == count_tokens(item.text + "\n") <= 1000 * 0.125 * 1.5
    assert count_tokens(resp.rendered_text) <= resp.total_budget


_VOICE_PIECES = [*"iI'mMyYoOuUrRwWeEsS .!?\"\n\tAbcL-_1ıİſK\u212aé我你您", "you", "You", "YOUR", "yours", "yourself", "I'm",
                 "we're", "our", "ours", "us", "me", "mine", "myself", "my", "we", "Ann", "Mel"]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(_VOICE_PIECES), max_size=30).map("".join) | st.text(max_size=40))
def test_voice_and_capitalised_answer_as_their_plain_patterns(text):
    # The reference patterns the faster forms must agree with: IGNORECASE on every text, and the
    # assertions of a capitalised word tried at every position.
    import re

    from fastpath import capitalised, voice

    person = re.compile(r"\b(i|i'm|i've|i'd|i'll|me|my|mine|myself|we|we're|we've|us|our|ours"
                        r"|(you|your|you're|you've|you'd|you'll|yours|yourself))\b", re.I)
    own = sum(1 for m in person.finditer(text) if not m.group(2)) + text.count("我")
    other = sum(1 for m in person.finditer(text) if m.group(2)) + text.count("你") + text.count("您")
    assert voice(text) == (own > other) - (other > own)
    plain = re.compile(r"(?<![.!?]\s)(?<![.!?]\s\")(?<!^)\b[A-Z][a-z]+")
    assert capitalised(text) == tuple(dict.fromkeys(w.lower() for w in plain.findall(text)))


def test_a_recalled_turn_gets_no_bonus_for_being_recent(stub, scope):
    """What is recalled from past sessions is what the ranking puts first: yesterday's passing mention
    is not lifted over last month's answer by its age, as the builder's recency bonus (up to 0.5 on
    relevance in (0, 1]) would have done for a live user."""
    day_ms = 86_400_000
    now = int(time.time() * 1000)

    def told(days_ago: int, text: str) -> pb.ImportedSession:
        at = now - days_ago * day_ms
        return pb.ImportedSession(session_id=f"d{days_ago}", closed=True, messages=[
            pb.NewMessage(role=pb.ROLE_USER, text=text, client_timestamp_ms=at),
            pb.NewMessage(role=pb.ROLE_ASSISTANT, text="Thanks for telling me.", client_timestamp_ms=at + 1000)])

    stub.ImportSessions(pb.ImportSessionsRequest(scope=scope, sessions=[
        told(30, "My doctor recommended chamomile tea for my sleep, before bed."),
        told(1, "My doctor recommended some sleep and tea, so I will try.")]))
    asking = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    budget = pb.Budget(max_input=200, reserved_for_output=0, system_and_tools=0, session_state=0,
                       recent_messages=0, memories=24, rag_or_graph=0, tool_observations=0, flow_unused=True)
    resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=asking, budget=budget, debug=True,
                                                    query="Which tea did my doctor recommend for my sleep?"))
    turns = [it for s in resp.sections for it in s.items if it.source.startswith("message:")]
    assert [it.text for it in turns] == ["user: My doctor recommended chamomile tea for my sleep, before bed."]
    passing = [d for d in resp.dropped if d.source.startswith("message:")]  # yesterday's, left out for room
    assert passing and all(d.score < turns[0].score for d in passing)
