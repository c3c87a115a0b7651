"""In-memory traversal of the knowledge graph's edges (subject --relation--> object).

``EdgeIndex`` keeps outgoing and incoming adjacency dicts so expanding an entity costs O(degree),
and is updated edge by edge as facts are added or retired. ``paths`` enumerates simple paths
(no entity twice, so cycles never loop) level by level: all 1-hop paths, then 2-hop, then 3-hop,
each level sorted by entity sequence so results are deterministic. Direction 'in' walks edges
backwards (object -> subject): from payment-db it finds who depends on it, transitively — what
breaks if it is down.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from itertools import count
from typing import Literal, Protocol

Direction = Literal["out", "in", "both"]
MAX_HOPS = 3
_VERSIONS = count(1)  # one sequence for every EdgeIndex: a rebuilt graph never repeats a version


class Edge(Protocol):
    """What traversal needs from an edge; the store's fact rows (or any dataclass) fit."""

    @property
    def edge_id(self) -> Hashable: ...
    @property
    def subject(self) -> str: ...
    @property
    def relation(self) -> str: ...
    @property
    def object(self) -> str: ...
    @property
    def valid_from_ms(self) -> int: ...
    @property
    def valid_to_ms(self) -> int: ...
    @property
    def source(self) -> str: ...


@dataclass
class Path:
    entities: list[str]
    edges: list[Edge] = field(default_factory=list)

    @property
    def hops(self) -> int:
        return len(self.edges)


def is_valid_at(edge: Edge, at_ms: int) -> bool:
    """0 means open-ended on that side; the window is [valid_from_ms, valid_to_ms)."""
    return (edge.valid_from_ms == 0 or edge.valid_from_ms <= at_ms) and (
        edge.valid_to_ms == 0 or at_ms < edge.valid_to_ms
    )


def render_path(path: Path) -> str:
    """'checkout-web --calls--> payment-api --depends_on--> payment-db'; an edge walked backwards is
    drawn backwards ('payment-db <--depends_on-- payment-api') so the arrow always reads as stored."""
    parts = [path.entities[0]]
    for here, edge in zip(path.entities, path.edges, strict=False):
        if edge.subject == here:
            parts.append(f"--{edge.relation}--> {edge.object}")
        else:
            parts.append(f"<--{edge.relation}-- {edge.subject}")
    return " ".join(parts)


