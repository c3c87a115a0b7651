"""Where users' indexes are saved (beside a DuckDB file, or in a directory given), which saved files
are current after a start, each user's file name and the file's format (pack / unpack). What a
snapshot holds is _UserIndex.freeze / restore (index.py); when one is written, read or deleted is
EpisodicSource's (source.py)."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import mmap
import pickle
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger("sidecar.episodic")

SNAPSHOT_VERSION = 7  # 7: 我 / 你 in a turn's voice; 6: "don’t" is "don't"; 5: words of every script
SAVE_AT_CLOSE_S = 10.0  # at close, users' indexes are saved for at most this long (the rest rebuild from rows)
MAX_SNAPSHOT_BYTES = 1 << 30  # users' saved indexes over all users (~1.5 MB for 500 long turns)
CLEAN_MARK = "CLEAN"  # written at close once every saved snapshot is current


def backend_of(store):
    """The database store beneath the app's caching store (or the store itself)."""
    return getattr(store, "backend", store)


def snapshot_dir(store, configured: str = "") -> Path | None:
    """Where users' indexes are saved: `configured` if given, else beside a DuckDB file. None for an
    in-memory database and for a shared PostgreSQL store given no directory of the replica's own."""
    if configured:
        return Path(configured)
    path = getattr(backend_of(store), "path", None)
    if not isinstance(path, str) or not path or path == ":memory:":
        return None
    return Path(path).with_suffix(".episodic")


def store_identity(store) -> str:
    """Which database the snapshots were saved from: a DuckDB file's path, a PostgreSQL change log's
    identity. Snapshots saved from another are not restored."""
    backend = backend_of(store)
    identity = getattr(backend, "identity", None)
    if callable(identity):
        return str(identity())
    path = getattr(backend, "path", "")
    return f"duckdb:{Path(path).resolve()}" if isinstance(path, str) and path else ""


# On a PostgreSQL store other replicas change users' rows. While this one runs, its change feed
# deletes what they change (EpisodicSource.forget); across a stop, the clean mark holds the feed's
# position and every user changed after it loses their snapshot at the next start.
ChangedSince = Callable[[int], tuple[set[tuple[str, str]], int]]


LOCK_FILE = ".lock"  # held (flock) by the one process using the directory, for as long as it runs


@dataclass(frozen=True, slots=True)
class OpenedSnapshots:
    directory: Path | None  # None where it cannot be used
    current: OrderedDict[str, int]  # the snapshots that are current, oldest saved first, with their sizes
    feed_from: int | None  # with changed_since: the change seq the replica's feed must start after
    lock: IO[bytes] | None = None  # the open lock file: closing it lets the directory go


def _open_snapshots(directory: Path | None, identity: str = "",
                    changed_since: ChangedSince | None = None) -> OpenedSnapshots:
    """The snapshots a clean close of a process on the same database left current. After a crash
    (no mark), or from another database, none is trusted: all are deleted. The mark goes at once:
    it is written again only by the next clean close."""
    if directory is None:
        return OpenedSnapshots(None, OrderedDict(), None)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        lock = _lock(directory)
        if lock is None:
            log.warning("episodic snapshots: %s is in use by another process; this one keeps none (give each "
                        "its own directory)", directory)
            return OpenedSnapshots(None, OrderedDict(), None)
        mark = directory / CLEAN_MARK
        saved = _read_mark(mark)
        mark.unlink(missing_ok=True)
        clean = saved is not None and saved.get("store") == identity
        stale: set[str] = set()
        feed_from = None
        if changed_since is not None:
            seq = saved.get("change_seq") if clean and saved else None
            clean = isinstance(seq, int)
            if clean:
                try:
                    users, feed_from = changed_since(seq)
                except Exception:
                    log.exception("episodic snapshots: the changes since the last stop are unknown; none kept")
                    users, feed_from = set(), -1
                clean = feed_from >= seq  # a log behind the mark is not the one the mark saw
                stale = {_snapshot_name(user) for user in users}
        kept = []
        for path in directory.iterdir():
            if clean and path.suffix == ".snap" and path.name not in stale:
                stat = path.stat()
                kept.append((stat.st_mtime_ns, path.name, stat.st_size))
            elif path.is_file() and path.name != LOCK_FILE:
                path.unlink(missing_ok=True)
        return OpenedSnapshots(directory, OrderedDict((name, size) for _, name, size in sorted(kept)),
                               feed_from if clean else None, lock)
    except OSError:
        log.exception("episodic snapshots unavailable in %s", directory)
        return OpenedSnapshots(None, OrderedDict(), None)


