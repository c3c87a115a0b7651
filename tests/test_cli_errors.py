"""`python -m sidecar serve` that cannot start says what is wrong and what to do in one line on
stderr, exits with code 2 and shows no traceback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from sidecar.index.embedders import model_installed
from tests.conftest import ROOT

ANY_PORT = "127.0.0.1:0"  # for the cases that fail before binding


def serve_fails(*args: str, env: dict[str, str] | None = None, prefix: tuple[str, ...] = ()) -> str:
    """Runs `serve` with no SIDECAR_* variables but `env`; returns its one line of stderr."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    proc = subprocess.run([*prefix, sys.executable, "-m", "sidecar", "serve", *args], cwd=ROOT,
                          env={**clean, **(env or {})}, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("context-sidecar: ")
    return lines[0]


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.mark.parametrize("flag", ["--listen", "--metrics-listen"])
def test_port_in_use(flag, taken_port, tmp_path):
    db = tmp_path / "sidecar.duckdb"
    listen = ["--listen", ANY_PORT] if flag != "--listen" else []
    line = serve_fails("--db", str(db), *listen, flag, f"127.0.0.1:{taken_port}")
    assert f"{flag} 127.0.0.1:{taken_port}: the port is already in use" in line and "free port" in line
    assert not db.exists()  # found before the database was opened


def test_database_locked_by_another_sidecar(spawn):
    first = spawn("shared.duckdb")
    line = serve_fails("--db", first.db_path, "--listen", ANY_PORT)
    assert f"{first.db_path} is locked by process {first.proc.pid}" in line and "own --db" in line


def _without_file_permission_override() -> tuple[str, ...]:
    """root writes anywhere; without these capabilities its file permissions hold as anyone's."""
    if os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root needs setpriv (util-linux) to drop the file-permission override")
    return ("setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--")


@pytest.mark.parametrize("db", ["new-dir/sidecar.duckdb", "sidecar.duckdb"])
def test_unwritable_data_dir(db, tmp_path):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    try:
        line = serve_fails("--db", str(read_only / db), "--listen", ANY_PORT,
                           prefix=_without_file_permission_override())
    finally:
        read_only.chmod(0o755)
    assert f"cannot write {read_only / db.split('/')[0]} (permission denied)" in line and "writable" in line


@pytest.mark.parametrize(("store", "expected"), [
    ("postgresql://nohost:1/x", "--store postgresql://nohost:1/x: failed to resolve host 'nohost'"),
    ("postgresql://agent:hunter2@127.0.0.1:1/x?schema=s", "--store postgresql://agent:***@127.0.0.1:1/x?schema=s: "
                                                          "connection failed"),
    ("postgres://[nohost/x", "--store: not a valid URL"),
    ("mysql://db/x", "--store takes a postgres:// or postgresql:// URL"),
])
def test_bad_store_url(store, expected):
    line = serve_fails("--store", store, "--listen", ANY_PORT)
    assert expected in line and "hunter2" not in line


def test_bad_store_url_from_the_environment():
    line = serve_fails("--listen", ANY_PORT, env={"SIDECAR_STORE": "postgresql://nohost:1/x"})
    assert "failed to resolve host 'nohost'" in line and "SIDECAR_STORE" in line


def test_missing_model_extra():
    if model_installed():
        pytest.skip("the model extra is installed here")
    line = serve_fails("--embedder", "minilm", "--listen", ANY_PORT)
    assert "needs the 'model' extra" in line and "pip install" in line


@pytest.mark.parametrize("given", ["--tls-cert", "--tls-key"])
def test_tls_needs_both_cert_and_key(given, tmp_path):
    pem = tmp_path / "only.pem"
    pem.write_text("unused")
    line = serve_fails(given, str(pem), "--listen", ANY_PORT)
    assert "--tls-cert and --tls-key go together" in line


def test_tls_files_that_are_not_a_certificate_and_key(tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("not a certificate")
    key.write_text("not a key")
    line = serve_fails("--tls-cert", str(cert), "--tls-key", str(key), "--listen", ANY_PORT)
    assert "not a PEM certificate chain and its matching, unencrypted private key" in line
    missing = serve_fails("--tls-cert", str(tmp_path / "absent.pem"), "--tls-key", str(key), "--listen", ANY_PORT)
    assert f"cannot read {tmp_path / 'absent.pem'}" in missing
