"""Render an assembled context as one prompt string or as chat messages, in section order."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.assembly.builder import HEADERS, ROLE_LABELS, BuildResult, Item
from sidecar.assembly.candidates import Section


def block(section: Section, items: list[Item]) -> str:
    """A section as text: its header (after a blank line) and its items, one per line."""
    body = "\n".join(it.text for it in items)
    header = HEADERS.get(section)
    return f"\n{header}\n{body}" if header else body


def chat_message(item: Item) -> tuple[str, str]:
    """A history item as (role, content): the role's label is the role, not part of the content."""
    role = ROLE_LABELS.get(item.role, "user")
    prefix = role + ": "
    return role, item.text[len(prefix):] if item.text.startswith(prefix) else item.text


@dataclass(slots=True)
class ChatLayout:
    """Where a conversation-shaped prompt (chat messages, a provider's request) puts each section:
    `before` the conversation (one system part), the conversation's items (`history`), `after` it
    (this call's memories, knowledge and tool observations in the cache-aware layout; tool observations
    in the classic one), then `query` as the last user turn ("" when none, or when the newest message
    already is the query)."""

    before: list[tuple[Section, list[Item]]]
    history: list[Item]
    after: list[tuple[Section, list[Item]]]
    query: str


def chat_layout(result: BuildResult) -> ChatLayout:
    layout = ChatLayout([], [], [], "")
    for section, items in result.sections:
        if not items:
            continue
        if section == Section.RECENT_MESSAGES:
            layout.history = items
        elif section == Section.QUERY:
            query = items[0].text
            last = layout.history[-1] if layout.history else None
            if last is None or chat_message(last) != ("user", query):
                layout.query = query
        elif layout.history or section == Section.TOOL_OBSERVATIONS or _after_history(result, section):
            layout.after.append((section, items))
        else:
            layout.before.append((section, items))
    return layout


def system_text(sections: list[tuple[Section, list[Item]]]) -> str:
    """The sections before the conversation as one system message's text."""
    return "\n".join(block(s, items) for s, items in sections).lstrip("\n")


def after_text(layout: ChatLayout) -> str:
    return "\n\n".join(block(s, items).lstrip("\n") for s, items in layout.after)


def render_text(result: BuildResult) -> str:
    return "\n".join(block(s, items) for s, items in result.sections if items).lstrip("\n")


def render_chat(result: BuildResult) -> list[tuple[str, str]]:
    return render_chat_indexed(result)[0]


def render_chat_indexed(result: BuildResult) -> tuple[list[tuple[str, str]], dict[int, int]]:
    """A system message with every section before the conversation, the recent messages with their
    roles, one system message with the sections after it, and the query as the last user message
    (chat_layout). Also, per section, the index of the last chat message holding it (for cache
    breakpoints)."""
    layout = chat_layout(result)
    system = system_text(layout.before)
    head = [("system", system)] if system else []
    chat = [chat_message(it) for it in layout.history]
    tail = [("system", after_text(layout))] if layout.after else []
    query = [("user", layout.query)] if layout.query else []
    index = {int(s): 0 for s, _ in layout.before}
    index |= {int(s): len(head) + len(chat) for s, _ in layout.after}
    if chat:
        index[int(Section.RECENT_MESSAGES)] = len(head) + len(chat) - 1
    return head + chat + tail + query, index


def _after_history(result: BuildResult, section: Section) -> bool:
    """Whether the section is rendered after the conversation (it comes after it in render order)."""
    kinds = [s for s, items in result.sections]
    return Section.RECENT_MESSAGES in kinds and kinds.index(section) > kinds.index(Section.RECENT_MESSAGES)
