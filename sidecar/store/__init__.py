"""Storage: the Store protocol, the DuckDB backend and the in-process cache in front of it."""

from sidecar.store.base import Store
from sidecar.store.cache import CachingStore
from sidecar.store.duckdb_store import DuckDBStore


def open_store(path: str) -> CachingStore:
    """Open the default embedded backend with its hot-read cache."""
    return CachingStore(DuckDBStore(path))


__all__ = ["Store", "CachingStore", "DuckDBStore", "open_store"]
