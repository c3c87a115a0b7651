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
    """System message with everything before the conversation, the recent messages with their roles,
    tool observations as a system message, and the query as the last user message (unless the newest
    message already is that query)."""
    system_parts, chat, tail = [], [], []
    for section, items in result.sections:
        if not items:
            continue
        if section == Section.RECENT_MESSAGES:
            chat = [_chat_message(it) for it in items]
        elif section == Section.TOOL_OBSERVATIONS:
            tail.append(("system", _block(section, items).lstrip("\n")))
        elif section == Section.QUERY:
            query = items[0].text
            if not (chat and chat[-1] == ("user", query)):
                tail.append(("user", query))
        else:
            system_parts.append(_block(section, items))
    system = "\n".join(system_parts).lstrip("\n")
    return ([("system", system)] if system else []) + chat + tail
