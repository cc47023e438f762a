"""The origin as a :class:`~lota.cache.source.ChunkSource`: the cache's first source.

A HEAD or a ranged GET through the region's :class:`~lota.regions.origin.OriginClient`
(signed; an origin that cannot be reached is an :class:`~lota.errors.OriginError` there,
a body that breaks off is one here), answered as a :class:`~lota.cache.source.SourceReply`.
Body bytes read through it are counted in ``lota_origin_bytes_in`` under the region's name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

import aiohttp
from prometheus_client import Counter

from lota.cache.source import SourceKind
from lota.errors import OriginError
from lota.metrics import Metrics
from lota.regions.origin import OriginClient


class OriginSource:
    """Reads objects from one region's origin."""

    kind: SourceKind = "origin"

    def __init__(self, origin: OriginClient, metrics: Metrics) -> None:
        self.origin = origin
        self.name = origin.region.name
        self._received = metrics.origin_bytes_in.labels(self.name)

    @asynccontextmanager
    async def head(
        self, bucket: str, key: str, *, part: int | None = None, if_none_match: str = ""
    ) -> AsyncIterator[OriginResponse]:
        query = [] if part is None else [("partNumber", str(part))]
        # The whole object's checksums come with a HEAD only when asked for; a ranged GET
        # never has them, so this is where the cache learns them.
        headers = {"x-amz-checksum-mode": "ENABLED"}
        if if_none_match:
            headers["if-none-match"] = if_none_match
        async with self.origin.request(
            "HEAD", bucket, key, query=query, headers=headers
        ) as response:
            yield OriginResponse(response, self._received)

    @asynccontextmanager
    async def get(
        self, bucket: str, key: str, *, byte_range: str = "", if_match: str = ""
    ) -> AsyncIterator[OriginResponse]:
        headers = {"x-amz-checksum-mode": "ENABLED"}
        if byte_range:
            headers["range"] = byte_range
        if if_match:
            headers["if-match"] = if_match
        async with self.origin.request("GET", bucket, key, headers=headers) as response:
            yield OriginResponse(response, self._received)


class OriginResponse:
    """An origin response as a :class:`~lota.cache.source.SourceReply`."""

    __slots__ = ("_content", "_received", "headers", "status")
    kind: SourceKind = "origin"

    def __init__(self, response: aiohttp.ClientResponse, received: Counter) -> None:
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers
        self._content = response.content
        self._received = received

    async def read(self, count: int) -> bytes:
        try:
            piece = await self._content.read(count)
        except aiohttp.ClientError as exc:  # the connection broke mid-body
            raise OriginError(f"origin body failed: {exc!r}") from exc
        self._received.inc(len(piece))
        return piece

    async def pieces(self, size: int) -> AsyncIterator[bytes]:
        while piece := await self.read(size):
            yield piece
