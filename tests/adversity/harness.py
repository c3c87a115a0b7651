"""Adversity harness, shared by tests/adversity/* (fast versions) and bench/adversity.py (long ones):
a sidecar subprocess whose output is drained, /proc sampling, and the five adversities:

- CrashLoop: writes with idempotency keys while a driver kill -9s the server; after each restart
  every acknowledged write is present exactly once, unacknowledged batches are all-or-none, the
  indexes agree with the rows and every queued job finishes.
- Fuzzer: hypothesis strategies built from the proto descriptors for EVERY RPC, plus raw garbage
  on the port; counts statuses, records INTERNAL answers, checks that a seeded tenant's data only
  changes when a call that may change it succeeded.
- IsolationWorld: tenants x users with overlapping vocabulary; every source tag and every text of a
  BuildContext / SearchMemories / SearchKnowledge answer is checked against its owner.
- forget_residue: ForgetUser, then every table, every in-process structure and the index files are
  scanned for the forgotten user's texts and ids.
- soak: a steady mixed load; RSS, file descriptors, threads and p99 over time.

Nothing here asserts: each function returns counts; the tests and the bench decide.
"""

from __future__ import annotations

import collections
import os
import random
import re
import socket
import string
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402

from sidecar.api import context_service_pb2 as pb  # noqa: E402
from sidecar.api import context_service_pb2_grpc as pb_grpc  # noqa: E402
from tests.conftest import SidecarProcess  # noqa: E402

SERVICE = pb.DESCRIPTOR.services_by_name["ContextService"]
METHODS = [m.name for m in SERVICE.methods]
BIG = 64 * 1024 * 1024
CHANNEL_OPTIONS = [("grpc.max_send_message_length", BIG), ("grpc.max_receive_message_length", BIG)]

# Shared by every tenant and user: isolation must not depend on vocabulary being disjoint.
VOCAB = ("payment api database restart latency error deploy rollback cache queue timeout region cluster shard "
         "replica index backup alert incident runbook approval window traffic canary config rotate certificate "
         "disk memory cpu thread pool retry budget quota invoice ledger refund checkout gateway search ranking "
         "vector staging production owner escalation oncall dashboard metric logs trace").split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(VOCAB) for _ in range(n))


def code_of(e: BaseException) -> str:
    return e.code().name if isinstance(e, grpc.RpcError) and e.code() is not None else type(e).__name__


# ================================================================================ process plumbing
def proc_stats(pid: int) -> dict[str, float]:
    """RSS (MB), threads, open file descriptors and CPU seconds used of a process, from /proc."""
    out = {"rss_mb": 0.0, "threads": 0, "fds": 0, "cpu_s": 0.0}
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        out["cpu_s"] = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                out["rss_mb"] = round(int(line.split()[1]) / 1024, 1)
            elif line.startswith("Threads:"):
                out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


_LOG_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")  # the server's log lines start with asctime


class Server(SidecarProcess):
    """`python -m sidecar serve` whose output is drained by a thread (a full pipe would block the
    server's logging) and scanned for logged internal errors."""

    def __init__(self, db_path: str, extra: list[str] | None = None) -> None:
        super().__init__(db_path, extra=extra)
        self.log: collections.deque[str] = collections.deque(maxlen=400)
        self.internal_logs: list[str] = []
        self._channels: list[grpc.Channel] = []
        threading.Thread(target=self._pump, name="server-log", daemon=True).start()

    def _pump(self) -> None:
        tracing = False  # inside the traceback that follows a logged internal error
        for line in self.proc.stdout:
            self.log.append(line)
            if "internal error" in line:
                self.internal_logs.append(line.rstrip()[:500])
                tracing = True
            elif tracing and not _LOG_RECORD.match(line):
                self.internal_logs[-1] = (self.internal_logs[-1] + "\n" + line.rstrip())[-4000:]
            else:
                tracing = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def new_stub(self) -> pb_grpc.ContextServiceStub:
        ch = grpc.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        self._channels.append(ch)
        return pb_grpc.ContextServiceStub(ch)

    def healthy(self, timeout: float = 5.0) -> bool:
        return health_ok(self.address, timeout)

    def kill9(self) -> None:
        """SIGKILL first, so that calls in flight see the process die (not a closed channel)."""
        self.kill_process()
        self.channel.close()
        self._close_channels()

    def kill_process(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> int | None:
        self._close_channels()
        if self.alive():
            return self.terminate(timeout=15)
        return self.proc.returncode

    def _close_channels(self) -> None:
        for ch in self._channels:
            ch.close()
        self._channels.clear()


def health_ok(address: str, timeout: float = 5.0) -> bool:
    with grpc.insecure_channel(address) as ch:
        try:
            r = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
            return r.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            return False


def serve_supports_store() -> bool:
    """Whether `python -m sidecar serve` takes --store (a postgres:// URL)."""
    import subprocess

    out = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60).stdout
    return "--store" in out


def retry(fn: Callable[[], object], attempts: int = 20, delay: float = 0.1):
    for i in range(attempts):
        try:
            return fn()
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or i == attempts - 1:
                raise
            time.sleep(delay)


def wait_jobs(stub, scope: pb.Scope, timeout_ms: int = 60_000, job_ids: Iterable[str] = ()) -> pb.WaitForJobsResponse:
    return stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=list(job_ids), timeout_ms=timeout_ms),
                            timeout=timeout_ms / 1000 + 10)


def all_messages(stub, scope, session_id: str) -> list[pb.Message]:
    return list(stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=session_id, from_seq=1)).messages)


def all_memories(stub, scope, include_inactive: bool = False) -> list[pb.Memory]:
    out, token = [], ""
    while True:
        r = stub.ListMemories(pb.ListMemoriesRequest(scope=scope, page_size=500, page_token=token,
                                                     include_inactive=include_inactive))
        out.extend(r.memories)
        token = r.next_page_token
        if not token:
            return out


def all_sessions(stub, scope) -> list[pb.Session]:
    out, token = [], ""
    while True:
        r = stub.ListSessions(pb.ListSessionsRequest(scope=scope, page_size=500, page_token=token,
                                                     include_closed=True))
        out.extend(r.sessions)
        token = r.next_page_token
        if not token:
            return out


# ================================================================================ crash loop
@dataclass
class _Batch:
    user: str
    session: str
    keys: list[str]
    texts: list[str]


@dataclass
class Ledger:
    msg_acked: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # key -> (user, session, text)
    msg_pending: list[_Batch] = field(default_factory=list)
    fact_acked: dict[tuple[str, str, str], str] = field(default_factory=dict)  # (user, session, key) -> value
    fact_pending: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    mem_acked: dict[str, tuple[str, str]] = field(default_factory=dict)  # memory_id -> (user, content)
    mem_pending: list[tuple[str, str]] = field(default_factory=list)  # (user, content)
    doc_acked: dict[str, str] = field(default_factory=dict)  # doc_id -> text
    doc_pending: dict[str, str] = field(default_factory=dict)
    jobs_acked: dict[str, str] = field(default_factory=dict)  # job_id -> user ("" for the tenant)
    sessions: dict[str, list[str]] = field(default_factory=dict)  # user -> session ids


