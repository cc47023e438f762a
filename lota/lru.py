"""A least-recently-used map bounded by the sizes its entries declare (characters, bytes),
not by their number: for memories keyed by requests, whose keys vary in length."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class SizedLru(Generic[K, V]):
    """At most `max_size` in sizes; the least recently used forgotten first."""

    def __init__(self, max_size: int) -> None:
        self._entries: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._size = 0
        self._max_size = max_size

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: K) -> V | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: K, value: V, size: int) -> None:
        """Remember `value` (of `size`); one larger than the whole bound is not kept."""
        self.pop(key)
        if size > self._max_size:
            return
        self._entries[key] = (value, size)
        self._size += size
        while self._size > self._max_size:
            _, (_, old) = self._entries.popitem(last=False)
            self._size -= old

    def pop(self, key: K) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._size -= entry[1]
