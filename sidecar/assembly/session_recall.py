"""The session's recall, kept (cache-aware layout). What a session's first call recalls (past turns,
memories, knowledge) is kept as one block before the history, and each later call shows the same
block, so a provider serves it from its cache; what a call recalls beyond it goes after the history.
The block is made again when its epoch changes: the summary folds (the history's start moves, so
the prefix after the state changes anyway), the user's memories or recall index change (a write, an
edit, a deletion: nothing stale or deleted is ever shown), the tenant's knowledge changes, or the
call's roles, budgets or layout differ; and when it no longer serves the question: a block made for
another question, with what fits after it, must show most of what this call would recall on its own
(recall_covered), or the call's own recall becomes the block. Kept in memory per session, bounded."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

from sidecar.assembly.candidates import CandidateBatch, Section

MAX_SESSIONS = 4096
RECALLED = (Section.MEMORIES, Section.KNOWLEDGE)  # the sections a block is made of
# A kept block stays while it and what a call recalls after it show at least this share of what the
# call would recall on its own (by score); below it the block is made again from the call's own recall.
KEEP_COVER = 0.8
SERVED_KEPT = 32  # questions a block remembers serving


class RecallBlock:
    """A session's kept recall: the packed sections of the call that made it. Its Item objects and
    source tags are made only when asked for (a text rendering, a later call of the session), so making
    a block costs a new session's first call nothing."""

    def __init__(self, epoch: tuple, sections: Sequence) -> None:
        self.epoch = epoch
        self._sections = sections
        self.bodies: list[bytes] = [b for p in sections for b in p.bodies]
        self.scores: list[float] = [s for p in sections for s in p.scores]
        self.tokens: int = sum(p.tokens for p in sections)
        self.by_section: dict[Section, int] = {p.kind: p.tokens for p in sections}  # taken from each budget
        self._items: list | None = None
        self._sources: frozenset[str] | None = None
        self._served: OrderedDict[bytes, None] = OrderedDict()  # digests of questions it served (recall_covered)

    def serves(self, ask: bytes) -> bool:
        """Whether this question (a digest of its query, time of asking, client vector) was found served by the block:
        within one epoch its recall is the same, so the check is not made again (a tool loop's calls)."""
        return ask in self._served

    def served(self, ask: bytes) -> None:
        self._served[ask] = None
        while len(self._served) > SERVED_KEPT:
            self._served.popitem(last=False)

    @property
    def items(self) -> list:
        if self._items is None:
            self._items = [it for p in self._sections for it in p.items]
        return self._items

    @property
    def sources(self) -> frozenset[str]:
        if self._sources is None:
            self._sources = frozenset(src for src, _ in _recalled(self._sections))
        return self._sources


class SessionRecall:
    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._blocks: OrderedDict[tuple[str, str, str], RecallBlock] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str], epoch: tuple) -> RecallBlock | None:
        with self._lock:
            block = self._blocks.get(key)
            if block is None or block.epoch != epoch:
                return None
            self._blocks.move_to_end(key)
            return block

    def keep(self, key: tuple[str, str, str], epoch: tuple, sections: Sequence) -> RecallBlock:
        """The block of this call's recalled sections (packed, in render order)."""
        block = RecallBlock(epoch, [p for p in sections if p.kind in RECALLED and p.bodies])
        with self._lock:
            self._blocks[key] = block
            self._blocks.move_to_end(key)
            while len(self._blocks) > self.max_sessions:
                self._blocks.popitem(last=False)
        return block

    def drop_user(self, tenant_id: str, user_id: str) -> int:
        """Forget the user's kept blocks (a deletion: they may quote what was deleted)."""
        with self._lock:
            gone = [k for k in self._blocks if k[0] == tenant_id and k[1] == user_id]
            for k in gone:
                del self._blocks[k]
        return len(gone)


def _recalled(sections: Sequence) -> Iterator[tuple[str, float]]:
    """(source, score) of each item of the recalled sections."""
    for p in sections:
        if p.kind in RECALLED:
            yield from zip(p.item_sources if p.item_sources is not None else [it.source for it in p.items],
                           p.scores, strict=True)


def recall_covered(own: Sequence, block: RecallBlock, after: Sequence) -> float:
    """The share of the score of what a call recalls on its own (`own`, its packed sections without a
    block) that the block and what the call recalls after it (`after`'s sections) show: 1 when it
    recalls nothing. A tool loop's calls (one question) find all of it there; another question's may not."""
    total = held = 0.0
    shown = block.sources | {source for source, _ in _recalled(after)}
    for source, score in _recalled(own):
        total += score
        held += score if source in shown else 0.0
    return held / total if total > 0 else 1.0


def leave_out(batches: Sequence[CandidateBatch], block: RecallBlock) -> None:
    """This call's candidates that the block already shows are not chosen again."""
    for b in batches:
        kept = block.sources
        if b.section in RECALLED and len(b) and not kept.isdisjoint(b.sources):  # the common case, in C
            shown = {j for j, source in enumerate(b.sources) if source in kept}
            if shown:
                b.exclude(shown)