class CrashLoop:
    """Writes against a sidecar subprocess that a driver kill -9s at random moments."""

    TENANT = "crash"

    def __init__(self, db_path: str, *, seed: int = 7, users: int = 2, threads: int = 4,
                 up_s: tuple[float, float] = (0.4, 1.4), early_kill_p: float = 0.0, log=lambda *_: None) -> None:
        self.db_path = db_path
        self.rng = random.Random(seed)
        self.users = [f"u{i}" for i in range(users)]
        self.threads = threads
        self.up_s = up_s
        self.early_kill_p = early_kill_p
        self.log = log
        self.ledger = Ledger(sessions={u: [] for u in self.users})
        self.lock = threading.Lock()
        self.report: dict[str, object] = collections.Counter()
        self.load_codes: collections.Counter[str] = collections.Counter()
        self.problems: list[str] = []
        self._up = threading.Event()

    def scope(self, user: str = "") -> pb.Scope:
        return pb.Scope(tenant_id=self.TENANT, user_id=user)

    # ---------------------------------------------------------------- load
    def _load(self, stub, cycle: int, tid: int, stop: threading.Event) -> None:
        rng = random.Random(f"{cycle}-{tid}-{self.rng.random()}")
        n = 0
        while not stop.is_set():
            n += 1
            user = rng.choice(self.users)
            session = rng.choice(self.ledger.sessions[user][-2:])
            tag = f"c{cycle}t{tid}n{n}"
            op = rng.random()
            try:
                if op < 0.45:
                    size = rng.randint(1, 4)
                    b = _Batch(user, session, [f"k-{tag}-{i}" for i in range(size)],
                               [f"{words(rng, 6)} msg{tag}i{i}" for i in range(size)])
                    with self.lock:
                        self.ledger.msg_pending.append(b)
                    stub.AppendMessages(pb.AppendMessagesRequest(scope=self.scope(user), session_id=session, messages=[
                        pb.NewMessage(role=pb.ROLE_USER if i % 2 == 0 else pb.ROLE_ASSISTANT, text=t, idempotency_key=k)
                        for i, (k, t) in enumerate(zip(b.keys, b.texts, strict=True))]), timeout=10)
                    with self.lock:
                        self.ledger.msg_pending.remove(b)
                        for k, t in zip(b.keys, b.texts, strict=True):
                            self.ledger.msg_acked[k] = (user, session, t)
                elif op < 0.65:
                    facts = {f"f_{tag}_{i}": f"{words(rng, 3)} {tag}" for i in range(rng.randint(1, 3))}
                    entry = (user, session, facts)
                    with self.lock:
                        self.ledger.fact_pending.append(entry)
                    stub.UpsertFacts(pb.UpsertFactsRequest(scope=self.scope(user), session_id=session, facts=[
                        pb.FactInput(key=k, value=v, provenance=pb.PROVENANCE_USER_CONFIRMED, source="load")
                        for k, v in facts.items()]), timeout=10)
                    with self.lock:
                        self.ledger.fact_pending.remove(entry)
                        for k, v in facts.items():
                            self.ledger.fact_acked[(user, session, k)] = v
                elif op < 0.85:
                    content = f"The user noted {words(rng, 7)} mem{tag}"
                    with self.lock:
                        self.ledger.mem_pending.append((user, content))
                    r = stub.AddMemory(pb.AddMemoryRequest(scope=self.scope(user), type=pb.MEMORY_TYPE_SEMANTIC,
                                                           content=content), timeout=10)
                    with self.lock:
                        self.ledger.mem_pending.remove((user, content))
                        if r.outcome == pb.WRITE_OUTCOME_MERGED:
                            self.report["memories_merged"] += 1
                        else:
                            self.ledger.mem_acked[r.memory.memory_id] = (user, content)
                elif op < 0.93:
                    doc_id = f"doc-{tag}"
                    text = (f"# Runbook {tag}\n\n{words(rng, 12)} kb{tag}.\n\n## Steps\n\n{words(rng, 20)} "
                            f"kb{tag} step.\n")
                    with self.lock:
                        self.ledger.doc_pending[doc_id] = text
                    r = stub.IngestDocument(pb.IngestDocumentRequest(scope=self.scope(), doc_id=doc_id,
                                                                     title=f"runbook {tag}", text=text,
                                                                     format=pb.DOCUMENT_FORMAT_MARKDOWN), timeout=10)
                    with self.lock:
                        del self.ledger.doc_pending[doc_id]
                        self.ledger.doc_acked[doc_id] = text
                        self.ledger.jobs_acked[r.job_id] = ""
                else:
                    r = stub.CommitTurn(pb.CommitTurnRequest(scope=self.scope(user), session_id=session), timeout=10)
                    with self.lock:
                        for j in r.job_ids:
                            self.ledger.jobs_acked[j] = user
                self.load_codes["OK"] += 1
            except ValueError:  # the channel was closed under us: the cycle is over
                return
            except grpc.RpcError as e:
                self.load_codes[code_of(e)] += 1
                if e.code() != grpc.StatusCode.UNAVAILABLE and not stop.is_set() and self._up.is_set():
                    self.problems.append(f"load call failed while the server was up: {code_of(e)} {e.details()}")
                if stop.is_set() or e.code() == grpc.StatusCode.UNAVAILABLE:
                    time.sleep(0.02)

    # ---------------------------------------------------------------- verification
    def verify(self, stub) -> None:
        """Everything acknowledged is there exactly once; pending batches are all-or-none."""
        led, rep = self.ledger, self.report
        # Jobs first: queued work (index, extraction, summary) of the crashed processes finishes.
        for scope in [self.scope()] + [self.scope(u) for u in self.users]:
            r = wait_jobs(stub, scope)
            if not r.all_finished:
                rep["jobs_unfinished"] += len(r.jobs)
                self.problems.append(f"WaitForJobs({scope.user_id or 'tenant'}) not all_finished: {len(r.jobs)} left")
        by_user: dict[str, list[str]] = collections.defaultdict(list)
        for j, u in led.jobs_acked.items():
            by_user[u].append(j)
        failed = 0
        for u, ids in by_user.items():
            for start in range(0, len(ids), 200):
                for j in wait_jobs(stub, self.scope(u), 60_000, ids[start:start + 200]).jobs:
                    if j.status == pb.JOB_STATUS_FAILED:
                        failed += 1
                        self.problems.append(f"job {j.job_id} ({j.kind}) FAILED: {j.error[:200]}")
        rep["jobs_failed"] = failed

        # Messages.
        present: dict[str, list[pb.Message]] = collections.defaultdict(list)
        for u in self.users:
            for s in led.sessions[u]:
                msgs = all_messages(stub, self.scope(u), s)
                if [m.seq for m in msgs] != list(range(1, len(msgs) + 1)):
                    rep["seq_gaps"] += 1
                    self.problems.append(f"session {s}: seqs not gap-free")
                for m in msgs:
                    if m.idempotency_key:
                        present[m.idempotency_key].append(m)
        lost = dup = 0
        for k, (_u, s, text) in led.msg_acked.items():
            found = present.get(k, [])
            if not found:
                lost += 1
                self.problems.append(f"acked message {k} lost")
            elif len(found) > 1:
                dup += 1
                self.problems.append(f"acked message {k} stored {len(found)} times")
            elif found[0].text != text or found[0].session_id != s:
                lost += 1
                self.problems.append(f"acked message {k} changed")
        torn = 0
        for b in led.msg_pending:
            n = sum(1 for k in b.keys if k in present)
            if any(len(present.get(k, [])) > 1 for k in b.keys):
                dup += 1
            if 0 < n < len(b.keys):
                torn += 1
                self.problems.append(f"torn message batch {b.keys}: {n} of {len(b.keys)} stored")
            elif n == len(b.keys):
                seqs = [present[k][0].seq for k in b.keys]
                if seqs != list(range(seqs[0], seqs[0] + len(seqs))):
                    torn += 1
                    self.problems.append(f"message batch {b.keys} not contiguous: {seqs}")
        found_msgs = sum(1 for k in led.msg_acked if len(present.get(k, [])) == 1)

        # Facts.
        state: dict[tuple[str, str], dict[str, str]] = {}
        for u in self.users:
            for s in led.sessions[u]:
                st = stub.GetSessionState(pb.GetSessionStateRequest(scope=self.scope(u), session_id=s))
                state[(u, s)] = {f.key: f.value for f in st.confirmed}
        fact_lost = 0
        for (u, s, k), v in led.fact_acked.items():
            if state.get((u, s), {}).get(k) != v:
                fact_lost += 1
                self.problems.append(f"acked fact {k} lost")
        for u, s, facts in led.fact_pending:
            n = sum(1 for k in facts if k in state.get((u, s), {}))
            if 0 < n < len(facts):
                torn += 1
                self.problems.append(f"torn fact batch {sorted(facts)}: {n} of {len(facts)} stored")

        # Memories: rows, and the index agrees with the rows (every active row found by its exact text).
        mem_lost = mem_miss = 0
        for u in self.users:
            rows = all_memories(stub, self.scope(u))
            ids = {m.memory_id for m in rows}
            contents = collections.Counter(m.content for m in rows)
            for mid, (owner, _content) in led.mem_acked.items():
                if owner == u and mid not in ids:
                    mem_lost += 1
                    self.problems.append(f"acked memory {mid} lost")
            for owner, content in led.mem_pending:
                if owner == u and contents[content] > 1:
                    dup += 1
            for content, n in contents.items():
                if n > 1:
                    dup += 1
                    self.problems.append(f"memory stored {n} times: {content[:60]!r}")
            for m in rows:
                hits = stub.SearchMemories(pb.SearchMemoriesRequest(scope=self.scope(u), query=m.content, top_k=10))
                if m.memory_id not in {h.memory.memory_id for h in hits.hits}:
                    mem_miss += 1
                    self.problems.append(f"memory {m.memory_id} not found by its exact text")
            rep["memory_searches"] += len(rows)

        # Documents: rows, indexed, and found by their exact text.
        docs = {d.doc_id: d for d in stub.ListDocuments(pb.ListDocumentsRequest(scope=self.scope())).documents}
        doc_lost = kb_miss = 0
        for doc_id, text in list(led.doc_acked.items()) + list(led.doc_pending.items()):
            d = docs.get(doc_id)
            if d is None:
                if doc_id in led.doc_acked:
                    doc_lost += 1
                    self.problems.append(f"acked document {doc_id} lost")
                continue
            if d.version != 1:
                dup += 1
                self.problems.append(f"document {doc_id} at version {d.version}")
            if not d.indexed:
                kb_miss += 1
                self.problems.append(f"document {doc_id} not indexed after WaitForJobs")
            hits = stub.SearchKnowledge(pb.SearchKnowledgeRequest(scope=self.scope(), query=text, k=10))
            if doc_id not in {h.doc_id for h in hits.hits}:
                kb_miss += 1
                self.problems.append(f"document {doc_id} not found by its exact text")

        acked = len(led.msg_acked) + len(led.fact_acked) + len(led.mem_acked) + len(led.doc_acked)
        rep["acked_writes"] = acked
        rep["found_writes"] = (found_msgs + len(led.fact_acked) - fact_lost + len(led.mem_acked) - mem_lost
                               + len(led.doc_acked) - doc_lost)
        rep["lost_writes"] = lost + fact_lost + mem_lost + doc_lost
        rep["duplicate_writes"] = dup
        rep["torn_batches"] = torn
        rep["memory_index_misses"] = mem_miss
        rep["kb_index_misses"] = kb_miss
        rep["verifications"] += 1

    def retry_pending(self, stub) -> None:
        """Retry the unacknowledged message batches with the same keys: each lands exactly once."""
        led = self.ledger
        for b in list(led.msg_pending):
            r = retry(lambda b=b: stub.AppendMessages(pb.AppendMessagesRequest(
                scope=self.scope(b.user), session_id=b.session, messages=[
                    pb.NewMessage(role=pb.ROLE_USER if i % 2 == 0 else pb.ROLE_ASSISTANT, text=t, idempotency_key=k)
                    for i, (k, t) in enumerate(zip(b.keys, b.texts, strict=True))]), timeout=10))
            if [m.idempotency_key for m in r.messages] != b.keys:
                self.problems.append(f"retried batch {b.keys} answered {[m.idempotency_key for m in r.messages]}")
            led.msg_pending.remove(b)
            for k, t in zip(b.keys, b.texts, strict=True):
                led.msg_acked[k] = (b.user, b.session, t)
            self.report["retried_batches"] += 1
        # Lost-in-flight memories and documents are simply not acknowledged; forget them once checked.
        led.mem_pending.clear()
        led.fact_pending.clear()
        for doc_id in list(led.doc_pending):
            led.doc_pending.pop(doc_id)

    # ---------------------------------------------------------------- driver
    def _start(self) -> Server:
        return Server(self.db_path)

    def run(self, cycles: int) -> dict[str, object]:
        started = time.monotonic()
        for cycle in range(cycles + 1):
            server = self._start()
            try:
                if cycle and self.rng.random() < self.early_kill_p:  # kill during recovery, too
                    time.sleep(self.rng.uniform(0.0, 0.3))
                    server.kill9()
                    self.report["early_kills"] += 1
                    server = self._start()
                stub = server.new_stub()
                self.verify(stub)
                self.retry_pending(stub)
                if cycle == cycles:
                    self.verify(stub)  # the retried batches, exactly once
                    server.stop()
                    break
                for u in self.users:
                    sid = f"s-c{cycle}-{u}"
                    retry(lambda u=u, sid=sid, stub=stub: stub.CreateSession(pb.CreateSessionRequest(
                        scope=self.scope(u), session_id=sid, title="crash loop")))
                    self.ledger.sessions[u].append(sid)
                stop = threading.Event()
                self._up.set()
                stubs = [server.new_stub() for _ in range(self.threads)]
                workers = [threading.Thread(target=self._load, args=(stubs[i], cycle, i, stop), daemon=True)
                           for i in range(self.threads)]
                for w in workers:
                    w.start()
                time.sleep(self.rng.uniform(*self.up_s))
                self._up.clear()
                server.kill_process()
                stop.set()
                for w in workers:
                    w.join(15)
                server.kill9()
                self.report["crash_cycles"] += 1
                self.log(f"cycle {cycle}: acked so far {self.report.get('acked_writes', 0)}")
            finally:
                if server.alive():
                    server.proc.kill()
                    server.proc.wait()
        out = dict(self.report)
        out["load_codes"] = dict(self.load_codes)
        out["problems"] = self.problems[:50]
        out["seconds"] = round(time.monotonic() - started, 1)
        return out


