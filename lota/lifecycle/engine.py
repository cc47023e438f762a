"""The lifecycle engine: list, join with the catalog, plan, and move objects between tiers.

One run, for each bucket the rules name::

    origin ListObjectsV2 pages ──┐
                                 ├─▶ windows ──▶ rules.plan ──▶ decisions ──▶ apply
    catalog access records ──────┘  (key order)

* **Memory is bounded by the window, not the bucket.** Origin pages (1,000 keys) and
  catalog pages are merged in key order; :func:`lota.lifecycle.rules.plan` sees a window
  of about `window` objects at a time. ``keep_latest`` ranks the children of a directory
  against each other, so a window is only ever cut *between* matched directories. One
  directory holding more than `max_window` objects cannot be ranked that way: its objects
  are skipped (never moved) and a warning names it. Keep checkpoint directories below that
  (250,000 objects by default: roughly 100 MB of window).
* **One node at a time.** A run holds the catalog lease ``lifecycle``, renewed every third
  of its length by a heartbeat while it works and checked before every transition; a node
  that cannot take it does nothing, a node that may have lost it stops at once (nodes'
  clocks must agree to well within the lease, as the catalog requires anyway).
* **A transition** copies the object onto itself with the new ``x-amz-storage-class``
  (CopyObject, metadata and tags directives ``COPY``, so metadata, content type and tags
  stay; over 5 GiB a multipart copy that carries them over explicitly: the origin end is
  :mod:`lota.lifecycle.origin`). Before copying the
  engine checks with HEAD that the object is still what the listing showed (same ETag and
  class; the copy is also conditional on the ETag), then records in the catalog the
  object's last access and its new tier, then copies. Tiers mapped to the same class only
  record the tier.
* **Tag filters.** A rule with ``tags`` governs only objects that carry all of them. Tags
  are read (GetObjectTagging) only for objects whose key the first matching rule has tag
  filters for, a few at a time, and kept per version (bucket, key, ETag) across runs.
* **Idempotent and resumable.** Nothing is remembered between runs but the origin's
  classes and the catalog: a second run finds every object in its tier and does nothing.
  A crash between recording and copying leaves a tier the origin's class contradicts, which
  the plan ignores, so the next run moves the object again.
* Transitions are paced to `rate` per second; each is logged on ``lota.lifecycle`` and
  reported to the :class:`Observer` (metrics).

Caveats: in a versioned bucket a transition writes a new version and leaves the previous
one in its class (pair it with an origin rule that expires noncurrent versions); objects
encrypted with customer keys (SSE-C) cannot be copied and fail; a multipart copy gives the
object a new ETag.

Errors (:mod:`lota.errors`)::

    LotaError
    ├── OriginError     one object could not be moved: counted and logged, the run goes
    │                   on; a listing that fails ends the run (the next run resumes)
    ├── CatalogError    the run stops; the next run resumes
    └── LeaseLost       another node took the lease: this run stops at once
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from lota.catalog import AccessRecord, Catalog
from lota.clock import Clock
from lota.errors import CatalogError, LeaseLost, OriginError
from lota.lifecycle.config import LifecycleConfig
from lota.lifecycle.rules import (
    Decision,
    ObjectInfo,
    Rule,
    Status,
    explain,
    listing_prefix,
    needs_tags,
    plan,
    splits_directory,
)
from lota.lifecycle.state import LifecycleState
from lota.metrics import Metrics
from lota.tasks import TaskGroup

log = logging.getLogger("lota.lifecycle")

LEASE = "lifecycle"
COPY_LIMIT = 5 * 1024**3  # the largest object one CopyObject may copy
PART_SIZE = 512 * 1024**2
# What a multipart copy must carry over by hand (CopyObject keeps it by itself).
_KEPT_HEADERS = (
    "content-type",
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
    "x-amz-website-redirect-location",
    "x-amz-server-side-encryption",
    "x-amz-server-side-encryption-aws-kms-key-id",
)


# -- the two ends the engine talks to --------------------------------------------------------


class ListingSource(Protocol):
    """Where objects come from: pages in key order, under a prefix."""

    def pages(self, bucket: str, prefix: str) -> AsyncIterator[list[ObjectInfo]]: ...

    async def one(self, bucket: str, key: str) -> ObjectInfo | None:
        """One object; None if there is none."""


class Mover(Protocol):
    """What changes an object's storage class."""

    async def check(self, decision: Decision) -> str | None:
        """None if the object is still as listed, else why it is skipped."""

    async def copy(self, decision: Decision) -> str | None:
        """Rewrite the object in `decision.storage_class`; None when done, else why not."""


