"""The placement of a node in a cluster: :class:`Clustered`.

Each chunk of each object version has an owner (:mod:`lota.cluster.ownership`). For a
chunk this node does not hold, the :class:`~lota.cache.route.Route` is:

- owned here (or every owner is down): filled here from the origin, in one request with
  the chunks after it that are also owned here, and kept;
- owned by another node: relayed from it as it arrives (its next owners, then the origin,
  when it fails), and kept here only once it is hot (:mod:`lota.cluster.hot`).

The owner's version check makes a stale copy unservable: every peer read names the ETag
it wants, and the owner answers that version or 412, never another.

Prefetches (read-ahead, ``Range: bytes=0-0``) and warming ask each chunk's owner to fill
it, so a prefix is warmed once for the whole cluster.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from lota.cache import plan
from lota.cache.fill import OriginReply
from lota.cache.layout import chunk_count, chunk_length
from lota.cache.route import Route, Warmed, warm_here
from lota.cache.service import ChunkService
from lota.cache.source import ChunkSource
from lota.cache.store import CachedObject
from lota.cluster.cluster import OWNERS_ASKED, Cluster
from lota.cluster.hot import Copies, HotChunks
from lota.cluster.peers import OwnersSource
from lota.metrics import Metrics
from lota.tasks import TaskGroup

log = logging.getLogger("lota.cluster")

# Prefetch requests to other nodes in flight at once (read-ahead, bytes=0-0), per node.
PREFETCHES = 64
ChunkId = tuple[str, str, str, int]


class HotCopies:
    """The hot-chunk rule and the copies it keeps, for the whole node (every region's
    placement shares them)."""

    def __init__(
        self, hot: HotChunks, copies: Copies[ChunkId], cache: ChunkService, metrics: Metrics
    ) -> None:
        self.hot = hot
        self.copies = copies
        self._cache = cache
        self._metrics = metrics

    def keep(self, obj: CachedObject, index: int) -> bool:
        """Count a peer read of chunk `index`; whether to keep a copy of it now."""
        m = obj.meta
        chunk: ChunkId = (m.bucket, m.key, m.etag, index)
        if not self.hot.read(chunk, time.monotonic()) or chunk in self.copies:
            return False
        if not self._cache.keeps(obj, index):
            return False  # the cache is full of chunks read as often here (the admission rule)
        released = self.copies.add(chunk, chunk_length(m.size, self._cache.chunk_size, index))
        if released is None:
            return False
        for bucket, key, etag, old in released:
            held = self._cache.lookup(bucket, key)
            if held is not None and held.meta.etag == etag:
                self._cache.release(held, old)
        self._metrics.cluster_copies.inc()
        self._metrics.cluster_copy_bytes.set(self.copies.bytes)
        return True


class Clustered:
    """Where one bucket's chunks come from on a node of a cluster."""

    clustered = True

    def __init__(
        self,
        cache: ChunkService,
        origin: ChunkSource,
        cluster: Cluster,
        hot: HotCopies,
        tasks: TaskGroup,
        metrics: Metrics,
    ) -> None:
        self._cache = cache
        self.origin = origin
        self._cluster = cluster
        self._hot = hot
        self._tasks = tasks
        self._metrics = metrics
        self._prefetching: set[ChunkId] = set()
        self._prefetch_slots = asyncio.Semaphore(PREFETCHES)

    # -- who --------------------------------------------------------------------------

    def _asked(self, obj: CachedObject, index: int) -> list[str]:
        """The owners to ask for chunk `index`, in order: the usable ones before this node
        (empty when this node is the first usable owner, or none is usable)."""
        cluster = self._cluster
        asked = []
        for member in cluster.owners(obj.meta, index):
            if member == cluster.me:
                break
            if cluster.usable(member):
                asked.append(member)
        return asked

    def remote(self, obj: CachedObject, index: int) -> bool:
        return bool(self._asked(obj, index))

    # -- reading ----------------------------------------------------------------------

    def route(self, obj: CachedObject, index: int, last: int) -> Route:
        asked = self._asked(obj, index)
        if not asked:
            end = index
            while end < last and not self._asked(obj, end + 1):
                end += 1
            return Route(self.origin, keep=True, last=end)
        source = self._owners(asked)
        return Route(source, keep=self._hot.keep(obj, index), last=index)

    def _owners(self, asked: Sequence[str]) -> OwnersSource:
        peers = [self._cluster.peers.source(m) for m in asked]
        return OwnersSource(peers, self.origin, self._cluster.usable, self._metrics)

    # -- filling where they belong ----------------------------------------------------

    def prefetch(self, obj: CachedObject, indexes: Sequence[int]) -> None:
        here, elsewhere = self._split(obj, indexes)
        m = obj.meta
        for first, last in plan.runs(here):
            self._cache.fill(self.origin, m.bucket, m.key, first, last, obj)
        for member, chunks in elsewhere.items():
            wanted = [i for i in chunks if (m.bucket, m.key, m.etag, i) not in self._prefetching]
            if wanted:
                self._prefetching.update((m.bucket, m.key, m.etag, i) for i in wanted)
                self._tasks.start(self._prefetch(member, obj, wanted), f"prefetch {m.key}")

    async def _prefetch(self, member: str, obj: CachedObject, chunks: list[int]) -> None:
        m = obj.meta
        try:
            async with self._prefetch_slots:
                await self._cluster.peers.fill(member, m.bucket, m.key, m.etag, chunks)
        finally:
            self._prefetching.difference_update((m.bucket, m.key, m.etag, i) for i in chunks)

    async def warm(self, bucket: str, key: str, known: CachedObject | None) -> Warmed:
        obj = known
        if obj is None:
            learnt = await self._cache.learn(self.origin, bucket, key)
            if isinstance(learnt, OriginReply):
                return Warmed(failed=1)
            obj = learnt
        pending = list(range(chunk_count(obj.meta.size, self._cache.chunk_size)))
        done = Warmed(fetched=known is None)
        # Chunks whose owner failed them go to the next owner, down to this node last.
        for _ in range(OWNERS_ASKED + 1):
            here, elsewhere = self._split(obj, pending)
            parts = [self._warm_here(obj, here)] if here else []
            parts += [self._warm_on(m, obj, chunks) for m, chunks in elsewhere.items()]
            pending = []
            for warmed, retry in await asyncio.gather(*parts):
                done.add(warmed)
                pending += retry
            if not pending:
                break
        done.failed += len(pending)
        return done

    async def _warm_here(self, obj: CachedObject, chunks: list[int]) -> tuple[Warmed, list[int]]:
        m = obj.meta
        return await warm_here(self._cache, self.origin, m.bucket, m.key, obj, chunks), []

    async def _warm_on(
        self, member: str, obj: CachedObject, chunks: list[int]
    ) -> tuple[Warmed, list[int]]:
        """Warm `chunks` on their owner `member`; if it failed them and is down now, they
        are handed back, for the next owner."""
        m = obj.meta
        warmed = await self._cluster.peers.fill(member, m.bucket, m.key, m.etag, chunks)
        if warmed.failed and not self._cluster.usable(member):
            warmed.failed = 0
            return warmed, chunks
        return warmed, []

    def _split(
        self, obj: CachedObject, indexes: Sequence[int]
    ) -> tuple[list[int], dict[str, list[int]]]:
        """`indexes` as the chunks this node fills and, per member, the chunks it owns."""
        here: list[int] = []
        elsewhere: dict[str, list[int]] = {}
        for index in indexes:
            asked = self._asked(obj, index)
            if asked:
                elsewhere.setdefault(asked[0], []).append(index)
            else:
                here.append(index)
        return here, elsewhere
