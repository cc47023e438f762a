"""The mirror of pending keys (lota.regions.pending), on SQLite and on a real PostgreSQL,
and a node's reads asking it.

Node "a" writes through its catalog; the mirror is node "b"'s. PostgreSQL streams here
poll every 30 s, and the mirror's own idle refresh waits as long: a read that sees a write
at once saw it through its own refresh.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from lota.catalog import Catalog, CatalogSettings, PendingObject, open_catalog
from lota.catalog.sqlite import SQLiteCatalog
from lota.clock import FakeClock
from lota.errors import CatalogError, CatalogUnavailable
from lota.regions.pending import PendingKeys
from lota.testing.node import node_config, running_node
from tests.conftest import client_for

pytestmark = pytest.mark.timeout(60)

SETTINGS = CatalogSettings(poll_interval=30.0, listen_poll_interval=30.0, gap_timeout=2.0)

Mirror = Callable[..., Awaitable[PendingKeys]]


@pytest.fixture
async def nodes(catalog_url: str) -> AsyncIterator[tuple[Catalog, Catalog]]:
    clock = FakeClock()
    a = await open_catalog(catalog_url, clock=clock, node="node-a", settings=SETTINGS)
    b = await open_catalog(catalog_url, clock=clock, node="node-b", settings=SETTINGS)
    yield a, b
    await a.close()
    await b.close()


@pytest.fixture
async def mirror_of(nodes: tuple[Catalog, Catalog]) -> AsyncIterator[Mirror]:
    """Starts a mirror of node b's catalog (or of a stand-in for it); stops them at the end."""
    tasks: list[asyncio.Task[None]] = []

    async def start(catalog: Any = None, poll: float = 30.0, **kwargs: Any) -> PendingKeys:
        mirror = PendingKeys(catalog or nodes[1], poll=poll, gap_timeout=2.0, **kwargs)
        tasks.append(asyncio.create_task(mirror.run()))
        return mirror

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def pending(key: str) -> PendingObject:
    return PendingObject(
        bucket="bkt",
        key=key,
        size=1,
        etag=f'"{key}"',
        source_region="us-east",
        staging_bucket="staging",
        staging_key=f"stage/{key}",
    )


async def migrate(catalog: Catalog, key: str, seq: int) -> None:
    await catalog.claim_migrations(limit=100, lease_seconds=60)
    assert await catalog.complete_migration("bkt", key, seq)


