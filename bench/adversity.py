"""Adversity bench: the long versions of tests/adversity (same harness, bigger numbers).

python bench/adversity.py [--quick] [--crash-cycles N] [--fuzz-requests N] [--isolation-queries N]
                          [--soak-seconds S] [--soak-rate R] [--postgres] [--canary-secrets N]
                          [--soak-serve-args ARGS] [--only crash fuzz isolation forget soak canaries]

--quick (under a minute): 1 crash cycle, 300 fuzzed requests, 300 isolation queries, 100 canary
secrets and 20 deletions, a 6 s soak. Default: 20 cycles, 100,000 requests, 10,000 queries, a 2-minute soak. The last line printed
is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.adversity.canaries import canaries_on  # noqa: E402
from tests.adversity.harness import (  # noqa: E402
    CrashLoop,
    Fuzzer,
    IsolationWorld,
    Server,
    duckdb_sql,
    forget_residue,
    postgres_sql,
    raw_garbage,
    raw_protobuf_garbage,
    serve_supports_store,
    soak,
)
from tests.conftest import Running  # noqa: E402


def log(*args) -> None:
    print(*args, file=sys.stderr, flush=True)


def isolation_postgres(tmp: Path, queries: int) -> dict:
    if not serve_supports_store():
        return {"isolation_pg": "skipped: serve has no --store"}
    try:
        import psycopg

        from tests.pg import PG_DSN, pg_create_schema, pg_drop_schema, pg_url
        admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=3)
    except Exception as e:  # noqa: BLE001
        return {"isolation_pg": f"skipped: {str(e).strip()[:120]}"}
    schema = pg_create_schema(admin, "b_adv_iso")
    server = Server(str(tmp / "unused.duckdb"), extra=["--store", pg_url(schema)])
    try:
        world = IsolationWorld(server.new_stub(), prefix="pgiso")
        world.seed()
        world.load_truth(postgres_sql(admin, schema))
        r = world.sweep(queries)
        return {"isolation_pg_queries": r["isolation_queries"], "isolation_pg_leaks": r["isolation_leaks"],
                "isolation_pg_leak_examples": r["isolation_leak_examples"][:3]}
    finally:
        server.stop()
        pg_drop_schema(admin, schema)
        admin.close()


def crash_part(tmp: Path, cycles: int) -> dict:
    t = time.monotonic()
    crash = CrashLoop(str(tmp / "crash.duckdb"), seed=7, up_s=(0.5, 1.5), early_kill_p=0.2, log=log).run(cycles)
    out = {k: crash.get(k, 0) for k in ("crash_cycles", "acked_writes", "found_writes", "lost_writes",
                                        "duplicate_writes", "torn_batches", "memory_index_misses",
                                        "kb_index_misses", "jobs_unfinished", "jobs_failed",
                                        "retried_batches", "early_kills")}
    out["crash_problems"] = crash["problems"][:5]
    out["crash_seconds"] = round(time.monotonic() - t, 1)
    log("crash", {k: out[k] for k in ("crash_cycles", "acked_writes", "lost_writes")})
    return out


def fuzz_part(tmp: Path, requests: int, quick: bool) -> dict:
    """Fuzzed requests for every RPC, then garbage on the port."""
    t = time.monotonic()
    out: dict[str, object] = {}
    server = Server(str(tmp / "fuzz.duckdb"))
    try:
        f = Fuzzer(server, seed=11)
        f.every_rpc_once()
        f.run_hypothesis(requests, per_example=10)
        out.update(f.report())
        out.update(raw_garbage(server.address, random.Random(1), rounds=4 if quick else 40))
        pg = raw_protobuf_garbage(server.address, random.Random(2), per_method=2 if quick else 20)
        out.update({k: v for k, v in pg.items() if k != "protobuf_garbage_examples"})
        alive = server.alive() and server.healthy()
        out["fuzz_crashes"] = 0 if alive else 1
        out["fuzz_logged_internal_errors"] = len(server.internal_logs)
        out["fuzz_internal_logs"] = server.internal_logs[:3]  # with the server's traceback
    finally:
        server.stop()
    out["fuzz_seconds"] = round(time.monotonic() - t, 1)
    log("fuzz", {k: out[k] for k in ("fuzz_requests", "fuzz_crashes", "fuzz_internal")})
    return out


def isolation_part(tmp: Path, queries: int, postgres: bool) -> dict:
    """The sweep on DuckDB; on PostgreSQL too with --postgres."""
    t = time.monotonic()
    running = Running(str(tmp / "iso.duckdb"))
    try:
        world = IsolationWorld(running.stub)
        world.seed()
        world.load_truth(duckdb_sql(running.app))
        r = world.sweep(queries)
    finally:
        running.stop()
    out: dict[str, object] = {k: r[k] for k in ("isolation_queries", "isolation_leaks", "isolation_unknown_tags")}
    out["isolation_items_checked"] = r["isolation_counts"].get("items_checked", 0)
    out["isolation_leak_examples"] = r["isolation_leak_examples"][:3]
    if postgres:
        out.update(isolation_postgres(tmp, queries))
    out["isolation_seconds"] = round(time.monotonic() - t, 1)
    log("isolation", {k: out[k] for k in ("isolation_queries", "isolation_leaks")})
    return out


def forget_part(tmp: Path) -> dict:
    r = forget_residue(Running(str(tmp / "forget.duckdb")))
    out = {k: r[k] for k in ("forget_residue", "forget_other_users_changed", "forget_db_file_mentions")}
    out["forget_residue_examples"] = r["forget_residue_examples"][:3]
    return out


def soak_part(tmp: Path, seconds: float, rate: float, bounds: list[str]) -> dict:
    server = Server(str(tmp / "soak.duckdb"), extra=bounds)
    try:
        r = soak(server, seconds, rate=rate)
    finally:
        server.stop()
    log("soak", {k: r[k] for k in ("soak_rss_start_mb", "soak_rss_end_mb", "soak_p99_first_ms", "soak_p99_last_ms")})
    # A failed call is a finding: its status line and the server's traceback go into the figures.
    return {**r, "soak_internal_logs": server.internal_logs[:3]}


def canaries_part(tmp: Path, secrets: int, items: int, postgres: bool) -> dict:
    """Secret and forget canaries on DuckDB (and PostgreSQL with --postgres): leaks and INTERNAL
    answers summed over the backends, each backend's figures beside them."""
    out: dict[str, object] = {"secret_leaks": 0, "forget_leaks": 0, "internal_errors": 0}
    for backend in ("duckdb", "postgres") if postgres else ("duckdb",):
        r = canaries_on(backend, tmp, secrets=secrets, items=items, seed=17)
        out[f"canaries_{backend}"] = r
        out["secret_leaks"] += r["secret_leaks"] + r["secret_in_own_session"] + r["secret_table_hits"] + \
            r["secret_log_hits"] + r["secret_metric_hits"]
        out["forget_leaks"] += r["forget_leaks"]
        out["internal_errors"] += r["internal_errors"]
        log("canaries", backend, {k: r[k] for k in ("secret_canaries", "secret_leaks", "forget_leaks")})
    return out


