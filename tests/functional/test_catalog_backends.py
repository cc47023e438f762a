"""The catalog's behaviour, run once on SQLite and once on a real PostgreSQL (``catalog_url``).

Two catalog instances on one URL are two nodes: separate connections (and, for SQLite,
separate threads), sharing one FakeClock so that leases expire when the test says so.
"""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import asyncpg  # type: ignore[import-untyped]
import pytest

from lota.catalog import Catalog, CatalogSettings, EventKind, PendingObject, open_catalog
from lota.clock import FakeClock
from lota.errors import CatalogError, CatalogUnavailable, CatalogVersionError, StagingSwept
from tests.postgres import PostgresServer

pytestmark = pytest.mark.timeout(60)

# Fast polling for SQLite; for PostgreSQL a fallback poll so slow that only NOTIFY can
# deliver an event within a test's patience.
SETTINGS = CatalogSettings(poll_interval=0.05, listen_poll_interval=30.0, gap_timeout=2.0)

TRICKY_KEYS = [
    "a",
    "a/b",
    "a-b",
    "a b",
    "a/b/c",
    "ab",
    "ä",
    "äb",
    "A",
    "Z",
    "B/x",
    "a\u00ff",
    "a\U0001f600",
    "\U0001f600",
    "z",
    "_",
    "~",
]

OpenNode = Callable[[str], Awaitable[Catalog]]


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def open_node(catalog_url: str, clock: FakeClock) -> AsyncIterator[OpenNode]:
    """Opens the test's catalog as another node; closes them all at the end."""
    opened: list[Catalog] = []

    async def open_(node: str) -> Catalog:
        catalog = await open_catalog(catalog_url, clock=clock, node=node, settings=SETTINGS)
        opened.append(catalog)
        return catalog

    yield open_
    for catalog in opened:
        await catalog.close()


@pytest.fixture
async def catalog(open_node: OpenNode) -> Catalog:
    return await open_node("node-a")


def pending(key: str, bucket: str = "bkt", **fields: object) -> PendingObject:
    values: dict[str, object] = {
        "size": 100,
        "etag": f'"{key}"',
        "source_region": "us-east",
        "staging_bucket": "staging",
        "staging_key": f"stage/{key}",
    }
    return PendingObject(bucket=bucket, key=key, **(values | fields))  # type: ignore[arg-type]


async def raw_rows(url: str, sql: str) -> list[tuple[object, ...]]:
    """Rows of `sql`, read behind the catalog's back."""
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            return list(conn.execute(sql).fetchall())
    conn = await asyncpg.connect(url)
    try:
        return [tuple(row) for row in await conn.fetch(sql)]
    finally:
        await conn.close()


# -- objects ------------------------------------------------------------------------------


async def test_commit_and_get_round_trip_every_field(catalog: Catalog, clock: FakeClock) -> None:
    obj = pending(
        "dir/ä",
        size=12,
        content_type="application/x-tar",
        metadata={"owner": "ada", "run": "7"},
        checksums={"x-amz-checksum-crc32c": "yZRlqg=="},
        headers=(("cache-control", "no-store"), ("content-encoding", "zstd")),
        parts=(8, 4),
    )
    seq = await catalog.commit_object(obj)
    got = await catalog.get_object("bkt", "dir/ä")
    assert got is not None
    assert (got.seq, got.state, got.deleted, got.latest) == (seq, "pending", False, True)
    assert (got.node, got.created_at, got.attempts) == ("node-a", clock.time(), 0)
    for name in PendingObject.__dataclass_fields__:
        assert getattr(got, name) == getattr(obj, name), name
    assert await catalog.get_object("bkt", "dir/a") is None
    assert await catalog.get_object("other", "dir/ä") is None


