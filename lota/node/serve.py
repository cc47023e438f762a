"""``lota serve``: build a node, serve until told to stop, then drain and stop."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from lota.config import Config
from lota.node.build import build_node
from lota.workers.spec import WorkerSpec


async def serve(
    config: Config,
    *,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[str], None] | None = None,
    worker: WorkerSpec | None = None,
) -> None:
    """Serve until `stop` is set or SIGTERM/SIGINT arrives, then drain and return.
    `on_ready` gets the URL once the node listens; `worker`: this process is one of the
    node's workers (:mod:`lota.workers`)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        async with build_node(config, worker=worker) as node:
            url = await node.start()
            if on_ready:
                on_ready(url)
            await stop.wait()
            await node.drain()
            await node.stop()
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
