"""Secret masking (issue #30): the share of generated secrets that ``sidecar.secrets.mask`` hides,
false masks on real conversations (LoCoMo, LongMemEval), and what the detector costs per turn and
per pasted log.

python bench/secret_masking.py [--quick] [--seed N] [--cases N]

(a) A corpus generated from the seed: secrets of many kinds (cloud keys, vendor tokens, JWTs, private
keys, connection strings, English and Chinese password statements, labelled and unlabelled keys),
each written the way people write it (a carrier: ``DB_PASSWORD=...``, "我的数据库密码是 ...") inside a
sentence, log line, config snippet or tool output in English or Chinese (a frame). ``masked_share``:
the share of secrets whose every character lies inside a masked span (target >= 0.99), overall and
per kind; ``other_masks``: masked spans in the corpus that touch no secret (frames are full of ids,
SHAs, pod names and URLs that must stay).
(b) Every turn of LoCoMo and of LongMemEval's development half (each distinct turn once), read in
place from ../shared/data; ``false_mask_share``: turns with any mask (target <= 0.001 per dataset).
A few examples go to stderr for a person to judge. A dataset that is not there is reported as null.
(c) Speed: mask() per ~200-char turn (us), clean and holding a password, and per 256 KiB log (ms),
with one detection pass by part; and the slowest of a few hostile 256 KiB texts (many starts of a
token, tens of thousands of secrets).
--quick (under a minute): 600 corpus cases, 3,000 sampled turns per dataset, fewer timing rounds.
The last line printed is one JSON object.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder leads sys.path and this file's name would shadow the standard
# library's `secrets` for anything imported later (duckdb imports it): load the real one first.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    _bench_dir = sys.path.pop(0)
    import secrets as _stdlib_secrets  # noqa: F401
    sys.path.insert(0, _bench_dir)

import argparse  # noqa: E402
import base64  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import string  # noqa: E402
import time  # noqa: E402
from collections import Counter, defaultdict  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass  # noqa: E402

from harness import ROOT, emit, median_us  # noqa: E402

from sidecar import secrets as detector  # noqa: E402

LOCOMO = ROOT.parent / "shared" / "data" / "locomo" / "locomo10.json"
LONGMEMEVAL = ROOT.parent / "shared" / "data" / "longmemeval" / "longmemeval_s_dev.json.gz"

B62 = string.ascii_letters + string.digits
B64 = B62 + "+/"
URLSAFE = B62 + "-_"
HEX = "0123456789abcdef"
UPNUM = string.ascii_uppercase + string.digits
WORDS = ("hunter", "summer", "dragon", "falcon", "maple", "orange", "tiger", "winter", "silver", "rocket",
         "harbor", "pepper", "coffee", "sunset", "panda", "violet", "thunder", "meadow", "copper", "garden")
PINYIN = ("zhangsan", "lisi", "wangwu", "xiaoming", "laowang", "chenchen", "liuyang", "zhaolei")
HOSTS = ("db.prod.internal", "10.0.12.7", "pg-primary.payments.svc.cluster.local", "mysql-01.corp.example.com",
         "rabbit.ops.example.net", "cache-redis-master.prod", "orders-db.c9akciq32.us-east-1.rds.amazonaws.com")
USERS = ("admin", "app", "svc_orders", "root", "deploy", "readonly", "payments")
DBS = ("app", "orders", "billing", "analytics", "inventory")
SERVICES = ("payment-api", "order-service", "auth-gateway", "billing-worker", "search-indexer")


def rand(rng: random.Random, alphabet: str, n: int) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# ------------------------------------------------------------------------------ secret values

def password(rng: random.Random) -> str:
    """Passwords as people choose them: words with digits and symbols, leet, random, passphrases."""
    word = rng.choice(WORDS)
    shape = rng.randrange(6)
    if shape == 0:
        return f"{word.capitalize()}{rng.randint(0, 99)}{rng.choice('-_!@#$%&*')}{rng.randint(100, 9999)}"
    if shape == 1:
        leet = word.translate(str.maketrans("aeios", "43105"))
        return f"{leet.capitalize()}{rng.choice('&!#@')}{rng.randint(0, 9)}"
    if shape == 2:
        return rand(rng, B62 + "!@#$%^&*-_+=?", rng.randint(10, 16)) + rng.choice(string.digits)
    if shape == 3:
        return "-".join(rng.sample(WORDS, 4))
    if shape == 4:
        return f"{rng.choice(PINYIN)}{rng.choice('@#_')}{rng.randint(100, 99999)}"
    return f"{rand(rng, string.ascii_uppercase, 1)}{rand(rng, string.ascii_lowercase, 2)}{rng.randint(1000, 999999)}!"


def url_password(rng: random.Random) -> str:
    """A password written into a URL: unreserved characters, now and then percent-encoded ones."""
    pw = rand(rng, B62 + "-_.~", rng.randint(10, 20)) + rng.choice(B62)
    return pw if rng.random() < 0.8 else pw[:4] + rng.choice(("%40", "%21", "%23")) + pw[4:]


def jwt(rng: random.Random) -> str:
    header = {"alg": rng.choice(("HS256", "RS256", "ES256")), "typ": "JWT"}
    claims = {"sub": str(rng.randint(10**5, 10**9)), "name": rng.choice(PINYIN), "iat": rng.randint(1.6e9, 1.8e9),
              "role": rng.choice(("admin", "user", "ops"))}
    return ".".join((b64url(json.dumps(header).encode()), b64url(json.dumps(claims).encode()),
                     rand(rng, URLSAFE, 43)))


def pem(rng: random.Random, label: str, newline: str = "\n") -> str:
    body = newline.join(rand(rng, B64, 64) for _ in range(rng.randint(4, 9)))
    return f"-----BEGIN {label}-----{newline}{body}{newline}-----END {label}-----"


def basic_auth(rng: random.Random) -> str:
    return base64.b64encode(f"{rng.choice(USERS)}:{password(rng)}".encode()).decode()


# kind -> how to make a value of it
MAKERS: dict[str, Callable[[random.Random], str]] = {
    "aws_access_key": lambda r: r.choice(("AKIA", "ASIA")) + rand(r, UPNUM, 16),
    "aws_secret_key": lambda r: rand(r, B64, 40),
    "gcp_service_account_key": lambda r: pem(r, "PRIVATE KEY", "\\n"),
    "private_key": lambda r: pem(r, r.choice(("RSA PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY",
                                              "PRIVATE KEY"))),
    "azure_storage_key": lambda r: rand(r, B64, 86) + "==",
    "github_token": lambda r: r.choice((lambda: "ghp_" + rand(r, B62, 36),
                                        lambda: f"github_pat_{rand(r, B62, 22)}_{rand(r, B62, 59)}"))(),
    "gitlab_token": lambda r: "glpat-" + rand(r, URLSAFE, 20),
    "slack_token": lambda r: f"xox{r.choice('bp')}-{r.randint(10**11, 10**12)}-{r.randint(10**12, 10**13)}-"
                             + rand(r, B62, 24),
    "slack_webhook": lambda r: f"https://hooks.slack.com/services/T{rand(r, UPNUM, 8)}/B{rand(r, UPNUM, 10)}/"
                               + rand(r, B62, 24),
    "stripe_key": lambda r: r.choice(("sk_live_", "rk_live_", "sk_test_")) + rand(r, B62, 24),
    "twilio_api_key": lambda r: "SK" + rand(r, HEX, 32),
    "sendgrid_key": lambda r: f"SG.{rand(r, URLSAFE, 22)}.{rand(r, URLSAFE, 43)}",
    "mailchimp_key": lambda r: f"{rand(r, HEX, 32)}-us{r.randint(1, 21)}",
    "npm_token": lambda r: "npm_" + rand(r, B62, 36),
    "pypi_token": lambda r: "pypi-AgEIcHlwaS5vcmc" + rand(r, URLSAFE, r.randint(70, 140)),
    "openai_key": lambda r: r.choice(("sk-proj-", "sk-ant-api03-")) + rand(r, URLSAFE, r.randint(40, 90)),
    "google_api_key": lambda r: "AIza" + rand(r, URLSAFE, 35),
    "square_token": lambda r: r.choice(("sq0atp-" + rand(r, URLSAFE, 22), "sq0csp-" + rand(r, URLSAFE, 43))),
    "discord_bot_token": lambda r: f"{r.choice('MNO')}{rand(r, B62, 23)}.{rand(r, URLSAFE, 6)}.{rand(r, URLSAFE, 27)}",
    "telegram_bot_token": lambda r: f"{r.randint(10**8, 10**10 - 1)}:AA{rand(r, URLSAFE, 33)}",
    "huggingface_token": lambda r: "hf_" + rand(r, B62, 34),
    "docker_token": lambda r: "dckr_pat_" + rand(r, URLSAFE, 27),
    "jwt": jwt,
    "bearer_token": lambda r: rand(r, B62 + "-._~", r.randint(32, 64)) + r.choice(B62),
    "basic_auth": basic_auth,
    "connection_password": url_password,
    "stated_password": password,
    "api_key": lambda r: r.choice((lambda: rand(r, B62, 32), lambda: rand(r, HEX, 32),
                                   lambda: rand(r, URLSAFE, 40) + r.choice(B62)))(),
    "django_secret_key": lambda r: "django-insecure-" + rand(r, string.ascii_lowercase + string.digits
                                                             + "!@#$%^&*(-_=+)", 50),
    "unlabelled_token": lambda r: r.choice((lambda: rand(r, B62, r.randint(28, 48)), lambda: rand(r, B64, 40),
                                            lambda: rand(r, string.ascii_lowercase + string.digits, 32)))(),
}

# ------------------------------------------------------------------------------ carriers
# How each kind is written: "{s}" is the secret; other fields are filled with harmless context.
_TOKEN_CARRIERS_EN = ("{s}", "{env}={s}", "export {env}={s}", '{env}: "{s}"', "my {label} is {s}",
                      "here's the {label}: {s}", "{label} -> {s}")
_TOKEN_CARRIERS_ZH = ("{label}：{s}", "新的 {label} 是 {s}", "用这个 {label} {s} 就行", "{label} 我放这了 {s}")
_LABELS = {
    "aws_access_key": ("AWS_ACCESS_KEY_ID", "access key id"),
    "github_token": ("GITHUB_TOKEN", "GitHub token"),
    "gitlab_token": ("GITLAB_TOKEN", "GitLab token"),
    "slack_token": ("SLACK_BOT_TOKEN", "Slack bot token"),
    "slack_webhook": ("SLACK_WEBHOOK_URL", "Slack webhook"),
    "stripe_key": ("STRIPE_SECRET_KEY", "Stripe key"),
    "twilio_api_key": ("TWILIO_API_KEY", "Twilio API key"),
    "sendgrid_key": ("SENDGRID_API_KEY", "SendGrid key"),
    "mailchimp_key": ("MAILCHIMP_API_KEY", "Mailchimp key"),
    "npm_token": ("NPM_TOKEN", "npm token"),
    "pypi_token": ("TWINE_PASSWORD", "PyPI token"),
    "openai_key": ("OPENAI_API_KEY", "OpenAI key"),
    "google_api_key": ("GOOGLE_MAPS_KEY", "Maps API key"),
    "square_token": ("SQUARE_ACCESS_TOKEN", "Square token"),
    "discord_bot_token": ("DISCORD_TOKEN", "Discord bot token"),
    "telegram_bot_token": ("TELEGRAM_BOT_TOKEN", "Telegram bot token"),
    "huggingface_token": ("HF_TOKEN", "Hugging Face token"),
    "docker_token": ("DOCKERHUB_TOKEN", "Docker Hub token"),
}
CARRIERS: dict[str, list[tuple[str, str]]] = {  # kind -> [(lang, template)]
    kind: [("en", t) for t in _TOKEN_CARRIERS_EN] + [("zh", t) for t in _TOKEN_CARRIERS_ZH] for kind in _LABELS
}
CARRIERS["npm_token"].append(("en", "//registry.npmjs.org/:_authToken={s}"))
CARRIERS["telegram_bot_token"].append(("en", "curl https://api.telegram.org/bot{s}/getMe"))
CARRIERS.update({
    "aws_secret_key": [
        ("en", "AWS_SECRET_ACCESS_KEY={s}"), ("en", "aws_secret_access_key = {s}"),
        ("en", "the AWS secret access key is {s}"), ("en", '"SecretAccessKey": "{s}",'),
        ("en", "aws configure set aws_secret_access_key {s}"),
        ("zh", "AWS 的 SecretAccessKey 是 {s}"), ("zh", "secret access key：{s}"),
    ],
    "gcp_service_account_key": [
        ("en", '{{"type": "service_account", "project_id": "acme-prod-4821", "private_key_id": "{hex40}", '
               '"private_key": "{s}\\n", "client_email": "deployer@acme-prod-4821.iam.gserviceaccount.com"}}'),
        ("en", '  "private_key": "{s}\\n",\n  "client_email": "ci@build-farm.iam.gserviceaccount.com",'),
    ],
    "private_key": [("en", "{s}"), ("en", "cat ~/.ssh/id_deploy\n{s}"), ("zh", "这是跳板机的私钥：\n{s}")],
    "azure_storage_key": [
        ("en", "DefaultEndpointsProtocol=https;AccountName=acmelogs;AccountKey={s};EndpointSuffix=core.windows.net"),
        ("en", "AZURE_STORAGE_KEY={s}"), ("zh", "存储账户的 AccountKey={s} 先别外传"),
    ],
    "jwt": [("en", "Authorization: Bearer {s}"), ("en", "Cookie: session={s}; Path=/"), ("en", '{{"token": "{s}"}}'),
            ("en", "{s}"), ("zh", "前端拿到的 token：{s}"), ("zh", "令牌是 {s}")],
    "bearer_token": [("en", "Authorization: Bearer {s}"),
                     ("en", "curl -H 'Authorization: Bearer {s}' https://api.example.com/v1/me"),
                     ("zh", "请求头里带上 Authorization: Bearer {s}")],
    "basic_auth": [("en", "Authorization: Basic {s}"), ("en", "-H 'authorization: Basic {s}'")],
    "connection_password": [
        ("en", "postgres://{user}:{s}@{host}:5432/{db}"), ("en", "postgresql://{user}:{s}@{host}/{db}?sslmode=require"),
        ("en", "mysql://{user}:{s}@{host}:3306/{db}"),
        ("en", "mongodb+srv://{user}:{s}@cluster0.x7k2p.mongodb.net/{db}?retryWrites=true&w=majority"),
        ("en", "redis://:{s}@{host}:6379/0"), ("en", "redis://default:{s}@{host}:6379"),
        ("en", "amqp://{user}:{s}@{host}:5672/orders"), ("en", "DATABASE_URL=postgresql://{user}:{s}@{host}/{db}"),
        ("en", "jdbc:postgresql://{host}:5432/{db}?user={user}&password={s}&ssl=true"),
        ("en", "jdbc:mysql://{host}:3306/{db}?user={user}&password={s}&useSSL=false"),
        ("en", "jdbc:sqlserver://{host}:1433;databaseName={db};user={user};password={s};encrypt=true"),
        ("en", "Server=tcp:{host},1433;Database={db};User ID={user};Password={s};Encrypt=True;"),
        ("en", "mysql -h {host} -u {user} -p{s} {db}"), ("en", "PGPASSWORD={s} psql -h {host} -U {user} {db}"),
        ("en", "curl -u {user}:{s} https://{host}/api/health"), ("en", "sshpass -p '{s}' ssh {user}@{host}"),
        ("zh", "连接串是 mysql://{user}:{s}@{host}:3306/{db}"),
    ],
    "stated_password": [
        ("en", "my db password is {s}"), ("en", "the wifi password is {s}"), ("en", "password: {s}"),
        ("en", "The password for {host} is {s}"), ("en", "the root password was changed to {s}"),
        ("en", "DB_PASSWORD={s}"), ("en", "MYSQL_ROOT_PASSWORD: {s}"), ("en", 'password = "{s}"'),
        ("en", '"password": "{s}"'), ("en", "spring.datasource.password={s}"),
        ("en", "log in as {user} with password {s}"), ("en", "vpn passphrase: {s}"),
        ("en", "./deploy.sh --db-password {s}"), ("en", "**Password:** {s}"), ("en", "SMTP_PASS={s}"),
        ("en", "creds for {host}: {user} / {s}"), ("en", "the password is: {s}"),
        ("zh", "我的数据库密码是 {s}"), ("zh", "口令：{s}"), ("zh", "wifi密码是{s}"), ("zh", "root 密码为 {s}"),
        ("zh", "新密码：{s}"), ("zh", "密码改成了 {s}"), ("zh", "服务器登录密码 {s}"), ("zh", "管理员口令是 {s}"),
        ("zh", "VPN 的密码：{s}"), ("zh", "邮箱密码设置为 {s}"), ("zh", "密码就是 {s}"),
        ("zh", "账号 {user} 密码 {s}"), ("zh", "密码忘了，重置成 {s} 了"), ("zh", "账号密码：{user} / {s}"),
    ],
    "api_key": [
        ("en", 'api_key = "{s}"'), ("en", "X-API-Key: {s}"), ("en", "apiKey: '{s}'"), ("en", "the API key is {s}"),
        ("en", "client_secret={s}"), ("en", "webhook secret: {s}"), ("en", '"client_secret": "{s}"'),
        ("en", "GET /v2/report?api_key={s}&format=csv"), ("en", "- **API key**: `{s}`"),
        ("zh", "API 密钥是 {s}"), ("zh", "接口的 api key：{s}"), ("zh", "AccessKey Secret：{s}"),
    ],
    "django_secret_key": [("en", "SECRET_KEY = '{s}'"), ("en", 'DJANGO_SECRET_KEY="{s}"')],
    "unlabelled_token": [
        ("en", "{s}"), ("en", "can you check why {s} stopped working?"), ("en", "use {s} for the staging tenant"),
        ("zh", "用 {s} 这个试一下"), ("zh", "昨天发的 {s} 还能用吗"),
    ],
})

# ------------------------------------------------------------------------------ frames
# Where a written secret sits: chat and ops phrasing, logs, config snippets, tool output. They carry
# what must stay readable: timestamps, pod names, SHAs, UUIDs, trace ids, URLs.
FRAMES: list[tuple[str, str]] = [
    ("en", "{x}"),
    ("en", "hey, {x} — can you update the staging config before 3pm?"),
    ("en", "FYI {x}. Please don't paste it in #general."),
    ("en", "Quick one: {x}, does that still work for you?"),
    ("en", "I rotated it this morning after the incident ({ticket}): {x}"),
    ("en", "Here you go:\n{x}\nping me if {svc} still returns 401."),
    ("en", "Customer {uuid} says login fails; they sent this over email: {x}"),
    ("en", "{ts} DEBUG [{svc}] loaded credentials {x} trace_id={trace}"),
    ("en", "$ kubectl logs {pod} -n prod | grep -i auth\n{ts} WARN retrying with {x}\n{ts} INFO connected"),
    ("en", "```\n{x}\n```"),
    ("en", ".env for {svc} (commit {sha}):\n{x}\nLOG_LEVEL=info\nREGION=eu-west-1"),
    ("en", "Step 3 of the runbook says: set {x} and restart {pod}."),
    ("en", "tool output (get_secret, 12 ms):\n{x}"),
    ("en", "the deploy of {svc}:{version} failed, config dump:\n  replicas: 3\n  {x}\n  image: registry.example.com/{svc}:{version}"),
    ("en", "Can you remember this for later? {x}"),
    ("zh", "麻烦帮我看一下，{x}，为什么 {svc} 还是登录不上？"),
    ("zh", "测试环境的配置如下：\n{x}\n用完记得删掉。"),
    ("zh", "{ts} ERROR [{svc}] 鉴权失败，使用的凭证：{x}"),
    ("zh", "我把 {x} 发你了，别外传。"),
    ("zh", "运维同学说 {x}，下周会轮换。"),
    ("zh", "上线前记得更新：{x}"),
    ("zh", "客户那边给的是 {x} ，先别提交到 git（提交 {sha} 里已经删了）。"),
    ("zh", "这是生产库的连接信息\n{x}\n仅限今天使用，工单 {ticket}。"),
    ("zh", "帮我记一下：{x}"),
    ("zh", "{pod} 重启了三次，日志里有这一行：{x}"),
]


@dataclass(frozen=True, slots=True)
class Case:
    kind: str
    lang: str
    text: str
    secret: str


def fill(rng: random.Random, template: str, **given: str) -> str:
    context = {
        "user": rng.choice(USERS), "host": rng.choice(HOSTS), "db": rng.choice(DBS), "svc": rng.choice(SERVICES),
        "pod": f"{rng.choice(SERVICES)}-{rand(rng, HEX, 9)}-{rand(rng, string.ascii_lowercase + string.digits, 5)}",
        "sha": rand(rng, HEX, 40), "hex40": rand(rng, HEX, 40), "trace": rand(rng, HEX, 32),
        "uuid": "-".join(rand(rng, HEX, n) for n in (8, 4, 4, 4, 12)), "ticket": f"INC-{rng.randint(1000, 9999)}",
        "version": f"v{rng.randint(1, 3)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}",
        "ts": f"2026-0{rng.randint(1, 9)}-{rng.randint(10, 28)}T{rng.randint(10, 23)}:{rng.randint(10, 59)}:"
              f"{rng.randint(10, 59)}.{rng.randint(100, 999)}Z",
    }
    context.update(given)
    return template.format(**context)


def corpus(rng: random.Random, n: int) -> list[Case]:
    """n cases, the kinds taken in turn so each is about equally represented."""
    kinds = sorted(MAKERS)
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        secret = MAKERS[kind](rng)
        lang, carrier = rng.choice(CARRIERS[kind])
        env, label = _LABELS.get(kind, ("", ""))
        written = fill(rng, carrier, s=secret, env=env, label=label)
        frame_lang, frame = rng.choice([f for f in FRAMES if f[0] == lang or rng.random() < 0.3])
        out.append(Case(kind, lang if lang == frame_lang else "mixed", fill(rng, frame, x=written), secret))
    return out


def covered(case: Case, masked: list[detector.Masked]) -> bool:
    """Every occurrence of the secret lies inside masked spans."""
    spans = sorted((m.start, m.end) for m in masked)
    pos = case.text.find(case.secret)
    while pos >= 0:
        reach, end = pos, pos + len(case.secret)
        for s, e in spans:
            if s <= reach < e:
                reach = e
        if reach < end:
            return False
        pos = case.text.find(case.secret, pos + 1)
    return True


def corpus_part(cases: list[Case]) -> dict[str, object]:
    per_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    per_lang: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    missed: list[Case] = []
    other = 0
    for case in cases:
        _, masked = detector.mask(case.text)
        ok = covered(case, masked)
        for tally in (per_kind[case.kind], per_lang[case.lang]):
            tally[0] += ok
            tally[1] += 1
        if not ok:
            missed.append(case)
        s0 = case.text.find(case.secret)
        s1 = s0 + len(case.secret)
        extra = [m for m in masked if m.end <= s0 or m.start >= s1]
        other += len(extra)
        for m in extra[:1]:
            log(f"corpus: masked outside the secret ({case.kind}): {case.text[m.start:m.end]!r}")
    for case in missed[:15]:
        log(f"corpus: missed {case.kind}: {case.text!r}")
    share = lambda t: round(t[0] / t[1], 4)  # noqa: E731
    return {
        "corpus_cases": len(cases), "corpus_kinds": len(per_kind),
        "masked_share": round(sum(t[0] for t in per_kind.values()) / len(cases), 4),
        "masked_share_by_kind": {k: share(t) for k, t in sorted(per_kind.items())},
        "masked_share_by_language": {k: share(t) for k, t in sorted(per_lang.items())},
        "other_masks": other,
    }


# ------------------------------------------------------------------------------ real conversations

def locomo_turns(path: Path) -> list[str] | None:
    if not path.exists():
        return None
    turns = []
    for conv in json.loads(path.read_text()):
        for key, session in conv["conversation"].items():
            if key.startswith("session_") and isinstance(session, list):
                turns += [t["text"] + (f" [image: {t['blip_caption']}]" if t.get("blip_caption") else "")
                          for t in session]
    return turns


def longmemeval_turns(path: Path) -> list[str] | None:
    """Each distinct turn once: the questions' haystacks share most sessions."""
    if not path.exists():
        return None
    with gzip.open(path, "rt") as f:
        records = json.load(f)
    return list(dict.fromkeys(t["content"] for r in records for s in r["haystack_sessions"] for t in s))


