"""Loading a user's in-process state (memory rows, a recall index) without holding the lock that every
other user's call takes: the read runs outside it, and its result is kept only if no change of that
user landed meanwhile. Changes are counted per stripe of users (ChangeSerials), so a change of another
user on the same stripe costs a load at most one more read."""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import TypeVar

STRIPES = 64  # users share change serials (and a service's writer locks) by hash
LOAD_TRIES = 3  # reads without the lock before one under it (changes kept landing on the stripe)

State = TypeVar("State")
Read = TypeVar("Read")


class ChangeSerials:
    """By stripe of keys, a serial that every change of a key's state bumps, under its owner's lock."""

    def __init__(self, stripes: int = STRIPES) -> None:
        self._serials = [0] * stripes

    def stripe(self, key: Hashable) -> int:
        return hash(key) % len(self._serials)

    def changed(self, key: Hashable) -> None:
        """A change of key's rows or state landed (called under the owner's lock): loads in flight are stale."""
        self._serials[self.stripe(key)] += 1

    def changed_all(self) -> None:
        """Every key's state changed (other knobs): every load in flight is stale."""
        self._serials = [s + 1 for s in self._serials]

    def load(self, lock: threading.RLock, key: Hashable, find: Callable[[], State | None],
             begin: Callable[[], Callable[[], Read]], keep: Callable[[Read], State],
             locked: Callable[[], State]) -> State:
        """key's state: find() it under `lock`; else begin() under the lock (what the read needs) and
        run the read it returns without the lock, then keep(result) under the lock if no change of
        key's stripe landed meanwhile and no other call loaded it first (find() again); after
        LOAD_TRIES reads, locked() loads it under the lock."""
        stripe = self.stripe(key)
        for _ in range(LOAD_TRIES):
            with lock:
                state = find()
                if state is not None:
                    return state
                seen = self._serials[stripe]
                read = begin()
            got = read()
            with lock:
                state = find()
                if state is not None:  # another call loaded it first
                    return state
                if self._serials[stripe] == seen:
                    return keep(got)
        with lock:
            state = find()
            return state if state is not None else locked()
