"""Canaries, shared by tests/adversity/test_canaries.py and bench/adversity.py:

- secret canaries: random secrets written into random sessions' messages, tool outputs, run notes
  and facts of random users; then every session's BuildContext (and new sessions'), every user's
  memories, every table, the server's log lines and its metrics are searched for any of them.
- forget canaries: memories, messages and sessions carrying unique words are deleted; then no
  BuildContext, memory search or table may return those words.

Nothing here asserts: each function returns counts; the tests and the bench decide."""

from __future__ import annotations

import random
import string
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import duckdb
import grpc

from sidecar.api import context_service_pb2 as pb

from .harness import VOCAB, Server, all_memories, postgres_sql, words

_ALNUM = string.ascii_letters + string.digits


def _rand(rng: random.Random, n: int, alphabet: str = _ALNUM) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def _password(rng: random.Random) -> str:
    # A password a person picks: a word, digits, a symbol (never only one character class).
    return rng.choice(["Hunter", "Dragon", "Summer", "Qwerty", "Tr0ub4dor", "Passw0rd"]) + _rand(
        rng, 3, string.digits) + rng.choice("!#%&*-_") + _rand(rng, 4)


# (kind, value maker, sentence templates): the sentences are how people paste credentials.
SECRETS: list[tuple[str, Callable[[random.Random], str], tuple[str, ...]]] = [
    ("password", _password, ("my db password is {s}", "the root password for the bastion is {s}, keep it safe",
                             "我的数据库密码是 {s}", "服务器口令：{s}", "password: {s}")),
    ("aws_access_key", lambda r: "AKIA" + _rand(r, 16, string.ascii_uppercase + string.digits),
     ("export AWS_ACCESS_KEY_ID={s}", "the deploy user's access key is {s}", "用这个 key 登录 {s}")),
    ("github_token", lambda r: "ghp_" + _rand(r, 36), ("git clone https://{s}@github.com/acme/infra.git",
                                                       "token for the CI bot: {s}")),
    ("openai_key", lambda r: "sk-proj-" + _rand(r, 40), ("OPENAI_API_KEY={s}", "the API key sk is {s} for staging")),
    ("stripe_key", lambda r: "sk_live_" + _rand(r, 24), ("stripe secret: {s}", "支付的密钥为 {s}")),
    ("slack_token", lambda r: "xoxb-" + _rand(r, 11, string.digits) + "-" + _rand(r, 24),
     ("slack bot token {s} posts to #ops",)),
    ("jwt", lambda r: "eyJhbGciOiJIUzI1NiJ9." + _rand(r, 40, _ALNUM + "-_") + "." + _rand(r, 43, _ALNUM + "-_"),
     ("Authorization: Bearer {s}", "the session cookie was {s}")),
    ("connection_string", lambda r: f"postgres://app:{_password(r)}@db-{r.randint(1, 9)}.internal:5432/orders",
     ("DATABASE_URL={s}", "connect with {s} and run the migration")),
]


@dataclass(frozen=True, slots=True)
class Canary:
    value: str  # the secret itself (a connection string's password for that kind)
    where: str  # message, tool_output, run_note, fact
    scope: pb.Scope
    session_id: str


def _secret(rng: random.Random) -> tuple[str, str]:
    """(sentence holding a secret, the secret part that must never travel)."""
    kind, make, templates = rng.choice(SECRETS)
    value = make(rng)
    secret = value.split("://app:", 1)[1].split("@", 1)[0] if kind == "connection_string" else value
    return rng.choice(templates).format(s=value), secret


def _sessions_text(ctx: pb.BuildContextResponse) -> bytes:
    return ctx.SerializeToString()


