"""Event streams: every event exactly once, in id order as far as commits allow.

The ``events`` table is the source of truth; notifications (PostgreSQL NOTIFY) only wake
a stream early, and a stream also polls, so a lost notification or a dropped listener
connection delays an event, never loses it.

Ids are handed out when an event is inserted but become visible when its transaction
commits, so on PostgreSQL id 7 may appear after id 8. :class:`EventCursor` (pure, no I/O)
remembers such holes for ``gap_timeout`` seconds and the stream asks for them by id until
they show up or are given up (a rolled-back transaction leaves a hole forever).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from types import TracebackType
from typing import Protocol

from lota.catalog.model import Event
from lota.errors import CatalogError

log = logging.getLogger("lota.catalog")

MAX_GAPS = 1000
"""Holes remembered at most; past this the oldest are given up at once."""


class EventCursor:
    """Which event ids a stream has delivered, and which holes below the newest it awaits."""

    def __init__(self, after: int, *, gap_timeout: float) -> None:
        self.top = after
        """The greatest id delivered (or the starting point)."""
        self.gap_timeout = gap_timeout
        self._gaps: dict[int, float] = {}

    @property
    def gaps(self) -> list[int]:
        """Ids below :attr:`top` not delivered yet, still awaited."""
        return sorted(self._gaps)

    @property
    def floor(self) -> int:
        """Every id up to this one has been delivered or given up."""
        return min(self._gaps) - 1 if self._gaps else self.top

    def await_uncommitted(self, committed: Iterable[int], now: float) -> None:
        """A stream from now on starts at the newest id, but an id handed out before it may
        not have committed yet: await as holes those of the MAX_GAPS ids up to :attr:`top`
        not in `committed` (the ids of the events committed among them, read after the top
        was). Holes that never come (rolled back, pruned) are given up as any other."""
        seen = set(committed)
        missing = range(max(0, self.top - MAX_GAPS) + 1, self.top + 1)
        self._gaps.update(dict.fromkeys((i for i in missing if i not in seen), now))

    def accept(self, events: Iterable[Event], now: float) -> list[Event]:
        """The events of `events` not delivered before, in id order; updates the holes."""
        fresh = []
        for event in sorted(events, key=lambda e: e.id):
            if event.id > self.top:
                first_missing = max(self.top + 1, event.id - MAX_GAPS)
                self._gaps.update(dict.fromkeys(range(first_missing, event.id), now))
                self.top = event.id
                fresh.append(event)
            elif self._gaps.pop(event.id, None) is not None:
                fresh.append(event)
        self.expire(now)
        return fresh

    def expire(self, now: float) -> None:
        """Give up holes older than the gap timeout, and the oldest past MAX_GAPS."""
        for event_id, since in list(self._gaps.items()):
            if now - since >= self.gap_timeout:
                del self._gaps[event_id]
        for event_id in self.gaps[: max(0, len(self._gaps) - MAX_GAPS)]:
            del self._gaps[event_id]


class EventSource(Protocol):
    """What a backend gives its streams."""

    async def events_after(self, after: int, limit: int) -> list[Event]: ...

    async def events_by_id(self, ids: Sequence[int]) -> list[Event]: ...


class Waker:
    """Lets a stream sleep until its next poll, or until something wakes it earlier."""

    def __init__(self) -> None:
        self._woken = asyncio.Event()
        self.closed = False

    def wake(self) -> None:
        self._woken.set()

    async def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True if woken before that."""
        woken = False
        with contextlib.suppress(TimeoutError):
            woken = await asyncio.wait_for(self._woken.wait(), seconds)
        self._woken.clear()
        return woken

    async def close(self) -> None:
        self.closed = True
        self._woken.set()


class EventStream:
    """The events after a given id, as an endless async iterator, until closed.

    Use it as ``async with await catalog.events(after) as stream: async for event in
    stream: ...``; closing the catalog closes its streams. Database errors while waiting
    are logged and retried: a stream rides out an outage of the catalog.
    """

    def __init__(
        self,
        source: EventSource,
        waker: Waker,
        cursor: EventCursor,
        *,
        poll_interval: float,
        batch: int = 500,
    ) -> None:
        self._source = source
        self._waker = waker
        self._cursor = cursor
        self._poll = poll_interval
        self._batch = batch
        self._ready: collections.deque[Event] = collections.deque()
        self._failing = False
        self.on_idle: Callable[[], object] | None = None
        """Called each time the reader has taken every event committed so far and the
        stream waits for more (its :attr:`position` may have moved: holes given up)."""
        self.caught_up = asyncio.Event()
        """Set once the reader has taken every event committed so far (it asks for the
        next one and the catalog says there is none yet): those handled one by one are
        handled by then."""

    @property
    def position(self) -> int:
        """Resume a later stream from here and nothing is missed (some may repeat): below
        every event not yet taken from the stream, those read and waiting included."""
        floor = self._cursor.floor
        return min(floor, self._ready[0].id - 1) if self._ready else floor

    @property
    def closed(self) -> bool:
        return self._waker.closed

    def wake(self) -> None:
        """Look for new events now rather than at the next poll."""
        self._waker.wake()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        while not self._ready:
            if self._waker.closed:
                raise StopAsyncIteration
            more = await self._refill()
            if not self._ready and not more:
                if not self._failing:
                    self.caught_up.set()
                    if self.on_idle is not None:
                        self.on_idle()
                await self._waker.wait(self._poll)
        return self._ready.popleft()

    async def _refill(self) -> bool:
        """Read what is new; True when there may be more to read at once."""
        try:
            events = await self._source.events_after(self._cursor.top, self._batch)
            full = len(events) == self._batch
            if self._cursor.gaps:
                events += await self._source.events_by_id(self._cursor.gaps)
        except CatalogError as exc:
            if not self._failing:
                log.warning("catalog events: %s; retrying every %.1fs", exc, self._poll)
            self._failing = True
            return False
        if self._failing:
            log.info("catalog events: reading again")
            self._failing = False
        self._ready.extend(self._cursor.accept(events, time.monotonic()))
        return full

    async def aclose(self) -> None:
        await self._waker.close()

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
