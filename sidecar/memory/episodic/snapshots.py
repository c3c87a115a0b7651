"""Where users' indexes are saved (beside a DuckDB file), which saved files are current after a
start, and each user's file name. What a snapshot holds is _UserIndex.freeze / restore (index.py);
when one is written, read or deleted is EpisodicSource's (source.py)."""

from __future__ import annotations

import hashlib
import logging
import os
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger("sidecar.episodic")

SNAPSHOT_VERSION = 2
SAVE_AT_CLOSE_S = 10.0  # at close, users' indexes are saved for at most this long (the rest rebuild from rows)
MAX_SNAPSHOT_BYTES = 1 << 30  # users' saved indexes over all users (~1.5 MB for 500 long turns)
CLEAN_MARK = "CLEAN"  # written at close once every saved snapshot is current
REUSED_READ_BYTES = 16 << 20  # a snapshot up to this size is read into a buffer kept for the next read


def snapshot_dir(store) -> Path | None:
    """Where users' indexes are saved: beside a DuckDB file. None for an in-memory database and a
    shared PostgreSQL store (another replica may change a user's rows: each rebuilds from rows)."""
    path = getattr(getattr(store, "backend", store), "path", None)
    if not isinstance(path, str) or not path or path == ":memory:":
        return None
    return Path(path).with_suffix(".episodic")


def _open_snapshots(directory: Path | None) -> tuple[Path | None, OrderedDict[str, int]]:
    """(the directory, or None where it cannot be used; the snapshots a clean close left current, oldest
    saved first, with their sizes). After a crash (no mark) none is trusted: all are deleted. The mark
    goes at once: it is written again only by the next clean close."""
    if directory is None:
        return None, OrderedDict()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        mark = directory / CLEAN_MARK
        clean = mark.exists()
        mark.unlink(missing_ok=True)
        kept = []
        for path in directory.iterdir():
            if clean and path.suffix == ".snap":
                stat = path.stat()
                kept.append((stat.st_mtime_ns, path.name, stat.st_size))
            elif path.is_file():
                path.unlink(missing_ok=True)
        return directory, OrderedDict((name, size) for _, name, size in sorted(kept))
    except OSError:
        log.exception("episodic snapshots unavailable in %s", directory)
        return None, OrderedDict()


class _ReadBuffer:
    """One buffer snapshots are read into, kept for the next read (used under EpisodicSource's lock):
    a fresh one per read would fault in every page of every snapshot.
    _UserIndex.restore copies what it keeps out of it."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def read(self, path: Path) -> memoryview | bytes:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > REUSED_READ_BYTES:
                return f.read()
            if len(self._buf) < size:
                self._buf = bytearray(size)  # replaced, not resized: an earlier view may still exist
            view = memoryview(self._buf)[:size]
            return view[:f.readinto(view)]


def _snapshot_name(key: tuple[str, str]) -> str:
    return hashlib.sha256("\0".join(key).encode()).hexdigest()[:40] + ".snap"