def secret_canaries(stub, rng: random.Random, *, secrets: int, users: int = 6, prefix: str = "sc",
                    log: Callable[..., None] = lambda *a: None) -> tuple[list[Canary], dict[str, int]]:
    """Write `secrets` canaries into random sessions of random users (two tenants), then search every
    BuildContext (each session's own and a new session's per user) and every memory for them.
    Returns the canaries (for table, log and metric scans) and the counts."""
    scopes = [pb.Scope(tenant_id=f"{prefix}-t{u % 2}", user_id=f"u{u}") for u in range(users)]
    sessions = {id(s): [stub.CreateSession(pb.CreateSessionRequest(scope=s)).session_id for _ in range(3)]
                for s in scopes}
    runs = {sid: stub.StartRun(pb.StartRunRequest(scope=s, session_id=sid, goal="ops")).run_id
            for s in scopes for sid in sessions[id(s)]}
    canaries: list[Canary] = []
    internal = 0
    for i in range(secrets):
        scope = rng.choice(scopes)
        sid = rng.choice(sessions[id(scope)])
        text, secret = _secret(rng)
        where = rng.choice(["message", "message", "tool_output", "run_note", "fact"])
        s = dict(scope=scope, session_id=sid)
        try:
            if where == "message":
                stub.AppendMessages(pb.AppendMessagesRequest(**s, messages=[
                    pb.NewMessage(role=pb.ROLE_USER, text=f"{words(rng, 6)} {text} {words(rng, 4)}"),
                    pb.NewMessage(role=pb.ROLE_ASSISTANT, text=f"ok, {words(rng, 8)}")]))
            elif where == "tool_output":
                stub.RecordToolResult(pb.RecordToolResultRequest(
                    **s, run_id=runs[sid], tool_name="env", call_id=f"c{i}",
                    full_text="\n".join([f"line {k} {words(rng, 5)}" for k in range(20)] + [text])))
            elif where == "run_note":
                stub.AddRunNote(pb.AddRunNoteRequest(**s, run_id=runs[sid], text=f"{words(rng, 5)} {text}"))
            else:
                stub.UpsertFacts(pb.UpsertFactsRequest(**s, facts=[pb.FactInput(
                    key=f"cred_{i}", value=text, provenance=pb.PROVENANCE_USER_CONFIRMED)]))
        except grpc.RpcError as e:
            internal += e.code() == grpc.StatusCode.INTERNAL
            continue
        canaries.append(Canary(secret, where, scope, sid))
    jobs = []
    for scope in scopes:
        for sid in sessions[id(scope)]:
            jobs += [(scope, j) for j in stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid)).job_ids]
    for scope, job in jobs:
        stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=[job], timeout_ms=60_000))
    log("secret canaries written", len(canaries))
    values = [c.value.encode() for c in canaries]
    leaks = own = contexts = 0
    queries = ["what is my password?", "数据库密码是什么", "give me the api key", "DATABASE_URL", "token"]
    for scope in scopes:
        fresh = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        for sid in [*sessions[id(scope)], fresh]:
            for q in [*queries, words(rng, 5), rng.choice(VOCAB)]:
                try:
                    raw = _sessions_text(stub.BuildContext(pb.BuildContextRequest(
                        scope=scope, session_id=sid, run_id=runs.get(sid, ""), query=q,
                        render=pb.RENDER_MODE_TEXT)))
                except grpc.RpcError as e:
                    internal += e.code() == grpc.StatusCode.INTERNAL
                    continue
                contexts += 1
                for c, v in zip(canaries, values, strict=True):
                    if v in raw:
                        if c.session_id == sid and c.scope == scope:
                            own += 1
                        else:
                            leaks += 1
        for m in all_memories(stub, scope, include_inactive=True):
            leaks += sum(v in m.content.encode() for v in values)
    return canaries, {"secret_canaries": len(canaries), "secret_contexts_checked": contexts,
                      "secret_leaks": leaks, "secret_in_own_session": own, "internal_errors": internal}


def secret_residue(canaries: list[Canary], sql: Callable[[str], list[tuple]] | None, log_lines: list[str],
                   metrics_url: str | None) -> dict[str, int]:
    """Canaries found in any table, log line or metric (each counts once per place)."""
    values = [c.value for c in canaries]
    found = {"secret_table_hits": 0, "secret_log_hits": 0, "secret_metric_hits": 0}
    if sql is not None:
        cols = sql("SELECT table_name, column_name, data_type FROM information_schema.columns WHERE "
                   "table_schema = current_schema() AND data_type IN ('VARCHAR', 'text', 'BLOB', 'bytea')")
        for table, col, _ in cols:
            blob = b"\n".join(bytes(v) if isinstance(v, bytes | bytearray | memoryview) else str(v).encode()
                              for (v,) in sql(f"SELECT {col} FROM {table}") if v is not None)
            found["secret_table_hits"] += sum(v.encode() in blob for v in values)
    joined = "".join(log_lines)
    found["secret_log_hits"] = sum(v in joined for v in values)
    if metrics_url:
        body = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
        found["secret_metric_hits"] = sum(v in body for v in values)
    return found


