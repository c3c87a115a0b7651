"""Detect explicit user constraints (prohibitions and requirements) to pin in the context.

``detect_constraints`` returns whole sentences of a USER message, verbatim (exact
substrings of the input, stripped of surrounding whitespace, terminating punctuation
kept), in their original order. Exception: a sentence containing a secret is returned
with the secret replaced by ``[REDACTED:<kind>]`` (sidecar.secrets.redact), so that part
is no longer verbatim; pinned blocks must never carry credentials.

Questions (ending in ?/？/吗/呢, or starting with why/为什么/为啥) are never constraints,
and well-known non-constraint phrases ("don't know", "never mind", 别人, 不要紧, 必须的吗)
are excluded.

A permission to do a side-effecting operation ("you may restart staging now", "现在可以重启测试环境了")
is pinned too, as its own constraint: it is how the user lifts an earlier prohibition, and kept
verbatim after it the model reads the later word as the one that holds. Nothing is ever unpinned
by what a message says; only Unpin does that, so a permission never drops an unrelated prohibition.

``constraint_key`` says when two pinned sentences are the same rule (rendered once).
"""

from __future__ import annotations

import re
from functools import lru_cache

from sidecar.literal_gate import GatedPattern, folded
from sidecar.memory.filters import normalize_for_dedup
from sidecar.secrets import contains_secret, redact
from sidecar.textmodel import split_sentences, word_tokens

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

# Operations a permission may grant: the side-effecting ones prohibitions are about ("you can see
# the error" or "可以看看日志" grant nothing).
_OPERATIONS_EN = (
    r"(?:restart|reboot|deploy|redeploy|roll\s*back|roll\s+out|release|delete|drop|remove|modify|change|touch|"
    r"scale|migrate|push|merge|write|update|upgrade|downgrade|stop|kill|shut\s+down|run|execute)"
)
_OPERATIONS_CN = "重启|部署|发布|上线|下线|回滚|删除|删|修改|改|变更|执行|扩容|缩容|迁移|停止|停掉|关闭|关掉|升级|降级|写入|清理|动"
_PERMISSION_RULES: list[re.Pattern[str]] = [
    # "you may restart", "you can now deploy"; not "you may not", "you can't", "could" (a suggestion).
    re.compile(rf"\byou\s+(?:may|can)\s+(?:now\s+|go\s+ahead\s+and\s+|safely\s+)?{_OPERATIONS_EN}\b", re.I),
    re.compile(
        r"\b(?:go\s+ahead\s+and|feel\s+free\s+to|(?:you\s+are|you're)\s+(?:now\s+)?(?:allowed|permitted|cleared)\s+to|"
        rf"(?:it's|it\s+is)\s+(?:now\s+)?(?:ok|okay|fine|safe)\s+to)\s+(?:now\s+)?{_OPERATIONS_EN}\b",
        re.I,
    ),
    # 可以/允许 + an operation; not 不可以, 可不可以, 只允许 (a requirement), nor a first or third person
    # saying what they can do (我们可以先重启看看 is a suggestion).
    re.compile(rf"(?<![不只我们他她它])(?:可以|允许|准许)(?:先|再|直接|马上|立即|随时|去)*(?:{_OPERATIONS_CN})"),
]

_QUESTION_RE = re.compile(r"(?:[?？]|[吗呢么嘛][\s。.!！~～]*)$|^(?:why|how\s+come|为什么|为啥|怎么)", re.I)
# Each rule behind the literals every match of it holds: most sentences hold none of any rule's.
_GATED_RULES = [GatedPattern(rx) for rx in (*_CN_RULES, *_EN_RULES, *_PERMISSION_RULES)]
_ASCII_RULES = [rule for rule in _GATED_RULES if rule.ascii_ok]  # those an ASCII sentence can match


def _is_constraint(sentence: str) -> bool:
    if _QUESTION_RE.search(sentence):
        return False
    s = sentence.replace("\u2019", "'").replace("\uff07", "'")
    low = folded(s)  # what every IGNORECASE rule's gates read
    return any(rule.search(s, low) for rule in (_ASCII_RULES if s.isascii() else _GATED_RULES))


def detect_constraints(text: str) -> list[str]:
    """Explicit prohibitions, requirements and permissions in a USER message, verbatim, in order,
    deduplicated."""
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


# Words that change nothing in a rule: politeness, repetition, emphasis, articles. Negations, modals,
# quantifiers ("only", "all") and every content word stay, so "must" and "must not", production and
# staging never share a key: merging two rules that differ in one such word would drop one of them.
_FILLER_WORDS = frozenset("please pls kindly just really again also remember reminder note ok okay so the a an".split())
# 一定 only where it is emphasis: 不一定要 ("need not") without it would read 不要 ("do not").
_FILLER_CN = re.compile(r"请|再说一遍|再强调一次|重申一下|重申|记住|注意|千万|(?<!不)一定|务必|再次|再|的|了|吧|啊|呀|哦")
_CONTRACTIONS = (
    (re.compile(r"\bwon['\u2019]t\b", re.I), "will not"),
    (re.compile(r"\bcan['\u2019]t\b|\bcannot\b", re.I), "can not"),
    (re.compile(r"\bshan['\u2019]t\b", re.I), "shall not"),
    (re.compile(r"\bdont\b", re.I), "do not"),
    (re.compile(r"n['\u2019]t\b", re.I), " not"),
)


@lru_cache(maxsize=1 << 14)
def constraint_key(text: str) -> str:
    """Equal for two constraints that are the same rule said again: case, whitespace, punctuation,
    contractions and filler words aside, the same words in the same order ("Please, DON'T restart
    prod!" and "do not restart prod"). Word order is kept: "copy prod to staging" is not "copy
    staging to prod". Cached: BuildContext asks for every pinned constraint on every call."""
    for rx, full in _CONTRACTIONS:
        text = rx.sub(full, text)
    words = word_tokens(normalize_for_dedup(_FILLER_CN.sub(" ", text)))
    return " ".join(w for w in words if w not in _FILLER_WORDS)


__all__ = ["constraint_key", "detect_constraints"]
