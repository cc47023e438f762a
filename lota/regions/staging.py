"""Where accelerated writes wait for migration: the local region's staging bucket, or a
directory on this node (``staging = "local-disk"``, for single-node use).

A staged object is named by a :class:`Location` string that any node can parse:
``s3://REGION/BUCKET/KEY`` for bucket staging, ``file://NODE/PATH`` for local disk. Only
bucket staging survives the loss of the node and can be read from other nodes; local-disk
staging is as durable as that one disk and readable only where it was written.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import uuid
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from lota.errors import OriginError
from lota.regions.origin import OriginClient
from lota.s3.errors import S3Error
from lota.threads import run_in_thread

STAGING_PREFIX = "lota-staging/"
READ_SIZE = 256 * 1024


@dataclass(frozen=True, slots=True)
class Location:
    """Where a staged object's bytes are."""

    scheme: str  # "s3" or "file"
    region_or_node: str
    bucket: str  # "" for file
    key: str  # staging key, or absolute path for file

    def __str__(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.region_or_node}/{self.bucket}/{self.key}"
        return f"file://{self.region_or_node}{self.key}"

    @classmethod
    def parse(cls, text: str) -> Location:
        scheme, _, rest = text.partition("://")
        if scheme == "s3":
            region, bucket, key = rest.split("/", 2)
            return cls("s3", region, bucket, key)
        if scheme == "file":
            node, slash, path = rest.partition("/")
            return cls("file", node, "", slash + path)
        raise ValueError(f"not a staging location: {text!r}")


@dataclass(frozen=True, slots=True)
class Staged:
    """A body written to staging: where, how big, its MD5 (the ETag S3 gives a single PUT)."""

    location: Location
    size: int
    md5: str


class Staging:
    """Writes, reads and deletes staged objects; reads work for any region's bucket staging."""

    def __init__(
        self,
        *,
        node: str,
        region: str,
        origins: Mapping[str, OriginClient],
        staging_bucket: str = "",
        local_dir: str = "",
    ) -> None:
        self.node = node
        self.region = region
        self._origins = origins
        self._bucket = staging_bucket
        self._dir = Path(local_dir) if local_dir else None

    @property
    def mode(self) -> str:
        return "local-disk" if self._dir is not None else "bucket"

    @property
    def bucket(self) -> str:
        return self._bucket

    def new_key(self, bucket: str) -> str:
        return f"{STAGING_PREFIX}{bucket}/{uuid.uuid4().hex}"

    async def put(self, bucket: str, body: AsyncIterator[bytes], length: int) -> Staged:
        """Stage a whole body; returns once it is durable (origin 200, or fsync'd file)."""
        md5 = hashlib.md5(usedforsecurity=False)

        async def hashed() -> AsyncIterator[bytes]:
            async for piece in body:
                md5.update(piece)
                yield piece

        key = self.new_key(bucket)
        if self._dir is not None:
            path = self._dir / key
            await _write_file(path, hashed())
            return Staged(Location("file", self.node, "", str(path)), length, md5.hexdigest())
        origin = self._origins[self.region]
        headers = {"content-length": str(length)}
        async with origin.request("PUT", self._bucket, key, headers=headers, body=hashed()) as r:
            if r.status != 200:
                raise OriginError(f"staging PUT failed: {r.status} {(await r.read())[:300]!r}")
        return Staged(Location("s3", self.region, self._bucket, key), length, md5.hexdigest())

    async def read(
        self, location: Location, first: int = 0, last: int | None = None
    ) -> AsyncIterator[bytes]:
        """The staged bytes first..last (inclusive; None: to the end)."""
        if location.scheme == "file":
            if location.region_or_node != self.node:
                raise OriginError(f"staged on node {location.region_or_node}, not readable here")
            async for piece in _read_file(Path(location.key), first, last):
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

    # Multipart uploads stage as multipart uploads in the staging bucket, part for part, so
    # the staged object has the part boundaries (and so the ETag) the home object will have.

    async def create_multipart(self, key: str) -> str:
        self._bucket_mode("multipart uploads")
        origin = self._origins[self.region]
        async with origin.request("POST", self._bucket, key, query=[("uploads", "")]) as r:
            body = await r.read()
            if r.status != 200:
                raise OriginError(
                    f"staging CreateMultipartUpload failed: {r.status} {body[:300]!r}"
                )
        upload = _xml_text(body, "UploadId")
        if not upload:
            raise OriginError("staging CreateMultipartUpload returned no UploadId")
        return upload

    async def upload_part(
        self, key: str, upload: str, number: int, body: AsyncIterator[bytes], length: int
    ) -> str:
        """Stage one part; returns its MD5 hex (the part's ETag)."""
        self._bucket_mode("multipart uploads")
        md5 = hashlib.md5(usedforsecurity=False)

        async def hashed() -> AsyncIterator[bytes]:
            async for piece in body:
                md5.update(piece)
                yield piece

        origin = self._origins[self.region]
        query = [("partNumber", str(number)), ("uploadId", upload)]
        headers = {"content-length": str(length)}
        async with origin.request(
            "PUT", self._bucket, key, query=query, headers=headers, body=hashed()
        ) as r:
            if r.status != 200:
                raise _passed_on(r.status, await r.read())
        return md5.hexdigest()

    async def complete_multipart(self, key: str, upload: str, body: bytes) -> tuple[str, list[int]]:
        """Complete the staged upload with the client's part list; returns (ETag, part sizes)."""
        origin = self._origins[self.region]
        query = [("uploadId", upload)]
        sizes = await self._part_sizes(origin, key, upload)
        async with origin.request(
            "POST",
            self._bucket,
            key,
            query=query,
            body=body,
            headers={"content-length": str(len(body))},
        ) as r:
            answer = await r.read()
            if r.status != 200 or b"<Error>" in answer:
                raise _passed_on(r.status if r.status != 200 else 400, answer)
        etag = _xml_text(answer, "ETag")
        chosen = [int(n) for n in _xml_all(body, "PartNumber")]
        listed = all(n in sizes for n in chosen)
        if not listed or sum(sizes[n] for n in chosen) != await self._size(origin, key):
            # A part was uploaded again between the listing and the completion: ask the
            # completed object itself.
            sizes = {n: await self._size(origin, key, part=n) for n in chosen}
        return etag, [sizes[n] for n in chosen]

    async def _size(self, origin: OriginClient, key: str, part: int | None = None) -> int:
        query = [] if part is None else [("partNumber", str(part))]
        async with origin.request("HEAD", self._bucket, key, query=query) as r:
            if r.status not in (200, 206):
                raise OriginError(f"staging HEAD answered {r.status}")
            return int(r.headers.get("content-length", "-1"))

    async def _part_sizes(self, origin: OriginClient, key: str, upload: str) -> dict[int, int]:
        sizes: dict[int, int] = {}
        marker = "0"
        while True:
            query = [("uploadId", upload), ("part-number-marker", marker)]
            async with origin.request("GET", self._bucket, key, query=query) as r:
                answer = await r.read()
                if r.status != 200:
                    raise _passed_on(r.status, answer)
            numbers = [int(n) for n in _xml_all(answer, "PartNumber")]
            lengths = [int(s) for s in _xml_all(answer, "Size")]
            sizes.update(zip(numbers, lengths, strict=False))
            if _xml_text(answer, "IsTruncated") != "true" or not numbers:
                return sizes
            marker = str(numbers[-1])

    async def abort_multipart(self, key: str, upload: str) -> None:
        origin = self._origins[self.region]
        async with origin.request("DELETE", self._bucket, key, query=[("uploadId", upload)]) as r:
            if r.status not in (204, 200, 404):
                raise _passed_on(r.status, await r.read())

    def _bucket_mode(self, what: str) -> None:
        if self._dir is not None:
            raise S3Error("NotImplemented", f"{what} to far buckets need bucket staging")

    async def delete(self, location: Location) -> None:
        if location.scheme == "file":
            await asyncio.to_thread(_unlink, Path(location.key))
            return
        origin = self._origins[location.region_or_node]
        async with origin.request("DELETE", location.bucket, location.key) as r:
            if r.status not in (200, 204, 404):
                raise OriginError(f"staging DELETE failed: {r.status}")


