"""Filter stage for memory candidates, plus pure dedup helpers.

Checks run in this order and the first failing one gives the rejection reason:
``low_information`` -> ``secret`` -> ``raw_log`` -> ``low_confidence``.
Dedup/merge/supersede against stored rows happens elsewhere; ``normalize_for_dedup`` and
``near_duplicate`` are the pure building blocks for it.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sidecar.memory.extract import MemoryCandidate
from sidecar.secrets import contains_secret, looks_like_raw_log
from sidecar.textmodel import CJK_CHARS, is_low_information, word_tokens

REASON_LOW_INFORMATION = "low_information"
REASON_SECRET = "secret"
REASON_RAW_LOG = "raw_log"
REASON_LOW_CONFIDENCE = "low_confidence"


@dataclass
class FilterResult:
    accepted: list[MemoryCandidate] = field(default_factory=list)
    rejected: list[tuple[MemoryCandidate, str]] = field(default_factory=list)


def _rejection(
    cand: MemoryCandidate, min_confidence: float, source_texts: Mapping[str, str] | None
) -> str | None:
    sources = [source_texts[i] for i in cand.source_message_ids if i in source_texts] if source_texts else []
    if is_low_information(cand.content) or (sources and all(is_low_information(s) for s in sources)):
        return REASON_LOW_INFORMATION
    if contains_secret(cand.content):
        return REASON_SECRET
    if looks_like_raw_log(cand.content):
        return REASON_RAW_LOG
    if cand.confidence < min_confidence:
        return REASON_LOW_CONFIDENCE
    return None


def filter_candidates(
    cands: Iterable[MemoryCandidate],
    *,
    min_confidence: float = 0.7,
    source_texts: Mapping[str, str] | None = None,
) -> FilterResult:
    """Split candidates into accepted and (candidate, reason) rejected, preserving order.

    ``source_texts`` (message id -> text) is optional; when given, a candidate whose source
    turns are all small talk is rejected as ``low_information`` too.
    """
    result = FilterResult()
    for cand in cands:
        reason = _rejection(cand, min_confidence, source_texts)
        if reason is None:
            result.accepted.append(cand)
        else:
            result.rejected.append((cand, reason))
    return result


_NON_WORD_RE = re.compile(rf"[^\w{CJK_CHARS}]+")
_CJK_GAP_RE = re.compile(rf"(?<=[{CJK_CHARS}]) (?=[{CJK_CHARS}])")


def normalize_for_dedup(text: str) -> str:
    """NFKC, lowercase, punctuation -> single spaces, no spaces between CJK characters."""
    norm = _NON_WORD_RE.sub(" ", unicodedata.normalize("NFKC", text).lower()).replace("_", " ").strip()
    return _CJK_GAP_RE.sub("", re.sub(r"\s+", " ", norm))


def near_duplicate(a: str, b: str) -> bool:
    """Token Jaccard >= 0.8, or one normalised string inside the other with length ratio >= 0.9."""
    na, nb = normalize_for_dedup(a), normalize_for_dedup(b)
    if na == nb:
        return True
    if not na or not nb:
        return False
    short, long_ = sorted((na, nb), key=len)
    if short in long_ and len(short) / len(long_) >= 0.9:
        return True
    ta, tb = set(word_tokens(a)), set(word_tokens(b))
    return bool(ta | tb) and len(ta & tb) / len(ta | tb) >= 0.8


__all__ = [
    "FilterResult",
    "filter_candidates",
    "is_low_information",
    "normalize_for_dedup",
    "near_duplicate",
    "REASON_LOW_INFORMATION",
    "REASON_SECRET",
    "REASON_RAW_LOG",
    "REASON_LOW_CONFIDENCE",
]
