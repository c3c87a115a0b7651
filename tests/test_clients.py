"""The Go and Java client examples (clients/) against a real sidecar subprocess.

Each client is built once per test session by its own build.sh, which skips the work when the
proto, the sources, the scripts and the tool versions are unchanged since its last build (a
content-hash stamp in clients/<lang>/build/.stamp), so reruns only pay for running the clients.
The client then does one whole turn (CreateSession ... CommitTurn) and times BuildContext; every
RPC error makes it exit 1, which fails the test.

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
def go_binary(pytestconfig) -> Path:
    missing = _missing_go()
    if missing:
        _skip_loudly("Go", missing, pytestconfig)
    _build("go", pytestconfig)
    binary = CLIENTS / "go" / "build" / "bin" / "sidecar-example"
    assert binary.is_file() and os.access(binary, os.X_OK), f"{binary} was not built"
    return binary


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

    def __init__(self, workdir: Path) -> None:
        self.log_path = workdir / "sidecar.log"
        last_error = ""
        for _attempt in range(3):  # a free port can be taken between the probe and the bind
            self.address = f"127.0.0.1:{_free_port()}"
            with open(self.log_path, "w") as log:
                self.proc = subprocess.Popen(
                    [sys.executable, "-m", "sidecar", "serve", "--db", str(workdir / "c.duckdb"),
                     "--listen", self.address],
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
