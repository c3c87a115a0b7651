"""Provider-native rendering over a real server: BuildContext's provider_request_json for OpenAI's chat
completions, Anthropic's Messages API and Gemini's generateContent, validated against each provider's
own published request types (their SDKs, offline: nothing is sent), strictly, so that a wrong field
name fails; tool calls paired with their results by id; Anthropic's turns alternating and its
cache_control marks at the response's cache breakpoints; tool calls stored, validated and masked."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import grpc
import pytest
from anthropic.types.message_create_params import MessageCreateParamsNonStreaming
from google.genai import types as genai
from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming
from pydantic import TypeAdapter, ValidationError
from pydantic_core import SchemaValidator

from sidecar.api import context_service_pb2 as pb

QUERY = "What should we do next?"
RULES = "You are an SRE."
NO_RESULT = "[no result of this call in this context]"
TOOLS = [
    pb.ToolSchema(name="query_logs", description="Search service logs",
                  schema_json='{"type": "object", "properties": {"service": {"type": "string"}}, '
                              '"required": ["service"]}'),
    pb.ToolSchema(name="query_metrics", description="Read a metric", schema_json=""),
]
MODES = {"openai": pb.RENDER_MODE_OPENAI_CHAT, "anthropic": pb.RENDER_MODE_ANTHROPIC_MESSAGES,
         "gemini": pb.RENDER_MODE_GEMINI}


def strict(request_type: Any) -> SchemaValidator:
    """A validator of an SDK's request TypedDict that refuses unknown keys at every level (TypedDicts
    ignore them by default; the few the SDK marks open stay open) and checks every item of its
    iterables (which pydantic would only check when iterated)."""
    schema = copy.deepcopy(TypeAdapter(request_type).core_schema)

    def tighten(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("type") == "typed-dict" and node.get("extra_behavior", "ignore") == "ignore":
                node["extra_behavior"] = "forbid"
            if node.get("type") == "generator":
                node["type"] = "list"
            for value in node.values():
                tighten(value)
        elif isinstance(node, list):
            for value in node:
                tighten(value)

    tighten(schema)
    return SchemaValidator(schema)


OPENAI = strict(CompletionCreateParamsNonStreaming)
ANTHROPIC = strict(MessageCreateParamsNonStreaming)


def validate_openai(body: dict) -> None:
    OPENAI.validate_python({"model": "gpt-4o", **body})


def validate_anthropic(body: dict) -> None:
    ANTHROPIC.validate_python({"model": "claude-sonnet-4-5", "max_tokens": 1024, **body})


def validate_gemini(body: dict) -> None:
    """The REST body's parts through the SDK's models (extra="forbid", the wire's camelCase names)."""
    assert set(body) <= {"systemInstruction", "contents", "tools"}
    TypeAdapter(list[genai.Content]).validate_json(json.dumps(body["contents"]))
    genai.GenerateContentConfig.model_validate_json(json.dumps(
        {k: body[k] for k in ("systemInstruction", "tools") if k in body}))


# ------------------------------------------------------------------------------------------ helpers
def say(stub, scope, sid: str, role: int, text: str, calls: list[pb.ToolCall] | None = None, **kw) -> pb.Message:
    out = stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=sid, messages=[
        pb.NewMessage(role=role, text=text, tool_calls=calls or [], **kw)]))
    time.sleep(0.003)  # tool results are placed after the message before them by time (ms)
    return out.messages[0]


def record(stub, scope, sid: str, tool: str, call_id: str, text: str, status: int = pb.TOOL_STATUS_OK) -> str:
    ref = stub.RecordToolResult(pb.RecordToolResultRequest(scope=scope, session_id=sid, tool_name=tool,
                                                           call_id=call_id, full_text=text, status=status))
    time.sleep(0.003)
    return ref.tool_result_id


def build(stub, scope, sid: str, mode: int, **kw) -> tuple[pb.BuildContextResponse, dict]:
    resp = stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=sid, query=QUERY, system_rules=RULES,
                                                    tools=TOOLS, render=mode, **kw))
    return resp, json.loads(resp.provider_request_json)


