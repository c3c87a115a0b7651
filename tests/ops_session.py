"""A synthetic long ops investigation (English and Chinese) with prohibitions scattered in it."""

from __future__ import annotations

import random

SERVICES = ["payment-api", "order-service", "ledger-db", "checkout-web", "auth-gateway"]
ENVS = ["production", "staging", "生产环境", "预发环境"]
PROHIBITIONS = [
    "Do not restart the production instance of payment-api.",
    "Never run database migrations on ledger-db during business hours.",
    "You must not delete any pods in the payments namespace.",
    "Don't change the connection pool size without asking me first.",
    "Only use read-only commands on production.",
    "不要重启生产环境的 order-service 实例。",
    "禁止在工作时间修改 ledger-db 的配置。",
    "别动 checkout-web 的发布流水线。",
    "不能直接在生产环境执行 SQL 更新。",
    "必须先在预发环境验证回滚方案。",
]
FILLER_EN = ["error rate is up again", "p99 latency looks stable", "checking the dashboards now",
             "the canary is at 10 percent", "logs show connection resets", "I see 502s at the load balancer"]
FILLER_ZH = ["错误率又上升了", "延迟看起来稳定", "正在看监控", "日志里有连接重置", "网关返回 502"]


def ops_turns(n: int = 500, seed: int = 11) -> tuple[list[tuple[str, str]], dict[int, str]]:
    """(role, text) turns and {turn index: prohibition} for the prohibitions placed in user turns."""
    rng = random.Random(seed)
    slots = sorted(rng.sample(range(0, n, 2), len(PROHIBITIONS)))
    placed = dict(zip(slots, PROHIBITIONS, strict=True))
    turns = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        svc, env = rng.choice(SERVICES), rng.choice(ENVS)
        if i in placed:
            text = placed[i]
        elif rng.random() < 0.4:
            text = f"{env} 的 {svc} {rng.choice(FILLER_ZH)}，第 {i} 轮"
        else:
            text = f"In {env}, {svc}: {rng.choice(FILLER_EN)} (turn {i})."
        if i % 97 == 13:
            text += " Root cause confirmed: connection pool exhausted after deploy 4812."
        turns.append((role, text))
    return turns, placed
