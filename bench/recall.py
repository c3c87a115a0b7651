"""Context quality on LoCoMo (issue #8): each conversation replayed through a real sidecar over
gRPC, then every question (categories 1-4) asked in a new session of that user; evidence recall =
share of a question's evidence turns present in the context (as the turn itself, or through a
memory whose source_message_ids include it), beside a recency baseline at the same budgets.

python bench/recall.py [--data PATH] [--limit N] [--profile default|model] [--quick] [--commit turn|session]

The data is CC BY-NC: it is read from ../shared, never copied into the repo.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import re
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fastpath_bench import yardstick_ms
from harness import ROOT, ServerProcess, emit, one_core, percentiles, served_build_latency

from sidecar.api import context_service_pb2 as pb
from sidecar.assembly.builder import SOFT_HEADER_RESERVE
from sidecar.domain import Role
from sidecar.memory.episodic import DEFAULT_RANKING, MODEL_RANKING, date_label, day_number, render_turn
from sidecar.tokens import count_line, count_tokens

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "locomo" / "locomo10.json"
RESULTS = ROOT / "bench" / "results"
BUDGETS = (2000, 4000, 8000, 16000)
CATEGORIES = (1, 2, 3, 4)  # 5 (adversarial) has no evidence to recall
CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
TENANT = "locomo"
_EVIDENCE_RE = re.compile(r"^D:?(\d+):0*(\d+)$")
_SESSION_KEY_RE = re.compile(r"^session_(\d+)$")


# ---------------------------------------------------------------------------------------- data
@dataclass(slots=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    timestamp_ms: int
    session: int


@dataclass(slots=True)
class Question:
    text: str
    category: int
    evidence: list[str]


@dataclass(slots=True)
class Conversation:
    index: int
    speakers: tuple[str, str]
    sessions: dict[int, list[Turn]]
    questions: list[Question]
    issues: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))


def parse_date(text: str) -> int | None:
    """"1:56 pm on 8 May, 2023" -> epoch ms (UTC)."""
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%d %B, %Y", "%d %B %Y"):
        try:
            return int(dt.datetime.strptime(text.strip(), fmt).replace(tzinfo=dt.UTC).timestamp() * 1000)
        except ValueError:
            continue
    return None


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
    convs = []
    for index, item in enumerate(data, 1):
        c = item["conversation"]
        conv = Conversation(index, (c["speaker_a"], c["speaker_b"]), {}, [])
        last_ms = 0
        # Only the session_N lists that exist: one conversation has date keys without a session.
        numbers = sorted(int(m.group(1)) for k in c if (m := _SESSION_KEY_RE.match(k)) and isinstance(c[k], list))
        for n in numbers:
            when = parse_date(c.get(f"session_{n}_date_time", ""))
            if when is None:
                conv.issues["undated_session"].append(str(n))
                when = last_ms + 86_400_000
            last_ms = when
            turns = []
            for i, t in enumerate(c[f"session_{n}"]):
                text = t.get("text", "")
                if t.get("blip_caption"):
                    text = f"{text} [image: {t['blip_caption']}]"
                # One second apart keeps the order of a session's turns in their timestamps.
                turns.append(Turn(t["dia_id"], t["speaker"], text, when + i * 1000, n))
            conv.sessions[n] = turns
        known = [t.dia_id for turns in conv.sessions.values() for t in turns]
        if len(set(known)) != len(known):
            conv.issues["duplicate_dia_id"].extend(sorted({d for d in known if known.count(d) > 1}))
        for q in item["qa"]:
            if q.get("category") not in CATEGORIES:
                continue
            evidence = normalise_evidence(q.get("evidence", []), set(known), conv.issues)
            if not evidence:
                conv.issues["question_without_evidence"].append(q["question"])
                continue
            conv.questions.append(Question(q["question"], int(q["category"]), evidence))
        convs.append(conv)
    return convs


# ---------------------------------------------------------------------------------------- replay
def user_of(conv: Conversation) -> pb.Scope:
    return pb.Scope(tenant_id=TENANT, user_id=f"conv-{conv.index}")


def ingest(stub, conv: Conversation, commit: str = "turn") -> dict[str, str]:
    """Replay the conversation; returns message_id -> dia_id. speaker_a is the user."""
    scope = user_of(conv)
    by_message: dict[str, str] = {}
    for n, turns in conv.sessions.items():
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id=f"s{n}", title=f"session {n}")
                                 ).session_id
        msgs = [pb.NewMessage(role=pb.ROLE_USER if t.speaker == conv.speakers[0] else pb.ROLE_ASSISTANT,
                              text=t.text, speaker=t.speaker, client_timestamp_ms=t.timestamp_ms) for t in turns]
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


def wait_jobs(stub, conv: Conversation) -> None:
    while not stub.WaitForJobs(pb.WaitForJobsRequest(scope=user_of(conv), timeout_ms=60_000)).all_finished:
        pass


def budget_for(soft: int, query: str) -> pb.Budget:
    """A budget whose soft zone is exactly `soft` tokens, all of it for memories."""
    hard = count_tokens(query)
    return pb.Budget(max_input=soft + hard + SOFT_HEADER_RESERVE, reserved_for_output=0, system_and_tools=0,
                     session_state=0, recent_messages=0, memories=soft, rag_or_graph=0, tool_observations=0,
                     flow_unused=True)


def context_dia_ids(resp: pb.BuildContextResponse, by_message: dict[str, str],
                    memory_share: dict[str, float] | None = None) -> set[str]:
    """Evidence turns in the context. memory_share, when given, accumulates what extracted memories
    (memory:<id>) took: their tokens, their count, and the turns found only through them."""
    found, via_memory = set(), set()
    for section in resp.sections:
        for item in section.items:
            if item.source.startswith("message:"):
                found.add(by_message.get(item.source[len("message:"):], ""))
                continue
            ids = {by_message.get(m, "") for m in item.source_message_ids}
            if item.source.startswith("memory:") and memory_share is not None:
                memory_share["tokens"] += item.tokens
                memory_share["items"] += 1
                via_memory |= ids
            found |= ids
    found.discard("")
    if memory_share is not None:
        memory_share["_via"] = via_memory - {""}  # type: ignore[assignment]
    return found


def recency_ids(conv: Conversation, budget: int) -> set[str]:
    """Newest turns first, as rendered and charged by the sidecar (with a day's date header the first
    time a turn of that day is taken, when the sidecar packs dates that way), skipping a turn that
    does not fit."""
    turns = [t for n in sorted(conv.sessions) for t in conv.sessions[n]]
    headers = DEFAULT_RANKING.date_headers
    used, out, days = 0, set(), set()
    for t in reversed(turns):
        role = Role.USER if t.speaker == conv.speakers[0] else Role.ASSISTANT
        cost = count_line(render_turn(t.speaker, role, t.text, t.timestamp_ms, dated=not headers))
        day = day_number(t.timestamp_ms)
        if headers and day not in days:
            cost += count_line(date_label(t.timestamp_ms))
        if used + cost <= budget:
            used += cost
            out.add(t.dia_id)
            days.add(day)
    return out


# ---------------------------------------------------------------------------------------- metric
@dataclass(slots=True)
class Tally:
    """Per budget: sum of per-question recall and count of questions with all evidence."""

    recall: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    complete: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    n: int = 0

    def add(self, budget: int, evidence: list[str], present: set[str]) -> None:
        hit = sum(1 for e in evidence if e in present)
        self.recall[budget] += hit / len(evidence)
        self.complete[budget] += hit == len(evidence)

    def figures(self, budgets: Sequence[int]) -> tuple[dict[str, float], dict[str, float]]:
        d = max(self.n, 1)
        return ({str(b): round(self.recall[b] / d, 4) for b in budgets},
                {str(b): round(self.complete[b] / d, 4) for b in budgets})


def evaluate(stub, conversations: Sequence[Conversation], budgets: Sequence[int] = BUDGETS, *,
             commit: str = "turn", log=print) -> dict:
    """Replay, ask, measure. Returns the figures (fractions 0-1)."""
    ours, recency = Tally(), Tally()
    by_cat = {c: Tally() for c in CATEGORIES}
    by_half = {"conv_1_5": Tally(), "conv_6_10": Tally()}
    latencies: dict[int, list[float]] = {b: [] for b in budgets}
    # A question's first call (its first budget) embeds the query and ranks the past turns; the same
    # question at the next budgets finds both kept (the model's recent texts, the episodic ranking).
    first_calls: list[float] = []
    repeat_calls: list[float] = []
    mem = {b: {"tokens": 0.0, "items": 0.0, "evidence_only_via_memory": 0.0} for b in budgets}
    stages: dict[str, list[int]] = defaultdict(list)  # server-side microseconds per stage (debug calls, untimed)
    ingest_s = 0.0
    issues: dict[str, list[str]] = defaultdict(list)
    for conv in conversations:
        t0 = time.perf_counter()
        by_message = ingest(stub, conv, commit)
        wait_jobs(stub, conv)
        spent = time.perf_counter() - t0
        ingest_s += spent
        for kind, items in conv.issues.items():
            issues[kind].extend(f"conv-{conv.index}:{x}" for x in items)
        scope = user_of(conv)
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="eval")).session_id
        recent = {b: recency_ids(conv, b) for b in budgets}
        half = by_half["conv_1_5" if conv.index <= 5 else "conv_6_10"]
        for q in conv.questions:
            for tally in (ours, recency, by_cat[q.category], half):
                tally.n += 1
            for b in budgets:
                req = pb.BuildContextRequest(scope=scope, session_id=sid, query=q.text, budget=budget_for(b, q.text))
                t = time.perf_counter()
                resp = stub.BuildContext(req)
                latencies[b].append(time.perf_counter() - t)
                (repeat_calls if b != budgets[0] else first_calls).append(latencies[b][-1])
                present = context_dia_ids(resp, by_message, mem[b])
                via = mem[b].pop("_via")
                direct = {by_message.get(it.source[len("message:"):], "") for s in resp.sections for it in s.items
                          if it.source.startswith("message:")}
                mem[b]["evidence_only_via_memory"] += sum(1 for e in q.evidence if e in via and e not in direct)
                for tally in (ours, by_cat[q.category], half):
                    tally.add(b, q.evidence, present)
                recency.add(b, q.evidence, recent[b])
        mid_budget = 4000 if 4000 in budgets else budgets[0]
        for q in conv.questions[:20]:
            req = pb.BuildContextRequest(scope=scope, session_id=sid, query=q.text, debug=True,
                                         budget=budget_for(mid_budget, q.text))
            for timing in stub.BuildContext(req).timings:
                stages[timing.stage].append(timing.micros)
        r4 = ours.figures(budgets)[0]
        log(f"conv {conv.index}: {sum(len(s) for s in conv.sessions.values())} turns ingested in {spent:.1f}s; "
            f"{len(conv.questions)} questions; cumulative recall {r4}")
    recall, complete = ours.figures(budgets)
    rec_recall, rec_complete = recency.figures(budgets)
    every = [x for b in budgets for x in latencies[b]]
    lat = percentiles(every) if every else {"p50_ms": 0.0, "p99_ms": 0.0}
    mid = "4000" if 4000 in budgets else str(budgets[0])
    return {
        "questions": ours.n,
        "recall": recall, "all_evidence": complete,
        "recency": rec_recall, "recency_all_evidence": rec_complete,
        "by_category": {str(c): by_cat[c].figures(budgets)[0] for c in CATEGORIES if by_cat[c].n},
        "by_category_n": {str(c): by_cat[c].n for c in CATEGORIES},
        "recall_conv_1_5": by_half["conv_1_5"].figures(budgets)[0].get(mid) if by_half["conv_1_5"].n else None,
        "recall_conv_6_10": by_half["conv_6_10"].figures(budgets)[0].get(mid) if by_half["conv_6_10"].n else None,
        "halves": {k: t.figures(budgets)[0] for k, t in by_half.items() if t.n},
        # Per question: mean tokens and items of extracted memories, evidence turns found only through them.
        "memories_per_question": {str(b): {k: round(v / max(ours.n, 1), 3) for k, v in mem[b].items()}
                                  for b in budgets},
        "ingest_s": round(ingest_s, 2),
        "build_p50_ms": lat["p50_ms"], "build_p99_ms": lat["p99_ms"],
        "build_ms_by_budget": {str(b): percentiles(latencies[b]) for b in budgets if latencies[b]},
        "build_ms_new_query": percentiles(first_calls) if first_calls else {},
        "build_ms_repeated_query": percentiles(repeat_calls) if repeat_calls else {},
        "stage_us_p50": {k: sorted(v)[len(v) // 2] for k, v in stages.items()},
        "evidence_issues": {k: len(v) for k, v in issues.items()},
        "evidence_issue_items": dict(issues),
        "commit": commit,
    }


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
            log(f"conv {conv.index} ingested in {time.perf_counter() - t0:.1f}s")
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
                     budgets: Sequence[int] = BUDGETS, ranking=None) -> dict:
    """The metric of evaluate() with BuildContext called in process (no gRPC), for tuning; `ranking`
    (a Ranking) replaces the episodic source's knobs (EpisodicSource.set_ranking)."""
    from sidecar.assembly.budget import Budget
    from sidecar.assembly.builder import BuildRequest
    from sidecar.domain import Scope

    source = app.episodic
    if ranking is not None and ranking != source.ranking:
        source.set_ranking(ranking)
    ours = Tally()
    by_cat = {c: Tally() for c in CATEGORIES}
    by_half = {"conv_1_5": Tally(), "conv_6_10": Tally()}
    spent: list[float] = []
    per_question: dict[int, list[float]] = {b: [] for b in budgets}
    for conv in convs:
        scope = Scope(TENANT, f"conv-{conv.index}")
        by_message = maps[conv.index]
        half = by_half["conv_1_5" if conv.index <= 5 else "conv_6_10"]
        source.search(scope, "warm up", "eval", 1)  # the index build is not a query's cost
        for q in conv.questions:
            for tally in (ours, by_cat[q.category], half):
                tally.n += 1
            hard = count_tokens(q.text)
            for b in budgets:
                budget = Budget(max_input=b + hard + SOFT_HEADER_RESERVE, reserved_for_output=0, system_and_tools=0,
                                session_state=0, recent_messages=0, memories=b, rag_or_graph=0,
                                tool_observations=0, flow_unused=True)
                t = time.perf_counter()
                result = app.builder.build(scope, BuildRequest(session_id="eval", query=q.text, budget=budget))
                spent.append(time.perf_counter() - t)
                present = set()
                for section in result.packed:
                    for it in section.build_items():
                        if it.source.startswith("message:"):
                            present.add(by_message.get(it.source[8:], ""))
                        present |= {by_message.get(m, "") for m in it.source_message_ids}
                for tally in (ours, by_cat[q.category], half):
                    tally.add(b, q.evidence, present)
                per_question[b].append(sum(e in present for e in q.evidence) / len(q.evidence))
    recall, complete = ours.figures(budgets)
    return {"questions": ours.n, "recall": recall, "all_evidence": complete,
            "by_category": {str(c): by_cat[c].figures(budgets)[0] for c in CATEGORIES if by_cat[c].n},
            "halves": {k: t.figures(budgets)[0] for k, t in by_half.items() if t.n},
            "build_ms": percentiles(spent) if spent else {}, "per_question": per_question}


