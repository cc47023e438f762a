"""The migrator: moves accelerated writes from staging to their home-region bucket.

One owner task per node (:meth:`Migrator.run`) claims work from the catalog under leases,
so exactly one node moves a given version; a node that dies mid-copy loses its lease and
another takes over. How a version is written home, keeping its ETag and never landing over
a newer one, is :mod:`lota.regions.home`. Failures retry with exponential backoff, so an
origin outage is ridden out; a bandwidth cap keeps migration from crowding out reads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

from lota.catalog import Catalog, CatalogObject, retry_delay
from lota.clock import Clock
from lota.config import WriteConfig
from lota.errors import LotaError
from lota.metrics import Metrics
from lota.regions.control import ControlPlane
from lota.regions.home import Fenced, Home, Superseded
from lota.regions.origin import OriginClient
from lota.regions.orphans import OrphanSweep
from lota.regions.staged import object_location
from lota.regions.staging import Staging
from lota.tasks import TaskGroup

log = logging.getLogger("lota.migrator")

IDLE_POLL = 1.0
# Finished history (migrated, superseded versions; old events) is forgotten after this.
HISTORY = 24 * 3600.0
PRUNE_EVERY = 600.0


class RateLimit:
    """A token bucket shared by every migration stream (bytes per second; 0: unlimited)."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._allowance = float(rate)
        self._last = time.monotonic()
        self._lock = asyncio.Lock()

    async def take(self, amount: int) -> None:
        if self.rate <= 0:
            return
        async with self._lock:
            now = time.monotonic()
            self._allowance = min(
                float(self.rate), self._allowance + (now - self._last) * self.rate
            )
            self._last = now
            self._allowance -= amount
            if self._allowance < 0:
                await asyncio.sleep(-self._allowance / self.rate)


class Migrator:
    """Claims pending versions and copies them home."""

    def __init__(
        self,
        catalog: Catalog,
        staging: Staging,
        origin_for: Callable[[str], OriginClient],
        control: ControlPlane,
        config: WriteConfig,
        metrics: Metrics,
        clock: Clock,
    ) -> None:
        self.catalog = catalog
        self.staging = staging
        self._origin_for = origin_for
        self._config = config
        self._metrics = metrics
        self._clock = clock
        self._rate = RateLimit(config.migrate_bandwidth)
        self._home = Home(catalog, staging, origin_for, control, metrics, config.part_concurrency)
        self._orphans = OrphanSweep(catalog, staging, config, metrics, clock)
        self._pruned_at = 0.0

    async def run(self) -> None:
        """Migrate forever (the node's owner task cancels it on shutdown)."""
        while True:
            try:
                moved = await self.run_once()
                await self._collect_garbage()
                await self._orphans.sweep()
                await self._report()
                await self._prune()
            except asyncio.CancelledError:
                raise
            except LotaError as exc:
                log.warning("migrator: catalog unavailable: %s", exc)
                moved = 0
            except Exception:
                # The owner loop must outlive a bug in one round; the traceback says where.
                log.exception("migrator round failed")
                moved = 0
            if not moved:
                await asyncio.sleep(IDLE_POLL)

    async def run_once(self) -> int:
        """Claim a batch and migrate it; returns how many versions were claimed."""
        claimed = await self.catalog.claim_migrations(
            self._config.migrate_concurrency, self._config.lease
        )
        if claimed:
            await asyncio.gather(*(self._migrate(obj) for obj in claimed))
        return len(claimed)

    async def _migrate(self, obj: CatalogObject) -> None:
        started = time.perf_counter()
        # The copy's failures are handled below, where it is awaited: not logged twice.
        tasks = TaskGroup(f"migrate {obj.bucket}/{obj.key}", log_failures=False)
        move = tasks.start(self._move(obj), name="copy")
        lost = asyncio.Event()
        tasks.start(self._keep_lease(obj, move, lost), name="lease")
        try:
            await move
        except asyncio.CancelledError:
            if not lost.is_set():
                raise  # the node is stopping
            # Another node may hold the version now: this copy must not land after its.
            log.warning("lost the lease on %s/%s v%d: copy stopped", obj.bucket, obj.key, obj.seq)
            return
        except Superseded:
            # The newer version migrates instead; this one is garbage now.
            self._metrics.migration_fenced.labels("superseded").inc()
            log.info("%s/%s v%d is superseded: not copied home", obj.bucket, obj.key, obj.seq)
            await self.catalog.fail_migration(
                obj.bucket, obj.key, obj.seq, "superseded", self._clock.time()
            )
            return
        except (LotaError, OSError, TimeoutError) as exc:
            if isinstance(exc, Fenced):
                self._metrics.migration_fenced.labels("conditional").inc()
            attempts = obj.attempts
            retry_at = self._clock.time() + retry_delay(attempts)
            log.warning(
                "migrating %s/%s v%d failed (attempt %d): %s",
                obj.bucket,
                obj.key,
                obj.seq,
                attempts,
                exc,
            )
            self._metrics.migration_failures.inc()
            await self.catalog.fail_migration(
                obj.bucket, obj.key, obj.seq, str(exc)[:500], retry_at
            )
            return
        finally:
            await tasks.close()  # the renewer
        if await self.catalog.complete_migration(obj.bucket, obj.key, obj.seq):
            self._metrics.migrations.inc()
            self._metrics.migrated_bytes.inc(obj.size)
            self._metrics.migration_seconds.observe(time.perf_counter() - started)
            log.info("migrated %s/%s v%d (%d bytes) home", obj.bucket, obj.key, obj.seq, obj.size)

    async def _move(self, obj: CatalogObject) -> None:
        await self._home.move(obj, self._paced)

    async def _keep_lease(
        self, obj: CatalogObject, move: asyncio.Task[None], lost: asyncio.Event
    ) -> None:
        """Renew the lease while `move` runs; stop `move` the moment it may have lapsed (a
        renewal refused, or one that could not reach the catalog), since an expired lease
        lets another node migrate a newer version that this copy must not land after."""
        while True:
            await asyncio.sleep(self._config.lease / 3)
            try:
                held = await self.catalog.renew_lease(
                    obj.bucket, obj.key, obj.seq, self._config.lease
                )
            except LotaError as exc:
                log.warning("cannot renew the lease on %s/%s: %s", obj.bucket, obj.key, exc)
                held = False
            if not held:
                lost.set()
                move.cancel()
                return

    async def _paced(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        async for piece in body:
            await self._rate.take(len(piece))
            yield piece

    async def _prune(self) -> None:
        if time.monotonic() - self._pruned_at >= PRUNE_EVERY:
            self._pruned_at = time.monotonic()
            removed = await self.catalog.prune(
                versions_older_than=HISTORY, events_older_than=HISTORY
            )
            if removed:
                log.info("pruned %d rows of finished catalog history", removed)

    async def _report(self) -> None:
        count, size, oldest, failing = await self.catalog.pending_summary()
        self._metrics.migration_pending.set(count)
        self._metrics.migration_pending_bytes.set(size)
        self._metrics.migration_oldest_seconds.set(oldest)
        self._metrics.migration_failing.set(failing)

    async def _collect_garbage(self) -> None:
        """Delete staging copies nobody needs any more (migrated or superseded versions)."""
        done = []
        for obj in await self.catalog.staging_garbage(100, self._config.staging_grace):
            try:
                await self.staging.delete(object_location(obj))
            except (LotaError, OSError) as exc:
                log.warning("cannot delete staging copy of %s/%s: %s", obj.bucket, obj.key, exc)
                continue
            done.append(obj.seq)
        if done:
            await self.catalog.staging_deleted(done)
