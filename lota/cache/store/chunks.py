"""Reading and writing one chunk file: :class:`ChunkReader`, :class:`ChunkWriter`."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import xxhash

from lota.cache.store.entries import CachedObject
from lota.cache.store.errors import CacheWriteError

if TYPE_CHECKING:
    from lota.cache.store.core import CacheStore

T = TypeVar("T")
_RWF_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None)


def read_resident(fd: int, count: int, offset: int) -> bytearray | None:
    """`count` bytes at `offset` of a file if the page cache holds all of them, read
    without blocking (``RWF_NOWAIT``): safe on the event loop. None when any are not
    resident, the file is shorter, or the read fails; then the caller reads on a thread,
    where a cold or failing drive stalls nobody and errors are handled."""
    if _RWF_NOWAIT is None:
        return None
    data = bytearray(count)
    try:
        got = os.preadv(fd, (data,), offset, _RWF_NOWAIT)
    except OSError:  # EAGAIN: not resident; EOPNOTSUPP: not on this file system; EIO...
        return None
    return data if got == count else None


class ChunkReader:
    """An open, verified chunk: read it with ``os.pread``/``os.sendfile`` on `fd`, then
    close(). It stays readable even if the entry is invalidated meanwhile."""

    __slots__ = ("_owned", "_release", "fd", "length")

    def __init__(
        self, fd: int, length: int, release: Callable[[], None], *, owned: bool = True
    ) -> None:
        self.fd = fd
        self.length = length
        self._release = release
        # A descriptor from the store's cache of open chunks is the store's to close.
        self._owned = owned

    def close(self) -> None:
        if self.fd >= 0:
            fd, self.fd = self.fd, -1
            try:
                if self._owned:
                    os.close(fd)
            finally:
                self._release()


class ChunkWriter:
    """One chunk being filled: write() the bytes as they arrive, then commit() or abort().

    Calls must not overlap. Readers may open `path` read-only to stream the fill: its first
    `written` bytes are in the file. After an error the writer is aborted already.
    """

    def __init__(self, store: CacheStore, obj: CachedObject, index: int, length: int) -> None:
        self.path = ""
        self.written = 0
        self.length = length
        """The chunk's exact length: commit() insists on it."""
        self.obj = obj
        self.index = index
        self.dir = -1
        self.reserved = 0
        self._store = store
        self._final = ""
        self._fd = -1
        self._hasher = xxhash.xxh3_64()
        self._busy: concurrent.futures.Future[Any] | None = None
        self._state: Literal["new", "open", "publishing", "done", "aborted"] = "new"
        self._gone: asyncio.Future[None] | None = None

    def _opened(self, dir_no: int, temp: str, final: str, fd: int) -> None:
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
            self._store._count("discarded_commits")
            await self.abort()
            return
        self._state = "publishing"
        fd, self._fd = self._fd, -1
        store = self._store
        try:
            await self._io(store._files.publish, fd, self.path, self._final, store._fsync)
        except OSError as exc:
            await self._failed(exc)
            raise CacheWriteError(f"cannot publish cache chunk {self._final}: {exc}") from exc
        self._state = "done"
        store._record(self, self._hasher.intdigest())

    async def abort(self) -> None:
        """Delete the temp file and release the reservation. Idempotent."""
        if self._state != "done":
            await asyncio.shield(self._discard())

    def _check_open(self) -> None:
        if self._state != "open":
            raise CacheWriteError(f"chunk writer for {self.path or self.obj!r} is {self._state}")

    def _write(self, data: bytes | bytearray | memoryview) -> None:
        self._store._files.write(self._fd, data)
        self._hasher.update(data)

    async def _io(self, fn: Callable[..., T], *args: Any) -> T:
        # Shielded: a cancelled caller does not cancel the call, which owns the descriptor
        # (publish closes it); the cleanup waits for the call instead (see _discard).
        cf = self._busy = self._store._io.submit(fn, *args)
        try:
            return await asyncio.shield(asyncio.wrap_future(cf))
        except asyncio.CancelledError:
            self._discard()
            raise

    async def _failed(self, exc: OSError) -> None:
        self._store._dir_failed(self.dir, exc)
        await self.abort()

    def _discard(self) -> asyncio.Future[None]:
        """Schedule the cleanup once no I/O of this writer runs (its fd must not be closed
        under a running write), and return a future for its end."""
        if self._gone is None:
            published = self._state in ("publishing", "done")
            self._state = "aborted"
            fd, self._fd = self._fd, -1
            paths = [self.path, self._final] if published else [self.path]
            self._gone = self._store._background(
                self._store._files.discard, fd, paths, after=self._busy, then=self._cleaned
            )
        return self._gone

    def _cleaned(self, removed_dirs: int | None) -> None:
        self._store._dirs_removed(removed_dirs)
        self._store._release_writer(self)
