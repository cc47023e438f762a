"""The catalog: the metadata every LOTA node of a cluster shares.

It holds the writes accepted through cross-region write acceleration until they reach
their home region (versions ordered by a commit sequence, migration work handed out under
leases), named leases for singleton engines (lifecycle), last-access times and storage
tiers per object, and events that other nodes must hear (invalidations, new writes).

One small interface, :class:`Catalog`, two backends picked by URL:

- ``sqlite:////var/lib/lota/catalog.db`` (four slashes: absolute path; ``sqlite:///rel.db``
  relative): embedded, the default; WAL, safe for several processes on one machine;
  other processes see events by polling.
- ``postgresql://user@host:port/db``: a real cluster, every node and region points at it;
  events arrive through LISTEN/NOTIFY.

Usage::

    catalog = await open_catalog(config.catalog.url, clock=clock, node=node_name)
    try:
        seq = await catalog.commit_object(PendingObject(bucket="b", key="k", size=3, ...))
        async with await catalog.events() as stream:
            async for event in stream:
                ...
    finally:
        await catalog.close()

Errors (every database or network error is translated once, where it enters)::

    LotaError                       lota.errors (the whole tree is drawn there)
    └── CatalogError                a catalog operation failed (bad URL, SQL error, closed)
        ├── CatalogUnavailable      the database is unreachable or stayed locked: transient,
        │                           retry later (a write path answers 503 ServiceUnavailable)
        ├── CatalogVersionError     the database's schema is newer than this LOTA
        └── StagingSwept            a commit named a staging copy the orphan sweep took

``asyncio.CancelledError`` always propagates. A cancelled call may still have taken effect
(a commit is atomic, but its caller may not hear that it happened).
"""

from __future__ import annotations

from lota.catalog.base import Catalog, CatalogSettings, CatalogURL, parse_url
from lota.catalog.events import EventStream
from lota.catalog.model import (
    AccessRecord,
    CatalogObject,
    Event,
    EventKind,
    PendingObject,
    PendingSummary,
    State,
    UploadRecord,
    retry_delay,
)
from lota.clock import Clock

__all__ = [
    "AccessRecord",
    "Catalog",
    "CatalogObject",
    "CatalogSettings",
    "CatalogURL",
    "Event",
    "EventKind",
    "EventStream",
    "PendingObject",
    "PendingSummary",
    "State",
    "UploadRecord",
    "open_catalog",
    "parse_url",
    "retry_delay",
]


async def open_catalog(
    url: str, *, clock: Clock, node: str, settings: CatalogSettings | None = None
) -> Catalog:
    """Open (creating or migrating its schema if needed) the catalog at `url` as `node`."""
    parsed = parse_url(url)
    settings = settings or CatalogSettings()
    if parsed.backend == "sqlite":
        from lota.catalog.sqlite import SQLiteCatalog

        return await SQLiteCatalog.open(
            parsed.target, url=url, clock=clock, node=node, settings=settings
        )
    from lota.catalog.postgres import PostgresCatalog

    return await PostgresCatalog.open(
        parsed.target, url=url, clock=clock, node=node, settings=settings
    )
