"""Context quality on long conversations (issues #8, #32), each user's past replayed through a real
sidecar over gRPC, then every question asked in a new session of that user. Evidence recall = share of
a question's evidence turns present in the context (as the turn itself, as a passage of it, or through a
memory whose source_message_ids include it; a passage or memory only if it keeps every word of the
answer the turn says), beside two baselines packed under the same budgets: recency (newest
turns first) and a plain BM25 over the user's turns.

- LoCoMo: a conversation is a user; its questions of categories 1-4 (5 has no evidence).
- LongMemEval: a question is a user, its haystack (~48 sessions) replayed in date order; abstention
  questions (`_abs`) are left out. It also names evidence sessions: session recall = share of them
  with at least one turn in the context.

python bench/recall.py [--data PATH] [--dataset locomo|longmemeval] [--limit N] [--profile default|model|multilingual]
                       [--quick] [--commit turn|session|import]

The data (LoCoMo CC BY-NC, LongMemEval MIT) is read from ../shared, never copied into the repo.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gzip
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from fastpath_bench import yardstick_ms
from harness import ROOT, ServerProcess, emit, one_core, percentiles, served_build_latency

from sidecar.api import context_service_pb2 as pb
from sidecar.assembly.builder import SOFT_HEADER_RESERVE
from sidecar.domain import Role
from sidecar.index.embedders import NEEDS, model_installed, needs_extra
from sidecar.memory.episodic import (
    DEFAULT_RANKING,
    MODEL_RANKING,
    asks_before,
    date_label,
    day_number,
    render_turn,
)
from sidecar.text import STOPWORDS
from sidecar.tokens import count_line, count_lines, count_tokens

DATA = ROOT.parent / "shared" / "data"
DEFAULT_DATA = {"locomo": DATA / "locomo" / "locomo10.json",
                "longmemeval": DATA / "longmemeval" / "longmemeval_s_dev.json.gz"}
RESULTS = ROOT / "bench" / "results"
BUDGETS = (2000, 4000, 8000, 16000)
UPDATE_CATEGORY = "knowledge-update"  # LongMemEval's questions about a value the user changed
CATEGORIES = (1, 2, 3, 4)  # 5 (adversarial) has no evidence to recall
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
LME_TYPES = ("single-session-user", "single-session-assistant", "single-session-preference", "multi-session",
             "temporal-reasoning", "knowledge-update")
TENANT = "locomo"
LME_TENANT = "longmemeval"
QUICK_TURNS = 100  # --quick on LongMemEval: each haystack cut to about this many turns
INGEST_MODES = {"turn": "CommitTurn per turn", "session": "CommitTurn per session",
                "import": "ImportSessions of each user's history"}
IMPORT_MESSAGES = 10_000  # ImportSessions takes this many messages per call (sidecar.services.limits)
TURN_GAP_MS = 1000  # a session's turns one second apart: their timestamps keep their order
DAY_MS = 86_400_000
METHODS = ("ours", "bm25", "recency")
_EVIDENCE_RE = re.compile(r"^D:?(\d+):0*(\d+)$")
_SESSION_KEY_RE = re.compile(r"^session_(\d+)$")
_WORD_RE = re.compile(r"\w+")


# ---------------------------------------------------------------------------------------- data
@dataclass(slots=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    timestamp_ms: int
    session: int
    role: Role = Role.USER


@dataclass(slots=True)
class Question:
    text: str
    category: int | str  # LoCoMo's category number, LongMemEval's question_type
    evidence: list[str]  # dia_ids of the evidence turns
    sessions: list[str] = field(default_factory=list)  # names of the evidence sessions (LongMemEval)
    asked_at_ms: int = 0  # when it was asked (LongMemEval's question_date; 0: LoCoMo gives none)
    answer: str = ""  # the data's answer: a passage or memory of an evidence turn counts only if it keeps its words


@dataclass(slots=True)
class Conversation:
    index: int
    speakers: tuple[str, str]
    sessions: dict[int, list[Turn]]
    questions: list[Question]
    issues: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    tenant: str = TENANT
    user: str = ""  # the user id; "" for conv-<index>
    half: str = ""  # LoCoMo's conversations 1-5 (tuned on) or 6-10
    session_names: dict[int, str] = field(default_factory=dict)  # session number -> the data's session id

    @property
    def user_id(self) -> str:
        return self.user or f"conv-{self.index}"

    def turns(self) -> list[Turn]:
        return [t for n in sorted(self.sessions) for t in self.sessions[n]]

    def session_of(self) -> dict[str, str]:
        """dia_id -> the name of its session (the data's session id where it has one)."""
        return {t.dia_id: self.session_names.get(t.session, str(t.session)) for t in self.turns()}


def parse_date(text: str) -> int | None:
    """"1:56 pm on 8 May, 2023" (LoCoMo) or "2023/05/30 (Tue) 23:40" (LongMemEval) -> epoch ms (UTC)."""
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%d %B, %Y", "%d %B %Y", "%Y/%m/%d (%a) %H:%M"):
        try:
            return int(dt.datetime.strptime(text.strip(), fmt).replace(tzinfo=dt.UTC).timestamp() * 1000)
        except ValueError:
            continue
    return None


def session_times(dated: Sequence[tuple[str, str]], issues: dict[str, list[str]]) -> list[int]:
    """Epoch ms of each (session name, date text); an unreadable date is recorded in issues and taken
    as a day after the previous session's."""
    out, last_ms = [], 0
    for name, text in dated:
        when = parse_date(text)
        if when is None:
            issues["undated_session"].append(name)
            when = last_ms + 86_400_000
        last_ms = when
        out.append(when)
    return out


def normalise_evidence(raw: Sequence[str], known: set[str], issues: dict[str, list[str]]) -> list[str]:
    """Evidence ids as turns of the conversation: "D8:6; D9:17" is split, "D:11:26" and "D30:05" are
    repaired; what cannot be matched to a turn is recorded in issues (never silently dropped)."""
    out: list[str] = []
    for item in raw:
        pieces = [p for p in re.split(r"[;,\s]+", str(item)) if p]
        if len(pieces) > 1:
            issues["split"].append(str(item))
        for piece in pieces:
            m = _EVIDENCE_RE.match(piece)
            fixed = f"D{m.group(1)}:{m.group(2)}" if m else piece
            if fixed != piece:
                issues["repaired"].append(piece)
            if fixed in known:
                if fixed not in out:
                    out.append(fixed)
            elif m:
                issues["dangling"].append(piece)
            else:
                issues["malformed"].append(piece)
    return out


def load(data: list[dict]) -> list[Conversation]:
    """LoCoMo: one conversation per user, speaker_a is the user."""
    convs = []
    for index, item in enumerate(data, 1):
        c = item["conversation"]
        conv = Conversation(index, (c["speaker_a"], c["speaker_b"]), {}, [],
                            half="conv_1_5" if index <= 5 else "conv_6_10")
        # Only the session_N lists that exist: one conversation has date keys without a session.
        numbers = sorted(int(m.group(1)) for k in c if (m := _SESSION_KEY_RE.match(k)) and isinstance(c[k], list))
        times = session_times([(str(n), c.get(f"session_{n}_date_time", "")) for n in numbers], conv.issues)
        for n, when in zip(numbers, times, strict=True):
            turns = []
            for i, t in enumerate(c[f"session_{n}"]):
                text = t.get("text", "")
                if t.get("blip_caption"):
                    text = f"{text} [image: {t['blip_caption']}]"
                role = Role.USER if t["speaker"] == conv.speakers[0] else Role.ASSISTANT
                turns.append(Turn(t["dia_id"], t["speaker"], text, when + i * TURN_GAP_MS, n, role))
            conv.sessions[n] = turns
        known = [t.dia_id for t in conv.turns()]
        if len(set(known)) != len(known):
            conv.issues["duplicate_dia_id"].extend(sorted({d for d in known if known.count(d) > 1}))
        for q in item["qa"]:
            if q.get("category") not in CATEGORIES:
                continue
            evidence = normalise_evidence(q.get("evidence", []), set(known), conv.issues)
            if not evidence:
                conv.issues["question_without_evidence"].append(q["question"])
                continue
            conv.questions.append(Question(q["question"], int(q["category"]), evidence, answer=str(q.get("answer", ""))))
        convs.append(conv)
    return convs


def load_longmemeval(data: list[dict]) -> list[Conversation]:
    """LongMemEval: one user per question, holding that question's haystack. Sessions are replayed in
    date order (the temporal-reasoning haystacks are shuffled in the file; a stable sort keeps sessions
    of the same minute in the file's order), numbered from 1 in that order; turns are S<n>:<i>. The
    user and assistant send no speaker names (the sidecar labels them by role)."""
    convs = []
    for index, item in enumerate(data, 1):
        if item["question_id"].endswith("_abs"):
            continue  # abstention: no evidence to recall
        conv = Conversation(index, ("user", "assistant"), {}, [], tenant=LME_TENANT, user=f"q-{item['question_id']}")
        names = item["haystack_session_ids"]
        times = session_times(list(zip(names, item["haystack_dates"], strict=True)), conv.issues)
        evidence = []
        for n, k in enumerate(sorted(range(len(names)), key=times.__getitem__), 1):
            conv.session_names[n] = names[k]
            turns = []
            for i, t in enumerate(item["haystack_sessions"][k], 1):
                role = Role.USER if t["role"] == "user" else Role.ASSISTANT
                turns.append(Turn(f"S{n}:{i}", "", t["content"], times[k] + (i - 1) * TURN_GAP_MS, n, role))
                if t.get("has_answer"):
                    evidence.append(turns[-1].dia_id)
            conv.sessions[n] = turns
        answers = list(dict.fromkeys(item["answer_session_ids"]))
        for kind, items in (("dangling", [a for a in answers if a not in names]),
                            ("duplicate_session", sorted({s for s in names if names.count(s) > 1}))):
            if items:  # only what happened is listed
                conv.issues[kind].extend(items)
        if not evidence:
            conv.issues["question_without_evidence"].append(item["question_id"])
        else:
            conv.questions.append(Question(item["question"], item["question_type"], evidence,
                                           [a for a in answers if a in names],
                                           parse_date(item.get("question_date", "")) or 0, str(item.get("answer", ""))))
        convs.append(conv)
    return convs


# The same conversations in another script, letter for letter (--script): what a user writing in it
# gets from a ranker tuned on English text, without the English stemmer, date words or word vectors.
SCRIPTS = {"cyrillic": str.maketrans("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
                                     "абцдефгхийклмнопярстувшжызАБЦДЕФГХИЙКЛМНОПЯРСТУВШЖЫЗ")}


def in_script(conv: Conversation, table: dict[int, str]) -> Conversation:
    """The conversation with its turns, speakers, questions and answers written in another script."""
    sessions = {n: [replace(t, text=t.text.translate(table), speaker=t.speaker.translate(table)) for t in turns]
                for n, turns in conv.sessions.items()}
    questions = [replace(q, text=q.text.translate(table), answer=q.answer.translate(table)) for q in conv.questions]
    return replace(conv, speakers=(conv.speakers[0].translate(table), conv.speakers[1].translate(table)),
                   sessions=sessions, questions=questions)


def read_data(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def dataset_of(data: list[dict]) -> str:
    """Which reader a file needs, from its first record."""
    first = data[0] if data else {}
    if "question_id" in first and "haystack_sessions" in first:
        return "longmemeval"
    if "conversation" in first and "qa" in first:
        return "locomo"
    raise SystemExit("neither LoCoMo (conversation, qa) nor LongMemEval (question_id, haystack_sessions) data")


LOADERS = {"locomo": load, "longmemeval": load_longmemeval}


def stratified(convs: Sequence[Conversation], n: int) -> list[Conversation]:
    """n of the one-question users (LongMemEval), spread over the question types in proportion to their
    counts (each type at least one while n allows), the same every run: inside a type, by a hash of
    the user id. Returned in the file's order."""
    groups: dict[str, list[Conversation]] = defaultdict(list)
    for c in convs:
        groups[str(c.questions[0].category)].append(c)
    n = min(n, len(convs))
    quota = {k: n * len(v) / len(convs) for k, v in groups.items()}
    take = {k: int(q) for k, q in quota.items()}
    # The seats left go to the types with none yet, then to the largest remainders.
    for k in sorted(groups, key=lambda k: (take[k] > 0, take[k] - quota[k], k))[: n - sum(take.values())]:
        take[k] += 1
    chosen = {id(c) for k, v in groups.items()
              for c in sorted(v, key=lambda c: hashlib.sha256(c.user_id.encode()).hexdigest())[: take[k]]}
    return [c for c in convs if id(c) in chosen]


def cut(conv: Conversation, turns: int) -> Conversation:
    """A smaller haystack for --quick (a full one is ~500 turns, slow to replay): the evidence sessions
    and the newest others, about `turns` turns in all."""
    wanted = {e for q in conv.questions for e in q.evidence}
    named = {s for q in conv.questions for s in q.sessions}
    keep = {n for n, ts in conv.sessions.items()
            if conv.session_names.get(n) in named or any(t.dia_id in wanted for t in ts)}
    total = sum(len(conv.sessions[n]) for n in keep)
    for n in sorted(set(conv.sessions) - keep, reverse=True):
        if total >= turns:
            break
        keep.add(n)
        total += len(conv.sessions[n])
    return replace(conv, sessions={n: conv.sessions[n] for n in sorted(keep)})


# ---------------------------------------------------------------------------------------- replay
def user_of(conv: Conversation) -> pb.Scope:
    return pb.Scope(tenant_id=conv.tenant, user_id=conv.user_id)


def new_message(t: Turn) -> pb.NewMessage:
    return pb.NewMessage(role=pb.ROLE_USER if t.role is Role.USER else pb.ROLE_ASSISTANT, text=t.text,
                         speaker=t.speaker, client_timestamp_ms=t.timestamp_ms)


def import_history(stub, conv: Conversation) -> dict[str, str]:
    """The conversation's sessions through ImportSessions (as many per call as its limits allow);
    returns message_id -> dia_id."""
    by_message: dict[str, str] = {}
    calls: list[list[int]] = [[]]
    held = 0
    for n, turns in conv.sessions.items():
        if calls[-1] and held + len(turns) > IMPORT_MESSAGES:
            calls.append([])
            held = 0
        calls[-1].append(n)
        held += len(turns)
    for names in calls:
        answer = stub.ImportSessions(pb.ImportSessionsRequest(scope=user_of(conv), sessions=[
            pb.ImportedSession(session_id=f"s{n}", title=f"session {n}", closed=True,
                               messages=[new_message(t) for t in conv.sessions[n]]) for n in names]))
        for n, imported in zip(names, answer.sessions, strict=True):
            by_message.update(zip(imported.message_ids, (t.dia_id for t in conv.sessions[n]), strict=True))
    return by_message


def ingest(stub, conv: Conversation, commit: str = "turn") -> dict[str, str]:
    """Replay the conversation; returns message_id -> dia_id."""
    if commit == "import":
        return import_history(stub, conv)
    scope = user_of(conv)
    by_message: dict[str, str] = {}
    for n, turns in conv.sessions.items():
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id=f"s{n}", title=f"session {n}")
                                 ).session_id
        msgs = [new_message(t) for t in turns]
        if commit == "turn":
            for t, m in zip(turns, msgs, strict=True):
                stored = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[m]))
                ids = [s.message_id for s in stored.messages]
                by_message[ids[0]] = t.dia_id
                stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid, message_ids=ids))
        else:
            for lo in range(0, len(msgs), 1000):
                stored = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid,
                                                                      messages=msgs[lo:lo + 1000]))
                for t, s in zip(turns[lo:lo + 1000], stored.messages, strict=True):
                    by_message[s.message_id] = t.dia_id
            stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid))
    return by_message


