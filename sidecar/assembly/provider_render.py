"""Provider-native renderings of an assembled prompt: the JSON body an agent forwards to OpenAI's chat
completions, Anthropic's Messages API or Gemini's generateContent (RenderMode 3-5): the messages and
the system part, tools as the provider's tool objects; the agent adds the model and its settings.

Sections are placed as in chat rendering (render.chat_layout), less the tools section, which goes as
the provider's tools. The history's tool calls and tool results become the provider's own blocks:
each result right after the call it answers (by call id), every call answered (a call whose result
is not in the history gets NO_RESULT, as every provider refuses an unanswered call), and a result
whose call is not in the history shown as plain text in a user turn (no provider takes a result
without its call)."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.assembly.builder import BuildResult, Item, ToolSpec
from sidecar.assembly.candidates import Section
from sidecar.assembly.render import ChatLayout, after_text, block, chat_layout, chat_message, system_text
from sidecar.domain import Message, Role, ToolCall, ToolResult, ToolStatus
from sidecar.errors import InvalidArgument
from sidecar.store.cache import SessionView


class Provider(enum.IntEnum):
    """The proto RenderMode numbers of the provider renderings."""

    OPENAI_CHAT = 3
    ANTHROPIC_MESSAGES = 4
    GEMINI = 5


NO_RESULT = "[no result of this call in this context]"
MAX_CACHE_MARKS = 4  # Anthropic takes at most 4 cache_control blocks per request
EPHEMERAL = {"type": "ephemeral"}
# Gemini 3 checks a thought signature on the current turn's function calls. This history is assembled from
# stored calls (no signatures kept), the case Google documents this placeholder for.
GEMINI_SIGNATURE = "skip_thought_signature_validator"
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a function name every provider accepts
ANTHROPIC_ID_OUTSIDE = re.compile(r"[^A-Za-z0-9_-]")  # tool_use ids are [A-Za-z0-9_-]+; ours may hold .:@
NO_PARAMETERS = {"type": "object", "properties": {}}


def check_tools(tools: Sequence[ToolSpec]) -> None:
    """What a provider rendering needs of the request's tools: names the providers accept, parameters as
    a JSON object (INVALID_ARGUMENT naming the field otherwise)."""
    for i, t in enumerate(tools):
        if not TOOL_NAME.fullmatch(t.name):
            raise InvalidArgument(f"tools[{i}].name {t.name[:64]!r} must be 1-64 letters, digits, '_' or '-' "
                                  "to render for a provider")
        if t.schema_json and not isinstance(_json(t.schema_json), dict):
            raise InvalidArgument(f"tools[{i}].schema_json must be a JSON object (a JSON Schema) to render for a "
                                  "provider")


def render_provider(result: BuildResult, provider: Provider, *, tools: Sequence[ToolSpec],
                    view: SessionView | None) -> str:
    """The provider's request body (its messages, system part and tools) as compact JSON. `view` is the
    session the result was built from: its messages' tool calls and its tool results' call ids (None: the
    history as plain turns)."""
    layout = chat_layout(result)
    turns = conversation(layout.history, view)
    body = _RENDERERS[provider](result, layout, turns, tools)
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))


# ---------------------------------------------------------------------------------------- the conversation
@dataclass(frozen=True, slots=True)
class Answer:
    """A tool result shown as the answer to its call."""

    call: ToolCall
    text: str
    error: bool = False


@dataclass(frozen=True, slots=True)
class Turn:
    """A history entry: a message (role "user", "assistant" or "system"; an assistant message with its
    calls, each with its answer), or a tool result that answers no call in the history (role "user",
    its text as shown in the prompt)."""

    role: str
    text: str  # as in chat rendering: the role's label stripped
    line: str  # the item's text, label included: how a system message reads inside a user turn
    calls: tuple[ToolCall, ...] = ()
    answers: tuple[Answer, ...] = ()

    @property
    def shown(self) -> str:
        """The text of a user or assistant turn without calls: a system message keeps its label, as Anthropic
        and Gemini have no system turn."""
        return self.line if self.role == "system" else self.text


@dataclass(frozen=True, slots=True)
class _Entry:
    item: Item
    role: str  # the chat role: "user", "assistant", "tool", "system"
    text: str
    calls: tuple[ToolCall, ...] = ()
    answers: str = ""  # the call id a tool result names
    error: bool = False


def conversation(history: Sequence[Item], view: SessionView | None) -> list[Turn]:
    """The history as turns, each tool result moved right after the call it answers (the first result
    naming a call answers it; a later one, or one whose call is not in the history, stays as text where
    it was). A call id made again by a later message is structured only the first time."""
    # Only assistant messages make calls and only tool messages answer them: the others need no lookup.
    wanted = {it.source_message_ids[0] for it in history
              if it.source_message_ids and it.role in (Role.ASSISTANT, Role.TOOL)}
    messages = _messages(view, wanted) if view is not None else {}
    results = {r.tool_result_id: r for r in view.tool_results} if view is not None else {}
    entries = [_entry(it, messages, results) for it in history]
    made = {c.id for e in entries for c in e.calls}
    chosen: dict[str, _Entry] = {}
    for e in entries:
        if e.answers in made:
            chosen.setdefault(e.answers, e)
    turns: list[Turn] = []
    shown: set[str] = set()  # call ids structured so far
    for e in entries:
        if e.answers and chosen.get(e.answers) is e:
            continue  # shown after its call
        calls = tuple(c for c in e.calls if c.id not in shown)
        if calls:
            shown.update(c.id for c in calls)
            answers = tuple(Answer(c, chosen[c.id].text, chosen[c.id].error) if c.id in chosen
                            else Answer(c, NO_RESULT) for c in calls)
            turns.append(Turn("assistant", e.text, e.item.text, calls, answers))
        elif e.role == "tool":
            turns.append(Turn("user", e.item.text, e.item.text))
        else:
            turns.append(Turn(e.role, e.text, e.item.text))
    return turns


def _entry(item: Item, messages: dict[str, Message], results: dict[str, ToolResult]) -> _Entry:
    role, text = chat_message(item)
    if item.source.startswith("tool:"):
        r = results.get(item.source.removeprefix("tool:"))
        return _Entry(item, role, text, answers=r.call_id if r else "",
                      error=r is not None and r.status == ToolStatus.ERROR)
    m = messages.get(item.source_message_ids[0]) if item.source_message_ids else None
    if m is None:
        return _Entry(item, role, text)
    return _Entry(item, role, text, calls=_calls(m), answers=m.tool_call_id if m.role == Role.TOOL else "")


def _calls(m: Message) -> tuple[ToolCall, ...]:
    if m.role != Role.ASSISTANT:
        return ()
    if m.tool_calls:
        return m.tool_calls
    # The older form: one call named by the message's own tool_name and tool_call_id, without arguments.
    return (ToolCall(m.tool_call_id, m.tool_name),) if m.tool_call_id and m.tool_name else ()


def _messages(view: SessionView, ids: set[str]) -> dict[str, Message]:
    """The messages with these ids, looked for from the newest back (the history is the tail's end)."""
    found: dict[str, Message] = {}
    for m in reversed(view.tail.messages):
        if len(found) == len(ids):
            break
        if m.message_id in ids:
            found[m.message_id] = m
    return found


# ---------------------------------------------------------------------------------------- providers
def _openai(result: BuildResult, layout: ChatLayout, turns: list[Turn], tools: Sequence[ToolSpec]) -> dict:
    messages: list[dict[str, Any]] = []
    system = system_text(_without_tools(layout))
    if system:
        messages.append({"role": "system", "content": system})
    for t in turns:
        if not t.calls:
            messages.append({"role": t.role, "content": t.text})
            continue
        messages.append({"role": "assistant", **({"content": t.text} if t.text else {}), "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments_json or "{}"}}
            for c in t.calls]})
        messages += [{"role": "tool", "tool_call_id": a.call.id, "content": a.text} for a in t.answers]
    if layout.after:
        messages.append({"role": "system", "content": after_text(layout)})
    if layout.query:
        messages.append({"role": "user", "content": layout.query})
    body: dict[str, Any] = {"messages": messages}
    if tools:
        body["tools"] = [{"type": "function", "function": _function(t, "parameters")} for t in tools]
    return body


