"""Which keys have a latest version still on its way home: :class:`PendingKeys`.

A GET or HEAD through a node with a catalog must see a write accepted anywhere in the
cluster as soon as its writer got its 200 (the version is served from staging until it is
home). Asking the catalog for the key on every read costs a query per read, on every
node: a cluster's reads would all land on one database. Instead each worker mirrors the
set of pending keys (bucket, key and the newest pending seq), loaded once and kept up to
date from the catalog's events (``put``/``delete``/``requeued`` add a key, ``migrated``
removes it, unless a newer version is pending):

* A read waits for the mirror to have heard every event committed before the read
  arrived (:meth:`PendingKeys.may_be_pending`), then asks the mirror. Reads waiting
  together share that one refresh (a query for the events after the last one heard,
  and one for the holes below it: :class:`lota.catalog.events.EventCursor`), so a worker
  sends the catalog at most one such query at a time, whatever its load; the key itself
  is asked for (``get_object``) only when the mirror holds it.
* Idle, the mirror refreshes every ``poll`` seconds, so it never falls far behind.
* A refresh that fails fails the reads waiting for it (the catalog is down: they would
  have failed asking it), and the next one loads the whole set again (events may have
  been pruned meanwhile). So does a mirror that would hold more than `limit` keys: it
  then answers "maybe" for every key at once (each read asks the catalog, as without a
  mirror) until an idle refresh finds the backlog under the limit again.

A key the mirror holds whose latest version the catalog says is home (an event replayed
after a reload) is dropped by :meth:`PendingKeys.settled`, unless the mirror heard it
pending again meanwhile.

Limits. Event ids are handed out before their transaction commits (PostgreSQL): the mirror
waits for a missing id as long as a catalog statement may take (``gap_timeout``, raised to
the catalog's ``command_timeout`` and then some by the node), and after a reload replays
the last 1,000 events (:data:`lota.catalog.events.MAX_GAPS`); a write whose commit lands
after both would be heard only with its key's next event. Every node of a cluster must
run a LOTA that publishes ``requeued`` (this one or later).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time

from lota.catalog import Catalog, Event, EventKind
from lota.catalog.events import MAX_GAPS, EventCursor
from lota.errors import CatalogError, CatalogUnavailable

log = logging.getLogger("lota.writes")

MAX_KEYS = 100_000
"""Pending keys mirrored at most (some 15 MiB); past this every read asks the catalog."""
BATCH = 1000
"""Events read per query."""

_ADDS = frozenset({EventKind.PUT, EventKind.DELETE, EventKind.REQUEUED})


class PendingKeys:
    """A worker's mirror of the catalog's pending keys (see the module); :meth:`run` keeps
    it, as a task."""

    def __init__(
        self, catalog: Catalog, *, poll: float, gap_timeout: float, limit: int = MAX_KEYS
    ) -> None:
        self._catalog = catalog
        self._poll = poll
        self._gap_timeout = gap_timeout
        self._limit = limit
        # (bucket, key): (the newest pending seq heard, when it was heard: see :meth:`mark`)
        self._keys: dict[tuple[str, str], tuple[int, int]] = {}
        self._heard = 0
        self._overflow = False
        self._cursor: EventCursor | None = None  # None: load the whole set next time
        self._next: asyncio.Future[CatalogError | None] | None = None
        self._wanted = asyncio.Event()
        self._stopped = False
        self.refreshes = 0
        """Refreshes done (each one or two queries; a reload two)."""

    async def may_be_pending(self, bucket: str, key: str) -> bool:
        """Whether bucket/key may have a version on its way home, as of a refresh begun
        after this call (False: the catalog has none). Raises the refresh's
        :class:`CatalogError`."""
        if self._overflow:
            return True  # the read asks the catalog anyway
        ready = self.later()
        if ready is None:
            raise CatalogUnavailable("the node is stopping: pending keys are not kept")
        failed = await asyncio.shield(ready)
        if failed is not None:
            raise copy.copy(failed) from failed  # each its own (a traceback each)
        return self.holds(bucket, key)

    def later(self) -> asyncio.Future[CatalogError | None] | None:
        """The refresh a read arriving now waits for, begun after now: done when it is
        (its result: the error that stopped it, or None), then ask :meth:`holds`. None
        when no refresh is needed (past its limit the mirror holds every key) or none
        will come (stopped)."""
        if self._overflow or self._stopped:
            return None
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
            self._wanted.set()
        return self._next

    def holds(self, bucket: str, key: str) -> bool:
        """Whether bucket/key may have a version on its way home, as of the last refresh."""
        return self._overflow or (bucket, key) in self._keys

    def mark(self, bucket: str, key: str) -> int:
        """When the mirror last heard the key is pending (0: it holds no such key), for
        :meth:`settled`."""
        return self._keys.get((bucket, key), (0, 0))[1]

    def settled(self, bucket: str, key: str, mark: int) -> None:
        """The catalog said the key's latest version is home, asked after the mirror held
        it as of `mark` (:meth:`mark`): forget it, unless it was heard pending since (a
        newer version, or the same one requeued)."""
        if mark and self.mark(bucket, key) == mark:
            del self._keys[(bucket, key)]

    async def run(self) -> None:
        """Refresh when reads wait, and every `poll` seconds; until cancelled."""
        waiting: asyncio.Future[CatalogError | None] | None = None
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wanted.wait(), self._poll)
                self._wanted.clear()
                waiting, self._next = self._next, None
                failed = await self._refreshed()
                self.refreshes += 1
                if waiting is not None:
                    waiting.set_result(failed)
                    waiting = None
        finally:
            self._stopped = True
            for left in (waiting, self._next):
                if left is not None and not left.done():
                    left.set_result(CatalogUnavailable("the node is stopping"))

    async def _refreshed(self) -> CatalogError | None:
        """Refresh; the error that stopped it, if one did (the next one reloads)."""
        try:
            await self._refresh()
            return None
        except Exception as exc:
            if not isinstance(exc, CatalogError):
                log.exception("pending keys: refresh failed")
                exc = CatalogError(f"pending keys: {exc!r}")
            elif self._cursor is not None:
                log.warning("pending keys: %s; reloading them once it answers", exc)
            self._cursor = None
            return exc

    async def _refresh(self) -> None:
        cursor = self._cursor
        if cursor is None or self._overflow:
            await self._reload()
            return
        while True:
            events = await self._catalog.events_after(cursor.top, BATCH)
            more = len(events) == BATCH
            if cursor.gaps:
                events += await self._catalog.events_by_id(cursor.gaps)
            for event in cursor.accept(events, time.monotonic()):
                self._hear(event)
            if not more:
                return

    async def _reload(self) -> None:
        """The whole set again; then the events from somewhat before it (ids are handed
        out before their commit: one below the newest may still come, as in a stream)."""
        top = await self._catalog.last_event_id()
        if self._overflow and (await self._catalog.pending_summary()).objects > self._limit:
            return
        rows = await self._catalog.pending_keys(self._limit + 1)
        self._overflow = len(rows) > self._limit
        self._heard += 1
        heard = self._heard
        self._keys = {} if self._overflow else {(b, k): (seq, heard) for b, k, seq in rows}
        if self._overflow:
            log.warning("over %d keys pending: every read asks the catalog", self._limit)
            return
        self._cursor = EventCursor(max(0, top - MAX_GAPS), gap_timeout=self._gap_timeout)
        await self._refresh()

    def _hear(self, event: Event) -> None:
        name = (event.bucket, event.key)
        held = self._keys.get(name, (0, 0))[0]
        if event.kind in _ADDS:
            if event.seq > held:
                self._heard += 1
                self._keys[name] = (event.seq, self._heard)
                if len(self._keys) > self._limit:
                    self._cursor = None  # the next refresh finds it over the limit
        elif event.kind == EventKind.MIGRATED and 0 < held <= event.seq:
            del self._keys[name]
