"""The OpsPilot demo (sidecar.demo) runs end to end against a real server and prints what it promises."""

from __future__ import annotations

from sidecar import demo


def test_demo_runs_end_to_end(fresh_server, capsys):
    rc = demo.main(["--address", fresh_server.address, "--tenant", "opspilot-test"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "-- PINNED_CONSTRAINTS" in out
    pinned = out.split("-- PINNED_CONSTRAINTS", 1)[1].split("\n-- ", 1)[0]
    assert "不要重启生产实例" in pinned
    knowledge = out.split("-- KNOWLEDGE", 1)[1].split("\n-- ", 1)[0]
    assert "kb:rb-payment-5xx@v1#" in knowledge and "graph:" in knowledge
    assert "kb:rb-prod-restart" in out.split("roles [support]", 1)[0]  # the SRE-only runbook, for the sre caller
    assert "roles [support] see documents: kb:rb-payment-5xx\n" in out  # ...and never for support
    assert "candidates hypothesis=payment-db connection pool exhausted (MODEL_INFERRED)" in out
    assert "fact hypothesis confirmed by TOOL_VERIFIED" in out
    assert "INTERRUPTED (awaiting human approval)" in out
    assert "resumed: RUNNING" in out and '"env": "staging"' in out
    assert "memory:" in out.split("-- MEMORIES", 1)[1].split("\n-- ", 1)[0]
    assert "-- dropped: " in out and "-- knowledge_status: MATCHED" in out


def test_demo_reports_a_missing_sidecar(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert demo.main(["--address", f"127.0.0.1:{port}", "--connect-timeout", "1"]) == 2
    assert "no sidecar answering" in capsys.readouterr().err
