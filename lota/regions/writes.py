"""The requests the catalog decides, when write acceleration is on.

* Writes to a bucket homed in another region — or to a key whose latest version is still
  pending, so that commit order stays the truth — are accelerated
  (:mod:`lota.regions.accelerate`).
* GET and HEAD of a key whose latest version has not reached its home region are served
  from staging; a pending delete answers 404.
* Listings of a bucket with pending versions merge them into the origin's listing
  (:mod:`lota.regions.listing`).

Everything else falls through (``None``) to the cache and pass-through paths.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from lota.auth.body import BodyDecoder
from lota.catalog import Catalog, CatalogObject
from lota.config import Config
from lota.regions.accelerate import Accelerator
from lota.regions.listing import (
    Entry,
    ListRequest,
    Merger,
    Override,
    is_lota_token,
    render,
)
from lota.regions.origin import OriginClient
from lota.regions.origin_pages import origin_page
from lota.regions.origins import Origins
from lota.regions.pending import PendingKeys
from lota.regions.uploads import Uploads, is_accelerated_upload
from lota.s3.addressing import Target
from lota.s3.errors import S3Error
from lota.s3.operations import Op, Operation
from lota.s3.xml import DeleteRequest, delete_result

log = logging.getLogger("lota.writes")

_UPLOAD_CALLS = frozenset(
    {
        Op.UPLOAD_PART,
        Op.COMPLETE_MULTIPART_UPLOAD,
        Op.ABORT_MULTIPART_UPLOAD,
        Op.LIST_PARTS,
        Op.UPLOAD_PART_COPY,
    }
)
_WRITES = frozenset({Op.PUT_OBJECT, Op.COPY_OBJECT, Op.DELETE_OBJECT, Op.CREATE_MULTIPART_UPLOAD})


def _still_migrating() -> S3Error:
    return S3Error(
        "ServiceUnavailable",
        "An earlier write of this key is still on its way to its home region; retry shortly.",
    )


class RegionalRouter:
    """Routes the operations the catalog has a say in."""

    def __init__(
        self,
        config: Config,
        catalog: Catalog,
        accelerator: Accelerator,
        origins: Origins,
        pending: PendingKeys,
    ) -> None:
        self._config = config
        self.catalog = catalog
        self.pending = pending
        self.accelerator = accelerator
        self.uploads = Uploads(accelerator, config.body_timeout)
        self._origins = origins

    async def read(self, request: web.BaseRequest, target: Target) -> web.StreamResponse | None:
        """A GET or HEAD of a key whose latest version is still on its way home is answered
        from where it is staged; None for every other read. Only a key the mirror of
        pending keys holds is asked for (:mod:`lota.regions.pending`)."""
        if "versionId" in request.query:
            return None
        bucket, key = target.bucket, target.key
        if not await self.pending.may_be_pending(bucket, key):
            return None
        heard = self.pending.mark(bucket, key)
        latest = await self.catalog.get_object(bucket, key)
        if latest is not None and latest.pending:
            return await self.accelerator.read(request, target, latest)
        self.pending.settled(bucket, key, heard)
        return None

    async def handle(
        self,
        request: web.BaseRequest,
        target: Target,
        operation: Operation,
        decoder: BodyDecoder,
    ) -> web.StreamResponse | None:
        """Any other operation the catalog has a say in; None when it has none."""
        name = operation.name
        if name in (Op.LIST_OBJECTS, Op.LIST_OBJECTS_V2):
            return await self._list(request, target, name)
        if name == Op.LIST_MULTIPART_UPLOADS:
            origin = self._origins.for_bucket(target.bucket)
            return await self.uploads.list_uploads(request, target, origin)
        if name in _UPLOAD_CALLS:
            upload_id = request.query.get("uploadId", "")
            if is_accelerated_upload(upload_id):
                return await self._upload_call(request, target, operation, decoder, upload_id)
            if name == Op.COMPLETE_MULTIPART_UPLOAD and await self._pending(
                target.bucket, target.key
            ):
                # An upload that went straight home, completed while an earlier write is
                # still on its way: that write would land after it and undo it.
                raise _still_migrating()
            return None
        if name in _WRITES and await self._accelerates(target):
            return await self._write(request, target, operation, decoder)
        return None

    async def _pending(self, bucket: str, key: str) -> bool:
        """Whether the key's latest version has not reached its home region yet."""
        latest = await self.catalog.get_object(bucket, key)
        return latest is not None and latest.pending

    async def _any_pending(self, bucket: str, keys: list[str]) -> bool:
        for key in keys:
            if await self._pending(bucket, key):
                return True
        return False

    async def _accelerates(self, target: Target) -> bool:
        return self._config.accelerated(target.bucket) or await self._pending(
            target.bucket, target.key
        )

    async def _write(
        self, request: web.BaseRequest, target: Target, operation: Operation, decoder: BodyDecoder
    ) -> web.StreamResponse:
        accel = self.accelerator
        if operation.name == Op.PUT_OBJECT:
            return await accel.put_object(request, target, decoder)
        if operation.name == Op.COPY_OBJECT:
            assert operation.copy_source is not None
            return await accel.copy_object(
                request, target, operation.copy_source, operation.copy_source_version
            )
        if operation.name == Op.DELETE_OBJECT:
            return await accel.delete_object(target)
        return await self.uploads.create(request, target)

    async def _upload_call(
        self,
        request: web.BaseRequest,
        target: Target,
        operation: Operation,
        decoder: BodyDecoder,
        upload_id: str,
    ) -> web.StreamResponse:
        uploads, name = self.uploads, operation.name
        if name in (Op.UPLOAD_PART, Op.UPLOAD_PART_COPY):
            number = request.query.get("partNumber", "")
            if not number.isdigit() or not 1 <= int(number) <= 10000:
                raise S3Error(
                    "InvalidArgument", "Part number must be an integer between 1 and 10000"
                )
            if name == Op.UPLOAD_PART:
                return await uploads.upload_part(request, target, decoder, upload_id, int(number))
            assert operation.copy_source is not None
            return await uploads.upload_part_copy(
                request,
                target,
                upload_id,
                int(number),
                operation.copy_source,
                operation.copy_source_version,
            )
        if name == Op.COMPLETE_MULTIPART_UPLOAD:
            return await uploads.complete(request, target, decoder, upload_id)
        if name == Op.LIST_PARTS:
            return await uploads.list_parts(request, target, upload_id)
        return await uploads.abort(target, upload_id)

    async def delete_objects(self, target: Target, deletes: DeleteRequest) -> bytes | None:
        """DeleteObjects of the (authorized) entries, as a DeleteResult; None when the
        catalog has no say. Like DeleteObject: in the catalog if the bucket is far or any
        key has a version still on its way home (a delete sent home past it would be
        undone by it)."""
        keys = [entry.key for entry in deletes.entries]
        if not self._config.accelerated(target.bucket) and not await self._any_pending(
            target.bucket, keys
        ):
            return None
        for key in keys:
            await self.catalog.commit_delete(target.bucket, key)
        return delete_result(() if deletes.quiet else deletes.entries)

    async def _list(
        self, request: web.BaseRequest, target: Target, name: str
    ) -> web.StreamResponse | None:
        wanted = ListRequest.from_query(target.bucket, list(request.query.items()))
        # A listing goes on where its first page was made: an origin's continuation token
        # back to the origin, one of LOTA's to the merger, whatever the catalog holds now.
        if wanted.continuation_token:
            if not is_lota_token(wanted.continuation_token):
                return None
        elif not await self.catalog.list_objects(target.bucket, wanted.prefix, "", 1):
            return None  # no key of the catalog's under this prefix: the origin's list is true
        origin = self._origins.for_bucket(target.bucket)
        body = await merged_listing(wanted, origin, self.catalog)
        return web.Response(body=body, content_type="application/xml")


