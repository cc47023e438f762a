"""Fenced writes to a version's home region: what the migrator does with a version it holds.

A version moves the way it was written, so it keeps the ETag its writer was given: a single
PUT as one PUT with Content-MD5 (the home region checks it), a multipart upload as a
multipart upload with the same part boundaries (the home ETag, MD5 of the part MD5s, then
equals the staged one, which checks every part). A delete moves as a delete.

Fencing: a migrator whose lease ran out mid-copy (a stalled process, a partition) may still
be copying when a newer version of the key is committed, claimed by another node and
landed. Its copy must not land over that one. So, for each version:

1. it asks the home what it holds now (HEAD: an ETag, or nothing);
2. it checks the catalog: a newer version committed meanwhile means this one is done for
   (:class:`Superseded`; that one migrates instead);
3. it writes conditionally on what it saw (``If-Match`` that ETag, or ``If-None-Match: *``:
   PutObject, CompleteMultipartUpload and DeleteObject, as S3 honours them): a newer
   version landed since step 1 makes the origin refuse (:class:`Fenced`, retried later,
   when step 2 finds the newer one);
4. after the write, it checks the catalog again: if a newer version had reached home before
   it (possible only at an origin that ignores conditional writes), that one is made
   pending again so that it lands last (``requeued``).

A multipart copy does steps 1 and 2 again just before its completion, which is when its
object lands. The calls without a body (HEAD, CreateMultipartUpload, its completion and
abort, DeleteObject) go through the control plane (:mod:`lota.regions.control`); the
bodies (PutObject, UploadPart) stream from staging through the data path's client.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from lota.catalog import Catalog, CatalogObject
from lota.errors import LotaError, OriginError
from lota.metrics import Metrics
from lota.regions.accelerate import md5_base64
from lota.regions.control import ControlPlane, translated
from lota.regions.origin import OriginClient
from lota.regions.staged import object_location
from lota.regions.staging import Staging
from lota.s3.errors import S3Error

log = logging.getLogger("lota.migrator")

# Stored request headers (lota.regions.staged.STORED_HEADERS) as CreateMultipartUpload's
# parameters.
_CREATE_PARAMS = {
    "cache-control": "CacheControl",
    "content-disposition": "ContentDisposition",
    "content-encoding": "ContentEncoding",
    "content-language": "ContentLanguage",
    "expires": "Expires",
    "x-amz-website-redirect-location": "WebsiteRedirectLocation",
    "x-amz-tagging": "Tagging",
    "x-amz-storage-class": "StorageClass",
}

Paced = Callable[[AsyncIterator[bytes]], AsyncIterator[bytes]]


class Superseded(LotaError):
    """A newer version of the key was committed: this one need not go home."""


class Fenced(LotaError):
    """The home origin refused a conditional write: what it holds changed since it was
    asked (a newer version landed). Retried: the catalog then says which version wins."""


class Home:
    """Copies pending versions to their home origin, fenced (see the module docstring)."""

    def __init__(
        self,
        catalog: Catalog,
        staging: Staging,
        origin_for: Callable[[str], OriginClient],
        control: ControlPlane,
        metrics: Metrics,
        part_concurrency: int,
    ) -> None:
        self._catalog = catalog
        self._control = control
        self._staging = staging
        self._origin_for = origin_for
        self._metrics = metrics
        self._part_concurrency = part_concurrency

    async def move(self, obj: CatalogObject, paced: Paced) -> None:
        """Write `obj` home (or delete it there); raises Superseded, Fenced, OriginError."""
        held = await self._fence(obj)
        if obj.deleted:
            await self._delete(obj, held)
        elif obj.parts:
            await self._copy_multipart(obj, paced)
        else:
            await self._copy_single(obj, held, paced)
        await self._after(obj)

    async def _fence(self, obj: CatalogObject) -> str | None:
        """Steps 1 and 2: what the home holds now (an ETag, None: nothing), if `obj` is
        still the latest version."""
        client = await self._control.for_bucket(obj.bucket)
        try:
            async with translated(f"home HEAD of {obj.bucket}/{obj.key}"):
                held: str | None = (await client.head_object(Bucket=obj.bucket, Key=obj.key))[
                    "ETag"
                ]
        except S3Error as exc:
            if exc.status != 404:
                raise OriginError(f"home HEAD answered {exc.status} {exc.code}") from exc
            held = None
        latest = await self._catalog.get_object(obj.bucket, obj.key)
        if latest is None or latest.seq != obj.seq:
            raise Superseded(f"{obj.bucket}/{obj.key} v{obj.seq} has a newer version")
        return held

    async def _after(self, obj: CatalogObject) -> None:
        """Step 4: a newer version already home before this write lands again after it."""
        latest = await self._catalog.get_object(obj.bucket, obj.key)
        if latest is None or latest.seq == obj.seq or latest.pending or latest.etag == obj.etag:
            return
        if await self._catalog.requeue_migration(latest.bucket, latest.key, latest.seq):
            self._metrics.migration_fenced.labels("requeued").inc()
            log.warning(
                "%s/%s v%d landed after v%d at home: v%d goes home again",
                obj.bucket,
                obj.key,
                obj.seq,
                latest.seq,
                latest.seq,
            )
        else:
            log.error(
                "%s/%s v%d landed after v%d at home, and v%d's staging copy is gone: the "
                "home holds the older version",
                obj.bucket,
                obj.key,
                obj.seq,
                latest.seq,
                latest.seq,
            )

    def _headers(self, obj: CatalogObject) -> dict[str, str]:
        headers = {"content-type": obj.content_type, **dict(obj.headers)}
        headers.update({f"x-amz-meta-{k}": v for k, v in obj.metadata.items()})
        return headers

    async def _copy_single(self, obj: CatalogObject, held: str | None, paced: Paced) -> None:
        headers = self._headers(obj) | _condition(held)
        headers["content-length"] = str(obj.size)
        headers["content-md5"] = md5_base64(obj.etag)
        headers.update(obj.checksums)
        body = paced(self._staging.read(object_location(obj)))
        async with self._origin_for(obj.bucket).request(
            "PUT", obj.bucket, obj.key, headers=headers, body=body
        ) as reply:
            answer = await reply.read()
            _check_fence(reply.status, "PUT")
            if reply.status != 200:
                raise OriginError(f"home PUT answered {reply.status}: {answer[:300]!r}")
            if reply.headers.get("etag", "") != obj.etag:
                raise OriginError(f"home ETag {reply.headers.get('etag')} != {obj.etag}")

    async def _copy_multipart(self, obj: CatalogObject, paced: Paced) -> None:
        origin, client = self._origin_for(obj.bucket), await self._control.for_bucket(obj.bucket)
        where = {"Bucket": obj.bucket, "Key": obj.key}
        async with translated(f"home CreateMultipartUpload of {obj.bucket}/{obj.key}"):
            created = await client.create_multipart_upload(**where, **_created(obj))
        upload = created["UploadId"]
        try:
            etags = await self._upload_parts(origin, obj, upload, paced)
            held = await self._fence(obj)  # the object lands with the completion
            parts = [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]
            async with _fenced("CompleteMultipartUpload"):
                done = await client.complete_multipart_upload(
                    **where, UploadId=upload, MultipartUpload={"Parts": parts}, **_if(held)
                )
            if done.get("ETag") != obj.etag:
                raise OriginError(f"home ETag {done.get('ETag')} != {obj.etag}")
        except BaseException:
            with contextlib.suppress(S3Error, OriginError):
                async with translated("aborting a home upload"):
                    await client.abort_multipart_upload(**where, UploadId=upload)
            raise

    async def _upload_parts(
        self, origin: OriginClient, obj: CatalogObject, upload: str, paced: Paced
    ) -> list[str]:
        slots = asyncio.Semaphore(self._part_concurrency)
        location = object_location(obj)
        offsets = [sum(obj.parts[:i]) for i in range(len(obj.parts))]

        async def part(number: int) -> str:
            async with slots:
                first = offsets[number - 1]
                size = obj.parts[number - 1]
                body = paced(self._staging.read(location, first, first + size - 1))
                async with origin.request(
                    "PUT",
                    obj.bucket,
                    obj.key,
                    query=[("partNumber", str(number)), ("uploadId", upload)],
                    headers={"content-length": str(size)},
                    body=body,
                ) as reply:
                    await reply.read()
                    if reply.status != 200:
                        raise OriginError(f"home UploadPart {number} answered {reply.status}")
                    return reply.headers.get("etag", "")

        return list(await asyncio.gather(*(part(n) for n in range(1, len(obj.parts) + 1))))

    async def _delete(self, obj: CatalogObject, held: str | None) -> None:
        if held is None:
            return  # nothing there to delete
        client = await self._control.for_bucket(obj.bucket)
        async with _fenced("DELETE"):
            await client.delete_object(Bucket=obj.bucket, Key=obj.key, IfMatch=held)


def _created(obj: CatalogObject) -> dict[str, Any]:
    """CreateMultipartUpload's parameters for the headers `obj` was written with."""
    headers = dict(obj.headers)
    params: dict[str, Any] = {"ContentType": obj.content_type, "Metadata": dict(obj.metadata)}
    params.update((name, headers[h]) for h, name in _CREATE_PARAMS.items() if h in headers)
    return params


def _if(held: str | None) -> dict[str, str]:
    """Only if the home still holds what it held when asked."""
    return {"IfMatch": held} if held is not None else {"IfNoneMatch": "*"}


@contextlib.asynccontextmanager
async def _fenced(what: str) -> AsyncIterator[None]:
    try:
        async with translated(f"home {what}"):
            yield
    except S3Error as exc:
        _check_fence(exc.status, what)
        raise OriginError(f"home {what} answered {exc.status} {exc.code}") from exc


def _condition(held: str | None) -> dict[str, str]:
    """The write happens only if the home still holds what it held when asked."""
    return {"if-match": held} if held is not None else {"if-none-match": "*"}


def _check_fence(status: int, what: str) -> None:
    # 412 PreconditionFailed; 409 ConditionalRequestConflict (S3: a concurrent write).
    if status in (409, 412):
        raise Fenced(f"home {what} refused: the home object changed since it was asked")
