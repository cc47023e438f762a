"""Hot chunks: which chunks owned by other nodes this node keeps a copy of.

Without copies, a chunk everyone reads (a small hot object, the header of a checkpoint
every rank opens, an object uploaded in one PUT) is served by its one owner to the whole
cluster, and most hits become remote hits. So a chunk this node has read from its owner
``hot_reads`` times within ``hot_window`` seconds is filled into the local cache too, and
the next readers here get it from the local drive. Copies may take ``hot_share`` of the
cache budget (groupcache keeps its "hot cache" at 1/8 of the main one); when they would
take more, the oldest copies are released first.

No I/O: :class:`HotChunks` counts, :class:`Copies` keeps the books; the placement
(:mod:`lota.cluster.placement`) fills and releases.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

# Chunks whose peer reads are being counted at once; the least recent go first.
TRACKED = 100_000


class HotChunks:
    """Counts reads of other nodes' chunks; says when one turns hot."""

    def __init__(self, reads: int, window: float, tracked: int = TRACKED) -> None:
        self._reads = reads
        self._window = window
        self._tracked = tracked
        self._seen: OrderedDict[Hashable, tuple[float, int]] = OrderedDict()

    def read(self, chunk: Hashable, now: float) -> bool:
        """Count one read of `chunk` from a peer; whether it is hot now."""
        first, count = self._seen.pop(chunk, (now, 0))
        if now - first > self._window:
            first, count = now, 0
        count += 1
        self._seen[chunk] = (first, count)
        if len(self._seen) > self._tracked:
            self._seen.popitem(last=False)
        return count >= self._reads


class Copies(Generic[K]):
    """The copies of other nodes' chunks kept here, oldest first, within `limit` bytes."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.bytes = 0
        self._held: OrderedDict[K, int] = OrderedDict()

    def __contains__(self, chunk: object) -> bool:
        return chunk in self._held

    def add(self, chunk: K, size: int) -> list[K] | None:
        """Make room for a copy of `chunk`: the copies to release first (oldest first), or
        None when it cannot fit at all."""
        if size > self.limit:
            return None
        released: list[K] = []
        while self.bytes + size > self.limit:
            old, old_size = self._held.popitem(last=False)
            self.bytes -= old_size
            released.append(old)
        self._held[chunk] = size
        self.bytes += size
        return released

    def forget(self, chunk: K) -> None:
        """`chunk` is not held after all (its fill failed)."""
        size = self._held.pop(chunk, None)
        if size is not None:
            self.bytes -= size