def best_of(runs: Sequence[dict]) -> dict[str, float]:
    """Per budget, the recall of picking for each question whichever run recalled most of its evidence:
    knowing the answers, so an upper bound on choosing among these rankings per question (how much a
    family of knobs could still give), not a method."""
    budgets = runs[0]["per_question"]
    return {str(b): round(sum(map(max, zip(*(r["per_question"][b] for r in runs), strict=True)))
                          / max(len(runs[0]["per_question"][b]), 1), 4) for b in budgets}


# ---------------------------------------------------------------------------------------- server
def model_cost(convs: Sequence[Conversation], n: int = 200) -> dict:
    """What the local model costs, timed here with the server's settings (torch on one thread unless
    SIDECAR_MODEL_THREADS says otherwise): load, one query (each new, no cache), and turns per second
    embedded one at a time (as AppendMessages indexes them) and in batches (an index rebuilt from rows)."""
    from sidecar.index.embedders import MiniLMEmbedder

    t = time.perf_counter()
    embedder = MiniLMEmbedder()
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
    import torch  # type: ignore[import-not-found]

    return {"embedder": embedder.name, "torch_threads": torch.get_num_threads(), "load_s": round(load_s, 2),
            "query_embedding_ms": percentiles(spent), "turns_per_s_one_by_one": round(single, 1),
            "turns_per_s_batched": round(batched, 1)}


