"""`python -m sidecar call`: any RPC with JSON through server reflection, against a live in-process
server, run as the command it is (a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, Running, free_port


def call(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SIDECAR_AUTH_TOKEN", "CONTEXT_SIDECAR_ADDRESS")}
    return subprocess.run([sys.executable, "-m", "sidecar", "call", *args], cwd=ROOT, env=env, input=stdin,
                          capture_output=True, text=True, timeout=60)


def answer(*args: str, stdin: str | None = None) -> dict:
    out = call(*args, stdin=stdin)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def one_line_error(out: subprocess.CompletedProcess, code: int) -> str:
    assert out.returncode == code and "Traceback" not in out.stderr, (out.returncode, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("context-sidecar: ") and not out.stdout, out.stderr
    return lines[0]


def test_create_append_and_build_through_the_command_line(shared_server, scope):
    at = ["--address", shared_server.address]
    who = {"tenant_id": scope.tenant_id, "user_id": scope.user_id}
    session = answer("CreateSession", json.dumps({"scope": who, "title": "incident"}), *at)
    sid = session["session_id"]
    appended = answer("AppendMessages", "-", *at, stdin=json.dumps({"scope": who, "session_id": sid, "messages": [
        {"role": "ROLE_USER", "text": "payment-api returns 5xx in prod since the 14:05 deploy"}]}))
    assert appended["messages"][0]["seq"] == "1"  # int64 is a string in protobuf's JSON mapping
    built = answer("context_sidecar.v1.ContextService/BuildContext",
                   json.dumps({"scope": who, "session_id": sid, "query": "why the 5xx?", "render": "RENDER_MODE_TEXT"}), *at)
    texts = [item["text"] for section in built["sections"] for item in section.get("items", [])]
    assert any("14:05 deploy" in t for t in texts) and "why the 5xx?" in texts
    assert "14:05 deploy" in built["rendered_text"] and built["total_tokens"] > 0


def test_list_names_every_rpc(shared_server):
    out = call("--list", "--address", shared_server.address)
    assert out.returncode == 0, out.stderr
    rows = dict(line.split(None, 1) for line in out.stdout.splitlines())
    assert rows["BuildContext"] == "BuildContextRequest -> BuildContextResponse"
    assert {"CreateSession", "AppendMessages", "ForgetUser", "QueryGraph"} <= rows.keys()


@pytest.mark.parametrize(("args", "said"), [
    (("BuildContxt", "{}"), "unknown RPC 'BuildContxt'; did you mean BuildContext?"),
    (("Nothing", "{}"), "unknown RPC 'Nothing'; `python -m sidecar call --list` lists them"),
    (("GetSession", '{"scope": '), "the GetSession request is not valid JSON: Expecting value"),
    (("GetSession", '{"scope": {"tenant": "t"}}'), 'has no field named "tenant"'),
    (("GetSession", '{"scope": {"tenant_id": 7}}'), "does not fit GetSessionRequest"),
])
def test_a_bad_rpc_name_or_request_is_one_line_with_exit_2(args, said, shared_server):
    assert said in one_line_error(call(*args, "--address", shared_server.address), 2)


def test_a_failed_rpc_prints_its_status_with_exit_1(shared_server, scope):
    request = {"scope": {"tenant_id": scope.tenant_id, "user_id": scope.user_id}, "session_id": "no-such-session"}
    line = one_line_error(call("GetSession", json.dumps(request), "--address", shared_server.address), 1)
    assert line.startswith("context-sidecar: GetSession: NOT_FOUND: ") and "no-such-session" in line


def test_no_sidecar_at_the_address_is_said_at_once():
    started = time.monotonic()
    line = one_line_error(call("--list", "--address", f"127.0.0.1:{free_port()}"), 2)
    assert "no sidecar answering on 127.0.0.1:" in line and time.monotonic() - started < 10


def test_the_token_goes_with_the_call(tmp_path):
    server = Running(str(tmp_path / "auth.duckdb"), auth_token="s3cret")
    try:
        request = json.dumps({"scope": {"tenant_id": "t", "user_id": "u"}})
        line = one_line_error(call("CreateSession", request, "--address", server.address), 1)
        assert "UNAUTHENTICATED" in line  # reflection needs no token; the call does
        assert answer("CreateSession", request, "--address", server.address, "--token", "s3cret")["session_id"]
    finally:
        server.stop()
