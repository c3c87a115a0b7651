"""Rule-based extraction of simple service facts ("payment-api depends on payment-db", "redis-cluster
部署在 vm-pool-3") from English and Chinese text, for the knowledge graph.

Precision over recall: a relation needs a service-like subject right before the verb (only
adverbs, auxiliaries and generic nouns like "service" / "服务" may sit between) and a service-like
object right after it. Sentences with English negation ("does not", "never", "no longer") and
questions are skipped whole; a Chinese negator before the verb ("不依赖", "没有调用") drops that
clause, and so does a condition ("if", "如果") in the verb's clause. Entities are lowercased; each
(subject, relation, object) is returned once, with its first sentence.

Edges point from what breaks to what it needs (payment-api --depends_on--> payment-db, redis-cluster
--deployed_on--> vm-pool-3), whatever the sentence's voice: "vm-pool-3 hosts redis-cluster" and
"vm-pool-3 上运行着 redis-cluster" give redis-cluster --...--> vm-pool-3. So walking IMPACT_RELATIONS
backwards from an entity answers "what breaks if it goes down".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from itertools import product

from sidecar.knowledge.chunking import split_sentences
from sidecar.text import STOPWORDS

RELATIONS = (
    "depends_on",
    "calls",
    "uses",
    "reads_from",
    "writes_to",
    "backed_by",
    "connects_to",
    "deployed_on",
    "runs_on",
    "hosted_on",
    "owned_by",
)
# An owning team being away breaks nothing: ownership is the one relation an impact walk skips.
IMPACT_RELATIONS = frozenset(RELATIONS) - {"owned_by"}


@dataclass(frozen=True, slots=True)
class _Verb:
    pattern: str
    relations: tuple[str, ...] = ()
    # The list after the verb is the relation's subject: "X is called by Y", "Y hosts X".
    swap: bool = False
    # A be-verb may precede the verb ("is hosted on"); for the others it signals naming ("is called X").
    be_ok: bool = False
    # A Chinese frame opener ("X 由 Y 负责", "X 从 Y 读取"): the verb closing the frame after Y says
    # the relation.
    closings: tuple[_Verb, ...] = ()


_ENTITY_CHARS = r"A-Za-z0-9_.:/\-"
# Must end on a word character so a sentence's final "." or a trailing ":" is not swallowed.
_ENTITY = rf"(?<![{_ENTITY_CHARS}'’])[A-Za-z0-9](?:[{_ENTITY_CHARS}]*[A-Za-z0-9_])?"
_ADVERB = r"(?:\s+(?:heavily|directly|mostly|mainly|entirely|only|strongly|partly))?"
_ON = r"(?:on\s+top\s+of|on|onto|in|into|inside|within|atop|across|to|at)"

# Passive and compound forms come before the forms they start with, so they win at the same position.
_ENGLISH_VERBS: tuple[_Verb, ...] = (
    _Verb(r"depended\s+on\s+by|relied\s+on\s+by", ("depends_on",), swap=True, be_ok=True),
    _Verb(r"(?:called|invoked)\s+by", ("calls",), swap=True, be_ok=True),
    _Verb(r"used\s+by", ("uses",), swap=True, be_ok=True),
    _Verb(r"(?:read|consumed)\s+by", ("reads_from",), swap=True, be_ok=True),
    _Verb(r"written\s+to\s+by", ("writes_to",), swap=True, be_ok=True),
    _Verb(r"(?:owned|maintained)\s+by", ("owned_by",), be_ok=True),
    _Verb(rf"hosted\s+(?:by|with|{_ON})", ("hosted_on",), be_ok=True),
    _Verb(rf"(?:deployed|redeployed)\s+{_ON}", ("deployed_on",), be_ok=True),
    _Verb(rf"(?:runs|run|running|ran)\s+{_ON}", ("runs_on",), be_ok=True),
    _Verb(
        r"(?:reads|read)(?:\s+from)?\s*(?:/|\band\b|&)\s*(?:writes|write)(?:\s+to)?"
        r"|(?:writes|write)(?:\s+to)?\s*(?:/|\band\b|&)\s*(?:reads|read)(?:\s+from)?",
        ("reads_from", "writes_to"),
    ),
    _Verb(rf"(?:depends|depend|depended|relies|rely|relied){_ADVERB}\s+on", ("depends_on",)),
    _Verb(r"dependent\s+on", ("depends_on",), be_ok=True),
    _Verb(r"calls|call|called|invokes|invoke|invoked|(?:talks|talk)\s+to", ("calls",)),
    _Verb(r"uses|use|used(?!\s+to\b)", ("uses",)),
    # A plain noun may sit between verb and particle: "reads secrets from vault-01".
    _Verb(r"(?:reads|read|loads|load)(?:\s+(?:the|its|their))?(?:\s+[a-z]+){0,2}?\s+from"
          r"|(?:consumes|consume|consumed)(?:\s+from)?", ("reads_from",)),
    _Verb(r"(?:writes|write|wrote)(?:\s+(?:the|its|their))?(?:\s+[a-z]+){0,2}?\s+to"
          r"|(?:publishes|publish|published)\s+to", ("writes_to",)),
    _Verb(r"backed\s+by", ("backed_by",), be_ok=True),
    _Verb(r"(?:connects|connect|connected)\s+to", ("connects_to",), be_ok=True),
    # Only the third person: "host" and "own" are mostly nouns and adjectives ("payment-api host").
    _Verb(r"hosts", ("hosted_on",), swap=True),
    _Verb(r"owns|own", ("owned_by",), swap=True),
)
# Verbs that also read passively inside "被/由 Y …" ("payment-db 被 billing 调用").
_CHINESE_ACTIONS: tuple[_Verb, ...] = (
    _Verb("依赖于|依赖", ("depends_on",)),
    _Verb("调用了|调用", ("calls",)),
    _Verb("使用了|使用", ("uses",)),
    _Verb("读写", ("reads_from", "writes_to")),
    _Verb("读取了|读取|消费", ("reads_from",)),
    _Verb("写入到|写入了|写入|发布到|推送到|投递到", ("writes_to",)),
    _Verb("连接到|连接了|连接", ("connects_to",)),
)
_CHINESE_OWNED = _Verb("负责|维护|管理|运维|拥有|所有|管", ("owned_by",))
_CHINESE_PLACED = (
    _Verb("上?(?:运行|跑)", ("runs_on",)),
    _Verb("上?部署", ("deployed_on",)),
    _Verb("上?托管", ("hosted_on",)),
)
_CHINESE_VERBS: tuple[_Verb, ...] = _CHINESE_ACTIONS + (
    _Verb("部署在|部署于|部署到|部署至", ("deployed_on",)),
    _Verb("运行在|运行于|跑在", ("runs_on",)),
    _Verb("托管于|托管在|托管到", ("hosted_on",)),
    _Verb(r"归属于|归属|的\s*(?:owner|负责人|负责团队|维护团队|维护人|所有者)\s*(?:是|为)", ("owned_by",)),
    # "vm-pool-3 上运行着 redis-cluster": the place comes first.
    _Verb("上(?:运行|跑)(?:着|了)", ("runs_on",), swap=True),
    _Verb("上部署(?:着|了)", ("deployed_on",), swap=True),
    _Verb("上托管(?:着|了)", ("hosted_on",), swap=True),
    # Frames; the lookaheads keep "由于" (because), "从不" (never), "归属" out.
    _Verb(
        "由(?!于)|被",
        closings=(_CHINESE_OWNED, _Verb("托管", ("hosted_on",)))
        + tuple(replace(v, swap=True) for v in _CHINESE_ACTIONS),
    ),
    _Verb("从(?![不未而])", closings=(_Verb("读取|读|拉取|消费|订阅|获取|同步", ("reads_from",)),)),
    _Verb(
        "向|往",
        closings=(
            _Verb("写入|写|推送|发布|投递|上报", ("writes_to",)),
            _Verb("发起调用|发送请求|发请求", ("calls",)),
        ),
    ),
    _Verb("归(?!属)", closings=(_CHINESE_OWNED,)),
    _Verb("在", closings=_CHINESE_PLACED),
)
_VERB_TABLE: tuple[_Verb, ...] = _ENGLISH_VERBS + _CHINESE_VERBS
# One capturing group per table row, so match.lastindex says which row matched; the English rows share
# one word-boundary check (once per position, not once per row).
_VERB = re.compile(
    rf"(?<![{_ENTITY_CHARS}])(?:{'|'.join(f'({v.pattern})' for v in _ENGLISH_VERBS)})(?![A-Za-z0-9_-])|"
    + "|".join(f"({v.pattern})" for v in _CHINESE_VERBS),
    re.IGNORECASE,
)

_BE = r"is|are|was|were|be|been|being|get|gets|got|getting"
# Words that name a kind of thing, not a thing: "the checkout service" means "checkout".
_GENERIC_NOUNS = (
    "service|services|server|application|database|db|cache|queue|cluster|component|module|system"
    "|pod|pods|instance|instances|container|containers|replica|replicas|node|nodes|vm|vms|machine|machines"
    "|broker|brokers|frontend|backend|team|teams|job|jobs|lambda|function|functions|site|website|app|apps"
)
_ENGLISH_GAP = (
    r"also|still|now|only|directly|currently|always|usually|typically|mainly|primarily|heavily|indirectly"
    r"|then|just|often|sometimes|frequently|does|do|did|will|would|can|could|should|must|may|might|has|have"
    rf"|had|both|all|not|never|no|longer|n['’]t|{_BE}|{_GENERIC_NOUNS}"
)
_CHINESE_GAP = (
    "也|还|会|将|都|均|只|仅|就|直接|同时|主要|需要|需|目前|现在|一直|通常|默认|分别|已经|已|被|强|弱|并|再"
    "|不|没有|没|未|无需|从不|从未|服务|系统|模块|组件|集群|实例|数据库|团队|小组"
)
# Also skipped between subject and verb: a parenthesis ("payment-api (支付核心) 部署在"), a Chinese
# via-phrase ("X 通过 api-gateway 调用 Y") and a Chinese object put first ("X 将订单写入 Y").
_HAN = r"[\u4e00-\u9fff]"
_ASIDE = rf"[(（][^()（）]{{1,40}}[)）]|(?:通过|经过|经由|借助)\s*{_ENTITY}|(?:将|把){_HAN}{{1,8}}"
_GAP = rf"(?:\s*(?:(?<![A-Za-z])(?:{_ENGLISH_GAP})(?![A-Za-z])|{_ASIDE}|{_CHINESE_GAP}))*\s*"
_SUBJECT = re.compile(rf"({_ENTITY})({_GAP})$", re.IGNORECASE)
# More subjects before the one next to the verb: "payment-api and checkout-web depend on …". The
# nearest join must be a conjunction (a bare comma usually ends an introductory phrase); "A, B and C".
_SUBJECT_JOIN = re.compile(
    rf"({_ENTITY})\s*(?:,?\s*\b(?:and|or)\s+|&|、|和|与|以及|及|或)\s*(?:the\s+)?$", re.IGNORECASE
)
_SUBJECT_MORE = re.compile(rf"({_ENTITY})\s*[,、]\s*(?:the\s+)?$", re.IGNORECASE)
# An entity after a Chinese preposition ("从 X 调用") or a quantifier ("all payment services") is no subject.
_NOT_SUBJECT_BEFORE = re.compile(
    r"(?:通过|经过|经由|借助|从|被|由|向|往|对|给|所有|全部|其他|其它|一些|部分)\s*$"
    r"|\b(?:all|every|each|most|some|many|several|other)\s+$",
    re.IGNORECASE,
)
# A Chinese clause may end on its own non-entity object first: "X 从 kafka 消费消息，并调用 Y".
_CONJUNCTION = re.compile(
    rf"(?:\s*{_HAN}{{1,8}}?)?(?:\s*(?:\band\b|,|，|并且|而且|然后|并|且))+{_GAP}", re.IGNORECASE
)
# "… depends on payment-db, which runs on vm-pool-3": the previous objects are the subjects.
_RELATIVE = re.compile(rf"\s*,?\s*\b(?:(?:both|all|each)\s+of\s+which|which|that)\b{_GAP}", re.IGNORECASE)
# "every node of X" is X; generic nouns and a Chinese locative after the object belong to it: "runs on
# the k8s-prod cluster and calls …", "部署在 vm-pool-3 上，由 … 负责".
_OBJECT = re.compile(
    rf"\s*(?:(?:every|each|all|some)\s+(?:{_GENERIC_NOUNS})\s+(?:of|in)\s+)?(?:(?:the|an?|its|our|their)\s+)?"
    rf"({_ENTITY})(?:\s+(?:{_GENERIC_NOUNS})\b)*(?:\s*[上中里内](?![运跑部托]))?",
    re.IGNORECASE,
)
_LIST_SEPARATOR = re.compile(
    r"\s*(?:,\s*(?:and|or)\s+|,|，|、|\band\s+|\bor\s+|\bplus\s+|&|以及|和|与|及|或)\s*(?:the\s+)?",
    re.IGNORECASE,
)
_CLAUSE_AHEAD = re.compile(rf"{_GAP}(?:{_VERB.pattern})", re.IGNORECASE)
# A plain word after "and" that a participle or a content word follows starts a new phrase, not another
# object: "backed by dynamodb and cached in …", "depends on payment-db and handles retries".
_PHRASE_AHEAD = re.compile(
    r"(?:(?<=ed)|(?<=ing))\s+[A-Za-z]|\s+(?!(?:and|or|plus|over|for|via|in|on|at|with|to|from|through|as|when"
    r"|during|behind|by|respectively)\b)[A-Za-z]",
    re.IGNORECASE,
)
# One alternation per frame opener, a group per closing verb (lastindex says which).
# A coordinated verb may come first: "由 team-risk 开发和运维".
_CLOSINGS = {
    v: re.compile(rf"({_GAP}(?:{_HAN}{{2}}[和与并及、])?)(?:{'|'.join(f'({c.pattern})' for c in v.closings)})")
    for v in _VERB_TABLE
    if v.closings
}
# "A and B run on X and Y respectively", "A 和 B 分别部署在 X 和 Y": pairs, not every combination.
_RESPECTIVELY = re.compile(r"\s*,?\s*respectively\b", re.IGNORECASE)
_SENTENCE_NEGATION = re.compile(
    r"\b(?:not|never|cannot|neither|nor|no\s+longer|nothing|nobody|none|no\s+one)\b|n['’]t\b", re.IGNORECASE
)
_QUESTION = re.compile(r"(?:[?？]|吗)[\s\"'”’)）]*$")
_GAP_NEGATION = re.compile(r"不|没|未|无需")
_GAP_BE = re.compile(rf"\b(?:{_BE})\b", re.IGNORECASE)
_CLAUSE_BREAK = re.compile(r"[,;:，；：]")
_CONDITION = re.compile(r"\b(?:if|unless|whether)\b|如果|假如|若(?!干)|要是|是否|万一", re.IGNORECASE)
_NOT_ENTITIES = (
    STOPWORDS
    | frozenset(_GENERIC_NOUNS.split("|"))
    | frozenset(
        "also one everything something nothing anything nobody none someone everyone each both either other"
        " another per more most person people engineer engineers developer developers user users customer"
        " customers".split()
    )
    # Quantities, times, manners and environments after "runs on/in", "deployed in": not components.
    | frozenset(
        "every multiple several many few port ports parallel background foreground batch batches demand"
        " startup boot schedule cron loop top today tomorrow yesterday morning afternoon evening night"
        " nightly weekdays weekends monday tuesday wednesday thursday friday saturday sunday mondays tuesdays"
        " wednesdays thursdays fridays saturdays sundays production prod staging dev development test"
        " testing qa sandbox".split()
    )
)
# Numbers, dates and times ("2024-05-01", "10:00") and durations ("a five-minute schedule") are no components.
_NOT_A_NAME = re.compile(r"^[\d.:/-]+$|-(?:seconds?|minutes?|hours?|days?|weeks?|months?)$")
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
        if _SENTENCE_NEGATION.search(sentence) or _QUESTION.search(sentence):
            continue
        for subject, relation, obj in _sentence_relations(sentence):
            key = (subject, relation, obj)
            if subject != obj and key not in seen:
                seen.add(key)
                out.append(Relation(subject, relation, obj, sentence))
    return out


def _sentence_relations(sentence: str) -> list[tuple[str, str, str]]:
    found: list[tuple[str, str, str]] = []
    # The previous clause's end, subjects and objects, for "A calls B and uses C" and "…B, which …".
    last_end = -1
    last_subjects: list[str] = []
    last_objects: list[str] = []
    for verb in _VERB.finditer(sentence):
        if verb.start() < last_end:
            continue
        row = _VERB_TABLE[verb.lastindex - 1]
        subjects, gap = _subjects(sentence, verb.start(), last_end, last_subjects, last_objects)
        if (
            not subjects
            or _GAP_NEGATION.search(gap)
            or (not row.be_ok and _GAP_BE.search(gap))
            or _CONDITION.search(_CLAUSE_BREAK.split(sentence[: verb.start()])[-1])
        ):
            continue
        # Inside a frame the list runs up to the closing verb: "被 A 和 B 调用" has two objects.
        objects, end = _objects(sentence, verb.end(), in_frame=bool(row.closings))
        if not objects:
            continue
        if row.closings:
            closing = _CLOSINGS[row].match(sentence, end)
            if closing is None or _GAP_NEGATION.search(closing.group(1)):
                continue
            # Group 1 is the gap before the closing verb; one group per closing follows.
            row, end = row.closings[closing.lastindex - 2], closing.end()
        respectively = _RESPECTIVELY.match(sentence, end)
        if len(subjects) == len(objects) > 1 and (respectively or "分别" in gap):
            pairs = zip(subjects, objects, strict=True)
            end = respectively.end() if respectively else end
        else:
            pairs = product(subjects, objects)
        for subject, obj in pairs:
            found.extend((obj, r, subject) if row.swap else (subject, r, obj) for r in row.relations)
        last_end, last_subjects, last_objects = end, subjects, objects
    return found


def _subjects(
    sentence: str, verb_start: int, last_end: int, last_subjects: list[str], last_objects: list[str]
) -> tuple[list[str], str]:
    """(subjects, the words between them and the verb); no subjects when there is none."""
    if last_end >= 0:
        between = sentence[last_end:verb_start]
        if _CONJUNCTION.fullmatch(between):
            return last_subjects, between
        if _RELATIVE.fullmatch(between):
            return last_objects, between
    match = _SUBJECT.search(sentence, max(0, verb_start - _SUBJECT_WINDOW), verb_start)
    if match is None or _NOT_SUBJECT_BEFORE.search(sentence, max(0, match.start(1) - 8), match.start(1)):
        return [], ""
    entity = _normalise(match.group(1))
    if not entity:
        return [], ""
    subjects = [entity]
    # Never reach back into the previous clause: its objects are not these subjects.
    lo, start, join = max(0, last_end, verb_start - _SUBJECT_WINDOW), match.start(1), _SUBJECT_JOIN
    while (item := join.search(sentence, lo, start)) is not None and (more := _normalise(item.group(1))):
        subjects.insert(0, more)
        start, join = item.start(1), _SUBJECT_MORE
    return subjects, match.group(2)


def _objects(sentence: str, pos: int, *, in_frame: bool = False) -> tuple[list[str], int]:
    """The entity list right after a verb ("B", "B and C", "B, C and D", "B、C 和 D") and where it ends.
    An item followed by its own verb starts a new clause ("... B and C calls D"), so it stops the list
    (not inside a frame, which a verb closes)."""
    objects: list[str] = []
    end = start = pos
    while (item := _OBJECT.match(sentence, start)) is not None and not _VERB.match(sentence, item.start(1)):
        if objects and not in_frame and (
            _CLAUSE_AHEAD.match(sentence, item.end())
            or (item.group(1).isalpha() and _PHRASE_AHEAD.match(sentence, item.end()))
        ):
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
    if entity in _NOT_ENTITIES or _NOT_A_NAME.search(entity):
        return ""
    return entity