async def test_list_orders_tricky_keys_by_utf8_bytes_and_pages(catalog: Catalog) -> None:
    for key in TRICKY_KEYS:
        await catalog.commit_object(pending(key))
    await catalog.commit_object(pending("a", bucket="bkt2"))
    expected = sorted(TRICKY_KEYS, key=str.encode)

    listed = [o.key for o in await catalog.list_objects("bkt", limit=100)]
    assert listed == expected

    under_a = [o.key for o in await catalog.list_objects("bkt", prefix="a")]
    assert under_a == [k for k in expected if k.startswith("a")]
    assert [o.key for o in await catalog.list_objects("bkt", prefix="a/")] == ["a/b", "a/b/c"]
    after = [o.key for o in await catalog.list_objects("bkt", prefix="a", start_after="a/b")]
    assert after == [k for k in expected if k.startswith("a") and k.encode() > b"a/b"]

    paged: list[str] = []
    start_after = ""
    while page := await catalog.list_objects("bkt", start_after=start_after, limit=4):
        assert len(page) <= 4
        paged += [o.key for o in page]
        start_after = page[-1].key
    assert paged == expected


async def test_overwrites_and_deletes_order_by_commit_seq(catalog: Catalog) -> None:
    first = await catalog.commit_object(pending("k", etag='"v1"'))
    second = await catalog.commit_object(pending("k", etag='"v2"'))
    assert second > first
    head = await catalog.get_object("bkt", "k")
    assert head is not None
    assert (head.seq, head.etag) == (second, '"v2"')

    tomb = await catalog.commit_delete("bkt", "k")
    assert tomb > second
    head = await catalog.get_object("bkt", "k")
    assert head is not None
    assert (head.seq, head.deleted, head.size, head.has_staging) == (tomb, True, 0, False)
    [listed] = await catalog.list_objects("bkt")
    assert listed.deleted

    again = await catalog.commit_object(pending("k", etag='"v3"'))
    head = await catalog.get_object("bkt", "k")
    assert head is not None
    assert again > tomb
    assert (head.seq, head.deleted, head.etag) == (again, False, '"v3"')


async def test_concurrent_overwrites_from_two_nodes_leave_one_head(open_node: OpenNode) -> None:
    a, b = await open_node("node-a"), await open_node("node-b")
    seqs = await asyncio.gather(
        *(node.commit_object(pending("hot", etag=f'"{i}"')) for i in range(15) for node in (a, b))
    )
    assert len(set(seqs)) == len(seqs)
    heads = await a.list_objects("bkt")
    assert [h.seq for h in heads] == [max(seqs)]


async def test_catalog_survives_reopening(catalog_url: str, clock: FakeClock) -> None:
    async with await open_catalog(catalog_url, clock=clock, node="n") as first:
        seq = await first.commit_object(pending("kept"))
    async with await open_catalog(catalog_url, clock=clock, node="n") as second:
        got = await second.get_object("bkt", "kept")
        assert got is not None
        assert got.seq == seq
    with pytest.raises(CatalogError, match="closed"):
        await second.get_object("bkt", "kept")


async def test_pending_summary(catalog: Catalog, clock: FakeClock) -> None:
    assert tuple(await catalog.pending_summary()) == (0, 0, 0.0, 0)
    await catalog.commit_object(pending("old", size=1000))
    clock.advance(60)
    await catalog.commit_object(pending("new", size=24))
    await catalog.commit_object(pending("new", size=500))  # supersedes: not counted twice
    clock.advance(15)
    summary = await catalog.pending_summary()
    assert summary == (2, 1500, 75.0, 0)
    assert summary.objects == 2


# -- migration work -----------------------------------------------------------------------


async def test_two_nodes_claiming_at_once_never_get_the_same_object(open_node: OpenNode) -> None:
    a, b = await open_node("node-a"), await open_node("node-b")
    for i in range(60):
        await a.commit_object(pending(f"obj-{i:03d}"))

    async def drain(node: Catalog) -> list[int]:
        got = []
        while batch := await node.claim_migrations(limit=4, lease_seconds=300):
            assert all(o.lease_node == node.node and o.state == "migrating" for o in batch)
            got += [o.seq for o in batch]
            await asyncio.sleep(0.001)  # let the other node in (SQLite's lock is not fair)
        return got

    got_a, got_b = await asyncio.gather(drain(a), drain(b))
    assert not set(got_a) & set(got_b)
    assert len(got_a) + len(got_b) == 60


