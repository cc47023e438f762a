"""The placement of a node in a cluster: :class:`Clustered`.

Each chunk of each object version has an owner (:mod:`lota.cluster.ownership`). For a
chunk this node does not hold, the :class:`~lota.cache.route.Route` is:

- owned here (or every owner is down): filled here from the origin and kept;
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
from collections import OrderedDict
from collections.abc import Sequence

from lota.cache.layout import chunk_count, chunk_length
from lota.cache.route import NodePlacement, OpenedChunk, Route, Warmed, known_or_learnt
from lota.cache.service import ChunkService
from lota.cache.store import CachedObject
from lota.cluster.cluster import OWNERS_ASKED, Cluster
from lota.cluster.hot import Copies, HotChunks
from lota.cluster.peers import OwnersSource, PeerClient
from lota.metrics import Metrics
from lota.tasks import TaskGroup

log = logging.getLogger("lota.cluster")

# Prefetch requests to other nodes in flight at once (read-ahead, bytes=0-0), per node.
PREFETCHES = 64
# A chunk asked of its owner is not asked again for this long (a reader's look-ahead
# passes over each chunk several times).
PREFETCH_MEMORY = 30.0
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


class RemoteFills:
    """Asking other processes (nodes, or workers of this node) to fill the chunks they own:
    without waiting (prefetch; a chunk asked for is not asked again for
    :data:`PREFETCH_MEMORY` seconds, as a reader's look-ahead passes over it several times),
    or waiting for them (warm)."""

    def __init__(self, peers: PeerClient, tasks: TaskGroup) -> None:
        self.peers = peers
        self._tasks = tasks
        self._asked: OrderedDict[tuple[str, ChunkId], float] = OrderedDict()  # -> when
        self._slots = asyncio.Semaphore(PREFETCHES)

    def ask(self, member: str, obj: CachedObject, chunks: Sequence[int]) -> None:
        m = obj.meta
        now = time.monotonic()
        asked = self._asked
        while asked and next(iter(asked.values())) < now - PREFETCH_MEMORY:
            asked.popitem(last=False)
        wanted = [i for i in chunks if (member, (m.bucket, m.key, m.etag, i)) not in asked]
        if wanted:
            asked.update(((member, (m.bucket, m.key, m.etag, i)), now) for i in wanted)
            self._tasks.start(self._ask(member, obj, wanted), f"prefetch {m.key}")

    async def _ask(self, member: str, obj: CachedObject, chunks: list[int]) -> None:
        async with self._slots:
            await self.fill(member, obj, chunks)

    async def fill(self, member: str, obj: CachedObject, chunks: Sequence[int]) -> Warmed:
        m = obj.meta
        return await self.peers.fill(member, m.bucket, m.key, m.etag, chunks)


class Clustered:
    """Where one bucket's chunks come from on a node of a cluster: chunks this node owns
    are the node-local placement's (one process, or its workers), the others come from
    their owner node."""

    spread = True

    def __init__(
        self,
        local: NodePlacement,
        cluster: Cluster,
        hot: HotCopies,
        fills: RemoteFills,
        metrics: Metrics,
    ) -> None:
        self._local = local
        self.origin = local.origin
        self.metadata = local.metadata
        self._cache = local.cache
        self._cluster = cluster
        self._hot = hot
        self._fills = fills
        self._metrics = metrics

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
            return self._local.route(obj, index, last)
        source = self._owners(asked)
        return Route(source, keep=self._hot.keep(obj, index), last=index)

    async def open_elsewhere(self, obj: CachedObject, index: int) -> OpenedChunk | None:
        if self._asked(obj, index):
            return None
        return await self._local.open_elsewhere(obj, index)

    def kept_elsewhere(self, obj: CachedObject, index: int) -> OpenedChunk | None:
        if self._asked(obj, index):
            return None
        return self._local.kept_elsewhere(obj, index)

    def _owners(self, asked: Sequence[str]) -> OwnersSource:
        peers = [self._cluster.peers.source(m) for m in asked]
        return OwnersSource(peers, self.origin, self._cluster.usable, self._metrics)

    # -- filling where they belong ----------------------------------------------------

    def prefetch(self, obj: CachedObject, indexes: Sequence[int]) -> None:
        here, elsewhere = self._split(obj, indexes)
        if here:
            self._local.prefetch(obj, here)
        for member, chunks in elsewhere.items():
            self._fills.ask(member, obj, chunks)

    async def warm(
        self, bucket: str, key: str, known: CachedObject | None, size: int = -1
    ) -> Warmed:
        obj = await known_or_learnt(self._cache, self.origin, bucket, key, known)
        if obj is None:
            return Warmed(failed=1)
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
        return await self._local.warm_chunks(obj, chunks), []

    async def _warm_on(
        self, member: str, obj: CachedObject, chunks: list[int]
    ) -> tuple[Warmed, list[int]]:
        """Warm `chunks` on their owner `member`; if it failed them and is down now, they
        are handed back, for the next owner."""
        warmed = await self._fills.fill(member, obj, chunks)
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