# ================================================================================ fuzzing
READ_ONLY = {"GetSession", "ListSessions", "ListMessages", "GetSessionState", "GetFactHistory", "GetRun",
             "GetToolResult", "ListRunNotes", "BuildContext", "GetJobStatus", "WaitForJobs", "SearchMemories",
             "ListMemories", "GetMemoryHistory", "ListDocuments", "ListDocumentVersions", "SearchKnowledge",
             "QueryGraph"}
ODD_CHARS = ("\x00", "\u200b", "\u200d", "\u200e", "\u200f", "\u202e", "\u2066", "\ufeff", "\ufffd", "\uffff",
             "\ufffe", "\U0010ffff", "\U0001f600", "\U000e0001", "\u0301", "\u00e9", "e\u0301", "\u05d0", "\u0627",
             "\u4e2d", "\r\n", "\t", "\x7f", "\x1b[31m", "'", '"', "%s", "{}", "\\", "../", "NULL", "\u2028")


def fuzz_strategies(pools: dict[str, list[str]], *, huge_p: int = 300):
    """{method name: strategy of request messages}, built from the descriptors so that every field of
    every RPC is covered. `pools` holds real values (scopes' tenants/users, ids of a seeded tenant
    and of another tenant) mixed into the garbage so that calls reach past validation."""
    from google.protobuf.descriptor import FieldDescriptor as F
    from hypothesis import strategies as st

    odd_text = st.lists(st.sampled_from(ODD_CHARS) | st.characters(codec="utf-8"), max_size=30).map("".join)
    huge = st.sampled_from(["a" * (256 * 1024 + 1), "\u00e9" * 140_000, "w " * 600_000, "x" * (4 * 1024 * 1024),
                            "\u4e2d" * 3_000_000])
    id_like = st.text(alphabet=string.ascii_letters + string.digits + "-_.:@", min_size=1, max_size=12)
    real_ids = st.sampled_from(pools["ids"])
    long_id = st.sampled_from(["i" * 129, "i" * 128, "x" * 5000])

    def string_strategy(name: str):
        parts = [odd_text, st.just(""), id_like]
        if name.endswith("_id") or name.endswith("_ids") or name in ("key", "fact_keys", "roles", "allowed_roles",
                                                                   "entity", "relations"):
            parts = [real_ids, real_ids, real_ids, id_like, long_id] + parts
        else:
            parts = parts + [st.builds(lambda n: words(random.Random(n), n % 40), st.integers(0, 400))]
        base = st.one_of(parts)
        return st.integers(0, huge_p).flatmap(lambda r: huge if r == 0 else base)

    int_edges = {32: [0, 1, -1, 2**31 - 1, -2**31, 100, 1000, 1001, 10_001, 120_001],
                 64: [0, 1, -1, 2**63 - 1, -2**63, 2**40, 1_700_000_000_000]}

    def scalar(fd):
        t = fd.type
        if t == F.TYPE_STRING:
            return string_strategy(fd.name)
        if t == F.TYPE_BYTES:
            return st.one_of(st.binary(max_size=64), st.sampled_from([b"\xff\xfe\x00", bytes(range(256)),
                                                                     b"\x00" * (4 * 1024 * 1024 + 1)]))
        if t == F.TYPE_BOOL:
            return st.booleans()
        if t in (F.TYPE_FLOAT, F.TYPE_DOUBLE):
            return st.floats(width=32, allow_nan=True, allow_infinity=True)
        if t == F.TYPE_ENUM:
            valid = [v.number for v in fd.enum_type.values]
            return st.one_of(st.sampled_from(valid), st.integers(-2**31, 2**31 - 1), st.sampled_from([-1, 99, 2**31 - 1]))
        bits = 64 if t in (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64) else 32
        if t in (F.TYPE_UINT32, F.TYPE_UINT64, F.TYPE_FIXED32, F.TYPE_FIXED64):
            return st.integers(0, 2**bits - 1)
        return st.one_of(st.sampled_from(int_edges[bits]), st.integers(-2**(bits - 1), 2**(bits - 1) - 1),
                         st.integers(-5, 5000))

    valid_scope = st.builds(pb.Scope, tenant_id=st.sampled_from(pools["tenants"]),
                            user_id=st.sampled_from(pools["users"]))
    scopes = st.one_of(
        valid_scope, valid_scope, valid_scope, valid_scope,
        st.builds(pb.Scope, tenant_id=string_strategy("tenant_id"), user_id=string_strategy("user_id")),
        st.just(None))

    cache: dict[tuple[str, int], object] = {}

    def message(desc, depth: int):
        key = (desc.full_name, depth)
        if key in cache:
            return cache[key]
        cls = getattr(pb, desc.name) if hasattr(pb, desc.name) else None
        optional = {}
        for fd in desc.fields:
            if desc.GetOptions().map_entry:
                break
            if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
                k = scalar(fd.message_type.fields_by_name["key"])
                v = scalar(fd.message_type.fields_by_name["value"])
                optional[fd.name] = st.one_of(st.dictionaries(k, v, max_size=4),
                                              st.builds(lambda n: {f"k{i}": "v" for i in range(n)},
                                                        st.sampled_from([64, 65, 1000])))
                continue
            if fd.message_type is not None:
                if fd.message_type.name == "Scope":
                    elem = scopes
                elif depth >= 3:
                    continue
                else:
                    elem = message(fd.message_type, depth + 1)
            else:
                elem = scalar(fd)
            if fd.is_repeated if hasattr(fd, "is_repeated") else fd.label == F.LABEL_REPEATED:
                optional[fd.name] = st.one_of(
                    st.lists(elem, max_size=4),
                    st.tuples(elem, st.sampled_from([200, 201, 1000, 1001, 3000])).map(_many))
            else:
                optional[fd.name] = elem
        strat = st.fixed_dictionaries({}, optional=optional).map(
            lambda kw, cls=cls: cls(**{k: v for k, v in kw.items() if v is not None}))
        cache[key] = strat
        if depth == 0:
            top_fields[desc.full_name] = optional
        return strat

    top_fields: dict[str, dict] = {}
    out = {}
    for m in SERVICE.methods:
        wild = message(m.input_type, 0)
        fields = top_fields[m.input_type.full_name]
        names = sorted(fields)
        base = pools["seed"] if m.name not in DESTRUCTIVE else pools["other"]

        def build(picks, desc=m.input_type, base=base):
            req = template(desc, base)
            for name, value in picks:
                _set_field(req, name, value)
            return req

        near = st.lists(st.sampled_from(names).flatmap(lambda n, fields=fields: fields[n].map(lambda v, n=n: (n, v))),
                        max_size=2).map(build)
        out[m.name] = st.one_of(wild, near, near)
    return out


# Near-valid requests of these go to the other tenant: a valid one would empty the seeded tenant.
DESTRUCTIVE = {"ForgetUser", "CloseSession", "DeleteDocument", "DeleteMemory", "DeleteEdges", "DeleteSession",
               "DeleteMessages", "Unpin"}


