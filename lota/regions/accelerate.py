"""Write acceleration: writes to buckets homed in far regions finish at local speed.

For a bucket whose home region is not this node's, a PUT (or CopyObject, or a multipart
upload) goes, in this order:

1. to durable staging in the local region (:mod:`lota.regions.staging`), its body verified
   on the way (signature, length, checksums) and its MD5 computed;
2. into the catalog as the object's latest version, with everything a reader needs
   (size, ETag, content type, user metadata, checksums, where the bytes are);
3. only then is the client answered, with the ETag S3 would have given.

From that moment every node sees the object (:meth:`Accelerator.read` serves pending
objects from staging), and the migrator (:mod:`lota.regions.migrator`) copies it home.
A delete is a catalog tombstone that migrates the same way.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable, Mapping
from email.utils import formatdate
from xml.sax.saxutils import escape

from aiohttp import web

from lota.auth.body import BodyDecoder
from lota.catalog import Catalog, CatalogObject, PendingObject
from lota.metrics import Metrics
from lota.regions.origin import OriginClient
from lota.regions.staging import Location, Staged, Staging
from lota.relay import read_small_body, verified_body
from lota.s3 import conditions
from lota.s3.addressing import Target
from lota.s3.errors import S3Error
from lota.s3.ranges import content_range, parse_range
from lota.s3.xml import S3_NS

log = logging.getLogger("lota.accelerate")

# Request headers stored with the object and replayed on reads and at migration.
STORED_HEADERS = (
    "cache-control",
    "content-disposition",
    "content-encoding",
    "content-language",
    "expires",
    "x-amz-website-redirect-location",
    "x-amz-tagging",
    "x-amz-storage-class",
)
# Of those, the ones a GET answers with.
REPLAYED = frozenset(STORED_HEADERS) - {"x-amz-tagging", "x-amz-storage-class"}
CHECKSUM_PREFIX = "x-amz-checksum-"
UPLOAD_ID_TAG = "lota1."


class Accelerator:
    """Accepts writes to far-homed buckets and serves them until they have migrated."""

    def __init__(
        self,
        catalog: Catalog,
        staging: Staging,
        origin_for: Callable[[str], OriginClient],
        metrics: Metrics,
        body_timeout: float,
    ) -> None:
        self.catalog = catalog
        self.staging = staging
        self._origin_for = origin_for
        self._metrics = metrics
        self._body_timeout = body_timeout

    # -- single PUT -------------------------------------------------------------------

    async def put_object(
        self, request: web.BaseRequest, target: Target, decoder: BodyDecoder
    ) -> web.StreamResponse:
        length = _length(decoder)
        started = time.perf_counter()
        body = verified_body(request, decoder, self._body_timeout)
        staged = await self.staging.put(target.bucket, body, length)
        etag = f'"{staged.md5}"'
        checksums = _checksums(request.headers, decoder)
        await self._commit(target, request.headers, staged.location, staged.size, etag, checksums)
        self._metrics.accelerated_writes.inc()
        self._metrics.accelerated_write_seconds.observe(time.perf_counter() - started)
        return web.Response(status=200, headers={"ETag": etag, **checksums})

    async def _commit(
        self,
        target: Target,
        headers: Mapping[str, str],
        location: Location,
        size: int,
        etag: str,
        checksums: dict[str, str],
        parts: tuple[int, ...] = (),
    ) -> int:
        metadata = {
            k.lower()[len("x-amz-meta-") :]: v
            for k, v in headers.items()
            if k.lower().startswith("x-amz-meta-")
        }
        stored = tuple((k, headers[k]) for k in STORED_HEADERS if k in headers)
        stored = tuple(
            (k, _without_aws_chunked(v) if k == "content-encoding" else v) for k, v in stored
        )
        obj = PendingObject(
            bucket=target.bucket,
            key=target.key,
            size=size,
            etag=etag,
            content_type=headers.get("content-type", "binary/octet-stream"),
            metadata=metadata,
            checksums=checksums,
            headers=tuple((k, v) for k, v in stored if v),
            parts=parts,
            **_where(location),
        )
        seq = await self.catalog.commit_object(obj)
        log.info(
            "accepted %s/%s (%d bytes) as version %d, staged at %s",
            target.bucket,
            target.key,
            size,
            seq,
            location,
        )
        return seq

    async def delete_object(self, target: Target) -> web.StreamResponse:
        """A tombstone in the catalog: readers see 404 at once, the delete migrates home."""
        await self.catalog.commit_delete(target.bucket, target.key)
        return web.Response(status=204)

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
        bucket, key = source
        pending = None if version_id else await self.catalog.get_object(bucket, key)
        if pending is not None and pending.pending:
            if pending.deleted:
                raise S3Error("NoSuchKey")
            size = pending.size
            source_headers: dict[str, str] = {
                "content-type": pending.content_type,
                **dict(pending.headers),
            }
            source_headers.update({f"x-amz-meta-{k}": v for k, v in pending.metadata.items()})
            staged = await self.staging.put(
                target.bucket, self.staging.read(object_location(pending)), size
            )
        else:
            staged, source_headers = await self._copy_from_origin(target, bucket, key, version_id)
        directive = request.headers.get("x-amz-metadata-directive", "COPY").upper()
        headers = source_headers if directive == "COPY" else dict(request.headers)
        etag = f'"{staged.md5}"'
        await self._commit(
            target,
            {k.lower(): v for k, v in headers.items()},
            staged.location,
            staged.size,
            etag,
            {},
        )
        modified = _iso(time.time())
        xml = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<CopyObjectResult xmlns="{S3_NS}">'
            f"<LastModified>{modified}</LastModified><ETag>{escape(etag)}</ETag></CopyObjectResult>"
        )
        return web.Response(body=xml.encode(), content_type="application/xml")

    async def _copy_from_origin(
        self, target: Target, bucket: str, key: str, version_id: str
    ) -> tuple[Staged, dict[str, str]]:
        origin = self._origin_for(bucket)
        query = [("versionId", version_id)] if version_id else []
        async with origin.request("GET", bucket, key, query=query) as reply:
            if reply.status != 200:
                raise S3Error(
                    "NoSuchKey" if reply.status == 404 else "AccessDenied",
                    "The copy source cannot be read.",
                )
            size = int(reply.headers.get("content-length", "0"))
            headers = {k.lower(): v for k, v in reply.headers.items()}
            staged = await self.staging.put(
                target.bucket, reply.content.iter_chunked(256 * 1024), size
            )
        return staged, headers

    # -- multipart uploads ------------------------------------------------------------

    async def create_multipart(
        self, request: web.BaseRequest, target: Target
    ) -> web.StreamResponse:
        key = self.staging.new_key(target.bucket)
        upload = await self.staging.create_multipart(key)
        upload_id = encode_upload_id(key, upload, dict(request.headers))
        xml = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<InitiateMultipartUploadResult xmlns="{S3_NS}">'
            f"<Bucket>{escape(target.bucket)}</Bucket><Key>{escape(target.key)}</Key>"
            f"<UploadId>{upload_id}</UploadId></InitiateMultipartUploadResult>"
        )
        return web.Response(body=xml.encode(), content_type="application/xml")

    async def upload_part(
        self,
        request: web.BaseRequest,
        target: Target,
        decoder: BodyDecoder,
        upload_id: str,
        number: int,
    ) -> web.StreamResponse:
        key, upload, _ = decode_upload_id(upload_id)
        length = _length(decoder)
        body = verified_body(request, decoder, self._body_timeout)
        md5 = await self.staging.upload_part(key, upload, number, body, length)
        checksums = _checksums(request.headers, decoder)
        return web.Response(status=200, headers={"ETag": f'"{md5}"', **checksums})

    async def complete_multipart(
        self, request: web.BaseRequest, target: Target, decoder: BodyDecoder, upload_id: str
    ) -> web.StreamResponse:
        key, upload, headers = decode_upload_id(upload_id)
        body = await read_small_body(request, decoder, 4 * 1024 * 1024, self._body_timeout)
        etag, sizes = await self.staging.complete_multipart(key, upload, body)
        location = Location("s3", self.staging.region, self.staging.bucket, key)
        await self._commit(target, headers, location, sum(sizes), etag, {}, tuple(sizes))
        self._metrics.accelerated_writes.inc()
        xml = (
            f'<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<CompleteMultipartUploadResult xmlns="{S3_NS}">'
            f"<Location>/{escape(target.bucket)}/{escape(target.key)}</Location>"
            f"<Bucket>{escape(target.bucket)}</Bucket><Key>{escape(target.key)}</Key>"
            f"<ETag>{escape(etag)}</ETag></CompleteMultipartUploadResult>"
        )
        return web.Response(body=xml.encode(), content_type="application/xml")

    async def abort_multipart(self, upload_id: str) -> web.StreamResponse:
        key, upload, _ = decode_upload_id(upload_id)
        await self.staging.abort_multipart(key, upload)
        return web.Response(status=204)

    # -- reads of objects not yet home ------------------------------------------------

    async def read(self, request: web.BaseRequest, obj: CatalogObject) -> web.StreamResponse:
        """GET/HEAD of a pending version, from its staging copy (any region's)."""
        if obj.deleted:
            raise S3Error(
                "NoSuchKey",
                "The specified key does not exist.",
                resource=f"/{obj.bucket}/{obj.key}",
            )
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
        response.headers.update(
            {
                "ETag": obj.etag,
                "Last-Modified": modified,
                "Content-Type": obj.content_type,
                "Accept-Ranges": "bytes",
            }
        )
        for name, value in obj.headers:
            if name in REPLAYED:
                response.headers[name] = value
        for name, value in obj.metadata.items():
            response.headers[f"x-amz-meta-{name}"] = value
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


def encode_upload_id(staging_key: str, upload: str, headers: Mapping[str, str]) -> str:
    """An UploadId that carries the staging key, the staging upload and the object's headers."""
    keep = {
        k.lower(): v
        for k, v in headers.items()
        if k.lower() in STORED_HEADERS
        or k.lower() == "content-type"
        or k.lower().startswith("x-amz-meta-")
    }
    raw = json.dumps({"k": staging_key, "u": upload, "h": keep}, separators=(",", ":"))
    return UPLOAD_ID_TAG + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_upload_id(upload_id: str) -> tuple[str, str, dict[str, str]]:
    if not upload_id.startswith(UPLOAD_ID_TAG):
        raise S3Error("NoSuchUpload")
    try:
        text = upload_id[len(UPLOAD_ID_TAG) :]
        data = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        return str(data["k"]), str(data["u"]), {str(k): str(v) for k, v in data["h"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not ours, or forged
        raise S3Error("NoSuchUpload") from exc


def is_accelerated_upload(upload_id: str) -> bool:
    return upload_id.startswith(UPLOAD_ID_TAG)


def _length(decoder: BodyDecoder) -> int:
    if decoder.expected_length is None:
        raise S3Error("MissingContentLength", "You must provide the Content-Length HTTP header.")
    return decoder.expected_length


def _checksums(headers: Mapping[str, str], decoder: BodyDecoder) -> dict[str, str]:
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


def object_location(obj: CatalogObject) -> Location:
    if obj.local_path:
        return Location.parse(obj.local_path)
    return Location("s3", obj.source_region, obj.staging_bucket, obj.staging_key)


def _iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(at))


def md5_base64(etag: str) -> str:
    """Content-MD5 for a single-PUT ETag (hex MD5)."""
    return base64.b64encode(bytes.fromhex(etag.strip('"'))).decode()
