"""Keeping an object in the cache as a client writes it (:class:`Intake`), and what an
accelerated write asks of the node's cache (:class:`WriteCache`).

An accelerated write (:mod:`lota.regions.accelerate`) hands its body here on its way to
staging, so that the node that took the write holds the object the moment it is
acknowledged: a read there is a HIT that asks neither the origin nor staging for a byte,
and stays one once the object is home (the same ETag revalidates).

A cached object is known by its ETag, and a written object's ETag is the MD5 of its body:
known only once its last byte has passed. So the bytes are kept under a name no request
can ask for (the key, a NUL, a token: keys never hold a NUL, and pinning sees the key it
starts with), chunk by chunk, each with its digest as every fill writes it;
:meth:`Intake.keep` then makes that entry the object's (:meth:`CacheStore.adopt`) and
:meth:`Intake.drop` forgets it. The cache never fails a write: a chunk it cannot take
ends the keeping there, and the rest is read from staging when asked for. An object larger
than half the budget is not kept at all: it would evict more than it is worth.

A multipart upload keeps each part so, under a name of the upload's, and its completion
copies the parts kept here into the object's entry (:meth:`WriteCache.join`, a local copy);
a part that went through another node leaves the object to be read from staging.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from itertools import accumulate
from typing import TYPE_CHECKING

from aiohttp import web
from prometheus_client import Counter

from lota.cache.fill import object_meta
from lota.cache.layout import chunk_count
from lota.cache.source import ChunkSource, SourceKind
from lota.cache.store import CachedObject, CacheStore, CacheWriteError, ChunkWriter, ObjectMeta

if TYPE_CHECKING:
    from lota.cache.service import ChunkService
from lota.s3.addressing import Target
from lota.threads import run_in_thread

log = logging.getLogger("lota.cache")

WRITE_SIZE = 1024 * 1024
# A request answered from a version the caller vouches for; None when it is not held.
ServeVersion = Callable[
    [web.BaseRequest, Target, ChunkSource, str], Awaitable[web.StreamResponse | None]
]


class Intake:
    """One object's bytes, kept in the cache as they are written: :meth:`write` them in
    order (or pass the body through :meth:`tee`), then :meth:`keep` or :meth:`drop`."""

    def __init__(
        self,
        store: CacheStore | None = None,
        obj: CachedObject | None = None,
        written: Counter | None = None,
        chunk_size: int = 1,
    ) -> None:
        self._store = store
        self._obj = obj
        self._written = written
        self._chunk_size = chunk_size
        self._writer: ChunkWriter | None = None
        self._next = 0
        self._full = False
        self._pieces: list[bytes] = []
        self._gathered = 0

    @classmethod
    def off(cls) -> Intake:
        """An intake that keeps nothing (no cache, or an object too large for it)."""
        return cls()

    @property
    def keeping(self) -> bool:
        """Whether it may still become an entry (it has an entry to become one)."""
        return self._obj is not None

    async def tee(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`body`, each piece kept before it is passed on."""
        async for piece in body:
            await self.write(piece)
            yield piece

    async def write(self, piece: bytes | bytearray) -> None:
        if self._obj is None or self._full or not piece:
            return
        self._pieces.append(bytes(piece))
        self._gathered += len(piece)
        if self._gathered >= WRITE_SIZE:
            await self._flush()

    async def keep(self, meta: ObjectMeta) -> bool:
        """Every byte was written and the write is committed: the bytes kept become the
        cached copy of `meta` (its bucket, key and ETag). False when nothing was kept."""
        if self._obj is None:
            return False
        if self._pieces:
            await self._flush()
        obj, store = self._obj, self._store
        self._obj = None
        assert store is not None
        if self._writer is not None:  # fewer bytes than the size: not the object
            await self._writer.abort()
            self._writer = None
        elif store.adopt(obj, meta) is not None:
            return True
        await store.invalidate(obj.meta.bucket, obj.meta.key)
        return False

    async def drop(self) -> None:
        """The write failed: forget what was kept of it."""
        obj, self._obj = self._obj, None
        if self._writer is not None:
            await self._writer.abort()
            self._writer = None
        if obj is not None and self._store is not None:
            await self._store.invalidate(obj.meta.bucket, obj.meta.key)

    async def _flush(self) -> None:
        data = self._pieces[0] if len(self._pieces) == 1 else b"".join(self._pieces)
        self._pieces.clear()
        self._gathered = 0
        view = memoryview(data)
        try:
            while view and not self._full:
                writer = self._writer or await self._begin()
                if writer is None:
                    return
                take = min(len(view), writer.length - writer.written)
                await writer.write(view[:take])
                view = view[take:]
                if writer.written == writer.length:
                    self._writer = None
                    await writer.commit()
                    if self._written is not None:
                        self._written.inc(writer.length)
        except CacheWriteError as exc:  # the writer is aborted already
            log.info("keeping a written object in the cache stopped: %s", exc)
            self._writer = None
            self._full = True

    async def _begin(self) -> ChunkWriter | None:
        obj, store = self._obj, self._store
        assert obj is not None and store is not None
        if self._next >= chunk_count(obj.meta.size, self._chunk_size):
            self._full = True  # more bytes than the size: keep() will refuse it
            return None
        self._writer = await store.begin_chunk(obj, self._next)
        self._next += 1
        if self._writer is None:  # no room, no healthy drive, or the entry was evicted
            self._full = True
        return self._writer


