"""The LOTA node: wiring, the request handler, start-up and graceful shutdown.

A request goes through named steps::

    admin?  ──▶ /_lota/healthz | readyz | metrics
    parse   ──▶ addressing (bucket, key) and request sanity
    auth    ──▶ SigV4 + policy, on every request
    route   ──▶ pass-through to the bucket's home origin

Errors become S3 XML wherever they happen, including in aiohttp's own HTTP parser
(:class:`S3RequestHandler`); a response that already started is aborted instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import signal
import ssl
import time
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import Any
from xml.sax.saxutils import escape

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_exceptions import LineTooLong
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from lota.auth import Authenticator, Authorized, Refused
from lota.auth.body import BodyDecoder, make_decoder
from lota.auth.sigv4 import RequestView
from lota.cache.fill import Filler
from lota.cache.reads import ReadPath, cacheable
from lota.cache.store import CacheError, CacheStore
from lota.cache.warm import Warm, parse_concurrency
from lota.catalog import Catalog, CatalogUnavailable, EventKind, PendingSummary, open_catalog
from lota.clock import Clock
from lota.config import Config, ConfigError, StartupError
from lota.connections import GuardedRequestHandler, GuardedServer, connection_limits
from lota.http import BodyWriter
from lota.lifecycle.access import AccessRecorder
from lota.lifecycle.engine import Engine, OriginListing, OriginMover
from lota.lifecycle.state import LifecycleState
from lota.logs import AccessLog
from lota.metrics import LifecycleObserver, Metrics
from lota.passthrough import PassThrough
from lota.regions.accelerate import Accelerator
from lota.regions.migrator import Migrator
from lota.regions.origin import POOL_SIZE, OriginClient
from lota.regions.staging import Staging
from lota.regions.writes import RegionalRouter
from lota.relay import abort, read_small_body
from lota.s3.addressing import (
    Target,
    is_admin,
    is_valid_bucket_name,
    parse_target,
    split_target,
)
from lota.s3.errors import OriginError, S3Error
from lota.s3.operations import bucket_arn, object_arn
from lota.s3.xml import DeleteEntry, DeleteRequest, delete_result, merge_result, parse_delete
from lota.tasks import TaskGroup

log = logging.getLogger("lota.server")
# Operations counted by the x-lota-cache header of their response (lota_cache_requests).
_READS = frozenset({"GetObject", "HeadObject"})
# Operations that count as an access to their object (lifecycle tiering).
ACCESSES = frozenset({"GetObject", "PutObject", "CopyObject", "CompleteMultipartUpload"})
# S3 allows 1,000 keys per DeleteObjects; their XML stays well under this.
DELETE_BODY_LIMIT = 2 * 1024 * 1024
# aiohttp refuses longer request lines (8 KiB by default) before LOTA sees them; keys over
# S3's 1,024 bytes, percent-encoded, must reach the KeyTooLongError check. Each header
# line keeps aiohttp's 8 KiB bound, at most 128 of them.
MAX_REQUEST_LINE = 64 * 1024
# What a draining node still answers: everything else gets 503.
PROBES = frozenset({"/_lota/healthz", "/_lota/readyz", "/_lota/metrics"})
# Once the drain is over, seconds left for responses aiohttp is still writing.
FLUSH_GRACE = 1.0
# Catalog events after which other nodes' cached copies of the key are stale.
_INVALIDATING_EVENTS = frozenset({EventKind.PUT, EventKind.DELETE, EventKind.INVALIDATE})
# Operations after which cached copies of the addressed object(s) are stale.
INVALIDATING = frozenset(
    {
        "PutObject",
        "CopyObject",
        "DeleteObject",
        "CompleteMultipartUpload",
        "PutObjectTagging",
        "DeleteObjectTagging",
        "PutObjectAcl",
        "RestoreObject",
    }
)


class Node:
    """One LOTA node. ``async with Node(config) as node:`` then serve ``node.handle``."""

    def __init__(self, config: Config, clock: Clock | None = None) -> None:
        self.config = config
        self.clock = clock or Clock.from_environment()
        self.metrics = Metrics()
        # Signatures are checked and made against the real time, whatever LOTA_TIME_OFFSET
        # says: clients and origins sign with theirs.
        self.auth = Authenticator(config.auth, Clock())
        self.ready = False
        self.tasks = TaskGroup("node")
        # Cache fills run on their own: a stop lets them finish (see stop_serving).
        self.fills = TaskGroup("fills")
        self._drain_until: float | None = None
        self._quiet = asyncio.Event()  # set when the drain finds no request in flight
        self.store: CacheStore | None = None
        self._session: aiohttp.ClientSession | None = None
        self._passthrough: PassThrough | None = None
        self._reads: ReadPath | None = None
        self.catalog: Catalog | None = None
        self._router: RegionalRouter | None = None
        self.migrator: Migrator | None = None
        self.lifecycle = LifecycleState(config.lifecycle.rules)
        self.access: AccessRecorder | None = None
        self.engine: Engine | None = None
        self.access_log = AccessLog()
        self.inflight = 0  # requests being answered; the gauge reads it when scraped
        self.metrics.inflight.set_function(lambda: self.inflight)

    async def __aenter__(self) -> Node:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=POOL_SIZE, limit_per_host=POOL_SIZE // 2, ttl_dns_cache=60
            ),
            timeout=aiohttp.ClientTimeout(
                total=None, sock_connect=10, sock_read=self.config.origin_timeout
            ),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
        )
        origins = {
            name: OriginClient(region, self._session, self.metrics, Clock())
            for name, region in self.config.regions.items()
        }
        self._passthrough = PassThrough(
            origins,
            self.config.bucket_regions,
            self.config.default_region,
            self.config.body_timeout,
        )
        try:
            if self.config.cache.dirs:
                await self._open_cache()
            if self.config.catalog.url:
                await self._open_catalog(origins)
        except BaseException:
            await self.__aexit__(None, None, None)  # close what did open (the session...)
            raise
        self.ready = True
        return self

    async def _open_catalog(self, origins: dict[str, OriginClient]) -> None:
        w = self.config.write
        self.catalog = await open_catalog(
            self.config.catalog.url, clock=self.clock, node=self.config.node
        )
        local = self.config.regions[self.config.region]
        staging = Staging(
            node=self.config.node,
            region=self.config.region,
            origins=origins,
            staging_bucket=local.staging_bucket,
            local_dir=w.staging_dir if w.staging == "local-disk" else "",
        )
        assert self._passthrough is not None
        accelerator = Accelerator(
            self.catalog,
            staging,
            self._passthrough.origin_for,
            self.metrics,
            self.config.body_timeout,
        )
        self._router = RegionalRouter(self.config, self.catalog, accelerator, self._passthrough)
        self.migrator = Migrator(
            self.catalog, staging, self._passthrough.origin_for, w, self.metrics, self.clock
        )
        self.tasks.start(self.migrator.run(), "migrator")
        if self.store is not None:
            self.tasks.start(self._follow_events(), "invalidations")
        self.access = AccessRecorder(self.catalog, self.clock)
        self.access.start(self.tasks)
        origin_for = self._passthrough.origin_for
        self.engine = Engine(
            self.catalog,
            OriginListing(origin_for),
            OriginMover(origin_for),
            self.config.lifecycle,
            clock=self.clock,
            state=self.lifecycle,
            observer=LifecycleObserver(self.metrics),
        )
        if self.config.lifecycle.interval > 0:
            self.tasks.start(self.engine.run_forever(), "lifecycle")

    async def _open_cache(self) -> None:
        c = self.config.cache
        store = CacheStore(
            c.dirs,
            c.size,
            c.chunk_size,
            clock=self.clock,
            verify=c.verify,
            pinned=c.pinned,
            fsync=c.fsync,
            scrub_interval=c.scrub_interval,
            high_watermark=c.high_watermark,
            low_watermark=c.low_watermark,
        )
        try:
            await store.open()
        except CacheError as exc:  # a dir in use or unusable: nothing to serve without it
            raise StartupError(str(exc)) from exc
        self.store = store
        # The index just loaded is long-lived: keep the collector from rescanning it.
        gc.freeze()
        self.metrics.watch_store(self.store)
        filler = Filler(self.store, c.chunk_size, self.metrics, self.clock, self.fills)
        self._reads = ReadPath(self.store, filler, c, self.clock, self.metrics)
        if self.config.lifecycle.restore_on_read:
            self._reads.on_archived = self._start_restore

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.ready = False
        try:
            if self.access is not None:
                await self.access.close()  # flush the last accesses while the catalog is open
            # Fills in flight (bytes a client has been sent, or a prefetch) are kept if they
            # end within the drain time; what is left then is cut, never committed partial.
            until = self._drain_until or time.monotonic() + self.config.drain_timeout
            await self.fills.drain(max(0.0, until - time.monotonic()))
            await self.fills.close()
            await self.tasks.close()
            if self._reads is not None:
                self._reads.close()
            if self.store is not None:
                await self.store.close()
            if self.catalog is not None:
                await self.catalog.close()
            if self._session is not None:
                await self._session.close()
        finally:
            self.access_log.flush()

    def stop_serving(self) -> None:
        """Not ready any more (health probes say so); the drain time starts now. Until it
        ends, new S3 requests are answered 503 and their connections closed: serving them
        could keep the drain from ever ending, and the client's retry finds a ready node
        (or this node's successor, which cannot start before this process exits)."""
        self.ready = False
        self._drain_until = time.monotonic() + self.config.drain_timeout

    async def drained(self) -> None:
        """Until no request is in flight, or the drain time is up."""
        assert self._drain_until is not None
        remaining = self._drain_until - time.monotonic()
        if self.inflight and remaining > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._quiet.wait(), remaining)

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Answer one request; never raises except to abort a response already started."""
        ctx = RequestContext()
        if is_admin(request.host, request.raw_path, self.config.domain):
            ctx.operation = "Admin"
        self.inflight += 1
        try:
            response = await self._answer(request, ctx)
            if self.access is not None and response.status < 300:
                self._record_access(ctx)
            # Sent now rather than by aiohttp once we return, so that all of it is counted.
            await response.prepare(request)
            await response.write_eof()
            return response
        finally:
            self.inflight -= 1
            if not self.inflight and self._drain_until is not None:
                self._quiet.set()
            self._account(request, ctx)

    def _account(self, request: web.BaseRequest, ctx: RequestContext) -> None:
        """Count and log the response as it went out, from what its writer saw (a response
        cut short included): status, x-lota-cache header, body bytes."""
        sent = request.writer
        assert isinstance(sent, BodyWriter)
        elapsed = time.perf_counter() - ctx.started
        received = request.content.total_bytes
        m = self.metrics
        m.bytes_out.inc(sent.body_size)
        if received:
            m.bytes_in.inc(received)
        if sent.status:  # else nothing went out: the client left, or a shutdown cut it short
            m.requests.labels(ctx.operation, str(sent.status)).inc()
            m.request_seconds.labels(ctx.operation).observe(elapsed)
            if sent.cache and ctx.operation in _READS:
                m.cache_requests.labels(sent.cache).inc()
                m.cache_request_seconds.labels(sent.cache).observe(elapsed)
        self.access_log.write(
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
        assert self.access is not None
        if ctx.operation in ACCESSES and ctx.bucket and ctx.key:
            self.access.record(ctx.bucket, ctx.key)
            if ctx.copy_source is not None:
                self.access.record(*ctx.copy_source)

    async def _answer(self, request: web.BaseRequest, ctx: RequestContext) -> web.StreamResponse:
        """Run the request's steps; turn every error into an S3 XML response."""
        try:
            probe = ctx.operation == "Admin" and request.path in PROBES
            if self._drain_until is not None and not probe:
                return self._refuse_while_draining(request, ctx)
            if ctx.operation == "Admin":
                return await self._admin(request)
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
        target = parse_target(request.host, request.raw_path, self.config.domain)
        view = RequestView(request.method, target.raw_path, target.query, request.headers)
        authorized = self.auth.authenticate(view, target.bucket, target.key)
        ctx.operation = authorized.operation.name
        if authorized.principal is not None:
            ctx.principal = authorized.principal.name
        ctx.bucket, ctx.key = target.bucket, target.key
        ctx.copy_source = authorized.operation.copy_source
        assert self._passthrough is not None
        read = ctx.operation in _READS
        if read:
            if self._router is not None:
                routed = await self._router.read(request, target)
                if routed is not None:
                    return routed
            if self._reads is not None and cacheable(target, request.headers):
                origin = self._passthrough.origin_for(target.bucket)
                return await self._reads.serve(request, target, origin)
        # Made only now: a read answered from the cache has no body to decode.
        decoder = self.auth.decoder(view, authorized)
        if request.headers.get("expect", "").lower() == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self._router is not None and not read:
            routed = await self._router.handle(request, target, authorized.operation, decoder)
            if routed is not None:
                if ctx.operation in INVALIDATING:
                    await self._drop_cached(target.bucket, [target.key])
                return routed
        if ctx.operation == "DeleteObjects":
            return await self._delete_objects(request, target, authorized, decoder)
        copy_source = authorized.operation.forwarded_copy_source
        if ctx.operation not in INVALIDATING:
            return await self._passthrough.forward(request, target, decoder, copy_source)
        await self._invalidate(target.bucket, [target.key])
        try:
            return await self._passthrough.forward(request, target, decoder, copy_source)
        finally:
            await self._invalidate(target.bucket, [target.key])

    async def _delete_objects(
        self, request: web.BaseRequest, target: Target, authorized: Authorized, decoder: BodyDecoder
    ) -> web.StreamResponse:
        """DeleteObjects, authorized per key as S3 does: denied keys are reported as
        AccessDenied errors and never sent on; the origin (or the catalog) gets a body
        rebuilt from the authorized entries only."""
        body = await read_small_body(request, decoder, DELETE_BODY_LIMIT, self.config.body_timeout)
        allowed, denied = self._authorize_deletes(authorized, target.bucket, parse_delete(body))
        keys = [entry.key for entry in allowed.entries]
        if not keys:
            return web.Response(body=delete_result((), denied), content_type="application/xml")
        if self._router is not None:
            result = await self._router.delete_objects(target, allowed)
            if result is not None:
                await self._drop_cached(target.bucket, keys)
                body = merge_result(result, denied, quiet=allowed.quiet)
                return web.Response(body=body, content_type="application/xml")
        assert self._passthrough is not None
        await self._invalidate(target.bucket, keys)
        try:
            response = await self._passthrough.exchange(request, target, allowed.to_xml())
        finally:
            await self._invalidate(target.bucket, keys)
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
            if self.auth.allows(authorized, action, object_arn(bucket, entry.key)):
                allowed.append(entry)
            else:
                log.info("denied DeleteObjects entry %s/%s", bucket, entry.key)
                denied.append(entry)
        return DeleteRequest(tuple(allowed), wanted.quiet), denied

    async def _drop_cached(self, bucket: str, keys: list[str]) -> None:
        """Drop this node's cached copies (accelerated writes: the catalog's own events tell
        the other nodes)."""
        if self.store is not None:
            for key in keys:
                await self.store.invalidate(bucket, key)

    async def _invalidate(self, bucket: str, keys: list[str]) -> None:
        """Drop cached copies of objects a write changes (before and after it), here and,
        through the catalog, on every other node."""
        await self._drop_cached(bucket, keys)
        if self.catalog is not None:
            for key in keys:
                await self.catalog.publish(EventKind.INVALIDATE, bucket, key)

    def _start_restore(self, origin: OriginClient, bucket: str, key: str) -> None:
        """Ask the origin to restore an archived object someone tried to read."""
        lc = self.config.lifecycle
        body = (
            f"<RestoreRequest><Days>{lc.restore_days}</Days><GlacierJobParameters>"
            f"<Tier>{escape(lc.restore_tier)}</Tier></GlacierJobParameters></RestoreRequest>"
        ).encode()

        async def restore() -> None:
            headers = {"content-length": str(len(body))}
            async with origin.request(
                "POST", bucket, key, query=[("restore", "")], headers=headers, body=body
            ) as reply:
                log.info(
                    "restore of archived %s/%s requested: origin %d", bucket, key, reply.status
                )

        self.tasks.start(restore(), f"restore {bucket}/{key}")

    async def _follow_events(self) -> None:
        """Drop cached copies that writes on other nodes made stale, and every copy of a
        key whose new version just reached its home (an older one may have been cached
        by a read that crossed the write)."""
        assert self.catalog is not None and self.store is not None
        async with await self.catalog.events() as stream:
            async for event in stream:
                if event.kind == EventKind.MIGRATED or (
                    event.node != self.config.node and event.kind in _INVALIDATING_EVENTS
                ):
                    await self.store.invalidate(event.bucket, event.key)

    async def _admin(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == "/_lota/healthz":
            return web.Response(text="ok\n")
        if path == "/_lota/readyz":
            return web.Response(
                text="ready\n" if self.ready else "not ready\n", status=200 if self.ready else 503
            )
        if path == "/_lota/metrics":
            return web.Response(
                body=self.metrics.render(), content_type="text/plain", charset="utf-8"
            )
        if path == "/_lota/warm" and request.method == "POST":
            return await self._warm(request)
        if path == "/_lota/lifecycle/rules":
            return await self._lifecycle_rules(request)
        if path == "/_lota/migrations":
            raw_path, query = split_target(request.raw_path)
            view = RequestView(request.method, raw_path, query, request.headers)
            self.auth.authorize(view, "s3:ListAllMyBuckets", "*")
            if self.catalog is None:
                raise S3Error("InvalidRequest", "Write acceleration is off on this node.")
            summary = await self.catalog.pending_summary()
            return web.json_response(migration_report(summary))
        raise S3Error("InvalidRequest", f"Unknown LOTA admin call {path!r}.", status=404)

    async def _lifecycle_rules(self, request: web.BaseRequest) -> web.StreamResponse:
        """``GET``/``PUT /_lota/lifecycle/rules``: this node's lifecycle rules, as JSON."""
        raw_path, query = split_target(request.raw_path)
        view = RequestView(request.method, raw_path, query, request.headers)
        action = "s3:GetLifecycleConfiguration"
        if request.method == "PUT":
            action = "s3:PutLifecycleConfiguration"
        self.auth.authorize(view, action, "*")
        if request.method == "PUT":
            decoder = make_decoder(view, None)
            body = await read_small_body(
                request, decoder, DELETE_BODY_LIMIT, self.config.body_timeout
            )
            try:
                self.lifecycle.replace(body.decode("utf-8", "replace"))
            except ConfigError as exc:
                raise S3Error("InvalidArgument", str(exc)) from exc
        elif request.method != "GET":
            raise S3Error("MethodNotAllowed", "Use GET or PUT.")
        return web.Response(text=self.lifecycle.as_json(), content_type="application/json")

    async def _warm(self, request: web.BaseRequest) -> web.StreamResponse:
        """``POST /_lota/warm?bucket=B&prefix=P[&concurrency=N]``: progress as JSON lines.

        Needs ``s3:ListBucket`` on the bucket; each object is filled only if its
        ``s3:GetObject`` is allowed (see :mod:`lota.cache.warm`)."""
        bucket = request.query.get("bucket", "")
        if not is_valid_bucket_name(bucket):
            raise S3Error("InvalidBucketName", "The specified bucket is not valid.")
        raw_path, query = split_target(request.raw_path)
        view = RequestView(request.method, raw_path, query, request.headers)
        principal = self.auth.authorize(view, "s3:ListBucket", bucket_arn(bucket))
        concurrency = parse_concurrency(request.query.get("concurrency"))
        if self._reads is None or self._passthrough is None:
            raise S3Error("InvalidRequest", "This node has no cache to warm.")

        def may_read(key: str) -> bool:
            return principal is None or principal.policy.allows(
                "s3:GetObject", object_arn(bucket, key)
            )

        run = Warm(
            self._reads.filler,
            self._passthrough.origin_for(bucket),
            bucket,
            request.query.get("prefix", ""),
            may_read=may_read,
            metrics=self.metrics,
            concurrency=concurrency,
        )
        await run.start()  # a refusal is still an S3 error, before any 200
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        async with contextlib.aclosing(run.progress()) as lines:
            async for progress in lines:
                await response.write(progress.as_line())
        await response.write_eof()
        return response

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
            self.metrics.auth_failures.labels(exc.code).inc()
        if isinstance(exc, Refused):
            ctx.principal = exc.principal
            if ctx.operation == "Unknown":
                ctx.operation = exc.operation
        ctx.error = exc.code
        response = error_response(exc, ctx.request_id)
        if request.body_exists and not request.content.is_eof():
            # The body was never read (a client waiting for 100-continue may never send
            # it): close rather than let the next request be taken for its bytes.
            response.force_close()
        return response


class RequestContext:
    """What the handler learns about a request as it goes, for metrics and the access log."""

    __slots__ = (
        "bucket",
        "copy_source",
        "error",
        "key",
        "operation",
        "principal",
        "request_id",
        "started",
    )

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.request_id = next_request_id()
        self.operation = "Unknown"
        self.bucket = self.key = ""
        self.copy_source: tuple[str, str] | None = None
        self.principal = "-"
        self.error = ""  # the S3 error code LOTA answered with


_REQUEST_PREFIX = uuid.uuid4().hex[:6].upper()
_request_numbers = itertools.count(1)


def next_request_id() -> str:
    """Unique per process run and cheap: a random prefix and a counter."""
    return f"{_REQUEST_PREFIX}{next(_request_numbers):010X}"


def as_s3_error(exc: Exception, request_id: str) -> S3Error:
    """The S3 error a failure is answered with: unreachable dependencies are 503s (retry
    later), anything unexpected a logged 500."""
    if isinstance(exc, S3Error):
        return exc
    if isinstance(exc, OriginError):
        log.warning("request %s: %s", request_id, exc)
        return S3Error("ServiceUnavailable", "The origin could not be reached; retry later.")
    if isinstance(exc, CatalogUnavailable):
        log.warning("request %s: %s", request_id, exc)
        return S3Error("ServiceUnavailable", "The catalog could not be reached; retry later.")
    log.error("request %s failed", request_id, exc_info=exc)
    return S3Error("InternalError", "We encountered an internal error. Please try again.")


def migration_report(summary: PendingSummary) -> dict[str, float | int]:
    count, size, oldest, failing = summary
    return {
        "pending": count,
        "pending_bytes": size,
        "oldest_age_seconds": round(oldest, 1),
        "failing": failing,
    }


def response_started(request: web.BaseRequest) -> bool:
    """Whether any part of a response (headers included) has been handed to aiohttp."""
    writer: Any = request.writer
    return bool(
        writer.output_size
        or getattr(writer, "_headers_buf", None)
        or getattr(writer, "_headers_written", False)
    )


def error_response(exc: S3Error, request_id: str) -> web.Response:
    """An S3 XML error response (aiohttp leaves the body out for HEAD by itself)."""
    return web.Response(
        status=exc.status,
        body=exc.to_xml(request_id),
        content_type="application/xml",
        headers={"x-amz-request-id": request_id},
    )


class S3RequestHandler(GuardedRequestHandler):
    """aiohttp's connection handler, with its HTTP-level errors answered as S3 XML."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("response already started; cannot send an error")
        if status >= 500:
            self.log_exception("error handling request", exc_info=exc)
            err = S3Error("InternalError", "We encountered an internal error. Please try again.")
        elif isinstance(exc, LineTooLong):
            err = S3Error(
                "RequestHeaderSectionTooLarge",
                "Your request header section exceeds the maximum allowed size.",
            )
        else:
            err = S3Error("InvalidRequest", f"Malformed HTTP request: {message or exc}"[:512])
        response = error_response(err, next_request_id())
        response.force_close()
        return response


class S3Server(GuardedServer):
    """aiohttp's low-level server using :class:`S3RequestHandler` for each connection, and
    a :class:`BodyWriter` for each response."""

    def __call__(self) -> RequestHandler:
        return S3RequestHandler(self, loop=self._loop, **self._kwargs)

    def _make_request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        # In place of the writer aiohttp made: this one keeps count of what went out.
        counted = BodyWriter(protocol, self._loop)
        return web.BaseRequest(message, payload, protocol, counted, task, self._loop)


def ssl_context(config: Config) -> ssl.SSLContext | None:
    if not config.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(config.tls_cert, config.tls_key)
    except (OSError, ssl.SSLError) as exc:
        raise StartupError(f"cannot load tls_cert / tls_key: {exc}") from exc
    return context


async def serve(
    config: Config,
    *,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve until `stop` is set or SIGTERM/SIGINT arrives, then drain and return."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        limits = connection_limits(config)  # raises the descriptor limit before files open
        async with Node(config) as node:
            server = S3Server(
                node.handle,
                limits=limits,
                metrics=node.metrics,
                request_id=next_request_id,
                access_log=None,
                max_line_size=MAX_REQUEST_LINE,
            )
            runner = web.ServerRunner(server, shutdown_timeout=FLUSH_GRACE, handle_signals=False)
            await runner.setup()
            host, port = config.listen_address
            site = web.TCPSite(runner, host, port, ssl_context=ssl_context(config), backlog=1024)
            try:
                await site.start()
            except OSError as exc:
                reason = os.strerror(exc.errno).lower() if exc.errno else str(exc)
                raise StartupError(
                    f"cannot listen on {config.listen}: {reason} "
                    "(is another process on that port? choose one with --listen or LOTA_LISTEN)"
                ) from exc
            url = _bound_url(site, config)
            log.info("LOTA %s listening on %s (region %s)", _version(), url, config.region)
            if on_ready:
                on_ready(url)
            await stop.wait()
            log.info(
                "shutting down: draining in-flight requests (up to %.0fs)", config.drain_timeout
            )
            node.stop_serving()
            # The listener stays open meanwhile: probes see "not ready", not a refusal.
            await node.drained()
            if node.inflight:
                log.warning("drain time is up: cutting %d requests in flight", node.inflight)
            await runner.cleanup()
            log.info("stopped")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


def _bound_url(site: web.TCPSite, config: Config) -> str:
    server: Any = site._server  # the asyncio Server, for the port actually bound
    host, port = server.sockets[0].getsockname()[:2]
    scheme = "https" if config.tls_cert else "http"
    return f"{scheme}://{host if ':' not in host else f'[{host}]'}:{port}"


def _version() -> str:
    from lota import __version__

    return __version__
