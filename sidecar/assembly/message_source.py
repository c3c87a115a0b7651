"""Recent messages of the session: newest first in priority, conversational order in the prompt."""

from __future__ import annotations

import numpy as np

from sidecar.assembly.candidates import BuildInput, CandidateBatch, Section, SoftCategory
from sidecar.store.cache import MESSAGE_LINE_EXTRA

# Priority halves every this many turns back, so newer turns always outrank older ones.
HALF_LIFE_TURNS = 24.0
# Consider at most this multiple of the category budget (older turns belong to the summary).
WINDOW_FACTOR = 2
MAX_WINDOW_MESSAGES = 400


class MessageSource:
    name = "messages"

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        view = inp.view
        batch = CandidateBatch(category=SoftCategory.RECENT_MESSAGES, section=Section.RECENT_MESSAGES)
        if not view.messages:
            return [batch]
        tail = view.line_tokens[-MAX_WINDOW_MESSAGES:][::-1] + MESSAGE_LINE_EXTRA
        within = int(np.searchsorted(np.cumsum(tail), max(inp.budget.recent_messages * WINDOW_FACTOR, 1),
                                     side="right"))
        start = len(view.messages) - max(within, 1)
        window = view.messages[start:]
        n = len(window)
        batch.texts = view.lines[start:]
        batch.sources = view.sources[start:]
        batch.tokens = view.line_tokens[start:] + MESSAGE_LINE_EXTRA
        batch.relevance = np.zeros(n)
        batch.age_s = np.zeros(n)
        batch.priority = 0.5 ** (np.arange(n - 1, -1, -1) / HALF_LIFE_TURNS)
        batch.meta = lambda j: (int(window[j].role), window[j].timestamp_ms, float(window[j].seq),
                                (window[j].message_id,))
        batch.order = view.seqs[start:]  # conversational order in the prompt
        batch.bodies = view.item_bodies[start:]
        batch.exact_keys = view.exact_keys[start:]
        batch.simhashes = view.simhashes[start:]
        return [batch]
