"""Following the catalog's events: a failure handling one event neither stops the
follower nor loses the event."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from lota.catalog import Event, EventKind, open_catalog
from lota.clock import Clock
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
