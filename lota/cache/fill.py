"""Filling the cache from a source: single flight per chunk, readers follow fills live.

A :class:`FillJob` is one streaming GET from a :class:`~lota.cache.source.ByteSource`
(the origin, today) that fills a run of consecutive chunks of
one object, in order, into the store. Each chunk it will write is registered as a
:class:`ChunkFill` before any byte arrives, so every other reader who needs that chunk
waits for it instead of asking the origin again (single flight), and streams its bytes
from the chunk's file as they land, without waiting for the chunk or the object to
finish. Jobs run as tasks owned by the :class:`Filler`, not by the request that started
them: a client that goes away does not stop a fill others are waiting for.

Whether the store keeps a chunk (the admission rule, :mod:`lota.cache.admission`) is
asked before its request when the object is known: a chunk not kept is not claimed, and a
job left with none sends no request (a look-ahead over chunks a full cache declines costs
the origin nothing). It is asked again as the chunk's bytes come, as the fills begun
meanwhile may have filled the store. A fill counts no read for the rule: it may be a
look-ahead, a prefetch or a warm, so the readers count theirs (:mod:`lota.cache.deliver`).
When a chunk cannot be stored (no room, disk error) or is not kept, its fill is marked
failed, the job stops, and its readers fetch the bytes they still need straight from the
source: the client never sees an error because of the cache.

A job for an object not known yet may ask for a suffix (the last bytes of an object of
unknown size, see :func:`lota.cache.plan.cold_fetch`): its first chunk is then the first
that begins within the answer, and the answer's bytes before it are skipped.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lota.cache.layout import chunk_count, chunk_length
from lota.cache.plan import ColdFetch, body_start, first_whole_chunk
from lota.cache.source import VALIDATED_AT, ByteSource, ChunkSource, SourceReply
from lota.cache.store import CachedObject, CacheStore, CacheWriteError, ChunkWriter, ObjectMeta
from lota.clock import Clock
from lota.errors import LotaError, OriginError
from lota.metrics import Metrics
from lota.tasks import TaskGroup

log = logging.getLogger("lota.cache")

READ_SIZE = 256 * 1024
WRITE_SIZE = 1024 * 1024
ERROR_BODY_LIMIT = 64 * 1024
# How far ahead of its job a chunk's readers still wait for the job (see coming_soon).
NEAR = 2

# Response headers that describe the object itself and are replayed on hits.
_OBJECT_HEADERS = (
    "content-type",
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
    "etag",
    "last-modified",
    "x-amz-version-id",
    "x-amz-storage-class",
    "x-amz-server-side-encryption",
    "x-amz-server-side-encryption-aws-kms-key-id",
    "x-amz-server-side-encryption-bucket-key-enabled",
    "x-amz-tagging-count",
    "x-amz-website-redirect-location",
    "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date",
    "x-amz-object-lock-legal-hold",
    "x-amz-replication-status",
    "x-amz-restore",
    "x-amz-checksum-type",
)


@dataclass(slots=True)
class OriginReply:
    """A non-success answer of the source (404, 403, 416...), kept so every waiter can
    relay it."""

    status: int
    headers: list[tuple[str, str]]
    body: bytes


def object_meta(bucket: str, key: str, response: SourceReply, validated_at: float) -> ObjectMeta:
    """What the store keeps about an object, from a 200/206 GET or a HEAD answer."""
    headers = response.headers
    size = _total_size(headers)
    keep = [
        (name.lower(), value)
        for name, value in headers.items()
        if name.lower() in _OBJECT_HEADERS
        or name.lower().startswith("x-amz-meta-")
        or (name.lower().startswith("x-amz-checksum-") and response.status == 200)
    ]
    return ObjectMeta(
        bucket=bucket,
        key=key,
        etag=headers.get("etag", ""),
        size=size,
        last_modified=headers.get("last-modified", ""),
        headers=tuple(keep),
        version_id=headers.get("x-amz-version-id", ""),
        validated_at=validated_at,
    )


def checked_at(reply: SourceReply, now: float) -> float:
    """When the origin last vouched for `reply`'s metadata: now, unless another LOTA
    process answered from its copy and said when it checked (:data:`VALIDATED_AT`)."""
    try:
        said = float(reply.headers.get(VALIDATED_AT, now))
    except ValueError:
        return now
    return min(said, now) if math.isfinite(said) else now


def _total_size(headers: Mapping[str, str]) -> int:
    content_range = headers.get("content-range", "")
    if "/" in content_range:
        total = content_range.rsplit("/", 1)[1]
        if total.isdigit():
            return int(total)
    return int(headers.get("content-length", "0"))


class CacheFull(LotaError):
    """A fill stopped because the store could not take its next chunk."""


class ChunkDeclined(CacheFull):
    """A fill stopped because the store's admission rule does not keep its next chunk
    (counted as a declined fill, not a bypassed one): its readers fetch it from the source."""


class ChunkFill:
    """One chunk on its way into the store; readers follow ``written`` as it grows."""

    def __init__(self, index: int, length: int) -> None:
        self.index = index
        self.length = length
        self.path: str | None = None
        self.written = 0
        # Bytes of this chunk read from the origin: written, or gathered for the next write.
        self.taken = 0
        self.finished = False
        self.failed = False
        self.job: FillJob | None = None  # the job that will fill it
        self._progress = asyncio.Event()

    def _pulse(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()

    def advance(self, count: int) -> None:
        """`count` more bytes are in the chunk's file."""
        self.written += count
        self._pulse()

    def finish(self, ok: bool) -> None:
        self.finished = True
        self.failed = not ok
        self._pulse()

    async def wait(self) -> None:
        """Until more bytes are written, or the fill ends."""
        if not self.finished:
            await self._progress.wait()


