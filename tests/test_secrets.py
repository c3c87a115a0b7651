import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar import secrets as detector
from sidecar.secrets import (
    Masked,
    contains_secret,
    find_secrets,
    looks_like_raw_log,
    mask,
    redact,
    shannon_entropy,
)

GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0" * 2
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
    "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)


@pytest.mark.parametrize(
    ("text", "secret", "kind"),
    [
        ("password: hunter2", "hunter2", "password"),
        ("db passwd=S3cr3t!x", "S3cr3t!x", "password"),
        ("the pwd is abc123.", "abc123", "password"),
        ("the password for the prod db is Tr0ub4dor", "Tr0ub4dor", "password"),
        ("数据库密码是abc123，记住", "abc123", "password"),
        ("密码：P@ssw0rd", "P@ssw0rd", "password"),
        ("口令 为 letmein9", "letmein9", "password"),
        ("key AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE", "aws_access_key"),
        (f"token {GITHUB_TOKEN}", GITHUB_TOKEN, "github_token"),
        ("slack xoxb-123456789012-abcdefABCDEF", "xoxb-123456789012-abcdefABCDEF", "slack_token"),
        ("OPENAI sk-proj-abcdefghijklmnopqrstuvwx1234", "sk-proj-abcdefghijklmnopqrstuvwx1234", "openai_key"),
        (
            "AIzaSyA-1234567890abcdefghijklmnopqrstu",
            "AIzaSyA-1234567890abcdefghijklmnopqrstu",
            "google_api_key",
        ),
        (f"cookie={JWT}", JWT, "jwt"),
        ("Authorization: Bearer abcdef123456", "abcdef123456", "bearer_token"),
        ('{"api_key": "zq9XbW2LmN4p"}', "zq9XbW2LmN4p", "api_key"),
        ("ACCESS_KEY = qwertyuiop", "qwertyuiop", "api_key"),
        ("client_secret: verysecretvalue", "verysecretvalue", "api_key"),
        ("postgres://admin:s3cret@db.prod.internal:5432/app", "s3cret", "connection_string"),
        ("mongodb+srv://u:pa55word@cluster0.mongodb.net", "pa55word", "connection_string"),
        ("random Xy7Kp2Qm9Zr4Tn8Wv3Lb6Hd1 token", "Xy7Kp2Qm9Zr4Tn8Wv3Lb6Hd1", "high_entropy"),
    ],
)
def test_detects_and_redacts(text: str, secret: str, kind: str) -> None:
    spans = find_secrets(text)
    assert spans, text
    assert any(
        text[s.start : s.end].find(secret) >= 0 or secret.find(text[s.start : s.end]) >= 0 for s in spans
    )
    assert contains_secret(text)
    red = redact(text)
    assert secret not in red
    assert f"[REDACTED:{spans[0].kind}]" in red
    assert any(s.kind == kind for s in spans)


def test_private_key_block_is_one_span() -> None:
    text = "before\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\nq83kd9\n-----END RSA PRIVATE KEY-----\nafter"
    assert redact(text) == "before\n[REDACTED:private_key]\nafter"
    truncated = (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAA"  # no END: still redacted to end
    )
    assert redact(truncated) == "[REDACTED:private_key]"


def test_connection_string_keeps_host_and_user() -> None:
    red = redact("connect to postgres://admin:s3cret@db.prod.internal:5432/app now")
    assert red == "connect to postgres://admin:[REDACTED:connection_string]@db.prod.internal:5432/app now"


