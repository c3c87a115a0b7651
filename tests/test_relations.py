"""extract_relations: English and Chinese service facts, lists, coordination, passives, and the
sentences that must yield nothing (negation, naming, pronouns, non-entities); recall and precision
over a set of architecture sentences (tests/data/relation_sentences.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.knowledge.relations import RELATIONS, Relation, extract_relations

SENTENCES = Path(__file__).parent / "data" / "relation_sentences.json"


def triples(text: str) -> list[tuple[str, str, str]]:
    return [(r.subject, r.relation, r.object) for r in extract_relations(text)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("payment-api depends on payment-db.", [("payment-api", "depends_on", "payment-db")]),
        ("Checkout-Web calls Payment-API", [("checkout-web", "calls", "payment-api")]),
        ("order_service uses redis-cache for sessions.", [("order_service", "uses", "redis-cache")]),
        ("report-job reads from warehouse.events", [("report-job", "reads_from", "warehouse.events")]),
        ("audit-svc writes to s3://audit-bucket.", [("audit-svc", "writes_to", "s3://audit-bucket")]),
        ("session-store is backed by redis-cache.", [("session-store", "backed_by", "redis-cache")]),
        ("gateway connects to auth-svc:8443 over mTLS.", [("gateway", "connects_to", "auth-svc:8443")]),
        ("The checkout service also calls fraud-svc.", [("checkout", "calls", "fraud-svc")]),
        ("payment-api relies on the ledger database.", [("payment-api", "depends_on", "ledger")]),
        ("payment-db is used by billing.", [("billing", "uses", "payment-db")]),
        ("payment-api 依赖 payment-db。", [("payment-api", "depends_on", "payment-db")]),
        ("payment-api依赖于payment-db", [("payment-api", "depends_on", "payment-db")]),
        ("checkout-web 调用 payment-api", [("checkout-web", "calls", "payment-api")]),
        ("order_service 使用 kafka 发送事件。", [("order_service", "uses", "kafka")]),
        ("report-job 读取 warehouse", [("report-job", "reads_from", "warehouse")]),
        ("audit-svc 写入 audit-log。", [("audit-svc", "writes_to", "audit-log")]),
        ("payment-api 服务也依赖 redis-cache", [("payment-api", "depends_on", "redis-cache")]),
    ],
)
def test_single_facts(text: str, expected: list[tuple[str, str, str]]) -> None:
    assert triples(text) == expected


@pytest.mark.parametrize(
    ("text", "objects"),
    [
        ("payment-api depends on payment-db and redis-cache.", ["payment-db", "redis-cache"]),
        ("payment-api depends on payment-db, redis-cache and kafka.", ["payment-db", "redis-cache", "kafka"]),
        (
            "payment-api depends on payment-db, redis-cache, and kafka.",
            ["payment-db", "redis-cache", "kafka"],
        ),
        ("payment-api 依赖 payment-db、redis-cache 和 kafka。", ["payment-db", "redis-cache", "kafka"]),
        ("payment-api依赖payment-db，redis-cache及kafka", ["payment-db", "redis-cache", "kafka"]),
    ],
)
def test_lists_give_one_relation_per_object(text: str, objects: list[str]) -> None:
    assert triples(text) == [("payment-api", "depends_on", o) for o in objects]


def test_coordinated_clauses_share_or_change_the_subject() -> None:
    assert triples("payment-api reads from payment-db and writes to audit-log.") == [
        ("payment-api", "reads_from", "payment-db"),
        ("payment-api", "writes_to", "audit-log"),
    ]
    assert triples("payment-api 依赖 redis-cache，并且调用 risk-engine。") == [
        ("payment-api", "depends_on", "redis-cache"),
        ("payment-api", "calls", "risk-engine"),
    ]
    # An item followed by its own verb is the next clause's subject, not another object.
    assert triples("payment-api depends on payment-db and fraud-svc calls payment-api.") == [
        ("payment-api", "depends_on", "payment-db"),
        ("fraud-svc", "calls", "payment-api"),
    ]


@pytest.mark.parametrize(
    "text",
    [
        "payment-api does not depend on redis-cache.",
        "payment-api doesn't call legacy-api.",
        "payment-api no longer uses memcached.",
        "payment-api never writes to audit-log.",
        "Neither billing nor checkout-web calls legacy-api.",
        "payment-api 不依赖 mysql。",
        "payment-api 没有调用 legacy-api",
        "payment-api 不再使用 memcached。",
        "The service is called payment-api.",  # naming, not a call
        "payment-api used to call legacy-api.",  # habit in the past, and "used to" is not "uses"
        "It calls payment-api every minute.",  # pronoun subject
        "payment-api calls per second doubled.",  # "per" is not an entity
        "payment-api uses 3 replicas.",  # numbers are not entities
        "支付服务依赖数据库。",  # no service-like tokens
        "Dependencies: payment-db, redis-cache.",  # no verb
    ],
)
def test_negated_and_non_facts_yield_nothing(text: str) -> None:
    assert triples(text) == []


def test_negation_only_drops_its_own_sentence() -> None:
    text = "payment-api does not depend on redis-cache. payment-api depends on payment-db."
    assert triples(text) == [("payment-api", "depends_on", "payment-db")]


def test_relations_are_normalised_deduplicated_and_keep_their_sentence() -> None:
    text = "Payment-API calls Fraud-Svc. Later, payment-api calls fraud-svc again. fraud-svc calls fraud-svc."
    assert extract_relations(text) == [
        Relation("payment-api", "calls", "fraud-svc", "Payment-API calls Fraud-Svc."),
    ]
    text = "payment-api depends on payment-db.\ncheckout-web 调用 payment-api。"
    assert {r.relation for r in extract_relations(text)} <= set(RELATIONS)
    assert [r.sentence for r in extract_relations(text)] == [
        "payment-api depends on payment-db.",
        "checkout-web 调用 payment-api。",
    ]


def test_entity_boundaries() -> None:
    # Trailing sentence punctuation is not part of the entity; URLs and ports are.
    assert triples("worker connects to redis://cache-01:6379/0.") == [
        ("worker", "connects_to", "redis://cache-01:6379/0")
    ]
    # A verb inside a hyphenated name is not a verb.
    assert triples("uses-api-gateway calls auth-svc") == [("uses-api-gateway", "calls", "auth-svc")]


@pytest.mark.parametrize(
    "text",
    [
        "redis-cluster is deployed on vm-pool-3.",
        "redis-cluster runs on vm-pool-3.",
        "vm-pool-3 hosts redis-cluster.",
        "redis-cluster 部署在 vm-pool-3 上。",
        "vm-pool-3 上运行着 redis-cluster。",
        "redis-cluster 在 vm-pool-3 上运行。",
    ],
)
def test_placement_points_from_the_workload_to_where_it_runs(text: str) -> None:
    # Whatever the voice, the edge goes workload -> infrastructure, like depends_on goes dependent ->
    # dependency: walking edges backwards from vm-pool-3 is what breaks if it goes down.
    [(subject, relation, obj)] = triples(text)
    assert (subject, obj) == ("redis-cluster", "vm-pool-3")
    assert relation in {"deployed_on", "runs_on", "hosted_on"}


def test_ownership_points_from_the_service_to_its_owner() -> None:
    for text in ("team-cache owns redis-cluster.", "redis-cluster is owned by team-cache.",
                 "redis-cluster 由 team-cache 负责。", "redis-cluster 归 team-cache 所有。"):
        assert triples(text) == [("redis-cluster", "owned_by", "team-cache")], text


def test_architecture_sentences_recall_and_precision() -> None:
    """Edge-level recall and precision over ops engineers' sentences, English and Chinese, with
    negatives that must yield nothing. Batch 1 was written first and the rules were then fitted to it;
    batches 2 and 3 were each written after that (as first measured: recall 0.885 and precision 0.92
    on batch 2, 0.82 and 0.90 on batch 3), then the general misses they showed were fixed too. So the
    figures asserted here are on fitted data: expect unseen text to score nearer the first measures."""
    cases = json.loads(SENTENCES.read_text(encoding="utf-8"))
    assert len(cases) >= 50 and any(not c["edges"] for c in cases)
    hits = extracted = expected = 0
    wrong: list[tuple[str, list, list]] = []
    for case in cases:
        want = {tuple(edge) for edge in case["edges"]}
        got = set(triples(case["text"]))
        assert {relation for _, relation, _ in want} <= set(RELATIONS), case
        hits += len(want & got)
        extracted += len(got)
        expected += len(want)
        if got != want:
            wrong.append((case["text"], sorted(got - want), sorted(want - got)))
    recall, precision = hits / expected, hits / extracted
    assert recall >= 0.9 and precision >= 0.95, (f"recall {recall:.3f} precision {precision:.3f}", wrong)