def _set_field(req, name: str, value) -> None:
    fd = req.DESCRIPTOR.fields_by_name[name]
    req.ClearField(name)
    if value is None:
        return
    target = getattr(req, name)
    if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
        target.update(value)
    elif fd.is_repeated:
        target.extend(value)
    elif fd.message_type is not None:
        target.CopyFrom(value)
    else:
        setattr(req, name, value)


def template(desc, seed: dict, depth: int = 0):
    """A valid-looking request of `desc` aimed at the seeded tenant's real objects."""
    cls = getattr(pb, desc.name)
    by_name = {"session_id": seed["session_id"], "parent_session_id": seed["session_id"], "run_id": seed["run_id"],
               "tool_result_id": seed["tool_result_id"], "memory_id": seed["memory_id"], "doc_id": seed["doc_id"],
               "job_id": seed["job_id"], "key": "env", "entity": "payment-api", "subject": "payment-api",
               "relation": "depends_on", "object": "payment-db", "name": "search", "role": "user",
               "source": "kb:runbook@v1#0", "tool_name": "logs", "call_id": "c9", "speaker": "alice",
               "page_token": "", "idempotency_key": "", "edge_id": "", "checkpoint_id": ""}
    repeated = {"message_ids": seed["message_ids"][:1], "job_ids": [seed["job_id"]], "edge_ids": seed["edge_ids"],
                "fact_keys": ["env"], "roles": ["ops"], "allowed_roles": ["ops"], "relations": ["depends_on"],
                "source_message_ids": seed["message_ids"][:1]}
    kw = {}
    for fd in desc.fields:
        if fd.message_type is not None and fd.message_type.GetOptions().map_entry:
            continue
        if fd.message_type is not None:
            if fd.message_type.name == "Scope":
                kw[fd.name] = seed["scope"]
            elif depth < 2 and fd.name not in ("budget", "chunking"):
                sub = template(fd.message_type, seed, depth + 1)
                kw[fd.name] = [sub] if fd.is_repeated else sub
            continue
        if fd.is_repeated:
            if fd.name in repeated:
                kw[fd.name] = repeated[fd.name]
            continue
        if fd.type == fd.TYPE_STRING:
            kw[fd.name] = by_name.get(fd.name, f"{fd.name} {words(random.Random(fd.name), 6)}")
        elif fd.type == fd.TYPE_BYTES:
            kw[fd.name] = b"\x00state\xff"
        elif fd.type == fd.TYPE_ENUM:
            values = [v.number for v in fd.enum_type.values if v.number]
            kw[fd.name] = values[0] if values else 0
        elif fd.type == fd.TYPE_BOOL:
            kw[fd.name] = False
    return cls(**kw)


def _many(elem_count: tuple) -> list:
    """A long repeated field of one element, at most ~2 MB in all (a deep list, not a huge frame)."""
    elem, count = elem_count
    size = elem.ByteSize() if hasattr(elem, "ByteSize") else len(elem) if isinstance(elem, (str, bytes)) else 8
    return [elem] * max(1, min(count, 2_000_000 // max(1, size)))


def seed_tenant(stub, tenant: str, user: str, rng: random.Random) -> dict[str, object]:
    """A small tenant with one of everything; returns the ids it made."""
    scope = pb.Scope(tenant_id=tenant, user_id=user)
    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, title=f"seed {tenant}",
                                                     metadata={"k": "v"})).session_id
    msgs = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text=f"Never restart the {words(rng, 2)} cluster without approval."),
        pb.NewMessage(role=pb.ROLE_ASSISTANT, text=words(rng, 12), idempotency_key="seed-1"),
        pb.NewMessage(role=pb.ROLE_USER, text=f"I prefer concise answers about {words(rng, 3)}.")])).messages
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=sid, facts=[
        pb.FactInput(key="env", value="prod", provenance=pb.PROVENANCE_USER_CONFIRMED),
        pb.FactInput(key="hypothesis", value=words(rng, 4), provenance=pb.PROVENANCE_MODEL_INFERRED)]))
    run = stub.StartRun(pb.StartRunRequest(scope=scope, session_id=sid, goal="seed"))
    stub.Checkpoint(pb.CheckpointRequest(scope=scope, session_id=sid, run_id=run.run_id, state=b"\x00\xffseed",
                                         pending_step="approve"))
    tool = stub.RecordToolResult(pb.RecordToolResultRequest(scope=scope, session_id=sid, run_id=run.run_id,
                                                            tool_name="logs", call_id="c1",
                                                            full_text="\n".join(words(rng, 8) for _ in range(30))))
    note = stub.AddRunNote(pb.AddRunNoteRequest(scope=scope, session_id=sid, run_id=run.run_id, text=words(rng, 10)))
    mem = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE,
                                             content=f"Prefers {words(rng, 5)} in answers")).memory
    doc = stub.IngestDocument(pb.IngestDocumentRequest(scope=pb.Scope(tenant_id=tenant), doc_id="runbook",
                                                       title="Runbook", text=f"# Restart\n\n{words(rng, 40)}\n",
                                                       format=pb.DOCUMENT_FORMAT_MARKDOWN, allowed_roles=["ops"]))
    edges = stub.UpsertEdges(pb.UpsertEdgesRequest(scope=pb.Scope(tenant_id=tenant), edges=[
        pb.Edge(subject="payment-api", relation="depends_on", object="payment-db", source="kb:runbook@v1#0")]))
    wait_jobs(stub, pb.Scope(tenant_id=tenant))
    return {"scope": scope, "session_id": sid, "run_id": run.run_id, "tool_result_id": tool.tool_result_id,
            "note_id": note.note_id, "memory_id": mem.memory_id, "doc_id": doc.doc_id, "job_id": doc.job_id,
            "message_ids": [m.message_id for m in msgs], "edge_ids": [e.edge_id for e in edges.edges]}


def snapshot(stub, seed: dict) -> bytes:
    """Everything readable of the seeded user and tenant, as one deterministic byte string."""
    scope, sid, run_id = seed["scope"], seed["session_id"], seed["run_id"]
    tenant = pb.Scope(tenant_id=scope.tenant_id)
    parts = [
        *all_sessions(stub, scope),
        stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=sid, from_seq=1)),
        stub.GetSessionState(pb.GetSessionStateRequest(scope=scope, session_id=sid)),
        stub.GetRun(pb.GetRunRequest(scope=scope, session_id=sid, run_id=run_id)),
        stub.ListRunNotes(pb.ListRunNotesRequest(scope=scope, session_id=sid, run_id=run_id)),
        stub.GetToolResult(pb.GetToolResultRequest(scope=scope, session_id=sid, tool_result_id=seed["tool_result_id"])),
        *all_memories(stub, scope, include_inactive=True),
        stub.ListDocuments(pb.ListDocumentsRequest(scope=tenant)),
        stub.QueryGraph(pb.QueryGraphRequest(scope=tenant, entity="payment-api", max_hops=3,
                                             direction=pb.GRAPH_DIRECTION_BOTH)),
    ]
    return b"|".join(p.SerializeToString(deterministic=True) for p in parts)