def server_cpu_s(pid: int) -> float:
    """CPU seconds (user and system, every thread) the process has used; 0 without a pid."""
    from tests.adversity.harness import proc_stats  # the soak's /proc reader

    return proc_stats(pid)["cpu_s"] if pid else 0.0


def wait_jobs(stub, conv: Conversation) -> None:
    while not stub.WaitForJobs(pb.WaitForJobsRequest(scope=user_of(conv), timeout_ms=60_000)).all_finished:
        pass


def budget_for(soft: int, query: str) -> pb.Budget:
    """A budget whose soft zone is exactly `soft` tokens, all of it for memories."""
    hard = count_tokens(query)
    return pb.Budget(max_input=soft + hard + SOFT_HEADER_RESERVE, reserved_for_output=0, system_and_tools=0,
                     session_state=0, recent_messages=0, memories=soft, rag_or_graph=0, tool_observations=0,
                     flow_unused=True)


def turn_position(dia_id: str) -> tuple[int, int]:
    """(session, turn) of a dia_id "S<n>:<i>" or "D<n>:<i>", for ordering turns in time."""
    session, _, turn = dia_id.partition(":")
    return int(session[1:]), int(turn)


def passages_of(resp, by_message: dict[str, str], whole_lines: dict[str, str]) -> set[str]:
    """Turns (dia_ids) packed as a passage (their item's text holds less than the whole line) and not
    also whole."""
    cut, whole = set(), set()
    for it in (it for s in resp.sections for it in s.items if it.source.startswith("message:")):
        d = by_message.get(it.source[len("message:"):])
        if d in whole_lines:
            (whole if whole_lines[d] in it.text else cut).add(d)
    return cut - whole


