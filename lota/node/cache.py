"""The composition root's cache part: :func:`build_cache` makes the node's read cache, with
its workers' and its cluster's parts when it has them.

Placements, from the inside out (each wraps the one before for the chunks it keeps)::

    Alone (one process: the origin, kept)
      → Local (workers of this node: each chunk's owner worker)   if workers > 1
        → Clustered (nodes: each chunk's owner node)              if [cluster]

CacheStore, Filler, ChunkService, ReadPath, Deliverer (inside ReadPath), the sources,
placements, the peer endpoint and Warm are constructed here and nowhere else.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace

from lota.cache.deliver import Deliverer
from lota.cache.fill import Filler
from lota.cache.intake import WriteCache
from lota.cache.plan import cacheable
from lota.cache.reads import ReadPath
from lota.cache.route import Alone, NodePlacement, Placement
from lota.cache.service import ChunkService
from lota.cache.store import CacheError, CacheStore
from lota.cache.warm import Warm
from lota.clock import Clock
from lota.cluster.cluster import Cluster
from lota.cluster.endpoint import PeerEndpoint
from lota.cluster.hot import Copies, HotChunks
from lota.cluster.members import Membership
from lota.cluster.peers import PeerClient, peer_session
from lota.cluster.placement import ChunkId, Clustered, HotCopies, RemoteFills
from lota.cluster.signing import Verifier
from lota.config import Config
from lota.connections import chunk_descriptors
from lota.errors import StartupError
from lota.metrics import Metrics
from lota.node.features import CacheFeature
from lota.regions.origin_pages import origin_pages
from lota.regions.origins import Origins
from lota.regions.source import OriginSource
from lota.tasks import TaskGroup
from lota.workers.fds import FdClient
from lota.workers.news import News
from lota.workers.node import Siblings, descriptor_server, worker_name
from lota.workers.placement import Local
from lota.workers.siblings import SiblingSource

log = logging.getLogger("lota.node")

# Seconds a write (or another node's invalidation) waits for the sibling workers to drop
# their copies: a stuck sibling must not hold up the write, nor make the node that asked
# take this one for dead.
SIBLING_TELL_TIMEOUT = 5.0


@asynccontextmanager
async def build_cache(
    config: Config,
    clock: Clock,
    metrics: Metrics,
    fills: TaskGroup,
    origins: Origins,
    on_archived: Callable[[str, str], None],
    siblings: Siblings | None,
) -> AsyncIterator[CacheFeature]:
    """The node's read cache, open (``StartupError`` when a cache dir is in use or
    unusable: nothing to serve without it), with its siblings' and its cluster's parts;
    closed on exit."""
    c = config.cache
    async with AsyncExitStack() as stack:
        store = await stack.enter_async_context(_open_store(config, clock))
        # The index just loaded is long-lived: keep the collector from rescanning it.
        gc.freeze()
        metrics.watch_store(store)
        filler = Filler(store, c.chunk_size, metrics, clock, fills, c.fill_concurrency)
        service = ChunkService(store, filler)
        # Each region's origin is the source of its buckets' chunks.
        sources = {region: OriginSource(origin, metrics) for region, origin in origins.items()}
        alone = {region: Alone(service, source) for region, source in sources.items()}
        local: Mapping[str, NodePlacement] = alone
        peers = news = None
        if siblings is not None:
            local, peers, news = await stack.enter_async_context(
                _over_workers(siblings, service, sources, config, metrics, fills)
            )
        placements: Mapping[str, Placement] = local
        cluster = None
        if config.cluster.on:
            cluster = await stack.enter_async_context(build_cluster(config, metrics))
            hot = HotCopies(
                HotChunks(config.cluster.hot_reads, config.cluster.hot_window),
                Copies[ChunkId](int(config.cluster.hot_share * c.size)),
                service,
                metrics,
            )
            node_fills = RemoteFills(cluster.peers, fills)
            placements = {
                region: Clustered(placement, cluster, hot, node_fills, metrics)
                for region, placement in local.items()
            }

        def region_of(bucket: str) -> str:
            return origins.for_bucket(bucket).region.name

        reads = ReadPath(service, lambda b: placements[region_of(b)], c, clock, metrics)
        stack.callback(reads.close)
        if config.lifecycle.restore_on_read:
            reads.on_archived = on_archived

        async def keys(bucket: str, prefix: str) -> AsyncGenerator[list[tuple[str, int]], None]:
            async for page in origin_pages(origins.for_bucket(bucket), bucket, prefix):
                yield [(e.key, e.size) for e in page]

        def warm(bucket: str, prefix: str, may_read: Callable[[str], bool], n: int) -> Warm:
            return Warm(
                service,
                placements[region_of(bucket)],
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
            plan_hit=reads.plan_hit,
            holds=reads.holds,
            hit=reads.hit,
            bring_to_hand=reads.bring_to_hand if c.verify != "always" else None,
            invalidate=service.invalidate,
            warm=warm,
            cached_etag=cached_etag,
            event_position=service.event_position,
            save_event_position=service.save_event_position,
            writes=WriteCache(service, reads.serve_version, metrics.cache_written_bytes),
        )
        tell_siblings = _tell(peers, siblings.indexes) if siblings and peers else None
        secret = config.cluster.secret or (siblings.spec.secret if siblings else "")
        if secret:
            sender = Deliverer(service, metrics, sent=metrics.peer_served_bytes)
            stack.callback(sender.close)
            endpoint = PeerEndpoint(
                Verifier(secret.encode()),
                service,
                sender,
                lambda b: alone[region_of(b)],
                lambda b: local[region_of(b)],
                metrics,
                tell_siblings,
                reads.entry,
            )

            feature = replace(feature, peer=endpoint.handle)
        if news is not None:
            feature = replace(feature, tell_answered=news.answered, hear_answered=news.hear_answers)
        if siblings is not None and tell_siblings is not None:
            feature = replace(feature, waiting=siblings.waiting, tell_siblings=tell_siblings)
        if cluster is not None:
            feature = replace(
                feature,
                waiting=_first(feature.waiting, cluster.waiting),
                tell_nodes=cluster.invalidate,
            )
        yield feature


@asynccontextmanager
async def _over_workers(
    siblings: Siblings,
    service: ChunkService,
    sources: Mapping[str, OriginSource],
    config: Config,
    metrics: Metrics,
    fills: TaskGroup,
) -> AsyncIterator[tuple[dict[str, NodePlacement], PeerClient, News]]:
    """Each region's placement over this node's workers, and the signed calls to them: the
    siblings' chunks opened from them, this worker's handed to them, and what each learns
    told the others (:class:`News`). Closed on exit."""
    async with AsyncExitStack() as stack:
        peers = _sibling_peers(siblings, config, metrics)
        kept = chunk_descriptors(config)
        fd_clients = {k: FdClient(siblings.spec.fd_socket(k)) for k in siblings.indexes}
        sibling_sources = {
            k: SiblingSource(k, peers.source(worker_name(k)), fd_clients[k], kept)
            for k in siblings.indexes
        }
        for source in sibling_sources.values():
            stack.callback(source.close)
        me = siblings.spec.index
        news = News(me, service, sibling_sources, fd_clients, metrics, config.cache.dirs)
        stack.push_async_callback(news.close)
        service.watch(news)
        stack.callback(service.watch, None)
        await stack.enter_async_context(descriptor_server(siblings.spec, service, news.hear))
        shared = RemoteFills(peers, fills)
        usable = _usable(peers.membership)
        yield (
            {
                region: Local(service, src, me, sibling_sources, shared, usable, metrics)
                for region, src in sources.items()
            },
            peers,
            news,
        )


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
        open_chunks=chunk_descriptors(config),
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
        peers = PeerClient(
            c.self,
            c.secret.encode(),
            membership,
            session,
            metrics,
            scheme=scheme,
            dial=dict(c.dial),
        )
        metrics.node_info.labels(c.rack, c.self).set(1)
        cluster = Cluster(c, peers, metrics)
        await cluster.refresh()
        tasks = TaskGroup("cluster")
        tasks.start(cluster.run(), "refresh")
        try:
            yield cluster
        finally:
            await tasks.close()


def _first(*waits: Callable[[], str]) -> Callable[[], str]:
    """What the first of `waits` that waits for something waits for ("" when none)."""
    return lambda: next((why for wait in waits if (why := wait())), "")


def _sibling_peers(siblings: Siblings, config: Config, metrics: Metrics) -> PeerClient:
    """The signed calls to the siblings (their peer endpoints), each on its Unix socket."""
    secret = (config.cluster.secret or siblings.spec.secret).encode()
    membership = Membership(siblings.me, math.inf)
    return PeerClient(siblings.me, secret, membership, None, metrics, sessions=siblings.sessions)


def _usable(membership: Membership) -> Callable[[str], bool]:
    def usable(member: str) -> bool:
        return membership.usable(member, time.monotonic())

    return usable


def _tell(peers: PeerClient, indexes: list[int]) -> Callable[[str, list[str]], Awaitable[None]]:
    """Have the sibling workers drop their copies of `keys`, all at once, each call waiting
    at most SIBLING_TELL_TIMEOUT (however many keys: a DeleteObjects of 1,000 is not cut
    short); siblings that do not answer (restarting, or stuck) are logged."""

    async def one(k: int, bucket: str, key: str) -> bool:
        try:
            return await asyncio.wait_for(
                peers.invalidate(worker_name(k), bucket, key), SIBLING_TELL_TIMEOUT
            )
        except TimeoutError:
            return False

    async def tell(bucket: str, keys: list[str]) -> None:
        told = await asyncio.gather(*(one(k, bucket, key) for k in indexes for key in keys))
        if not all(told):
            log.warning("%d of %d sibling invalidations unanswered", told.count(False), len(told))

    return tell
