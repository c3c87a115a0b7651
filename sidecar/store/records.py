"""Row layouts and row <-> domain conversions shared by the DuckDB and PostgreSQL backends (the two
schemas have the same tables and columns)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.domain import (
    Authority,
    DocumentVersion,
    Fact,
    FactStatus,
    Job,
    JobStatus,
    Memory,
    MemoryStatus,
    MemoryType,
    Message,
    NewMessage,
    Provenance,
    Role,
    Run,
    RunNote,
    RunStatus,
    Scope,
    Session,
    SessionStatus,
    ToolCall,
    ToolResult,
    ToolStatus,
)
from sidecar.ids import new_id

SESSION_COLS = ("tenant_id, user_id, session_id, title, status, created_at_ms, updated_at_ms, closed_at_ms, "
                 "parent_session_id, task, metadata")
MESSAGE_COLS = ("tenant_id, user_id, session_id, seq, message_id, role, text, tool_name, tool_call_id, "
                 "timestamp_ms, created_at_ms, tokens, line_tokens, idempotency_key, speaker, tool_calls")
FACT_COLS = "key, value, provenance, source, updated_at_ms, status, version, tokens"
RUN_COLS = "run_id, session_id, status, goal, reason, created_at_ms, updated_at_ms"
MEMORY_COLS = ("memory_id, type, content, subject, source_message_ids, confidence, authority, created_at_ms, "
                "updated_at_ms, expires_at_ms, status, superseded_by, tokens")
# Every table that holds a user's data; ForgetUser empties each of them for that user.
USER_TABLES = ("sessions", "messages", "facts", "fact_history", "runs", "run_checkpoints", "jobs", "memories",
               "memory_history", "turn_commits", "tool_results", "run_notes", "session_summaries",
               "pinned_constraints", "subsession_results", "idempotency_keys", "recall_exclusions")
TOOL_COLS = ("tool_result_id, session_id, run_id, tool_name, call_id, status, tokens, lines, view_text, view_tokens, "
              "brief_text, brief_tokens, created_at_ms")
DOC_COLS = ("doc_id, version, title, format, allowed_roles, metadata, chunk_count, live, indexed, "
             "created_at_ms")
NOTE_COLS = "note_id, session_id, run_id, seq, text, tokens, is_summary, folded_note_ids, created_at_ms"
JOB_COLS = ("job_id, tenant_id, user_id, kind, payload, status, attempts, error, done_items, total_items, "
             "created_at_ms, updated_at_ms, result")

# Message count and last message time of a session, so appends need not update the session row.
MESSAGE_STATS = ("(SELECT count(*) FROM messages m WHERE m.tenant_id = s.tenant_id AND m.user_id = s.user_id "
                  "AND m.session_id = s.session_id), (SELECT coalesce(max(created_at_ms), 0) FROM messages m "
                  "WHERE m.tenant_id = s.tenant_id AND m.user_id = s.user_id AND m.session_id = s.session_id)")


def session_from(row: tuple) -> Session:
    return Session(
        tenant_id=row[0], user_id=row[1], session_id=row[2], title=row[3], status=SessionStatus(row[4]),
        created_at_ms=row[5], updated_at_ms=max(row[6], row[12]), closed_at_ms=row[7], parent_session_id=row[8],
        task=row[9], metadata=json.loads(row[10]), message_count=row[11],
    )


def message_from(r: tuple) -> Message:
    return Message(
        session_id=r[2], seq=r[3], message_id=r[4], role=Role(r[5]), text=r[6], tool_name=r[7],
        tool_call_id=r[8], timestamp_ms=r[9], created_at_ms=r[10], tokens=r[11], line_tokens=r[12],
        idempotency_key=r[13], speaker=r[14], tool_calls=tool_calls_from(r[15]),
    )


def tool_calls_text(calls: Sequence[ToolCall]) -> str:
    """The tool_calls column: a JSON list of {id, name, arguments_json}, "" for none (most messages)."""
    if not calls:
        return ""
    return json.dumps([{"id": c.id, "name": c.name, "arguments_json": c.arguments_json} for c in calls],
                      ensure_ascii=False)


def tool_calls_from(text: str | None) -> tuple[ToolCall, ...]:
    if not text:
        return ()
    return tuple(ToolCall(c["id"], c["name"], c["arguments_json"]) for c in json.loads(text))


def fact_from(r: Sequence[Any]) -> Fact:
    return Fact(key=r[0], value=r[1], provenance=Provenance(r[2]), source=r[3], updated_at_ms=r[4],
                status=FactStatus(r[5]), version=r[6], tokens=r[7])


def run_from(r: tuple, checkpoints: int) -> Run:
    return Run(run_id=r[0], session_id=r[1], status=RunStatus(r[2]), goal=r[3], reason=r[4],
               created_at_ms=r[5], updated_at_ms=r[6], checkpoint_count=checkpoints)


def in_order(job_ids: Sequence[str], jobs: Sequence[Job]) -> list[Job]:
    """`jobs` (rows read for these ids) in the order of the ids asked for, once per id asked (get_jobs)."""
    by_id = {j.job_id: j for j in jobs}
    return [by_id[i] for i in job_ids if i in by_id]


def job_from(r: tuple) -> Job:
    return Job(job_id=r[0], tenant_id=r[1], user_id=r[2], kind=r[3], payload=json.loads(r[4]),
               status=JobStatus(r[5]), attempts=r[6], error=r[7], done_items=r[8], total_items=r[9],
               created_at_ms=r[10], updated_at_ms=r[11], result=json.loads(r[12]))


def job_row(j: Job) -> tuple:
    return (j.job_id, j.tenant_id, j.user_id, j.kind, json.dumps(j.payload), int(j.status), j.attempts, j.error,
            j.done_items, j.total_items, j.created_at_ms, j.updated_at_ms, json.dumps(j.result))


def job_update_row(j: Job) -> tuple:
    """What finishing (or giving back) a job writes: job_id, status, attempts, error, done_items,
    total_items, updated_at_ms, result."""
    return (j.job_id, int(j.status), j.attempts, j.error, j.done_items, j.total_items, j.updated_at_ms,
            json.dumps(j.result))


def memory_from(r: Sequence[Any]) -> Memory:
    return Memory(memory_id=r[0], type=MemoryType(r[1]), content=r[2], subject=r[3],
                  source_message_ids=json.loads(r[4]), confidence=r[5], authority=Authority(r[6]),
                  created_at_ms=r[7], updated_at_ms=r[8], expires_at_ms=r[9], status=MemoryStatus(r[10]),
                  superseded_by=r[11], tokens=r[12])


def tool_from(r: Sequence[Any]) -> ToolResult:
    return ToolResult(tool_result_id=r[0], session_id=r[1], run_id=r[2], tool_name=r[3], call_id=r[4],
                      status=ToolStatus(r[5]), tokens=r[6], lines=r[7], view_text=r[8], view_tokens=r[9],
                      brief_text=r[10], brief_tokens=r[11], created_at_ms=r[12],
                      full_text=r[13] if len(r) > 13 else "")


def note_from(r: Sequence[Any]) -> RunNote:
    return RunNote(note_id=r[0], session_id=r[1], run_id=r[2], seq=r[3], text=r[4], tokens=r[5],
                   is_summary=bool(r[6]), folded_note_ids=json.loads(r[7]), created_at_ms=r[8])


def doc_from(r: Sequence[Any]) -> DocumentVersion:
    return DocumentVersion(doc_id=r[0], version=r[1], title=r[2], format=r[3], allowed_roles=json.loads(r[4]),
                           metadata=json.loads(r[5]), chunk_count=r[6], live=bool(r[7]), indexed=bool(r[8]),
                           created_at_ms=r[9])


@dataclass(slots=True)
class AppendPlan:
    """What one AppendMessages batch stores: the messages to return (stored or replayed), the message
    rows and the pinned-constraint rows to insert, and the next free sequence number."""

    out: list[Message]
    message_rows: list[tuple]
    pinned_rows: list[tuple]
    next_seq: int


@dataclass(frozen=True, slots=True)
class SessionImport:
    """One session of an ImportSessions call: its row, its planned messages (sequence numbers from 1)
    and its after-turn jobs; stored with every other session of the call in one transaction.
    `cache_view`: a job queued for it reads its view, so the store's cache keeps the view it can make
    from what it stored (the job would load it from rows moments later)."""

    session: Session
    plan: AppendPlan
    jobs: list[Job]
    cache_view: bool = False


def session_row(scope: Scope, s: Session) -> tuple:
    return (scope.tenant_id, scope.user_id, s.session_id, s.title, int(s.status), s.created_at_ms, s.updated_at_ms,
            s.closed_at_ms, s.parent_session_id, s.task, json.dumps(s.metadata, sort_keys=True))


TURN_COMMIT_COLS = "tenant_id, user_id, session_id, upto_seq"


def import_rows(scope: Scope, batch: Sequence[SessionImport]) -> list[tuple[str, str, list[tuple]]]:
    """(table, columns, rows) of an ImportSessions call, every session's rows of a table together:
    a statement per table, not per session."""
    return [
        ("sessions", SESSION_COLS, [session_row(scope, b.session) for b in batch]),
        ("messages", MESSAGE_COLS, [r for b in batch for r in b.plan.message_rows]),
        ("pinned_constraints", PINNED_COLS, [r for b in batch for r in b.plan.pinned_rows]),
        ("turn_commits", TURN_COMMIT_COLS,
         [(scope.tenant_id, scope.user_id, b.session.session_id, b.plan.next_seq - 1) for b in batch]),
        ("jobs", JOB_COLS, [job_row(j) for b in batch for j in b.jobs]),
    ]


def plan_append(scope: Scope, session_id: str, messages: Sequence[NewMessage],
                token_counts: Sequence[tuple[int, int]], pinned: Sequence[tuple[int, str, int]], now_ms: int,
                existing: dict[str, Message], next_seq: int) -> AppendPlan:
    """Assign ids and sequence numbers. A message whose idempotency key is already stored (in
    `existing`) is replayed, not stored again; a key repeated inside the batch is stored once."""
    out: list[Message] = []
    rows = []
    stored_at: dict[int, str] = {}  # batch index -> id of a newly stored message
    for m, (tokens, line_tokens) in zip(messages, token_counts, strict=True):
        if m.idempotency_key and m.idempotency_key in existing:
            out.append(existing[m.idempotency_key])
            continue
        msg = Message(
            message_id=new_id("msg"), session_id=session_id, seq=next_seq, role=m.role, text=m.text,
            tool_name=m.tool_name, tool_call_id=m.tool_call_id, timestamp_ms=m.client_timestamp_ms or now_ms,
            created_at_ms=now_ms, tokens=tokens, line_tokens=line_tokens,
            idempotency_key=m.idempotency_key, speaker=m.speaker, tool_calls=tuple(m.tool_calls),
        )
        if m.idempotency_key:
            existing[m.idempotency_key] = msg
        stored_at[len(out)] = msg.message_id
        next_seq += 1
        out.append(msg)
        rows.append((scope.tenant_id, scope.user_id, session_id, msg.seq, msg.message_id, int(msg.role),
                     msg.text, msg.tool_name, msg.tool_call_id, msg.timestamp_ms, msg.created_at_ms,
                     msg.tokens, msg.line_tokens, msg.idempotency_key, msg.speaker,
                     tool_calls_text(msg.tool_calls)))
    # Pinned constraints are written with their message: a committed prohibition is never lost.
    pinned_rows = [(scope.tenant_id, scope.user_id, session_id, stored_at[i], k, text, n, now_ms)
                   for k, (i, text, n) in enumerate(pinned) if i in stored_at]
    return AppendPlan(out, rows, pinned_rows, next_seq)


PINNED_COLS = "tenant_id, user_id, session_id, message_id, idx, text, tokens, created_at_ms"
PINNED_READ_COLS = "message_id, idx, text, tokens, created_at_ms, unpinned_at_ms, unpinned_by, unpin_reason, session_id"


# A user's messages with their sessions (as m and s): the timeline's order and the sub-session test read both.
USER_MESSAGES = ("messages m JOIN sessions s ON s.tenant_id = m.tenant_id AND s.user_id = m.user_id "
                 "AND s.session_id = m.session_id")


def user_timeline_order(newest_first: bool) -> str:
    """ORDER BY of a user's messages over all sessions (joined as m and s): sessions in creation order,
    turns in order; reversed when only the newest are wanted (the caller reverses the rows back)."""
    d = " DESC" if newest_first else ""
    return f"s.created_at_ms{d}, m.session_id{d}, m.seq{d}"


# ------------------------------------------------------------------ deleting sessions and messages
# Tables keyed by session_id whose rows go with their session (run_checkpoints go by run,
# subsession_results by parent or child).
SESSION_TABLES = ("messages", "facts", "fact_history", "runs", "tool_results", "run_notes", "session_summaries",
                  "pinned_constraints", "turn_commits", "sessions")


def _in(ph: str, n: int) -> str:
    return "(" + ", ".join([ph] * n) + ")"


def _delete_counted(cur: Any, table: str, where: str, params: list, counts: dict[str, int]) -> None:
    cur.execute(f"SELECT count(*) FROM {table} WHERE {where}", params)
    n = cur.fetchall()[0][0]
    if n:
        cur.execute(f"DELETE FROM {table} WHERE {where}", params)
    counts[table] = counts.get(table, 0) + n


def delete_sessions(cur: Any, scope: Scope, session_id: str, ph: str) -> tuple[dict[str, int], list[str], list[str]]:
    """Delete a session and its sub-sessions (recursively) whole, inside the caller's transaction.
    Returns the rows deleted per table, the ids of the messages that went (for derived data) and of
    the sessions."""
    owner = [scope.tenant_id, scope.user_id]
    mine = f"tenant_id = {ph} AND user_id = {ph}"
    ids, frontier = [session_id], [session_id]
    while frontier:
        cur.execute(f"SELECT session_id FROM sessions WHERE {mine} AND parent_session_id IN {_in(ph, len(frontier))}",
                    [*owner, *frontier])
        frontier = [r[0] for r in cur.fetchall() if r[0] not in ids]
        ids += frontier
    within = f"{mine} AND session_id IN {_in(ph, len(ids))}"
    cur.execute(f"SELECT message_id FROM messages WHERE {within}", [*owner, *ids])
    message_ids = [r[0] for r in cur.fetchall()]
    counts: dict[str, int] = {}
    _delete_counted(cur, "run_checkpoints", f"{mine} AND run_id IN (SELECT run_id FROM runs WHERE {within})",
                    [*owner, *owner, *ids], counts)
    _delete_counted(cur, "subsession_results", f"{mine} AND (parent_session_id IN {_in(ph, len(ids))} OR "
                    f"child_session_id IN {_in(ph, len(ids))})", [*owner, *ids, *ids], counts)
    for table in SESSION_TABLES:
        _delete_counted(cur, table, within, [*owner, *ids], counts)
    if message_ids:
        _delete_counted(cur, "recall_exclusions", f"{mine} AND message_id IN {_in(ph, len(message_ids))}",
                        [*owner, *message_ids], counts)
    purge_answers(cur, scope, ph, counts)
    return counts, message_ids, ids


def delete_messages(cur: Any, scope: Scope, session_id: str, message_ids: Sequence[str], ph: str) -> dict[str, int]:
    """Delete messages of one session with what was made of them in that session: the constraints
    they pinned and the session's rolling summary (rebuilt from what is left by the next commit)."""
    owner = [scope.tenant_id, scope.user_id]
    mine, ids_in = f"tenant_id = {ph} AND user_id = {ph}", f"message_id IN {_in(ph, len(message_ids))}"
    counts: dict[str, int] = {}
    for table in ("messages", "pinned_constraints"):
        _delete_counted(cur, table, f"{mine} AND session_id = {ph} AND {ids_in}", [*owner, session_id, *message_ids],
                        counts)
    _delete_counted(cur, "recall_exclusions", f"{mine} AND {ids_in}", [*owner, *message_ids], counts)
    _delete_counted(cur, "session_summaries", f"{mine} AND session_id = {ph}", [*owner, session_id], counts)
    purge_answers(cur, scope, ph, counts)
    return counts


def purge_answers(cur: Any, scope: Scope, ph: str, counts: dict[str, int]) -> None:
    """Drop the user's stored idempotent answers: they may quote what is being deleted (an
    AppendMessages answer holds its messages). A retry in flight then runs again."""
    _delete_counted(cur, "idempotency_keys", f"tenant_id = {ph} AND user_id = {ph}", [scope.tenant_id, scope.user_id],
                    counts)