@pytest.mark.parametrize(
    "text",
    [
        "commit 3f786850e387550fdab836ed7e6dc881de23001b fixed it",  # git SHA: deliberately not a secret
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
        "request 123e4567-e89b-12d3-a456-426614174000 failed",  # UUID
        "pod payment-api-7d9f8b6c5-x2x4z restarted 3 times",
        "image registry.example.com/team/order-service:v1.2.3-20240115",
        "password is required",
        "click the password reset link",
        "max_tokens: 4096 and token: 42",
        "postgres://user:${DB_PASS}@host/db",
        "password: <your-password>",
        "密码是多少？",
        "run pwd in the shell",
        "2024-01-15T10:23:45.123Z INFO started",
        "/usr/lib/python3.11/site-packages/foo/bar.py",
        "payment-api in prod returns 502 since 10:05",
        "今天生产环境的 order-service 超时了",
    ],
)
def test_not_secrets(text: str) -> None:
    assert find_secrets(text) == []
    assert redact(text) is text


def test_overlapping_matches_merge_into_one_placeholder() -> None:
    red = redact("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY end")
    assert red.count("[REDACTED:") == 1
    assert "wJalrXUtnFEMI" not in red
    assert red.endswith(" end")


def test_entropy_helper() -> None:
    assert shannon_entropy("") == 0.0
    assert shannon_entropy("aaaa") == 0.0
    assert shannon_entropy("abcd") == pytest.approx(2.0)


_words = st.lists(st.from_regex(r"[a-z]{1,12}", fullmatch=True), min_size=1, max_size=30)


@settings(max_examples=60, deadline=None)
@given(_words)
def test_plain_prose_is_never_a_secret(words: list[str]) -> None:
    text = " ".join(w for w in words if w not in {"password", "passwd", "pwd", "passphrase"})
    assert not contains_secret(text)


@settings(max_examples=60, deadline=None)
@given(st.from_regex(r"[A-Z0-9]{16}", fullmatch=True), st.text(alphabet=" .,:=\n", max_size=20))
def test_aws_keys_never_survive_redaction(body: str, noise: str) -> None:
    key = "AKIA" + body
    assert key not in redact(f"{noise}{key}{noise}")


@pytest.mark.parametrize(
    "text",
    [
        'Traceback (most recent call last):\n  File "app.py", line 3, in <module>\n    main()\nValueError: x',
        'Exception in thread "main" java.lang.NullPointerException\n\tat com.foo.Bar.baz(Bar.java:12)',
        "\tat com.foo.Service.handle(Service.java:88)\n\tat com.foo.Main.main(Main.java:5)",
        "panic: runtime error: index out of range\n\ngoroutine 1 [running]:\nmain.main()",
        "2024-01-15 10:23:45 INFO start\n2024-01-15 10:23:46 ERROR boom\n2024-01-15 10:23:47 WARN retry",
        "[ERROR] connection refused\n[INFO] retrying\n[INFO] retrying",
        "Jan 15 10:23:45 host sshd[1]: Accepted\nJan 15 10:23:46 host sshd[1]: closed",
        "E0115 10:23:45.123 1 main.go:10] failed\nI0115 10:23:46.000 1 main.go:11] ok",
    ],
)
def test_raw_logs(text: str) -> None:
    assert looks_like_raw_log(text)


@pytest.mark.parametrize(
    "text",
    [
        "I prefer concise answers.",
        "The payment-api in prod had an ERROR spike at 10:05, root cause was the connection pool.",
        "2024-01-15 was the day we migrated.\nEverything went fine after that.\nNo issues since.",
        "以后默认查测试环境",
        "",
    ],
)
def test_not_raw_logs(text: str) -> None:
    assert not looks_like_raw_log(text)


# --------------------------------------------------------------------------- mask()

AWS_KEY = "AKIAQ7XK2M4N6P8R0T3V"


def _covered(text: str, secret: str) -> bool:
    """Every char of the secret (its first occurrence) lies inside a masked span."""
    start = text.index(secret)
    inside = {i for m in mask(text)[1] for i in range(m.start, m.end)}
    return set(range(start, start + len(secret))) <= inside


