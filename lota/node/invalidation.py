"""Write invalidation: a write through LOTA drops the cached copies it makes stale.

* On this node, at once: the addressed keys' cached copies, in this worker and its
  sibling workers, before a write is sent on and again after it (a read that crossed the
  write may have cached the old version).
* On the other nodes, through the catalog: an ``INVALIDATE`` event per key, which each
  node's :func:`follow_events` turns into a local drop. Accelerated writes need no event
  of their own: the catalog commit publishes one, and on the writing node the bytes kept
  as they were written replace the old copy (:mod:`lota.regions.accelerate`). A cluster
  without a catalog tells the other nodes itself, with a signed peer call to each
  (:mod:`lota.cluster.endpoint`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from lota.catalog import Catalog, Event, EventKind
from lota.node.features import CacheFeature, CatalogFeature

# Operations after which cached copies of the addressed object(s) are stale.
INVALIDATING = frozenset(
    {
        "PutObject",
        "CopyObject",
        "DeleteObject",
        "CompleteMultipartUpload",
        "PutObjectTagging",
        "DeleteObjectTagging",
        "PutObjectAcl",
        "RestoreObject",
    }
)
# Catalog events after which other nodes' cached copies of the key are stale.
# (A requeued version went home again because an older one landed after it there: what was
# read from home meanwhile is that older one.)
_INVALIDATING_EVENTS = frozenset(
    {EventKind.PUT, EventKind.DELETE, EventKind.REQUEUED, EventKind.INVALIDATE}
)


class Invalidation:
    """Drops cached copies of the keys a write changes."""

    def __init__(self, cache: CacheFeature, catalog: CatalogFeature) -> None:
        self._cache = cache
        self._catalog = catalog.catalog
        self._catalog_on = catalog.on

    async def drop_cached(self, bucket: str, keys: list[str]) -> None:
        """Drop this node's cached copies, in every worker (accelerated writes: the
        catalog's own events tell the other nodes)."""
        for key in keys:
            await self._cache.invalidate(bucket, key)
        await self._cache.tell_siblings(bucket, keys)

    async def drop_in_siblings(self, bucket: str, keys: list[str]) -> None:
        """Drop the cached copies the node's other workers hold (an accelerated write
        replaced this worker's itself)."""
        await self._cache.tell_siblings(bucket, keys)

    async def invalidate(self, bucket: str, keys: list[str]) -> None:
        """Drop cached copies of objects a write changes (before and after it), here and,
        through the catalog, on every other node."""
        await self.drop_cached(bucket, keys)
        if not self._catalog_on:
            await self._cache.tell_nodes(bucket, keys)
        for key in keys:
            await self._catalog.publish(EventKind.INVALIDATE, bucket, key)


async def follow_events(
    catalog: Catalog,
    cache: CacheFeature,
    node: str,
    documents: Callable[[Event], Awaitable[None]],
) -> None:
    """Drop cached copies that writes on other nodes made stale; when a version reaches its
    home, drop any other version of the key held here (a read that crossed the write may
    have cached an older one) but keep that one (its writer kept it as it was written).
    Hand ``document`` events (the lifecycle rules changed) to `documents`."""
    async with await catalog.events() as stream:
        async for event in stream:
            if event.kind == EventKind.DOCUMENT:
                await documents(event)
            elif event.kind == EventKind.MIGRATED:
                if held := cache.cached_etag(event.bucket, event.key):
                    keep = await _migrated_etag(catalog, event)
                    await cache.invalidate(event.bucket, event.key, keep if keep == held else "")
            elif event.node != node and event.kind in _INVALIDATING_EVENTS:
                await cache.invalidate(event.bucket, event.key)


async def _migrated_etag(catalog: Catalog, event: Event) -> str:
    """The ETag of the version a ``migrated`` event names, if it is still the latest."""
    latest = await catalog.get_object(event.bucket, event.key)
    if latest is None or latest.seq != event.seq or latest.deleted:
        return ""
    return latest.etag
