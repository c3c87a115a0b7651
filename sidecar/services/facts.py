"""Session state with provenance. Only user-confirmed or tool-verified facts are state; a
model-inferred fact is a candidate until ConfirmFact promotes it. Every change is kept in history."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, replace

from sidecar import tokens
from sidecar.clock import now_ms
from sidecar.domain import Fact, FactChange, FactStatus, Provenance, Scope, render_fact_line
from sidecar.errors import InvalidArgument, NotFound
from sidecar.ids import check_text
from sidecar.secrets import mask
from sidecar.services import limits
from sidecar.services.sessions import SessionService
from sidecar.store.cache import SessionView

_KEY_LIMIT = 128


@dataclass(slots=True)
class FactInput:
    key: str
    value: str
    provenance: Provenance
    source: str


def state_hash(confirmed: Sequence[tuple[str, Fact]]) -> str:
    """Hash of the confirmed state (key, fact pairs in key order); equal while it does not change."""
    h = hashlib.blake2b(digest_size=12)
    for key, f in confirmed:
        h.update(f"{key}\x00{f.value}\x01".encode())
    return h.hexdigest()


class FactService:
    def __init__(self, sessions: SessionService) -> None:
        self.sessions = sessions
        self.store = sessions.store

    def upsert(self, scope: Scope, session_id: str, inputs: Sequence[FactInput]) -> list[Fact]:
        if not inputs:
            raise InvalidArgument("facts must hold at least one fact")
        if len(inputs) > limits.MAX_FACTS_PER_CALL:
            raise InvalidArgument(f"facts holds {len(inputs)} facts; the limit is {limits.MAX_FACTS_PER_CALL}")
        for i, f in enumerate(inputs):
            check_text(f.key, f"facts[{i}].key", _KEY_LIMIT, required=True)
            check_text(f.value, f"facts[{i}].value", limits.MAX_FACT_VALUE)
            check_text(f.source, f"facts[{i}].source", 256)
        view = self.sessions.open_view(scope, session_id)
        at = now_ms()
        written: dict[tuple[str, FactStatus], Fact] = {}
        changes: list[FactChange] = []
        for f in inputs:
            f.value = mask(f.value)[0]  # state is rendered into every prompt: never a credential
            status = FactStatus.CANDIDATE if f.provenance == Provenance.MODEL_INFERRED else FactStatus.CONFIRMED
            fact = Fact(key=f.key, value=f.value, provenance=f.provenance, source=f.source, updated_at_ms=at,
                        status=status, version=self._next_version(view, f.key, written),
                        tokens=tokens.count_tokens(render_fact_line(f.key, f.value)))
            written[(f.key, status)] = fact
            changes.append(FactChange(fact=fact, action="upsert", reason=""))
        deletes = []
        # A confirmed value makes an older candidate for the same key moot.
        for (key, status) in list(written):
            if status == FactStatus.CONFIRMED and key in view.candidates and (key, FactStatus.CANDIDATE) not in written:
                deletes.append((key, int(FactStatus.CANDIDATE)))
        self.store.write_facts(scope, session_id, list(written.values()), deletes, changes, at)
        return [c.fact for c in changes]

    @staticmethod
    def _next_version(view: SessionView, key: str, written: dict[tuple[str, FactStatus], Fact]) -> int:
        versions = [f.version for f in (view.confirmed.get(key), view.candidates.get(key)) if f]
        versions += [f.version for (k, _), f in written.items() if k == key]
        return max(versions, default=0) + 1

    def confirm(self, scope: Scope, session_id: str, key: str, confirmed_by: Provenance, source: str) -> Fact:
        check_text(key, "key", _KEY_LIMIT, required=True)
        check_text(source, "source", 256)
        if confirmed_by not in (Provenance.USER_CONFIRMED, Provenance.TOOL_VERIFIED):
            raise InvalidArgument("confirmed_by must be PROVENANCE_USER_CONFIRMED or PROVENANCE_TOOL_VERIFIED")
        view = self.sessions.open_view(scope, session_id)
        candidate = view.candidates.get(key)
        if candidate is None:
            raise NotFound(f"no candidate fact with key {key!r} in session {session_id!r}")
        at = now_ms()
        fact = replace(candidate, provenance=confirmed_by, source=source or candidate.source, updated_at_ms=at,
                       status=FactStatus.CONFIRMED, version=self._next_version(view, key, {}))
        self.store.write_facts(scope, session_id, [fact], [(key, int(FactStatus.CANDIDATE))],
                               [FactChange(fact=fact, action="confirm", reason="")], at)
        return fact

    def reject(self, scope: Scope, session_id: str, key: str, which: FactStatus, reason: str) -> Fact:
        check_text(key, "key", _KEY_LIMIT, required=True)
        check_text(reason, "reason", limits.MAX_RUN_TEXT)
        if which not in (FactStatus.CANDIDATE, FactStatus.CONFIRMED):
            raise InvalidArgument("which must be FACT_STATUS_CANDIDATE or FACT_STATUS_CONFIRMED")
        view = self.sessions.open_view(scope, session_id)
        current = (view.candidates if which == FactStatus.CANDIDATE else view.confirmed).get(key)
        if current is None:
            raise NotFound(f"no {which.name.lower()} fact with key {key!r} in session {session_id!r}")
        at = now_ms()
        rejected = replace(current, status=FactStatus.REJECTED, updated_at_ms=at,
                           version=self._next_version(view, key, {}))
        self.store.write_facts(scope, session_id, [], [(key, int(which))],
                               [FactChange(fact=rejected, action="reject", reason=reason)], at)
        return rejected

    def state(self, scope: Scope, session_id: str) -> tuple[list[Fact], list[Fact], str]:
        view = self.sessions.view(scope, session_id)
        # One read of each dict: a write swaps in new ones (SessionView.apply_fact_changes), and the
        # list and its hash must describe the same state.
        confirmed = sorted(view.confirmed.items())
        candidates = sorted(view.candidates.items())
        return [f for _, f in confirmed], [f for _, f in candidates], state_hash(confirmed)

    def history(self, scope: Scope, session_id: str, key: str) -> list[FactChange]:
        check_text(key, "key", _KEY_LIMIT, required=True)
        self.sessions.view(scope, session_id)
        changes = self.store.fact_history(scope, session_id, key)
        if not changes:
            raise NotFound(f"no fact with key {key!r} in session {session_id!r}")
        return changes

