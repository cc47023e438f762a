"""Where each chunk of an object comes from, and whether this node keeps it: :class:`Placement`.

The read path asks a placement, per chunk it does not hold, for a :class:`Route`: the
source to read the chunk from, and whether to fill it into this node's cache (then the
client follows the fill) or only relay it to the client. A node working alone has one
placement, :class:`Alone`: every chunk comes from the bucket's origin and is kept. A node of a
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

from lota.cache.fill import FillJob, OriginReply
from lota.cache.layout import chunk_count
from lota.cache.service import ChunkService
from lota.cache.source import ByteSource, ChunkSource
from lota.cache.store import CachedObject


class OpenedChunk(Protocol):
    """A chunk file held by another process of this node, open here: send it from `fd`,
    then :meth:`close`. While `kept`, the descriptor stays open here after that (at least
    until the event loop goes on); :meth:`drop` says its file is not to be read again."""

    fd: int
    length: int
    kept: bool
    warm: tuple[int, int] | None
    """See :class:`lota.cache.store.reader.Warm`."""

    def read(self) -> None:
        """Bytes of it were read for a client (not only to find out whether it is held, or to
        bring it to hand): its owner counts that as its own hit."""

    def close(self) -> None: ...

    def drop(self) -> None: ...


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
    """The bucket's origin: revalidation asks it."""
    metadata: ChunkSource
    """Where a cold read learns an object's metadata (one HEAD): the origin, or the
    worker of this node the key's metadata lives with, which asks the origin once for all."""
    spread: bool
    """Whether chunks are spread over processes (workers, nodes): then a cold read learns
    the object's metadata first (one HEAD), since who owns a chunk depends on its version."""

    def route(self, obj: CachedObject, index: int, last: int) -> Route:
        """How to get chunk `index` of `obj` (a reader wants chunks up to `last`)."""
        ...

    def remote(self, obj: CachedObject, index: int) -> bool:
        """Whether chunk `index` would come from another node (``x-lota-cache: PEER``)."""
        ...

    async def open_elsewhere(self, obj: CachedObject, index: int) -> OpenedChunk | None:
        """Chunk `index`, if another worker of this node holds it (sent from here,
        zero-copy; :meth:`OpenedChunk.read` once read for a client); None if not, or if it
        is not another worker's."""
        ...

    def kept_elsewhere(self, obj: CachedObject, index: int) -> OpenedChunk | None:
        """Like :meth:`open_elsewhere`, without waiting: only a chunk whose descriptor
        another worker has handed over already (and that is kept here)."""
        ...

    def prefetch(self, obj: CachedObject, indexes: Sequence[int]) -> None:
        """Have these chunks filled where they belong; nobody waits for it."""
        ...

    async def warm(
        self, bucket: str, key: str, known: CachedObject | None, size: int = -1
    ) -> Warmed:
        """Fill every chunk of the object where it belongs, and wait until they are in
        (`known`: its cache entry, if this node has one; `size`: its size as listed, -1 if
        not known)."""
        ...


class NodePlacement(Placement, Protocol):
    """The placement of the chunks this node owns (all of them, for a node alone): what a
    cluster's placement hands the node's own chunks to."""

    cache: ChunkService

    async def warm_chunks(self, obj: CachedObject, indexes: Sequence[int]) -> Warmed:
        """Fill these chunks of `obj` where they belong on this node; wait for them."""
        ...


class Alone:
    """The placement of a node working alone in one process: every chunk from the origin,
    kept here."""

    spread = False

    def __init__(self, cache: ChunkService, origin: ChunkSource) -> None:
        self.cache = cache
        self.origin = self.metadata = origin

    def route(self, obj: CachedObject, index: int, last: int) -> Route:
        return Route(self.origin, keep=True, last=index)

    def remote(self, obj: CachedObject, index: int) -> bool:
        return False

    async def open_elsewhere(self, obj: CachedObject, index: int) -> OpenedChunk | None:
        return None

    def kept_elsewhere(self, obj: CachedObject, index: int) -> OpenedChunk | None:
        return None

    def prefetch(self, obj: CachedObject, indexes: Sequence[int]) -> None:
        if indexes:
            self.cache.fill_each(self.origin, obj, indexes)

    async def warm(
        self, bucket: str, key: str, known: CachedObject | None, size: int = -1
    ) -> Warmed:
        if known is None and size == 0:  # nothing to fill: one HEAD says all there is
            learnt = await self.cache.learn(self.origin, bucket, key)
            return Warmed(fetched=True) if isinstance(learnt, CachedObject) else Warmed(failed=1)
        return await warm_here(self.cache, self.origin, bucket, key, known)

    async def warm_chunks(self, obj: CachedObject, indexes: Sequence[int]) -> Warmed:
        m = obj.meta
        return await warm_here(self.cache, self.origin, m.bucket, m.key, obj, indexes)


async def warm_here(
    cache: ChunkService,
    source: ChunkSource,
    bucket: str,
    key: str,
    known: CachedObject | None,
    indexes: Sequence[int] | None = None,
) -> Warmed:
    """Fill chunks `indexes` (default: all) of an object into this node's cache from
    `source` and wait for them: a ranged request each, ``fill_concurrency`` at a time. A
    chunk another fill was bringing in counts once that fill is done. An object not
    `known` yet is learnt from the request for its first chunk."""
    done = Warmed()
    if known is None:
        job = cache.fill(source, bucket, key, 0, 0)  # its answer says what the object is
        await job.ended
        known = _filled(job)
        if known is None and _refused(job) == 416:  # an empty object: no chunk to read
            learnt = await cache.learn(source, bucket, key)
            known = learnt if isinstance(learnt, CachedObject) else None
        if known is None:
            return Warmed(failed=1)
        done = _count(cache, known, [0] if known.meta.size else [])
        indexes = range(1, chunk_count(known.meta.size, cache.chunk_size))
    every = range(chunk_count(known.meta.size, cache.chunk_size))
    wanted = list(every if indexes is None else indexes)
    missing = [i for i in wanted if not cache.has_chunk(known, i)]
    done.cached += len(wanted) - len(missing)
    if missing:
        await cache.fill_each(source, known, missing)
        done.add(_count(cache, known, missing))
    return done


async def known_or_learnt(
    cache: ChunkService, origin: ChunkSource, bucket: str, key: str, known: CachedObject | None
) -> CachedObject | None:
    """`known`, or the object's entry learnt from `origin` (one HEAD); None if refused."""
    if known is not None:
        return known
    learnt = await cache.learn(origin, bucket, key)
    return learnt if isinstance(learnt, CachedObject) else None


def _filled(job: FillJob) -> CachedObject | None:
    """What a finished fill job filled: the object, or None if it failed or was refused."""
    outcome = job.result
    if not outcome.done() or outcome.exception() is not None:
        return None
    obj = outcome.result()
    return obj if isinstance(obj, CachedObject) else None


def _refused(job: FillJob) -> int:
    """The status a finished job's source refused it with (0 if it did not)."""
    outcome = job.result
    if not outcome.done() or outcome.exception() is not None:
        return 0
    answer = outcome.result()
    return answer.status if isinstance(answer, OriginReply) else 0


def _count(cache: ChunkService, obj: CachedObject, indexes: Sequence[int]) -> Warmed:
    """What became of chunks `indexes`, just fetched."""
    done = Warmed(fetched=True)
    for index in indexes:
        if cache.has_chunk(obj, index):
            done.filled += 1
        else:
            done.failed += 1
    return done
