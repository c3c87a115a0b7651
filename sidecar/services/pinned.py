"""Pinned constraints' life cycle: what a session shows (its ancestors' constraints first, near
duplicates once) and Unpin, which keeps the row in history with who and why.

A sub-session reads its parent's constraints at every call instead of copying them, so a rule the
user pins in the parent later reaches the child, and the child cannot unpin what it inherited.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from sidecar.clock import now_ms
from sidecar.compress.constraints import constraint_key
from sidecar.domain import PinnedConstraint, Scope
from sidecar.errors import FailedPrecondition, InvalidArgument, NotFound
from sidecar.ids import check_id, check_text
from sidecar.secrets import redact
from sidecar.services import limits
from sidecar.services.sessions import SessionService
from sidecar.store.cache import SessionView

MAX_BY = 256
# Sub-sessions nest a few levels in practice; the bound only keeps a corrupt parent chain finite.
MAX_LINEAGE = 32


@dataclass(frozen=True, slots=True)
class ShownPin:
    """A pinned constraint as ListPinned and BuildContext show it."""

    constraint: PinnedConstraint
    inherited: bool = False  # said in an ancestor session
    merged: tuple[PinnedConstraint, ...] = ()  # later near duplicates rendered as this one

    @property
    def merged_pin_ids(self) -> list[str]:
        return [m.pin_id for m in self.merged]


@dataclass(slots=True)
class _Kept:
    constraint: PinnedConstraint
    inherited: bool
    merged: list[PinnedConstraint] = field(default_factory=list)


def parse_pin_id(pin_id: str) -> tuple[str, int]:
    """(message_id, index) of a "<message_id>:<index>" pin id, or INVALID_ARGUMENT naming pin_id."""
    check_id(pin_id, "pin_id")
    message_id, sep, idx = pin_id.rpartition(":")
    if not sep or not message_id or not idx.isdigit() or len(idx) > 9:
        raise InvalidArgument(f"pin_id {pin_id!r} is not '<message_id>:<index>' as ListPinned returns it")
    return message_id, int(idx)


class PinnedService:
    def __init__(self, sessions: SessionService) -> None:
        self.sessions = sessions
        self.store = sessions.store

    def shown(self, scope: Scope, view: SessionView, *, include_unpinned: bool = False) -> list[ShownPin]:
        """The constraints in render order: the root ancestor's first, the session's own last, each
        session's oldest first. An active constraint that is the same rule as an earlier active one
        (constraint_key) is not shown itself: the earlier one lists it as merged. Unpinned ones
        (history) only with include_unpinned, in their place."""
        kept: list[_Kept] = []
        by_key: dict[str, _Kept] = {}
        for pins, inherited in self._lineage_pins(scope, view):
            for p in pins:
                if p.unpinned_at_ms:
                    if include_unpinned:
                        kept.append(_Kept(p, inherited))
                    continue
                key = constraint_key(p.text)
                first = by_key.get(key)
                if first is not None:
                    first.merged.append(p)
                    continue
                by_key[key] = entry = _Kept(p, inherited)
                kept.append(entry)
        return [ShownPin(k.constraint, k.inherited, tuple(k.merged)) for k in kept]

    def _lineage_pins(self, scope: Scope, view: SessionView) -> Iterator[tuple[list[PinnedConstraint], bool]]:
        """(pinned rows, inherited) of the session's ancestors, the root first, then its own. Each
        view's list is read once: a write swaps in a new one."""
        chain = [view]
        seen = {view.session.session_id}
        parent_id = view.session.parent_session_id
        while parent_id and parent_id not in seen and len(chain) < MAX_LINEAGE:
            parent = self.store.session_view(scope, parent_id)
            if parent is None:  # deleted with its sub-sessions: nothing left to inherit
                break
            chain.append(parent)
            seen.add(parent_id)
            parent_id = parent.session.parent_session_id
        for v in reversed(chain):
            yield v.pinned, v is not view

    def list(self, scope: Scope, session_id: str, include_unpinned: bool) -> list[ShownPin]:
        return self.shown(scope, self.sessions.view(scope, session_id), include_unpinned=include_unpinned)

    def unpin(self, scope: Scope, session_id: str, pin_id: str, by: str, reason: str) -> ShownPin:
        """Unpins a constraint of this session. Unpinning a shown constraint also unpins the near
        duplicates merged into it: they are the same rule, and one of them would otherwise take its
        place. A merged one named by its own id is unpinned alone."""
        message_id, idx = parse_pin_id(pin_id)
        check_text(by, "by", MAX_BY, required=True)
        check_text(reason, "reason", limits.MAX_RUN_TEXT)
        shown = self.shown(scope, self.sessions.view(scope, session_id), include_unpinned=True)
        found = next(((s.constraint, s.merged) for s in shown if s.constraint.pin_id == pin_id), None) or next(
            ((m, ()) for s in shown for m in s.merged if m.pin_id == pin_id), None)
        if found is None:
            raise NotFound(f"pin_id {pin_id!r} not found in session {session_id!r}")
        pin, merged = found
        if pin.session_id != session_id:
            raise FailedPrecondition(f"pin_id {pin_id!r} is inherited from session {pin.session_id!r}; unpin it there")
        if pin.unpinned_at_ms:
            raise FailedPrecondition(f"pin_id {pin_id!r} was already unpinned by {pin.unpinned_by!r}")
        at, reason = now_ms(), redact(reason)
        if not self.store.unpin_constraint(scope, session_id, message_id, idx, by, reason, at):
            raise FailedPrecondition(f"pin_id {pin_id!r} was already unpinned")
        done = [m for m in merged
                if self.store.unpin_constraint(scope, session_id, m.message_id, m.idx, by, reason, at)]
        unpinned = {"unpinned_at_ms": at, "unpinned_by": by, "unpin_reason": reason}
        return ShownPin(replace(pin, **unpinned), False, tuple(replace(m, **unpinned) for m in done))
