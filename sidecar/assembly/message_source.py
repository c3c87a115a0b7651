"""Recent messages of the session: newest first in priority, conversational order in the prompt.

In the cache-aware layout the window starts where the rolling summary ends (the summary folds in
blocks, so the start moves in blocks too) and, when what is left is more than the budget allows,
at the start of a block of history (half the room, counted in the tokens each message will keep):
consecutive calls share the whole history but its newest turns. Tool results join the history after
the message they followed: those of the current turn (since the user last spoke) as their view, paid
from the tool observations' budget as this call's observations are, earlier ones as their brief, paid
from the history's; a turn's outputs shrink once, when the user speaks next, and then stay put."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

import fastpath
from sidecar.assembly.candidates import (
    DROP_OVER_BUDGET,
    BuildInput,
    CandidateBatch,
    DropRun,
    Section,
    SoftCategory,
)
from sidecar.compress.trim import tool_header
from sidecar.domain import Category, Role, ToolResult
from sidecar.store.cache import MAX_CACHED_TOOL_RESULTS, MESSAGE_LINE_EXTRA
from sidecar.tokens import TokenCounter

# Priority halves every this many turns back, so newer turns always outrank older ones.
HALF_LIFE_TURNS = 24.0
# Consider at most this multiple of the category budget (older turns belong to the summary).
WINDOW_FACTOR = 2
MAX_WINDOW_MESSAGES = 400
MAX_TOOL_ITEMS = 256  # a session's tool results' history items kept made (its view holds the newest ones)
BLOCKS_PER_ROOM = 2  # a window start forced by the budget moves by this share of the room at once
VIEW_RESERVE = 4  # a session with tool results keeps 1/4 of the room for the turn's growth (lines, briefs)


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
        sizes = line_tokens + MESSAGE_LINE_EXTRA
        views: list[tuple[int, ToolItem]] = []
        if inp.cache_aware:
            start, tools, views = _cache_aware_window(inp, tail, sizes, room)
        else:  # more than the budget holds: the selector keeps the newest that fit
            tools = []
            start = len(tail.messages) - _newest_within(sizes, room * WINDOW_FACTOR)
        if not tail.messages:
            _empty(batch)
            batches = [batch, _view_batch(views, tail, [], batch)] if views else [batch]
            if tools:
                _add_tools(batch, tools, tail, [])
            return batches
        window = tail.messages[start:]
        n = len(window)
        # Messages before the window that no summary folds in yet (a turn not committed) are dropped, and
        # said so, with the tool outputs that followed them.
        first = int(np.searchsorted(tail.seqs[:start], summary.covered_until_seq, side="right")) if summary else 0
        if first < start:
            batch.dropped_runs.append(DropRun(tail.sources[first:start][::-1], SoftCategory.RECENT_MESSAGES,
                                              DROP_OVER_BUDGET, sizes[first:start][::-1]))
            span = (int(tail.created[first]), window[0].created_at_ms)
            batch.dropped_runs += [run for run in (_outputs_left(tools, span, SoftCategory.RECENT_MESSAGES),
                                                   _outputs_left(views, span, SoftCategory.TOOL_OBSERVATIONS)) if run]
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
        shown = [(i, t) for i, t in tools if window and t.at >= window[0].created_at_ms]
        views = [(i, t) for i, t in views if window and t.at >= window[0].created_at_ms]
        batches = [batch]
        if views:  # before the briefs join the history batch: its arrays are the messages' alone
            batches.append(_view_batch(views, tail, window, batch))
        if shown:
            _add_tools(batch, shown, tail, window)
        return batches


def _outputs_left(items: list[tuple[int, ToolItem]], span: tuple[int, int], category: SoftCategory
                  ) -> DropRun | None:
    """The tool outputs recorded within span (ms, from the first message no summary folds to the
    window's first), which the window leaves out with those messages, newest first."""
    left = sorted((t for _, t in items if span[0] <= t.at < span[1]), key=lambda t: -t.at)
    return DropRun([t.source for t in left], category, DROP_OVER_BUDGET, [t.tokens for t in left]) if left else None


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


def _placed(tools: list[tuple[int, ToolItem]], tail, window, history: CandidateBatch
            ) -> tuple[np.ndarray, np.ndarray]:
    """Each tool result's place in the history, after the message it followed (results of one message in
    the order recorded: `tools` pairs each with its index among the session's results), and that
    message's priority."""
    first = len(tail.messages) - len(window)
    at = np.maximum(np.searchsorted(tail.created[first:], [t.at for _, t in tools], side="right") - 1, 0)
    seqs = np.asarray(history.order, np.float64)
    base = seqs[at] if len(seqs) else np.zeros(len(tools))  # no message yet: in the order recorded
    order = base + 0.5 + np.asarray([i for i, _ in tools], np.float64) * 1e-4
    priority = np.asarray(history.priority, np.float64)
    return order, priority[at] if len(priority) else np.ones(len(tools))


def _tool_batch(tools: list[tuple[int, ToolItem]], tail, window, history: CandidateBatch, category: SoftCategory,
                anchored_priority: bool) -> CandidateBatch:
    """Tool results placed in the history after the message they followed, packed under `category`'s
    budget; with `anchored_priority`, each with that message's priority (else the newest's, 1)."""
    order, priority = _placed(tools, tail, window, history)
    items = [t for _, t in tools]
    texts = [t.text for t in items]
    exact, sim = fastpath.text_keys(texts)
    metas = [(int(Role.TOOL), t.at, o, ()) for t, o in zip(items, order.tolist(), strict=True)]
    n = len(items)
    return CandidateBatch(category=category, section=Section.RECENT_MESSAGES, texts=texts,
                          sources=[t.source for t in items], tokens=np.asarray([t.tokens for t in items], np.int32),
                          relevance=np.zeros(n), age_s=np.zeros(n),
                          priority=priority if anchored_priority else np.ones(n), meta=metas.__getitem__,
                          order=order, bodies=[t.body for t in items], exact_keys=exact, simhashes=sim)


def _add_tools(batch: CandidateBatch, tools: list[tuple[int, ToolItem]], tail, window) -> None:
    """Tool results (briefs) join the window after the message they followed, with its priority."""
    extra = _tool_batch(tools, tail, window, batch, batch.category, anchored_priority=True)
    n = len(batch.texts)
    own, theirs = batch.meta, extra.meta
    batch.meta = lambda j: own(j) if j < n else theirs(j - n)
    batch.texts = [*batch.texts, *extra.texts]
    batch.sources = [*batch.sources, *extra.sources]
    batch.tokens = np.concatenate([batch.tokens, extra.tokens])
    batch.relevance = np.zeros(len(batch.texts))
    batch.age_s = np.zeros(len(batch.texts))
    batch.priority = np.concatenate([np.asarray(batch.priority, np.float64), extra.priority])
    batch.order = np.concatenate([np.asarray(batch.order, np.float64), extra.order])
    batch.bodies = [*batch.bodies, *extra.bodies]
    batch.exact_keys = np.concatenate([batch.exact_keys, extra.exact_keys])
    batch.simhashes = np.concatenate([batch.simhashes, extra.simhashes])


def _view_batch(views: list[tuple[int, ToolItem]], tail, window, history: CandidateBatch) -> CandidateBatch:
    """The current turn's views: shown in the history after the message they followed, packed under
    the tool observations' budget (they are this call's observations; the history's budget holds what
    each turn keeps once it is over)."""
    return _tool_batch(views, tail, window, history, SoftCategory.TOOL_OBSERVATIONS, anchored_priority=False)


def _empty(batch: CandidateBatch) -> CandidateBatch:
    batch.texts, batch.sources, batch.bodies = [], [], []
    batch.tokens, batch.priority, batch.order = np.zeros(0, np.int32), np.zeros(0), np.zeros(0)
    batch.exact_keys, batch.simhashes = np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    batch.meta = lambda j: (0, 0, None, ())
    return batch


def _cache_aware_window(inp: BuildInput, tail, sizes: np.ndarray, room: int
                        ) -> tuple[int, list[tuple[int, ToolItem]], list[tuple[int, ToolItem]]]:
    """Where the history starts, the session's tool results shown by their briefs in it, and the current
    turn's shown by their views (each paired with its index among the session's results).

    The start is chosen when the user speaks, by what each message keeps once its turn is over (its line
    and its tool results' briefs, which never change), leaving a share of the room for the turn's own
    tool loop: the model calls of one turn share the whole history, and the start moves (in blocks) only
    at a user's turn, with the summary's folds. Only a turn that outgrows its share moves it within the
    turn. The current turn's results are shown as their views, newest first, while the tool observations'
    budget holds them; the others as their briefs."""
    results = inp.view.tool_results
    briefs = [_tool_item(inp.view.history_items, r, False, inp.counter) for r in results]
    n = len(tail.messages)
    if not n:
        return 0, *_with_views(inp, results, briefs, range(len(results)))
    settled, first_held, anchor = sizes, 0, np.zeros(0, np.int64)
    if results:  # each result follows the newest message stored before it (or in the same millisecond)
        anchor = np.maximum(np.searchsorted(tail.created, [r.created_at_ms for r in results], side="right") - 1, 0)
        settled = sizes + np.bincount(anchor, [b.tokens for b in briefs], n)
        if len(results) >= MAX_CACHED_TOOL_RESULTS:  # older ones may have left the view: start after them
            first_held = min(int(anchor[0]) + 1, n - 1)
    turn = _turn_start(tail)
    reserve = room // VIEW_RESERVE if results else 0  # for the turn's tool loop
    at_turn = turn + 1 - _newest_within(settled[:turn + 1], room - reserve)  # chosen when the user spoke
    fits = n - _newest_within(settled, room)  # what the whole turn needs
    start = _stepped_start(tail, max(at_turn, fits, first_held), settled, room, inp)
    return start, *_with_views(inp, results, briefs, np.flatnonzero(anchor >= turn).tolist())


def _with_views(inp: BuildInput, results: list[ToolResult], briefs: list[ToolItem], current: Sequence[int]
                ) -> tuple[list[tuple[int, ToolItem]], list[tuple[int, ToolItem]]]:
    """(briefs, views): the current turn's results (`current`) as their views, newest first, while the
    tool observations' budget holds them; every other one as its brief."""
    viewed: dict[int, ToolItem] = {}
    left = inp.budget.tool_observations
    for i in reversed(current):
        view = _tool_item(inp.view.history_items, results[i], True, inp.counter)
        if view.tokens > left:
            break  # an older view would leave a newer one's place to its brief: the newest run only
        viewed[i], left = view, left - view.tokens
    return ([(i, b) for i, b in enumerate(briefs) if i not in viewed],
            [(i, viewed[i]) for i in sorted(viewed)])


def _newest_within(sizes: np.ndarray, room: int) -> int:
    """How many of the newest entries fit `room` (at least one)."""
    return max(int(np.searchsorted(np.cumsum(sizes[-MAX_WINDOW_MESSAGES:][::-1]), max(room, 1), side="right")), 1)


def _turn_start(tail) -> int:
    """The newest user message's index (the newest message's before any)."""
    for i in range(len(tail.messages) - 1, -1, -1):
        if tail.messages[i].role == Role.USER:
            return i
    return len(tail.messages) - 1


def _stepped_start(tail, start: int, settled: np.ndarray, room: int, inp: BuildInput) -> int:
    """The first message after the summary's coverage or, when the budget cannot hold everything since
    then, the first message at or after `start` that opens a block of the history: blocks of room /
    BLOCKS_PER_ROOM tokens counted from the summary's end in what each message keeps once its turn is over
    (a grid that stays put while the newest turn's tool results shrink to their briefs)."""
    summary = inp.view.summary
    covered = summary.covered_until_seq if summary is not None else 0
    after_summary = int(np.searchsorted(tail.seqs, covered, side="right")) if covered else 0
    if start <= after_summary:
        return after_summary
    block = max(room // BLOCKS_PER_ROOM, 1)
    opens = np.cumsum(settled[after_summary:]) - settled[after_summary:]  # where each message starts
    blocks = opens // block
    firsts = np.flatnonzero(np.diff(blocks)) + 1 + after_summary  # messages that open a block
    at = int(np.searchsorted(firsts, start))
    return int(firsts[at]) if at < len(firsts) else len(tail.messages) - 1
