"""The read path for GetObject and HeadObject: lookup → (revalidate) → miss/fill → deliver.

* lookup: the cache's entry for (bucket, key), if any, is the candidate copy.
* revalidate: an entry older than ``revalidate_after`` (unless its prefix is immutable)
  is checked with a conditional HEAD; a changed object replaces it, a vanished one drops
  it; an unreachable origin lets it be served STALE within ``stale_if_error``.
* miss: no entry: one GET from the bucket's origin (ranged to whole chunks for a range
  read, to the last bytes for a suffix range) starts a fill and gives the object's
  metadata; concurrent cold readers share it. In a cluster, where a chunk's owner depends
  on the object's version, the miss learns the metadata first (one HEAD, shared too).
* deliver: conditions, range and headers are answered from the entry; the body streams
  from chunks, each from where the bucket's :class:`~lota.cache.route.Placement` says
  (see :mod:`lota.cache.deliver`).

What to do at each step is decided by :mod:`lota.cache.plan` (no I/O there); this module
does the asking and the answering. Every response carries ``x-lota-cache: HIT | PEER |
MISS | STALE``: the server counts responses by that header (see :mod:`lota.node.front`), so it
is the one place the source is decided.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from aiohttp import web

from lota.cache import plan
from lota.cache.deliver import INLINE_READ, Deliverer
from lota.cache.fill import OriginReply, object_meta
from lota.cache.layout import chunk_count
from lota.cache.plan import CACHE_HEADER
from lota.cache.route import Alone, Placement
from lota.cache.service import ChunkService
from lota.cache.source import ChunkSource
from lota.cache.store import CachedObject, ObjectMeta
from lota.clock import Clock
from lota.config import CacheConfig
from lota.errors import LotaError, OriginError
from lota.metrics import Metrics
from lota.s3 import conditions
from lota.s3.addressing import Target
from lota.s3.errors import S3Error, s3_error
from lota.zerocopy import FileSpan

log = logging.getLogger("lota.cache")

# A hit this small is read into memory and sent with its headers in one write.
SMALL_BODY = INLINE_READ
PlacementFor = Callable[[str], Placement]


class ObjectChanged(LotaError):
    """The origin's object is no longer the one the cache entry describes."""


@dataclass(frozen=True, slots=True)
class HitPlan:
    """How a small GET is answered at once (:meth:`ReadPath.plan_hit`): it holds while its
    entry is alive, fresh and still of the metadata it was planned from;
    :meth:`ReadPath.hit` answers the GET from it, as often as it comes."""

    obj: CachedObject
    meta: ObjectMeta
    """The entry's metadata as planned from: any refresh of the entry replaces it."""
    placement: Placement
    first: int
    last: int
    status: int
    headers: list[tuple[str, str]]
    fresh_until: float


