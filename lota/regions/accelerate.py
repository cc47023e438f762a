"""Write acceleration: writes to buckets homed in far regions finish at local speed.

For a bucket whose home region is not this node's, a PUT (or CopyObject, or a multipart
upload, :mod:`lota.regions.uploads`) goes, in this order:

1. to durable staging in the local region (:mod:`lota.regions.staging`), its body verified
   on the way (signature, length, checksums) and its MD5 computed, and into this node's
   cache as it passes (:class:`lota.cache.intake.Intake`);
2. into the catalog as the object's latest version, with everything a reader needs
   (size, ETag, content type, user metadata, checksums, where the bytes are);
3. only then is the client answered, with the ETag S3 would have given; the bytes kept in
   the cache are now the object's cached copy, so a read through this node is a HIT.

From that moment every node sees the object (:meth:`Accelerator.read` serves pending
versions from the cache or staging), and the migrator (:mod:`lota.regions.migrator`)
copies it home. A delete is a catalog tombstone that migrates the same way.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from email.utils import formatdate
from xml.sax.saxutils import escape

from aiohttp import web

from lota.auth.body import BodyDecoder
from lota.cache.intake import Intake, WriteCache, written_meta
from lota.catalog import Catalog, CatalogObject, PendingObject
from lota.errors import StagingSwept
from lota.metrics import Metrics
from lota.regions.location import Location
from lota.regions.origin import OriginClient
from lota.regions.staged import STORED_HEADERS, StagedSource, object_headers, object_location
from lota.regions.staging import Staged, Staging
from lota.relay import verified_body
from lota.s3 import conditions
from lota.s3.addressing import Target
from lota.s3.errors import S3Error
from lota.s3.ranges import content_range, parse_range
from lota.s3.xml import S3_NS

log = logging.getLogger("lota.accelerate")

CHECKSUM_PREFIX = "x-amz-checksum-"
# A staging copy read as the source of a copy, a piece at a time.
COPY_PIECE = 256 * 1024


class Accelerator:
    """Accepts writes to far-homed buckets and serves them until they have migrated."""

    def __init__(
        self,
        catalog: Catalog,
        staging: Staging,
        origin_for: Callable[[str], OriginClient],
        metrics: Metrics,
        body_timeout: float,
        cache: WriteCache | None = None,
    ) -> None:
        self.catalog = catalog
        self.staging = staging
        self.cache = cache or WriteCache.off()
        self._origin_for = origin_for
        self._metrics = metrics
        self._body_timeout = body_timeout
        # Why this node cannot stage writes now ("" when it can): the start-up check's.
        self.problem = ""

    async def recheck_staging(self, create: bool) -> bool:
        """Check this node's staging once (creating a missing bucket if `create`): True if
        it takes writes. Meanwhile :attr:`problem` says why not, and so do readyz and the
        503s writes get; one log line when it fails, one when it works again."""
        problem = await self.staging.check(create)
        if problem and problem != self.problem:
            log.warning("write acceleration is off: %s", problem)
        elif not problem and self.problem:
            log.info("write acceleration is on: %s takes writes", self.staging.area.where)
        self.problem = problem
        return not problem

    async def watch_staging(self, create: bool, every: float = 10.0) -> None:
        """Check again every `every` seconds until the staging takes writes."""
        while True:
            await asyncio.sleep(every)
            if await self.recheck_staging(create):
                return

    def check_staging(self) -> None:
        """Refuse a write while this node's staging cannot take it, saying why."""
        if self.problem:
            raise S3Error("ServiceUnavailable", f"Writes cannot be staged: {self.problem}.")

    # -- single PUT -------------------------------------------------------------------

    async def put_object(
        self, request: web.BaseRequest, target: Target, decoder: BodyDecoder
    ) -> web.StreamResponse:
        self.check_staging()
        length = length_of(decoder)
        started = time.perf_counter()
        body = verified_body(request, decoder, self._body_timeout)
        checksums: dict[str, str] = {}
        async with self._kept(target, length) as intake:
            staged = await self.staging.put(target.bucket, intake.tee(body), length)
            checksums = checksums_of(request.headers, decoder)
            etag = await self.commit(target, request.headers, staged, checksums, intake)
        self._metrics.accelerated_write_seconds.observe(time.perf_counter() - started)
        return web.Response(status=200, headers={"ETag": etag, **checksums})

    @asynccontextmanager
    async def _kept(self, target: Target, size: int) -> AsyncIterator[Intake]:
        """An intake for the object written to `target`, dropped if the write fails."""
        intake = await self.cache.intake(target.bucket, target.key, size)
        try:
            yield intake
        except BaseException:
            await intake.drop()
            raise

    async def commit(
        self,
        target: Target,
        headers: Mapping[str, str],
        staged: Staged,
        checksums: dict[str, str],
        intake: Intake,
    ) -> str:
        """Commit what was staged as the latest version of `target`, then make the bytes
        `intake` kept its cached copy here; returns the ETag (quoted)."""
        etag = f'"{staged.md5}"'
        obj = _pending(target, headers, staged, etag, checksums)
        try:
            seq = await self.catalog.commit_object(obj)
        except StagingSwept as exc:
            raise S3Error("ServiceUnavailable", f"{exc}; retry the write.") from exc
        self._metrics.accelerated_writes.inc()
        log.info(
            "accepted %s/%s (%d bytes) as version %d, staged at %s",
            target.bucket,
            target.key,
            staged.size,
            seq,
            staged.location,
        )
        await self._keep(intake, target, seq, staged.parts)
        return etag

    async def _keep(self, intake: Intake, target: Target, seq: int, parts: tuple[int, ...]) -> None:
        """The bytes kept become the object's cached copy here; if none were kept, what
        this node cached of the key before goes (reads must not find it once the version
        is home). A later write of the key won already: its own keeping, or its event,
        takes care of this node's copy."""
        if intake.keeping:
            committed = await self.catalog.get_object(target.bucket, target.key)
            if committed is None or committed.seq != seq:
                await intake.drop()
                return
            headers = object_headers(committed) | {"content-length": str(committed.size)}
            headers |= committed.checksums
            meta = written_meta(target.bucket, target.key, headers, parts, committed.created_at)
            if await intake.keep(meta):
                return
        await self.cache.forget(target.bucket, [target.key])

    async def delete_object(self, target: Target) -> web.StreamResponse:
        """A tombstone in the catalog: readers see 404 at once, the delete migrates home."""
        await self.catalog.commit_delete(target.bucket, target.key)
        await self.cache.forget(target.bucket, [target.key])
        return web.Response(status=204)

    # -- copies -----------------------------------------------------------------------

    async def copy_object(
        self,
        request: web.BaseRequest,
        target: Target,
        source: tuple[str, str],
        version_id: str = "",
    ) -> web.StreamResponse:
        """CopyObject into a far bucket: read the source (wherever it is), stage, commit.

        `source` and `version_id` are what was authorized; a named version is the
        origin's (the catalog only knows latest versions)."""
        self.check_staging()
        directive = request.headers.get("x-amz-metadata-directive", "COPY").upper()
        async with (
            self.source(*source, version_id) as (body, size, source_headers),
            self._kept(target, size) as intake,
        ):
            staged = await self.staging.put(target.bucket, intake.tee(body), size)
            headers = source_headers if directive == "COPY" else dict(request.headers)
            lowered = {k.lower(): v for k, v in headers.items()}
            etag = await self.commit(target, lowered, staged, {}, intake)
        xml = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<CopyObjectResult xmlns="{S3_NS}">'
            f"<LastModified>{iso(time.time())}</LastModified><ETag>{escape(etag)}</ETag>"
            "</CopyObjectResult>"
        )
        return web.Response(body=xml.encode(), content_type="application/xml")

    @asynccontextmanager
    async def source(
        self, bucket: str, key: str, version_id: str = "", byte_range: str = ""
    ) -> AsyncIterator[tuple[AsyncIterator[bytes], int, dict[str, str]]]:
        """The bytes of a copy source (`byte_range`: a Range value, or all of it), their
        count and the source's headers: from staging if its latest version is pending,
        else from its origin (a named version is always the origin's)."""
        pending = None if version_id else await self.catalog.get_object(bucket, key)
        if pending is not None and pending.pending:
            if pending.deleted:
                raise S3Error("NoSuchKey")
            first, last = _source_range(byte_range, pending.size)
            headers = object_headers(pending) | {"content-type": pending.content_type}
            headers |= dict(pending.headers)
            body = self.staging.read(object_location(pending), first, last)
            try:
                yield body, max(0, last - first + 1), headers
            finally:
                await body.aclose()
            return
        origin = self._origin_for(bucket)
        query = [("versionId", version_id)] if version_id else []
        wanted = {"range": byte_range} if byte_range else {}
        async with origin.request("GET", bucket, key, query=query, headers=wanted) as reply:
            if reply.status == 416:
                raise S3Error("InvalidRange", "The requested range is not satisfiable")
            if reply.status not in (200, 206):
                raise S3Error(
                    "NoSuchKey" if reply.status == 404 else "AccessDenied",
                    "The copy source cannot be read.",
                )
            size = int(reply.headers.get("content-length", "0"))
            headers = {k.lower(): v for k, v in reply.headers.items()}
            yield reply.content.iter_chunked(COPY_PIECE), size, headers

    # -- reads of objects not yet home ------------------------------------------------

    async def read(
        self, request: web.BaseRequest, target: Target, obj: CatalogObject
    ) -> web.StreamResponse:
        """GET/HEAD of a pending version: through the cache when the node has one (the
        writing node holds it already), else streamed from its staging copy."""
        if obj.deleted:
            raise S3Error(
                "NoSuchKey",
                "The specified key does not exist.",
                resource=f"/{obj.bucket}/{obj.key}",
            )
        received = self._metrics.origin_bytes_in.labels(obj.source_region or "local")
        source = StagedSource(self.staging, obj, received)
        served = await self.cache.serve(request, target, source, obj.etag)
        return served if served is not None else await self._stream(request, obj)

    async def _stream(self, request: web.BaseRequest, obj: CatalogObject) -> web.StreamResponse:
        modified = formatdate(obj.created_at, usegmt=True)
        try:
            conditions.check(request.headers, obj.etag, modified)
        except conditions.NotModified:
            return web.Response(status=304, headers={"ETag": obj.etag, "Last-Modified": modified})
        first, last, status = 0, obj.size - 1, 200
        wanted = parse_range(request.headers.get("range", ""))
        if wanted is not None:
            first, last = wanted.resolve(obj.size)
            status = 206
        response = web.StreamResponse(status=status)
        response.headers.update(object_headers(obj))
        if status == 200 and request.headers.get("x-amz-checksum-mode", "").upper() == "ENABLED":
            response.headers.update(obj.checksums)
        if status == 206:
            response.headers["Content-Range"] = content_range(first, last, obj.size)
        response.headers["x-lota-cache"] = "PENDING"
        response.content_length = max(0, last - first + 1)
        await response.prepare(request)
        if request.method == "GET" and last >= first:
            async for piece in self.staging.read(object_location(obj), first, last):
                await response.write(piece)
        await response.write_eof()
        return response


