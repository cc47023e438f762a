"""The node's optional features as always-present objects: the read cache and the catalog.

A node without ``cache.dirs`` still has a :class:`CacheFeature` (:meth:`CacheFeature.off`:
nothing is cacheable, nothing to invalidate, no cache to warm, no peers to answer); a
node without a catalog still has a :class:`CatalogFeature` (:meth:`CatalogFeature.off`:
nothing is routed by the catalog, no access is recorded, no event published). The front
end asks them without checking whether the feature is there;
:func:`lota.node.build.build_node` makes the real ones. ``on`` says which it is, for the
few places that skip work rather than ask (the hit path, which must not pay for a feature
the node does not have).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web

from lota.auth.body import BodyDecoder
from lota.cache.intake import WriteCache
from lota.cache.reads import HitPlan
from lota.cache.warm import Warm
from lota.catalog import PendingSummary
from lota.errors import CatalogError
from lota.s3.addressing import Target
from lota.s3.errors import S3Error
from lota.s3.operations import Operation
from lota.s3.xml import DeleteRequest
from lota.zerocopy import FileSpan

# (bucket, prefix, may_read(key), concurrency): one warm run, not yet started.
WarmFactory = Callable[[str, str, Callable[[str], bool], int], Warm]
ServeCached = Callable[[web.BaseRequest, Target], Awaitable[web.StreamResponse]]
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class Invalidate(Protocol):
    """Drop this node's cached copy of (bucket, key), unless it is version `keep`."""

    def __call__(self, bucket: str, key: str, keep: str = "") -> Awaitable[None]: ...


async def _no_cluster(request: web.BaseRequest) -> web.StreamResponse:
    raise S3Error("InvalidRequest", "This node is not in a cluster ([cluster]).", status=404)


async def _tell_nobody(bucket: str, keys: list[str]) -> None:
    pass


def _not_waiting() -> str:
    return ""


def _no_etag(bucket: str, key: str) -> str:
    return ""


def _no_position() -> int | None:
    return None


def _save_nothing(position: int) -> None:
    pass


def _tell_no_one(told: dict[str, Any]) -> None:
    return None


def _hear_no_one(hearer: Callable[[Mapping[str, Any]], bool]) -> None:
    return None


def _no_plan(headers: Mapping[str, str], target: Target) -> HitPlan | None:
    return None


def _no_hit(plan: HitPlan, span: bool) -> bytes | bytearray | FileSpan | None:
    return None


def _holds_not(plan: HitPlan) -> bool:
    return False


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheFeature:
    """What the front end asks of the node's read cache (built by
    :func:`lota.node.build.build_cache`)."""

    on: bool
    cacheable: Callable[[Target, Mapping[str, str]], bool]
    """Whether the cache answers this read (else it passes through)."""
    serve: ServeCached
    """Answer a cacheable read from the cache, filling it from the origin on a miss."""
    invalidate: Invalidate
    """Drop this node's cached copy of (bucket, key), unless it is version `keep`."""
    warm: WarmFactory
    peer: Handler = _no_cluster
    """Answer another node of the cluster (``/_lota/peer/``; :mod:`lota.cluster.endpoint`)."""
    tell_siblings: Callable[[str, list[str]], Awaitable[None]] = _tell_nobody
    """Have the other workers of this node drop their cached copies of these keys."""
    tell_nodes: Callable[[str, list[str]], Awaitable[None]] = _tell_nobody
    """Have every other node of the cluster drop its cached copies of these keys (when no
    catalog carries the news)."""
    waiting: Callable[[], str] = _not_waiting
    """What the cache waits for before it can serve ("" once it can): every sibling worker
    to answer once, in a cluster the members to be known."""
    cached_etag: Callable[[str, str], str] = _no_etag
    """The ETag of this node's cached copy of (bucket, key); "" when it has none."""
    event_position: Callable[[], int | None] = _no_position
    """The catalog event position saved with this worker's cache when it was opened (None
    if none was): its event stream resumes after it (:mod:`lota.node.invalidation`)."""
    save_event_position: Callable[[int], None] = _save_nothing
    """Every catalog event up to this position has been applied to this worker's cache."""
    writes: WriteCache = field(default_factory=WriteCache.off)
    """What accelerated writes ask of the cache: keep what they write, serve it back."""
    plan_hit: Callable[[Mapping[str, str], Target], HitPlan | None] = _no_plan
    """How a cacheable GET is answered at once, as :attr:`serve` would answer it, when
    that needs no waiting (a small fresh hit); None otherwise."""
    holds: Callable[[HitPlan], bool] = _holds_not
    """Whether a plan still holds: its entry alive, fresh, and not refreshed since."""
    hit: Callable[[HitPlan, bool], bytes | bytearray | FileSpan | None] = _no_hit
    """The body of the GET a plan was made for, if its bytes are at hand (None otherwise,
    or once it no longer holds); with True, it may be a span of a file, to be sent from
    the page cache at once."""
    bring_to_hand: Callable[[HitPlan], Coroutine[Any, Any, bool]] | None = None
    """Bring the bytes of the GET a plan was made for to hand, when :attr:`hit` found them
    not (read on a thread, or handed over by the worker that holds them), counting
    nothing; False once the plan no longer holds, or a chunk is missing (then
    :attr:`serve` answers). None where :attr:`hit` would still not answer (every read
    checks its chunk on a thread: ``verify = "always"``)."""
    tell_answered: Callable[[dict[str, Any]], None] = _tell_no_one
    """Tell the other workers of this node of a request remembered to be answered at once
    (:meth:`lota.node.at_once.AtOnce.heard` is what hears it there)."""
    hear_answered: Callable[[Callable[[Mapping[str, Any]], bool]], None] = _hear_no_one
    """Have this function hear what the other workers tell (:attr:`tell_answered`)."""

    @classmethod
    def off(cls) -> CacheFeature:
        """A node without a cache: every read passes through."""
        return cls(on=False, cacheable=_never, serve=_no_cache, invalidate=_nothing, warm=_no_warm)


