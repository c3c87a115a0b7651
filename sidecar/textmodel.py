"""Shared text model and helpers for the pure-Python text modules.

Holds the ``Turn`` dataclass (used by summarisation and memory extraction) and the
small language helpers (sentence splitting, tokenising, small-talk and entity
detection) that several modules need, so they are defined exactly once.
English and Chinese are supported throughout.
"""

from __future__ import annotations

import itertools
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from sidecar.literal_gate import GatedPattern, folded

Role = Literal["user", "assistant", "tool", "system"]
ROLES: frozenset[str] = frozenset({"user", "assistant", "tool", "system"})


@dataclass(frozen=True)
class Turn:
    """One message of a conversation."""

    message_id: str
    role: Role
    text: str
    speaker: str | None = None
    timestamp_ms: int = 0


# CJK Unified Ideographs (+ extension A and compatibility block); enough for Chinese.
CJK_CHARS = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
CJK_RE = re.compile(f"[{CJK_CHARS}]")

# --------------------------------------------------------------------------- sentences

# CJK terminators always end a sentence; ASCII ones only when followed by space/end/CJK,
# so "v1.2", "foo.bar" and "a.b.c" stay intact.
_BOUNDARY_RE = re.compile(rf"[。！？；\n]+|[.!?;]+(?=\s|$|[{CJK_CHARS}])|[!?;]+")
_ABBREVIATIONS = frozenset({"e.g", "i.e", "etc", "vs", "mr", "mrs", "dr", "approx", "cf"})


def split_sentences(text: str) -> list[tuple[int, int]]:
    """Return (start, end) spans of sentences in ``text``.

    Spans are stripped of surrounding whitespace and include their terminating
    punctuation (needed to recognise questions); newlines never belong to a span.
    """
    spans: list[tuple[int, int]] = []
    start = 0
    for m in _BOUNDARY_RE.finditer(text):
        if m.group()[0] == "." and _ends_with_abbreviation(text, m.start()):
            continue
        end = m.start() if m.group()[0] == "\n" else _terminator_end(m)
        _append_stripped(text, start, end, spans)
        start = m.end()
    _append_stripped(text, start, len(text), spans)
    return spans


def _terminator_end(m: re.Match[str]) -> int:
    # "Stop!\n" -> keep "!" but not the newline that the CJK class may have swallowed.
    nl = m.group().find("\n")
    return m.end() if nl < 0 else m.start() + nl


def _ends_with_abbreviation(text: str, dot: int) -> bool:
    j = dot
    while j > 0 and (text[j - 1].isalpha() or text[j - 1] == "."):
        j -= 1
    return text[j:dot].lower() in _ABBREVIATIONS


def _append_stripped(text: str, start: int, end: int, out: list[tuple[int, int]]) -> None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    if end > start:
        out.append((start, end))


def sentences(text: str) -> list[str]:
    return [text[s:e] for s, e in split_sentences(text)]


# --------------------------------------------------------------------------- tokens

_WORD_RE = re.compile(rf"[a-z0-9]+(?:['_-][a-z0-9]+)*|[{CJK_CHARS}]")


def word_tokens(text: str) -> list[str]:
    """Lowercased word tokens; each CJK character is its own token (no segmenter needed)."""
    return _WORD_RE.findall(unicodedata.normalize("NFKC", text).lower())


# re's \w is str.isalnum() or "_", one character at a time (CPython's _sre): so [^\W_] is exactly
# isalnum, scanned in C rather than a Python loop over every character of a long turn.
_MEANINGFUL_RE = re.compile(r"[^\W_]")
_NOT_MEANINGFUL_RE = re.compile(r"[\W_]+")
_NOT_PHRASE_RE = re.compile(r"[^\w ]|_")  # what _phrase_is_small_talk drops: not isalnum, not a space


def meaningful_chars(text: str) -> int:
    """Letters, digits and CJK characters; punctuation, spaces and emoji don't count."""
    return len(_NOT_MEANINGFUL_RE.sub("", text))


