"""A LOTA node served in the test's own event loop, for tests that need no subprocess.

:func:`running_node` runs :func:`lota.node.serve.serve` (what ``lota serve`` runs) on an
ephemeral loopback port until the block ends, then lets it drain and stop::

    config = node_config({"origin": origin, "auth.mode": "none", "cache.dirs": [str(tmp)]})
    async with running_node(config) as node:
        async with aiohttp.ClientSession() as http, http.get(f"{node.url}/b/k") as r:
            ...
        assert 'lota_cache_requests_total{source="HIT"} 1.0' in await node.metrics()

It uses only the public face of :mod:`lota.node.serve` and :mod:`lota.config` (``serve``,
``load``), so it keeps working however the node is put together inside. Tests of the
process itself (signals, exit codes, descriptor limits, the CLI) use
:class:`lota.testing.processes.LotaProcess` instead: here SIGTERM/SIGINT reach the test
process's loop while the node serves, and the descriptor limit is raised for the whole test
process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from lota import config as configuration
from lota.config import Config
from lota.node.serve import serve
from lota.tasks import TaskGroup
from lota.testing.credentials import ORIGIN_KEYS
from lota.testing.tls import unverified_context

READY_TIMEOUT = 30.0
STOP_GRACE = 10.0  # beyond the drain timeout, before a node that will not stop is cancelled


def node_config(settings: Mapping[str, Any], *, environ: Mapping[str, str] | None = None) -> Config:
    """A config for a test node on an ephemeral loopback port.

    `settings` are the dotted paths of :func:`lota.config.settings` (``"origin"``,
    ``"cache.dirs"``, ``"auth.mode"``...); `environ` stands in for the process environment,
    so the machine's own ``LOTA_*`` and ``AWS_*`` variables play no part. The origin signs
    with the embedded origin's keys unless `environ` says otherwise.
    """
    overrides = {"listen": "127.0.0.1:0", **settings}
    return configuration.load(overrides=overrides, environ={**ORIGIN_KEYS, **(environ or {})})


@dataclass(slots=True)
class InProcessNode:
    """A node :func:`running_node` serves: where it listens and how to stop it early."""

    url: str
    config: Config
    _stop: asyncio.Event = field(repr=False)
    _serving: asyncio.Task[None] = field(repr=False)

    async def metrics(self) -> str:
        """The node's Prometheus text, as scraped from ``/_lota/metrics``."""
        async with (
            aiohttp.ClientSession() as http,
            http.get(f"{self.url}/_lota/metrics", ssl=unverified_context()) as response,
        ):
            response.raise_for_status()
            return await response.text()

    async def stop(self) -> None:
        """Stop as on SIGTERM (stop accepting, drain, close) and wait until it has.

        A failure of the node while it served is raised here.
        """
        self._stop.set()
        await asyncio.shield(self._serving)


@contextlib.asynccontextmanager
async def running_node(
    config: Config, *, ready_timeout: float = READY_TIMEOUT
) -> AsyncIterator[InProcessNode]:
    """Serve `config` in this event loop for the block; a node that fails to start raises
    what ``lota serve`` would have (a ``StartupError``, a ``ConfigError``...)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[str] = loop.create_future()
    stop = asyncio.Event()
    tasks = TaskGroup("testing")
    serving = tasks.start(_serve(config, stop, ready), name="node")
    try:
        async with asyncio.timeout(ready_timeout):
            url = await asyncio.shield(ready)
        node = InProcessNode(url, config, stop, serving)
        yield node
        await node.stop()
    finally:
        # Also when the block failed: a drained node closes its sockets and files.
        stop.set()
        await asyncio.wait({serving}, timeout=config.drain_timeout + STOP_GRACE)
        await tasks.close()


async def _serve(config: Config, stop: asyncio.Event, ready: asyncio.Future[str]) -> None:
    """Run the node; a failure before it is ready goes to `ready`, for running_node to raise."""

    def announce(url: str) -> None:
        if not ready.done():
            ready.set_result(url)

    try:
        await serve(config, stop=stop, on_ready=announce)
    except Exception as exc:
        if ready.done():
            raise
        ready.set_exception(exc)
    if not ready.done():
        ready.set_exception(RuntimeError("the node stopped before it was ready"))
