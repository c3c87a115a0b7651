"""The compression layers: tool results (full text stored, trimmed views shown), bounded run notes
that fold, the rolling session summary (a job after the turn), and sub-agent sessions."""

from __future__ import annotations

import bisect
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sidecar import tokens
from sidecar.clock import now_ms
from sidecar.compress.summarize import ExtractiveSummarizer, Summarizer, Summary, SummaryItem
from sidecar.compress.trim import trim_tool_output
from sidecar.domain import (
    Job,
    Message,
    Provenance,
    RunNote,
    Scope,
    Session,
    SessionSummary,
    SubSessionResult,
    ToolResult,
    ToolStatus,
)
from sidecar.errors import FailedPrecondition, NotFound
from sidecar.ids import check_id, check_text, new_id
from sidecar.secrets import mask, redact
from sidecar.services.facts import FactInput, FactService
from sidecar.services.runs import RunService
from sidecar.services.sessions import SessionService
from sidecar.store.cache import SessionView
from sidecar.text import terms
from sidecar.textmodel import Turn

SUMMARY_JOB = "update_summary"
FOLD_DOWN_TO = 0.5  # of the summary window: what a fold leaves verbatim
# A fold comes early, once the verbatim turns pass this share of the window, when the session's next
# prompt differs before the summary anyway (a fact or a pinned constraint changed since its last one):
# the summary and history are sent again then, so the fold costs no cached prefix of its own.
EARLY_FOLD_AT = 0.75
MAX_TOOL_TEXT = 8 * 1024 * 1024
MAX_NOTE_TEXT = 16 * 1024


@dataclass(frozen=True, slots=True)
class CompressionSettings:
    view_tokens: int = 1500  # trimmed view of the latest tool result
    brief_tokens: int = 300  # trimmed view of older tool results
    max_notes_per_run: int = 12
    max_note_tokens_per_run: int = 1500
    keep_newest_notes: int = 4
    note_summary_tokens: int = 300
    # Turns newer than this many tokens stay verbatim; older ones fold into the rolling summary.
    summary_window_tokens: int = 4000
    summary_tokens: int = 800


def focus_terms(view: SessionView) -> set[str]:
    """What makes a tool-output line relevant: the confirmed state and the latest user question."""
    focus = set()
    for f in view.confirmed.values():
        focus.update(terms(f.value))
        focus.add(f.value.lower())
    last_user = next((m for m in reversed(view.messages) if m.role == 1), None)
    if last_user is not None:
        focus.update(t for t in terms(last_user.text) if len(t) > 2)
    return {t for t in focus if t}


