"""The lifecycle engine's two ends at the origin: listing a bucket (:class:`OriginListing`)
and rewriting an object in another storage class (:class:`OriginMover`).

A transition copies the object onto itself with the new ``x-amz-storage-class``
(CopyObject, metadata and tags directives ``COPY``; over 5 GiB a multipart copy that
carries them over explicitly), conditional on the ETag the listing showed.
"""

from __future__ import annotations

import contextlib
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from email.utils import parsedate_to_datetime
from urllib.parse import quote

from lota.errors import OriginError
from lota.http import uri_encode
from lota.lifecycle.rules import Decision, ObjectInfo
from lota.regions.origin import OriginClient
from lota.regions.origin_pages import origin_pages
from lota.s3.errors import S3Error
from lota.s3.xml import S3_NS_PREFIX

COPY_LIMIT = 5 * 1024**3  # the largest object one CopyObject may copy
PART_SIZE = 512 * 1024**2
# What a multipart copy must carry over by hand (CopyObject keeps it by itself).
_KEPT_HEADERS = (
    "content-type",
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
    "x-amz-website-redirect-location",
    "x-amz-server-side-encryption",
    "x-amz-server-side-encryption-aws-kms-key-id",
)


def parse_time(text: str) -> float:
    """S3's ``2024-05-01T12:00:00.000Z`` as seconds since the epoch."""
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError as exc:
        raise OriginError(f"origin listing has a bad LastModified {text!r}") from exc


class OriginListing:
    """:class:`ListingSource` over the origins' ListObjectsV2."""

    def __init__(self, origin_for: Callable[[str], OriginClient]) -> None:
        self._origin_for = origin_for

    async def pages(self, bucket: str, prefix: str) -> AsyncIterator[list[ObjectInfo]]:
        try:
            async for page in origin_pages(self._origin_for(bucket), bucket, prefix):
                yield [
                    ObjectInfo(
                        bucket, e.key, e.size, parse_time(e.last_modified), e.storage_class, e.etag
                    )
                    for e in page
                ]
        except S3Error as exc:  # the origin refused: the run fails, as when it is down
            raise OriginError(
                f"listing {bucket}/{prefix} at the origin: {exc.status} {exc.code}"
            ) from exc

    async def one(self, bucket: str, key: str) -> ObjectInfo | None:
        """One object as a listing would show it (a HEAD); None if there is none."""
        async with self._origin_for(bucket).request("HEAD", bucket, key) as reply:
            if reply.status == 404:
                return None
            if reply.status != 200:
                raise OriginError(f"HEAD {bucket}/{key}: {reply.status}")
            headers = reply.headers
            modified = parsedate_to_datetime(headers.get("last-modified", "")).timestamp()
            return ObjectInfo(
                bucket,
                key,
                int(headers.get("content-length", "0")),
                modified,
                headers.get("x-amz-storage-class", "STANDARD"),
                headers.get("etag", ""),
            )


