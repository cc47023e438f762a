"""Every Prometheus metric LOTA exports, declared once, with help text.

Each :class:`Metrics` owns its own registry, so several nodes can live in one process
(tests, the cluster simulator) without mixing their counters. ``/_lota/metrics`` renders it.
No ``_created`` series (each counter's and histogram's creation time): they would double the
series count, and ``rate()`` does not need them.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from functools import lru_cache
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from lota import __version__
from lota.lifecycle.rules import TIERS

# Process-wide in prometheus-client: every registry built from here on, ours included.
disable_created_metrics()  # type: ignore[no-untyped-call]

_CHILDREN = 512
_LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)


class Metrics:
    """The node's metrics. Attribute names follow the metric names without the prefix."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        # Counted as plain numbers until the registry is read (see LaterCount).
        self._later: list[LaterCount | LaterHistogram] = []
        self.requests = Counter(
            "lota_requests",
            "S3 requests answered, by S3 operation and HTTP status",
            ["operation", "status"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "lota_request_seconds",
            "Time from request start to the last byte of the response, by S3 operation",
            ["operation"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.bytes_in = Counter(
            "lota_bytes_in",
            "Request body bytes received from clients, as sent (aws-chunked framing included)",
            registry=r,
        )
        self.bytes_out = Counter(
            "lota_bytes_out",
            "Response body bytes sent to clients, whatever the path (cache, fill, origin, "
            "error); without headers or chunked framing",
            registry=r,
        )
        self.auth_failures = Counter(
            "lota_auth_failures",
            "Requests refused by authentication or authorization, by S3 error code",
            ["code"],
            registry=r,
        )
        self.origin_requests = Counter(
            "lota_origin_requests",
            "Requests LOTA sent to an origin, by region, method and status",
            ["region", "method", "status"],
            registry=r,
        )
        self.origin_seconds = Histogram(
            "lota_origin_seconds",
            "Origin latency to response headers, by region",
            ["region"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.origin_bytes_in = Counter(
            "lota_origin_bytes_in",
            "Response body bytes received from origins, by region",
            ["region"],
            registry=r,
        )
        self.origin_errors = Counter(
            "lota_origin_errors",
            "Origin requests that failed without an HTTP response, by region",
            ["region"],
            registry=r,
        )
        self.cache_requests = Counter(
            "lota_cache_requests",
            "GetObject/HeadObject responses by the x-lota-cache header they carried "
            "(HIT, PEER, MISS, STALE, BYPASS, PENDING)",
            ["source"],
            registry=r,
        )
        self.cache_request_seconds = Histogram(
            "lota_cache_request_seconds",
            "Time from request start to the last byte of GetObject/HeadObject responses, "
            "by their x-lota-cache header",
            ["source"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cache_bytes = Counter(
            "lota_cache_bytes",
            "Object bytes sent to clients by the read path, by source: hit (stored chunk), "
            "fill (following a fill in progress), peer (relayed from the chunk's owner "
            "node), sibling (relayed from the worker of this node that owns it, filling "
            "it), origin (relayed when the cache could not hold it, or every owner failed)",
            ["source"],
            registry=r,
        )
        self.cache_fill_seconds = Histogram(
            "lota_cache_fill_seconds",
            "Duration of origin fills (one origin GET filling one or more chunks)",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.cache_fill_bytes = Counter(
            "lota_cache_fill_bytes", "Bytes written into the cache by fills", registry=r
        )
        self.cache_coalesced = Counter(
            "lota_cache_coalesced",
            "Readers that joined a fill already in flight instead of asking the origin",
            registry=r,
        )
        self.cache_bypassed_fills = Counter(
            "lota_cache_bypassed_fills",
            "Chunks the cache could not store (no room, disk error); served from the origin",
            registry=r,
        )
        self.cache_revalidations = Counter(
            "lota_cache_revalidations",
            "Conditional checks of cached objects against the origin, by result",
            ["result"],
            registry=r,
        )
        self.cache_prefetches = Counter(
            "lota_cache_prefetches",
            "Whole-object prefetches started (HEAD with Range: bytes=0-0)",
            registry=r,
        )
        self.warm_objects = Counter(
            "lota_warm_objects",
            "Objects lota warm dealt with, by result: filled, cached (already), denied "
            "(the policy forbids reading it), failed",
            ["result"],
            registry=r,
        )
        # Children made at 0 up front, here and below: rate() and increase() see a counter's
        # first step only from a sample before it, so one born at its first event hides it.
        for result in ("filled", "cached", "denied", "failed"):
            self.warm_objects.labels(result)
        self.warm_filled_bytes = Counter(
            "lota_warm_filled_bytes",
            "Size of the objects lota warm filled",
            registry=r,
        )
        self.accelerated_writes = Counter(
            "lota_accelerated_writes",
            "Writes to far-homed buckets accepted at local speed (staged + committed)",
            registry=r,
        )
        self.accelerated_write_seconds = Histogram(
            "lota_accelerated_write_seconds",
            "Time to stage and commit an accelerated PUT",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.migrations = Counter(
            "lota_migrations", "Versions this node moved to their home region", registry=r
        )
        self.migrated_bytes = Counter(
            "lota_migrated_bytes", "Bytes this node moved to home regions", registry=r
        )
        self.migration_seconds = Histogram(
            "lota_migration_seconds",
            "Time to move one version home",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.migration_failures = Counter(
            "lota_migration_failures", "Migration attempts that failed (retried)", registry=r
        )
        self.migration_pending = Gauge(
            "lota_migration_pending", "Versions not yet in their home region", registry=r
        )
        self.migration_pending_bytes = Gauge(
            "lota_migration_pending_bytes", "Bytes not yet in their home region", registry=r
        )
        self.migration_oldest_seconds = Gauge(
            "lota_migration_oldest_seconds",
            "Age of the oldest version not yet in its home region",
            registry=r,
        )
        self.migration_failing = Gauge(
            "lota_migration_failing", "Pending versions whose last attempt failed", registry=r
        )
        self.lifecycle_transitions = Counter(
            "lota_lifecycle_transitions",
            "Objects the lifecycle engine moved to another tier, by tier",
            ["tier"],
            registry=r,
        )
        for tier in TIERS:
            self.lifecycle_transitions.labels(tier)
        self.lifecycle_transition_bytes = Counter(
            "lota_lifecycle_transition_bytes", "Bytes moved between tiers", registry=r
        )
        self.lifecycle_failures = Counter(
            "lota_lifecycle_failures", "Tier transitions that failed (retried next run)", registry=r
        )
        self.lifecycle_runs = Counter(
            "lota_lifecycle_runs", "Lifecycle engine runs this node made", registry=r
        )
        self._declare_cluster(r)
        self._declare_writes(r)
        self.inflight = Gauge(
            "lota_inflight_requests", "Requests being handled right now", registry=r
        )
        self.ready = Gauge(
            "lota_ready",
            "1 while /_lota/readyz answers 200 (index loaded, members known, not draining), "
            "else 0: what a readiness probe sees, for alerts where no probe results are kept",
            registry=r,
        )
        self.client_connections = Gauge(
            "lota_client_connections", "Client connections open right now", registry=r
        )
        self.client_connection_limit = Gauge(
            "lota_client_connection_limit",
            "Client connections allowed at once (max_connections, or derived from the "
            "descriptor limit)",
            registry=r,
        )
        self.client_connections_closed = Counter(
            "lota_client_connections_closed",
            "Client connections LOTA closed on its own, by reason: header_timeout (no whole "
            "request head in time), idle_timeout (kept alive, unused), evicted (the longest "
            "idle, to make room under the cap), refused (over the cap, none idle)",
            ["reason"],
            registry=r,
        )
        self.build = Info("lota_build", "The LOTA version this node runs", registry=r)
        self.build.info({"version": __version__})
        # labels() takes a lock and builds a key on every call, several times per request:
        # remember the children (label values here are few: operations, statuses, sources).
        for metric in vars(self).values():
            if isinstance(metric, MetricWrapperBase) and metric._labelnames:
                metric.labels = lru_cache(maxsize=_CHILDREN)(metric.labels)  # type: ignore[method-assign]

    def _declare_writes(self, r: CollectorRegistry) -> None:
        """The metrics of write acceleration's staging, fencing and cached writes."""
        self.cache_written_bytes = Counter(
            "lota_cache_written_bytes",
            "Object bytes kept in this node's cache as clients wrote them (accelerated "
            "writes), so that reading them back here is a hit",
            registry=r,
        )
        self.staging_orphans_swept = Counter(
            "lota_staging_orphans_swept",
            "Staging copies no catalog entry named (a write that failed between staging and "
            "commit), deleted by this node's orphan sweep",
            registry=r,
        )
        self.migration_fenced = Counter(
            "lota_migration_fenced",
            "Migrations that did not land an older version over a newer one, by how: "
            "superseded (the catalog had a newer version before the home write), "
            "conditional (the origin refused the conditional write), requeued (a newer "
            "version already home was sent again after this one)",
            ["reason"],
            registry=r,
        )
        for reason in ("superseded", "conditional", "requeued"):
            self.migration_fenced.labels(reason)

    def _declare_cluster(self, r: CollectorRegistry) -> None:
        """The metrics of the cluster: peer reads both ways, members, hot copies."""
        self.peer_requests = Counter(
            "lota_peer_requests",
            "Chunk reads this node asked of other nodes, by result: hit or miss (the owner "
            "had the chunk, or filled it from its origin), stale (412: not that version), "
            "error (another status), unreachable, timeout, broken (cut mid-body)",
            ["result"],
            registry=r,
        )
        self.peer_bytes_in = Counter(
            "lota_peer_bytes_in", "Chunk bytes received from other nodes", registry=r
        )
        self.peer_served = Counter(
            "lota_peer_served",
            "Chunk reads other nodes asked of this one as owner, by where it found the "
            "bytes: HIT (its cache) or MISS (filled from its origin)",
            ["source"],
            registry=r,
        )
        self.peer_served_bytes = Counter(
            "lota_peer_served_bytes",
            "Chunk bytes this process sent to other nodes and other workers, by where it "
            "found them, as lota_cache_bytes (which counts client bytes only)",
            ["source"],
            registry=r,
        )
        self.peer_bytes_out = Counter(
            "lota_peer_bytes_out",
            "Chunk bytes sent to other nodes (not counted in lota_bytes_out)",
            registry=r,
        )
        self.peer_refused = Counter(
            "lota_peer_refused",
            "Requests to the peer endpoint refused, by reason: unsigned, signature (not the "
            "cluster secret), date (outside the 30 s window), replay, hop",
            ["reason"],
            registry=r,
        )
        self.peer_fallbacks = Counter(
            "lota_peer_fallbacks",
            "Chunk reads that could not be had from their owner (down, in its back-off, "
            "refusing), by where they went next: the next owner (peer) or the origin",
            ["to"],
            registry=r,
        )
        for to in ("peer", "origin"):
            self.peer_fallbacks.labels(to)
        self.cluster_members = Gauge(
            "lota_cluster_members",
            "Members this node knows of, by state: live, or suspected (its last call failed)",
            ["state"],
            registry=r,
        )
        self.cluster_owners = Gauge(
            "lota_cluster_owners", "Members that own chunks now (live or within grace)", registry=r
        )
        self.cluster_ownership_changes = Counter(
            "lota_cluster_ownership_changes",
            "Times the set of members owning chunks changed (a member joined, or was away "
            "longer than the grace period)",
            registry=r,
        )
        self.node_info = Gauge(
            "lota_node_info",
            "1, labelled with this node's rack ([cluster] rack) and cluster address",
            ["rack", "member"],
            registry=r,
        )
        self.cluster_copies = Counter(
            "lota_cluster_copies",
            "Hot chunks of other nodes' this node started keeping a copy of",
            registry=r,
        )
        self.worker_requests = Counter(
            "lota_worker_requests",
            "Chunk reads this worker asked of the other workers of its node (their chunks, "
            "not held: relayed as they filled them), by result, as lota_peer_requests; "
            "meta: an object's metadata asked of the worker it lives with",
            ["result"],
            registry=r,
        )
        self.worker_bytes_in = Counter(
            "lota_worker_bytes_in", "Chunk bytes relayed from the other workers", registry=r
        )
        self.worker_bytes_out = Counter(
            "lota_worker_bytes_out",
            "Chunk bytes relayed to the other workers (not in lota_bytes_out)",
            registry=r,
        )
        self.worker_news = Counter(
            "lota_worker_news",
            "What this worker learnt and told the other workers of its node (an object's "
            "metadata, a chunk it cached; one per sibling told), by result: sent, dropped "
            "(too much waiting), unsent (the sibling did not answer); and what it heard from "
            "them: heard, refused (malformed)",
            ["result"],
            registry=r,
        )
        self.worker_sibling_reads = Counter(
            "lota_worker_sibling_reads",
            "Reads of chunks another worker of this node owns, served here from its "
            "descriptor and told to it (told), or not, more of its chunks read between two "
            "news than are counted (untold); reads of this worker's chunks its siblings "
            "told it of, counted by its eviction and admission as hits (heard), or not, the "
            "object's version being no longer known here (unknown)",
            ["result"],
            registry=r,
        )
        self.event_loop_lag_seconds = Histogram(
            "lota_event_loop_lag_seconds",
            "How late a worker's event loop ran a timer due every 20 ms: time it spent on "
            "one step (no request is answered meanwhile) or off the CPU",
            buckets=_LAG_BUCKETS,
            registry=r,
        )
        self.workers = Gauge(
            "lota_workers",
            "Worker processes whose metrics are in this answer (the node's workers that "
            "answered; 1 per worker)",
            registry=r,
        )
        self.workers.set(1)
        self.cluster_copy_bytes = Gauge(
            "lota_cluster_copy_bytes",
            "Bytes of hot chunks of other nodes' kept here (at most hot_share of the budget)",
            registry=r,
        )

    def watch_store(self, store: StoreStats) -> None:
        """Export the cache store's own counts (usage, budget, evictions, corrupt chunks)."""
        self.registry.register(_StoreCollector(store))

    def later(self, child: Counter) -> LaterCount:
        """`child` (a counter's labelled series) counted on a hot path: see :class:`LaterCount`."""
        count = LaterCount(child)
        self._later.append(count)
        return count

    def later_histogram(self, *children: Histogram) -> LaterHistogram:
        """`children` (labelled series of histograms with the same buckets) observed alike
        on a hot path."""
        histogram = LaterHistogram(*children)
        self._later.append(histogram)
        return histogram

    def render(self) -> bytes:
        for later in self._later:
            later.fold()
        return generate_latest(self.registry)


class LaterCount:
    """A counter's series added to as a plain number on the event loop and folded into the
    series when the registry is read (:meth:`Metrics.render`, on the same loop), so that
    what is scraped is what was counted. A Prometheus update takes a lock: a small hit
    answered at once made six, a fifth of the answer's own time."""

    __slots__ = ("_child", "n")

    def __init__(self, child: Counter) -> None:
        self._child = child
        self.n: float = 0

    def fold(self) -> None:
        if self.n:
            self._child.inc(self.n)
            self.n = 0


class LaterHistogram:
    """Histograms' series, each observing every value (a request's time, as all requests'
    and as hits'), observed as plain numbers, folded in as :class:`LaterCount`'s."""

    __slots__ = ("_bounds", "_children", "_counts", "_sum")

    def __init__(self, *children: Histogram) -> None:
        self._children = children
        self._bounds: list[float] = list(children[0]._upper_bounds)  # their buckets' bounds
        if any(list(child._upper_bounds) != self._bounds for child in children):
            raise ValueError("histograms observed alike must have the same buckets")
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0

    def observe(self, value: float) -> None:
        # Histogram.observe's bucket: the first whose bound is at least `value`.
        self._counts[bisect_left(self._bounds, value)] += 1
        self._sum += value

    def fold(self) -> None:
        if not any(self._counts):
            return
        for child in self._children:
            buckets = child._buckets  # prometheus-client adds each bucket's count as this
            for i, n in enumerate(self._counts):
                if n:
                    buckets[i].inc(n)
            child._sum.inc(self._sum)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0


class StoreStats(Protocol):
    @property
    def usage(self) -> int: ...
    @property
    def budget(self) -> int: ...

    def stats(self) -> dict[str, int]: ...
    def dir_stats(self) -> dict[str, dict[str, int]]: ...


class _StoreCollector(Collector):
    """Reads the store's counters at scrape time, so the store needs no metrics code."""

    _GAUGES = {
        "chunks": "Chunks held in the cache",
        "objects": "Objects with an entry in the cache",
    }
    _COUNTERS = {
        "hits": "Reads of chunks this cache holds, served by this worker (the reads of its "
        "chunks other workers of the node serve are lota_worker_sibling_reads_total)",
        "evictions": "Chunks evicted to stay under the budget",
        "declined_fills": "Chunks read from their source that the admission rule did not "
        "keep (the cache is full of chunks read as often): served, not stored",
        "corrupt": "Chunks that failed digest verification and were dropped",
        "write_errors": "Cache writes that failed (the drive is then rested for a while)",
        "disk_full": "Cache writes that found their file system full (ENOSPC): that "
        "directory's budget drops to what LOTA holds there",
        "read_errors": "Cache chunk reads that failed with an I/O error (chunk dropped)",
    }

    # Per cache directory (label "dir"), from dir_stats(); a free space not known yet is left out.
    _DIR_GAUGES = {
        "bytes_used": (
            "lota_cache_dir_bytes_used",
            "Bytes LOTA holds in this cache directory (chunks, fills in progress, the index)",
        ),
        "free_bytes": (
            "lota_cache_dir_free_bytes",
            "Free bytes of the file system holding this cache directory (checked every second)",
        ),
        "budget": (
            "lota_cache_dir_budget_bytes",
            "What this cache directory may hold: the cache budget, or less since its file "
            "system filled up (ENOSPC) before it",
        ),
        "healthy": (
            "lota_cache_dir_healthy",
            "1 if this cache directory takes fills, 0 while it rests after an error "
            "(or, unusable at start, until a restart)",
        ),
    }

    def __init__(self, store: StoreStats) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        stats = self._store.stats()
        yield GaugeMetricFamily(
            "lota_cache_bytes_used",
            "Bytes LOTA holds under its cache directories",
            self._store.usage,
        )
        yield GaugeMetricFamily(
            "lota_cache_budget_bytes", "The cache byte budget", self._store.budget
        )
        for name, help_text in self._GAUGES.items():
            yield GaugeMetricFamily(f"lota_cache_{name}", help_text, stats.get(name, 0))
        for name, help_text in self._COUNTERS.items():
            yield CounterMetricFamily(f"lota_cache_{name}", help_text, stats.get(name, 0))
        yield from self._per_dir()

    def _per_dir(self) -> Iterator[Metric]:
        dirs = self._store.dir_stats()
        for key, (name, help_text) in self._DIR_GAUGES.items():
            family = GaugeMetricFamily(name, help_text, labels=["dir"])
            for root, values in dirs.items():
                if values[key] >= 0:
                    family.add_metric([root], values[key])
            yield family