@pytest.fixture
def incident(stub, scope, session_id) -> str:
    """A user turn (with a constraint, pinned), an assistant turn making two tool calls, their two results
    (one failed), a confirmed fact and the next user turn."""
    say(stub, scope, session_id, pb.ROLE_USER, "payment-api returns 5xx. Do not restart the production instance.")
    say(stub, scope, session_id, pb.ROLE_ASSISTANT, "Checking logs and metrics.", [
        pb.ToolCall(id="call_logs", name="query_logs", arguments_json='{"service": "payment-api"}'),
        pb.ToolCall(id="call_metrics", name="query_metrics", arguments_json='{"metric": "http_5xx"}')])
    record(stub, scope, session_id, "query_logs", "call_logs", "ERROR connection pool exhausted\nINFO retry")
    record(stub, scope, session_id, "query_metrics", "call_metrics", "timeout reading metrics", pb.TOOL_STATUS_ERROR)
    stub.UpsertFacts(pb.UpsertFactsRequest(scope=scope, session_id=session_id, facts=[
        pb.FactInput(key="service", value="payment-api", provenance=pb.PROVENANCE_USER_CONFIRMED)]))
    say(stub, scope, session_id, pb.ROLE_USER, QUERY)
    return session_id


# ------------------------------------------------------------------------------------------ the SDKs' types
def test_the_strict_validators_refuse_a_wrong_field_name():
    validate_openai({"messages": [{"role": "user", "content": "hi"}]})
    with pytest.raises(ValidationError):
        validate_openai({"messages": [{"role": "tool", "tool_call_ids": "c1", "content": "x"}]})
    with pytest.raises(ValidationError):  # a call's function nested one level too high
        validate_openai({"messages": [{"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "name": "f", "arguments": "{}"}]}]})
    validate_anthropic({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]})
    with pytest.raises(ValidationError):
        validate_anthropic({"messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_call_id": "c1", "content": "x"}]}]})
    with pytest.raises(ValidationError):
        validate_anthropic({"system": [{"type": "text", "text": "s", "cache": {"type": "ephemeral"}}], "messages": []})
    validate_gemini({"contents": [{"role": "user", "parts": [{"text": "hi"}]}]})
    with pytest.raises(ValidationError):
        validate_gemini({"contents": [{"role": "user", "parts": [{"functionReply": {"name": "f"}}]}]})


