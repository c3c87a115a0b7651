"""The Go and Java clients (clients/) against a real sidecar subprocess.

Each client is built once per test session by its own build.sh, which skips the work when the
proto, the sources, the scripts and the tool versions are unchanged since its last build (a
content-hash stamp in clients/<lang>/build/.stamp), so reruns only pay for running the clients.
The example client then does one whole turn (CreateSession ... CommitTurn) and times BuildContext;
every RPC error makes it exit 1, which fails the test.

For Go there is more: `go test ./...` of the library (package contextsidecar) runs against the
sidecar (SIDECAR_ADDR) and a second one started with --auth-token (SIDECAR_AUTH_ADDR), and the
load generator (cmd/loadgen) is aimed at the sidecar and at bench/assembly.py's floor server.

Without the toolchains (Debian packages: see clients/install-toolchains.sh) the tests are skipped,
loudly; with SIDECAR_REQUIRE_CLIENTS=1 (CI after install-toolchains.sh) a missing toolchain fails
instead.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from sidecar.api import context_service_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = ROOT / "clients"
INSTALL = "clients/install-toolchains.sh"
BUILD_TIMEOUT_S = 600
RUN_TIMEOUT_S = 120
LATENCY_CALLS = 200

pytestmark = pytest.mark.slow


# ---- toolchain detection ------------------------------------------------------------------------

def _missing_go() -> list[str]:
    missing = [t for t in ("bash", "go", "protoc", "protoc-gen-go", "protoc-gen-go-grpc") if shutil.which(t) is None]
    gocode = Path("/usr/share/gocode/src")
    for pkg, deb in (("google.golang.org/grpc", "golang-google-grpc-dev"),
                     ("google.golang.org/protobuf/proto", "golang-google-protobuf-dev"),
                     ("github.com/golang/protobuf/proto/registry.go", "golang-github-golang-protobuf-1-5-dev")):
        if not (gocode / pkg).exists():
            missing.append(f"{gocode / pkg} (Debian package {deb})")
    return missing


def _missing_java() -> list[str]:
    missing = [t for t in ("bash", "javac", "java", "protoc") if shutil.which(t) is None]
    if "bash" in missing:
        return missing
    if not os.access("/usr/bin/grpc_java_plugin", os.X_OK):
        missing.append("/usr/bin/grpc_java_plugin (Debian package protobuf-compiler-grpc-java-plugin)")
    # The jar lists live in one place, clients/java/classpath.sh; ask it what is absent.
    probe = subprocess.run(
        ["bash", "-c", 'source "$1"; for j in "${SIDECAR_RUN_JARS[@]}"; do '
                       '[[ -f "$JAVA_SHARE/$j.jar" ]] || echo "$JAVA_SHARE/$j.jar"; done',
         "probe", str(CLIENTS / "java" / "classpath.sh")],
        capture_output=True, text=True, timeout=30,
    )
    if probe.returncode != 0:
        missing.append(f"clients/java/classpath.sh failed: {probe.stderr.strip()}")
    missing += probe.stdout.split()
    return missing


def _skip_loudly(lang: str, missing: list[str], config: pytest.Config) -> None:
    reason = (f"!!! {lang} CLIENT NOT TESTED: missing {', '.join(missing)}. "
              f"Install the toolchain with `sudo {INSTALL} {lang.lower()}` (Debian packages, offline-friendly).")
    if os.environ.get("SIDECAR_REQUIRE_CLIENTS") == "1":
        pytest.fail(reason + " (SIDECAR_REQUIRE_CLIENTS=1 makes this a failure)")
    # Past pytest's capture, so it shows in the middle of the run, not only in the -ra summary.
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        print(f"\nWARNING: {reason}", file=sys.stderr, flush=True)
    warnings.warn(reason, stacklevel=2)
    pytest.skip(reason)


# ---- building -----------------------------------------------------------------------------------

def _build(lang: str, config: pytest.Config) -> float:
    """Runs clients/<lang>/build.sh under a lock (concurrent pytest runs share the build dir).
    Returns its wall time; build.sh itself returns at once when its stamp is current."""
    build_dir = CLIENTS / lang / "build"
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        t0 = time.monotonic()
        try:
            proc = subprocess.run(["bash", str(CLIENTS / lang / "build.sh")], cwd=ROOT, capture_output=True,
                                  text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"clients/{lang}/build.sh ran over {BUILD_TIMEOUT_S} s:\n{e.stdout}\n{e.stderr}")
        elapsed = time.monotonic() - t0
    if proc.returncode == 3:  # build.sh's "a tool or package is missing"
        _skip_loudly(lang.capitalize(), [proc.stderr.strip()], config)
    assert proc.returncode == 0, (f"clients/{lang}/build.sh failed (rc {proc.returncode}):\n"
                                  f"{proc.stdout}\n{proc.stderr}")
    print(f"clients/{lang}/build.sh: {elapsed:.1f} s: {proc.stdout.strip()}")
    return elapsed


@pytest.fixture(scope="session")
def go_build(pytestconfig) -> Path:
    """clients/go/build/bin, with sidecar-example and sidecar-loadgen built."""
    missing = _missing_go()
    if missing:
        _skip_loudly("Go", missing, pytestconfig)
    _build("go", pytestconfig)
    bin_dir = CLIENTS / "go" / "build" / "bin"
    for name in ("sidecar-example", "sidecar-loadgen"):
        assert os.access(bin_dir / name, os.X_OK), f"{bin_dir / name} was not built"
    return bin_dir


@pytest.fixture(scope="session")
def go_binary(go_build) -> Path:
    return go_build / "sidecar-example"


@pytest.fixture(scope="session")
def java_runner(pytestconfig) -> Path:
    missing = _missing_java()
    if missing:
        _skip_loudly("Java", missing, pytestconfig)
    _build("java", pytestconfig)
    assert (CLIENTS / "java" / "build" / "classes" / "Example.class").is_file(), "Example.class was not built"
    return CLIENTS / "java" / "run.sh"


# ---- the sidecar --------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Sidecar:
    """`python -m sidecar serve` with its output in a file (no pipe to fill up)."""

    def __init__(self, workdir: Path, extra: tuple[str, ...] = ()) -> None:
        self.log_path = workdir / "sidecar.log"
        last_error = ""
        for _attempt in range(3):  # a free port can be taken between the probe and the bind
            self.address = f"127.0.0.1:{_free_port()}"
            with open(self.log_path, "w") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "sidecar", "serve", "--db", str(workdir / "c.duckdb"),
                     "--listen", self.address, *extra],
                    cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env={**os.environ, "SIDECAR_AUTH_TOKEN": ""},
                )
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if "serving on" in self.log_text():
                    return
                if self.proc.poll() is not None:
                    break
                time.sleep(0.05)
            last_error = f"rc={self.proc.poll()}\n{self.log_text()}"
            self.stop()
        raise RuntimeError(f"the sidecar did not start (3 tries); last: {last_error}")

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory) -> Iterator[_Sidecar]:
    running = _Sidecar(tmp_path_factory.mktemp("clients"))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def py_stub(sidecar) -> Iterator[pb_grpc.ContextServiceStub]:
    with grpc.insecure_channel(sidecar.address) as channel:
        yield pb_grpc.ContextServiceStub(channel)


# ---- the checks ---------------------------------------------------------------------------------

def _run_client(cmd: list[str], sidecar: _Sidecar) -> dict:
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT_S,
                              env={**os.environ, "SIDECAR_AUTH_TOKEN": ""})
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{cmd[0]} ran over {RUN_TIMEOUT_S} s:\n{e.stdout}\n{e.stderr}\n"
                    f"--- sidecar log ---\n{sidecar.log_text()[-4000:]}")
    assert proc.returncode == 0, (f"{' '.join(cmd)} exited {proc.returncode}\nstderr: {proc.stderr}\n"
                                  f"stdout: {proc.stdout}\n--- sidecar log ---\n{sidecar.log_text()[-4000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert lines, f"no output; stderr: {proc.stderr}"
    try:
        out = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        pytest.fail(f"last stdout line is not JSON ({e}): {lines[-1]!r}")
    print(lines[-1])
    return out


def _check_turn(out: dict, lang: str, scope: pb.Scope, py_stub) -> None:
    assert out["client"] == lang
    assert out["session_id"], out
    assert out["facts"] == 1, out
    assert out["sections"] > 0, out
    assert "SECTION_KIND_SYSTEM_RULES" in out["section_kinds"], out
    assert out["chat_messages"] > 0, out
    assert out["total_tokens"] > 0, out
    assert out["total_tokens"] <= out["total_budget"], out
    assert out["stable_prefix_hash"], out
    assert out["tool_result_id"], out
    assert isinstance(out["job_ids"], list) and out["job_ids"], out
    assert all(isinstance(j, str) and j for j in out["job_ids"]), out
    assert out["latency_calls"] == LATENCY_CALLS and out["p50_ms"] > 0, out
    # What the client wrote is there for a Python caller of the same scope.
    msgs = py_stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=out["session_id"], newest=10))
    # (Only user/assistant: whether RecordToolResult also stores a TOOL message is the server's call.)
    said = [m for m in msgs.messages if m.role in (pb.ROLE_USER, pb.ROLE_ASSISTANT)]
    assert [m.role for m in said] == [pb.ROLE_USER, pb.ROLE_ASSISTANT]
    assert said[0].text == "查一下生产环境 payment-api 的 5xx"
    assert [m.message_id for m in said] == [out["user_message_id"], out["assistant_message_id"]]


def test_go_client_full_turn(go_binary, sidecar, py_stub):
    scope = pb.Scope(tenant_id=f"clients-go-{os.getpid()}", user_id="alice")
    out = _run_client([str(go_binary), "-addr", sidecar.address, "-tenant", scope.tenant_id,
                       "-user", scope.user_id, "-n", str(LATENCY_CALLS)], sidecar)
    _check_turn(out, "go", scope, py_stub)


def test_java_client_full_turn(java_runner, sidecar, py_stub):
    scope = pb.Scope(tenant_id=f"clients-java-{os.getpid()}", user_id="alice")
    out = _run_client(["bash", str(java_runner), "-addr", sidecar.address, "-tenant", scope.tenant_id,
                       "-user", scope.user_id, "-n", str(LATENCY_CALLS)], sidecar)
    _check_turn(out, "java", scope, py_stub)


def test_go_client_rpc_error_exits_1(go_binary, sidecar):
    """An RPC error (here INVALID_ARGUMENT for a bad tenant id) is a message on stderr and exit 1."""
    proc = subprocess.run([str(go_binary), "-addr", sidecar.address, "-tenant", "bad tenant!", "-n", "0"],
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "CreateSession failed" in proc.stderr and "InvalidArgument" in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_java_client_rpc_error_exits_1(java_runner, sidecar):
    proc = subprocess.run(["bash", str(java_runner), "-addr", sidecar.address, "-tenant", "bad tenant!",
                           "-n", "0"], capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "CreateSession failed" in proc.stderr and "INVALID_ARGUMENT" in proc.stderr, proc.stderr
    assert proc.stdout == ""


# ---- the Go library and the load generator -------------------------------------------------------

AUTH_TOKEN = "go-library-test-token"
# The Go tests that must run and pass against the live sidecars (go test -v prints "--- PASS: <name>").
GO_LIVE_TESTS = ("TestLiveTurn", "TestLiveMemory", "TestLiveKnowledge", "TestLiveRuns", "TestLiveErrorStatus",
                 "TestLiveRetriedWriteIsNotDuplicated", "TestLiveUnavailableIsRetried", "TestLiveDialWaitsForHealth",
                 "TestLiveAuthToken")
GO_UNIT_TESTS = ("TestEveryMethodIsAReadOrAKeyedWrite", "TestKeyedWriteRetriedWithOneKeyAndCallerRequestUnchanged",
                 "TestOnlyUnavailableIsRetried", "TestRetriesStopAtTheDeadline", "TestDeadlines", "TestTokenHeader",
                 "TestBackoff")


@pytest.fixture(scope="module")
def auth_sidecar(tmp_path_factory) -> Iterator[_Sidecar]:
    running = _Sidecar(tmp_path_factory.mktemp("clients-auth"), ("--auth-token", AUTH_TOKEN))
    yield running
    running.stop()


def test_go_library_against_live_sidecar(go_build, sidecar, auth_sidecar):
    """`go test ./...` of clients/go (the library, the example, the load generator) with the live
    tests on: a turn, memory, knowledge, runs, error statuses, a retried write stored once, retries
    while the sidecar is unreachable, Dial's health wait and the bearer token."""
    env = {**os.environ, "SIDECAR_ADDR": sidecar.address, "SIDECAR_AUTH_ADDR": auth_sidecar.address,
           "SIDECAR_AUTH_TEST_TOKEN": AUTH_TOKEN, "SIDECAR_AUTH_TOKEN": ""}
    with open(CLIENTS / "go" / "build" / ".lock", "w") as lock:  # build.sh test rebuilds if a source changed
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            proc = subprocess.run(["bash", str(CLIENTS / "go" / "build.sh"), "test", "-count=1", "-v"], cwd=ROOT,
                                  capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"go test ran over {BUILD_TIMEOUT_S} s:\n{e.stdout}\n{e.stderr}")
    out = proc.stdout + proc.stderr
    print(out)
    assert proc.returncode == 0, (f"go test failed (rc {proc.returncode}):\n{out[-8000:]}\n"
                                  f"--- sidecar log ---\n{sidecar.log_text()[-4000:]}")
    not_passed = [t for t in GO_LIVE_TESTS + GO_UNIT_TESTS if f"--- PASS: {t} " not in out]
    assert not not_passed, f"these Go tests did not run and pass: {not_passed}\n{out[-8000:]}"
    assert "--- SKIP" not in out, f"a Go test skipped although both sidecars run:\n{out[-8000:]}"