def word_form(word: str) -> str:
    """A lowercased word in its singular ("tools" -> tool, "classes" -> class, "stories" -> story; "bus",
    "analysis" kept), so an answer that says "tool" is kept by a passage that says "tools"."""
    if len(word) <= 3 or not word.endswith("s") or word.endswith(("ss", "us", "is")):
        return word
    if word.endswith(("sses", "xes", "ches", "shes")):
        return word[:-2]
    return word[:-3] + "y" if word.endswith("ies") and len(word) > 4 else word[:-1]


def answer_words(text: str) -> frozenset[str]:
    """The words of an answer (or of a turn) that can say it: lowercased, stopwords left out, each in
    its word_form."""
    return frozenset(word_form(w) for w in _WORD_RE.findall(text.lower()) if w not in STOPWORDS)


def keeps_answer(shown: str, whole: str, answer: frozenset[str]) -> bool:
    """Whether a turn shown as `shown` (a passage of it, or all of it) keeps every word of the answer
    that the whole turn says: a passage that cut the answer out does not recall the turn."""
    return (answer & answer_words(whole)) <= answer_words(shown)


def answer_kept(q: Question, text_of: dict[str, str]) -> Callable[[str, str], bool]:
    """evidence_scores' `kept` for this question: an evidence turn's item keeps the answer's words."""
    answer, evidence = answer_words(q.answer), set(q.evidence)
    return lambda d, shown: d not in evidence or keeps_answer(shown, text_of[d], answer)


def evidence_found(resp, q: Question, by_message: dict[str, str], text_of: dict[str, str]) -> float:
    """The share of the question's evidence turns a BuildContext response's context holds (evidence_scores,
    a passage or memory only if it keeps the answer's words)."""
    present = evidence_scores([it for s in resp.sections for it in s.items], by_message, kept=answer_kept(q, text_of))
    return sum(e in present for e in q.evidence) / len(q.evidence)


def evidence_scores(items: Iterable, by_message: dict[str, str],
                    memory_share: dict[str, float] | None = None,
                    kept: Callable[[str, str], bool] | None = None) -> dict[str, float]:
    """Evidence turns in the context: turn (dia_id) -> the best score of an item holding it (the turn,
    or a memory drawn from it). memory_share, when given, accumulates what extracted memories
    (memory:<id>) took: their tokens, their count, and (under "_via") the turns they hold. `kept(dia_id,
    item text)`, when given, says whether an item keeps the answer of a turn it holds (keeps_answer): a
    passage of the turn, or a memory of one of its sentences, may not."""
    best: dict[str, float] = {}
    via_memory: set[str] = set()
    for item in items:
        ids = set(item.source_message_ids)
        if item.source.startswith("message:"):
            ids.add(item.source[len("message:"):])
        turns = {d for m in ids if (d := by_message.get(m)) and (kept is None or kept(d, item.text))}
        if item.source.startswith("memory:") and memory_share is not None:
            memory_share["tokens"] += item.tokens
            memory_share["items"] += 1
            via_memory |= turns
        for d in turns:
            best[d] = max(best.get(d, float("-inf")), float(item.score))
    if memory_share is not None:
        memory_share["_via"] = via_memory  # type: ignore[assignment]
    return best


# ---------------------------------------------------------------------------------------- baselines
class Packer:
    """A user's turns packed in a given order under a budget, as rendered and charged by the sidecar
    (with a day's date header the first time a turn of that day is taken, when the sidecar packs dates
    that way), skipping a turn that does not fit: how the baselines fill the same budgets."""

    def __init__(self, conv: Conversation) -> None:
        self.turns = conv.turns()
        self.headers = DEFAULT_RANKING.date_headers
        self.lines = [render_turn(t.speaker, t.role, t.text, t.timestamp_ms, dated=not self.headers)
                      for t in self.turns]
        self.costs = count_lines(self.lines)
        self.days = [day_number(t.timestamp_ms) for t in self.turns]
        self.header_costs = {d: count_line(date_label(t.timestamp_ms))
                             for d, t in zip(self.days, self.turns, strict=True)}

    def pack(self, order: Iterable[int], budget: int) -> set[str]:
        used, out, days = 0, set(), set()
        for i in order:
            day = self.days[i]
            cost = self.costs[i] + (self.header_costs[day] if self.headers and day not in days else 0)
            if used + cost <= budget:
                used += cost
                out.add(self.turns[i].dia_id)
                days.add(day)
        return out

    def recency(self, budget: int) -> set[str]:
        return self.pack(range(len(self.turns) - 1, -1, -1), budget)


def recency_ids(conv: Conversation, budget: int) -> set[str]:
    """Newest turns first (see Packer)."""
    return Packer(conv).recency(budget)


class TurnBM25:
    """The baseline a user would build without the sidecar: BM25 (Lucene's idf) over the turns' lines
    as packed ("Ann: text"), lower-cased words, no stemming or stop words."""

    def __init__(self, lines: Sequence[str], k1: float = 1.2, b: float = 0.75) -> None:
        self.k1 = k1
        self.tf = [Counter(_WORD_RE.findall(line.lower())) for line in lines]
        lengths = [sum(c.values()) for c in self.tf]
        avg = sum(lengths) / max(len(lengths), 1) or 1.0
        self.norm = [k1 * (1 - b + b * n / avg) for n in lengths]
        df = Counter(w for c in self.tf for w in c)
        self.idf = {w: math.log(1 + (len(lines) - d + 0.5) / (d + 0.5)) for w, d in df.items()}

    def scores(self, query: str) -> list[float]:
        words = [w for w in _WORD_RE.findall(query.lower()) if w in self.idf]
        return [sum(self.idf[w] * tf[w] * (self.k1 + 1) / (tf[w] + norm) for w in words if w in tf)
                for tf, norm in zip(self.tf, self.norm, strict=True)]

    def ranked(self, query: str) -> list[int]:
        """Turn indexes best first; ties (the turns sharing no word with the query among them) newest
        first, so the budget is filled as recency would."""
        s = self.scores(query)
        return sorted(range(len(s)), key=lambda i: (-s[i], -i))


# ---------------------------------------------------------------------------------------- metric
@dataclass(slots=True)
class Tally:
    """Per budget: sum of per-question recall, count of questions with all evidence, questions."""

    recall: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    complete: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    asked: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    @property
    def n(self) -> int:
        return max(self.asked.values(), default=0)

    def add(self, budget: int, evidence: Sequence[str], present: set[str]) -> None:
        hit = sum(1 for e in evidence if e in present)
        self.recall[budget] += hit / len(evidence)
        self.complete[budget] += hit == len(evidence)
        self.asked[budget] += 1

    def figures(self, budgets: Sequence[int]) -> tuple[dict[str, float], dict[str, float]]:
        d = max(self.n, 1)
        return ({str(b): round(self.recall[b] / d, 4) for b in budgets},
                {str(b): round(self.complete[b] / d, 4) for b in budgets})


