"""How late a worker's event loop runs: :func:`watch_lag`.

Everything a worker does runs on its one event loop, so one step that holds the loop (a
long computation, a blocking call) delays every request of that worker, and so does the
worker being off the CPU (more busy processes than cores); neither shows in any
request's own work. A timer due every :data:`EVERY` seconds runs late by as much: that
lateness is observed in ``lota_event_loop_lag_seconds``, the tail of every request's
latency that no request caused. (A probe of this kind, in 2026-12, found each worker's
loop held 4-20 ms dozens of times every five seconds by counting siblings' reads in
one go: ``bench/HISTORY.md``.) Costs one timer per :data:`EVERY` per worker, run by the
node's tasks (:func:`lota.node.build.build_node`).
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import Histogram

# Seconds between two looks: a hold shorter than this is seen in proportion to its length.
EVERY = 0.02


async def watch_lag(lag: Histogram, every: float = EVERY) -> None:
    """Observe in `lag`, every `every` seconds, how late the loop woke this task; forever."""
    while True:
        due = time.monotonic() + every
        await asyncio.sleep(every)
        lag.observe(max(0.0, time.monotonic() - due))
