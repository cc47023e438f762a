"""Where each chunk of an object comes from, and whether this node keeps it: :class:`Placement`.

The read path asks a placement, per chunk it does not hold, for a :class:`Route`: the
source to read the chunk from, and whether to fill it into this node's cache (then the
client follows the fill) or only relay it to the client. A node working alone has one
placement, :class:`Alone`: every chunk comes from the bucket's origin and is kept, and a
fill may run on to the end of what the reader asked for in one request. A node of a
cluster has :class:`lota.cluster.placement.Clustered`: a chunk another node owns is read
from that node (next owners, then the origin, when it fails) and kept only when it is hot.

A placement also fills chunks where they belong without a reader waiting
(:meth:`Placement.prefetch`: read-ahead, ``Range: bytes=0-0``) or with one that waits
for all of them (:meth:`Placement.warm`: ``lota warm``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from lota.cache import plan
from lota.cache.fill import FillJob
from lota.cache.layout import chunk_count
from lota.cache.service import ChunkService
from lota.cache.source import ByteSource, ChunkSource
from lota.cache.store import CachedObject


@dataclass(frozen=True, slots=True)
class Route:
    """Where one chunk comes from."""

    source: ByteSource
    keep: bool
    """Fill it into this node's cache (readers follow the fill); else relay it only."""
    last: int
    """A fill starting at this chunk may go on to chunk `last` in the same request."""


@dataclass(slots=True)
class Warmed:
    """What warming one object did, in chunks (over the whole cluster)."""

    filled: int = 0
    cached: int = 0
    failed: int = 0
    fetched: bool = False
    """Whether anything was fetched (an empty object has no chunks, yet it was)."""

    def add(self, other: Warmed) -> None:
        self.filled += other.filled
        self.cached += other.cached
        self.failed += other.failed
        self.fetched = self.fetched or other.fetched


class Placement(Protocol):
    """Where one bucket's chunks come from and are kept."""

    origin: ChunkSource
    """The bucket's origin: metadata (HEAD, revalidation) comes from it."""
    clustered: bool
    """Whether chunks are spread over nodes: then a cold read learns the object's
    metadata first (one HEAD), since which node owns a chunk depends on its version."""

    def route(self, obj: CachedObject, index: int, last: int) -> Route:
        """How to get chunk `index` of `obj` (a reader wants chunks up to `last`)."""
        ...

    def remote(self, obj: CachedObject, index: int) -> bool:
        """Whether chunk `index` would come from another node (``x-lota-cache: PEER``)."""
        ...

    def prefetch(self, obj: CachedObject, indexes: Sequence[int]) -> None:
        """Have these chunks filled where they belong; nobody waits for it."""
        ...

    async def warm(self, bucket: str, key: str, known: CachedObject | None) -> Warmed:
        """Fill every chunk of the object where it belongs, and wait until they are in
        (`known`: its cache entry, if this node has one)."""
        ...


class Alone:
    """The placement of a node working alone: every chunk from the origin, kept here."""

    clustered = False

    def __init__(self, cache: ChunkService, origin: ChunkSource) -> None:
        self._cache = cache
        self.origin = origin

    def route(self, obj: CachedObject, index: int, last: int) -> Route:
        return Route(self.origin, keep=True, last=last)

    def remote(self, obj: CachedObject, index: int) -> bool:
        return False

    def prefetch(self, obj: CachedObject, indexes: Sequence[int]) -> None:
        # One request over them all: the chunks in between are held or on their way
        # (a fill skips those), and nobody else should fill them.
        if indexes:
            m = obj.meta
            self._cache.fill(self.origin, m.bucket, m.key, min(indexes), max(indexes), obj)

    async def warm(self, bucket: str, key: str, known: CachedObject | None) -> Warmed:
        return await warm_here(self._cache, self.origin, bucket, key, known)


async def warm_here(
    cache: ChunkService,
    source: ByteSource,
    bucket: str,
    key: str,
    known: CachedObject | None,
    indexes: Sequence[int] | None = None,
) -> Warmed:
    """Fill chunks `indexes` (default: all) of an object into this node's cache from
    `source` and wait for them: one request per run of consecutive chunks missing. A chunk
    another fill was bringing in counts once that fill is done. An object not `known` yet
    is learnt from the request that fills all of it (no `indexes` then)."""
    if known is None:
        job = cache.fill(source, bucket, key, 0, None)
        await job.done.wait()
        obj = _filled(job)
        if obj is None:
            return Warmed(failed=1)
        return _count(cache, obj, range(chunk_count(obj.meta.size, cache.chunk_size)), 0)
    every = range(chunk_count(known.meta.size, cache.chunk_size))
    wanted = list(every if indexes is None else indexes)
    held = [i for i in wanted if cache.has_chunk(known, i)]
    missing = [i for i in wanted if not cache.has_chunk(known, i)]
    if not missing:
        return Warmed(cached=len(held))
    others = [f for i in missing if (f := cache.filling(known, i)) is not None]
    jobs = [cache.fill(source, bucket, key, a, b, known) for a, b in plan.runs(missing)]
    for job in jobs:
        await job.done.wait()
    for fill in others:
        while not fill.finished:
            await fill.wait()
    if any(_filled(job) is None for job in jobs):
        return Warmed(cached=len(held), failed=len(missing), fetched=True)
    return _count(cache, known, missing, len(held))


def _filled(job: FillJob) -> CachedObject | None:
    """What a finished fill job filled: the object, or None if it failed or was refused."""
    outcome = job.result
    if not outcome.done() or outcome.exception() is not None:
        return None
    obj = outcome.result()
    return obj if isinstance(obj, CachedObject) else None


def _count(cache: ChunkService, obj: CachedObject, indexes: Sequence[int], held: int) -> Warmed:
    done = Warmed(cached=held, fetched=True)
    for index in indexes:
        if cache.has_chunk(obj, index):
            done.filled += 1
        else:
            done.failed += 1
    return done
