"""The composition root: :func:`build_node` constructs everything a node serves with.

Parts open in order and close in reverse (one :class:`contextlib.AsyncExitStack`)::

    origin session → origin clients (Origins) → pass-through
      → cache (build_cache: store, fill, read path, warm)       if cache.dirs
      → catalog (build_catalog: staging, acceleration, migrator,
                 invalidation events, access times, lifecycle)   if catalog.url
      → front end (admin, invalidation, routing) → Node

A feature that is not configured is there all the same, switched off
(:mod:`lota.node.features`): nothing the front end holds is ``None``. On the way out,
background work stops first (last accesses flushed, fills given the drain time, tasks
cancelled), then the catalog, the cache and the session close.
"""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace

import aiohttp

from lota.auth import Authenticator
from lota.cache.fill import Filler
from lota.cache.intake import WriteCache
from lota.cache.plan import cacheable
from lota.cache.reads import ReadPath
from lota.cache.route import Alone, Placement
from lota.cache.service import ChunkService
from lota.cache.store import CacheError, CacheStore
from lota.cache.warm import Warm
from lota.catalog import Event, open_catalog
from lota.clock import Clock
from lota.cluster.cluster import Cluster
from lota.cluster.endpoint import PeerEndpoint
from lota.cluster.hot import Copies, HotChunks
from lota.cluster.members import Membership
from lota.cluster.peers import PeerClient, peer_session
from lota.cluster.placement import ChunkId, Clustered, HotCopies
from lota.cluster.signing import Verifier
from lota.config import Config
from lota.connections import connection_limits
from lota.errors import StartupError
from lota.lifecycle.access import AccessRecorder
from lota.lifecycle.engine import Engine
from lota.lifecycle.origin import OriginListing, OriginMover, OriginTags
from lota.lifecycle.restore import Restores
from lota.lifecycle.state import RULES_DOCUMENT, LifecycleState
from lota.logs import AccessLog
from lota.metrics import LifecycleObserver, Metrics
from lota.node.admin import Admin
from lota.node.features import CacheFeature, CatalogFeature
from lota.node.front import Front
from lota.node.invalidation import Invalidation, follow_events
from lota.node.node import Drain, Node
from lota.passthrough import PassThrough
from lota.regions.accelerate import Accelerator
from lota.regions.control import ControlPlane
from lota.regions.migrator import Migrator
from lota.regions.origin import POOL_SIZE
from lota.regions.origin_pages import origin_pages
from lota.regions.origins import Origins
from lota.regions.source import OriginSource
from lota.regions.staging import Staging
from lota.regions.writes import RegionalRouter
from lota.tasks import TaskGroup


@asynccontextmanager
async def build_node(config: Config, *, clock: Clock | None = None) -> AsyncIterator[Node]:
    """The node `config` describes, every part open, ready to :meth:`Node.start`; its parts
    close when the block ends. `clock` drives cache ages, leases and lifecycle decisions
    (default: the process clock, which ``LOTA_TIME_OFFSET`` shifts)."""
    clock = clock or Clock.from_environment()
    limits = connection_limits(config)  # raises the descriptor limit before files open
    metrics = Metrics()
    drain = Drain(config.drain_timeout, metrics)
    # Signatures are checked and made against the real time, whatever LOTA_TIME_OFFSET
    # says: clients and origins sign with theirs.
    auth = Authenticator(config.auth, Clock())
    lifecycle = LifecycleState(config.lifecycle.rules)
    access_log = AccessLog()
    tasks = TaskGroup("node")
    # Cache fills run on their own: a stop lets them finish within the drain time.
    fills = TaskGroup("fills")
    async with AsyncExitStack() as stack:
        stack.callback(access_log.flush)
        session = await stack.enter_async_context(_origin_session(config))
        origins = Origins(config, session, metrics)
        control = ControlPlane(config, metrics)
        stack.push_async_callback(control.close)
        cache = CacheFeature.off()
        if config.cache.dirs:
            restores = Restores(config.lifecycle, tasks, origins.for_bucket)
            cache = await stack.enter_async_context(
                build_cache(config, clock, metrics, fills, origins, restores.start)
            )
        catalog = CatalogFeature.off()
        if config.catalog.url:
            catalog = await stack.enter_async_context(
                build_catalog(config, clock, metrics, origins, control, tasks, lifecycle, cache)
            )
        stack.push_async_callback(_stop_work, drain, catalog, fills, tasks)
        front = Front(
            domain=config.domain,
            body_timeout=config.body_timeout,
            auth=auth,
            metrics=metrics,
            access_log=access_log,
            drain=drain,
            admin=Admin(config, auth, metrics, drain, lifecycle, cache, catalog),
            passthrough=PassThrough(origins, config.body_timeout),
            cache=cache,
            catalog=catalog,
            invalidation=Invalidation(cache, catalog),
        )
        node = Node(config, front.handle, drain, limits, metrics)
        drain.ready = True
        yield node


