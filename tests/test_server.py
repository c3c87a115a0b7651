"""The server process: health, reflection, auth, graceful SIGTERM, unimplemented RPCs."""

import signal
import subprocess
import sys
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from sidecar.api import context_service_pb2 as pb
from sidecar.api import context_service_pb2_grpc as pb_grpc
from tests.conftest import Running
from tests.grpc_assert import expect_status


def test_health_and_reflection(shared_server):
    health = health_pb2_grpc.HealthStub(shared_server.channel)
    for service in ("", "context_sidecar.v1.ContextService"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status in (
            health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.UNKNOWN)
    services = ProtoReflectionDescriptorDatabase(shared_server.channel).get_services()
    assert "context_sidecar.v1.ContextService" in services and "grpc.health.v1.Health" in services


def test_auth_token(tmp_path):
    running = Running(str(tmp_path / "auth.duckdb"), auth_token="s3cret")
    try:
        scope = pb.Scope(tenant_id="t", user_id="u")
        call = lambda md: running.stub.CreateSession(pb.CreateSessionRequest(scope=scope), metadata=md)  # noqa: E731
        expect_status(lambda: call(()), grpc.StatusCode.UNAUTHENTICATED)
        expect_status(lambda: call((("authorization", "Bearer wrong"),)), grpc.StatusCode.UNAUTHENTICATED)
        assert call((("authorization", "Bearer s3cret"),)).session_id
        # Health stays open for probes.
        health_pb2_grpc.HealthStub(running.channel).Check(health_pb2.HealthCheckRequest())
    finally:
        running.stop()


def test_every_rpc_of_the_contract_is_implemented():
    from sidecar.servicer import ContextServicer

    rpcs = [m.name for m in pb.DESCRIPTOR.services_by_name["ContextService"].methods]
    assert len(rpcs) > 40
    missing = [name for name in rpcs if name not in ContextServicer.__dict__]
    assert not missing, f"RPCs still answering UNIMPLEMENTED: {missing}"


def test_a_slow_stop_prints_where_each_thread_is(tmp_path):
    """A stop that runs past STOP_REPORT_S prints every thread's stack (faulthandler) before it ends, so
    an orchestrator's log says what held it; it still exits 0 once done."""
    script = f"""
import time
import sidecar.server as server
from sidecar.app import Sidecar
server.STOP_REPORT_S = 0.5
class SlowToClose(Sidecar):
    def close(self):
        time.sleep(2.0)
        super().close()
raise SystemExit(server.serve({str(tmp_path / "slow.duckdb")!r}, listen="127.0.0.1:0", uds=None, auth_token=None,
                              app_factory=SlowToClose))
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while "serving on" not in proc.stdout.readline():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "(most recent call first)" in err and "in close" in err, err


def test_sigterm_exits_zero_and_data_survives_restart(spawn):
    proc = spawn()
    scope = pb.Scope(tenant_id="t", user_id="u")
    s = proc.stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="s1"))
    proc.stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id="s1", facts=[
        pb.FactInput(key="env", value="prod", provenance=pb.PROVENANCE_USER_CONFIRMED),
        pb.FactInput(key="svc", value="payment-api", provenance=pb.PROVENANCE_MODEL_INFERRED)]))
    run = proc.stub.StartRun(pb.StartRunRequest(scope=scope, session_id="s1", goal="g"))
    proc.stub.Checkpoint(pb.CheckpointRequest(scope=scope, session_id="s1", run_id=run.run_id, state=b"\x00\x01state",
                                              pending_step="approve restart"))
    proc.stub.UpdateRun(pb.UpdateRunRequest(scope=scope, session_id="s1", run_id=run.run_id,
                                            status=pb.RUN_STATUS_INTERRUPTED))
    started = time.monotonic()
    assert proc.terminate() == 0
    assert time.monotonic() - started < 8

    again = spawn(db_name="proc.duckdb")
    assert again.stub.GetSession(pb.GetSessionRequest(scope=scope, session_id="s1")).session_id == s.session_id
    state = again.stub.GetSessionState(pb.GetSessionStateRequest(scope=scope, session_id="s1"))
    assert [f.key for f in state.confirmed] == ["env"] and [f.key for f in state.candidates] == ["svc"]
    resumed = again.stub.ResumeRun(pb.ResumeRunRequest(scope=scope, session_id="s1", run_id=run.run_id))
    assert resumed.checkpoint.state == b"\x00\x01state" and resumed.run.status == pb.RUN_STATUS_RUNNING
    again.proc.send_signal(signal.SIGINT)
    assert again.proc.wait(timeout=10) == 0


def test_kill9_mid_stream_keeps_every_acknowledged_message(spawn):
    """Append from a client thread, kill -9 the server mid-stream, restart on the same file."""
    import threading

    proc = spawn(db_name="crash.duckdb")
    scope = pb.Scope(tenant_id="t", user_id="u")
    proc.stub.CreateSession(pb.CreateSessionRequest(scope=scope, session_id="s"))
    acked: list[str] = []
    stop = threading.Event()

    def writer(stub):
        i = 0
        while not stop.is_set():
            batch = [pb.NewMessage(role=pb.ROLE_USER, text=f"message {i}-{j} " + "x" * (i % 50),
                                   idempotency_key=f"k{i}-{j}") for j in range(3)]
            try:
                out = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id="s", messages=batch),
                                          timeout=5)
            except (grpc.RpcError, ValueError):  # ValueError: kill9 closed the channel between two calls
                return
            acked.extend(m.text for m in out.messages)
            i += 1

    t = threading.Thread(target=writer, args=(proc.stub,))
    t.start()
    time.sleep(1.5)
    proc.kill9()
    stop.set()
    t.join(timeout=10)
    assert len(acked) > 30

    again = spawn(db_name="crash.duckdb")
    stored = again.stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id="s", newest=10000)).messages
    texts = [m.text for m in stored]
    assert len(texts) == len(set(texts)), "a message was stored twice"
    assert set(acked) <= set(texts), "an acknowledged message was lost"
    assert [m.seq for m in stored] == list(range(1, len(stored) + 1))
    # Batches are atomic: no torn batch (a batch has 3 messages).
    assert len(stored) % 3 == 0
    ok = pb_grpc.ContextServiceStub(again.channel)
    assert ok.GetSession(pb.GetSessionRequest(scope=scope, session_id="s")).message_count == len(stored)


def test_cpus_pins_every_thread_and_bad_lists_are_refused(spawn, tmp_path):
    """--cpus: every thread of the sidecar, those started while serving too, runs on the CPUs named;
    a CPU the process may not use, or text that is no CPU list, stops it at start with a message."""
    import os
    import subprocess
    import sys

    cpu = max(os.sched_getaffinity(0))
    proc = spawn(extra=["--cpus", str(cpu)])
    scope = pb.Scope(tenant_id="t", user_id="u")
    sid = proc.stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    proc.stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query="warm every pool"))
    tasks = os.listdir(f"/proc/{proc.proc.pid}/task")
    assert len(tasks) > 3
    assert {os.sched_getaffinity(int(t)) == {cpu} for t in tasks} == {True}
    assert proc.terminate() == 0
    for spec, said in (("4096", "may run on CPUs"), ("one", "expected CPU numbers")):
        out = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--db", str(tmp_path / "x.duckdb"),
                              "--cpus", spec], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and "--cpus" in out.stderr and said in out.stderr


def test_the_start_up_work_can_be_waited_for(tmp_path):
    """serve takes calls once the start-up threads (word tables, index loads) are done: calls served
    beside them wait for the GIL, the tail of a fresh server."""
    from sidecar.app import Sidecar

    app = Sidecar(str(tmp_path / "w.duckdb"))
    try:
        assert app.wait_warm_up(60.0)
        assert not any(t.is_alive() for t in app._warm_ups) and {t.name for t in app._warm_ups} == {
            "kb-warm-up", "episodic-warm-up"}
        assert app.wait_warm_up(0.0)  # done: no wait
    finally:
        app.close()
