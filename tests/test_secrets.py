import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.secrets import contains_secret, find_secrets, looks_like_raw_log, redact, shannon_entropy

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