# -- helpers ------------------------------------------------------------------------------


def _pending(
    target: Target,
    headers: Mapping[str, str],
    staged: Staged,
    etag: str,
    checksums: dict[str, str],
) -> PendingObject:
    """The catalog's record of a write: what a reader needs, and where the bytes are."""
    metadata = {
        k.lower()[len("x-amz-meta-") :]: v
        for k, v in headers.items()
        if k.lower().startswith("x-amz-meta-")
    }
    stored = [(k, headers[k]) for k in STORED_HEADERS if k in headers]
    stored = [(k, _without_aws_chunked(v) if k == "content-encoding" else v) for k, v in stored]
    return PendingObject(
        bucket=target.bucket,
        key=target.key,
        size=staged.size,
        etag=etag,
        content_type=headers.get("content-type", "binary/octet-stream"),
        metadata=metadata,
        checksums=checksums,
        headers=tuple((k, v) for k, v in stored if v),
        parts=staged.parts,
        **_where(staged.location),
    )


def _source_range(byte_range: str, size: int) -> tuple[int, int]:
    wanted = parse_range(byte_range) if byte_range else None
    return wanted.resolve(size) if wanted is not None else (0, size - 1)


def length_of(decoder: BodyDecoder) -> int:
    if decoder.expected_length is None:
        raise S3Error("MissingContentLength", "You must provide the Content-Length HTTP header.")
    return decoder.expected_length


def checksums_of(headers: Mapping[str, str], decoder: BodyDecoder) -> dict[str, str]:
    """The ``x-amz-checksum-*`` values a client sent for its body (headers or trailers)."""
    found = {
        k.lower(): v
        for k, v in headers.items()
        if k.lower().startswith(CHECKSUM_PREFIX) and k.lower() != "x-amz-checksum-type"
    }
    found.update({k: v for k, v in decoder.trailers.items() if k.startswith(CHECKSUM_PREFIX)})
    return found


def _without_aws_chunked(value: str) -> str:
    return ",".join(p.strip() for p in value.split(",") if p.strip() and p.strip() != "aws-chunked")


def _where(location: Location) -> dict[str, str]:
    if location.scheme == "file":
        return {"local_path": str(location)}
    return {
        "source_region": location.region_or_node,
        "staging_bucket": location.bucket,
        "staging_key": location.key,
    }


def iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(at))


def md5_base64(etag: str) -> str:
    """Content-MD5 for a single-PUT ETag (hex MD5)."""
    return base64.b64encode(bytes.fromhex(etag.strip('"'))).decode()