class ReadPath:
    """Answers cacheable GET and HEAD requests."""

    def __init__(
        self,
        cache: ChunkService,
        placement_for: PlacementFor,
        config: CacheConfig,
        clock: Clock,
        metrics: Metrics,
    ) -> None:
        self.cache = cache
        self._placement_for = placement_for
        self.deliverer = Deliverer(cache, metrics)
        self._config = config
        self._clock = clock
        self._metrics = metrics
        self._cs = config.chunk_size
        # Called when the origin refuses a read because the object must be restored first.
        self.on_archived: Callable[[str, str], None] = lambda *_: None
        self._sequential = plan.Sequential(config.readahead, config.chunk_size)

    def close(self) -> None:
        self.deliverer.close()

    async def serve(self, request: web.BaseRequest, target: Target) -> web.StreamResponse:
        placement = self._placement_for(target.bucket)
        obj = self.cache.lookup(target.bucket, target.key)
        answered = "HIT"
        if obj is not None and self._due(obj):
            obj, answered = await self._revalidate(placement.origin, obj)
        if obj is None:
            result = await self._miss(request, target, placement)
            if isinstance(result, OriginReply):
                if result.status == 403 and b"InvalidObjectState" in result.body:
                    self.on_archived(target.bucket, target.key)
                return relay_reply(result)
            # Spread over workers, a cold entry was learnt by HEAD: its bytes may be held
            # by another worker (HIT), or not (MISS), as the chunks say below.
            spread_get = placement.spread and request.method == "GET"
            obj, answered = result, "HIT" if spread_get else "MISS"
        return await self._respond(request, target, placement, obj, answered)

    def plan_hit(self, headers: Mapping[str, str], target: Target) -> HitPlan | None:
        """How :meth:`serve` would answer a GET, when that can be at once: the entry is
        fresh, its conditions pass and the range is small. None for anything else, with
        nothing counted or read: then :meth:`serve` answers."""
        if "partNumber" in target.names:
            return None
        obj = self.cache.lookup(target.bucket, target.key)
        if obj is None or self._due(obj):
            return None
        m = obj.meta
        try:
            conditions.check(headers, m.etag, m.last_modified)
            first, last, status = plan.answer_range(headers.get("range", ""), m.size)
        except (conditions.NotModified, S3Error):
            return None
        if last < first or last - first >= SMALL_BODY:
            return None
        answer = self._response_headers(headers, target, obj, first, last, status, None, "HIT")
        fresh = m.validated_at + plan.fresh_for(f"{m.bucket}/{m.key}", self._config)
        placement = self._placement_for(target.bucket)
        return HitPlan(obj, m, placement, first, last, status, answer, fresh)

    def holds(self, planned: HitPlan) -> bool:
        """Whether `planned` still holds: its entry is alive, not due for revalidation, and
        has not been refreshed since (new headers, or told to be checked with the origin
        before its next use, :meth:`lota.cache.store.CacheStore.admit`): then it is
        planned again."""
        obj = planned.obj
        return obj.alive and obj.meta is planned.meta and self._clock.time() <= planned.fresh_until

    def hit(self, planned: HitPlan, span: bool = False) -> bytes | bytearray | FileSpan | None:
        """The body of the GET `planned` was made for (the first time or again, from the
        same client or another), when every byte of it is in the page cache behind a
        descriptor open here (:meth:`Deliverer.read_now`); None once it no longer
        :meth:`holds`, or while its bytes are not at hand. `span`: it may be a span of a
        chunk's file, to be sent from the page cache at once (when the connection can take
        it so). This runs for every small hit: :meth:`holds` is written out here."""
        obj = planned.obj
        meta = obj.meta
        if not obj.alive or meta is not planned.meta or self._clock.time() > planned.fresh_until:
            return None
        first, last = planned.first, planned.last
        body = self.deliverer.read_now(planned.placement, obj, first, last, span)
        if body is not None and (first or last + 1 < meta.size):  # whole: nothing ahead
            self._read_ahead(planned.placement, obj, first, last)
        return body

    async def bring_to_hand(self, planned: HitPlan) -> bool:
        """Bring the bytes of the GET `planned` was made for to hand, when :meth:`hit` found
        them not (a chunk's pages gone from the page cache, its file not yet opened or
        checked here, or held by another worker): read on a thread, or handed over by that
        worker (:meth:`Deliverer.bring_to_hand`), counting nothing; then :meth:`hit`
        answers. False once the plan no longer holds, or if a chunk is missing or damaged
        (then :meth:`serve` fetches it)."""
        if not self.holds(planned):
            return False
        obj, first, last = planned.obj, planned.first, planned.last
        return await self.deliverer.bring_to_hand(planned.placement, obj, first, last)

    async def serve_version(
        self, request: web.BaseRequest, target: Target, source: ChunkSource, etag: str
    ) -> web.StreamResponse | None:
        """A read of version `etag` of an object that `source` holds and the origin has not
        got yet (a write on its way home: the catalog vouches for the version): from the
        entry if it is that version, else filled from `source`; never revalidated. None
        when a fill in flight brought another version (the caller reads `source` then)."""
        placement = Alone(self.cache, source)
        obj = self.cache.lookup(target.bucket, target.key)
        answered = "HIT"
        if obj is None or obj.meta.etag != etag:
            result = await self._miss(request, target, placement)
            if isinstance(result, OriginReply):
                return relay_reply(result)
            if result.meta.etag != etag:
                return None
            obj, answered = result, "MISS"
        return await self._respond(request, target, placement, obj, answered)

    async def entry(self, bucket: str, key: str, origin: ChunkSource) -> CachedObject | OriginReply:
        """The object's entry as a read here would find it: the one held (revalidated with
        `origin` if due), or learnt from `origin` (one HEAD, shared); or what `origin`
        refused with. What another process asking for the metadata is answered."""
        obj = self.cache.lookup(bucket, key)
        if obj is not None and self._due(obj):
            obj, _ = await self._revalidate(origin, obj)
        if obj is not None:
            return obj
        return await self.cache.learn(origin, bucket, key)

    # -- freshness --------------------------------------------------------------------

    def _due(self, obj: CachedObject) -> bool:
        m = obj.meta
        path = f"{m.bucket}/{m.key}"
        return plan.revalidation_due(path, m.validated_at, self._config, self._clock.time())

    async def _revalidate(
        self, source: ChunkSource, obj: CachedObject
    ) -> tuple[CachedObject | None, str]:
        m = obj.meta
        asked = time.monotonic()
        try:
            async with source.head(m.bucket, m.key, if_none_match=m.etag) as reply:
                status, told = reply.status, reply.kind == "origin"
                fresh = (
                    object_meta(m.bucket, m.key, reply, self._clock.time())
                    if status == 200
                    else None
                )
        except OriginError:
            return self._stale_or_raise(obj)
        if not obj.alive:
            # Replaced or dropped while we asked (a write through LOTA): the answer is about
            # an older state than the cache's; start over from what the cache has now.
            current = self.cache.lookup(m.bucket, m.key)
            if current is not None and not self._due(current):
                return current, "HIT"
            return None, "MISS"
        if status == 304 or (fresh is not None and fresh.etag == m.etag):
            self._metrics.cache_revalidations.labels("unchanged").inc()
            refreshed = replace(m, validated_at=self._clock.time())
            return await self.cache.admit(refreshed, since=asked, tell=told), "HIT"
        if fresh is not None:
            self._metrics.cache_revalidations.labels("changed").inc()
            return await self.cache.admit(fresh, since=asked, tell=told), "MISS"
        if status == 404:
            self._metrics.cache_revalidations.labels("gone").inc()
            await self.cache.invalidate(m.bucket, m.key)
            return None, "MISS"
        return self._stale_or_raise(obj)

    def _stale_or_raise(self, obj: CachedObject) -> tuple[CachedObject, str]:
        self._metrics.cache_revalidations.labels("error").inc()
        if plan.may_serve_stale(obj.meta.validated_at, self._config, self._clock.time()):
            return obj, "STALE"
        raise OriginError("origin unreachable and the cached copy is too old to serve stale")

    # -- misses -----------------------------------------------------------------------

    async def _miss(
        self, request: web.BaseRequest, target: Target, placement: Placement
    ) -> CachedObject | OriginReply:
        pending = self.cache.cold_job(target.bucket, target.key)
        if pending is not None:
            self._metrics.cache_coalesced.inc()
            shared = await asyncio.shield(pending.result)
            # Any answer about the object is everyone's; a 416 was about another's range.
            if not (isinstance(shared, OriginReply) and shared.status == 416):
                return shared
        part = plan.part_number(target)
        wanted = plan.cold_fetch(
            request.method,
            request.headers.get("range", ""),
            part,
            self._cs,
            spread=placement.spread,
        )
        origin, bucket, key = placement.origin, target.bucket, target.key
        if wanted.head:
            learnt = await self.cache.learn(placement.metadata, bucket, key)
            if not isinstance(learnt, OriginReply) or request.method != "GET":
                return learnt
            # A HEAD's refusal has no body: a GET gets the origin's own error document
            # (NoSuchKey or NoSuchBucket, InvalidObjectState...) from a GET of its own.
            wanted = plan.ColdFetch(first=0, last=0)
        # A ranged answer never carries the whole object's checksums: a reader that wants
        # them (boto3 always asks) gets them from a HEAD sent beside the first chunk's GET.
        checksums = request.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"
        head = self.cache.learn_soon(origin, bucket, key) if wanted.whole and checksums else None
        job = self.cache.fill(origin, bucket, key, wanted.first, wanted.last, suffix=wanted.suffix)
        found = await asyncio.shield(job.result)
        if isinstance(found, OriginReply) and found.status == 416 and wanted.whole:
            # An empty object: no first chunk to read. The HEAD says all there is.
            return await self.cache.learn(origin, bucket, key)
        if head is not None:
            await asyncio.wait({head})  # its checksums are merged into the entry
        return found

    # -- delivery ---------------------------------------------------------------------

    async def _respond(
        self,
        request: web.BaseRequest,
        target: Target,
        placement: Placement,
        obj: CachedObject,
        answered: str,
    ) -> web.StreamResponse:
        m = obj.meta
        try:
            conditions.check(request.headers, m.etag, m.last_modified)
        except conditions.NotModified:
            unchanged = web.Response(status=304)
            unchanged.headers.extend(plan.not_modified_headers(m.headers, answered))
            return unchanged
        part = plan.part_number(target)
        if part is not None:
            obj, first, last = await self._part_range(placement.origin, obj, part)
            status = 206
        else:
            first, last, status = plan.answer_range(request.headers.get("range", ""), m.size)
        get = request.method == "GET"
        if get:
            answered = await self._source_header(placement, obj, first, last, answered)
        if get and answered == "HIT" and last - first < SMALL_BODY:
            body = await self.deliverer.read_cached(placement, obj, first, last)
            if body is not None:
                # All of it was cached and is read: one response, written in one go.
                small = web.Response(status=status, body=body)
                small.headers.extend(
                    self._response_headers(
                        request.headers, target, obj, first, last, status, part, answered
                    )
                )
                self._read_ahead(placement, obj, first, last)
                return small
        streamed = BufferedHeadersResponse(status=status)
        streamed.headers.extend(
            self._response_headers(
                request.headers, target, obj, first, last, status, part, answered
            )
        )
        streamed.content_length = max(0, last - first + 1)
        await streamed.prepare(request)
        if not get:
            if request.headers.get("range", "").replace(" ", "") == "bytes=0-0":
                self._prefetch(placement, obj)
            return streamed
        if last >= first:
            await self.deliverer.send(request, streamed, placement, obj, first, last)
            self._read_ahead(placement, obj, first, last)
        await streamed.write_eof()
        return streamed

    def _response_headers(
        self,
        headers: Mapping[str, str],
        target: Target,
        obj: CachedObject,
        first: int,
        last: int,
        status: int,
        part: int | None,
        answered: str,
    ) -> list[tuple[str, str]]:
        checksums = headers.get("x-amz-checksum-mode", "").upper() == "ENABLED"
        return plan.response_headers(
            obj.meta.headers,
            status=status,
            checksums=checksums,
            part=part is not None,
            overrides=plan.overrides(target),
            source=answered,
            first=first,
            last=last,
            size=obj.meta.size,
        )

    async def _part_range(
        self, source: ChunkSource, obj: CachedObject, part: int
    ) -> tuple[CachedObject, int, int]:
        """Byte range of part `part`, learnt once from the source and kept in the entry."""
        known = {number: (first, last) for number, first, last in obj.meta.parts}
        if part not in known:
            try:
                learnt, parts_count = await self._learn_part(source, obj.meta, part, known)
            except ObjectChanged as exc:
                # The entry is older than the origin's object: the client's retry refetches.
                await self.cache.invalidate(obj.meta.bucket, obj.meta.key)
                raise s3_error(
                    "ServiceUnavailable",
                    "The object changed at the origin while its parts were looked up; retry.",
                ) from exc
            m = obj.meta
            headers = m.headers
            if parts_count and not any(n == "x-amz-mp-parts-count" for n, _ in headers):
                headers = (*headers, ("x-amz-mp-parts-count", parts_count))
            parts = tuple(sorted({*m.parts, *((n, *span) for n, span in learnt.items())}))
            obj = await self.cache.admit(replace(m, parts=parts, headers=headers))
            known.update(learnt)
        first, last = known[part]
        return obj, first, last

    async def _learn_part(
        self, source: ChunkSource, m: ObjectMeta, part: int, known: dict[int, tuple[int, int]]
    ) -> tuple[dict[int, tuple[int, int]], str]:
        """Ask the origin where part `part` lies (and, without Content-Range, the parts before).

        Whether the object is still the entry's is checked by its size only: S3 answers with
        a Content-Range over the object, but with the part's own ETag and Last-Modified in
        some implementations (moto: and no Content-Range). Raises ObjectChanged when the
        parts do not fit the entry's size; bytes are fetched with If-Match anyway."""
        learnt: dict[int, tuple[int, int]] = {}
        lengths: dict[int, int] = {n: last - first + 1 for n, (first, last) in known.items()}
        parts_count = ""
        for number in [part, *range(1, part)]:
            if number in lengths and number != part:
                continue
            # Not If-Match: some S3 implementations answer part requests with the part's ETag.
            async with source.head(m.bucket, m.key, part=number) as reply:
                if reply.status not in (200, 206):
                    raise S3Error(
                        "InvalidPartNumber",
                        "The requested partnumber is not satisfiable",
                        status=416,
                    )
                parts_count = parts_count or reply.headers.get("x-amz-mp-parts-count", "")
                span = plan.parse_content_range(reply.headers.get("content-range", ""))
                lengths[number] = int(reply.headers.get("content-length", "0"))
            if span is not None:
                first, last, total = span
                if total != m.size:
                    raise ObjectChanged(f"{m!r} changed at the origin (part {number})")
                learnt[number] = (first, last)
                if number == part:
                    return learnt, parts_count
        offset = sum(lengths[n] for n in range(1, part))
        if offset + lengths[part] > m.size:
            raise ObjectChanged(f"{m!r} changed at the origin: its parts outgrow it")
        learnt[part] = (offset, offset + lengths[part] - 1)
        return learnt, parts_count

    async def _source_header(
        self, placement: Placement, obj: CachedObject, first: int, last: int, answered: str
    ) -> str:
        """What ``x-lota-cache`` says of a GET of bytes first..last, decided before the
        body (see :func:`lota.cache.plan.answered_from`): a chunk another worker of this
        node holds is as good as held here."""
        if answered not in ("HIT", "MISS") or last < first:
            return answered
        missing = []
        for index in plan.chunk_span(first, last, self._cs):
            if self.cache.has_chunk(obj, index):
                continue
            opened = await placement.open_elsewhere(obj, index)
            if opened is None:
                missing.append(index)
            else:
                opened.close()
        return plan.answered_from(answered, [placement.remote(obj, i) for i in missing])

    def _prefetch(self, placement: Placement, obj: CachedObject) -> None:
        """``HEAD`` with ``Range: bytes=0-0``: fill the whole object in the background,
        each chunk where it belongs."""
        count = chunk_count(obj.meta.size, self._cs)
        missing = [i for i in range(count) if not self.cache.has_chunk(obj, i)]
        if missing:
            self._metrics.cache_prefetches.inc()
            placement.prefetch(obj, missing)

    def _read_ahead(self, placement: Placement, obj: CachedObject, first: int, last: int) -> None:
        """A reader whose ranges follow on from the last one gets the next chunks fetched ahead."""
        m = obj.meta
        ahead = self._sequential.ahead((m.bucket, m.key, m.etag), first, last, m.size)
        missing = [
            i
            for i in ahead
            if not self.cache.has_chunk(obj, i) and self.cache.filling(obj, i) is None
        ]
        if missing:
            placement.prefetch(obj, missing)


class BufferedHeadersResponse(web.StreamResponse):
    """Headers wait for the first body bytes and go out in the same write: a small hit is
    one send on the socket and one segment on the wire, not two."""

    _send_headers_immediately = False


def relay_reply(reply: OriginReply) -> web.Response:
    """A source's non-success answer (404, 403, 412...), relayed as it came."""
    response = web.Response(status=reply.status, body=reply.body or None)
    for name, value in reply.headers:
        if name.lower() not in ("content-length", "transfer-encoding", "connection"):
            response.headers.add(name, value)
    response.headers[CACHE_HEADER] = "MISS"
    return response
