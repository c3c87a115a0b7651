"""What of a prompt a provider may serve from its cache: per section a digest, the tokens at its
start identical to the session's previous prompt, and where cache breakpoints go (end of tools,
end of state, end of history). The previous prompt of each session is kept as its sections'
digests, its items' hashes and the head it was built on (state, pinned constraints), in memory (a
restarted sidecar reports 0 for one call)."""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sidecar.assembly.candidates import Section
from sidecar.store.cache import SessionView

MAX_SESSIONS = 4096
# A breakpoint after the last non-empty section of each group (the prefix a provider caches).
BREAKPOINT_GROUPS = ((Section.SYSTEM_RULES, Section.TOOLS), (Section.PINNED_CONSTRAINTS, Section.SESSION_STATE),
                     (Section.SUMMARY, Section.RECENT_MESSAGES))


class Packed(Protocol):
    kind: Section
    tokens: int
    bodies: list[bytes]
    item_tokens: list[int] | None

    @property
    def items(self) -> Sequence: ...


@dataclass(frozen=True, slots=True)
class SectionDigest:
    kind: Section
    hash: str
    tokens: int  # with its header


@dataclass(frozen=True, slots=True)
class PromptCache:
    prefix_tokens: int  # identical to the session's previous prompt
    digests: list[SectionDigest]
    breakpoints: list[tuple[Section, int]]  # (last section of the prefix, tokens through it)


@dataclass(frozen=True, slots=True)
class _Seen:
    digest: SectionDigest
    item_hashes: tuple[int, ...]


def prompt_head(view: SessionView) -> Hashable:
    """What the sections before the summary are made of that a session changes: its confirmed facts
    (their version) and its pinned constraints."""
    return view.state_version, tuple(p.pin_id for p in view.pinned if not p.unpinned_at_ms)


class PromptMemory:
    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self._previous: OrderedDict[tuple[str, str, str], tuple[list[_Seen], Hashable]] = OrderedDict()
        self._lock = threading.Lock()

    def compare(self, key: tuple[str, str, str], packed: Sequence[Packed],
                header_tokens: Mapping[Section, int], head: Hashable = None) -> PromptCache:
        """The cache report of this prompt (sections in render order) against the session's previous
        one, which it then replaces (with the `head` it was built on: see prompt_head)."""
        with self._lock:
            last = self._previous.get(key)
        # A section whose items are those of a section of the session's previous prompt (the rules, the
        # tools, the kept recall) keeps its digest: its bytes are not read again.
        known = {(s.digest.kind, s.item_hashes): s.digest.hash for s in last[0]} if last is not None else {}
        seen = []
        for p in packed:
            if p.bodies:
                hashes = tuple(map(hash, p.bodies))
                digest = known.get((p.kind, hashes)) or _digest(p.bodies)
                seen.append(_Seen(SectionDigest(p.kind, digest, p.tokens + header_tokens.get(p.kind, 0)), hashes))
        with self._lock:
            before, _ = self._previous.pop(key, ([], None))
            self._previous[key] = (seen, head)
            while len(self._previous) > self.max_sessions:
                self._previous.popitem(last=False)
        shown = [p for p in packed if p.bodies]
        return PromptCache(_shared_tokens(before, seen, shown, header_tokens), [s.digest for s in seen],
                           _breakpoints(seen))

    def head_moved(self, key: tuple[str, str, str], head: Hashable) -> bool:
        """Whether the session's last prompt was built on another head than `head`: its next prompt
        differs from the last one before the summary, whatever follows."""
        with self._lock:
            last = self._previous.get(key)
        return last is not None and last[1] != head


    def drop_user(self, tenant_id: str, user_id: str) -> None:
        with self._lock:
            for k in [k for k in self._previous if k[0] == tenant_id and k[1] == user_id]:
                del self._previous[k]


def _shared_tokens(before: list[_Seen], now: list[_Seen], packed: list[Packed],
                   header_tokens: Mapping[Section, int]) -> int:
    """Tokens of the longest run of leading items equal in both prompts."""
    shared = 0
    for old, new, p in zip(before, now, packed, strict=False):
        if old.digest == new.digest:
            shared += new.digest.tokens
            continue
        if old.digest.kind == new.digest.kind:  # the same section grew or changed: its equal leading items
            k = next((i for i, (a, b) in enumerate(zip(old.item_hashes, new.item_hashes, strict=False)) if a != b),
                     min(len(old.item_hashes), len(new.item_hashes)))
            if k:
                counts = p.item_tokens if p.item_tokens is not None else [it.tokens for it in p.items]
                shared += header_tokens.get(p.kind, 0) + sum(counts[:k])
        break
    return shared


def _digest(bodies: list[bytes]) -> str:
    """A 64-bit checksum of a section's item bytes (CRC-32 and Adler-32): it tells a change, three times
    faster than a cryptographic hash, and is the same in every process and replica."""
    joined = b"\0".join(bodies)
    return f"{zlib.crc32(joined):08x}{zlib.adler32(joined):08x}"


def _breakpoints(seen: list[_Seen]) -> list[tuple[Section, int]]:
    out, total, last = [], 0, {}
    for s in seen:
        total += s.digest.tokens
        last[s.digest.kind] = total
    for group in BREAKPOINT_GROUPS:
        ends = [(last[k], k) for k in group if k in last]
        if ends:
            tokens, kind = max(ends)
            out.append((kind, tokens))
    return out
