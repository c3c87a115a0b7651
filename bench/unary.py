"""Unary latency and throughput over gRPC on localhost: AppendMessages and GetSessionState.

python bench/unary.py [--quick]
"""

from __future__ import annotations

import argparse

from harness import ServerProcess, emit, percentiles, throughput, time_calls

from sidecar.api import context_service_pb2 as pb


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    n, seconds = (300, 3.0) if args.quick else (3000, 10.0)

    server = ServerProcess()
    try:
        stub = server.stub
        scope = pb.Scope(tenant_id="bench", user_id="u0")
        sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
        stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=sid, facts=[
            pb.FactInput(key=f"k{i}", value=f"value {i}", provenance=pb.PROVENANCE_USER_CONFIRMED) for i in range(10)]))
        msg = pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
            pb.NewMessage(role=pb.ROLE_USER, text="查一下生产环境 payment-api 最近 30 分钟的 5xx 错误日志")])
        state_req = pb.GetSessionStateRequest(scope=scope, session_id=sid)

        append = percentiles(time_calls(lambda: stub.AppendMessages(msg), n))
        state = percentiles(time_calls(lambda: stub.GetSessionState(state_req), n))

        def state_call(i: int):
            s = server.new_stub()
            return lambda: s.GetSessionState(state_req)

        def append_call(i: int):
            s = server.new_stub()
            sc = pb.Scope(tenant_id="bench", user_id=f"w{i}")
            wsid = s.CreateSession(pb.CreateSessionRequest(scope=sc)).session_id
            req = pb.AppendMessagesRequest(scope=sc, session_id=wsid, messages=msg.messages)
            return lambda: s.AppendMessages(req)

        figures = {
            "append_p50_ms": append["p50_ms"], "append_p99_ms": append["p99_ms"],
            "state_p50_ms": state["p50_ms"], "state_p99_ms": state["p99_ms"],
            "state_rps_8_threads": throughput(state_call, 8, seconds),
            "append_rps_4_threads": throughput(append_call, 4, seconds),
            "calls_per_latency_sample": n,
        }
    finally:
        server.stop()
    print(f"AppendMessages p50 {figures['append_p50_ms']} ms p99 {figures['append_p99_ms']} ms; "
          f"GetSessionState p50 {figures['state_p50_ms']} ms p99 {figures['state_p99_ms']} ms")
    emit(figures)


if __name__ == "__main__":
    main()
