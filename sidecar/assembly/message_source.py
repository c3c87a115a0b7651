"""Recent messages of the session: newest first in priority, conversational order in the prompt.

In the cache-aware layout the window starts where the rolling summary ends (the summary folds in
blocks, so the start moves in blocks too) and, when what is left is more than the budget allows,
at a multiple of STEP messages: consecutive calls share the whole history but its newest turns."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

import fastpath
from sidecar.assembly.candidates import BuildInput, CandidateBatch, Section, SoftCategory
from sidecar.compress.trim import tool_header
from sidecar.domain import Category, Role, ToolResult
from sidecar.store.cache import MESSAGE_LINE_EXTRA
from sidecar.tokens import TokenCounter

# Priority halves every this many turns back, so newer turns always outrank older ones.
HALF_LIFE_TURNS = 24.0
# Consider at most this multiple of the category budget (older turns belong to the summary).
WINDOW_FACTOR = 2
MAX_WINDOW_MESSAGES = 400
MAX_TOOL_ITEMS = 256  # a session's tool results' history items kept made (its view holds the newest 20)
STEP = 8  # a window start forced by the budget moves by this many messages at once


class MessageSource:
    name = "messages"

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        tail = inp.view.tail  # one read: an append publishes a new tail meanwhile, never changes this one
        batch = CandidateBatch(category=SoftCategory.RECENT_MESSAGES, section=Section.RECENT_MESSAGES)
        counter = inp.counter
        line_tokens, bodies = tail.counted(counter)  # the stored ones, or made once per tokenizer
        summary = inp.view.summary
        room = inp.budget.recent_messages - (counter.plus_newline(summary.text, summary.tokens)
                                             if inp.cache_aware and summary and summary.text else 0)
        # Cache-aware: the session's tool results belong to the history, each shown as it was recorded (its
        # view, or its brief when the view would take over a quarter of the history's room).
        tools = [_tool_item(inp.view.history_items, r, counter.of(r.view_text, r.view_tokens) <= room // 4, counter)
                 for r in inp.view.tool_results] if inp.cache_aware else []
        if not tail.messages:
            if tools:
                _add_tools(_empty(batch), tools, tail, [])
            return [batch]
        sizes = line_tokens + MESSAGE_LINE_EXTRA
        if tools:  # what the tool results after each message take, charged to that message
            anchor = np.searchsorted(tail.created, [t.at for t in tools], side="right") - 1
            sizes = sizes + np.bincount(np.maximum(anchor, 0), [t.tokens for t in tools], len(tail.messages))
        newest = sizes[-MAX_WINDOW_MESSAGES:][::-1]
        # Cache-aware: only what the budget holds beside the summary, so the whole window is packed and its
        # start is the prompt's (classic: more, the selector keeps the newest that fit).
        within = int(np.searchsorted(np.cumsum(newest), max(room * (1 if inp.cache_aware else WINDOW_FACTOR), 1),
                                     side="right"))
        start = len(tail.messages) - max(within, 1)
        if inp.cache_aware:
            start = _stepped_start(tail, start, inp)
        window = tail.messages[start:]
        n = len(window)
        batch.texts = tail.lines[start:]
        batch.sources = tail.sources[start:]
        batch.tokens = line_tokens[start:] + MESSAGE_LINE_EXTRA
        batch.relevance = np.zeros(n)
        batch.age_s = np.zeros(n)
        batch.priority = 0.5 ** (np.arange(n - 1, -1, -1) / HALF_LIFE_TURNS)
        batch.meta = lambda j: (int(window[j].role), window[j].timestamp_ms, float(window[j].seq),
                                (window[j].message_id,))
        batch.order = tail.seqs[start:]  # conversational order in the prompt
        batch.bodies = bodies[start:]
        batch.exact_keys = tail.exact_keys[start:]
        batch.simhashes = tail.simhashes[start:]
        shown = [t for t in tools if window and t.at >= window[0].created_at_ms]
        if shown:
            _add_tools(batch, shown, tail, window)
        return [batch]


def _tool_item(made: dict, r: ToolResult, view: bool, counter: TokenCounter) -> ToolItem:
    """A tool result in the history: its header and the view (or brief) made when it was recorded, the
    same on every call; its tokens and bytes made once per tokenizer and kept with the session's cached
    view (so they leave with it: an evicted, deleted or forgotten session keeps nothing here)."""
    key = (r.tool_result_id, view, counter)
    item = made.get(key)
    if item is None:
        source, text = f"tool:{r.tool_result_id}", f"{tool_header(r)}\n{r.view_text if view else r.brief_text}"
        tokens = counter.count_line(text)
        body = fastpath.encode_item(source, Category.TOOL_OBSERVATIONS, tokens, text, int(Role.TOOL),
                                    r.created_at_ms, ())
        if len(made) >= MAX_TOOL_ITEMS:
            made.clear()
        item = made[key] = ToolItem(source, text, tokens, body, r.created_at_ms)
    return item


class ToolItem(NamedTuple):
    source: str
    text: str
    tokens: int
    body: bytes
    at: int  # when it was recorded


def _add_tools(batch: CandidateBatch, tools: list[ToolItem], tail, window) -> None:
    """Tool results join the window after the message they followed, with its priority."""
    first = len(tail.messages) - len(window)
    at = np.maximum(np.searchsorted(tail.created[first:], [t.at for t in tools], side="right") - 1, 0)
    seqs = np.asarray(batch.order, np.float64)
    base = seqs[at] if len(seqs) else np.zeros(len(tools))  # no message yet: in the order recorded
    order = base + 0.5 + np.arange(len(tools)) * 1e-4
    texts = [t.text for t in tools]
    exact, sim = fastpath.text_keys(texts)
    n = len(batch.texts)
    metas = [(int(Role.TOOL), t.at, o, ()) for t, o in zip(tools, order.tolist(), strict=True)]
    own = batch.meta
    batch.meta = lambda j: own(j) if j < n else metas[j - n]
    batch.texts = [*batch.texts, *texts]
    batch.sources = [*batch.sources, *(t.source for t in tools)]
    batch.tokens = np.concatenate([batch.tokens, [t.tokens for t in tools]])
    batch.relevance = np.zeros(len(batch.texts))
    batch.age_s = np.zeros(len(batch.texts))
    own_priority = np.asarray(batch.priority, np.float64)
    batch.priority = np.concatenate([own_priority, own_priority[at] if len(own_priority) else np.ones(len(tools))])
    batch.order = np.concatenate([seqs, order])
    batch.bodies = [*batch.bodies, *(t.body for t in tools)]
    batch.exact_keys = np.concatenate([batch.exact_keys, exact])
    batch.simhashes = np.concatenate([batch.simhashes, sim])


def _empty(batch: CandidateBatch) -> CandidateBatch:
    batch.texts, batch.sources, batch.bodies = [], [], []
    batch.tokens, batch.priority, batch.order = np.zeros(0, np.int32), np.zeros(0), np.zeros(0)
    batch.exact_keys, batch.simhashes = np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    batch.meta = lambda j: (0, 0, None, ())
    return batch


def _stepped_start(tail, start: int, inp: BuildInput) -> int:
    """The first message after the summary's coverage or, when the budget cannot hold everything since
    then, the first later multiple of STEP messages (counted from the session's first message: a grid
    that, unlike one in tokens, never moves when old tool results leave the view)."""
    summary = inp.view.summary
    covered = summary.covered_until_seq if summary is not None else 0
    after_summary = int(np.searchsorted(tail.seqs, covered, side="right")) if covered else 0
    offset = tail.messages[0].seq - 1  # the tail may hold only the session's newest messages
    if start <= after_summary:
        return after_summary
    return min(-(-(start + offset) // STEP) * STEP - offset, len(tail.messages) - 1)
