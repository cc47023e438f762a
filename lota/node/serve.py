"""``lota serve``: build a node, serve until told to stop, then drain and stop."""

from __future__ import annotations

import asyncio
import gc
import signal
from collections.abc import Callable
from dataclasses import replace

from lota.config import Config
from lota.workers.spec import WorkerSpec

# The cycle collector's thresholds in a serving process (Python's are 700, 10, 10).
GC_THRESHOLDS = (50_000, 20, 10)


def collect_less() -> None:
    """Have Python's cycle collector run less often than its defaults would. A node holds
    hundreds of thousands of long-lived objects (entries, remembered answers, verdicts,
    descriptors), added as its hot set is first read: with the defaults, young
    collections cost a first hit of 20,000 objects ~25 µs, and each growth of that set by
    a quarter a full collection of all of it (~0.2 s at 300,000 objects, a stall every
    connection waits out). Hits answered at once make no cyclic garbage (tested), and
    whatever else does (errors, closed connections) is still collected, after 50,000
    allocations, not 700."""
    gc.set_threshold(*GC_THRESHOLDS)


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
    # Imported here: a supervisor of workers imports this module and serves nothing, and
    # the node's modules would be a third of a worker's memory in it too.
    from lota.node.build import build_node

    if worker is None:  # serving alone, whatever `workers` says
        config = replace(config, workers=1)
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
