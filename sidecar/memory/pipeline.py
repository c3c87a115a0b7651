"""The after-turn memory job: turns -> skip small talk -> extract -> filter -> write (merge,
supersede, create). Every rejection is counted by its reason in the job's result."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from sidecar.domain import Authority, Job, MemoryType, Message, Scope
from sidecar.memory.extract import Extractor, MemoryCandidate
from sidecar.memory.filters import filter_candidates, is_low_information
from sidecar.memory.service import MemoryInput, MemoryService, WriteResult
from sidecar.secrets import PLACEHOLDER_RE, contains_secret, redact
from sidecar.textmodel import Turn

EXTRACT_JOB = "extract_memories"
WRITES = ("created", "merged", "superseded_older", "superseded_by_newer")  # MemoryService.write's outcomes that change the user's memories
REDACTION_MARK = "[REDACTED:"
_TYPES = {"preference": MemoryType.PREFERENCE, "episode": MemoryType.EPISODE, "habit": MemoryType.HABIT,
          "semantic": MemoryType.SEMANTIC}
_AUTHORITIES = {"USER_STATED": Authority.USER_STATED, "TOOL_VERIFIED": Authority.TOOL_VERIFIED,
                "INFERRED": Authority.INFERRED}


class ExtractionPipeline:
    def __init__(self, store, memories: MemoryService, extractor: Extractor, *, min_confidence: float = 0.7) -> None:
        self.store = store
        self.memories = memories
        self.extractor = extractor
        self.min_confidence = min_confidence
        self._prefetched: dict[str, list[Message]] = {}  # job id -> its messages (the worker's thread only)
        # Inside a worker's batch (prefetch opens it, commit closes it) a job's memories are staged,
        # job id -> (its memory inputs, its counts), and stored by commit: one transaction a user.
        self._staged: dict[str, tuple[list[MemoryInput], Counter]] = {}
        self._batch_open = False

    def prefetch(self, jobs: Sequence[Job]) -> None:
        """The messages of a claimed batch's jobs, one query per user (an import queues a job per
        session; a query each would cost more than their extraction)."""
        self._batch_open = True
        self._staged.clear()
        self._prefetched.clear()
        for scope, group in _by_user(jobs).items():
            if len(group) < 2:
                continue  # handle() reads it, from the cached view where it can
            found = {m.message_id: m for m in self.store.get_user_messages(
                scope, [i for job in group for i in job.payload["message_ids"]])}
            for job in group:
                session_id = job.payload["session_id"]
                self._prefetched[job.job_id] = sorted(
                    (m for i in job.payload["message_ids"] if (m := found.get(i)) is not None
                     and m.session_id == session_id), key=lambda m: m.seq)

    def settle(self, jobs: Sequence[Job]) -> None:
        """After a batch: the turn marks of each user whose memories its jobs wrote (a write drops
        them), read again now, once a user, rather than by the user's next BuildContext."""
        wrote = {Scope(j.tenant_id, j.user_id) for j in jobs if j.result and any(
            int(j.result.get(outcome, 0)) for outcome in WRITES)}
        for scope in wrote:
            self.memories.superseded_turns(scope)

    def handle(self, job: Job) -> dict[str, str]:
        scope = Scope(job.tenant_id, job.user_id)
        session_id = job.payload["session_id"]
        messages = self._prefetched.pop(job.job_id, None)
        if messages is None:
            messages = self.store.get_messages(scope, session_id, job.payload["message_ids"])
        inputs, counts = self.extract([
            Turn(message_id=m.message_id, role=m.role.label, text=m.text, speaker=m.speaker or None,
                 timestamp_ms=m.timestamp_ms) for m in messages])
        if self._batch_open:  # the worker's commit stores them
            self._staged[job.job_id] = (inputs, counts)
        else:
            _count_writes(counts, self.memories.write_many(scope, inputs, learnt_from_turns=True))
        return _result(counts)

    def commit(self, jobs: Sequence[Job]) -> list[tuple[Job, Exception]]:
        """JobWorker commit: the memories the batch's jobs staged, one write_many (one transaction) a
        user, the jobs' candidates in claim order (each decided as one write after another would be);
        each job's result counts its writes. Returns the jobs of the users whose write failed (nothing
        of theirs stored)."""
        self._batch_open = False
        staged, self._staged = self._staged, {}
        failed: list[tuple[Job, Exception]] = []
        for scope, group in _by_user([job for job in jobs if job.job_id in staged]).items():
            try:
                written = self.memories.write_many(scope, [inp for job in group for inp in staged[job.job_id][0]],
                                                   learnt_from_turns=True)
            except Exception as e:
                failed += [(job, e) for job in group]
                continue
            at = 0
            for job in group:
                inputs, counts = staged[job.job_id]
                _count_writes(counts, written[at:at + len(inputs)])
                at += len(inputs)
                job.result = _result(counts)
        return failed

    def run(self, scope: Scope, turns: list[Turn]) -> Counter:
        """A conversation's memories extracted, filtered and written (one transaction); what happened to
        each candidate counted. The turns need not be stored (a job's are: see handle)."""
        inputs, counts = self.extract(turns)
        _count_writes(counts, self.memories.write_many(scope, inputs))
        return counts

    def extract(self, turns: list[Turn]) -> tuple[list[MemoryInput], Counter]:
        """The candidates of these turns that pass the filters, as memory inputs, and the counts of what
        was skipped or rejected."""
        counts: Counter = Counter(turns=len(turns))
        useful = [t for t in turns if not is_low_information(t.text)]
        counts["skipped_low_information_turns"] = len(turns) - len(useful)
        if not useful:
            return [], counts
        # Secrets are masked at ingest and cut out again here (a row written before masking), so no
        # fragment of one can reach a memory; a candidate that carries a mask or the redaction marker
        # ("use this password: [secret:password#1]") is refused as a secret: it is no use without it.
        useful = [replace(t, text=redact(t.text)) if contains_secret(t.text) else t for t in useful]
        candidates = self.extractor.extract(useful)
        secret = [_holds_secret_mark(c.content) for c in candidates]
        counts["rejected_secret"] += sum(secret)
        candidates = [c for c, s in zip(candidates, secret, strict=True) if not s]
        result = filter_candidates(candidates, min_confidence=self.min_confidence,
                                   source_texts={t.message_id: t.text for t in turns})
        for _, reason in result.rejected:
            counts[f"rejected_{reason}"] += 1
        said = {t.message_id: t.timestamp_ms for t in turns}
        return [to_input(c, max((said.get(i, 0) for i in c.source_message_ids), default=0))
                for c in result.accepted], counts


def _by_user(jobs: Sequence[Job]) -> dict[Scope, list[Job]]:
    """The jobs of each user, in claim order."""
    by_user: dict[Scope, list[Job]] = {}
    for job in jobs:
        by_user.setdefault(Scope(job.tenant_id, job.user_id), []).append(job)
    return by_user


def _count_writes(counts: Counter, written: Sequence[WriteResult]) -> None:
    for w in written:
        counts[w.outcome if w.outcome != "rejected" else f"rejected_{w.reason}"] += 1


def _result(counts: Counter) -> dict[str, str]:
    return {k: str(v) for k, v in counts.items()}


def _holds_secret_mark(text: str) -> bool:
    return REDACTION_MARK in text or PLACEHOLDER_RE.search(text) is not None


def to_input(cand: MemoryCandidate, said_at_ms: int = 0) -> MemoryInput:
    """A candidate as a memory input, said at its newest source turn's time (0: unknown, now)."""
    return MemoryInput(type=_TYPES[cand.type], content=cand.content, subject=cand.subject,
                       source_message_ids=list(cand.source_message_ids), confidence=float(cand.confidence),
                       authority=_AUTHORITIES[cand.authority], said_at_ms=said_at_ms)
