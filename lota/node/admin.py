"""LOTA's own calls, under ``/_lota/`` (no S3 bucket name can contain ``_``).

=============================  ==========================================================
``GET /_lota/healthz``         the process answers (liveness)
``GET /_lota/readyz``          200 while serving; 503 saying why: starting, waiting for
                               the sibling workers or the cluster's members, this node's
                               staging unable to take writes, draining
``GET /_lota/metrics``         Prometheus text, summed over the node's workers
``POST /_lota/warm``           fill the cache with a prefix; progress as JSON lines
``GET|PUT /_lota/lifecycle/rules``  the lifecycle rules, versioned, as JSON (with a catalog,
                               a PUT replaces them on every node)
``GET /_lota/migrations``      accelerated writes not yet in their home region
``/_lota/peer/…``              the other nodes of the cluster (lota.cluster.endpoint)
=============================  ==========================================================

The probes need no credentials; the peer calls are signed with the cluster secret and
nothing else; the other calls are signed like S3 requests and authorized against the S3
action they amount to.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

from aiohttp import web

from lota.auth import Authenticator
from lota.auth.body import make_decoder
from lota.auth.sigv4 import RequestView
from lota.cache.warm import parse_concurrency
from lota.catalog import PendingSummary
from lota.config import Config
from lota.errors import ConfigError
from lota.lifecycle.state import LifecycleState
from lota.metrics import Metrics
from lota.node.features import CacheFeature, CatalogFeature
from lota.node.node import Drain
from lota.relay import read_small_body
from lota.s3.addressing import is_valid_bucket_name, split_target
from lota.s3.errors import S3Error
from lota.s3.operations import bucket_arn, object_arn

# Calls from the other nodes of the cluster.
PEER_PREFIX = "/_lota/peer/"
# What a draining node still answers: everything else gets 503.
PROBES = frozenset({"/_lota/healthz", "/_lota/readyz", "/_lota/metrics"})
# A lifecycle rules document stays well under this.
RULES_BODY_LIMIT = 2 * 1024 * 1024


class Admin:
    """Answers the ``/_lota/`` calls."""

    def __init__(
        self,
        config: Config,
        auth: Authenticator,
        metrics: Metrics,
        drain: Drain,
        lifecycle: LifecycleState,
        cache: CacheFeature,
        catalog: CatalogFeature,
        node_metrics: Callable[[bytes], Awaitable[bytes]],
    ) -> None:
        """`node_metrics`: the node's metrics from this process's (its workers' added)."""
        self._node_metrics = node_metrics
        self._config = config
        self._auth = auth
        self._metrics = metrics
        self._drain = drain
        self._lifecycle = lifecycle
        self._cache = cache
        self._catalog = catalog.catalog
        self._problem = catalog.problem

    def ready(self) -> bool:
        """Whether the node serves: started and not draining, its cache ready, its
        staging taking writes."""
        return not self.not_ready()

    def not_ready(self) -> str:
        """Why the node does not serve now ("" when it does)."""
        if self._drain.draining:
            return "draining"
        if not self._drain.ready:
            return "starting"
        return self._cache.waiting() or self._problem()

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        if path == "/_lota/healthz":
            return web.Response(text="ok\n")
        if path == "/_lota/readyz":
            return self._readyz()
        if path == "/_lota/metrics":
            own = self._metrics.render()
            # ?worker=own: this worker's alone (what a sibling asks for, to add up).
            body = own if "worker" in request.query else await self._node_metrics(own)
            return web.Response(body=body, content_type="text/plain", charset="utf-8")
        if path.startswith(PEER_PREFIX):
            return await self._cache.peer(request)
        if path == "/_lota/warm" and request.method == "POST":
            return await self._warm(request)
        if path == "/_lota/lifecycle/rules":
            return await self._lifecycle_rules(request)
        if path == "/_lota/migrations":
            self._auth.authorize(_view(request), "s3:ListAllMyBuckets", "*")
            summary = await self._catalog.pending_summary()
            return web.json_response(migration_report(summary))
        raise S3Error("InvalidRequest", f"Unknown LOTA admin call {path!r}.", status=404)

    def _readyz(self) -> web.Response:
        """200 "ready", or 503 "not ready: " and why."""
        why = self.not_ready()
        if not why:
            return web.Response(text="ready\n")
        return web.Response(text=f"not ready: {why}\n", status=503)

    async def _lifecycle_rules(self, request: web.BaseRequest) -> web.StreamResponse:
        """``GET``/``PUT /_lota/lifecycle/rules``: the lifecycle rules and their version, as
        JSON; a PUT replaces them (for every node, with a catalog)."""
        view = _view(request)
        action = "s3:GetLifecycleConfiguration"
        if request.method == "PUT":
            action = "s3:PutLifecycleConfiguration"
        self._auth.authorize(view, action, "*")
        if request.method == "PUT":
            decoder = make_decoder(view, None)
            body = await read_small_body(
                request, decoder, RULES_BODY_LIMIT, self._config.body_timeout
            )
            try:
                await self._lifecycle.replace(body.decode("utf-8", "replace"))
            except ConfigError as exc:
                raise S3Error("InvalidArgument", str(exc)) from exc
        elif request.method != "GET":
            raise S3Error("MethodNotAllowed", "Use GET or PUT.")
        return web.Response(text=self._lifecycle.as_json(), content_type="application/json")

    async def _warm(self, request: web.BaseRequest) -> web.StreamResponse:
        """``POST /_lota/warm?bucket=B&prefix=P[&concurrency=N]``: progress as JSON lines.

        Needs ``s3:ListBucket`` on the bucket; each object is filled only if its
        ``s3:GetObject`` is allowed (see :mod:`lota.cache.warm`)."""
        bucket = request.query.get("bucket", "")
        if not is_valid_bucket_name(bucket):
            raise S3Error("InvalidBucketName")
        principal = self._auth.authorize(_view(request), "s3:ListBucket", bucket_arn(bucket))
        concurrency = parse_concurrency(request.query.get("concurrency"))

        def may_read(key: str) -> bool:
            return principal is None or principal.policy.allows(
                "s3:GetObject", object_arn(bucket, key)
            )

        prefix = request.query.get("prefix", "")
        run = self._cache.warm(bucket, prefix, may_read, concurrency)
        await run.start()  # a refusal is still an S3 error, before any 200
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        async with contextlib.aclosing(run.progress()) as lines:
            async for progress in lines:
                await response.write(progress.as_line())
        await response.write_eof()
        return response


def _view(request: web.BaseRequest) -> RequestView:
    raw_path, query = split_target(request.raw_path)
    return RequestView(request.method, raw_path, query, request.headers)


def migration_report(summary: PendingSummary) -> dict[str, float | int]:
    """``lota migrations`` and ``/_lota/migrations``: the pending summary as JSON."""
    count, size, oldest, failing = summary
    return {
        "pending": count,
        "pending_bytes": size,
        "oldest_age_seconds": round(oldest, 1),
        "failing": failing,
    }
