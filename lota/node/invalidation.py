"""Write invalidation: a write through LOTA drops the cached copies it makes stale.

* On this node, at once: the addressed keys' cached copies, in this worker and its
  sibling workers, before a write is sent on and again after it (a read that crossed the
  write may have cached the old version).
* On the other nodes, through the catalog: an ``INVALIDATE`` event per key, which each
  node's :func:`follow_events` turns into a local drop. Accelerated writes need no event
  of their own: the catalog commit publishes one. A cluster without a catalog tells the
  other nodes itself, with a signed peer call to each (:mod:`lota.cluster.endpoint`).
"""

from __future__ import annotations

from lota.catalog import Catalog, EventKind
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
_INVALIDATING_EVENTS = frozenset({EventKind.PUT, EventKind.DELETE, EventKind.INVALIDATE})


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

    async def invalidate(self, bucket: str, keys: list[str]) -> None:
        """Drop cached copies of objects a write changes (before and after it), here and,
        through the catalog, on every other node."""
        await self.drop_cached(bucket, keys)
        if not self._catalog_on:
            await self._cache.tell_nodes(bucket, keys)
        for key in keys:
            await self._catalog.publish(EventKind.INVALIDATE, bucket, key)


async def follow_events(catalog: Catalog, cache: CacheFeature, node: str) -> None:
    """Drop cached copies that writes on other nodes made stale, and every copy of a
    key whose new version just reached its home (an older one may have been cached
    by a read that crossed the write)."""
    async with await catalog.events() as stream:
        async for event in stream:
            if event.kind == EventKind.MIGRATED or (
                event.node != node and event.kind in _INVALIDATING_EVENTS
            ):
                await cache.invalidate(event.bucket, event.key)
