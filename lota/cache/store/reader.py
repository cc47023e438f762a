"""Reading chunks: open one (verified as the policy says), or read a hot one at once.

``verify`` decides when a read checks a chunk's xxh3-64 digest: ``always``,
``after-restart`` (the first read of a chunk this process did not write itself) or
``never``. Concurrent first reads of a chunk share one verification. A damaged, missing or
unreadable chunk is dropped and reported as absent, so the caller fetches it again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections import Counter
from collections.abc import Callable
from functools import partial
from typing import Literal, Protocol

from lota import zerocopy
from lota.cache.files import ChunkDamaged, ChunkFiles
from lota.cache.store.entries import CachedObject, Chunk
from lota.cache.store.fdcache import FdCache
from lota.cache.store.pool import IOPool
from lota.cache.store.table import ChunkTable
from lota.clock import Clock
from lota.zerocopy import FileSpan, resident

log = logging.getLogger("lota.cache")

VerifyPolicy = Literal["always", "after-restart", "never"]
VERIFY_POLICIES: tuple[VerifyPolicy, ...] = ("always", "after-restart", "never")

_RWF_NOWAIT: int | None = getattr(os, "RWF_NOWAIT", None)
# Seconds after its last read that what was known in memory of a chunk file (Warm) is
# still trusted: the page cache may drop an idle file's pages, and a thread (a stream's,
# the scrubber's, another worker's) may be reading them in again. A hit waits only if it
# comes in the milliseconds such a read takes; this bounds how old the knowledge may be
# (a minute: longer than filling a hot set of 20,000 objects takes here, so their first
# hits after it are sent from the page cache; 10 s copied most of them).
WARM_FOR = 60.0


def read_resident(fd: int, count: int, offset: int) -> bytearray | None:
    """`count` bytes at `offset` of a file if the page cache holds all of them, read
    without blocking (``RWF_NOWAIT``): safe on the event loop. None when any are not
    resident, the file is shorter, or the read fails; then the caller reads on a thread,
    where a cold or failing drive stalls nobody and errors are handled."""
    data = bytearray(count)
    return data if _read_whole(fd, data, offset) else None


def _read_whole(fd: int, into: bytearray | memoryview, offset: int) -> bool:
    """Whether `into` was filled from `offset` of file `fd` without blocking: every byte in
    the page cache, none still being read in (see :func:`read_resident`)."""
    if _RWF_NOWAIT is None:
        return False
    try:
        return os.preadv(fd, (into,), offset, _RWF_NOWAIT) == len(into)
    except OSError:  # EAGAIN: not resident; EOPNOTSUPP: not on this file system; EIO...
        return False


# What a span's bytes are read into to prove them in memory (then dropped): only the
# event loop's thread reads into it, and nothing reads what it holds. As large as any
# small hit (lota.cache.reads.SMALL_BODY); a span asked for more is copied.
_proof = memoryview(bytearray(256 * 1024))


class Warm(Protocol):
    """A file whose bytes [start, end) were last read whole from memory
    (:func:`read_or_span`), or written by a fill: `warm`, None once a read did not find
    them all in memory. It holds for :data:`WARM_FOR` after the file's last read, and
    outlives the descriptor it was learnt through: the page cache is the file's, whatever
    opens it, and closing a descriptor evicts nothing (a file reopened for each hit, in a
    hot set larger than the descriptors kept, is still sent from the page cache)."""

    warm: tuple[int, int] | None


def read_or_span(
    fd: int,
    offset: int,
    count: int,
    seen: Warm,
    *,
    span: bool,
    short: Callable[[], object] | None = None,
) -> bytes | bytearray | FileSpan | None:
    """`count` bytes at `offset` of file `fd` if the page cache holds them all, without
    blocking: as a span of the file to send from there (`span`), or read (as
    :func:`read_resident`); None when any are not in memory.

    A span is made only for bytes known to be whole in memory: the page cache counts pages
    still being read in as held (cachestat), and sending those would wait for the drive.
    Known so: read whole from memory before, or written by a fill (`seen`), then checked
    with cachestat; else read whole from memory now, into a scratch buffer that is then
    dropped (the read a copy would make: the span spares allocating and writing the copy).
    What is known is remembered in `seen`, until found missing.
    `short`: called when a span turns out longer than the file (see :class:`FileSpan`)."""
    warm = seen.warm
    known = span and warm is not None and warm[0] <= offset and offset + count <= warm[1]
    if known and resident(fd, offset, count):
        return FileSpan(fd, offset, count, short)
    found: bytearray | FileSpan | None
    if span and zerocopy.AVAILABLE and count <= len(_proof):
        proved = _read_whole(fd, _proof[:count], offset)
        found = FileSpan(fd, offset, count, short) if proved else None
    else:
        found = read_resident(fd, count, offset)
    seen.warm = None if found is None else (offset, offset + count)
    return found


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


class Readers:
    """Opens chunks of the table for reading; keeps hot ones' descriptors in `fds`."""

    def __init__(
        self,
        table: ChunkTable,
        *,
        verify: VerifyPolicy,
        fds: FdCache,
        io: IOPool,
        files: ChunkFiles,
        clock: Clock,
        counts: Counter[str],
    ) -> None:
        if verify not in VERIFY_POLICIES:
            raise ValueError(f"verify must be one of {VERIFY_POLICIES}, got {verify!r}")
        self._table = table
        self._verify: VerifyPolicy = verify
        self._fds = fds
        self._io = io
        self._files = files
        self._clock = clock
        self._counts = counts
        self._verifying: dict[Chunk, asyncio.Future[None]] = {}

    def read_hot(
        self, chunk: Chunk, offset: int, count: int, span: bool = False, touch: bool = True
    ) -> bytes | bytearray | FileSpan | None:
        """See :meth:`lota.cache.store.CacheStore.read_hot`."""
        if not self._hot(chunk):
            return None
        now = self._clock.time()
        if not 0 <= now - chunk.last_access <= WARM_FOR:
            chunk.warm = None  # idle since (or the clock stepped): its pages may have gone
        dropped = partial(self.drop_unreadable, chunk.obj, chunk.index) if span else None
        found = read_or_span(chunk.fd, offset, count, chunk, span=span, short=dropped)
        if found is None:
            if os.fstat(chunk.fd).st_size < chunk.length:  # cut short: never serve it
                self.drop_unreadable(chunk.obj, chunk.index)
            return None
        if touch:
            self._touch(chunk, now)
        return found

    def _hot(self, chunk: Chunk) -> bool:
        """Whether `chunk` is read here without a thread: checked, its descriptor open
        (then it is the most recently read; one opened again here is kept as FdCache
        says)."""
        verify = self._verify  # _digest_to_check, written out: this runs on every hit
        if verify == "always" or (verify == "after-restart" and not chunk.verified):
            return False
        if chunk.fd >= 0:
            self._fds.used(chunk)
            return True
        return self._reopen(chunk)

    def _reopen(self, chunk: Chunk) -> bool:
        """Open again, here on the loop, a chunk opened and checked since start-up whose
        descriptor was closed since (a hot set larger than the descriptors kept): as nginx
        opens its files, on its event loop. Its inode and directory entries were read
        lately, so this costs microseconds; a chunk never opened yet is opened on a thread
        (:meth:`open`), and so is this one if it fails or is not of its length (the error
        is handled there)."""
        if not chunk.checked:
            return False
        try:
            fd = os.open(self._table.path(chunk), os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        if os.fstat(fd).st_size != chunk.length:
            os.close(fd)
            return False
        self._fds.keep(chunk, fd, again=True)
        return True

    def drop_unreadable(self, obj: CachedObject, index: int) -> None:
        chunk = obj.chunks.get(index)
        if chunk is not None:
            log.warning("cache chunk %s unreadable, dropping it", self._table.path(chunk))
            self._table.drop(chunk, "read_errors")

    async def open(self, chunk: Chunk, *, read: bool = True) -> ChunkReader | None:
        """A reader of `chunk`, verified as the policy says; None if it is damaged or gone.
        `read`: counted as a read (see :meth:`lota.cache.store.CacheStore.open_chunk`)."""
        self._table.ref(chunk)
        if self._hot(chunk):
            # Hot path: a chunk read since start-up, already checked, its descriptor still
            # open (or opened again here, on the loop).
            return self._reader(chunk, chunk.fd, owned=False, read=read)
        try:
            fd = await self._open_fd(chunk)
        except BaseException:
            self._table.unref(chunk)
            raise
        if fd is None or chunk.dead:
            if fd is not None:
                os.close(fd)
            self._table.unref(chunk)
            self._counts["misses"] += read
            return None
        if self._verify != "always" and chunk.fd < 0:
            self._fds.keep(chunk, fd)
            return self._reader(chunk, fd, owned=False, read=read)
        return self._reader(chunk, fd, owned=True, read=read)

    def _reader(self, chunk: Chunk, fd: int, *, owned: bool, read: bool) -> ChunkReader:
        if read:
            self._touch(chunk)
        return ChunkReader(fd, chunk.length, partial(self._table.unref, chunk), owned=owned)

    def touch(self, chunk: Chunk, now: float | None = None) -> None:
        """See :meth:`lota.cache.store.CacheStore.count_hit`."""
        self._touch(chunk, now)

    def _touch(self, chunk: Chunk, now: float | None = None) -> None:
        """A chunk is read (at `now`, the store's clock): the eviction policy and the
        scrubber hear of it."""
        self._table.touch(chunk)
        chunk.last_access = self._clock.time() if now is None else now
        self._counts["hits"] += 1

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
        path = self._table.path(chunk)
        try:
            fd = await self._io.call(
                self._files.open_chunk, path, chunk.length, digest, on_orphan=os.close
            )
        except ChunkDamaged as exc:
            log.warning("cache chunk damaged, dropping it: %s", exc)
            self._table.drop(chunk, "corrupt")
            return None
        except OSError as exc:
            if not isinstance(exc, FileNotFoundError):
                log.warning("cannot read cache chunk %s, dropping it: %s", path, exc)
            self._table.drop(
                chunk, "missing" if isinstance(exc, FileNotFoundError) else "read_errors"
            )
            return None
        if digest is not None:
            chunk.verified = True
            self._counts["verified"] += 1
        chunk.checked = True
        return fd