async def _stop_work(
    drain: Drain, catalog: CatalogFeature, fills: TaskGroup, tasks: TaskGroup
) -> None:
    """Stop the node's background work, before what it uses closes."""
    drain.ready = False
    await catalog.access.close()  # flush the last accesses while the catalog is open
    # Fills in flight (bytes a client has been sent, or a prefetch) are kept if they end
    # within the drain time; what is left then is cut, never committed partial.
    await fills.drain(max(0.0, drain.deadline() - time.monotonic()))
    await fills.close()
    await tasks.close()


def _origin_session(config: Config) -> aiohttp.ClientSession:
    """The node's one HTTP session to every origin."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=POOL_SIZE, limit_per_host=POOL_SIZE // 2, ttl_dns_cache=60
        ),
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=config.origin_timeout),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
    )


# -- The cache components ---------------------------------------------------------------
# CacheStore, Filler, ChunkService, ReadPath, Deliverer (inside ReadPath), the sources,
# placements, the cluster's parts and Warm are constructed here and nowhere else: a change
# to their constructors is made in these functions.


@asynccontextmanager
async def build_cache(
    config: Config,
    clock: Clock,
    metrics: Metrics,
    fills: TaskGroup,
    origins: Origins,
    on_archived: Callable[[str, str], None],
) -> AsyncIterator[CacheFeature]:
    """The node's read cache, open (``StartupError`` when a cache dir is in use or
    unusable: nothing to serve without it), with its cluster if it is in one; closed on
    exit."""
    c = config.cache
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(_open_store(config, clock))
        # The index just loaded is long-lived: keep the collector from rescanning it.
        gc.freeze()
        metrics.watch_store(store)
        service = ChunkService(store, Filler(store, c.chunk_size, metrics, clock, fills))
        # Each region's origin is the source of its buckets' chunks. Alone, a node keeps
        # them all; in a cluster, each chunk's owner does.
        sources = {name: OriginSource(origin, metrics) for name, origin in origins.items()}
        alone = {name: Alone(service, source) for name, source in sources.items()}
        placements: Mapping[str, Placement] = alone
        cluster = None
        if config.cluster.on:
            cluster = await stack.enter_async_context(build_cluster(config, metrics))
            hot = HotCopies(
                HotChunks(config.cluster.hot_reads, config.cluster.hot_window),
                Copies[ChunkId](int(config.cluster.hot_share * c.size)),
                service,
                metrics,
            )
            placements = {
                name: Clustered(service, source, cluster, hot, fills, metrics)
                for name, source in sources.items()
            }

        def placement_for(bucket: str) -> Placement:
            return placements[origins.for_bucket(bucket).region.name]

        def alone_for(bucket: str) -> Alone:
            return alone[origins.for_bucket(bucket).region.name]

        reads = ReadPath(service, placement_for, c, clock, metrics)
        stack.callback(reads.close)
        if config.lifecycle.restore_on_read:
            reads.on_archived = on_archived

        async def keys(bucket: str, prefix: str) -> AsyncGenerator[list[tuple[str, int]], None]:
            async for page in origin_pages(origins.for_bucket(bucket), bucket, prefix):
                yield [(e.key, e.size) for e in page]

        def warm(bucket: str, prefix: str, may_read: Callable[[str], bool], n: int) -> Warm:
            return Warm(
                service,
                placement_for(bucket),
                keys(bucket, prefix),
                bucket,
                prefix,
                may_read=may_read,
                metrics=metrics,
                concurrency=n,
            )

        def cached_etag(bucket: str, key: str) -> str:
            obj = service.lookup(bucket, key)
            return obj.meta.etag if obj is not None else ""

        feature = CacheFeature(
            on=True,
            cacheable=cacheable,
            serve=reads.serve,
            invalidate=service.invalidate,
            warm=warm,
            cached_etag=cached_etag,
            writes=WriteCache(service, reads.serve_version, metrics.cache_written_bytes),
        )
        if cluster is not None:
            verifier = Verifier(config.cluster.secret.encode())
            endpoint = PeerEndpoint(verifier, service, reads.deliverer, alone_for, metrics)
            feature = replace(
                feature,
                peer=endpoint.handle,
                tell_peers=cluster.invalidate,
                ready=cluster.is_ready,
            )
        yield feature


@asynccontextmanager
async def _open_store(config: Config, clock: Clock) -> AsyncIterator[CacheStore]:
    c = config.cache
    store = CacheStore(
        c.dirs,
        c.size,
        c.chunk_size,
        clock=clock,
        verify=c.verify,
        pinned=c.pinned,
        fsync=c.fsync,
        scrub_interval=c.scrub_interval,
        high_watermark=c.high_watermark,
        low_watermark=c.low_watermark,
    )
    try:
        await store.open()
    except CacheError as exc:
        raise StartupError(str(exc)) from exc
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def build_cluster(config: Config, metrics: Metrics) -> AsyncIterator[Cluster]:
    """This node's part in its cluster: the members read once (a static list is ready at
    once), then refreshed by a task of its own; the peers' session closes on exit."""
    c = config.cluster
    scheme = "https" if config.tls_cert else "http"
    async with peer_session(c.timeout, config.origin_timeout) as session:
        membership = Membership(c.self, c.grace)
        peers = PeerClient(c.self, c.secret.encode(), membership, session, metrics, scheme=scheme)
        cluster = Cluster(c, peers, metrics)
        await cluster.refresh()
        tasks = TaskGroup("cluster")
        tasks.start(cluster.run(), "refresh")
        try:
            yield cluster
        finally:
            await tasks.close()