class CompressionService:
    def __init__(self, sessions: SessionService, facts: FactService, runs: RunService,
                 settings: CompressionSettings = CompressionSettings(), summarizer: Summarizer | None = None) -> None:
        self.sessions = sessions
        self.facts = facts
        self.runs = runs
        self.store = sessions.store
        self.settings = settings
        self.summarizer = summarizer or ExtractiveSummarizer()
        # Whether a session's next prompt changes before the summary anyway (set by the app: the builder
        # knows what its last prompt was built on).
        self.head_moved: Callable[[Scope, SessionView], bool] = lambda scope, view: False

    # ------------------------------------------------------------------ tool results
    def record_tool_result(self, scope: Scope, session_id: str, run_id: str, tool_name: str, call_id: str,
                           full_text: str, status: ToolStatus) -> ToolResult:
        check_id(run_id, "run_id", required=False)
        check_id(call_id, "call_id", required=False)
        check_text(tool_name, "tool_name", 256, required=True)
        check_text(full_text, "full_text", MAX_TOOL_TEXT)
        full_text = mask(full_text)[0]  # a credential in tool output is never stored
        view = self.sessions.open_view(scope, session_id)
        result_id = new_id("tool")
        focus = focus_terms(view) | {tool_name.lower()}
        trimmed = [trim_tool_output(full_text, budget_tokens=b, count_tokens=tokens.count_tokens, focus_terms=focus,
                                    result_id=result_id) for b in (self.settings.view_tokens, self.settings.brief_tokens)]
        result = ToolResult(tool_result_id=result_id, session_id=session_id, run_id=run_id, tool_name=tool_name,
                            call_id=call_id, status=status, tokens=tokens.count_tokens(full_text),
                            lines=full_text.count("\n") + 1 if full_text else 0, view_text=trimmed[0].text,
                            view_tokens=trimmed[0].tokens, brief_text=trimmed[1].text, brief_tokens=trimmed[1].tokens,
                            created_at_ms=now_ms(), full_text=full_text)
        self.store.insert_tool_result(scope, result)
        return result

    def get_tool_result(self, scope: Scope, session_id: str, tool_result_id: str) -> ToolResult:
        check_id(tool_result_id, "tool_result_id")
        self.sessions.view(scope, session_id)
        result = self.store.get_tool_result(scope, tool_result_id)
        if result is None or result.session_id != session_id:
            raise NotFound(f"tool_result_id {tool_result_id!r} not found in session {session_id!r}")
        return result

    # ------------------------------------------------------------------ run notes
    def add_run_note(self, scope: Scope, session_id: str, run_id: str, text: str) -> RunNote:
        check_text(text, "text", MAX_NOTE_TEXT, required=True)
        view = self.sessions.open_view(scope, session_id)
        self.runs.get(scope, session_id, run_id)  # the run must exist in this session
        existing = view.notes.get(run_id, [])
        clean = mask(text)[0]
        note = RunNote(note_id=new_id("note"), session_id=session_id, run_id=run_id,
                       seq=(existing[-1].seq + 1) if existing else 1, text=clean,
                       tokens=tokens.count_tokens(clean) + 1, is_summary=False, folded_note_ids=[],
                       created_at_ms=now_ms())
        notes = [*existing, note]
        s = self.settings
        over = len(notes) > s.max_notes_per_run or sum(n.tokens for n in notes) > s.max_note_tokens_per_run
        if over and len(notes) > s.keep_newest_notes:  # else nothing is old enough to fold (one long note)
            folded, kept = notes[: -s.keep_newest_notes], notes[-s.keep_newest_notes:]
            summary = self.summarizer.update(None, [Turn(n.note_id, "assistant", n.text) for n in folded],
                                             max_tokens=s.note_summary_tokens, count_tokens=tokens.count_tokens)
            text_out = summary.text or "; ".join(n.text for n in folded)[:2000]
            fold = RunNote(note_id=new_id("note"), session_id=session_id, run_id=run_id, seq=folded[0].seq,
                           text=text_out, tokens=tokens.count_tokens(text_out) + 1, is_summary=True,
                           folded_note_ids=[i for n in folded for i in (n.folded_note_ids or [n.note_id])],
                           created_at_ms=note.created_at_ms)
            stored_new = [fold] + [n for n in kept if n is note]
            self.store.write_run_notes(scope, stored_new, [n.note_id for n in folded if n is not note])
        else:
            self.store.write_run_notes(scope, [note])
        return note

    def list_run_notes(self, scope: Scope, session_id: str, run_id: str) -> list[RunNote]:
        check_id(run_id, "run_id")
        return list(self.sessions.view(scope, session_id).notes.get(run_id, []))

    # ------------------------------------------------------------------ rolling summary (a job)
    def may_fold(self, messages: Sequence[Message]) -> bool:
        """Whether a session holding only these messages (no summary, no tool results) could fold any
        into a summary (update_summary's rule, at its lower threshold): an imported session's summary
        job is queued only then, not loaded from rows to find nothing to do."""
        return sum(m.line_tokens + 1 for m in messages) > self.settings.summary_window_tokens * EARLY_FOLD_AT

    def handle_summary_job(self, job: Job) -> dict[str, str]:
        scope = Scope(job.tenant_id, job.user_id)
        view = self.store.session_view(scope, job.payload["session_id"])
        if view is None:
            return {"skipped": "session gone"}
        return self.update_summary(scope, view)

    def update_summary(self, scope: Scope, view: SessionView) -> dict[str, str]:
        """Fold turns that left the verbatim window into the summary, incrementally."""
        covered = view.summary.covered_until_seq if view.summary else 0
        window = self.settings.summary_window_tokens
        verbatim = [m for m in view.messages if m.seq > covered]
        # What each turn keeps in the history: its line and the briefs of the tool results after it (the
        # prompt's history shows a past turn's tool results as their briefs).
        kept = [m.line_tokens + 1 for m in verbatim]
        if verbatim and view.tool_results:
            created = [m.created_at_ms for m in verbatim]
            for r in view.tool_results:
                at = bisect.bisect_right(created, r.created_at_ms) - 1
                if at >= 0:
                    kept[at] += r.brief_tokens
        # Fold in blocks: only once the verbatim turns outgrow the window (or most of it, when the next
        # prompt changes before the summary anyway), and then down to half of it, so the summary (and the
        # prompt's prefix through the history) changes once per half window, not after every turn.
        spent, cutoff = 0, 0
        if sum(kept) > (window * EARLY_FOLD_AT if self.head_moved(scope, view) else window):
            for m, size in zip(reversed(verbatim), reversed(kept), strict=True):
                spent += size
                if spent > window * FOLD_DOWN_TO:
                    cutoff = m.seq
                    break
        fold = [m for m in verbatim if m.seq <= cutoff]
        if not fold:
            return {"folded": "0"}
        previous = _restore(view.summary)
        summary = self.summarizer.update(
            previous, [Turn(m.message_id, m.role.label, m.text, m.speaker or None, m.timestamp_ms) for m in fold],
            max_tokens=self.settings.summary_tokens, count_tokens=tokens.count_tokens)
        text = redact(summary.text)
        self.store.put_summary(scope, SessionSummary(
            session_id=view.session.session_id, text=text, tokens=tokens.count_tokens(text) + 1,
            source_message_ids=list(summary.source_message_ids), covered_until_seq=cutoff,
            state=json.dumps([asdict(i) for i in summary.items]), updated_at_ms=now_ms()))
        return {"folded": str(len(fold)), "covered_until_seq": str(cutoff), "summary_tokens": str(summary.tokens)}

    # ------------------------------------------------------------------ sub-agents
    def create_sub_session(self, scope: Scope, parent_session_id: str, session_id: str, task: str,
                           fact_keys: list[str]) -> Session:
        check_text(task, "task", MAX_NOTE_TEXT, required=True)
        parent = self.sessions.open_view(scope, parent_session_id)
        for i, key in enumerate(fact_keys):
            if key not in parent.confirmed:
                raise NotFound(f"fact_keys[{i}] {key!r} is not a confirmed fact of session {parent_session_id!r}")
        child = self.sessions.create(scope, session_id, f"sub-agent of {parent_session_id}", {},
                                     parent_session_id=parent_session_id, task=redact(task))
        handed = [FactInput(k, parent.confirmed[k].value, parent.confirmed[k].provenance, f"handoff:{parent_session_id}")
                  for k in fact_keys]
        # The parent agent words the task, not the user: a candidate, never confirmed state (nor handed on
        # as confirmed to a grandchild). The child still sees it: BuildContext shows the session's task.
        # The parent's pinned constraints are not copied: PinnedService reads them at every call.
        handed.append(FactInput("task", child.task, Provenance.MODEL_INFERRED, f"handoff:{parent_session_id}"))
        self.facts.upsert(scope, child.session_id, handed)
        return child

    def complete_sub_session(self, scope: Scope, session_id: str, result_summary: str) -> SubSessionResult:
        check_text(result_summary, "result_summary", MAX_NOTE_TEXT, required=True)
        child = self.sessions.view(scope, session_id).session
        if not child.parent_session_id:
            raise FailedPrecondition(f"session_id {session_id!r} is not a sub-session")
        if child.status != 1:
            raise FailedPrecondition(f"session_id {session_id!r} is already completed")
        text = f"Sub-agent result for {child.task!r}: {redact(result_summary)}"
        at = now_ms()
        result = SubSessionResult(parent_session_id=child.parent_session_id, child_session_id=session_id,
                                  task=child.task, text=text, tokens=tokens.count_tokens(text) + 1, created_at_ms=at)
        self.store.add_subsession_result(scope, result, at)
        return result


def _restore(stored: SessionSummary | None) -> Summary | None:
    if stored is None:
        return None
    items: tuple[SummaryItem, ...] = ()
    if stored.state:
        raw: list[dict[str, Any]] = json.loads(stored.state)
        items = tuple(SummaryItem(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items()}) for d in raw)
    return Summary(text=stored.text, tokens=stored.tokens, source_message_ids=list(stored.source_message_ids),
                   entities=set(), covered_until_message_id=None, items=items)

