"""Prometheus metrics on the opt-in port, the memory bounds set on the command line, and the
one-line-per-call debug log that never carries message content."""

from __future__ import annotations

import re
import urllib.request

import grpc

from sidecar.api import context_service_pb2 as pb
from tests.adversity.harness import Server
from tests.conftest import free_port

SECRET_WORDS = "zebra-umbrella-quasar"


def scrape(port: int) -> dict[str, float]:
    """Sample name with its labels -> value, from the text exposition format."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def turns(stub, scope: pb.Scope, n_sessions: int, per_session: int) -> str:
    sid = ""
    for s in range(n_sessions):
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
            pb.NewMessage(role=pb.ROLE_USER if i % 2 == 0 else pb.ROLE_ASSISTANT,
                          text=f"session {s} turn {i} about the payment-api rollout {SECRET_WORDS}")
            for i in range(per_session)]))
    return sid


def test_metrics_and_memory_bounds_of_a_served_sidecar(tmp_path):
    port = free_port()
    # Server drains the process's output into .log (a full pipe would block its logging).
    proc = Server(str(tmp_path / "m.duckdb"), extra=[
        "--metrics-port", str(port), "--cache-messages", "30", "--episodic-turns", "20",
        "--duckdb-memory", "64MB", "--log-level", "DEBUG"])
    try:
        scope = pb.Scope(tenant_id="t-metrics", user_id="u1")
        turns(proc.stub, scope, n_sessions=4, per_session=15)
        new = proc.stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        for _ in range(3):
            proc.stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=new, query="payment-api rollout"))
        try:
            proc.stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id="no-such-session", query="x"))
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.NOT_FOUND
        proc.stub.AddMemory(pb.AddMemoryRequest(scope=scope, type=pb.MEMORY_TYPE_PREFERENCE,
                                                content="Prefers concise answers"))
        m = scrape(port)
    finally:
        proc.stop()
    log = "".join(proc.log)

    assert m['sidecar_rpc_requests_total{code="OK",method="AppendMessages"}'] == 4
    assert m['sidecar_rpc_requests_total{code="OK",method="BuildContext"}'] == 3
    assert m['sidecar_rpc_requests_total{code="NOT_FOUND",method="BuildContext"}'] == 1
    assert m['sidecar_rpc_latency_seconds_count{method="BuildContext"}'] == 4
    assert m['sidecar_rpc_latency_seconds_bucket{le="+Inf",method="AppendMessages"}'] == 4
    assert m['sidecar_build_stage_seconds_count{stage="select"}'] == 3
    assert m['sidecar_context_tokens_packed_total{zone="soft"}'] > 0
    assert 'sidecar_job_queue_depth' in m
    assert m['sidecar_index_entries{index="memories"}'] == 1
    # The bounds given on the command line hold: 60 messages written, at most 30 cached, 20 indexed.
    assert 0 < m['sidecar_index_entries{index="cached_messages"}'] <= 30
    assert 0 < m['sidecar_index_entries{index="episodic_turns"}'] <= 20

    calls = [line for line in log.splitlines() if "rpc method=" in line]
    assert len(calls) >= 10 and any(re.search(r"method=BuildContext code=NOT_FOUND ms=[\d.]+", c) for c in calls)
    assert SECRET_WORDS not in log and "payment-api" not in log


def test_duckdb_memory_limit_reaches_the_store(tmp_path):
    from sidecar.app import Settings, Sidecar

    app = Sidecar(str(tmp_path / "d.duckdb"), Settings(duckdb_memory="64MB"))
    try:
        limit = app.store.backend._query("SELECT current_setting('memory_limit')")[0][0]
    finally:
        app.close()
    assert limit.endswith("MiB") and 55 <= float(limit.split()[0]) <= 64, limit


def test_nothing_is_recorded_without_a_metrics_port(monkeypatch):
    """With no port nobody can scrape, so BuildContext skips the bookkeeping; with one it records."""
    from sidecar import metrics
    from sidecar.assembly.builder import BuildResult

    result = BuildResult(packed=[], usage=[], hard_zone_tokens=7, soft_zone_tokens=5, total_budget=100, dropped=[],
                         drop_counts={1: 2}, stable_prefix_hash="", stable_prefix_tokens=0, knowledge_status=0,
                         timings=[("render", 40)], debug=False)

    def packed() -> float:
        return metrics.REGISTRY.get_sample_value("sidecar_context_tokens_packed_total", {"zone": "hard"}) or 0.0

    before = packed()
    metrics.observe_build(result)
    assert packed() == before and not metrics.enabled()
    monkeypatch.setattr(metrics, "_enabled", True)
    metrics.observe_build(result)
    assert packed() == before + 7
