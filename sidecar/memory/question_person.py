"""Whose turns a question asks about when it names nobody: a user asks about themselves in the first
person ("what did I…", "my…") and about what the assistant said in the second ("you recommended…",
"did you say…", "your list"). A "you" that only asks for something now ("can you remind me…") is not
about the assistant's past turns, nor is a "me" (its object); a question that points back to the
conversation itself ("our previous chat", "we talked about") may ask about either side's turns."""

from __future__ import annotations

import re

from fastpath.reference.scripts import as_typed
from sidecar.domain import Role

_FIRST = re.compile(r"\b(?:i|i'm|i've|i'd|i'll|my|mine|myself)\b|我")
# The assistant as the one who said, wrote or gave something earlier (English and Chinese).
_SECOND_SAID = re.compile(
    r"\byou(?:'ve| have| had)? (?:said|mentioned|told|recommended|suggested|provided|gave|listed|shared|"
    r"explained|described|wrote|made|offered|proposed|named|pointed|came up|created|advised)\b|"
    r"\b(?:did|do) you (?:say|mention|tell|recommend|suggest|provide|give|list|share|explain|describe|write|"
    r"offer|propose|name|advise)\b|"
    r"\byour (?:suggestions?|recommendations?|list|answers?|advice|response|reply|explanation|tips?|ideas?)\b|"
    r"你(?:说|提到|推荐|建议|给|列)")


# The conversation itself as the subject: what either side said in it.
_SHARED = re.compile(r"\bour (?:\w+ ){0,2}(?:conversation|chat|discussion|talk)s?\b|"
                     r"\bwe (?:talked|discussed|chatted|spoke|went over)\b|我们(?:聊|谈|讨论)")


def asked_about(question: str) -> Role | None:
    """ASSISTANT when the question asks what the assistant said, USER when it speaks of the asker in the
    first person (and not of the conversation itself), else None."""
    text = as_typed(question.lower())  # "you’ve said", as phones type it
    if _SECOND_SAID.search(text):
        return Role.ASSISTANT
    if _SHARED.search(text):
        return None
    if _FIRST.search(text):
        return Role.USER
    return None