# -- The catalog ------------------------------------------------------------------------
# The catalog and what runs on it are opened here and nowhere else.


@asynccontextmanager
async def build_catalog(
    config: Config,
    clock: Clock,
    metrics: Metrics,
    origins: Origins,
    control: ControlPlane,
    tasks: TaskGroup,
    lifecycle: LifecycleState,
    cache: CacheFeature,
) -> AsyncIterator[CatalogFeature]:
    """The catalog, with write acceleration, the migrator, the invalidation follower, the
    access recorder and the lifecycle engine started as `tasks`; closed on exit (the
    tasks must be stopped by then)."""
    w = config.write
    catalog = await open_catalog(config.catalog.url, clock=clock, node=config.node)
    try:
        local = config.regions[config.region]
        staging = Staging(
            node=config.node,
            region=config.region,
            origins=origins,
            staging_bucket=local.staging_bucket,
            local_dir=w.staging_dir if w.staging == "local-disk" else "",
            control=control,
        )
        accelerator = Accelerator(
            catalog, staging, origins.for_bucket, metrics, config.body_timeout, cache.writes
        )
        if config.accelerates_writes:
            await _check_staging(accelerator, w.create_staging, tasks)
        router = RegionalRouter(config, catalog, accelerator, origins)
        migrator = Migrator(catalog, staging, origins.for_bucket, control, w, metrics, clock)
        tasks.start(migrator.run(), "migrator")
        lifecycle.share(catalog)
        await lifecycle.load()

        async def on_document(event: Event) -> None:
            if event.key == RULES_DOCUMENT:
                await lifecycle.load()

        tasks.start(follow_events(catalog, cache, config.node, on_document), "events")
        access = AccessRecorder(catalog, clock)
        access.start(tasks)
        engine = Engine(
            catalog,
            OriginListing(control),
            OriginMover(control),
            config.lifecycle,
            clock=clock,
            state=lifecycle,
            observer=LifecycleObserver(metrics),
            tags=OriginTags(control),
        )
        if config.lifecycle.interval > 0:
            tasks.start(engine.run_forever(), "lifecycle")
        yield CatalogFeature(
            on=True,
            catalog=catalog,
            router=router,
            access=access,
            problem=lambda: accelerator.problem,
        )
    finally:
        await tasks.close()  # already done, unless the opening failed half-way
        await catalog.close()


async def _check_staging(accelerator: Accelerator, create: bool, tasks: TaskGroup) -> None:
    """Check this node's staging before it serves; if it cannot take writes, keep checking
    in the background (the node is not ready meanwhile, and says why)."""
    if not await accelerator.recheck_staging(create):
        tasks.start(accelerator.watch_staging(create), "staging check")