class EdgeIndex:
    def __init__(self, edges: Iterable[Edge] = ()) -> None:
        self._edges: dict[Hashable, Edge] = {}
        self._out: dict[str, dict[Hashable, Edge]] = {}
        self._in: dict[str, dict[Hashable, Edge]] = {}
        # Callers cache what they derive from the graph (BuildContext's neighbourhood items) under
        # (version, interval): a new version on every change; see interval().
        self.version = next(_VERSIONS)
        self._bounds: list[int] | None = None
        for edge in edges:
            self.add(edge)

    def __len__(self) -> int:
        return len(self._edges)

    def __contains__(self, edge_id: object) -> bool:
        return edge_id in self._edges

    def get(self, edge_id: Hashable) -> Edge | None:
        return self._edges.get(edge_id)

    def add(self, edge: Edge) -> None:
        """Insert or replace (same edge_id) an edge."""
        self.remove(edge.edge_id)
        self._changed()
        self._edges[edge.edge_id] = edge
        self._out.setdefault(edge.subject, {})[edge.edge_id] = edge
        self._in.setdefault(edge.object, {})[edge.edge_id] = edge

    def _changed(self) -> None:
        self.version = next(_VERSIONS)
        self._bounds = None

    def interval(self, at_ms: int) -> int:
        """Which interval between validity boundaries at_ms falls in: within one, every edge is
        either valid throughout or not at all."""
        if self._bounds is None:
            self._bounds = sorted({t for e in self._edges.values() for t in (e.valid_from_ms, e.valid_to_ms) if t})
        return bisect_right(self._bounds, at_ms)

    def has_entity(self, entity: str) -> bool:
        return entity in self._out or entity in self._in

    def remove(self, edge_id: Hashable) -> bool:
        edge = self._edges.pop(edge_id, None)
        if edge is None:
            return False
        self._changed()
        _discard(self._out, edge.subject, edge_id)
        _discard(self._in, edge.object, edge_id)
        return True

    def paths(
        self,
        entity: str,
        *,
        relations: set[str] | None = None,
        max_hops: int = 2,
        direction: Direction = "out",
        at_ms: int,
        limit: int | None = None,
    ) -> list[Path]:
        """Every simple path of 1..max_hops edges valid at ``at_ms`` starting at ``entity``, shortest
        first, then by entity sequence (then relation and edge id for parallel edges). ``limit`` caps
        the result; levels are built one at a time, so work stays bounded by limit x degree."""
        if not 1 <= max_hops <= MAX_HOPS:
            raise ValueError(f"max_hops must be in 1..{MAX_HOPS}, got {max_hops}")
        if direction not in ("out", "in", "both"):
            raise ValueError(f"direction must be 'out', 'in' or 'both', got {direction!r}")
        if limit is not None and limit <= 0:
            return []
        result: list[Path] = []
        frontier = [Path([entity])]
        for _ in range(max_hops):
            level = [
                Path([*path.entities, neighbour], [*path.edges, edge])
                for path in frontier
                for neighbour, edge in self._steps(path.entities[-1], relations, direction, at_ms)
                if neighbour not in path.entities
            ]
            level.sort(key=_path_key)
            if limit is not None and len(result) + len(level) >= limit:
                result.extend(level[: limit - len(result)])
                break
            result.extend(level)
            frontier = level
            if not frontier:
                break
        return result

    def neighbourhood(
        self,
        entities: Iterable[str],
        *,
        max_hops: int = 2,
        limit: int = 50,
        at_ms: int,
        relations: set[str] | None = None,
    ) -> list[Path]:
        """Paths around several entities (e.g. those a query mentions) in both directions, for
        BuildContext: shortest first across all seeds, then seed order, without repeating a path
        already found from another seed (the same edges walked the other way count as the same)."""
        seeds = list(dict.fromkeys(entities))
        candidates: list[tuple[int, int, tuple[str, ...], tuple[tuple[str, str], ...], Path]] = []
        for order, seed in enumerate(seeds):
            found = self.paths(
                seed, relations=relations, max_hops=max_hops, direction="both", at_ms=at_ms, limit=limit
            )
            candidates.extend((path.hops, order, *_path_key(path), path) for path in found)
        candidates.sort(key=lambda c: c[:4])
        out: list[Path] = []
        seen: set[tuple[Hashable, ...]] = set()
        for *_, path in candidates:
            ids = tuple(edge.edge_id for edge in path.edges)
            key = min(ids, ids[::-1], key=repr)
            if key in seen:
                continue
            seen.add(key)
            out.append(path)
            if len(out) >= limit:
                break
        return out

    def _steps(
        self, entity: str, relations: set[str] | None, direction: Direction, at_ms: int
    ) -> Iterable[tuple[str, Edge]]:
        if direction != "in":
            for edge in self._out.get(entity, {}).values():
                if (relations is None or edge.relation in relations) and is_valid_at(edge, at_ms):
                    yield edge.object, edge
        if direction != "out":
            for edge in self._in.get(entity, {}).values():
                if (relations is None or edge.relation in relations) and is_valid_at(edge, at_ms):
                    yield edge.subject, edge


def _path_key(path: Path) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    return tuple(path.entities), tuple((edge.relation, str(edge.edge_id)) for edge in path.edges)


def _discard(adjacency: dict[str, dict[Hashable, Edge]], entity: str, edge_id: Hashable) -> None:
    bucket = adjacency.get(entity)
    if bucket is not None:
        bucket.pop(edge_id, None)
        if not bucket:
            del adjacency[entity]
