"""After-turn extraction of long-term memory candidates (rule-based or LLM-backed).

``RuleBasedExtractor`` reads USER turns for preferences, habits and stated facts about the
user's environment, and user/assistant/tool turns for incident -> conclusion episodes.
Candidate content is left unredacted on purpose: the filter stage (sidecar.memory.filters)
must see a secret to reject the candidate with reason ``secret``. Weak cues ("maybe",
"也许") lower confidence below the default 0.7 filter threshold.

``subject`` is a stable key used to detect conflicting memories: known topics map to fixed
keys (``answer_style``, ``language``, ``default_env``, ``editor``, ``name``, ``location``, ...);
other statements get a key built from their main noun phrase (``prod_cluster``, ``manager``,
``owns:payment-api``). ``derive_subject`` is that rule; AddMemory without a subject uses it too.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from sidecar.caseless import CaselessPattern
from sidecar.llm import ChatClient, LLMError, parse_json_content
from sidecar.secrets import redact
from sidecar.textmodel import Turn, find_entities, find_environments, is_low_information, sentences

CandidateType = Literal["preference", "episode", "habit", "semantic"]
Authority = Literal["USER_STATED", "TOOL_VERIFIED", "INFERRED"]
CANDIDATE_TYPES: frozenset[str] = frozenset({"preference", "episode", "habit", "semantic"})
AUTHORITIES: frozenset[str] = frozenset({"USER_STATED", "TOOL_VERIFIED", "INFERRED"})


@dataclass
class MemoryCandidate:
    type: CandidateType
    content: str
    subject: str
    confidence: float
    authority: Authority
    source_message_ids: list[str] = field(default_factory=list)


class Extractor(Protocol):
    def extract(self, turns: Sequence[Turn]) -> list[MemoryCandidate]: ...


# --------------------------------------------------------------------------- rules

# "I like" / "I'd like" state a preference, but not as a reaction to what was just said or shown ("I like
# the idea of...", "I like the clean lines", "I like the Garden Party theme", "I like those", "I like how
# you put it": a definite "the" points at something in the conversation) or as a want of this
# conversation ("I'd like to know...", "I'd like you to help...", "I'd like a durable pump", "I'd like
# that!"): those say what the user is about now (_INTEREST_RE), kept as facts that compete only by
# relevance, not as preferences that compete on every call.
_REACTION = (r"\s+(?:the|that|this|these|those|your|both|it|how|what\s+you|"
             r"(?:some|most|all|one|many|each)\s+of)\b")
_REQUEST = r"\s+(?:(?:(?:you|it|them|him|her|us|someone|somebody)\s+)?to|that|this|it|those|these|some|an?|more)\b"
_INTEREST_RE = re.compile(r"\bi\s+(?:really\s+)?like" + _REACTION + r"|\bi'?d\s+like" + _REQUEST, re.I)
# "Please ..." states a standing wish when it says how to answer from now on ("please always...", "please
# answer in Chinese", "please use metric units", "please keep answers short"); not when it asks for a
# piece of work now ("please write an email...", "please use the above data", "please keep in mind...").
_STANDING_PLEASE = (r"\bplease\s+(?:always|never)\b|\bplease\s+(?:answer|reply|respond|write)\s+(?:(?:only|always)\s+)?in\b|"
                    r"\bplease\s+use\b(?!\s+(?:the|this|that|these|those|it|them|my|our|your|a|an)\b)|"
                    r"\bplease\s+keep\b(?!\s+(?:me|us)\b|\s+(?:(?:it|this|that|them|these|those)\s+)?(?:in\s+mind|track|going)\b)")
# "... which one I like best", "... later than I'd like": a comparison, no statement of what is liked.
_NOT_A_CHOICE = r"(?<!\bwhich\s)(?<!\bwhich\sone\s)(?<!\bwhich\sones\s)(?<!\bthan\s)"
_PREFERENCE_RE = re.compile(
    r"\bi\s+(?:would\s+|'d\s+)?prefer\b|" + _NOT_A_CHOICE + r"\bi\s+(?:really\s+)?like\b(?!" + _REACTION + r")|"
    + _NOT_A_CHOICE + r"\bi'?d\s+like\b(?!" + _REQUEST + r")|" + _STANDING_PLEASE
    + r"|\bfrom\s+now\s+on\b|\bgoing\s+forward\b|\bcall\s+me\b|\bby\s+default\b|"
    r"\bdefault\s+to\b|\bmy\s+(?:name\s+is\b(?![\"\u201d])|preferred\b)|以后|今后|我(?:可能|也许|大概|或许)?更?喜欢|我习惯|请用|请使用|默认|我偏好|叫我",
    re.I,
)
_HABIT_RE = re.compile(
    r"\bi\s+(?:usually|always|normally|typically|generally|often)\b|\bevery\s+(?:morning|day|week|night|evening|"
    r"monday|friday)\b|我通常|我每天|我一般|我经常|我总是|每天早上|每周",
    re.I,
)
_SEMANTIC_RE = re.compile(
    r"\bour\s+(?:[\w-]+\s+){0,3}?(?:is|are|runs|run|uses|use|lives|sits)\b|\bwe\s+(?:use|run|are\s+on|deploy|host)\b|"
    r"\b(?:my|our)\s+team\s+owns\b|\bi\s+own\b|\bi(?:'m|\s+am)\s+responsible\s+for\b|\bi\s+(?:work\s+on|maintain)\b|"
    r"我们的|我们用|我们使用|我们在用|我负责|我们团队负责|我维护",
    re.I,
)
_WEAK_RE = re.compile(
    r"\bmaybe\b|\bperhaps\b|\bmight\b|\bprobably\b|\bi\s+guess\b|\bnot\s+sure\b|\bi\s+think\b|\bsometimes\b|"
    r"可能|也许|或许|大概|好像|不确定",
    re.I,
)
_QUESTION_RE = re.compile(r"[?？]\s*$|[吗呢]\s*[。.]?$")
# A habit is the speaker's own: "every morning" in a pasted story or article ("the shop opens every
# morning") is not one. Chinese drops the subject ("每周五发布一次"), so any CJK sentence may say it.
_SPEAKER_RE = re.compile(r"\b(?:i|me|my|mine|myself|we|us|our|ours)\b|[\u4e00-\u9fff]", re.I)
_INCIDENT_RE = re.compile(
    r"\b(?:incident|outage|downtime|sev[-\s]?[0-4]|p[0-4]\s+incident|alert|alarm|paged|is\s+down|went\s+down)\b|"
    r"故障|告警|报警|宕机|事故|挂了",
    re.I,
)
_CONCLUSION_RE = re.compile(
    r"\broot[\s-]?cause\b|\bfixed\s+by\b|\bresolved\s+by\b|\bcaused\s+by\b|\bthe\s+fix\s+was\b|\bmitigated\s+by\b|"
    r"\bturned\s+out\b|根因|原因是|修复|已解决|解决了|结论|定位到",
    re.I,
)
# One search per turn decides whether the per-sentence rules run at all: a user's turn may hold any
# cue; another role's only an episode's (its statements are not the user's).
_ANY_CUE_RE = re.compile(
    "|".join(rx.pattern for rx in (_PREFERENCE_RE, _INTEREST_RE, _HABIT_RE, _SEMANTIC_RE, _INCIDENT_RE,
                                   _CONCLUSION_RE)),
    re.I,
)
_EPISODE_CUE_RE = re.compile("|".join(rx.pattern for rx in (_INCIDENT_RE, _CONCLUSION_RE)), re.I)
_ANY_CUE, _EPISODE_CUE = CaselessPattern(_ANY_CUE_RE), CaselessPattern(_EPISODE_CUE_RE)

# Known topics -> fixed subject keys, checked in order.
_TOPICS: list[tuple[str, re.Pattern[str]]] = [
    ("name", re.compile(r"\bcall\s+me\b|\bmy\s+name\s+is\b|叫我|我的名字", re.I)),
    (
        "default_env",
        re.compile(
            r"(?:default|from\s+now\s+on|going\s+forward|以后|默认|今后).*(?:prod|production|staging|test|dev|qa|uat|"
            r"生产|测试|预发|开发|灰度)|(?:prod|production|staging|生产|测试|预发).*(?:by\s+default|默认)",
            re.I,
        ),
    ),
    (
        "language",
        re.compile(r"\b(?:english|chinese|mandarin|japanese|language)\b|中文|英文|英语|汉语|日语|语言", re.I),
    ),
    (
        "answer_style",
        re.compile(
            r"\b(?:concise|brief|short|shorter|verbose|detailed|terse|succinct|bullet|step[\s-]by[\s-]step|answers?|"
            r"replies|explanations?)\b|简洁|简短|详细|啰嗦|要点|简单点|回答|回复",
            re.I,
        ),
    ),
    (
        "editor",
        re.compile(
            r"\b(?:vim|neovim|nvim|emacs|vscode|vs\s+code|nano|intellij|jetbrains|editor)\b|编辑器", re.I
        ),
    ),
    ("shell", re.compile(r"\b(?:bash|zsh|fish|powershell|shell)\b", re.I)),
    ("timezone", re.compile(r"\b(?:timezone|time\s+zone|utc|pst|est|cet)\b|时区|北京时间", re.I)),
    ("output_format", re.compile(r"\b(?:json|yaml|markdown|table|tables)\b|表格", re.I)),
    (
        "database",
        re.compile(r"\b(?:postgres(?:ql)?|mysql|mariadb|mongodb|mongo|dynamodb|sqlite|oracle)\b", re.I),
    ),
    ("cloud", re.compile(r"\b(?:aws|gcp|azure|aliyun|alibaba\s+cloud)\b|阿里云|腾讯云", re.I)),
    # Last, so "I moved to AWS" stays ``cloud``; present tense only ("I lived in Boston" is history).
    (
        "location",
        re.compile(
            r"\bi(?:\s+(?:now\s+|still\s+)?live|(?:\s+am|'m)\s+(?:now\s+)?(?:living|based))\s+(?:in|at|near)\b|"
            r"\bi(?:\s+have|'ve)?\s+(?:just\s+)?(?:moved|relocated)\s+to\b|我(?:现在)?住在|我(?:已经)?搬(?:家)?(?:到|去)",
            re.I,
        ),
    ),
]
_OWNERSHIP_RE = re.compile(r"\bowns\b|\bi\s+own\b|responsible\s+for|\bmaintain|负责|维护", re.I)

# Noun-phrase keys: a small bilingual vocabulary so "our prod cluster" and "我们的生产集群"
# both become "prod_cluster".
_SYNONYMS = dict(
    pair.split("=")
    for pair in (
        "production=prod 生产=prod staging=staging 预发=staging 测试=test testing=test 开发=dev development=dev "
        "环境=env environment=env 集群=cluster 数据库=database db=database 版本=version 服务=service "
        "监控=monitoring 日志=logging 告警=alerting 区域=region 机房=datacenter 网关=gateway 队列=queue 缓存=cache"
    ).split()
)
_STOPWORDS = frozenset(
    "the a an our my we i is are was were to of for in on at and or it this that with be main primary "
    "use uses using run runs running".split()
)
# "our prod cluster is ..." and "my manager is ...": the noun phrase is the key, the rest its value.
_EN_NP_RE = re.compile(r"\b(?:our|my)\s+((?:[\w-]+\s+){0,3}?)(?:is|are|runs|run|uses|use|lives|sits)\b", re.I)
_CN_NP_RE = re.compile(r"我们?的([^\s，,。是用在为]{1,12}?)(?:是|用|在|为|跑在|部署在)")
_CN_TERMS_RE = re.compile("|".join(sorted((k for k in _SYNONYMS if not k.isascii()), key=len, reverse=True)))
_KEY_TOKEN_RE = re.compile(r"[a-z0-9][a-z0-9_-]*|[\u4e00-\u9fff]+")


def _normalise_key(phrase: str) -> str:
    phrase = _CN_TERMS_RE.sub(lambda m: f" {_SYNONYMS[m.group()]} ", phrase.lower())
    words = [_SYNONYMS.get(w, w) for w in _KEY_TOKEN_RE.findall(phrase) if w not in _STOPWORDS]
    return "_".join(words[:3])


_TRIGGERS = {"preference": _PREFERENCE_RE, "habit": _HABIT_RE, "semantic": _SEMANTIC_RE}


def _owned(text: str) -> str:
    """What an ownership statement is about: its first service/host name, else the words after the verb.
    An environment is a qualifier ("the prod payment db"), not the thing owned: keyed on it, owning
    two production things would make one supersede the other."""
    envs = set(find_environments(text))
    names = [e for e in find_entities(text) if e not in envs]
    return names[0] if names else _normalise_key(_OWNERSHIP_RE.split(text, 1)[-1])


def derive_subject(text: str, kind: str) -> str:
    """The conflict key of a statement of `kind` (a candidate type); "" when it has none.

    Shared by the extractor and the write path (AddMemory without a subject), so both key a
    statement alike. In order: an interest (semantic: "I'd like to know about X" -> ``interest:`` and all
    its words), ownership (semantic), a known topic, "my/our <noun phrase> is", the
    words after the kind's cue ("I like tea" -> ``tea``, so "I like hiking" does not supersede it).
    Text with no cue of its kind gets "": a key from arbitrary leading words would make unrelated
    memories supersede each other. Episodes get "" too: a later incident does not undo an earlier one.
    """
    trigger = _TRIGGERS.get(kind)
    if trigger is None:
        return ""
    if kind == "semantic" and not trigger.search(text) and _INTEREST_RE.search(text):
        # An interest is keyed on all its words, so one never supersedes another.
        words = (w for w in _KEY_TOKEN_RE.findall(text.lower()) if w not in _STOPWORDS)
        return "interest:" + "_".join(words)[:120]
    if kind == "semantic" and _OWNERSHIP_RE.search(text) and (owned := _owned(text)):
        return "owns:" + owned
    for key, rx in _TOPICS:
        if rx.search(text):
            return key
    m = _EN_NP_RE.search(text) or _CN_NP_RE.search(text)
    if m and _normalise_key(m.group(1)):
        return _normalise_key(m.group(1))
    return _normalise_key(trigger.split(text, 1)[-1]) if trigger.search(text) else ""


_BASE_CONFIDENCE = {"preference": 0.9, "habit": 0.8, "semantic": 0.8}
_WEAK_CONFIDENCE = 0.55
_EPISODE_CONFIDENCE = 0.75


class RuleBasedExtractor:
    """Fast bilingual rules; precompiled regexes and one pre-check per turn."""

    def extract(self, turns: Sequence[Turn]) -> list[MemoryCandidate]:
        out: list[MemoryCandidate] = []
        open_incident: tuple[Turn, str] | None = None
        for turn in turns:
            text = turn.text
            cue = _ANY_CUE if turn.role == "user" else _EPISODE_CUE
            if turn.role == "system" or not cue.found(text) or is_low_information(text):
                continue
            for sentence in sentences(text):
                if turn.role == "user":
                    cand = self._statement(turn, sentence)
                    if cand is not None:
                        out.append(cand)
                        continue
                if _CONCLUSION_RE.search(sentence):
                    out.append(self._episode(open_incident, turn, sentence))
                    open_incident = None
                elif _INCIDENT_RE.search(sentence) and not _QUESTION_RE.search(sentence):
                    open_incident = (turn, sentence)
        return out

    @staticmethod
    def _statement(turn: Turn, sentence: str) -> MemoryCandidate | None:
        if _QUESTION_RE.search(sentence):
            return None
        for kind, rx in (("preference", _PREFERENCE_RE), ("habit", _HABIT_RE), ("semantic", _SEMANTIC_RE),
                         ("semantic", _INTEREST_RE)):  # an interest: a fact, keyed by derive_subject
            if rx.search(sentence) and (kind != "habit" or _SPEAKER_RE.search(sentence)):
                weak = bool(_WEAK_RE.search(sentence))
                return MemoryCandidate(
                    kind,  # type: ignore[arg-type]
                    sentence,
                    # The sentence matched its cue, so "" means only stopwords followed it.
                    derive_subject(sentence, kind) or _normalise_key(sentence) or "misc",
                    _WEAK_CONFIDENCE if weak else _BASE_CONFIDENCE[kind],
                    "USER_STATED",
                    [turn.message_id],
                )
        return None

    @staticmethod
    def _episode(incident: tuple[Turn, str] | None, turn: Turn, conclusion: str) -> MemoryCandidate:
        authority: Authority = {"user": "USER_STATED", "tool": "TOOL_VERIFIED"}.get(  # type: ignore[assignment]
            turn.role, "INFERRED"
        )
        if incident is None:
            content, ids, about = conclusion, [turn.message_id], conclusion
        else:
            first, incident_sentence = incident
            content = f"{incident_sentence} → {conclusion}"
            ids = list(dict.fromkeys([first.message_id, turn.message_id]))
            about = incident_sentence
        ents = find_entities(about) or find_entities(conclusion)
        subject = "incident:" + (ents[0] if ents else _normalise_key(about) or "misc")
        confidence = _EPISODE_CONFIDENCE if incident is not None or _INCIDENT_RE.search(conclusion) else 0.65
        return MemoryCandidate("episode", content, subject, confidence, authority, ids)


# --------------------------------------------------------------------------- LLM-backed

_EXTRACT_PROMPT = (
    "Extract long-term memory candidates about the USER from the conversation. Return JSON "
    '{"candidates": [{"type": "preference|episode|habit|semantic", "content": "short normalised statement", '
    '"subject": "stable snake_case key, e.g. answer_style, language, default_env, editor", '
    '"confidence": 0.0-1.0, "authority": "USER_STATED|TOOL_VERIFIED|INFERRED", '
    '"source_message_ids": ["..."]}]}. Only include durable facts, preferences, habits and incident '
    'conclusions; no small talk, no secrets, no raw logs. Return {"candidates": []} if there are none.'
)
_SUBJECT_CLEAN_RE = re.compile(r"[^\w:.-]+")


class LLMExtractor:
    """Extractor backed by an OpenAI-compatible endpoint; validates and clamps its output."""

    def __init__(
        self, client: ChatClient, *, fallback: Extractor | None = None, max_turn_chars: int = 4000
    ) -> None:
        self.client = client
        self.fallback = fallback
        self.max_turn_chars = max_turn_chars

    def extract(self, turns: Sequence[Turn]) -> list[MemoryCandidate]:
        if not turns:
            return []
        convo = "\n".join(
            f"[{t.message_id}] {t.role}: {redact(t.text)[: self.max_turn_chars]}"
            for t in turns
            if t.text.strip()
        )
        messages = [{"role": "system", "content": _EXTRACT_PROMPT}, {"role": "user", "content": convo}]
        try:
            data = parse_json_content(
                self.client.complete(messages, temperature=0.0, response_format_json=True)
            )
        except LLMError:
            if self.fallback is None:
                raise
            return self.fallback.extract(turns)
        raw = data.get("candidates", []) if isinstance(data, dict) else data
        valid_ids = [t.message_id for t in turns]
        return [
            c for c in (_validate(item, valid_ids) for item in raw if isinstance(raw, list)) if c is not None
        ]


def _validate(item: object, valid_ids: list[str]) -> MemoryCandidate | None:
    if not isinstance(item, dict):
        return None
    ctype = str(item.get("type", "")).strip().lower()
    content = redact(str(item.get("content", "")).strip())
    if ctype not in CANDIDATE_TYPES or not content:
        return None
    subject = _SUBJECT_CLEAN_RE.sub("_", str(item.get("subject", "")).strip().lower()).strip("_")
    try:
        confidence = float(item.get("confidence", 0.5))
    except (TypeError, ValueError):
        confidence = 0.5
    confidence = min(1.0, max(0.0, confidence)) if confidence == confidence else 0.5  # NaN -> 0.5
    authority = str(item.get("authority", "INFERRED")).strip().upper()
    if authority not in AUTHORITIES:
        authority = "INFERRED"
    ids_in = item.get("source_message_ids", [])
    ids = [i for i in ids_in if isinstance(i, str) and i in valid_ids] if isinstance(ids_in, list) else []
    return MemoryCandidate(
        ctype,  # type: ignore[arg-type]
        content[:1000],
        subject[:80] or derive_subject(content, ctype) or _normalise_key(content) or "misc",
        confidence,
        authority,  # type: ignore[arg-type]
        ids or list(valid_ids[-1:]),
    )


__all__ = [
    "MemoryCandidate",
    "Extractor",
    "RuleBasedExtractor",
    "LLMExtractor",
    "derive_subject",
    "CANDIDATE_TYPES",
    "AUTHORITIES",
]
