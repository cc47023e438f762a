"""Access tracking: the request path notes reads and writes; a background loop writes them
to the catalog in batches.

Lifecycle decisions need the last time each object was read or written *through LOTA*:
behind a cache the origin never sees the reads. Recording must cost the request path next
to nothing, so :meth:`AccessRecorder.record` only updates a dict; the flush loop hands
the latest time per object to :meth:`lota.catalog.Catalog.record_accesses` every
`flush_interval` seconds, or as soon as `max_pending` objects are waiting::

    recorder = AccessRecorder(catalog, clock)
    recorder.start(node.tasks)                  # the flush loop, owned by the node's tasks
    recorder.record("ckpt", "runs/a/step-1")    # GET (hits and misses), PUT, copy
    ...
    await recorder.close()                      # on clean shutdown: stop, flush the rest

Bounded memory: at most `max_pending` objects wait, plus one batch being written. When
the catalog is slow or down and the limit is reached, the *least recently accessed*
waiting entry is dropped (and counted in ``dropped``): losing an access can only make an
object look older than it is, and the oldest entry is the one whose loss moves its
object's age least. A failed flush puts its batch back (newer times win) and is retried at
the next interval; a flush on :meth:`close` that fails is logged with what was lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict

from lota.catalog import Catalog
from lota.clock import Clock
from lota.errors import CatalogError
from lota.tasks import TaskGroup

log = logging.getLogger("lota.lifecycle")

Pending = OrderedDict[tuple[str, str], float]


class AccessRecorder:
    """Batches last-access times per object on their way to the catalog."""

    def __init__(
        self,
        catalog: Catalog,
        clock: Clock,
        *,
        flush_interval: float = 5.0,
        max_pending: int = 100_000,
    ) -> None:
        if flush_interval <= 0 or max_pending < 1:
            raise ValueError("flush_interval and max_pending must be positive")
        self._catalog = catalog
        self._clock = clock
        self.flush_interval = flush_interval
        self.max_pending = max_pending
        self._pending: Pending = OrderedDict()
        self._full = asyncio.Event()
        self._flushing = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        # Counters for metrics: accesses noted, objects written to the catalog, entries
        # dropped for lack of room, flushes that failed.
        self.recorded = 0
        self.flushed = 0
        self.dropped = 0
        self.failures = 0

    def __len__(self) -> int:
        return len(self._pending)

    def record(self, bucket: str, key: str, at: float | None = None) -> None:
        """Note an access to bucket/key now (or at `at`). Never blocks, never fails."""
        pending = self._pending
        entry = (bucket, key)
        when = self._clock.time() if at is None else at
        self.recorded += 1
        if entry in pending:
            pending[entry] = max(pending[entry], when)
            pending.move_to_end(entry)
            return
        pending[entry] = when
        if len(pending) >= self.max_pending:
            self._full.set()
            if len(pending) > self.max_pending:
                pending.popitem(last=False)
                self.dropped += 1

    async def flush(self) -> None:
        """Write what is waiting to the catalog now; on failure it waits for the next try."""
        async with self._flushing:
            batch, self._pending = self._pending, OrderedDict()
            self._full.clear()
            if not batch:
                return
            try:
                await self._catalog.record_accesses(
                    (bucket, key, at) for (bucket, key), at in batch.items()
                )
            except BaseException:
                self._put_back(batch)
                raise
            self.flushed += len(batch)

    def _put_back(self, batch: Pending) -> None:
        """Merge a batch that did not reach the catalog back in, as the oldest entries."""
        pending = self._pending
        for entry, at in reversed(batch.items()):
            if entry in pending:
                pending[entry] = max(pending[entry], at)
            else:
                pending[entry] = at
                pending.move_to_end(entry, last=False)
        while len(pending) > self.max_pending:
            pending.popitem(last=False)
            self.dropped += 1

    def start(self, tasks: TaskGroup) -> None:
        """Start the flush loop as a task of `tasks`."""
        if self._task is None:
            self._task = tasks.start(self._loop(), "access-recorder")

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), self.flush_interval)
            try:
                await self.flush()
            except CatalogError as exc:
                self.failures += 1
                log.warning("could not record %d accesses yet: %s", len(self._pending), exc)

    async def close(self) -> None:
        """Stop the flush loop and flush what is left (clean shutdown)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        try:
            await self.flush()
        except CatalogError as exc:
            self.failures += 1
            log.error("lost %d accesses at shutdown: %s", len(self._pending), exc)
