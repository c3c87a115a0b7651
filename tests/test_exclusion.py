"""Candidates a resolver excludes before selection: never packed, never listed by the selection
(their source reports them), and excluding in one call leaves the next call's batches untouched."""

import uuid
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.app import Sidecar
from sidecar.assembly.budget import DEFAULT_BUDGET
from sidecar.assembly.builder import BuildRequest
from sidecar.assembly.candidates import CandidateBatch, Section, SoftCategory, SourceDrop
from sidecar.domain import Scope

SCOPE = Scope("t", "u")
TEXTS = [f"memory number {i} about service-{i} and its owner team-{i}" for i in range(6)]


class SharedCopySource:
    """Returns shallow copies of one template batch, as a cache-backed source may."""

    name = "shared"

    def __init__(self) -> None:
        self.template = CandidateBatch(category=SoftCategory.MEMORIES, section=Section.MEMORIES, texts=TEXTS,
                                       sources=[f"memory:m{i}" for i in range(6)], tokens=[12] * 6,
                                       relevance=[1.0 - i / 10 for i in range(6)], age_s=[0.0] * 6,
                                       priority=[0.2] * 6)

    def candidates(self, inp) -> list[CandidateBatch]:
        return [replace(self.template, dropped=[])]


def exclude_even(batches: list[CandidateBatch]) -> None:
    for b in batches:
        if b.category == SoftCategory.MEMORIES and len(b):
            gone = {j for j in range(len(b)) if j % 2 == 0 and b.sources[j].startswith("memory:m")}
            b.dropped += [SourceDrop(b.sources[j], b.category, 7, 12) for j in sorted(gone)]
            b.exclude(gone)


def test_excluded_candidates_are_not_packed_nor_listed_twice(tmp_path):
    app = Sidecar(str(tmp_path / "x.duckdb"))
    try:
        app.builder.sources.append(SharedCopySource())
        app.builder.resolvers.append(exclude_even)
        sid = app.sessions.create(SCOPE, "s", "agent", {}).session_id
        # Classic layout: the second call selects again (the cache-aware one shows the session's kept recall).
        req = BuildRequest(session_id=sid, query="which team owns service-3?", cache_aware=False)
        first, second = (app.builder.build(SCOPE, req) for _ in range(2))
        for result in (first, second):
            packed = [it.source for _, items in result.sections for it in items if it.source.startswith("memory:m")]
            assert packed == ["memory:m1", "memory:m3", "memory:m5"]
            listed = [d.source for d in result.dropped if d.source.startswith("memory:m")]
            assert sorted(listed) == ["memory:m0", "memory:m2", "memory:m4"]  # once each, by the source
            usage = next(u for u in result.usage if u.category == SoftCategory.MEMORIES.wire)
            assert (usage.candidates, usage.selected) == (3, 3)
        assert app.builder.sources[-1].template.excluded == set()
    finally:
        app.close()


class FixedSource:
    name = "fixed"

    def __init__(self, batch: CandidateBatch) -> None:
        self.batch = batch

    def candidates(self, inp) -> list[CandidateBatch]:
        return [replace(self.batch, dropped=[])]


def _batch(texts: list[str], relevance: list[float], tokens: list[int]) -> CandidateBatch:
    n = len(texts)
    return CandidateBatch(category=SoftCategory.MEMORIES, section=Section.MEMORIES, texts=texts,
                          sources=[f"memory:c{i}" for i in range(n)], tokens=tokens, relevance=relevance,
                          age_s=[0.0] * n, priority=[0.0] * n)


def _outcome(app: Sidecar, sid: str, req: BuildRequest):
    result = app.builder.build(SCOPE, req)
    packed = [(it.source, round(it.score, 9)) for _, items in result.sections for it in items
              if it.source.startswith("memory:c")]
    dropped = sorted((d.source, d.reason, d.kept_source) for d in result.dropped if d.source.startswith("memory:c"))
    usage = [(u.used, u.candidates, u.selected) for u in result.usage]
    return packed, dropped, usage


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["alpha beta", "alpha beta", "gamma delta epsilon", "zeta"]),
                          st.floats(0.0, 1.0), st.integers(0, 400)), min_size=1, max_size=25),
       st.sets(st.integers(0, 24)), st.integers(50, 3000))
def test_excluding_equals_removing(tmp_path, items, gone, memory_budget):
    """Masking candidates out of the selection gives exactly what removing them from the batch gives."""
    gone = {i for i in gone if i < len(items)}
    texts = [f"{t} {i % 3}" for i, (t, _, _) in enumerate(items)]  # some exact and near duplicates
    full = _batch(texts, [r for _, r, _ in items], [n for _, _, n in items])
    kept = [i for i in range(len(items)) if i not in gone]
    removed = _batch([texts[i] for i in kept], [items[i][1] for i in kept], [items[i][2] for i in kept])
    removed.sources = [full.sources[i] for i in kept]
    app = Sidecar(str(tmp_path / f"{uuid.uuid4().hex}.duckdb"))  # tmp_path is shared by the examples
    try:
        sid = app.sessions.create(SCOPE, "s", "agent", {}).session_id
        req = BuildRequest(session_id=sid, query="alpha gamma", budget=replace(DEFAULT_BUDGET, memories=memory_budget),
                           cache_aware=False)  # two builds of one session: the second would show the kept recall
        app.builder.sources.append(FixedSource(removed))
        expected = _outcome(app, sid, req)
        app.builder.sources[-1] = FixedSource(full)
        app.builder.resolvers.append(lambda batches: [b.exclude(gone) for b in batches if b.sources[:1] == ["memory:c0"]])
        assert _outcome(app, sid, req) == expected
    finally:
        app.close()
