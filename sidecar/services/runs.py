"""Runs and their checkpoints. The state machine is the one table below; anything else is refused."""

from __future__ import annotations

from dataclasses import replace

from sidecar.clock import now_ms
from sidecar.domain import Run, RunCheckpoint, RunStatus, Scope
from sidecar.errors import FailedPrecondition, InvalidArgument, NotFound
from sidecar.ids import check_id, check_text, new_id
from sidecar.services import limits
from sidecar.services.sessions import SessionService

TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    RunStatus.RUNNING: frozenset({RunStatus.INTERRUPTED, RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED}),
    RunStatus.INTERRUPTED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}


def check_transition(current: RunStatus, target: RunStatus) -> None:
    if target not in TRANSITIONS[current]:
        raise FailedPrecondition(
            f"run cannot go from RUN_STATUS_{current.name} to RUN_STATUS_{target.name}")


class RunService:
    def __init__(self, sessions: SessionService) -> None:
        self.sessions = sessions
        self.store = sessions.store

    def start(self, scope: Scope, session_id: str, run_id: str, goal: str) -> Run:
        check_id(run_id, "run_id", required=False)
        check_text(goal, "goal", limits.MAX_RUN_TEXT)
        self.sessions.open_view(scope, session_id)
        run_id = run_id or new_id("run")
        if self.store.get_run(scope, run_id) is not None:
            raise FailedPrecondition(f"run_id {run_id!r} already exists")
        at = now_ms()
        run = Run(run_id=run_id, session_id=session_id, status=RunStatus.RUNNING, goal=goal, reason="",
                  created_at_ms=at, updated_at_ms=at)
        self.store.create_run(scope, run)
        return run

    def get(self, scope: Scope, session_id: str, run_id: str) -> Run:
        check_id(run_id, "run_id")
        self.sessions.view(scope, session_id)
        run = self.store.get_run(scope, run_id)
        if run is None or run.session_id != session_id:
            raise NotFound(f"run_id {run_id!r} not found in session {session_id!r}")
        return run

    def update(self, scope: Scope, session_id: str, run_id: str, status: RunStatus, reason: str) -> Run:
        check_text(reason, "reason", limits.MAX_RUN_TEXT)
        run = self.get(scope, session_id, run_id)
        check_transition(run.status, status)
        updated = replace(run, status=status, reason=reason, updated_at_ms=now_ms())
        self.store.update_run(scope, updated)
        return updated

    def checkpoint(self, scope: Scope, session_id: str, run_id: str, state: bytes, pending_step: str) -> RunCheckpoint:
        if len(state) > limits.MAX_CHECKPOINT_STATE:
            raise InvalidArgument(f"state is {len(state)} bytes; the limit is {limits.MAX_CHECKPOINT_STATE}")
        check_text(pending_step, "pending_step", limits.MAX_RUN_TEXT)
        run = self.get(scope, session_id, run_id)
        if run.status not in (RunStatus.RUNNING, RunStatus.INTERRUPTED):
            raise FailedPrecondition(f"run is RUN_STATUS_{run.status.name}; only a running or interrupted run "
                                     "takes checkpoints")
        cp = RunCheckpoint(checkpoint_id=new_id("ckp"), run_id=run_id, seq=run.checkpoint_count + 1,
                           state=bytes(state), pending_step=pending_step, created_at_ms=now_ms())
        self.store.add_checkpoint(scope, cp)
        return cp

    def resume(self, scope: Scope, session_id: str, run_id: str) -> tuple[Run, RunCheckpoint | None]:
        run = self.get(scope, session_id, run_id)
        if run.status == RunStatus.INTERRUPTED:
            run = self.update(scope, session_id, run_id, RunStatus.RUNNING, "resumed")
        elif run.status != RunStatus.RUNNING:
            raise FailedPrecondition(f"run is RUN_STATUS_{run.status.name}; only an interrupted or running run "
                                     "can resume")
        return run, self.store.last_checkpoint(scope, run_id)
