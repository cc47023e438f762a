"""Multipart uploads into far buckets: every call of an upload, as S3 answers it.

An accelerated upload stages as an upload of this node's staging area (a multipart upload
of the staging bucket, or part files on local disk), part for part, so the staged object
has the part boundaries and the ETag its home copy will have. Its UploadId carries the
staging key, the staging upload and the object's headers (:func:`encode_upload_id`), so
any node can take its parts; the catalog records it while it is in progress, for
ListMultipartUploads, and a call names an upload only if the catalog has it on record for
that bucket and key (an UploadId is the client's to send: its contents are not proof).
Each part is kept in the cache of the node it went through, and the completion joins
those into the object's cached copy (:meth:`WriteCache.join`).

* CreateMultipartUpload, UploadPart, UploadPartCopy (from any source, pending or home, a
  byte range of it if asked), ListParts, CompleteMultipartUpload, AbortMultipartUpload;
* ListMultipartUploads of a far bucket: the catalog's uploads merged with the origin's.
"""

from __future__ import annotations

import base64
import json
import re
import time
from collections.abc import AsyncIterator, Mapping
from xml.sax.saxutils import escape

from aiohttp import web

from lota.auth.body import BodyDecoder
from lota.cache.intake import part_name, written_meta
from lota.regions.accelerate import Accelerator, checksums_of, iso, length_of
from lota.regions.multipart import (
    Upload,
    list_parts_result,
    list_uploads_result,
    parse_complete,
    parse_uploads,
)
from lota.regions.origin import OriginClient
from lota.regions.origin_pages import refusal
from lota.regions.staged import STORED_HEADERS
from lota.regions.staging import STAGING_PREFIX, StagingArea
from lota.relay import read_small_body, verified_body
from lota.s3.addressing import Target
from lota.s3.errors import S3Error
from lota.s3.xml import S3_NS

UPLOAD_ID_TAG = "lota1."
# An upload in progress: (staging key, staging upload, headers, staging area).
_Opened = tuple[str, str, dict[str, str], StagingArea]
# A staging key as Staging.new_key makes them: the prefix, the bucket, a uuid.
_STAGING_KEY = re.compile(re.escape(STAGING_PREFIX) + r"[^/]+/[0-9a-f]{32}")
COMPLETE_BODY_LIMIT = 4 * 1024 * 1024


