"""Trimmed, budget-bounded view of a huge tool output.

Lines are kept in priority order until the token budget is used: error-ish lines, warning
lines, lines naming a focus term, then head and tail lines (alternating). Kept lines are
rendered in original order with a marker per gap::

    [... 1234 lines omitted; full output: GetToolResult("<result_id>") ...]

Guarantees and choices:

* ``count_tokens(view.text) <= budget_tokens`` always (markers included). Each candidate
  line is counted once; sums plus a safety margin drive the selection, the final text is
  counted once and lines are dropped (lowest priority first) in the rare case it is over.
* Secrets are redacted first, so line numbers in markers refer to the redacted text (a
  multi-line private key collapses to one ``[REDACTED:private_key]`` line).
* If the whole (redacted) text fits it is returned as is; the original string is returned
  unchanged when it fits and has no secrets.
* Tiny budgets: if not even one full marker fits, the result is the longest of the
  shorter marker forms that fits (``[... N lines; GetToolResult("id")]``, then
  ``[GetToolResult("id")]``), or ``""`` when none does.
* A single very long line is cut to a per-line cap with ``[... N chars cut ...]``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sidecar.domain import ToolResult
from sidecar.secrets import redact

CountTokens = Callable[[str], int]

_ERROR_RE = re.compile(
    r"\b(?:error|err|fatal|crit(?:ical)?|severe|exception|traceback|fail(?:ed|ure|ing|s)?|"
    r"time[d ]?out|timed\s+out|oom(?:killed)?|segfault)\b|Exception|Error\b|panic:|"
    r"\bHTTP(?:/\d(?:\.\d)?)?\"?\s+5\d\d\b|\b(?:status|code)[=: ]+5\d\d\b|\"\s+5\d\d\s|"
    r"错误|失败|超时|异常|报错|崩溃",
    re.I,
)
_WARN_RE = re.compile(r"\bwarn(?:ing)?\b|\bdeprecated\b|警告|告警", re.I)
# Literal-first prefilters on the lowercased line: cheap enough to run on every line of a
# huge output; the precise (slower) regexes then only see candidate lines.
_ERROR_HINT = re.compile(
    r"err|fatal|crit|severe|exception|traceback|fail|time|oom|segfault|panic|5\d\d|"
    r"错误|失败|超时|异常|报错|崩溃"
)
_WARN_HINT = re.compile(r"warn|deprecated|警告|告警")

_TIER_ERROR, _TIER_WARN, _TIER_FOCUS = 0, 1, 2
_MIN_LINE_CAP = 24
_MAX_MISSES = 64  # consecutive lines that did not fit before giving up on the rest


@dataclass(frozen=True)
class TrimmedView:
    text: str
    tokens: int
    kept_lines: int
    total_lines: int
    omitted_lines: int


def _marker(omitted: int, result_id: str) -> str:
    return f'[... {omitted} lines omitted; full output: GetToolResult("{result_id}") ...]'


def _focus_regex(terms: Iterable[str]) -> re.Pattern[str] | None:
    # Matched against lowercased lines: a literal alternation without re.I is much faster.
    cleaned = sorted({t.strip().lower() for t in terms if t and t.strip()}, key=len, reverse=True)
    return re.compile("|".join(re.escape(t) for t in cleaned)) if cleaned else None


def _fits_whole(text: str, budget: int, count_tokens: CountTokens) -> int | None:
    """Token count of ``text`` if it fits ``budget``; cheap rejection for huge texts."""
    probe_len = (budget + 1) * 8
    # A prefix has (almost) no more tokens than the text, so an over-budget prefix proves
    # the whole is over budget without tokenising megabytes.
    if len(text) > probe_len and count_tokens(text[:probe_len]) > budget + 2:
        return None
    n = count_tokens(text)
    return n if n <= budget else None


def _cut_line(line: str, cap: int, count_tokens: CountTokens) -> tuple[str, int]:
    """Cut ``line`` to at most ``cap`` tokens (suffix marker included)."""
    if len(line) > cap * 6:  # pre-cut by chars so a 1 MB line is never tokenised
        line_chars = len(line)
        line = line[: cap * 4]
    else:
        line_chars = len(line)
    n = count_tokens(line)
    if n <= cap and len(line) == line_chars:
        return line, n
    keep = len(line)
    while True:
        keep = max(0, min(keep - 1, int(keep * cap / max(n, 1) * 0.9)))
        cut = f"{line[:keep]} [... {line_chars - keep} chars cut ...]"
        n = count_tokens(cut)
        if n <= cap or keep == 0:
            return cut, n


def trim_tool_output(
    text: str,
    *,
    budget_tokens: int,
    count_tokens: CountTokens,
    focus_terms: Iterable[str],
    result_id: str,
    head_lines: int = 5,
    tail_lines: int = 5,
) -> TrimmedView:
    red = redact(text)
    lines = red.split("\n")
    total = len(lines)
    whole = _fits_whole(red, budget_tokens, count_tokens) if budget_tokens > 0 else None
    if whole is not None:
        return TrimmedView(red, whole, total, total, 0)

    marker_cost = count_tokens(_marker(total, result_id)) + 1  # digits of total bound any count
    margin = max(2, budget_tokens // 50)
    limit = budget_tokens - margin
    if marker_cost > limit:
        return _marker_only(total, result_id, budget_tokens, count_tokens)

    order = _priority_order(lines, _focus_regex(focus_terms), head_lines, tail_lines)
    line_cap = max(_MIN_LINE_CAP, budget_tokens // 8)
    kept: dict[int, str] = {}
    added: list[tuple[int, int]] = []  # (index, cost) in the order lines were added
    used = marker_cost  # everything omitted: one gap
    misses = 0
    for i in order:
        if limit - used < 2 or misses >= _MAX_MISSES:
            break  # budget exhausted: don't tokenise the rest of a huge output
        line, n = _cut_line(lines[i], line_cap, count_tokens)
        left = i > 0 and (i - 1) not in kept
        right = i < total - 1 and (i + 1) not in kept
        gap_delta = 1 if (left and right) else (-1 if not (left or right) else 0)
        cost = n + 1 + gap_delta * marker_cost
        if used + cost > limit:
            misses += 1
            continue  # a later, shorter line may still fit
        misses = 0
        kept[i] = line
        added.append((i, cost))
        used += cost

    rendered = _render(kept, total, result_id)
    tokens = count_tokens(rendered)
    while tokens > budget_tokens and added:
        excess = tokens - budget_tokens
        while added and excess > 0:  # drop lowest-priority lines until the estimate fits
            i, cost = added.pop()
            del kept[i]
            excess -= max(cost, 1)
        rendered = _render(kept, total, result_id)
        tokens = count_tokens(rendered)
    if tokens > budget_tokens:
        return _marker_only(total, result_id, budget_tokens, count_tokens)
    return TrimmedView(rendered, tokens, len(kept), total, total - len(kept))


def _priority_order(
    lines: list[str], focus: re.Pattern[str] | None, head_lines: int, tail_lines: int
) -> list[int]:
    tiers: tuple[list[int], list[int], list[int]] = ([], [], [])
    for i, line in enumerate(lines):
        low = line.lower()
        if _ERROR_HINT.search(low) and _ERROR_RE.search(line):
            tiers[_TIER_ERROR].append(i)
        elif _WARN_HINT.search(low) and _WARN_RE.search(line):
            tiers[_TIER_WARN].append(i)
        elif focus is not None and focus.search(low):
            tiers[_TIER_FOCUS].append(i)
    n = len(lines)
    head = list(range(min(head_lines, n)))
    tail = list(range(n - 1, max(n - tail_lines, 0) - 1, -1))
    edges = [x for pair in zip(head, tail, strict=False) for x in pair]
    edges += head[len(tail) :] + tail[len(head) :]
    order = tiers[0] + tiers[1] + tiers[2] + edges
    return list(dict.fromkeys(order))


def _render(kept: dict[int, str], total: int, result_id: str) -> str:
    out: list[str] = []
    prev = -1
    for i in sorted(kept):
        if i > prev + 1:
            out.append(_marker(i - prev - 1, result_id))
        out.append(kept[i])
        prev = i
    if prev < total - 1:
        out.append(_marker(total - prev - 1, result_id))
    return "\n".join(out)


def _marker_only(total: int, result_id: str, budget: int, count_tokens: CountTokens) -> TrimmedView:
    for text in (
        _marker(total, result_id),
        f'[... {total} lines; GetToolResult("{result_id}")]',
        f'[GetToolResult("{result_id}")]',
    ):
        n = count_tokens(text)
        if n <= budget:
            return TrimmedView(text, n, 0, total, total)
    return TrimmedView("", 0, 0, total, total)


__all__ = ["TrimmedView", "trim_tool_output"]


def tool_header(r: ToolResult) -> str:
    """The line a tool result is shown under: its tool, status, id (to fetch it whole) and length."""
    status = "error" if r.status == 2 else "ok"
    return f"[{r.tool_name} {status}, tool:{r.tool_result_id}, {r.lines} lines]"