class TagSource(Protocol):
    """An object's tags (GetObjectTagging), for rules with tag filters."""

    async def tags(self, bucket: str, key: str) -> dict[str, str]: ...


class _NoTags:
    async def tags(self, bucket: str, key: str) -> dict[str, str]:
        return {}


class _TagCache:
    """Tags already read, per object version (bucket, key, ETag): a plan every interval
    must not read every tagged object's tags again. The oldest go past `size` entries."""

    def __init__(self, source: TagSource, size: int = 100_000, concurrency: int = 8) -> None:
        self._source = source
        self._size = size
        self._known: OrderedDict[tuple[str, str, str], dict[str, str]] = OrderedDict()
        self._slots = asyncio.Semaphore(concurrency)

    async def tagged(self, objects: list[ObjectInfo], rules: Sequence[Rule]) -> list[ObjectInfo]:
        """`objects`, with their tags where the rules need them."""
        wanted = [i for i, obj in enumerate(objects) if needs_tags(obj, rules)]
        found = await asyncio.gather(*(self._tags(objects[i]) for i in wanted))
        tagged = list(objects)
        for i, tags in zip(wanted, found, strict=True):
            tagged[i] = replace(tagged[i], tags=tags)
        return tagged

    async def _tags(self, obj: ObjectInfo) -> dict[str, str]:
        version = (obj.bucket, obj.key, obj.etag)
        if (tags := self._known.get(version)) is not None:
            self._known.move_to_end(version)
            return tags
        async with self._slots:
            tags = await self._source.tags(obj.bucket, obj.key)
        self._known[version] = tags
        while len(self._known) > self._size:
            self._known.popitem(last=False)
        return tags


class Observer(Protocol):
    """Hooks for metrics (the node counts these in Prometheus)."""

    def transitioned(self, decision: Decision) -> None: ...

    def failed(self, decision: Decision, error: Exception) -> None: ...

    def finished(self, report: RunReport, seconds: float) -> None: ...


class MetricsObserver:
    """The hooks, counted in Prometheus."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def transitioned(self, decision: Decision) -> None:
        self._m.lifecycle_transitions.labels(decision.to_tier).inc()
        self._m.lifecycle_transition_bytes.inc(decision.size)

    def failed(self, decision: Decision, error: Exception) -> None:
        self._m.lifecycle_failures.inc()

    def finished(self, report: RunReport, seconds: float) -> None:
        self._m.lifecycle_runs.inc()


@dataclass(slots=True)
class RunReport:
    """What one run did."""

    now: float
    scanned: int = 0
    planned: int = 0
    moved: int = 0
    moved_bytes: int = 0
    skipped: int = 0
    failed: int = 0
    too_large: int = 0  # objects in directories too big to rank (never moved)
    lease_lost: bool = False


# -- the engine --------------------------------------------------------------------------------


class _Accesses:
    """The catalog's access records of one bucket, read in key order a page at a time."""

    def __init__(self, catalog: Catalog, bucket: str, prefix: str, page: int = 5000) -> None:
        self._catalog = catalog
        self._bucket = bucket
        self._prefix = prefix
        self._page = page
        self._after = ""
        self._buffer: deque[AccessRecord] = deque()
        self._done = False

    async def upto(self, last_key: str) -> dict[tuple[str, str], AccessRecord]:
        """Records of keys up to `last_key`, past the ones returned before."""
        found: dict[tuple[str, str], AccessRecord] = {}
        while True:
            while self._buffer and self._buffer[0].key <= last_key:
                record = self._buffer.popleft()
                found[record.bucket, record.key] = record
            if self._buffer or self._done:
                return found
            records = await self._catalog.list_accesses(
                self._bucket, self._prefix, self._after, self._page
            )
            self._done = len(records) < self._page
            if records:
                self._after = records[-1].key
                self._buffer.extend(records)