def figure_key(method: str, kind: str = "recall", level: str = "turn") -> str:
    """Where a figure is kept: kind "recall", "all_evidence" or "by_category"; ours under the names
    LoCoMo's results have always had (recall, all_evidence, by_category), a baseline's beside them
    (bm25, bm25_all_evidence, by_category_bm25); the session level's prefixed "session_"."""
    prefix = "" if level == "turn" else "session_"
    if method == "ours":
        return prefix + kind
    return prefix + {"recall": method, "all_evidence": f"{method}_all_evidence", "by_category": f"by_category_{method}"}[kind]


class Board:
    """Tallies per (method, level, group): level "turn" (evidence turns) or "session" (evidence
    sessions with a turn in the context); group "" (every question), "cat:<category>" or
    "half:<half>" (LoCoMo's)."""

    def __init__(self) -> None:
        self.tallies: dict[tuple[str, str, str], Tally] = defaultdict(Tally)
        # Knowledge updates about the current value, per budget: questions whose newest evidence turn
        # scored above every older one in the context, and questions with the newest and an older
        # evidence turn both in it.
        self.newer_first: dict[int, int] = defaultdict(int)
        self.update_pairs: dict[int, int] = defaultdict(int)
        # ... and of those asking for an earlier value or the change: how many, and with both in it.
        self.change_questions: dict[int, int] = defaultdict(int)
        self.change_both: dict[int, int] = defaultdict(int)
        # Ours at the turn level, per budget: (conversation, share of the question's evidence) per question.
        self.ours: dict[int, list[tuple[int, float]]] = defaultdict(list)

    def add_update_order(self, q: Question, budget: int, scores: dict[str, float]) -> None:
        """For a knowledge-update question (a value the user stated again later, changed) about the
        current value, whether the context scores the newest statement above the older ones (scores:
        evidence turn -> the best score of an item holding it); for one asking for an earlier value or
        the change (asks_before), whether the newest and an older statement are both in it."""
        if q.category != UPDATE_CATEGORY:
            return
        told = sorted((turn_position(e), e) for e in q.evidence)
        if asks_before(q.text):
            if len(told) >= 2:
                self.change_questions[budget] += 1
                self.change_both[budget] += told[-1][1] in scores and any(e in scores for _, e in told[:-1])
            return
        present = [(p, e) for p, e in told if e in scores]
        if len(present) < 2:
            return
        newest = present[-1][1]
        self.update_pairs[budget] += 1
        self.newer_first[budget] += all(scores[newest] > scores[e] for _, e in present[:-1])

    def add(self, method: str, conv: Conversation, q: Question, budget: int, present: set[str],
            session_of: dict[str, str]) -> None:
        groups = ("", f"cat:{q.category}", *((f"half:{conv.half}",) if conv.half else ()))
        sessions = {session_of[d] for d in present if d in session_of} if q.sessions else set()
        if method == "ours":
            self.ours[budget].append((conv.index, sum(e in present for e in q.evidence) / len(q.evidence)))
        for g in groups:
            self.tallies[method, "turn", g].add(budget, q.evidence, present)
            if q.sessions:
                self.tallies[method, "session", g].add(budget, q.sessions, sessions)

    def groups(self, prefix: str) -> list[str]:
        return sorted({g[len(prefix):] for _, _, g in self.tallies if g.startswith(prefix)})

    def summary(self, budgets: Sequence[int]) -> dict:
        """The figures (fractions 0-1), under figure_key's names; the session level only when the data
        names evidence sessions."""
        mid = "4000" if 4000 in budgets else str(budgets[0])
        cats = self.groups("cat:")
        ours = self.tallies["ours", "turn", ""]
        out: dict = {"questions": ours.n,
                     "by_category_n": {c: self.tallies["ours", "turn", f"cat:{c}"].n for c in cats}}
        for level in ("turn", "session"):
            for method in METHODS:
                if (method, level, "") in self.tallies:
                    out[figure_key(method, "recall", level)], out[figure_key(method, "all_evidence", level)] = \
                        self.tallies[method, level, ""].figures(budgets)
                    out[figure_key(method, "by_category", level)] = {
                        c: self.tallies[method, level, f"cat:{c}"].figures(budgets)[0] for c in cats}
        if self.ours:
            # How far the turn-level recall would move over other conversations like these.
            out["recall_ci95"] = {str(b): interval95([v for _, v in self.ours[b]], [c for c, _ in self.ours[b]])
                                  for b in budgets if self.ours[b]}
        if self.update_pairs:
            out["update_newer_first"] = {str(b): round(self.newer_first[b] / max(self.update_pairs[b], 1), 4)
                                         for b in budgets}
            out["update_pairs"] = {str(b): self.update_pairs[b] for b in budgets}
        if self.change_questions:
            out["update_change_both"] = {str(b): round(self.change_both[b] / max(self.change_questions[b], 1), 4)
                                         for b in budgets}
            out["update_change_questions"] = {str(b): self.change_questions[b] for b in budgets}
        halves = {h: self.tallies["ours", "turn", f"half:{h}"].figures(budgets)[0] for h in self.groups("half:")}
        if halves:
            out["halves"] = halves
            out.update({f"recall_{h}": d.get(mid) for h, d in halves.items()})
        return out


