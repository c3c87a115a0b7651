"""Rule-based extraction of simple service facts ("payment-api depends on payment-db") from English
and Chinese text, for the knowledge graph.

Precision over recall: a relation needs a service-like subject right before the verb (only
adverbs, auxiliaries and generic nouns like "service" / "服务" may sit between) and a service-like
object right after it. Sentences with English negation ("does not", "never", "no longer") are
skipped whole; a Chinese negator before the verb ("不依赖", "没有调用") drops that clause.
Entities are lowercased; each (subject, relation, object) is returned once, with its first sentence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sidecar.knowledge.chunking import split_sentences
from sidecar.text import STOPWORDS

RELATIONS = ("depends_on", "calls", "uses", "reads_from", "writes_to", "backed_by", "connects_to")

_ENTITY_CHARS = r"A-Za-z0-9_.:/\-"
# Must end on a word character so a sentence's final "." or a trailing ":" is not swallowed.
_ENTITY = rf"(?<![{_ENTITY_CHARS}'’])[A-Za-z0-9](?:[{_ENTITY_CHARS}]*[A-Za-z0-9_])?"

# (pattern, relation, passive, be_ok). Passive forms ("is called by") swap subject and object and
# come before their active forms so they win at the same position. be_ok: a be-verb may precede
# the verb ("is backed by"); for the others it signals naming ("is called X") and is rejected.
_ENGLISH_VERBS: tuple[tuple[str, str, bool, bool], ...] = (
    (r"depended\s+on\s+by|relied\s+on\s+by", "depends_on", True, True),
    (r"(?:called|invoked)\s+by", "calls", True, True),
    (r"used\s+by", "uses", True, True),
    (r"read\s+by", "reads_from", True, True),
    (r"written\s+to\s+by", "writes_to", True, True),
    (r"(?:depends|depend|depended|relies|rely|relied)\s+on", "depends_on", False, False),
    (r"calls|call|called|invokes|invoke|invoked", "calls", False, False),
    (r"uses|use|used(?!\s+to\b)", "uses", False, False),
    (r"(?:reads|read)\s+from", "reads_from", False, False),
    (r"(?:writes|write|wrote)\s+to", "writes_to", False, False),
    (r"backed\s+by", "backed_by", False, True),
    (r"(?:connects|connect|connected)\s+to", "connects_to", False, True),
)
_CHINESE_VERBS: tuple[tuple[str, str], ...] = (
    ("依赖于|依赖", "depends_on"),
    ("调用了|调用", "calls"),
    ("使用了|使用", "uses"),
    ("读取了|读取", "reads_from"),
    ("写入到|写入了|写入", "writes_to"),
    ("连接到|连接了|连接", "connects_to"),
)
_VERB_TABLE: tuple[tuple[str, bool, bool], ...] = tuple((r, p, b) for _, r, p, b in _ENGLISH_VERBS) + tuple(
    (r, False, False) for _, r in _CHINESE_VERBS
)
# One capturing group per table row, so match.lastindex says which row matched.
_VERB = re.compile(
    "|".join(
        [rf"(?<![{_ENTITY_CHARS}])({pattern})(?![A-Za-z0-9_-])" for pattern, *_ in _ENGLISH_VERBS]
        + [f"({pattern})" for pattern, _ in _CHINESE_VERBS]
    ),
    re.IGNORECASE,
)

_BE = r"is|are|was|were|be|been|being"
# Words that name a kind of thing, not a thing: "the checkout service" means "checkout".
_GENERIC_NOUNS = "service|services|server|application|database|db|cache|queue|cluster|component|module|system"
_ENGLISH_GAP = (
    r"also|still|now|only|directly|currently|always|usually|typically|mainly|primarily|heavily|indirectly"
    r"|then|just|often|sometimes|frequently|does|do|did|will|would|can|could|should|must|may|might|has|have"
    rf"|had|not|never|no|longer|n['’]t|{_BE}|{_GENERIC_NOUNS}"
)
_CHINESE_GAP = "也|还|会|将|都|只|仅|就|直接|同时|主要|需要|需|目前|现在|一直|通常|并|再|不|没有|没|未|无需|从不|从未|服务|系统|模块|组件"
_GAP = rf"(?:\s*(?:(?<![A-Za-z])(?:{_ENGLISH_GAP})(?![A-Za-z])|{_CHINESE_GAP}))*\s*"
_SUBJECT = re.compile(rf"({_ENTITY})({_GAP})$", re.IGNORECASE)
_CONJUNCTION = re.compile(rf"(?:\s*(?:\band\b|,|，|并且|而且|然后|且))+{_GAP}", re.IGNORECASE)
_OBJECT = re.compile(rf"\s*(?:(?:the|an?|its|our|their)\s+)?({_ENTITY})", re.IGNORECASE)
_LIST_SEPARATOR = re.compile(
    r"\s*(?:,\s*(?:and|or)\s+|,|，|、|\band\s+|\bor\s+|\bplus\s+|&|以及|和|与|及|或)\s*(?:the\s+)?",
    re.IGNORECASE,
)
_CLAUSE_AHEAD = re.compile(rf"{_GAP}(?:{_VERB.pattern})", re.IGNORECASE)
_SENTENCE_NEGATION = re.compile(r"\b(?:not|never|cannot|neither|nor|no\s+longer)\b|n['’]t\b", re.IGNORECASE)
_GAP_NEGATION = re.compile(r"不|没|未|无需")
_GAP_BE = re.compile(rf"\b(?:{_BE})\b", re.IGNORECASE)
_NOT_ENTITIES = (
    STOPWORDS
    | frozenset(_GENERIC_NOUNS.split("|"))
    | frozenset(
        "also one everything something nothing anything each both either other another per more most".split()
    )
)
_SUBJECT_WINDOW = 200


@dataclass(frozen=True, slots=True)
class Relation:
    subject: str
    relation: str
    object: str
    sentence: str


def extract_relations(text: str) -> list[Relation]:
    seen: set[tuple[str, str, str]] = set()
    out: list[Relation] = []
    for sentence in split_sentences(text):
        if _SENTENCE_NEGATION.search(sentence):
            continue
        for subject, relation, obj in _sentence_relations(sentence):
            key = (subject, relation, obj)
            if subject != obj and key not in seen:
                seen.add(key)
                out.append(Relation(subject, relation, obj, sentence))
    return out


def _sentence_relations(sentence: str) -> list[tuple[str, str, str]]:
    found: list[tuple[str, str, str]] = []
    # Where the previous clause's object list ended and its subject, for "A calls B and uses C".
    last_end = -1
    last_subject = ""
    for verb in _VERB.finditer(sentence):
        if verb.start() < last_end:
            continue
        relation, passive, be_ok = _VERB_TABLE[verb.lastindex - 1]
        subject, gap = _subject(sentence, verb.start(), last_end, last_subject)
        if not subject or _GAP_NEGATION.search(gap) or (not be_ok and _GAP_BE.search(gap)):
            continue
        objects, end = _objects(sentence, verb.end())
        if not objects:
            continue
        for obj in objects:
            found.append((obj, relation, subject) if passive else (subject, relation, obj))
        last_end, last_subject = end, subject
    return found


def _subject(sentence: str, verb_start: int, last_end: int, last_subject: str) -> tuple[str, str]:
    """(subject, the words between it and the verb); subject is "" when there is none."""
    if last_end >= 0:
        between = sentence[last_end:verb_start]
        if _CONJUNCTION.fullmatch(between):
            return last_subject, between
    match = _SUBJECT.search(sentence, max(0, verb_start - _SUBJECT_WINDOW), verb_start)
    if match is None:
        return "", ""
    entity = _normalise(match.group(1))
    return entity, match.group(2)


def _objects(sentence: str, pos: int) -> tuple[list[str], int]:
    """The entity list right after a verb ("B", "B and C", "B, C and D", "B、C 和 D") and where it ends.
    An item followed by its own verb starts a new clause ("... B and C calls D"), so it stops the list."""
    objects: list[str] = []
    end = start = pos
    while (item := _OBJECT.match(sentence, start)) is not None and not _VERB.match(sentence, item.start(1)):
        if objects and _CLAUSE_AHEAD.match(sentence, item.end()):
            break
        entity = _normalise(item.group(1))
        if not entity:
            break
        objects.append(entity)
        end = item.end()
        separator = _LIST_SEPARATOR.match(sentence, end)
        if separator is None:
            break
        start = separator.end()
    return objects, end


def _normalise(token: str) -> str:
    entity = token.lower()
    if entity in _NOT_ENTITIES or entity.isdigit():
        return ""
    return entity