async def test_expired_lease_lets_another_node_take_over(
    open_node: OpenNode, clock: FakeClock
) -> None:
    a, b = await open_node("node-a"), await open_node("node-b")
    seq = await a.commit_object(pending("ckpt"))
    [claimed] = await a.claim_migrations(limit=10, lease_seconds=30)
    assert (claimed.seq, claimed.attempts) == (seq, 1)
    assert await b.claim_migrations(limit=10, lease_seconds=30) == []

    clock.advance(20)
    assert await a.renew_lease("bkt", "ckpt", seq, lease_seconds=30)
    clock.advance(20)  # still within the renewed lease
    assert await b.claim_migrations(limit=10, lease_seconds=30) == []

    clock.advance(31)  # node-a is dead, as far as anyone can tell
    [taken] = await b.claim_migrations(limit=10, lease_seconds=30)
    assert (taken.seq, taken.lease_node, taken.attempts) == (seq, "node-b", 2)
    assert not await a.renew_lease("bkt", "ckpt", seq, lease_seconds=30)
    assert not await a.complete_migration("bkt", "ckpt", seq)
    assert not await a.fail_migration("bkt", "ckpt", seq, "late", retry_at=0)
    assert await b.complete_migration("bkt", "ckpt", seq)
    assert not await b.complete_migration("bkt", "ckpt", seq)

    done = await a.get_object("bkt", "ckpt")
    assert done is not None
    assert (done.state, done.migrated_at, done.pending) == ("migrated", clock.time(), False)
    assert (await a.pending_summary()).objects == 0


async def test_expired_lease_nobody_took_still_completes(
    catalog: Catalog, clock: FakeClock
) -> None:
    seq = await catalog.commit_object(pending("slow"))
    await catalog.claim_migrations(limit=1, lease_seconds=10)
    clock.advance(100)
    assert await catalog.complete_migration("bkt", "slow", seq)


async def test_newer_version_committed_mid_migration_stays_pending(open_node: OpenNode) -> None:
    a, b = await open_node("node-a"), await open_node("node-b")
    v1 = await a.commit_object(pending("k", etag='"v1"', staging_key="stage/1"))
    [claimed] = await a.claim_migrations(limit=10, lease_seconds=60)
    v2 = await b.commit_object(pending("k", etag='"v2"', staging_key="stage/2"))

    # v2 waits until v1's copy is done: the home region must see versions in order.
    assert await b.claim_migrations(limit=10, lease_seconds=60) == []
    # v1's staging copy is still being read by its migration.
    assert await b.staging_garbage(limit=10, grace_seconds=0) == []
    assert not await a.complete_migration("bkt", "k", v2)  # a holds v1's lease, not v2's
    assert await a.complete_migration("bkt", "k", claimed.seq)
    assert [g.seq for g in await b.staging_garbage(limit=10, grace_seconds=0)] == [v1]

    head = await b.get_object("bkt", "k")
    assert head is not None
    assert (head.seq, head.state, head.etag) == (v2, "pending", '"v2"')
    [next_claim] = await b.claim_migrations(limit=10, lease_seconds=60)
    assert (next_claim.seq, next_claim.etag) == (v2, '"v2"')
    assert v1 == claimed.seq


