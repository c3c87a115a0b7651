"""Rolling conversation summary: extractive (default, no LLM) or LLM-backed.

``ExtractiveSummarizer.update`` folds new turns into the previous summary without
re-reading old turns. It keeps sentences that carry entities (environments, services,
hosts, IPs, namespaces), decisions/conclusions, errors and numbers with units/ids, one
per line, prefixed with the speaker or a one-letter role (U/A/T/S). Small talk is
dropped. When over budget, the lowest-value sentences go first (oldest first on ties),
but the newest sentence mentioning each distinct entity is protected; only if the
protected sentences alone do not fit are the oldest of them dropped. Secrets are redacted
before anything is stored. Output is deterministic for the same inputs.

``Summary.items`` carries per-sentence metadata between updates. A ``Summary`` restored
from storage without items is re-parsed from its text (one sentence per line); those
lines no longer know their message ids, so ``source_message_ids`` keeps the previous
list for them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.caseless import CaselessPattern
from sidecar.llm import ChatClient, LLMError
from sidecar.secrets import redact
from sidecar.textmodel import (
    DIGIT_RE,
    Turn,
    find_entities,
    find_environments,
    find_services,
    is_low_information,
    is_small_talk,
    sentences,
)

CountTokens = Callable[[str], int]

# Matched as CaselessPattern (lowered text, gated alternatives): re.I folds every character it reads.
_DECISION = CaselessPattern(re.compile(
    r"root[\s-]?cause|resolved|resolution|decided|decision|conclu(?:sion|ded)|confirmed|fixed|"
    r"rolled\s+back|roll\s?back|mitigat|agreed|workaround|postmortem|action\s+item|next\s+step|"
    r"根因|结论|已确认|确认|决定|原因是|修复|回滚|解决|定位到|止损",
    re.I,
))
# Under IGNORECASE [a-z] is any letter [A-Z] would be ("JIRA-12" and "jira-12" alike). Every
# alternative holds a digit: a sentence without one is not read again (DIGIT_RE).
_NUMBER = CaselessPattern(re.compile(
    r"\d+(?:\.\d+)?\s*(?:ms|s|sec|secs|seconds?|mins?|minutes?|h|hrs?|hours?|days?|%|[kmgt]i?b|qps|rps|"
    r"req/s|cores?|pods?|replicas?|nodes?|毫秒|秒|分钟|小时|天|次|个|台|条)(?![a-z])|"
    r"\b\d{1,2}:\d{2}\b|#\d+|\b[a-z][a-z0-9]+-\d+\b|\bv?\d+\.\d+(?:\.\d+)?\b|\b[45]\d\d\b",
    re.I,
))
_ERROR = CaselessPattern(re.compile(r"error|fail|timeout|timed out|exception|panic|oom|5xx|错误|失败|超时|异常|报错", re.I))
_WS_RE = re.compile(r"\s+")
_ROLE_LABELS = {"user": "U", "assistant": "A", "tool": "T", "system": "S"}
_MAX_SENTENCE_CHARS = 300
_RECENCY_BONUS = 3.0


@dataclass(frozen=True)
class SummaryItem:
    seq: int  # insertion order across updates
    message_id: str | None
    line: str  # rendered "<label>: <sentence>"
    entities: tuple[str, ...]
    value: float
    tokens: int
    # environment/service names whose newest mention must survive eviction (not IPs/hosts,
    # which are too numerous in tool output to protect)
    protects: tuple[str, ...] = ()


@dataclass
class Summary:
    text: str
    tokens: int
    source_message_ids: list[str]
    entities: set[str]
    covered_until_message_id: str | None
    items: tuple[SummaryItem, ...] = field(default=(), repr=False, compare=False)


class Summarizer(Protocol):
    def update(
        self,
        previous: Summary | None,
        new_turns: Sequence[Turn],
        *,
        max_tokens: int,
        count_tokens: CountTokens,
    ) -> Summary: ...


def _score(sentence: str, entities: Sequence[str], role: str) -> float:
    value = 0.0
    if _DECISION.found(sentence):
        value += 3.0
    value += 2.0 * min(len(entities), 2)
    if DIGIT_RE.search(sentence) and _NUMBER.found(sentence):
        value += 1.0
    if _ERROR.found(sentence):
        value += 1.0
    if value and role == "user":
        value += 0.5  # users state goals and constraints; slightly prefer them
    return value


def _label(turn: Turn) -> str:
    if turn.speaker and turn.speaker.strip():
        return _WS_RE.sub(" ", turn.speaker.strip())[:32]
    return _ROLE_LABELS.get(turn.role, turn.role[:1].upper())


def _clip(sentence: str, entities: Sequence[str]) -> str:
    if len(sentence) <= _MAX_SENTENCE_CHARS:
        return sentence
    cut = sentence[:_MAX_SENTENCE_CHARS].rstrip() + "…"
    lost = [e for e in entities if e not in cut.lower()]
    # Entity coverage matters more than prose: keep the names the cut would lose.
    return cut + (f" [{', '.join(lost)}]" if lost else "")


_DIGITS_RE = re.compile(r"\d+")


def _dedup_key(line: str) -> str:
    # Digits are masked so "rolled back foo_db to v1.7" followed by "... to v1.9" keeps only
    # the newer statement, and repeated tool errors differing only in ids/latencies collapse.
    return _DIGITS_RE.sub("#", _WS_RE.sub(" ", line.split(": ", 1)[-1].lower()).strip())


class ExtractiveSummarizer:
    """Deterministic, incremental, entity-preserving extractive summariser."""

    def update(
        self,
        previous: Summary | None,
        new_turns: Sequence[Turn],
        *,
        max_tokens: int,
        count_tokens: CountTokens,
    ) -> Summary:
        items = _previous_items(previous, count_tokens)
        seq = max((it.seq for it in items), default=-1) + 1
        by_key = {_dedup_key(it.line): it for it in items}
        for turn in new_turns:
            text = redact(turn.text)
            if is_low_information(text):
                continue
            label = _label(turn)
            for sentence in sentences(text):
                if is_small_talk(sentence):
                    continue
                sentence = _WS_RE.sub(" ", sentence)
                entities = find_entities(sentence)
                value = _score(sentence, entities, turn.role)
                if value <= 0:
                    continue
                line = f"{label}: {_clip(sentence, entities)}"
                # A repeated sentence moves to its newest position instead of duplicating.
                by_key[_dedup_key(line)] = SummaryItem(
                    seq, turn.message_id, line, tuple(entities), value, count_tokens(line), _protects(line)
                )
                seq += 1
        kept = _fit(sorted(by_key.values(), key=lambda it: it.seq), max_tokens, count_tokens)
        covered = (
            new_turns[-1].message_id
            if new_turns
            else (previous.covered_until_message_id if previous else None)
        )
        return _build(kept, previous, covered, count_tokens)


def _protects(line: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(find_environments(line) + find_services(line)))


def _previous_items(previous: Summary | None, count_tokens: CountTokens) -> list[SummaryItem]:
    if previous is None:
        return []
    if previous.items:
        return list(previous.items)
    out: list[SummaryItem] = []
    for i, line in enumerate(ln.strip() for ln in previous.text.splitlines()):
        if line:
            ents = find_entities(line)
            out.append(
                SummaryItem(
                    i, None, line, tuple(ents), _score(line, ents, ""), count_tokens(line), _protects(line)
                )
            )
    return out


def _fit(items: list[SummaryItem], max_tokens: int, count_tokens: CountTokens) -> list[SummaryItem]:
    """Evict items until the rendered text fits; ``items`` are in seq order."""
    est = sum(it.tokens for it in items) + max(len(items) - 1, 0)
    if est <= max_tokens and count_tokens(_render(items)) <= max_tokens:
        return items
    newest_for: dict[str, SummaryItem] = {}
    for it in items:
        for e in it.protects:
            newest_for[e] = it
    protected = {id(it) for it in newest_for.values()}
    # Rolling summary: newer sentences get up to +_RECENCY_BONUS so stale ones go first.
    rank = {id(it): _RECENCY_BONUS * i / len(items) for i, it in enumerate(items)}
    evict_order = sorted(
        (it for it in items if id(it) not in protected), key=lambda it: (it.value + rank[id(it)], it.seq)
    )
    evict_order += [it for it in items if id(it) in protected]  # oldest protected first
    gone: set[int] = set()
    pos = 0
    while True:
        while est > max_tokens and pos < len(evict_order):
            it = evict_order[pos]
            gone.add(id(it))
            est -= it.tokens + 1
            pos += 1
        kept = [it for it in items if id(it) not in gone]
        if not kept or count_tokens(_render(kept)) <= max_tokens:
            return kept
        est = max_tokens + 1  # estimate was optimistic: evict at least one more


def _render(items: Sequence[SummaryItem]) -> str:
    return "\n".join(it.line for it in items)


def _build(
    kept: list[SummaryItem], previous: Summary | None, covered: str | None, count_tokens: CountTokens
) -> Summary:
    text = _render(kept)
    ids: list[str] = []
    if any(it.message_id is None for it in kept) and previous is not None:
        ids.extend(previous.source_message_ids)  # re-parsed lines: ids unknown, keep the old list
    ids.extend(it.message_id for it in kept if it.message_id is not None)
    entities = {e for it in kept for e in it.entities}
    return Summary(
        text, count_tokens(text) if text else 0, list(dict.fromkeys(ids)), entities, covered, tuple(kept)
    )


# --------------------------------------------------------------------------- LLM-backed

_SYSTEM_PROMPT = (
    "You maintain a rolling summary of an operations conversation between a user, an AI agent and "
    "its tools. Update the previous summary with the new turns. Keep, verbatim: every environment "
    "name (prod, staging, 生产, 测试, ...), every service, host, IP and namespace name, and every "
    "decision, conclusion and root cause. Drop small talk. One fact per line, prefixed with who said "
    "it (U:, A:, T:). Never include passwords, keys or tokens. Answer in the conversation's language(s) "
    "and return only the summary text, at most {max_tokens} tokens."
)
_MAX_TURN_CHARS = 4000


class LLMSummarizer:
    """Summariser backed by an OpenAI-compatible endpoint; redacts before sending and after."""

    def __init__(self, client: ChatClient, *, fallback: Summarizer | None = None) -> None:
        self.client = client
        self.fallback = fallback

    def update(
        self,
        previous: Summary | None,
        new_turns: Sequence[Turn],
        *,
        max_tokens: int,
        count_tokens: CountTokens,
    ) -> Summary:
        turns_text = "\n".join(
            f"[{_label(t)}] {redact(t.text)[:_MAX_TURN_CHARS]}" for t in new_turns if t.text.strip()
        )
        prev_text = redact(previous.text) if previous else ""
        messages = [
            {"role": "system", "content": _SYSTEM_PROMPT.format(max_tokens=max_tokens)},
            {
                "role": "user",
                "content": f"Previous summary:\n{prev_text or '(none)'}\n\nNew turns:\n{turns_text}",
            },
        ]
        try:
            content = self.client.complete(messages, temperature=0.0)
        except LLMError:
            if self.fallback is None:
                raise
            return self.fallback.update(previous, new_turns, max_tokens=max_tokens, count_tokens=count_tokens)
        lines = [ln.strip() for ln in redact(content).strip().splitlines() if ln.strip()]
        text = "\n".join(lines)
        while lines and count_tokens(text) > max_tokens:
            lines.pop(0)  # the model overshot: drop the oldest lines
            text = "\n".join(lines)
        ids = list(previous.source_message_ids) if previous else []
        ids = list(dict.fromkeys(ids + [t.message_id for t in new_turns]))
        covered = (
            new_turns[-1].message_id
            if new_turns
            else (previous.covered_until_message_id if previous else None)
        )
        return Summary(text, count_tokens(text) if text else 0, ids, set(find_entities(text)), covered)


__all__ = ["Summary", "SummaryItem", "Summarizer", "ExtractiveSummarizer", "LLMSummarizer"]
