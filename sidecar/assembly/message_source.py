"""Recent messages of the session: newest first in priority, conversational order in the prompt."""

from __future__ import annotations

import numpy as np

from sidecar.assembly.candidates import BuildInput, CandidateBatch, Section, SoftCategory

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
        # + 1: the newline that separates a line from the next one in the prompt.
        tail = view.line_tokens[-MAX_WINDOW_MESSAGES:][::-1] + 1
        within = int(np.searchsorted(np.cumsum(tail), max(inp.budget.recent_messages * WINDOW_FACTOR, 1),
                                     side="right"))
        start = len(view.messages) - max(within, 1)
        window = view.messages[start:]
        n = len(window)
        batch.texts = view.lines[start:]
        batch.sources = view.sources[start:]
        batch.tokens = view.line_tokens[start:] + 1
        batch.relevance = np.zeros(n)
        batch.age_s = np.zeros(n)
        batch.priority = 0.5 ** (np.arange(n - 1, -1, -1) / HALF_LIFE_TURNS)
        batch.meta = lambda j: (int(window[j].role), window[j].timestamp_ms, float(window[j].seq),
                                (window[j].message_id,))
        batch.exact_keys = view.exact_keys[start:]
        batch.simhashes = view.simhashes[start:]
        return [batch]
