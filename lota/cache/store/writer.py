"""Filling chunks: :class:`Fills` starts one (a reservation, a temp file on the best dir),
:class:`ChunkWriter` writes, publishes or aborts it.

Crash safety: a chunk is written to a temp file next to its final name, fsynced
(optional), renamed, and only then queued for the index. A fill that hits ENOSPC is
aborted (its temp file and reservation released at once) and lowers that dir's budget;
another OSError aborts it (``CacheWriteError``) and rests the dir.
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Literal

import xxhash

from lota.cache.files import ChunkFiles
from lota.cache.layout import blocks, chunk_length, chunk_path, rank_dirs, subdir, temp_name
from lota.cache.store.budget import Budget, Reservation
from lota.cache.store.entries import CachedObject, Chunk, Watcher
from lota.cache.store.errors import CacheWriteError
from lota.cache.store.pool import IOPool
from lota.cache.store.table import ChunkTable
from lota.clock import Clock
from lota.threads import outlast


class ChunkWriter:
    """One chunk being filled: write() the bytes as they arrive, then commit() or abort().

    Calls must not overlap. Readers may open `path` read-only to stream the fill: its first
    `written` bytes are in the file. After an error the writer is aborted already.
    """

    def __init__(self, fills: Fills, obj: CachedObject, index: int, length: int) -> None:
        self.path = ""
        self.written = 0
        self.length = length
        """The chunk's exact length: commit() insists on it."""
        self.obj = obj
        self.index = index
        self.dir = -1
        self.reservation: Reservation | None = None
        self._fills = fills
        self._final = ""
        self._fd = -1
        self._hasher = xxhash.xxh3_64()
        self._busy: asyncio.Future[Any] | None = None
        self._state: Literal["new", "open", "publishing", "done", "aborted"] = "new"
        self._gone: asyncio.Future[None] | None = None

    def opened(self, dir_no: int, temp: str, final: str, fd: int) -> None:
        """The temp file is open: the writer owns `fd` from now on."""
        self.dir, self.path, self._final, self._fd = dir_no, temp, final, fd
        self._state = "open"

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Append `data` to the chunk. Raises CacheWriteError (writer aborted) on failure."""
        self._check_open()
        if self.written + len(data) > self.length:
            await self.abort()
            raise CacheWriteError(f"chunk {self.index} of {self.obj!r} is {self.length} bytes")
        try:
            await self._io(self._write, data)
        except OSError as exc:
            await self._failed(exc)
            raise CacheWriteError(f"cannot write cache chunk {self.path}: {exc}") from exc
        self.written += len(data)

    async def commit(self) -> None:
        """Publish the chunk: fsync (if configured), rename, record in the index.

        A chunk of an entry that was replaced or invalidated meanwhile is discarded.
        """
        self._check_open()
        if self.written != self.length:
            await self.abort()
            raise CacheWriteError(
                f"chunk {self.index} of {self.obj!r}: {self.written} of {self.length} bytes"
            )
        if not self.obj.alive:
            self._fills.counts["discarded_commits"] += 1
            await self.abort()
            return
        self._state = "publishing"
        fd, self._fd = self._fd, -1
        fills = self._fills
        try:
            await self._io(fills.files.publish, fd, self.path, self._final, fills.fsync)
        except OSError as exc:
            await self._failed(exc)
            raise CacheWriteError(f"cannot publish cache chunk {self._final}: {exc}") from exc
        self._state = "done"
        if not fills.published(self, self._hasher.intdigest()):
            self.discard()

    async def abort(self) -> None:
        """Delete the temp file and release the reservation. Idempotent."""
        if self._state != "done":
            await asyncio.shield(self.discard())

    def _check_open(self) -> None:
        if self._state != "open":
            raise CacheWriteError(f"chunk writer for {self.path or self.obj!r} is {self._state}")

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        self._fills.files.write(self._fd, data)
        self._hasher.update(data)

    async def _io(self, fn: Callable[..., Any], *args: Any) -> None:
        # A cancelled caller waits for the call, which owns the descriptor (publish closes
        # it); the cleanup runs after it (see discard).
        busy = self._busy = self._fills.io.submit(fn, *args)
        try:
            await outlast(busy)
        except asyncio.CancelledError:
            self.discard()
            raise

    async def _failed(self, exc: OSError) -> None:
        self._fills.budget.dir_failed(self.dir, exc)
        await self.abort()

    def discard(self) -> asyncio.Future[None]:
        """Schedule the cleanup once no I/O of this writer runs (its fd must not be closed
        under a running write), and return a future for its end."""
        if self._gone is None:
            published = self._state in ("publishing", "done")
            self._state = "aborted"
            fd, self._fd = self._fd, -1
            paths = [self.path, self._final] if published else [self.path]
            fills = self._fills
            self._gone = fills.io.background(
                fills.files.discard, fd, paths, after=self._busy, then=self._cleaned
            )
        return self._gone

    def _cleaned(self, removed_dirs: int | None) -> None:
        self._fills.budget.dirs_removed(removed_dirs)
        self._fills.release(self)


class Fills:
    """The chunks being filled: at most one writer per chunk, each with its reservation."""

    def __init__(
        self,
        dirs: Sequence[str],
        *,
        chunk_size: int,
        fsync: bool,
        table: ChunkTable,
        budget: Budget,
        io: IOPool,
        files: ChunkFiles,
        clock: Clock,
        counts: Counter[str],
    ) -> None:
        self.fsync = fsync
        self.budget = budget
        self.io = io
        self.files = files
        self.counts = counts
        self._dirs = tuple(dirs)
        self._chunk_size = chunk_size
        self._table = table
        self._clock = clock
        self._writers: dict[tuple[str, int], ChunkWriter] = {}
        self._temps: set[str] = set()
        self._claimed: set[tuple[str, int]] | None = None
        self.closing = False
        self.watcher: Watcher | None = None

    def __len__(self) -> int:
        return len(self._writers)

    def writers(self) -> list[ChunkWriter]:
        return list(self._writers.values())

    def is_filling(self, temp: str) -> bool:
        """Whether a fill writes to the temp file `temp` (the sweep leaves it alone)."""
        return temp in self._temps

    def claim(self) -> set[tuple[str, int]]:
        """Start collecting the (stem, index) of every fill, those running now included,
        until unclaim(): the sweep does not delete a file a fill may publish."""
        self._claimed = set(self._writers)
        return self._claimed

    def unclaim(self) -> None:
        self._claimed = None

    def check_index(self, obj: CachedObject, index: int) -> None:
        count = obj.chunk_count(self._chunk_size)
        if not 0 <= index < count:
            raise ValueError(f"chunk {index} is outside 0..{count - 1} of {obj!r}")

    async def begin(self, obj: CachedObject, index: int) -> ChunkWriter | None:
        """See :meth:`lota.cache.store.CacheStore.begin_chunk`."""
        self.check_index(obj, index)
        key = (obj.stem, index)
        if not obj.alive or index in obj.chunks or key in self._writers:
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
            self.release(writer)
            raise
        self.release(writer)
        return None

    async def _reserve(self, writer: ChunkWriter) -> bool:
        need = blocks(writer.length)
        if self.budget.usage + need > self.budget.high:
            await self._table.make_room(need)
        writer.reservation = self.budget.reserve(need)
        if writer.reservation is None:
            self.counts["bypassed_writes"] += 1
            return False
        return True

    async def _create(self, writer: ChunkWriter) -> bool:
        """Open the temp file on the best healthy dir with room for it; a dir that fails is
        rested (or, if full, given a lower budget)."""
        stem, index = writer.obj.stem, writer.index
        assert writer.reservation is not None
        need = writer.reservation.bytes
        for d in rank_dirs(stem, index, self.budget.healthy_dirs()):
            if self.closing:
                return False
            if self.budget.dir_usage(d) + need > self.budget.dir_budget(d):
                continue
            directory, name = subdir(self._dirs[d], stem), temp_name(stem, index)
            temp = os.path.join(directory, name)
            self._temps.add(temp)
            lost = partial(self._lost_temp, temp)
            try:
                fd, made = await self.io.call(self.files.create, directory, name, on_orphan=lost)
            except OSError as exc:
                self._temps.discard(temp)
                self.budget.dir_failed(d, exc)
                continue
            except BaseException:
                self._temps.discard(temp)
                raise
            self.budget.dirs_made(made)
            writer.opened(d, temp, chunk_path(self._dirs[d], stem, index), fd)
            writer.reservation.place(d)
            return True
        self.counts["bypassed_writes"] += 1
        return False

    def _lost_temp(self, temp: str, created: tuple[int, int]) -> None:
        """The temp file of a cancelled begin is deleted."""
        fd, made = created
        self.io.background(
            self.files.discard,
            fd,
            [temp],
            then=lambda removed: self.budget.dirs_removed((removed or 0) - made),
        )

    def published(self, writer: ChunkWriter, digest: int) -> bool:
        """A published chunk becomes servable, then is queued for the index (never before).
        False: its object is gone, so is the chunk (the writer discards the file)."""
        obj = writer.obj
        if not obj.alive:
            self.counts["discarded_commits"] += 1
            return False
        chunk = Chunk(obj, writer.index, writer.dir, writer.length, digest)
        chunk.verified = chunk.checked = True
        chunk.last_access = self._clock.time()
        chunk.warm = (0, chunk.length)  # just written: its pages are in memory, up to date
        self.release(writer)
        self._table.add(chunk)
        self.counts["fills"] += 1
        if self.watcher is not None and obj.meta.etag:  # not a write's bytes, still unnamed
            self.watcher.published(obj.meta, writer.index, self._table.path(chunk), chunk.length)
        return True

    def release(self, writer: ChunkWriter) -> None:
        """The writer holds nothing any more: its name, its reservation, its temp file."""
        key = (writer.obj.stem, writer.index)
        if self._writers.get(key) is writer:
            del self._writers[key]
            writer.obj.writers -= 1
        self._temps.discard(writer.path)
        if writer.reservation is not None:
            writer.reservation.release()