def has_meaningful(text: str, at_least: int = 1) -> bool:
    """meaningful_chars(text) >= at_least, stopping at the at_least-th such character (a long turn is
    not scanned to its end)."""
    if at_least == 1:
        return _MEANINGFUL_RE.search(text) is not None
    return sum(1 for _ in itertools.islice(_MEANINGFUL_RE.finditer(text), at_least)) == at_least


# --------------------------------------------------------------------------- small talk

# "|"-separated so multi-word phrases fit on a line.
_SMALL_TALK = frozenset(
    "ok|okay|k|kk|thanks|thank you|thankyou|thx|ty|tks|hi|hello|hey|yes|yep|yeah|yup|no|nope|sure|got it|"
    "cool|nice|great|lol|haha|good|fine|alright|right|np|no problem|noted|roger|good morning|good night|bye|"
    "cheers|awesome|perfect|understood|sounds good|ok thanks|thanks a lot|many thanks|will do|hmm|hm|ah|oh|"
    "wow|sorry|嗯|嗯嗯|好|好的|好滴|好吧|行|可以|谢谢|多谢|感谢|收到|哈|哈哈|明白|了解|知道了|没问题|你好|"
    "您好|早|早上好|晚安|辛苦了|是的|对|对的|嗯好|ok了|好嘞|拜拜|再见|哦|噢|懂了|不客气".split("|")
)
_LONGEST_SMALL_TALK = max(map(len, _SMALL_TALK))
_HEAD_CHARS = 4 * _LONGEST_SMALL_TALK  # what _phrase_is_small_talk reads first
_SPLIT_SMALL_TALK_RE = re.compile(r"[\s,.!?;:~，。！？；：、…]+")
_REPEAT_RE = re.compile(r"(.)\1+")


def is_small_talk(text: str) -> bool:
    """True for acknowledgements/greetings ("好的，谢谢", "ok thanks!", "嗯嗯嗯") and emoji-only text."""
    norm = unicodedata.normalize("NFKC", text).lower().strip()
    if not has_meaningful(norm):
        return True
    if _phrase_is_small_talk(norm):
        return True
    # Every part that holds a meaningful character must be small talk, and there must be one; a long
    # turn fails at its first part.
    seen = False
    for part in _parts(norm):
        if has_meaningful(part):
            if not _phrase_is_small_talk(part):
                return False
            seen = True
    return seen


def _parts(norm: str) -> Iterator[str]:
    """_SPLIT_SMALL_TALK_RE.split(norm), one part at a time: is_small_talk stops at a long turn's first
    part that is no small talk, without splitting the rest."""
    start = 0
    for m in _SPLIT_SMALL_TALK_RE.finditer(norm):
        yield norm[start:m.start()]
        start = m.end()
    yield norm[start:]


def _phrase_is_small_talk(phrase: str) -> bool:
    # Collapsing repeats keeps every distinct character: a core with more of them than the longest
    # phrase has is none of the phrases, however its repeats collapse. Characters are dropped one by
    # one, so the head's core is the core's head: a long turn is told apart from its first characters.
    head = _NOT_PHRASE_RE.sub("", phrase[:_HEAD_CHARS])
    if len(set(head.replace(" ", ""))) > _LONGEST_SMALL_TALK:
        return False
    core = _NOT_PHRASE_RE.sub("", phrase).strip()
    if len(set(core)) > _LONGEST_SMALL_TALK:
        return False
    return (
        core in _SMALL_TALK
        or _REPEAT_RE.sub(r"\1", core) in _SMALL_TALK
        or _REPEAT_RE.sub(r"\1\1", core) in _SMALL_TALK
    )


def is_low_information(text: str) -> bool:
    """Small talk, emoji-only, or fewer than 3 meaningful characters."""
    return not has_meaningful(text, 3) or is_small_talk(text)


# --------------------------------------------------------------------------- entities

