"""The config file of `serve`: every knob in one TOML file, the shipped example equal to the defaults,
precedence flag > environment variable > file > default, `--print-config`, and one-line errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from sidecar import cli
from sidecar.api import context_service_pb2 as pb
from sidecar.app import Settings
from sidecar.config import KNOBS, ConfigError, Level, example, load, read_file, tomllib
from tests.conftest import ROOT

EXAMPLE = ROOT / "deploy" / "sidecar.example.toml"


def parse(*argv: str) -> object:
    return cli.build_parser().parse_args(["serve", *argv])


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "sidecar.toml"
    path.write_text(text)
    return str(path)


@pytest.fixture(autouse=True)
def no_sidecar_environment(monkeypatch):
    """What the developer's shell sets must not leak into these tests (load() reads os.environ)."""
    for name in list(os.environ):
        if name.startswith("SIDECAR_"):
            monkeypatch.delenv(name)


def test_the_example_is_made_from_the_table_and_holds_every_default():
    assert EXAMPLE.read_text() == example(), \
        "deploy/sidecar.example.toml is out of date: python -m sidecar.config > deploy/sidecar.example.toml"
    assert read_file(str(EXAMPLE)) == {key: knob.default for key, knob in KNOBS.items()}
    config = load(parse("--config", str(EXAMPLE)), environ={})
    assert set(config.levels.values()) == {Level.FILE}
    assert config.settings() == Settings()  # the file's defaults are the code's


def test_every_settings_field_has_a_knob():
    """A field added to Settings (or to its compression settings) without a key in the file fails here."""
    named = {k.settings for k in KNOBS.values() if k.settings}
    fields = {f for f in Settings.__dataclass_fields__ if f != "compression"}
    fields |= {f"compression.{f}" for f in Settings().compression.__dataclass_fields__}
    assert named == fields


@pytest.mark.parametrize(("flag", "env", "file", "expected", "level"), [
    (None, None, None, 100_000, Level.DEFAULT),
    (None, None, 300, 300, Level.FILE),
    (None, "200", 300, 200, Level.ENVIRONMENT),
    ("100", "200", 300, 100, Level.FLAG),
    ("100", None, 300, 100, Level.FLAG),
    (None, " ", 300, 300, Level.FILE),  # an empty variable counts as not set
])
def test_flag_beats_environment_beats_file_beats_default(flag, env, file, expected, level, tmp_path):
    argv = ["--config", write(tmp_path, f"[storage]\ncache_messages = {file}\n")] if file is not None else []
    argv += ["--cache-messages", flag] if flag is not None else []
    config = load(parse(*argv), environ={"SIDECAR_CACHE_MESSAGES": env} if env is not None else {})
    assert (config["storage.cache_messages"], config.levels["storage.cache_messages"]) == (expected, level)


def test_the_config_file_comes_from_the_flag_or_the_environment(tmp_path):
    by_flag = write(tmp_path, '[server]\nlog_level = "debug"\n')
    by_env = tmp_path / "other.toml"
    by_env.write_text('[server]\nlog_level = "warning"\n')
    assert load(parse(), environ={"SIDECAR_CONFIG": str(by_env)})["server.log_level"] == "WARNING"
    config = load(parse("--config", by_flag), environ={"SIDECAR_CONFIG": str(by_env)})
    assert config["server.log_level"] == "DEBUG" and config.path == by_flag  # choices match in any case


def test_knobs_that_live_in_code_reach_the_settings(tmp_path):
    path = write(tmp_path, """
[memory]
min_confidence = 0.5
episodic_turns = 1000
[knowledge]
threshold = 0.35
[compression]
view_tokens = 900
summary_window_tokens = 2000
[jobs]
poll_s = 0.25
[storage]
feed_poll_ms = 100
duckdb_memory = "64MB"
""")
    settings = load(parse("--config", path, "--episodic-turns", "2000"), environ={}).settings()
    assert (settings.min_confidence, settings.knowledge_threshold, settings.job_poll_s) == (0.5, 0.35, 0.25)
    assert (settings.compression.view_tokens, settings.compression.summary_window_tokens) == (900, 2000)
    assert settings.compression.brief_tokens == Settings().compression.brief_tokens  # untouched: the default
    assert (settings.feed_poll_ms, settings.duckdb_memory, settings.episodic_turns) == (100, "64MB", 2000)