def _lock(directory: Path) -> IO[bytes] | None:
    """The directory's lock file, opened and locked; None when another process holds it (two processes
    sharing one directory would restore each other's snapshots, which neither's changes delete)."""
    f = (directory / LOCK_FILE).open("ab")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        return None
    return f


def _read_mark(mark: Path) -> dict | None:
    try:
        saved = json.loads(mark.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return saved if isinstance(saved, dict) else None


def write_mark(directory: Path, identity: str, change_seq: int | None) -> None:
    """Every saved snapshot is current: for the store `identity`, as of `change_seq` on PostgreSQL."""
    (directory / CLEAN_MARK).write_text(json.dumps({"store": identity, "change_seq": change_seq}), encoding="utf-8")


# A snapshot file: MAGIC, then the lengths (u64 little-endian) of the head and of each buffer, the
# head (a pickle whose arrays travel out of band, protocol 5) and the buffers, each at an offset that
# is a multiple of ALIGN. Restored, the arrays are views of the mapped file: nothing is copied, and
# only the pages a query reads are faulted in (from the page cache).
MAGIC = b"EPISODIC" + SNAPSHOT_VERSION.to_bytes(4, "little")
ALIGN = 64


def pack(state: object) -> bytes:
    """`state` as a snapshot file's bytes (read back by unpack)."""
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(state, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    lengths = [len(head), *(r.nbytes for r in raws)]
    parts = [MAGIC, len(raws).to_bytes(8, "little"), *(n.to_bytes(8, "little") for n in lengths), head]
    at = sum(map(len, parts))
    for raw in raws:
        pad = -at % ALIGN
        parts += [bytes(pad), raw]
        at += pad + raw.nbytes
    return b"".join(parts)


def unpack(data: bytes | memoryview | mmap.mmap) -> object | None:
    """What pack() packed, its arrays views of `data` (read-only where `data` is); None for a file of
    another format (an older version's)."""
    view = memoryview(data)
    if view[:len(MAGIC)] != MAGIC:
        return None
    at = len(MAGIC)
    count = int.from_bytes(view[at:at + 8], "little")
    if at + 8 * (count + 2) > len(view):
        raise ValueError("episodic snapshot truncated")
    lengths = [int.from_bytes(view[at + 8 * k:at + 8 * k + 8], "little") for k in range(1, count + 2)]
    at += 8 * (count + 2)
    head = view[at:at + lengths[0]]
    at += lengths[0]
    buffers = []
    for n in lengths[1:]:
        at += -at % ALIGN
        if at + n > len(view):
            raise ValueError("episodic snapshot truncated")
        buffers.append(view[at:at + n])
        at += n
    return pickle.loads(head, buffers=buffers)  # noqa: S301  # written by this process's pack(), in its own directory


def map_snapshot(path: Path) -> mmap.mmap:
    """The file mapped read-only. Snapshots are never written in place (a new one replaces the file, a
    stale one is unlinked), so a mapping stays what was saved for as long as the index it backs lives
    (an unlinked file's blocks are freed with that index: at most max_users of them)."""
    with path.open("rb") as f:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def _snapshot_name(key: tuple[str, str]) -> str:
    return hashlib.sha256("\0".join(key).encode()).hexdigest()[:40] + ".snap"
