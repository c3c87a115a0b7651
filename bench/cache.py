"""Provider prompt caching: how much of each model call's input a provider would serve from its
cache, replaying (a) an ops agent's 40-turn tool loop, (b) LoCoMo sessions as chat, (c) a
LongMemEval haystack as chat and (d) LoCoMo's questions asked one after another in one session (with
the share of their evidence turns each context held) through a served sidecar, in the cache-aware
layout and, in the same run and the same server, the classic one (LAYOUT_CLASSIC) as the baseline.

Every model call is BuildContext rendered as chat, flattened to one string and counted in cl100k.
- OpenAI's rule: the longest prefix shared with any earlier call of the session is cached once it
  is at least 1,024 tokens, in 128-token steps; cached tokens cost 0.1x.
- Anthropic's: a cache entry is written at each breakpoint the response names (end of tools, state,
  history) and read by a later call whose prompt starts with it; reads 0.1x, writes 1.25x, 1,024
  tokens at least.

python bench/cache.py [--quick] [--locomo PATH] [--longmemeval PATH]
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from harness import ServerProcess, emit
from recall import (
    DEFAULT_DATA,
    LOADERS,
    dataset_of,
    evidence_found,
    import_history,
    read_data,
    user_of,
    wait_jobs,
)

from sidecar.api import context_service_pb2 as pb
from sidecar.tokens import encode

MIN_CACHED, STEP = 1024, 128
READ, WRITE = 0.1, 1.25
LAYOUTS = {"cache_aware": pb.LAYOUT_CACHE_AWARE, "classic": pb.LAYOUT_CLASSIC}


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ accounting
@dataclass
class Call:
    tokens: np.ndarray
    breakpoints: list[int]  # token offsets where the response says a cache may end
    fresh_output: int = 0  # tokens of the tool output this call shows for the first time (no cache has them)


@dataclass
class Ledger:
    """Input tokens and what each provider would charge, over calls."""

    total: int = 0
    openai_cached: int = 0
    anthropic_read: int = 0
    anthropic_written: int = 0
    fresh_output: int = 0
    calls: int = 0
    sessions: list[list[Call]] = field(default_factory=list)

    def session(self, calls: list[Call]) -> None:
        entries: list[tuple[int, int]] = []  # (call index, breakpoint): Anthropic's cache
        for i, call in enumerate(calls):
            n = len(call.tokens)
            shared = [_common(call.tokens, calls[j].tokens) for j in range(i)]
            best = max(shared, default=0)
            self.openai_cached += best // STEP * STEP if best >= MIN_CACHED else 0
            read = max((b for j, b in entries if b <= shared[j]), default=0)
            last = max((b for b in call.breakpoints if b >= MIN_CACHED), default=0)
            self.anthropic_read += read
            self.anthropic_written += max(last - read, 0)
            entries += [(i, b) for b in call.breakpoints if b >= MIN_CACHED]
            self.total += n
            self.fresh_output += call.fresh_output
            self.calls += 1

    def figures(self) -> dict[str, float]:
        t = max(self.total, 1)
        plain_anthropic = self.total - self.anthropic_read - self.anthropic_written
        return {"calls": self.calls, "input_tokens": self.total,
                "cached_share": round(self.openai_cached / t, 4),
                "cost_openai": round((READ * self.openai_cached + self.total - self.openai_cached) / t, 4),
                "anthropic_read_share": round(self.anthropic_read / t, 4),
                # The tool outputs each call shows first: what no layout can serve from a cache.
                "fresh_output_share": round(self.fresh_output / t, 4),
                "cost_anthropic": round((READ * self.anthropic_read + WRITE * self.anthropic_written
                                         + plain_anthropic) / t, 4)}


def _common(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.flatnonzero(a[:n] != b[:n])
    return int(diff[0]) if len(diff) else n


def flatten(resp: pb.BuildContextResponse) -> Call:
    """The chat messages as a provider receives them, in cl100k tokens, with the breakpoints."""
    text = "".join(f"<|{m.role}|>\n{m.content}\n" for m in resp.chat_messages)
    tokens = np.asarray(encode(text), np.int64)
    return Call(tokens, [min(b.prefix_tokens, len(tokens)) for b in resp.cache_breakpoints])


# ------------------------------------------------------------------------------------ a: tool loop
RULES = "\n".join(
    [f"Rule {i + 1}. {line}" for i, line in enumerate([
        "You are OpsPilot, the on-call assistant of the payments platform team.",
        "Answer in the language the user writes in; keep answers short and put commands first.",
        "Never restart, scale down or fail over a production instance without an explicit approval in this chat.",
        "Before any change, state the service, the environment, the change and how to roll it back.",
        "Prefer read-only tools (logs, metrics, describe) until the cause is known.",
        "Quote error lines exactly; never paraphrase a stack trace.",
        "When a runbook covers the situation, follow it and cite its section.",
        "If the knowledge base has no answer, say so; do not guess an internal procedure.",
        "Never print secrets, tokens or passwords, even if a tool returns them.",
        "Escalate to the incident commander when customer impact lasts over 15 minutes.",
        "Use UTC times in every message and in every change record.",
        "Record every change in the change log with its ticket number.",
        "Treat staging and production as different systems; never copy data from production to staging.",
        "Roll back first, investigate second, when a deploy correlates with an error spike.",
        "Keep the user informed after every tool call with one line of what you learnt.",
    ] * 4)])
TOOLS = [pb.ToolSchema(name=name, description=desc, schema_json=(
    '{"type": "object", "properties": {"service": {"type": "string"}, "environment": {"type": "string", '
    '"enum": ["staging", "production"]}, "since": {"type": "string"}, "limit": {"type": "integer"}}, '
    f'"required": ["service"], "description": "{desc}"}}')) for name, desc in [
    ("get_logs", "Fetch recent log lines of a service"), ("get_metrics", "Query a metric over a time window"),
    ("describe_deploy", "Describe the latest deploys of a service"), ("list_alerts", "List firing alerts"),
    ("restart_instance", "Restart one instance (needs approval in production)"),
    ("rollback_deploy", "Roll a service back to its previous release"),
    ("open_ticket", "Open a change or incident ticket"), ("query_runbook", "Search the runbooks")]]
SERVICES = ["payment-api", "ledger-db", "checkout-web", "fraud-scorer", "refund-worker", "gateway"]
RUNBOOKS = {
    "runbook-payment-api": "# Payment API\n\n## Latency\nCheck the connection pool first; p99 above 800 ms "
                           "means the pool is saturated. Scale out before restarting.\n\n## Errors\n5xx spikes "
                           "after a deploy: roll back first. Never restart the primary during business hours.",
    "runbook-ledger-db": "# Ledger DB\n\n## Replication lag\nLag above 30 s: pause the batch writers, check the "
                         "replica's disk. Failover needs the DBA on call.\n\n## Locks\nLong transactions: find "
                         "them in pg_stat_activity; cancel, do not kill the backend.",
}


def tool_output(rng: random.Random, service: str, lines: int) -> str:
    out = []
    for k in range(lines):
        level = rng.choice(["INFO", "INFO", "INFO", "WARN", "ERROR"])
        out.append(f"2026-12-05T10:{k % 60:02d}:{rng.randint(0, 59):02d}Z {level} {service} "
                   f"req={rng.getrandbits(40):010x} latency_ms={rng.randint(20, 2400)} status={rng.choice([200, 200, 502])}")
    return "\n".join(out)


def tool_loop(stub, scope: pb.Scope, layout: int, turns: int, seed: int) -> list[Call]:
    """One session of an ops agent: per user turn one or two tool calls, each followed by a model call."""
    rng = random.Random(seed)
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, title="on-call")).session_id
    s = dict(scope=scope, session_id=sid)
    calls: list[Call] = []

    def model_call(query: str, run: str, after_tool: bool = False) -> None:
        resp = stub.BuildContext(pb.BuildContextRequest(**s, run_id=run, query=query, system_rules=RULES, tools=TOOLS,
                                                        roles=["oncall"], render=pb.RENDER_MODE_CHAT, layout=layout))
        calls.append(flatten(resp))
        if after_tool:  # the output the model just asked for: the newest tool message
            newest = [m for m in resp.chat_messages if m.role == "tool"][-1:]
            calls[-1].fresh_output = sum(len(encode(f"<|{m.role}|>\n{m.content}\n")) for m in newest)

    for t in range(turns):
        service = rng.choice(SERVICES)
        ask = rng.choice([f"{service} p99 is up, what is going on?", f"any errors on {service} in production?",
                          f"did the last deploy of {service} break anything?", f"is {service} healthy now?"])
        if t == 2:
            ask = "不要重启生产实例，任何情况下都先问我。 " + ask
        stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[pb.NewMessage(role=pb.ROLE_USER, text=ask)]))
        run = stub.StartRun(pb.StartRunRequest(**s, goal=ask[:80])).run_id
        model_call(ask, run)
        for k in range(1 + (t % 12 < 1 or t % 13 == 5)):  # a second tool call now and then: 83 calls in 40 turns
            tool = rng.choice(["get_logs", "get_metrics", "describe_deploy"])
            stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[pb.NewMessage(
                role=pb.ROLE_ASSISTANT, text=f"calling {tool} for {service}", tool_name=tool)]))
            stub.RecordToolResult(pb.RecordToolResultRequest(**s, run_id=run, tool_name=tool, call_id=f"c{t}-{k}",
                                                             full_text=tool_output(rng, service, rng.randint(30, 90))))
            model_call(ask, run, after_tool=True)
        answer = f"{service}: {rng.choice(['pool saturated', 'a bad deploy', 'a noisy neighbour', 'healthy'])}; " \
                 f"next step {rng.choice(['scale out', 'roll back', 'watch for 10 minutes', 'open a ticket'])}."
        stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[pb.NewMessage(role=pb.ROLE_ASSISTANT, text=answer)]))
        if t % 5 == 4:
            stub.UpsertFacts(pb.UpsertFactsRequest(**s, facts=[pb.FactInput(
                key=f"incident_{service}", value=answer[:60], provenance=pb.PROVENANCE_USER_CONFIRMED)]))
        stub.UpdateRun(pb.UpdateRunRequest(**s, run_id=run, status=pb.RUN_STATUS_COMPLETED))
        commit(stub, scope, sid)
    return calls


def commit(stub, scope: pb.Scope, sid: str) -> None:
    jobs = list(stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid)).job_ids)
    if jobs:
        stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs, timeout_ms=60_000))


# ------------------------------------------------------------------------------------ b, c: chats
def chat_sessions(stub, scope: pb.Scope, layout: int, sessions: list[list], rules: str) -> list[list[Call]]:
    """Each session a sidecar session; a model call at every user turn (asked with its text), the
    assistant's turn appended after it, the turn committed."""
    out = []
    for turns in sessions:
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        calls = []
        for turn in turns:
            msg = pb.NewMessage(role=pb.ROLE_USER if turn.role == 1 else pb.ROLE_ASSISTANT, text=turn.text,
                                speaker=turn.speaker, client_timestamp_ms=turn.timestamp_ms)
            stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[msg]))
            if msg.role == pb.ROLE_USER:
                resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=turn.text,
                                                                system_rules=rules, render=pb.RENDER_MODE_CHAT,
                                                                layout=layout))
                calls.append(flatten(resp))
            else:
                commit(stub, scope, sid)
        out.append(calls)
    return out


