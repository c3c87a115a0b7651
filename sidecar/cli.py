"""Command line: `python -m sidecar serve [--config FILE] [--db PATH] [--listen HOST:PORT | --uds PATH] ...`
(every setting: sidecar/config.py), `python -m sidecar call RPC JSON` (sidecar/call.py), `migrate`, `demo`.

A problem the person starting the sidecar can fix (a taken port, a locked or unwritable database, an
unreachable store, a missing extra, half a TLS pair, a bad config file) is one line on stderr and exit
code 2. The server's modules are imported only by the commands that need them, so `call` starts fast."""

from __future__ import annotations

import argparse
import errno
import logging
import os
import re
import socket
import ssl
import sys
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import parse_qsl, urlsplit, urlunsplit

if TYPE_CHECKING:
    from sidecar.config import Config
    from sidecar.tracing import Tracing

STORE_CONNECT_TIMEOUT_S = 5  # the store is probed once before start-up; its pool would wait 30 s
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


class StartupError(Exception):
    """Something the person starting the sidecar can fix; printed as one line, exit code 2."""


def cpu_list(spec: str, source: str = "--cpus") -> set[int]:
    """"1" or "0,2-3" -> {0, 2, 3}; the CPUs must be ones this process may run on."""
    cpus: set[int] = set()
    try:
        for part in filter(None, (p.strip() for p in spec.split(","))):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise StartupError(f"{source} {spec!r}: expected CPU numbers such as 1 or 0,2-3") from None
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise StartupError(f"{source} {spec!r}: this process may run on CPUs {sorted(allowed)}")
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


def metrics_address(args: argparse.Namespace, config: Config | None = None) -> MetricsAt | None:
    """Where Prometheus metrics are served, or None (off). Of metrics.listen and metrics.port
    (127.0.0.1:PORT, kept for existing set-ups) the one given at the highest level wins: a flag beats the
    environment; at the same level listen wins. `config`: the one loaded from `args`, if at hand."""
    if config is None:
        from sidecar.config import load

        config = load(args)
    key = config.winner("metrics.listen", "metrics.port")
    source = config.where(key)
    if key == "metrics.port":
        return MetricsAt("127.0.0.1", config[key], source) if config[key] else None
    listen = config[key]
    if not listen:
        return None
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


def check_store(url: str) -> None:
    """A store URL that is not PostgreSQL, or a PostgreSQL that does not answer, stops start-up at
    once instead of a DuckDB file named like a URL or the pool's 30 s wait and traceback."""
    from sidecar.config import redact_url
    from sidecar.store import is_postgres

    if not is_postgres(url):
        if "://" in url:
            raise StartupError(f"--store {url.split('://')[0]}://...: --store takes a postgres:// or postgresql:// "
                               "URL; a DuckDB file goes in --db")
        return
    import psycopg

    try:
        shown = redact_url(url)
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
    from sidecar import config

    parser = argparse.ArgumentParser(prog="python -m sidecar", description="Context Sidecar")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve ContextService over gRPC",
                           description="Every setting below can also be given in a TOML config file "
                                       "(deploy/sidecar.example.toml lists them all). A flag beats its environment "
                                       "variable, which beats the config file, which beats the default.")
    serve.add_argument("--config", default=None, metavar="FILE",
                       help=f"TOML file with any of the settings (env {config.CONFIG_ENV})")
    serve.add_argument("--print-config", action="store_true",
                       help="print the configuration in force as TOML (secrets as ***) and exit")
    config.add_flags(serve)
    migrate = sub.add_parser("migrate", help="apply the versioned schema to a store and print its version")
    migrate.add_argument("--db", default="./data/sidecar.duckdb")
    migrate.add_argument("--store", default=os.environ.get("SIDECAR_STORE"))
    sub.add_parser("demo", help="run the OpsPilot demo against a running sidecar (demo --help)", add_help=False)
    sub.add_parser("call", help="call a ContextService RPC with JSON through server reflection (call --help)",
                   add_help=False)
    return parser


