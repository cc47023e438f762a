"""Warming: fill the cache with every object under a prefix before anyone asks.

``lota warm s3://bucket/prefix`` and the admin call ``POST /_lota/warm`` both use
:func:`warm`, which lists the prefix at the origin and fills objects with bounded
concurrency, reporting progress as it goes.
"""

from __future__ import annotations

import asyncio
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass

from lota.cache.fill import Filler
from lota.regions.origin import OriginClient
from lota.s3.errors import OriginError

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


@dataclass(slots=True)
class Progress:
    objects_listed: int = 0
    objects_done: int = 0
    bytes_listed: int = 0
    bytes_done: int = 0
    failed: int = 0
    listing_done: bool = False

    def as_dict(self) -> dict[str, int | bool]:
        return asdict(self)


async def list_objects(
    origin: OriginClient, bucket: str, prefix: str
) -> AsyncIterator[tuple[str, int]]:
    """Every (key, size) under `prefix`, page by page (ListObjectsV2)."""
    token = ""
    while True:
        query = [("list-type", "2"), ("prefix", prefix)]
        if token:
            query.append(("continuation-token", token))
        async with origin.request("GET", bucket, "", query=query) as reply:
            body = await reply.read()
            if reply.status != 200:
                raise OriginError(
                    f"listing {bucket}/{prefix} failed: {reply.status} {body[:200]!r}"
                )
        root = ET.fromstring(body)
        for item in root.iter(f"{_NS}Contents"):
            yield item.findtext(f"{_NS}Key", ""), int(item.findtext(f"{_NS}Size", "0"))
        token = root.findtext(f"{_NS}NextContinuationToken", "")
        if root.findtext(f"{_NS}IsTruncated", "false") != "true" or not token:
            return


async def warm(
    filler: Filler, origin: OriginClient, bucket: str, prefix: str, concurrency: int = 8
) -> AsyncIterator[Progress]:
    """Fill every object under the prefix; yield progress after each object finishes."""
    progress = Progress()
    slots = asyncio.Semaphore(max(1, concurrency))
    finished: asyncio.Queue[None] = asyncio.Queue()
    running: set[asyncio.Task[None]] = set()
    started = reported = 0

    async def one(key: str, size: int) -> None:
        try:
            await _fill(filler, origin, bucket, key)
            progress.objects_done += 1
            progress.bytes_done += size
        except OriginError:
            progress.failed += 1
        finally:
            slots.release()
            finished.put_nowait(None)

    try:
        async for key, size in list_objects(origin, bucket, prefix):
            progress.objects_listed += 1
            progress.bytes_listed += size
            await slots.acquire()
            task = asyncio.get_running_loop().create_task(one(key, size), name=f"warm {key}")
            running.add(task)
            task.add_done_callback(running.discard)
            started += 1
            while not finished.empty():
                finished.get_nowait()
                reported += 1
                yield progress
        progress.listing_done = True
        yield progress
        while reported < started:
            await finished.get()
            reported += 1
            yield progress
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def _fill(filler: Filler, origin: OriginClient, bucket: str, key: str) -> None:
    obj = filler.store.lookup(bucket, key)
    if obj is not None:
        count = -(-obj.meta.size // filler.chunk_size)
        if all(filler.store.has_chunk(obj, i) for i in range(count)):
            return
    job = filler.start(origin, bucket, key, 0, None, obj)
    await job.done.wait()
    if not job.result.done() or job.result.exception() is not None:
        raise OriginError(f"warming {bucket}/{key} failed")