class Gated:
    """A catalog whose event reads, once made, wait at a gate to answer; they may fail."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self.gate = asyncio.Event()
        self.gate.set()
        self.reads = 0
        self.loads = 0
        self.fail = 0

    async def pending_keys(self, limit: int) -> Any:
        self.loads += 1
        return await self._catalog.pending_keys(limit)

    async def events_after(self, after: int, limit: int) -> Any:
        if self.fail:
            self.fail -= 1
            raise CatalogUnavailable("the catalog is down (test)")
        events = await self._catalog.events_after(after, limit)
        self.reads += 1
        await self.gate.wait()
        return events

    def __getattr__(self, name: str) -> Any:
        return getattr(self._catalog, name)


async def test_a_write_on_another_node_is_seen_by_the_next_read(
    nodes: tuple[Catalog, Catalog], mirror_of: Mirror
) -> None:
    a, _ = nodes
    mirror = await mirror_of()
    assert not await mirror.may_be_pending("bkt", "k")
    v1 = await a.commit_object(pending("k"))
    assert await mirror.may_be_pending("bkt", "k")
    assert not await mirror.may_be_pending("bkt", "other")

    await migrate(a, "k", v1)
    assert not await mirror.may_be_pending("bkt", "k")
    assert await a.requeue_migration("bkt", "k", v1)  # goes home again
    assert await mirror.may_be_pending("bkt", "k")

    # v1 is migrating when v2 is committed: v1's arrival leaves v2 pending.
    [claimed] = await a.claim_migrations(limit=1, lease_seconds=60)
    await a.commit_object(pending("k"))
    assert await a.complete_migration("bkt", "k", claimed.seq)
    assert await mirror.may_be_pending("bkt", "k")
    tomb = await a.commit_delete("bkt", "k")  # a pending delete is pending too
    await migrate(a, "k", tomb)
    assert not await mirror.may_be_pending("bkt", "k")


async def test_reads_waiting_together_share_one_refresh(
    nodes: tuple[Catalog, Catalog], mirror_of: Mirror
) -> None:
    a, b = nodes
    gated = Gated(b)
    mirror = await mirror_of(gated)
    await a.commit_object(pending("k"))
    assert await mirror.may_be_pending("bkt", "k")
    before = mirror.refreshes
    answers = await asyncio.gather(*(mirror.may_be_pending("bkt", f"{i}") for i in range(200)))
    assert answers == [False] * 200
    assert mirror.refreshes - before <= 2


async def test_a_read_arriving_during_a_refresh_waits_for_a_later_one(
    nodes: tuple[Catalog, Catalog], mirror_of: Mirror
) -> None:
    a, b = nodes
    gated = Gated(b)
    mirror = await mirror_of(gated)
    assert not await mirror.may_be_pending("bkt", "k")  # loaded
    gated.gate.clear()
    reads = gated.reads
    early = asyncio.create_task(mirror.may_be_pending("bkt", "k"))
    while gated.reads == reads:  # wait for its refresh to have read the events
        await asyncio.sleep(0.001)
    await a.commit_object(pending("k"))  # acknowledged after the refresh began
    late = asyncio.create_task(mirror.may_be_pending("bkt", "k"))
    await asyncio.sleep(0.01)
    gated.gate.set()
    assert await late
    assert not await early  # its refresh had begun before the write: it may not see it


async def test_a_failed_refresh_fails_its_reads_and_the_next_one_loads_all_again(
    nodes: tuple[Catalog, Catalog], mirror_of: Mirror
) -> None:
    a, b = nodes
    gated = Gated(b)
    mirror = await mirror_of(gated)
    assert not await mirror.may_be_pending("bkt", "k")
    assert not await mirror.may_be_pending("bkt", "k")
    assert gated.loads == 1  # loaded once, then kept from the events
    gated.fail = 1
    with pytest.raises(CatalogError):
        await mirror.may_be_pending("bkt", "k")
    await a.commit_object(pending("k"))
    assert await mirror.may_be_pending("bkt", "k")
    assert gated.loads == 2  # events may have been pruned while it failed: loaded again


async def test_past_its_limit_the_mirror_sends_every_read_to_the_catalog(
    nodes: tuple[Catalog, Catalog], mirror_of: Mirror
) -> None:
    a, _ = nodes
    mirror = await mirror_of(limit=2, poll=0.05)
    seqs = {key: await a.commit_object(pending(key)) for key in ("x", "y", "z")}
    assert await mirror.may_be_pending("bkt", "never-written")  # unsure: ask the catalog
    for key in ("x", "y"):
        await migrate(a, key, seqs[key])
    deadline = asyncio.get_running_loop().time() + 5
    while await mirror.may_be_pending("bkt", "never-written"):  # till an idle refresh
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    assert await mirror.may_be_pending("bkt", "z")
    assert not await mirror.may_be_pending("bkt", "x")


async def test_a_key_the_catalog_says_is_home_is_forgotten_unless_heard_pending_since(
    nodes: tuple[Catalog, Catalog], mirror_of: Mirror
) -> None:
    a, _ = nodes
    mirror = await mirror_of()
    v1 = await a.commit_object(pending("k"))
    assert await mirror.may_be_pending("bkt", "k")
    heard = mirror.mark("bkt", "k")
    # A read saw v1 home, then (before it said so) the mirror heard v1 requeued.
    await migrate(a, "k", v1)
    assert await a.requeue_migration("bkt", "k", v1)
    assert await mirror.may_be_pending("bkt", "k")
    mirror.settled("bkt", "k", heard)
    assert await mirror.may_be_pending("bkt", "k")
    mirror.settled("bkt", "k", mirror.mark("bkt", "k"))
    assert not await mirror.may_be_pending("bkt", "k")
    assert mirror.mark("bkt", "k") == 0


async def test_a_stopped_mirror_answers_unavailable_rather_than_leave_reads_waiting(
    nodes: tuple[Catalog, Catalog],
) -> None:
    mirror = PendingKeys(nodes[1], poll=30.0, gap_timeout=2.0)
    task = asyncio.create_task(mirror.run())
    assert not await mirror.may_be_pending("bkt", "k")
    waiting = asyncio.create_task(mirror.may_be_pending("bkt", "k"))
    task.cancel()
    with pytest.raises(CatalogUnavailable):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(CatalogUnavailable):
        await mirror.may_be_pending("bkt", "k")


async def test_a_node_asks_the_catalog_for_a_key_only_when_its_mirror_holds_it(
    origin: str, origin_s3: Any, bucket: str, credentials_file: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """Through the front end (HEAD is never answered at once): reads of a key with nothing
    pending cost no get_object; one committed elsewhere, pending, is asked for and seen."""
    asked: list[str] = []
    real = SQLiteCatalog.get_object

    async def get_object(self: SQLiteCatalog, bucket: str, key: str) -> Any:
        asked.append(key)
        return await real(self, bucket, key)

    monkeypatch.setattr(SQLiteCatalog, "get_object", get_object)
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=b"v1")
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    settings = {
        "origin": origin,
        "auth.mode": "sigv4",
        "auth.credentials": str(credentials_file),
        "cache.dirs": [str(tmp_path / "cache")],
        "catalog.url": url,
    }
    async with running_node(node_config(settings)) as node:
        s3 = client_for(node.url)
        for _ in range(5):
            head = await asyncio.to_thread(s3.head_object, Bucket=bucket, Key="k")
            assert head["ContentLength"] == 2
        assert asked == []
        other = await open_catalog(url, clock=FakeClock(), node="elsewhere")
        try:
            await other.commit_delete(bucket, "k")
        finally:
            await other.close()
        with pytest.raises(ClientError) as refused:
            await asyncio.to_thread(s3.head_object, Bucket=bucket, Key="k")
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
        assert asked == ["k"]
