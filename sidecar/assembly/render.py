"""Render an assembled context as one prompt string or as chat messages, in section order."""

from __future__ import annotations

from sidecar.assembly.builder import HEADERS, ROLE_LABELS, BuildResult, Item
from sidecar.assembly.candidates import Section


def _block(section: Section, items: list[Item]) -> str:
    body = "\n".join(it.text for it in items)
    header = HEADERS.get(section)
    return f"\n{header}\n{body}" if header else body


def _chat_message(item: Item) -> tuple[str, str]:
    role = ROLE_LABELS.get(item.role, "user")
    prefix = role + ": "
    return role, item.text[len(prefix):] if item.text.startswith(prefix) else item.text


def render_text(result: BuildResult) -> str:
    return "\n".join(_block(s, items) for s, items in result.sections if items).lstrip("\n")


def render_chat(result: BuildResult) -> list[tuple[str, str]]:
    return render_chat_indexed(result)[0]


def render_chat_indexed(result: BuildResult) -> tuple[list[tuple[str, str]], dict[int, int]]:
    """A system message with every section before the conversation, the recent messages with their
    roles, one system message with the sections after it (this call's memories, knowledge and tool
    observations in the cache-aware layout; tool observations in the classic one), and the query as
    the last user message (unless the newest message already is that query). Also, per section, the
    index of the last chat message holding it (for cache breakpoints)."""
    system_parts, chat, after, query_msg = [], [], [], []
    placed: dict[int, str] = {}  # section -> "system", "chat" or "after"
    for section, items in result.sections:
        if not items:
            continue
        if section == Section.RECENT_MESSAGES:
            chat = [_chat_message(it) for it in items]
            placed[int(section)] = "chat"
        elif section == Section.QUERY:
            query = items[0].text
            if not (chat and chat[-1] == ("user", query)):
                query_msg.append(("user", query))
        elif chat or section == Section.TOOL_OBSERVATIONS or _after_history(result, section):
            after.append(_block(section, items).lstrip("\n"))
            placed[int(section)] = "after"
        else:
            system_parts.append(_block(section, items))
            placed[int(section)] = "system"
    system = "\n".join(system_parts).lstrip("\n")
    head = [("system", system)] if system else []
    tail = [("system", "\n\n".join(after))] if after else []
    where = {"system": 0, "chat": len(head) + len(chat) - 1, "after": len(head) + len(chat)}
    return head + chat + tail + query_msg, {s: where[p] for s, p in placed.items()}


def _after_history(result: BuildResult, section: Section) -> bool:
    """Whether the section is rendered after the conversation (it comes after it in render order)."""
    kinds = [s for s, items in result.sections]
    return Section.RECENT_MESSAGES in kinds and kinds.index(section) > kinds.index(Section.RECENT_MESSAGES)
