"""EdgeIndex traversal: chains in both directions, cycles, filters, validity windows, incremental
updates, neighbourhood bounds, and (hypothesis) agreement with a brute-force path enumeration; and
"what breaks if vm-pool-3 goes down" over edges extracted from a document, in process and through the
real server (QueryGraph, BuildContext's graph facts)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.api import context_service_pb2 as pb
from sidecar.knowledge.graph import EdgeIndex, Path, is_valid_at, render_path
from sidecar.knowledge.relations import IMPACT_RELATIONS, extract_relations

NOW = 1_700_000_000_000


@dataclass(frozen=True)
class E:
    edge_id: str
    subject: str
    relation: str
    object: str
    valid_from_ms: int = 0
    valid_to_ms: int = 0
    source: str = "test"


CHAIN = [
    E("e1", "checkout-web", "calls", "payment-api"),
    E("e2", "payment-api", "depends_on", "payment-db"),
    E("e3", "payment-db", "backed_by", "ebs-volume"),
    E("e4", "mobile-app", "calls", "payment-api"),
]


def rendered(paths: list[Path]) -> list[str]:
    return [render_path(p) for p in paths]


def test_three_hop_chain_out() -> None:
    index = EdgeIndex(CHAIN)
    assert rendered(index.paths("checkout-web", max_hops=3, at_ms=NOW)) == [
        "checkout-web --calls--> payment-api",
        "checkout-web --calls--> payment-api --depends_on--> payment-db",
        "checkout-web --calls--> payment-api --depends_on--> payment-db --backed_by--> ebs-volume",
    ]
    path = index.paths("checkout-web", max_hops=3, at_ms=NOW)[-1]
    assert path.entities == ["checkout-web", "payment-api", "payment-db", "ebs-volume"]
    assert [e.edge_id for e in path.edges] == ["e1", "e2", "e3"]
    assert rendered(index.paths("checkout-web", max_hops=1, at_ms=NOW)) == [
        "checkout-web --calls--> payment-api"
    ]


def test_impact_walks_in_direction() -> None:
    # What breaks if ebs-volume is down? Everything that (transitively) points at it.
    index = EdgeIndex(CHAIN)
    paths = index.paths("ebs-volume", max_hops=3, direction="in", at_ms=NOW)
    assert [p.entities for p in paths] == [
        ["ebs-volume", "payment-db"],
        ["ebs-volume", "payment-db", "payment-api"],
        ["ebs-volume", "payment-db", "payment-api", "checkout-web"],
        ["ebs-volume", "payment-db", "payment-api", "mobile-app"],
    ]
    assert render_path(paths[2]) == (
        "ebs-volume <--backed_by-- payment-db <--depends_on-- payment-api <--calls-- checkout-web"
    )
    assert index.paths("checkout-web", max_hops=3, direction="in", at_ms=NOW) == []


def test_both_directions_mix_steps() -> None:
    index = EdgeIndex(CHAIN)
    assert rendered(index.paths("checkout-web", max_hops=2, direction="both", at_ms=NOW)) == [
        "checkout-web --calls--> payment-api",
        "checkout-web --calls--> payment-api <--calls-- mobile-app",
        "checkout-web --calls--> payment-api --depends_on--> payment-db",
    ]


def test_cycle_does_not_loop() -> None:
    index = EdgeIndex(
        [
            E("a", "svc-a", "calls", "svc-b"),
            E("b", "svc-b", "calls", "svc-c"),
            E("c", "svc-c", "calls", "svc-a"),
        ]
    )
    for direction in ("out", "in", "both"):
        for path in index.paths("svc-a", max_hops=3, direction=direction, at_ms=NOW):
            assert len(set(path.entities)) == len(path.entities)
    assert [p.entities for p in index.paths("svc-a", max_hops=3, at_ms=NOW)] == [
        ["svc-a", "svc-b"],
        ["svc-a", "svc-b", "svc-c"],
    ]
    # A self-loop is never a path either.
    assert EdgeIndex([E("s", "svc-a", "calls", "svc-a")]).paths("svc-a", direction="both", at_ms=NOW) == []


def test_relation_filter() -> None:
    index = EdgeIndex(CHAIN)
    assert rendered(
        index.paths("payment-api", relations={"depends_on", "backed_by"}, max_hops=3, at_ms=NOW)
    ) == [
        "payment-api --depends_on--> payment-db",
        "payment-api --depends_on--> payment-db --backed_by--> ebs-volume",
    ]
    assert index.paths("payment-api", relations={"calls"}, at_ms=NOW) == []
    assert len(index.paths("payment-api", relations={"calls"}, direction="in", at_ms=NOW)) == 2


def test_validity_window() -> None:
    retired = E("old", "payment-api", "depends_on", "mysql", valid_from_ms=100, valid_to_ms=200)
    future = E("new", "payment-api", "depends_on", "postgres", valid_from_ms=200)
    index = EdgeIndex([retired, future])
    assert not is_valid_at(retired, 99) and is_valid_at(retired, 100) and is_valid_at(retired, 199)
    assert not is_valid_at(retired, 200), "valid_to_ms is exclusive"
    assert [p.entities[-1] for p in index.paths("payment-api", at_ms=150)] == ["mysql"]
    assert [p.entities[-1] for p in index.paths("payment-api", at_ms=200)] == ["postgres"]
    assert index.paths("payment-api", at_ms=50) == []


def test_incremental_add_replace_remove() -> None:
    index = EdgeIndex()
    index.add(E("x", "svc-a", "calls", "svc-b"))
    index.add(E("y", "svc-b", "calls", "svc-c"))
    assert len(index) == 2 and "x" in index
    index.add(E("x", "svc-a", "uses", "svc-d"))  # same id replaces, old adjacency gone
    assert rendered(index.paths("svc-a", at_ms=NOW)) == ["svc-a --uses--> svc-d"]
    assert index.paths("svc-b", direction="in", at_ms=NOW) == []
    assert index.remove("y") and not index.remove("y")
    assert index.paths("svc-b", at_ms=NOW) == [] and len(index) == 1
    assert index.get("x").object == "svc-d"


def test_parallel_edges_are_separate_paths_in_a_stable_order() -> None:
    index = EdgeIndex([E("2", "svc-a", "uses", "svc-b"), E("1", "svc-a", "calls", "svc-b")])
    assert rendered(index.paths("svc-a", at_ms=NOW)) == ["svc-a --calls--> svc-b", "svc-a --uses--> svc-b"]


def test_arguments_are_checked() -> None:
    index = EdgeIndex(CHAIN)
    for hops in (0, 4):
        with pytest.raises(ValueError):
            index.paths("payment-api", max_hops=hops, at_ms=NOW)
    with pytest.raises(ValueError):
        index.paths("payment-api", direction="sideways", at_ms=NOW)  # type: ignore[arg-type]


def star(n: int) -> list[E]:
    edges = [E(f"in{i}", f"client-{i:03}", "calls", "hub") for i in range(n)]
    return edges + [E(f"out{i}", "hub", "depends_on", f"dep-{i:03}") for i in range(n)]


def test_limit_keeps_the_shortest_paths() -> None:
    index = EdgeIndex(star(40))
    paths = index.paths("hub", max_hops=3, direction="both", at_ms=NOW, limit=50)
    assert len(paths) == 50
    assert [p.hops for p in paths] == [1] * 50
    assert paths == index.paths("hub", max_hops=3, direction="both", at_ms=NOW)[:50]


def test_neighbourhood_is_bounded_deduplicated_and_shortest_first() -> None:
    index = EdgeIndex(CHAIN + star(30))
    paths = index.neighbourhood(
        ["payment-api", "payment-db", "payment-api", "unknown"], max_hops=2, limit=6, at_ms=NOW
    )
    assert len(paths) == 6
    assert [p.hops for p in paths] == sorted(p.hops for p in paths)
    # payment-api's direct edges come first, then payment-db's new ones; e2 (between the two seeds)
    # is reported once although both seeds reach it.
    assert rendered(paths[:4]) == [
        "payment-api <--calls-- checkout-web",
        "payment-api <--calls-- mobile-app",
        "payment-api --depends_on--> payment-db",
        "payment-db --backed_by--> ebs-volume",
    ]
    edge_sets = [frozenset(e.edge_id for e in p.edges) for p in paths]
    assert len(edge_sets) == len(set(edge_sets))
    # Unbounded, the two seeds have 7 distinct paths: 4 from payment-api, 3 more from payment-db.
    assert len(index.neighbourhood(["payment-api", "payment-db"], limit=50, at_ms=NOW)) == 7
    assert len(index.neighbourhood(["hub"], max_hops=2, limit=50, at_ms=NOW)) == 50
    assert index.neighbourhood(["nobody"], at_ms=NOW) == []


ENTITIES = ["a", "b", "c", "d", "e"]
EDGES = st.lists(
    st.tuples(
        st.sampled_from(ENTITIES),
        st.sampled_from(["calls", "uses"]),
        st.sampled_from(ENTITIES),
        st.sampled_from([0, 100]),
        st.sampled_from([0, 150, 300]),
    ),
    max_size=12,
)


def brute_force(edges: list[E], start: str, relations, max_hops: int, direction: str, at_ms: int) -> set:
    """Every edge sequence that forms a simple walk from start, by exhaustive enumeration."""
    usable = [e for e in edges if (relations is None or e.relation in relations) and is_valid_at(e, at_ms)]
    found = set()
    for hops in range(1, max_hops + 1):
        for seq in itertools.product(usable, repeat=hops):
            walk = [start]
            for edge in seq:
                here = walk[-1]
                if direction != "in" and edge.subject == here:
                    walk.append(edge.object)
                elif direction != "out" and edge.object == here:
                    walk.append(edge.subject)
                else:
                    break
            if len(walk) == hops + 1 and len(set(walk)) == len(walk):
                found.add((tuple(walk), tuple(e.edge_id for e in seq)))
    return found


@settings(max_examples=150, deadline=None)
@given(
    raw=EDGES,
    start=st.sampled_from(ENTITIES),
    relations=st.sampled_from([None, {"calls"}, {"uses"}]),
    max_hops=st.integers(1, 3),
    direction=st.sampled_from(["out", "in", "both"]),
    at_ms=st.sampled_from([50, 120, 200, 400]),
)
def test_paths_are_simple_connected_bounded_and_complete(
    raw, start, relations, max_hops, direction, at_ms
) -> None:
    edges = [E(f"e{i}", s, r, o, f, t) for i, (s, r, o, f, t) in enumerate(raw)]
    paths = EdgeIndex(edges).paths(
        start, relations=relations, max_hops=max_hops, direction=direction, at_ms=at_ms
    )
    for path in paths:
        assert 1 <= path.hops <= max_hops and len(path.entities) == path.hops + 1
        assert path.entities[0] == start and len(set(path.entities)) == len(path.entities)
        for here, there, edge in zip(path.entities, path.entities[1:], path.edges, strict=False):
            forward = (edge.subject, edge.object) == (here, there)
            backward = (edge.object, edge.subject) == (here, there)
            assert (forward and direction != "in") or (backward and direction != "out")
            assert is_valid_at(edge, at_ms) and (relations is None or edge.relation in relations)
    keys = [(p.hops, p.entities) for p in paths]
    assert keys == sorted(keys)
    got = {(tuple(p.entities), tuple(e.edge_id for e in p.edges)) for p in paths}
    assert len(got) == len(paths)
    assert got == brute_force(edges, start, relations, max_hops, direction, at_ms)


@settings(max_examples=200, deadline=None)
@given(windows=st.lists(st.tuples(st.integers(0, 20), st.integers(0, 20)), min_size=1, max_size=8),
       a=st.integers(0, 25), b=st.integers(0, 25))
def test_one_interval_means_the_same_valid_edges(windows, a, b) -> None:
    """interval() is what callers key cached neighbourhoods on: two times in one interval see the same
    valid edges; and any change to the graph gives it a new version."""
    index = EdgeIndex(E(f"e{i}", f"s{i}", "calls", f"o{i}", lo, hi) for i, (lo, hi) in enumerate(windows))
    if index.interval(a) == index.interval(b):
        assert [is_valid_at(e, a) for e in index._edges.values()] == [is_valid_at(e, b) for e in index._edges.values()]
    versions = {index.version}
    index.add(E("new", "x", "calls", "y", 0, 5))
    versions.add(index.version)
    assert index.remove("new")
    versions.add(index.version)
    assert not index.remove("new") and len(versions) == 3 and EdgeIndex().version not in versions


# The same cache layer written in each language: a placement, a dependent of the placed service, an owner.
CACHE_LAYER = {
    "en": ("# Cache layer\nredis-cluster is deployed on vm-pool-3. session-api depends on redis-cluster. "
           "redis-cluster is owned by team-cache.", "What breaks if vm-pool-3 goes down?"),
    "zh": ("# 缓存层\nredis-cluster 部署在 vm-pool-3。session-api 依赖 redis-cluster。"
           "redis-cluster 由 team-cache 负责。", "vm-pool-3 挂了会影响什么"),
}


@pytest.mark.parametrize("lang", sorted(CACHE_LAYER))
def test_impact_of_a_host_over_extracted_edges(lang: str) -> None:
    relations = extract_relations(CACHE_LAYER[lang][0])
    index = EdgeIndex(E(f"e{i}", r.subject, r.relation, r.object) for i, r in enumerate(relations))
    impact = index.paths("vm-pool-3", relations=set(IMPACT_RELATIONS), max_hops=3, direction="in", at_ms=NOW)
    assert rendered(impact) == [
        "vm-pool-3 <--deployed_on-- redis-cluster",
        "vm-pool-3 <--deployed_on-- redis-cluster <--depends_on-- session-api",
    ]
    # An owner is not a dependency: nothing breaks when team-cache is away, although the edge is there.
    assert index.paths("team-cache", relations=set(IMPACT_RELATIONS), direction="in", at_ms=NOW) == []
    owned = index.paths("team-cache", direction="in", at_ms=NOW)
    assert rendered(owned)[0] == "team-cache <--owned_by-- redis-cluster"


@pytest.mark.parametrize("lang", sorted(CACHE_LAYER))
def test_what_breaks_if_a_host_goes_down_through_the_server(stub, scope, lang: str) -> None:
    text, question = CACHE_LAYER[lang]
    doc = pb.IngestDocumentRequest(scope=scope, doc_id=f"cache-{lang}", title="Cache layer", text=text,
                                   format=pb.DOCUMENT_FORMAT_MARKDOWN)
    ingested = stub.IngestDocument(doc)
    done = stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=[ingested.job_id], timeout_ms=30000))
    assert done.all_finished and done.jobs[0].status == pb.JOB_STATUS_DONE, done

    # QueryGraph: the agent names the entity; incoming edges are what depends on it.
    impact = stub.QueryGraph(pb.QueryGraphRequest(scope=scope, entity="vm-pool-3", max_hops=2,
                                                  relations=sorted(IMPACT_RELATIONS),
                                                  direction=pb.GRAPH_DIRECTION_INCOMING)).paths
    assert [list(p.entities) for p in impact] == [["vm-pool-3", "redis-cluster"],
                                                  ["vm-pool-3", "redis-cluster", "session-api"]]
    placed = impact[0].edges[0]
    assert (placed.subject, placed.relation, placed.object) == ("redis-cluster", "deployed_on", "vm-pool-3")
    assert placed.source.startswith(f"kb:cache-{lang}@v1#")

    # BuildContext: the question itself names vm-pool-3, and the graph facts around it come with it.
    session_id = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    ctx = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=session_id, query=question))
    facts = [it.text for s in ctx.sections for it in s.items if it.source.startswith("graph:")]
    assert "vm-pool-3 <--deployed_on-- redis-cluster" in facts
    assert "vm-pool-3 <--deployed_on-- redis-cluster <--depends_on-- session-api" in facts
