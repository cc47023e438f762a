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

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp

from lota.auth import Authenticator
from lota.catalog import Event, open_catalog
from lota.clock import Clock
from lota.config import Config
from lota.connections import connection_limits
from lota.lifecycle.access import AccessRecorder
from lota.lifecycle.engine import Engine, MetricsObserver
from lota.lifecycle.origin import OriginListing, OriginMover, OriginTags
from lota.lifecycle.restore import Restores
from lota.lifecycle.state import RULES_DOCUMENT, LifecycleState
from lota.logs import AccessLog
from lota.metrics import Metrics
from lota.node.admin import Admin
from lota.node.at_once import AtOnce
from lota.node.cache import build_cache
from lota.node.features import CacheFeature, CatalogFeature
from lota.node.front import Front
from lota.node.invalidation import Invalidation, catch_up, follow_events, resume_after
from lota.node.lag import watch_lag
from lota.node.node import Drain, Node
from lota.passthrough import PassThrough
from lota.regions.accelerate import Accelerator
from lota.regions.control import ControlPlane
from lota.regions.migrator import Migrator
from lota.regions.origin import POOL_SIZE
from lota.regions.origins import Origins
from lota.regions.pending import PendingKeys
from lota.regions.staging import Staging
from lota.regions.writes import RegionalRouter
from lota.tasks import TaskGroup
from lota.threads import run_in_thread
from lota.workers.metrics import merge
from lota.workers.node import Siblings
from lota.workers.node import siblings as sibling_sessions
from lota.workers.spec import WorkerSpec


@asynccontextmanager
async def build_node(
    config: Config, *, clock: Clock | None = None, worker: WorkerSpec | None = None
) -> AsyncIterator[Node]:
    """The node `config` describes, every part open, ready to :meth:`Node.start`; its parts
    close when the block ends. `clock` drives cache ages, leases and lifecycle decisions
    (default: the process clock, which ``LOTA_TIME_OFFSET`` shifts). `worker`: this
    process is one of the node's workers (:mod:`lota.workers`)."""
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
        siblings = None
        if worker is not None and worker.count > 1:
            siblings = await stack.enter_async_context(sibling_sessions(worker))
        control = ControlPlane(config, metrics)
        stack.push_async_callback(control.close)
        cache = CacheFeature.off()
        if config.cache.dirs:
            restores = Restores(config.lifecycle, tasks, origins.for_bucket)
            cache = await stack.enter_async_context(
                build_cache(config, clock, metrics, fills, origins, restores.start, siblings)
            )
        catalog = CatalogFeature.off()
        if config.catalog.url:
            # The migrator and the lifecycle engine run in one worker of a node.
            engines = worker is None or worker.index == 0
            catalog = await stack.enter_async_context(
                build_catalog(
                    config, clock, metrics, origins, control, tasks, lifecycle, cache, engines
                )
            )
        stack.push_async_callback(_stop_work, drain, catalog, fills, tasks)
        tasks.start(watch_lag(metrics.event_loop_lag_seconds), "loop lag")
        admin = Admin(
            config, auth, metrics, drain, lifecycle, cache, catalog, node_metrics(siblings)
        )
        metrics.ready.set_function(lambda: float(admin.ready()))
        front = Front(
            domain=config.domain,
            body_timeout=config.body_timeout,
            auth=auth,
            metrics=metrics,
            access_log=access_log,
            drain=drain,
            admin=admin,
            passthrough=PassThrough(origins, config.body_timeout),
            cache=cache,
            catalog=catalog,
            invalidation=Invalidation(cache, catalog),
        )
        at_once = AtOnce(
            domain=config.domain,
            auth=auth,
            metrics=metrics,
            access_log=access_log,
            drain=drain,
            cache=cache,
            catalog=catalog,
        )
        stack.push_async_callback(at_once.close)  # before the cache it reads closes
        node = Node(
            config,
            front.handle,
            drain,
            limits,
            metrics,
            worker,
            answers=at_once,
        )
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


def node_metrics(siblings: Siblings | None) -> Callable[[bytes], Awaitable[bytes]]:
    """The node's metrics from this worker's (`own`): its siblings' added in."""

    async def render(own: bytes) -> bytes:
        if siblings is None:
            return own
        # Parsing each sibling's text takes ~3 ms (~210 ms for 64 workers): on a thread,
        # the loop serving this worker's requests meanwhile.
        return await run_in_thread(merge, [own, *await siblings.metrics()])

    return render


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
    engines: bool = True,
) -> AsyncIterator[CatalogFeature]:
    """The catalog, with write acceleration, the invalidation follower, the access
    recorder, and (with `engines`) the migrator and the lifecycle engine started as
    `tasks`; closed on exit (the tasks must be stopped by then)."""
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
        pending = PendingKeys(
            catalog,
            poll=catalog.settings.listen_poll_interval,
            # A missing event is a write whose commit may still come: as long as a
            # statement may take, and then some.
            gap_timeout=max(catalog.settings.gap_timeout, catalog.settings.command_timeout + 30.0),
        )
        tasks.start(pending.run(), "pending keys")
        router = RegionalRouter(config, catalog, accelerator, origins, pending)
        migrator = Migrator(catalog, staging, origins.for_bucket, control, w, metrics, clock)
        if engines:
            tasks.start(migrator.run(), "migrator")
        lifecycle.share(catalog)
        # Follow the events from before the rules are read, and before the node serves:
        # rules replaced (or keys written) elsewhere meanwhile are then either read here or
        # heard, never neither. From where this worker's cache left them, if it can.
        events = await catalog.events(await resume_after(catalog, cache.event_position()))
        await lifecycle.load()

        async def on_document(event: Event) -> None:
            if event.key == RULES_DOCUMENT:
                await lifecycle.load()

        tasks.start(follow_events(events, catalog, cache, config.node, on_document), "events")
        await catch_up(events)
        access = AccessRecorder(catalog, clock)
        access.start(tasks)
        engine = Engine(
            catalog,
            OriginListing(control),
            OriginMover(control),
            config.lifecycle,
            clock=clock,
            state=lifecycle,
            observer=MetricsObserver(metrics),
            tags=OriginTags(control),
        )
        if engines and config.lifecycle.interval > 0:
            tasks.start(engine.run_forever(), "lifecycle")
        yield CatalogFeature(
            on=True,
            catalog=catalog,
            router=router,
            access=access,
            problem=lambda: accelerator.problem,
            pending=pending,
        )
    finally:
        await tasks.close()  # already done, unless the opening failed half-way
        await catalog.close()


async def _check_staging(accelerator: Accelerator, create: bool, tasks: TaskGroup) -> None:
    """Check this node's staging before it serves; if it cannot take writes, keep checking
    in the background (the node is not ready meanwhile, and says why)."""
    if not await accelerator.recheck_staging(create):
        tasks.start(accelerator.watch_staging(create), "staging check")