CATALOG_PAGE = 1000


async def merged_listing(wanted: ListRequest, origin: OriginClient, catalog: Catalog) -> bytes:
    """Drive a :class:`Merger` with catalog pages and origin pages until it has a page."""
    merger = Merger(wanted)
    while (page := merger.page) is None:
        if (after := merger.needs_overrides_after()) is not None:
            rows = await catalog.list_objects(wanted.bucket, wanted.prefix, after, CATALOG_PAGE)
            # Migrated versions are the origin's to list (it may have changed them since).
            merger.feed_overrides(
                [_override(r) for r in rows if r.pending],
                complete=len(rows) < CATALOG_PAGE,
                last_key=rows[-1].key if rows else None,
            )
        elif (after := merger.needs_origin_after()) is not None:
            found = await origin_page(origin, wanted.bucket, wanted.prefix, start_after=after)
            merger.feed_origin(found.contents, truncated=found.truncated)
    return render(wanted, page.contents, page.prefixes, page.truncated, page.next_after)


def _override(obj: CatalogObject) -> Override:
    """What the catalog says about a key: a tombstone hides it, a version shows it."""
    if obj.deleted:
        return Override(obj.key, None)
    modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(obj.created_at))
    return Override(obj.key, Entry(obj.key, obj.size, obj.etag, modified))
