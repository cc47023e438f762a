"""Following the catalog's events: a failure handling one event neither stops the
follower nor loses the event."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from lota.catalog import CatalogSettings, Event, EventKind, open_catalog
from lota.catalog.events import EventCursor, EventStream, Waker
from lota.clock import Clock, FakeClock
from lota.errors import CatalogUnavailable
from lota.node import invalidation
from lota.node.features import CacheFeature


async def test_an_event_the_catalog_fails_to_handle_is_handled_again_and_a_broken_one_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(invalidation, "_RETRY_FIRST", 0.01)
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    here = await open_catalog(url, clock=Clock(), node="here")
    elsewhere = await open_catalog(url, clock=Clock(), node="elsewhere")
    handled: list[tuple[str, str]] = []
    failures = {"rules": 2, "broken": 1}

    async def documents(event: Event) -> None:
        if failures["rules"]:
            failures["rules"] -= 1
            raise CatalogUnavailable("catalog down while the rules are read again")
        handled.append(("document", event.key))

    async def invalidate(bucket: str, key: str, keep: str = "") -> None:
        if key == "broken" and failures["broken"]:
            failures["broken"] -= 1
            raise RuntimeError("a bug")
        handled.append((bucket, key))

    cache = dataclasses.replace(CacheFeature.off(), invalidate=invalidate)
    stream = await here.events()
    follower = asyncio.ensure_future(
        invalidation.follow_events(stream, here, cache, "here", documents)
    )
    try:
        await elsewhere.publish(EventKind.DOCUMENT, "", "rules", 1)
        for key in ("broken", "k1"):
            await elsewhere.publish(EventKind.INVALIDATE, "bkt", key)
        async with asyncio.timeout(10):
            while len(handled) < 2:
                await asyncio.sleep(0.01)
        assert handled == [("document", "rules"), ("bkt", "k1")]
        assert failures == {"rules": 0, "broken": 0}
        assert not follower.done()
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        for catalog in (here, elsewhere):
            await catalog.close()


async def test_a_migrated_event_whose_version_the_catalog_cannot_say_drops_every_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    here = await open_catalog(url, clock=Clock(), node="here")
    dropped: list[tuple[str, str, str]] = []

    async def invalidate(bucket: str, key: str, keep: str = "") -> None:
        dropped.append((bucket, key, keep))

    async def unavailable(bucket: str, key: str) -> None:
        raise CatalogUnavailable("catalog down")

    async def documents(event: Event) -> None: ...

    cache = dataclasses.replace(
        CacheFeature.off(), invalidate=invalidate, cached_etag=lambda b, k: '"held"'
    )
    stream = await here.events()
    monkeypatch.setattr(here, "get_object", unavailable)
    follower = asyncio.ensure_future(
        invalidation.follow_events(stream, here, cache, "here", documents)
    )
    try:
        await here.publish(EventKind.MIGRATED, "bkt", "m", 7)
        async with asyncio.timeout(10):
            while not dropped:
                await asyncio.sleep(0.01)
        assert dropped == [("bkt", "m", "")]
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await here.close()


async def test_a_worker_resumes_after_its_saved_position_only_while_the_catalog_holds_what_followed(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    catalog = await open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", clock=clock, node="n")
    try:
        assert await invalidation.resume_after(catalog, None) is None
        for key in ("a", "b", "c"):
            await catalog.publish(EventKind.INVALIDATE, "bkt", key)
        clock.advance(3600)
        for key in ("d", "e"):
            await catalog.publish(EventKind.INVALIDATE, "bkt", key)
        assert [await invalidation.resume_after(catalog, n) for n in (0, 2, 5)] == [0, 2, 5]
        assert await invalidation.resume_after(catalog, 6) is None  # another catalog's
        await catalog.prune(versions_older_than=60, events_older_than=60)  # a, b, c
        assert await invalidation.resume_after(catalog, 3) == 3  # d, e: all it missed
        assert await invalidation.resume_after(catalog, 2) is None  # c is gone
        assert await invalidation.resume_after(catalog, 5) == 5
    finally:
        await catalog.close()


async def test_a_stream_says_when_its_reader_has_taken_every_event_committed(
    tmp_path: Path,
) -> None:
    catalog = await open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", clock=Clock(), node="n")
    try:
        for key in ("a", "b"):
            await catalog.publish(EventKind.INVALIDATE, "bkt", key)
        async with await catalog.events(after=0) as stream:
            assert (await anext(stream)).key == "a"
            assert not stream.caught_up.is_set()
            assert (await anext(stream)).key == "b"
            assert not stream.caught_up.is_set()  # "b" may still be in hand
            waiting = asyncio.ensure_future(anext(stream))
            await asyncio.wait_for(stream.caught_up.wait(), 5)
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
    finally:
        await catalog.close()


async def test_the_position_saved_covers_each_event_once_handled_and_none_read_ahead(
    tmp_path: Path,
) -> None:
    """The stream reads events in batches; the position saved after each one handled
    stays below those read and not yet handled. Catching up, this node's own writes
    count (a sibling worker took them while this one was down); after, they do not."""
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    here = await open_catalog(url, clock=Clock(), node="here")
    elsewhere = await open_catalog(url, clock=Clock(), node="elsewhere")
    saved: list[int] = []
    dropped: list[str] = []

    async def invalidate(bucket: str, key: str, keep: str = "") -> None:
        dropped.append(key)

    async def documents(event: Event) -> None: ...

    cache = dataclasses.replace(
        CacheFeature.off(), invalidate=invalidate, save_event_position=saved.append
    )
    await elsewhere.publish(EventKind.INVALIDATE, "bkt", "a")
    await here.publish(EventKind.INVALIDATE, "bkt", "b")  # a sibling's write, missed
    await elsewhere.publish(EventKind.INVALIDATE, "bkt", "c")
    stream = await here.events(after=0)
    follower = asyncio.ensure_future(
        invalidation.follow_events(stream, here, cache, "here", documents)
    )
    try:
        await invalidation.catch_up(stream)
        assert (saved, dropped) == ([0, 1, 2, 3], ["a", "b", "c"])
        await here.publish(EventKind.INVALIDATE, "bkt", "d")  # this worker's own write
        await elsewhere.publish(EventKind.INVALIDATE, "bkt", "e")
        async with asyncio.timeout(10):
            while saved[-1] != 5:
                await asyncio.sleep(0.01)
        assert dropped == ["a", "b", "c", "e"]
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        for catalog in (here, elsewhere):
            await catalog.close()


class _Down:
    """A catalog that cannot be read while `down` (what an outage looks like to a stream),
    and holds no events."""

    down = True

    async def events_after(self, after: int, limit: int) -> list[Event]:
        if self.down:
            raise CatalogUnavailable("catalog down")
        return []

    async def events_by_id(self, ids: Sequence[int]) -> list[Event]:
        if self.down:
            raise CatalogUnavailable("catalog down")
        return []


async def test_a_stream_that_cannot_read_is_not_caught_up() -> None:
    stream = EventStream(_Down(), Waker(), EventCursor(0, gap_timeout=5), poll_interval=0.01)
    reader = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.1)
    assert not stream.caught_up.is_set()
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)


async def test_a_position_held_low_by_holes_is_saved_again_once_they_are_given_up(
    tmp_path: Path,
) -> None:
    """A stream from now on awaits the ids below its start that are not in the catalog
    (maybe not committed yet; here pruned): its position is below them until they are
    given up, and is saved again then, with no event to handle (a quiet cluster), so that
    the next start finds the catalog still holds what follows it."""
    clock = FakeClock()
    settings = CatalogSettings(poll_interval=0.05, gap_timeout=0.3)
    url = f"sqlite:///{tmp_path / 'catalog.db'}"
    catalog = await open_catalog(url, clock=clock, node="n", settings=settings)
    saved: list[int] = []

    async def documents(event: Event) -> None: ...

    cache = dataclasses.replace(CacheFeature.off(), save_event_position=saved.append)
    for key in ("a", "b", "c"):
        await catalog.publish(EventKind.INVALIDATE, "bkt", key)
    clock.advance(3600)
    await catalog.prune(versions_older_than=60, events_older_than=60)
    stream = await catalog.events()
    follower = asyncio.ensure_future(
        invalidation.follow_events(stream, catalog, cache, "n", documents)
    )
    try:
        async with asyncio.timeout(10):
            while saved[-1:] != [3]:
                await asyncio.sleep(0.02)
        assert saved == [0, 3]
        assert await invalidation.resume_after(catalog, saved[-1]) == 3
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await catalog.close()


async def test_a_stream_catches_up_once_it_can_read_again() -> None:
    source = _Down()
    stream = EventStream(source, Waker(), EventCursor(0, gap_timeout=5), poll_interval=0.01)
    reader = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.1)
    assert not stream.caught_up.is_set()
    source.down = False
    await asyncio.wait_for(stream.caught_up.wait(), 5)
    reader.cancel()
    await asyncio.gather(reader, return_exceptions=True)


async def test_an_event_still_failing_when_the_stream_closes_moves_no_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(invalidation, "_RETRY_FIRST", 0.01)
    catalog = await open_catalog(f"sqlite:///{tmp_path / 'catalog.db'}", clock=Clock(), node="n")
    saved: list[int] = []
    tries: list[int] = []

    async def documents(event: Event) -> None:
        tries.append(event.id)
        raise CatalogUnavailable("catalog down while the rules are read again")

    cache = dataclasses.replace(CacheFeature.off(), save_event_position=saved.append)
    await catalog.publish(EventKind.DOCUMENT, "", "rules", 1)
    stream = await catalog.events(after=0)
    follower = asyncio.ensure_future(
        invalidation.follow_events(stream, catalog, cache, "n", documents)
    )
    try:
        async with asyncio.timeout(10):
            while len(tries) < 3:
                await asyncio.sleep(0.01)
        await stream.aclose()
        await asyncio.wait_for(follower, 5)
        assert saved == [0]  # the rules were never read: the next start reads them again
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        await catalog.close()