def test_mask_numbers_distinct_values_and_keeps_positions() -> None:
    text = f"password: Hunter2-7741\nkey {AWS_KEY}\nagain password: Hunter2-7741, token={GITHUB_TOKEN}"
    out, masked = mask(text)
    assert [(m.kind, m.placeholder) for m in masked] == [
        ("password", "[secret:password#1]"),
        ("aws_access_key", "[secret:aws_access_key#2]"),
        ("password", "[secret:password#1]"),  # the same value keeps its number
        ("github_token", "[secret:github_token#3]"),
    ]
    assert [text[m.start : m.end] for m in masked] == ["Hunter2-7741", AWS_KEY, "Hunter2-7741", GITHUB_TOKEN]
    assert out == (
        "password: [secret:password#1]\nkey [secret:aws_access_key#2]\n"
        "again password: [secret:password#1], token=[secret:github_token#3]"
    )
    assert all(isinstance(m, Masked) for m in masked)


def test_mask_returns_clean_text_itself() -> None:
    text = "deploy payment-api v1.2.3 to prod after the 10:00 standup"
    out, masked = mask(text)
    assert out is text and masked == []


def test_masked_text_is_clean_and_stays_the_same() -> None:
    text = (
        f"postgres://admin:s3cret-Pa55@db.prod.internal:5432/app\nAuthorization: Bearer {JWT}\n"
        "我的数据库密码是 Hunter2-xyz，口令：abc123!\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n"
        "-----END RSA PRIVATE KEY-----"
    )
    once, masked = mask(text)
    assert len(masked) == 5
    assert "s3cret" not in once and "Hunter2-xyz" not in once and "abc123!" not in once and "MIIE" not in once
    assert "db.prod.internal" in once  # only the password of a connection string goes
    twice, again = mask(once)
    assert twice is once and again == []
    assert not contains_secret(once) and find_secrets("[secret:password#1]") == []
    assert redact(once) is once


def test_numbering_goes_on_after_placeholders_already_there() -> None:
    out, masked = mask("earlier: [secret:password#1] [secret:jwt#2]; now the wifi password is Tr0ub4dor&3")
    assert [m.placeholder for m in masked] == ["[secret:password#3]"]
    assert out.endswith("the wifi password is [secret:password#3]")


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("我的数据库密码是 Hunter2-xyz", "Hunter2-xyz"),
        ("口令：abc123!", "abc123!"),
        ("the wifi password is Tr0ub4dor&3", "Tr0ub4dor&3"),
        ("my db password is Hunter2-7741.", "Hunter2-7741"),
        ("The password for the prod db was changed to Summer2024!", "Summer2024!"),
        ("**Password:** P3pp3r#4", "P3pp3r#4"),
        ("log in as root with password Vi0let@77", "Vi0let@77"),
        ("the vpn passphrase is 'correct horse battery staple'", "correct horse battery staple"),
        ("wifi密码是Xk9!pq2，别告诉别人", "Xk9!pq2"),
        ("root 密码为 Passw0rd#2024。", "Passw0rd#2024"),
        ("密码改成了 zhangsan@123 了", "zhangsan@123"),
        ("服务器登录密码 Abc123456!", "Abc123456!"),
        ("密码忘了，重置成 Lisi_8848 了", "Lisi_8848"),
        ("账号密码：admin / Adm1n!2024", "Adm1n!2024"),
        ("PGPASSWORD=q9Lk2mXz psql -h db -U app", "q9Lk2mXz"),
        ("mysql -h db.prod -u root -pRootPw99 orders", "RootPw99"),
        ("jdbc:mysql://db:3306/app?user=app&password=Tr0ub4dor&3x&useSSL=false", "Tr0ub4dor"),
        ("jdbc:sqlserver://db:1433;databaseName=app;user=sa;password=Sa-Pass-99;encrypt=true", "Sa-Pass-99"),
        ("redis://:R3dis-pw@cache.prod:6379/0", "R3dis-pw"),
        ("amqp://orders:Rabb1t.pw@mq.prod:5672/orders", "Rabb1t.pw"),
        ("mongodb+srv://app:M0ngo-pw@cluster0.abcde.mongodb.net/app?retryWrites=true", "M0ngo-pw"),
        ("aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLE", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLE"),
        ("the AWS secret key is Zx8/Qm3+Lp0vTn7Rk2Ws5Yd9Hc4Jf6Gb1Ne8Ua0i", "Zx8/Qm3+Lp0vTn7Rk2Ws5Yd9Hc4Jf6Gb1Ne8Ua0i"),
    ],
)
def test_stated_secrets_are_masked(text: str, secret: str) -> None:
    assert _covered(text, secret), mask(text)
    assert secret not in mask(text)[0]


