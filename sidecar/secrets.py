"""The one secret detector used everywhere (ingest masking, memory filter, summaries, pinned blocks,
tool views).

Detection = our own patterns (passwords stated in English or Chinese, labelled keys and tokens, vendor
key formats, JWTs, private key blocks, credentials in connection strings, URL parameters and command
lines) + the keyword-free plugins of the detect-secrets library (vendor formats we do not spell out
ourselves) + an entropy check for otherwise unlabelled random-looking tokens. Overlapping findings are
merged. ``mask`` replaces each secret with ``[secret:<kind>#<n>]``; such a placeholder is never a
secret itself, so masking twice changes nothing.

Entropy-check decisions (documented because they trade recall for precision):

* a token qualifies when it has >= 20 chars from ``[A-Za-z0-9+/=_-]``, mixes letters and
  digits and has Shannon entropy >= 3.5 bits/char;
* UUIDs are never secrets (they are ids);
* pure hex strings (git SHAs, sha256 digests, trace ids) are NOT flagged: ops text is full
  of them and redacting commit ids would destroy useful context. A hex secret that is
  labelled (``api_key=<hex>``, ``token: <hex>``) is still caught by the keyword patterns;
* all-lowercase identifiers built from dash/underscore/dot/slash separated parts with at
  least one plain word (k8s pod names like ``payment-api-7d9f8b6c5-x2x4z``, image tags,
  paths) are not flagged either: random secrets are almost always mixed case;
* identifiers (``feeGrowthGlobal0X128``, ``S3OperationException``, ``Project_X_Proposal_2023``)
  are mostly words and change between lower case, upper case and digits far less often than
  random text does: they are not flagged;
* SRI hashes and key fingerprints (``sha384-...``, ``SHA256:...``) are not flagged;
* tokens inside URLs and data URIs are not flagged (video ids, document ids, short links);
  credentials in URLs are caught by their own patterns (``user:pass@``, ``?token=``, webhooks).

Where only part of a match is secret (the password in ``postgres://user:pass@host``, the
value after ``password:``), only that part is masked so hosts and field names survive.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.plugins.base import BasePlugin

import fastpath


@dataclass(frozen=True)
class SecretSpan:
    start: int
    end: int
    kind: str


@dataclass(frozen=True)
class Masked:
    """One masked secret: ``placeholder`` replaced ``text[start:end]`` of the original text."""

    kind: str
    placeholder: str
    start: int
    end: int


PLACEHOLDER_RE = re.compile(r"\[secret:([a-z0-9_]+)#(\d+)\]")

# Values that follow "password is"/"secret:" but are words, placeholders, types or env references.
_NOT_A_VALUE = re.compile(
    r"(?:required|wrong|incorrect|invalid|expired|correct|missing|empty|not|too|the|a|an|set|changed|"
    r"reset|needed|weak|strong|same|different|being|now|still|also|updated|stored|saved|hashed|"
    r"encrypted|in|on|at|for|ok|fine|valid|true|false|null|none|nil|undefined|redacted|hidden|"
    r"password|passwd|pwd|pass|secret|token|key|str|string|int|bool|bytes|char|text|varchar|\?|"
    r"\*+|x{3,}|\.{3,}|<[^>]*>?|\{\{[^}]*\}?\}?|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?|\[REDACTED[^\]]*\]?|"
    r"\[secret:[^\]]*\]?|%\(?\w+\)?s?)",
    re.I,
)
# Sample-code placeholders ("YOUR_API_KEY", "your-client-secret", "replace_this_with_...", "${X}", "{$x}").
_PLACEHOLDER_VALUE = re.compile(
    r"(?:your|my)[-_ ].*|(?:replace|insert|enter|change|put)[-_].*|.*[-_](?:here|placeholder)|"
    r".*(?:\$\{|\{\{|\{\$|process\.env|os\.environ|getenv).*",
    re.I,
)
# Code that reads the value from elsewhere (request.form[...], $data['x'], settings.db.password),
# or a variable named after the secret (apiKey, secret_name, DATA_API_KEY).
_CODE_VALUE = re.compile(
    r"\$?[A-Za-z_][\w.]*[(\[].*|"
    r"(?:self|this|request|req|config|cfg|conf|settings|os|process|env|params|args|options|opts|ctx|form|data)"
    r"(?:\.\w+)+|"
    r"(?=\w*(?i:key|token|secret|pass|pwd))(?:[a-z]+(?:[A-Z][a-z]*)+|[A-Za-z]+(?:_[A-Za-z]+)+)"
)
# A plain word after a label must end its line to be a value ("password: hunter" yes;
# "**Check your password**: If you're ...", "**Use a strong password**: Choose ..." no).
_PLAIN_WORD_RE = re.compile(r"[A-Z]?[a-z]+|[A-Z]+")
_LINE_END_RE = re.compile(r"[.,;!?)\"'`\]]*[ \t]*(?:\n|$)")
# A value may not hold whitespace, quotes, "," or ";" nor end in sentence punctuation; it is ASCII,
# which also ends it at the next CJK word ("密码是abc123，记住").
_VCHAR = r"[^\x00-\x20\"',;`\x7f-\U0010ffff]"
_VEND = r"[^\x00-\x20\"',;`.:)\]}>\x7f-\U0010ffff]"
# At most 512 chars (gaps in the patterns at most 200), so that looking again from inside each
# match stays linear in the text.
_VALUE = rf"(\"[^\"\n]{{1,200}}\"|'[^'\n]{{1,200}}'|`[^`\n]{{1,200}}`|{_VCHAR}{{0,511}}{_VEND})"
# Between a keyword and its value: "=", ":", "：", "is", "was changed to", "是", "为", "改成了" ...
_ASSIGN = r"[\"'`*\]]{0,3}\s*(?::=|[:=：](?![=:])"
_STATED = (
    r"|\s+(?:is|was|are|has\s+been|will\s+be|should\s+be)(?:\s+(?:now|still|temporarily))?"
    r"(?:\s+(?:set|changed|reset|updated)\s+to)?\b|\s+(?:set|changed|reset|updated)\s+to\b"
    r"|\s*(?:是|为|改成了?|改为|设为|设置为))(?:\s*[:：])?\s*(?:\*\*)?\s*"  # "is: x", "**Password:** x"
)


class _Rule(NamedTuple):
    kind: str
    needles: tuple[str, ...]  # one must be in the text (lowercased for folded rules) for the rule to run
    rx: re.Pattern[str]
    group: int  # group holding the secret part (0 = whole match)
    no_before: str  # "alnum"/"alpha": the char before the match must not be one ("" = anything)
    folded: bool  # keyword rule: matched case-insensitively
    symbol: bool  # the value must hold a digit or a symbol


def _rule(kind: str, needles: str, pattern: str, group: int = 0, no_before: str = "", folded: bool = False,
          symbol: bool = False) -> _Rule:
    return _Rule(kind, tuple(needles.split("|")), re.compile(pattern), group, no_before, folded, symbol)


_PASSWORD_WORDS = r"(?:password|passwd|passphrase|passcode|pwd|(?<=_)pass)"  # DB_PASS= as well
_KEY_WORDS = (
    r"(?:api[ _-]?(?:key|secret|token)|apikey|access[ _-]?(?:key|token)|refresh[ _-]?token|auth[ _-]?token|"
    r"secret[ _-]?(?:access[ _-]?)?key|client[ _-]?secret|app[ _-]?secret|private[ _-]?key|signing[ _-]?key|"
    r"encryption[ _-]?key|webhook[ _-]?secret|accountkey|sharedaccesskey|token|secret)"
)

# A rule runs only when one of its needles (plain substrings) is in the text: most texts hold none,
# and looking for a few substrings once costs less than running every pattern. Rules share needles
# where they can ("pass" for every password rule), as each distinct one is a scan of the text. Patterns start with a literal where they can (no leading
# lookbehind/\b), so the engine skips through megabytes of logs quickly; boundary checks are done in
# code instead. Keyword ("folded") rules run on a lowercased copy, which is much faster than re.I.
_RULES: list[_Rule] = [
    _rule(
        "private_key", "PRIVATE KEY",
        r"----[- ]BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)? ?-{4,5}[\s\S]*?"
        r"(?:-{4,5} ?END (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)? ?-{4,5}|\Z)",
    ),
    _rule("private_key", "PuTTY-User-Key-File-", r"PuTTY-User-Key-File-\d: [\s\S]*?(?:Private-MAC: [0-9a-f]+|\Z)"),
    _rule("aws_access_key", "AKIA|ASIA|AGPA|AIDA|AROA", r"(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}(?![A-Za-z0-9])",
          no_before="alnum"),
    _rule("github_token", "gh|github_pat_", r"gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{22,}",
          no_before="alnum"),
    _rule("gitlab_token", "gl", r"gl(?:pat|dt|rt|cbt|ptt|oas)-[A-Za-z0-9_-]{20,}", no_before="alnum"),
    _rule("slack_token", "xox", r"xox[abposre]-[A-Za-z0-9-]{10,}", no_before="alnum"),
    _rule("openai_key", "sk-", r"sk-(?:proj-|svcacct-|ant-)?[A-Za-z0-9_-]{20,}", no_before="alnum"),
    _rule("stripe_key", "k_live_|k_test_", r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,}", no_before="alnum"),
    _rule("google_api_key", "AIza", r"AIza[0-9A-Za-z_-]{35}", no_before="alnum"),
    _rule("google_oauth", "GOCSPX-|ya29.", r"GOCSPX-[A-Za-z0-9_-]{24,}|ya29\.[0-9A-Za-z_-]{20,}", no_before="alnum"),
    _rule("npm_token", "npm_", r"npm_[A-Za-z0-9]{36}", no_before="alnum"),
    _rule("pypi_token", "pypi-AgE", r"pypi-AgE[A-Za-z0-9_-]{50,}", no_before="alnum"),
    _rule("huggingface_token", "hf_", r"hf_[A-Za-z0-9]{30,}", no_before="alnum"),
    _rule("docker_token", "dckr_pat_", r"dckr_pat_[A-Za-z0-9_-]{20,}", no_before="alnum"),
    _rule("square_token", "sq0", r"sq0(?:atp|csp)-[0-9A-Za-z_-]{22,}", no_before="alnum"),
    _rule("sendgrid_key", "SG.", r"SG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}", no_before="alnum"),
    _rule("digitalocean_token", "_v1_", r"do[opr]_v1_[a-f0-9]{64}", no_before="alnum"),
    _rule("shopify_token", "shp", r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}", no_before="alnum"),
    _rule("webhook_url", "/api/webhooks/", r"discord(?:app)?\.com/api/webhooks/\d+/([A-Za-z0-9_-]{40,512})", 1),
    # The lookbehind after the literal keeps "eyJeyJ..." without dots from being rescanned at every "eyJ".
    _rule("jwt", "eyJ", r"eyJ(?<![A-Za-z0-9]eyJ)[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]*"),
    _rule("bearer_token", "bearer", r"bearer\s+([a-z0-9._~+/=-]{8,8192})", 1, "alnum", folded=True),
    _rule("basic_auth", "basic", r"authorization[\"']?\s*[:=]\s*[\"']?basic\s+([a-z0-9+/]{8,4096}={0,2})", 1,
          folded=True),
    # scheme://user:PASSWORD@host (user may be empty: redis://:pw@host) — only the password is masked.
    _rule("connection_string", "://", r"://[^\s:/@]{0,256}:([^\s@/]{1,512})@[^\s/]", 1),
    # Query/JDBC parameters: the value ends at "&" or ";", which a stated password may contain.
    _rule("password", "pass|pwd", r"[?&;](?:password|passwd|pwd|pass)=([^&;\s#\"'<>]{1,512})", 1,
          folded=True),
    _rule(
        "api_key", "token|key|sig=|signature=|secret|auth=",
        r"[?&](?:token|access_token|api_key|apikey|api-key|sig|signature|secret|client_secret|auth)=([^&\s#\"'<>]{1,512})",
        1,
        folded=True,
    ),
    _rule("password", "pass", r"--(?:password|passwd|pass|db-password)[= ]['\"]?([^\s'\"]{1,512})", 1,
          folded=True),
    _rule(
        "password", "mysql|sshpass|curl",
        r"(?:mysql(?:dump|admin)?\s(?:[^\n]{0,200}?\s)??-p|sshpass\s+-p\s*|curl\s(?:[^\n]{0,200}?\s)??(?:-u|--user)\s+"
        r"['\"]?[^\s:'\"]+:)"
        r"['\"]?([^\s'\"]{1,512})",
        1,
        "alpha",
        folded=True,
    ),
    _rule(
        "password", "pass|pwd",
        _PASSWORD_WORDS + r"(?![a-z])"
        r"(?:\s+(?:for|of|to|on|at)\s+(?:the\s+)?[\w.@:/-]+(?:\s+[\w.-]+)?)?" + _ASSIGN + _STATED + _VALUE,
        1,
        "alpha",
        folded=True,
    ),
    # "log in with password X": no label punctuation, so the value must look like a credential.
    _rule("password", "pass|pwd", r"(?:with|using|and|use)\s+(?:the\s+)?" + _PASSWORD_WORDS + r"[ \t]+" + _VALUE,
          1, folded=True),
    # "creds for db: admin / Hunter2!", "账号密码：root / Passw0rd": the part after the user name.
    _rule(
        "password", "cred|login|账号|用户名|账密",
        r"(?:creds|credentials|login|账号密码|用户名和?密码|账密)(?:\s+(?:for|to|of|on|at)\s+[\w.@:/-]+?)?\s*[:：]\s*"
        r"\w[\w.@-]{0,39}\s*/\s*(?!/)" + _VALUE,
        1,
        folded=True,
    ),
    # Chinese: passwords are essentially always ASCII, which also stops at the next CJK word.
    # A few CJK characters may sit between the keyword and its value ("密码登录：x", "口令设置为 x").
    _rule(
        "password", "密码|口令|密钥|秘钥|令牌",
        r"(?:密码|口令|密钥|秘钥|令牌)[\u4e00-\u9fff，、]{0,8}?\s*(?:是|为|成了?|[:：=])\s*" + _VALUE,
        1,
    ),
    # "root密码 Passw0rd!": no verb, so the value must hold a digit or a symbol.
    _rule("password", "密码|口令", r"(?:密码|口令)[ \t]+(" + _VCHAR + r"{3,511}" + _VEND + ")", 1, symbol=True),
    _rule("api_key", "key|token|secret", _KEY_WORDS + r"(?![a-z])" + _ASSIGN + _STATED + _VALUE, 1, "alpha",
          folded=True),
]


@functools.cache
def _rules_ci() -> list[_Rule]:
    # For the rare text whose lowercased copy has other offsets: keyword rules with re.I on the text
    # itself. Compiled on first need: with re.I the big patterns take ~0.2 s to compile.
    return [r._replace(rx=re.compile(r.rx.pattern, re.I)) if r.folded else r for r in _RULES]


_VALUE_RULES = {"password", "api_key"}
# A bare "token:"/"secret:" label, or a value stated in words ("the password is ..."), needs a value
# that looks like a credential; "key = value" assignments and Chinese statements do not.
_GENERIC_LABEL_RE = re.compile(r"(?:token|secret)[\"'`*\]]*\s*[:=：]", re.I)
_WORDY_LEAD_RE = re.compile(r"[A-Za-z]\s*$")
_SYMBOL_RE = re.compile(r"[^A-Za-z]")
_ALNUM_RE = re.compile(r"[^\W_]")


def _credential_like(value: str) -> bool:
    # A password or key in a sentence has a digit, a symbol or a capital inside it;
    # "the secret is patience", "the password is case-sensitive", "and password protection?" are prose.
    value = value.rstrip("?!")
    if value.islower() and value.replace("-", "").isalpha() and value.count("-") < 2:
        return False
    return bool(_SYMBOL_RE.search(value) or any(c.isupper() for c in value[1:]))


def _value_ok(rule: _Rule, text: str, m: re.Match[str], end: int, value: str, quoted: bool) -> bool:
    if rule.group == 0:
        return True
    if _NOT_A_VALUE.fullmatch(value) or not _ALNUM_RE.search(value):
        return False
    if rule.symbol:
        return bool(_SYMBOL_RE.search(value))
    if rule.kind not in _VALUE_RULES:
        return True
    if _PLACEHOLDER_VALUE.fullmatch(value):
        return False
    if rule.kind == "api_key" and (len(value) < 6 or any(c.isspace() for c in value)):
        return False  # "token: 42" is a count; keys hold no spaces
    if quoted:
        return True
    if _PLAIN_WORD_RE.fullmatch(value) and not _LINE_END_RE.match(text, end):
        return False
    if text.startswith(":", end) or _CODE_VALUE.fullmatch(value):
        return False  # a YAML key ("Resources:\n  SATNetwork:"), or code
    lead = text[m.start() : m.start(rule.group)]
    if _WORDY_LEAD_RE.search(lead) or _GENERIC_LABEL_RE.match(lead):
        return _credential_like(value)
    return True


# --------------------------------------------------------------------------- entropy

# "=" only as base64 padding, so "name=value" is split and the name is not flagged. Runs of hex
# digits only (request ids, SHAs: most long tokens of a log) are passed over here, not in Python.
_ENTROPY_MIN_RUN = 20
_ENTROPY_TOKEN_RE = re.compile(
    r"(?<![A-Za-z0-9+/_-])(?!(?:[0-9a-f]+|[0-9A-F]+)(?![A-Za-z0-9+/_-]))[A-Za-z0-9+/_-]{"
    + str(_ENTROPY_MIN_RUN) + r",}={0,2}(?![A-Za-z0-9+/_-])"
)
_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")
_HEX_RE = re.compile(r"[0-9a-f]+|[0-9A-F]+")
_PARTS_RE = re.compile(r"[-_./+]+")
_LETTER_RE = re.compile(r"[A-Za-z]")
_DIGIT_RE = re.compile(r"[0-9]")
# URLs (from "://" on; the scheme is never a token), bare www. links and data URIs: one literal-led
# pattern each, as an alternation would be tried at every letter.
_URL_RES = tuple(re.compile(p) for p in (
    r"://[^\s<>\"'`)]+", r"www\.[^\s<>\"'`)]+", r"data:[\w/+.-]+;base64,[\w+/=]+"))
_HASH_PREFIX_RE = re.compile(r"(?:sha|SHA)(?:1|224|256|384|512)[-:]")  # SRI hashes, key fingerprints
# Words of an identifier: a capitalised run or a part's leading lower-case run, with a vowel.
_WORD_RE = re.compile(r"[A-Z][a-z]{2,}|(?<![A-Za-z0-9])[a-z]{3,}")
_VOWEL_RE = re.compile(r"[aeiouy]")
_MIN_ENTROPY = 3.5
# Share of the class changes (lower/upper/digit) a random string of the same mix would have.
_MIN_CHANGE_RATIO = 0.6
# Share of letters inside words above which a token is an identifier; random 20-char base62
# strings get there about twice in 1,000 (32 chars: 0.015 %), camelCase and snake_case names almost always.
_MAX_WORD_SHARE = 0.75


def shannon_entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values()) if n else 0.0


def _char_class(c: str) -> int:
    return 0 if c.islower() else 1 if c.isupper() else 2


def _changes_like_random(core: str) -> bool:
    changes = pairs = 0
    counts = [0, 0, 0]
    for part in _PARTS_RE.split(core):
        classes = [_char_class(c) for c in part]
        for c in classes:
            counts[c] += 1
        pairs += max(len(classes) - 1, 0)
        changes += sum(a != b for a, b in zip(classes, classes[1:], strict=False))
    n = sum(counts)
    expected = 1.0 - sum((k / n) ** 2 for k in counts)
    return pairs > 0 and changes >= _MIN_CHANGE_RATIO * expected * pairs


def _word_share(core: str) -> float:
    words = sum(len(w) for w in _WORD_RE.findall(core) if _VOWEL_RE.search(w))
    return words / max(sum(c.isalpha() for c in core), 1)


def _is_random_token(tok: str) -> bool:
    core = tok.strip("=-_/+")
    if len(core) < 20 or _HEX_RE.fullmatch(core) or not (_LETTER_RE.search(core) and _DIGIT_RE.search(core)):
        return False
    if _UUID_RE.match(core) or _HASH_PREFIX_RE.match(core):
        return False
    if core.islower() and any(p.isalpha() and len(p) >= 3 for p in _PARTS_RE.split(core)):
        return False  # lowercase identifier with a real word: pod name, image tag, path
    return (shannon_entropy(core) >= _MIN_ENTROPY and _changes_like_random(core)
            and _word_share(core) < _MAX_WORD_SHARE)


def _entropy_spans(hay: _Hay, found: list[SecretSpan]) -> Iterable[SecretSpan]:
    """Random-looking tokens outside the spans already found: a token glued to a found secret is
    judged without it, as it will read once that secret is masked (so masking twice finds nothing new)."""
    text = hay.text
    if not fastpath.has_token_run(text, _ENTROPY_MIN_RUN):
        return  # no token long enough (most prose): a scan in C instead of the pattern's at every word
    cuts = [(s.start, s.end) for s in found]  # sorted and merged
    urls: list[tuple[int, int]] | None = None
    i = 0  # the first cut that ends after the token's start
    for m in _ENTROPY_TOKEN_RE.finditer(text):
        while i < len(cuts) and cuts[i][1] <= m.start():
            i += 1
        pieces = [m.span()] if i == len(cuts) or cuts[i][0] >= m.end() else _outside(m.start(), m.end(), cuts, i)
        for start, end in pieces:
            if not _is_random_token(text[start:end]) or _HASH_PREFIX_RE.match(text, max(start - 7, 0), start):
                continue
            if urls is None:
                urls = sorted(u.span() for rx in _URL_RES for u in rx.finditer(hay.low))
            u = bisect.bisect_right(urls, (start, len(text))) - 1
            if u < 0 or start >= urls[u][1]:
                yield SecretSpan(start, end, "high_entropy")


def _outside(start: int, end: int, cuts: list[tuple[int, int]], i: int) -> list[tuple[int, int]]:
    """The parts of [start, end) that no cut covers; cuts are sorted, apart, none of cuts[:i] reaches it."""
    parts = []
    for c0, c1 in itertools.islice(cuts, i, None):
        if c0 >= end:
            break
        if c0 > start:
            parts.append((start, c0))
        start = max(start, c1)
    if start < end:
        parts.append((start, end))
    return parts


# --------------------------------------------------------------------------- detect-secrets

# Plugins left out, and why (run over the 113k LoCoMo and LongMemEval turns):
# - PrivateKeyDetector reports only the BEGIN marker; our private_key rule masks the whole block;
# - IPPublicDetector: an address is not a credential (15 turns flagged);
# - KeywordDetector: ~1 ms a turn and it found only quoted placeholders ("your-client-secret");
#   our labelled-value rules cover "key = value" in prose, configs and code;
# - Base64/HexHighEntropyString look at quoted strings only and found SRI hashes and database ids;
#   our entropy check covers unquoted tokens as well.
_LIBRARY_SKIP = frozenset({
    "PrivateKeyDetector", "IPPublicDetector", "KeywordDetector", "Base64HighEntropyString",
    "HexHighEntropyString",
})
# Per plugin, cheap gates of which one must match where the plugin can find anything (a superset of
# its own patterns): the plugin runs only around their hits, so a 256 KiB log costs a few literal
# scans instead of every plugin regex over every line (~140 ms). A gate is (needle, pattern, run on
# the lowercased text): skipped unless the needle is in the text, then the pattern ("" = the needle
# itself) finds the hits. A plugin missing here (a newer library) is gated by its own patterns:
# slower, never blind.
_GATES: dict[str, tuple[tuple[str, str, bool], ...]] = {
    "ArtifactoryDetector": (("AKC", r"AKC[a-zA-Z0-9]{10}", False), ("AP", r"AP[0-9A-F][a-zA-Z0-9]{8}", False)),
    "AWSKeyDetector": (
        *((k, "", False) for k in ("A3T", "ABIA", "ACCA", "AKIA", "ASIA")),
        ("aws", r"aws.{0,20}?(?:key|pw|pass|token)", True),
    ),
    "AzureStorageKeyDetector": (("AccountKey=", "", False),),
    "BasicAuthDetector": (("://", r"://[^\s/@]+@", False),),
    "CloudantDetector": (
        ("cl", r"cl(?:oudant|ou)?[-_]?(?:api)?(?:key|pwd|pw|pass|token)", True), ("cl", r"cloudant\.com", True),
    ),
    "DiscordBotTokenDetector": ((".", r"\.[\w-]{6}\.[\w-]{27}", False),),
    "GitHubTokenDetector": (("gh", r"gh[pousr]_", False),),
    "GitLabTokenDetector": (
        ("gl", r"gl(?:pat|dt|ft|soat|rt|cbt|imt|ptt|agent|oas)-", False), ("GR1348941", "", False),
    ),
    "IbmCloudIamDetector": tuple((k, rf"{k}{w}[^\w\n]*[\w-]{{44}}", True)
                                 for k, w in (("key", ""), ("pwd", ""), ("pass", "(?:word)?"), ("token", ""))),
    "IbmCosHmacDetector": (("secret", r"secret[-_]?(?:access)?[-_]?key[^\w\n]*[0-9a-f]{48}", True),),
    "JwtTokenDetector": (("eyJ", "", False),),
    "MailchimpDetector": (("-us", r"-us[0-9]", False),),
    "NpmDetector": ((":_authToken=", "", False),),
    "OpenAIDetector": (("T3BlbkFJ", "", False),),
    "PypiTokenDetector": (("pypi-AgE", "", False),),
    "SendGridDetector": (("SG.", "", False),),
    "SlackDetector": (("xox", r"xox[abposr]-", True), ("hooks.slack.com/services/", "", True)),
    "SoftlayerDetector": (("softlayer", "", True), ("sl", r"sl[-_]?(?:api)?[-_]?(?:key|pwd|pass|token)", True)),
    "SquareOAuthDetector": (("sq0", r"sq0csp-", False),),
    "StripeDetector": (("k_live_", "", False),),
    "TelegramBotTokenDetector": ((":", r":[\w-]{35}", False),),
    "TwilioKeyDetector": (("AC", r"AC[a-z0-9]{32}", False), ("SK", r"SK[a-z0-9]{32}", False)),
}
# The library's names for what our own patterns also find, so a secret gets one kind whichever
# detector saw it; the rest are slugs of the library's ("Twilio API Key" -> twilio_api_key).
_LIBRARY_KINDS = {
    "JSON Web Token": "jwt", "NPM tokens": "npm_token", "Stripe Access Key": "stripe_key",
    "SendGrid API Key": "sendgrid_key", "OpenAI Token": "openai_key", "Square OAuth Secret": "square_token",
    "Basic Auth Credentials": "connection_string", "Azure Storage Account access key": "azure_storage_key",
}


class _Gate(NamedTuple):
    needle: str
    rx: re.Pattern[str]
    folded: bool  # needle and pattern apply to the lowercased text


class _Plugin(NamedTuple):
    kind: str
    plugin: BasePlugin
    denylist: tuple[re.Pattern[str], ...]  # its patterns
    gates: tuple[_Gate, ...]
    needles: frozenset[str]  # its gates' needles, case-sensitive
    needles_low: frozenset[str]  # and folded


def _library_plugins() -> list[_Plugin]:
    out = []
    for secret_type, cls in sorted(get_mapping_from_secret_type_to_class().items()):
        name = cls.__name__
        denylist = getattr(cls, "denylist", ())
        if name in _LIBRARY_SKIP or not denylist:
            continue  # skipped, or not pattern-based: we could not tell where its findings are
        kind = _LIBRARY_KINDS.get(secret_type) or re.sub(r"[^a-z0-9]+", "_", secret_type.lower()).strip("_")
        if name in _GATES:
            gates = tuple(_Gate(n, re.compile(p or re.escape(n)), f) for n, p, f in _GATES[name])
        else:
            gates = tuple(_Gate("", rx, False) for rx in denylist)
        out.append(_Plugin(kind, cls(), tuple(denylist), gates, frozenset(g.needle for g in gates if not g.folded),
                           frozenset(g.needle for g in gates if g.folded)))
    return out


_PLUGINS = _library_plugins()


class _Hay(NamedTuple):
    """A text prepared once for every detector: its lowercased copy and which needles it holds."""

    text: str
    low: str
    same: bool  # lowercasing kept every offset (a few exotic chars change length)
    found: frozenset[str]  # case-sensitive needles present in text
    found_low: frozenset[str]  # folded needles present in low
    holes: tuple[tuple[int, int], ...]  # the [secret:...] placeholders already in text, in order

    def in_hole(self, start: int, end: int) -> bool:
        # A finding that touches a placeholder came from its own text ("[secret:" reads as a
        # "secret:" label) or runs across it: either way it is not a new secret.
        i = bisect.bisect_left(self.holes, (end,)) - 1
        return i >= 0 and self.holes[i][1] > start


# Each distinct needle is looked for once per text; most rules and gates then cost a set lookup.
_NEEDLES = frozenset({n for r in _RULES if not r.folded for n in r.needles}.union(*(p.needles for p in _PLUGINS)))
_NEEDLES_LOW = frozenset({n for r in _RULES if r.folded for n in r.needles}.union(*(p.needles_low for p in _PLUGINS)))


# Each read once per text (an ASCII text in one pass over its characters).
_NEEDLE_SET, _NEEDLE_SET_LOW = fastpath.NeedleSet(sorted(_NEEDLES)), fastpath.NeedleSet(sorted(_NEEDLES_LOW))


def _hay(text: str) -> _Hay:
    low = text.lower()
    holes = tuple(m.span() for m in PLACEHOLDER_RE.finditer(text)) if "[secret:" in text else ()
    return _Hay(text, low, len(low) == len(text), _NEEDLE_SET.found(text), _NEEDLE_SET_LOW.found(low), holes)


_LIBRARY_VALUE_RE = re.compile(r"[\s\"'=:]*([^\s\"']+)")
_TOKEN_TAIL_RE = re.compile(r"[A-Za-z0-9_\-=.]{0,4096}")


def _gate_hits(hay: _Hay, plug: _Plugin) -> list[int]:
    """Where a gate of the plugin matched, in order."""
    hits: list[int] = []
    for gate in plug.gates:
        if gate.needle not in (hay.found_low if gate.folded else hay.found):
            continue
        haystack, rx = (hay.text, gate.rx) if not gate.folded else (hay.low, gate.rx) if hay.same else \
            (hay.text, re.compile(gate.rx.pattern, re.I))
        hits += (m.start() for m in rx.finditer(haystack))
    return sorted(hits)


# A plugin reads a window around each gate hit, within its line: a secret starts at most _BEFORE
# chars before the hit and is seen within _AFTER chars after it (the rest of a long token is
# added below). Windows keep the plugins' own regexes, some of which rescan a line from every
# candidate start, from going quadratic on a long line ("eyJ" x 80k: 63 s as whole lines).
# A window reaches _SLACK further, so that dense hits share one; at most _MAX_WINDOWS per plugin
# and text (a text with more is not prose; our own patterns still read all of it).
_BEFORE, _AFTER, _SLACK, _MAX_WINDOWS = 256, 512, 512, 128


def _windows(text: str, hits: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for h in hits:
        if out and out[-1][0] <= h - _BEFORE and h + _AFTER <= out[-1][1]:
            continue
        if len(out) == _MAX_WINDOWS:
            break
        line_start = text.rfind("\n", 0, h) + 1
        line_end = text.find("\n", h)
        out.append((max(line_start, h - _BEFORE),
                    min(line_end if line_end >= 0 else len(text), h + _AFTER + _SLACK)))
    return out


def _library_spans(hay: _Hay) -> Iterable[SecretSpan]:
    text = hay.text
    for plug in _PLUGINS:
        if hay.found.isdisjoint(plug.needles) and hay.found_low.isdisjoint(plug.needles_low):
            continue
        for start, end in _windows(text, _gate_hits(hay, plug)):
            window = text[start:end]
            # The plugin's verdict (its own checks, such as the JWT plugin's decoding) says what is a
            # secret; its patterns, run again here, say where: analyze_string gives values only.
            verdict = set(plug.plugin.analyze_string(window))
            if not verdict:
                continue
            for rx in plug.denylist:
                covered = 0  # where the last span found by this pattern ends
                for m in rx.finditer(window):
                    for g in [g for g in range(1, rx.groups + 1) if m.group(g)] or [0]:
                        if m.group(g) in verdict and start + m.start(g) >= covered:
                            span = _library_span(text, start + m.start(g), start + m.end(g), plug.kind)
                            if span:
                                covered = span.end
                                yield span


def _library_span(text: str, start: int, end: int, kind: str) -> SecretSpan | None:
    # Some plugins include the delimiters around the value (" AKC...", "npm_... rest of line")...
    value = _LIBRARY_VALUE_RE.match(text, start, end)
    if not value or _NOT_A_VALUE.fullmatch(value.group(1)):
        return None
    start = value.start(1)
    # ... others only part of the token: the GitHub plugin its "ghp" group, the JWT plugin
    # header.payload without the signature. The span runs on to the token's end.
    end = _TOKEN_TAIL_RE.match(text, value.end(1)).end()
    return SecretSpan(start, end - text[start:end].endswith("."), kind)


# --------------------------------------------------------------------------- detection

def _own_spans(hay: _Hay) -> Iterable[SecretSpan]:
    text = hay.text
    for rule in _RULES if hay.same else _rules_ci():
        if (hay.found_low if rule.folded else hay.found).isdisjoint(rule.needles):
            continue
        haystack = hay.low if (rule.folded and hay.same) else text
        pos = 0
        kept = (0, 0)  # the last value kept
        while m := rule.rx.search(haystack, pos):
            if kept[0] <= m.start() < kept[1]:
                pos = kept[1]  # a match inside a kept value goes with it
                continue
            span = _accepted(rule, hay, m)
            if span:
                yield span
                kept = (span.start, span.end)
            # Look again from the next char, not from the match's end: a match may hide another
            # ("aZcurl -u a:curl -u a:pw" holds "curl -u a:pw"), which masking would bring to light.
            # Not needed after a whole match kept (a token, a key block): it is all masked.
            pos = m.end() if span and not rule.group else m.start() + 1


def _accepted(rule: _Rule, hay: _Hay, m: re.Match[str]) -> SecretSpan | None:
    text = hay.text
    before = text[m.start() - 1] if m.start() > 0 else ""
    if rule.no_before and before and _bad_before(before, rule.no_before, text, m):
        return None
    if rule.no_before and before == "]" and hay.in_hole(m.start() - 1, m.start()):
        return None  # glued to a masked secret, as it was to the secret before masking
    if rule.kind == "connection_string" and not before.isalnum():
        return None  # needs a scheme before "://"
    if rule.group and rule.kind in _VALUE_RULES and before in ("?", "&"):
        return None  # a query parameter: the parameter rules end its value at "&"
    start, end = m.span(rule.group)
    value = text[start:end]
    quoted = len(value) >= 2 and value[0] in "\"'`" and value[-1] == value[0]
    if quoted:
        start, end, value = start + 1, end - 1, value[1:-1]
    if end > start and not hay.in_hole(start, end) and _value_ok(rule, text, m, end + quoted, value, quoted):
        return SecretSpan(start, end, rule.kind)
    return None


def _bad_before(ch: str, what: str, text: str, m: re.Match[str]) -> bool:
    if not ch.isascii() or not (ch.isalnum() if what == "alnum" else ch.isalpha()):
        return False
    # An upper-case env name ends in the keyword (PGPASSWORD=, MYSQL_PWD=): still a label.
    return not (what == "alpha" and ch.isupper() and text[m.start() : m.start() + 3].isupper())


def find_secrets(text: str) -> list[SecretSpan]:
    """Non-overlapping secret spans in ``text``, sorted by start; ``[secret:...]`` placeholders are
    not secrets."""
    hay = _hay(text)
    spans = [*_own_spans(hay), *_library_spans(hay)]
    found = _merge([s for s in spans if not hay.in_hole(s.start, s.end)] if hay.holes else spans)
    return _merge(found + [s for s in _entropy_spans(hay, found) if not hay.in_hole(s.start, s.end)])


def _merge(spans: list[SecretSpan]) -> list[SecretSpan]:
    # Overlaps are unioned; the kind of the earliest (then longest, then our own) span wins.
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
    digest = _digest(text)
    if digest in _CLEAN:
        return False
    found = bool(find_secrets(text))
    if not found:
        _known_clean(digest)
    return found


# Texts found to hold no secret, by digest: a message is masked at ingest, and its after-turn job reads
# it back to check it again (a row may predate masking); in the same process that check is a lookup.
# Cleared when full (a dict's get and set are atomic).
_CLEAN: dict[bytes, None] = {}
_CLEAN_MAX = 1 << 16


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _known_clean(digest: bytes) -> None:
    if len(_CLEAN) >= _CLEAN_MAX:
        _CLEAN.clear()
    _CLEAN[digest] = None


def mask(text: str) -> tuple[str, list[Masked]]:
    """Replace each secret with ``[secret:<kind>#<n>]``: n numbers the distinct secret values of
    ``text`` from 1 (the same value again gets the same n; numbering goes on after any placeholder
    the text already holds). Positions in the result refer to ``text``; a clean text is returned
    itself. The masked text holds nothing left to mask, so masking it again changes nothing."""
    spans = find_secrets(text)
    if not spans:
        _known_clean(_digest(text))
        return text, []
    last = max((int(m.group(2)) for m in PLACEHOLDER_RE.finditer(text)), default=0)
    for _ in range(_MASK_ROUNDS):
        numbers: dict[str, int] = {}
        masked = [
            Masked(s.kind, f"[secret:{s.kind}#{numbers.setdefault(text[s.start:s.end], last + len(numbers) + 1)}]",
                   s.start, s.end)
            for s in spans
        ]
        out = _replace(text, [(m.start, m.end, m.placeholder) for m in masked])
        # Masking can bring a secret to light (a token glued to a masked one now stands alone):
        # mask what the masked text still shows too, at its place in the original.
        more = find_secrets(out)
        if not more:
            _known_clean(_digest(out))
            break
        spans = _merge(spans + _in_original(masked, more))
    return out, masked


_MASK_ROUNDS = 3  # one is the rule; a second only for glued secrets


def _in_original(masked: list[Masked], spans: list[SecretSpan]) -> list[SecretSpan]:
    """Spans of the masked text (sorted, outside every placeholder) at their place in the original."""
    out: list[SecretSpan] = []
    shift = i = 0
    out_pos = orig_pos = 0  # where masked[i] starts in the masked text; where the text before it ends
    for span in spans:
        while i < len(masked) and out_pos + masked[i].start - orig_pos < span.end:
            m = masked[i]
            out_pos += m.start - orig_pos + len(m.placeholder)
            shift += len(m.placeholder) - (m.end - m.start)
            orig_pos = m.end
            i += 1
        out.append(SecretSpan(span.start - shift, span.end - shift, span.kind))
    return out


def redact(text: str) -> str:
    """Replace every secret span with ``[REDACTED:<kind>]``; returns ``text`` itself if clean."""
    spans = find_secrets(text)
    return _replace(text, [(s.start, s.end, f"[REDACTED:{s.kind}]") for s in spans]) if spans else text


def _replace(text: str, parts: list[tuple[int, int, str]]) -> str:
    out: list[str] = []
    pos = 0
    for start, end, new in parts:
        out += (text[pos:start], new)
        pos = end
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


__all__ = [
    "Masked", "SecretSpan", "find_secrets", "contains_secret", "mask", "redact", "looks_like_raw_log",
    "shannon_entropy", "PLACEHOLDER_RE",
]