class Fuzzer:
    """Sends hypothesis-generated requests for every RPC to a server; never raises on a status."""

    def __init__(self, server: Server, *, seed: int = 11, huge_p: int = 300) -> None:
        self.server = server
        self.stub = server.new_stub()
        rng = random.Random(seed)
        self.seed = seed_tenant(self.stub, "fz-seed", "alice", rng)
        self.other = seed_tenant(self.stub, "fz-other", "bob", rng)
        ids = []
        for s in (self.seed, self.other):
            ids += [s["session_id"], s["run_id"], s["tool_result_id"], s["note_id"], s["memory_id"], s["doc_id"],
                    s["job_id"], *s["message_ids"], *s["edge_ids"], "env", "hypothesis", "ops", "payment-api"]
        self.pools = {"tenants": ["fz-seed", "fz-other", "fz-x"], "users": ["alice", "bob", ""], "ids": ids,
                      "seed": self.seed, "other": self.other}
        self.strategies = fuzz_strategies(self.pools, huge_p=huge_p)
        self.statuses: collections.Counter[str] = collections.Counter()
        self.by_method: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.internal: list[str] = []
        self.requests = 0
        self.changed_by_rejected: list[str] = []
        self.batches_checked = 0
        self.batches_unchecked = 0
        self.baseline = snapshot(self.stub, self.seed)

    def targets_seed(self, method: str, req) -> bool:
        if not req.HasField("scope"):
            return False
        return req.scope.tenant_id == self.seed["scope"].tenant_id

    def send(self, method: str, req) -> str:
        fn = getattr(self.stub, method)
        try:
            fn(req, timeout=30)
            code = "OK"
        except grpc.RpcError as e:
            code = code_of(e)
            if code == "INTERNAL":
                self.internal.append(f"{method}: {e.details()} <- {_short(req)}")
        self.requests += 1
        self.statuses[code] += 1
        self.by_method[method][code] += 1
        return code

    def batch(self, calls: list[tuple[str, object]]) -> None:
        """Send a batch; when no call that may change the seeded tenant succeeded, its data must be
        byte-for-byte what it was."""
        may_change = False
        for method, req in calls:
            if method == "ForgetUser" and req.HasField("scope") and req.scope == self.seed["scope"]:
                continue  # a valid ForgetUser of the seeded user would legitimately empty it
            code = self.send(method, req)
            if code == "OK" and method not in READ_ONLY and self.targets_seed(method, req):
                may_change = True
        after = snapshot(self.stub, self.seed)
        if may_change:
            self.batches_unchecked += 1
        else:
            self.batches_checked += 1
            if after != self.baseline:
                self.changed_by_rejected.append(" ; ".join(f"{m}: {_short(r)}" for m, r in calls))
        self.baseline = after

    def run_hypothesis(self, requests: int, per_example: int = 8, seed: int = 0) -> None:
        from hypothesis import HealthCheck, Phase, given, settings
        from hypothesis import strategies as st

        @settings(max_examples=max(1, requests // per_example), deadline=None, database=None,
                  phases=[Phase.generate], derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(st.data())
        def run(data):
            # The methods from a drawn Random (hypothesis favours the first of a sampled_from).
            pick = data.draw(st.randoms(use_true_random=False), label="methods")
            calls = []
            for _ in range(per_example):
                m = pick.choice(METHODS)
                calls.append((m, data.draw(self.strategies[m], label=m)))
            self.batch(calls)

        run._hypothesis_internal_use_seed = seed
        run()

    def every_rpc_once(self) -> None:
        """Each RPC with an empty request, and with only a valid scope."""
        for m in METHODS:
            cls = getattr(pb, SERVICE.methods_by_name[m].input_type.name)
            self.batch([(m, cls()), (m, cls(scope=pb.Scope(tenant_id="fz-x", user_id="alice")))])

    def report(self) -> dict[str, object]:
        return {"fuzz_requests": self.requests, "fuzz_statuses": dict(self.statuses),
                "fuzz_internal": len(self.internal), "fuzz_internal_examples": self.internal[:5],
                "fuzz_changed_by_rejected": len(self.changed_by_rejected),
                "fuzz_batches_checked": self.batches_checked, "fuzz_batches_unchecked": self.batches_unchecked,
                "fuzz_methods": len(self.by_method)}


def _short(req) -> str:
    text = str(req).replace("\n", " ")
    return text[:300] + ("..." if len(text) > 300 else "")


def raw_garbage(address: str, rng: random.Random, rounds: int = 20) -> dict[str, int]:
    """Garbage on the port: random bytes, HTTP/1.1, a valid HTTP/2 preface followed by broken frames,
    an absurd frame length, a connection left half-open. Returns how many connections were made."""
    host, port = address.rsplit(":", 1)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    def frame(kind: int, flags: int, stream: int, payload: bytes, length: int | None = None) -> bytes:
        n = len(payload) if length is None else length
        return struct.pack(">I", n)[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload

    payloads = [
        lambda: rng.randbytes(rng.randint(1, 4096)),
        lambda: b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        lambda: preface + rng.randbytes(rng.randint(1, 512)),
        lambda: preface + frame(4, 0, 0, b"") + frame(1, 4, 1, rng.randbytes(40)),  # HEADERS with broken HPACK
        lambda: preface + frame(4, 0, 0, b"") + frame(0, 0, 1, b"\x00\x00\x00\x00\x05hello"),  # DATA before HEADERS
        lambda: preface + frame(4, 0, 0, b"") + frame(0, 0, 0, b"", length=0xFFFFFF),  # absurd length
        lambda: preface + frame(4, 0, 0, b"\x00\x04\xff\xff\xff\xff"),  # illegal window size setting
        lambda: preface + frame(8, 0, 0, b"\x7f\xff\xff\xff"),  # WINDOW_UPDATE overflow
        lambda: preface + frame(4, 0, 0, b"") + frame(3, 0, 0, b"\x00\x00\x00\x01"),  # RST_STREAM on stream 0
        lambda: preface + b"".join(frame(6, 0, 0, rng.randbytes(8)) for _ in range(200)),  # PING flood
        lambda: b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + rng.randbytes(200),  # a TLS ClientHello
    ]
    connections = 0
    lingering = []
    for i in range(rounds):
        for make in payloads:
            try:
                s = socket.create_connection((host, int(port)), timeout=2)
                s.sendall(make())
                connections += 1
                if i == 0 and len(lingering) < 3:
                    lingering.append(s)  # half-open: the server must not wait on it
                    continue
                try:
                    s.recv(1024)
                except OSError:
                    pass
                s.close()
            except OSError:
                connections += 1
    healthy_with_lingering = health_ok(address)
    for s in lingering:
        s.close()
    return {"garbage_connections": connections, "garbage_healthy_while_half_open": int(healthy_with_lingering)}


def raw_protobuf_garbage(address: str, rng: random.Random, per_method: int = 5) -> dict[str, object]:
    """Bytes that are not a valid request message (or carry invalid UTF-8 in a string field) sent to
    every method with an identity serializer."""
    codes: collections.Counter[str] = collections.Counter()
    examples: list[str] = []
    with grpc.insecure_channel(address) as ch:
        for m in METHODS:
            call = ch.unary_unary(f"/{SERVICE.full_name}/{m}")
            blobs = [b"\xff" * 3, b"\x0a\x03\x0a\x01\xff",  # scope.tenant_id = invalid UTF-8
                     b"\x0a\x80", b"\x08\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"]
            blobs += [rng.randbytes(rng.randint(1, 64)) for _ in range(per_method)]
            for blob in blobs:
                try:
                    call(blob, timeout=10)
                    codes["OK"] += 1
                except grpc.RpcError as e:
                    codes[code_of(e)] += 1
                    if e.code() == grpc.StatusCode.INTERNAL and len(examples) < 3:
                        examples.append(f"{m} <- {blob[:16]!r}: {e.details()}")
    return {"protobuf_garbage_requests": sum(codes.values()), "protobuf_garbage_statuses": dict(codes),
            "protobuf_garbage_internal": codes["INTERNAL"], "protobuf_garbage_examples": examples}


# ================================================================================ isolation sweep
MARK = re.compile(r"qz(\d+)(?:u(\d+))?q")
ROLES = ("ops", "finance", "sre")


class IsolationWorld:
    """Tenants x users sharing vocabulary; every text carries an owner marker (qz<t>u<u>q for user
    data, qz<t>q for tenant data) and every id is looked up in the store's own tables."""

    def __init__(self, stub, tenants: int = 5, users: int = 20, *, prefix: str = "iso", seed: int = 3) -> None:
        self.stub = stub
        self.rng = random.Random(seed)
        self.prefix = prefix
        self.tenants = [f"{prefix}{t}" for t in range(tenants)]
        self.users = [f"u{u:02d}" for u in range(users)]
        self.sessions: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
        self.doc_roles: dict[tuple[str, str], set[str]] = {}
        self.owner: dict[str, dict[str, tuple[str, ...]]] = {}
        self.edges: dict[str, set[str]] = collections.defaultdict(set)

    def scope(self, t: int, u: int | None) -> pb.Scope:
        return pb.Scope(tenant_id=self.tenants[t], user_id="" if u is None else self.users[u])

    def seed(self, workers: int = 8) -> None:
        def one_user(tu):
            t, u = tu
            rng = random.Random(f"{t}-{u}")
            mark, scope = f"qz{t}u{u}q", self.scope(t, u)
            stub = self.stub
            sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, title=f"incident {mark}")).session_id
            stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
                pb.NewMessage(role=pb.ROLE_USER, text=f"Never restart the {words(rng, 2)} cluster {mark}."),
                pb.NewMessage(role=pb.ROLE_ASSISTANT, text=f"{words(rng, 10)} {mark}"),
                pb.NewMessage(role=pb.ROLE_USER, text=f"I prefer {words(rng, 3)} dashboards {mark}."),
                pb.NewMessage(role=pb.ROLE_ASSISTANT, text=f"{words(rng, 12)} {mark}"),
                pb.NewMessage(role=pb.ROLE_USER, text=f"Check the {words(rng, 4)} {mark} please.")]))
            stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=sid, facts=[
                pb.FactInput(key="service", value=f"{rng.choice(VOCAB)}-api {mark}",
                             provenance=pb.PROVENANCE_USER_CONFIRMED)]))
            for _ in range(2):
                stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                                   content=f"Works on {words(rng, 5)} {mark}"))
            self.sessions[(t, u)].append(sid)
            if u % 4 == 0:  # a run with a tool result and a note, and a second session (episodic recall)
                run = stub.StartRun(pb.StartRunRequest(scope=scope, session_id=sid, goal=f"fix {mark}"))
                stub.RecordToolResult(pb.RecordToolResultRequest(
                    scope=scope, session_id=sid, run_id=run.run_id, tool_name="logs", call_id="c1",
                    full_text="\n".join(f"{words(rng, 6)} {mark}" for _ in range(20))))
                stub.AddRunNote(pb.AddRunNoteRequest(scope=scope, session_id=sid, run_id=run.run_id,
                                                     text=f"{words(rng, 8)} {mark}"))
                sid2 = stub.CreateSession(pb.CreateSessionRequest(scope=scope, title="second")).session_id
                stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid2, messages=[
                    pb.NewMessage(role=pb.ROLE_USER, text=f"{words(rng, 8)} {mark}")]))
                self.sessions[(t, u)].append(sid2)
            if u == 0:  # a long session: a rolling summary, and a sub-session result
                stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
                    pb.NewMessage(role=pb.ROLE_USER if i % 2 == 0 else pb.ROLE_ASSISTANT,
                                  text=" ".join(f"{words(rng, 9)} {mark}." for _ in range(8))) for i in range(40)]))
                child = stub.CreateSubSession(pb.CreateSubSessionRequest(scope=scope, parent_session_id=sid,
                                                                         task=f"look {mark}", fact_keys=["service"]))
                stub.CompleteSubSession(pb.CompleteSubSessionRequest(scope=scope, session_id=child.session_id,
                                                                     result_summary=f"{words(rng, 10)} {mark}"))
            if u % 2 == 0:
                stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid))

        def one_tenant(t):
            rng = random.Random(f"kb-{t}")
            mark, scope = f"qz{t}q", self.scope(t, None)
            for d, roles in enumerate([[], ["ops"], ["finance"], ["ops", "sre"], [], ["sre"]]):
                text = "\n\n".join(f"## {words(rng, 2)}\n\n{words(rng, 30)} {mark}." for _ in range(3))
                self.stub.IngestDocument(pb.IngestDocumentRequest(
                    scope=scope, doc_id=f"doc{d}", title=f"{words(rng, 2)} {mark}", text=text,
                    format=pb.DOCUMENT_FORMAT_MARKDOWN, allowed_roles=roles))
            self.stub.UpsertEdges(pb.UpsertEdgesRequest(scope=scope, edges=[
                pb.Edge(subject="payment-api", relation="depends_on", object="payment-db"),  # same id everywhere
                pb.Edge(edge_id=f"e{t}a", subject="payment-api", relation="calls", object=f"ledger-{mark}"),
                pb.Edge(edge_id=f"e{t}b", subject=f"ledger-{mark}", relation="depends_on", object="cache"),
                pb.Edge(subject="checkout", relation="calls", object="payment-api", source="kb:doc0@v1#0")]))

        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(one_tenant, range(len(self.tenants))))
            list(ex.map(one_user, [(t, u) for t in range(len(self.tenants)) for u in range(len(self.users))]))
        for t in range(len(self.tenants)):
            wait_jobs(self.stub, self.scope(t, None))
            for u in range(len(self.users)):
                wait_jobs(self.stub, self.scope(t, u))

    def load_truth(self, sql: Callable[[str], list[tuple]]) -> None:
        """Owner of every id, from the store's tables (not from the API under test)."""
        t_index = {name: i for i, name in enumerate(self.tenants)}
        u_index = {name: i for i, name in enumerate(self.users)}
        owner: dict[str, dict[str, set]] = collections.defaultdict(lambda: collections.defaultdict(set))
        for kind, query in (
                ("message", "SELECT tenant_id, user_id, message_id FROM messages"),
                ("memory", "SELECT tenant_id, user_id, memory_id FROM memories"),
                ("tool", "SELECT tenant_id, user_id, tool_result_id FROM tool_results"),
                ("note", "SELECT tenant_id, user_id, note_id FROM run_notes"),
                ("session", "SELECT tenant_id, user_id, session_id FROM sessions")):
            for tenant, user, oid in sql(query):
                if tenant in t_index:
                    owner[kind][oid].add((t_index[tenant], u_index.get(user, -1)))
        self.owner = owner
        for tenant, eid in sql("SELECT tenant_id, edge_id FROM graph_edges"):
            if tenant in t_index:
                self.edges[eid].add(t_index[tenant])
        for t in range(len(self.tenants)):
            for d in self.stub.ListDocuments(pb.ListDocumentsRequest(scope=self.scope(t, None))).documents:
                for v in self.stub.ListDocumentVersions(pb.ListDocumentVersionsRequest(
                        scope=self.scope(t, None), doc_id=d.doc_id)).versions:
                    self.doc_roles[(t, f"{d.doc_id}@v{v.version}")] = set(v.allowed_roles)

    # ---------------------------------------------------------------- checks
    def _check_text(self, text: str, t: int, u: int | None) -> str | None:
        for m in MARK.finditer(text):
            mt, mu = int(m.group(1)), m.group(2)
            if mt != t or (mu is not None and (u is None or int(mu) != u)):
                return f"text carries {m.group(0)}"
        return None

    def _check_tag(self, tag: str, t: int, u: int, roles: set[str]) -> str | None:
        kind, _, rest = tag.partition(":")
        if kind in ("message", "memory", "tool", "note", "summary", "subsession", "pinned"):
            oid = rest.split("#", 1)[0] if kind == "pinned" else rest
            table = {"pinned": "message", "summary": "session", "subsession": "session"}.get(kind, kind)
            owners = self.owner.get(table, {}).get(oid)
            if not owners:
                return None if kind == "subsession" else f"{tag}: unknown id"
            if (t, u) not in owners:
                return f"{tag}: owned by {sorted(owners)}"
            return None
        if kind == "kb":
            doc = rest.split("#", 1)[0]
            allowed = self.doc_roles.get((t, doc))
            if allowed is None:
                return f"{tag}: not a document of tenant {t}"
            if allowed and not allowed & roles:
                return f"{tag}: needs {sorted(allowed)}, caller has {sorted(roles)}"
            return None
        if kind == "graph":
            for eid in rest.split("+"):
                if t not in self.edges.get(eid, ()):
                    return f"{tag}: edge {eid} not of tenant {t}"
            return None
        if kind in ("fact", "query", "system", "tool_schema", "date"):
            # The session's own state, the caller's own request, an episodic date header: their texts
            # are still checked for other owners' markers.
            return None
        return "unknown"

    def sweep(self, queries: int, *, workers: int = 8, seed: int = 5) -> dict[str, object]:
        counts: collections.Counter[str] = collections.Counter()
        leaks: list[str] = []
        unknown: collections.Counter[str] = collections.Counter()
        lock = threading.Lock()

        def one(i: int) -> None:
            rng = random.Random(f"{seed}-{i}")
            t, u = rng.randrange(len(self.tenants)), rng.randrange(len(self.users))
            scope = self.scope(t, u)
            roles = set(rng.sample(ROLES, rng.randint(0, 2)))
            query = words(rng, rng.randint(1, 6)) + rng.choice(["", " payment-api", " checkout", " ledger"])
            found: list[tuple[str, str]] = []  # (tag, text)
            kind = rng.random()
            try:
                if kind < 0.5:
                    own = rng.random() < 0.9
                    if own:
                        sid = rng.choice(self.sessions[(t, u)])
                    else:  # someone else's session id: must answer NOT_FOUND, never content
                        t2, u2 = rng.randrange(len(self.tenants)), rng.randrange(len(self.users))
                        if (t2, u2) == (t, u):
                            u2 = (u + 1) % len(self.users)
                        sid = rng.choice(self.sessions[(t2, u2)])
                    req = pb.BuildContextRequest(scope=scope, session_id=sid, query=query, roles=sorted(roles),
                                                 render=rng.choice([0, 1, 2]), debug=rng.random() < 0.2)
                    if rng.random() < 0.3:
                        req.budget.max_input = rng.choice([2000, 8000, 64000])
                    try:
                        r = self.stub.BuildContext(req, timeout=30)
                    except grpc.RpcError as e:
                        if not own and e.code() == grpc.StatusCode.NOT_FOUND:
                            with lock:
                                counts["foreign_session_not_found"] += 1
                            return
                        raise
                    if not own:
                        found.append(("", f"foreign session {sid} answered OK"))
                    for s in r.sections:
                        for it in s.items:
                            found.append((it.source, it.text))
                    for d in r.dropped:
                        found.append((d.source, ""))
                    found.append(("", r.rendered_text))
                    found += [("", c.content) for c in r.chat_messages]
                    counts["build_context"] += 1
                elif kind < 0.75:
                    r = self.stub.SearchMemories(pb.SearchMemoriesRequest(scope=scope, query=query,
                                                                          top_k=rng.choice([5, 20, 100])), timeout=30)
                    found += [(f"memory:{h.memory.memory_id}", h.memory.content) for h in r.hits]
                    counts["search_memories"] += 1
                else:
                    r = self.stub.SearchKnowledge(pb.SearchKnowledgeRequest(
                        scope=pb.Scope(tenant_id=self.tenants[t], user_id=self.users[u] if rng.random() < 0.5 else ""),
                        roles=sorted(roles), query=query, k=rng.choice([5, 20, 100])), timeout=30)
                    found += [(h.source, h.text + " " + h.title) for h in r.hits]
                    counts["search_knowledge"] += 1
            except grpc.RpcError as e:
                with lock:
                    counts[f"error_{code_of(e)}"] += 1
                    leaks.append(f"call failed: {code_of(e)} {e.details()}")
                return
            problems = []
            for tag, text in found:
                if not tag and text.startswith("foreign session"):
                    problems.append(text)
                    continue
                if tag:
                    why = self._check_tag(tag, t, u, roles)
                    if why == "unknown":
                        with lock:
                            unknown[tag.partition(":")[0]] += 1
                    elif why:
                        problems.append(why)
                if text:
                    why = self._check_text(text, t, u)
                    if why:
                        problems.append(f"{tag or 'rendered'}: {why}")
            with lock:
                counts["items_checked"] += len(found)
                if problems:
                    counts["leaky_responses"] += 1
                    leaks.extend(f"{self.tenants[t]}/{self.users[u]}: {p}" for p in problems[:3])

        started = time.monotonic()
        with ThreadPoolExecutor(workers) as ex:
            list(ex.map(one, range(queries)))
        return {"isolation_queries": queries, "isolation_leaks": len(leaks), "isolation_leak_examples": leaks[:10],
                "isolation_unknown_tags": dict(unknown), "isolation_counts": dict(counts),
                "isolation_seconds": round(time.monotonic() - started, 1)}


