"""PostgreSQL backend bench (issue #9): BuildContext over gRPC on PostgreSQL beside DuckDB, database
queries per BuildContext on each backend (the hot path must not query more on PostgreSQL), write
throughput, replica catch-up delay (write on A, read on B), and a returning user's first question on
PostgreSQL (~500 LongMemEval turns, in process): their recall index rebuilt from rows, as with no
snapshot directory, against restored from the replica's own (`--episodic-snapshots`), two replicas
of one schema asked in turn (`pg_cold_user_*`).

python bench/replicas.py [--quick]      (needs PostgreSQL on 127.0.0.1:5432, database test)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from assembly import evict, longmemeval_users, new_question, next_question, replay_users, synthetic_users
from harness import ServerProcess, emit, percentiles, throughput, time_calls

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar.api import context_service_pb2 as pb  # noqa: E402
from sidecar.app import Settings, Sidecar  # noqa: E402
from sidecar.assembly.builder import BuildRequest  # noqa: E402
from sidecar.domain import NewMessage, Role, Scope  # noqa: E402
from tests.pg import pg_admin, pg_create_schema, pg_drop_schema, pg_url  # noqa: E402

SCOPE = pb.Scope(tenant_id="bench", user_id="u")
TURNS = [("user" if i % 2 == 0 else "assistant", f"payment-api in production: step {i}, error rate and p99 checked")
         for i in range(200)]


def populate(stub) -> str:
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=SCOPE)).session_id
    stub.AppendMessages(pb.AppendMessagesRequest(scope=SCOPE, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER if r == "user" else pb.ROLE_ASSISTANT, text=t) for r, t in TURNS]))
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=SCOPE, session_id=sid, facts=[
        pb.FactInput(key="env", value="production", provenance=pb.PROVENANCE_USER_CONFIRMED)]))
    for i in range(20):
        stub.AddMemory(pb.AddMemoryRequest(scope=SCOPE, type=pb.MEMORY_TYPE_SEMANTIC,
                                           content=f"payment-api fact {i}: pool size is {10 + i}"))
    return sid


def queries_per_build(url: str, calls: int) -> float:
    """Backend calls made by BuildContext once the caches are warm (counted by wrapping the backend)."""
    app = Sidecar(url)
    try:
        counter = {"n": 0}
        backend = app.store.backend
        for name in dir(type(backend)):
            if name.startswith("_") or not callable(getattr(backend, name)):
                continue
            original = getattr(backend, name)

            def counted(*a, _f=original, **kw):
                counter["n"] += 1
                return _f(*a, **kw)

            setattr(backend, name, counted)
        scope = Scope("bench-q", "u")
        sid = app.sessions.create(scope, "", "", {}).session_id
        app.sessions.append(scope, sid, [NewMessage(role=Role.USER, text=t) for _, t in TURNS[:50]])
        req = BuildRequest(session_id=sid, query="what next for payment-api?")
        app.builder.build(scope, req)  # warm
        counter["n"] = 0
        for _ in range(calls):
            app.builder.build(scope, req)
        return counter["n"] / calls
    finally:
        app.close()


def catch_up_delays(a, b, trials: int) -> list[float]:
    out = []
    for i in range(trials):
        b.stub.SearchMemories(pb.SearchMemoriesRequest(scope=SCOPE, query="warm"))
        word = f"marker{i}x"
        t0 = time.perf_counter()
        a.stub.AddMemory(pb.AddMemoryRequest(scope=SCOPE, type=pb.MEMORY_TYPE_HABIT, content=f"checks {word} daily"))
        while not b.stub.SearchMemories(pb.SearchMemoriesRequest(scope=SCOPE, query=word)).hits:
            if time.perf_counter() - t0 > 10:
                raise RuntimeError("replica B did not catch up within 10 s")
            time.sleep(0.002)
        out.append(time.perf_counter() - t0)
    return out


def pg_cold_users(admin, quick: bool) -> dict:
    """A returning user's first question on PostgreSQL, rebuilt from rows and restored from a snapshot
    (see the module's docstring). The first round loads every user from rows on both replicas."""
    n_users, rounds = (3, 4) if quick else (8, 6)
    users = longmemeval_users(n_users) or synthetic_users(n_users)
    pool = list(dict.fromkeys(q for _, _, qs in users for q in qs))
    schema = pg_create_schema(admin, "bench_cold")
    snapshots = tempfile.mkdtemp(prefix="sidecar-snapshots-")
    try:
        writer = Sidecar(pg_url(schema))
        turns = replay_users(writer, users)
        writer.close()
        replicas = {"rows": Sidecar(pg_url(schema)),
                    "snapshot": Sidecar(pg_url(schema), Settings(episodic_snapshot_dir=snapshots))}
        for app in replicas.values():
            app.wait_warm_up(60.0)
        asked = {(name, uid): set() for name in replicas for uid, _, _ in users}
        spent: dict[str, list[float]] = {name: [] for name in replicas}
        for round_ in range(rounds):
            for uid, _, qs in users:
                for name, app in replicas.items():
                    evict(app, Scope("cold", uid))
                    took = new_question(app, uid, next_question(asked[name, uid], qs, pool))
                    if round_:
                        spent[name].append(took)
        for app in replicas.values():
            app.close()
    finally:
        pg_drop_schema(admin, schema)
    rows, restored = percentiles(spent["rows"]), percentiles(spent["snapshot"])
    return {"pg_cold_user_rows_p50_ms": rows["p50_ms"], "pg_cold_user_rows_p99_ms": rows["p99_ms"],
            "pg_cold_user_snapshot_p50_ms": restored["p50_ms"], "pg_cold_user_snapshot_p99_ms": restored["p99_ms"],
            "pg_cold_user_snapshot_vs_rows": round(restored["p50_ms"] / rows["p50_ms"], 3),
            "pg_cold_user_turns": round(sum(turns) / len(turns)), "pg_cold_samples": len(spent["rows"])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, seconds, trials = (300, 3.0, 20) if args.quick else (2000, 10.0, 100)
    admin = pg_admin()
    schema = pg_create_schema(admin, "bench_replicas")
    url = pg_url(schema)
    figures: dict = {}
    try:
        for name, extra in (("duckdb", []), ("postgres", ["--store", url])):
            server = ServerProcess(extra=extra)
            try:
                sid = populate(server.stub)
                req = pb.BuildContextRequest(scope=SCOPE, session_id=sid, query="what next for payment-api?")
                stats = percentiles(time_calls(lambda: server.stub.BuildContext(req), n))  # noqa: B023
                figures[f"{name}_build_p50_ms"], figures[f"{name}_build_p99_ms"] = stats["p50_ms"], stats["p99_ms"]

                def writer(i: int, server=server):
                    stub = server.new_stub()
                    s = pb.Scope(tenant_id="bench", user_id=f"w{i}")
                    wsid = stub.CreateSession(pb.CreateSessionRequest(scope=s)).session_id
                    msg = pb.AppendMessagesRequest(scope=s, session_id=wsid, messages=[
                        pb.NewMessage(role=pb.ROLE_USER, text="write throughput probe")])
                    return lambda: stub.AppendMessages(msg)

                figures[f"{name}_append_rps_4_threads"] = throughput(writer, 4, seconds)
            finally:
                server.stop()
        tmp = tempfile.mkdtemp(prefix="sidecar-q-")
        figures["duckdb_queries_per_build"] = queries_per_build(f"{tmp}/q.duckdb", 50)
        figures["postgres_queries_per_build"] = queries_per_build(url, 50)

        a, b = ServerProcess(extra=["--store", url]), ServerProcess(extra=["--store", url])
        try:
            delays = catch_up_delays(a, b, trials)
        finally:
            a.stop()
            b.stop()
        figures["catch_up_p50_ms"] = round(statistics.median(delays) * 1000, 1)
        figures["catch_up_max_ms"] = round(max(delays) * 1000, 1)
        figures["catch_up_trials"] = trials
        figures.update(pg_cold_users(admin, args.quick))
    finally:
        pg_drop_schema(admin, schema)
        admin.close()
    print(f"BuildContext p50 duckdb {figures['duckdb_build_p50_ms']} ms, postgres {figures['postgres_build_p50_ms']} ms; "
          f"queries per build {figures['duckdb_queries_per_build']} vs {figures['postgres_queries_per_build']}; "
          f"catch-up p50 {figures['catch_up_p50_ms']} ms max {figures['catch_up_max_ms']} ms; a returning user's "
          f"first question ({figures['pg_cold_user_turns']} turns) p50 {figures['pg_cold_user_rows_p50_ms']} ms "
          f"from rows, {figures['pg_cold_user_snapshot_p50_ms']} ms from a snapshot")
    emit(figures)


if __name__ == "__main__":
    main()