# ------------------------------------------------------------------------------------------ the three renderings
def test_openai_chat_messages_pair_tool_calls_with_tool_messages(stub, scope, incident):
    resp, body = build(stub, scope, incident, pb.RENDER_MODE_OPENAI_CHAT)
    validate_openai(body)
    messages = body["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "user"]
    system = messages[0]["content"]
    assert system.startswith(RULES) and "Do not restart the production instance." in system
    assert "service: payment-api" in system and "## Tools" not in system  # the tools go as tools
    call = messages[2]
    assert call["content"] == "Checking logs and metrics."
    assert [(c["id"], c["type"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in call["tool_calls"]] == [("call_logs", "function", "query_logs", {"service": "payment-api"}),
                                             ("call_metrics", "function", "query_metrics", {"metric": "http_5xx"})]
    assert [m["tool_call_id"] for m in messages[3:5]] == ["call_logs", "call_metrics"]
    assert "connection pool exhausted" in messages[3]["content"] and "timeout" in messages[4]["content"]
    assert messages[-1] == {"role": "user", "content": QUERY}  # the newest message is the query: once
    assert [(t["type"], t["function"]["name"]) for t in body["tools"]] == [("function", "query_logs"),
                                                                         ("function", "query_metrics")]
    assert body["tools"][1]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert not resp.chat_messages and not resp.rendered_text


def test_anthropic_messages_alternate_pair_tool_use_and_mark_the_cache_breakpoints(stub, scope, incident):
    resp, body = build(stub, scope, incident, pb.RENDER_MODE_ANTHROPIC_MESSAGES)
    validate_anthropic(body)
    messages = body["messages"]
    roles = [m["role"] for m in messages]
    assert roles == ["user", "assistant", "user"]
    assert all(a != b for a, b in zip(roles, roles[1:], strict=False)) and "system" not in roles
    uses = [b for b in messages[1]["content"] if b["type"] == "tool_use"]
    assert [(u["id"], u["name"], u["input"]) for u in uses] == [("call_logs", "query_logs", {"service": "payment-api"}),
                                                               ("call_metrics", "query_metrics", {"metric": "http_5xx"})]
    answer = messages[2]["content"]
    results = [b for b in answer if b["type"] == "tool_result"]
    assert answer[:len(results)] == results  # tool results open the next user turn
    assert [r["tool_use_id"] for r in results] == [u["id"] for u in uses]
    assert [r.get("is_error", False) for r in results] == [False, True]
    assert answer[-1]["text"] == QUERY

    # cache_control at each breakpoint: tools (the rules' block: Anthropic caches tools, then system),
    # state, history; never more than 4.
    kinds = [b.after for b in resp.cache_breakpoints]
    assert kinds == [pb.SECTION_KIND_TOOLS, pb.SECTION_KIND_SESSION_STATE, pb.SECTION_KIND_RECENT_MESSAGES]
    marked = [b for b in [*body["system"], *body["tools"], *(c for m in messages for c in m["content"])]
              if "cache_control" in b]
    assert len(marked) == len(kinds) <= 4
    assert all(b["cache_control"] == {"type": "ephemeral"} for b in marked)
    system = body["system"]
    assert marked[0] is system[0] and system[0]["text"] == RULES
    assert marked[1] is system[-1] and system[-1]["text"].startswith("## Session state")
    assert marked[2] is answer[-1]  # the history's last block (the newest message, the query)
    assert [t["name"] for t in body["tools"]] == ["query_logs", "query_metrics"]
    assert body["tools"][0]["input_schema"]["required"] == ["service"]


def test_gemini_contents_answer_function_calls_with_function_responses(stub, scope, incident):
    _, body = build(stub, scope, incident, pb.RENDER_MODE_GEMINI)
    validate_gemini(body)
    contents = body["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user"]
    calls = [p["functionCall"] for p in contents[1]["parts"] if "functionCall" in p]
    answers = [p["functionResponse"] for p in contents[2]["parts"] if "functionResponse" in p]
    assert [(c["id"], c["name"], c["args"]) for c in calls] == [("call_logs", "query_logs", {"service": "payment-api"}),
                                                               ("call_metrics", "query_metrics", {"metric": "http_5xx"})]
    assert [(a["id"], a["name"]) for a in answers] == [(c["id"], c["name"]) for c in calls]
    assert "connection pool exhausted" in answers[0]["response"]["output"] and "error" in answers[1]["response"]
    assert contents[2]["parts"][-1] == {"text": QUERY}
    assert body["systemInstruction"]["parts"][0] == {"text": RULES}
    declared = body["tools"][0]["functionDeclarations"]
    assert [d["name"] for d in declared] == ["query_logs", "query_metrics"]
    assert declared[0]["parametersJsonSchema"]["properties"] == {"service": {"type": "string"}}


def test_every_call_is_answered_and_a_result_without_its_call_is_plain_text(stub, scope, session_id):
    """A call without a recorded result gets NO_RESULT; a result naming no call of the history, and a tool
    message answering none, stay where they were as user text; consecutive assistant turns merge for
    Anthropic and Gemini; the older single-call form (tool_name + tool_call_id) is a call too."""
    sid = session_id
    say(stub, scope, sid, pb.ROLE_USER, "Is checkout slow?")
    say(stub, scope, sid, pb.ROLE_ASSISTANT, "", [pb.ToolCall(id="call:1", name="query_logs")])
    orphan = record(stub, scope, sid, "query_metrics", "call-unknown", "p99 2.5s")
    say(stub, scope, sid, pb.ROLE_ASSISTANT, "Looking.")
    say(stub, scope, sid, pb.ROLE_ASSISTANT, "Still looking.", tool_name="query_metrics", tool_call_id="legacy-1")
    say(stub, scope, sid, pb.ROLE_TOOL, "p50 120ms", tool_name="query_metrics", tool_call_id="legacy-1")
    say(stub, scope, sid, pb.ROLE_TOOL, "stray output", tool_name="query_logs", tool_call_id="nobody")
    say(stub, scope, sid, pb.ROLE_USER, QUERY)

    _, openai = build(stub, scope, sid, pb.RENDER_MODE_OPENAI_CHAT)
    validate_openai(openai)
    messages = openai["messages"][1:]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user", "assistant", "assistant", "tool",
                                             "user", "user"]
    assert "content" not in messages[1] and messages[2] == {"role": "tool", "tool_call_id": "call:1",
                                                            "content": NO_RESULT}
    assert f"tool:{orphan}" in messages[3]["content"] and "p99 2.5s" in messages[3]["content"]
    assert messages[5]["tool_calls"][0]["id"] == "legacy-1" and messages[5]["tool_calls"][0]["function"] == {
        "name": "query_metrics", "arguments": "{}"}
    assert messages[6] == {"role": "tool", "tool_call_id": "legacy-1", "content": "p50 120ms"}
    assert messages[7]["content"] == "tool: stray output"

    _, anthropic = build(stub, scope, sid, pb.RENDER_MODE_ANTHROPIC_MESSAGES)
    validate_anthropic(anthropic)
    turns = anthropic["messages"]
    roles = [m["role"] for m in turns]
    assert roles == ["user", "assistant", "user", "assistant", "user"]
    assert turns[1]["content"] == [{"type": "tool_use", "id": "call_1", "name": "query_logs", "input": {}}]
    assert turns[2]["content"][0] == {"type": "tool_result", "tool_use_id": "call_1", "content": NO_RESULT}
    assert [b["type"] for b in turns[3]["content"]] == ["text", "text", "tool_use"]  # two assistant turns, merged
    assert turns[4]["content"][0]["tool_use_id"] == "legacy-1"

    _, gemini = build(stub, scope, sid, pb.RENDER_MODE_GEMINI)
    validate_gemini(gemini)
    contents = gemini["contents"]
    assert [c["role"] for c in contents] == ["user", "model", "user", "model", "user"]
    for call, answer in ((contents[1], contents[2]), (contents[3], contents[4])):
        made = [p["functionCall"] for p in call["parts"] if "functionCall" in p]
        answered = [p["functionResponse"] for p in answer["parts"] if "functionResponse" in p]
        assert [(c["id"], c["name"]) for c in made] == [(a["id"], a["name"]) for a in answered]


def test_a_provider_rendering_needs_tools_a_provider_takes(stub, scope, session_id):
    for bad in (pb.ToolSchema(name="query logs"), pb.ToolSchema(name="q", schema_json="any text")):
        with pytest.raises(grpc.RpcError) as err:
            stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=session_id, tools=[bad],
                                                     render=pb.RENDER_MODE_GEMINI))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "tools[0]" in err.value.details()
    # text and chat keep taking any text
    stub.BuildContext(pb.BuildContextRequest(scope=scope, session_id=session_id, render=pb.RENDER_MODE_CHAT,
                                             tools=[pb.ToolSchema(name="query logs", schema_json="any text")]))