async def test_superseded_versions_never_migrate_and_become_garbage(
    catalog: Catalog, clock: FakeClock
) -> None:
    v1 = await catalog.commit_object(pending("k", staging_key="stage/1"))
    clock.advance(1)
    v2 = await catalog.commit_object(pending("k", staging_key="stage/2"))
    [claimed] = await catalog.claim_migrations(limit=10, lease_seconds=60)
    assert claimed.seq == v2

    # Within the grace period a reader mid-GET may still be reading v1's staging copy.
    assert await catalog.staging_garbage(limit=10, grace_seconds=30) == []
    clock.advance(31)
    [garbage] = await catalog.staging_garbage(limit=10, grace_seconds=30)
    assert (garbage.seq, garbage.staging_key, garbage.latest) == (v1, "stage/1", False)
    await catalog.staging_deleted([v1])
    assert await catalog.staging_garbage(limit=10, grace_seconds=30) == []

    assert await catalog.complete_migration("bkt", "k", v2)
    clock.advance(31)
    [migrated] = await catalog.staging_garbage(limit=10, grace_seconds=30)
    assert (migrated.seq, migrated.staging_key) == (v2, "stage/2")
    await catalog.staging_deleted([v2])

    # Pruning forgets both once old enough; readers then go to the origin.
    await catalog.publish(EventKind.INVALIDATE, "bkt", "k")
    assert await catalog.prune(versions_older_than=3600, events_older_than=3600) == 0
    clock.advance(3600)
    assert await catalog.prune(versions_older_than=3600, events_older_than=3600) == 2 + 4
    assert await catalog.get_object("bkt", "k") is None


async def test_failed_migration_backs_off(catalog: Catalog, clock: FakeClock) -> None:
    seq = await catalog.commit_object(pending("k", size=7))
    await catalog.claim_migrations(limit=1, lease_seconds=60)
    retry_at = clock.time() + 30
    assert await catalog.fail_migration("bkt", "k", seq, "origin: 503 SlowDown", retry_at)

    failed = await catalog.get_object("bkt", "k")
    assert failed is not None
    assert (failed.state, failed.attempts, failed.last_error) == (
        "pending",
        1,
        "origin: 503 SlowDown",
    )
    assert failed.retry_at == retry_at
    assert (await catalog.pending_summary()).failures == 1
    assert await catalog.claim_migrations(limit=1, lease_seconds=60) == []

    clock.advance(30)
    [again] = await catalog.claim_migrations(limit=1, lease_seconds=60)
    assert again.attempts == 2
    assert await catalog.complete_migration("bkt", "k", seq)
    done = await catalog.get_object("bkt", "k")
    assert done is not None
    assert done.last_error == ""


async def test_pending_keys_are_the_latest_versions_not_home(catalog: Catalog) -> None:
    await catalog.commit_object(pending("x"))
    x2 = await catalog.commit_object(pending("x"))
    y = await catalog.commit_object(pending("y"))
    tomb = await catalog.commit_delete("bkt", "z")
    await catalog.claim_migrations(limit=10, lease_seconds=60)
    assert await catalog.complete_migration("bkt", "y", y)
    assert sorted(await catalog.pending_keys(10)) == [("bkt", "x", x2), ("bkt", "z", tomb)]
    assert len(await catalog.pending_keys(1)) == 1


async def test_a_delete_migrates_too(catalog: Catalog) -> None:
    put = await catalog.commit_object(pending("gone"))
    tomb = await catalog.commit_delete("bkt", "gone")
    [claimed] = await catalog.claim_migrations(limit=10, lease_seconds=60)
    assert (claimed.seq, claimed.deleted) == (tomb, True)
    assert put < tomb


async def test_a_migrated_version_is_requeued_only_while_its_staging_copy_is_there(
    catalog: Catalog,
) -> None:
    seq = await catalog.commit_object(pending("again"))
    await catalog.claim_migrations(limit=10, lease_seconds=60)
    assert await catalog.complete_migration("bkt", "again", seq)
    assert await catalog.requeue_migration("bkt", "again", seq)
    row = await catalog.get_object("bkt", "again")
    assert row is not None and row.state == "pending"
    *_, event = await catalog.events_after(0, 100)
    assert (event.kind, event.key, event.seq) == (EventKind.REQUEUED, "again", seq)
    [claimed] = await catalog.claim_migrations(limit=10, lease_seconds=60)
    assert claimed.seq == seq and await catalog.complete_migration("bkt", "again", seq)
    await catalog.staging_deleted([seq])
    assert not await catalog.requeue_migration("bkt", "again", seq)


