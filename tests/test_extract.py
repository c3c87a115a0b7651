import random
import time

import pytest

from sidecar.memory.extract import Extractor, MemoryCandidate, RuleBasedExtractor, derive_subject
from sidecar.textmodel import Turn


def extract_one(text: str, role: str = "user") -> list[MemoryCandidate]:
    return RuleBasedExtractor().extract([Turn("m1", role, text)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "ctype", "subject"),
    [
        ("I prefer concise answers.", "preference", "answer_style"),
        ("Please always answer in Chinese.", "preference", "language"),
        ("From now on use staging by default.", "preference", "default_env"),
        ("Going forward, reply with bullet points.", "preference", "answer_style"),
        ("Call me Sam.", "preference", "name"),
        ("I like vim.", "preference", "editor"),
        ("以后默认查测试环境", "preference", "default_env"),
        ("我喜欢简洁的回答", "preference", "answer_style"),
        ("请用中文回复", "preference", "language"),
        ("我偏好用 zsh", "preference", "shell"),
        ("I usually check grafana first.", "habit", None),
        ("Every morning I review the on-call alerts.", "habit", None),
        ("我通常先看日志", "habit", None),
        ("我每天早上看一下告警", "habit", None),
        ("每周五发布一次", "habit", None),  # Chinese drops the subject
        ("Our prod cluster is eks-prod-1 in us-east-1.", "semantic", "prod_cluster"),
        ("我们的生产集群是 ack-prod", "semantic", "prod_cluster"),
        ("We use postgres 15.", "semantic", "database"),
        ("My team owns payment-api.", "semantic", "owns:payment-api"),
        ("我负责 order-service", "semantic", "owns:order-service"),
        ("My team owns the prod payment-api.", "semantic", "owns:payment-api"),
        ("I'd like shorter answers.", "preference", "answer_style"),
        ("I'd like to keep answers short from now on.", "preference", "answer_style"),
        ("I really like spicy food.", "preference", None),
        # What the user asks of this conversation, or how they take a suggestion in it, is no preference:
        # a fact of what they are about, keyed on all of it so one never supersedes another.
        ("I'd like to know more about energy storage startups.", "semantic",
         "interest:d_like_know_more_about_energy_storage_startups"),
        ("I'd like you to draft the launch email.", "semantic", "interest:d_like_you_draft_launch_email"),
        ("I like the idea of painting vintage items.", "semantic", "interest:like_idea_painting_vintage_items"),
        ("I really like those ideas, especially the planner.", "semantic", "interest:really_like_those_ideas_especially_planner"),
        ("I like the wine and cheese gift basket idea.", "semantic", "interest:like_wine_cheese_gift_basket_idea"),
        # A definite "the" points at something of the conversation: a reaction, not a standing taste.
        ("I like the mountains and the idea of living there.", "semantic", None),
        ("I like the clean lines and the fact that it has ball-bearing glides.", "semantic", None),
        ("I really like the Garden Party theme, it sounds so elegant.", "semantic", None),
        ("I like hiking in the mountains.", "preference", None),
        ("I like the plan.", "semantic", None),
        ("I like the sample workout routine you provided, but slower.", "semantic", None),
        ("I like how you mentioned the print I won.", "semantic", None),
        ("I like the fact that it charges two devices.", "semantic", None),
        ("I like it.", "semantic", None),
        ("I'd like a pump that's durable and reliable.", "semantic", None),
        ("I'd like that!", "semantic", None),
        ("I like some of those ideas.", "semantic", None),
        # How to answer from now on is a preference; a piece of work asked for now is no memory at all.
        ("Please write in English language.", "preference", "language"),
        ("Please use metric units.", "preference", None),
        ("Please keep it short.", "preference", None),
    ],
)
def test_user_statements(text: str, ctype: str, subject: str | None) -> None:
    cands = extract_one(text)
    assert len(cands) == 1, cands
    c = cands[0]
    assert c.type == ctype
    assert c.authority == "USER_STATED"
    assert c.source_message_ids == ["m1"]
    assert c.content == text.strip()
    assert c.confidence >= 0.7
    assert c.confidence == (0.9 if ctype == "preference" else 0.8)
    if subject is not None:
        assert c.subject == subject
    assert c.subject and c.subject == derive_subject(text.strip(), ctype)  # one rule, shared with AddMemory


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("以后默认查测试环境", "以后默认查生产环境"),
        ("I prefer concise answers", "I prefer detailed answers"),
        ("请用中文回复", "Please always answer in English."),
        ("Our prod cluster is eks-1", "我们的生产集群是 ack-2"),
        ("I like vim", "I prefer emacs"),
    ],
)
def test_conflicting_statements_share_a_subject(a: str, b: str) -> None:
    (ca,), (cb,) = extract_one(a), extract_one(b)
    assert ca.subject == cb.subject


