"""Where accelerated writes wait for migration: the local region's staging bucket, or a
directory on this node (``staging = "local-disk"``, for single-node use).

A staged object is named by a :class:`Location` string that any node can parse:
``s3://REGION/BUCKET/KEY`` for bucket staging, ``file://NODE/PATH`` for local disk. Only
bucket staging survives the loss of the node and can be read from other nodes; local-disk
staging is as durable as that one disk and readable only where it was written.

:class:`Staging` writes to this node's :class:`StagingArea` (a bucket,
:mod:`lota.regions.staging_bucket`, or a directory, :mod:`lota.regions.staging_disk`), the
same calls for both: single objects, multipart uploads part for part (so the staged object
has the part boundaries, and so the ETag, its home copy will have), listings for the
orphan sweep, and the start-up check. It reads and deletes any location.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from lota.errors import OriginError
from lota.regions.control import ControlPlane
from lota.regions.location import Location
from lota.regions.multipart import PartsPage
from lota.regions.origin import OriginClient
from lota.regions.staging_bucket import BucketArea
from lota.regions.staging_disk import DiskArea
from lota.s3.errors import S3Error

STAGING_PREFIX = "lota-staging/"
READ_SIZE = 256 * 1024


@dataclass(frozen=True, slots=True)
class Staged:
    """A body written to staging: where, how big, its ETag as S3 gives it, without quotes
    (the MD5 of a single PUT; of a multipart upload, the MD5 of its parts' MD5s, ``-N``)."""

    location: Location
    size: int
    md5: str
    parts: tuple[int, ...] = ()
    """Part sizes, in order, of a multipart upload."""


@dataclass(frozen=True, slots=True)
class StagedEntry:
    """One staged object as the orphan sweep sees it: its key in the area (a staging key,
    or a path under the staging directory) and when it was written."""

    key: str
    modified: float


class StagingArea(Protocol):
    """Where this node stages: the calls both kinds of staging answer the same way."""

    where: str
    """The bucket's or directory's name, for messages."""

    def location(self, key: str) -> Location:
        """Where the object staged here as `key` is (``""``: the area's root)."""
        ...

    async def put(self, key: str, body: AsyncIterator[bytes], length: int) -> None: ...

    async def create_multipart(self, key: str) -> str: ...

    async def upload_part(
        self,
        key: str,
        upload: str,
        number: int,
        body: AsyncIterator[bytes],
        length: int,
        md5: Callable[[], str],
    ) -> None:
        """Stage one part; `md5` gives its MD5 once the body has been read."""
        ...

    async def list_parts(
        self, key: str, upload: str, marker: int = 0, limit: int = 1000
    ) -> PartsPage: ...

    async def complete_multipart(self, key: str, upload: str, body: bytes) -> tuple[str, list[int]]:
        """Complete with the client's part list: (the ETag, its part sizes)."""
        ...

    async def abort_multipart(self, key: str, upload: str) -> None: ...

    async def entries(self, after: str, limit: int) -> tuple[list[tuple[str, float]], str]:
        """Up to `limit` staged objects after key `after` (key, when written), and the key
        to go on after ("": that was the end)."""
        ...

    async def check(self, create: bool) -> str:
        """Why this staging cannot take writes ("" when it can); `create` makes a
        missing bucket."""
        ...


class Staging:
    """Writes to this node's staging area; reads and deletes any region's staged copies."""

    def __init__(
        self,
        *,
        node: str,
        region: str,
        origins: Mapping[str, OriginClient],
        staging_bucket: str = "",
        local_dir: str = "",
        control: ControlPlane | None = None,
    ) -> None:
        self.node = node
        self.region = region
        self._origins = origins
        self._bucket = staging_bucket
        self._disk = DiskArea(node, local_dir, STAGING_PREFIX) if local_dir else None
        self.area: StagingArea = self._disk or BucketArea(
            origins.get(region), region, staging_bucket, STAGING_PREFIX, control
        )

    @property
    def mode(self) -> str:
        return "local-disk" if self._disk is not None else "bucket"

    @property
    def bucket(self) -> str:
        return self._bucket

    @property
    def configured(self) -> bool:
        """Whether this node has somewhere to stage (a bucket or a directory)."""
        return bool(self._bucket) or self._disk is not None

    def location(self, key: str) -> Location:
        """Where the object this node staged as `key` is."""
        return self.area.location(key)

    def area_at(self, root: str) -> StagingArea:
        """The staging area whose root location is `root` (a multipart upload's, which
        may have been started on a node of another region): this node's, or the staging
        bucket of that region."""
        if not root or root == str(self.area.location("")):
            return self.area
        where = Location.parse(root)
        if where.scheme != "s3" or where.region_or_node not in self._origins:
            raise S3Error(
                "NoSuchUpload", "This upload is staged on another node's disk: send it there."
            )
        origin = self._origins[where.region_or_node]
        return BucketArea(origin, where.region_or_node, where.bucket, STAGING_PREFIX)

    def new_key(self, bucket: str) -> str:
        return f"{STAGING_PREFIX}{bucket}/{uuid.uuid4().hex}"

    async def put(self, bucket: str, body: AsyncIterator[bytes], length: int) -> Staged:
        """Stage a whole body; returns once it is durable (origin 200, or fsync'd file)."""
        md5, key = _Md5(), self.new_key(bucket)
        await self.area.put(key, md5.tee(body), length)
        return Staged(self.location(key), length, md5.hexdigest())

    async def upload_part(
        self,
        area: StagingArea,
        key: str,
        upload: str,
        number: int,
        body: AsyncIterator[bytes],
        length: int,
    ) -> str:
        """Stage one part; returns its MD5 hex (the part's ETag)."""
        md5 = _Md5()
        await area.upload_part(key, upload, number, md5.tee(body), length, md5.hexdigest)
        return md5.hexdigest()

    async def complete_multipart(
        self, area: StagingArea, key: str, upload: str, body: bytes
    ) -> Staged:
        etag, sizes = await area.complete_multipart(key, upload, body)
        return Staged(area.location(key), sum(sizes), etag.strip('"'), tuple(sizes))

    async def entries(self, after: str, limit: int) -> tuple[list[StagedEntry], str]:
        """Up to `limit` objects staged here, in key order after `after` (a key), and where
        the next call goes on from ("": the end); bounded, for the orphan sweep."""
        found, following = await self.area.entries(after, limit)
        return [StagedEntry(key, modified) for key, modified in found], following

    def name(self, key: str) -> str:
        """What the catalog names the copy staged here as `key` by."""
        return self.location(key).name

    async def check(self, create: bool) -> str:
        """Why this node cannot stage writes ("" when it can); see :meth:`StagingArea.check`."""
        return await self.area.check(create)

    async def read(
        self, location: Location, first: int = 0, last: int | None = None
    ) -> AsyncGenerator[bytes, None]:
        """The staged bytes first..last (inclusive; None: to the end)."""
        if location.scheme == "file":
            if self._disk is None or location.region_or_node != self.node:
                raise OriginError(f"staged on node {location.region_or_node}, not readable here")
            async for piece in self._disk.read(location.key, first, last):
                yield piece
            return
        origin = self._origins[location.region_or_node]
        headers = {}
        if first or last is not None:
            # Not for the whole object: S3 answers "bytes=0-" on an empty one with 416.
            headers["range"] = f"bytes={first}-{'' if last is None else last}"
        async with origin.request("GET", location.bucket, location.key, headers=headers) as r:
            if r.status not in (200, 206):
                raise OriginError(f"staged object unreadable: {r.status}")
            async for piece in r.content.iter_chunked(READ_SIZE):
                yield piece

    async def delete(self, location: Location) -> None:
        if location.scheme == "file":
            if self._disk is not None and location.region_or_node == self.node:
                await self._disk.delete(location.key)
            return
        origin = self._origins[location.region_or_node]
        async with origin.request("DELETE", location.bucket, location.key) as r:
            if r.status not in (200, 204, 404):
                raise OriginError(f"staging DELETE failed: {r.status}")


class _Md5:
    """The MD5 of a body, computed as it passes."""

    def __init__(self) -> None:
        self._md5 = hashlib.md5(usedforsecurity=False)

    async def tee(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for piece in body:
            self._md5.update(piece)
            yield piece

    def hexdigest(self) -> str:
        return self._md5.hexdigest()
