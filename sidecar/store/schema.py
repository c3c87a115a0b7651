"""Versioned schema. Each migration runs once, in order, inside a transaction; the applied
versions are recorded in schema_migrations. Every user-data table carries tenant_id and user_id."""

from __future__ import annotations

MIGRATIONS: list[tuple[int, str, str]] = [
    (
        1,
        "sessions, messages, facts, runs, jobs",
        """
        CREATE TABLE sessions (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL,
            title VARCHAR NOT NULL, status SMALLINT NOT NULL,
            created_at_ms BIGINT NOT NULL, updated_at_ms BIGINT NOT NULL, closed_at_ms BIGINT NOT NULL,
            parent_session_id VARCHAR NOT NULL, task VARCHAR NOT NULL, metadata VARCHAR NOT NULL,
            PRIMARY KEY (tenant_id, user_id, session_id));
        CREATE TABLE messages (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL,
            seq BIGINT NOT NULL, message_id VARCHAR NOT NULL, role SMALLINT NOT NULL, text VARCHAR NOT NULL,
            tool_name VARCHAR NOT NULL, tool_call_id VARCHAR NOT NULL, timestamp_ms BIGINT NOT NULL,
            created_at_ms BIGINT NOT NULL, tokens INTEGER NOT NULL, line_tokens INTEGER NOT NULL,
            idempotency_key VARCHAR NOT NULL, speaker VARCHAR NOT NULL,
            PRIMARY KEY (tenant_id, user_id, session_id, seq));
        CREATE TABLE facts (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL,
            key VARCHAR NOT NULL, status SMALLINT NOT NULL, value VARCHAR NOT NULL,
            provenance SMALLINT NOT NULL, source VARCHAR NOT NULL, updated_at_ms BIGINT NOT NULL,
            version BIGINT NOT NULL, tokens INTEGER NOT NULL,
            PRIMARY KEY (tenant_id, user_id, session_id, key, status));
        CREATE TABLE fact_history (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL,
            key VARCHAR NOT NULL, version BIGINT NOT NULL, status SMALLINT NOT NULL, value VARCHAR NOT NULL,
            provenance SMALLINT NOT NULL, source VARCHAR NOT NULL, at_ms BIGINT NOT NULL,
            action VARCHAR NOT NULL, reason VARCHAR NOT NULL, tokens INTEGER NOT NULL);
        CREATE TABLE runs (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL,
            run_id VARCHAR NOT NULL, status SMALLINT NOT NULL, goal VARCHAR NOT NULL, reason VARCHAR NOT NULL,
            created_at_ms BIGINT NOT NULL, updated_at_ms BIGINT NOT NULL,
            PRIMARY KEY (tenant_id, user_id, run_id));
        CREATE TABLE run_checkpoints (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, run_id VARCHAR NOT NULL,
            seq BIGINT NOT NULL, checkpoint_id VARCHAR NOT NULL, state BLOB NOT NULL,
            pending_step VARCHAR NOT NULL, created_at_ms BIGINT NOT NULL,
            PRIMARY KEY (tenant_id, user_id, run_id, seq));
        CREATE TABLE jobs (
            job_id VARCHAR PRIMARY KEY, tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL,
            kind VARCHAR NOT NULL, payload VARCHAR NOT NULL, status SMALLINT NOT NULL,
            attempts INTEGER NOT NULL, error VARCHAR NOT NULL, done_items BIGINT NOT NULL,
            total_items BIGINT NOT NULL, created_at_ms BIGINT NOT NULL, updated_at_ms BIGINT NOT NULL,
            result VARCHAR NOT NULL);
        """,
    ),
    (
        2,
        "long-term memory with history; commit watermark per session",
        """
        CREATE TABLE memories (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, memory_id VARCHAR NOT NULL,
            type SMALLINT NOT NULL, content VARCHAR NOT NULL, subject VARCHAR NOT NULL,
            source_message_ids VARCHAR NOT NULL, confidence DOUBLE NOT NULL, authority SMALLINT NOT NULL,
            created_at_ms BIGINT NOT NULL, updated_at_ms BIGINT NOT NULL, expires_at_ms BIGINT NOT NULL,
            status SMALLINT NOT NULL, superseded_by VARCHAR NOT NULL, tokens INTEGER NOT NULL,
            embedding BLOB NOT NULL,
            PRIMARY KEY (tenant_id, user_id, memory_id));
        CREATE TABLE memory_history (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, memory_id VARCHAR NOT NULL,
            at_ms BIGINT NOT NULL, seq BIGINT NOT NULL, action VARCHAR NOT NULL, reason VARCHAR NOT NULL,
            type SMALLINT NOT NULL, content VARCHAR NOT NULL, subject VARCHAR NOT NULL,
            source_message_ids VARCHAR NOT NULL, confidence DOUBLE NOT NULL, authority SMALLINT NOT NULL,
            expires_at_ms BIGINT NOT NULL, status SMALLINT NOT NULL, superseded_by VARCHAR NOT NULL);
        CREATE TABLE turn_commits (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL,
            upto_seq BIGINT NOT NULL, PRIMARY KEY (tenant_id, user_id, session_id));
        """,
    ),
    (
        3,
        "tool results, run notes, rolling summaries, pinned constraints, sub-session results",
        """
        CREATE TABLE tool_results (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL,
            tool_result_id VARCHAR NOT NULL, run_id VARCHAR NOT NULL, tool_name VARCHAR NOT NULL,
            call_id VARCHAR NOT NULL, full_text VARCHAR NOT NULL, status SMALLINT NOT NULL, tokens INTEGER NOT NULL,
            lines INTEGER NOT NULL, view_text VARCHAR NOT NULL, view_tokens INTEGER NOT NULL,
            brief_text VARCHAR NOT NULL, brief_tokens INTEGER NOT NULL, created_at_ms BIGINT NOT NULL,
            PRIMARY KEY (tenant_id, user_id, tool_result_id));
        CREATE TABLE run_notes (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL,
            run_id VARCHAR NOT NULL, note_id VARCHAR NOT NULL, seq BIGINT NOT NULL, text VARCHAR NOT NULL,
            tokens INTEGER NOT NULL, is_summary BOOLEAN NOT NULL, folded_note_ids VARCHAR NOT NULL,
            created_at_ms BIGINT NOT NULL, PRIMARY KEY (tenant_id, user_id, note_id));
        CREATE TABLE session_summaries (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL,
            text VARCHAR NOT NULL, tokens INTEGER NOT NULL, source_message_ids VARCHAR NOT NULL,
            covered_until_seq BIGINT NOT NULL, state VARCHAR NOT NULL, updated_at_ms BIGINT NOT NULL,
            PRIMARY KEY (tenant_id, user_id, session_id));
        CREATE TABLE pinned_constraints (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, session_id VARCHAR NOT NULL,
            message_id VARCHAR NOT NULL, idx INTEGER NOT NULL, text VARCHAR NOT NULL, tokens INTEGER NOT NULL,
            created_at_ms BIGINT NOT NULL);
        CREATE TABLE subsession_results (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, parent_session_id VARCHAR NOT NULL,
            child_session_id VARCHAR NOT NULL, task VARCHAR NOT NULL, text VARCHAR NOT NULL,
            tokens INTEGER NOT NULL, created_at_ms BIGINT NOT NULL);
        """,
    ),
    (
        4,
        "knowledge base documents, chunks and graph edges (tenant-shared)",
        """
        CREATE TABLE kb_documents (
            tenant_id VARCHAR NOT NULL, doc_id VARCHAR NOT NULL, version INTEGER NOT NULL, title VARCHAR NOT NULL,
            format SMALLINT NOT NULL, allowed_roles VARCHAR NOT NULL, metadata VARCHAR NOT NULL,
            chunk_count INTEGER NOT NULL, live BOOLEAN NOT NULL, indexed BOOLEAN NOT NULL,
            created_at_ms BIGINT NOT NULL, PRIMARY KEY (tenant_id, doc_id, version));
        CREATE TABLE kb_chunks (
            tenant_id VARCHAR NOT NULL, doc_id VARCHAR NOT NULL, version INTEGER NOT NULL,
            chunk_index INTEGER NOT NULL, heading VARCHAR NOT NULL, text VARCHAR NOT NULL, tokens INTEGER NOT NULL,
            PRIMARY KEY (tenant_id, doc_id, version, chunk_index));
        CREATE TABLE graph_edges (
            tenant_id VARCHAR NOT NULL, edge_id VARCHAR NOT NULL, subject VARCHAR NOT NULL, relation VARCHAR NOT NULL,
            object VARCHAR NOT NULL, source VARCHAR NOT NULL, valid_from_ms BIGINT NOT NULL,
            valid_to_ms BIGINT NOT NULL, PRIMARY KEY (tenant_id, edge_id));
        """,
    ),
    (
        5,
        "idempotency keys, pinned constraint life cycle, recall exclusions",
        """
        CREATE TABLE idempotency_keys (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, method VARCHAR NOT NULL, key VARCHAR NOT NULL,
            request_hash VARCHAR NOT NULL, response BLOB NOT NULL, created_at_ms BIGINT NOT NULL,
            PRIMARY KEY (tenant_id, user_id, method, key));
        ALTER TABLE pinned_constraints ADD COLUMN unpinned_at_ms BIGINT DEFAULT 0;
        ALTER TABLE pinned_constraints ADD COLUMN unpinned_by VARCHAR DEFAULT '';
        ALTER TABLE pinned_constraints ADD COLUMN unpin_reason VARCHAR DEFAULT '';
        CREATE TABLE recall_exclusions (
            tenant_id VARCHAR NOT NULL, user_id VARCHAR NOT NULL, message_id VARCHAR NOT NULL,
            reason VARCHAR NOT NULL, at_ms BIGINT NOT NULL, PRIMARY KEY (tenant_id, user_id, message_id));
        """,
    ),
    (
        6,
        "assistant messages' tool calls",
        # A JSON list of {id, name, arguments_json}; '' for a message without tool calls (and every older row).
        """
        ALTER TABLE messages ADD COLUMN tool_calls VARCHAR DEFAULT '';
        """,
    ),
]

LATEST_VERSION = MIGRATIONS[-1][0]