def dataset_sessions(path: Path, quick: bool) -> list[list]:
    data = read_data(path)
    conv = LOADERS[dataset_of(data)](data[:1])[0]
    sessions = [conv.sessions[n] for n in sorted(conv.sessions)]
    return sessions[:3] if quick else sessions


CHAT_RULES = RULES.split("\n", 1)[1].replace("OpsPilot, the on-call assistant of the payments platform team",
                                            "a helpful assistant with a long memory")


# ------------------------------------------------------------------------------------ d: questions
QUICK_QUESTIONS = 20
QUESTION_BUDGET = pb.Budget(max_input=8000)  # a model with an 8k window; the other budgets the defaults


def questions_in_turn(stub, path: Path, layout: int, name: str, quick: bool) -> tuple[list[Call], float]:
    """LoCoMo's first conversation imported as a user's history, then its questions asked one after
    another in one new session, as an agent's user asks them: each a user message and a model call with an
    8k window (QUESTION_BUDGET), the data's answer the assistant's reply, the turn committed. Returns the
    calls and the share of the questions' evidence turns their contexts held (as bench/recall.py counts them)."""
    data = read_data(path)
    conv = LOADERS[dataset_of(data)](data[:1])[0]
    conv.tenant, conv.user = "questions", f"asker-{name}"
    by_message = import_history(stub, conv)
    wait_jobs(stub, conv)
    scope = user_of(conv)
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    text_of = {t.dia_id: t.text for t in conv.turns()}
    calls, found = [], []
    for q in conv.questions[:QUICK_QUESTIONS] if quick else conv.questions:
        stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
            pb.NewMessage(role=pb.ROLE_USER, text=q.text)]))
        resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=q.text, system_rules=CHAT_RULES,
                                                        render=pb.RENDER_MODE_CHAT, layout=layout, budget=QUESTION_BUDGET))
        calls.append(flatten(resp))
        found.append(evidence_found(resp, q, by_message, text_of))
        stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
            pb.NewMessage(role=pb.ROLE_ASSISTANT, text=str(q.answer) or "I don't know.")]))
        commit(stub, scope, sid)
    return calls, round(sum(found) / max(len(found), 1), 4)