@pytest.mark.parametrize(("argv", "env", "file", "expected"), [
    ([], {}, 'port = 9100\nlisten = ""', ("127.0.0.1", 9100)),  # a copied example keeps listen = ""
    ([], {}, 'port = 9100\nlisten = "0.0.0.0:9464"', ("0.0.0.0", 9464)),  # same level: listen wins
    ([], {"SIDECAR_METRICS_LISTEN": "0.0.0.0:9464"}, "port = 9100", ("0.0.0.0", 9464)),
    ([], {"SIDECAR_METRICS_PORT": "9200"}, 'listen = "0.0.0.0:9464"', ("127.0.0.1", 9200)),
    (["--metrics-port", "0"], {}, 'listen = "0.0.0.0:9464"', None),  # a flag turns it off
])
def test_metrics_address_across_levels(argv, env, file, expected, tmp_path):
    args = parse("--config", write(tmp_path, f"[metrics]\n{file}\n"), *argv)
    at = cli.metrics_address(args, load(args, environ=env))
    assert (None if at is None else (at.host, at.port)) == expected


def test_listen_or_uds_given_at_the_highest_level_wins(tmp_path):
    path = write(tmp_path, '[server]\nlisten = "127.0.0.1:50051"\nuds = "/tmp/s.sock"\n')
    assert load(parse("--config", path), environ={}).winner("server.uds", "server.listen") == "server.uds"
    flagged = load(parse("--config", path, "--listen", "0.0.0.0:1"), environ={})
    assert flagged.winner("server.uds", "server.listen") == "server.listen"
    plain = load(parse(), environ={})
    assert plain.winner("server.uds", "server.listen") == "server.listen"