# -- staging copies, uploads, documents ---------------------------------------------------


async def test_the_orphan_sweep_and_commits_never_both_win_a_staging_copy(
    open_node: OpenNode,
) -> None:
    a, b = await open_node("node-a"), await open_node("node-b")
    await a.commit_object(pending("named"))
    swept = await b.sweep_orphans(["stage/named", "stage/orphan", "file://n/x"])
    assert sorted(swept) == ["file://n/x", "stage/orphan"]
    with pytest.raises(StagingSwept):
        await a.commit_object(pending("orphan"))
    with pytest.raises(StagingSwept):
        await a.commit_object(pending("disk", staging_key="", local_path="file://n/x"))
    assert await a.get_object("bkt", "orphan") is None
    # Racing: each name goes to exactly one side.
    names = [f"race{i}" for i in range(20)]
    commits = [a.commit_object(pending(n)) for n in names]
    results = await asyncio.gather(
        b.sweep_orphans([f"stage/{n}" for n in names]), *commits, return_exceptions=True
    )
    swept_names = {name.removeprefix("stage/") for name in results[0]}  # type: ignore[union-attr]
    committed = {n for n, r in zip(names, results[1:], strict=True) if isinstance(r, int)}
    assert swept_names.isdisjoint(committed) and swept_names | committed == set(names)


async def test_uploads_in_progress_list_in_key_order_and_page(catalog: Catalog) -> None:
    for key, upload in [("b/2", "u3"), ("a", "u2"), ("b/1", "u1"), ("b/1", "u0"), ("c", "u4")]:
        await catalog.record_upload("bkt", key, upload)
    await catalog.record_upload("other", "b/1", "u9")
    found = await catalog.list_uploads("bkt", "b/")
    assert [(u.key, u.upload_id) for u in found] == [("b/1", "u0"), ("b/1", "u1"), ("b/2", "u3")]
    page = await catalog.list_uploads("bkt", "", ("b/1", "u0"), limit=2)
    assert [(u.key, u.upload_id) for u in page] == [("b/1", "u1"), ("b/2", "u3")]
    found_one = await catalog.get_upload("u9")
    assert found_one is not None and (found_one.bucket, found_one.key) == ("other", "b/1")
    await catalog.forget_upload("u1")
    assert [u.upload_id for u in await catalog.list_uploads("bkt", "b/")] == ["u0", "u3"]
    assert await catalog.get_upload("u1") is None


async def test_documents_are_versioned_and_announced_to_every_node(open_node: OpenNode) -> None:
    a, b = await open_node("node-a"), await open_node("node-b")
    assert await b.get_document("rules") is None
    async with await b.events() as stream:
        assert await a.put_document("rules", '{"rules": []}') == 1
        assert await a.put_document("rules", '{"rules": [1]}') == 2
        seen = []
        async for event in stream:
            seen.append((event.kind, event.key, event.seq))
            if len(seen) == 2:
                break
    assert seen == [(EventKind.DOCUMENT, "rules", 1), (EventKind.DOCUMENT, "rules", 2)]
    assert await b.get_document("rules") == (2, '{"rules": [1]}')


# -- named leases -------------------------------------------------------------------------


async def test_named_lease_is_exclusive_until_it_expires(
    open_node: OpenNode, clock: FakeClock
) -> None:
    a, b = await open_node("node-a"), await open_node("node-b")
    assert await a.acquire_lease("lifecycle", 60)
    assert not await b.acquire_lease("lifecycle", 60)
    assert await a.acquire_lease("lifecycle", 60)  # renewal
    assert await b.acquire_lease("other", 60)
    assert await b.lease_holder("lifecycle") == ("node-a", clock.time() + 60)

    clock.advance(61)
    assert await a.lease_holder("lifecycle") is None
    assert await b.acquire_lease("lifecycle", 60)
    assert not await a.acquire_lease("lifecycle", 60)

    await a.release_lease("lifecycle")  # not a's to release
    assert not await a.acquire_lease("lifecycle", 60)
    await b.release_lease("lifecycle")
    assert await a.acquire_lease("lifecycle", 60)


