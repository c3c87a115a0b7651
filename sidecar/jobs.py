"""Durable job queue (rows in the jobs table) and the background worker that drains it.

A job is claimed (RUNNING) before its handler runs and finished after (once its kind's commit, if it
has one, has stored what the batch's jobs decided); at start-up RUNNING jobs of a crashed process go
back to QUEUED. Handlers are idempotent (re-running one merges instead of
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
# Stores what a batch's jobs of one kind decided, in one go, once they have run; returns the jobs whose
# part could not be stored (with why), which go back to the queue as failed attempts.
Commit = Callable[[Sequence[Job]], list[tuple[Job, Exception]]]
MAX_ATTEMPTS = 3
# A worker claims up to `batch` jobs in one transaction and writes their outcomes in one more: a
# replayed history queues a few jobs per session, and two statements per job cost more than the
# jobs. Jobs still unrun after BATCH_SECONDS go back to the queue, so a slow handler (an LLM
# extractor) keeps no other replica waiting on the jobs it holds.
BATCH_SECONDS = 0.5


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
    def __init__(self, store, handlers: dict[str, Handler], poll_s: float = 1.0, name: str = "job-worker",
                 batch: int = 1, prefetch: dict[str, Callable[[Sequence[Job]], None]] | None = None,
                 settle: dict[str, Callable[[Sequence[Job]], None]] | None = None,
                 commit: dict[str, Commit] | None = None) -> None:
        self.store = store
        self.batch = max(batch, 1)
        self.handlers: dict[str, Handler] = dict(handlers)
        # Per kind: loads what a claimed batch's jobs of that kind read, in one go, before they run.
        self.prefetch = dict(prefetch or {})
        # Per kind: makes ready what the batch's jobs of that kind changed, once they have run, so the
        # next BuildContext does not (derived state a write invalidates).
        self.settle = dict(settle or {})
        # Per kind: stores what the batch's jobs of that kind decided (Commit), before their outcomes
        # are written: a job is done only once what it decided is stored.
        self.commit = dict(commit or {})
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
            jobs = self.store.claim_jobs(now_ms(), list(self.handlers), self.batch)
            if jobs and (not self._run_batch(jobs) or len(jobs) == self.batch):
                continue  # more may be queued: claim again at once
            # The queue was drained: wait for notify() (a job enqueued meanwhile has set it already) or
            # the poll (another replica's jobs), rather than claim nothing again.
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def _run_batch(self, jobs: Sequence[Job]) -> bool:
        """Run claimed jobs in claim order, then record every outcome in one write; those not reached
        (the batch's time is up, or the worker is stopping) go back to the queue as they were. Whether
        every job ran."""
        deadline = time.monotonic() + BATCH_SECONDS
        _each_kind(self.prefetch, jobs, "prefetch")  # on failure each handler still reads for itself
        ran = 0
        for job in jobs:
            if ran and (self._stop.is_set() or time.monotonic() > deadline):
                break
            self._run(job)
            ran += 1
        for job in jobs[ran:]:
            job.status, job.attempts = JobStatus.QUEUED, job.attempts - 1
        self._commit([j for j in jobs[:ran] if j.status == JobStatus.DONE])
        _each_kind(self.settle, [j for j in jobs[:ran] if j.status == JobStatus.DONE], "settle")
        self.store.finish_jobs(jobs)
        with self._finished:
            self._finished.notify_all()
        return ran == len(jobs)

    def _run(self, job: Job) -> None:
        """Run one claimed job's handler; its outcome is set on `job`, written by the caller."""
        handler = self.handlers.get(job.kind)
        try:
            if handler is None:
                raise ValueError(f"no handler for job kind {job.kind!r}")
            job.result = handler(job)
            job.status = JobStatus.DONE
            job.error = ""
        except Exception as e:  # a failing job must not stop the worker
            log.exception("job %s (%s) failed", job.job_id, job.kind)
            _failed(job, e)
        job.updated_at_ms = now_ms()

    def _commit(self, done: Sequence[Job]) -> None:
        for kind, commit in self.commit.items():  # called every batch, as prefetch is
            mine = [j for j in done if j.kind == kind]
            try:
                failed = commit(mine)
            except Exception as e:  # nothing of theirs is known to be stored: all are tried again
                failed = [(j, e) for j in mine]
            for job, e in failed:
                log.error("job %s (%s) failed to store its result: %s", job.job_id, job.kind, e)
                _failed(job, e)
                job.updated_at_ms = now_ms()

    def report_progress(self, job: Job, done: int, total: int) -> None:
        job.done_items, job.total_items, job.updated_at_ms = done, total, now_ms()
        self.store.finish_job(job)  # same row update; status stays RUNNING

    def wait(self, scope: Scope, job_ids: Sequence[str], timeout_s: float) -> tuple[list[Job], bool]:
        deadline = time.monotonic() + timeout_s
        while True:
            jobs = self.store.get_jobs(scope, job_ids) if job_ids else self.store.unfinished_jobs(scope)
            done = all(j.status in (JobStatus.DONE, JobStatus.FAILED) for j in jobs)
            left = deadline - time.monotonic()
            if done or left <= 0:
                return jobs, done
            with self._finished:
                self._finished.wait(min(left, 0.2))


def _failed(job: Job, e: Exception) -> None:
    """A failed attempt: queued again, or failed for good after MAX_ATTEMPTS."""
    job.error = f"{type(e).__name__}: {e}"[:2000]
    job.status = JobStatus.QUEUED if job.attempts < MAX_ATTEMPTS else JobStatus.FAILED


def _each_kind(hooks: dict[str, Callable[[Sequence[Job]], None]], jobs: Sequence[Job], what: str) -> None:
    """Each hook with the jobs of its kind; a failing hook is logged, never fails the batch (what it
    would have made ready is made by its reader)."""
    for kind, hook in hooks.items():
        try:
            hook([j for j in jobs if j.kind == kind])
        except Exception:
            log.exception("%s for %s jobs failed", what, kind)
