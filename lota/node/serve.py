"""``lota serve``: build a node, serve until told to stop, then drain and stop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import signal
from collections.abc import Callable
from dataclasses import replace

from lota.config import Config
from lota.workers.spec import WorkerSpec

log = logging.getLogger(__name__)

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


def schedule(policy: str) -> None:
    """With `policy` "batch" (``Config.scheduling``), put every thread of this serving
    process, and so every thread it starts later, under ``SCHED_BATCH``, unless it was
    started under a policy other than the default (``chrt``: the operator's choice
    stands). With "normal", leave the policy as it was started. A warning, not a failure,
    where the system refuses it (a seccomp filter). Each serving process (a worker, or a
    node serving alone) decides for itself; a supervisor of workers serves nothing and
    keeps its own, which its workers start with.

    Under ``SCHED_BATCH`` a thread woken by a request does not preempt the task running on
    its core: it takes its turn. When the cores are all busy (the node's jobs, the clients
    themselves), a worker woken for each request preempts a client that has more to send,
    for that one request; waiting its turn, it finds more requests ready and answers them
    in one go. Measured with ``bench.nginx``'s cells (two workers and the load generator on
    two cores, 64 KiB hits): more hits per second and a sixth of the context switches
    (``bench/HISTORY.md``). The price: with every core busy, a request to an idle worker
    waits for a running task's turn to end instead of running at once; "normal" is for a
    node whose clients care more for that than for throughput."""
    if policy != "batch":
        return
    try:
        started = policy_of()
        if started != "SCHED_OTHER":
            log.info("scheduling = batch: %s, as started, stands", started)
            return
        for thread in os.listdir("/proc/self/task"):
            with contextlib.suppress(ProcessLookupError):  # a thread that ended since
                os.sched_setscheduler(int(thread), os.SCHED_BATCH, os.sched_param(0))
        log.debug("scheduling = batch: SCHED_BATCH applied")
    except AttributeError:  # not Linux: no such policy
        log.debug("scheduling = %s: no such policy here", policy)
    except OSError as exc:  # refused
        log.warning("scheduling = %s not applied: %s", policy, exc)


def policy_of(pid: int = 0) -> str:
    """The name of the scheduling policy that thread or process `pid` (0: the calling
    thread) runs under, its reset-on-fork flag aside: ``SCHED_OTHER``, ``SCHED_BATCH``..."""
    policy = os.sched_getscheduler(pid) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)
    names = ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE", "SCHED_FIFO", "SCHED_RR")
    return next((n for n in names if getattr(os, n, None) == policy), f"policy {policy}")


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
    # The handlers it replaces come back once it has drained (a worker's, which leaves
    # its run directory; a bench's or a test's that runs a node in process).
    replaced = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in replaced:
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
        if worker is not None:  # before the handlers go: a second SIGTERM must not stop it
            worker.leave()
        for sig, handler in replaced.items():
            loop.remove_signal_handler(sig)
            if handler is not None:
                signal.signal(sig, handler)