@dataclass(eq=False)
class FillJob:
    """One GET from a source filling chunks ``first``.. of an object (to ``last`` or the end)."""

    bucket: str
    key: str
    first: int
    last: int | None
    known: CachedObject | None
    # For an object not known yet: fetch its last `suffix` bytes (first is then decided
    # by the answer).
    suffix: int = 0
    # For an object not known yet: the version it must be (If-Match), if one is expected.
    expect: str = ""
    # (chunk index, its fill) for every chunk in the job; None where another holds it.
    claimed: list[tuple[int, ChunkFill | None]] = field(default_factory=list)
    etag: str = ""
    result: asyncio.Future[CachedObject | OriginReply] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    # Done when the job has ended, whatever the outcome.
    ended: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    # The chunk the job is copying now (its response body arrives in order).
    at: int = 0


class Filler:
    """Starts fill jobs and knows every chunk in flight (the single-flight registry)."""

    def __init__(
        self,
        store: CacheStore,
        chunk_size: int,
        metrics: Metrics,
        clock: Clock,
        tasks: TaskGroup,
        concurrency: int = 8,
    ) -> None:
        self.store = store
        self.chunk_size = chunk_size
        self.concurrency = concurrency
        self._metrics = metrics
        self._clock = clock
        self._tasks = tasks
        self._fills: dict[tuple[str, str, str, int], ChunkFill] = {}
        self._cold: dict[tuple[str, str], FillJob] = {}
        self._learning: dict[tuple[str, str], asyncio.Future[CachedObject | OriginReply]] = {}

    def fill_for(self, obj: CachedObject, index: int) -> ChunkFill | None:
        m = obj.meta
        return self._fills.get((m.bucket, m.key, m.etag, index))

    def coming_soon(self, fill: ChunkFill) -> bool:
        """Whether `fill` has started or its job is at most NEAR chunks before it; a reader
        of a chunk further on reads the origin itself rather than wait for the job to
        stream everything before it (a tail read during a cold read of the whole object)."""
        job = fill.job
        return fill.path is not None or job is None or fill.index - job.at <= NEAR

    def fill_each(
        self, source: ByteSource, obj: CachedObject, indexes: Sequence[int]
    ) -> asyncio.Future[None]:
        """Fill each of chunks `indexes` of `obj` with a ranged request of its own, in
        order, at most ``concurrency`` at once (a window-bound origin stream is that many
        times faster); chunks held or filling already, and those the cache would not keep,
        are skipped. The future is done when every chunk has ended (filled, or failed),
        fills by others included."""
        finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        m = obj.meta
        self._tasks.start(self._each(source, obj, indexes, finished), f"fill {m.bucket}/{m.key}*")
        return finished

    async def _each(
        self,
        source: ByteSource,
        obj: CachedObject,
        indexes: Sequence[int],
        finished: asyncio.Future[None],
    ) -> None:
        slots = asyncio.Semaphore(self.concurrency)
        others: list[ChunkFill] = []
        jobs: list[FillJob] = []
        try:
            for index in indexes:
                if not obj.alive:
                    break
                if self.store.has_chunk(obj, index):
                    continue
                if (other := self.fill_for(obj, index)) is not None:
                    others.append(other)
                    continue
                await slots.acquire()
                job = self.start(source, obj.meta.bucket, obj.meta.key, index, index, obj)
                job.ended.add_done_callback(lambda _: slots.release())
                jobs.append(job)
            await asyncio.gather(*(job.ended for job in jobs))
            for fill in others:
                while not fill.finished:
                    await fill.wait()
        finally:
            if not finished.done():
                finished.set_result(None)

    def learn(
        self, source: ChunkSource, bucket: str, key: str
    ) -> asyncio.Future[CachedObject | OriginReply]:
        """The object's metadata from `source` (one HEAD), admitted to the store; everyone
        asking meanwhile shares the one HEAD, which a departing asker does not cancel."""
        pending = self._learning.get((bucket, key))
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._learning[(bucket, key)] = pending
            self._tasks.start(self._learn(source, bucket, key, pending), f"head {bucket}/{key}")
        return pending

    def learning(self, bucket: str, key: str) -> bool:
        return (bucket, key) in self._learning

    async def _learn(
        self,
        source: ChunkSource,
        bucket: str,
        key: str,
        learnt: asyncio.Future[CachedObject | OriginReply],
    ) -> None:
        try:
            asked = time.monotonic()
            async with source.head(bucket, key) as reply:
                if reply.status != 200:
                    learnt.set_result(OriginReply(reply.status, list(reply.headers.items()), b""))
                    return
                meta = object_meta(bucket, key, reply, checked_at(reply, self._clock.time()))
                told = reply.kind == "origin"
            learnt.set_result(await self.store.admit(meta, since=asked, tell=told))
        except asyncio.CancelledError:
            learnt.set_exception(OriginError("metadata request cancelled"))
            raise
        except Exception as exc:  # every asker gets it; it is theirs to report
            learnt.set_exception(exc)
        finally:
            if learnt.done():
                learnt.exception()  # retrieved: the askers may all have gone
            del self._learning[(bucket, key)]

    def cold_job(self, bucket: str, key: str) -> FillJob | None:
        """A job fetching an object whose metadata is not known yet, if one is running."""
        return self._cold.get((bucket, key))

    def start(
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
        """Fetch chunks first..last (None: to the end) from `source` in one GET; with
        `suffix` (an object not `known` yet), the whole chunks of its last `suffix` bytes."""
        if known is None and (pending := self._cold.get((bucket, key))) is not None:
            return pending
        cold = known is None
        job = FillJob(
            bucket, key, first, last, known, suffix if cold else 0, expect if cold else "", at=first
        )
        if known is None:
            self._cold[(bucket, key)] = job
        else:
            self._register(job, known)
        self._tasks.start(self._run(source, job), f"fill {bucket}/{key}#{first}")
        return job

    def _register(self, job: FillJob, obj: CachedObject) -> None:
        """Claim the chunks of `job` that nobody holds or fills and, for an object known
        before the job's request, that the cache keeps; None marks the others."""
        m = obj.meta
        job.etag = m.etag
        count = chunk_count(m.size, self.chunk_size)
        job.last = count - 1 if job.last is None else min(job.last, count - 1)
        for index in range(job.first, job.last + 1):
            ident = (m.bucket, m.key, m.etag, index)
            if (
                ident in self._fills
                or self.store.has_chunk(obj, index)
                or (job.known is not None and not self.store.keeps(obj, index))
            ):
                job.claimed.append((index, None))
                continue
            fill = ChunkFill(index, chunk_length(m.size, self.chunk_size, index))
            fill.job = job
            self._fills[ident] = fill
            job.claimed.append((index, fill))

    async def _run(self, source: ByteSource, job: FillJob) -> None:
        started = time.perf_counter()
        try:
            await self._fetch(source, job)
        except asyncio.CancelledError:
            self._fail(job, OriginError("fill cancelled"))
            raise
        except CacheFull as exc:  # counted (bypassed or declined fills): no news
            self._fail(job, exc)
        except (LotaError, OSError, TimeoutError) as exc:
            log.warning("fill of %s/%s failed: %r", job.bucket, job.key, exc)
            self._fail(job, exc)
        except Exception as exc:  # a bug or an unreadable reply: waiters must not hang
            log.exception("fill of %s/%s failed", job.bucket, job.key)
            self._fail(job, exc)
        finally:
            job.ended.set_result(None)
            if self._cold.get((job.bucket, job.key)) is job:
                del self._cold[(job.bucket, job.key)]
            self._metrics.cache_fill_seconds.observe(time.perf_counter() - started)

    async def _fetch(self, source: ByteSource, job: FillJob) -> None:
        if_match = job.expect
        if job.known is not None:
            if_match = job.known.meta.etag
            # Fetch only from the first chunk this job holds to the last: the others are
            # cached, on their way already (a second prefetch of an object costs nothing)
            # or not kept.
            held = [n for n, (_, fill) in enumerate(job.claimed) if fill is not None]
            if not held:
                self._finish_result(job, job.known)
                return
            job.claimed = job.claimed[held[0] : held[-1] + 1]
            job.first, job.last = job.claimed[0][0], job.claimed[-1][0]
            job.at = job.first
        asked = time.monotonic()
        wanted = ColdFetch(job.first, job.last, job.suffix).byte_range(self.chunk_size)
        async with source.get(job.bucket, job.key, byte_range=wanted, if_match=if_match) as reply:
            if reply.status not in (200, 206):
                body = await reply.read(ERROR_BODY_LIMIT)
                failed = OriginReply(reply.status, list(reply.headers.items()), body)
                # 412: the version being filled is gone at the source; drop its entry
                # unless a newer one has replaced it already.
                known = job.known
                if reply.status == 412 and known is not None and known.alive:
                    await self.store.invalidate(job.bucket, job.key)
                self._finish_result(job, failed)
                self._fail(job, OriginError(f"{source.name} answered {reply.status}"))
                return
            begins = body_start(reply.status, reply.headers.get("content-range", ""))
            if job.suffix:
                job.first = job.at = first_whole_chunk(begins, self.chunk_size)
            lead = job.first * self.chunk_size - begins
            if lead < 0:
                raise OriginError(f"{source.name} answered bytes from {begins}, not those asked")
            meta = object_meta(job.bucket, job.key, reply, self._clock.time())
            if job.known is None:
                obj = await self.store.admit(meta, since=asked, tell=reply.kind == "origin")
                self._register(job, obj)
                del self._cold[(job.bucket, job.key)]
            else:
                obj = job.known
            self._finish_result(job, obj)
            await self._skip(reply, lead)
            await self._copy(reply, obj, job)

    async def _copy(self, response: SourceReply, obj: CachedObject, job: FillJob) -> None:
        """Copy the response body into the claimed chunks, skipping the unclaimed ones."""
        for index, fill in job.claimed:
            job.at = index
            if fill is None:
                await self._skip(response, chunk_length(obj.meta.size, self.chunk_size, index))
            else:
                await self._fill_chunk(response, obj, fill)

    async def _fill_chunk(self, response: SourceReply, obj: CachedObject, fill: ChunkFill) -> None:
        # Asked (again) now: the fills begun since this one was claimed may have filled the
        # store, and then keeping this chunk means evicting.
        if not self.store.has_chunk(obj, fill.index) and not self.store.keeps(obj, fill.index):
            self._done(obj, fill, ok=False)
            raise ChunkDeclined(f"the cache does not keep chunk {fill.index} of {obj!r}")
        writer = await self.store.begin_chunk(obj, fill.index)
        if writer is None:
            # Either another fill committed this chunk a moment ago (its readers will find
            # it in the store), or the cache cannot take it: then reading on would only
            # throw bytes away, so the job stops (its readers fetch their bytes themselves).
            cached = self.store.has_chunk(obj, fill.index)
            self._done(obj, fill, ok=cached)
            if not cached:
                self._metrics.cache_bypassed_fills.inc()
                raise CacheFull(f"the cache cannot take chunk {fill.index} of {obj!r}")
            await self._skip(response, fill.length)
            return
        fill.path = writer.path
        try:
            await self._write(response, writer, fill)
            await writer.commit()
        except CacheWriteError as exc:
            log.warning("cache write failed, serving from origin: %r", exc)
            await writer.abort()
            self._done(obj, fill, ok=False)
            # Past what this chunk took from the response (not what reached its file), or
            # every chunk after it in this GET would be filled with shifted bytes.
            await self._skip(response, fill.length - fill.taken)
            return
        except BaseException:
            await writer.abort()
            raise
        self._metrics.cache_fill_bytes.inc(fill.length)
        self._done(obj, fill, ok=True)

    async def _write(self, response: SourceReply, writer: ChunkWriter, fill: ChunkFill) -> None:
        # Bytes are gathered into writes of up to WRITE_SIZE: each write is a hand-off to
        # the store's I/O thread, and readers following the fill wake once per write.
        pieces: list[bytes] = []
        gathered = 0
        while fill.written < fill.length:
            want = min(READ_SIZE, fill.length - fill.written - gathered)
            piece = await response.read(want) if want > 0 else b""
            if want > 0 and not piece:
                raise OriginError("the source's body ended early")
            fill.taken += len(piece)
            pieces.append(piece)
            gathered += len(piece)
            if gathered >= WRITE_SIZE or fill.written + gathered == fill.length:
                data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
                await writer.write(data)
                fill.advance(len(data))
                pieces.clear()
                gathered = 0

    async def _skip(self, response: SourceReply, length: int) -> None:
        """Read and drop `length` bytes of the response (a chunk someone else has, or the
        part of a suffix before its first whole chunk); the source counts them all the same."""
        while length > 0:
            piece = await response.read(min(READ_SIZE, length))
            if not piece:
                raise OriginError("the source's body ended early")
            length -= len(piece)

    def _done(self, obj: CachedObject, fill: ChunkFill, *, ok: bool) -> None:
        m = obj.meta
        self._fills.pop((m.bucket, m.key, m.etag, fill.index), None)
        fill.finish(ok)

    def _finish_result(self, job: FillJob, result: CachedObject | OriginReply) -> None:
        if not job.result.done():
            job.result.set_result(result)

    def _fail(self, job: FillJob, exc: BaseException) -> None:
        if not job.result.done():
            job.result.set_exception(OriginError(str(exc)))
            job.result.exception()  # retrieved: waiters may all be gone
        for index, fill in job.claimed:
            if fill is not None and not fill.finished:
                ident = (job.bucket, job.key, job.etag, index)
                if self._fills.get(ident) is fill:
                    del self._fills[ident]
                fill.finish(False)
