"""Every setting of `python -m sidecar serve` in one table: its key in the TOML config file, its flag
and environment variable where it has them, its default and the one text that documents it. The
flags and their --help, `serve --print-config` and deploy/sidecar.example.toml are all made from it.

Precedence: flag > environment variable > config file (--config or SIDECAR_CONFIG) > default.
`python -m sidecar.config` prints the example file."""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, replace
from enum import IntEnum
from itertools import groupby
from typing import Any
from urllib.parse import urlsplit, urlunsplit

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, from PyPI, before it joined the standard library
    import tomli as tomllib

from sidecar.app import Settings
from sidecar.index.embedders import EMBEDDERS
from sidecar.llm import ChatClient

CONFIG_ENV = "SIDECAR_CONFIG"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class ConfigError(Exception):
    """A setting the person starting the sidecar can fix; printed as one line, exit code 2."""


def redact_url(url: str) -> str:
    """The URL with its password, if any, shown as ***."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not a URL urllib can take apart: hide whatever stands between ':' and '@'
        return re.sub(r"(//[^/@]*?:)[^/@]*@", r"\1***@", url)
    if parts.password is None:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@", 1)))


def _secret(value: str) -> str:
    return "***" if value else ""


@dataclass(frozen=True)
class Knob:
    key: str  # "section.name" in the config file
    default: Any  # its type is the setting's type: str, int, float or bool
    help: str
    flag: str | None = None
    env: str | None = None
    settings: str | None = None  # the Settings field it fills ("compression.view_tokens": a nested one)
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    maximum: float | None = None
    shown: Callable[[str], str] | None = None  # how a secret is printed
    group: str | None = None  # flags of one group exclude each other
    # Read from the environment by the code that uses it (the LLM client, the model): a value from the
    # file is put there before the sidecar starts.
    exported: bool = False

    @property
    def section(self) -> str:
        return self.key.partition(".")[0]

    @property
    def name(self) -> str:
        return self.key.partition(".")[2]

    @property
    def dest(self) -> str:
        """The argparse attribute of its flag."""
        return (self.flag or "").lstrip("-").replace("-", "_")

    def show(self, value: Any) -> Any:
        """The value as printed: a secret hidden."""
        return self.shown(value) if self.shown and isinstance(value, str) else value


def _setting(key: str, field: str, help: str, **kw: Any) -> Knob:
    """A knob whose default is the in-code default of a Settings field, so the two cannot differ."""
    value: Any = Settings()
    for part in field.split("."):
        value = getattr(value, part)
    return Knob(key, value, help, settings=field, **kw)


_LLM_DEFAULTS = inspect.signature(ChatClient).parameters  # the client's own defaults, documented as they are

KNOBS: dict[str, Knob] = {k.key: k for k in (
    Knob("server.listen", "127.0.0.1:50051", "HOST:PORT the gRPC server binds; 0.0.0.0:50051 in a container.",
         flag="--listen", group="where"),
    Knob("server.uds", "", "Unix socket path to serve on instead of TCP; empty: TCP. Where listen and uds are "
         "both given at the same level, uds wins.", flag="--uds", group="where"),
    Knob("server.log_level", "INFO", "DEBUG (adds one line per call with its method, status and time, never "
         "message content), INFO, WARNING, ERROR or CRITICAL.", flag="--log-level", env="SIDECAR_LOG_LEVEL",
         choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")),
    Knob("server.cpus", "", "Run on these CPUs only, e.g. \"1\" or \"0,2-3\"; empty: any. One core keeps the gRPC "
         "threads' hand-offs on one cache: lower latency (README: Running it).", flag="--cpus", env="SIDECAR_CPUS"),
    Knob("server.rate_per_tenant", 0.0, "Requests per second allowed per tenant before RESOURCE_EXHAUSTED; "
         "0: no limit.", flag="--rate-per-tenant", env="SIDECAR_RATE_PER_TENANT", minimum=0),

    Knob("auth.token", "", "Shared secret clients send as 'authorization: Bearer ...'; empty: no "
         "authentication. Prefer token_file or token_env over a token given inline. Of token, token_file and "
         "token_env the one given at the highest level is used (at the same level, in that order).",
         flag="--auth-token", env="SIDECAR_AUTH_TOKEN", shown=_secret),
    Knob("auth.token_file", "", "File holding the token, e.g. a mounted Kubernetes Secret; whitespace around it "
         "is ignored.", flag="--auth-token-file", env="SIDECAR_AUTH_TOKEN_FILE"),
    Knob("auth.token_env", "", "Name of an environment variable holding the token."),

    Knob("tls.cert", "", "PEM certificate chain: serve gRPC over TLS (with key); empty: plaintext.",
         flag="--tls-cert", env="SIDECAR_TLS_CERT"),
    Knob("tls.key", "", "PEM private key of cert, unencrypted.", flag="--tls-key", env="SIDECAR_TLS_KEY"),

    Knob("metrics.listen", "", "HOST:PORT to serve Prometheus metrics on, e.g. 0.0.0.0:9464 in a pod; empty: "
         "off.", flag="--metrics-listen", env="SIDECAR_METRICS_LISTEN", group="metrics"),
    Knob("metrics.port", 0, "Serve Prometheus metrics on 127.0.0.1:PORT; 0: off. Where listen and port are both "
         "given at the same level, listen wins.", flag="--metrics-port", env="SIDECAR_METRICS_PORT",
         group="metrics", minimum=0, maximum=65535),

    Knob("storage.db", "./data/sidecar.duckdb", "DuckDB file holding everything (the knowledge indexes are "
         "saved beside it).", flag="--db"),
    Knob("storage.store", "", "postgres://USER:PASSWORD@HOST:PORT/DB to share memory and knowledge between "
         "replicas; empty: the db file.", flag="--store", env="SIDECAR_STORE", shown=redact_url),
    _setting("storage.duckdb_memory", "duckdb_memory", "DuckDB's buffer pool limit.", flag="--duckdb-memory",
             env="SIDECAR_DUCKDB_MEMORY"),
    _setting("storage.cache_messages", "cache_messages", "Messages the cached session views hold in all, least "
             "recently used out.", flag="--cache-messages", env="SIDECAR_CACHE_MESSAGES", minimum=1),
    _setting("storage.feed_poll_ms", "feed_poll_ms", "On a shared PostgreSQL store: milliseconds between reads "
             "of the other replicas' writes.", minimum=1),
    _setting("storage.index_save_every_s", "index_save_every_s", "Seconds between saves of the changed "
             "knowledge indexes beside the db file.", minimum=0.01),

    _setting("embedder.name", "embedder", "hash: no model; minilm: the local all-MiniLM-L6-v2 embeds memories, "
             "documents, queries and past turns (the 'model' extra); use: the local multilingual Universal "
             "Sentence Encoder does, Chinese included (the 'multilingual' extra).", flag="--embedder",
             env="SIDECAR_EMBEDDER",
             choices=EMBEDDERS),
    Knob("embedder.threads", 1, "Torch threads of the minilm model.", env="SIDECAR_MODEL_THREADS", minimum=1,
         exported=True),

    _setting("memory.min_confidence", "min_confidence", "Memories extracted after a turn with a lower "
             "confidence are not kept.", minimum=0, maximum=1),
    _setting("memory.episodic_turns", "episodic_turns", "Past turns the episodic index holds over all users, "
             "least recently used out.", flag="--episodic-turns", env="SIDECAR_EPISODIC_TURNS", minimum=1),
    _setting("memory.episodic_snapshot_bytes", "episodic_snapshot_bytes", "Bytes of the users' episodic indexes "
             "saved beside a DuckDB file (restored on a user's next call instead of rebuilt from rows), the "
             "oldest saved deleted first; 0: none saved.", env="SIDECAR_EPISODIC_SNAPSHOT_BYTES", minimum=0),
    _setting("memory.episodic_snapshot_dir", "episodic_snapshot_dir", "Directory the users' episodic indexes "
             "are saved in; empty: beside a DuckDB file, and none on a PostgreSQL store. On PostgreSQL give each "
             "replica a directory of its own (e.g. under /data): the change feed deletes what other replicas "
             "change, and at a start every user changed since this one stopped loses theirs.",
             flag="--episodic-snapshots", env="SIDECAR_EPISODIC_SNAPSHOTS"),

    _setting("knowledge.threshold", "knowledge_threshold", "Score the best knowledge chunk needs for "
             "knowledge_status MATCHED; below it BuildContext answers NO_MATCH.", minimum=0),

    _setting("compression.view_tokens", "compression.view_tokens", "Tokens of the trimmed view of the latest "
             "tool result.", minimum=1),
    _setting("compression.brief_tokens", "compression.brief_tokens", "Tokens of the trimmed view of older tool "
             "results.", minimum=1),
    _setting("compression.max_notes_per_run", "compression.max_notes_per_run", "Run notes a run keeps before "
             "the older ones fold into one summary note.", minimum=1),
    _setting("compression.max_note_tokens_per_run", "compression.max_note_tokens_per_run", "Tokens of run notes "
             "a run keeps before the older ones fold.", minimum=1),
    _setting("compression.keep_newest_notes", "compression.keep_newest_notes", "Newest run notes never folded.",
             minimum=1),
    _setting("compression.note_summary_tokens", "compression.note_summary_tokens", "Tokens of the note that "
             "folded notes become.", minimum=1),
    _setting("compression.summary_window_tokens", "compression.summary_window_tokens", "Turns newer than this "
             "many tokens stay verbatim; older ones fold into the rolling summary.", minimum=1),
    _setting("compression.summary_tokens", "compression.summary_tokens", "Tokens of the rolling summary.",
             minimum=1),

    _setting("jobs.poll_s", "job_poll_s", "Longest wait, in seconds, of the job workers between looks for "
             "queued jobs (this process's own jobs wake them at once).", minimum=0.01),

    Knob("llm.base_url", "", "OpenAI-compatible endpoint (.../v1) that extracts memories and writes summaries, "
         "the rule-based ones as fallback; empty: rule-based only.", env="SIDECAR_LLM_BASE_URL", exported=True),
    Knob("llm.api_key", "", "Its API key; prefer the environment variable to writing it here.",
         env="SIDECAR_LLM_API_KEY", shown=_secret, exported=True),
    Knob("llm.model", _LLM_DEFAULTS["model"].default, "Model name sent to the endpoint.", env="SIDECAR_LLM_MODEL",
         exported=True),
    Knob("llm.timeout_s", _LLM_DEFAULTS["timeout_s"].default, "Seconds one call to the endpoint may take.",
         env="SIDECAR_LLM_TIMEOUT_S", minimum=0.01, exported=True),

    Knob("otel.enabled", False, "OpenTelemetry spans: one per RPC, joined to the caller's trace by its "
         "traceparent metadata, with one child per BuildContext stage (the 'otel' extra).", flag="--otel",
         env="SIDECAR_OTEL"),
    Knob("otel.exporter", "otlp", "otlp: send spans to endpoint over OTLP/gRPC; console: print them to stdout.",
         choices=("otlp", "console")),
    Knob("otel.endpoint", "", "OTLP/gRPC collector address; empty: OTEL_EXPORTER_OTLP_ENDPOINT, else "
         "http://localhost:4317."),
    Knob("otel.service_name", "context-sidecar", "service.name of the spans."),
)}

_TYPE_WORDS = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}


class Level(IntEnum):
    """Where a value came from; the higher wins."""

    DEFAULT = 0
    FILE = 1
    ENVIRONMENT = 2
    FLAG = 3


def add_flags(parser: argparse.ArgumentParser) -> None:
    """The knobs' flags on `serve`; each defaults to None so that an absent flag defers to the levels below."""
    groups: dict[str, Any] = {}
    for knob in KNOBS.values():
        if knob.flag is None:
            continue
        target = parser
        if knob.group:
            if knob.group not in groups:
                groups[knob.group] = parser.add_mutually_exclusive_group()
            target = groups[knob.group]
        where = f"config {knob.key}" + (f", env {knob.env}" if knob.env else "")
        shown = toml_value(knob.default) if knob.default != "" else "empty"
        help_text = f"{knob.help} ({where}; default {shown})".replace("%", "%%")
        if type(knob.default) is bool:
            target.add_argument(knob.flag, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            target.add_argument(knob.flag, type=type(knob.default), default=None, help=help_text,
                                choices=knob.choices or None, metavar=knob.name.upper())


@dataclass(frozen=True)
class Config:
    """The value of every knob and the level it came from."""

    values: Mapping[str, Any]
    levels: Mapping[str, Level]
    path: str | None = None  # the config file read, if any

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def where(self, key: str) -> str:
        """Where the value was given, for messages: its flag, variable or key in the file; for a default, the
        way to change it."""
        knob, level = KNOBS[key], self.levels[key]
        if level is Level.FILE:
            return f"{key} ({self.path})"
        if level is Level.ENVIRONMENT:
            return knob.env or key
        return knob.flag or (knob.env if level is Level.DEFAULT else None) or key

    def said(self, key: str) -> str:
        """How the value was given, secrets hidden: "--embedder minilm", "SIDECAR_EMBEDDER='bert'"."""
        knob, level = KNOBS[key], self.levels[key]
        value = knob.show(self.values[key])
        if level is Level.FLAG:
            if isinstance(value, bool):  # --otel / --no-otel
                return knob.flag if value else f"--no-{(knob.flag or '').lstrip('-')}"
            return f"{knob.flag} {value}"
        if level is Level.ENVIRONMENT:
            return f"{knob.env}={value!r}"
        return f"{key} = {toml_value(value)}" + (f" ({self.path})" if level is Level.FILE else " (the default)")

    def winner(self, *keys: str) -> str:
        """Of knobs that say one thing in different ways (listen or uds, token or token_file), the one given at
        the highest level; at the same level the first with a value (a copied example gives them all)."""
        top = max(self.levels[k] for k in keys)
        tied = [k for k in keys if self.levels[k] == top]
        return next((k for k in tied if self.values[k]), tied[0])

    def settings(self) -> Settings:
        top: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for knob in KNOBS.values():
            if knob.settings:
                head, _, field = knob.settings.partition(".")
                if field:
                    nested.setdefault(head, {})[field] = self.values[knob.key]
                else:
                    top[head] = self.values[knob.key]
        defaults = Settings()
        top.update({head: replace(getattr(defaults, head), **fields) for head, fields in nested.items()})
        return Settings(**top)

    def auth_token(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """The token from whichever of token, token_file and token_env wins; None: no authentication."""
        key = self.winner("auth.token", "auth.token_file", "auth.token_env")
        value = self.values[key]
        if not value:
            return None
        if key == "auth.token":
            return value
        if key == "auth.token_env":
            token = environ.get(value, "").strip()
            if not token:
                raise ConfigError(f"{self.said(key)}: the environment variable {value} is not set or empty")
            return token
        try:
            with open(value, encoding="utf-8") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{self.said(key)}: cannot read the token ({getattr(e, 'strerror', None) or e})") \
                from None
        if not token:
            raise ConfigError(f"{self.said(key)}: the file is empty")
        return token

    def export_environment(self, environ: MutableMapping[str, str] = os.environ) -> None:
        """Values from the file for the knobs that their users read from the environment."""
        for knob in KNOBS.values():
            if knob.exported and knob.env and self.levels[knob.key] is Level.FILE:
                environ[knob.env] = str(self.values[knob.key])

    def to_toml(self) -> str:
        """The configuration in force, secrets as ***, each value not a default followed by where it came from."""
        head = ["# The configuration `python -m sidecar serve` runs with: flag > environment variable > "
                f"config file ({self.path or 'none'}) > default."]

        def note(knob: Knob) -> str:
            return "" if self.levels[knob.key] is Level.DEFAULT else f"  # {self.where(knob.key)}"

        return _render(head, {k: KNOBS[k].show(v) for k, v in self.values.items()}, lambda _: [], note)


def load(args: argparse.Namespace | None = None, environ: Mapping[str, str] = os.environ) -> Config:
    """Every knob from the flags in `args`, the environment, the config file (--config or SIDECAR_CONFIG)
    and the defaults. An empty environment variable counts as not set."""
    flags = vars(args) if args is not None else {}
    path = flags.get("config") or environ.get(CONFIG_ENV, "").strip() or None
    from_file = read_file(path) if path else {}
    values: dict[str, Any] = {}
    levels: dict[str, Level] = {}
    for key, knob in KNOBS.items():
        given = flags.get(knob.dest) if knob.flag else None
        text = environ.get(knob.env, "").strip() if knob.env else ""
        if given is not None:
            values[key], levels[key] = given, Level.FLAG
        elif text:
            values[key], levels[key] = _parse_text(knob, text), Level.ENVIRONMENT
        elif key in from_file:
            values[key], levels[key] = from_file[key], Level.FILE
        else:
            values[key], levels[key] = knob.default, Level.DEFAULT
    config = Config(values, levels, path)
    for key in KNOBS:
        if levels[key] is not Level.DEFAULT:
            values[key] = _checked(config, key)
    return config


def read_file(path: str) -> dict[str, Any]:
    """{"section.name": value} from a TOML file, every key known and every value of its knob's type."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"cannot read the config file {path}: {e.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not valid TOML ({e})") from None
    out: dict[str, Any] = {}
    for key, value in _flatten(data):
        knob = KNOBS.get(key)
        if knob is None:
            near = difflib.get_close_matches(key, KNOBS, n=1)
            raise ConfigError(f"{path}: unknown key {key}" + (f" (did you mean {near[0]}?)" if near else
                                                               "; deploy/sidecar.example.toml lists every key"))
        out[key] = _typed(knob, value, path)
    return out


def _flatten(data: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for section, table in data.items():
        if not isinstance(table, dict):  # a key outside any [section]
            yield section, table
            continue
        for name, value in table.items():
            yield f"{section}.{name}", value


def _typed(knob: Knob, value: Any, path: str) -> Any:
    kind = type(knob.default)
    if kind is float and type(value) is int:  # `rate_per_tenant = 5` means 5.0
        return float(value)
    if type(value) is not kind:
        got = {dict: "a table", list: "a list"}.get(type(value)) or _TYPE_WORDS.get(type(value), type(value).__name__)
        raise ConfigError(f"{path}: {knob.key}: expected {_TYPE_WORDS[kind]}, got {got}")
    return value


def _parse_text(knob: Knob, text: str) -> Any:
    """An environment variable's text as the knob's type."""
    kind = type(knob.default)
    if kind is bool:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
    else:
        try:
            return kind(text)
        except ValueError:
            pass
    raise ConfigError(f"{knob.env}={knob.show(text)!r}: expected {_TYPE_WORDS[kind]}")


def _checked(config: Config, key: str) -> Any:
    """The value within its knob's choices (any case) and bounds."""
    knob, value = KNOBS[key], config[key]
    if knob.choices:
        match = next((c for c in knob.choices if c.lower() == str(value).lower()), None)
        if match is None:
            raise ConfigError(f"{config.said(key)}: use {', '.join(knob.choices[:-1])} or {knob.choices[-1]}")
        return match
    if knob.minimum is not None and value < knob.minimum:
        raise ConfigError(f"{config.said(key)}: must be at least {knob.minimum:g}")
    if knob.maximum is not None and value > knob.maximum:
        raise ConfigError(f"{config.said(key)}: must be at most {knob.maximum:g}")
    return value


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    # A JSON string is a TOML basic string, but for DEL, which TOML wants escaped.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _render(head: list[str], values: Mapping[str, Any], comments: Callable[[Knob], list[str]],
            note: Callable[[Knob], str]) -> str:
    lines = list(head)
    for section, knobs in groupby(KNOBS.values(), key=lambda k: k.section):
        lines += ["", f"[{section}]"]
        for n, knob in enumerate(knobs):
            said = comments(knob)
            lines += ([""] if said and n else []) + [f"# {line}" for line in said]
            lines.append(f"{knob.name} = {toml_value(values[knob.key])}{note(knob)}")
    return "\n".join(lines) + "\n"


def example() -> str:
    """deploy/sidecar.example.toml: every key with its default and its documentation."""
    head = ["# Context Sidecar configuration: python -m sidecar serve --config sidecar.toml (or SIDECAR_CONFIG).",
            "# Every key is optional and shown with its default. A flag beats its environment variable, which",
            "# beats this file; `serve --print-config` prints the configuration in force, secrets as ***.",
            "# Made by `python -m sidecar.config` from the table in sidecar/config.py."]

    def comments(knob: Knob) -> list[str]:
        given = [f"flag {knob.flag}"] if knob.flag else []
        given += [f"env {knob.env}"] if knob.env else []
        return textwrap.wrap(knob.help, 98, break_on_hyphens=False) + ([", ".join(given)] if given else [])

    return _render(head, {k: knob.default for k, knob in KNOBS.items()}, comments, lambda _: "")


if __name__ == "__main__":
    print(example(), end="")
