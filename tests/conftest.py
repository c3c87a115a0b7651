"""Test base: a real sidecar (real gRPC server on an ephemeral port, real DuckDB file) and a real
generated client. Each test gets its own tenant, so tests sharing the server never see each other."""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sidecar.api import context_service_pb2 as pb
from sidecar.api import context_service_pb2_grpc as pb_grpc
from sidecar.app import Sidecar
from sidecar.server import build_server

ROOT = Path(__file__).resolve().parent.parent
_tenants = itertools.count(1)


class Running:
    """An in-process server with a client stub."""

    def __init__(self, db_path: str, auth_token: str | None = None, embedder=None) -> None:
        self.db_path = db_path
        self.app = Sidecar(db_path, embedder=embedder)
        self.server, self.port = build_server(self.app, listen="127.0.0.1:0", uds=None, auth_token=auth_token)
        self.server.start()
        self.address = f"127.0.0.1:{self.port}"
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.ContextServiceStub(self.channel)

    def stop(self) -> None:
        self.channel.close()
        self.server.stop(grace=1).wait()
        self.app.close()


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory) -> Iterator[Running]:
    running = Running(str(tmp_path_factory.mktemp("db") / "shared.duckdb"))
    yield running
    running.stop()


@pytest.fixture
def stub(shared_server) -> pb_grpc.ContextServiceStub:
    return shared_server.stub


@pytest.fixture
def fresh_server(tmp_path) -> Iterator[Running]:
    running = Running(str(tmp_path / "fresh.duckdb"))
    yield running
    running.stop()


@pytest.fixture
def scope() -> pb.Scope:
    return pb.Scope(tenant_id=f"t{next(_tenants)}-{os.getpid()}", user_id="alice")


@pytest.fixture
def session_id(stub, scope) -> str:
    return stub.CreateSession(pb.CreateSessionRequest(scope=scope, title="incident")).session_id


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SidecarProcess:
    """`python -m sidecar serve` as a subprocess, for kill -9 and SIGTERM tests."""

    def __init__(self, db_path: str, port: int | None = None, extra: list[str] | None = None) -> None:
        self.db_path = db_path
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sidecar", "serve", "--db", db_path, "--listen", self.address, *(extra or [])],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if "serving on" in line:
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"sidecar exited with {self.proc.returncode}: {line}{self.proc.stdout.read()}")
        else:
            raise RuntimeError("sidecar did not start in 30 s")
        self.channel = grpc.insecure_channel(self.address)
        self.stub = pb_grpc.ContextServiceStub(self.channel)
        self.output = ""  # what it printed after the line above, once terminated

    def kill9(self) -> None:
        self.channel.close()
        self.proc.kill()
        self.proc.wait()

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, then its exit status; what it printed is kept in `output` (read while it stops, so a
        full pipe cannot stall it). 30 s: Kubernetes' default grace period before it kills a pod."""
        self.channel.close()
        self.proc.terminate()
        try:
            self.output, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
            raise AssertionError(f"sidecar still running {timeout} s after SIGTERM; it printed:\n{out[-4000:]}") from None
        return self.proc.returncode


@pytest.fixture
def spawn(tmp_path) -> Iterator:
    procs: list[SidecarProcess] = []

    def start(db_name: str = "proc.duckdb", **kw) -> SidecarProcess:
        p = SidecarProcess(str(tmp_path / db_name), **kw)
        procs.append(p)
        return p

    yield start
    for p in procs:
        if p.proc.poll() is None:
            p.proc.kill()
            p.proc.wait()
