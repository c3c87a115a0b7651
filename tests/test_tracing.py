"""OpenTelemetry (the optional 'otel' extra): a server span per RPC joined to the caller's trace by its
traceparent metadata, BuildContext's stages as its children, no request content on any span; with
tracing off nothing of it is imported and no call goes through a tracing wrapper."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from sidecar.api import context_service_pb2_grpc as pb_grpc
from sidecar.app import Sidecar
from sidecar.server import build_server
from tests.conftest import ROOT

MISSING = "optional extra 'otel' not installed (pip install -e '.[otel]'): OpenTelemetry tests skipped"
TRACE_ID, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN}-01"
STAGES = ["scope", "hard_zone", "candidates", "features", "select", "render"]
SECRET_WORDS = "zebra-umbrella-quasar"


class Traced:
    """An in-process server with tracing into an in-memory exporter, and a client stub."""

    def __init__(self, db_path: str) -> None:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from sidecar.tracing import Tracing

        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))  # exported as each span ends
        self.tracing = Tracing(provider)
        self.app = Sidecar(db_path)
        self.server, port = build_server(self.app, listen="127.0.0.1:0", uds=None, tracing=self.tracing)
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.ContextServiceStub(self.channel)

    def spans(self, name_part: str = "") -> list:
        return [s for s in self.exporter.get_finished_spans() if name_part in s.name]

    def stop(self) -> None:
        self.channel.close()
        self.server.stop(grace=1).wait()
        self.app.close()
        self.tracing.shutdown()


@pytest.fixture
def traced(tmp_path) -> Iterator[Traced]:
    pytest.importorskip("opentelemetry.sdk", reason=MISSING)
    running = Traced(str(tmp_path / "traced.duckdb"))
    yield running
    running.stop()


def test_the_call_span_joins_the_callers_trace_and_the_stages_are_its_children(traced):
    from opentelemetry.trace import SpanKind, StatusCode

    scope = pb.Scope(tenant_id="tenant-secret-name", user_id="alice")
    sid = traced.stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    traced.stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text=f"payment-api returns 5xx {SECRET_WORDS}")]))
    traced.exporter.clear()
    traced.stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=f"why 5xx {SECRET_WORDS}"),
                             metadata=[("traceparent", TRACEPARENT)])

    [call] = traced.spans("ContextService/BuildContext")
    assert call.name == "context_sidecar.v1.ContextService/BuildContext" and call.kind is SpanKind.SERVER
    assert format(call.context.trace_id, "032x") == TRACE_ID
    assert call.parent is not None and call.parent.is_remote and format(call.parent.span_id, "016x") == CALLER_SPAN
    assert call.attributes["rpc.method"] == "BuildContext" and call.attributes["rpc.grpc.status_code"] == 0
    assert call.status.status_code is StatusCode.UNSET

    stages = sorted(traced.spans("BuildContext."), key=lambda s: s.start_time)
    assert [s.name for s in stages] == [f"BuildContext.{stage}" for stage in STAGES]
    for stage in stages:
        assert stage.parent.span_id == call.context.span_id and stage.context.trace_id == call.context.trace_id
        assert call.start_time <= stage.start_time <= stage.end_time <= call.end_time
    assert all(a.end_time <= b.start_time for a, b in zip(stages, stages[1:], strict=False))  # one after another

    said = json.dumps([dict(s.attributes) for s in traced.spans()])
    assert "tenant-secret-name" not in said and "alice" not in said and sid not in said and SECRET_WORDS not in said
    assert call.attributes["sidecar.tenant_hash"] and len(call.attributes["sidecar.tenant_hash"]) == 16


def test_a_call_without_a_traceparent_starts_a_trace_and_failures_carry_their_code(traced):
    from opentelemetry.trace import StatusCode

    scope = pb.Scope(tenant_id="t", user_id="u")
    with pytest.raises(grpc.RpcError) as missing:
        traced.stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id="no-such-session", query="q"))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    [call] = traced.spans("ContextService/BuildContext")
    assert call.parent is None
    assert call.attributes["rpc.grpc.status_code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert call.status.status_code is StatusCode.UNSET  # the caller's mistake, not the server's fault
    assert "no-such-session" not in json.dumps(dict(call.attributes)) and not call.events
    assert not traced.spans("BuildContext.")  # a build that failed has no stage spans


def test_tracing_off_imports_nothing_and_wraps_no_call(tmp_path):
    """Without tracing the server's calls go straight to the guard, and the builder has no observer:
    run in a fresh interpreter so that no other test's import of OpenTelemetry counts."""
    script = f"""
import sys
import grpc
from sidecar.api import context_service_pb2 as pb, context_service_pb2_grpc as pb_grpc
from sidecar.app import Sidecar
from sidecar.server import Guard, build_server

app = Sidecar({str(tmp_path / "off.duckdb")!r})
server, port = build_server(app, listen="127.0.0.1:0", uds=None)
server.start()
stub = pb_grpc.ContextServiceStub(grpc.insecure_channel(f"127.0.0.1:{{port}}"))
scope = pb.Scope(tenant_id="t", user_id="u")
sid = stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query="q"),
                  metadata=[("traceparent", {TRACEPARENT!r})])
handler = grpc.unary_unary_rpc_method_handler(lambda request, context: None)
assert Guard(None).wrap("/s/M", handler).__name__ == "guarded"
assert app.builder.stage_observer is None
loaded = sorted(m for m in sys.modules if m.startswith(("opentelemetry", "sidecar.tracing")))
assert not loaded, loaded
server.stop(grace=1).wait()
app.close()
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr


def test_serve_otel_without_the_extra_is_one_line(tmp_path):
    """`serve --otel` where OpenTelemetry cannot be imported (hidden here): one line, exit 2, no database."""
    db = tmp_path / "x.duckdb"
    script = ("import sys; sys.modules['opentelemetry'] = None; from sidecar.cli import main; "
              f"raise SystemExit(main(['serve', '--otel', '--db', {str(db)!r}, '--listen', '127.0.0.1:0']))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == "context-sidecar: --otel needs the 'otel' extra: pip install -e '.[otel]'"
    assert not db.exists()


def test_served_with_otel_the_spans_reach_the_exporter(spawn, tmp_path: Path):
    """`serve --otel` with the console exporter (config file): the spans are flushed when it stops."""
    pytest.importorskip("opentelemetry.sdk", reason=MISSING)
    config = tmp_path / "otel.toml"
    config.write_text('[otel]\nexporter = "console"\nservice_name = "sidecar-under-test"\n')
    server = spawn(extra=["--otel", "--config", str(config)])
    server.stub.CreateSession(pb.CreateSessionRequest(scope=pb.Scope(tenant_id="t", user_id="u")),
                              metadata=[("traceparent", TRACEPARENT)])
    assert server.terminate() == 0
    printed = server.output
    assert '"name": "context_sidecar.v1.ContextService/CreateSession"' in printed
    assert f'"trace_id": "0x{TRACE_ID}"' in printed and f'"parent_id": "0x{CALLER_SPAN}"' in printed
    assert '"service.name": "sidecar-under-test"' in printed