async def test_named_lease_race_has_one_winner(open_node: OpenNode) -> None:
    nodes = [await open_node(f"node-{i}") for i in range(4)]
    won = await asyncio.gather(*(n.acquire_lease("lifecycle", 60) for n in nodes))
    assert sorted(won) == [False, False, False, True]


# -- accesses and tiers -------------------------------------------------------------------


async def test_accesses_keep_the_latest_time(catalog: Catalog) -> None:
    await catalog.record_accesses([("b", "k", 100.0), ("b", "k", 50.0)])
    await catalog.record_accesses([("b", "k", 70.0)])
    assert await catalog.last_access("b", "k") == 100.0
    await catalog.record_accesses([("b", "k", 150.0)])
    assert await catalog.last_access("b", "k") == 150.0
    assert await catalog.last_access("b", "nope") is None

    assert await catalog.get_tier("b", "k") is None
    await catalog.set_tier("b", "k", "archive", 160.0)
    await catalog.set_tier("b", "tier-only", "warm", 161.0)
    assert await catalog.get_tier("b", "k") == ("archive", 160.0)
    records = await catalog.list_accesses("b")
    assert [(r.key, r.last_access, r.tier, r.tier_at) for r in records] == [
        ("k", 150.0, "archive", 160.0),
        ("tier-only", None, "warm", 161.0),
    ]


async def test_accesses_upsert_and_page_over_100k_rows(
    catalog: Catalog, catalog_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    n = 100_000
    keys = [f"runs/{i % 97:02d}/shard-{i:06d}" for i in range(n)]
    started = time.perf_counter()
    await catalog.record_accesses(("data", key, 1000.0) for key in keys)
    inserted = time.perf_counter()
    # A second batch: half the objects read later, half with an older time (ignored).
    await catalog.record_accesses(
        ("data", k, 2000.0 if i % 2 else 500.0) for i, k in enumerate(keys)
    )
    upserted = time.perf_counter()

    seen = 0
    previous = b""
    async for record in catalog.iter_accesses("data", page=5000):
        assert record.key.encode() > previous
        previous = record.key.encode()
        seen += 1
    paged = time.perf_counter()
    assert seen == n
    under = [r async for r in catalog.iter_accesses("data", prefix="runs/05/", page=300)]
    assert len(under) == len([k for k in keys if k.startswith("runs/05/")])
    assert await catalog.last_access("data", keys[1]) == 2000.0
    assert await catalog.last_access("data", keys[2]) == 1000.0
    backend = catalog_url.split(":", maxsplit=1)[0]
    with capsys.disabled():
        print(
            f"\n[{backend}] accesses: insert {n} {inserted - started:.2f}s,"
            f" upsert {n} {upserted - inserted:.2f}s, page {n} {paged - upserted:.2f}s"
        )


# -- events -------------------------------------------------------------------------------


async def test_events_reach_another_node(open_node: OpenNode) -> None:
    a, b = await open_node("node-a"), await open_node("node-b")
    async with await b.events() as stream:
        seq = await a.commit_object(pending("new"))
        put = await asyncio.wait_for(anext(stream), 5)
        assert (put.kind, put.bucket, put.key, put.seq, put.node) == (
            "put",
            "bkt",
            "new",
            seq,
            "node-a",
        )

        started = time.monotonic()
        event_id = await a.publish(EventKind.INVALIDATE, "bkt", "cached", 0)
        invalidate = await asyncio.wait_for(anext(stream), 5)
        latency = time.monotonic() - started
        assert (invalidate.id, invalidate.kind, invalidate.key) == (
            event_id,
            "invalidate",
            "cached",
        )
        # PostgreSQL's fallback poll is 30 s here: only NOTIFY can be this quick.
        assert latency < 2.0

        tomb = await a.commit_delete("bkt", "new")
        [claimed] = await a.claim_migrations(limit=1, lease_seconds=60)
        await a.complete_migration("bkt", "new", claimed.seq)
        kinds = [await asyncio.wait_for(anext(stream), 5) for _ in range(2)]
        assert [(e.kind, e.seq) for e in kinds] == [("delete", tomb), ("migrated", tomb)]


async def test_events_published_concurrently_by_two_nodes_arrive_once_each(
    open_node: OpenNode,
) -> None:
    a, b, reader = await open_node("node-a"), await open_node("node-b"), await open_node("r")
    async with await reader.events() as stream:
        ids = await asyncio.gather(
            *(
                node.publish("invalidate", "bkt", f"{node.node}/{i}")
                for i in range(100)
                for node in (a, b)
            )
        )
        got = [await asyncio.wait_for(anext(stream), 5) for _ in ids]
        assert sorted(e.id for e in got) == sorted(ids)
        # Nothing more: no event is delivered twice.
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(stream), 0.3)