def duckdb_sql(app) -> Callable[[str], list[tuple]]:
    backend = app.store.backend

    def run(query: str) -> list[tuple]:
        with backend._lock:
            return backend._conn.execute(query).fetchall()
    return run


def postgres_sql(admin, schema: str) -> Callable[[str], list[tuple]]:
    def run(query: str) -> list[tuple]:
        admin.execute(f"SET search_path TO {schema}")
        return admin.execute(query).fetchall()
    return run


# ================================================================================ forget-user residue
def _user_world(stub, scope: pb.Scope, mark: str, rng: random.Random) -> dict[str, list[str]]:
    """A user with one of everything (texts carry `mark`); returns their ids and texts."""
    ids: dict[str, list[str]] = collections.defaultdict(list)
    texts: list[str] = []

    def t(s: str) -> str:
        texts.append(s)
        return s

    sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope, title=t(f"incident {mark}"),
                                                     metadata={"ticket": mark})).session_id
    ids["session"].append(sid)
    msgs = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text=t(f"Never restart the {mark} database without approval.")),
        pb.NewMessage(role=pb.ROLE_USER, text=t(f"I prefer concise answers about {mark} deployments."),
                      idempotency_key=f"key-{mark}"),
        pb.NewMessage(role=pb.ROLE_ASSISTANT, text=t(f"Noted, {words(rng, 6)} {mark}.")),
        *[pb.NewMessage(role=pb.ROLE_USER if i % 2 == 0 else pb.ROLE_ASSISTANT,
                        text=t(" ".join(f"{words(rng, 10)} {mark}." for _ in range(10)))) for i in range(30)],
    ])).messages
    ids["message"] += [m.message_id for m in msgs]
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=sid, facts=[
        pb.FactInput(key="service", value=t(f"{mark}-api"), provenance=pb.PROVENANCE_USER_CONFIRMED),
        pb.FactInput(key="hypothesis", value=t(f"{mark} cache"), provenance=pb.PROVENANCE_MODEL_INFERRED)]))
    stub.RejectFact(pb.RejectFactRequest(scope=scope, session_id=sid, key="hypothesis", reason=t(f"not {mark}")))
    run = stub.StartRun(pb.StartRunRequest(scope=scope, session_id=sid, goal=t(f"fix {mark}")))
    ids["run"].append(run.run_id)
    cp = stub.Checkpoint(pb.CheckpointRequest(scope=scope, session_id=sid, run_id=run.run_id,
                                              state=mark.encode() + b"\x00\xff", pending_step=t(f"approve {mark}")))
    ids["checkpoint"].append(cp.checkpoint_id)
    tool = stub.RecordToolResult(pb.RecordToolResultRequest(
        scope=scope, session_id=sid, run_id=run.run_id, tool_name="logs", call_id=f"call-{mark}",
        full_text="\n".join(t(f"ERROR {words(rng, 5)} {mark}") for _ in range(20))))
    ids["tool"].append(tool.tool_result_id)
    for i in range(16):  # over the per-run bounds: the oldest fold into a summary note
        ids["note"].append(stub.AddRunNote(pb.AddRunNoteRequest(scope=scope, session_id=sid, run_id=run.run_id,
                                                                text=t(f"note {i} {words(rng, 30)} {mark}"))).note_id)
    child = stub.CreateSubSession(pb.CreateSubSessionRequest(scope=scope, parent_session_id=sid,
                                                             task=t(f"look at {mark}"), fact_keys=["service"]))
    ids["session"].append(child.session_id)
    stub.CompleteSubSession(pb.CompleteSubSessionRequest(scope=scope, session_id=child.session_id,
                                                         result_summary=t(f"found {mark} root cause")))
    for i in range(3):
        r = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_SEMANTIC,
                                               content=t(f"Owns the {words(rng, 4)} {mark} service {i}")))
        ids["memory"].append(r.memory.memory_id)
    m0 = ids["memory"][0]
    stub.UpdateMemory(pb.UpdateMemoryRequest(scope=scope, memory_id=m0, content=t(f"Owns the ledger {mark} service")))
    ids["job"] += list(stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid)).job_ids)
    wait_jobs(stub, scope)
    stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=f"what about {mark}?"))
    ids["text"] = texts
    return ids