# ------------------------------------------------------------------------------------ main
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="10 tool-loop turns, 3 sessions of each dataset, 20 questions")
    p.add_argument("--locomo", type=Path, default=DEFAULT_DATA["locomo"])
    p.add_argument("--longmemeval", type=Path, default=DEFAULT_DATA["longmemeval"])
    a = p.parse_args()
    started = time.monotonic()
    server = ServerProcess()
    out: dict[str, object] = {"bench": "cache", "quick": a.quick}
    try:
        stub = server.stub
        for doc_id, text in RUNBOOKS.items():
            stub.IngestDocument(pb.IngestDocumentRequest(scope=pb.Scope(tenant_id="ops"), doc_id=doc_id, text=text,
                                                         format=pb.DOCUMENT_FORMAT_MARKDOWN))
        scenarios: dict[str, dict[str, Ledger]] = {}
        for name, layout in LAYOUTS.items():
            ledger = Ledger()
            ledger.session(tool_loop(stub, pb.Scope(tenant_id="ops", user_id=f"oncall-{name}"), layout,
                                     10 if a.quick else 40, seed=7))
            scenarios.setdefault("tool_loop", {})[name] = ledger
            log("tool_loop", name, ledger.figures())
        for key, path in (("locomo_chat", a.locomo), ("longmemeval_chat", a.longmemeval)):
            if not path.exists():
                out[key] = None
                continue
            sessions = dataset_sessions(path, a.quick)
            for name, layout in LAYOUTS.items():
                ledger = Ledger()
                for calls in chat_sessions(stub, pb.Scope(tenant_id=key, user_id=name), layout, sessions, CHAT_RULES):
                    ledger.session(calls)
                scenarios.setdefault(key, {})[name] = ledger
                log(key, name, ledger.figures())
        recall: dict[str, float] = {}
        if a.locomo.exists():
            for name, layout in LAYOUTS.items():
                ledger = Ledger()
                calls, recall[name] = questions_in_turn(stub, a.locomo, layout, name, a.quick)
                ledger.session(calls)
                scenarios.setdefault("locomo_questions", {})[name] = ledger
                log("locomo_questions", name, ledger.figures(), "evidence recall", recall[name])
        for key, ledgers in scenarios.items():
            now, base = ledgers["cache_aware"].figures(), ledgers["classic"].figures()
            out[key] = {**now, "baseline_cached_share": base["cached_share"],
                        "baseline_cost_openai": base["cost_openai"], "baseline_cost_anthropic": base["cost_anthropic"]}
        if recall:
            out["locomo_questions"].update(evidence_recall=recall["cache_aware"], baseline_evidence_recall=recall["classic"])
    finally:
        server.stop()
    out["seconds"] = round(time.monotonic() - started, 1)
    emit(out)


if __name__ == "__main__":
    main()
