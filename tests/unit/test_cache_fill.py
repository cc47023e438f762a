"""Fills from a ChunkSource: which bytes they ask for, where they put them, and that one
ending in an unexpected error still releases everyone waiting on it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from multidict import CIMultiDict

from lota.cache.fill import Filler
from lota.cache.source import SourceKind
from lota.cache.store import CachedObject, CacheStore, ObjectMeta
from lota.clock import FakeClock
from lota.errors import OriginError
from lota.metrics import Metrics
from lota.s3.ranges import parse_range
from lota.tasks import TaskGroup

CS = 64 * 1024


class _BrokenSource:
    """A source whose replies blow up with an error no handler expects (a bug)."""

    kind: SourceKind = "origin"
    name = "r"

    def __init__(self) -> None:
        self.requests = 0

    @asynccontextmanager
    async def get(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.requests += 1
        await asyncio.sleep(0.01)
        raise KeyError("unexpected")
        yield  # pragma: no cover

    head = get


class _Reply:
    kind = "origin"

    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.headers = CIMultiDict(headers)
        self._body = body

    async def read(self, count: int) -> bytes:
        piece, self._body = self._body[:count], self._body[count:]
        return piece

    async def pieces(self, size: int) -> AsyncIterator[bytes]:
        while piece := await self.read(size):
            yield piece


class _MemorySource:
    """One object held in memory, answered as S3 answers a GET (or, with `ranges` off, as
    a server that ignores Range); every Range asked for is kept."""

    kind: SourceKind = "origin"
    name = "memory"

    def __init__(self, data: bytes, *, ranges: bool = True) -> None:
        self.data = data
        self.ranges = ranges
        self.asked: list[str] = []

    @asynccontextmanager
    async def get(
        self, bucket: str, key: str, *, byte_range: str = "", if_match: str = ""
    ) -> AsyncIterator[_Reply]:
        self.asked.append(byte_range)
        size = len(self.data)
        headers = {"etag": '"e"', "last-modified": "Wed, 02 Dec 2026 10:00:00 GMT"}
        wanted = parse_range(byte_range) if self.ranges else None
        if wanted is None:
            yield _Reply(200, {**headers, "content-length": str(size)}, self.data)
            return
        first, last = wanted.resolve(size)
        headers["content-range"] = f"bytes {first}-{last}/{size}"
        yield _Reply(206, headers, self.data[first : last + 1])

    head = get


@pytest.fixture
async def filler(tmp_path: Path) -> AsyncIterator[Filler]:
    store = CacheStore([str(tmp_path / "c")], 64 * CS, CS, clock=FakeClock(), scrub_interval=0)
    await store.open()
    yield Filler(store, CS, Metrics(), FakeClock(), TaskGroup("test"))
    await store.close()


async def test_waiters_of_a_cold_fill_get_an_error_not_a_hang(filler: Filler) -> None:
    origin = _BrokenSource()
    job = filler.start(origin, "b", "k", 0, None)
    assert filler.start(origin, "b", "k", 0, None) is job
    with pytest.raises(OriginError):
        await asyncio.wait_for(asyncio.shield(job.result), 5)
    await asyncio.wait_for(job.ended, 5)
    assert filler.cold_job("b", "k") is None
    assert origin.requests == 1


async def test_readers_following_chunk_fills_are_released(filler: Filler) -> None:
    meta = ObjectMeta(
        bucket="b",
        key="k",
        etag='"e"',
        size=3 * CS,
        last_modified="Wed, 02 Dec 2026 10:00:00 GMT",
        headers=(),
        validated_at=0.0,
    )
    obj = await filler.store.admit(meta)
    job = filler.start(_BrokenSource(), "b", "k", 0, None, obj)
    fills = [filler.fill_for(obj, i) for i in range(3)]
    assert all(f is not None for f in fills)
    for fill in fills:
        assert fill is not None
        await asyncio.wait_for(fill.wait(), 5)
        assert fill.finished and fill.failed
    await asyncio.wait_for(job.ended, 5)
    assert [filler.fill_for(obj, i) for i in range(3)] == [None, None, None]
    with pytest.raises(OriginError):
        job.result.result()


async def _filled(filler: Filler, job: Any) -> CachedObject:
    await asyncio.wait_for(job.ended, 5)
    obj = job.result.result()
    assert isinstance(obj, CachedObject)
    return obj


async def _chunk(filler: Filler, obj: CachedObject, index: int) -> bytes:
    reader = await filler.store.open_chunk(obj, index)
    assert reader is not None
    try:
        return os.pread(reader.fd, CS, 0)
    finally:
        reader.close()


async def test_a_cold_suffix_fill_asks_once_and_keeps_the_whole_chunks_of_the_tail(
    filler: Filler,
) -> None:
    data = bytes(range(256)) * (10 * CS // 256 + 3)  # 10 chunks and a bit
    source = _MemorySource(data)
    # The last 100 bytes, as the read path asks for them: 100 + CS - 1 from the end.
    job = filler.start(source, "b", "k", 0, None, suffix=100 + CS - 1)
    obj = await _filled(filler, job)
    assert source.asked == [f"bytes=-{100 + CS - 1}"]
    assert obj.meta.size == len(data)
    count = -(-len(data) // CS)
    # The answer began inside chunk count - 2: that chunk is not kept (it is partial),
    # the last one is, whole, with its own bytes.
    assert not filler.store.has_chunk(obj, count - 2)
    assert filler.store.has_chunk(obj, count - 1)
    assert await _chunk(filler, obj, count - 1) == data[(count - 1) * CS :]


async def test_a_suffix_longer_than_the_object_fills_all_of_it(filler: Filler) -> None:
    data = b"x" * (CS + 5)
    source = _MemorySource(data)
    obj = await _filled(filler, filler.start(source, "b", "k", 0, None, suffix=3 * CS))
    assert [filler.store.has_chunk(obj, i) for i in range(2)] == [True, True]
    assert await _chunk(filler, obj, 1) == b"x" * 5


async def test_a_range_fill_from_a_source_that_ignores_range_skips_to_its_chunks(
    filler: Filler,
) -> None:
    data = b"".join(bytes([i]) * CS for i in range(4))
    source = _MemorySource(data, ranges=False)
    obj = await _filled(filler, filler.start(source, "b", "k", 2, 2))
    assert source.asked == [f"bytes={2 * CS}-{3 * CS - 1}"]
    assert [filler.store.has_chunk(obj, i) for i in range(4)] == [False, False, True, False]
    assert await _chunk(filler, obj, 2) == bytes([2]) * CS


def _meta(key: str, size: int) -> ObjectMeta:
    return ObjectMeta(
        bucket="b",
        key=key,
        etag='"e"',
        size=size,
        last_modified="Wed, 02 Dec 2026 10:00:00 GMT",
        headers=(),
        validated_at=0.0,
    )


async def test_prefetches_of_a_chunk_a_full_cache_declines_send_nothing_and_count_no_read(
    filler: Filler,
) -> None:
    """A chunk the admission rule would not keep is not fetched ahead (no request started
    to be aborted), and fetching ahead is not reading: however often a look-ahead passes
    over the chunk, it never earns the three reads more than the cached chunks it needs."""
    store = filler.store
    source = _MemorySource(bytes(80 * CS))
    held = await store.admit(_meta("held", 80 * CS))
    await asyncio.wait_for(filler.fill_each(source, held, range(80)), 10)
    declined = store.stats()["declined_fills"]
    assert declined > 0  # the cache is full: keeping a chunk means evicting one
    new = await store.admit(_meta("new", CS))
    # The fills above end anywhere between the low watermark and the high one, as they
    # interleave with eviction and with the index's commits (its files count in the usage):
    # fill on, a chunk at a time, until keeping the new chunk means evicting.
    more = await store.admit(_meta("more", 8 * CS))
    for index in range(8):
        await store.flush()
        if not store.keeps(new, 0):
            break
        await asyncio.wait_for(filler.fill_each(source, more, [index]), 5)
    else:
        pytest.fail("eight more chunks did not fill the cache")
    declined = store.stats()["declined_fills"]
    asked = len(source.asked)
    for _ in range(6):
        await asyncio.wait_for(filler.fill_each(source, new, [0]), 5)
    assert len(source.asked) == asked
    assert not store.has_chunk(new, 0)
    assert store.stats()["declined_fills"] == declined + 6
