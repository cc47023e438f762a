"""The store's entries: the (bucket, key) table of objects, their chunks, and how a chunk
enters (a fill, the index at start-up) and leaves (eviction, damage, invalidation).

Leaving is two steps. A chunk is first detached (no longer found, queued for deletion in
the index), then retired: its file is deleted in the background, and its bytes stay
counted until the file is gone and its last reader has closed (``chunk.readers`` counts
one for the deletion). Objects without chunks are kept in a bounded FIFO (``bare``).

Hits are told to the eviction policy and the admission rule a few at a time: each is
held (:meth:`ChunkTable.touch`), and the hits held are applied, in the order they came,
when :data:`HITS_HELD` are, and before anything else asks or tells either of them (a
fill, an eviction, an admission, a removal, reads heard of), so that every decision sees
exactly what it would have seen had each hit been told as it came. Told one by one, the
two cost a small hit a sixth of LOTA's Python (``python -m bench.hitpath``); applied
together, they run as one loop, whose code and state stay in the processor's caches.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

from lota.cache.admission import Admission
from lota.cache.eviction import S3FIFO
from lota.cache.files import ChunkFiles
from lota.cache.index import ChunkRow, Index, ObjectRow
from lota.cache.layout import STEM, blocks, chunk_length, chunk_path
from lota.cache.store.budget import Budget
from lota.cache.store.entries import (
    CachedObject,
    Chunk,
    ObjectMeta,
    chunk_id,
    fingerprint,
    meta_from_row,
)
from lota.cache.store.fdcache import FdCache
from lota.cache.store.pool import IOPool

log = logging.getLogger("lota.cache")

_U64 = (1 << 64) - 1
# Hits held before the eviction policy and the admission rule hear of them (ChunkTable.touch).
HITS_HELD = 32


class ChunkTable:
    """Every live object by (bucket, key) and by file stem, and every chunk of them."""

    def __init__(
        self,
        dirs: Sequence[str],
        *,
        chunk_size: int,
        pinned: tuple[str, ...],
        max_bare_objects: int,
        index: Index,
        budget: Budget,
        fds: FdCache,
        io: IOPool,
        files: ChunkFiles,
        counts: Counter[str],
    ) -> None:
        self._dirs = tuple(dirs)
        self._chunk_size = chunk_size
        self._pinned = tuple(p if "/" in p else p + "/" for p in pinned)
        self._max_bare = max_bare_objects
        self._index = index
        self._budget = budget
        self._fds = fds
        self._io = io
        self._files = files
        self._counts = counts
        self._objects: dict[str, dict[str, CachedObject]] = {}
        self._stems: dict[str, CachedObject] = {}
        self._bare: OrderedDict[str, CachedObject] = OrderedDict()
        self._policy: S3FIFO[Chunk] = S3FIFO(fingerprint=fingerprint)
        self._admission = Admission(self._policy, fingerprint, budget.size // chunk_size)
        self._hits: list[Chunk] = []  # held, not yet applied (touch)
        self._evict_lock = asyncio.Lock()
        self.chunks = 0
        """How many chunks are live."""
        self.pinned_bytes = 0

    # Objects

    def __len__(self) -> int:
        return len(self._stems)

    def lookup(self, bucket: str, key: str) -> CachedObject | None:
        objects = self._objects.get(bucket)
        return objects.get(key) if objects is not None else None

    def by_stem(self, stem: str) -> CachedObject | None:
        return self._stems.get(stem)

    def all_chunks(self) -> list[Chunk]:
        return [c for o in list(self._stems.values()) for c in o.chunks.values()]

    def add_object(self, meta: ObjectMeta, stem: str) -> CachedObject:
        """A new entry for `meta`, replacing none (forget the old one first). It has no
        chunks yet: note_bare() it once its row is queued."""
        obj = CachedObject(meta, stem, self._is_pinned(meta))
        self._objects.setdefault(meta.bucket, {})[meta.key] = obj
        self._stems[stem] = obj
        return obj

    def rename(self, obj: CachedObject, meta: ObjectMeta) -> None:
        """`obj` becomes the entry of `meta`, found under its (bucket, key) from now on, its
        chunks and file stem unchanged; whatever entry was there must be forgotten first.
        Its pinning stays as it was: the caller names it so that it matches (see
        :class:`lota.cache.intake.Intake`)."""
        objects = self._objects.get(obj.meta.bucket, {})
        if objects.get(obj.meta.key) is obj:
            del objects[obj.meta.key]
            if not objects:
                del self._objects[obj.meta.bucket]
        obj.meta = meta
        for chunk in obj.chunks.values():  # named anew
            chunk.fingerprint = None
        self._objects.setdefault(meta.bucket, {})[meta.key] = obj

    def _is_pinned(self, meta: ObjectMeta) -> bool:
        return f"{meta.bucket}/{meta.key}".startswith(self._pinned) if self._pinned else False

    def forget(self, obj: CachedObject) -> None:
        """Make `obj` dead: no longer found, its chunks deleted, its fills discarded."""
        obj.alive = False
        objects = self._objects.get(obj.meta.bucket, {})
        if objects.get(obj.meta.key) is obj:
            del objects[obj.meta.key]
            if not objects:
                del self._objects[obj.meta.bucket]
        del self._stems[obj.stem]
        self._bare.pop(obj.stem, None)
        self._index.delete_object(obj.stem)
        chunks = list(obj.chunks.values())
        obj.chunks.clear()
        if chunks:
            self._retire(chunks)

    def note_bare(self, obj: CachedObject) -> None:
        """Remember objects without chunks in a bounded FIFO: their metadata is cheap but
        not free, and nothing else would ever evict it."""
        self._bare[obj.stem] = obj
        self._bare.move_to_end(obj.stem)
        for _ in range(len(self._bare) - self._max_bare):
            _, oldest = self._bare.popitem(last=False)
            if oldest.writers:
                self._bare[oldest.stem] = oldest
            else:
                self.forget(oldest)

    # Chunks

    def path(self, chunk: Chunk) -> str:
        return chunk_path(self._dirs[chunk.dir], chunk.obj.stem, chunk.index)

    def add(self, chunk: Chunk) -> None:
        """A chunk just published becomes servable, then is queued for the index."""
        obj = chunk.obj
        obj.chunks[chunk.index] = chunk
        size = blocks(chunk.length)
        self._budget.add_chunk(chunk.dir, size)
        self.chunks += 1
        if obj.pinned:
            self.pinned_bytes += size
        else:
            self._apply_hits()
            self._policy.insert(chunk, size)
            self._admission.added(chunk)
        self._bare.pop(obj.stem, None)
        self._index.put_chunk(obj.stem, chunk.index, chunk.dir, chunk.length, chunk.digest)

    def touch(self, chunk: Chunk) -> None:
        """A read of `chunk` (a hit): held, then applied with others (see the module)."""
        hits = self._hits
        hits.append(chunk)
        if len(hits) >= HITS_HELD:
            self._apply_hits()

    def _apply_hits(self) -> None:
        """Tell the eviction policy and the admission rule of the hits held, in order."""
        hits = self._hits
        if hits:
            self._hits = []
            self._policy.access_each(hits)
            self._admission.hit_each(hits, [chunk.length for chunk in hits])

    def touched(self, chunk: Chunk, times: int) -> None:
        """`times` reads of `chunk` told at once (:meth:`CacheStore.told_reads`)."""
        self._apply_hits()
        self._policy.access(chunk, times)
        self._admission.hits(chunk, chunk.length, times)

    def keeps(self, obj: CachedObject, index: int) -> bool:
        """Whether a fill of chunk `index` of `obj` would be kept now: the admission rule
        (:mod:`lota.cache.admission`) decides when keeping it means evicting. Counts nothing."""
        if obj.pinned:
            return True
        need = blocks(chunk_length(obj.meta.size, self._chunk_size, index))
        full = self._budget.usage + need > self._budget.high
        self._apply_hits()
        return self._admission.admits(chunk_id(obj, index), full=full)

    def count_read(self, obj: CachedObject, index: int, times: int = 1) -> None:
        """Count `times` reads of chunk `index` of `obj` that no cached copy served (the
        admission rule's counts)."""
        length = chunk_length(obj.meta.size, self._chunk_size, index)
        self._apply_hits()
        self._admission.read(chunk_id(obj, index), length, times)

    def drop(self, chunk: Chunk, reason: str) -> None:
        """Delete one chunk (damaged, missing, unreadable); its object stays, maybe bare."""
        obj = chunk.obj
        if obj.chunks.get(chunk.index) is not chunk:
            return
        del obj.chunks[chunk.index]
        self._counts[reason] += 1
        self._index.delete_chunk(obj.stem, chunk.index)
        self._retire([chunk])
        if obj.alive and not obj.chunks:
            self.note_bare(obj)

    def ref(self, chunk: Chunk) -> None:
        """A reader holds the chunk: it is not evicted, and its file stays counted."""
        chunk.readers += 1

    def unref(self, chunk: Chunk) -> None:
        chunk.readers -= 1
        if chunk.dead and chunk.readers == 0:
            self._fds.close(chunk)
            self._budget.remove_chunk(chunk.dir, blocks(chunk.length))

    def _retire(self, chunks: list[Chunk]) -> asyncio.Future[None]:
        """Delete the files of chunks already detached from their objects."""
        self._apply_hits()
        for chunk in chunks:
            chunk.dead = True
            chunk.readers += 1
            self.chunks -= 1
            if chunk.obj.pinned:
                self.pinned_bytes -= blocks(chunk.length)
            else:
                self._policy.remove(chunk)
            self._admission.removed(chunk)
        paths = [self.path(c) for c in chunks]
        return self._io.background(self._files.unlink, paths, then=partial(self._retired, chunks))

    def _retired(self, chunks: list[Chunk], removed_dirs: int | None) -> None:
        self._budget.dirs_removed(removed_dirs)
        for chunk in chunks:
            self.unref(chunk)

    # Eviction

    async def make_room(self, need: int) -> None:
        """Evict down to the low watermark (leaving room for `need`), and wait until the
        evicted files are deleted."""
        budget = self._budget
        async with self._evict_lock:
            if budget.usage + need <= budget.high:
                return
            self._apply_hits()
            victims: list[Chunk] = []
            freeing = 0
            low = budget.low
            while budget.usage - freeing + need > low:
                chunk = self._policy.evict(_is_busy)
                if chunk is None:
                    break
                victims.append(chunk)
                freeing += blocks(chunk.length)
            if victims:
                await self._evict(victims, freeing)

    async def _evict(self, victims: list[Chunk], freeing: int) -> None:
        for chunk in victims:
            del chunk.obj.chunks[chunk.index]
            self._index.delete_chunk(chunk.obj.stem, chunk.index)
        done = self._retire(victims)
        self._counts["evictions"] += len(victims)
        self._counts["evicted_bytes"] += freeing
        for obj in {id(c.obj): c.obj for c in victims}.values():
            if obj.alive and not obj.chunks and not obj.writers:
                self.forget(obj)
            elif obj.alive and not obj.chunks:
                self.note_bare(obj)
        await done

    # Start-up

    async def load(self) -> None:
        """Fill the table from the index (rows it cannot use are deleted from it)."""
        with _gc_paused():
            shared: dict[str, Any] = {}  # equal strings and header sets, parsed once
            async for rows in self._index.object_rows():
                for row in rows:
                    self._load_object(row, shared)
            async for chunk_rows in self._index.chunk_rows():
                self._load_chunks(chunk_rows)
            for obj in list(self._stems.values()):
                if not obj.chunks:
                    self.note_bare(obj)

    def _load_object(self, row: ObjectRow, shared: dict[str, Any]) -> None:
        stem = row[0]
        try:
            meta = meta_from_row(row, shared)
        except (ValueError, TypeError) as exc:
            log.warning("cache index: dropping unreadable object row %s: %s", stem, exc)
            meta = None
        if meta is None or not STEM.fullmatch(stem):
            self._index.delete_object(stem)
            return
        obj = CachedObject(meta, stem, self._is_pinned(meta))
        if self._objects.setdefault(meta.bucket, {}).setdefault(meta.key, obj) is not obj:
            self._index.delete_object(stem)  # a duplicate (bucket, key): keep the first
            return
        self._stems[stem] = obj

    def _load_chunks(self, rows: list[ChunkRow]) -> None:
        """Attach a batch of chunk rows to their objects. One tight loop: at start-up it
        runs a million times."""
        stems, cs, dirs = self._stems, self._chunk_size, range(len(self._dirs))
        evictable: list[tuple[Chunk, int]] = []
        per_dir = [0] * len(self._dirs)
        pinned = count = 0
        for stem, index, d, length, digest in rows:
            obj = stems.get(stem)
            rest = obj.meta.size - index * cs if obj is not None else 0
            if (
                obj is None
                or d not in dirs
                or index in obj.chunks
                or not 0 < length == min(rest, cs)
            ):
                self._index.delete_chunk(stem, index)
                continue
            # One shared int object for all full chunks; digests are stored signed.
            chunk = Chunk(obj, index, d, cs if length == cs else length, digest & _U64)
            obj.chunks[index] = chunk
            size = blocks(length)
            per_dir[d] += size
            count += 1
            if obj.pinned:
                pinned += size
            else:
                evictable.append((chunk, size))
        self._policy.extend_established(evictable)
        self._budget.loaded(per_dir)
        self.pinned_bytes += pinned
        self.chunks += count


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Building a million long-lived objects with the cyclic GC on costs about as much
    again in collections that find nothing to collect: pause it while loading the index."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _is_busy(chunk: Chunk) -> bool:
    return chunk.readers > 0
