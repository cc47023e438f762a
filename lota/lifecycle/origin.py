"""The lifecycle engine's ends at the origin: listing a bucket (:class:`OriginListing`),
rewriting an object in another storage class (:class:`OriginMover`) and reading its tags
(:class:`OriginTags`), all through the control plane's aiobotocore clients
(:mod:`lota.regions.control`: their paginators, retries and error parsing).

A transition copies the object onto itself with the new storage class (CopyObject,
metadata and tags directives ``COPY``; over 5 GiB a multipart copy that carries them over
explicitly), conditional on the ETag the listing showed.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from lota.errors import OriginError
from lota.lifecycle.rules import Decision, ObjectInfo
from lota.regions.control import ControlPlane, translated
from lota.s3.errors import S3Error

COPY_LIMIT = 5 * 1024**3  # the largest object one CopyObject may copy
PART_SIZE = 512 * 1024**2
# What a multipart copy must carry over by hand (CopyObject keeps it by itself).
_KEPT = (
    "ContentType",
    "ContentEncoding",
    "ContentDisposition",
    "ContentLanguage",
    "CacheControl",
    "Expires",
    "WebsiteRedirectLocation",
    "ServerSideEncryption",
    "SSEKMSKeyId",
    "Metadata",
)


class OriginListing:
    """:class:`ListingSource` over the origins' ListObjectsV2 (botocore's paginator)."""

    def __init__(self, control: ControlPlane) -> None:
        self._control = control

    async def pages(self, bucket: str, prefix: str) -> AsyncIterator[list[ObjectInfo]]:
        client = await self._control.for_bucket(bucket)
        pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        try:
            async with translated(f"listing {bucket}/{prefix}"):
                async for page in pages:
                    yield [_listed(bucket, entry) for entry in page.get("Contents", [])]
        except S3Error as exc:  # the origin refused: the run fails, as when it is down
            raise OriginError(
                f"listing {bucket}/{prefix} at the origin: {exc.status} {exc.code}"
            ) from exc

    async def one(self, bucket: str, key: str) -> ObjectInfo | None:
        """One object as a listing would show it (a HEAD); None if there is none."""
        head = await _head(self._control, bucket, key)
        if head is None:
            return None
        return ObjectInfo(
            bucket,
            key,
            int(head["ContentLength"]),
            head["LastModified"].timestamp(),
            head.get("StorageClass", "STANDARD"),
            head.get("ETag", ""),
        )


def _listed(bucket: str, entry: dict[str, Any]) -> ObjectInfo:
    return ObjectInfo(
        bucket,
        entry["Key"],
        int(entry["Size"]),
        entry["LastModified"].timestamp(),
        entry.get("StorageClass", "STANDARD"),
        entry.get("ETag", ""),
    )


async def _head(control: ControlPlane, bucket: str, key: str) -> dict[str, Any] | None:
    client = await control.for_bucket(bucket)
    try:
        async with translated(f"HEAD {bucket}/{key}"):
            return dict(await client.head_object(Bucket=bucket, Key=key))
    except S3Error as exc:
        if exc.status == 404:
            return None
        raise OriginError(f"HEAD {bucket}/{key}: {exc.status} {exc.code}") from exc


class OriginMover:
    """:class:`Mover` that copies objects onto themselves at their origin."""

    def __init__(
        self,
        control: ControlPlane,
        *,
        copy_limit: int = COPY_LIMIT,
        part_size: int = PART_SIZE,
    ) -> None:
        self._control = control
        self._copy_limit = copy_limit
        self._part_size = part_size

    async def check(self, decision: Decision) -> str | None:
        head = await _head(self._control, decision.bucket, decision.key)
        if head is None:
            return "deleted since listed"
        storage_class = head.get("StorageClass", "STANDARD")
        etag = head.get("ETag", "").strip('"')
        if storage_class != decision.from_class or etag != decision.etag.strip('"'):
            return "changed since listed"
        return None

    async def copy(self, decision: Decision) -> str | None:
        try:
            if decision.size <= self._copy_limit:
                await self._copy_object(decision)
            else:
                await self._copy_parts(decision)
        except S3Error as exc:
            if exc.status == 412:
                return "changed since listed"
            if exc.status == 404:
                return "deleted since listed"
            raise OriginError(f"copying {decision.bucket}/{decision.key}: {exc}") from exc
        return None

    def _source(self, d: Decision) -> dict[str, Any]:
        source: dict[str, Any] = {"CopySource": {"Bucket": d.bucket, "Key": d.key}}
        if d.etag:
            source["CopySourceIfMatch"] = d.etag
        return source

    async def _copy_object(self, d: Decision) -> None:
        client = await self._control.for_bucket(d.bucket)
        async with translated(f"copy {d.bucket}/{d.key} to {d.storage_class}"):
            await client.copy_object(
                Bucket=d.bucket,
                Key=d.key,
                MetadataDirective="COPY",
                TaggingDirective="COPY",
                StorageClass=d.storage_class,
                **self._source(d),
            )

    async def _copy_parts(self, d: Decision) -> None:
        """A multipart copy (objects over 5 GiB), carrying metadata and tags over by hand."""
        client = await self._control.for_bucket(d.bucket)
        head = await _head(self._control, d.bucket, d.key)
        if head is None:
            raise S3Error("NoSuchKey")
        kept = {name: head[name] for name in _KEPT if name in head}
        if tags := await OriginTags(self._control).tags(d.bucket, d.key):
            kept["Tagging"] = "&".join(
                f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in tags.items()
            )
        async with translated(f"multipart copy of {d.bucket}/{d.key}"):
            created = await client.create_multipart_upload(
                Bucket=d.bucket, Key=d.key, StorageClass=d.storage_class, **kept
            )
        upload = created["UploadId"]
        try:
            parts = [
                await self._copy_part(client, d, upload, number, start)
                for number, start in enumerate(range(0, d.size, self._part_size), 1)
            ]
            async with translated(f"completing the copy of {d.bucket}/{d.key}"):
                await client.complete_multipart_upload(
                    Bucket=d.bucket, Key=d.key, UploadId=upload, MultipartUpload={"Parts": parts}
                )
        except BaseException:
            with contextlib.suppress(S3Error, OriginError):
                async with translated("aborting a copy"):
                    await client.abort_multipart_upload(Bucket=d.bucket, Key=d.key, UploadId=upload)
            raise

    async def _copy_part(
        self, client: Any, d: Decision, upload: str, number: int, start: int
    ) -> dict[str, Any]:
        end = min(start + self._part_size, d.size) - 1
        async with translated(f"copying part {number} of {d.bucket}/{d.key}"):
            copied = await client.upload_part_copy(
                Bucket=d.bucket,
                Key=d.key,
                UploadId=upload,
                PartNumber=number,
                CopySourceRange=f"bytes={start}-{end}",
                **self._source(d),
            )
        return {"PartNumber": number, "ETag": copied["CopyPartResult"]["ETag"]}


class OriginTags:
    """An object's tags, read with GetObjectTagging (the engine's tag filters)."""

    def __init__(self, control: ControlPlane) -> None:
        self._control = control

    async def tags(self, bucket: str, key: str) -> dict[str, str]:
        """Its tags; none for an object gone since it was listed."""
        client = await self._control.for_bucket(bucket)
        try:
            async with translated(f"tags of {bucket}/{key}"):
                answer = await client.get_object_tagging(Bucket=bucket, Key=key)
        except S3Error as exc:
            if exc.status == 404:
                return {}
            raise OriginError(f"tags of {bucket}/{key}: {exc.status} {exc.code}") from exc
        return {tag["Key"]: tag["Value"] for tag in answer.get("TagSet", [])}