class Uploads:
    """The multipart calls of accelerated uploads."""

    def __init__(self, accelerator: Accelerator, body_timeout: float) -> None:
        self._accel = accelerator
        self._staging = accelerator.staging
        self._catalog = accelerator.catalog
        self._cache = accelerator.cache
        self._body_timeout = body_timeout

    async def create(self, request: web.BaseRequest, target: Target) -> web.StreamResponse:
        self._accel.check_staging()
        key, area = self._staging.new_key(target.bucket), self._staging.area
        upload = await area.create_multipart(key)
        root = str(area.location(""))
        upload_id = encode_upload_id(key, upload, dict(request.headers), root)
        await self._catalog.record_upload(target.bucket, target.key, upload_id)
        return _xml(
            "InitiateMultipartUploadResult",
            f"<Bucket>{escape(target.bucket)}</Bucket><Key>{escape(target.key)}</Key>"
            f"<UploadId>{upload_id}</UploadId>",
        )

    async def upload_part(
        self,
        request: web.BaseRequest,
        target: Target,
        decoder: BodyDecoder,
        upload_id: str,
        number: int,
    ) -> web.StreamResponse:
        opened = await self._open(target, upload_id)
        length = length_of(decoder)
        body = verified_body(request, decoder, self._body_timeout)
        md5 = await self._stage_part(target, opened, number, body, length)
        checksums = checksums_of(request.headers, decoder)
        return web.Response(status=200, headers={"ETag": f'"{md5}"', **checksums})

    async def upload_part_copy(
        self,
        request: web.BaseRequest,
        target: Target,
        upload_id: str,
        number: int,
        source: tuple[str, str],
        version_id: str,
    ) -> web.StreamResponse:
        """UploadPartCopy: the source (`x-amz-copy-source-range` of it, if given) as a part."""
        opened = await self._open(target, upload_id)
        wanted = request.headers.get("x-amz-copy-source-range", "")
        if wanted and not wanted.replace(" ", "").startswith("bytes="):
            raise S3Error("InvalidArgument", "The x-amz-copy-source-range value must be bytes=a-b.")
        async with self._accel.source(*source, version_id, wanted) as (body, size, _):
            md5 = await self._stage_part(target, opened, number, body, size)
        return _xml(
            "CopyPartResult",
            f"<LastModified>{iso(time.time())}</LastModified><ETag>&quot;{md5}&quot;</ETag>",
        )

    async def _stage_part(
        self,
        target: Target,
        opened: _Opened,
        number: int,
        body: AsyncIterator[bytes],
        size: int,
    ) -> str:
        """Stage part `number` of an upload and keep it in the cache as it goes by; its MD5."""
        key, upload, _, area = opened
        name = part_name(target.key, upload, number)
        intake = await self._cache.intake(target.bucket, name, size)
        try:
            md5 = await self._staging.upload_part(area, key, upload, number, intake.tee(body), size)
        except BaseException:
            await intake.drop()
            raise
        headers = {"etag": f'"{md5}"', "content-length": str(size)}
        await intake.keep(written_meta(target.bucket, name, headers, (), time.time()))
        return md5

    async def _open(self, target: Target, upload_id: str) -> _Opened:
        """(staging key, staging upload, headers, staging area) of an upload of `target`
        in progress. An UploadId is the client's to send, so what it carries is believed
        only for an upload the catalog has on record for this bucket and key, staged
        under this bucket's staging prefix."""
        key, upload, headers, root = decode_upload_id(upload_id)
        record = await self._catalog.get_upload(upload_id)
        if (
            record is None
            or (record.bucket, record.key) != (target.bucket, target.key)
            or not _STAGING_KEY.fullmatch(key)
            or key.split("/")[1] != target.bucket
        ):
            raise S3Error("NoSuchUpload")
        return key, upload, headers, self._staging.area_at(root)

    async def list_parts(
        self, request: web.BaseRequest, target: Target, upload_id: str
    ) -> web.StreamResponse:
        key, upload, _, area = await self._open(target, upload_id)
        marker = _number(request.query.get("part-number-marker", "0"), "part-number-marker")
        limit = min(1000, _number(request.query.get("max-parts", "1000"), "max-parts"))
        page = await area.list_parts(key, upload, marker, limit)
        body = list_parts_result(target.bucket, target.key, upload_id, page, marker, limit)
        return web.Response(body=body, content_type="application/xml")

    async def complete(
        self, request: web.BaseRequest, target: Target, decoder: BodyDecoder, upload_id: str
    ) -> web.StreamResponse:
        key, upload, headers, area = await self._open(target, upload_id)
        body = await read_small_body(request, decoder, COMPLETE_BODY_LIMIT, self._body_timeout)
        staged = await self._staging.complete_multipart(area, key, upload, body)
        chosen = parse_complete(body)
        parts = [(n, etag, size) for (n, etag), size in zip(chosen, staged.parts, strict=False)]
        intake = await self._cache.join(target.bucket, target.key, upload, parts)
        try:
            etag = await self._accel.commit(target, headers, staged, {}, intake)
        except BaseException:
            await intake.drop()
            raise
        await self._cache.forget(
            target.bucket, [part_name(target.key, upload, n) for n, *_ in parts]
        )
        await self._catalog.forget_upload(upload_id)
        return _xml(
            "CompleteMultipartUploadResult",
            f"<Location>/{escape(target.bucket)}/{escape(target.key)}</Location>"
            f"<Bucket>{escape(target.bucket)}</Bucket><Key>{escape(target.key)}</Key>"
            f"<ETag>{escape(etag)}</ETag>",
        )

    async def abort(self, target: Target, upload_id: str) -> web.StreamResponse:
        key, upload, _, area = await self._open(target, upload_id)
        try:
            await area.abort_multipart(key, upload)
        except S3Error as exc:
            if exc.code != "NoSuchUpload":
                raise
            # Staging has no parts left (a completion that failed after joining them): the
            # catalog's record is all that is left of it, and it goes too.
        await self._catalog.forget_upload(upload_id)
        return web.Response(status=204)

    async def list_uploads(
        self, request: web.BaseRequest, target: Target, origin: OriginClient
    ) -> web.StreamResponse | None:
        """ListMultipartUploads: the catalog's accelerated uploads merged with the origin's
        own, in (key, upload id) order; None (pass through) when the catalog has none."""
        query = request.query
        if "delimiter" in query:
            return None  # grouping by prefixes is the origin's
        prefix = query.get("prefix", "")
        after = (query.get("key-marker", ""), query.get("upload-id-marker", ""))
        limit = min(1000, _number(query.get("max-uploads", "1000"), "max-uploads"))
        mine = await self._catalog.list_uploads(target.bucket, prefix, after, limit + 1)
        if not mine:
            return None
        found = [Upload(r.key, r.upload_id, iso(r.created_at)) for r in mine]
        found += await _origin_uploads(origin, target.bucket, list(query.items()))
        found = sorted((u for u in found if (u.key, u.upload_id) > after), key=_order)
        body = list_uploads_result(target.bucket, prefix, found[:limit], len(found) > limit, limit)
        return web.Response(body=body, content_type="application/xml")


