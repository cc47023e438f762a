"""The read path for GetObject and HeadObject: lookup → (revalidate) → miss/fill → deliver.

* lookup: the store's entry for (bucket, key), if any, is the candidate copy.
* revalidate: an entry older than ``revalidate_after`` (unless its prefix is immutable)
  is checked with a conditional HEAD; a changed object replaces it, a vanished one drops
  it; an unreachable origin lets it be served STALE within ``stale_if_error``.
* miss: no entry: one origin GET (ranged to whole chunks for range reads) starts a fill
  and gives the object's metadata; concurrent cold readers share it.
* deliver: conditions, range and headers are answered from the entry; the body streams
  from chunks (see :mod:`lota.cache.deliver`).

Every response carries ``x-lota-cache: HIT | MISS | STALE``: the server counts responses
by that header (see :mod:`lota.node.front`), so it is the one place the source is decided.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import lru_cache

from aiohttp import web

from lota.cache.deliver import INLINE_READ, Deliverer
from lota.cache.fill import Filler, OriginReply, object_meta
from lota.cache.store import CachedObject, CacheStore, ObjectMeta
from lota.clock import Clock
from lota.config import CacheConfig
from lota.http import CACHE_HEADER
from lota.metrics import Metrics
from lota.regions.origin import OriginClient
from lota.s3 import conditions
from lota.s3.addressing import Target
from lota.s3.errors import LotaError, OriginError, S3Error, s3_error
from lota.s3.ranges import content_range, parse_range

log = logging.getLogger("lota.cache")

# Query parameters that only rewrite response headers; applied locally on hits.
RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}
# Requests the cache does not answer: other versions, customer-key encryption.
_BYPASS_QUERY = frozenset({"versionId"})
_SSE_C_HEADERS = (
    "x-amz-server-side-encryption-customer-algorithm",
    "x-amz-server-side-encryption-customer-key",
    "x-amz-server-side-encryption-customer-key-md5",
)
_SEQUENTIAL_MEMORY = 4096
# A hit this small is read into memory and sent with its headers in one write.
SMALL_BODY = INLINE_READ
Headers = tuple[tuple[str, str], ...]


def cacheable(target: Target, headers: Mapping[str, str]) -> bool:
    """Whether a GetObject/HeadObject may be answered from the cache."""
    if not target.key or not _BYPASS_QUERY.isdisjoint(target.names):
        return False
    return not any(name in headers for name in _SSE_C_HEADERS)


class ObjectChanged(LotaError):
    """The origin's object is no longer the one the cache entry describes."""