def _loadgen(bin_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(bin_dir / "sidecar-loadgen"), *args], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, env={**os.environ, "SIDECAR_AUTH_TOKEN": ""})


def _loadgen_json(bin_dir: Path, *args: str) -> dict:
    proc = _loadgen(bin_dir, *args)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(out)
    assert out["load_generator"] == "go" and out["method"] == "/context_sidecar.v1.ContextService/BuildContext", out
    assert out["calls"] > 0 and out["errors"] == 0 and out["error_codes"] == {}, out
    assert out["throughput_rps"] > 0 and 0 < out["p50_ms"] <= out["p99_ms"], out
    return out


def test_go_loadgen_sidecar_and_floor(go_build, sidecar, py_stub, tmp_path):
    """The load generator against the sidecar (a protojson request) and against bench/assembly.py's
    floor server (the same request in binary, answered with fixed bytes)."""
    from google.protobuf import json_format

    scope = pb.Scope(tenant_id=f"clients-loadgen-{os.getpid()}", user_id="alice")
    sid = py_stub.CreateSession(pb.CreateSessionRequest(scope=scope)).session_id
    py_stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=pb.ROLE_USER, text="payment-api 5xx in production?")]))
    req = pb.BuildContextRequest(scope=scope, session_id=sid, query="payment-api 5xx", system_rules="Be brief.",
                                 render=pb.RENDER_MODE_CHAT)
    (tmp_path / "req.json").write_text(json_format.MessageToJson(req))
    (tmp_path / "req.bin").write_bytes(req.SerializeToString())
    answer = py_stub.BuildContext(req).SerializeToString()
    (tmp_path / "answer.bin").write_bytes(answer)

    common = ("-c", "4", "-duration", "1s", "-warmup", "300ms")
    served = _loadgen_json(go_build, "-addr", sidecar.address, "-request", str(tmp_path / "req.json"),
                           "-server-pid", str(sidecar.proc.pid), "-health", *common)
    assert served["decoded"] is True and served["server_cpu_ms_per_call"] > 0, served
    assert served["concurrency"] == 4 and served["request_bytes"] == len(req.SerializeToString()), served

    floor_log = tmp_path / "floor.log"
    address = f"127.0.0.1:{_free_port()}"
    with open(floor_log, "w") as log:
        floor = subprocess.Popen([sys.executable, str(ROOT / "bench" / "assembly.py"), "--floor",
                                  str(tmp_path / "answer.bin"), "--listen", address],
                                 cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while "serving on" not in floor_log.read_text() and floor.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert floor.poll() is None, floor_log.read_text()
        floored = _loadgen_json(go_build, "-addr", address, "-method", "BuildContext",
                                "-request", str(tmp_path / "req.bin"), *common)
        assert floored["response_bytes"] == len(answer), (floored, len(answer))
        # No health service on the floor: -health says so instead of hanging.
        proc = _loadgen(go_build, "-addr", address, "-request", str(tmp_path / "req.bin"), "-health", *common)
        assert proc.returncode == 2 and "no grpc.health.v1 service" in proc.stderr, proc.stderr
    finally:
        floor.terminate()
        floor.wait(timeout=15)

    # A mistake stops at the probe call, with the status on stderr and exit 2.
    proc = _loadgen(go_build, "-addr", sidecar.address, "-method", "NoSuchMethod", "-request", str(tmp_path / "req.bin"))
    assert proc.returncode == 2 and "has no such method" in proc.stderr, proc.stderr
    bad = pb.BuildContextRequest(scope=pb.Scope(tenant_id="bad tenant!", user_id="u"), session_id=sid)
    (tmp_path / "bad.bin").write_bytes(bad.SerializeToString())
    proc = _loadgen(go_build, "-addr", sidecar.address, "-request", str(tmp_path / "bad.bin"), *common)
    assert proc.returncode == 2 and "InvalidArgument" in proc.stderr, proc.stderr
