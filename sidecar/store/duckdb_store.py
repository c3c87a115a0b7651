"""Embedded DuckDB backend: one database file owned by this process.

DuckDB allows one writer and a connection is not meant for concurrent use, so every call holds
one lock and runs as one transaction. DuckDB costs ~0.1 ms per statement: hot reads are served by
CachingStore, and batch writes use one multi-row INSERT instead of a statement per row.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

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
from sidecar.store.records import USER_TABLES
from sidecar.store.schema import MIGRATIONS

# A sidecar shares its pod: cap DuckDB's buffer pool (its default is 80 % of the machine's RAM).
DEFAULT_MEMORY_LIMIT = "512MB"


# The columns finish_jobs writes, as records.job_update_row gives them.
_JOB_UPDATE = ("job_id", "status", "attempts", "error", "done_items", "total_items", "updated_at_ms", "result")


class DuckDBStore:
    def __init__(self, path: str, *, memory_limit: str = DEFAULT_MEMORY_LIMIT) -> None:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._conn = duckdb.connect(path, config={"memory_limit": memory_limit})
        self._lock = threading.RLock()
        self._next_seq: dict[tuple[str, str, str], int] = {}
        self._history_seq = 0
        self._migrate()
        with self._lock:
            # History rows are ordered by a counter that must keep growing across restarts.
            self._history_seq = (self._conn.execute("SELECT coalesce(max(seq), 0) FROM memory_history")
                                 .fetchone()[0] // 1000) + 1

    # ------------------------------------------------------------------ plumbing
    @contextmanager
    def _tx(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._lock:
            self._conn.execute("BEGIN TRANSACTION")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def _migrate(self) -> None:
        with self._tx() as c:
            c.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, "
                      "description VARCHAR NOT NULL, applied_at TIMESTAMP DEFAULT current_timestamp)")
            applied = {row[0] for row in c.execute("SELECT version FROM schema_migrations").fetchall()}
            for version, description, ddl in MIGRATIONS:
                if version in applied:
                    continue
                for statement in filter(str.strip, ddl.split(";")):
                    c.execute(statement)
                c.execute("INSERT INTO schema_migrations (version, description) VALUES (?, ?)",
                          [version, description])

    def schema_version(self) -> int:
        return self._query("SELECT coalesce(max(version), 0) FROM schema_migrations")[0][0]

    @staticmethod
    def _insert_many(c: duckdb.DuckDBPyConnection, table: str, columns: str, rows: Sequence[Sequence[Any]]) -> None:
        """One INSERT for all rows, bound column by column (a list per column, unnested side by side):
        binding a parameter per value costs more than the insert itself."""
        if not rows:
            return
        values = [list(column) for column in zip(*rows, strict=True)]
        c.execute(f"INSERT INTO {table} ({columns}) SELECT {', '.join(['unnest(?)'] * len(values))}", values)

    def close(self) -> None:
        with self._lock:
            self._conn.execute("CHECKPOINT")
            self._conn.close()

    # ------------------------------------------------------------------ sessions
    def create_session(self, scope: Scope, session: Session) -> None:
        try:
            with self._tx() as c:
                self._insert_many(c, "sessions", records.SESSION_COLS, [records.session_row(scope, session)])
        except duckdb.ConstraintException as exc:  # the primary key: no read before the write
            raise AlreadyExists(f"session_id {session.session_id!r} already exists") from exc
        with self._lock:  # a new session holds no message: its first append needs no max(seq) read
            self._next_seq[(scope.tenant_id, scope.user_id, session.session_id)] = 1

    def get_session(self, scope: Scope, session_id: str) -> Session | None:
        # The message stats as one aggregate joined to the row: the two correlated subqueries of
        # MESSAGE_STATS cost DuckDB about three times as much.
        owner = [scope.tenant_id, scope.user_id, session_id]
        rows = self._query(
            f"SELECT {records.SESSION_COLS}, m.n, m.last FROM sessions s, (SELECT count(*) AS n, "
            "coalesce(max(created_at_ms), 0) AS last FROM messages WHERE tenant_id = ? AND user_id = ? "
            "AND session_id = ?) m WHERE s.tenant_id = ? AND s.user_id = ? AND s.session_id = ?", owner + owner)
        return records.session_from(rows[0]) if rows else None

    def list_sessions(self, scope: Scope, *, limit: int, offset: int, include_closed: bool) -> list[Session]:
        status_filter = "" if include_closed else f"AND status = {int(SessionStatus.OPEN)}"
        rows = self._query(
            f"SELECT {records.SESSION_COLS}, {records.MESSAGE_STATS} FROM sessions s "
            f"WHERE tenant_id = ? AND user_id = ? {status_filter} "
            "ORDER BY created_at_ms DESC, session_id DESC LIMIT ? OFFSET ?",
            [scope.tenant_id, scope.user_id, limit, offset],
        )
        return [records.session_from(r) for r in rows]

    def close_session(self, scope: Scope, session_id: str, at_ms: int) -> None:
        with self._tx() as c:
            c.execute(
                "UPDATE sessions SET status = ?, closed_at_ms = ?, updated_at_ms = ? "
                "WHERE tenant_id = ? AND user_id = ? AND session_id = ?",
                [int(SessionStatus.CLOSED), at_ms, at_ms, scope.tenant_id, scope.user_id, session_id],
            )

    # ------------------------------------------------------------------ messages
    def append_messages(
        self, scope: Scope, session_id: str, messages: Sequence[NewMessage], token_counts: Sequence[tuple[int, int]],
        now_ms: int, pinned: Sequence[tuple[int, str, int]] = (),
    ) -> list[Message]:
        """Store a batch atomically. Messages whose idempotency key is already stored in the session
        are not stored again; the stored row is returned in their place."""
        with self._lock:
            with self._tx() as c:
                key_params = [m.idempotency_key for m in messages if m.idempotency_key]
                existing: dict[str, Message] = {}
                if key_params:
                    marks = ", ".join("?" * len(key_params))
                    for r in c.execute(
                        f"SELECT {records.MESSAGE_COLS} FROM messages WHERE tenant_id = ? AND user_id = ? AND session_id = ? "
                        f"AND idempotency_key IN ({marks})",
                        [scope.tenant_id, scope.user_id, session_id, *key_params],
                    ).fetchall():
                        existing[r[13]] = records.message_from(r)
                seq_key = (scope.tenant_id, scope.user_id, session_id)
                next_seq = self._next_seq.get(seq_key)
                if next_seq is None:
                    next_seq = c.execute(
                        "SELECT coalesce(max(seq), 0) + 1 FROM messages WHERE tenant_id = ? AND user_id = ? "
                        "AND session_id = ?", [scope.tenant_id, scope.user_id, session_id]).fetchone()[0]
                plan = records.plan_append(scope, session_id, messages, token_counts, pinned, now_ms, existing, next_seq)
                self._insert_many(c, "messages", records.MESSAGE_COLS, plan.message_rows)
                self._insert_many(c, "pinned_constraints", records.PINNED_COLS, plan.pinned_rows)
            # Only this process writes the file, so the next sequence number can live in memory; it is
            # recorded after the commit so a rolled-back batch leaves no gap.
            self._next_seq[seq_key] = plan.next_seq
            return plan.out

    def import_sessions(self, scope: Scope, batch: Sequence[records.SessionImport]) -> None:
        """Store new sessions whole (rows, messages, pinned constraints, commit watermarks, after-turn
        jobs) in one transaction; AlreadyExists, and nothing stored, when one of the ids is taken."""
        ids = [b.session.session_id for b in batch]
        with self._lock:
            with self._tx() as c:
                taken = c.execute(
                    f"SELECT session_id FROM sessions WHERE tenant_id = ? AND user_id = ? AND session_id IN "
                    f"({', '.join('?' * len(ids))}) ORDER BY session_id",
                    [scope.tenant_id, scope.user_id, *ids]).fetchall()
                if taken:
                    raise AlreadyExists(f"session_id {taken[0][0]!r} already exists")
                for table, columns, rows in records.import_rows(scope, batch):
                    self._insert_many(c, table, columns, rows)
            for b in batch:
                self._next_seq[(scope.tenant_id, scope.user_id, b.session.session_id)] = b.plan.next_seq

    def list_messages(
        self, scope: Scope, session_id: str, *, newest: int = 0, from_seq: int = 0, to_seq: int = 0
    ) -> list[Message]:
        base = f"SELECT {records.MESSAGE_COLS} FROM messages WHERE tenant_id = ? AND user_id = ? AND session_id = ?"
        params: list[Any] = [scope.tenant_id, scope.user_id, session_id]
        if newest > 0:
            rows = self._query(base + " ORDER BY seq DESC LIMIT ?", [*params, newest])
            rows.reverse()
        else:
            sql = base + " AND seq >= ?"
            params.append(max(from_seq, 1))
            if to_seq > 0:
                sql += " AND seq <= ?"
                params.append(to_seq)
            rows = self._query(sql + " ORDER BY seq", params)
        return [records.message_from(r) for r in rows]

    def list_user_messages(self, scope: Scope, roles: Sequence[int], newest: int | None = None) -> list[Message]:
        """Every message of the user with one of `roles` (only the `newest` ones when given), sessions in
        creation order, turns in order. Sub-sessions' messages are left out: a sub-agent's work reaches
        other sessions only as its result summary."""
        cols = ", ".join(f"m.{c.strip()}" for c in records.MESSAGE_COLS.split(","))
        rows = self._query(
            f"SELECT {cols} FROM {records.USER_MESSAGES} WHERE m.tenant_id = ? AND m.user_id = ? AND s.parent_session_id = '' "
            f"AND m.role IN "
            f"({', '.join('?' * len(roles))}) ORDER BY {records.user_timeline_order(newest is not None)}"
            + (" LIMIT ?" if newest is not None else ""),
            [scope.tenant_id, scope.user_id, *[int(r) for r in roles], *([newest] if newest is not None else [])])
        return [records.message_from(r) for r in (rows[::-1] if newest is not None else rows)]

    def newest_session_with_messages(self, scope: Scope, excluding: Sequence[str]) -> tuple[int, str] | None:
        """(created_at_ms, session_id) of the user's last session in timeline order that holds a message,
        sub-sessions and `excluding` left out; None when there is none."""
        rows = self._query(
            "SELECT s.created_at_ms, s.session_id FROM sessions s WHERE s.tenant_id = ? AND s.user_id = ? "
            "AND s.parent_session_id = '' AND NOT list_contains(?, s.session_id) AND EXISTS (SELECT 1 FROM messages m "
            "WHERE m.tenant_id = s.tenant_id AND m.user_id = s.user_id AND m.session_id = s.session_id) "
            "ORDER BY s.created_at_ms DESC, s.session_id DESC LIMIT 1",
            [scope.tenant_id, scope.user_id, list(excluding)])
        return (rows[0][0], rows[0][1]) if rows else None

    # ------------------------------------------------------------------ facts
    def get_facts(self, scope: Scope, session_id: str) -> list[Fact]:
        rows = self._query(
            f"SELECT {records.FACT_COLS} FROM facts WHERE tenant_id = ? AND user_id = ? AND session_id = ? ORDER BY key, status",
            [scope.tenant_id, scope.user_id, session_id],
        )
        return [records.fact_from(r) for r in rows]

    def write_facts(
        self, scope: Scope, session_id: str, upserts: Sequence[Fact], deletes: Sequence[tuple[str, int]],
        changes: Sequence[FactChange], at_ms: int,
    ) -> None:
        """Replace fact rows (by key and status), delete others, and append history: one transaction."""
        owner = [scope.tenant_id, scope.user_id, session_id]
        with self._tx() as c:
            for key, status in [*deletes, *((f.key, int(f.status)) for f in upserts)]:
                c.execute("DELETE FROM facts WHERE tenant_id = ? AND user_id = ? AND session_id = ? AND key = ? "
                          "AND status = ?", [*owner, key, int(status)])
            self._insert_many(c, "facts", "tenant_id, user_id, session_id, " + records.FACT_COLS, [
                (*owner, f.key, f.value, int(f.provenance), f.source, f.updated_at_ms, int(f.status), f.version,
                 f.tokens) for f in upserts])
            self._insert_many(
                c, "fact_history",
                "tenant_id, user_id, session_id, key, version, status, value, provenance, source, at_ms, action, "
                "reason, tokens",
                [(*owner, ch.fact.key, ch.fact.version, int(ch.fact.status), ch.fact.value, int(ch.fact.provenance),
                  ch.fact.source, at_ms, ch.action, ch.reason, ch.fact.tokens) for ch in changes])
            c.execute("UPDATE sessions SET updated_at_ms = ? WHERE tenant_id = ? AND user_id = ? AND session_id = ?",
                      [at_ms, *owner])

    def fact_history(self, scope: Scope, session_id: str, key: str) -> list[FactChange]:
        rows = self._query(
            "SELECT key, value, provenance, source, at_ms, status, version, tokens, action, reason FROM fact_history "
            "WHERE tenant_id = ? AND user_id = ? AND session_id = ? AND key = ? ORDER BY version, at_ms",
            [scope.tenant_id, scope.user_id, session_id, key],
        )
        return [FactChange(fact=records.fact_from(r[:8]), action=r[8], reason=r[9]) for r in rows]

    # ------------------------------------------------------------------ runs
    def create_run(self, scope: Scope, run: Run) -> None:
        with self._tx() as c:
            self._insert_many(c, "runs", "tenant_id, user_id, " + records.RUN_COLS, [(
                scope.tenant_id, scope.user_id, run.run_id, run.session_id, int(run.status), run.goal, run.reason,
                run.created_at_ms, run.updated_at_ms)])

    def get_run(self, scope: Scope, run_id: str) -> Run | None:
        rows = self._query(
            f"SELECT {records.RUN_COLS}, (SELECT count(*) FROM run_checkpoints k WHERE k.tenant_id = r.tenant_id AND "
            "k.user_id = r.user_id AND k.run_id = r.run_id) FROM runs r "
            "WHERE tenant_id = ? AND user_id = ? AND run_id = ?",
            [scope.tenant_id, scope.user_id, run_id],
        )
        return records.run_from(rows[0], rows[0][-1]) if rows else None

    def update_run(self, scope: Scope, run: Run) -> None:
        with self._tx() as c:
            c.execute("UPDATE runs SET status = ?, reason = ?, updated_at_ms = ? "
                      "WHERE tenant_id = ? AND user_id = ? AND run_id = ?",
                      [int(run.status), run.reason, run.updated_at_ms, scope.tenant_id, scope.user_id, run.run_id])

    def add_checkpoint(self, scope: Scope, checkpoint: RunCheckpoint) -> None:
        with self._tx() as c:
            self._insert_many(c, "run_checkpoints",
                              "tenant_id, user_id, run_id, seq, checkpoint_id, state, pending_step, created_at_ms",
                              [(scope.tenant_id, scope.user_id, checkpoint.run_id, checkpoint.seq,
                                checkpoint.checkpoint_id, checkpoint.state, checkpoint.pending_step,
                                checkpoint.created_at_ms)])

    def last_checkpoint(self, scope: Scope, run_id: str) -> RunCheckpoint | None:
        rows = self._query(
            "SELECT checkpoint_id, run_id, seq, state, pending_step, created_at_ms FROM run_checkpoints "
            "WHERE tenant_id = ? AND user_id = ? AND run_id = ? ORDER BY seq DESC LIMIT 1",
            [scope.tenant_id, scope.user_id, run_id],
        )
        if not rows:
            return None
        r = rows[0]
        return RunCheckpoint(checkpoint_id=r[0], run_id=r[1], seq=r[2], state=bytes(r[3]), pending_step=r[4],
                             created_at_ms=r[5])

    # ------------------------------------------------------------------ jobs
    def enqueue_jobs(self, jobs: Sequence[Job]) -> None:
        with self._tx() as c:
            self._insert_many(c, "jobs", records.JOB_COLS, [records.job_row(j) for j in jobs])

    def get_job(self, scope: Scope, job_id: str) -> Job | None:
        rows = self._query(f"SELECT {records.JOB_COLS} FROM jobs WHERE tenant_id = ? AND user_id = ? AND job_id = ?",
                           [scope.tenant_id, scope.user_id, job_id])
        return records.job_from(rows[0]) if rows else None

    def get_jobs(self, scope: Scope, job_ids: Sequence[str]) -> list[Job]:
        """The user's jobs of these ids, in their order (an id not found left out), in one query."""
        if not job_ids:
            return []
        rows = self._query(f"SELECT {records.JOB_COLS} FROM jobs WHERE tenant_id = ? AND user_id = ? "
                           "AND job_id IN (SELECT unnest(?))", [scope.tenant_id, scope.user_id, list(set(job_ids))])
        return records.in_order(job_ids, [records.job_from(r) for r in rows])

    def unfinished_jobs(self, scope: Scope) -> list[Job]:
        rows = self._query(
            f"SELECT {records.JOB_COLS} FROM jobs WHERE tenant_id = ? AND user_id = ? AND status IN (?, ?) ORDER BY created_at_ms",
            [scope.tenant_id, scope.user_id, int(JobStatus.QUEUED), int(JobStatus.RUNNING)],
        )
        return [records.job_from(r) for r in rows]

    def claim_job(self, now_ms: int, kinds: Sequence[str] | None = None) -> Job | None:
        jobs = self.claim_jobs(now_ms, kinds)
        return jobs[0] if jobs else None

    def claim_jobs(self, now_ms: int, kinds: Sequence[str] | None = None, limit: int = 1) -> list[Job]:
        """The oldest `limit` queued jobs (of one of `kinds` when given), marked RUNNING in one transaction."""
        kind_filter = f" AND kind IN ({', '.join('?' * len(kinds))})" if kinds else ""
        with self._tx() as c:
            rows = c.execute(f"SELECT {records.JOB_COLS} FROM jobs WHERE status = ?{kind_filter} "
                             "ORDER BY created_at_ms, job_id LIMIT ?",
                             [int(JobStatus.QUEUED), *(kinds or []), limit]).fetchall()
            jobs = [records.job_from(r) for r in rows]
            if jobs:
                c.execute("UPDATE jobs SET status = ?, attempts = attempts + 1, updated_at_ms = ? "
                          "WHERE list_contains(?, job_id)",  # the ids as one list: a parameter each costs more
                          [int(JobStatus.RUNNING), now_ms, [j.job_id for j in jobs]])
            for job in jobs:
                job.status, job.attempts, job.updated_at_ms = JobStatus.RUNNING, job.attempts + 1, now_ms
            return jobs

    def finish_job(self, job: Job) -> None:
        self.finish_jobs([job])

    def finish_jobs(self, jobs: Sequence[Job]) -> None:
        """Write back the jobs' status, attempts, progress and result in one transaction."""
        if not jobs:
            return
        with self._tx() as c:
            # One statement for the batch, its values bound a list per column and unnested side by side
            # (an UPDATE per job costs a statement each; a parameter per value, 8 a job, ~4 ms a batch).
            c.execute("UPDATE jobs SET status = v.status, attempts = v.attempts, error = v.error, "
                      "done_items = v.done_items, total_items = v.total_items, updated_at_ms = v.updated_at_ms, "
                      "result = v.result FROM (SELECT " + ", ".join(f"unnest(?) AS {name}" for name in _JOB_UPDATE)
                      + ") AS v WHERE jobs.job_id = v.job_id",
                      [list(column) for column in zip(*map(records.job_update_row, jobs), strict=True)])

    def requeue_running_jobs(self) -> int:
        """At start-up, jobs a crashed process was running go back to the queue."""
        with self._tx() as c:
            n = c.execute("SELECT count(*) FROM jobs WHERE status = ?", [int(JobStatus.RUNNING)]).fetchone()[0]
            c.execute("UPDATE jobs SET status = ? WHERE status = ?", [int(JobStatus.QUEUED), int(JobStatus.RUNNING)])
            return n

    # ------------------------------------------------------------------ long-term memory
    def put_memories(self, scope: Scope, rows: Sequence[tuple[Memory, bytes]], changes: Sequence[MemoryChange]) -> None:
        """Insert or replace memory rows and append their history, in one transaction."""
        # A memory created in this write has no row to replace (a statement each costs ~1 ms); were one
        # there, the primary key would fail the insert and roll the whole write back.
        created = {ch.memory.memory_id for ch in changes if ch.action == "create"}
        with self._tx() as c:
            for m, _ in rows:
                if m.memory_id in created:
                    continue
                c.execute("DELETE FROM memories WHERE tenant_id = ? AND user_id = ? AND memory_id = ?",
                          [scope.tenant_id, scope.user_id, m.memory_id])
            self._insert_many(c, "memories", "tenant_id, user_id, " + records.MEMORY_COLS + ", embedding", [
                (scope.tenant_id, scope.user_id, m.memory_id, int(m.type), m.content, m.subject,
                 json.dumps(m.source_message_ids), m.confidence, int(m.authority), m.created_at_ms, m.updated_at_ms,
                 m.expires_at_ms, int(m.status), m.superseded_by, m.tokens, emb) for m, emb in rows])
            self._append_memory_history(c, scope, changes)

    def _append_memory_history(self, c: duckdb.DuckDBPyConnection, scope: Scope,
                               changes: Sequence[MemoryChange]) -> None:
        self._history_seq += 1
        self._insert_many(c, "memory_history",
                          "tenant_id, user_id, memory_id, at_ms, seq, action, reason, type, content, subject, "
                          "source_message_ids, confidence, authority, expires_at_ms, status, superseded_by",
                          [(scope.tenant_id, scope.user_id, ch.memory.memory_id, ch.at_ms, self._history_seq * 1000 + k,
                            ch.action, ch.reason, int(ch.memory.type), ch.memory.content, ch.memory.subject,
                            json.dumps(ch.memory.source_message_ids), ch.memory.confidence, int(ch.memory.authority),
                            ch.memory.expires_at_ms, int(ch.memory.status), ch.memory.superseded_by)
                           for k, ch in enumerate(changes)])

    def get_memory(self, scope: Scope, memory_id: str) -> Memory | None:
        rows = self._query(f"SELECT {records.MEMORY_COLS} FROM memories WHERE tenant_id = ? AND user_id = ? AND memory_id = ?",
                           [scope.tenant_id, scope.user_id, memory_id])
        return records.memory_from(rows[0]) if rows else None

    def list_memories(self, scope: Scope, *, limit: int, offset: int, types: Sequence[int], include_inactive: bool,
                      now_ms: int) -> list[Memory]:
        sql = f"SELECT {records.MEMORY_COLS} FROM memories WHERE tenant_id = ? AND user_id = ?"
        params: list[Any] = [scope.tenant_id, scope.user_id]
        if types:
            sql += f" AND type IN ({', '.join('?' * len(types))})"
            params += list(types)
        if not include_inactive:
            sql += " AND status = ? AND (expires_at_ms = 0 OR expires_at_ms > ?)"
            params += [int(MemoryStatus.ACTIVE), now_ms]
        rows = self._query(sql + " ORDER BY updated_at_ms DESC, memory_id LIMIT ? OFFSET ?", [*params, limit, offset])
        return [records.memory_from(r) for r in rows]

    def active_memories_with_embeddings(self, scope: Scope) -> list[tuple[Memory, bytes]]:
        rows = self._query(f"SELECT {records.MEMORY_COLS}, embedding FROM memories WHERE tenant_id = ? AND user_id = ? "
                           "AND status = ? ORDER BY created_at_ms, memory_id",
                           [scope.tenant_id, scope.user_id, int(MemoryStatus.ACTIVE)])
        return [(records.memory_from(r), bytes(r[-1])) for r in rows]

    def memories_with_embeddings(self, scope: Scope) -> list[tuple[Memory, bytes]]:
        """Every memory row of the user (active and superseded) with its vector, in creation order: a
        user's whole memory state in one query. Sorted here: DuckDB's ORDER BY costs more than the
        query for a user's few hundred rows, and its binary collation is Python's str order."""
        rows = self._query(f"SELECT {records.MEMORY_COLS}, embedding FROM memories WHERE tenant_id = ? AND user_id = ?",
                           [scope.tenant_id, scope.user_id])
        out = [(records.memory_from(r), bytes(r[-1])) for r in rows]
        out.sort(key=lambda row: (row[0].created_at_ms, row[0].memory_id))
        return out

    def memory_history(self, scope: Scope, memory_id: str) -> list[MemoryChange]:
        rows = self._query(
            "SELECT memory_id, type, content, subject, source_message_ids, confidence, authority, at_ms, at_ms, "
            "expires_at_ms, status, superseded_by, 0, action, reason, at_ms FROM memory_history "
            "WHERE tenant_id = ? AND user_id = ? AND memory_id = ? ORDER BY seq",
            [scope.tenant_id, scope.user_id, memory_id])
        return [MemoryChange(memory=records.memory_from(r[:13]), action=r[13], reason=r[14], at_ms=r[15]) for r in rows]

    def delete_memory(self, scope: Scope, memory_id: str, tombstone: MemoryChange,
                      unrecall: Sequence[str] = ()) -> None:
        """Deletion really deletes: the row and every earlier version; a contentless tombstone stays.
        `unrecall`: source turns that leave recall with it (recall_exclusions), in the same transaction."""
        owner = [scope.tenant_id, scope.user_id, memory_id]
        with self._tx() as c:
            c.execute("DELETE FROM memories WHERE tenant_id = ? AND user_id = ? AND memory_id = ?", owner)
            c.execute("DELETE FROM memory_history WHERE tenant_id = ? AND user_id = ? AND memory_id = ?", owner)
            self._append_memory_history(c, scope, [tombstone])
            self._insert_exclusions(c, scope, unrecall, "memory_deleted", tombstone.at_ms)

    # ------------------------------------------------------------------ after-turn commits
    def commit_watermark(self, scope: Scope, session_id: str) -> int:
        rows = self._query("SELECT upto_seq FROM turn_commits WHERE tenant_id = ? AND user_id = ? AND session_id = ?",
                           [scope.tenant_id, scope.user_id, session_id])
        return rows[0][0] if rows else 0

    def commit_turn(self, scope: Scope, session_id: str, upto_seq: int, jobs: Sequence[Job]) -> None:
        """Record the watermark and enqueue the after-turn jobs atomically."""
        owner = [scope.tenant_id, scope.user_id, session_id]
        with self._tx() as c:
            # An UPDATE, and an INSERT when there was no row: DuckDB's INSERT OR REPLACE with its read
            # costs twice as much.
            moved = c.execute("UPDATE turn_commits SET upto_seq = greatest(upto_seq, ?) WHERE tenant_id = ? "
                              "AND user_id = ? AND session_id = ?", [upto_seq, *owner]).fetchone()[0]
            if not moved:
                c.execute("INSERT INTO turn_commits VALUES (?, ?, ?, ?)", [*owner, upto_seq])
            self._insert_many(c, "jobs", records.JOB_COLS, [records.job_row(j) for j in jobs])

    # ------------------------------------------------------------------ forget
    def forget_user(self, scope: Scope) -> dict[str, int]:
        """Delete every row of the user in the tenant, in every table that holds user data."""
        counts: dict[str, int] = {}
        with self._tx() as c:
            for table in USER_TABLES:
                where = "WHERE tenant_id = ? AND user_id = ?"
                n = c.execute(f"SELECT count(*) FROM {table} {where}", [scope.tenant_id, scope.user_id]).fetchone()[0]
                if n:
                    c.execute(f"DELETE FROM {table} {where}", [scope.tenant_id, scope.user_id])
                counts[table] = n
        for key in [k for k in self._next_seq if k[0] == scope.tenant_id and k[1] == scope.user_id]:
            del self._next_seq[key]
        return counts

    # ------------------------------------------------------------------ compression layers
    def list_pinned(self, scope: Scope, session_id: str) -> list[PinnedConstraint]:
        rows = self._query(f"SELECT {records.PINNED_READ_COLS} FROM pinned_constraints WHERE "
                           "tenant_id = ? AND user_id = ? AND session_id = ? ORDER BY created_at_ms, idx",
                           [scope.tenant_id, scope.user_id, session_id])
        return [PinnedConstraint(*r) for r in rows]

    def unpin_constraint(self, scope: Scope, session_id: str, message_id: str, idx: int, by: str, reason: str,
                         at_ms: int) -> bool:
        with self._tx() as c:
            hit = c.execute("UPDATE pinned_constraints SET unpinned_at_ms = ?, unpinned_by = ?, unpin_reason = ? "
                            "WHERE tenant_id = ? AND user_id = ? AND session_id = ? AND message_id = ? AND idx = ? "
                            "AND unpinned_at_ms = 0 RETURNING idx",
                            [at_ms, by, reason, scope.tenant_id, scope.user_id, session_id, message_id, idx]).fetchall()
        return bool(hit)

    # ------------------------------------------------------------------ deleting sessions and messages
    def delete_messages(self, scope: Scope, session_id: str, message_ids: Sequence[str]) -> dict[str, int]:
        with self._tx() as c:
            counts = records.delete_messages(c, scope, session_id, message_ids, "?")
        return counts

    def delete_session(self, scope: Scope, session_id: str) -> tuple[dict[str, int], list[str]]:
        with self._tx() as c:
            counts, message_ids, ids = records.delete_sessions(c, scope, session_id, "?")
            for sid in ids:  # a session made again under this id starts at seq 1
                self._next_seq.pop((scope.tenant_id, scope.user_id, sid), None)
        return counts, message_ids

    # ------------------------------------------------------------------ idempotency and recall exclusions
    def get_idempotent(self, scope: Scope, method: str, key: str) -> tuple[str, bytes] | None:
        rows = self._query("SELECT request_hash, response FROM idempotency_keys WHERE tenant_id = ? AND user_id = ? "
                           "AND method = ? AND key = ?", [scope.tenant_id, scope.user_id, method, key])
        return (rows[0][0], bytes(rows[0][1])) if rows else None

    def put_idempotent(self, scope: Scope, method: str, key: str, request_hash: str, response: bytes,
                       at_ms: int) -> None:
        with self._tx() as c:
            c.execute("INSERT INTO idempotency_keys VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                      [scope.tenant_id, scope.user_id, method, key, request_hash, response, at_ms])

    def add_recall_exclusions(self, scope: Scope, message_ids: Sequence[str], reason: str, at_ms: int) -> None:
        with self._tx() as c:
            self._insert_exclusions(c, scope, message_ids, reason, at_ms)

    @staticmethod
    def _insert_exclusions(c, scope: Scope, message_ids: Sequence[str], reason: str, at_ms: int) -> None:
        if not message_ids:
            return
        c.executemany("INSERT INTO recall_exclusions VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                       [(scope.tenant_id, scope.user_id, m, reason, at_ms) for m in dict.fromkeys(message_ids)])

    def recall_exclusions(self, scope: Scope) -> set[str]:
        rows = self._query("SELECT message_id FROM recall_exclusions WHERE tenant_id = ? AND user_id = ?",
                           [scope.tenant_id, scope.user_id])
        return {r[0] for r in rows}

    def insert_tool_result(self, scope: Scope, result: ToolResult) -> None:
        with self._tx() as c:
            self._insert_many(c, "tool_results", "tenant_id, user_id, " + records.TOOL_COLS + ", full_text", [(
                scope.tenant_id, scope.user_id, result.tool_result_id, result.session_id, result.run_id,
                result.tool_name, result.call_id, int(result.status), result.tokens, result.lines, result.view_text,
                result.view_tokens, result.brief_text, result.brief_tokens, result.created_at_ms, result.full_text)])

    def get_tool_result(self, scope: Scope, tool_result_id: str) -> ToolResult | None:
        rows = self._query(f"SELECT {records.TOOL_COLS}, full_text FROM tool_results WHERE tenant_id = ? AND user_id = ? "
                           "AND tool_result_id = ?", [scope.tenant_id, scope.user_id, tool_result_id])
        return records.tool_from(rows[0]) if rows else None

    def recent_tool_results(self, scope: Scope, session_id: str, limit: int) -> list[ToolResult]:
        """Newest last, without the full text."""
        rows = self._query(f"SELECT {records.TOOL_COLS} FROM tool_results WHERE tenant_id = ? AND user_id = ? AND "
                           "session_id = ? ORDER BY created_at_ms DESC, tool_result_id DESC LIMIT ?",
                           [scope.tenant_id, scope.user_id, session_id, limit])
        return [records.tool_from(r) for r in reversed(rows)]

    def write_run_notes(self, scope: Scope, add: Sequence[RunNote], delete_ids: Sequence[str] = ()) -> None:
        """Add notes and delete folded ones in one transaction."""
        with self._tx() as c:
            for note_id in delete_ids:
                c.execute("DELETE FROM run_notes WHERE tenant_id = ? AND user_id = ? AND note_id = ?",
                          [scope.tenant_id, scope.user_id, note_id])
            self._insert_many(c, "run_notes", "tenant_id, user_id, " + records.NOTE_COLS, [
                (scope.tenant_id, scope.user_id, n.note_id, n.session_id, n.run_id, n.seq, n.text, n.tokens,
                 n.is_summary, json.dumps(n.folded_note_ids), n.created_at_ms) for n in add])

    def list_run_notes(self, scope: Scope, session_id: str) -> list[RunNote]:
        rows = self._query(f"SELECT {records.NOTE_COLS} FROM run_notes WHERE tenant_id = ? AND user_id = ? AND "
                           "session_id = ? ORDER BY run_id, seq", [scope.tenant_id, scope.user_id, session_id])
        return [records.note_from(r) for r in rows]

    def put_summary(self, scope: Scope, s: SessionSummary) -> None:
        with self._tx() as c:
            c.execute("DELETE FROM session_summaries WHERE tenant_id = ? AND user_id = ? AND session_id = ?",
                      [scope.tenant_id, scope.user_id, s.session_id])
            self._insert_many(c, "session_summaries", "tenant_id, user_id, session_id, text, tokens, "
                              "source_message_ids, covered_until_seq, state, updated_at_ms",
                              [(scope.tenant_id, scope.user_id, s.session_id, s.text, s.tokens,
                                json.dumps(s.source_message_ids), s.covered_until_seq, s.state, s.updated_at_ms)])

    def get_summary(self, scope: Scope, session_id: str) -> SessionSummary | None:
        rows = self._query("SELECT session_id, text, tokens, source_message_ids, covered_until_seq, state, "
                           "updated_at_ms FROM session_summaries WHERE tenant_id = ? AND user_id = ? AND "
                           "session_id = ?", [scope.tenant_id, scope.user_id, session_id])
        if not rows:
            return None
        r = rows[0]
        return SessionSummary(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5], r[6])

    def add_subsession_result(self, scope: Scope, r: SubSessionResult, close_child_at_ms: int) -> None:
        """Store the child's result and close the child session, atomically."""
        with self._tx() as c:
            self._insert_many(c, "subsession_results", "tenant_id, user_id, parent_session_id, child_session_id, "
                              "task, text, tokens, created_at_ms",
                              [(scope.tenant_id, scope.user_id, r.parent_session_id, r.child_session_id, r.task,
                                r.text, r.tokens, r.created_at_ms)])
            c.execute("UPDATE sessions SET status = ?, closed_at_ms = ?, updated_at_ms = ? WHERE tenant_id = ? AND "
                      "user_id = ? AND session_id = ?", [int(SessionStatus.CLOSED), close_child_at_ms,
                                                         close_child_at_ms, scope.tenant_id, scope.user_id,
                                                         r.child_session_id])

    def list_subsession_results(self, scope: Scope, parent_session_id: str) -> list[SubSessionResult]:
        rows = self._query("SELECT parent_session_id, child_session_id, task, text, tokens, created_at_ms FROM "
                           "subsession_results WHERE tenant_id = ? AND user_id = ? AND parent_session_id = ? "
                           "ORDER BY created_at_ms", [scope.tenant_id, scope.user_id, parent_session_id])
        return [SubSessionResult(*r) for r in rows]

    def get_messages(self, scope: Scope, session_id: str, message_ids: Sequence[str]) -> list[Message]:
        if not message_ids:
            return []
        marks = ", ".join("?" * len(message_ids))
        rows = self._query(f"SELECT {records.MESSAGE_COLS} FROM messages WHERE tenant_id = ? AND user_id = ? AND "
                           f"session_id = ? AND message_id IN ({marks}) ORDER BY seq",
                           [scope.tenant_id, scope.user_id, session_id, *message_ids])
        return [records.message_from(r) for r in rows]

    def stored_message_ids(self, scope: Scope, message_ids: Sequence[str]) -> set[str]:
        """Those of these ids that are the user's stored messages (not deleted)."""
        if not message_ids:
            return set()
        return {r[0] for r in self._query("SELECT message_id FROM messages WHERE tenant_id = ? AND user_id = ? AND "
                                          "list_contains(?, message_id)",
                                          [scope.tenant_id, scope.user_id, list(message_ids)])}

    def user_message_ids(self, scope: Scope) -> list[str]:
        """The ids of all the user's messages, of every session, in timeline order (list_user_messages')."""
        return [r[0] for r in self._query(
            f"SELECT m.message_id FROM {records.USER_MESSAGES} WHERE m.tenant_id = ? AND m.user_id = ? "
            f"ORDER BY {records.user_timeline_order(False)}", [scope.tenant_id, scope.user_id])]

    def get_user_messages(self, scope: Scope, message_ids: Sequence[str]) -> list[Message]:
        """The user's messages with these ids, from any of their sessions (by session, then seq): one
        query for what a batch of after-turn jobs reads."""
        if not message_ids:
            return []
        rows = self._query(f"SELECT {records.MESSAGE_COLS} FROM messages WHERE tenant_id = ? AND user_id = ? AND "
                           "list_contains(?, message_id) ORDER BY session_id, seq",
                           [scope.tenant_id, scope.user_id, list(message_ids)])
        return [records.message_from(r) for r in rows]

    # ------------------------------------------------------------------ knowledge base (tenant-shared)
    def add_document_version(self, tenant_id: str, doc: DocumentVersion, chunks: Sequence[KnowledgeChunk],
                             job: Job) -> int:
        """Store the next version of a document with its chunks and its indexing job, atomically.
        Returns the version number assigned."""
        with self._tx() as c:
            version = c.execute("SELECT coalesce(max(version), 0) + 1 FROM kb_documents WHERE tenant_id = ? AND "
                                "doc_id = ?", [tenant_id, doc.doc_id]).fetchone()[0]
            if doc.live:
                c.execute("UPDATE kb_documents SET live = false WHERE tenant_id = ? AND doc_id = ? AND live",
                          [tenant_id, doc.doc_id])
            self._insert_many(c, "kb_documents", "tenant_id, " + records.DOC_COLS, [(
                tenant_id, doc.doc_id, version, doc.title, doc.format, json.dumps(sorted(doc.allowed_roles)),
                json.dumps(doc.metadata, sort_keys=True), len(chunks), doc.live, False, doc.created_at_ms)])
            self._insert_many(c, "kb_chunks", "tenant_id, doc_id, version, chunk_index, heading, text, tokens",
                              [(tenant_id, doc.doc_id, version, ch.chunk_index, ch.heading, ch.text, ch.tokens)
                               for ch in chunks])
            job.payload["version"] = version
            self._insert_many(c, "jobs", records.JOB_COLS, [records.job_row(job)])
            return version

    def document_versions(self, tenant_id: str, doc_id: str | None = None, *, live_only: bool = False
                          ) -> list[DocumentVersion]:
        sql = f"SELECT {records.DOC_COLS} FROM kb_documents WHERE tenant_id = ?"
        params: list[Any] = [tenant_id]
        if doc_id is not None:
            sql += " AND doc_id = ?"
            params.append(doc_id)
        if live_only:
            sql += " AND live"
        return [records.doc_from(r) for r in self._query(sql + " ORDER BY doc_id, version", params)]

    def set_live_version(self, tenant_id: str, doc_id: str, version: int) -> None:
        with self._tx() as c:
            c.execute("UPDATE kb_documents SET live = (version = ?) WHERE tenant_id = ? AND doc_id = ?",
                      [version, tenant_id, doc_id])

    def mark_indexed(self, tenant_id: str, doc_id: str, version: int) -> None:
        with self._tx() as c:
            c.execute("UPDATE kb_documents SET indexed = true WHERE tenant_id = ? AND doc_id = ? AND version = ?",
                      [tenant_id, doc_id, version])

    def delete_document(self, tenant_id: str, doc_id: str) -> tuple[int, int]:
        with self._tx() as c:
            versions = c.execute("SELECT count(*) FROM kb_documents WHERE tenant_id = ? AND doc_id = ?",
                                 [tenant_id, doc_id]).fetchone()[0]
            chunks = c.execute("SELECT count(*) FROM kb_chunks WHERE tenant_id = ? AND doc_id = ?",
                               [tenant_id, doc_id]).fetchone()[0]
            c.execute("DELETE FROM kb_chunks WHERE tenant_id = ? AND doc_id = ?", [tenant_id, doc_id])
            c.execute("DELETE FROM kb_documents WHERE tenant_id = ? AND doc_id = ?", [tenant_id, doc_id])
            c.execute("DELETE FROM graph_edges WHERE tenant_id = ? AND starts_with(source, ?)",
                      [tenant_id, f"kb:{doc_id}@v"])
            return versions, chunks

    def chunks(self, tenant_id: str, doc_id: str | None = None, version: int | None = None, *,
               live_only: bool = False) -> list[KnowledgeChunk]:
        sql = ("SELECT c.doc_id, c.version, c.chunk_index, c.heading, c.text, c.tokens FROM kb_chunks c "
               "JOIN kb_documents d ON d.tenant_id = c.tenant_id AND d.doc_id = c.doc_id AND d.version = c.version "
               "WHERE c.tenant_id = ?")
        params: list[Any] = [tenant_id]
        if doc_id is not None:
            sql += " AND c.doc_id = ?"
            params.append(doc_id)
        if version is not None:
            sql += " AND c.version = ?"
            params.append(version)
        if live_only:
            sql += " AND d.live"
        rows = self._query(sql + " ORDER BY c.doc_id, c.version, c.chunk_index", params)
        return [KnowledgeChunk(*r) for r in rows]

    def knowledge_tenants(self) -> list[str]:
        return [r[0] for r in self._query("SELECT DISTINCT tenant_id FROM kb_documents ORDER BY 1")]

    def upsert_edges(self, tenant_id: str, edges: Sequence[GraphEdge]) -> None:
        with self._tx() as c:
            for e in edges:
                c.execute("DELETE FROM graph_edges WHERE tenant_id = ? AND edge_id = ?", [tenant_id, e.edge_id])
            self._insert_many(c, "graph_edges", "tenant_id, edge_id, subject, relation, object, source, "
                              "valid_from_ms, valid_to_ms",
                              [(tenant_id, e.edge_id, e.subject, e.relation, e.object, e.source, e.valid_from_ms,
                                e.valid_to_ms) for e in edges])

    def delete_edges(self, tenant_id: str, edge_ids: Sequence[str]) -> int:
        with self._tx() as c:
            n = 0
            for edge_id in edge_ids:
                n += c.execute("SELECT count(*) FROM graph_edges WHERE tenant_id = ? AND edge_id = ?",
                               [tenant_id, edge_id]).fetchone()[0]
                c.execute("DELETE FROM graph_edges WHERE tenant_id = ? AND edge_id = ?", [tenant_id, edge_id])
            return n

    def edges(self, tenant_id: str) -> list[GraphEdge]:
        rows = self._query("SELECT edge_id, subject, relation, object, source, valid_from_ms, valid_to_ms FROM "
                           "graph_edges WHERE tenant_id = ? ORDER BY edge_id", [tenant_id])
        return [GraphEdge(*r) for r in rows]

    def queue_depth(self) -> int:
        return self._query("SELECT count(*) FROM jobs WHERE status IN (?, ?)",
                           [int(JobStatus.QUEUED), int(JobStatus.RUNNING)])[0][0]