async def test_events_replay_from_a_position_in_order(catalog: Catalog) -> None:
    ids = [await catalog.publish("invalidate", "bkt", f"k{i}", i) for i in range(30)]
    assert await catalog.last_event_id() == ids[-1]
    async with await catalog.events(after=ids[9]) as stream:
        got = [await asyncio.wait_for(anext(stream), 5) for _ in range(20)]
    assert [e.id for e in got] == ids[10:]
    assert [e.key for e in got] == [f"k{i}" for i in range(10, 30)]


async def test_closing_the_catalog_ends_its_streams(catalog: Catalog) -> None:
    stream = await catalog.events()
    reader = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.1)
    await catalog.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(reader, 5)


async def test_postgres_events_survive_losing_the_listening_connection(
    postgres_server: PostgresServer, clock: FakeClock
) -> None:
    url = postgres_server.create_database("listen_loss")
    async with (
        await open_catalog(url, clock=clock, node="a", settings=SETTINGS) as a,
        await open_catalog(url, clock=clock, node="b", settings=SETTINGS) as b,
        await b.events() as stream,
    ):
        killer = await asyncpg.connect(url)
        try:
            killed = await killer.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE datname = current_database() AND query LIKE 'LISTEN%'"
            )
        finally:
            await killer.close()
        assert killed == 1
        await asyncio.sleep(0.2)
        await a.publish("invalidate", "bkt", "after-loss")
        event = await asyncio.wait_for(anext(stream), 10)
        assert event.key == "after-loss"
        # And it listens again: the next one comes by NOTIFY, not the 30 s poll.
        await a.publish("invalidate", "bkt", "relistened")
        assert (await asyncio.wait_for(anext(stream), 5)).key == "relistened"


async def test_postgres_a_stream_from_now_gets_an_event_whose_id_came_before_it_and_its_commit_after(
    postgres_server: PostgresServer, clock: FakeClock
) -> None:
    """Ids are handed out at insert and seen at commit: a stream opened between the two
    starts above the id, and must still deliver the event when its transaction commits."""
    url = postgres_server.create_database("late_commit")
    async with (
        await open_catalog(url, clock=clock, node="a", settings=SETTINGS) as a,
        await open_catalog(url, clock=clock, node="b", settings=SETTINGS) as b,
    ):
        await a.publish("invalidate", "bkt", "before")
        writer = await asyncpg.connect(url)
        try:
            late = writer.transaction()
            await late.start()
            late_id = await writer.fetchval(
                "INSERT INTO events (at, kind, bucket, key, seq, node)"
                " VALUES (0, 'invalidate', 'bkt', 'late', 0, 'w') RETURNING id"
            )
            newer = await a.publish("invalidate", "bkt", "newer")
            assert newer > late_id
            async with await b.events() as stream:
                await late.commit()
                await a.publish("invalidate", "bkt", "after")
                got = [(await asyncio.wait_for(anext(stream), 5)).key for _ in range(2)]
        finally:
            await writer.close()
    assert sorted(got) == ["after", "late"]