def test_the_token_from_a_file_a_variable_or_inline(tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    path = write(tmp_path, f'[auth]\ntoken = ""\ntoken_file = "{token_file}"\ntoken_env = "AGENT_TOKEN"\n')
    assert load(parse("--config", path), environ={}).auth_token() == "from-file"  # same level: file before env
    assert load(parse("--config", path), environ={"SIDECAR_AUTH_TOKEN": "from-env"}).auth_token() == "from-env"
    assert load(parse("--config", path, "--auth-token", "flag")).auth_token() == "flag"
    by_name = write(tmp_path, '[auth]\ntoken_env = "AGENT_TOKEN"\n')
    assert load(parse("--config", by_name), environ={}).auth_token({"AGENT_TOKEN": "named"}) == "named"
    with pytest.raises(ConfigError, match="the environment variable AGENT_TOKEN is not set"):
        load(parse("--config", by_name), environ={}).auth_token({})
    with pytest.raises(ConfigError, match=r"--auth-token-file .*absent: cannot read the token \(No such file"):
        load(parse("--auth-token-file", str(tmp_path / "absent")), environ={}).auth_token()
    assert load(parse(), environ={}).auth_token() is None


def test_file_values_for_the_environment_readers_are_exported(tmp_path):
    path = write(tmp_path, '[llm]\nbase_url = "http://llm:8000/v1"\nmodel = "m"\n[embedder]\nthreads = 2\n')
    environ = {"SIDECAR_LLM_MODEL": "from-env"}
    load(parse("--config", path), environ=environ).export_environment(environ)
    assert environ == {"SIDECAR_LLM_BASE_URL": "http://llm:8000/v1", "SIDECAR_LLM_MODEL": "from-env",
                       "SIDECAR_MODEL_THREADS": "2"}


def test_print_config_shows_what_is_in_force_with_secrets_hidden(tmp_path, capsys, monkeypatch):
    path = write(tmp_path, '[storage]\nstore = "postgres://agent:hunter2@db:5432/x"\n[llm]\napi_key = "sk-abc"\n')
    monkeypatch.setenv("SIDECAR_AUTH_TOKEN", "s3cret-token")
    assert cli.main(["serve", "--config", path, "--rate-per-tenant", "5", "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "s3cret-token" not in out and "hunter2" not in out and "sk-abc" not in out
    printed = tomllib.loads(out)
    assert printed["auth"]["token"] == "***" and printed["llm"]["api_key"] == "***"
    assert printed["storage"]["store"] == "postgres://agent:***@db:5432/x"
    assert printed["server"]["rate_per_tenant"] == 5.0 and printed["server"]["listen"] == "127.0.0.1:50051"
    assert 'rate_per_tenant = 5.0  # --rate-per-tenant' in out and 'token = "***"  # SIDECAR_AUTH_TOKEN' in out
    assert f"api_key = \"***\"  # llm.api_key ({path})" in out
    assert {f"{s}.{k}" for s, table in printed.items() for k in table} == set(KNOBS)


@pytest.mark.parametrize(("text", "said"), [
    ('[server]\nlisen = "0.0.0.0:1"\n', "unknown key server.lisen (did you mean server.listen?)"),
    ('[nope]\nx = 1\n', "unknown key nope.x"),
    ('listen = "0.0.0.0:1"\n', "unknown key listen"),
    ('[server]\nrate_per_tenant = "fast"\n', "server.rate_per_tenant: expected a number, got a string"),
    ('[storage]\ncache_messages = 1.5\n', "storage.cache_messages: expected a whole number, got a number"),
    ('[otel]\nenabled = "yes"\n', "otel.enabled: expected true or false, got a string"),
    ('[compression]\nview_tokens = [1]\n', "compression.view_tokens: expected a whole number, got a list"),
    ('[embedder]\nname = "bert"\n', 'embedder.name = "bert" ('),
    ('[memory]\nmin_confidence = 2\n', "memory.min_confidence = 2.0 ("),
    ('[storage]\ncache_messages = 0\n', "must be at least 1"),
    ('[server\n', "not valid TOML"),
])
def test_a_bad_file_is_one_line_naming_the_key(text, said, tmp_path, capsys):
    assert cli.main(["serve", "--config", write(tmp_path, text), "--print-config"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("context-sidecar: ") and said in err[0], err


def test_a_bad_environment_variable_or_missing_file_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SIDECAR_CACHE_MESSAGES", "many")
    assert cli.main(["serve", "--print-config"]) == 2
    assert "SIDECAR_CACHE_MESSAGES='many': expected a whole number" in capsys.readouterr().err
    monkeypatch.delenv("SIDECAR_CACHE_MESSAGES")
    assert cli.main(["serve", "--config", str(tmp_path / "absent.toml")]) == 2
    assert "cannot read the config file" in capsys.readouterr().err


def test_serve_exits_2_on_a_bad_file_before_opening_anything(tmp_path):
    db = tmp_path / "x.duckdb"
    path = write(tmp_path, f'[storage]\ndb = "{db}"\n[server]\nrate_per_tenant = "fast"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    out = subprocess.run([sys.executable, "-m", "sidecar", "serve", "--config", path], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr.strip() == f"context-sidecar: {path}: server.rate_per_tenant: expected a number, got a string"
    assert not db.exists()


def test_a_served_sidecar_takes_its_settings_from_the_file(spawn, tmp_path, monkeypatch):
    """listen and db come from the conftest's flags; the token from a file named in the config file."""
    token_file = tmp_path / "token"
    token_file.write_text("file-token\n")
    path = write(tmp_path, f'[auth]\ntoken_file = "{token_file}"\n[server]\nlog_level = "DEBUG"\n')
    for name in [n for n in os.environ if n.startswith("SIDECAR_")]:
        monkeypatch.delenv(name)
    server = spawn(extra=["--config", path])
    scope = pb.Scope(tenant_id="t", user_id="u")
    with pytest.raises(grpc.RpcError) as refused:
        server.stub.CreateSession(pb.CreateSessionRequest(scope=scope))
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    server.stub.CreateSession(pb.CreateSessionRequest(scope=scope), metadata=[("authorization", "Bearer file-token")])
    assert server.terminate() == 0
    log = server.output
    assert "rpc method=CreateSession code=UNAUTHENTICATED" in log  # log_level from the file
    assert "file-token" not in log
