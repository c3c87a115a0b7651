"""The one secret detector used everywhere (memory filter, summaries, pinned blocks, tool views).

Detection = explicit patterns (passwords in context, vendor API keys/tokens, JWTs, bearer
tokens, ``key = value`` assignments, private key blocks, credentials in connection strings)
plus an entropy check for otherwise unlabelled random-looking tokens.

Entropy-check decisions (documented because they trade recall for precision):

* a token qualifies when it has >= 20 chars from ``[A-Za-z0-9+/=_-]``, mixes letters and
  digits and has Shannon entropy >= 3.5 bits/char;
* UUIDs are never secrets (they are ids);
* pure hex strings (git SHAs, sha256 digests, trace ids) are NOT flagged: ops text is full
  of them and redacting commit ids would destroy useful context. A hex secret that is
  labelled (``api_key=<hex>``, ``token: <hex>``) is still caught by the keyword patterns;
* all-lowercase identifiers built from dash/underscore/dot/slash separated parts with at
  least one plain word (k8s pod names like ``payment-api-7d9f8b6c5-x2x4z``, image tags,
  paths) are not flagged either: random secrets are almost always mixed case.

Where only part of a match is secret (the password in ``postgres://user:pass@host``, the
value after ``password:``), only that part is redacted so hosts and field names survive.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple


@dataclass(frozen=True)
class SecretSpan:
    start: int
    end: int
    kind: str


# Values that follow "password is"/"secret:" but are words, placeholders or env references.
_NOT_A_VALUE = re.compile(
    r"(?:required|wrong|incorrect|invalid|expired|correct|missing|empty|not|too|the|a|an|set|changed|"
    r"reset|needed|weak|strong|same|different|being|now|still|also|updated|stored|saved|hashed|"
    r"encrypted|in|on|at|for|ok|fine|valid|true|false|null|none|nil|undefined|redacted|hidden|"
    r"\*+|x{3,}|\.{3,}|<[^>]*>?|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\[REDACTED[^\]]*\]?|%\(?\w+\)?s?)",
    re.I,
)
_VALUE = r"(\"[^\"\n]{1,200}\"|'[^'\n]{1,200}'|[^\s\"',;]*[^\s\"',;.)\]}>])"


class _Rule(NamedTuple):
    kind: str
    rx: re.Pattern[str]
    group: int  # group holding the secret part (0 = whole match)
    no_before: str  # "alnum"/"alpha": the char before the match must not be one ("" = anything)
    folded: bool  # keyword rule: matched case-insensitively


def _rule(kind: str, pattern: str, group: int = 0, no_before: str = "", folded: bool = False) -> _Rule:
    return _Rule(kind, re.compile(pattern), group, no_before, folded)


# Every pattern starts with a literal (no leading lookbehind/\b) so the regex engine can
# skip through megabytes of logs quickly; boundary checks are done in code instead.
# Keyword ("folded") rules run on a lowercased copy, which is much faster than re.I.
_RULES: list[_Rule] = [
    _rule(
        "private_key",
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]*?"
        r"(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----|\Z)",
    ),
    _rule("aws_access_key", r"(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}(?![A-Za-z0-9])", no_before="alnum"),
    _rule("github_token", r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}", no_before="alnum"),
    _rule("slack_token", r"xox[abposre]-[A-Za-z0-9-]{10,}", no_before="alnum"),
    _rule("openai_key", r"sk-(?:proj-|svcacct-|ant-)?[A-Za-z0-9_-]{20,}", no_before="alnum"),
    _rule("stripe_key", r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,}", no_before="alnum"),
    _rule("google_api_key", r"AIza[0-9A-Za-z_-]{35}", no_before="alnum"),
    # Lookbehind kept here: "eyJeyJ..." without dots would otherwise rescan from every "eyJ".
    _rule("jwt", r"(?<![A-Za-z0-9])eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
    _rule("bearer_token", r"bearer\s+([a-z0-9._~+/=-]{8,})", 1, "alnum", folded=True),
    # scheme://user:PASSWORD@host — only the password is redacted, the host stays readable.
    _rule("connection_string", r"://[^\s:/@]+:([^\s@/]+)@[^\s/]+", 1),
    _rule(
        "password",
        r"(?:password|passwd|passphrase|pwd)(?![a-z])"
        r"(?:\s+(?:for|of|to|on|at)\s+(?:the\s+)?[\w.@:/-]+(?:\s+[\w.-]+)?)?"
        r"[\"']?\s*(?:[:=]|\s+is\b|\s+was\b)\s*" + _VALUE,
        1,
        "alpha",
        folded=True,
    ),
    # Chinese: passwords are essentially always ASCII, which also stops at the next CJK word.
    # A few CJK characters may sit between the keyword and its value ("密码登录：x", "口令设置为 x").
    _rule("password", r"(?:密码|口令|密钥)[\u4e00-\u9fff]{0,6}?\s*(?:是|为|[:：=])\s*([\x21-\x7e]*[\x21-\x2d\x2f-\x7e])",
          1),
    _rule(
        "api_key",
        r"(?:api[_-]?key|apikey|token|secret|access[_-]?key|client[_-]?secret|auth[_-]?token|"
        r"private[_-]?key|secret[_-]?key)(?![a-z])[\"']?\s*[:=]\s*" + _VALUE,
        1,
        "alpha",
        folded=True,
    ),
]
_RULES_CI = [r._replace(rx=re.compile(r.rx.pattern, re.I)) if r.folded else r for r in _RULES]

# "=" only as base64 padding, so "name=value" is split and the name is not redacted.
_ENTROPY_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9+/_-])[A-Za-z0-9+/_-]{20,}={0,2}(?![A-Za-z0-9+/_-])")
_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX_RE = re.compile(r"[0-9a-f]+|[0-9A-F]+")
_PARTS_RE = re.compile(r"[-_./]+")
_LETTER_RE = re.compile(r"[A-Za-z]")
_DIGIT_RE = re.compile(r"[0-9]")
_MIN_ENTROPY = 3.5


def shannon_entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values()) if n else 0.0


def _is_random_token(tok: str) -> bool:
    core = tok.strip("=-_/")
    if len(core) < 20 or _UUID_RE.fullmatch(core) or _HEX_RE.fullmatch(core):
        return False
    if not (_LETTER_RE.search(core) and _DIGIT_RE.search(core)):
        return False
    if core.islower() and any(p.isalpha() and len(p) >= 3 for p in _PARTS_RE.split(core)):
        return False  # lowercase identifier with a real word: pod name, image tag, path
    return shannon_entropy(core) >= _MIN_ENTROPY


def find_secrets(text: str) -> list[SecretSpan]:
    """Non-overlapping secret spans in ``text``, sorted by start."""
    low = text.lower()
    # Lowercasing may change the length of a few exotic chars; then offsets would shift.
    same = len(low) == len(text)
    spans: list[SecretSpan] = []
    for rule in _RULES if same else _RULES_CI:
        hay = low if (rule.folded and same) else text
        for m in rule.rx.finditer(hay):
            if rule.no_before and m.start() > 0 and _bad_before(text[m.start() - 1], rule.no_before):
                continue
            if rule.kind == "connection_string" and not (m.start() > 0 and text[m.start() - 1].isalnum()):
                continue  # needs a scheme before "://"
            start, end = m.span(rule.group)
            value = text[start:end]
            if rule.group and _NOT_A_VALUE.fullmatch(value.strip("\"'")):
                continue
            if rule.kind == "api_key" and len(value) < 6:
                continue  # "token: 42" is a count, not a credential
            if end > start:
                spans.append(SecretSpan(start, end, rule.kind))
    for m in _ENTROPY_TOKEN_RE.finditer(text):
        if _is_random_token(m.group()):
            spans.append(SecretSpan(m.start(), m.end(), "high_entropy"))
    return _merge(spans)


def _bad_before(ch: str, what: str) -> bool:
    return ch.isascii() and (ch.isalnum() if what == "alnum" else ch.isalpha())


def _merge(spans: list[SecretSpan]) -> list[SecretSpan]:
    # Overlaps are unioned; the kind of the earliest (then longest) span wins.
    spans.sort(key=lambda s: (s.start, -s.end))
    merged: list[SecretSpan] = []
    for s in spans:
        if merged and s.start < merged[-1].end:
            last = merged[-1]
            if s.end > last.end:
                merged[-1] = SecretSpan(last.start, s.end, last.kind)
        else:
            merged.append(s)
    return merged


def contains_secret(text: str) -> bool:
    return bool(find_secrets(text))


def redact(text: str) -> str:
    """Replace every secret span with ``[REDACTED:<kind>]``; returns ``text`` itself if clean."""
    spans = find_secrets(text)
    if not spans:
        return text
    out: list[str] = []
    pos = 0
    for s in spans:
        out.append(text[pos : s.start])
        out.append(f"[REDACTED:{s.kind}]")
        pos = s.end
    out.append(text[pos:])
    return "".join(out)


# --------------------------------------------------------------------------- raw logs

_STACK_TRACE_RE = re.compile(
    r"Traceback \(most recent call last\)|^\s*File \"[^\"]+\", line \d+|^\s+at [\w$.<>/]+\([^)]*\)|"
    r"^goroutine \d+ \[[\w ]+\]:|^panic: |^Exception in thread \"|^Caused by: [\w.]+(?:Exception|Error)",
    re.M,
)
_LOG_LINE_RE = re.compile(
    r"^\s*(?:"
    r"\[?\d{4}[-/]\d{2}[-/]\d{2}[T ]\d{1,2}:\d{2}|"  # ISO-ish date + time
    r"\[?\d{1,2}:\d{2}:\d{2}|"  # time of day
    r"[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2}|"  # syslog
    r"\[?\d{10}(?:\.\d+)?\]?\s|"  # epoch seconds
    r"[IWEF]\d{4} \d{2}:\d{2}|"  # glog
    r"\[?(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|ERR|FATAL|CRITICAL|CRIT|SEVERE)\b[\]:]?|"
    r"\[?\d{4}年\d{1,2}月\d{1,2}日"
    r")"
)


def looks_like_raw_log(text: str) -> bool:
    """Stack traces, or >= 2 lines where at least 60% start with a timestamp or log level."""
    if _STACK_TRACE_RE.search(text):
        return True
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2:
        return False
    hits = sum(1 for ln in lines if _LOG_LINE_RE.match(ln))
    return hits >= 0.6 * len(lines)


__all__ = ["SecretSpan", "find_secrets", "contains_secret", "redact", "looks_like_raw_log", "shannon_entropy"]