def evaluate(stub, conversations: Sequence[Conversation], budgets: Sequence[int] = BUDGETS, *,
             commit: str = "turn", log=print, maps: dict[int, dict[str, str]] | None = None,
             server_pid: int = 0) -> dict:
    """Replay, ask, measure. Returns the figures (fractions 0-1, see Board.summary); `maps` receives
    each conversation's message_id -> dia_id; given the server's pid, the CPU it spent ingesting (a
    figure a busy hour changes less than turns per second)."""
    board = Board()
    latencies: dict[int, list[float]] = {b: [] for b in budgets}
    # A question's first call (its first budget) embeds the query and ranks the past turns; the same
    # question at the next budgets finds both kept (the model's recent texts, the episodic ranking).
    first_calls: list[float] = []
    repeat_calls: list[float] = []
    # Per budget: memories' tokens and items, evidence turns found only through them, and evidence turns
    # whose only memory left the answer out (keeps_answer; not counted as recalled).
    mem = {b: {"tokens": 0.0, "items": 0.0, "evidence_only_via_memory": 0.0, "evidence_memory_without_answer": 0.0}
           for b in budgets}
    # Evidence turns packed as a passage, evidence turns packed, passages of evidence turns without the answer.
    passages = {b: [0, 0, 0] for b in budgets}
    stages: dict[str, list[int]] = defaultdict(list)  # server-side microseconds per stage (debug calls, untimed)
    ingest_s, ingested, ingest_cpu_s = 0.0, 0, 0.0
    issues: dict[str, list[str]] = defaultdict(list)
    in_turn: dict[int, list[float]] = {b: [] for b in budgets[:2]}
    for conv in conversations:
        t0, cpu0 = time.perf_counter(), server_cpu_s(server_pid)
        by_message = ingest(stub, conv, commit)
        wait_jobs(stub, conv)
        spent = time.perf_counter() - t0
        ingest_cpu_s += server_cpu_s(server_pid) - cpu0
        if maps is not None:
            maps[conv.index] = by_message
        ingest_s += spent
        ingested += len(by_message)
        for kind, items in conv.issues.items():
            issues[kind].extend(f"{conv.user_id}:{x}" for x in items)
        scope = user_of(conv)
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="eval")).session_id
        packer = Packer(conv)
        whole_lines = dict(zip((t.dia_id for t in packer.turns), packer.lines, strict=True))
        bm25 = TurnBM25(packer.lines)
        session_of = conv.session_of()
        recent = {b: packer.recency(b) for b in budgets}
        text_of = {t.dia_id: t.text for t in packer.turns}
        for q in conv.questions:
            ranked = bm25.ranked(q.text)
            kept = answer_kept(q, text_of)
            for b in budgets:
                req = pb.BuildContextRequest(scope=scope, session_id=sid, query=q.text, budget=budget_for(b, q.text),
                                             asked_at_ms=q.asked_at_ms)
                t = time.perf_counter()
                resp = stub.BuildContext(req)
                latencies[b].append(time.perf_counter() - t)
                (repeat_calls if b != budgets[0] else first_calls).append(latencies[b][-1])
                items = [it for s in resp.sections for it in s.items]
                scores = evidence_scores(items, by_message, mem[b], kept)
                present = set(scores)
                # Evidence held only by a passage or memory that left the answer out.
                lost = [e for e in q.evidence if e not in present and e in evidence_scores(items, by_message)]
                via = mem[b].pop("_via")
                direct = {by_message.get(it.source[len("message:"):], "") for it in items
                          if it.source.startswith("message:")}
                mem[b]["evidence_only_via_memory"] += sum(1 for e in q.evidence if e in via and e not in direct)
                cut = passages_of(resp, by_message, whole_lines)
                passages[b][0] += sum(1 for e in q.evidence if e in cut and e in present)
                passages[b][1] += sum(1 for e in q.evidence if e in present)
                passages[b][2] += sum(1 for e in lost if e in cut)
                mem[b]["evidence_memory_without_answer"] += sum(1 for e in lost if e not in cut)
                for method, ids in (("ours", present), ("recency", recent[b]), ("bm25", packer.pack(ranked, b))):
                    board.add(method, conv, q, b, ids, session_of)
                board.add_update_order(q, b, scores)
        if len(conv.questions) > 1:
            ask_in_turn(stub, scope, conv, budgets[:2], by_message, text_of, in_turn)
        mid_budget = 4000 if 4000 in budgets else budgets[0]
        for q in conv.questions[:20]:
            req = pb.BuildContextRequest(scope=scope, session_id=sid, query=q.text, debug=True, asked_at_ms=q.asked_at_ms,
                                         budget=budget_for(mid_budget, q.text))
            for timing in stub.BuildContext(req).timings:
                stages[timing.stage].append(timing.micros)
        so_far = board.tallies["ours", "turn", ""].figures(budgets)[0]
        log(f"{conv.user_id}: {len(by_message)} turns ingested in {spent:.1f}s ({len(by_message) / spent:.0f}/s); "
            f"{len(conv.questions)} questions; cumulative recall {so_far}")
    every = [x for b in budgets for x in latencies[b]]
    lat = percentiles(every) if every else {"p50_ms": 0.0, "p99_ms": 0.0}
    questions = max(board.tallies["ours", "turn", ""].n, 1)
    return {
        **board.summary(budgets),
        # Per question: mean tokens and items of extracted memories, evidence turns found only through them
        # and those whose memory left the answer out.
        "memories_per_question": {str(b): {k: round(v / questions, 3) for k, v in mem[b].items()} for b in budgets},
        # Evidence turns in the context as a passage of a long turn (sidecar/memory/episodic/passages.py),
        # and their share of the evidence turns in it.
        # Passages that cut the answer out are not counted as recalled (keeps_answer).
        "evidence_as_passage": {str(b): {"turns": cut, "share": round(cut / max(found, 1), 4), "answer_cut": lost}
                                for b, (cut, found, lost) in passages.items()},
        "ingest_s": round(ingest_s, 2),
        "ingested_turns": ingested,
        "ingest_turns_per_s": round(ingested / ingest_s, 1) if ingest_s else 0.0,
        "ingest_server_cpu_ms_per_turn": round(ingest_cpu_s * 1000 / ingested, 3) if server_pid and ingested else None,
        "build_p50_ms": lat["p50_ms"], "build_p99_ms": lat["p99_ms"],
        "build_ms_by_budget": {str(b): percentiles(latencies[b]) for b in budgets if latencies[b]},
        "build_ms_new_query": percentiles(first_calls) if first_calls else {},
        "build_ms_repeated_query": percentiles(repeat_calls) if repeat_calls else {},
        "stage_us_p50": {k: sorted(v)[len(v) // 2] for k, v in stages.items()},
        "evidence_issues": {k: len(v) for k, v in issues.items()},
        "evidence_issue_items": dict(issues),
        # A user's questions asked one after another in one session at one budget, as an agent's calls
        # come (ask_in_turn); only where a user asks more than one.
        **({"in_one_session": {str(b): round(sum(v) / len(v), 4) for b, v in in_turn.items()},
            "in_one_session_questions": len(in_turn[budgets[0]])} if in_turn[budgets[0]] else {}),
        "commit": commit,
    }


def ask_in_turn(stub, scope: pb.Scope, conv: Conversation, budgets: Sequence[int], by_message: dict[str, str],
                text_of: dict[str, str], out: dict[int, list[float]]) -> None:
    """Each question of the user asked in turn in one new session per budget, the budget's max_input the
    same for every call (room for the longest question), as an agent's calls come: the cache-aware layout
    keeps the session's recall from one call to the next, and every later question must still find its
    own evidence. Appends each question's share of evidence found to out[budget]."""
    room = max(count_tokens(q.text) for q in conv.questions)
    for b in budgets:
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id=f"in-turn-{b}")).session_id
        budget = budget_for(b, "")
        budget.max_input += room
        for q in conv.questions:
            resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=q.text, budget=budget,
                                                            asked_at_ms=q.asked_at_ms))
            out[b].append(evidence_found(resp, q, by_message, text_of))


def served_new_questions(db: str, convs: Sequence[Conversation], serve_args: list[str], n: int) -> dict:
    """BuildContext p50 / p99 at 4k over the replayed database, the questions of all users in turn
    (each call a new question for its user), served as `serve` runs by default and on a core of its
    own (`--cpus`, as the README advises: the calling service, this bench, runs on the other cores)
    at the same time, in alternating blocks."""
    per_user = [[pb.BuildContextRequest(scope=user_of(c), session_id="eval", query=q.text,
                                        budget=budget_for(4000, q.text)) for q in c.questions] for c in convs]
    requests = [req for batch in itertools.zip_longest(*per_user) for req in batch if req is not None]
    core = one_core()
    others = os.sched_getaffinity(0) - {int(core)}
    served = served_build_latency(db, requests, n, {"default": serve_args, "one_core": [*serve_args, "--cpus", core]},
                                  client_cpus=others or None)
    return {name: stats for name, (_, _, stats) in served.items()}


# ---------------------------------------------------------------------------------------- offline
def keep_replay(cache: Path, db: Path, maps: dict[int, dict[str, str]], profile: str) -> None:
    """Keep a served run's database and message maps where offline_app looks for them."""
    cache.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(db, cache / f"recall-{profile}.duckdb")
    wal = db.with_name(db.name + ".wal")  # what a server stopped before its checkpoint still holds
    if wal.exists():
        shutil.copyfile(wal, cache / f"recall-{profile}.duckdb.wal")
    (cache / f"recall-{profile}.maps.json").write_text(json.dumps(maps))


def offline_app(cache: Path, convs: Sequence[Conversation], profile: str = "default", log=print):
    """(app, message_id -> dia_id per conversation): an in-process sidecar whose database was replayed
    once through gRPC (CommitTurn per turn, as evaluate() does) and kept under `cache`, so ranking
    knobs can be compared in seconds by calling the builder directly (offline_evaluate)."""
    import grpc

    from sidecar.api import context_service_pb2_grpc as pb_grpc
    from sidecar.server import build_server

    cache.mkdir(parents=True, exist_ok=True)
    db, maps_path = cache / f"recall-{profile}.duckdb", cache / f"recall-{profile}.maps.json"
    fresh = not maps_path.exists()
    if fresh:
        for p in cache.glob(f"recall-{profile}.*"):
            p.unlink() if p.is_file() else None
    app = make_app(str(db), profile)
    if not fresh:
        maps = {int(k): v for k, v in json.loads(maps_path.read_text()).items()}
        return app, maps
    server, port = build_server(app, listen="127.0.0.1:0", uds=None, auth_token=None)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.ContextServiceStub(channel)
    maps = {}
    try:
        for conv in convs:
            t0 = time.perf_counter()
            maps[conv.index] = ingest(stub, conv)
            wait_jobs(stub, conv)
            stub.CreateSession(pb.CreateSessionRequest(scope=user_of(conv), session_id="eval"))
            log(f"{conv.user_id} ingested in {time.perf_counter() - t0:.1f}s")
    finally:
        channel.close()
        server.stop(grace=1).wait()
    maps_path.write_text(json.dumps(maps))
    return app, maps


