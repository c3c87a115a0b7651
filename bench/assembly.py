"""BuildContext bench (issue #4): fastpath vs its reference, in-process and gRPC latency,
throughput with 8 concurrent callers, a naive count-everything-then-trim baseline, greedy vs
optimum, and the transport floor: a bare gRPC server answering with the same response bytes and no
work.

Cold users (issue #34), in process: users with ~500 LongMemEval turns each (read from ../shared, or
long synthetic turns made here when the data is missing) are replayed, the sidecar is closed and
opened again on the same database, and each user returns: opens a new session and asks a new
question (freshly loaded); then, in rounds, every user is evicted from memory (as the least recently
used are) and returns again: `cold_user_first_build_p50_ms` / `_p99_ms`. `warm_new_query_p50_ms`: a
user still in memory asks a question not asked before in the session they are in.
`cold_user_first_append_p50_ms` / `_p99_ms`: an evicted user's first message (AppendMessages in a new
session), which indexes it into their recall index. `warm_beside_rebuild_p50_ms` / `_p99_ms`: warm
users' new questions while a second thread rebuilds another user's recall index from rows over and
over (as after a crash); `warm_beside_import_p50_ms` / `_p99_ms`: while it imports one user's
history after another (ImportSessions, which builds the user's recall index).

Throughput comes from the compiled Go load generator (clients/go/cmd/loadgen, built here once by
clients/go/build.sh) when the Go toolchain is installed (clients/install-toolchains.sh go): on a
machine with 2+ cores the server (the sidecar, then the floor) runs on one core (`--cpus`, as
`serve --cpus`) and the load generator on another (`taskset -c`), so the client's CPU does not eat
the server's; it receives each answer's bytes without parsing them, so its own cost per call stays
small. Without Go, 8 Python client threads measure it as before, unpinned. The JSON says which:
"load_generator": "go" | "python" (--python-load forces Python).

python bench/assembly.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import fastpath_bench
import grpc
import scenario
from harness import ROOT, ServerProcess, emit, one_core, percentiles, throughput_cpu, time_calls

import fastpath
from sidecar import convert, tokens
from sidecar.api import context_service_pb2 as pb
from sidecar.app import Sidecar
from sidecar.assembly.builder import BuildRequest, ToolSpec
from sidecar.domain import NewMessage, Provenance, Role, Scope
from sidecar.services.facts import FactInput
from sidecar.services.imports import PastSession

RULES = ("You are OpsPilot, an operations assistant. You may query logs, metrics and traces. Any write action "
         "(restart, scale, rollback, config change) needs explicit human approval. Answer concisely, cite the "
         "evidence you used, and say so when the knowledge base has no answer. ") * 3
TOOLS = [ToolSpec("query_logs", "Query a service's logs",
                  '{"serviceId":"string","env":"string","timeRange":"string","level":"string"}'),
         ToolSpec("query_metrics", "Query a Prometheus metric", '{"expr":"string","range":"string"}'),
         ToolSpec("restart_service", "Restart a service (needs approval)", '{"serviceId":"string","env":"string"}')]
QUERY = "它的错误日志呢？ payment-api 5xx in production since the deploy"
SCOPE = Scope("bench", "u1")


def make_app(db_path: str) -> Sidecar:
    app = Sidecar(db_path)
    app.builder.sources.append(scenario.SyntheticSource())
    return app


def populate_inproc(app: Sidecar) -> str:
    rng = random.Random(1)
    sid = app.sessions.create(SCOPE, "bench-session", "bench", {}).session_id
    msgs = [NewMessage(role=Role.USER if r == "user" else Role.ASSISTANT, text=t) for r, t in scenario.messages(rng)]
    app.sessions.append(SCOPE, sid, msgs)
    app.facts.upsert(SCOPE, sid, [FactInput(k, v, Provenance.USER_CONFIRMED, "") for k, v in scenario.facts()])
    return sid


def populate_grpc(stub) -> str:
    rng = random.Random(1)
    s = pb.Scope(tenant_id=SCOPE.tenant_id, user_id=SCOPE.user_id)
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=s, session_id="bench-session")).session_id
    stub.AppendMessages(pb.AppendMessagesRequest(scope=s, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER if r == "user" else pb.ROLE_ASSISTANT, text=t)
        for r, t in scenario.messages(rng)]))
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=s, session_id=sid, facts=[
        pb.FactInput(key=k, value=v, provenance=pb.PROVENANCE_USER_CONFIRMED) for k, v in scenario.facts()]))
    return sid


def grpc_request(sid: str) -> pb.BuildContextRequest:
    return pb.BuildContextRequest(
        scope=pb.Scope(tenant_id=SCOPE.tenant_id, user_id=SCOPE.user_id), session_id=sid, query=QUERY,
        system_rules=RULES, tools=[pb.ToolSchema(name=t.name, description=t.description, schema_json=t.schema_json)
                                   for t in TOOLS])


def naive_baseline(app: Sidecar, sid: str, synthetic: scenario.SyntheticSource, budget_total: int):
    """What a typical framework does per call: count every candidate with tiktoken, sort, trim."""
    view = app.store.session_view(SCOPE, sid)
    texts = [m.rendered for m in view.messages] + synthetic.texts
    scores = [float(i) for i in range(len(view.messages))] + [r for b in synthetic.batches for r in b.relevance]

    def call():
        counted = [(s, tokens.count_tokens(t), t) for s, t in zip(scores, texts, strict=True)]
        counted.sort(key=lambda x: -x[0])
        used, out = tokens.count_tokens(RULES) + tokens.count_tokens(QUERY), []
        for _, n, t in counted:
            if used + n <= budget_total:
                out.append(t)
                used += n
        return out

    return call


def serve_floor(listen: str, payload_path: str) -> None:
    """The transport floor: the same kind of server (asyncio, answering on the loop) and service
    path, answered with fixed response bytes and no work."""
    from sidecar.server import SERVICE_NAME

    payload = Path(payload_path).read_bytes()

    async def answer(raw, context) -> bytes:
        return payload

    async def run() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
            SERVICE_NAME, {"BuildContext": grpc.unary_unary_rpc_method_handler(answer)})])
        server.add_insecure_port(listen)
        await server.start()
        print("serving on", listen, flush=True)
        await server.wait_for_termination()

    asyncio.run(run())


COLD_SESSIONS = 50  # a synthetic user (no LongMemEval data): ~500 turns in 50 sessions of 10
_WORDS = ("trip garden recipe guitar budget apartment marathon camera museum coffee lecture vaccine "
          "printer salmon novel hiking invoice laptop violin festival sofa ticket puppy cousin yoga "
          "mortgage paint glacier bakery podcast chess kayak lantern orchid telescope quilt").split()


def synthetic_users(n: int) -> list[tuple[str, list[list[tuple[bool, str, int]]], list[str]]]:
    """n users of ~500 long turns (user ~80 words, assistant ~300, as LongMemEval's), the same every
    run: (user id, sessions of (is_user, text, timestamp_ms), questions)."""
    out = []
    for u in range(n):
        rng = random.Random(1000 + u)
        sessions, at = [], 1_684_000_000_000
        for _ in range(COLD_SESSIONS):
            at += rng.randint(1, 5) * 86_400_000
            turns = []
            for i in range(10):
                words = rng.choices(_WORDS, k=80 if i % 2 == 0 else 300)
                text = " ".join(words).capitalize() + "."
                turns.append((i % 2 == 0, ("I think " if i % 2 == 0 else "") + text, at + i * 1000))
            sessions.append(turns)
        questions = [f"What did I say about the {a} and the {b}?" for a, b in
                     itertools.islice(zip(rng.sample(_WORDS, 12), rng.sample(_WORDS, 12), strict=True), 12)]
        out.append((f"synthetic-{u}", sessions, questions))
    return out


def longmemeval_users(n: int):
    """The first n LongMemEval users (one question's haystack each, ~500 turns) in the shape of
    synthetic_users, the other users' questions given to each as more new questions; None without
    the data."""
    import recall

    path = recall.DEFAULT_DATA["longmemeval"]
    if not path.exists():
        return None
    convs = recall.load_longmemeval(recall.read_data(path))
    others = [q.text for c in convs[n:] for q in c.questions]
    out = []
    for conv in convs[:n]:
        sessions = [[(t.role is Role.USER, t.text, t.timestamp_ms) for t in conv.sessions[k]] for k in sorted(conv.sessions)]
        out.append((conv.user_id, sessions, [q.text for q in conv.questions] + others))
    return out


def replay_users(app: Sidecar, users) -> list[int]:
    """Store each user's sessions (as AppendMessages and CommitTurn would, extraction awaited) and a
    session "ask" for questions asked in place; the turns of each."""
    turns = []
    for uid, sessions, _ in users:
        scope = Scope("cold", uid)
        jobs = []
        for k, session in enumerate(sessions):
            sid = app.sessions.create(scope, f"s{k}", "", {}).session_id
            app.sessions.append(scope, sid, [NewMessage(role=Role.USER if mine else Role.ASSISTANT, text=text,
                                                        client_timestamp_ms=at) for mine, text, at in session])
            jobs += app.turns.commit(scope, sid, [])
        app.worker.wait(scope, jobs, 300)
        app.sessions.create(scope, "ask", "", {})
        turns.append(sum(map(len, sessions)))
    return turns


def next_question(asked: set[str], own: list[str], pool: list[str]) -> str:
    """The user's first question not asked yet (their own, then everyone's), marked asked."""
    query = next(q for q in itertools.chain(own, pool) if q not in asked)
    asked.add(query)
    return query


def evict(app: Sidecar, scope: Scope) -> None:
    """The user leaves memory as the least recently used do."""
    app.episodic.evict(scope)
    app.memories.invalidate(scope)
    app.store.evict_user(scope)


def new_question(app: Sidecar, uid: str, query: str, returning: bool = True) -> float:
    """Seconds to answer `query` (BuildContext and its response bytes); a returning user asks it in a
    session they open now (not timed), else in their session "ask"."""
    sid = app.sessions.create(Scope("cold", uid), "", "", {}).session_id if returning else "ask"
    req = BuildRequest(session_id=sid, query=query)
    t = time.perf_counter()
    convert.build_response_bytes(app.builder.build(Scope("cold", uid), req), 0)  # what the server sends
    return time.perf_counter() - t


def cold_users(quick: bool) -> dict:
    """What a user's first question costs when their past is not in memory, and a warm user's new
    question (see the module's docstring). The first user only warms the process up."""
    n_users, rounds, warm_asks = (3, 5, 6) if quick else (12, 6, 10)
    users = longmemeval_users(n_users + 1)
    data = "longmemeval" if users is not None else "synthetic"
    if users is None:
        users = synthetic_users(n_users + 1)
    # Questions not asked before by anyone: each user's own first, then the others' in turn.
    pool = list(dict.fromkeys(q for _, _, qs in users for q in qs))
    db = tempfile.mkdtemp(prefix="sidecar-cold-") + "/cold.duckdb"
    app = Sidecar(db)
    turns = replay_users(app, users)
    app.close()
    app = Sidecar(db)  # freshly loaded: no user in memory
    app.wait_warm_up(60.0)  # a serving process has long finished its start-up work

    asked: dict[str, set[str]] = {uid: set() for uid, _, _ in users}

    def ask(uid: str, own: list[str], returning: bool = True) -> float:
        return new_question(app, uid, next_question(asked[uid], own, pool), returning)

    ask(users[0][0], users[0][2])  # the process's first call
    measured = users[1:]
    cold = [ask(uid, qs) for uid, _, qs in measured]
    for _ in range(rounds - 1):
        for uid, _, qs in measured:
            evict(app, Scope("cold", uid))
            cold.append(ask(uid, qs))
    for uid, _, qs in measured:  # the session asked in is loaded once (eviction dropped it): not a question's cost
        ask(uid, qs, returning=False)
    warm = [ask(uid, qs, returning=False) for _ in range(warm_asks) for uid, _, qs in measured]

    def says(uid: str) -> float:
        """A returning user's first message (AppendMessages in a session they open now), timed."""
        scope = Scope("cold", uid)
        evict(app, scope)
        sid = app.sessions.create(scope, "", "", {}).session_id
        message = [NewMessage(role=Role.USER, text=next(q for q in pool if q not in asked[uid]))]
        t = time.perf_counter()
        app.sessions.append(scope, sid, message)
        return time.perf_counter() - t

    appends = [says(uid) for _ in range(rounds) for uid, _, _ in measured]

    def beside(work, times: int = 3) -> list[float]:
        """Warm users' new questions while a second thread runs work() again and again, until it has
        run `times` times (and they asked at least warm_asks * 3 rounds)."""
        stop, done = threading.Event(), []

        def loop() -> None:
            while not stop.is_set():
                work()
                done.append(1)

        worker = threading.Thread(target=loop)
        worker.start()
        out: list[float] = []
        try:
            while len(done) < times or len(out) < warm_asks * 3 * len(measured[1:]):
                out += [ask(uid, qs, returning=False) for uid, _, qs in measured[1:]]
            return out
        finally:
            stop.set()
            worker.join()

    # Another user's recall index rebuilt from rows (as after a crash): what a load costs the users
    # already in memory. Then another user's history imported (ImportSessions builds their index).
    loader = measured[0]

    def rebuild() -> None:
        app.episodic.drop_user(Scope("cold", loader[0]))
        ask(loader[0], loader[2], returning=False)

    imported = itertools.count()

    def import_history() -> None:
        app.imports.import_sessions(Scope("cold", f"imported-{next(imported)}"), [PastSession(messages=[
            NewMessage(role=Role.USER if mine else Role.ASSISTANT, text=text, client_timestamp_ms=at)
            for mine, text, at in session]) for session in loader[1]])

    beside_rebuild, beside_import = beside(rebuild), beside(import_history)
    app.close()
    shutil.rmtree(Path(db).parent, ignore_errors=True)
    cold_stats, warm_stats, append_stats = percentiles(cold), percentiles(warm), percentiles(appends)
    beside_stats, import_stats = percentiles(beside_rebuild), percentiles(beside_import)
    return {"cold_user_first_build_p50_ms": cold_stats["p50_ms"], "cold_user_first_build_p99_ms": cold_stats["p99_ms"],
            "cold_user_first_append_p50_ms": append_stats["p50_ms"],
            "cold_user_first_append_p99_ms": append_stats["p99_ms"],
            "warm_new_query_p50_ms": warm_stats["p50_ms"], "warm_new_query_p99_ms": warm_stats["p99_ms"],
            "warm_beside_rebuild_p50_ms": beside_stats["p50_ms"], "warm_beside_rebuild_p99_ms": beside_stats["p99_ms"],
            "warm_beside_import_p50_ms": import_stats["p50_ms"], "warm_beside_import_p99_ms": import_stats["p99_ms"],
            "cold_users": len(measured), "cold_user_turns": round(sum(turns[1:]) / len(measured)),
            "cold_user_data": data, "cold_samples": len(cold)}


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


CALLERS = 8
GO_BUILD = ROOT / "clients" / "go" / "build.sh"
GO_LOADGEN = ROOT / "clients" / "go" / "build" / "bin" / "sidecar-loadgen"


def go_loadgen() -> Path | None:
    """The compiled load generator, built once (build.sh returns at once when nothing changed); None,
    with the reason on stderr, when the Go toolchain is missing or the build fails."""
    try:
        proc = subprocess.run(["bash", str(GO_BUILD)], capture_output=True, text=True, timeout=1200)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"load generator: python (building the Go one failed: {e})", file=sys.stderr)
        return None
    if proc.returncode == 3:  # build.sh's "a tool or package is missing"
        print(f"load generator: python ({proc.stderr.strip()})", file=sys.stderr)
        return None
    if proc.returncode != 0 or not os.access(GO_LOADGEN, os.X_OK):
        print(f"load generator: python (clients/go/build.sh failed, rc {proc.returncode}):\n{proc.stdout}\n"
              f"{proc.stderr}", file=sys.stderr)
        return None
    return GO_LOADGEN


def cpu_plan() -> tuple[str | None, str | None]:
    """(the server's CPU, the load generator's CPU) on a machine with 2+ cores, else (None, None)."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return None, None
    server = one_core()  # the last CPU, as the other benches' pinned sidecar
    return server, str(next(c for c in allowed if str(c) != server))


def go_throughput(loadgen: Path, server: ServerProcess, greq, seconds: float, client_cpu: str | None) -> dict:
    """CALLERS concurrent callers of the Go load generator for `seconds` (after 1 s of warm-up), and
    the CPU per call of either side in that window."""
    request = Path(tempfile.mkdtemp(prefix="sidecar-loadgen-")) / "request.bin"
    request.write_bytes(greq.SerializeToString())
    cmd = [str(loadgen), "-addr", server.address, "-method", "BuildContext", "-request", str(request),
           "-c", str(CALLERS), "-duration", f"{seconds}s", "-warmup", "1s", "-server-pid", str(server.proc.pid),
           "-decode=false"]  # the answer's bytes are received, not parsed: the client stays out of the figure
    pin = None
    if client_cpu is not None:
        if shutil.which("taskset"):
            cmd = ["taskset", "-c", client_cpu, *cmd]
        else:
            pin = lambda: os.sched_setaffinity(0, {int(client_cpu)})  # noqa: E731
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120, preexec_fn=pin)
    shutil.rmtree(request.parent, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the Go load generator failed (rc {proc.returncode}): {proc.stderr.strip()}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    if out["errors"]:
        print(f"load generator: {out['errors']} of {out['calls']} calls failed: {out['error_codes']} "
              f"(first: {out.get('first_error')})", file=sys.stderr)
    client_ms, server_ms = out["client_cpu_ms_per_call"], out["server_cpu_ms_per_call"]
    return {"rps": out["throughput_rps"], "client_cpu_ms": client_ms, "server_cpu_ms": server_ms,
            "cpu_bound_rps": round((os.cpu_count() or 1) * 1000 / max(client_ms + server_ms, 1e-6), 1),
            "p50_ms": out["p50_ms"], "p99_ms": out["p99_ms"], "errors": out["errors"]}


def grpc_figures(command: list[str], greq_of, n: int, seconds: float, loadgen: Path | None = None,
                 client_cpu: str | None = None) -> tuple[dict, dict, bytes]:
    """Latency of one client, and throughput of CALLERS concurrent callers (the Go load generator,
    or Python threads without it) with the CPU per call of either side, against a server subprocess."""
    server = ServerProcess(command=command)
    try:
        greq = greq_of(server.stub)
        stats = percentiles(time_calls(lambda: server.stub.BuildContext(greq), n))
        if loadgen is not None:
            load = go_throughput(loadgen, server, greq, seconds, client_cpu)
        else:
            def client(i: int):
                stub = server.new_stub()
                return lambda: stub.BuildContext(greq)

            load = throughput_cpu(client, CALLERS, seconds, server.proc.pid)
        return stats, load, server.stub.BuildContext(greq).SerializeToString()
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--db")
    parser.add_argument("--listen")
    parser.add_argument("--log-level")
    parser.add_argument("--metrics-port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--floor", help=argparse.SUPPRESS)
    parser.add_argument("--cpus", help=argparse.SUPPRESS)  # the server's CPUs, as `serve --cpus`
    parser.add_argument("--python-load", action="store_true",
                        help="measure throughput with Python client threads even when Go is installed")
    parser.add_argument("--cold-only", action="store_true", help="only the cold-user figures (cold_users)")
    args, _ = parser.parse_known_args()
    if args.cold_only:
        return emit(cold_users(args.quick))
    if (args.floor or args.serve) and args.cpus:
        from sidecar.cli import cpu_list, pin_to

        pin_to(cpu_list(args.cpus))
    if args.floor:
        return serve_floor(args.listen, args.floor)
    if args.serve:  # the server side of the gRPC measurement, with the synthetic source plugged in
        from sidecar.server import serve

        raise SystemExit(serve(args.db, listen=args.listen, uds=None, auth_token=None, app_factory=make_app,
                               metrics_port=args.metrics_port))

    n = 400 if args.quick else 3000
    seconds = 3.0 if args.quick else 10.0
    loadgen = None if args.python_load else go_loadgen()  # built before anything is measured

    # -- fastpath vs reference on the scenario's candidates
    app = make_app(tempfile.mkdtemp(prefix="sidecar-asm-") + "/a.duckdb")
    app.wait_warm_up(60.0)  # as `serve` does before it takes calls
    sid = populate_inproc(app)
    req = BuildRequest(session_id=sid, query=QUERY, system_rules=RULES, tools=TOOLS)
    synthetic = app.builder.sources[-1]
    from sidecar.assembly.candidates import BuildInput
    from sidecar.text import query_terms

    view = app.store.session_view(SCOPE, sid)
    inp = BuildInput(SCOPE, view, "", QUERY, frozenset(query_terms(QUERY)), None, (), req.budget, 0)
    batches = [b for src in app.builder.sources for b in src.candidates(inp)]
    arrays = scenario.feature_arrays(batches)
    cat_budget = __import__("numpy").array([6000, 4000, 2000, 6000], "int64")
    candidates = len(arrays["tokens"])

    def run(mod):
        return lambda: mod.select(arrays["relevance"], arrays["age_s"], arrays["priority"], arrays["tokens"],
                                  arrays["category"], arrays["exact_key"], arrays["simhash"], cat_budget, 20000,
                                  w_recency=0.5, half_life_s=7 * 86400.0)

    compiled_t = percentiles(time_calls(run(fastpath), 300 if args.quick else 2000))["p50_ms"]
    reference_t = percentiles(time_calls(run(fastpath.reference), 10 if args.quick else 50, warmup=2))["p50_ms"]

    # -- in process: the whole BuildContext including the response's bytes, as the server sends them
    def inproc():
        return convert.build_response_bytes(app.builder.build(SCOPE, req), 0)

    inproc_stats = percentiles(time_calls(inproc, n))
    resp = convert.build_response(app.builder.build(SCOPE, req), 0)
    baseline_stats = percentiles(time_calls(naive_baseline(app, sid, synthetic, req.budget.total),
                                            30 if args.quick else 200, warmup=3))
    app.close()

    # -- over gRPC against a sidecar subprocess, then the transport floor with its response bytes.
    # Throughput: the Go load generator on its own core, the server pinned to another, when Go is there.
    server_cpu, client_cpu = cpu_plan() if loadgen is not None else (None, None)
    pin = ["--cpus", server_cpu] if server_cpu is not None else []
    grpc_stats, load, answer = grpc_figures([sys.executable, __file__, "--serve", *pin],
                                           lambda stub: grpc_request(populate_grpc(stub)), n, seconds,
                                           loadgen, client_cpu)
    payload = Path(tempfile.mkdtemp(prefix="sidecar-floor-")) / "response.bin"
    payload.write_bytes(answer)
    floor_stats, floor_load, _ = grpc_figures([sys.executable, __file__, "--floor", str(payload), *pin],
                                             lambda stub: grpc_request("floor"), n, seconds, loadgen, client_cpu)

    cold = cold_users(args.quick)
    quality = round(fastpath_bench.greedy_vs_optimum(fastpath, random.Random(3), 60 if args.quick else 200), 4)
    figures = {
        "candidates": candidates,
        "selected_items": sum(len(s.items) for s in resp.sections),
        "dropped_items": len(resp.dropped),
        "fastpath_select_ms": compiled_t, "reference_select_ms": reference_t,
        "fastpath_speedup": round(reference_t / compiled_t, 1),
        "inproc_p50_ms": inproc_stats["p50_ms"], "inproc_p99_ms": inproc_stats["p99_ms"],
        "grpc_p50_ms": grpc_stats["p50_ms"], "grpc_p99_ms": grpc_stats["p99_ms"],
        "throughput_rps": load["rps"], "response_bytes": len(answer),
        "load_generator": "go" if loadgen is not None else "python", "load_callers": CALLERS,
        "server_cpus": server_cpu, "load_generator_cpus": client_cpu,
        "throughput_vs_floor": round(load["rps"] / floor_load["rps"], 3) if floor_load["rps"] else None,
        # The other ratios, computed here so a run is read against its targets at once.
        "grpc_p50_vs_floor": _ratio(grpc_stats["p50_ms"], floor_stats["p50_ms"]),
        "server_cpu_vs_floor": _ratio(load["server_cpu_ms"], floor_load["server_cpu_ms"]),
        "grpc_p99_vs_p50": _ratio(grpc_stats["p99_ms"], grpc_stats["p50_ms"]),
        "inproc_p99_vs_p50": _ratio(inproc_stats["p99_ms"], inproc_stats["p50_ms"]),
        # Latency under the load, as the Go load generator saw it (None with Python threads).
        "load_p50_ms": load.get("p50_ms"), "load_p99_ms": load.get("p99_ms"),
        "floor_load_p50_ms": floor_load.get("p50_ms"), "floor_load_p99_ms": floor_load.get("p99_ms"),
        # CPU per call under the 8-thread load, and the calls/s all cores could serve at that cost.
        "client_cpu_ms_per_call": load["client_cpu_ms"], "server_cpu_ms_per_call": load["server_cpu_ms"],
        "cpu_bound_rps": load["cpu_bound_rps"],
        "floor_grpc_p50_ms": floor_stats["p50_ms"], "floor_grpc_p99_ms": floor_stats["p99_ms"],
        "floor_throughput_rps": floor_load["rps"], "floor_client_cpu_ms_per_call": floor_load["client_cpu_ms"],
        "floor_server_cpu_ms_per_call": floor_load["server_cpu_ms"], "baseline_p50_ms": baseline_stats["p50_ms"],
        "baseline_vs_inproc": round(baseline_stats["p50_ms"] / inproc_stats["p50_ms"], 1),
        "greedy_vs_optimum": quality,
        **cold,
    }
    print(f"{candidates} candidates; fastpath {compiled_t} ms vs reference {reference_t} ms; in-process p50 "
          f"{figures['inproc_p50_ms']} ms; gRPC p50 {figures['grpc_p50_ms']} ms p99 {figures['grpc_p99_ms']} ms; "
          f"{load['rps']} calls/s with {CALLERS} {figures['load_generator']} callers"
          f"{f' (server on CPU {server_cpu}, load generator on CPU {client_cpu})' if server_cpu else ''}"
          f" (CPU per call: client {load['client_cpu_ms']} ms, server "
          f"{load['server_cpu_ms']} ms); transport floor (same {len(answer)} response bytes, no work) p50 "
          f"{floor_stats['p50_ms']} ms, {floor_load['rps']} calls/s (CPU per call: client "
          f"{floor_load['client_cpu_ms']} ms, server {floor_load['server_cpu_ms']} ms); sidecar/floor throughput "
          f"{figures['throughput_vs_floor']}; naive baseline p50 "
          f"{figures['baseline_p50_ms']} ms; a cold user's first question ({cold['cold_user_turns']} "
          f"{cold['cold_user_data']} turns) p50 {cold['cold_user_first_build_p50_ms']} ms p99 "
          f"{cold['cold_user_first_build_p99_ms']} ms, its first message p50 "
          f"{cold['cold_user_first_append_p50_ms']} ms, a warm user's new question p50 "
          f"{cold['warm_new_query_p50_ms']} ms")
    emit(figures)


if __name__ == "__main__":
    main()
