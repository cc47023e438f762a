"""The peer endpoint: what a node answers the other nodes of its cluster, under ``/_lota/peer/``.

=================================================  =======================================
``GET /_lota/peer/object?bucket=B&key=K``          bytes of one version of an object:
  ``If-Match: ETAG``, ``Range: bytes=A-Z``         206 from the cache (zero-copy), or filled
                                                   from the origin as they arrive; 412 when
                                                   the origin has another version
``HEAD /_lota/peer/object?bucket=B&key=K``         the object's metadata, fresh (learnt from
                                                   the origin if not held, revalidated if
                                                   due), ``x-lota-validated-at`` saying when
                                                   it was checked; or the origin's refusal
``POST /_lota/peer/fill?bucket=B&key=K&chunks=..`` fill those chunks of version ETAG, then
  ``If-Match: ETAG``                               200 ``{"filled", "cached", "failed"}``
``POST /_lota/peer/invalidate?bucket=B&key=K``     drop this node's cached copy (every
                                                   worker's, when another node asks)
``GET /_lota/peer/ping``                           200 while serving
=================================================  =======================================

Every request must carry a valid signature made with the cluster secret
(:mod:`lota.cluster.signing`): anything else is answered 403 before anything is looked
up, fetched or filled. Client credentials are not looked at here, and the client's
authentication and policy were checked by the node the client talks to.

The owner never forwards: what it does not hold it fills from its own origin (one request
however many nodes ask at once), so two nodes that disagree on the members cannot send a
request around in circles.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from lota.cache import plan
from lota.cache.deliver import Deliverer
from lota.cache.fill import OriginReply
from lota.cache.layout import chunk_count
from lota.cache.reads import relay_reply
from lota.cache.route import Alone, NodePlacement
from lota.cache.service import ChunkService
from lota.cache.source import VALIDATED_AT, ChunkSource
from lota.cache.store import CachedObject
from lota.cluster.peers import FILL, INVALIDATE, OBJECT, PING
from lota.cluster.signing import PeerRefused, Verifier
from lota.metrics import Metrics
from lota.s3.addressing import is_valid_bucket_name
from lota.s3.errors import S3Error
from lota.workers.node import is_sibling

PREFIX = "/_lota/peer/"
# A fill names at most this many chunks (80 GiB of 8 MiB chunks).
MAX_FILL_CHUNKS = 10_000
_CHUNK_LIST = re.compile(r"[0-9]{1,9}(,[0-9]{1,9})*")
Entry = Callable[[str, str, ChunkSource], Awaitable[CachedObject | OriginReply]]
"""(bucket, key, origin) -> the object's entry, fresh, or what the origin refused."""


