"""Recent messages of the session: newest first in priority, conversational order in the prompt.

In the cache-aware layout the window starts where the rolling summary ends (the summary folds in
blocks, so the start moves in blocks too) and, when what is left is more than the budget allows,
at a multiple of STEP messages: consecutive calls share the whole history but its newest turns."""

from __future__ import annotations

import numpy as np

from sidecar.assembly.candidates import BuildInput, CandidateBatch, Section, SoftCategory
from sidecar.store.cache import MESSAGE_LINE_EXTRA

# Priority halves every this many turns back, so newer turns always outrank older ones.
HALF_LIFE_TURNS = 24.0
# Consider at most this multiple of the category budget (older turns belong to the summary).
WINDOW_FACTOR = 2
MAX_WINDOW_MESSAGES = 400
STEP = 8  # a window start forced by the budget moves by this many messages at once


class MessageSource:
    name = "messages"

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        tail = inp.view.tail  # one read: an append publishes a new tail meanwhile, never changes this one
        batch = CandidateBatch(category=SoftCategory.RECENT_MESSAGES, section=Section.RECENT_MESSAGES)
        if not tail.messages:
            return [batch]
        newest = tail.line_tokens[-MAX_WINDOW_MESSAGES:][::-1] + MESSAGE_LINE_EXTRA
        # Cache-aware: only what the budget holds, so the whole window is packed and its start is the
        # prompt's (classic: more, the selector keeps the newest that fit).
        factor = 1 if inp.cache_aware else WINDOW_FACTOR
        within = int(np.searchsorted(np.cumsum(newest), max(inp.budget.recent_messages * factor, 1), side="right"))
        start = len(tail.messages) - max(within, 1)
        if inp.cache_aware:
            start = _stepped_start(tail, start, inp)
        window = tail.messages[start:]
        n = len(window)
        batch.texts = tail.lines[start:]
        batch.sources = tail.sources[start:]
        batch.tokens = tail.line_tokens[start:] + MESSAGE_LINE_EXTRA
        batch.relevance = np.zeros(n)
        batch.age_s = np.zeros(n)
        batch.priority = 0.5 ** (np.arange(n - 1, -1, -1) / HALF_LIFE_TURNS)
        batch.meta = lambda j: (int(window[j].role), window[j].timestamp_ms, float(window[j].seq),
                                (window[j].message_id,))
        batch.order = tail.seqs[start:]  # conversational order in the prompt
        batch.bodies = tail.item_bodies[start:]
        batch.exact_keys = tail.exact_keys[start:]
        batch.simhashes = tail.simhashes[start:]
        return [batch]


def _stepped_start(tail, start: int, inp: BuildInput) -> int:
    """The first message after the summary's coverage, or a later multiple of STEP (counted from the
    session's first message) when the budget cannot hold everything since then."""
    summary = inp.view.summary
    covered = summary.covered_until_seq if summary is not None else 0
    after_summary = int(np.searchsorted(tail.seqs, covered, side="right")) if covered else 0
    offset = tail.messages[0].seq - 1  # the tail may hold only the session's newest messages
    if start <= after_summary:
        return after_summary
    return min(-(-(start + offset) // STEP) * STEP - offset, len(tail.messages) - 1)