async def start_intake(
    store: CacheStore, chunk_size: int, written: Counter | None, bucket: str, key: str, size: int
) -> Intake:
    """An :class:`Intake` for an object of `size` bytes to be known as bucket/key (see
    :meth:`lota.cache.service.ChunkService.intake`)."""
    if size > store.budget // 2:
        return Intake.off()
    hidden = ObjectMeta(
        bucket=bucket,
        key=f"{key}\0{secrets.token_hex(8)}",
        etag="",
        size=size,
        last_modified="",
        headers=(),
    )
    return Intake(store, await store.admit(hidden), written, chunk_size)


class _Described:
    """The answer a GET of a written object would get, for :func:`object_meta`."""

    status = 200
    kind: SourceKind = "origin"

    def __init__(self, headers: Mapping[str, str]) -> None:
        self.headers: Mapping[str, str] = {k.lower(): v for k, v in headers.items()}

    async def read(self, count: int) -> bytes:
        return b""

    async def pieces(self, size: int) -> AsyncIterator[bytes]:
        return
        yield b""


def written_meta(
    bucket: str, key: str, headers: Mapping[str, str], parts: Sequence[int], now: float
) -> ObjectMeta:
    """What the cache keeps about a written object: what a GET of it would answer
    (`headers`), and where its parts lie (a ``partNumber`` read then asks nobody)."""
    meta = object_meta(bucket, key, _Described(headers), now)
    ends = list(accumulate(parts))
    spans = tuple(
        (n, end - size, end - 1) for n, (size, end) in enumerate(zip(parts, ends, strict=True), 1)
    )
    return replace(meta, parts=spans)


def part_name(key: str, upload: str, number: int) -> str:
    """The cache's name for part `number` of an upload (a key no request can name)."""
    return f"{key}\0{upload}#{number}"


class WriteCache:
    """What an accelerated write, and a read of it before it is home, ask of this node's
    cache; :meth:`off` on a node without one."""

    def __init__(
        self,
        cache: ChunkService | None = None,
        serve_version: ServeVersion | None = None,
        written: Counter | None = None,
    ) -> None:
        self._cache = cache
        self._serve_version = serve_version
        self._written = written

    @classmethod
    def off(cls) -> WriteCache:
        return cls()

    async def intake(self, bucket: str, key: str, size: int) -> Intake:
        """Where to keep the bytes of bucket/key as they are written."""
        if self._cache is None or self._written is None:
            return Intake.off()
        return await self._cache.intake(bucket, key, size, self._written)

    async def join(
        self, bucket: str, key: str, upload: str, parts: Sequence[tuple[int, str, int]]
    ) -> Intake:
        """An intake holding the object an upload's `parts` (number, ETag, size) make,
        copied from the parts kept here; one that keeps nothing if any part is not."""
        cache = self._cache
        found = [obj for part in parts if (obj := self._part(bucket, key, upload, part))]
        if cache is None or len(found) != len(parts):
            return Intake.off()
        # Not counted as written: the parts were, as they came.
        intake = await cache.intake(bucket, key, sum(size for _, _, size in parts))
        try:
            for obj in found:
                async for piece in _cached_bytes(cache, obj):
                    await intake.write(piece)
        except _NotHeld as exc:
            log.info("not keeping %s/%s: %s", bucket, key, exc)
            await intake.drop()
            return Intake.off()
        return intake

    def _part(
        self, bucket: str, key: str, upload: str, part: tuple[int, str, int]
    ) -> CachedObject | None:
        number, etag, size = part
        if self._cache is None:
            return None
        obj = self._cache.lookup(bucket, part_name(key, upload, number))
        if obj is None or obj.meta.etag != etag or obj.meta.size != size:
            return None
        return obj if size == 0 or self._cache.holds(obj, 0, size - 1) else None

    async def forget(self, bucket: str, keys: Sequence[str]) -> None:
        """Drop the entries of these keys (the parts of an upload that ended)."""
        if self._cache is not None:
            for key in keys:
                await self._cache.invalidate(bucket, key)

    async def serve(
        self, request: web.BaseRequest, target: Target, source: ChunkSource, etag: str
    ) -> web.StreamResponse | None:
        """A read of version `etag`, which `source` holds, from the cache (filled from
        `source` where it is not held); None without a cache, or when another version
        got in the way (the caller reads `source` itself then)."""
        if self._serve_version is None:
            return None
        return await self._serve_version(request, target, source, etag)


class _NotHeld(Exception):
    """A chunk of a kept part went away while it was being copied."""


async def _cached_bytes(cache: ChunkService, obj: CachedObject) -> AsyncIterator[bytes]:
    """Every byte of `obj`, from its chunks, read on a thread a piece at a time."""
    for index in range(chunk_count(obj.meta.size, cache.chunk_size)):
        reader = await cache.open_chunk(obj, index, read=False)  # a copy: no client's read
        if reader is None:
            raise _NotHeld(f"chunk {index} of {obj!r} is gone")
        try:
            for offset in range(0, reader.length, WRITE_SIZE):
                count = min(WRITE_SIZE, reader.length - offset)
                piece = await run_in_thread(os.pread, reader.fd, count, offset)
                if len(piece) != count:
                    raise _NotHeld(f"chunk {index} of {obj!r} is short")
                yield piece
        finally:
            reader.close()
