"""Recent messages of the session: newest first in priority, conversational order in the prompt."""

from __future__ import annotations

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
        limit = max(inp.budget.recent_messages * WINDOW_FACTOR, 1)
        msgs = view.messages
        start, spent = len(msgs), 0
        while start > 0 and len(msgs) - start < MAX_WINDOW_MESSAGES:
            spent += msgs[start - 1].line_tokens + 1
            if spent > limit:
                break
            start -= 1
        window = msgs[start:]
        n = len(window)
        batch = CandidateBatch(category=SoftCategory.RECENT_MESSAGES, section=Section.RECENT_MESSAGES)
        if n == 0:
            return [batch]
        batch.texts = [m.rendered for m in window]
        batch.sources = [f"message:{m.message_id}" for m in window]
        batch.tokens = [m.line_tokens + 1 for m in window]  # + the newline that separates it
        batch.relevance = [0.0] * n
        batch.age_s = [0.0] * n
        batch.priority = [0.5 ** ((n - 1 - i) / HALF_LIFE_TURNS) for i in range(n)]
        batch.roles = [int(m.role) for m in window]
        batch.timestamps = [m.timestamp_ms for m in window]
        batch.order_keys = [float(m.seq) for m in window]
        batch.source_message_ids = [(m.message_id,) for m in window]
        batch.exact_keys = view.exact_keys[start:]
        batch.simhashes = view.simhashes[start:]
        return [batch]