def test_gcp_service_account_and_azure_connection_string() -> None:
    key = "-----BEGIN PRIVATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\\nqg83kd9x\\n-----END PRIVATE KEY-----"
    gcp = f'{{"type": "service_account", "private_key_id": "{"ab12" * 10}", "private_key": "{key}\\n"}}'
    out, masked = mask(gcp)
    assert [m.kind for m in masked] == ["private_key"] and "MIIE" not in out and "ab12ab12" in out
    account_key = "Zm9vYmFy" * 11  # 88 chars, as Azure's are
    azure = f"DefaultEndpointsProtocol=https;AccountName=acme;AccountKey={account_key};EndpointSuffix=core.windows.net"
    out, masked = mask(azure)
    assert account_key not in out and "AccountName=acme" in out and out.endswith("EndpointSuffix=core.windows.net")


# --------------------------------------------------------------------------- detect-secrets

@pytest.mark.parametrize(
    ("secret", "kind"),
    [
        ("SK" + "0123456789abcdef" * 2, "twilio_api_key"),
        ("MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs", "discord_bot_token"),
        ("123456789:AAHqzjJ6yF1bz8fjXyPq3Y2sFd8Zn0kLm4c", "telegram_bot_token"),
        ("0123456789abcdef0123456789abcdef-us12", "mailchimp_access_key"),
        ("AKCp8ihpN4bkL3d2XnFk", "artifactory_credentials"),
    ],
)
def test_library_detections_are_masked(secret: str, kind: str) -> None:
    text = f"ops handover: use {secret} for the bot, rotate on Friday"
    out, masked = mask(text)
    assert secret not in out
    assert [m.kind for m in masked] == [kind]
    assert text[masked[0].start : masked[0].end] == secret


def test_library_and_own_findings_merge_into_one_placeholder() -> None:
    # Our JWT and bearer patterns and the library's JWT plugin all see this token: one span, our kind.
    text = f"curl -H 'Authorization: Bearer {JWT}' https://api.example.com/v1/me"
    out, masked = mask(text)
    assert [m.kind for m in masked] == ["jwt"] and out.count("[secret:") == 1
    slack = "https://hooks.slack.com/services/T0A1B2C3D/B0E1F2G3H4/" + "aZ3kQ9mX2pL7vN4c"
    assert [m.kind for m in mask(f"webhook: {slack}")[1]] == ["slack_token"]


def _plugin_regexes() -> list[tuple[str, re.Pattern[str]]]:
    return [(p.kind, rx) for p in detector._PLUGINS for rx in p.denylist]


@pytest.mark.parametrize(("kind", "rx"), _plugin_regexes(), ids=lambda v: getattr(v, "pattern", v)[:40])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_gates_never_hide_a_library_finding(kind: str, rx: re.Pattern[str], data: st.DataObject) -> None:
    """Whatever a plugin finds on a line, its gates hit there (they are a superset of its patterns)
    and it finds something again in the windows it reads around the hits."""
    alphabet = st.characters(codec="ascii", exclude_characters="\n")
    line = data.draw(st.from_regex(rx, alphabet=alphabet))
    plugin = next(p for p in detector._PLUGINS if p.kind == kind and rx in p.denylist)
    if any(plugin.plugin.analyze_string(line)):
        hits = detector._gate_hits(detector._hay(line), plugin)
        assert hits, line
        assert any(any(plugin.plugin.analyze_string(line[a:b])) for a, b in detector._windows(line, hits)), line


