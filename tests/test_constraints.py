import pytest

from sidecar.compress.constraints import detect_constraints

EN_POSITIVES = [
    "Don't restart the payment-api pods.",
    "Do not touch prod!",
    "Never run migrations on Friday.",
    "You must not delete the namespace.",
    "You mustn't scale below 3 replicas.",
    "You must use kubectl get for everything.",
    "Only use read-only commands.",
    "Always ask before rolling back.",
    "No restarts of order-service.",
    "Check the logs, but never restart anything.",
    "Please only query staging.",
    "Staging only.",
    "I don't want you to page anyone.",
    "Under no circumstances drop tables.",
    "dont push to main",
    "Don\u2019t scale the cluster down.",
]
CN_POSITIVES = [
    "不要重启支付服务。",
    "禁止在生产环境执行写操作！",
    "别删日志",
    "不能修改配置",
    "不许重启数据库",
    "只能用只读命令",
    "必须先备份数据库",
    "不准动生产库",
    "务必在变更前通知我",
    "千万别 rollback",
    "查一下日志，但是别重启",
    "严禁直接连主库",
    "你不得修改密钥配置",
]
NEGATIVES = [
    "Why don't we restart it?",
    "为什么不能重启？",
    "I don't know what happened.",
    "Never mind.",
    "别人已经修好了",
    "不要紧",
    "这个是必须的吗",
    "It must be DNS.",
    "The read-only replica is lagging.",
    "Only 3 errors so far.",
    "I always use vim",
    "I've never seen this error",
    "特别注意一下内存",
    "能不能重启一下",
    "我不能确定是不是网络问题",
    "说不准是哪个服务",
    "No problem.",
    "No, that's wrong",
    "Don't worry about it.",
    "可不可以先看看日志",
    "数据不准确",
    "要不要重启",
    "Can you restart it, please",
    "The deploy finished at 10:05.",
]


@pytest.mark.parametrize("text", EN_POSITIVES + CN_POSITIVES)
def test_positive_single_sentence_is_returned_verbatim(text: str) -> None:
    assert detect_constraints(text) == [text.strip()]


@pytest.mark.parametrize("text", NEGATIVES)
def test_negative(text: str) -> None:
    assert detect_constraints(text) == []


def test_counts_meet_the_brief() -> None:
    assert len(EN_POSITIVES) >= 10 and len(CN_POSITIVES) >= 10 and len(NEGATIVES) >= 10


def test_multi_sentence_message_keeps_order_and_exact_substrings() -> None:
    msg = (
        "Hi! Please look at the payment-api errors in prod. Don't restart anything; only use kubectl get.\n"
        "Why don't we check staging? 另外，不要动生产库。为什么不能重启？必须先通知 oncall！"
    )
    got = detect_constraints(msg)
    assert got == [
        "Don't restart anything;",
        "only use kubectl get.",
        "另外，不要动生产库。",
        "必须先通知 oncall！",
    ]
    for c in got:
        assert c in msg and c == c.strip()


def test_duplicates_are_returned_once() -> None:
    assert detect_constraints("Never touch prod.\nNever touch prod.") == ["Never touch prod."]


def test_secret_inside_constraint_is_redacted() -> None:
    got = detect_constraints("Never log the password: hunter2 anywhere. 不要泄露密码是abc123的账号")
    assert got == [
        "Never log the password: [REDACTED:password] anywhere.",
        "不要泄露密码是[REDACTED:password]的账号",
    ]
    assert all("hunter2" not in c and "abc123" not in c for c in got)


def test_empty_and_whitespace() -> None:
    assert detect_constraints("") == []
    assert detect_constraints("   \n\n ") == []


def test_decimal_points_do_not_split_sentences() -> None:
    assert detect_constraints("Don't upgrade past v1.2.3 on payment-api.prod please.") == [
        "Don't upgrade past v1.2.3 on payment-api.prod please."
    ]
