"""Versioned PostgreSQL schema: the same tables, columns, version numbers and descriptions as
sidecar/store/schema.py (DuckDB), translated to PostgreSQL types (VARCHAR -> text, BLOB -> bytea,
DOUBLE -> double precision), plus what only a shared, multi-replica database needs:

* Row-level security on every user-data table, ENABLEd and FORCEd (so the owning role that
  runs the sidecar is subject to it too; superusers and BYPASSRLS roles still skip RLS, which
  PostgresStore reports as `rls_enforced = False`). A row is visible / writable only when
      tenant_id = current_setting('sidecar.tenant_id', true)
      AND user_id = current_setting('sidecar.user_id', true)
  which PostgresStore sets with set_config(..., true) (transaction-local) from the Scope at the
  start of every transaction that touches user data. Knowledge-base tables (tenant-wide data) use
  `rls_ddl(table, tenant_only=True)`: only tenant_id is checked.
* System bypass: the same policies also admit every row when
      current_setting('sidecar.system', true) = 'on'
  PostgresStore sets that (transaction-local) ONLY in the transactions that legitimately work
  across users: the job worker (claim_job, finish_job, requeue_running_jobs), the change feed
  reads (changes_since, current_change_seq) and migrations. Nothing a client sends can set it:
  settings are only ever written by the store's own SQL with bound parameters.
* change_log: an append-only feed of writes (kind, key) for replicas; BIGSERIAL seq, appended in
  the writing transaction, announced with pg_notify('sidecar_changes', seq::text).

Each migration runs once, in order, in one transaction (under an advisory lock, so replicas that
start together do not race); applied versions are recorded in schema_migrations.
"""

from __future__ import annotations

from sidecar.store import records

NOTIFY_CHANNEL = "sidecar_changes"

_USER_PREDICATE = ("(tenant_id = nullif(current_setting('sidecar.tenant_id', true), '') "
                   "AND user_id = current_setting('sidecar.user_id', true))")
_TENANT_PREDICATE = "(tenant_id = nullif(current_setting('sidecar.tenant_id', true), ''))"
_SYSTEM_PREDICATE = "(current_setting('sidecar.system', true) = 'on')"


def rls_ddl(table: str, *, tenant_only: bool = False) -> str:
    """Enable and force row-level security on `table` with the scope policy and the system bypass."""
    scope = _TENANT_PREDICATE if tenant_only else _USER_PREDICATE
    cond = f"({scope} OR {_SYSTEM_PREDICATE})"
    return (f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY;\n"
            f"ALTER TABLE {table} FORCE ROW LEVEL SECURITY;\n"
            f"CREATE POLICY {table}_scope ON {table} USING {cond} WITH CHECK {cond};\n")


