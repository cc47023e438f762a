"""A version on its way home, as a :class:`~lota.cache.source.ChunkSource`: its bytes from
where it is staged, its headers from the catalog.

The origin has not got an accelerated write until it has migrated, so reads of it are the
catalog's (:mod:`lota.regions.writes`). On a node with a cache they go through the cache
all the same (:meth:`lota.cache.reads.ReadPath.serve_version`), filled from this source
where it does not hold the bytes already (the writing node does: it kept them as they were
written); a node without a cache streams from it (:meth:`Accelerator.read`).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from contextlib import asynccontextmanager
from email.utils import formatdate

from prometheus_client import Counter

from lota.cache.source import SourceKind
from lota.catalog import CatalogObject
from lota.regions.location import Location
from lota.regions.staging import Staging
from lota.s3.errors import S3Error
from lota.s3.ranges import content_range, parse_range

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


def object_location(obj: CatalogObject) -> Location:
    """Where the bytes of a committed version are staged."""
    if obj.local_path:
        return Location.parse(obj.local_path)
    return Location("s3", obj.source_region, obj.staging_bucket, obj.staging_key)


def object_headers(obj: CatalogObject) -> dict[str, str]:
    """The headers a GET of `obj` answers with, but its length, range and checksums."""
    headers = {
        "etag": obj.etag,
        "last-modified": formatdate(obj.created_at, usegmt=True),
        "content-type": obj.content_type,
        "accept-ranges": "bytes",
    }
    headers.update((name, value) for name, value in obj.headers if name in REPLAYED)
    headers.update((f"x-amz-meta-{name}", value) for name, value in obj.metadata.items())
    return headers


class StagedReply:
    """One answer of a :class:`StagedSource` (a :class:`~lota.cache.source.SourceReply`)."""

    kind: SourceKind = "origin"

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        body: AsyncGenerator[bytes, None] | None = None,
        received: Counter | None = None,
    ) -> None:
        self.status = status
        self.headers: Mapping[str, str] = headers
        self._body = body
        self._received = received
        self._buffer = b""

    async def read(self, count: int) -> bytes:
        if not self._buffer and self._body is not None:
            self._buffer = await anext(self._body, b"")
            if self._received is not None:
                self._received.inc(len(self._buffer))
        piece, self._buffer = self._buffer[:count], self._buffer[count:]
        return piece

    async def pieces(self, size: int) -> AsyncIterator[bytes]:
        while piece := await self.read(size):
            yield piece

    async def close(self) -> None:
        if self._body is not None:
            await self._body.aclose()


class StagedSource:
    """One pending version (`obj`), read from its staging copy."""

    kind: SourceKind = "origin"

    def __init__(self, staging: Staging, obj: CatalogObject, received: Counter) -> None:
        self.name = obj.source_region or staging.region
        self._staging = staging
        self._obj = obj
        self._received = received

    @asynccontextmanager
    async def head(
        self, bucket: str, key: str, *, part: int | None = None, if_none_match: str = ""
    ) -> AsyncIterator[StagedReply]:
        obj = self._obj
        headers = object_headers(obj) | {"content-length": str(obj.size)}
        if if_none_match == obj.etag:
            yield StagedReply(304, headers)
        elif part is None:
            yield StagedReply(200, headers | obj.checksums)
        elif 1 <= part <= max(1, len(obj.parts)):
            sizes = obj.parts or (obj.size,)
            first = sum(sizes[: part - 1])
            last = first + sizes[part - 1] - 1
            headers["content-length"] = str(sizes[part - 1])
            headers["content-range"] = content_range(first, last, obj.size)
            headers["x-amz-mp-parts-count"] = str(len(obj.parts))
            yield StagedReply(206, headers)
        else:
            yield StagedReply(416, {})

    @asynccontextmanager
    async def get(
        self, bucket: str, key: str, *, byte_range: str = "", if_match: str = ""
    ) -> AsyncIterator[StagedReply]:
        obj = self._obj
        if if_match and if_match != obj.etag:
            yield StagedReply(412, {})
            return
        first, last, status = 0, obj.size - 1, 200
        wanted = parse_range(byte_range)
        if wanted is not None:
            try:
                first, last = wanted.resolve(obj.size)
            except S3Error:
                yield StagedReply(416, {"content-range": f"bytes */{obj.size}"})
                return
            status = 206
        headers = object_headers(obj) | {"content-length": str(max(0, last - first + 1))}
        if status == 206:
            headers["content-range"] = content_range(first, last, obj.size)
        else:
            headers |= obj.checksums
        body = None
        if last >= first:
            body = self._staging.read(object_location(obj), first, last)
        reply = StagedReply(status, headers, body, self._received)
        try:
            yield reply
        finally:
            await reply.close()