def parse_ranking(spec: str, base=DEFAULT_RANKING):
    """"neighbours=3,stem=false" -> base (DEFAULT_RANKING, or MODEL_RANKING for the model profile)
    with those knobs replaced."""
    import dataclasses

    kinds = {f.name: type(getattr(base, f.name)) for f in dataclasses.fields(base)}
    changes = {}
    for part in filter(None, spec.split(",")):
        name, _, value = part.partition("=")
        kind = kinds[name.strip()]
        changes[name.strip()] = value.strip().lower() in ("1", "true", "yes") if kind is bool else kind(value)
    return dataclasses.replace(base, **changes)


def offline_evaluate(app, convs: Sequence[Conversation], maps: dict[int, dict[str, str]],
                     budgets: Sequence[int] = BUDGETS, ranking=None, live: bool = False) -> dict:
    """The metric of evaluate() (ours only) with BuildContext called in process (no gRPC), for tuning;
    `ranking` (a Ranking) replaces the episodic source's knobs (EpisodicSource.set_ranking). `live`:
    each question asked with the builder's clock at its time of asking, as a live sidecar would see
    it (the turns days old, not years); a LoCoMo question, which has none, a day after the
    conversation's last turn."""
    from sidecar.assembly.budget import Budget
    from sidecar.assembly.builder import BuildRequest
    from sidecar.domain import Scope

    source = app.episodic
    if ranking is not None and ranking != source.ranking:
        source.set_ranking(ranking)
    board = Board()
    spent: list[float] = []
    clock = app.builder.clock
    try:
        for conv in convs:
            scope = Scope(conv.tenant, conv.user_id)
            by_message = maps[conv.index]
            session_of = conv.session_of()
            source.search(scope, "warm up", "eval", 1)  # the index build is not a query's cost
            last_turn = max(t.timestamp_ms for t in conv.turns())
            text_of = {t.dia_id: t.text for t in conv.turns()}
            for q in conv.questions:
                kept = answer_kept(q, text_of)
                asked_at = q.asked_at_ms or (last_turn + DAY_MS if live else 0)
                if live:
                    app.builder.clock = lambda asked_at=asked_at: asked_at
                hard = count_tokens(q.text)
                for b in budgets:
                    budget = Budget(max_input=b + hard + SOFT_HEADER_RESERVE, reserved_for_output=0, system_and_tools=0,
                                    session_state=0, recent_messages=0, memories=b, rag_or_graph=0,
                                    tool_observations=0, flow_unused=True)
                    t = time.perf_counter()
                    result = app.builder.build(scope, BuildRequest(session_id="eval", query=q.text, budget=budget,
                                                                   asked_at_ms=asked_at))
                    spent.append(time.perf_counter() - t)
                    items = [it for section in result.packed for it in section.build_items()]
                    scores = evidence_scores(items, by_message, kept=kept)
                    present = set(scores)
                    board.add("ours", conv, q, b, present, session_of)
                    board.add_update_order(q, b, scores)
    finally:
        app.builder.clock = clock
    # Each question's share of its evidence, per budget, and its conversation (Board.ours, in asking order).
    return {**board.summary(budgets), "build_ms": percentiles(spent) if spent else {},
            "per_question": {b: [v for _, v in board.ours[b]] for b in budgets},
            "conversation_of": [c for c, _ in board.ours[budgets[0]]] if budgets else []}


def best_of(runs: Sequence[dict]) -> dict[str, float]:
    """Per budget, the recall of picking for each question whichever run recalled most of its evidence:
    knowing the answers, so an upper bound on choosing among these rankings per question (how much a
    family of knobs could still give), not a method."""
    budgets = runs[0]["per_question"]
    return {str(b): round(sum(map(max, zip(*(r["per_question"][b] for r in runs), strict=True)))
                          / max(len(runs[0]["per_question"][b]), 1), 4) for b in budgets}


def resampled_means(values: Sequence[float], conversation_of: Sequence[int], resamples: int = 2000,
                    seed: int = 0):
    """The mean of `values` (one per question) over the questions of conversations drawn with
    replacement, `resamples` times (seeded): how the mean would spread over other conversations."""
    import numpy as np

    _, conv = np.unique(np.asarray(conversation_of), return_inverse=True)
    sums, sizes = np.bincount(conv, np.asarray(values, np.float64)), np.bincount(conv)
    picks = np.random.default_rng(seed).integers(0, len(sums), (resamples, len(sums)))
    return sums[picks].sum(axis=1) / sizes[picks].sum(axis=1)


def interval95(values: Sequence[float], conversation_of: Sequence[int]) -> list[float]:
    """The 95 % interval of the mean of `values` over conversations (resampled_means), as fractions."""
    import numpy as np

    lo, hi = np.percentile(resampled_means(values, conversation_of), (2.5, 97.5))
    return [round(float(lo), 4), round(float(hi), 4)]


def against(base: dict, run: dict) -> dict[str, dict]:
    """Per budget, how `run` differs from `base` question by question (both offline_evaluate's, over the
    same questions): questions better and worse, the mean difference in points and its 95 % interval,
    resampling the conversations with replacement (`conversation_of`: a question's conversation; each
    question its own without it), as other conversations would differ, seeded so a rerun prints the
    same. An interval holding 0 is a difference these conversations cannot tell from chance."""
    import numpy as np

    out: dict[str, dict] = {}
    for b, ours in base["per_question"].items():
        diff = np.asarray(run["per_question"][b], np.float64) - np.asarray(ours, np.float64)
        if not len(diff):
            continue
        ci = interval95(diff, base.get("conversation_of", range(len(diff))))
        out[str(b)] = {"better": int((diff > 0).sum()), "worse": int((diff < 0).sum()),
                       "points": round(100 * float(diff.mean()), 2), "ci95": [round(100 * x, 2) for x in ci]}
    return out


# ---------------------------------------------------------------------------------------- server
def model_cost(convs: Sequence[Conversation], name: str, n: int = 200) -> dict:
    """What a local model costs, timed here with the server's settings (minilm: torch on one thread unless
    SIDECAR_MODEL_THREADS says otherwise): load, one query (each new, no cache), and turns per second
    embedded one at a time (as AppendMessages indexes them) and in batches (an index rebuilt from rows)."""
    from sidecar.index.embedders import make_embedder

    t = time.perf_counter()
    embedder = make_embedder(name)
    load_s = time.perf_counter() - t
    embedder.CACHED_QUERIES = 0
    questions = [q.text for c in convs for q in c.questions][:n]
    turns = [t.text for c in convs for s in c.sessions.values() for t in s][:n]
    for q in questions[:10]:
        embedder.embed([q + " ?"])  # warm-up
    spent = []
    for q in questions:
        t = time.perf_counter()
        embedder.embed([q])
        spent.append(time.perf_counter() - t)
    t = time.perf_counter()
    for text in turns:
        embedder.embed([text])
    single = len(turns) / (time.perf_counter() - t)
    t = time.perf_counter()
    embedder.embed(turns)
    batched = len(turns) / (time.perf_counter() - t)
    threads = {}
    if name == "minilm":
        import torch  # type: ignore[import-not-found]

        threads = {"torch_threads": torch.get_num_threads()}
    return {"embedder": embedder.name, **threads, "load_s": round(load_s, 2),
            "query_embedding_ms": percentiles(spent), "turns_per_s_one_by_one": round(single, 1),
            "turns_per_s_batched": round(batched, 1)}


# Each profile's `serve --embedder`: a model profile ranks past turns with its model too (MODEL_RANKING).
PROFILES = {"default": "hash", "model": "minilm", "multilingual": "use"}