def _migrate(args: argparse.Namespace) -> int:
    from sidecar.config import redact_url
    from sidecar.store import open_backend

    url = args.store or args.db
    check_store(url)
    backend = open_backend(url)
    if hasattr(backend, "migrate"):
        backend.migrate()
    print(f"schema version {backend.schema_version()} at {redact_url(url)}")
    backend.close()
    return 0


def start_tracing(config: Config) -> Tracing | None:
    """The OpenTelemetry exporter when otel.enabled; the 'otel' extra is imported only then."""
    if not config["otel.enabled"]:
        return None
    try:
        from sidecar.tracing import Tracing
    except ImportError:
        raise StartupError(f"{config.said('otel.enabled')} needs the 'otel' extra: pip install -e '.[otel]'") from None
    try:
        return Tracing.exporting(config["otel.exporter"], config["otel.endpoint"], config["otel.service_name"])
    except ImportError:
        raise StartupError(f"{config.said('otel.exporter')} needs opentelemetry-exporter-otlp-proto-grpc (in the "
                           "'otel' extra): pip install -e '.[otel]'") from None


def _serve(args: argparse.Namespace, config: Config) -> int:
    from sidecar.app import Sidecar
    from sidecar.index.embedders import NEEDS, model_installed, needs_extra
    from sidecar.server import serve as run_server

    name = config["embedder.name"]
    if name in NEEDS and not model_installed(name):
        raise StartupError(f"{config.said('embedder.name')} {needs_extra(name)} (or use --embedder hash)")
    cpus = cpu_list(config["server.cpus"], config.where("server.cpus")) if config["server.cpus"] else None
    auth_token = config.auth_token()
    tls = tls_pair(config["tls.cert"] or None, config["tls.key"] or None)
    metrics_at = metrics_address(args, config)
    uds = config["server.uds"] if config.winner("server.uds", "server.listen") == "server.uds" else None
    listen = None if uds else config["server.listen"]
    if listen:
        where = config.where("server.listen")
        ensure_bindable(*host_port(listen, where), where)
    if metrics_at:
        ensure_bindable(*metrics_at)
    url = config["storage.store"] or config["storage.db"]
    check_store(url)
    tracing = start_tracing(config)
    if cpus:
        pin_to(cpus)
    config.export_environment()
    settings = config.settings()
    return run_server(url, listen=listen, uds=uds, auth_token=auth_token, tls=tls,
                      metrics_host=metrics_at.host if metrics_at else "127.0.0.1",
                      metrics_port=metrics_at.port if metrics_at else 0,
                      rate_per_tenant=config["server.rate_per_tenant"], app_factory=lambda db: Sidecar(db, settings),
                      tracing=tracing)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["call"]:  # a client: none of the server's modules, and their start-up time, are needed
        from sidecar.call import main as call_main

        return call_main(argv[1:])
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        from sidecar.demo import main as demo_main

        return demo_main(rest)
    if rest:
        parser.error("unrecognized arguments: " + " ".join(rest))

    from sidecar.config import ConfigError, load

    db = args.store or args.db if args.command == "migrate" else None  # what a failure message names
    try:
        if args.command == "migrate":
            logging.basicConfig(level="INFO", format=LOG_FORMAT)
            return _migrate(args)
        config = load(args)
        db = config["storage.store"] or config["storage.db"]
        if args.print_config:
            print(config.to_toml(), end="")
            return 0
        logging.basicConfig(level=config["server.log_level"], format=LOG_FORMAT)
        return _serve(args, config)
    except (StartupError, ConfigError) as e:
        problem: str | None = str(e)
    except Exception as e:
        problem = explain_startup_failure(e, db or "the database")
        if problem is None:
            raise
    print(f"context-sidecar: {problem}", file=sys.stderr)
    return 2
