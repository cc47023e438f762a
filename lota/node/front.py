"""The front end: one request, answered in named steps.

::

    admin?  ──▶ /_lota/… (lota.node.admin)
    parse   ──▶ addressing (bucket, key) and request sanity
    auth    ──▶ SigV4 + policy, on every request, hits included
    route   ──▶ catalog (pending versions, accelerated writes) → cache (reads) →
                pass-through to the bucket's home origin, invalidating what writes change

Then accounting: metrics and one access-log line per request, from what its writer saw.
Errors become S3 XML wherever they happen; a response that already started is aborted.

A small hit may be answered before it reaches here, as its connection parses it
(:mod:`lota.node.at_once`), with the same steps and the same accounting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import Counter

from lota.auth import Authenticator, Authorized, Refused
from lota.auth.body import BodyDecoder
from lota.auth.sigv4 import RequestView
from lota.cluster.signing import FROM
from lota.http import BodyWriter
from lota.logs import AccessLog
from lota.metrics import Metrics
from lota.node.admin import PEER_PREFIX, PROBES, Admin
from lota.node.errors import as_s3_error, error_response, response_started
from lota.node.features import CacheFeature, CatalogFeature
from lota.node.invalidation import INVALIDATING, Invalidation
from lota.node.node import Drain
from lota.node.requests import RequestContext
from lota.passthrough import PassThrough
from lota.relay import abort, read_small_body
from lota.s3.addressing import Target, is_admin, parse_target
from lota.s3.errors import S3Error
from lota.s3.operations import Op, object_arn
from lota.s3.xml import DeleteEntry, DeleteRequest, delete_result, merge_result, parse_delete
from lota.workers.node import is_sibling

log = logging.getLogger("lota.node")
# Operations counted by the x-lota-cache header of their response (lota_cache_requests).
_READS = frozenset({Op.GET_OBJECT, Op.HEAD_OBJECT})
# Operations that count as an access to their object (lifecycle tiering).
ACCESSES = frozenset({Op.GET_OBJECT, Op.PUT_OBJECT, Op.COPY_OBJECT, Op.COMPLETE_MULTIPART_UPLOAD})
# S3 allows 1,000 keys per DeleteObjects; their XML stays well under this.
DELETE_BODY_LIMIT = 2 * 1024 * 1024


def _admin_operation(request: web.BaseRequest) -> Op:
    """LOTA's own call: a peer's (another node's, or another worker's: its signature is
    checked by the peer endpoint, this only names it), or an admin call."""
    if not request.path.startswith(PEER_PREFIX):
        return Op.ADMIN
    return Op.SIBLING if is_sibling(request.headers.get(FROM, "")) else Op.PEER


def _client_bytes(m: Metrics) -> Counter:
    return m.bytes_out


# Bytes sent to other processes of LOTA are not client bytes.
_BYTES_OUT: dict[str, Callable[[Metrics], Counter]] = {
    Op.PEER: lambda m: m.peer_bytes_out,
    Op.SIBLING: lambda m: m.worker_bytes_out,
}


class Front:
    """The request handler: :meth:`handle` answers one request, never raising except to
    abort a response already started."""

    def __init__(
        self,
        *,
        domain: str,
        body_timeout: float,
        auth: Authenticator,
        metrics: Metrics,
        access_log: AccessLog,
        drain: Drain,
        admin: Admin,
        passthrough: PassThrough,
        cache: CacheFeature,
        catalog: CatalogFeature,
        invalidation: Invalidation,
    ) -> None:
        self._domain = domain
        self._body_timeout = body_timeout
        self._auth = auth
        self._metrics = metrics
        self._access_log = access_log
        self._drain = drain
        self._admin = admin
        self._passthrough = passthrough
        self._invalidation = invalidation
        self._router = catalog.router
        self._access = catalog.access
        # Asked as flags, not by calling the off features: the hit path pays nothing for
        # a feature the node does not have.
        self._catalog_on = catalog.on
        self._cacheable = cache.cacheable
        self._serve_cached = cache.serve

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request; never raises except to abort a response already started."""
        ctx = RequestContext()
        if is_admin(request.host, request.raw_path, self._domain):
            ctx.operation = _admin_operation(request)
        drain = self._drain
        drain.inflight += 1
        try:
            response = await self._answer(request, ctx)
            if self._catalog_on and response.status < 300:
                self._record_access(ctx)
            # Sent now rather than by aiohttp once we return, so that all of it is counted.
            await response.prepare(request)
            await response.write_eof()
            return response
        finally:
            drain.finished()
            self._account(request, ctx)

    def _account(self, request: web.BaseRequest, ctx: RequestContext) -> None:
        """Count and log the response as it went out, from what its writer saw (a response
        cut short included): status, x-lota-cache header, body bytes."""
        sent = request.writer
        assert isinstance(sent, BodyWriter)
        elapsed = time.perf_counter() - ctx.started
        received = request.content.total_bytes
        m = self._metrics
        _BYTES_OUT.get(ctx.operation, _client_bytes)(m).inc(sent.body_size)
        if received:
            m.bytes_in.inc(received)
        if sent.status:  # else nothing went out: the client left, or a shutdown cut it short
            m.requests.labels(ctx.operation, str(sent.status)).inc()
            m.request_seconds.labels(ctx.operation).observe(elapsed)
            if sent.cache and ctx.operation in _READS:
                m.cache_requests.labels(sent.cache).inc()
                m.cache_request_seconds.labels(sent.cache).observe(elapsed)
        self._access_log.write(
            request.remote,
            request.method,
            request.raw_path,
            sent.status,
            ctx.operation,
            elapsed,
            ctx.request_id,
            cache=sent.cache or "-",
            sent=sent.body_size,
            received=received,
            principal=ctx.principal,
            error=ctx.error,
        )

    def _record_access(self, ctx: RequestContext) -> None:
        """Reads LOTA serves (cache hits included) and writes count as accesses for tiering;
        HEAD and LIST do not."""
        if ctx.operation in ACCESSES and ctx.bucket and ctx.key:
            self._access.record(ctx.bucket, ctx.key)
            if ctx.copy_source is not None:
                self._access.record(*ctx.copy_source)

    async def _answer(self, request: web.BaseRequest, ctx: RequestContext) -> web.StreamResponse:
        """Run the request's steps; turn every error into an S3 XML response."""
        try:
            probe = ctx.operation == Op.ADMIN and request.path in PROBES
            if self._drain.draining and not probe:
                return self._refuse_while_draining(request, ctx)
            if ctx.operation in (Op.ADMIN, Op.PEER, Op.SIBLING):
                return await self._admin.handle(request)
            return await self._s3(request, ctx)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:
            if response_started(request):
                # Too late for an error response: cut the connection so the client cannot
                # take the partial body for a whole one.
                log.warning("request %s failed mid-response: %r", ctx.request_id, exc)
                abort(request)
                raise ConnectionResetError("response aborted") from exc
            return self._error(request, as_s3_error(exc, ctx.request_id), ctx)

    async def _s3(self, request: web.BaseRequest, ctx: RequestContext) -> web.StreamResponse:
        target = parse_target(request.host, request.raw_path, self._domain)
        view = RequestView(request.method, target.raw_path, target.query, request.headers)
        authorized = self._auth.authenticate(view, target.bucket, target.key)
        ctx.operation = authorized.operation.name
        if authorized.principal is not None:
            ctx.principal = authorized.principal.name
        ctx.bucket, ctx.key = target.bucket, target.key
        ctx.copy_source = authorized.operation.copy_source
        read = ctx.operation in _READS
        if read:
            if self._catalog_on:
                routed = await self._router.read(request, target)
                if routed is not None:
                    return routed
            if self._cacheable(target, request.headers):
                return await self._serve_cached(request, target)
        # Made only now: a read answered from the cache has no body to decode.
        decoder = self._auth.decoder(view, authorized)
        if request.headers.get("expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not read:
            # An accelerated write replaces this worker's cached copy itself (with the
            # bytes it kept as they were written: see lota.regions.accelerate); the other
            # workers of the node drop theirs.
            routed = await self._router.handle(request, target, authorized.operation, decoder)
            if routed is not None:
                if ctx.operation in INVALIDATING:
                    await self._invalidation.drop_in_siblings(target.bucket, [target.key])
                return routed
        if ctx.operation == Op.DELETE_OBJECTS:
            return await self._delete_objects(request, target, authorized, decoder)
        copy_source = authorized.operation.forwarded_copy_source
        if ctx.operation not in INVALIDATING:
            return await self._passthrough.forward(request, target, decoder, copy_source)
        await self._invalidation.invalidate(target.bucket, [target.key])
        try:
            return await self._passthrough.forward(request, target, decoder, copy_source)
        finally:
            await self._invalidation.invalidate(target.bucket, [target.key])

    async def _delete_objects(
        self, request: web.BaseRequest, target: Target, authorized: Authorized, decoder: BodyDecoder
    ) -> web.StreamResponse:
        """DeleteObjects, authorized per key as S3 does: denied keys are reported as
        AccessDenied errors and never sent on; the origin (or the catalog) gets a body
        rebuilt from the authorized entries only."""
        body = await read_small_body(request, decoder, DELETE_BODY_LIMIT, self._body_timeout)
        allowed, denied = self._authorize_deletes(authorized, target.bucket, parse_delete(body))
        keys = [entry.key for entry in allowed.entries]
        if not keys:
            return web.Response(body=delete_result((), denied), content_type="application/xml")
        result = await self._router.delete_objects(target, allowed)
        if result is not None:
            await self._invalidation.drop_cached(target.bucket, keys)
            body = merge_result(result, denied, quiet=allowed.quiet)
            return web.Response(body=body, content_type="application/xml")
        await self._invalidation.invalidate(target.bucket, keys)
        try:
            response = await self._passthrough.exchange(request, target, allowed.to_xml())
        finally:
            await self._invalidation.invalidate(target.bucket, keys)
        if (denied or allowed.quiet) and response.status == 200:
            assert isinstance(response.body, bytes)
            response.body = merge_result(response.body, denied, quiet=allowed.quiet)
        return response

    def _authorize_deletes(
        self, authorized: Authorized, bucket: str, wanted: DeleteRequest
    ) -> tuple[DeleteRequest, list[DeleteEntry]]:
        """Split the entries into those the principal may delete and those it may not (a
        version needs s3:DeleteObjectVersion, as on AWS)."""
        allowed: list[DeleteEntry] = []
        denied: list[DeleteEntry] = []
        for entry in wanted.entries:
            action = "s3:DeleteObjectVersion" if entry.version_id else "s3:DeleteObject"
            if self._auth.allows(authorized, action, object_arn(bucket, entry.key)):
                allowed.append(entry)
            else:
                log.info("denied DeleteObjects entry %s/%s", bucket, entry.key)
                denied.append(entry)
        return DeleteRequest(tuple(allowed), wanted.quiet), denied

    def _refuse_while_draining(
        self, request: web.BaseRequest, ctx: RequestContext
    ) -> web.StreamResponse:
        err = S3Error("ServiceUnavailable", "This LOTA node is shutting down; retry.")
        response = self._error(request, err, ctx)
        response.force_close()
        return response

    def _error(
        self, request: web.BaseRequest, exc: S3Error, ctx: RequestContext
    ) -> web.StreamResponse:
        if exc.status == 403:
            self._metrics.auth_failures.labels(exc.code).inc()
        if isinstance(exc, Refused):
            ctx.principal = exc.principal
            if ctx.operation == Op.UNKNOWN:
                ctx.operation = exc.operation
        ctx.error = exc.code
        response = error_response(exc, ctx.request_id)
        if request.body_exists and not request.content.is_eof():
            # The body was never read (a client waiting for 100-continue may never send
            # it): close rather than let the next request be taken for its bytes.
            response.force_close()
        return response