def _xml_all(body: bytes, tag: str) -> list[str]:
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise OriginError(f"unreadable XML from staging: {body[:200]!r}") from exc
    return [e.text or "" for e in root.iter() if e.tag.rsplit("}", 1)[-1] == tag]


def _xml_text(body: bytes, tag: str) -> str:
    found = _xml_all(body, tag)
    return found[0] if found else ""


def _passed_on(status: int, body: bytes) -> S3Error:
    """A staging error the client must hear about (InvalidPart, NoSuchUpload, ...)."""
    try:
        root = ET.fromstring(body)
        code = root.findtext("Code") or "InternalError"
        message = root.findtext("Message") or ""
    except ET.ParseError:
        code, message = "ServiceUnavailable", "staging failed"
    if status >= 500:
        return S3Error("ServiceUnavailable", f"staging failed: {code}")
    return S3Error(code, message, status=status)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


async def _write_file(path: Path, body: AsyncIterator[bytes]) -> None:
    """Write to a temp file, fsync, rename, fsync the directories: the staged file is whole
    or absent, and once this returns (the write is acknowledged) it survives power loss."""
    created = await asyncio.to_thread(_make_dirs, path.parent)
    temp = path.with_suffix(".tmp")
    # run_in_thread: a cancelled caller waits for the call to end, since it closes the
    # descriptor the call writes to (a number closed under a running write may be another
    # file's by then); on_orphan gets the descriptor the caller missed.
    fd = await run_in_thread(
        os.open, temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, on_orphan=os.close
    )
    try:
        async for piece in body:
            await run_in_thread(_write_all, fd, piece)
        await run_in_thread(os.fsync, fd)
    except BaseException:
        os.close(fd)
        await asyncio.to_thread(_unlink, temp)
        raise
    os.close(fd)
    await asyncio.to_thread(os.rename, temp, path)
    for directory in (path.parent, *(d.parent for d in created)):
        await asyncio.to_thread(_fsync_dir, directory)


def _make_dirs(directory: Path) -> list[Path]:
    """mkdir -p; returns the directories it created, outermost first."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()][::-1]
    directory.mkdir(parents=True, exist_ok=True)
    return missing


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _read_file(path: Path, first: int, last: int | None) -> AsyncIterator[bytes]:
    fd = await asyncio.to_thread(os.open, path, os.O_RDONLY)
    try:
        end = (os.fstat(fd).st_size - 1) if last is None else last
        offset = first
        while offset <= end:
            piece = await asyncio.to_thread(os.pread, fd, min(READ_SIZE, end - offset + 1), offset)
            if not piece:
                break
            offset += len(piece)
            yield piece
    finally:
        os.close(fd)