def make_app(db_path: str, profile: str = "default"):
    """The sidecar as `serve` runs it: --embedder minilm for the model profile (the app then ranks
    past turns with the model too, MODEL_RANKING)."""
    from sidecar.app import Settings, Sidecar

    return Sidecar(db_path, Settings(embedder="minilm" if profile == "model" else "hash"))


def write_results(figures: dict, profile: str, budgets: Sequence[int]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"recall-{profile}.json").write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}"  # noqa: E731
    lines = [f"# LoCoMo evidence recall, profile `{profile}` ({figures['questions']} questions, categories 1-4)",
             "", "| | " + " | ".join(f"{b // 1000}k" for b in budgets) + " |",
             "|---|" + "---|" * len(budgets)]
    row = lambda name, d: f"| {name} | " + " | ".join(pct(d.get(str(b))) for b in budgets) + " |"  # noqa: E731
    lines.append(row("ours: evidence recall", figures["recall"]))
    lines.append(row("ours: all evidence", figures["all_evidence"]))
    lines.append(row("recency: evidence recall", figures["recency"]))
    lines.append(row("recency: all evidence", figures["recency_all_evidence"]))
    for c, d in figures["by_category"].items():
        lines.append(row(f"cat {c} {CATEGORY_NAMES[int(c)]} (n={figures['by_category_n'][c]})", d))
    for k, d in figures["halves"].items():
        lines.append(row(k.replace("_", " "), d))
    lines += ["", f"Ingest {figures['ingest_s']} s (CommitTurn per {figures['commit']}); BuildContext over gRPC "
              f"p50 {figures['build_p50_ms']} ms, p99 {figures['build_p99_ms']} ms (all budgets); by budget: "
              + ", ".join(f"{int(b) // 1000}k p50 {v['p50_ms']} / p99 {v['p99_ms']} ms"
                          for b, v in figures["build_ms_by_budget"].items()) + ".",
              f"A question's first call (the query is embedded, the past turns ranked) p50 "
              f"{figures['build_ms_new_query'].get('p50_ms')} / p99 {figures['build_ms_new_query'].get('p99_ms')} "
              f"ms; the same question at the next budgets (its ranking kept, as the user's turns are the same) "
              f"p50 {figures['build_ms_repeated_query'].get('p50_ms')} / "
              f"p99 {figures['build_ms_repeated_query'].get('p99_ms')} ms.",
              f"Server-side stages at 4k, p50 µs: {figures['stage_us_p50']}.",
              "After the run, the replayed database served as `serve` runs by default and on a core of its own "
              "(`--cpus`; this bench, the calling service, on the other cores) at the same time, new questions "
              "at 4k in alternating blocks: "
              + ", ".join(f"{name} p50 {v['p50_ms']} / p99 {v['p99_ms']} ms" for name, v in figures["served_4k"].items())
              + ".",
              "Extracted memories per question (tokens, items, evidence turns found only through them): "
              + ", ".join(f"{int(b) // 1000}k {v['tokens']:.0f} tok / {v['items']:.1f} items / "
                          f"{v['evidence_only_via_memory']:.3f}" for b, v in figures["memories_per_question"].items())
              + ".",
              f"Evidence ids repaired or unmatched: {figures['evidence_issues']}.",
              f"Machine speed (bench/fastpath_bench.py's yardstick, the pure-Python reference select on 700 fixed "
              f"candidates; higher is slower): {figures['yardstick_ms']['start']} ms before the run, "
              f"{figures['yardstick_ms']['end']} ms after."]
    if "model_cost" in figures:
        m = figures["model_cost"]
        lines.append(f"Model {m['embedder']} (torch threads {m['torch_threads']}): load {m['load_s']} s; one query "
                     f"embedding p50 {m['query_embedding_ms']['p50_ms']} / p99 {m['query_embedding_ms']['p99_ms']} ms; "
                     f"turns embedded {m['turns_per_s_one_by_one']}/s one by one, {m['turns_per_s_batched']}/s batched.")
    lines.append("")
    (RESULTS / f"recall-{profile}.md").write_text("\n".join(lines))
    plot_recall(figures, profile, budgets, RESULTS / f"recall-{profile}.png")