def user_snapshot(stub, scope: pb.Scope) -> bytes:
    parts: list = []
    for s in all_sessions(stub, scope):
        parts.append(s)
        parts.append(stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=s.session_id, from_seq=1)))
        parts.append(stub.GetSessionState(pb.GetSessionStateRequest(scope=scope, session_id=s.session_id)))
    parts += all_memories(stub, scope, include_inactive=True)
    return b"|".join(p.SerializeToString(deterministic=True) for p in parts)


def scan_objects(root, needles: re.Pattern[str], limit: int = 3_000_000) -> list[str]:
    """Every str / bytes reachable from `root` (dicts, sequences, sets, objects' __dict__ and
    __slots__) that matches `needles`; returns the paths of the first hits."""
    import numpy as np

    seen: set[int] = set()
    hits: list[str] = []
    stack: list[tuple[object, str]] = [(root, "app")]
    visited = 0
    skip_types = (type, type(len), type(scan_objects), np.ndarray, threading.Thread)
    while stack and visited < limit and len(hits) < 20:
        obj, path = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        visited += 1
        if isinstance(obj, str):
            if needles.search(obj):
                hits.append(f"{path} = {obj[:80]!r}")
            continue
        if isinstance(obj, (bytes, bytearray)):
            if needles.search(bytes(obj).decode("utf-8", "replace")):
                hits.append(f"{path} = {bytes(obj)[:40]!r}")
            continue
        if obj is None or isinstance(obj, (int, float, bool, complex)) or isinstance(obj, skip_types):
            continue
        mod = type(obj).__module__ or ""
        if mod.startswith(("duckdb", "psycopg", "grpc", "logging", "_thread", "threading", "concurrent")):
            continue
        if isinstance(obj, dict):
            for k, v in list(obj.items()):
                stack.append((k, f"{path}[key]"))
                stack.append((v, f"{path}[{str(k)[:30]!r}]"))
            continue
        if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
            for i, v in enumerate(list(obj)):
                stack.append((v, f"{path}[{i}]"))
            continue
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict):
            for k, v in d.items():
                stack.append((v, f"{path}.{k}"))
        for cls in type(obj).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if isinstance(slot, str) and hasattr(obj, slot):
                    try:
                        stack.append((getattr(obj, slot), f"{path}.{slot}"))
                    except Exception:  # noqa: BLE001
                        pass
    return hits


def table_mentions(sql: Callable[[str], list[tuple]], needles: re.Pattern[str], mark: str) -> list[str]:
    """Every text column of every table (and blobs, for `mark`) that still mentions a needle."""
    residue: list[str] = []
    cols = sql("SELECT table_name, column_name, data_type FROM information_schema.columns "
               "WHERE table_schema = 'main'")
    pattern = needles.pattern.replace("'", "''")
    for table, col, dtype in cols:
        kind = dtype.upper()
        try:
            if kind.startswith("BLOB"):
                n = sum(1 for (v,) in sql(f"SELECT {col} FROM {table}") if v is not None and mark.encode() in bytes(v))
            elif kind.startswith(("VARCHAR", "JSON")):
                n = sql(f"SELECT count(*) FROM {table} WHERE regexp_matches(CAST({col} AS VARCHAR), "
                        f"'{pattern}')")[0][0]
            else:
                continue
        except Exception as e:  # noqa: BLE001
            residue.append(f"{table}.{col}: scan failed {e}")
            continue
        if n:
            residue.append(f"{table}.{col}: {n} rows mention it")
    return residue


