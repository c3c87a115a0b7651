"""BuildContext inputs from the compression layers: the pinned constraints (hard zone), the rolling
summary (with recent messages), and tool results, run notes and sub-agent results."""

from __future__ import annotations

import threading

from sidecar.assembly.builder import CATEGORY_SESSION_STATE, Item
from sidecar.assembly.candidates import BuildInput, CandidateBatch, Section, SoftCategory
from sidecar.compress.trim import tool_header, trim_tool_output
from sidecar.domain import Scope, ToolResult
from sidecar.services.pinned import PinnedService
from sidecar.store.cache import SessionView

LATEST_PRIORITY, OLDER_PRIORITY, NOTE_PRIORITY, SUBSESSION_PRIORITY = 1.0, 0.5, 0.6, 0.9


def pinned_items(pinned: PinnedService, scope: Scope, view: SessionView) -> list[Item]:
    """The active pinned constraints verbatim, in PinnedService.shown's order (the parent sessions'
    first, each session's oldest first), a near duplicate once: its item stands for the messages of
    the ones merged into it too."""
    items = []
    for s in pinned.shown(scope, view):
        p = s.constraint
        message_ids = tuple(dict.fromkeys([p.message_id, *(m.message_id for m in s.merged)]))
        items.append(Item(f"pinned:{p.message_id}#{p.idx}", CATEGORY_SESSION_STATE, 0.0, p.tokens, p.text,
                          timestamp_ms=p.created_at_ms, source_message_ids=message_ids))
    return items


class SummarySource:
    name = "summary"

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        s = inp.view.summary
        batch = CandidateBatch(category=SoftCategory.RECENT_MESSAGES, section=Section.SUMMARY)
        if s is None or not s.text:
            return [batch]
        batch.texts, batch.sources = [s.text], [f"summary:{s.session_id}"]
        batch.tokens = [inp.counter.plus_newline(s.text, s.tokens)]
        batch.relevance, batch.age_s, batch.priority = [0.0], [0.0], [LATEST_PRIORITY]
        ids = tuple(s.source_message_ids)
        batch.meta = lambda j: (0, s.updated_at_ms, None, ids)
        return [batch]


class ToolObservationSource:
    name = "tool_observations"

    def __init__(self, store) -> None:
        self.store = store
        self._retrimmed: dict[tuple[str, int, str], tuple[str, int]] = {}  # (id, budget, tokenizer) -> view
        self._lock = threading.Lock()

    def _view_for(self, inp: BuildInput, r: ToolResult) -> tuple[str, int]:
        """The latest result's view; re-trimmed (once per budget and tokenizer, cached) when the call's
        budget is smaller."""
        counter = inp.counter
        budget = inp.budget.tool_observations - counter.cached(tool_header(r)) - 2
        view_tokens = counter.of(r.view_text, r.view_tokens)
        if view_tokens <= budget:
            return r.view_text, view_tokens
        key = (r.tool_result_id, budget, counter.name)
        with self._lock:
            hit = self._retrimmed.get(key)
        if hit is None:
            full = self.store.get_tool_result(inp.scope, r.tool_result_id)
            view = trim_tool_output(full.full_text if full else "", budget_tokens=max(budget, 0),
                                    count_tokens=counter.count, focus_terms=inp.query_terms,
                                    result_id=r.tool_result_id)
            hit = (view.text, view.tokens)
            with self._lock:
                if len(self._retrimmed) > 10_000:
                    self._retrimmed.clear()
                self._retrimmed[key] = hit
        return hit

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        view, counter = inp.view, inp.counter
        batch = CandidateBatch(category=SoftCategory.TOOL_OBSERVATIONS, section=Section.TOOL_OBSERVATIONS)
        if inp.budget.tool_observations <= 0:
            return [batch]
        texts, sources, toks, prio, metas = [], [], [], [], []
        # Cache-aware: tool results are part of the history (MessageSource); notes and sub-agents' results stay.
        results = [] if inp.cache_aware else view.tool_results
        for k, r in enumerate(reversed(results)):
            body, body_tokens = self._view_for(inp, r) if k == 0 else (r.brief_text,
                                                                       counter.of(r.brief_text, r.brief_tokens))
            header = tool_header(r)
            texts.append(f"{header}\n{body}")
            toks.append(counter.cached(header) + body_tokens + 2)
            sources.append(f"tool:{r.tool_result_id}")
            prio.append(LATEST_PRIORITY if k == 0 else OLDER_PRIORITY * 0.8 ** k)
            metas.append((0, r.created_at_ms, float(-r.created_at_ms), ()))
        for note in view.notes.get(inp.run_id, []) if inp.run_id else []:
            texts.append(note.text)
            toks.append(counter.plus_newline(note.text, note.tokens))
            sources.append(f"note:{note.note_id}")
            prio.append(NOTE_PRIORITY)
            metas.append((0, note.created_at_ms, float(note.seq), ()))
        for res in view.subsession_results:
            texts.append(res.text)
            toks.append(counter.plus_newline(res.text, res.tokens))
            sources.append(f"subsession:{res.child_session_id}")
            prio.append(SUBSESSION_PRIORITY)
            metas.append((0, res.created_at_ms, float(res.created_at_ms), ()))
        n = len(texts)
        batch.texts, batch.sources, batch.tokens, batch.priority = texts, sources, toks, prio
        batch.relevance, batch.age_s = [0.0] * n, [0.0] * n
        batch.meta = metas.__getitem__
        batch.order = [m[2] for m in metas]
        return [batch]
