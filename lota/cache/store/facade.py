"""The chunk store's facade, :class:`CacheStore` (see :mod:`lota.cache.store`): it builds
the parts, runs their tasks, and answers the read path.

The parts, each with its own module: :class:`~lota.cache.store.table.ChunkTable` (entries,
chunks, eviction, loading the index), :class:`~lota.cache.store.budget.Budget` (bytes,
drives, watermarks), :class:`~lota.cache.store.reader.Readers` and
:class:`~lota.cache.store.fdcache.FdCache` (reads and verification),
:class:`~lota.cache.store.writer.Fills` (writes),
:class:`~lota.cache.store.maintenance.Sweeper` and
:class:`~lota.cache.store.maintenance.Scrubber`, all doing file I/O through one
:class:`~lota.cache.store.pool.IOPool`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from lota.cache.files import ChunkFiles, DirLocked, in_use, unusable
from lota.cache.index import Index
from lota.cache.layout import new_stem
from lota.cache.store.budget import Budget
from lota.cache.store.entries import CachedObject, ObjectMeta, Watcher, object_row
from lota.cache.store.errors import CacheDirInUse, CacheError
from lota.cache.store.fdcache import FdCache
from lota.cache.store.maintenance import Scrubber, Sweeper
from lota.cache.store.pool import IOPool
from lota.cache.store.reader import ChunkReader, Readers, VerifyPolicy
from lota.cache.store.table import ChunkTable
from lota.cache.store.writer import ChunkWriter, Fills
from lota.clock import Clock
from lota.tasks import TaskGroup
from lota.zerocopy import FileSpan

log = logging.getLogger("lota.cache")

COUNTERS = (
    "hits",
    "misses",
    "fills",
    "evictions",
    "evicted_bytes",
    "corrupt",
    "missing",
    "read_errors",
    "write_errors",
    "disk_full",
    "bypassed_writes",
    "declined_fills",
    "discarded_commits",
    "verified",
    "scrubbed",
    "replaced",
    "invalidated",
    "released",
    "swept_deleted",
    "swept_missing",
    "swept_wrong_length",
    "swept_unknown",
)
"""Counters of :meth:`CacheStore.stats`, all present from the start."""
_MAINTAIN_EVERY = 1.0


class CacheStore:
    """Chunks of S3 objects on local disks, under one byte budget. See the package docstring."""

    def __init__(
        self,
        dirs: Sequence[str],
        size: int,
        chunk_size: int,
        *,
        clock: Clock,
        verify: VerifyPolicy = "after-restart",
        pinned: tuple[str, ...] = (),
        fsync: bool = True,
        high_watermark: float = 0.95,
        low_watermark: float = 0.90,
        scrub_interval: float = 3600.0,
        scrub_rate: int = 50 * 1024**2,
        scrub_idle: float = 600.0,
        dir_cooldown: float = 60.0,
        sweep_delay: float = 1.0,
        max_bare_objects: int = 100_000,
        io_threads: int = 8,
        files: ChunkFiles | None = None,
        open_chunks: int | None = None,
    ) -> None:
        """`open_chunks`: chunk descriptors kept open for hits (by default
        :func:`lota.cache.store.open_chunk_limit` of one worker)."""
        if not dirs:
            raise ValueError("the cache store needs at least one directory")
        self.dirs = tuple(os.path.abspath(d) for d in dirs)
        """The cache dirs, absolute; a chunk's ``dir`` is its position here."""
        self._chunk_size = chunk_size
        self._sweep_delay = sweep_delay
        self._files = files or ChunkFiles()
        self._counts: Counter[str] = Counter()
        self._clock = clock
        io = self._io = IOPool(io_threads)
        files = self._files
        counts = self._counts
        wal_limit = min(64 * 1024**2, max(64 * 1024, size // 64))
        index = self._index = Index(
            os.path.join(self.dirs[0], "index.sqlite"),
            chunk_size=chunk_size,
            dirs=self.dirs,
            wal_limit=wal_limit,
        )
        budget = self._budget = Budget(
            self.dirs,
            size,
            chunk_size=chunk_size,
            high_watermark=high_watermark,
            low_watermark=low_watermark,
            wal_limit=wal_limit,
            index_bytes=lambda: index.bytes,
            dir_cooldown=dir_cooldown,
            clock=clock,
            counts=counts,
            io=io,
            files=files,
        )
        self._fds = FdCache(open_chunks)
        table = self._table = ChunkTable(
            self.dirs,
            chunk_size=chunk_size,
            pinned=pinned,
            max_bare_objects=max_bare_objects,
            index=index,
            budget=budget,
            fds=self._fds,
            io=io,
            files=files,
            counts=counts,
        )
        self._readers = Readers(
            table, verify=verify, fds=self._fds, io=io, files=files, clock=clock, counts=counts
        )
        fills = self._fills = Fills(
            self.dirs,
            chunk_size=chunk_size,
            fsync=fsync,
            table=table,
            budget=budget,
            io=io,
            files=files,
            clock=clock,
            counts=counts,
        )
        self._sweeper = Sweeper(
            self.dirs, table=table, fills=fills, budget=budget, io=io, files=files, counts=counts
        )
        self._scrubber = Scrubber(
            interval=scrub_interval,
            rate=scrub_rate,
            idle=scrub_idle,
            table=table,
            io=io,
            files=files,
            clock=clock,
            counts=counts,
        )
        self._tasks = TaskGroup("cache")
        # When an entry was last dropped or replaced, by ``time.monotonic()`` (one clock for
        # every process of the machine): an origin answer asked for before that may describe
        # what a write replaced (see admit's `since`).
        # From the start: what another process asked before then, this one may have missed
        # the invalidation of (it was not running).
        self.changed_at = time.monotonic()
        self._ready = False

    @property
    def watcher(self) -> Watcher | None:
        """Told what the store learns (validated metadata, published chunks); None: nobody."""
        return self._fills.watcher

    @watcher.setter
    def watcher(self, watcher: Watcher | None) -> None:
        self._fills.watcher = watcher

    # Lifecycle

    async def open(self) -> None:
        """Create and lock the directories, load the index, start the sweep, scrub and
        commit tasks. Raises CacheDirInUse if another process holds one of the dirs,
        CacheError if the first one (which holds the index) is unusable."""
        started = time.perf_counter()
        try:
            for d, root in enumerate(self.dirs):
                await self._prepare(d, root)
            await self._open_index()
        except BaseException:
            self._unlock()
            self._io.shutdown()
            raise
        await self._table.load()
        await self._budget.check_size()
        self._ready = True
        self._tasks.start(self._index.run(), "index")
        self._tasks.start(self._maintain(), "maintain")
        self._tasks.start(self._sweep_later(), "sweep")
        if self._scrubber.interval > 0:
            self._tasks.start(self._scrubber.run(), "scrub")
        log.info(
            "cache open in %.2fs: %d objects, %d chunks, %d of %d bytes used, dirs %s",
            time.perf_counter() - started,
            len(self._table),
            self._table.chunks,
            self.usage,
            self.budget,
            ", ".join(self.dirs),
        )

    async def close(self) -> None:
        """Stop the tasks, abort fills in progress, commit the index, stop the threads."""
        if self._fills.closing:
            return
        self._fills.closing = True
        self._ready = False
        await self._tasks.close()
        for writer in self._fills.writers():
            if writer.path:
                await writer.abort()
        await self._io.drain()
        self._fds.close_all()
        try:
            await self._index.close()
        finally:
            self._unlock()
            self._io.shutdown()

    async def _prepare(self, d: int, root: str) -> None:
        """Make the dir's layout and take its lock. Another dir than the first (which holds
        the index) that cannot be used is left out until a restart: it holds no lock."""
        try:
            made = await self._io.call(self._files.prepare, root)
            self._budget.dir_bytes += made
            lock = await self._io.call(self._files.lock, root, on_orphan=os.close)
            self._budget.drives[d].lock = lock
        except DirLocked as exc:
            raise CacheDirInUse(in_use(root, exc)) from exc
        except OSError as exc:
            if d == 0:
                raise CacheError(unusable(root, exc)) from exc
            self._counts["write_errors"] += 1
            log.warning("cache dir %s is unusable (%s): not using it until restart", root, exc)

    async def _open_index(self) -> None:
        try:
            await self._index.open()
        except Exception as exc:  # sqlite3 or OSError: without an index there is no cache
            await self._index.close()
            raise CacheError(f"cannot open the cache index {self._index.path}: {exc}") from exc

    def _unlock(self) -> None:
        for drive in self._budget.drives:
            if drive.lock >= 0:
                fd, drive.lock = drive.lock, -1
                os.close(fd)

    async def _maintain(self) -> None:
        """Follow the drives' free space, and evict when something other than a fill (the
        index growing, a drive's lowered budget) passed the watermark."""
        while True:
            await asyncio.sleep(_MAINTAIN_EVERY)
            await self._budget.check_space()
            if self.usage > self._budget.high:
                await self._table.make_room(0)

    async def _sweep_later(self) -> None:
        await asyncio.sleep(self._sweep_delay)
        await self.sweep()

    # Entries

    @property
    def usage(self) -> int:
        """Bytes under the cache dirs, as ``du -sb`` would count them, plus fills reserved."""
        return self._budget.usage

    @property
    def budget(self) -> int:
        return self._budget.size

    def lookup(self, bucket: str, key: str) -> CachedObject | None:
        return self._table.lookup(bucket, key)

    def by_stem(self, stem: str) -> CachedObject | None:
        """The object admitted under file stem `stem` (its chunks' files' names begin so)."""
        return self._table.by_stem(stem)

    async def admit(
        self, meta: ObjectMeta, since: float | None = None, *, tell: bool = False
    ) -> CachedObject:
        """Insert or refresh the entry for `meta`. The same ETag/version keeps the chunks and
        takes the new metadata (validated_at, parts, headers; checksums and parts it lacks
        are kept: see :meth:`ObjectMeta.updated_by`); another one replaces them.

        `since` is when the origin was asked for `meta` (``time.monotonic()``, in this
        process or another of the machine's): if anything was invalidated since, `meta` may
        predate a write, so the entry is checked with the origin before its next use.
        Otherwise, if `tell` (`meta` is the origin's own answer, not a copy another LOTA
        process held), the :attr:`watcher` is told."""
        if meta.size < 0:
            raise ValueError(f"object size must not be negative: {meta.size}")
        if since is not None and since <= self.changed_at:
            meta = replace(meta, validated_at=0.0)
        elif since is not None and tell and self.watcher is not None:
            self.watcher.admitted(meta, since)
        current = self.lookup(meta.bucket, meta.key)
        if current is not None and current.meta.same_object(meta):
            current.meta = current.meta.updated_by(meta)
            self._index.put_object(object_row(current))
            return current
        if current is not None:
            self._table.forget(current)
            self._counts["replaced"] += 1
        stem = new_stem(meta.bucket, meta.key, meta.etag, meta.version_id)
        obj = self._table.add_object(meta, stem)
        self._index.put_object(object_row(obj))
        self._table.note_bare(obj)
        if self._ready:
            await self._index.backpressure()
        return obj

    def adopt(self, obj: CachedObject, meta: ObjectMeta) -> CachedObject | None:
        """Make `obj`, an entry filled under a name of its own, the entry of `meta`, chunks
        and all: how the bytes of a written object, kept as they arrived, become its cached
        copy once its ETag is known (:class:`lota.cache.intake.Intake`). The entry there
        before is dropped as by :meth:`invalidate`. None if `obj` died meanwhile (evicted,
        invalidated) or is not `meta`'s size."""
        if not obj.alive or obj.meta.size != meta.size:
            return None
        self.changed_at = time.monotonic()
        current = self.lookup(meta.bucket, meta.key)
        if current is not None and current is not obj:
            self._table.forget(current)
            self._counts["replaced"] += 1
        self._table.rename(obj, meta)
        self._index.put_object(object_row(obj))
        return obj

    @property
    def event_position(self) -> int | None:
        """The catalog event position saved with this cache (:meth:`save_event_position`)
        when it was opened; None if none was."""
        return self._index.event_position

    def save_event_position(self, position: int) -> None:
        """Every catalog event up to `position` has been applied here: saved with the
        changes those events made, a restart resumes the events after it."""
        self._index.save_event_position(position)

    async def invalidate(self, bucket: str, key: str) -> None:
        """Drop the entry and its chunks (writes and deletes through LOTA call this)."""
        self.changed_at = time.monotonic()
        obj = self.lookup(bucket, key)
        if obj is not None:
            self._table.forget(obj)
            self._counts["invalidated"] += 1

    def has_chunk(self, obj: CachedObject, index: int) -> bool:
        return obj.alive and index in obj.chunks

    def drop_unreadable(self, obj: CachedObject, index: int) -> None:
        """A reader found chunk `index` short or unreadable: drop it, so that the next read
        fetches it again instead of failing the same way."""
        self._readers.drop_unreadable(obj, index)

    def release(self, obj: CachedObject, index: int) -> None:
        """Drop chunk `index` of `obj`, which another node owns and this one kept as a copy
        (the room for such copies is full); the object's entry stays."""
        chunk = obj.chunks.get(index) if obj.alive else None
        if chunk is not None:
            self._table.drop(chunk, "released")

    # Chunks

    def read_hot(
        self,
        obj: CachedObject,
        index: int,
        offset: int,
        count: int,
        span: bool = False,
        touch: bool = True,
    ) -> bytes | bytearray | FileSpan | None:
        """`count` bytes at `offset` of chunk `index` if it is hot (read since start-up,
        checked, its descriptor still open) and the bytes are in the page cache, read at
        once without blocking; else None, and :meth:`open_chunk` is the way. `span`: as a
        span of the chunk's file, to be sent from the page cache at once
        (:mod:`lota.zerocopy`), once they were read so before
        (:func:`lota.cache.store.reader.read_or_span`). Nothing can close the descriptor
        meanwhile: that only happens on the event loop, which this call holds. `touch`:
        counted as a read (a hit) when found; else :meth:`count_hit` counts it later, once
        the rest of the answer is found too."""
        chunk = obj.chunks.get(index) if obj.alive and self._ready else None
        if chunk is None:
            return None
        return self._readers.read_hot(chunk, offset, count, span, touch)

    def count_hit(self, obj: CachedObject, index: int) -> None:
        """Count a read of chunk `index` of `obj` that :meth:`read_hot` (`touch` false) or
        :meth:`open_chunk` (`read` false) served, if it is still held."""
        chunk = obj.chunks.get(index) if obj.alive and self._ready else None
        if chunk is not None:
            self._readers.touch(chunk)

    async def open_chunk(
        self, obj: CachedObject, index: int, *, read: bool = True
    ) -> ChunkReader | None:
        """Open chunk `index` for reading, verified as the policy says; None if absent or
        damaged (then it is gone, and the caller fetches it again). `read`: whether this is
        a read (a hit, or a miss when it is not held), as it is unless the chunk is handed
        to a sibling worker, which tells of its reads itself (:meth:`told_reads`)."""
        chunk = obj.chunks.get(index) if obj.alive and self._ready else None
        if chunk is None:
            self._counts["misses"] += read
            return None
        return await self._readers.open(chunk, read=read)

    def told_reads(self, obj: CachedObject, index: int, times: int) -> None:
        """`times` reads of chunk `index` of `obj` that a sibling worker served from its own
        descriptor of the chunk's file, told at once (:mod:`lota.workers.news`): the
        eviction policy, the admission rule and the scrubber hear of them as of hits, or,
        if the chunk is gone since, the admission rule as of reads of a chunk not cached.
        Not counted as this store's hits: the sibling's. ValueError if `index` is not
        one of the object's chunks."""
        self._fills.check_index(obj, index)
        if times <= 0 or not obj.alive or not self._ready:
            return
        chunk = obj.chunks.get(index)
        if chunk is None:
            self._table.count_read(obj, index, times)
            return
        self._table.touched(chunk, times)
        chunk.last_access = self._clock.time()

    def keeps(self, obj: CachedObject, index: int) -> bool:
        """Whether a fill of chunk `index` of `obj` would be kept now. When keeping it
        means evicting, the admission rule decides (:mod:`lota.cache.admission`): a chunk
        read no more than the one it would evict is not kept, and the caller serves it
        from its source (counted as a declined fill)."""
        if self._table.keeps(obj, index):
            return True
        self._counts["declined_fills"] += 1
        return False

    def count_read(self, obj: CachedObject, index: int) -> None:
        """Count a client's read of chunk `index` of `obj` served without this store (from
        a fill, relayed from another node, or from the source after :meth:`keeps` said
        no); ask :meth:`keeps` first: a chunk's count is taken before its read."""
        self._table.count_read(obj, index)

    async def begin_chunk(self, obj: CachedObject, index: int) -> ChunkWriter | None:
        """Start filling chunk `index` of `obj`. None when the chunk is cached or being
        filled already, when there is no room, no healthy dir, or `obj` is no longer live."""
        self._fills.check_index(obj, index)
        return await self._fills.begin(obj, index) if self._ready else None

    def chunk_path(self, obj: CachedObject, index: int) -> str:
        """The file of cached chunk `index` of `obj`."""
        return self._table.path(obj.chunks[index])

    async def check_space(self) -> dict[int, int]:
        """Look at each dir's free space now (see :meth:`Budget.check_space`)."""
        return await self._budget.check_space()

    # Maintenance

    async def sweep(self) -> dict[str, int]:
        """Reconcile the dirs with the index: delete temp files and files without a row,
        drop rows whose file is missing or has the wrong length. Runs once after open()."""
        return await self._sweeper.sweep()

    async def scrub(self) -> int:
        """Verify every chunk idle for `scrub_idle` seconds, at most `scrub_rate` bytes per
        second; returns how many were damaged (and dropped)."""
        return await self._scrubber.scrub()

    async def flush(self) -> None:
        """Wait for pending file deletions and commit the index (tests, shutdown, admin)."""
        await self._io.drain()
        await self._index.flush()

    def stats(self) -> dict[str, int]:
        """Counters since start-up and current gauges, for metrics and tests."""
        budget = self._budget
        gauges = {
            "objects": len(self._table),
            "chunks": self._table.chunks,
            "bytes_used": self.usage,
            "budget": budget.size,
            "chunk_bytes": budget.chunk_bytes,
            "pinned_bytes": self._table.pinned_bytes,
            "reserved_bytes": budget.reserved,
            "index_bytes": self._index.bytes,
            "dir_bytes": budget.dir_bytes,
            "writers": len(self._fills),
            "dirs_unhealthy": len(self.dirs) - len(budget.healthy_dirs()),
            "index_errors": self._index.errors,
            "effective_budget": budget.effective,
        }
        return {**{name: self._counts[name] for name in COUNTERS}, **gauges}

    def dir_stats(self) -> dict[str, dict[str, int]]:
        """Per cache dir: bytes LOTA holds there (fills in progress included), the file
        system's free bytes at the last look (-1: unknown), the dir's budget (lowered by
        an ENOSPC) and whether it takes fills (1) or is resting after an error (0)."""
        return self._budget.dir_stats()