def make_app(db_path: str, profile: str = "default"):
    """The sidecar as `serve` runs it with the profile's embedder."""
    from sidecar.app import Settings, Sidecar

    return Sidecar(db_path, Settings(embedder=PROFILES[profile]))


def results_stem(dataset: str, profile: str) -> str:
    """bench/results/<stem>.{json,md,png}: LoCoMo's as they have always been named."""
    return f"recall-{profile}" if dataset == "locomo" else f"recall-{dataset}-{profile}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def _header(cells: Sequence[str], budgets: Sequence[int]) -> list[str]:
    return ["| " + " | ".join([*cells, *(f"{b // 1000}k" for b in budgets)]) + " |",
            "|" + "---|" * (len(cells) + len(budgets))]


def _row(cells: Sequence[str], d: dict, budgets: Sequence[int]) -> str:
    return "| " + " | ".join([*cells, *(_pct(d.get(str(b))) for b in budgets)]) + " |"


def _interval_row(cells: Sequence[str], figures: dict, budgets: Sequence[int]) -> str:
    ci = figures["recall_ci95"]
    return "| " + " | ".join([*cells, *(f"{_pct(ci[str(b)][0])}-{_pct(ci[str(b)][1])}" if str(b) in ci else "-"
                                        for b in budgets)]) + " |"


def locomo_table(figures: dict, profile: str, budgets: Sequence[int]) -> list[str]:
    lines = [f"# LoCoMo evidence recall, profile `{profile}` ({figures['questions']} questions, categories 1-4)",
             "", *_header([""], budgets)]
    for method, name in (("ours", "ours"), ("bm25", "BM25 over turns"), ("recency", "recency")):
        for kind, what in (("recall", "evidence recall"), ("all_evidence", "all evidence")):
            if (key := figure_key(method, kind)) in figures:
                lines.append(_row([f"{name}: {what}"], figures[key], budgets))
        if method == "ours" and "recall_ci95" in figures:
            lines.append(_interval_row(["ours: evidence recall, 95 % interval over conversations"], figures, budgets))
    for c, d in figures["by_category"].items():
        lines.append(_row([f"cat {c} {CATEGORY_NAMES[int(c)]} (n={figures['by_category_n'][c]})"], d, budgets))
    for k, d in figures.get("halves", {}).items():
        lines.append(_row([k.replace("_", " ")], d, budgets))
    return lines


def longmemeval_table(figures: dict, profile: str, budgets: Sequence[int]) -> list[str]:
    types = [t for t in LME_TYPES if t in figures["by_category_n"]]
    lines = [f"# LongMemEval evidence recall (development half), profile `{profile}`", "",
             f"{figures['questions']} questions (abstention questions left out), each asked by its own user whose "
             "haystack was replayed session by session in date order (the session dates as the messages' client "
             "timestamps), in a new session of that user, at the question's date (BuildContext's `asked_at_ms`). Baselines packed under the same budgets: a plain BM25 over the "
             "user's turns (k1 1.2, b 0.75) best first, and recency (newest turns first)."]
    methods = (("ours", f"ours ({profile})"), ("bm25", "BM25 over turns"), ("recency", "recency"))
    for level, title in (("turn", "Turn level: share of a question's evidence turns (`has_answer`) in the context, "
                                  "as the turn, a passage of it or a memory drawn from it (those two only if they keep the answer's words "
                                  "the turn says)."),
                         ("session", "Session level: share of a question's evidence sessions (`answer_session_ids`) "
                                     "with at least one of their turns in the context.")):
        lines += ["", title, "", *_header(["question type (n)", "method"], budgets)]
        for t in ["", *types]:
            n = figures["by_category_n"][t] if t else figures["questions"]
            for i, (method, name) in enumerate(methods):
                d = (figures[figure_key(method, "by_category", level)][t] if t
                     else figures[figure_key(method, "recall", level)])
                lines.append(_row([f"{t or 'all'} ({n})" if i == 0 else "", name], d, budgets))
                if not t and method == "ours" and level == "turn" and "recall_ci95" in figures:
                    lines.append(_interval_row(["", "ours: 95 % interval"], figures, budgets))
    if "update_newer_first" in figures:
        lines += ["", "Knowledge updates: of the knowledge-update questions about the current value with their newest "
                      "evidence turn and an older one both in the context, the share where the newest scored above "
                      "every older one: "
                  + ", ".join(f"{int(b) // 1000}k {100 * v:.1f} % of {figures['update_pairs'][b]}"
                              for b, v in _by_budget(figures["update_newer_first"])) + "."]
    if "update_change_both" in figures:
        lines += ["Of those asking for an earlier value or the change (\"my previous goal\", \"before the air fryer\"), "
                  "the share with the newest and an older telling both in the context: "
                  + ", ".join(f"{int(b) // 1000}k {100 * v:.1f} % of {figures['update_change_questions'][b]}"
                              for b, v in _by_budget(figures["update_change_both"])) + "."]
    return lines


def _by_budget(d: dict) -> list[tuple[str, dict]]:
    return sorted(d.items(), key=lambda kv: int(kv[0]))  # a JSON round trip sorts "16000" first


def run_notes(figures: dict) -> list[str]:
    """What a run cost and what else it saw, below either table."""
    lines = [f"Replay: {figures['ingested_turns']} turns in {figures['ingest_s']} s, "
             f"{figures['ingest_turns_per_s']} turns/s ({INGEST_MODES[figures['commit']]}, extraction jobs awaited"
             + (f"; the server's CPU {cpu} ms a turn" if (cpu := figures.get("ingest_server_cpu_ms_per_turn")) else "")
             + "); "
             f"BuildContext over gRPC p50 {figures['build_p50_ms']} ms, p99 {figures['build_p99_ms']} ms (all budgets); "
             "by budget: " + ", ".join(f"{int(b) // 1000}k p50 {v['p50_ms']} / p99 {v['p99_ms']} ms"
                                      for b, v in _by_budget(figures["build_ms_by_budget"])) + ".",
             f"A question's first call (the query is embedded, the past turns ranked) p50 "
             f"{figures['build_ms_new_query'].get('p50_ms')} / p99 {figures['build_ms_new_query'].get('p99_ms')} "
             f"ms; the same question at the next budgets (its ranking kept, as the user's turns are the same) "
             f"p50 {figures['build_ms_repeated_query'].get('p50_ms')} / "
             f"p99 {figures['build_ms_repeated_query'].get('p99_ms')} ms.",
             f"Server-side stages at 4k, p50 µs: {figures['stage_us_p50']}."]
    if "in_one_session" in figures:
        lines.append(f"A user's {figures['in_one_session_questions']} questions asked one after another in one "
                     "session at one budget, as an agent's calls come (the cache-aware layout keeps the session's "
                     "recall while it serves the next question): recall "
                     + ", ".join(f"{int(b) // 1000}k {100 * v:.1f} %" for b, v in _by_budget(figures["in_one_session"]))
                     + ".")
    if "served_4k" in figures:
        lines.append("After the run, the replayed database served as `serve` runs by default and on a core of its own "
                     "(`--cpus`; this bench, the calling service, on the other cores) at the same time, new questions "
                     "at 4k in alternating blocks: "
                     + ", ".join(f"{name} p50 {v['p50_ms']} / p99 {v['p99_ms']} ms"
                                 for name, v in figures["served_4k"].items()) + ".")
    lines += ["Extracted memories per question (tokens, items, evidence turns found only through them): "
              + ", ".join(f"{int(b) // 1000}k {v['tokens']:.0f} tok / {v['items']:.1f} items / "
                          f"{v['evidence_only_via_memory']:.3f}" for b, v in _by_budget(figures["memories_per_question"]))
              + ".",
              "Evidence turns in the context as a passage of a long turn (the run of its sentences about the "
              "question, when the whole turn is over an eighth of the budget) that keep the answer's words, and "
              "their share of those in it; passages that cut the answer out, not counted as recalled: "
              + ", ".join(f"{int(b) // 1000}k {v['turns']} ({100 * v['share']:.1f} %), {v.get('answer_cut', 0)} cut"
                          for b, v in _by_budget(figures.get("evidence_as_passage", {}))) + ".",
              f"Evidence ids repaired or unmatched, data issues: {figures['evidence_issues']}.",
              f"Machine speed (bench/fastpath_bench.py's yardstick, the pure-Python reference select on 700 fixed "
              f"candidates; higher is slower): {figures['yardstick_ms']['start']} ms before the run, "
              f"{figures['yardstick_ms']['end']} ms after."]
    if "model_cost" in figures:
        m = figures["model_cost"]
        lines.append(f"Model {m['embedder']} (torch threads {m['torch_threads']}): load {m['load_s']} s; one query "
                     f"embedding p50 {m['query_embedding_ms']['p50_ms']} / p99 {m['query_embedding_ms']['p99_ms']} ms; "
                     f"turns embedded {m['turns_per_s_one_by_one']}/s one by one, {m['turns_per_s_batched']}/s batched.")
    return lines