def false_masks(name: str, turns: list[str] | None, sample: int | None, rng: random.Random) -> dict | None:
    if turns is None:
        log(f"{name}: data not found, reported as null")
        return None
    if sample is not None and sample < len(turns):
        turns = rng.sample(turns, sample)
    kinds: Counter[str] = Counter()
    flagged = 0
    for text in turns:
        _, masked = detector.mask(text)
        if masked:
            flagged += 1
            kinds.update(m.kind for m in masked)
            if flagged <= 8:
                m = masked[0]
                log(f"{name}: false mask? {m.kind}: ...{text[max(m.start - 60, 0):m.start]!r} "
                    f"[{text[m.start:m.end]!r}] {text[m.end:m.end + 30]!r}...")
    return {"turns": len(turns), "masked_turns": flagged, "false_mask_share": round(flagged / len(turns), 5),
            "kinds": dict(kinds.most_common())}


# ------------------------------------------------------------------------------ speed

def chat_turns(rng: random.Random, n: int) -> list[str]:
    """~200-char ops chat turns without secrets (ids, pods, URLs, CJK), the common case at ingest."""
    lines = (
        "the {svc} in prod started returning 502s around {ts}; pod {pod} restarted 3 times, see {ticket}",
        "rolled back {svc} to {version} (commit {sha}); error rate back under 0.1%, keep an eye on p99",
        "request {uuid} failed with trace {trace} — can you check https://grafana.example.com/d/{svc}?",
        "{svc} 在生产环境从 {ts} 开始超时，{pod} 已经重启了，工单 {ticket}，先别回滚",
        "password reset emails are delayed again 😩 the queue for {svc} has 12k messages, token budget is fine",
    )
    return [(fill(rng, rng.choice(lines)) + " " + fill(rng, rng.choice(lines)))[:200] for _ in range(n)]


