import pytest

from sidecar.compress.constraints import constraint_key, detect_constraints

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


# A permission to do an operation is pinned as its own constraint (it lifts an earlier prohibition).
PERMISSIONS = [
    "you may restart staging now",
    "You can now deploy payment-api.",
    "Go ahead and roll back checkout-web.",
    "It's ok to delete the old pods now.",
    "Feel free to scale order-service down.",
    "现在可以重启测试环境了",
    "你可以直接回滚 checkout-web 了。",
    "允许扩容 order-service",
]
NOT_PERMISSIONS = [
    "you may not restart prod",
    "You could restart it later",
    "you can see the error in the logs",
    "我们可以先重启看看",
    "你可以看看日志",
    "可以重启吗",
    "I can restart it myself",
]


@pytest.mark.parametrize("text", PERMISSIONS)
def test_permission_is_pinned_verbatim(text: str) -> None:
    assert detect_constraints(text) == [text]


@pytest.mark.parametrize("text", NOT_PERMISSIONS)
def test_not_a_permission(text: str) -> None:
    assert detect_constraints(text) == []


def test_a_permission_after_a_prohibition_keeps_both_in_order() -> None:
    msg = "不要重启生产实例。现在可以重启测试环境了。"
    assert detect_constraints(msg) == ["不要重启生产实例。", "现在可以重启测试环境了。"]


@pytest.mark.parametrize("a, b", [
    ("Please, DON'T restart prod!", "do not restart prod"),
    ("Never restart prod", "Again: never restart the prod."),
    ("You can't touch ledger-db.", "you cannot touch ledger-db"),
    ("不要重启生产实例。", "再说一遍：千万不要重启生产实例了！"),
    ("请务必先备份数据库", "务必先备份数据库。"),
])
def test_same_rule_said_again_has_one_key(a: str, b: str) -> None:
    assert constraint_key(a) == constraint_key(b)


@pytest.mark.parametrize("a, b", [
    ("You must restart the pods before the deploy.", "You must not restart the pods before the deploy."),
    ("Do not restart prod.", "Do not restart staging."),
    ("Only restart staging.", "Restart staging."),
    ("Never copy prod to staging.", "Never copy staging to prod."),
    ("不一定要先备份", "不要先备份"),  # 一定 is emphasis only without 不 before it
    ("必须先备份数据库再重启", "必须先重启再备份数据库"),
])
def test_different_rules_have_different_keys(a: str, b: str) -> None:
    assert constraint_key(a) != constraint_key(b)
