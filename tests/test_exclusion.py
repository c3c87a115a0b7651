"""Candidates a resolver excludes before selection: never packed, never listed by the selection
(their source reports them), and excluding in one call leaves the next call's batches untouched."""

from dataclasses import replace

from sidecar.app import Sidecar
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
        req = BuildRequest(session_id=sid, query="which team owns service-3?")
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
