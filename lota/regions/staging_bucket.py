"""Bucket staging: accelerated writes wait in the local region's staging bucket.

Durable as the region's object store, and readable from every node of every region. A
multipart upload stages as a multipart upload of the staging bucket, part for part.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Callable

from lota.errors import LotaError, OriginError
from lota.regions.control import ControlPlane, translated
from lota.regions.location import Location
from lota.regions.multipart import PartsPage, parse_parts
from lota.regions.origin import OriginClient
from lota.s3.errors import S3Error
from lota.s3.xml import xml_text

PROBE = ".lota-probe"


class BucketArea:
    """The staging bucket of this node's region."""

    def __init__(
        self,
        origin: OriginClient | None,
        region: str,
        bucket: str,
        prefix: str,
        control: ControlPlane | None = None,
    ) -> None:
        self._origin_or_none = origin
        self._control = control
        self._region = region
        self._bucket = bucket
        self._prefix = prefix
        self.where = f"staging bucket {bucket} of region {region}"

    def location(self, key: str) -> Location:
        return Location("s3", self._region, self._bucket, key)

    @property
    def _origin(self) -> OriginClient:
        if self._origin_or_none is None:
            raise OriginError(f"region {self._region} has no origin: nowhere to stage")
        return self._origin_or_none

    async def put(self, key: str, body: AsyncIterator[bytes], length: int) -> None:
        headers = {"content-length": str(length)}
        async with self._origin.request("PUT", self._bucket, key, headers=headers, body=body) as r:
            if r.status != 200:
                raise OriginError(f"staging PUT failed: {r.status} {(await r.read())[:300]!r}")

    async def create_multipart(self, key: str) -> str:
        query = [("uploads", "")]
        async with self._origin.request("POST", self._bucket, key, query=query) as r:
            body = await r.read()
            if r.status != 200:
                raise OriginError(
                    f"staging CreateMultipartUpload failed: {r.status} {body[:300]!r}"
                )
        upload = xml_text(body, "UploadId")
        if not upload:
            raise OriginError("staging CreateMultipartUpload returned no UploadId")
        return upload

    async def upload_part(
        self,
        key: str,
        upload: str,
        number: int,
        body: AsyncIterator[bytes],
        length: int,
        md5: Callable[[], str],
    ) -> None:
        query = [("partNumber", str(number)), ("uploadId", upload)]
        headers = {"content-length": str(length)}
        async with self._origin.request(
            "PUT", self._bucket, key, query=query, headers=headers, body=body
        ) as r:
            if r.status != 200:
                raise passed_on(r.status, await r.read())

    async def list_parts(
        self, key: str, upload: str, marker: int = 0, limit: int = 1000
    ) -> PartsPage:
        query = [("uploadId", upload), ("part-number-marker", str(marker))]
        query.append(("max-parts", str(limit)))
        async with self._origin.request("GET", self._bucket, key, query=query) as r:
            answer = await r.read()
            if r.status != 200:
                raise passed_on(r.status, answer)
        return parse_parts(answer)

    async def complete_multipart(self, key: str, upload: str, body: bytes) -> tuple[str, list[int]]:
        sizes = await self._part_sizes(key, upload)
        query = [("uploadId", upload)]
        headers = {"content-length": str(len(body))}
        async with self._origin.request(
            "POST", self._bucket, key, query=query, body=body, headers=headers
        ) as r:
            answer = await r.read()
            if r.status != 200 or b"<Error>" in answer:
                raise passed_on(r.status if r.status != 200 else 400, answer)
        etag = xml_text(answer, "ETag")
        chosen = [int(n) for n in _xml_all(body, "PartNumber")]
        listed = all(n in sizes for n in chosen)
        if not listed or sum(sizes[n] for n in chosen) != await self._size(key):
            # A part was uploaded again between the listing and the completion: ask the
            # completed object itself.
            sizes = {n: await self._size(key, part=n) for n in chosen}
        return etag, [sizes[n] for n in chosen]

    async def _size(self, key: str, part: int | None = None) -> int:
        query = [] if part is None else [("partNumber", str(part))]
        async with self._origin.request("HEAD", self._bucket, key, query=query) as r:
            if r.status not in (200, 206):
                raise OriginError(f"staging HEAD answered {r.status}")
            return int(r.headers.get("content-length", "-1"))

    async def _part_sizes(self, key: str, upload: str) -> dict[int, int]:
        sizes: dict[int, int] = {}
        marker = 0
        while True:
            page = await self.list_parts(key, upload, marker)
            sizes.update((p.number, p.size) for p in page.parts)
            if not page.truncated or not page.parts:
                return sizes
            marker = page.next_marker

    async def abort_multipart(self, key: str, upload: str) -> None:
        query = [("uploadId", upload)]
        async with self._origin.request("DELETE", self._bucket, key, query=query) as r:
            if r.status not in (204, 200):
                raise passed_on(r.status, await r.read())

    async def entries(self, after: str, limit: int) -> tuple[list[tuple[str, float]], str]:
        if self._control is None:
            raise OriginError(f"{self.where}: no control plane to list it with")
        client = await self._control.region(self._region)
        async with translated(f"listing {self.where}"):
            page = await client.list_objects_v2(
                Bucket=self._bucket, Prefix=self._prefix, StartAfter=after, MaxKeys=limit
            )
        found = [(e["Key"], e["LastModified"].timestamp()) for e in page.get("Contents", [])]
        return found, found[-1][0] if page.get("IsTruncated") and found else ""

    async def check(self, create: bool) -> str:
        try:
            if not await self._exists():
                if not create:
                    return (
                        f"{self.where} does not exist (create it, or set "
                        "write.create_staging = true)"
                    )
                await self._create()
            return await self._probe()
        except (LotaError, OSError) as exc:
            return f"{self.where} cannot be checked: {exc}"

    async def _exists(self) -> bool:
        async with self._origin.request("HEAD", self._bucket, "") as r:
            if r.status in (200, 404):
                return r.status == 200
            raise OriginError(f"HEAD answered {r.status}")

    async def _create(self) -> None:
        signing = self._origin.region.signing_region
        body = b""
        if signing != "us-east-1":
            body = (
                "<CreateBucketConfiguration><LocationConstraint>"
                f"{signing}</LocationConstraint></CreateBucketConfiguration>"
            ).encode()
        async with self._origin.request("PUT", self._bucket, "", body=body) as r:
            if r.status != 200:
                raise passed_on(r.status, await r.read())

    async def _probe(self) -> str:
        """Write and delete an object: the bucket takes writes with LOTA's credentials."""
        key = self._prefix + PROBE
        headers = {"content-length": "0"}
        async with self._origin.request("PUT", self._bucket, key, headers=headers, body=b"") as r:
            if r.status != 200:
                return f"{self.where} refuses writes: {r.status} {_code(await r.read())}"
        async with self._origin.request("DELETE", self._bucket, key):
            pass
        return ""


def _code(body: bytes) -> str:
    return xml_text(body, "Code") if body.startswith(b"<") else ""


def _xml_all(body: bytes, tag: str) -> list[str]:
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise S3Error("MalformedXML") from exc
    return [e.text or "" for e in root.iter() if e.tag.rsplit("}", 1)[-1] == tag]


def passed_on(status: int, body: bytes) -> S3Error:
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
