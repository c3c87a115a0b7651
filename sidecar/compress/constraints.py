"""Detect explicit user constraints (prohibitions and requirements) to pin in the context.

``detect_constraints`` returns whole sentences of a USER message, verbatim (exact
substrings of the input, stripped of surrounding whitespace, terminating punctuation
kept), in their original order. Exception: a sentence containing a secret is returned
with the secret replaced by ``[REDACTED:<kind>]`` (sidecar.secrets.redact), so that part
is no longer verbatim; pinned blocks must never carry credentials.

Questions (ending in ?/？/吗/呢, or starting with why/为什么/为啥) are never constraints,
and well-known non-constraint phrases ("don't know", "never mind", 别人, 不要紧, 必须的吗)
are excluded.
"""

from __future__ import annotations

import re

from sidecar.secrets import contains_secret, redact
from sidecar.textmodel import split_sentences

# Words that may stand between a clause start and an imperative keyword ("Please just never…").
_FILLERS = (
    r"(?:(?:please|pls|kindly|just|also|really|again|remember\s+to|make\s+sure\s+to|"
    r"you|we|you\s+(?:should|must|can|may)|we\s+(?:should|must|can|may))\s+)*"
)
_CLAUSE_START = r"(?:^|[,:;(\-–—]\s*|\b(?:and|but|then|so|or|also)\s+)"
_IMPERATIVE = _CLAUSE_START + _FILLERS

_EN_RULES: list[re.Pattern[str]] = [
    # don't / do not — but not "I don't know", "it don't…", "don't worry".
    re.compile(
        r"(?<!\bi\s)(?<!\bit\s)(?<!\bthat\s)(?<!\bthis\s)(?<!\bthey\s)(?<!\bhe\s)(?<!\bshe\s)(?<!\bwho\s)"
        r"\b(?:do\s+not|don't|dont)\s+"
        r"(?!(?:know|think|understand|remember|care|worry|mind|get|see|believe|recall|recognize|have|"
        r"need|you|really\s+know)\b)",
        re.I,
    ),
    re.compile(r"\bi\s+(?:do\s+not|don't)\s+want\s+(?:you|anyone|anybody|any)\b", re.I),
    re.compile(r"\b(?:must\s+not|mustn't|shall\s+not|under\s+no\s+circumstances)\b", re.I),
    # must — but not epistemic "it must be DNS" / "you must be joking" / "must-have".
    re.compile(
        r"(?<!\bit\s)(?<!\bthat\s)(?<!\bthis\s)(?<!\bthere\s)(?<!\bwhich\s)(?<!\bhe\s)(?<!\bshe\s)"
        r"(?<!\bthey\s)\bmust\b(?![-\s]*(?:not\b|have\s+been|be\s+(?:joking|kidding)))",
        re.I,
    ),
    re.compile(
        _IMPERATIVE + r"never\b(?!\s+(?:mind|seen|heard|been|had|thought|knew|know|saw|ever)\b)", re.I
    ),
    re.compile(_IMPERATIVE + r"always\b(?!\s+(?:been|the|a|an)\b)", re.I),
    # "only" as a requirement: imperative "only use…", "use … only"; not "read-only", "only 3".
    re.compile(
        _IMPERATIVE + r"(?<![\w-])only(?![\w-])(?!\s+(?:\d|if|when|after|because|once|one|a|the|then)\b)",
        re.I,
    ),
    re.compile(r"\b(?:use|run|touch|query|modify|restart|deploy|read|access|change)\s+only(?![\w-])", re.I),
    re.compile(r"(?<=\S)\s+only[.!]?$", re.I),
    re.compile(
        _IMPERATIVE + r"no\s+(?:more\s+than\b|\w+ing\b|(?:restarts?|deploys?|deployments?|changes|writes|"
        r"deletes|deletions|rollbacks?|migrations?|reboots?|sudo|force|destructive|downtime|edits|"
        r"modifications|commits|pushes|merges|drops|manual|direct|root|access)\b)",
        re.I,
    ),
]

_CN_RULES: list[re.Pattern[str]] = [
    re.compile(r"禁止|严禁|切勿|务必|千万不要|千万别|只允许|不许"),
    re.compile(r"(?<!要)不要(?!紧)"),
    re.compile(r"(?<![说])不准(?!确)"),
    re.compile(r"(?<![能我])不能(?!确定|理解|肯定|保证|说|算|不)"),
    re.compile(r"(?<![我它他她])只能"),
    re.compile(r"(?<!不)必须(?![的吗嘛么])"),
    re.compile(r"(?<!可)不可以"),
    re.compile(r"(?<![舍怪巴恨免顾记由晓见懂认])不得(?![不了已])"),
    # 别 only as an imperative at a clause start ("别重启", "千万别", "你别动"), never 别人/特别/区别.
    re.compile(r"(?:^|(?<=[，,：:、；\s请你您也就可先都还千万是但]))别(?![人的处名称样号墅致扭具])"),
]

_QUESTION_RE = re.compile(r"(?:[?？]|[吗呢么嘛][\s。.!！~～]*)$|^(?:why|how\s+come|为什么|为啥|怎么)", re.I)


def _is_constraint(sentence: str) -> bool:
    if _QUESTION_RE.search(sentence):
        return False
    s = sentence.replace("\u2019", "'").replace("\uff07", "'")
    return any(rx.search(s) for rx in _CN_RULES) or any(rx.search(s) for rx in _EN_RULES)


def detect_constraints(text: str) -> list[str]:
    """Explicit prohibitions/requirements in a USER message, verbatim, in order, deduplicated."""
    out: list[str] = []
    seen: set[str] = set()
    for start, end in split_sentences(text):
        sentence = text[start:end]
        if not _is_constraint(sentence):
            continue
        if contains_secret(sentence):
            sentence = redact(sentence)
        if sentence not in seen:
            seen.add(sentence)
            out.append(sentence)
    return out


__all__ = ["detect_constraints"]
