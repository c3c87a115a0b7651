"""Durable job queue (rows in the jobs table) and the background worker that drains it.

A job is claimed (RUNNING) before its handler runs and finished after; at start-up RUNNING jobs of
a crashed process go back to QUEUED. Handlers are idempotent (re-running one merges instead of
duplicating), so a job that ran when the process died is exactly-once in effect."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sidecar.clock import now_ms
from sidecar.domain import Job, JobStatus, Scope
from sidecar.ids import new_id

log = logging.getLogger("sidecar.jobs")

Handler = Callable[[Job], dict[str, str]]
MAX_ATTEMPTS = 3


def requeue_interrupted(store) -> None:
    """Jobs a crashed process was running go back to the queue (they are idempotent)."""
    requeued = store.requeue_running_jobs()
    if requeued:
        log.info("requeued %d jobs a previous process was running", requeued)


def new_job(scope: Scope, kind: str, payload: dict[str, Any], total_items: int = 0) -> Job:
    at = now_ms()
    return Job(job_id=new_id("job"), tenant_id=scope.tenant_id, user_id=scope.user_id, kind=kind, payload=payload,
               status=JobStatus.QUEUED, attempts=0, error="", done_items=0, total_items=total_items,
               created_at_ms=at, updated_at_ms=at)


class JobWorker:
    def __init__(self, store, handlers: dict[str, Handler], poll_s: float = 1.0, name: str = "job-worker") -> None:
        self.store = store
        self.handlers: dict[str, Handler] = dict(handlers)
        self.name = name
        self.poll_s = poll_s
        self._wake = threading.Event()
        self._finished = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start draining. Call requeue_interrupted() once per process before the first worker starts."""
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def notify(self) -> None:
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            job = self.store.claim_job(now_ms(), list(self.handlers))
            if job is None:
                self._wake.wait(self.poll_s)
                self._wake.clear()
                continue
            self._run(job)

    def _run(self, job: Job) -> None:
        handler = self.handlers.get(job.kind)
        try:
            if handler is None:
                raise ValueError(f"no handler for job kind {job.kind!r}")
            job.result = handler(job)
            job.status = JobStatus.DONE
            job.error = ""
        except Exception as e:  # a failing job must not stop the worker
            log.exception("job %s (%s) failed", job.job_id, job.kind)
            job.error = f"{type(e).__name__}: {e}"[:2000]
            job.status = JobStatus.QUEUED if job.attempts < MAX_ATTEMPTS else JobStatus.FAILED
        job.updated_at_ms = now_ms()
        self.store.finish_job(job)
        with self._finished:
            self._finished.notify_all()

    def report_progress(self, job: Job, done: int, total: int) -> None:
        job.done_items, job.total_items, job.updated_at_ms = done, total, now_ms()
        self.store.finish_job(job)  # same row update; status stays RUNNING

    def wait(self, scope: Scope, job_ids: Sequence[str], timeout_s: float) -> tuple[list[Job], bool]:
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = ([j for j in (self.store.get_job(scope, i) for i in job_ids) if j is not None] if job_ids
                    else self.store.unfinished_jobs(scope))
            done = all(j.status in (JobStatus.DONE, JobStatus.FAILED) for j in jobs)
            left = deadline - time.monotonic()
            if done or left <= 0:
                return jobs, done
            with self._finished:
                self._finished.wait(min(left, 0.2))