async def _origin_uploads(
    origin: OriginClient, bucket: str, query: list[tuple[str, str]]
) -> list[Upload]:
    async with origin.request("GET", bucket, "", query=[("uploads", ""), *query]) as reply:
        body = await reply.read()
        if reply.status != 200:
            raise refusal(f"listing uploads of {bucket}", reply.status, body)
    return parse_uploads(body)[0]


def _order(upload: Upload) -> tuple[str, str]:
    return upload.key, upload.upload_id


def _xml(name: str, inner: str) -> web.Response:
    body = f'<?xml version="1.0" encoding="UTF-8"?>\n<{name} xmlns="{S3_NS}">{inner}</{name}>'
    return web.Response(body=body.encode(), content_type="application/xml")


def _number(value: str, name: str) -> int:
    if not value.isdigit():
        raise S3Error("InvalidArgument", f"{name} must be a whole number.")
    return int(value)


def encode_upload_id(
    staging_key: str, upload: str, headers: Mapping[str, str], root: str = ""
) -> str:
    """An UploadId that carries the staging key, the staging upload, the object's headers
    and where it is staged (the staging area's root location), so any node can take it."""
    keep = {
        k.lower(): v
        for k, v in headers.items()
        if k.lower() in STORED_HEADERS
        or k.lower() == "content-type"
        or k.lower().startswith("x-amz-meta-")
    }
    raw = json.dumps({"k": staging_key, "u": upload, "h": keep, "a": root}, separators=(",", ":"))
    return UPLOAD_ID_TAG + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_upload_id(upload_id: str) -> tuple[str, str, dict[str, str], str]:
    """(staging key, staging upload, headers, staging area root) of an UploadId of ours."""
    if not upload_id.startswith(UPLOAD_ID_TAG):
        raise S3Error("NoSuchUpload")
    try:
        text = upload_id[len(UPLOAD_ID_TAG) :]
        data = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
        headers = {str(k): str(v) for k, v in data["h"].items()}
        return str(data["k"]), str(data["u"]), headers, str(data.get("a", ""))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not ours, or forged
        raise S3Error("NoSuchUpload") from exc


def is_accelerated_upload(upload_id: str) -> bool:
    return upload_id.startswith(UPLOAD_ID_TAG)