class PeerEndpoint:
    """Answers the other nodes' requests, from this node's cache and origins only."""

    def __init__(
        self,
        verifier: Verifier,
        cache: ChunkService,
        deliverer: Deliverer,
        alone_for: Callable[[str], Alone],
        local_for: Callable[[str], NodePlacement],
        metrics: Metrics,
        tell_siblings: Callable[[str, list[str]], Awaitable[None]] | None = None,
        entry: Entry | None = None,
    ) -> None:
        """`alone_for`: a bucket's placement in this process alone (what a sibling worker's
        call is answered from: it goes no further); `local_for`: over this node's workers
        (what another node's call is answered from); `tell_siblings`: pass another node's
        invalidation on to this node's other workers; `entry`: an object's entry as a
        read here finds it (:meth:`lota.cache.reads.ReadPath.entry`), for metadata calls."""
        self._verifier = verifier
        self._cache = cache
        self._deliverer = deliverer
        self._alone_for = alone_for
        self._local_for = local_for
        self._metrics = metrics
        self._tell_siblings = tell_siblings
        self._entry = entry

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            sender = self._verifier.verify(
                request.method, request.raw_path, request.headers, time.time()
            )
        except PeerRefused as exc:
            self._metrics.peer_refused.labels(exc.reason).inc()
            raise
        path, method = request.path, request.method
        bucket = request.query.get("bucket", "")
        sibling = is_sibling(sender)
        placement = self._alone_for(bucket) if sibling else self._local_for(bucket)
        if path == OBJECT and method == "GET":
            return await self._object(request, placement, counted=not sibling)
        if path == OBJECT and method == "HEAD" and self._entry is not None:
            return await self._metadata(request, placement, self._entry)
        if path == FILL and method == "POST":
            return await self._fill(request, placement)
        if path == INVALIDATE and method == "POST":
            bucket, key = _target(request)
            await self._cache.invalidate(bucket, key)
            if not sibling and self._tell_siblings is not None:
                await self._tell_siblings(bucket, [key])
            return web.Response(text="ok\n")
        if path == PING and method == "GET":
            return web.Response(text="ok\n")
        raise S3Error("InvalidRequest", f"Unknown peer call {method} {path}.", status=404)

    async def _object(
        self, request: web.BaseRequest, placement: NodePlacement, *, counted: bool
    ) -> web.StreamResponse:
        """A range of one version; `counted`: another node asked (lota_peer_served)."""
        bucket, key = _target(request)
        etag = _version(request)
        wanted = request.headers.get("range", "")
        found = await self._version_of(placement, bucket, key, etag, wanted)
        if not isinstance(found, CachedObject):
            return relay_reply(found)
        m = found.meta
        first, last, status = plan.answer_range(wanted, m.size)
        answered = await self._answered(placement, found, first, last)
        if counted:
            self._metrics.peer_served.labels(answered).inc()
        # The head goes out at once, before the first byte (which may wait for this node's
        # own origin): the asker knows this node is alive and working on it.
        response = web.StreamResponse(status=status)
        response.headers.extend(
            plan.response_headers(
                m.headers,
                status=status,
                checksums=False,
                part=False,
                overrides=(),
                source=answered,
                first=first,
                last=last,
                size=m.size,
            )
        )
        response.content_length = max(0, last - first + 1)
        await response.prepare(request)
        if last >= first:
            await self._deliverer.send(request, response, placement, found, first, last)
        await response.write_eof()
        return response

    async def _metadata(
        self, request: web.BaseRequest, placement: NodePlacement, entry: Entry
    ) -> web.StreamResponse:
        """What a HEAD of the object would say (its whole-object checksums included), and
        when this node last checked it with its origin."""
        bucket, key = _target(request)
        found = await entry(bucket, key, placement.origin)
        if not isinstance(found, CachedObject):
            return relay_reply(found)
        m = found.meta
        response = web.StreamResponse(status=200)
        response.headers.extend(
            plan.response_headers(
                m.headers,
                status=200,
                checksums=True,
                part=False,
                overrides=(),
                source="HIT",
                first=0,
                last=m.size - 1,
                size=m.size,
            )
        )
        response.headers[VALIDATED_AT] = repr(m.validated_at)
        response.content_length = m.size
        await response.prepare(request)
        await response.write_eof()
        return response

    async def _answered(
        self, placement: NodePlacement, obj: CachedObject, first: int, last: int
    ) -> str:
        """HIT when this node holds every chunk of the range (in this worker or another),
        else MISS (it fills from its origin)."""
        for index in plan.chunk_span(first, last, self._cache.chunk_size):
            if self._cache.has_chunk(obj, index):
                continue
            opened = await placement.open_elsewhere(obj, index)
            if opened is None:
                return "MISS"
            opened.close()
        return "HIT"

    async def _version_of(
        self, placement: NodePlacement, bucket: str, key: str, etag: str, wanted: str
    ) -> CachedObject | OriginReply:
        """The entry of version `etag`: the one held; or learnt from the GET that starts
        filling the chunks asked for (If-Match: the origin answers 412 if it has another
        version); or, while this node is learning the object already (a reader here asked
        first), from that. Either way the chunks are registered before their bytes are
        fetched, so readers here and peers asking for the same chunks share one request."""
        held = self._cache.lookup(bucket, key)
        if held is not None and held.meta.etag == etag:
            return held
        cache = self._cache
        if cache.learning(bucket, key):
            found = await cache.learn(placement.origin, bucket, key)
        else:
            cold = plan.cold_fetch("GET", wanted, None, cache.chunk_size)
            job = cache.fill(
                placement.origin,
                bucket,
                key,
                cold.first,
                cold.last,
                suffix=cold.suffix,
                expect=etag,
            )
            found = await asyncio.shield(job.result)
        if isinstance(found, CachedObject) and found.meta.etag != etag:
            return OriginReply(412, [], b"")  # the origin has another version now
        return found

    async def _fill(self, request: web.BaseRequest, placement: NodePlacement) -> web.StreamResponse:
        bucket, key = _target(request)
        etag = _version(request)
        chunks = _chunks(request.query.get("chunks", ""))
        size = self._cache.chunk_size
        wanted = f"bytes={chunks[0] * size}-{(chunks[0] + 1) * size - 1}"
        found = await self._version_of(placement, bucket, key, etag, wanted)
        if not isinstance(found, CachedObject):
            return relay_reply(found)
        count = chunk_count(found.meta.size, self._cache.chunk_size)
        warmed = await placement.warm_chunks(found, [i for i in chunks if i < count])
        result = {"filled": warmed.filled, "cached": warmed.cached, "failed": warmed.failed}
        return web.Response(text=json.dumps(result), content_type="application/json")


def _target(request: web.BaseRequest) -> tuple[str, str]:
    bucket, key = request.query.get("bucket", ""), request.query.get("key", "")
    if not is_valid_bucket_name(bucket) or not key:
        raise S3Error("InvalidRequest", "A peer call names a bucket and a key.")
    return bucket, key


def _version(request: web.BaseRequest) -> str:
    etag = request.headers.get("if-match", "")
    if not etag:
        raise S3Error("InvalidRequest", "A peer read names the version it wants (If-Match).")
    return etag


def _chunks(raw: str) -> list[int]:
    if not _CHUNK_LIST.fullmatch(raw) or raw.count(",") >= MAX_FILL_CHUNKS:
        raise S3Error("InvalidRequest", "chunks must be chunk numbers, comma-separated.")
    return sorted({int(i) for i in raw.split(",")})