def forget_residue(running, *, seed: int = 9) -> dict[str, object]:
    """ForgetUser on an in-process server (tests.conftest.Running), then look for what is left."""
    stub, app = running.stub, running.app
    rng = random.Random(seed)
    tenant = "forget"
    victim = pb.Scope(tenant_id=tenant, user_id="victim")
    others = [pb.Scope(tenant_id=tenant, user_id="other"), pb.Scope(tenant_id="forget-b", user_id="victim")]
    stub.IngestDocument(pb.IngestDocumentRequest(scope=pb.Scope(tenant_id=tenant), doc_id="runbook", title="Runbook",
                                                 text=f"# Restart\n\n{words(rng, 60)}\n"))
    vic = _user_world(stub, victim, "vicmarkq", rng)
    for i, o in enumerate(others):
        _user_world(stub, o, f"othmark{i}q", rng)
    before = [user_snapshot(stub, o) for o in others]
    sql = duckdb_sql(app)
    victim_rows_before = sum(sql(f"SELECT count(*) FROM {t} WHERE tenant_id = '{tenant}' AND user_id = 'victim'")[0][0]
                             for t in _user_tables())
    summaries_before = sql(f"SELECT count(*) FROM session_summaries WHERE tenant_id = '{tenant}' AND "
                           "user_id = 'victim'")[0][0]
    deleted = dict(stub.ForgetUser(pb.ForgetUserRequest(scope=victim)).deleted)

    ids = sorted({i for k, v in vic.items() if k != "text" for i in v})
    needles = re.compile("vicmarkq|" + "|".join(re.escape(i) for i in ids))
    residue: list[str] = []
    # 1. every user table: no row of the user
    for table in _user_tables():
        n = sql(f"SELECT count(*) FROM {table} WHERE tenant_id = '{tenant}' AND user_id = 'victim'")[0][0]
        if n:
            residue.append(f"{table}: {n} rows of the forgotten user")
    # 2. every text column of every table: none of the user's texts or ids (jobs' payloads, summaries...)
    residue += table_mentions(sql, needles, "vicmarkq")
    # 3. indexes and in-process state
    if app.memories.indexed_ids(victim):
        residue.append(f"memory index still holds {app.memories.indexed_ids(victim)}")
    for text in vic["text"][:40]:
        hits = stub.SearchMemories(pb.SearchMemoriesRequest(scope=victim, query=text, top_k=100)).hits
        if hits:
            residue.append(f"SearchMemories({text[:30]!r}) found {len(hits)}")
    if stub.ListSessions(pb.ListSessionsRequest(scope=victim, include_closed=True)).sessions:
        residue.append("ListSessions still lists sessions")
    if all_memories(stub, victim, include_inactive=True):
        residue.append("ListMemories still lists memories")
    for sid in vic["session"]:
        try:
            stub.BuildContext(pb.BuildContextRequest(scope=victim, session_id=sid, query="x"))
            residue.append(f"BuildContext on forgotten session {sid} answered OK")
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                residue.append(f"BuildContext on forgotten session: {code_of(e)}")
    for mid in vic["memory"]:
        try:
            stub.GetMemoryHistory(pb.GetMemoryHistoryRequest(scope=victim, memory_id=mid))
            residue.append(f"memory history of {mid} still readable")
        except grpc.RpcError:
            pass
    for jid in vic["job"]:
        try:
            stub.GetJobStatus(pb.GetJobStatusRequest(scope=victim, job_id=jid))
            residue.append(f"job {jid} still readable")
        except grpc.RpcError:
            pass
    residue += [f"in-process: {h}" for h in scan_objects(app, needles)]
    after = [user_snapshot(stub, o) for o in others]
    changed = sum(1 for a, b in zip(before, after, strict=True) if a != b)
    # 4. files on disk after a clean stop (index files; the database file itself is informational)
    running.stop()
    file_residue = 0
    db = Path(running.db_path)
    for f in [p for p in db.parent.rglob("*") if p.is_file() and p != db and not p.name.startswith(db.name)]:
        if b"vicmarkq" in f.read_bytes():
            residue.append(f"file {f.name} holds the forgotten user's text")
    raw = db.read_bytes() if db.exists() else b""
    file_residue = raw.count(b"vicmarkq")
    return {"forget_residue": len(residue), "forget_residue_examples": residue[:10],
            "forget_other_users_changed": changed, "forget_deleted": deleted,
            "forget_victim_rows_before": victim_rows_before, "forget_summaries_before": summaries_before,
            "forget_db_file_mentions": file_residue}


def _user_tables() -> tuple[str, ...]:
    from sidecar.store.duckdb_store import USER_TABLES
    return USER_TABLES


# ================================================================================ soak
def soak(server: Server, seconds: float, *, rate: float = 40.0, threads: int = 4, seed: int = 13,
         sample_s: float = 0.5) -> dict[str, object]:
    """A steady mixed load; samples RSS / fds / threads of the server process."""
    tenant = "soak"
    setup = server.new_stub()
    rng = random.Random(seed)
    users = [pb.Scope(tenant_id=tenant, user_id=f"u{i}") for i in range(4)]
    sessions = {u.user_id: setup.CreateSession(pb.CreateSessionRequest(scope=u)).session_id for u in users}
    for u in users:
        for i in range(5):
            setup.AddMemory(pb.AddMemoryRequest(scope=u, type=pb.MEMORY_TYPE_SEMANTIC,
                                                content=f"Works on {words(rng, 5)} soak{u.user_id}x{i}"))
    for d in range(5):
        setup.IngestDocument(pb.IngestDocumentRequest(scope=pb.Scope(tenant_id=tenant), doc_id=f"doc{d}",
                                                      text=f"# T\n\n{words(rng, 200)}\n",
                                                      format=pb.DOCUMENT_FORMAT_MARKDOWN))
    wait_jobs(setup, pb.Scope(tenant_id=tenant))
    lat: list[tuple[float, float, str]] = []  # (t, seconds, op)
    codes: collections.Counter[str] = collections.Counter()
    errors: list[str] = []
    samples: list[dict[str, float]] = []
    lock = threading.Lock()
    stop = threading.Event()
    t0 = time.monotonic()
    per_thread = rate / threads

    def worker(i: int) -> None:
        stub = server.new_stub()
        r = random.Random(f"{seed}-{i}")
        n, next_at = 0, time.monotonic()
        appended = 0
        while not stop.is_set():
            next_at += 1.0 / per_thread
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            n += 1
            u = r.choice(users)
            sid = sessions[u.user_id]
            op = r.random()
            started = time.monotonic()
            try:
                if op < 0.3:
                    name = "BuildContext"
                    stub.BuildContext(pb.BuildContextRequest(scope=u, session_id=sid, query=words(r, 5),
                                                             render=pb.RENDER_MODE_TEXT), timeout=30)
                elif op < 0.55:
                    name = "AppendMessages"
                    stub.AppendMessages(pb.AppendMessagesRequest(scope=u, session_id=sid, messages=[
                        pb.NewMessage(role=pb.ROLE_USER, text=f"{words(r, 15)} t{i}n{n}"),
                        pb.NewMessage(role=pb.ROLE_ASSISTANT, text=words(r, 25))]), timeout=30)
                    appended += 2
                elif op < 0.7:
                    name = "SearchMemories"
                    stub.SearchMemories(pb.SearchMemoriesRequest(scope=u, query=words(r, 4)), timeout=30)
                elif op < 0.75:
                    name = "AddMemory"
                    stub.AddMemory(pb.AddMemoryRequest(scope=u, type=pb.MEMORY_TYPE_SEMANTIC,
                                                       content=f"Noted {words(r, 6)} t{i}n{n}"), timeout=30)
                elif op < 0.85:
                    name = "UpsertFacts"
                    stub.UpsertFacts(pb.UpsertFactsRequest(scope=u, session_id=sid, facts=[
                        pb.FactInput(key=f"k{r.randrange(20)}", value=words(r, 3),
                                     provenance=pb.PROVENANCE_USER_CONFIRMED)]), timeout=30)
                elif op < 0.95:
                    name = "SearchKnowledge"
                    stub.SearchKnowledge(pb.SearchKnowledgeRequest(scope=pb.Scope(tenant_id=tenant),
                                                                   query=words(r, 4)), timeout=30)
                else:
                    name = "CommitTurn"
                    stub.CommitTurn(pb.CommitTurnRequest(scope=u, session_id=sid), timeout=30)
                code = "OK"
            except grpc.RpcError as e:
                code = code_of(e)
                with lock:
                    errors.append(f"{name}: {code} {e.details()}")
            took = time.monotonic() - started
            with lock:
                codes[code] += 1
                lat.append((started - t0, took, name))
            if appended > 400:  # a fresh session now and then: the soak is about the server, not one session
                with lock:
                    sessions[u.user_id] = stub.CreateSession(pb.CreateSessionRequest(scope=u)).session_id
                appended = 0

    ws = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for w in ws:
        w.start()
    while time.monotonic() - t0 < seconds:
        s = proc_stats(server.pid)
        s["t"] = round(time.monotonic() - t0, 2)
        samples.append(s)
        time.sleep(sample_s)
    stop.set()
    for w in ws:
        w.join(30)
    samples.append({**proc_stats(server.pid), "t": round(time.monotonic() - t0, 2)})

    def p99(xs: list[float]) -> float:
        xs = sorted(xs)
        return round(xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1000, 2) if xs else 0.0

    third = seconds / 3
    first = [d for t, d, _ in lat if t < third]
    last = [d for t, d, _ in lat if t >= 2 * third]
    # Per operation and per sixth of the run: a rising tail shows which call degrades.
    sixth = seconds / 6
    by_op: dict[str, list[list[float]]] = collections.defaultdict(lambda: [[] for _ in range(6)])
    for t, d, name in lat:
        by_op[name][min(int(t / sixth), 5)].append(d)
    warm = next((s for s in samples if s["t"] >= min(2.0, seconds / 5)), samples[0])
    # RSS and the server's CPU share (100 = one core) in each sixth: growth that levels off once
    # the caches are full is bounded; a CPU share near 100 means calls queue for the interpreter.
    ends = [next((s for s in reversed(samples) if s["t"] <= sixth * (k + 1)), warm) for k in range(6)]
    rss_by_sixth = [s["rss_mb"] for s in ends]
    cpu_by_sixth = [round(100 * (b["cpu_s"] - a["cpu_s"]) / max(b["t"] - a["t"], 1e-9), 1)
                    for a, b in zip([samples[0], *ends[:-1]], ends, strict=True)]
    end = samples[-1]
    return {"soak_seconds": seconds, "soak_requests": len(lat), "soak_rate_achieved": round(len(lat) / seconds, 1),
            "soak_codes": dict(codes), "soak_errors": errors[:5],
            "soak_rss_start_mb": warm["rss_mb"], "soak_rss_end_mb": end["rss_mb"],
            "soak_rss_max_mb": max(s["rss_mb"] for s in samples), "soak_rss_by_sixth_mb": rss_by_sixth,
            "soak_server_cpu_pct_by_sixth": cpu_by_sixth,
            "soak_fds_start": warm["fds"], "soak_fds_end": end["fds"], "soak_fds_max": max(s["fds"] for s in samples),
            "soak_threads_start": warm["threads"], "soak_threads_end": end["threads"],
            "soak_threads_max": max(s["threads"] for s in samples),
            "soak_p99_first_ms": p99(first), "soak_p99_last_ms": p99(last),
            "soak_p99_by_op_ms": {op: [p99(xs) for xs in parts] for op, parts in sorted(by_op.items())},
            "soak_p50_ms": round(sorted(d for _, d, _ in lat)[len(lat) // 2] * 1000, 2) if lat else 0.0}