# --------------------------------------------------------------------------- false masks

@pytest.mark.parametrize(
    "text",
    [
        "git log shows 3f786850e387550fdab836ed7e6dc881de23001b and 9fceb02 merged into main",
        "trace 123e4567-e89b-12d3-a456-426614174000 span b8b6d8fe442e3d43 took 812 ms",
        "kubectl -n prod delete pod payment-api-7d9f8b6c5-x2x4z order-service-5c6d7e8f9-abcde",
        "see https://grafana.example.com/d/AbC123xYz/payment-api?orgId=1&from=now-6h and www.example.com/docs",
        "docs at https://www.youtube.com/watch?v=dQw4w9WgXcQ and https://docs.google.com/d/1MqJ9r3N0eJFbW8F3T2P",
        "今天生产环境的 order-service 超时了，密码是多少？我忘了，回头问一下运维",
        "rollback done 🎉🚀 p99 back to 120ms, error budget fine 👍",
        "the password is case-sensitive and the token is expired",
        "**Check your password**: If you're still locked out, reset it.",
        "const apiKey = process.env.DATA_API_KEY; this.apiKey = apiKey;",
        "api_key = 'YOUR_API_KEY'  # replace with your own",
        'password = request.form["password"]',
        "pydantic model: password: str, email: str",
        "feeGrowthGlobal0X128 and T5ForConditionalGeneration and S3OperationException",
        'integrity="sha384-KyZXEAg3QhqLMpG8r+Knujsl5/J5f5jU1wFzgW6xZI6loz6ldkgnC6fH1W9W1qw"',
        "ED25519 key fingerprint is SHA256:gdD8jZnn7uZBMNcRA9ptCg+2Ws6r1nBd2bzekCA65yU.",
        "2026-03-02T10:16:07.507Z INFO [billing-worker] request_id=c9e9c616612e7696a6cecc1b78e51061 status=200",
        "login: https://sso.example.com/login then pick the prod account",
    ],
)
def test_no_false_mask_on_ops_text(text: str) -> None:
    out, masked = mask(text)
    assert masked == [] and out is text


# --------------------------------------------------------------------------- property tests

_B62 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_SECRETS = st.one_of(
    st.from_regex(r"AKIA[0-9A-Z]{16}", fullmatch=True),
    st.from_regex(rf"ghp_[{_B62}]{{36}}", fullmatch=True),
    st.from_regex(rf"sk_live_[{_B62}]{{24}}", fullmatch=True),
    st.from_regex(rf"xoxb-[0-9]{{12}}-[0-9]{{12}}-[{_B62}]{{24}}", fullmatch=True),
    st.from_regex(rf"glpat-[{_B62}_-]{{20}}", fullmatch=True),
    st.from_regex(rf"AIza[{_B62}_-]{{35}}", fullmatch=True),
    st.from_regex(rf"SG\.[{_B62}_-]{{22}}\.[{_B62}_-]{{43}}", fullmatch=True),
)
# No "@": in the URL carrier it would have to be percent-encoded ("postgres://app:AA0@@db" is no valid URL).
_PASSWORDS = st.from_regex(r"[A-Za-z]{2,8}[0-9]{1,4}[-!#$%&*_]?[A-Za-z0-9]{0,4}", fullmatch=True)
_CARRIERS = (
    "password: {s}", "the password is {s}", "my db password is {s}", "DB_PASSWORD={s}", "密码是 {s}", "口令：{s}",
    "postgres://app:{s}@db.internal:5432/app", "新密码：{s}",
)
_WORDS_EN = st.lists(st.sampled_from(["deploy", "the", "prod", "cluster", "after", "standup", "rotate", "it",
                                      "please", "again", "today", "pod", "logs", "ok", "thanks", "v1.2.3"]),
                     max_size=8)
