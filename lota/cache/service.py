"""What the rest of a node may ask of its cache: :class:`ChunkService`.

The front end's read path, warming, write invalidation, and later the peer endpoint of
the cluster and the worker processes of a node, all go through this one interface; the
store (:mod:`lota.cache.store`) and the fills (:mod:`lota.cache.fill`) behind it are its
business. Lookups, chunk opens and hot reads answer at once from memory; fills start
with single flight: however many ask for a chunk, one request to a source fetches it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from prometheus_client import Counter

from lota.cache.fill import ChunkFill, Filler, FillJob, OriginReply
from lota.cache.intake import Intake, start_intake
from lota.cache.layout import parse_final
from lota.cache.plan import chunk_span
from lota.cache.source import ByteSource, ChunkSource
from lota.cache.store import CachedObject, CacheStore, ChunkReader, ObjectMeta, Watcher


class ChunkService:
    """A node's cache: the objects and chunks it holds, and the fills that add to them."""

    def __init__(self, store: CacheStore, filler: Filler) -> None:
        self._store = store
        self._filler = filler
        # Bytes of a chunk already open and in the page cache, read without a thread (or
        # a span of its file to send from there): the store's own, called for every hit.
        self.read_hot = store.read_hot
        self.count_hit = store.count_hit
        self.chunk_size = filler.chunk_size
        self.fill_concurrency = filler.concurrency

    # -- what is held -------------------------------------------------------------------

    @property
    def changed_at(self) -> float:
        """When an entry was last dropped or replaced (``time.monotonic()``), or the store
        opened: metadata asked of the origin before then is not to be taken as validated."""
        return self._store.changed_at

    def watch(self, watcher: Watcher | None) -> None:
        """Have `watcher` told what the store learns (None: nobody)."""
        self._store.watcher = watcher

    def lookup(self, bucket: str, key: str) -> CachedObject | None:
        return self._store.lookup(bucket, key)

    def event_position(self) -> int | None:
        return self._store.event_position

    def save_event_position(self, position: int) -> None:
        self._store.save_event_position(position)

    async def admit(
        self, meta: ObjectMeta, since: float | None = None, *, tell: bool = False
    ) -> CachedObject:
        """Keep `meta` as the entry of its (bucket, key); unvalidated if an entry was dropped
        or replaced `since` (``time.monotonic()`` when the origin was asked). `tell`: see
        :meth:`lota.cache.store.CacheStore.admit`."""
        return await self._store.admit(meta, since=since, tell=tell)

    async def invalidate(self, bucket: str, key: str, keep: str = "") -> None:
        """Drop the entry of (bucket, key), unless it is version `keep` (an ETag): the
        version a node was just told is the object's (it reached its home)."""
        if keep:
            obj = self._store.lookup(bucket, key)
            if obj is not None and obj.meta.etag == keep:
                return
        await self._store.invalidate(bucket, key)

    async def intake(
        self, bucket: str, key: str, size: int, written: Counter | None = None
    ) -> Intake:
        """Where to keep the bytes of an object as a client writes it, chunk by chunk with
        their digests, to become its entry once its ETag is known (:class:`Intake`;
        `written` counts the bytes kept)."""
        return await start_intake(self._store, self.chunk_size, written, bucket, key, size)

    def has_chunk(self, obj: CachedObject, index: int) -> bool:
        return self._store.has_chunk(obj, index)

    def holds(self, obj: CachedObject, first: int, last: int) -> bool:
        """Whether every chunk holding bytes first..last of `obj` is cached."""
        return all(self._store.has_chunk(obj, i) for i in chunk_span(first, last, self.chunk_size))

    async def open_chunk(
        self, obj: CachedObject, index: int, *, read: bool = True
    ) -> ChunkReader | None:
        """The chunk's file descriptor and length (verified first if the policy says so),
        for a zero-copy send; None when it is not cached or fails its check. `read`: see
        :meth:`lota.cache.store.CacheStore.open_chunk`."""
        return await self._store.open_chunk(obj, index, read=read)

    def told_reads(self, name: str, times: int) -> bool:
        """`times` reads of a chunk this worker owns that a sibling served, named by its
        file (``STEM.INDEX``; see :meth:`lota.cache.store.CacheStore.told_reads`); False if
        that admission of its object is no longer here (nothing to count them against).
        ValueError if `name` is not a chunk file's, or not one of its object's chunks."""
        parsed = parse_final(name)
        if parsed is None:
            raise ValueError(f"not a chunk file's name: {name!r}")
        obj = self._store.by_stem(parsed[0])
        if obj is None:
            return False
        self._store.told_reads(obj, parsed[1], times)
        return True

    def chunk_path(self, obj: CachedObject, index: int) -> str:
        """The file of cached chunk `index` of `obj`."""
        return self._store.chunk_path(obj, index)

    def keeps(self, obj: CachedObject, index: int) -> bool:
        """Whether a fill of this chunk would be kept now (the admission rule, which a
        fill asks itself); if not, it counts as a declined fill."""
        return self._store.keeps(obj, index)

    def count_read(self, obj: CachedObject, index: int) -> None:
        """A client's read of a chunk this cache does not hold, served by a fill or from
        elsewhere: it counts for the admission rule (a chunk read often here gets in).
        Fills count nothing: fetching ahead or warming is not reading."""
        self._store.count_read(obj, index)

    def release(self, obj: CachedObject, index: int) -> None:
        """Drop a chunk kept here as a copy of another node's (its share is full)."""
        self._store.release(obj, index)

    def drop_unreadable(self, obj: CachedObject, index: int) -> None:
        """A chunk turned out short or unreadable: forget it (it is refetched)."""
        self._store.drop_unreadable(obj, index)

    # -- fills --------------------------------------------------------------------------

    def fill(
        self,
        source: ByteSource,
        bucket: str,
        key: str,
        first: int,
        last: int | None,
        known: CachedObject | None = None,
        *,
        suffix: int = 0,
        expect: str = "",
    ) -> FillJob:
        """Fetch chunks first..last (None: to the end; or, for an object not known yet,
        the chunks within its last `suffix` bytes) from `source` in one request, into the
        cache; the chunks someone else holds or fills are skipped, and so are, of an
        object known, those the cache would not keep (:meth:`filling` finds no fill of
        them). For an object not known yet, `expect` names the version it must be
        (If-Match: another answers 412)."""
        return self._filler.start(
            source, bucket, key, first, last, known, suffix=suffix, expect=expect
        )

    def fill_each(
        self, source: ByteSource, obj: CachedObject, indexes: Sequence[int]
    ) -> asyncio.Future[None]:
        """Fill these chunks of `obj` from `source`, a request each, ``fill_concurrency`` at a
        time, in order; done when all have ended (see :meth:`Filler.fill_each`)."""
        return self._filler.fill_each(source, obj, indexes)

    def filling(self, obj: CachedObject, index: int) -> ChunkFill | None:
        """The fill bringing chunk `index` of `obj` in, if one is."""
        return self._filler.fill_for(obj, index)

    def coming_soon(self, fill: ChunkFill) -> bool:
        return self._filler.coming_soon(fill)

    async def learn(self, source: ChunkSource, bucket: str, key: str) -> CachedObject | OriginReply:
        """The object's metadata from `source` (a HEAD), kept as its entry; concurrent
        askers share one HEAD. A non-200 answer comes back as the :class:`OriginReply`."""
        return await asyncio.shield(self._filler.learn(source, bucket, key))

    def learn_soon(
        self, source: ChunkSource, bucket: str, key: str
    ) -> asyncio.Future[CachedObject | OriginReply]:
        """Start learning the object's metadata (as :meth:`learn`) without waiting."""
        return self._filler.learn(source, bucket, key)

    def learning(self, bucket: str, key: str) -> bool:
        """Whether the object's metadata is being learnt right now (a HEAD in flight)."""
        return self._filler.learning(bucket, key)

    def cold_job(self, bucket: str, key: str) -> FillJob | None:
        """A fill of an object whose metadata is not known yet, if one is running."""
        return self._filler.cold_job(bucket, key)
