"""The OpsPilot demo (sidecar.demo) runs end to end against a real server and prints what it promises."""

from __future__ import annotations

import pytest

from sidecar import demo
from tests.conftest import Running


def test_demo_runs_end_to_end(fresh_server, capsys):
    rc = demo.main(["--address", fresh_server.address, "--tenant", "opspilot-test"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "-- PINNED_CONSTRAINTS" in out
    pinned = out.split("-- PINNED_CONSTRAINTS", 1)[1].split("\n-- ", 1)[0]
    assert "不要重启生产实例" in pinned
    knowledge = _blocks(out, "KNOWLEDGE", "SESSION_RECALL")  # a session's first recall is kept (cache-aware)
    assert "kb:rb-payment-5xx@v1#" in knowledge and "graph:" in knowledge
    assert "kb:rb-prod-restart" in out.split("roles [support]", 1)[0]  # the SRE-only runbook, for the sre caller
    assert "roles [support] see documents: kb:rb-payment-5xx\n" in out  # ...and never for support
    assert "candidates hypothesis=payment-db connection pool exhausted (MODEL_INFERRED)" in out
    assert "fact hypothesis confirmed by TOOL_VERIFIED" in out
    assert "INTERRUPTED (awaiting human approval)" in out
    assert "resumed: RUNNING" in out and '"env": "staging"' in out
    assert "memory:" in _blocks(out, "MEMORIES", "SESSION_RECALL")
    assert "-- dropped: " in out and "-- knowledge_status: MATCHED" in out


def _blocks(out: str, *names: str) -> str:
    """The printed sections of these kinds, joined."""
    return "\n".join(part.split("\n-- ", 1)[0] for name in names for part in out.split(f"-- {name} ")[1:])


def test_demo_reports_a_missing_sidecar(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert demo.main(["--address", f"127.0.0.1:{port}", "--connect-timeout", "1"]) == 2
    assert "no sidecar answering" in capsys.readouterr().err


@pytest.fixture
def guarded_server(tmp_path):
    running = Running(str(tmp_path / "guarded.duckdb"), auth_token="s3cret-token")
    yield running
    running.stop()


def test_demo_without_the_token_says_how_to_give_it(guarded_server, monkeypatch, capsys):
    monkeypatch.delenv("SIDECAR_AUTH_TOKEN", raising=False)
    assert demo.main(["--address", guarded_server.address, "--tenant", "opspilot-noauth"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "UNAUTHENTICATED" in err[0] and "SIDECAR_AUTH_TOKEN" in err[0], err


def test_demo_takes_the_token_from_the_environment(guarded_server, monkeypatch, capsys):
    monkeypatch.setenv("SIDECAR_AUTH_TOKEN", "s3cret-token")
    rc = demo.main(["--address", guarded_server.address, "--tenant", "opspilot-envauth"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "-- knowledge_status: MATCHED" in out
