"""Process-wide caches keyed by text: token counts, constraint keys, speaker-name patterns and a
model embedder's recent texts. A deletion (DeleteMemory, DeleteMessages, DeleteSession, ForgetUser)
clears them all, so deleted words do not live on in memory; they refill within a few calls."""

from __future__ import annotations

from sidecar.compress.constraints import constraint_key
from sidecar.memory.episodic import names_pattern
from sidecar.tokens import clear_caches


def clear(embedder: object = None) -> None:
    clear_caches()  # every tokenizer's counts by text
    constraint_key.cache_clear()
    names_pattern.cache_clear()
    forget = getattr(embedder, "forget_texts", None)
    if forget is not None:
        forget()