class _Lease:
    """The lifecycle lease, renewed by a heartbeat while a run works.

    :meth:`check` fails once the lease may have run out (renewal refused, or no successful
    renewal for 80% of its length, by this node's monotonic clock), before any other node
    can take it over.
    """

    def __init__(
        self, catalog: Catalog, seconds: float, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._catalog = catalog
        self._seconds = seconds
        self._monotonic = monotonic
        self._renewed = -float("inf")
        self._refused = False

    async def take(self) -> bool:
        started = self._monotonic()
        if not await self._catalog.acquire_lease(LEASE, self._seconds):
            self._refused = True
            return False
        self._renewed = started
        return True

    async def keep(self) -> None:
        """Renew every third of the lease until cancelled or refused."""
        while not self._refused:
            await asyncio.sleep(self._seconds / 3)
            try:
                await self.take()
            except CatalogError as exc:
                log.warning("lifecycle: could not renew the lease: %s", exc)

    def check(self) -> None:
        if self._refused or self._monotonic() - self._renewed > 0.8 * self._seconds:
            raise LeaseLost("the lifecycle lease ran out or another node took it")

    async def release(self) -> None:
        await self._catalog.release_lease(LEASE)


class _Pacer:
    """At most `rate` calls of :meth:`wait` per second return (0: no limit)."""

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate if rate > 0 else 0.0
        self._next = 0.0

    async def wait(self) -> None:
        if not self._interval:
            return
        now = time.monotonic()
        if self._next > now:
            await asyncio.sleep(self._next - now)
        self._next = max(now, self._next) + self._interval


class Engine:
    """Plans and applies tier transitions for the buckets the rules name.

    ``plan()`` only reads; ``run()`` takes the lease and applies. `clock` gives the time
    decisions are made at unless a call names one; the catalog keeps its own clock for
    leases.
    """

    def __init__(
        self,
        catalog: Catalog,
        listing: ListingSource,
        mover: Mover,
        config: LifecycleConfig,
        *,
        clock: Clock,
        state: LifecycleState | None = None,
        observer: Observer | None = None,
        tags: TagSource | None = None,
        window: int = 1000,
        max_window: int = 250_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._catalog = catalog
        self._listing = listing
        self._mover = mover
        self._config = config
        self._clock = clock
        self.state = state or LifecycleState(config.rules)
        self._tags = _TagCache(tags or _NoTags())
        self._observer = observer
        self._window = window
        self._max_window = max(window, max_window)
        self._monotonic = monotonic

    async def plan(
        self, now: float | None = None, bucket: str | None = None
    ) -> AsyncIterator[Decision]:
        """Every transition due at `now` (default: the clock's now), bucket by bucket."""
        report = RunReport(now=self._clock.time() if now is None else now)
        async for decisions in self._decisions(report, bucket):
            for decision in decisions:
                yield decision

    async def status(self, bucket: str, key: str, now: float) -> tuple[ObjectInfo, Status] | None:
        """What the rules say about bucket/key at `now`; None if it does not exist. A
        version not home yet is the catalog's (in the tier its writer asked for)."""
        obj = await self._pending(bucket, key) or await self._listing.one(bucket, key)
        if obj is None:
            return None
        rules = [r for r in self.state.rules if r.bucket == bucket]
        [obj] = await self._tags.tagged([obj], rules)
        records = await self._catalog.list_accesses(bucket, key, "", 1)
        usage = records[0] if records and records[0].key == key else None
        return obj, explain(obj, usage, rules, self._config.tiers, now)

    async def _pending(self, bucket: str, key: str) -> ObjectInfo | None:
        latest = await self._catalog.get_object(bucket, key)
        if latest is None or not latest.pending or latest.deleted:
            return None
        storage_class = dict(latest.headers).get("x-amz-storage-class", "STANDARD")
        return ObjectInfo(bucket, key, latest.size, latest.created_at, storage_class, latest.etag)

    async def run(self, now: float | None = None, bucket: str | None = None) -> RunReport | None:
        """Apply every transition due at `now` once; None if another node holds the lease."""
        lease = _Lease(self._catalog, self._config.lease, self._monotonic)
        if not await lease.take():
            log.info("lifecycle: lease held by %s; not running", await self._holder())
            return None
        started = time.monotonic()
        report = RunReport(now=self._clock.time() if now is None else now)
        pacer = _Pacer(self._config.rate)
        tasks = TaskGroup("lifecycle")
        tasks.start(lease.keep(), "lease")
        try:
            async for decisions in self._decisions(report, bucket):
                lease.check()
                for decision in decisions:
                    await pacer.wait()
                    lease.check()
                    await self._apply(decision, report)
        except LeaseLost as exc:
            report.lease_lost = True
            log.warning("lifecycle run stopped: %s", exc)
        finally:
            await tasks.close()
            await lease.release()
        seconds = time.monotonic() - started
        log.info(
            "lifecycle run: %d objects scanned, %d moved (%d bytes), %d skipped, %d failed "
            "in %.1fs",
            report.scanned,
            report.moved,
            report.moved_bytes,
            report.skipped,
            report.failed,
            seconds,
        )
        if self._observer is not None:
            self._observer.finished(report, seconds)
        return report

    async def run_forever(self) -> None:
        """The server's loop: a run every ``interval`` (the first after a short jitter)."""
        interval = self._config.interval
        await asyncio.sleep(random.uniform(0, min(interval, 60.0)))
        while True:
            try:
                await self.run()
            except (CatalogError, OriginError) as exc:
                log.warning("lifecycle run failed: %s; next in %gs", exc, interval)
            await asyncio.sleep(interval)

    async def _holder(self) -> str:
        holder = await self._catalog.lease_holder(LEASE)
        return holder[0] if holder else "nobody (just released)"

    async def _decisions(
        self, report: RunReport, only: str | None
    ) -> AsyncIterator[list[Decision]]:
        rules = self.state.rules
        buckets = dict.fromkeys(r.bucket for r in rules if only is None or r.bucket == only)
        for bucket in buckets:
            mine = [r for r in rules if r.bucket == bucket]
            async for objects, accesses in self._windows(bucket, mine, report):
                tagged = await self._tags.tagged(objects, mine)
                decisions = plan(tagged, accesses, mine, self._config.tiers, report.now)
                report.planned += len(decisions)
                yield decisions

    async def _windows(
        self, bucket: str, rules: Sequence[Rule], report: RunReport
    ) -> AsyncIterator[tuple[list[ObjectInfo], Mapping[tuple[str, str], AccessRecord]]]:
        """Objects with their catalog records, in windows cut only between directories."""
        prefix = listing_prefix(rules, bucket)
        accesses = _Accesses(self._catalog, bucket, prefix)
        window: list[ObjectInfo] = []
        skipping: tuple[str, ...] = ()
        async for page in self._listing.pages(bucket, prefix):
            report.scanned += len(page)
            for obj in page:
                if skipping and obj.key.startswith(skipping):
                    report.too_large += 1
                    continue
                if len(window) >= self._window and not splits_directory(
                    rules, bucket, window[-1].key, obj.key
                ):
                    yield window, await accesses.upto(window[-1].key)
                    window = []
                window.append(obj)
                if len(window) > self._max_window:
                    skipping = self._directories(rules, obj)
                    window, dropped = _split(window, skipping)
                    report.too_large += dropped
                    log.warning(
                        "lifecycle: %s/%s holds more than %d objects; keep_latest cannot rank "
                        "it, its objects are left where they are",
                        bucket,
                        skipping[0],
                        self._max_window,
                    )
        if window:
            yield window, await accesses.upto(window[-1].key)

    @staticmethod
    def _directories(rules: Sequence[Rule], obj: ObjectInfo) -> tuple[str, ...]:
        found = (r.directory(obj.bucket, obj.key) for r in rules if r.keep_latest)
        return tuple(sorted({d for d in found if d is not None}, key=len))

    async def _apply(self, d: Decision, report: RunReport) -> None:
        try:
            copying = d.storage_class != d.from_class
            skipped = await self._mover.check(d) if copying else None
            if skipped is None:
                await self._catalog.record_accesses([(d.bucket, d.key, d.last_access)])
                await self._catalog.set_tier(d.bucket, d.key, d.to_tier, report.now)
                if copying:
                    skipped = await self._mover.copy(d)
        except OriginError as exc:
            report.failed += 1
            log.warning("lifecycle: %s/%s -> %s failed: %s", d.bucket, d.key, d.to_tier, exc)
            if self._observer is not None:
                self._observer.failed(d, exc)
            return
        if skipped is not None:
            report.skipped += 1
            log.info("lifecycle: %s/%s left alone: %s", d.bucket, d.key, skipped)
            return
        report.moved += 1
        report.moved_bytes += d.size
        log.info(
            "lifecycle: %s/%s %s -> %s (%s): %s",
            d.bucket,
            d.key,
            d.from_tier,
            d.to_tier,
            d.storage_class,
            d.reason,
        )
        if self._observer is not None:
            self._observer.transitioned(d)


def _split(window: list[ObjectInfo], directories: tuple[str, ...]) -> tuple[list[ObjectInfo], int]:
    """The window without the objects under `directories`, and how many those were."""
    kept = [obj for obj in window if not obj.key.startswith(directories)]
    return kept, len(window) - len(kept)