class OriginMover:
    """:class:`Mover` that copies objects onto themselves at their origin."""

    def __init__(
        self,
        origin_for: Callable[[str], OriginClient],
        *,
        copy_limit: int = COPY_LIMIT,
        part_size: int = PART_SIZE,
    ) -> None:
        self._origin_for = origin_for
        self._copy_limit = copy_limit
        self._part_size = part_size

    async def check(self, decision: Decision) -> str | None:
        headers = await self._head(decision)
        if headers is None:
            return "deleted since listed"
        storage_class = headers.get("x-amz-storage-class", "STANDARD")
        etag = headers.get("etag", "").strip('"')
        if storage_class != decision.from_class or etag != decision.etag.strip('"'):
            return "changed since listed"
        return None

    async def copy(self, decision: Decision) -> str | None:
        if decision.size <= self._copy_limit:
            return await self._copy_object(decision)
        return await self._copy_parts(decision)

    async def _head(self, d: Decision) -> dict[str, str] | None:
        async with self._origin_for(d.bucket).request("HEAD", d.bucket, d.key) as reply:
            if reply.status == 404:
                return None
            if reply.status != 200:
                raise OriginError(f"HEAD {d.bucket}/{d.key}: {reply.status}")
            return {k.lower(): v for k, v in reply.headers.items()}

    def _source(self, d: Decision) -> dict[str, str]:
        headers = {
            "x-amz-copy-source": f"/{uri_encode(d.bucket, keep_slash=False)}/"
            + uri_encode(d.key, keep_slash=True)
        }
        if d.etag:
            headers["x-amz-copy-source-if-match"] = d.etag
        return headers

    async def _copy_object(self, d: Decision) -> str | None:
        headers = self._source(d) | {
            "x-amz-metadata-directive": "COPY",
            "x-amz-tagging-directive": "COPY",
            "x-amz-storage-class": d.storage_class,
        }
        async with self._origin_for(d.bucket).request(
            "PUT", d.bucket, d.key, headers=headers
        ) as reply:
            body = await reply.read()
        if reply.status == 412:
            return "changed since listed"
        # CopyObject may fail after its 200 status line: the body is then an <Error>.
        if reply.status != 200 or b"<Error>" in body:
            raise OriginError(f"copy {d.bucket}/{d.key} to {d.storage_class}: {body[:300]!r}")
        return None

    async def _copy_parts(self, d: Decision) -> str | None:
        """A multipart copy (objects over 5 GiB), carrying metadata and tags over by hand."""
        origin = self._origin_for(d.bucket)
        head = await self._head(d)
        if head is None:
            return "deleted since listed"
        headers = {
            k: v for k, v in head.items() if k in _KEPT_HEADERS or k.startswith("x-amz-meta-")
        }
        headers["x-amz-storage-class"] = d.storage_class
        if tags := await self._tags(d):
            headers["x-amz-tagging"] = tags
        async with origin.request(
            "POST", d.bucket, d.key, query=[("uploads", "")], headers=headers
        ) as reply:
            body = await reply.read()
            if reply.status != 200:
                raise OriginError(f"multipart copy {d.bucket}/{d.key}: {body[:300]!r}")
        upload = _xml(body).findtext(f"{S3_NS_PREFIX}UploadId", "")
        try:
            parts = [
                await self._copy_part(d, upload, number, start)
                for number, start in enumerate(range(0, d.size, self._part_size), 1)
            ]
            complete = "".join(
                f"<Part><PartNumber>{n}</PartNumber><ETag>{etag}</ETag></Part>"
                for n, etag in enumerate(parts, 1)
            )
            xml = f"<CompleteMultipartUpload>{complete}</CompleteMultipartUpload>".encode()
            query = [("uploadId", upload)]
            async with origin.request("POST", d.bucket, d.key, query=query, body=xml) as reply:
                body = await reply.read()
            if reply.status != 200 or b"<Error>" in body:
                raise OriginError(f"completing copy of {d.bucket}/{d.key}: {body[:300]!r}")
        except BaseException:
            with contextlib.suppress(OriginError):
                async with origin.request("DELETE", d.bucket, d.key, query=[("uploadId", upload)]):
                    pass
            raise
        return None

    async def _copy_part(self, d: Decision, upload: str, number: int, start: int) -> str:
        end = min(start + self._part_size, d.size) - 1
        headers = self._source(d) | {"x-amz-copy-source-range": f"bytes={start}-{end}"}
        query = [("partNumber", str(number)), ("uploadId", upload)]
        async with self._origin_for(d.bucket).request(
            "PUT", d.bucket, d.key, query=query, headers=headers
        ) as reply:
            body = await reply.read()
        if reply.status != 200 or b"<Error>" in body:
            raise OriginError(f"copying part {number} of {d.bucket}/{d.key}: {body[:300]!r}")
        return _xml(body).findtext(f"{S3_NS_PREFIX}ETag", "")

    async def _tags(self, d: Decision) -> str:
        tags = await OriginTags(self._origin_for).tags(d.bucket, d.key)
        return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in tags.items())


class OriginTags:
    """An object's tags, read with GetObjectTagging (the engine's tag filters)."""

    def __init__(self, origin_for: Callable[[str], OriginClient]) -> None:
        self._origin_for = origin_for

    async def tags(self, bucket: str, key: str) -> dict[str, str]:
        """Its tags; none for an object gone since it was listed."""
        async with self._origin_for(bucket).request(
            "GET", bucket, key, query=[("tagging", "")]
        ) as reply:
            body = await reply.read()
        if reply.status == 404:
            return {}
        if reply.status != 200:
            raise OriginError(f"tags of {bucket}/{key}: {reply.status} {body[:200]!r}")
        return {
            tag.findtext(f"{S3_NS_PREFIX}Key", ""): tag.findtext(f"{S3_NS_PREFIX}Value", "")
            for tag in _xml(body).iter(f"{S3_NS_PREFIX}Tag")
        }


def _xml(body: bytes) -> ET.Element:
    try:
        return ET.fromstring(body)
    except ET.ParseError as exc:
        raise OriginError(f"origin answered with bad XML: {body[:200]!r}") from exc