def _anthropic(result: BuildResult, layout: ChatLayout, turns: list[Turn], tools: Sequence[ToolSpec]) -> dict:
    system = {s: {"type": "text", "text": block(s, items).lstrip("\n")} for s, items in _without_tools(layout)}
    messages: list[dict[str, Any]] = []
    add = _appender(messages, "content")
    for t in turns:
        if t.calls:
            add("assistant", [_text_block(t.text), *(
                {"type": "tool_use", "id": _anthropic_id(c.id), "name": c.name, "input": _arguments(c)}
                for c in t.calls)])
            add("user", [{"type": "tool_result", "tool_use_id": _anthropic_id(a.call.id), "content": a.text,
                          **({"is_error": True} if a.error else {})} for a in t.answers])
        else:
            add("assistant" if t.role == "assistant" else "user", [_text_block(t.shown)])
    history_end = messages[-1]["content"][-1] if messages else None
    add("user", [_text_block(after_text(layout)), _text_block(layout.query)])
    tool_objects = [_function(t, "input_schema") for t in tools]
    # The cache breakpoints: Anthropic's prefix is tools, system, messages, so the end of the tools
    # (rules and tools here) is the rules' system block, or the last tool without rules.
    at: dict[Section, dict | None] = {Section.RECENT_MESSAGES: history_end,
                                      Section.TOOLS: system.get(Section.SYSTEM_RULES)
                                      or (tool_objects[-1] if tool_objects else None)}
    breakpoints = result.cache.breakpoints if result.cache is not None else []
    marks = [at[kind] if kind in at else system.get(kind) for kind, _ in breakpoints]
    for target in [m for m in marks if m is not None][:MAX_CACHE_MARKS]:
        target["cache_control"] = dict(EPHEMERAL)
    body: dict[str, Any] = {}
    if system:
        body["system"] = list(system.values())
    body["messages"] = messages
    if tool_objects:
        body["tools"] = tool_objects
    return body