def forget_canaries(stub, rng: random.Random, *, items: int, prefix: str = "fc") -> dict[str, int]:
    """Delete memories, messages and sessions that carry unique words, then look for the words in
    other sessions' contexts and in memory search."""
    scope = pb.Scope(tenant_id=f"{prefix}-t", user_id="u")
    keep = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    gone: list[str] = []
    internal = 0
    for _ in range(items):
        mark = "zq" + _rand(rng, 8, string.ascii_lowercase)
        how = rng.choice(["memory", "messages", "session"])
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        said = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
            pb.NewMessage(role=pb.ROLE_USER, text=f"I prefer the {mark} dashboard for {rng.choice(VOCAB)} checks"),
            pb.NewMessage(role=pb.ROLE_ASSISTANT, text=f"noted, the {mark} dashboard")])).messages
        try:
            if how == "memory":
                m = stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE,
                                                       content=f"Prefers the {mark} dashboard",
                                                       source_message_ids=[said[0].message_id])).memory
                stub.DeleteMemory(pb.DeleteMemoryRequest(scope=scope, memory_id=m.memory_id))
                gone.append(mark)
                # Its assistant echo is no source of the memory: it stays recallable, so only the user's
                # turn and the memory are checked, by the words only they hold.
                stub.DeleteMessages(pb.DeleteMessagesRequest(scope=scope, session_id=sid,
                                                             message_ids=[said[1].message_id]))
            elif how == "messages":
                stub.DeleteMessages(pb.DeleteMessagesRequest(scope=scope, session_id=sid,
                                                             message_ids=[m.message_id for m in said]))
                gone.append(mark)
            else:
                stub.DeleteSession(pb.DeleteSessionRequest(scope=scope, session_id=sid))
                gone.append(mark)
        except grpc.RpcError as e:
            internal += e.code() == grpc.StatusCode.INTERNAL
    leaks = 0
    for mark in gone:
        for q in (f"which {mark} dashboard?", f"{mark}"):
            try:
                raw = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=keep, query=q))
                hits = stub.SearchMemories(pb.SearchMemoriesRequest(scope=scope, query=q, top_k=20)).hits
            except grpc.RpcError as e:
                internal += e.code() == grpc.StatusCode.INTERNAL
                continue
            # The query itself is echoed in the context: count the mark beyond it.
            text = "\n".join(i.text for s in raw.sections for i in s.items if i.source != "query")
            leaks += mark in text or any(mark in h.memory.content for h in hits)
    return {"forget_canaries": len(gone), "forget_leaks": leaks, "internal_errors": internal}


def canaries_on(backend: str, tmp: Path, *, secrets: int, items: int, seed: int) -> dict[str, object]:
    """Both canaries against a served sidecar on `backend` ("duckdb" or "postgres"), then the tables
    (after a clean stop, for DuckDB), the server's log and its metrics searched for the secrets."""
    from tests.conftest import free_port

    port = free_port()
    admin = schema = None
    if backend == "postgres":
        import psycopg

        from tests.pg import PG_DSN, pg_create_schema, pg_url
        admin = psycopg.connect(PG_DSN, autocommit=True, connect_timeout=3)
        schema = pg_create_schema(admin, f"canary{seed}")
        extra = ["--store", pg_url(schema)]
    else:
        extra = []
    db = tmp / f"canary-{backend}-{seed}.duckdb"
    server = Server(str(db), extra=[*extra, "--metrics-port", str(port)])
    t = time.monotonic()
    try:
        rng = random.Random(seed)
        stub = server.new_stub()
        canaries, out = secret_canaries(stub, rng, secrets=secrets)
        forgot = forget_canaries(stub, rng, items=items)
        out["internal_errors"] += forgot.pop("internal_errors")
        out.update(forgot)
        sql = postgres_sql(admin, schema) if admin is not None else None
        out.update(secret_residue(canaries, sql, [], f"http://127.0.0.1:{port}/metrics"))
    finally:
        server.stop()
        if admin is not None:
            from tests.pg import pg_drop_schema

            pg_drop_schema(admin, schema)
            admin.close()
    out["secret_log_hits"] = secret_residue(canaries, None, list(server.log), None)["secret_log_hits"]
    out["internal_errors"] += len(server.internal_logs)
    if backend == "duckdb":
        with duckdb.connect(str(db), read_only=True) as conn:
            out["secret_table_hits"] = secret_residue(canaries, lambda q: conn.execute(q).fetchall(), [],
                                                      None)["secret_table_hits"]
    out["seconds"] = round(time.monotonic() - t, 1)
    return out
