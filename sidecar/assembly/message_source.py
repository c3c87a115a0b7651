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
        tail = inp.view.tail  # one read: an append publishes a new tail meanwhile, never changes this one
        batch = CandidateBatch(category=SoftCategory.RECENT_MESSAGES, section=Section.RECENT_MESSAGES)
        if not tail.messages:
            return [batch]
        newest = tail.line_tokens[-MAX_WINDOW_MESSAGES:][::-1] + MESSAGE_LINE_EXTRA
        within = int(np.searchsorted(np.cumsum(newest), max(inp.budget.recent_messages * WINDOW_FACTOR, 1),
                                     side="right"))
        start = len(tail.messages) - max(within, 1)
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