PARTS = ("crash", "fuzz", "isolation", "forget", "soak", "canaries")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small numbers, under a minute")
    p.add_argument("--crash-cycles", type=int)
    p.add_argument("--fuzz-requests", type=int)
    p.add_argument("--isolation-queries", type=int)
    p.add_argument("--soak-seconds", type=float)
    p.add_argument("--soak-rate", type=float, default=40.0)
    p.add_argument("--canary-secrets", type=int, help="secrets written by the canaries part (default 1000)")
    p.add_argument("--postgres", action="store_true",
                   help="also sweep isolation and run the canaries on PostgreSQL (--store)")
    p.add_argument("--soak-serve-args", default="", metavar="ARGS",
                   help="serve options for the soak's sidecar, e.g. '--cache-messages 2000 --episodic-turns 2000 "
                        "--duckdb-memory 64MB' (small caches fill early, so the RSS must level off)")
    p.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS),
                   help="run only these parts (the JSON then holds only their keys)")
    a = p.parse_args()
    out: dict[str, object] = {"bench": "adversity", "quick": a.quick, "parts": a.only, "soak_serve_args": a.soak_serve_args}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="adversity-") as d:
        tmp = Path(d)
        runs = {
            "crash": lambda: crash_part(tmp, a.crash_cycles or (1 if a.quick else 20)),
            "fuzz": lambda: fuzz_part(tmp, a.fuzz_requests or (300 if a.quick else 100_000), a.quick),
            "isolation": lambda: isolation_part(tmp, a.isolation_queries or (300 if a.quick else 10_000), a.postgres),
            "forget": lambda: forget_part(tmp),
            "canaries": lambda: canaries_part(tmp, a.canary_secrets or (100 if a.quick else 1000),
                                              20 if a.quick else 200, a.postgres),
            "soak": lambda: soak_part(tmp, a.soak_seconds or (6.0 if a.quick else 120.0), a.soak_rate,
                                    shlex.split(a.soak_serve_args)),
        }
        for part in PARTS:
            if part in a.only:
                out.update(runs[part]())
    out["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(out, sort_keys=True, default=str))


if __name__ == "__main__":
    main()