# ------------------------------------------------------------------------------------------ storing tool calls
def test_tool_calls_are_stored_listed_and_masked(stub, scope, session_id):
    stored = say(stub, scope, session_id, pb.ROLE_ASSISTANT, "", [
        pb.ToolCall(id="c1", name="db_query", arguments_json='{"dsn": "postgres://admin:s3cr3tP4ssw0rd@db/prod"}'),
        pb.ToolCall(id="c2", name="noop")])
    assert [(c.id, c.name) for c in stored.tool_calls] == [("c1", "db_query"), ("c2", "noop")]
    args = json.loads(stored.tool_calls[0].arguments_json)
    assert "s3cr3tP4ssw0rd" not in args["dsn"] and "[secret:" in args["dsn"]
    listed = stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=session_id)).messages
    assert list(listed[-1].tool_calls) == list(stored.tool_calls)


@pytest.mark.parametrize("message, field", [
    (pb.NewMessage(role=pb.ROLE_USER, text="x", tool_calls=[pb.ToolCall(id="c1", name="f")]), "tool_calls"),
    (pb.NewMessage(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(name="f")]), "tool_calls[0].id"),
    (pb.NewMessage(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c 1", name="f")]), "tool_calls[0].id"),
    (pb.NewMessage(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c1")]), "tool_calls[0].name"),
    (pb.NewMessage(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c1", name="f", arguments_json="[1]")]),
     "tool_calls[0].arguments_json"),
    (pb.NewMessage(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c1", name="f"),
                                                       pb.ToolCall(id="c1", name="g")]), "tool_calls[1].id"),
])
def test_bad_tool_calls_are_refused(stub, scope, session_id, message, field):
    with pytest.raises(grpc.RpcError) as err:
        stub.AppendMessages(pb.AppendMessagesRequest(scope=scope, session_id=session_id, messages=[message]))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"messages[0].{field}" in err.value.details()
    assert not stub.ListMessages(pb.ListMessagesRequest(scope=scope, session_id=session_id)).messages