def _gemini(result: BuildResult, layout: ChatLayout, turns: list[Turn], tools: Sequence[ToolSpec]) -> dict:
    contents: list[dict[str, Any]] = []
    add = _appender(contents, "parts")
    for t in turns:
        if t.calls:
            add("model", [_text_part(t.text), *(
                {"functionCall": {"id": c.id, "name": c.name, "args": _arguments(c)},
                 **({"thoughtSignature": GEMINI_SIGNATURE} if j == 0 else {})}  # a step's first call carries it
                for j, c in enumerate(t.calls))])
            add("user", [{"functionResponse": {"id": a.call.id, "name": a.call.name,
                                               "response": {"error" if a.error else "output": a.text}}}
                         for a in t.answers])
        else:
            add("model" if t.role == "assistant" else "user", [_text_part(t.shown)])
    add("user", [_text_part(after_text(layout)), _text_part(layout.query)])
    body: dict[str, Any] = {}
    before = _without_tools(layout)
    if before:
        body["systemInstruction"] = {"parts": [_text_part(block(s, items).lstrip("\n")) for s, items in before]}
    body["contents"] = contents
    if tools:
        body["tools"] = [{"functionDeclarations": [_function(t, "parametersJsonSchema") for t in tools]}]
    return body


_RENDERERS: dict[Provider, Callable[[BuildResult, ChatLayout, list[Turn], Sequence[ToolSpec]], dict]] = {
    Provider.OPENAI_CHAT: _openai, Provider.ANTHROPIC_MESSAGES: _anthropic, Provider.GEMINI: _gemini}


# ---------------------------------------------------------------------------------------- helpers
def _appender(out: list[dict[str, Any]], key: str) -> Callable[[str, list[dict[str, Any]]], None]:
    """Adds a turn's blocks (parts) to `out`, merged into the previous turn when it has the same role (turns
    alternate), leaving out blank text (which Anthropic refuses and Gemini does not need)."""

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        blocks = [b for b in blocks if not isinstance(b.get("text"), str) or b["text"].strip()]
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1][key] += blocks
        else:
            out.append({"role": role, key: blocks})

    return add


def _text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _text_part(text: str) -> dict[str, Any]:
    return {"text": text}


def _function(t: ToolSpec, parameters_key: str) -> dict[str, Any]:
    """A tool as a provider's function: name, description and its JSON Schema under the provider's key."""
    out: dict[str, Any] = {"name": t.name}
    if t.description:
        out["description"] = t.description
    out[parameters_key] = _json(t.schema_json) if t.schema_json else dict(NO_PARAMETERS)
    return out


def _arguments(c: ToolCall) -> dict[str, Any]:
    return _json(c.arguments_json) if c.arguments_json else {}


def _anthropic_id(call_id: str) -> str:
    return ANTHROPIC_ID_OUTSIDE.sub("_", call_id)


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _without_tools(layout: ChatLayout) -> list[tuple[Section, list[Item]]]:
    """The sections before the conversation, less the tools (sent as the provider's tool objects)."""
    return [(s, items) for s, items in layout.before if s != Section.TOOLS]