@pytest.mark.parametrize(
    ("text", "kind", "subject"),
    [
        ("default env is staging", "preference", "default_env"),
        ("我改主意了，默认看测试环境", "preference", "default_env"),
        ("默认环境是测试环境", "preference", "default_env"),
        ("My manager is Bob", "semantic", "manager"),
        ("我的经理是李四", "semantic", "经理"),
        ("I live in Boston", "semantic", "location"),
        ("I moved to Denver.", "semantic", "location"),
        ("I'm now based in Berlin", "habit", "location"),
        ("我住在北京", "semantic", "location"),
        ("我搬到深圳了", "semantic", "location"),
        ("I moved to AWS last year", "semantic", "cloud"),  # a known topic before the place
        ("I lived in Boston", "semantic", ""),  # history, not where the user is now
        ("I like tea", "preference", "tea"),
        ("I like hiking", "preference", "hiking"),
        ("我喜欢爬山", "preference", "爬山"),
        ("I'm responsible for prod", "semantic", "owns:prod"),
        ("Owns the production billing cache", "semantic", "owns:prod_billing_cache"),
        ("Works on payment api retries", "semantic", ""),  # no cue: no key from leading words
        ("payment-api went down, fixed by rollback", "episode", ""),  # events never supersede
    ],
)
def test_derive_subject(text: str, kind: str, subject: str) -> None:
    assert derive_subject(text, kind) == subject


def test_weak_cues_get_low_confidence() -> None:
    for text in ["Maybe I'd like shorter answers.", "我可能喜欢用英文", "I think I prefer dark mode"]:
        (c,) = extract_one(text)
        assert c.confidence < 0.7, text


@pytest.mark.parametrize(
    "text",
    ["What editor do I prefer?", "ok thanks", "好的", "The build is green.", "以后呢？", "Do you like vim?",
     # "every morning" of someone else (a pasted story or article) is not the user's habit
     "The shop opens every morning at 9.", "Duulo woke up every night and many came to him for advice.",
     "Please write an email to the retired members.", "Please respond as the user.",
     "Please keep in mind the following as you rewrite the section.", "Please keep track of it as well.",
     "Can you please use the above data model for the campaign.", "Please write the key words above the table.",
     # a comparison, or a title in quotes, says nothing the user likes or is called
     "I'll try both apps and see which one I like best.", "I went to bed at 11:45, which is later than I'd like.",
     'Wow, I had no idea "My Name Is" had so many references.'],
)
def test_no_candidates(text: str) -> None:
    assert extract_one(text) == []


def test_assistant_and_system_preferences_are_ignored() -> None:
    assert extract_one("I prefer concise answers.", role="assistant") == []
    assert extract_one("From now on use staging.", role="system") == []


def test_episode_across_turns() -> None:
    turns = [
        Turn("t1", "user", "We had an outage on payment-api in prod this morning."),
        Turn("t2", "assistant", "Looking into it."),
        Turn("t3", "tool", "root cause: connection pool exhausted after config push"),
    ]
    eps = [c for c in RuleBasedExtractor().extract(turns) if c.type == "episode"]
    assert len(eps) == 1
    ep = eps[0]
    assert ep.source_message_ids == ["t1", "t3"]
    assert ep.authority == "TOOL_VERIFIED"
    assert ep.confidence == pytest.approx(0.75)
    assert ep.subject == "incident:prod"
    assert "outage" in ep.content and "connection pool" in ep.content


def test_chinese_episode() -> None:
    turns = [
        Turn("c1", "user", "昨晚 order-service 告警了"),
        Turn("c2", "assistant", "根因是数据库连接池耗尽，已修复。"),
    ]
    (ep,) = RuleBasedExtractor().extract(turns)
    assert ep.type == "episode" and ep.source_message_ids == ["c1", "c2"]
    assert ep.subject == "incident:order-service" and ep.authority == "INFERRED"


def test_secrets_are_left_for_the_filter() -> None:
    (c,) = extract_one("From now on use password: hunter2 for staging.")
    assert "hunter2" in c.content  # the filter stage rejects it with reason "secret"


def _synthetic_turns(n: int) -> list[Turn]:
    rnd = random.Random(0)
    texts = [
        "Can you check the payment-api logs in prod?",
        "I prefer concise answers.",
        "以后默认查测试环境",
        "The deploy of order-service finished at 10:05 with 3 replicas.",
        "好的，谢谢",
        "Looks like the p99 latency went up after the last release.",
        "我们的生产集群是 ack-prod",
        "Root cause was a bad config push to payment-api.",
        "Please restart nothing, just look.",
        "grep ERROR /var/log/app.log | tail -n 50",
    ]
    roles = ["user", "assistant", "tool"]
    return [Turn(f"m{i}", roles[i % 3], rnd.choice(texts)) for i in range(n)]  # type: ignore[arg-type]


def test_throughput() -> None:
    turns = _synthetic_turns(3000)
    extractor: Extractor = RuleBasedExtractor()
    t0 = time.perf_counter()
    extractor.extract(turns)
    rate = len(turns) / (time.perf_counter() - t0)
    print(f"RuleBasedExtractor: {rate:,.0f} turns/s")
    assert rate >= 300


def test_interests_never_share_a_subject() -> None:
    texts = ["I like the treasure hunt idea.", "I like the gift basket idea.", "I'd like to know more about X.",
             "I'd like to know more about Y.", "I like the idea of a road trip.", "I'd like you to book it."]
    subjects = [c.subject for t in texts for c in extract_one(t)]
    assert len(subjects) == len(texts) and len(set(subjects)) == len(texts)
    assert all(s.startswith("interest:") for s in subjects)
