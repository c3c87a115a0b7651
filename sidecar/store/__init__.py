"""Storage: the Store protocol, the DuckDB and PostgreSQL backends and the in-process cache."""

from __future__ import annotations

from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from sidecar.store.base import Store
from sidecar.store.cache import MAX_CACHED_VIEW_MESSAGES, CachingStore
from sidecar.store.duckdb_store import DEFAULT_MEMORY_LIMIT, DuckDBStore

POSTGRES_SCHEMES = ("postgres://", "postgresql://")


def is_postgres(url: str) -> bool:
    return url.startswith(POSTGRES_SCHEMES)


def open_backend(url: str, *, duckdb_memory: str = DEFAULT_MEMORY_LIMIT):
    """A DuckDB file path (its buffer pool capped at `duckdb_memory`), or a postgres:// URL (an
    optional `schema=` query parameter picks the schema; the rest goes to libpq)."""
    if not is_postgres(url):
        return DuckDBStore(url, memory_limit=duckdb_memory)
    from sidecar.store.postgres_store import PostgresStore

    parts = urlsplit(url)
    query = parse_qsl(parts.query)
    schema = next((v for k, v in query if k == "schema"), "public")
    dsn = urlunsplit(parts._replace(query=urlencode([(k, v) for k, v in query if k != "schema"])))
    return PostgresStore(dsn, schema=schema)


def open_store(url: str, *, cache_messages: int = MAX_CACHED_VIEW_MESSAGES,
               duckdb_memory: str = DEFAULT_MEMORY_LIMIT) -> CachingStore:
    """The backend for `url` with the hot-read cache (at most `cache_messages` messages) in front of it."""
    return CachingStore(open_backend(url, duckdb_memory=duckdb_memory), max_view_messages=cache_messages)


__all__ = ["Store", "CachingStore", "DuckDBStore", "open_backend", "open_store", "is_postgres"]