_V1_TABLES = ("sessions", "messages", "facts", "fact_history", "runs", "run_checkpoints", "jobs", "change_log")
_V2_TABLES = ("memories", "memory_history", "turn_commits")
_V3_TABLES = ("tool_results", "run_notes", "session_summaries", "pinned_constraints", "subsession_results")
_V4_TENANT_TABLES = ("kb_documents", "kb_chunks", "graph_edges")
_V5_TABLES = ("idempotency_keys", "recall_exclusions")

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "sessions, messages, facts, runs, jobs",
        """
        CREATE TABLE sessions (
            tenant_id text NOT NULL, user_id text NOT NULL, session_id text NOT NULL,
            title text NOT NULL, status smallint NOT NULL,
            created_at_ms bigint NOT NULL, updated_at_ms bigint NOT NULL, closed_at_ms bigint NOT NULL,
            parent_session_id text NOT NULL, task text NOT NULL, metadata text NOT NULL,
            PRIMARY KEY (tenant_id, user_id, session_id));
        CREATE INDEX sessions_by_created ON sessions (tenant_id, user_id, created_at_ms DESC, session_id DESC);
        CREATE TABLE messages (
            tenant_id text NOT NULL, user_id text NOT NULL, session_id text NOT NULL,
            seq bigint NOT NULL, message_id text NOT NULL, role smallint NOT NULL, text text NOT NULL,
            tool_name text NOT NULL, tool_call_id text NOT NULL, timestamp_ms bigint NOT NULL,
            created_at_ms bigint NOT NULL, tokens integer NOT NULL, line_tokens integer NOT NULL,
            idempotency_key text NOT NULL, speaker text NOT NULL,
            PRIMARY KEY (tenant_id, user_id, session_id, seq));
        CREATE INDEX messages_by_key ON messages (tenant_id, user_id, session_id, idempotency_key)
            WHERE idempotency_key <> '';
        CREATE INDEX messages_by_id ON messages (tenant_id, user_id, session_id, message_id);
        CREATE TABLE facts (
            tenant_id text NOT NULL, user_id text NOT NULL, session_id text NOT NULL,
            key text NOT NULL, status smallint NOT NULL, value text NOT NULL,
            provenance smallint NOT NULL, source text NOT NULL, updated_at_ms bigint NOT NULL,
            version bigint NOT NULL, tokens integer NOT NULL,
            PRIMARY KEY (tenant_id, user_id, session_id, key, status));
        CREATE TABLE fact_history (
            tenant_id text NOT NULL, user_id text NOT NULL, session_id text NOT NULL,
            key text NOT NULL, version bigint NOT NULL, status smallint NOT NULL, value text NOT NULL,
            provenance smallint NOT NULL, source text NOT NULL, at_ms bigint NOT NULL,
            action text NOT NULL, reason text NOT NULL, tokens integer NOT NULL);
        CREATE INDEX fact_history_by_key ON fact_history (tenant_id, user_id, session_id, key, version, at_ms);
        CREATE TABLE runs (
            tenant_id text NOT NULL, user_id text NOT NULL, session_id text NOT NULL,
            run_id text NOT NULL, status smallint NOT NULL, goal text NOT NULL, reason text NOT NULL,
            created_at_ms bigint NOT NULL, updated_at_ms bigint NOT NULL,
            PRIMARY KEY (tenant_id, user_id, run_id));
        CREATE TABLE run_checkpoints (
            tenant_id text NOT NULL, user_id text NOT NULL, run_id text NOT NULL,
            seq bigint NOT NULL, checkpoint_id text NOT NULL, state bytea NOT NULL,
            pending_step text NOT NULL, created_at_ms bigint NOT NULL,
            PRIMARY KEY (tenant_id, user_id, run_id, seq));
        CREATE TABLE jobs (
            job_id text PRIMARY KEY, tenant_id text NOT NULL, user_id text NOT NULL,
            kind text NOT NULL, payload text NOT NULL, status smallint NOT NULL,
            attempts integer NOT NULL, error text NOT NULL, done_items bigint NOT NULL,
            total_items bigint NOT NULL, created_at_ms bigint NOT NULL, updated_at_ms bigint NOT NULL,
            result text NOT NULL);
        CREATE INDEX jobs_by_status ON jobs (status, created_at_ms, job_id);
        CREATE INDEX jobs_by_owner ON jobs (tenant_id, user_id, status);
        CREATE TABLE change_log (
            seq bigserial PRIMARY KEY, tenant_id text NOT NULL, user_id text NOT NULL,
            kind text NOT NULL, key text NOT NULL, origin text NOT NULL DEFAULT '',
            at_ms bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint);
        CREATE INDEX change_log_by_owner ON change_log (tenant_id, user_id);
        """ + "".join(rls_ddl(t) for t in _V1_TABLES),
    ),
    (
        2,
        "long-term memory with history; commit watermark per session",
        """
        CREATE TABLE memories (
            tenant_id text NOT NULL, user_id text NOT NULL, memory_id text NOT NULL,
            type smallint NOT NULL, content text NOT NULL, subject text NOT NULL,
            source_message_ids text NOT NULL, confidence double precision NOT NULL, authority smallint NOT NULL,
            created_at_ms bigint NOT NULL, updated_at_ms bigint NOT NULL, expires_at_ms bigint NOT NULL,
            status smallint NOT NULL, superseded_by text NOT NULL, tokens integer NOT NULL,
            embedding bytea NOT NULL,
            PRIMARY KEY (tenant_id, user_id, memory_id));
        CREATE SEQUENCE memory_history_seq;
        CREATE TABLE memory_history (
            tenant_id text NOT NULL, user_id text NOT NULL, memory_id text NOT NULL,
            at_ms bigint NOT NULL, seq bigint NOT NULL DEFAULT nextval('memory_history_seq'),
            action text NOT NULL, reason text NOT NULL,
            type smallint NOT NULL, content text NOT NULL, subject text NOT NULL,
            source_message_ids text NOT NULL, confidence double precision NOT NULL, authority smallint NOT NULL,
            expires_at_ms bigint NOT NULL, status smallint NOT NULL, superseded_by text NOT NULL);
        ALTER SEQUENCE memory_history_seq OWNED BY memory_history.seq;
        CREATE INDEX memory_history_by_id ON memory_history (tenant_id, user_id, memory_id, seq);
        CREATE TABLE turn_commits (
            tenant_id text NOT NULL, user_id text NOT NULL, session_id text NOT NULL,
            upto_seq bigint NOT NULL, PRIMARY KEY (tenant_id, user_id, session_id));
        """ + "".join(rls_ddl(t) for t in _V2_TABLES),
    ),
    (
        3,
        "tool results, run notes, rolling summaries, pinned constraints, sub-session results",
        """
        CREATE TABLE tool_results (
            tenant_id text NOT NULL, user_id text NOT NULL, session_id text NOT NULL,
            tool_result_id text NOT NULL, run_id text NOT NULL, tool_name text NOT NULL,
            call_id text NOT NULL, full_text text NOT NULL, status smallint NOT NULL, tokens integer NOT NULL,
            lines integer NOT NULL, view_text text NOT NULL, view_tokens integer NOT NULL,
            brief_text text NOT NULL, brief_tokens integer NOT NULL, created_at_ms bigint NOT NULL,
            PRIMARY KEY (tenant_id, user_id, tool_result_id));
        CREATE INDEX tool_results_by_session ON tool_results (tenant_id, user_id, session_id, created_at_ms);
        CREATE TABLE run_notes (
            tenant_id text NOT NULL, user_id text NOT NULL, session_id text NOT NULL,
            run_id text NOT NULL, note_id text NOT NULL, seq bigint NOT NULL, text text NOT NULL,
            tokens integer NOT NULL, is_summary boolean NOT NULL, folded_note_ids text NOT NULL,
            created_at_ms bigint NOT NULL, PRIMARY KEY (tenant_id, user_id, note_id));
        CREATE INDEX run_notes_by_session ON run_notes (tenant_id, user_id, session_id, run_id, seq);
        CREATE TABLE session_summaries (
            tenant_id text NOT NULL, user_id text NOT NULL, session_id text NOT NULL,
            text text NOT NULL, tokens integer NOT NULL, source_message_ids text NOT NULL,
            covered_until_seq bigint NOT NULL, state text NOT NULL, updated_at_ms bigint NOT NULL,
            PRIMARY KEY (tenant_id, user_id, session_id));
        CREATE TABLE pinned_constraints (
            tenant_id text NOT NULL, user_id text NOT NULL, session_id text NOT NULL,
            message_id text NOT NULL, idx integer NOT NULL, text text NOT NULL, tokens integer NOT NULL,
            created_at_ms bigint NOT NULL);
        CREATE INDEX pinned_constraints_by_session ON pinned_constraints (tenant_id, user_id, session_id);
        CREATE TABLE subsession_results (
            tenant_id text NOT NULL, user_id text NOT NULL, parent_session_id text NOT NULL,
            child_session_id text NOT NULL, task text NOT NULL, text text NOT NULL,
            tokens integer NOT NULL, created_at_ms bigint NOT NULL);
        CREATE INDEX subsession_results_by_parent ON subsession_results (tenant_id, user_id, parent_session_id);
        """ + "".join(rls_ddl(t) for t in _V3_TABLES),
    ),
    (
        4,
        "knowledge base documents, chunks and graph edges (tenant-shared)",
        """
        CREATE TABLE kb_documents (
            tenant_id text NOT NULL, doc_id text NOT NULL, version integer NOT NULL, title text NOT NULL,
            format smallint NOT NULL, allowed_roles text NOT NULL, metadata text NOT NULL,
            chunk_count integer NOT NULL, live boolean NOT NULL, indexed boolean NOT NULL,
            created_at_ms bigint NOT NULL, PRIMARY KEY (tenant_id, doc_id, version));
        CREATE TABLE kb_chunks (
            tenant_id text NOT NULL, doc_id text NOT NULL, version integer NOT NULL,
            chunk_index integer NOT NULL, heading text NOT NULL, text text NOT NULL, tokens integer NOT NULL,
            PRIMARY KEY (tenant_id, doc_id, version, chunk_index));
        CREATE TABLE graph_edges (
            tenant_id text NOT NULL, edge_id text NOT NULL, subject text NOT NULL, relation text NOT NULL,
            object text NOT NULL, source text NOT NULL, valid_from_ms bigint NOT NULL,
            valid_to_ms bigint NOT NULL, PRIMARY KEY (tenant_id, edge_id));
        """ + "".join(rls_ddl(t, tenant_only=True) for t in _V4_TENANT_TABLES),
    ),
    (
        5,
        "idempotency keys, pinned constraint life cycle, recall exclusions",
        """
        CREATE TABLE idempotency_keys (
            tenant_id text NOT NULL, user_id text NOT NULL, method text NOT NULL, key text NOT NULL,
            request_hash text NOT NULL, response bytea NOT NULL, created_at_ms bigint NOT NULL,
            PRIMARY KEY (tenant_id, user_id, method, key));
        ALTER TABLE pinned_constraints ADD COLUMN unpinned_at_ms bigint NOT NULL DEFAULT 0;
        ALTER TABLE pinned_constraints ADD COLUMN unpinned_by text NOT NULL DEFAULT '';
        ALTER TABLE pinned_constraints ADD COLUMN unpin_reason text NOT NULL DEFAULT '';
        CREATE TABLE recall_exclusions (
            tenant_id text NOT NULL, user_id text NOT NULL, message_id text NOT NULL,
            reason text NOT NULL, at_ms bigint NOT NULL, PRIMARY KEY (tenant_id, user_id, message_id));
        """ + "".join(rls_ddl(t) for t in _V5_TABLES),
    ),
    (
        6,
        "assistant messages' tool calls",
        # A JSON list of {id, name, arguments_json}; '' for a message without tool calls (and every older row).
        """
        ALTER TABLE messages ADD COLUMN tool_calls text NOT NULL DEFAULT '';
        """,
    ),
]

LATEST_VERSION = MIGRATIONS[-1][0]

# Every table that holds a user's data is the same list as DuckDB's (records.USER_TABLES): forget_user
# empties each of them for the user and reports a count per table. change_log is emptied for the user
# too, but is not reported (it holds keys, not content, and is not a DuckDB table).
USER_TABLES = records.USER_TABLES
# Tenant-shared tables (knowledge base): RLS checks tenant_id only; ForgetUser does not touch them.
TENANT_TABLES = _V4_TENANT_TABLES