# Strong environment words count anywhere; weak ones ("test", "dev", 测试) only next to
# an environment noun, because they are also ordinary words.
_ENV_STRONG_RE = re.compile(r"(?<![\w-])(prod|production|staging|preprod|pre-prod|uat)(?![\w-])", re.I)
_ENV_WEAK_RE = re.compile(
    r"(?<![\w-])(test|testing|dev|development|qa|sandbox|stage)"
    r"(?=[\s-]*(?:env|envs|environment|cluster|namespace|server|servers|stack|region|db|database)\b)",
    re.I,
)
_ENV_CN_RE = re.compile(r"(生产|预发|灰度)(?:环境)?|(测试|开发|预生产)(?=环境|集群|库|服务器|机器)")
_SERVICE_RE = re.compile(r"(?<![\w.-])[a-z][a-z0-9]*(?:[-_][a-z0-9]+)+(?![\w-])", re.I)
_SERVICE_PARTS = frozenset(
    "api svc service services server srv db database cache redis worker workers gateway gw proxy queue "
    "mq kafka web app backend frontend cluster job cron consumer producer store auth admin portal engine "
    "daemon agent controller operator scheduler indexer ingest pipeline bus lb ingress node master replica "
    "primary etl sync notifier rpc grpc http mysql pg postgres es search storage broker cdn".split()
)
_HOST_RE = re.compile(
    r"(?<![\w.-])(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\.)+"
    r"(?:com|net|org|io|internal|local|lan|svc|cn|cloud|corp|intra|dev)(?![\w.-])",
    re.I,
)
_IP_RE = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?::\d{2,5})?(?![\d.])")
_NAMESPACE_RE = re.compile(
    r"(?:\bnamespace|\bns|命名空间)[\s:=/]*([a-z0-9][a-z0-9-]{1,62})(?![\w-])|(?<!\S)-n\s+([a-z0-9][a-z0-9-]{1,62})",
    re.I,
)


# Each pattern behind the literals its matches need (most sentences hold none), and the service and IP
# patterns behind the character they cannot match without ("-" or "_"; a digit).
_ENV_STRONG, _ENV_WEAK, _ENV_CN, _HOST, _NAMESPACE = (
    GatedPattern(rx) for rx in (_ENV_STRONG_RE, _ENV_WEAK_RE, _ENV_CN_RE, _HOST_RE, _NAMESPACE_RE))
DIGIT_RE = re.compile(r"\d")


def find_environments(text: str, low: str | None = None) -> list[str]:
    """Environment names; `low` is folded(text) where the caller has it."""
    low = folded(text) if low is None else low
    found: list[str] = [m.group(1).lower() for m in _ENV_STRONG.finditer(text, low)]
    found += [m.group(1).lower() for m in _ENV_WEAK.finditer(text, low)]
    found += [m.group(1) or m.group(2) for m in _ENV_CN.finditer(text, low)]
    return list(dict.fromkeys(found))


def find_services(text: str, low: str | None = None) -> list[str]:
    """Service-style names (``payment-api``, ``foo_db``) and k8s namespaces, lowercased; `low` is
    folded(text) where the caller has it."""
    found = [
        m.group().lower()
        for m in (_SERVICE_RE.finditer(text) if "-" in text or "_" in text else ())
        if any(p in _SERVICE_PARTS for p in re.split(r"[-_]", m.group().lower()))
    ]
    found += [(m.group(1) or m.group(2)).lower() for m in _NAMESPACE.finditer(text, low)]
    return list(dict.fromkeys(found))


def find_entities(text: str) -> list[str]:
    """Environment, service, namespace, host and IP names, lowercased, in first-seen order.

    Surface forms are kept (``production`` and ``prod`` are distinct) so that every
    returned name can be found verbatim in the text it came from.
    """
    low = folded(text)  # once, for every gated pattern
    found = find_environments(text, low) + find_services(text, low)
    found += [m.group().lower() for m in _HOST.finditer(text, low)]
    found += [m.group() for m in (_IP_RE.finditer(text) if DIGIT_RE.search(text) else ())]
    return list(dict.fromkeys(found))
