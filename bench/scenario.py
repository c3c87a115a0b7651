"""The assembly bench's scenario: one session of 200 realistic English/Chinese messages, 10
confirmed facts, 20 tool results and 500 extra candidates standing in for memories/knowledge."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np

import fastpath
from sidecar.assembly.candidates import BuildInput, CandidateBatch, Section, SoftCategory
from sidecar.text import term_ids, terms
from sidecar.tokens import count_many

SERVICES = ["payment-api", "order-service", "checkout-web", "ledger-db", "auth-gateway", "inventory-svc"]
ENVS = ["production", "staging", "生产环境", "测试环境"]
EN = ["error rate", "p99 latency", "rollback", "deploy", "5xx spike", "connection pool", "timeout", "retry storm",
      "canary", "config change", "CPU throttling", "GC pause", "disk pressure", "DNS", "TLS handshake"]
ZH = ["错误率", "延迟", "回滚", "发布", "连接池", "超时", "重试", "告警", "扩容", "配置变更", "日志", "排查"]


def _sentence(rng: random.Random, words: int) -> str:
    if rng.random() < 0.35:
        return "，".join(rng.choice(ZH) + rng.choice(["升高", "正常", "异常", "需要确认"]) for _ in range(max(words // 4, 1)))
    svc, env = rng.choice(SERVICES), rng.choice(ENVS)
    parts = [f"{svc} in {env}"] + [rng.choice(EN) for _ in range(words)]
    return " ".join(parts) + "."


def messages(rng: random.Random, n: int = 200) -> list[tuple[str, str]]:
    out = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        words = rng.randint(4, 25) if role == "user" else rng.randint(15, 90)
        out.append((role, _sentence(rng, words)))
    return out


def facts() -> list[tuple[str, str]]:
    return [("env", "production"), ("service", "payment-api"), ("time_window", "last 30 minutes"),
            ("region", "eu-west-1"), ("cluster", "k8s-prod-3"), ("namespace", "payments"),
            ("hypothesis", "connection pool exhausted after deploy 4812"), ("next_step", "compare pool metrics"),
            ("owner", "team-payments"), ("incident", "INC-20931")]


def _batch(category: SoftCategory, section: Section, texts: list[str], rng: random.Random, prefix: str
           ) -> CandidateBatch:
    b = CandidateBatch(category=category, section=section, texts=texts)
    b.sources = [f"{prefix}:{i}" for i in range(len(texts))]
    b.tokens = [t + 1 for t in count_many(texts)]
    b.relevance = [rng.random() for _ in texts]
    b.age_s = [rng.uniform(0, 30 * 86400) for _ in texts]
    b.priority = [0.2] * len(texts)
    b.exact_keys, b.simhashes = fastpath.text_keys(texts)
    # Like the real memory and knowledge sources, attach what was computed at index time.
    b.vectors = fastpath.hash_embed(texts, 256)
    b.term_ids = [term_ids(terms(t)) for t in texts]
    b.bodies = [fastpath.encode_item(s, category.wire, n, t, 0, 0, ()) for s, n, t in zip(b.sources, b.tokens, texts,
                                                                                         strict=True)]
    return b


class SyntheticSource:
    """20 tool results, 250 memories, 250 knowledge chunks with fixed random relevance."""

    name = "synthetic"

    def __init__(self, seed: int = 7) -> None:
        rng = random.Random(seed)
        tools = ["\n".join(f"2026-12-01T10:{m:02d}:00Z {rng.choice(['INFO', 'WARN', 'ERROR'])} "
                           f"{_sentence(rng, 8)}" for m in range(rng.randint(5, 25))) for _ in range(20)]
        memories = [_sentence(rng, rng.randint(5, 30)) for _ in range(250)]
        chunks = [" ".join(_sentence(rng, 20) for _ in range(rng.randint(2, 8))) for _ in range(250)]
        self.batches = [
            _batch(SoftCategory.TOOL_OBSERVATIONS, Section.TOOL_OBSERVATIONS, tools, rng, "tool"),
            _batch(SoftCategory.MEMORIES, Section.MEMORIES, memories, rng, "memory"),
            _batch(SoftCategory.RAG_OR_GRAPH, Section.KNOWLEDGE, chunks, rng, "kb"),
        ]

    def candidates(self, inp: BuildInput) -> list[CandidateBatch]:
        # Fresh batch objects each call, as a real source returns: resolvers take candidates out of
        # the batches they are given (the lists and sets inside are replaced, never changed in place).
        return [replace(b, dropped=[]) for b in self.batches]

    @property
    def texts(self) -> list[str]:
        return [t for b in self.batches for t in b.texts]


def feature_arrays(batches: list[CandidateBatch]) -> dict[str, np.ndarray]:
    """The arrays fastpath.select takes, for timing it apart from the service."""
    batches = [b for b in batches if len(b)]
    return {
        "relevance": np.array([r for b in batches for r in b.relevance], np.float64),
        "age_s": np.array([a for b in batches for a in b.age_s], np.float64),
        "priority": np.array([p for b in batches for p in b.priority], np.float64),
        "tokens": np.array([t for b in batches for t in b.tokens], np.int32),
        "category": np.array([int(b.category) for b in batches for _ in b.texts], np.int32),
        "exact_key": np.concatenate([b.exact_keys for b in batches]),
        "simhash": np.concatenate([b.simhashes for b in batches]),
    }
