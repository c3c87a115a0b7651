"""A long recalled turn packed as its best passage. A 1,500-token answer recalled whole would take most
of a small recall budget for the one paragraph a question is about, and crowd out other turns; a turn
longer than its cap is packed as the run of its sentences, about the cap long, that covers most of the
query's terms (weighed by idf), with its label ("Ann: ", "[8 May 2023] assistant: ") kept and "…" where
it was cut. The item still names the whole message (source and provenance), so an agent can read it all."""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Callable, Mapping, Sequence

ELLIPSIS = "…"
_LABEL_SEARCH = 120  # the label ends at the first ": " within this many characters


def passage_cap(budget_tokens: int, share: float, floor: int) -> int:
    """The most tokens a recalled turn is packed with under this recall budget (0: no cap)."""
    if share <= 0:
        return 0
    return max(int(budget_tokens * share), floor)


def split_label(text: str) -> int:
    """Where a packed turn's label ends ("[8 May 2023] Ann: " or "Ann: "), 0 when it has none."""
    at = text.find(": ", 0, _LABEL_SEARCH)
    return at + 2 if at >= 0 else 0


PIECE_CHARS = 400  # a sentence longer than this (a pasted log, a list without stops) is cut into pieces
# Where a sentence ends: blanks after a stop (the stop kept with its sentence), after a CJK stop, or a
# line break.
_BREAK_RE = re.compile(r"([.!?;]+)\s+|([。！？；]+)\s*|\n\s*")


def pieces(body: str, most_chars: int) -> list[tuple[int, int]]:
    """(start, end) spans of the body's sentences, blanks around them left out, one longer than
    most_chars cut at the last blank before each most_chars, so that any piece can be packed. A
    passage only starts and ends at these, so they need not be exact sentences."""
    out: list[tuple[int, int]] = []
    most_chars = max(most_chars, 1)
    start = 0
    for m in itertools.chain(_BREAK_RE.finditer(body), (None,)):
        if m is None:
            end = len(body.rstrip())
        else:
            end = m.end(1) if m.start(1) >= 0 else m.end(2) if m.start(2) >= 0 else m.start()
            while end > start and body[end - 1].isspace():  # blanks before a line break
                end -= 1
        while end - start > most_chars:
            cut = body.rfind(" ", start + 1, start + most_chars + 1)
            cut = cut if cut > start else start + most_chars
            out.append((start, cut))
            start = cut + 1 if body[cut] == " " else cut
        if end > start:
            out.append((start, end))
        if m is not None:
            start = max(m.end(), start)
    return out


def lowered(body: str) -> str:
    """The body lowercased, character for character (a character whose lowercase is longer, as "İ",
    kept as it is), so positions in it are positions in the body."""
    low = body.lower()
    if len(low) == len(body):
        return low
    return "".join(c if len(c.lower()) != 1 else c.lower() for c in body)


def found_in(low: str, spans: Sequence[tuple[int, int]], weight: Mapping[str, float]) -> list[set[str]]:
    """Per piece, the weighed terms found in it: a word that starts with the term's stem (a final "y"
    dropped: "hobby" finds "hobbies"; a stem of one or two letters only as a whole word), in the
    lowered body (lowered()). Each stem is searched for (str.find) rather than every word stemmed."""
    found: list[set[str]] = [set() for _ in spans]
    starts = [a for a, _ in spans]
    for t in weight:
        head = t[:-1] if len(t) > 3 and t.endswith("y") else t
        if not head:
            continue
        alone = head.isascii() and len(head) < 3
        at = low.find(head)
        while at >= 0:
            end = at + len(head)
            if not head.isascii() or ((at == 0 or not low[at - 1].isalnum())
                                      and not (alone and end < len(low) and low[end].isalnum())):
                k = bisect.bisect_right(starts, at) - 1
                if k >= 0 and at < spans[k][1]:
                    found[k].add(t)
            at = low.find(head, at + 1)
    return found


def best_window(sizes: Sequence[int], found: Sequence[set[str]], weight: Mapping[str, float],
                most: int) -> tuple[int, int]:
    """[first, last) of the run of consecutive pieces whose sizes sum to at most `most` (at least one
    piece) and whose distinct terms weigh most: the earliest such run on ties, so the opening one when
    no piece holds a weighed term. One pass: the run's right end only moves right."""
    n = len(sizes)
    held: dict[str, int] = {}  # weighed term -> pieces of the run holding it
    score, total, last = 0.0, 0, 0
    best, best_at = -1.0, (0, min(1, n))
    for first in range(n):
        while last < n and (last == first or total + sizes[last] <= most):
            total += sizes[last]
            for t in found[last]:
                k = held.get(t, 0)
                held[t] = k + 1
                if not k:
                    score += weight[t]
            last += 1
        if score > best + 1e-9:
            best, best_at = score, (first, last)
        if last == n:  # every later run ends at the same piece and holds less
            break
        total -= sizes[first]
        for t in found[first]:
            held[t] -= 1
            if not held[t]:
                score -= weight[t]
    return best_at


Split = Callable[[str, int], list[tuple[int, int]]]


def best_passage(text: str, tokens: int, cap: int, weight: Mapping[str, float], split: Split = pieces) -> str | None:
    """The packed text of a turn of `tokens` tokens under a cap (see the module's docstring), or None
    when it fits whole. `weight`: the query's terms (stemmed) and their weights; `split`: pieces(), or
    the caller's copy of what it returns. Sizes are estimated from the turn's characters per token; the
    caller counts the passage it gets."""
    if cap <= 0 or tokens <= cap:
        return None
    label = split_label(text)
    body = text[label:]
    per_token = len(text) / max(tokens, 1)
    room = int((cap - 2) * per_token) - label  # the label and the two ellipses are packed too
    if room <= 0 or len(body) <= room:
        return None
    spans = split(body, min(room, PIECE_CHARS))
    if not spans:
        return None
    first, last = best_window([b - a for a, b in spans], found_in(lowered(body), spans, weight), weight, room)
    start, end = spans[first][0], spans[last - 1][1]
    head = ELLIPSIS + " " if start > 0 else ""
    tail = " " + ELLIPSIS if end < len(body.rstrip()) else ""
    return f"{text[:label]}{head}{body[start:end]}{tail}"
