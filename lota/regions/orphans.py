"""The orphan sweep: staged objects that no catalog entry names are deleted.

A write that fails between staging and commit (the node died, the catalog refused) leaves
its staged copy behind, and nothing else would ever delete it. Each migrator sweeps its
node's staging area, one bounded page of its listing per round (at most every
``staging_grace``, at least every minute), under a catalog lease of that area's, so that
one node of a region does it. A staged object older than ``staging_grace`` (and than the
migration lease: a write may still be between its staging and its commit) that no version
names is recorded as swept in the catalog, then deleted. The catalog does both checks
atomically with commits (:meth:`Catalog.sweep_orphans`): a commit that names a swept copy
fails, unacknowledged, so the sweep never takes a copy a write still needs.
"""

from __future__ import annotations

import logging
import time

from lota.catalog import Catalog
from lota.clock import Clock
from lota.config import WriteConfig
from lota.errors import LotaError
from lota.metrics import Metrics
from lota.regions.staging import Staging

log = logging.getLogger("lota.migrator")

PAGE = 1000


class OrphanSweep:
    """Sweeps this node's staging area, a page per round (see the module docstring)."""

    def __init__(
        self,
        catalog: Catalog,
        staging: Staging,
        config: WriteConfig,
        metrics: Metrics,
        clock: Clock,
        page: int = PAGE,
    ) -> None:
        self._catalog = catalog
        self._staging = staging
        self._metrics = metrics
        self._clock = clock
        self._page = page
        self._age = max(config.staging_grace, config.lease)
        self._every = min(60.0, max(1.0, config.staging_grace))
        self._lease = config.lease
        self._after = ""
        self._next = 0.0

    async def sweep(self) -> int:
        """One round, if one is due and this node holds the lease; returns how many
        orphans it deleted."""
        if time.monotonic() < self._next or not self._staging.configured:
            return 0
        self._next = time.monotonic() + self._every
        area = self._staging.location("")  # the area's root: one lease per area
        if not await self._catalog.acquire_lease(f"orphans {area}", self._lease):
            return 0
        try:
            entries, self._after = await self._staging.entries(self._after, self._page)
        except (LotaError, OSError) as exc:  # the start-up check says why, once
            log.debug("orphan sweep: cannot list %s: %s", area, exc)
            return 0
        cutoff = self._clock.time() - self._age
        old = {self._staging.name(e.key): e.key for e in entries if e.modified <= cutoff}
        deleted = 0
        for name in await self._catalog.sweep_orphans(list(old)):
            location = self._staging.location(old[name])
            try:
                await self._staging.delete(location)
            except (LotaError, OSError) as exc:
                log.warning("cannot delete orphan staging copy %s: %s", location, exc)
                continue
            deleted += 1
            self._metrics.staging_orphans_swept.inc()
            log.info("deleted orphan staging copy %s (no write committed it)", location)
        return deleted
