"""The chunk store's facade, :class:`CacheStore` (see :mod:`lota.cache.store`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import errno
import gc
import logging
import os
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal, TypeVar

from lota.cache.eviction import S3FIFO
from lota.cache.files import ChunkDamaged, ChunkFiles, DirLocked
from lota.cache.index import ChunkRow, Index, ObjectRow
from lota.cache.layout import (
    BLOCK,
    DIR_BYTES,
    STEM,
    blocks,
    chunk_length,
    chunk_path,
    is_temp,
    new_stem,
    parse_final,
    rank_dirs,
    subdir,
    temp_name,
)
from lota.cache.store.chunks import ChunkReader, ChunkWriter, read_resident
from lota.cache.store.entries import (
    CachedObject,
    Chunk,
    ObjectMeta,
    fingerprint,
    meta_from_row,
    object_row,
)
from lota.cache.store.errors import CacheDirInUse, CacheError
from lota.clock import Clock
from lota.tasks import TaskGroup

log = logging.getLogger("lota.cache")

T = TypeVar("T")
VerifyPolicy = Literal["always", "after-restart", "never"]
VERIFY_POLICIES: tuple[VerifyPolicy, ...] = ("always", "after-restart", "never")
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
    "discarded_commits",
    "verified",
    "scrubbed",
    "replaced",
    "invalidated",
    "swept_deleted",
    "swept_missing",
    "swept_wrong_length",
    "swept_unknown",
)
"""Counters of :meth:`CacheStore.stats`, all present from the start."""
_MAINTAIN_EVERY = 1.0
# Chunk descriptors kept open for hits (well under the usual 1024..1M fd limits).
MAX_OPEN_CHUNKS = 512
_U64 = (1 << 64) - 1
_YIELD_EVERY = 20_000
_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(slots=True)
class _Drive:
    """What the store knows of one cache dir (one drive, usually)."""

    root: str
    lock: int = -1
    """The descriptor holding its lock; -1: not ours (unusable since start), never used."""
    sick_until: float = 0.0
    """Rested after an error until then."""
    chunk_bytes: int = 0
    reserved: int = 0
    limit: int | None = None
    """The budget an ENOSPC set; None: the store's whole budget."""
    free: int = -1
    """The file system's free bytes at the last look; -1: not known yet."""


