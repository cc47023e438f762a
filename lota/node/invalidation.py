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

import asyncio
import logging
from collections.abc import Awaitable, Callable

from lota.catalog import Catalog, Event, EventKind
from lota.catalog.events import EventStream
from lota.errors import CatalogError
from lota.node.features import CacheFeature, CatalogFeature

log = logging.getLogger("lota.node")

_RETRY_FIRST, _RETRY_MOST = 0.5, 5.0
"""Seconds before an event whose handling the catalog failed is handled again (doubling)."""
CATCH_UP_TIMEOUT = 10.0
"""Seconds a starting worker waits for the events it missed to be handled."""

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


async def resume_after(catalog: Catalog, saved: int | None) -> int | None:
    """Where a worker's event stream starts: after the position saved with its cache, if
    the catalog still holds every event since (events are pruned by age); else from now
    on (None), and copies written elsewhere meanwhile are left to revalidation."""
    if saved is None:
        return None
    last = await catalog.last_event_id()
    oldest = await catalog.events_after(0, 1)
    if saved > last or (saved < last and (not oldest or oldest[0].id > saved + 1)):
        log.warning(
            "the catalog no longer holds the events since this cache's position (%d; it "
            "holds %s up to %d): writes made elsewhere meanwhile are caught by revalidation",
            saved,
            f"from {oldest[0].id}" if oldest else "none",
            last,
        )
        return None
    return saved


async def catch_up(stream: EventStream) -> None:
    """Wait until the follower has handled every event committed so far, so that what was
    written elsewhere while this worker was down is dropped before it serves; at most
    :data:`CATCH_UP_TIMEOUT` (a catalog slow to answer delays serving, never stops it)."""
    try:
        await asyncio.wait_for(stream.caught_up.wait(), CATCH_UP_TIMEOUT)
    except TimeoutError:
        log.warning("catalog events: not caught up after %.0fs; serving", CATCH_UP_TIMEOUT)


async def follow_events(
    stream: EventStream,
    catalog: Catalog,
    cache: CacheFeature,
    node: str,
    documents: Callable[[Event], Awaitable[None]],
) -> None:
    """Drop cached copies that writes on other nodes made stale; when a version reaches its
    home, drop any other version of the key held here (a read that crossed the write may
    have cached an older one) but keep that one (its writer kept it as it was written).
    Hand ``document`` events (the lifecycle rules changed) to `documents`. `stream` is
    ``catalog.events()``, opened by the caller before it read what the events update (the
    rules), so nothing committed in between is missed, and after the position saved with
    the cache (:func:`resume_after`), which each event handled moves on; closed here.

    An event whose handling the catalog fails (an outage while the rules are read again)
    is handled again until it works, the next events waiting behind it, as the stream
    itself waits out an outage (a ``migrated`` event does not wait: it drops every
    version held); any other failure is logged and the next event handled."""
    saved = -1

    def save() -> None:  # after each event handled, and when idle (holes given up)
        nonlocal saved
        if stream.position != saved:
            saved = stream.position
            cache.save_event_position(saved)

    async with stream:
        save()
        stream.on_idle = save
        async for event in stream:
            # Catching up after a restart, this node's own writes count too: a sibling
            # worker took them while this one was down, and could not tell it.
            own = node if stream.caught_up.is_set() else ""
            delay = _RETRY_FIRST
            while not stream.closed:
                try:
                    await _follow(event, catalog, cache, own, documents)
                    break
                except CatalogError as exc:
                    log.log(
                        logging.WARNING if delay == _RETRY_FIRST else logging.DEBUG,
                        "catalog event %d (%s): %s; handling it again in %.1fs",
                        event.id,
                        event.kind,
                        exc,
                        delay,
                    )
                    await asyncio.sleep(delay)
                    delay = min(2 * delay, _RETRY_MOST)
                except Exception:
                    log.exception("catalog event %d (%s) not handled", event.id, event.kind)
                    break
            else:
                return  # closed while the event waited to be handled again: not handled
            save()


async def _follow(
    event: Event,
    catalog: Catalog,
    cache: CacheFeature,
    own: str,
    documents: Callable[[Event], Awaitable[None]],
) -> None:
    """Handle one event; invalidations by node `own` (this one, whose writes dropped
    their copies here as they were made) are passed over."""
    if event.kind == EventKind.DOCUMENT:
        await documents(event)
    elif event.kind == EventKind.MIGRATED:
        if held := cache.cached_etag(event.bucket, event.key):
            try:
                keep = await _migrated_etag(catalog, event)
            except CatalogError:  # not knowing which version is home: keep none
                keep = ""
            await cache.invalidate(event.bucket, event.key, keep if keep == held else "")
    elif event.node != own and event.kind in _INVALIDATING_EVENTS:
        await cache.invalidate(event.bucket, event.key)


async def _migrated_etag(catalog: Catalog, event: Event) -> str:
    """The ETag of the version a ``migrated`` event names, if it is still the latest."""
    latest = await catalog.get_object(event.bucket, event.key)
    if latest is None or latest.seq != event.seq or latest.deleted:
        return ""
    return latest.etag