def _never(target: Target, headers: Mapping[str, str]) -> bool:
    return False


async def _no_cache(request: web.BaseRequest, target: Target) -> web.StreamResponse:
    raise AssertionError("no cache to serve from: nothing is cacheable")


async def _nothing(bucket: str, key: str, keep: str = "") -> None:
    pass


def _no_warm(bucket: str, prefix: str, may_read: Callable[[str], bool], n: int) -> Warm:
    raise S3Error("InvalidRequest", "This node has no cache to warm.")


class Regional(Protocol):
    """The requests the catalog decides (:class:`lota.regions.writes.RegionalRouter`);
    each answers None when the catalog has no say."""

    async def read(self, request: web.BaseRequest, target: Target) -> web.StreamResponse | None: ...

    async def handle(
        self, request: web.BaseRequest, target: Target, operation: Operation, decoder: BodyDecoder
    ) -> web.StreamResponse | None: ...

    async def delete_objects(self, target: Target, deletes: DeleteRequest) -> bytes | None: ...


class Accesses(Protocol):
    """Last-access recording for tiering (:class:`lota.lifecycle.access.AccessRecorder`)."""

    def record(self, bucket: str, key: str, at: float | None = None) -> None: ...

    async def close(self) -> None: ...


class Shared(Protocol):
    """What the front end tells or asks the catalog itself (:class:`lota.catalog.Catalog`)."""

    async def publish(self, kind: str, bucket: str, key: str, seq: int = 0) -> int: ...

    async def pending_summary(self) -> PendingSummary: ...


class Pending(Protocol):
    """Which keys have a version on its way home (:class:`lota.regions.pending.PendingKeys`)."""

    def later(self) -> asyncio.Future[CatalogError | None] | None: ...

    def holds(self, bucket: str, key: str) -> bool: ...


def _no_problem() -> str:
    return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CatalogFeature:
    """What the catalog serves on this node (built by :func:`lota.node.build.build_catalog`):
    write acceleration, last accesses and invalidation events for the other nodes."""

    on: bool
    catalog: Shared
    router: Regional
    access: Accesses
    problem: Callable[[], str] = _no_problem
    """Why this node cannot take accelerated writes now ("" when it can): its staging
    bucket is missing or refuses writes. The node is not ready meanwhile."""
    pending: Pending | None = None
    """The keys with a version on its way home, mirrored (None: a read asks the router)."""

    @classmethod
    def off(cls) -> CatalogFeature:
        """A node without a catalog: no acceleration, no access times, no events."""
        return cls(on=False, catalog=_NoCatalog(), router=_NoRouter(), access=_NoAccesses())


class _NoRouter:
    async def read(self, request: web.BaseRequest, target: Target) -> web.StreamResponse | None:
        return None

    async def handle(
        self, request: web.BaseRequest, target: Target, operation: Operation, decoder: BodyDecoder
    ) -> web.StreamResponse | None:
        return None

    async def delete_objects(self, target: Target, deletes: DeleteRequest) -> bytes | None:
        return None


class _NoAccesses:
    def record(self, bucket: str, key: str, at: float | None = None) -> None:
        pass

    async def close(self) -> None:
        pass


class _NoCatalog:
    async def publish(self, kind: str, bucket: str, key: str, seq: int = 0) -> int:
        return 0

    async def pending_summary(self) -> PendingSummary:
        raise S3Error(
            "InvalidRequest", "This node has no catalog ([catalog] url): it migrates nothing."
        )