_WORDS_ZH = st.lists(st.sampled_from(["请", "帮我", "看一下", "生产环境", "今天", "记得", "轮换", "谢谢"]), max_size=5)


@settings(max_examples=150, deadline=None)
@given(
    st.one_of(_SECRETS.map(lambda s: (s, "{s}")), st.tuples(_PASSWORDS, st.sampled_from(_CARRIERS))),
    _WORDS_EN, _WORDS_EN, _WORDS_ZH, st.sampled_from([" ", "\n", "，", ". "]),
)
def test_random_secrets_in_random_sentences_are_masked(
    secret_and_carrier: tuple[str, str], before: list[str], after: list[str], zh: list[str], sep: str
) -> None:
    secret, carrier = secret_and_carrier
    text = " ".join(before) + " " + carrier.format(s=secret) + sep + "".join(zh) + " ".join(after)
    out = mask(text)[0]
    assert _covered(text, secret), (text, out)
    assert secret not in out
    assert mask(out)[0] == out  # idempotent


# Fragments that once made a second mask() find something new: a match hiding another behind it
# ("aZcurl -u a:curl -u a:pw"), tokens glued to a secret, a "[secret:" read as a "secret:" label.
_NOISE = ["a", "Z", "9", " ", ":", "=", "/", "@", ".", "-", "_", "'", '"', "\n", "，", "密码", "是", "：", "账号密码：",
          "password", "token", "secret", "[secret:jwt#1]", "AKIA", "AKIAABCDEFGHIJKLMNOP", "://", "u:", "@h/", "eyJ",
          "Hunter2!", "is", "with", "the password is ", "curl -u a:", "mysql -p", "--password ", "?token=",
          "&password=", "ghp_" + "aB3" * 12, "Xy7Kp2Qm9Zr4Tn8Wv3Lb", "0123456789ABCDEFGHIJ"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_NOISE), max_size=40).map("".join))
def test_mask_is_idempotent_on_noise(text: str) -> None:
    once, masked = mask(text)
    assert mask(once)[0] == once
    assert all(text[m.start : m.end] and m.placeholder in once for m in masked)


def test_mask_also_masks_what_masking_brings_to_light() -> None:
    # Found by the property test: once "-pXy7..." is masked, "mysql ... -pu:" reads as a password.
    text = "mysql -pXy7Kp2Qm9Zr4Tn8Wv3Lb(amysql -pu:"
    out, masked = mask(text)
    assert [text[m.start : m.end] for m in masked] == ["-pXy7Kp2Qm9Zr4Tn8Wv3Lb", "u:"]
    assert mask(out)[0] is out


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(_NOISE), max_size=40).map("".join))
def test_a_text_known_clean_answers_as_a_fresh_scan(text: str) -> None:
    """contains_secret keeps the digests of texts found clean (by it or by mask): a text masked at ingest
    and checked again by its after-turn job is a lookup, and no answer changes."""
    once, _ = mask(text)
    assert detector._digest(once) in detector._CLEAN  # what mask returns holds nothing left to mask
    assert contains_secret(once) is False is bool(detector.find_secrets(once))
    assert contains_secret(text) is bool(detector.find_secrets(text))
    assert (detector._digest(text) in detector._CLEAN) is (not detector.find_secrets(text))


def test_the_known_clean_texts_are_bounded(monkeypatch) -> None:
    monkeypatch.setattr(detector, "_CLEAN", {})
    monkeypatch.setattr(detector, "_CLEAN_MAX", 3)
    for n in range(5):
        assert not contains_secret(f"clean text {n}")
    assert len(detector._CLEAN) == 2  # cleared when full, then filled again
    assert contains_secret(f"password: Hunter2-7741 {GITHUB_TOKEN}") and len(detector._CLEAN) == 2