def pasted_log(rng: random.Random, size: int) -> str:
    """An application log as pasted into a chat, with a few secrets in it."""
    out: list[str] = []
    total = 0
    while total < size:
        kind = rng.random()
        line = fill(rng, "{ts} INFO  [{svc}] request_id={trace} method=GET path=/api/v1/orders status=200")
        if kind < 0.2:
            line = fill(rng, '{ts} WARN  {{"msg":"retrying upstream","upstream":"http://{svc}.prod.svc:8080",'
                             '"trace_id":"{trace}","pod":"{pod}"}}')
        elif kind < 0.3:
            line = fill(rng, "\tat com.example.orders.Service.handle(Service.java:{n})", n=str(rng.randint(1, 999)))
        elif kind < 0.31:
            line = fill(rng, "{ts} DEBUG [{svc}] db url postgres://{user}:{pw}@{host}/{db}", pw=url_password(rng))
        out.append(line)
        total += len(line) + 1
    return "\n".join(out)[:size]


def speed_part(rng: random.Random, quick: bool) -> dict[str, float]:
    """mask() on clean turns (the common case), on turns holding one stated password, and on a pasted
    log with a few secrets: a text with secrets is read twice (the masked text is checked again)."""
    turns = chat_turns(rng, 200)
    with_secret = [(f"the db password is {password(rng)} - {t}")[:200] for t in turns]
    rounds = 5 if quick else 25
    text = pasted_log(rng, 256 * 1024)
    reps = 3 if quick else 9
    hay = detector._hay(text)
    ms = lambda fn: round(median_us(fn, reps) / 1000, 1)  # noqa: E731
    return {
        "turn_chars_mean": round(statistics.fmean(map(len, turns))),
        "mask_us_per_200_char_turn": round(median_us(lambda: [detector.mask(t) for t in turns], rounds) / 200, 1),
        "mask_us_per_200_char_turn_with_secret":
            round(median_us(lambda: [detector.mask(t) for t in with_secret], rounds) / 200, 1),
        "mask_ms_per_256k_log": ms(lambda: detector.mask(text)),
        "find_ms_per_256k_log": ms(lambda: detector.find_secrets(text)),
        # one detection pass by part: looking for the needles, our patterns, the library's plugins
        # behind their gates, the entropy check
        "needles_ms_per_256k_log": ms(lambda: detector._hay(text)),
        "own_patterns_ms_per_256k_log": ms(lambda: list(detector._own_spans(hay))),
        "library_ms_per_256k_log": ms(lambda: list(detector._library_spans(hay))),
        "entropy_ms_per_256k_log": ms(lambda: list(detector._entropy_spans(hay, []))),
    }


