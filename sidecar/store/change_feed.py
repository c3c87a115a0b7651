"""Change feed for replicas: follow the PostgreSQL change_log from another process.

Every write that changes what a replica may have cached (messages, facts, memories, deletes,
ForgetUser, a session closing) appends rows to change_log in its own transaction and calls
pg_notify('sidecar_changes', seq::text). ChangeFeed runs a background thread with its own
connection that LISTENs on that channel and, on every notification -- and at least every
`poll_interval_ms` even without one -- reads `changes_since(cursor)` and hands the batch to a
callback. The notification is only a wake-up hint: the cursor is the monotonic change_log.seq, so
a missed or coalesced notification (or one from another schema sharing the channel) costs at
most one poll interval, never a lost change.

Ordering guarantee: PostgresStore takes one transaction-level advisory lock per schema just
before it draws change_log seq numbers and holds it to commit, so seq order is commit order and
a reader never sees seq N+1 before N becomes visible (a gap left by a rolled-back transaction
never fills). A cursor of "the last seq seen" is therefore safe.

Delivery is at-least-once: if the callback raises, the cursor stays and the batch is retried
after one poll interval.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import psycopg

if TYPE_CHECKING:
    from sidecar.store.postgres_store import PostgresStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Change:
    """One row of change_log. `key` by kind -- the session id: 'message' (with any pinned
    constraints), 'facts', 'session' (closed), 'tool_result', 'run_notes', 'summary', 'subsession'
    (a child's result was added to this parent); the memory id: 'memory' (put), 'memory_delete';
    the document id: 'kb_document' (tenant-wide, user_id ''); '' for 'kb_edges' (tenant-wide) and
    'forget' (every row of the user is gone, earlier changes of the user are purged)."""

    seq: int
    tenant_id: str
    user_id: str
    kind: str
    key: str
    at_ms: int
    origin: str = ""  # the writing process (PostgresStore.origin)


class ChangeFeed:
    """Calls `callback(list[Change])` for every change after `since` (default: the current end of
    the log, i.e. only changes made after start()). Start with start(), stop with close()."""

    def __init__(self, store: PostgresStore, callback: Callable[[list[Change]], None], *,
                 since: int | None = None, poll_interval_ms: int = 500, batch: int = 1000,
                 listen: bool = True) -> None:
        from sidecar.store.pg_schema import NOTIFY_CHANNEL

        self.store = store
        self.callback = callback
        self.poll_interval_ms = poll_interval_ms
        self.batch = batch
        self.listen = listen  # False: poll only (tests, or a pooler that drops LISTEN)
        self.channel = NOTIFY_CHANNEL
        self._wake_channel = f"sidecar_feed_{uuid.uuid4().hex}"  # close() notifies it to end the wait
        self.cursor = store.current_change_seq() if since is None else since
        self.notifications = 0  # notifications received, for tests and metrics
        self.polls = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conn: psycopg.Connection | None = None
        self.listening = threading.Event()  # set once LISTEN is active on the connection

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ChangeFeed:
        self._thread = threading.Thread(target=self._run, name="sidecar-change-feed", daemon=True)
        self._thread.start()
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (woken through its private channel, else within one poll interval)."""
        self._stop.set()
        if self.listening.is_set():
            try:
                with self.store._pool.connection() as conn:
                    conn.execute("SELECT pg_notify(%s, 'stop')", [self._wake_channel])
            except Exception:  # noqa: BLE001 - the poll timeout still ends the wait
                pass
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> ChangeFeed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ loop
    def _connect(self) -> psycopg.Connection | None:
        if not self.listen:
            return None
        conn = psycopg.connect(self.store.dsn, autocommit=True)
        conn.execute(f"LISTEN {self.channel}")
        conn.execute(f"LISTEN {self._wake_channel}")
        self.listening.set()
        return conn

    def drain(self) -> int:
        """Deliver everything after the cursor now; returns how many changes were delivered."""
        delivered = 0
        while not self._stop.is_set():
            changes = self.store.changes_since(self.cursor, limit=self.batch)
            self.polls += 1
            if not changes:
                break
            self.callback(changes)
            self.cursor = changes[-1].seq
            delivered += len(changes)
            if len(changes) < self.batch:
                break
        return delivered

    def _run(self) -> None:
        backoff = 0.1
        while not self._stop.is_set():
            try:
                self._conn = self._connect()
                backoff = 0.1
                while not self._stop.is_set():
                    self.drain()
                    self._wait()
            except Exception:  # noqa: BLE001 - keep following; reconnect after a pause
                if self._stop.is_set():
                    break
                log.exception("change feed: error, retrying in %.1fs", backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
            finally:
                self.listening.clear()
                conn, self._conn = self._conn, None
                if conn is not None:
                    try:
                        conn.close()
                    except Exception:  # noqa: BLE001
                        pass

    def _wait(self) -> None:
        """Return on a notification that may carry news, or after one poll interval."""
        timeout = self.poll_interval_ms / 1000
        if self._conn is None:
            self._stop.wait(timeout)
            return
        deadline = time.monotonic() + timeout
        while not self._stop.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for note in self._conn.notifies(timeout=remaining, stop_after=1):
                if note.channel == self._wake_channel:
                    return
                self.notifications += 1
                # A payload at or below the cursor was already delivered: keep waiting. One from
                # another schema on the same channel may wake us needlessly; that costs one read.
                if not note.payload.isdigit() or int(note.payload) > self.cursor:
                    return