class ReadPath:
    """Answers cacheable GET and HEAD requests."""

    def __init__(
        self,
        store: CacheStore,
        filler: Filler,
        config: CacheConfig,
        clock: Clock,
        metrics: Metrics,
    ) -> None:
        self.store = store
        self.filler = filler
        self.deliverer = Deliverer(filler, metrics)
        self._config = config
        self._clock = clock
        self._metrics = metrics
        self._cs = config.chunk_size
        # Called when the origin refuses a read because the object must be restored first.
        self.on_archived: Callable[[OriginClient, str, str], None] = lambda *_: None
        # (bucket, key, etag) -> last chunk served, to spot sequential readers.
        self._last_chunk: OrderedDict[tuple[str, str, str], int] = OrderedDict()

    def close(self) -> None:
        self.deliverer.close()

    async def serve(
        self, request: web.BaseRequest, target: Target, origin: OriginClient
    ) -> web.StreamResponse:
        obj = self.store.lookup(target.bucket, target.key)
        source = "HIT"
        if obj is not None and self._needs_revalidation(obj):
            obj, source = await self._revalidate(origin, obj)
        if obj is None:
            result = await self._miss(request, target, origin)
            if isinstance(result, OriginReply):
                if result.status == 403 and b"InvalidObjectState" in result.body:
                    self.on_archived(origin, target.bucket, target.key)
                return _reply(result)
            obj, source = result, "MISS"
        return await self._respond(request, target, origin, obj, source)

    # -- freshness --------------------------------------------------------------------

    def _needs_revalidation(self, obj: CachedObject) -> bool:
        c = self._config
        limit = c.revalidate_after
        if c.immutable or c.revalidate:
            path = f"{obj.meta.bucket}/{obj.meta.key}"
            if path.startswith(c.immutable):
                return False
            limit = next((s for prefix, s in c.revalidate if path.startswith(prefix)), limit)
        return self._clock.time() - obj.meta.validated_at > limit

    async def _revalidate(
        self, origin: OriginClient, obj: CachedObject
    ) -> tuple[CachedObject | None, str]:
        m = obj.meta
        epoch = self.store.epoch
        try:
            async with origin.request(
                "HEAD", m.bucket, m.key, headers={"if-none-match": m.etag}
            ) as reply:
                status = reply.status
                fresh = (
                    object_meta(m.bucket, m.key, reply, self._clock.time())
                    if status == 200
                    else None
                )
        except OriginError:
            return self._stale_or_raise(obj)
        if not obj.alive:
            # Replaced or dropped while we asked (a write through LOTA): the answer is about
            # an older state than the store's; start over from what the store has now.
            current = self.store.lookup(m.bucket, m.key)
            if current is not None and not self._needs_revalidation(current):
                return current, "HIT"
            return None, "MISS"
        if status == 304 or (fresh is not None and fresh.etag == m.etag):
            self._metrics.cache_revalidations.labels("unchanged").inc()
            refreshed = replace(m, validated_at=self._clock.time())
            return await self.store.admit(refreshed, since=epoch), "HIT"
        if fresh is not None:
            self._metrics.cache_revalidations.labels("changed").inc()
            return await self.store.admit(fresh, since=epoch), "MISS"
        if status == 404:
            self._metrics.cache_revalidations.labels("gone").inc()
            await self.store.invalidate(m.bucket, m.key)
            return None, "MISS"
        return self._stale_or_raise(obj)

    def _stale_or_raise(self, obj: CachedObject) -> tuple[CachedObject, str]:
        self._metrics.cache_revalidations.labels("error").inc()
        age = self._clock.time() - obj.meta.validated_at
        if age <= self._config.revalidate_after + self._config.stale_if_error:
            return obj, "STALE"
        raise OriginError("origin unreachable and the cached copy is too old to serve stale")

    # -- misses -----------------------------------------------------------------------

    async def _miss(
        self, request: web.BaseRequest, target: Target, origin: OriginClient
    ) -> CachedObject | OriginReply:
        pending = self.filler.cold_job(target.bucket, target.key)
        if pending is not None:
            self._metrics.cache_coalesced.inc()
            shared = await asyncio.shield(pending.result)
            # Any answer about the object is everyone's; a 416 was about another's range.
            if not (isinstance(shared, OriginReply) and shared.status == 416):
                return shared
        span = self._cold_span(request, target)
        if span is None:
            return await self._head(origin, target)
        first, last = span
        job = self.filler.start(origin, target.bucket, target.key, first, last)
        return await asyncio.shield(job.result)

    def _cold_span(self, request: web.BaseRequest, target: Target) -> tuple[int, int | None] | None:
        """Chunks a cold GET should fetch; None when only the metadata is needed first."""
        if request.method == "HEAD" or _part_number(target) is not None:
            return None
        wanted = parse_range(request.headers.get("range", ""))
        if wanted is None:
            return 0, None
        if wanted.start is None:
            return None  # a suffix: the size decides which chunks
        first = wanted.start // self._cs
        return first, None if wanted.end is None else wanted.end // self._cs

    async def _head(self, origin: OriginClient, target: Target) -> CachedObject | OriginReply:
        epoch = self.store.epoch
        async with origin.request("HEAD", target.bucket, target.key) as reply:
            if reply.status != 200:
                return OriginReply(reply.status, list(reply.headers.items()), b"")
            meta = object_meta(target.bucket, target.key, reply, self._clock.time())
        return await self.store.admit(meta, since=epoch)

    # -- delivery ---------------------------------------------------------------------

    async def _respond(
        self,
        request: web.BaseRequest,
        target: Target,
        origin: OriginClient,
        obj: CachedObject,
        source: str,
    ) -> web.StreamResponse:
        m = obj.meta
        try:
            conditions.check(request.headers, m.etag, m.last_modified)
        except conditions.NotModified:
            return _not_modified(m, source)
        part = _part_number(target)
        if part is not None:
            obj, first, last = await self._part_range(origin, obj, part)
            status = 206
        else:
            first, last, status = self._range(request, m)
        if request.method == "GET" and source == "HIT" and last - first < SMALL_BODY:
            body = await self.deliverer.read_cached(obj, first, last)
            if body is not None:
                # All of it was cached and is read: one response, written in one go.
                small = web.Response(status=status, body=body)
                self._headers(small, request, target, obj.meta, first, last, status, part, source)
                self._maybe_read_ahead(origin, obj, first, last)
                return small
        if request.method == "GET" and source == "HIT" and not self._all_cached(obj, first, last):
            source = "MISS"
        response = BufferedHeadersResponse(status=status)
        self._headers(response, request, target, obj.meta, first, last, status, part, source)
        response.content_length = max(0, last - first + 1)
        if request.method == "HEAD":
            await response.prepare(request)
            if request.headers.get("range", "").replace(" ", "") == "bytes=0-0":
                self._prefetch(origin, obj)
            return response
        await response.prepare(request)
        if last >= first:
            await self.deliverer.send(request, response, origin, obj, first, last)
            self._maybe_read_ahead(origin, obj, first, last)
        await response.write_eof()
        return response

    def _range(self, request: web.BaseRequest, m: ObjectMeta) -> tuple[int, int, int]:
        wanted = parse_range(request.headers.get("range", ""))
        if wanted is None:
            return 0, m.size - 1, 200
        first, last = wanted.resolve(m.size)
        return first, last, 206

    async def _part_range(
        self, origin: OriginClient, obj: CachedObject, part: int
    ) -> tuple[CachedObject, int, int]:
        """Byte range of part `part`, learnt once from the origin and kept in the entry."""
        known = {number: (first, last) for number, first, last in obj.meta.parts}
        if part not in known:
            try:
                learnt, parts_count = await self._learn_part(origin, obj.meta, part, known)
            except ObjectChanged as exc:
                # The entry is older than the origin's object: the client's retry refetches.
                await self.store.invalidate(obj.meta.bucket, obj.meta.key)
                raise s3_error(
                    "ServiceUnavailable",
                    "The object changed at the origin while its parts were looked up; retry.",
                ) from exc
            m = obj.meta
            headers = m.headers
            if parts_count and not any(n == "x-amz-mp-parts-count" for n, _ in headers):
                headers = (*headers, ("x-amz-mp-parts-count", parts_count))
            parts = tuple(sorted({*m.parts, *((n, *span) for n, span in learnt.items())}))
            obj = await self.store.admit(replace(m, parts=parts, headers=headers))
            known.update(learnt)
        first, last = known[part]
        return obj, first, last

    async def _learn_part(
        self, origin: OriginClient, m: ObjectMeta, part: int, known: dict[int, tuple[int, int]]
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
            query = [("partNumber", str(number))]
            # Not If-Match: some S3 implementations answer part requests with the part's ETag.
            async with origin.request("HEAD", m.bucket, m.key, query=query) as reply:
                if reply.status not in (200, 206):
                    raise S3Error(
                        "InvalidPartNumber",
                        "The requested partnumber is not satisfiable",
                        status=416,
                    )
                parts_count = parts_count or reply.headers.get("x-amz-mp-parts-count", "")
                span = _content_range(reply.headers.get("content-range", ""))
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

    def _all_cached(self, obj: CachedObject, first: int, last: int) -> bool:
        return (
            all(
                self.store.has_chunk(obj, i) for i in range(first // self._cs, last // self._cs + 1)
            )
            if last >= first
            else True
        )

    def _headers(
        self,
        response: web.StreamResponse,
        request: web.BaseRequest,
        target: Target,
        m: ObjectMeta,
        first: int,
        last: int,
        status: int,
        part: int | None,
        source: str,
    ) -> None:
        """Everything but Content-Length (which the caller's kind of response decides)."""
        headers = response.headers
        if status == 200 and request.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED":
            headers.extend(_without_parts_count(m.headers))  # a 200 is never a part
        else:
            headers.extend(_plain_headers(m.headers, part is not None))
        if not target.names.isdisjoint(RESPONSE_OVERRIDES):
            for name, value in target.query:
                override = RESPONSE_OVERRIDES.get(name)
                if override is not None:
                    headers[override] = value
        headers["Accept-Ranges"] = "bytes"
        headers[CACHE_HEADER] = source
        if status == 206:
            headers["Content-Range"] = content_range(first, last, m.size)

    def _prefetch(self, origin: OriginClient, obj: CachedObject) -> None:
        """``HEAD`` with ``Range: bytes=0-0``: fill the whole object in the background."""
        if obj.meta.size and not self._all_cached(obj, 0, obj.meta.size - 1):
            self._metrics.cache_prefetches.inc()
            self.filler.start(origin, obj.meta.bucket, obj.meta.key, 0, None, obj)

    def _maybe_read_ahead(
        self, origin: OriginClient, obj: CachedObject, first: int, last: int
    ) -> None:
        """A reader whose ranges follow on from the last one gets the next chunks fetched ahead."""
        m = obj.meta
        if first == 0 and last == m.size - 1:
            return  # the whole object: nothing is ahead
        ident = (m.bucket, m.key, m.etag)
        previous = self._last_chunk.pop(ident, None)
        first_chunk, last_chunk = first // self._cs, last // self._cs
        self._last_chunk[ident] = last_chunk
        if len(self._last_chunk) > _SEQUENTIAL_MEMORY:
            self._last_chunk.popitem(last=False)
        if previous is None or not previous <= first_chunk <= previous + 1:
            return
        count = max(1, -(-m.size // self._cs))
        ahead = range(last_chunk + 1, min(count, last_chunk + 1 + self._config.readahead))
        missing = [
            i
            for i in ahead
            if not self.store.has_chunk(obj, i) and self.filler.fill_for(obj, i) is None
        ]
        if missing:
            self.filler.start(origin, m.bucket, m.key, missing[0], ahead[-1], obj)


class BufferedHeadersResponse(web.StreamResponse):
    """Headers wait for the first body bytes and go out in the same write: a small hit is
    one send on the socket and one segment on the wire, not two."""

    _send_headers_immediately = False


@lru_cache(maxsize=4096)
def _plain_headers(headers: Headers, with_parts_count: bool) -> Headers:
    """An object's headers as sent without ``x-amz-checksum-mode: ENABLED`` (no checksums),
    and without the parts count unless a part was asked for; computed once per object."""
    return tuple(
        (name, value)
        for name, value in headers
        if not (name.startswith("x-amz-checksum-") and name != "x-amz-checksum-type")
        and (with_parts_count or name != "x-amz-mp-parts-count")
    )


def _without_parts_count(headers: Headers) -> Headers:
    return tuple((name, value) for name, value in headers if name != "x-amz-mp-parts-count")


def _part_number(target: Target) -> int | None:
    if "partNumber" not in target.names:
        return None
    value = next(v for k, v in target.query if k == "partNumber")
    if not value.isdigit() or not 1 <= int(value) <= 10000:
        raise S3Error(
            "InvalidArgument", "Part number must be an integer between 1 and 10000, inclusive"
        )
    return int(value)


def _content_range(value: str) -> tuple[int, int, int] | None:
    """``bytes 0-99/1000`` -> (0, 99, 1000); None when absent or unreadable."""
    try:
        span, total = value.split(" ", 1)[1].split("/", 1)
        first, last = span.split("-", 1)
        return int(first), int(last), int(total)
    except (IndexError, ValueError):
        return None


def _not_modified(m: ObjectMeta, source: str) -> web.Response:
    response = web.Response(status=304)
    for name in ("etag", "last-modified", "cache-control", "expires"):
        for header, value in m.headers:
            if header == name:
                response.headers[name] = value
    response.headers[CACHE_HEADER] = source
    return response


def _reply(reply: OriginReply) -> web.Response:
    response = web.Response(status=reply.status, body=reply.body or None)
    for name, value in reply.headers:
        if name.lower() not in ("content-length", "transfer-encoding", "connection"):
            response.headers.add(name, value)
    response.headers[CACHE_HEADER] = "MISS"
    return response
