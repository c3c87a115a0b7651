"""PostgreSQL backend: a shared database that several sidecar replicas may use at once.

Same tables, columns and method semantics as DuckDBStore (the reference backend), with what
sharing needs:

* Every call runs in one transaction on a pooled connection (psycopg 3 + psycopg_pool). A write
  method's transaction has committed when it returns.
* Row-level security (see pg_schema): each transaction that touches user data first runs
  set_config('sidecar.tenant_id' / 'sidecar.user_id', <scope>, true), so the database itself
  limits every statement to the caller's rows; the explicit WHERE clauses stay as a second
  fence. Only claim_job, finish_job, requeue_running_jobs, the change-feed reads and migrations
  set 'sidecar.system' = 'on', the policy's bypass for work across users. RLS is not applied to
  superusers or BYPASSRLS roles: run the sidecar as an ordinary role (`rls_enforced` says
  whether the connecting role is subject to it).
* No process-local state: message sequence numbers are drawn inside the transaction under a
  transaction-level advisory lock keyed by (schema, tenant, user, session), so concurrent
  appenders in any number of processes serialise per session (also when the session row does not
  exist, which DuckDBStore allows too); memory history order comes from a database sequence; jobs
  are claimed with FOR UPDATE SKIP LOCKED.
* change_log + pg_notify('sidecar_changes', seq) in the writing transaction, for replicas
  (ChangeFeed in change_feed.py). Seq numbers are drawn under one advisory lock per schema held
  to commit, so seq order is commit order and "last seq seen" is a safe cursor. pg_notify already
  serialises the commits of notifying transactions database-wide, so this lock costs little more.
* Upserts use INSERT ... ON CONFLICT DO UPDATE rather than DuckDB's DELETE + INSERT, which under
  READ COMMITTED can fail with a unique violation when two replicas write the same key at once.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import ConnectionPool

from sidecar.domain import (
    DocumentVersion,
    Fact,
    FactChange,
    GraphEdge,
    Job,
    JobStatus,
    KnowledgeChunk,
    Memory,
    MemoryChange,
    MemoryStatus,
    Message,
    NewMessage,
    PinnedConstraint,
    Run,
    RunCheckpoint,
    RunNote,
    Scope,
    Session,
    SessionStatus,
    SessionSummary,
    SubSessionResult,
    ToolResult,
)
from sidecar.errors import AlreadyExists
from sidecar.store import records
from sidecar.store.change_feed import Change
from sidecar.store.pg_schema import MIGRATIONS, NOTIFY_CHANNEL, USER_TABLES

log = logging.getLogger(__name__)

_MEMORY_HISTORY_COLS = ("tenant_id, user_id, memory_id, at_ms, action, reason, type, content, subject, "
                        "source_message_ids, confidence, authority, expires_at_ms, status, superseded_by")


_SET_SCOPE = "SELECT set_config('sidecar.tenant_id', %s, true), set_config('sidecar.user_id', %s, true)"
_SET_SYSTEM = "SELECT set_config('sidecar.system', 'on', true)"

_SCHEMA_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


def _lock_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key for the parts (collisions only cost extra waiting)."""
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PostgresStore:
    def __init__(self, dsn: str, *, schema: str = "public", min_size: int = 1, max_size: int = 8,
                 open_timeout_s: float = 30.0) -> None:
        if not _SCHEMA_NAME.match(schema):
            raise ValueError(f"schema must be a plain identifier (got {schema!r})")
        self.dsn = dsn
        self.schema = schema
        self._feed_lock = _lock_key("sidecar.change_log", schema)
        # Tags this process's changes so its own change feed can skip them (its caches are current).
        self.origin = uuid.uuid4().hex
        self._migrate_lock = _lock_key("sidecar.migrate", schema)
        self._set_path = sql.SQL("SET search_path TO {}").format(sql.Identifier(schema))
        self._pool = ConnectionPool(
            dsn, min_size=min_size, max_size=max_size, kwargs={"autocommit": True},
            configure=self._configure, open=False, name=f"sidecar-{schema}",
        )
        self._pool.open(wait=True, timeout=open_timeout_s)
        try:
            self.migrate()
            with self._pool.connection() as conn:
                bypass = conn.execute("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user"
                                      ).fetchone()
            self.rls_enforced = not (bypass and bypass[0])
            if not self.rls_enforced:
                log.warning("PostgresStore: role of %r is a superuser or has BYPASSRLS; row-level security is "
                            "NOT enforced for it (the WHERE clauses still scope every query)", schema)
        except BaseException:
            self._pool.close()
            raise

    # ------------------------------------------------------------------ plumbing
    def _configure(self, conn: psycopg.Connection) -> None:
        conn.execute(self._set_path)

    @contextmanager
    def _tx(self, scope: Scope | None = None, *, system: bool = False) -> Iterator[psycopg.Cursor]:
        """One transaction on a pooled connection, with the RLS settings of `scope` (or the system
        bypass) set transaction-locally before anything else runs."""
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            if scope is not None:
                cur.execute(_SET_SCOPE, [scope.tenant_id, scope.user_id])
            if system:
                cur.execute(_SET_SYSTEM)
            yield cur

    def _query(self, scope: Scope | None, query: str, params: Sequence[Any] = (), *,
               system: bool = False) -> list[tuple]:
        with self._tx(scope, system=system) as cur:
            cur.execute(query, params)
            return cur.fetchall()

    @staticmethod
    def _set_scope(cur: psycopg.Cursor, tenant_id: str, user_id: str) -> None:
        cur.execute(_SET_SCOPE, [tenant_id, user_id])

    def migrate(self) -> None:
        """Apply pending migrations (also run at open). Safe when replicas start at once."""
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [self._migrate_lock])
            cur.execute(_SET_SYSTEM)
            cur.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", [self.schema])
            if cur.fetchone() is None:
                cur.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(self.schema)))
            cur.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, "
                        "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
            cur.execute("SELECT version FROM schema_migrations")
            applied = {row[0] for row in cur.fetchall()}
            for version, description, ddl in MIGRATIONS:
                if version in applied:
                    continue
                cur.execute(ddl)  # several statements: sent as one simple query (no parameters)
                cur.execute("INSERT INTO schema_migrations (version, description) VALUES (%s, %s)",
                            [version, description])

    def schema_version(self) -> int:
        return self._query(None, "SELECT coalesce(max(version), 0) FROM schema_migrations")[0][0]

    @staticmethod
    def _insert_many(cur: psycopg.Cursor, table: str, columns: str, rows: Sequence[Sequence[Any]],
                     suffix: str = "") -> None:
        if not rows:
            return
        marks = ", ".join(["%s"] * len(rows[0]))
        query = f"INSERT INTO {table} ({columns}) VALUES ({marks}){suffix}"
        if len(rows) == 1:
            cur.execute(query, rows[0])
        else:
            cur.executemany(query, rows)  # pipelined: one round trip for the batch

    def _log_changes(self, cur: psycopg.Cursor, scope: Scope, kind: str, keys: Sequence[str]) -> None:
        """Append to change_log and notify, inside the caller's transaction. Call last: the
        advisory lock is held to commit, which makes change_log seq order the commit order."""
        if not keys:
            return
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [self._feed_lock])
        cur.execute(
            "WITH ins AS (INSERT INTO change_log (tenant_id, user_id, kind, key, origin) "
            "SELECT %s, %s, %s, k, %s FROM unnest(%s::text[]) WITH ORDINALITY AS u(k, n) ORDER BY n RETURNING seq) "
            "SELECT pg_notify(%s, max(seq)::text) FROM ins",
            [scope.tenant_id, scope.user_id, kind, self.origin, list(keys), NOTIFY_CHANNEL])

    def close(self) -> None:
        self._pool.close()

    # ------------------------------------------------------------------ change feed
    @staticmethod
    def _change(r: tuple) -> Change:
        return Change(seq=r[0], tenant_id=r[1], user_id=r[2], kind=r[3], key=r[4], at_ms=r[5], origin=r[6])

    def changes_since(self, seq: int, limit: int = 1000) -> list[Change]:
        """Changes after `seq`, oldest first, across all users (a system read, for replicas)."""
        rows = self._query(None, "SELECT seq, tenant_id, user_id, kind, key, at_ms, origin FROM change_log WHERE seq > %s "
                           "ORDER BY seq LIMIT %s", [seq, limit], system=True)
        return [self._change(r) for r in rows]

    def current_change_seq(self) -> int:
        """The seq of the newest visible change (0 when none): start a feed from here."""
        return self._query(None, "SELECT coalesce(max(seq), 0) FROM change_log", system=True)[0][0]

    def users_changed_since(self, seq: int) -> tuple[set[tuple[str, str]], int]:
        """((tenant, user) of every change after `seq`, the newest seq read): what a replica that stopped
        at `seq` missed. Seq order is commit order, so nothing at or below the newest is still to come."""
        end = self.current_change_seq()
        rows = self._query(None, "SELECT DISTINCT tenant_id, user_id FROM change_log WHERE seq > %s AND seq <= %s",
                           [seq, end], system=True)
        return {(t, u) for t, u in rows}, end

    def identity(self) -> str:
        """Which change_log this is: server, database, schema and the table's oid (a schema dropped and
        made again under the same name starts a new log, whose seqs say nothing of the old one's)."""
        info = conninfo_to_dict(self.dsn)
        oid = self._query(None, "SELECT 'change_log'::regclass::oid", system=True)[0][0]
        return (f"postgresql://{info.get('host', '')}:{info.get('port', '')}/{info.get('dbname', '')}"
                f"?schema={self.schema}&change_log={oid}")

    # ------------------------------------------------------------------ sessions
    def create_session(self, scope: Scope, session: Session) -> None:
        try:
            with self._tx(scope) as cur:
                self._insert_many(cur, "sessions", records.SESSION_COLS, [records.session_row(scope, session)])
        except psycopg.errors.UniqueViolation as exc:  # the primary key: no read before the write
            raise AlreadyExists(f"session_id {session.session_id!r} already exists") from exc

    def get_session(self, scope: Scope, session_id: str) -> Session | None:
        rows = self._query(
            scope,
            f"SELECT {records.SESSION_COLS}, {records.MESSAGE_STATS} FROM sessions s "
            "WHERE tenant_id = %s AND user_id = %s AND session_id = %s",
            [scope.tenant_id, scope.user_id, session_id],
        )
        return records.session_from(rows[0]) if rows else None

    def list_sessions(self, scope: Scope, *, limit: int, offset: int, include_closed: bool) -> list[Session]:
        status_filter = "" if include_closed else f"AND status = {int(SessionStatus.OPEN)}"
        rows = self._query(
            scope,
            f"SELECT {records.SESSION_COLS}, {records.MESSAGE_STATS} FROM sessions s "
            f"WHERE tenant_id = %s AND user_id = %s {status_filter} "
            "ORDER BY created_at_ms DESC, session_id DESC LIMIT %s OFFSET %s",
            [scope.tenant_id, scope.user_id, limit, offset],
        )
        return [records.session_from(r) for r in rows]

    def close_session(self, scope: Scope, session_id: str, at_ms: int) -> None:
        with self._tx(scope) as cur:
            cur.execute(
                "UPDATE sessions SET status = %s, closed_at_ms = %s, updated_at_ms = %s "
                "WHERE tenant_id = %s AND user_id = %s AND session_id = %s",
                [int(SessionStatus.CLOSED), at_ms, at_ms, scope.tenant_id, scope.user_id, session_id],
            )
            if cur.rowcount:
                self._log_changes(cur, scope, "session", [session_id])

    # ------------------------------------------------------------------ messages
    def append_messages(
        self, scope: Scope, session_id: str, messages: Sequence[NewMessage], token_counts: Sequence[tuple[int, int]],
        now_ms: int, pinned: Sequence[tuple[int, str, int]] = (),
    ) -> list[Message]:
        """Store a batch atomically. Messages whose idempotency key is already stored in the session
        are not stored again; the stored row is returned in their place. `pinned` holds
        (batch index, text, tokens) constraints stored with their (newly stored) message. Sequence numbers are drawn
        under a per-session advisory lock, so concurrent appenders (any process) never collide."""
        owner = [scope.tenant_id, scope.user_id, session_id]
        with self._tx(scope) as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)",
                        [_lock_key("sidecar.messages", self.schema, *owner)])
            key_params = [m.idempotency_key for m in messages if m.idempotency_key]
            existing: dict[str, Message] = {}
            if key_params:
                cur.execute(f"SELECT {records.MESSAGE_COLS} FROM messages WHERE tenant_id = %s AND user_id = %s "
                            "AND session_id = %s AND idempotency_key = ANY(%s)", [*owner, key_params])
                for r in cur.fetchall():
                    existing[r[13]] = records.message_from(r)
            cur.execute("SELECT coalesce(max(seq), 0) + 1 FROM messages WHERE tenant_id = %s AND user_id = %s "
                        "AND session_id = %s", owner)
            next_seq = cur.fetchone()[0]
            plan = records.plan_append(scope, session_id, messages, token_counts, pinned, now_ms, existing, next_seq)
            self._insert_many(cur, "messages", records.MESSAGE_COLS, plan.message_rows)
            self._insert_many(cur, "pinned_constraints", records.PINNED_COLS, plan.pinned_rows)
            if plan.message_rows:
                self._log_changes(cur, scope, "message", [session_id])
            return plan.out

    def import_sessions(self, scope: Scope, batch: Sequence[records.SessionImport]) -> None:
        """Store new sessions whole (rows, messages, pinned constraints, commit watermarks, after-turn
        jobs) in one transaction; AlreadyExists, and nothing stored, when one of the ids is taken (a
        concurrent creator of the same id included: the primary key decides)."""
        ids = [b.session.session_id for b in batch]
        try:
            with self._tx(scope) as cur:
                cur.execute("SELECT session_id FROM sessions WHERE tenant_id = %s AND user_id = %s "
                            "AND session_id = ANY(%s) ORDER BY session_id", [scope.tenant_id, scope.user_id, ids])
                taken = cur.fetchall()
                if taken:
                    raise AlreadyExists(f"session_id {taken[0][0]!r} already exists")
                for table, columns, rows in records.import_rows(scope, batch):
                    self._insert_many(cur, table, columns, rows)
                self._log_changes(cur, scope, "message", ids)
        except psycopg.errors.UniqueViolation as exc:
            raise AlreadyExists("a session_id of this import was created by another call meanwhile") from exc

    def list_messages(
        self, scope: Scope, session_id: str, *, newest: int = 0, from_seq: int = 0, to_seq: int = 0
    ) -> list[Message]:
        base = f"SELECT {records.MESSAGE_COLS} FROM messages WHERE tenant_id = %s AND user_id = %s AND session_id = %s"
        params: list[Any] = [scope.tenant_id, scope.user_id, session_id]
        if newest > 0:
            rows = self._query(scope, base + " ORDER BY seq DESC LIMIT %s", [*params, newest])
            rows.reverse()
        else:
            query = base + " AND seq >= %s"
            params.append(max(from_seq, 1))
            if to_seq > 0:
                query += " AND seq <= %s"
                params.append(to_seq)
            rows = self._query(scope, query + " ORDER BY seq", params)
        return [records.message_from(r) for r in rows]

    def get_messages(self, scope: Scope, session_id: str, message_ids: Sequence[str]) -> list[Message]:
        if not message_ids:
            return []
        rows = self._query(scope, f"SELECT {records.MESSAGE_COLS} FROM messages WHERE tenant_id = %s AND user_id = %s AND "
                           "session_id = %s AND message_id = ANY(%s) ORDER BY seq",
                           [scope.tenant_id, scope.user_id, session_id, list(message_ids)])
        return [records.message_from(r) for r in rows]

    def stored_message_ids(self, scope: Scope, message_ids: Sequence[str]) -> set[str]:
        """Those of these ids that are the user's stored messages (not deleted)."""
        if not message_ids:
            return set()
        return {r[0] for r in self._query(scope, "SELECT message_id FROM messages WHERE tenant_id = %s AND user_id = %s "
                                                 "AND message_id = ANY(%s)",
                                          [scope.tenant_id, scope.user_id, list(message_ids)])}

    def user_message_ids(self, scope: Scope) -> list[str]:
        """The ids of all the user's messages, of every session, in timeline order (list_user_messages')."""
        return [r[0] for r in self._query(
            scope, f"SELECT m.message_id FROM {records.USER_MESSAGES} WHERE m.tenant_id = %s AND m.user_id = %s "
                   f"ORDER BY {records.user_timeline_order(False)}", [scope.tenant_id, scope.user_id])]

    def get_user_messages(self, scope: Scope, message_ids: Sequence[str]) -> list[Message]:
        """The user's messages with these ids, from any of their sessions (by session, then seq)."""
        if not message_ids:
            return []
        rows = self._query(scope, f"SELECT {records.MESSAGE_COLS} FROM messages WHERE tenant_id = %s AND user_id = %s "
                           "AND message_id = ANY(%s) ORDER BY session_id, seq",
                           [scope.tenant_id, scope.user_id, list(message_ids)])
        return [records.message_from(r) for r in rows]

    def list_user_messages(self, scope: Scope, roles: Sequence[int], newest: int | None = None) -> list[Message]:
        """Every message of the user with one of `roles` (only the `newest` ones when given), sessions in
        creation order, turns in order. Sub-sessions' messages are left out: a sub-agent's work reaches
        other sessions only as its result summary."""
        cols = ", ".join(f"m.{c.strip()}" for c in records.MESSAGE_COLS.split(","))
        rows = self._query(scope, f"SELECT {cols} FROM {records.USER_MESSAGES} WHERE m.tenant_id = %s AND "
                           f"m.user_id = %s AND s.parent_session_id = '' AND m.role = ANY(%s) ORDER BY {records.user_timeline_order(newest is not None)}"
                           + (" LIMIT %s" if newest is not None else ""),
                           [scope.tenant_id, scope.user_id, [int(r) for r in roles],
                            *([newest] if newest is not None else [])])
        return [records.message_from(r) for r in (rows[::-1] if newest is not None else rows)]

    def newest_session_with_messages(self, scope: Scope, excluding: Sequence[str]) -> tuple[int, str] | None:
        """(created_at_ms, session_id) of the user's last session in timeline order that holds a message,
        sub-sessions and `excluding` left out; None when there is none."""
        rows = self._query(
            scope, "SELECT s.created_at_ms, s.session_id FROM sessions s WHERE s.tenant_id = %s AND s.user_id = %s "
            "AND s.parent_session_id = '' AND NOT (s.session_id = ANY(%s)) AND EXISTS (SELECT 1 FROM messages m "
            "WHERE m.tenant_id = s.tenant_id AND m.user_id = s.user_id AND m.session_id = s.session_id) "
            "ORDER BY s.created_at_ms DESC, s.session_id DESC LIMIT 1",
            [scope.tenant_id, scope.user_id, list(excluding)])
        return (rows[0][0], rows[0][1]) if rows else None

    # ------------------------------------------------------------------ facts
    def get_facts(self, scope: Scope, session_id: str) -> list[Fact]:
        rows = self._query(
            scope,
            f"SELECT {records.FACT_COLS} FROM facts WHERE tenant_id = %s AND user_id = %s AND session_id = %s "
            "ORDER BY key, status",
            [scope.tenant_id, scope.user_id, session_id],
        )
        return [records.fact_from(r) for r in rows]

    def write_facts(
        self, scope: Scope, session_id: str, upserts: Sequence[Fact], deletes: Sequence[tuple[str, int]],
        changes: Sequence[FactChange], at_ms: int,
    ) -> None:
        """Replace fact rows (by key and status), delete others, and append history: one transaction."""
        owner = [scope.tenant_id, scope.user_id, session_id]
        with self._tx(scope) as cur:
            if deletes:
                cur.execute(
                    "DELETE FROM facts f USING unnest(%s::text[], %s::smallint[]) AS d(key, status) "
                    "WHERE f.tenant_id = %s AND f.user_id = %s AND f.session_id = %s AND f.key = d.key "
                    "AND f.status = d.status",
                    [[k for k, _ in deletes], [int(s) for _, s in deletes], *owner])
            self._insert_many(
                cur, "facts", "tenant_id, user_id, session_id, " + records.FACT_COLS,
                [(*owner, f.key, f.value, int(f.provenance), f.source, f.updated_at_ms, int(f.status), f.version,
                  f.tokens) for f in upserts],
                suffix=" ON CONFLICT (tenant_id, user_id, session_id, key, status) DO UPDATE SET "
                       "value = EXCLUDED.value, provenance = EXCLUDED.provenance, source = EXCLUDED.source, "
                       "updated_at_ms = EXCLUDED.updated_at_ms, version = EXCLUDED.version, "
                       "tokens = EXCLUDED.tokens")
            self._insert_many(
                cur, "fact_history",
                "tenant_id, user_id, session_id, key, version, status, value, provenance, source, at_ms, action, "
                "reason, tokens",
                [(*owner, ch.fact.key, ch.fact.version, int(ch.fact.status), ch.fact.value, int(ch.fact.provenance),
                  ch.fact.source, at_ms, ch.action, ch.reason, ch.fact.tokens) for ch in changes])
            cur.execute("UPDATE sessions SET updated_at_ms = %s WHERE tenant_id = %s AND user_id = %s "
                        "AND session_id = %s", [at_ms, *owner])
            self._log_changes(cur, scope, "facts", [session_id])

    def fact_history(self, scope: Scope, session_id: str, key: str) -> list[FactChange]:
        rows = self._query(
            scope,
            "SELECT key, value, provenance, source, at_ms, status, version, tokens, action, reason FROM fact_history "
            "WHERE tenant_id = %s AND user_id = %s AND session_id = %s AND key = %s ORDER BY version, at_ms",
            [scope.tenant_id, scope.user_id, session_id, key],
        )
        return [FactChange(fact=records.fact_from(r[:8]), action=r[8], reason=r[9]) for r in rows]

    # ------------------------------------------------------------------ runs
    def create_run(self, scope: Scope, run: Run) -> None:
        with self._tx(scope) as cur:
            self._insert_many(cur, "runs", "tenant_id, user_id, " + records.RUN_COLS, [(
                scope.tenant_id, scope.user_id, run.run_id, run.session_id, int(run.status), run.goal, run.reason,
                run.created_at_ms, run.updated_at_ms)])

    def get_run(self, scope: Scope, run_id: str) -> Run | None:
        rows = self._query(
            scope,
            f"SELECT {records.RUN_COLS}, (SELECT count(*) FROM run_checkpoints k WHERE k.tenant_id = r.tenant_id AND "
            "k.user_id = r.user_id AND k.run_id = r.run_id) FROM runs r "
            "WHERE tenant_id = %s AND user_id = %s AND run_id = %s",
            [scope.tenant_id, scope.user_id, run_id],
        )
        return records.run_from(rows[0], rows[0][-1]) if rows else None

    def update_run(self, scope: Scope, run: Run) -> None:
        with self._tx(scope) as cur:
            cur.execute("UPDATE runs SET status = %s, reason = %s, updated_at_ms = %s "
                        "WHERE tenant_id = %s AND user_id = %s AND run_id = %s",
                        [int(run.status), run.reason, run.updated_at_ms, scope.tenant_id, scope.user_id, run.run_id])

    def add_checkpoint(self, scope: Scope, checkpoint: RunCheckpoint) -> None:
        with self._tx(scope) as cur:
            self._insert_many(cur, "run_checkpoints",
                              "tenant_id, user_id, run_id, seq, checkpoint_id, state, pending_step, created_at_ms",
                              [(scope.tenant_id, scope.user_id, checkpoint.run_id, checkpoint.seq,
                                checkpoint.checkpoint_id, bytes(checkpoint.state), checkpoint.pending_step,
                                checkpoint.created_at_ms)])

    def last_checkpoint(self, scope: Scope, run_id: str) -> RunCheckpoint | None:
        rows = self._query(
            scope,
            "SELECT checkpoint_id, run_id, seq, state, pending_step, created_at_ms FROM run_checkpoints "
            "WHERE tenant_id = %s AND user_id = %s AND run_id = %s ORDER BY seq DESC LIMIT 1",
            [scope.tenant_id, scope.user_id, run_id],
        )
        if not rows:
            return None
        r = rows[0]
        return RunCheckpoint(checkpoint_id=r[0], run_id=r[1], seq=r[2], state=bytes(r[3]), pending_step=r[4],
                             created_at_ms=r[5])

    # ------------------------------------------------------------------ jobs
    def _insert_jobs(self, cur: psycopg.Cursor, jobs: Sequence[Job]) -> None:
        """Insert jobs under each job's own scope (RLS checks every row against the settings)."""
        by_owner: dict[tuple[str, str], list[Job]] = {}
        for j in jobs:
            by_owner.setdefault((j.tenant_id, j.user_id), []).append(j)
        for (tenant_id, user_id), group in by_owner.items():
            self._set_scope(cur, tenant_id, user_id)
            self._insert_many(cur, "jobs", records.JOB_COLS, [records.job_row(j) for j in group])

    def enqueue_jobs(self, jobs: Sequence[Job]) -> None:
        if not jobs:
            return
        with self._tx() as cur:
            self._insert_jobs(cur, jobs)

    def get_job(self, scope: Scope, job_id: str) -> Job | None:
        rows = self._query(scope, f"SELECT {records.JOB_COLS} FROM jobs WHERE tenant_id = %s AND user_id = %s "
                           "AND job_id = %s", [scope.tenant_id, scope.user_id, job_id])
        return records.job_from(rows[0]) if rows else None

    def get_jobs(self, scope: Scope, job_ids: Sequence[str]) -> list[Job]:
        """The user's jobs of these ids, in their order (an id not found left out), in one query."""
        if not job_ids:
            return []
        rows = self._query(scope, f"SELECT {records.JOB_COLS} FROM jobs WHERE tenant_id = %s AND user_id = %s "
                           "AND job_id = ANY(%s)", [scope.tenant_id, scope.user_id, list(set(job_ids))])
        return records.in_order(job_ids, [records.job_from(r) for r in rows])

    def unfinished_jobs(self, scope: Scope) -> list[Job]:
        rows = self._query(
            scope,
            f"SELECT {records.JOB_COLS} FROM jobs WHERE tenant_id = %s AND user_id = %s AND status IN (%s, %s) "
            "ORDER BY created_at_ms",
            [scope.tenant_id, scope.user_id, int(JobStatus.QUEUED), int(JobStatus.RUNNING)],
        )
        return [records.job_from(r) for r in rows]

    def claim_job(self, now_ms: int, kinds: Sequence[str] | None = None) -> Job | None:
        jobs = self.claim_jobs(now_ms, kinds)
        return jobs[0] if jobs else None

    def claim_jobs(self, now_ms: int, kinds: Sequence[str] | None = None, limit: int = 1) -> list[Job]:
        """Take the oldest `limit` queued jobs of any user, of one of `kinds` when given (system
        transaction). SKIP LOCKED lets workers in several replicas claim concurrently without waiting
        on or double-claiming a job."""
        kind_filter = " AND kind = ANY(%s)" if kinds else ""
        with self._tx(system=True) as cur:
            cur.execute(
                f"WITH claimed AS (UPDATE jobs SET status = %s, attempts = attempts + 1, updated_at_ms = %s "
                f"WHERE job_id IN (SELECT job_id FROM jobs WHERE status = %s{kind_filter} "
                f"ORDER BY created_at_ms, job_id LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING {records.JOB_COLS}) "
                f"SELECT {records.JOB_COLS} FROM claimed ORDER BY created_at_ms, job_id",
                [int(JobStatus.RUNNING), now_ms, int(JobStatus.QUEUED), *([list(kinds)] if kinds else []), limit])
            return [records.job_from(row) for row in cur.fetchall()]

    def finish_job(self, job: Job) -> None:
        self.finish_jobs([job])

    def finish_jobs(self, jobs: Sequence[Job]) -> None:
        """Write back the jobs' status, attempts, progress and result in one transaction."""
        if not jobs:
            return
        with self._tx(system=True) as cur:
            cur.executemany("UPDATE jobs SET status = %s, attempts = %s, error = %s, done_items = %s, "
                            "total_items = %s, updated_at_ms = %s, result = %s WHERE job_id = %s",
                            [(*row[1:], row[0]) for row in map(records.job_update_row, jobs)])

    def requeue_running_jobs(self) -> int:
        """At start-up, jobs a crashed process was running go back to the queue. As in DuckDBStore
        this requeues EVERY running job: with several replicas, call it only when no other
        replica's worker is running (a job has no owner/lease column yet)."""
        with self._tx(system=True) as cur:
            cur.execute("UPDATE jobs SET status = %s WHERE status = %s",
                        [int(JobStatus.QUEUED), int(JobStatus.RUNNING)])
            return cur.rowcount

    def queue_depth(self) -> int:
        with self._tx(system=True) as cur:
            cur.execute("SELECT count(*) FROM jobs WHERE status IN (%s, %s)",
                        [int(JobStatus.QUEUED), int(JobStatus.RUNNING)])
            return cur.fetchone()[0]

    # ------------------------------------------------------------------ long-term memory
    def put_memories(self, scope: Scope, rows: Sequence[tuple[Memory, bytes]], changes: Sequence[MemoryChange]) -> None:
        """Insert or replace memory rows and append their history, in one transaction."""
        with self._tx(scope) as cur:
            self._insert_many(
                cur, "memories", "tenant_id, user_id, " + records.MEMORY_COLS + ", embedding",
                [(scope.tenant_id, scope.user_id, m.memory_id, int(m.type), m.content, m.subject,
                  json.dumps(m.source_message_ids), m.confidence, int(m.authority), m.created_at_ms, m.updated_at_ms,
                  m.expires_at_ms, int(m.status), m.superseded_by, m.tokens, bytes(emb)) for m, emb in rows],
                suffix=" ON CONFLICT (tenant_id, user_id, memory_id) DO UPDATE SET type = EXCLUDED.type, "
                       "content = EXCLUDED.content, subject = EXCLUDED.subject, "
                       "source_message_ids = EXCLUDED.source_message_ids, confidence = EXCLUDED.confidence, "
                       "authority = EXCLUDED.authority, created_at_ms = EXCLUDED.created_at_ms, "
                       "updated_at_ms = EXCLUDED.updated_at_ms, expires_at_ms = EXCLUDED.expires_at_ms, "
                       "status = EXCLUDED.status, superseded_by = EXCLUDED.superseded_by, "
                       "tokens = EXCLUDED.tokens, embedding = EXCLUDED.embedding")
            self._append_memory_history(cur, scope, changes)
            keys = dict.fromkeys([m.memory_id for m, _ in rows] + [ch.memory.memory_id for ch in changes])
            self._log_changes(cur, scope, "memory", list(keys))

    def _append_memory_history(self, cur: psycopg.Cursor, scope: Scope, changes: Sequence[MemoryChange]) -> None:
        # seq comes from the memory_history_seq default, drawn in row order: history keeps the
        # order of the changes, across batches and replicas.
        self._insert_many(cur, "memory_history", _MEMORY_HISTORY_COLS, [
            (scope.tenant_id, scope.user_id, ch.memory.memory_id, ch.at_ms, ch.action, ch.reason, int(ch.memory.type),
             ch.memory.content, ch.memory.subject, json.dumps(ch.memory.source_message_ids), ch.memory.confidence,
             int(ch.memory.authority), ch.memory.expires_at_ms, int(ch.memory.status), ch.memory.superseded_by)
            for ch in changes])

    def get_memory(self, scope: Scope, memory_id: str) -> Memory | None:
        rows = self._query(scope, f"SELECT {records.MEMORY_COLS} FROM memories WHERE tenant_id = %s AND user_id = %s "
                           "AND memory_id = %s", [scope.tenant_id, scope.user_id, memory_id])
        return records.memory_from(rows[0]) if rows else None

    def list_memories(self, scope: Scope, *, limit: int, offset: int, types: Sequence[int], include_inactive: bool,
                      now_ms: int) -> list[Memory]:
        query = f"SELECT {records.MEMORY_COLS} FROM memories WHERE tenant_id = %s AND user_id = %s"
        params: list[Any] = [scope.tenant_id, scope.user_id]
        if types:
            query += " AND type = ANY(%s::smallint[])"
            params.append([int(t) for t in types])
        if not include_inactive:
            query += " AND status = %s AND (expires_at_ms = 0 OR expires_at_ms > %s)"
            params += [int(MemoryStatus.ACTIVE), now_ms]
        rows = self._query(scope, query + " ORDER BY updated_at_ms DESC, memory_id LIMIT %s OFFSET %s",
                           [*params, limit, offset])
        return [records.memory_from(r) for r in rows]

    def active_memories_with_embeddings(self, scope: Scope) -> list[tuple[Memory, bytes]]:
        rows = self._query(scope, f"SELECT {records.MEMORY_COLS}, embedding FROM memories WHERE tenant_id = %s "
                           "AND user_id = %s AND status = %s ORDER BY created_at_ms, memory_id",
                           [scope.tenant_id, scope.user_id, int(MemoryStatus.ACTIVE)])
        return [(records.memory_from(r), bytes(r[-1])) for r in rows]

    def memories_with_embeddings(self, scope: Scope) -> list[tuple[Memory, bytes]]:
        """Every memory row of the user (active and superseded) with its vector, in creation order."""
        rows = self._query(scope, f"SELECT {records.MEMORY_COLS}, embedding FROM memories WHERE tenant_id = %s "
                           "AND user_id = %s ORDER BY created_at_ms, memory_id", [scope.tenant_id, scope.user_id])
        return [(records.memory_from(r), bytes(r[-1])) for r in rows]

    def memory_history(self, scope: Scope, memory_id: str) -> list[MemoryChange]:
        rows = self._query(
            scope,
            "SELECT memory_id, type, content, subject, source_message_ids, confidence, authority, at_ms, at_ms, "
            "expires_at_ms, status, superseded_by, 0, action, reason, at_ms FROM memory_history "
            "WHERE tenant_id = %s AND user_id = %s AND memory_id = %s ORDER BY seq",
            [scope.tenant_id, scope.user_id, memory_id])
        return [MemoryChange(memory=records.memory_from(r[:13]), action=r[13], reason=r[14], at_ms=r[15]) for r in rows]

    def delete_memory(self, scope: Scope, memory_id: str, tombstone: MemoryChange,
                      unrecall: Sequence[str] = ()) -> None:
        """Deletion really deletes: the row and every earlier version; a contentless tombstone stays.
        `unrecall`: source turns that leave recall with it (recall_exclusions), in the same transaction."""
        owner = [scope.tenant_id, scope.user_id, memory_id]
        with self._tx(scope) as cur:
            cur.execute("DELETE FROM memories WHERE tenant_id = %s AND user_id = %s AND memory_id = %s", owner)
            cur.execute("DELETE FROM memory_history WHERE tenant_id = %s AND user_id = %s AND memory_id = %s", owner)
            self._append_memory_history(cur, scope, [tombstone])
            self._insert_exclusions(cur, scope, unrecall, "memory_deleted", tombstone.at_ms)
            self._log_changes(cur, scope, "memory_delete", [memory_id])

    # ------------------------------------------------------------------ after-turn commits
    def commit_watermark(self, scope: Scope, session_id: str) -> int:
        rows = self._query(scope, "SELECT upto_seq FROM turn_commits WHERE tenant_id = %s AND user_id = %s "
                           "AND session_id = %s", [scope.tenant_id, scope.user_id, session_id])
        return rows[0][0] if rows else 0

    def commit_turn(self, scope: Scope, session_id: str, upto_seq: int, jobs: Sequence[Job]) -> None:
        """Record the watermark (it never moves back) and enqueue the after-turn jobs atomically."""
        with self._tx(scope) as cur:
            cur.execute("INSERT INTO turn_commits (tenant_id, user_id, session_id, upto_seq) VALUES (%s, %s, %s, %s) "
                        "ON CONFLICT (tenant_id, user_id, session_id) DO UPDATE SET "
                        "upto_seq = greatest(turn_commits.upto_seq, EXCLUDED.upto_seq)",
                        [scope.tenant_id, scope.user_id, session_id, upto_seq])
            self._insert_jobs(cur, jobs)

    # ------------------------------------------------------------------ forget
    def forget_user(self, scope: Scope) -> dict[str, int]:
        """Delete every row of the user in the tenant, in every table that holds user data, and the
        user's earlier change_log entries; one 'forget' change is appended for replicas."""
        counts: dict[str, int] = {}
        with self._tx(scope) as cur:
            for table in USER_TABLES:
                cur.execute(f"DELETE FROM {table} WHERE tenant_id = %s AND user_id = %s",
                            [scope.tenant_id, scope.user_id])
                counts[table] = cur.rowcount
            cur.execute("DELETE FROM change_log WHERE tenant_id = %s AND user_id = %s",
                        [scope.tenant_id, scope.user_id])
            self._log_changes(cur, scope, "forget", [""])
        return counts

    # ------------------------------------------------------------------ compression layers
    def list_pinned(self, scope: Scope, session_id: str) -> list[PinnedConstraint]:
        rows = self._query(scope, f"SELECT {records.PINNED_READ_COLS} FROM pinned_constraints WHERE "
                           "tenant_id = %s AND user_id = %s AND session_id = %s ORDER BY created_at_ms, idx",
                           [scope.tenant_id, scope.user_id, session_id])
        return [PinnedConstraint(*r) for r in rows]

    def unpin_constraint(self, scope: Scope, session_id: str, message_id: str, idx: int, by: str, reason: str,
                         at_ms: int) -> bool:
        with self._tx(scope) as cur:
            cur.execute("UPDATE pinned_constraints SET unpinned_at_ms = %s, unpinned_by = %s, unpin_reason = %s "
                        "WHERE tenant_id = %s AND user_id = %s AND session_id = %s AND message_id = %s AND idx = %s "
                        "AND unpinned_at_ms = 0",
                        [at_ms, by, reason, scope.tenant_id, scope.user_id, session_id, message_id, idx])
            hit = cur.rowcount > 0
            if hit:
                self._log_changes(cur, scope, "message", [session_id])
        return hit

    # ------------------------------------------------------------------ deleting sessions and messages
    def delete_messages(self, scope: Scope, session_id: str, message_ids: Sequence[str]) -> dict[str, int]:
        with self._tx(scope) as cur:
            counts = records.delete_messages(cur, scope, session_id, message_ids, "%s")
            self._log_changes(cur, scope, "message", [session_id])
        return counts

    def delete_session(self, scope: Scope, session_id: str) -> tuple[dict[str, int], list[str]]:
        with self._tx(scope) as cur:
            counts, message_ids, ids = records.delete_sessions(cur, scope, session_id, "%s")
            self._log_changes(cur, scope, "session", ids)
            self._log_changes(cur, scope, "recall", [""])
        return counts, message_ids

    # ------------------------------------------------------------------ idempotency and recall exclusions
    def get_idempotent(self, scope: Scope, method: str, key: str) -> tuple[str, bytes] | None:
        rows = self._query(scope, "SELECT request_hash, response FROM idempotency_keys WHERE tenant_id = %s AND "
                           "user_id = %s AND method = %s AND key = %s", [scope.tenant_id, scope.user_id, method, key])
        return (rows[0][0], bytes(rows[0][1])) if rows else None

    def put_idempotent(self, scope: Scope, method: str, key: str, request_hash: str, response: bytes,
                       at_ms: int) -> None:
        with self._tx(scope) as cur:
            cur.execute("INSERT INTO idempotency_keys VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                        [scope.tenant_id, scope.user_id, method, key, request_hash, response, at_ms])

    def add_recall_exclusions(self, scope: Scope, message_ids: Sequence[str], reason: str, at_ms: int) -> None:
        with self._tx(scope) as cur:
            self._insert_exclusions(cur, scope, message_ids, reason, at_ms)
            self._log_changes(cur, scope, "recall", [""])

    @staticmethod
    def _insert_exclusions(cur, scope: Scope, message_ids: Sequence[str], reason: str, at_ms: int) -> None:
        if not message_ids:
            return
        cur.executemany("INSERT INTO recall_exclusions VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                       [(scope.tenant_id, scope.user_id, m, reason, at_ms) for m in dict.fromkeys(message_ids)])

    def recall_exclusions(self, scope: Scope) -> set[str]:
        rows = self._query(scope, "SELECT message_id FROM recall_exclusions WHERE tenant_id = %s AND user_id = %s",
                           [scope.tenant_id, scope.user_id])
        return {r[0] for r in rows}

    def insert_tool_result(self, scope: Scope, result: ToolResult) -> None:
        with self._tx(scope) as cur:
            self._insert_many(cur, "tool_results", "tenant_id, user_id, " + records.TOOL_COLS + ", full_text", [(
                scope.tenant_id, scope.user_id, result.tool_result_id, result.session_id, result.run_id,
                result.tool_name, result.call_id, int(result.status), result.tokens, result.lines, result.view_text,
                result.view_tokens, result.brief_text, result.brief_tokens, result.created_at_ms, result.full_text)])
            self._log_changes(cur, scope, "tool_result", [result.session_id])

    def get_tool_result(self, scope: Scope, tool_result_id: str) -> ToolResult | None:
        rows = self._query(scope, f"SELECT {records.TOOL_COLS}, full_text FROM tool_results WHERE tenant_id = %s AND "
                           "user_id = %s AND tool_result_id = %s", [scope.tenant_id, scope.user_id, tool_result_id])
        return records.tool_from(rows[0]) if rows else None

    def recent_tool_results(self, scope: Scope, session_id: str, limit: int) -> list[ToolResult]:
        """Newest last, without the full text."""
        rows = self._query(scope, f"SELECT {records.TOOL_COLS} FROM tool_results WHERE tenant_id = %s AND user_id = %s AND "
                           "session_id = %s ORDER BY created_at_ms DESC, tool_result_id DESC LIMIT %s",
                           [scope.tenant_id, scope.user_id, session_id, limit])
        return [records.tool_from(r) for r in reversed(rows)]

    def write_run_notes(self, scope: Scope, add: Sequence[RunNote], delete_ids: Sequence[str] = ()) -> None:
        """Add notes and delete folded ones in one transaction."""
        sessions: dict[str, None] = {}
        with self._tx(scope) as cur:
            if delete_ids:
                cur.execute("DELETE FROM run_notes WHERE tenant_id = %s AND user_id = %s AND note_id = ANY(%s) "
                            "RETURNING session_id", [scope.tenant_id, scope.user_id, list(delete_ids)])
                sessions.update(dict.fromkeys(r[0] for r in cur.fetchall()))
            self._insert_many(cur, "run_notes", "tenant_id, user_id, " + records.NOTE_COLS, [
                (scope.tenant_id, scope.user_id, n.note_id, n.session_id, n.run_id, n.seq, n.text, n.tokens,
                 n.is_summary, json.dumps(n.folded_note_ids), n.created_at_ms) for n in add])
            sessions.update(dict.fromkeys(n.session_id for n in add))
            self._log_changes(cur, scope, "run_notes", list(sessions))

    def list_run_notes(self, scope: Scope, session_id: str) -> list[RunNote]:
        rows = self._query(scope, f"SELECT {records.NOTE_COLS} FROM run_notes WHERE tenant_id = %s AND user_id = %s AND "
                           "session_id = %s ORDER BY run_id, seq", [scope.tenant_id, scope.user_id, session_id])
        return [records.note_from(r) for r in rows]

    def put_summary(self, scope: Scope, s: SessionSummary) -> None:
        with self._tx(scope) as cur:
            cur.execute("INSERT INTO session_summaries (tenant_id, user_id, session_id, text, tokens, "
                        "source_message_ids, covered_until_seq, state, updated_at_ms) "
                        "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT (tenant_id, user_id, session_id) DO UPDATE SET text = EXCLUDED.text, "
                        "tokens = EXCLUDED.tokens, source_message_ids = EXCLUDED.source_message_ids, "
                        "covered_until_seq = EXCLUDED.covered_until_seq, state = EXCLUDED.state, "
                        "updated_at_ms = EXCLUDED.updated_at_ms",
                        [scope.tenant_id, scope.user_id, s.session_id, s.text, s.tokens,
                         json.dumps(s.source_message_ids), s.covered_until_seq, s.state, s.updated_at_ms])
            self._log_changes(cur, scope, "summary", [s.session_id])

    def get_summary(self, scope: Scope, session_id: str) -> SessionSummary | None:
        rows = self._query(scope, "SELECT session_id, text, tokens, source_message_ids, covered_until_seq, state, "
                           "updated_at_ms FROM session_summaries WHERE tenant_id = %s AND user_id = %s AND "
                           "session_id = %s", [scope.tenant_id, scope.user_id, session_id])
        if not rows:
            return None
        r = rows[0]
        return SessionSummary(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6])

    def add_subsession_result(self, scope: Scope, r: SubSessionResult, close_child_at_ms: int) -> None:
        """Store the child's result and close the child session, atomically."""
        with self._tx(scope) as cur:
            self._insert_many(cur, "subsession_results", "tenant_id, user_id, parent_session_id, child_session_id, "
                              "task, text, tokens, created_at_ms",
                              [(scope.tenant_id, scope.user_id, r.parent_session_id, r.child_session_id, r.task,
                                r.text, r.tokens, r.created_at_ms)])
            cur.execute("UPDATE sessions SET status = %s, closed_at_ms = %s, updated_at_ms = %s WHERE tenant_id = %s "
                        "AND user_id = %s AND session_id = %s",
                        [int(SessionStatus.CLOSED), close_child_at_ms, close_child_at_ms, scope.tenant_id,
                         scope.user_id, r.child_session_id])
            self._log_changes(cur, scope, "subsession", [r.parent_session_id])
            self._log_changes(cur, scope, "session", [r.child_session_id])

    def list_subsession_results(self, scope: Scope, parent_session_id: str) -> list[SubSessionResult]:
        rows = self._query(scope, "SELECT parent_session_id, child_session_id, task, text, tokens, created_at_ms "
                           "FROM subsession_results WHERE tenant_id = %s AND user_id = %s AND parent_session_id = %s "
                           "ORDER BY created_at_ms", [scope.tenant_id, scope.user_id, parent_session_id])
        return [SubSessionResult(*r) for r in rows]

    # ------------------------------------------------------------------ knowledge base (tenant-shared)
    # These tables have tenant-only RLS: the transactions set sidecar.tenant_id and an empty user_id.
    @staticmethod
    def _tenant(tenant_id: str) -> Scope:
        return Scope(tenant_id, "")

    def add_document_version(self, tenant_id: str, doc: DocumentVersion, chunks: Sequence[KnowledgeChunk],
                             job: Job) -> int:
        """Store the next version of a document with its chunks and its indexing job, atomically.
        Returns the version number assigned (drawn under a per-document advisory lock)."""
        tenant = self._tenant(tenant_id)
        with self._tx(tenant) as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%s)", [_lock_key("sidecar.kb", self.schema, tenant_id,
                                                                        doc.doc_id)])
            cur.execute("SELECT coalesce(max(version), 0) + 1 FROM kb_documents WHERE tenant_id = %s AND doc_id = %s",
                        [tenant_id, doc.doc_id])
            version = cur.fetchone()[0]
            if doc.live:
                cur.execute("UPDATE kb_documents SET live = false WHERE tenant_id = %s AND doc_id = %s AND live",
                            [tenant_id, doc.doc_id])
            self._insert_many(cur, "kb_documents", "tenant_id, " + records.DOC_COLS, [(
                tenant_id, doc.doc_id, version, doc.title, doc.format, json.dumps(sorted(doc.allowed_roles)),
                json.dumps(doc.metadata, sort_keys=True), len(chunks), doc.live, False, doc.created_at_ms)])
            self._insert_many(cur, "kb_chunks", "tenant_id, doc_id, version, chunk_index, heading, text, tokens",
                              [(tenant_id, doc.doc_id, version, ch.chunk_index, ch.heading, ch.text, ch.tokens)
                               for ch in chunks])
            self._log_changes(cur, tenant, "kb_document", [doc.doc_id])
            job.payload["version"] = version
            self._insert_jobs(cur, [job])
            return version

    def document_versions(self, tenant_id: str, doc_id: str | None = None, *, live_only: bool = False
                          ) -> list[DocumentVersion]:
        query = f"SELECT {records.DOC_COLS} FROM kb_documents WHERE tenant_id = %s"
        params: list[Any] = [tenant_id]
        if doc_id is not None:
            query += " AND doc_id = %s"
            params.append(doc_id)
        if live_only:
            query += " AND live"
        return [records.doc_from(r) for r in self._query(self._tenant(tenant_id), query + " ORDER BY doc_id, version",
                                                  params)]

    def set_live_version(self, tenant_id: str, doc_id: str, version: int) -> None:
        tenant = self._tenant(tenant_id)
        with self._tx(tenant) as cur:
            cur.execute("UPDATE kb_documents SET live = (version = %s) WHERE tenant_id = %s AND doc_id = %s",
                        [version, tenant_id, doc_id])
            self._log_changes(cur, tenant, "kb_document", [doc_id])

    def mark_indexed(self, tenant_id: str, doc_id: str, version: int) -> None:
        tenant = self._tenant(tenant_id)
        with self._tx(tenant) as cur:
            cur.execute("UPDATE kb_documents SET indexed = true WHERE tenant_id = %s AND doc_id = %s AND version = %s",
                        [tenant_id, doc_id, version])
            self._log_changes(cur, tenant, "kb_document", [doc_id])

    def delete_document(self, tenant_id: str, doc_id: str) -> tuple[int, int]:
        """Delete every version, chunk and derived graph edge of a document: (versions, chunks)."""
        tenant = self._tenant(tenant_id)
        with self._tx(tenant) as cur:
            cur.execute("DELETE FROM kb_chunks WHERE tenant_id = %s AND doc_id = %s", [tenant_id, doc_id])
            chunks = cur.rowcount
            cur.execute("DELETE FROM kb_documents WHERE tenant_id = %s AND doc_id = %s", [tenant_id, doc_id])
            versions = cur.rowcount
            cur.execute("DELETE FROM graph_edges WHERE tenant_id = %s AND starts_with(source, %s)",
                        [tenant_id, f"kb:{doc_id}@v"])
            self._log_changes(cur, tenant, "kb_document", [doc_id])
            return versions, chunks

    def chunks(self, tenant_id: str, doc_id: str | None = None, version: int | None = None, *,
               live_only: bool = False) -> list[KnowledgeChunk]:
        query = ("SELECT c.doc_id, c.version, c.chunk_index, c.heading, c.text, c.tokens FROM kb_chunks c "
                 "JOIN kb_documents d ON d.tenant_id = c.tenant_id AND d.doc_id = c.doc_id AND d.version = c.version "
                 "WHERE c.tenant_id = %s")
        params: list[Any] = [tenant_id]
        if doc_id is not None:
            query += " AND c.doc_id = %s"
            params.append(doc_id)
        if version is not None:
            query += " AND c.version = %s"
            params.append(version)
        if live_only:
            query += " AND d.live"
        rows = self._query(self._tenant(tenant_id), query + " ORDER BY c.doc_id, c.version, c.chunk_index", params)
        return [KnowledgeChunk(*r) for r in rows]

    def knowledge_tenants(self) -> list[str]:
        """Every tenant with a document: a system read (start-up index rebuild), across tenants."""
        return [r[0] for r in self._query(None, "SELECT DISTINCT tenant_id FROM kb_documents ORDER BY 1",
                                          system=True)]

    def upsert_edges(self, tenant_id: str, edges: Sequence[GraphEdge]) -> None:
        if not edges:
            return
        tenant = self._tenant(tenant_id)
        with self._tx(tenant) as cur:
            self._insert_many(cur, "graph_edges", "tenant_id, edge_id, subject, relation, object, source, "
                              "valid_from_ms, valid_to_ms",
                              [(tenant_id, e.edge_id, e.subject, e.relation, e.object, e.source, e.valid_from_ms,
                                e.valid_to_ms) for e in edges],
                              suffix=" ON CONFLICT (tenant_id, edge_id) DO UPDATE SET subject = EXCLUDED.subject, "
                                     "relation = EXCLUDED.relation, object = EXCLUDED.object, "
                                     "source = EXCLUDED.source, valid_from_ms = EXCLUDED.valid_from_ms, "
                                     "valid_to_ms = EXCLUDED.valid_to_ms")
            self._log_changes(cur, tenant, "kb_edges", [""])

    def delete_edges(self, tenant_id: str, edge_ids: Sequence[str]) -> int:
        tenant = self._tenant(tenant_id)
        with self._tx(tenant) as cur:
            cur.execute("DELETE FROM graph_edges WHERE tenant_id = %s AND edge_id = ANY(%s)",
                        [tenant_id, list(edge_ids)])
            n = cur.rowcount
            if n:
                self._log_changes(cur, tenant, "kb_edges", [""])
            return n

    def edges(self, tenant_id: str) -> list[GraphEdge]:
        rows = self._query(self._tenant(tenant_id), "SELECT edge_id, subject, relation, object, source, "
                           "valid_from_ms, valid_to_ms FROM graph_edges WHERE tenant_id = %s ORDER BY edge_id",
                           [tenant_id])
        return [GraphEdge(*r) for r in rows]