# Texts built to make patterns rescan (many starts of a token, many secrets): the worst one bounds
# what one hostile 256 KiB message costs at ingest.
HOSTILE = ("eyJ", "?token=", "x://a:b@c ", "AKIA", "mysql ", "password is Hunter2! ", "密码是 abc123 ", "-us1")


def hostile_part() -> dict[str, object]:
    size = 256 * 1024
    costs = {}
    for unit in HOSTILE:
        text = unit * (size // len(unit))
        t0 = time.perf_counter()
        detector.mask(text)
        costs[unit] = time.perf_counter() - t0
    worst = max(costs, key=costs.get)
    return {"hostile_worst_ms_per_256k": round(costs[worst] * 1000, 1), "hostile_worst_text": worst * 3 + "..."}


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="600 cases, 3,000 sampled turns per dataset (< 1 min)")
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--cases", type=int, default=0, help="corpus size (default 600 quick, 3,000 full)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    figures: dict[str, object] = {"bench": "secret_masking", "quick": args.quick, "seed": args.seed}
    figures.update(corpus_part(corpus(rng, args.cases or (600 if args.quick else 3000))))
    sample = 3000 if args.quick else None
    figures["locomo"] = false_masks("locomo", locomo_turns(LOCOMO), sample, rng)
    figures["longmemeval"] = false_masks("longmemeval", longmemeval_turns(LONGMEMEVAL), sample, rng)
    figures.update(speed_part(rng, args.quick))
    figures.update(hostile_part())
    figures["seconds"] = round(time.perf_counter() - t0, 1)
    by_kind = figures["masked_share_by_kind"]
    worst = min(by_kind, key=by_kind.get)
    print(f"masked {figures['masked_share']:.4f} of {figures['corpus_cases']} generated secrets "
          f"({figures['corpus_kinds']} kinds; lowest {worst} {by_kind[worst]}); other masks {figures['other_masks']}")
    for name in ("locomo", "longmemeval"):
        d = figures[name]
        print(f"{name}: " + (f"{d['masked_turns']} of {d['turns']} turns masked ({d['false_mask_share']})"
                             if d else "not found"))
    print(f"mask(): {figures['mask_us_per_200_char_turn']} us per 200-char turn, "
          f"{figures['mask_ms_per_256k_log']} ms per 256 KiB log")
    emit(figures)


if __name__ == "__main__":
    main()