def plot_recall(figures: dict, profile: str, budgets: Sequence[int], path: Path) -> bool:
    """Recall vs budget, ours beside the recency baseline, as a PNG at `path`; False (nothing drawn)
    without matplotlib (the optional `plot` extra)."""
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(budgets, [figures["recall"][str(b)] for b in budgets], marker="o", label=f"episodic ({profile})")
    ax.plot(budgets, [figures["recency"][str(b)] for b in budgets], marker="o", label="recency")
    ax.set(xscale="log", xlabel="soft-zone budget (tokens)", ylabel="evidence recall", ylim=(0, 1))
    ax.set_xticks(list(budgets), [f"{b // 1000}k" for b in budgets])
    ax.minorticks_off()
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--profile", choices=("default", "model"), default="default")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--commit", choices=("turn", "session"), default="turn")
    parser.add_argument("--offline", metavar="CACHE_DIR",
                        help="tuning: replay once into CACHE_DIR, then call BuildContext in process (no results written)")
    parser.add_argument("--ranking", action="append", default=[],
                        help="with --offline: episodic knobs, e.g. neighbours=3,dense_weight=0.1; given more than once, "
                             "each is evaluated and `best_of` says what picking the best of them per question would recall")
    args = parser.parse_args()
    path = Path(args.data)
    if not path.exists():
        print(f"LoCoMo data not found at {path}: skipping the recall bench")
        return
    convs = load(json.loads(path.read_text()))
    budgets: Sequence[int] = BUDGETS
    if args.quick:
        convs, budgets = convs[:2], (2000, 4000)
    if args.limit:
        convs = convs[: args.limit]
    if args.offline:
        app, maps = offline_app(Path(args.offline), convs, args.profile)
        try:
            base = MODEL_RANKING if args.profile == "model" else DEFAULT_RANKING
            runs = [offline_evaluate(app, convs, maps, budgets, parse_ranking(spec, base)) for spec in args.ranking or [""]]
        finally:
            app.close()
        for spec, run in zip(args.ranking, runs, strict=False):
            print(f"{spec or '(as shipped)'}: recall {run['recall']}")
        totals = [{k: v for k, v in run.items() if k != "per_question"} for run in runs]
        emit(totals[0] if len(runs) == 1 else
             {"rankings": dict(zip(args.ranking, totals, strict=True)), "best_of": best_of(runs)})
        return
    before = yardstick_ms()
    serve_args = ["--embedder", "minilm" if args.profile == "model" else "hash"]
    server = ServerProcess(serve_args)
    try:
        figures = evaluate(server.stub, convs, budgets, commit=args.commit)
    finally:
        server.stop()
    figures["yardstick_ms"] = {"start": before, "end": yardstick_ms()}
    figures["served_4k"] = served_new_questions(f"{server.tmp}/bench.duckdb", convs, serve_args,
                                                200 if args.quick else (600 if args.profile == "model" else 1500))
    figures["profile"] = args.profile
    figures["conversations"] = len(convs)
    if args.profile == "model":
        figures["model_cost"] = model_cost(convs)
    if not args.quick and not args.limit:  # only a full run replaces the published results
        write_results(figures, args.profile, budgets)
    slim = {k: v for k, v in figures.items() if k != "evidence_issue_items"}
    emit(slim)


if __name__ == "__main__":
    main()