# -- schema and connections ----------------------------------------------------------------

_OPEN_AT = """
import asyncio, sys, time
from lota.catalog import PendingObject, open_catalog
from lota.clock import Clock

async def main() -> None:
    url, start_at, node = sys.argv[1:]
    await asyncio.sleep(max(0.0, float(start_at) - time.time()))
    catalog = await open_catalog(url, clock=Clock(), node=node)
    await catalog.commit_object(PendingObject(bucket="b", key=node))
    await catalog.close()

asyncio.run(main())
"""


async def test_processes_opening_a_new_catalog_at_once_migrate_it_once(catalog_url: str) -> None:
    start_at = f"{time.time() + 2.0:.3f}"
    procs = [
        subprocess.Popen([sys.executable, "-c", _OPEN_AT, catalog_url, start_at, f"p{i}"])
        for i in range(4)
    ]
    codes = [await asyncio.to_thread(proc.wait, 30) for proc in procs]
    assert codes == [0, 0, 0, 0]
    versions = await raw_rows(catalog_url, "SELECT version FROM schema_version ORDER BY version")
    assert versions == [(1,), (2,)]
    keys = await raw_rows(catalog_url, "SELECT key FROM objects ORDER BY key")
    assert keys == [("p0",), ("p1",), ("p2",), ("p3",)]


async def test_a_schema_newer_than_this_lota_is_refused(catalog_url: str, clock: FakeClock) -> None:
    async with await open_catalog(catalog_url, clock=clock, node="n"):
        pass
    sql = "INSERT INTO schema_version VALUES (99, 'from the future', 0)"
    if catalog_url.startswith("sqlite:"):
        with sqlite3.connect(catalog_url.removeprefix("sqlite:///")) as conn:
            conn.execute(sql)
    else:
        conn = await asyncpg.connect(catalog_url)
        await conn.execute(sql)
        await conn.close()
    with pytest.raises(CatalogVersionError, match="99"):
        await open_catalog(catalog_url, clock=clock, node="n")


async def test_unreachable_postgres_is_unavailable(clock: FakeClock) -> None:
    settings = CatalogSettings(connect_timeout=2)
    with pytest.raises(CatalogUnavailable, match="lota:\\*\\*\\*@"):
        await open_catalog(
            "postgresql://lota:secret@127.0.0.1:1/none", clock=clock, node="n", settings=settings
        )


async def test_sqlite_path_that_cannot_be_a_database(tmp_path: Path, clock: FakeClock) -> None:
    with pytest.raises(CatalogError):
        await open_catalog(f"sqlite:///{tmp_path}", clock=clock, node="n")


async def test_postgres_fixture_runs_a_real_server(postgres_url: str) -> None:
    conn = await asyncpg.connect(postgres_url)
    try:
        version = await conn.fetchval("SELECT version()")
        assert version.startswith("PostgreSQL ")
        assert await conn.fetchval("SELECT 6 * 7") == 42
    finally:
        await conn.close()


async def test_a_postgres_catalog_closes_in_seconds_though_a_connection_is_held(
    postgres_url: str,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A pool connection never released (stuck) keeps a graceful close waiting forever;
    closing gives up after CLOSE_TIMEOUT and cuts the connections, with a warning."""
    from lota.catalog import postgres

    monkeypatch.setattr(postgres, "CLOSE_TIMEOUT", 0.5)
    catalog = await open_catalog(postgres_url, clock=clock, node="n")
    assert isinstance(catalog, postgres.PostgresCatalog)
    held = await catalog._pool.acquire()
    started = time.monotonic()
    await catalog.close()
    assert time.monotonic() - started < 5
    assert "closing: timed out" in caplog.text
    with pytest.raises(asyncpg.InterfaceError):  # cut
        await held.fetchval("SELECT 1")
