"""Compression bench (issue #7): rolling-summary update cost per folded turn, tool-result recording,
and BuildContext over gRPC on a 500-turn ops session with tool results and pinned constraints.

python bench/compression.py [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from harness import ServerProcess, emit, percentiles, time_calls

from sidecar.api import context_service_pb2 as pb
from sidecar.app import Sidecar
from sidecar.domain import NewMessage, Role, Scope
from tests.ops_session import PROHIBITIONS, ops_turns

ROLE = {"user": pb.ROLE_USER, "assistant": pb.ROLE_ASSISTANT}


def summary_cost(turns: list[tuple[str, str]]) -> dict[str, float]:
    """Fold the session 25 turns at a time, as CommitTurn does, and time each update."""
    app = Sidecar(tempfile.mkdtemp(prefix="sidecar-cmp-") + "/c.duckdb")
    try:
        scope = Scope("bench", "u")
        sid = app.sessions.create(scope, "", "", {}).session_id
        spent, folded = 0.0, 0
        for start in range(0, len(turns), 25):
            app.sessions.append(scope, sid, [NewMessage(role=Role.USER if r == "user" else Role.ASSISTANT, text=t)
                                             for r, t in turns[start:start + 25]])
            view = app.store.session_view(scope, sid)
            t0 = time.perf_counter()
            result = app.compression.update_summary(scope, view)
            spent += time.perf_counter() - t0
            folded += int(result.get("folded", 0))
        return {"summary_ms_per_turn": round(spent * 1000 / max(folded, 1), 3), "turns_folded": folded}
    finally:
        app.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n = 300 if args.quick else 3000
    turns, _ = ops_turns(500)
    figures = summary_cost(turns)

    server = ServerProcess()
    try:
        stub = server.stub
        scope = pb.Scope(tenant_id="bench", user_id="u")
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        for start in range(0, len(turns), 25):
            stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
                pb.NewMessage(role=ROLE[r], text=t) for r, t in turns[start:start + 25]]))
            jobs = stub.CommitTurn(pb.CommitTurnRequest(scope=scope, session_id=sid)).job_ids
            stub.WaitForJobs(pb.WaitForJobsRequest(scope=scope, job_ids=jobs))
        log = "\n".join(f"2026-12-01T10:00:{i % 60:02d}Z {'ERROR' if i % 300 == 0 else 'INFO'} payment-api line {i}"
                        for i in range(5000))
        t0 = time.perf_counter()
        for _ in range(5):
            stub.RecordToolResult(pb.RecordToolResultRequest(scope=scope, session_id=sid, tool_name="query_logs",
                                                             full_text=log))
        record_ms = (time.perf_counter() - t0) * 200
        req = pb.BuildContextRequest(scope=scope, session_id=sid, query="what next for payment-api?",
                                     system_rules="You are OpsPilot.")
        resp = stub.BuildContext(req)
        pinned = [it.text for s in resp.sections if s.kind == pb.SECTION_KIND_PINNED_CONSTRAINTS for it in s.items]
        stats = percentiles(time_calls(lambda: stub.BuildContext(req), n))
    finally:
        server.stop()
    figures.update({
        "turns": len(turns), "record_5000_line_tool_result_ms": round(record_ms, 1),
        "pinned_retained": f"{len(pinned)}/{len(PROHIBITIONS)}",
        "build_grpc_p50_ms": stats["p50_ms"], "build_grpc_p99_ms": stats["p99_ms"],
        "context_tokens": resp.total_tokens,
    })
    print(f"summary {figures['summary_ms_per_turn']} ms per folded turn; BuildContext over gRPC on "
          f"{len(turns)} turns p50 {stats['p50_ms']} ms p99 {stats['p99_ms']} ms; pinned {figures['pinned_retained']}")
    emit(figures)


if __name__ == "__main__":
    main()
