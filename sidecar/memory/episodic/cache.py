"""The ranking cache: a question's ranking kept while the user's turns are the same, so the same
question again (an agent's tool loop, another budget) only cuts it to its budget."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sidecar.memory.episodic.index import _UserIndex


class _RankedCache:
    """Recent rankings (_best_first of _UserIndex.rank), each valid for the index it was made on (by
    its serial: a compacted or reloaded index is another one) as long as that index has as many turns
    (an index only grows). Read and written under EpisodicSource's lock (get() also as an unlocked peek)."""

    SIZE = 256  # at most ~10 KB each (600 rows): ~2.5 MB

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple, tuple[int, tuple[np.ndarray, np.ndarray]]] = OrderedDict()

    def get(self, state: _UserIndex, memo: tuple) -> tuple[np.ndarray, np.ndarray] | None:
        entry = self._entries.get((state.serial, memo))
        if entry is None or entry[0] != len(state):
            return None
        return entry[1]

    def drop(self, state: _UserIndex) -> None:
        """Forget the rankings made on this index (it left the source: forgotten, evicted, replaced)."""
        for key in [k for k in self._entries if k[0] == state.serial]:
            del self._entries[key]

    def clear(self) -> None:
        self._entries.clear()

    def put(self, state: _UserIndex, memo: tuple, ranked: tuple[np.ndarray, np.ndarray]) -> None:
        key = (state.serial, memo)
        self._entries.pop(key, None)
        self._entries[key] = (len(state), ranked)
        while len(self._entries) > self.SIZE:
            self._entries.popitem(last=False)
