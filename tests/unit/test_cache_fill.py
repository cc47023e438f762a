"""A fill that ends in an unexpected error still releases everyone waiting on it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from lota.cache.fill import Filler
from lota.cache.store import CacheStore, ObjectMeta
from lota.clock import FakeClock
from lota.metrics import Metrics
from lota.s3.errors import OriginError
from lota.tasks import TaskGroup

CS = 64 * 1024


class _BrokenOrigin:
    """An origin whose replies blow up with an error no handler expects (a bug)."""

    region = SimpleNamespace(name="r")

    def __init__(self) -> None:
        self.requests = 0

    @asynccontextmanager
    async def request(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        self.requests += 1
        await asyncio.sleep(0.01)
        raise KeyError("unexpected")
        yield  # pragma: no cover


@pytest.fixture
async def filler(tmp_path: Path) -> AsyncIterator[Filler]:
    store = CacheStore([str(tmp_path / "c")], 64 * CS, CS, clock=FakeClock(), scrub_interval=0)
    await store.open()
    yield Filler(store, CS, Metrics(), FakeClock(), TaskGroup("test"))
    await store.close()


async def test_waiters_of_a_cold_fill_get_an_error_not_a_hang(filler: Filler) -> None:
    origin = _BrokenOrigin()
    job = filler.start(origin, "b", "k", 0, None)
    assert filler.start(origin, "b", "k", 0, None) is job
    with pytest.raises(OriginError):
        await asyncio.wait_for(asyncio.shield(job.result), 5)
    await asyncio.wait_for(job.done.wait(), 5)
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
    job = filler.start(_BrokenOrigin(), "b", "k", 0, None, obj)
    fills = [filler.fill_for(obj, i) for i in range(3)]
    assert all(f is not None for f in fills)
    for fill in fills:
        assert fill is not None
        await asyncio.wait_for(fill.wait(), 5)
        assert fill.finished and fill.failed
    await asyncio.wait_for(job.done.wait(), 5)
    assert [filler.fill_for(obj, i) for i in range(3)] == [None, None, None]
    with pytest.raises(OriginError):
        job.result.result()
