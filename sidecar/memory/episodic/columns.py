"""StrColumn: a list of strings kept as one UTF-8 buffer and the offsets of its items, decoded one item
at a time when read; StrLookup: a StrColumn's items found by value through a hash table kept as an
array. A restored index (_UserIndex.restore) reads its turns' texts and its terms this way straight from
the snapshot's mapped file: a query decodes the few dozen turns it returns and looks up the few dozen
terms it asks about, instead of making an object per turn and a dict of every term first."""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Sequence
from operator import itemgetter
from typing import overload

import numpy as np


class StrColumn(Sequence[str]):
    """An immutable sequence of strings over (utf-8 bytes, int64 offsets of len + 1); an item once
    decoded is kept (a user's next questions recall many of the same turns)."""

    __slots__ = ("_bounds", "_data", "_decoded", "_offsets", "_view")

    def __init__(self, data: np.ndarray, offsets: np.ndarray) -> None:
        self._data, self._offsets = data, offsets
        self._view = memoryview(data)  # str(view[a:b], "utf-8") decodes without copying the slice first
        self._bounds = memoryview(offsets)  # an item of it is a Python int, no numpy scalar made first
        self._decoded: list[str | None] = [None] * (len(offsets) - 1)

    @classmethod
    def of(cls, strings: Sequence[str]) -> StrColumn:
        encoded = [s.encode() for s in strings]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), np.uint8), offsets)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> list[str]: ...
    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
            if i < 0:
                raise IndexError("StrColumn index out of range")
        s = self._decoded[i]  # IndexError past the end
        if s is None:
            s = self._decoded[i] = str(self.raw(i), "utf-8")
        return s

    def pick(self, rows: list[int]) -> list[str]:
        """[self[r] for r in rows] (rows in range), those decoded before read in one C call."""
        if not rows:
            return []
        got = list(itemgetter(*rows)(self._decoded)) if len(rows) > 1 else [self._decoded[rows[0]]]
        if None in got:
            at = [j for j, s in enumerate(got) if s is None]
            missing = np.array([rows[j] for j in at], np.int64)
            view, decoded = self._view, self._decoded
            bounds = zip(self._offsets[missing].tolist(), self._offsets[missing + 1].tolist(), strict=True)
            for j, row, (a, b) in zip(at, missing.tolist(), bounds, strict=True):
                got[j] = decoded[row] = str(view[a:b], "utf-8")
        return got  # type: ignore[return-value]  # no None left

    def raw(self, i: int) -> memoryview:
        """The i-th item's UTF-8 bytes (0 <= i < len)."""
        bounds = self._bounds
        return self._view[bounds[i]:bounds[i + 1]]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tolist())

    def tolist(self) -> list[str]:
        data, bounds = bytes(self._view), self._offsets.tolist()
        return [data[a:b].decode() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and not isinstance(other, str) and self.tolist() == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable peers (lists) compare equal

    def __reduce__(self) -> tuple:
        # Pickled as its two arrays: with protocol 5 they travel out of band (snapshots.pack).
        return StrColumn, (self._data, self._offsets)


SEEN_MAX = 4096  # StrLookup's answers kept


class StrLookup:
    """The index of a string in a StrColumn (whose items are distinct): linear probing from the item's
    crc32 in a table of item indices (-1: empty) twice the items' count, with room after its end for
    the probes that run past it (no wrap-around)."""

    __slots__ = ("column", "_mask", "_seen", "_slots", "_table")

    def __init__(self, column: StrColumn, slots: np.ndarray) -> None:
        self.column, self._slots = column, slots
        self._table = memoryview(slots)  # read through a memoryview: its items are Python ints
        self._mask = len(slots) - len(column) - 2  # the table's size (a power of two) - 1
        # Answers given, kept while few (a user's questions and their expansions ask for the same terms again).
        self._seen: dict[str, int | None] = {}

    @classmethod
    def of(cls, column: StrColumn) -> StrLookup:
        n = len(column)
        size = 1 << max(2 * n - 1, 1).bit_length()
        home = np.fromiter((zlib.crc32(column.raw(i)) & (size - 1) for i in range(n)), np.int64, n)
        # Placed in the order of their home slots, each at its home or just after the one placed before:
        # the same run of taken slots from an item's home to its slot that one-by-one insertion leaves.
        order = np.argsort(home, kind="stable")
        step = np.arange(n)
        slots = np.full(size + n + 1, -1, np.int32)
        slots[np.maximum.accumulate(home[order] - step) + step] = order
        return cls(column, slots)

    def get(self, s: str) -> int | None:
        if s in self._seen:
            return self._seen[s]
        key = s.encode()
        table, column = self._table, self.column
        at = zlib.crc32(key) & self._mask
        found = None
        while (i := table[at]) >= 0:
            if column.raw(i) == key:
                found = i
                break
            at += 1
        if len(self._seen) >= SEEN_MAX:
            self._seen.clear()
        self._seen[s] = found
        return found

    def __reduce__(self) -> tuple:
        return StrLookup, (self.column, self._slots)