class CacheStore:
    """Chunks of S3 objects on local disks, under one byte budget. See the module docstring."""

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
    ) -> None:
        self._open_fds: OrderedDict[Chunk, None] = OrderedDict()
        if not dirs:
            raise ValueError("the cache store needs at least one directory")
        if verify not in VERIFY_POLICIES:
            raise ValueError(f"verify must be one of {VERIFY_POLICIES}, got {verify!r}")
        if not 0.0 < low_watermark < high_watermark <= 1.0:
            raise ValueError("watermarks must satisfy 0 < low < high <= 1")
        self._dirs = tuple(os.path.abspath(d) for d in dirs)
        self._budget = size
        self._chunk_size = chunk_size
        self._clock = clock
        self._verify: VerifyPolicy = verify
        self._pinned = tuple(p if "/" in p else p + "/" for p in pinned)
        self._fsync = fsync
        self._high_ratio = high_watermark
        self._low_ratio = low_watermark
        self._scrub_interval = scrub_interval
        self._scrub_rate = scrub_rate
        self._scrub_idle = scrub_idle
        self._dir_cooldown = dir_cooldown
        self._sweep_delay = sweep_delay
        self._max_bare = max_bare_objects
        self._files = files or ChunkFiles()
        self._io = ThreadPoolExecutor(io_threads, thread_name_prefix="lota-cache-io")
        self._wal_limit = min(64 * 1024**2, max(64 * 1024, size // 64))
        self._index = Index(
            os.path.join(self._dirs[0], "index.sqlite"),
            chunk_size=chunk_size,
            dirs=self._dirs,
            wal_limit=self._wal_limit,
        )
        self._tasks = TaskGroup("cache")
        self._objects: dict[str, dict[str, CachedObject]] = {}
        self._stems: dict[str, CachedObject] = {}
        # Bumped by every invalidation: an origin answer that set out before one may
        # describe what the write replaced (see admit's `since`).
        self.epoch = 0
        self._bare: OrderedDict[str, CachedObject] = OrderedDict()
        self._policy: S3FIFO[Chunk] = S3FIFO(fingerprint=fingerprint)
        self._writers: dict[tuple[str, int], ChunkWriter] = {}
        self._temps: set[str] = set()
        self._claimed: set[tuple[str, int]] | None = None
        self._verifying: dict[Chunk, asyncio.Future[None]] = {}
        self._pending: set[asyncio.Future[None]] = set()
        self._drives = [_Drive(root) for root in self._dirs]
        self._counts: Counter[str] = Counter()
        self._chunk_bytes = 0
        self._pinned_bytes = 0
        self._reserved = 0
        self._dir_bytes = 0
        self._nchunks = 0
        self._evict_lock = asyncio.Lock()
        self._sweep_lock = asyncio.Lock()
        self._ready = False
        self._closing = False

    # Lifecycle

    async def open(self) -> None:
        """Create and lock the directories, load the index, start the sweep, scrub and
        commit tasks. Raises CacheDirInUse if another process holds one of the dirs,
        CacheError if the first one (which holds the index) is unusable."""
        started = time.perf_counter()
        try:
            for d, root in enumerate(self._dirs):
                await self._prepare(d, root)
            await self._open_index()
        except BaseException:
            self._unlock()
            self._io.shutdown(wait=True)
            raise
        with _gc_paused():
            await self._load()
        await self._check_size()
        self._ready = True
        self._tasks.start(self._index.run(), "index")
        self._tasks.start(self._maintain(), "maintain")
        self._tasks.start(self._sweep_later(), "sweep")
        if self._scrub_interval > 0:
            self._tasks.start(self._scrub_forever(), "scrub")
        log.info(
            "cache open in %.2fs: %d objects, %d chunks, %d of %d bytes used, dirs %s",
            time.perf_counter() - started,
            len(self._stems),
            self._nchunks,
            self.usage,
            self._budget,
            ", ".join(self._dirs),
        )

    async def close(self) -> None:
        """Stop the tasks, abort fills in progress, commit the index, stop the threads."""
        if self._closing:
            return
        self._closing = True
        self._ready = False
        await self._tasks.close()
        for writer in list(self._writers.values()):
            if writer.path:
                await writer.abort()
        while self._pending:
            await asyncio.wait(set(self._pending))
        for chunk in list(self._open_fds):
            self._close_fd(chunk)
        try:
            await self._index.close()
        finally:
            self._unlock()
            self._io.shutdown(wait=True)

    async def _prepare(self, d: int, root: str) -> None:
        """Make the dir's layout and take its lock. Another dir than the first (which holds
        the index) that cannot be used is left out until a restart: it holds no lock."""
        try:
            self._dir_bytes += await self._io_call(self._files.prepare, root)
            lock = await self._io_call(self._files.lock, root, on_orphan=os.close)
            self._drives[d].lock = lock
        except DirLocked as exc:
            raise CacheDirInUse(
                f"cache directory {root} is in use by {exc.holder} (lock {exc.lock})"
            ) from exc
        except OSError as exc:
            if d == 0:
                raise CacheError(f"cannot use cache directory {root}: {exc}") from exc
            self._count("write_errors")
            log.warning("cache dir %s is unusable (%s): not using it until restart", root, exc)

    async def _open_index(self) -> None:
        try:
            await self._index.open()
        except Exception as exc:  # sqlite3 or OSError: without an index there is no cache
            await self._index.close()
            raise CacheError(f"cannot open the cache index {self._index.path}: {exc}") from exc

    def _unlock(self) -> None:
        for drive in self._drives:
            if drive.lock >= 0:
                fd, drive.lock = drive.lock, -1
                os.close(fd)

    async def _load(self) -> None:
        shared: dict[str, Any] = {}  # equal strings and header sets, parsed and stored once
        async for rows in self._index.object_rows():
            for row in rows:
                self._load_object(row, shared)
        async for chunk_rows in self._index.chunk_rows():
            self._load_chunks(chunk_rows)
        for obj in list(self._stems.values()):
            if not obj.chunks:
                self._note_bare(obj)

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
        total = pinned = count = 0
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
            size = -(-length // BLOCK) * BLOCK
            total += size
            per_dir[d] += size
            count += 1
            if obj.pinned:
                pinned += size
            else:
                evictable.append((chunk, size))
        self._policy.extend_established(evictable)
        for drive, size in zip(self._drives, per_dir, strict=True):
            drive.chunk_bytes += size
        self._chunk_bytes += total
        self._pinned_bytes += pinned
        self._nchunks += count

    # Entries

    @property
    def usage(self) -> int:
        """Bytes under the cache dirs, as ``du -sb`` would count them, plus fills reserved."""
        return self._chunk_bytes + self._reserved + self._dir_bytes + self._index.bytes

    @property
    def budget(self) -> int:
        return self._budget

    def lookup(self, bucket: str, key: str) -> CachedObject | None:
        objects = self._objects.get(bucket)
        return objects.get(key) if objects is not None else None

    async def admit(self, meta: ObjectMeta, since: int | None = None) -> CachedObject:
        """Insert or refresh the entry for `meta`. The same ETag/version keeps the chunks and
        takes the new metadata (validated_at, parts, headers); another one replaces them.

        `since` is :attr:`epoch` as it was when the origin was asked for `meta`: if anything
        was invalidated since, `meta` may predate a write, so the entry is checked with the
        origin before its next use."""
        if meta.size < 0:
            raise ValueError(f"object size must not be negative: {meta.size}")
        if since is not None and since != self.epoch:
            meta = replace(meta, validated_at=0.0)
        current = self.lookup(meta.bucket, meta.key)
        if current is not None and current.meta.same_object(meta):
            current.meta = meta
            self._index.put_object(object_row(current))
            return current
        if current is not None:
            self._forget(current)
            self._count("replaced")
        obj = CachedObject(meta, new_stem(meta.bucket, meta.key, meta.etag, meta.version_id), False)
        obj.pinned = self._is_pinned(meta)
        self._register(obj)
        self._index.put_object(object_row(obj))
        self._note_bare(obj)
        if self._ready:
            await self._index.backpressure()
        return obj

    async def invalidate(self, bucket: str, key: str) -> None:
        """Drop the entry and its chunks (writes and deletes through LOTA call this)."""
        self.epoch += 1
        obj = self.lookup(bucket, key)
        if obj is not None:
            self._forget(obj)
            self._count("invalidated")

    async def invalidate_prefix(self, bucket: str, prefix: str) -> int:
        """Drop every entry of `bucket` whose key starts with `prefix`; returns how many."""
        self.epoch += 1
        doomed = [o for k, o in self._objects.get(bucket, {}).items() if k.startswith(prefix)]
        for obj in doomed:
            self._forget(obj)
        self._count("invalidated", len(doomed))
        return len(doomed)

    def has_chunk(self, obj: CachedObject, index: int) -> bool:
        return obj.alive and index in obj.chunks

    def drop_unreadable(self, obj: CachedObject, index: int) -> None:
        """A reader found chunk `index` short or unreadable: drop it, so that the next read
        fetches it again instead of failing the same way."""
        chunk = obj.chunks.get(index)
        if chunk is not None:
            log.warning("cache chunk %s unreadable, dropping it", self._path(chunk))
            self._drop(chunk, "read_errors")

    def _register(self, obj: CachedObject) -> None:
        self._objects.setdefault(obj.meta.bucket, {})[obj.meta.key] = obj
        self._stems[obj.stem] = obj

    def _is_pinned(self, meta: ObjectMeta) -> bool:
        return f"{meta.bucket}/{meta.key}".startswith(self._pinned) if self._pinned else False

    def _forget(self, obj: CachedObject) -> None:
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

    def _note_bare(self, obj: CachedObject) -> None:
        """Remember objects without chunks in a bounded FIFO: their metadata is cheap but
        not free, and nothing else would ever evict it."""
        self._bare[obj.stem] = obj
        self._bare.move_to_end(obj.stem)
        for _ in range(len(self._bare) - self._max_bare):
            _, oldest = self._bare.popitem(last=False)
            if oldest.writers:
                self._bare[oldest.stem] = oldest
            else:
                self._forget(oldest)

    # Chunks

    def read_hot(
        self, obj: CachedObject, index: int, offset: int, count: int
    ) -> bytes | bytearray | None:
        """`count` bytes at `offset` of chunk `index` if it is hot (read since start-up,
        checked, its descriptor still open) and the bytes are in the page cache, read at
        once without blocking; else None, and :meth:`open_chunk` is the way. Nothing can
        close the descriptor meanwhile: that only happens on the event loop, which this
        call holds."""
        chunk = obj.chunks.get(index) if obj.alive and self._ready else None
        if chunk is None or chunk.fd < 0 or self._digest_to_check(chunk) is not None:
            return None
        data = read_resident(chunk.fd, count, offset)
        if data is None:
            if os.fstat(chunk.fd).st_size < chunk.length:  # cut short: never serve it
                self.drop_unreadable(obj, index)
            return None
        self._open_fds.move_to_end(chunk)
        self._touch(chunk)
        return data

    async def open_chunk(self, obj: CachedObject, index: int) -> ChunkReader | None:
        """Open chunk `index` for reading, verified as the policy says; None if absent or
        damaged (then it is gone, and the caller fetches it again)."""
        chunk = obj.chunks.get(index) if obj.alive and self._ready else None
        if chunk is None:
            self._count("misses")
            return None
        chunk.readers += 1
        if chunk.fd >= 0 and self._digest_to_check(chunk) is None:
            # Hot path: a chunk read since start-up, already checked, descriptor still open.
            self._open_fds.move_to_end(chunk)
            return self._reader(chunk, chunk.fd, owned=False)
        try:
            fd = await self._open_fd(chunk)
        except BaseException:
            self._unref(chunk)
            raise
        if fd is None or chunk.dead:
            if fd is not None:
                os.close(fd)
            self._unref(chunk)
            self._count("misses")
            return None
        if self._verify != "always" and chunk.fd < 0:
            self._keep_open(chunk, fd)
            return self._reader(chunk, fd, owned=False)
        return self._reader(chunk, fd, owned=True)

    def _reader(self, chunk: Chunk, fd: int, *, owned: bool) -> ChunkReader:
        self._touch(chunk)
        return ChunkReader(fd, chunk.length, partial(self._unref, chunk), owned=owned)

    def _touch(self, chunk: Chunk) -> None:
        """A chunk is read: the eviction policy and the scrubber hear of it."""
        self._policy.access(chunk)
        chunk.last_access = self._clock.time()
        self._count("hits")

    def _keep_open(self, chunk: Chunk, fd: int) -> None:
        """Keep the descriptors of recently read chunks open, so a hit costs no open()."""
        chunk.fd = fd
        self._open_fds[chunk] = None
        while len(self._open_fds) > MAX_OPEN_CHUNKS:
            oldest = next(iter(self._open_fds))
            if oldest.readers:
                self._open_fds.move_to_end(oldest)
                break
            self._close_fd(oldest)

    def _close_fd(self, chunk: Chunk) -> None:
        self._open_fds.pop(chunk, None)
        if chunk.fd >= 0:
            fd, chunk.fd = chunk.fd, -1
            os.close(fd)

    async def _open_fd(self, chunk: Chunk) -> int | None:
        """Open (and verify) the chunk's file; concurrent first reads share one verification."""
        while (digest := self._digest_to_check(chunk)) is not None and self._verify != "always":
            pending = self._verifying.get(chunk)
            if pending is None:
                return await self._verify_once(chunk, digest)
            await asyncio.wait([pending])
            if chunk.dead:
                return None
        return await self._open_checked(chunk, digest)

    async def _verify_once(self, chunk: Chunk, digest: int) -> int | None:
        done = self._verifying[chunk] = asyncio.get_running_loop().create_future()
        try:
            return await self._open_checked(chunk, digest)
        finally:
            del self._verifying[chunk]
            done.set_result(None)

    def _digest_to_check(self, chunk: Chunk) -> int | None:
        if self._verify == "always" or (self._verify == "after-restart" and not chunk.verified):
            return chunk.digest
        return None

    async def _open_checked(self, chunk: Chunk, digest: int | None) -> int | None:
        path = self._path(chunk)
        try:
            fd = await self._io_call(
                self._files.open_chunk, path, chunk.length, digest, on_orphan=os.close
            )
        except ChunkDamaged as exc:
            log.warning("cache chunk damaged, dropping it: %s", exc)
            self._drop(chunk, "corrupt")
            return None
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError):
                log.warning("cannot read cache chunk %s, dropping it: %s", path, exc)
            self._drop(chunk, "missing" if isinstance(exc, FileNotFoundError) else "read_errors")
            return None
        if digest is not None:
            chunk.verified = True
            self._count("verified")
        chunk.checked = True
        return fd

    async def begin_chunk(self, obj: CachedObject, index: int) -> ChunkWriter | None:
        """Start filling chunk `index` of `obj`. None when the chunk is cached or being
        filled already, when there is no room, no healthy dir, or `obj` is no longer live."""
        count = obj.chunk_count(self._chunk_size)
        if not 0 <= index < count:
            raise ValueError(f"chunk {index} is outside 0..{count - 1} of {obj!r}")
        key = (obj.stem, index)
        if not self._ready or not obj.alive or index in obj.chunks or key in self._writers:
            return None
        writer = ChunkWriter(self, obj, index, chunk_length(obj.meta.size, self._chunk_size, index))
        self._writers[key] = writer
        obj.writers += 1
        if self._claimed is not None:
            self._claimed.add(key)
        try:
            if await self._reserve(writer) and obj.alive and await self._create(writer):
                return writer
        except BaseException:
            self._release_writer(writer)
            raise
        self._release_writer(writer)
        return None

    async def _reserve(self, writer: ChunkWriter) -> bool:
        need = blocks(writer.length)
        if self.usage + need > self._high:
            await self._make_room(need)
        if self.usage + need > self._effective_budget:
            self._count("bypassed_writes")
            return False
        writer.reserved = need
        self._reserved += need
        return True

    async def _create(self, writer: ChunkWriter) -> bool:
        """Open the temp file on the best healthy dir with room for it; a dir that fails is
        rested (or, if full, given a lower budget)."""
        stem, index = writer.obj.stem, writer.index
        loop = asyncio.get_running_loop()
        for d in rank_dirs(stem, index, self._healthy_dirs()):
            if self._closing:
                return False
            if self._dir_usage(d) + writer.reserved > self._dir_budget(d):
                continue
            directory, name = subdir(self._dirs[d], stem), temp_name(stem, index)
            temp = os.path.join(directory, name)
            self._temps.add(temp)
            lost = partial(self._lost_temp, loop, temp)
            try:
                fd, made = await self._io_call(self._files.create, directory, name, on_orphan=lost)
            except OSError as exc:
                self._temps.discard(temp)
                self._dir_failed(d, exc)
                continue
            except BaseException:
                self._temps.discard(temp)
                raise
            self._dir_bytes += made * DIR_BYTES
            writer._opened(d, temp, chunk_path(self._dirs[d], stem, index), fd)
            self._drives[d].reserved += writer.reserved
            return True
        self._count("bypassed_writes")
        return False

    def _lost_temp(
        self, loop: asyncio.AbstractEventLoop, temp: str, created: tuple[int, int]
    ) -> None:
        """Runs on an I/O thread: the temp file of a cancelled begin_chunk is deleted."""
        fd, made = created
        removed = self._files.discard(fd, [temp])
        loop.call_soon_threadsafe(self._dirs_removed, removed - made)

    def _record(self, writer: ChunkWriter, digest: int) -> None:
        """A published chunk becomes servable, then is queued for the index (never before)."""
        obj = writer.obj
        if not obj.alive:
            self._count("discarded_commits")
            writer._discard()
            return
        chunk = Chunk(obj, writer.index, writer.dir, writer.length, digest)
        chunk.verified = chunk.checked = True
        chunk.last_access = self._clock.time()
        self._release_writer(writer)
        self._add_chunk(chunk)
        self._bare.pop(obj.stem, None)
        self._index.put_chunk(obj.stem, chunk.index, chunk.dir, chunk.length, digest)
        self._count("fills")

    def _add_chunk(self, chunk: Chunk) -> None:
        chunk.obj.chunks[chunk.index] = chunk
        size = blocks(chunk.length)
        self._chunk_bytes += size
        self._drives[chunk.dir].chunk_bytes += size
        self._nchunks += 1
        if chunk.obj.pinned:
            self._pinned_bytes += size
        else:
            self._policy.insert(chunk, size)

    def _release_writer(self, writer: ChunkWriter) -> None:
        """The writer holds nothing any more: its name, its reservation, its temp file."""
        key = (writer.obj.stem, writer.index)
        if self._writers.get(key) is writer:
            del self._writers[key]
            writer.obj.writers -= 1
        self._temps.discard(writer.path)
        self._reserved -= writer.reserved
        if writer.dir >= 0:
            self._drives[writer.dir].reserved -= writer.reserved
        writer.reserved = 0

    def _drop(self, chunk: Chunk, reason: str) -> None:
        """Delete one chunk (damaged, missing, unreadable); its object stays, maybe bare."""
        obj = chunk.obj
        if obj.chunks.get(chunk.index) is not chunk:
            return
        del obj.chunks[chunk.index]
        self._count(reason)
        self._index.delete_chunk(obj.stem, chunk.index)
        self._retire([chunk])
        if obj.alive and not obj.chunks:
            self._note_bare(obj)

    def _retire(self, chunks: list[Chunk]) -> asyncio.Future[None]:
        """Delete the files of chunks already detached from their objects. Their bytes stay
        counted until the files are gone and the last reader has closed."""
        for chunk in chunks:
            chunk.dead = True
            chunk.readers += 1
            self._nchunks -= 1
            if chunk.obj.pinned:
                self._pinned_bytes -= blocks(chunk.length)
            else:
                self._policy.remove(chunk)
        paths = [self._path(c) for c in chunks]
        return self._background(self._files.unlink, paths, then=partial(self._retired, chunks))

    def _retired(self, chunks: list[Chunk], removed_dirs: int | None) -> None:
        self._dirs_removed(removed_dirs)
        for chunk in chunks:
            self._unref(chunk)

    def _unref(self, chunk: Chunk) -> None:
        chunk.readers -= 1
        if chunk.dead and chunk.readers == 0:
            self._close_fd(chunk)
            self._chunk_bytes -= blocks(chunk.length)
            self._drives[chunk.dir].chunk_bytes -= blocks(chunk.length)

    def _path(self, chunk: Chunk) -> str:
        return chunk_path(self._dirs[chunk.dir], chunk.obj.stem, chunk.index)

    # Budget

    @property
    def _effective_budget(self) -> int:
        """The budget, or less when the drives cannot hold it (see _dir_full)."""
        return min(self._budget, sum(self._dir_budget(d) for d in range(len(self._dirs))))

    @property
    def _high(self) -> int:
        return int(self._effective_budget * self._high_ratio)

    @property
    def _low(self) -> int:
        return int(self._effective_budget * self._low_ratio)

    def _dir_budget(self, d: int) -> int:
        """What dir `d` may hold: the budget, unless its file system filled up first."""
        drive = self._drives[d]
        if drive.lock < 0:
            return 0
        return self._budget if drive.limit is None else min(drive.limit, self._budget)

    def _held(self, d: int) -> int:
        """Bytes of dir `d` that LOTA holds and that are on the disk: its chunks (and the
        index, on the first dir). Not counted: directories, and fills in progress."""
        return self._drives[d].chunk_bytes + (self._index.bytes if d == 0 else 0)

    def _dir_usage(self, d: int) -> int:
        return self._held(d) + self._drives[d].reserved

    def _margin(self, d: int) -> int:
        """Free space a full dir's budget leaves: a chunk, and room for the index's
        write-ahead log to grow, on the dir that holds it."""
        return self._chunk_size + (self._wal_limit if d == 0 else 0)

    def _dir_full(self, d: int) -> None:
        """ENOSPC: the drive holds less than the budget assumed. Its budget becomes what
        LOTA holds there now, less a margin; the next fill evicts down to that. Resting the
        drive instead would make the cache pass-through while the drive stays full."""
        self._count("disk_full")
        limit = max(0, self._held(d) - self._margin(d))
        drive = self._drives[d]
        if drive.limit is not None and drive.limit <= limit:
            return
        drive.limit = limit
        log.warning(
            "cache dir %s is full: its budget is now %d bytes (LOTA holds %d there; "
            "cache.size is %d)",
            self._dirs[d],
            limit,
            self._held(d),
            self._budget,
        )

    async def check_space(self) -> dict[int, int]:
        """Look at each dir's free space (the maintenance task does every second): a dir
        whose budget an ENOSPC lowered gets back what its file system has freed since.
        Returns the free bytes of each file system, by device id."""
        free_by_device: dict[int, int] = {}
        for d, drive in enumerate(self._drives):
            if drive.lock < 0:
                continue
            try:
                free, device = await self._io_call(self._files.space, drive.root)
            except OSError as exc:
                log.debug("cannot stat the file system of %s: %s", drive.root, exc)
                continue
            drive.free = free_by_device[device] = free
            self._regain(d, free)
        return free_by_device

    def _regain(self, d: int, free: int) -> None:
        limit = self._drives[d].limit
        room = self._held(d) + free - self._margin(d)
        if limit is None or room <= limit:
            return
        self._drives[d].limit = None if room >= self._budget else room
        if room - limit >= self._chunk_size:
            log.info(
                "cache dir %s has room again: its budget is now %d bytes",
                self._dirs[d],
                self._dir_budget(d),
            )

    async def _check_size(self) -> None:
        """Warn when the budget is more than the dirs can hold: their free space plus what
        LOTA holds in them already (dirs sharing a file system share its free space)."""
        free = sum((await self.check_space()).values())
        if self._budget > free + self.usage:
            log.warning(
                "cache.size (%d bytes) is more than the cache dirs can hold: %d bytes free "
                "+ %d held by LOTA = %d; a drive that fills up gets a budget of what it holds",
                self._budget,
                free,
                self.usage,
                free + self.usage,
            )

    async def _make_room(self, need: int) -> None:
        """Evict down to the low watermark (leaving room for `need`), and wait until the
        evicted files are deleted."""
        async with self._evict_lock:
            if self.usage + need <= self._high:
                return
            victims: list[Chunk] = []
            freeing = 0
            low = self._low
            while self.usage - freeing + need > low:
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
        self._count("evictions", len(victims))
        self._count("evicted_bytes", freeing)
        for obj in {id(c.obj): c.obj for c in victims}.values():
            if obj.alive and not obj.chunks and not obj.writers:
                self._forget(obj)
            elif obj.alive and not obj.chunks:
                self._note_bare(obj)
        await done

    async def _maintain(self) -> None:
        """Follow the drives' free space, and evict when something other than a fill (the
        index growing, a drive's lowered budget) passed the watermark."""
        while True:
            await asyncio.sleep(_MAINTAIN_EVERY)
            await self.check_space()
            if self.usage > self._high:
                await self._make_room(0)

    # Disks

    def _healthy_dirs(self) -> list[int]:
        now = self._clock.time()
        return [d for d, v in enumerate(self._drives) if v.sick_until <= now and v.lock >= 0]

    def _dir_failed(self, d: int, exc: OSError) -> None:
        if exc.errno in _FULL:
            self._dir_full(d)
            return
        self._count("write_errors")
        now = self._clock.time()
        if self._drives[d].sick_until <= now:
            log.warning(
                "cache dir %s failed (%s): not writing to it for %.0fs",
                self._dirs[d],
                exc,
                self._dir_cooldown,
            )
        self._drives[d].sick_until = now + self._dir_cooldown

    def _dirs_removed(self, count: int | None) -> None:
        self._dir_bytes -= (count or 0) * DIR_BYTES

    # Sweep and scrub

    async def sweep(self) -> dict[str, int]:
        """Reconcile the dirs with the index: delete temp files and files without a row,
        drop rows whose file is missing or has the wrong length. Runs once after open()."""
        async with self._sweep_lock:
            started = time.perf_counter()
            counts: Counter[str] = Counter()
            claimed = self._claimed = set(self._writers)
            try:
                for d, root in enumerate(self._dirs):
                    await self._sweep_dir(d, root, claimed, counts)
                await self._drop_unseen(counts)
                if self._pending:  # the files of the chunks it dropped
                    await asyncio.wait(set(self._pending))
            finally:
                self._claimed = None
            self._counts.update({f"swept_{k}": v for k, v in counts.items()})
            log.info("cache sweep done in %.1fs: %s", time.perf_counter() - started, dict(counts))
            return dict(counts)

    async def _sweep_later(self) -> None:
        await asyncio.sleep(self._sweep_delay)
        await self.sweep()

    async def _sweep_dir(
        self, d: int, root: str, claimed: set[tuple[str, int]], counts: Counter[str]
    ) -> None:
        try:
            for top in await self._io_call(self._files.tops, root):
                for leaf, entries in await self._io_call(self._files.scan, top):
                    await self._sweep_leaf(d, leaf, entries, claimed, counts)
        except OSError as exc:
            log.warning("cache sweep of %s failed: %s", root, exc)

    async def _sweep_leaf(
        self,
        d: int,
        leaf: str,
        entries: list[tuple[str, int]],
        claimed: set[tuple[str, int]],
        counts: Counter[str],
    ) -> None:
        strays: list[str] = []
        orphans: list[tuple[str, tuple[str, int]]] = []
        for name, size in entries:
            path = os.path.join(leaf, name)
            parsed = parse_final(name)
            if is_temp(name):
                if path not in self._temps:
                    strays.append(path)
            elif parsed is None:
                counts["unknown"] += 1
            elif not self._sweep_known(d, parsed, size, counts):
                obj = self._stems.get(parsed[0])
                if obj is None:
                    strays.append(path)
                else:
                    orphans.append((path, parsed))
        counts["deleted"] += len(strays) + len(orphans)
        if strays:
            await self._background(self._files.unlink, strays, then=self._dirs_removed)
        if orphans:
            job = partial(self._unlink_orphans, orphans, claimed)
            await self._background(job, then=self._dirs_removed)

    def _sweep_known(self, d: int, name: tuple[str, int], size: int, counts: Counter[str]) -> bool:
        """Whether the file is a chunk the index knows (checking its length if not yet)."""
        obj = self._stems.get(name[0])
        chunk = obj.chunks.get(name[1]) if obj is not None else None
        if chunk is None or chunk.dir != d:
            return False
        if not chunk.checked:
            if size != chunk.length:
                self._drop(chunk, "corrupt")
                counts["wrong_length"] += 1
            chunk.checked = True
        return True

    def _unlink_orphans(
        self, orphans: list[tuple[str, tuple[str, int]]], claimed: set[tuple[str, int]]
    ) -> int:
        """Runs on an I/O thread: a fill that claimed the name since the scan keeps it."""
        return sum(
            self._files.unlink_orphan(path, partial(claimed.__contains__, key))
            for path, key in orphans
        )

    async def _drop_unseen(self, counts: Counter[str]) -> None:
        """Chunks loaded from the index whose file the sweep did not find are gone."""
        unseen = [c for o in list(self._stems.values()) for c in o.chunks.values() if not c.checked]
        for n, chunk in enumerate(unseen):
            if not chunk.checked:
                self._drop(chunk, "missing")
                counts["missing"] += 1
            if n % _YIELD_EVERY == 0:
                await asyncio.sleep(0)

    async def scrub(self) -> int:
        """Verify every chunk idle for `scrub_idle` seconds, at most `scrub_rate` bytes per
        second; returns how many were damaged (and dropped)."""
        damaged = 0
        for chunk in [c for o in list(self._stems.values()) for c in o.chunks.values()]:
            idle = self._clock.time() - chunk.last_access >= self._scrub_idle
            if chunk.dead or chunk.readers or not idle:
                continue
            damaged += not await self._scrub_one(chunk)
            await asyncio.sleep(chunk.length / self._scrub_rate)
        return damaged

    async def _scrub_forever(self) -> None:
        while True:
            await asyncio.sleep(self._scrub_interval)
            started = time.perf_counter()
            damaged = await self.scrub()
            log.info(
                "cache scrub done in %.0fs: %d damaged", time.perf_counter() - started, damaged
            )

    async def _scrub_one(self, chunk: Chunk) -> bool:
        chunk.readers += 1
        try:
            await self._io_call(self._files.verify, self._path(chunk), chunk.length, chunk.digest)
        except (ChunkDamaged, OSError) as exc:
            log.warning("cache scrub: dropping chunk %s: %s", self._path(chunk), exc)
            self._drop(chunk, "corrupt" if isinstance(exc, ChunkDamaged) else "read_errors")
            return False
        finally:
            self._unref(chunk)
        chunk.verified = chunk.checked = True
        self._count("scrubbed")
        return True

    # Plumbing

    async def flush(self) -> None:
        """Wait for pending file deletions and commit the index (tests, shutdown, admin)."""
        while self._pending:
            await asyncio.wait(set(self._pending))
        await self._index.flush()

    def stats(self) -> dict[str, int]:
        """Counters since start-up and current gauges, for metrics and tests."""
        gauges = {
            "objects": len(self._stems),
            "chunks": self._nchunks,
            "bytes_used": self.usage,
            "budget": self._budget,
            "chunk_bytes": self._chunk_bytes,
            "pinned_bytes": self._pinned_bytes,
            "reserved_bytes": self._reserved,
            "index_bytes": self._index.bytes,
            "dir_bytes": self._dir_bytes,
            "writers": len(self._writers),
            "dirs_unhealthy": len(self._dirs) - len(self._healthy_dirs()),
            "index_errors": self._index.errors,
            "effective_budget": self._effective_budget,
        }
        return {**{name: self._counts[name] for name in COUNTERS}, **gauges}

    def dir_stats(self) -> dict[str, dict[str, int]]:
        """Per cache dir: bytes LOTA holds there (fills in progress included), the file
        system's free bytes at the last look (-1: unknown), the dir's budget (lowered by
        an ENOSPC) and whether it takes fills (1) or is resting after an error (0)."""
        healthy = set(self._healthy_dirs())
        return {
            root: {
                "bytes_used": self._dir_usage(d),
                "free_bytes": self._drives[d].free,
                "budget": self._dir_budget(d),
                "healthy": int(d in healthy),
            }
            for d, root in enumerate(self._dirs)
        }

    def _count(self, name: str, n: int = 1) -> None:
        self._counts[name] += n

    async def _io_call(
        self, fn: Callable[..., T], *args: Any, on_orphan: Callable[[T], Any] | None = None
    ) -> T:
        """Run `fn` on the I/O pool. If the caller is cancelled while `fn` runs, `on_orphan`
        gets its result (an fd to close, say) once it is done."""
        cf = self._io.submit(fn, *args)
        try:
            return await asyncio.wrap_future(cf)
        except asyncio.CancelledError:
            if on_orphan is not None:
                cf.add_done_callback(partial(_orphaned, on_orphan))
            raise

    def _background(
        self,
        fn: Callable[..., T],
        *args: Any,
        after: concurrent.futures.Future[Any] | None = None,
        then: Callable[[T | None], None],
    ) -> asyncio.Future[None]:
        """Run `fn` on the I/O pool once `after` is done, then `then(result)` on the loop
        whatever happens to those who await the returned future (close() waits for it)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._pending.add(done)

        def finish(cf: concurrent.futures.Future[T]) -> None:
            self._pending.discard(done)
            result: T | None = None
            if cf.exception() is not None:
                log.warning("cache file cleanup failed", exc_info=cf.exception())
            else:
                result = cf.result()
            try:
                then(result)
            finally:
                if not done.done():
                    done.set_result(None)

        def submit(_: object = None) -> None:
            cf = self._io.submit(fn, *args)
            cf.add_done_callback(lambda f: loop.call_soon_threadsafe(finish, f))

        if after is not None and not after.done():
            after.add_done_callback(submit)
        else:
            submit()
        return done


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


def _orphaned(cleanup: Callable[[T], Any], cf: concurrent.futures.Future[T]) -> None:
    if not cf.cancelled() and cf.exception() is None:
        cleanup(cf.result())