def write_results(figures: dict, profile: str, budgets: Sequence[int], dataset: str = "locomo") -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = results_stem(dataset, profile)
    (RESULTS / f"{stem}.json").write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    table = locomo_table if dataset == "locomo" else longmemeval_table
    lines = [*table(figures, profile, budgets), "", *run_notes(figures), ""]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines))
    plot_recall(figures, profile, budgets, RESULTS / f"{stem}.png")


def plot_recall(figures: dict, profile: str, budgets: Sequence[int], path: Path) -> bool:
    """Recall vs budget, ours beside the baselines (those in `figures`), turn level solid and session
    level dashed where measured, as a PNG at `path`; False (nothing drawn) without matplotlib (the
    optional `plot` extra)."""
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    names = {"ours": f"episodic ({profile})", "bm25": "BM25 over turns", "recency": "recency"}
    for colour, method in enumerate(METHODS):
        for level, style in (("turn", "-"), ("session", "--")):
            if (key := figure_key(method, "recall", level)) in figures:
                ax.plot(budgets, [figures[key][str(b)] for b in budgets], marker="o", linestyle=style,
                        color=f"C{colour}", label=names[method] + (", sessions" if level == "session" else ""))
    ax.set(xscale="log", xlabel="soft-zone budget (tokens)", ylabel="evidence recall", ylim=(0, 1))
    ax.set_xticks(list(budgets), [f"{b // 1000}k" for b in budgets])
    ax.minorticks_off()
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", help="a LoCoMo .json or a LongMemEval .json.gz (default: --dataset's file "
                                       "under ../shared/data)")
    parser.add_argument("--dataset", choices=tuple(LOADERS),
                        help="the reader (default: told by the file; LoCoMo when no --data is given)")
    parser.add_argument("--limit", type=int, default=0,
                        help="LoCoMo: the first N conversations; LongMemEval: N questions, stratified by type")
    parser.add_argument("--profile", choices=tuple(PROFILES), default="default")
    parser.add_argument("--quick", action="store_true",
                        help="2 budgets; LoCoMo's first 2 conversations, or one LongMemEval question per type, "
                             f"its haystack cut to about {QUICK_TURNS} turns")
    parser.add_argument("--commit", choices=tuple(INGEST_MODES), default="turn",
                        help="replay with CommitTurn per turn or per session, or import whole histories "
                             "(ImportSessions)")
    parser.add_argument("--script", choices=tuple(SCRIPTS),
                        help="the conversations written in another script, letter for letter (results printed only)")
    parser.add_argument("--offline", metavar="CACHE_DIR",
                        help="tuning: replay once into CACHE_DIR, then call BuildContext in process (no results written)")
    parser.add_argument("--keep", metavar="CACHE_DIR",
                        help="keep the replayed database in CACHE_DIR, where --offline finds it (one replay for both)")
    parser.add_argument("--live", action="store_true",
                        help="with --offline: ask each question at its time of asking with the server's clock "
                             "there too (LoCoMo's a day after its last turn), as a live user's turns are days old")
    parser.add_argument("--ranking", action="append", default=[],
                        help="with --offline: episodic knobs, e.g. neighbours=3,dense_weight=0.1; given more than once, "
                             "each is evaluated, compared with the first question by question (`against_first`: "
                             "the difference and its 95 %% interval), and `best_of` says what picking the best of "
                             "them per question would recall ('' is the profile as shipped)")
    args = parser.parse_args()
    embedder = PROFILES[args.profile]
    if embedder in NEEDS and not model_installed(embedder):
        raise SystemExit(f"--profile {args.profile} {needs_extra(embedder)}")
    path = Path(args.data) if args.data else DEFAULT_DATA[args.dataset or "locomo"]
    if not path.exists():
        print(f"recall data not found at {path}: skipping the recall bench")
        return
    raw = read_data(path)
    dataset = args.dataset or dataset_of(raw)
    convs = LOADERS[dataset](raw)
    budgets: Sequence[int] = BUDGETS
    if args.quick and dataset == "longmemeval":
        convs, budgets = [cut(c, QUICK_TURNS) for c in stratified(convs, len(LME_TYPES))], (2000, 4000)
    elif args.quick:
        convs, budgets = convs[:2], (2000, 4000)
    if args.limit:
        convs = stratified(convs, args.limit) if dataset == "longmemeval" else convs[: args.limit]
    if args.script:
        convs = [in_script(c, SCRIPTS[args.script]) for c in convs]
    if args.offline:
        app, maps = offline_app(Path(args.offline), convs, args.profile)
        try:
            base = MODEL_RANKING if embedder in NEEDS else DEFAULT_RANKING
            runs = [offline_evaluate(app, convs, maps, budgets, parse_ranking(spec, base), args.live)
                    for spec in args.ranking or [""]]
        finally:
            app.close()
        for spec, run in zip(args.ranking, runs, strict=False):
            print(f"{spec or '(as shipped)'}: recall {run['recall']}")
        totals = [{**{k: v for k, v in run.items() if k not in ("per_question", "conversation_of")}, "live": args.live}
                  for run in runs]
        if len(runs) == 1:
            emit(totals[0])
            return
        versus = {spec: against(runs[0], run) for spec, run in zip(args.ranking[1:], runs[1:], strict=True)}
        for spec, by_budget in versus.items():
            print(f"{spec} against {args.ranking[0] or '(as shipped)'}: " + "; ".join(
                f"{b}: {d['points']:+.2f} points [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}], "
                f"{d['better']} better, {d['worse']} worse" for b, d in by_budget.items()))
        emit({"rankings": dict(zip(args.ranking, totals, strict=True)), "best_of": best_of(runs),
              "against_first": versus})
        return
    before = yardstick_ms()
    serve_args = ["--embedder", embedder]
    server = ServerProcess(serve_args)
    maps: dict[int, dict[str, str]] = {}
    try:
        try:
            figures = evaluate(server.stub, convs, budgets, commit=args.commit, maps=maps, server_pid=server.proc.pid)
        finally:
            server.stop()
        if args.keep:
            keep_replay(Path(args.keep), Path(server.tmp) / "bench.duckdb", maps, args.profile)
        figures["yardstick_ms"] = {"start": before, "end": yardstick_ms()}
        # LongMemEval asks each user one question: served again, each first call would time its user's
        # index being rebuilt, so evaluate()'s first calls are its new-question latency.
        if dataset == "locomo":
            figures["served_4k"] = served_new_questions(f"{server.tmp}/bench.duckdb", convs, serve_args,
                                                        200 if args.quick else (600 if embedder in NEEDS else 1500))
    finally:
        shutil.rmtree(server.tmp, ignore_errors=True)
    figures["dataset"] = dataset
    figures["profile"] = args.profile
    figures["conversations"] = len(convs)
    if args.quick and dataset == "longmemeval":
        figures["haystack_cut_turns"] = QUICK_TURNS
    if embedder in NEEDS:
        figures["model_cost"] = model_cost(convs, embedder)
    if args.script:
        figures["script"] = args.script
    if not args.quick and not args.limit and not args.script:  # only a full run replaces the published results
        write_results(figures, args.profile, budgets, dataset)
    slim = {k: v for k, v in figures.items() if k != "evidence_issue_items"}
    emit(slim)


if __name__ == "__main__":
    main()
