"""Warming: fill the cache with every object under a prefix before anyone asks.

``lota warm s3://bucket/prefix`` and the admin call ``POST /_lota/warm`` both use
:class:`Warm`, which goes through the prefix's listing at the origin (pages of (key, size),
see :func:`lota.regions.origin_pages.origin_pages`) and fills each object's chunks where
they belong (:meth:`lota.cache.route.Placement.warm`: here, or on each chunk's owner in a
cluster, so a prefix is warmed once for the whole cluster) with bounded concurrency,
reporting progress, in objects and in chunks, as it goes.

Authorization is what the same principal would get doing the work with S3 calls: warming
starts only with ``s3:ListBucket`` on the bucket (warm lists it, as ``ListObjectsV2``
would), and each listed object is filled only if ``s3:GetObject`` on its ARN is allowed,
as a GET of it would be. A denied object is skipped (no origin request, nothing cached)
and counted ``denied``; the prefix itself grants nothing, so a Deny on ``private/*`` holds
for a warm of ``priv`` too.

Errors come back as S3 errors while they still can: the first listing page is fetched
(:meth:`Warm.start`) before the answer's ``200`` is sent, so a missing bucket is the
origin's ``404 NoSuchBucket``. The answer is then one JSON object per line
(:meth:`Progress.as_line`); the last line has ``"final": true``, and ``"error"`` says
why, as ``{"code", "message"}``, when the warm stopped early (a later listing page
failed). A client that sees no final line knows the answer was cut short.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

from lota.cache.route import Placement, Warmed
from lota.cache.service import ChunkService
from lota.errors import OriginError
from lota.metrics import Metrics
from lota.s3.errors import MESSAGES, S3Error, invalid_argument
from lota.tasks import TaskGroup

log = logging.getLogger("lota.cache")

DEFAULT_CONCURRENCY = 8
MAX_CONCURRENCY = 64
_WHOLE_NUMBER = re.compile(r"[0-9]{1,6}")

Result = Literal["filled", "cached", "denied", "failed"]
# A listing's pages of (key, size), in key order; the first fetched by Warm.start.
Pages = AsyncGenerator[Sequence[tuple[str, int]], None]


def parse_concurrency(raw: str | None) -> int:
    """The ``concurrency`` query parameter: absent means the default, else 1..MAX."""
    if raw is None:
        return DEFAULT_CONCURRENCY
    if _WHOLE_NUMBER.fullmatch(raw) is None or not 1 <= int(raw) <= MAX_CONCURRENCY:
        raise invalid_argument(
            f"concurrency must be a whole number from 1 to {MAX_CONCURRENCY}.",
            "concurrency",
            raw[:64],
        )
    return int(raw)


@dataclass(slots=True)
class Progress:
    """What one line of the answer says. ``objects_done`` counts every object dealt with
    (filled + cached + denied + failed); ``bytes_filled`` only what was fetched."""

    final: bool = False
    error: dict[str, str] | None = None
    listing_done: bool = False
    objects_listed: int = 0
    bytes_listed: int = 0
    objects_done: int = 0
    bytes_done: int = 0
    filled: int = 0
    bytes_filled: int = 0
    cached: int = 0
    denied: int = 0
    failed: int = 0
    # Chunks over the whole cluster: filled now, held already, failed.
    chunks_filled: int = 0
    chunks_cached: int = 0
    chunks_failed: int = 0

    def count_chunks(self, warmed: Warmed) -> None:
        self.chunks_filled += warmed.filled
        self.chunks_cached += warmed.cached
        self.chunks_failed += warmed.failed

    def count(self, result: Result, size: int) -> None:
        self.objects_done += 1
        self.bytes_done += size
        if result == "filled":
            self.filled += 1
            self.bytes_filled += size
        elif result == "cached":
            self.cached += 1
        elif result == "denied":
            self.denied += 1
        else:
            self.failed += 1

    def as_line(self) -> bytes:
        return json.dumps(asdict(self)).encode() + b"\n"


class Warm:
    """One warm of one prefix. Call :meth:`start`, then iterate :meth:`progress`."""

    def __init__(
        self,
        cache: ChunkService,
        placement: Placement,
        pages: Pages,
        bucket: str,
        prefix: str,
        *,
        may_read: Callable[[str], bool],
        metrics: Metrics,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        self._cache = cache
        self._placement = placement
        self._pages = pages
        self._bucket = bucket
        self._prefix = prefix
        self._may_read = may_read
        self._metrics = metrics
        self._slots = asyncio.Semaphore(concurrency)
        self._finished: asyncio.Queue[None] = asyncio.Queue()
        self._first: Sequence[tuple[str, int]] | None = None
        self._running = 0  # fills started and not yet reported
        self.state = Progress()

    async def start(self) -> None:
        """List the first page; raises the S3Error (or OriginError) if the origin refuses."""
        self._first = await anext(self._pages, ())

    async def progress(self) -> AsyncGenerator[Progress, None]:
        """Fill what is listed; yield after each object, at the end of the listing, and a
        final time when everything started has finished. Close it (``aclosing``) when
        not iterated to the end."""
        tasks = TaskGroup(f"warm {self._bucket}/{self._prefix}")
        try:
            async for state in self._start_fills(tasks):
                yield state
            yield self.state
            while self._running:
                await self._finished.get()
                self._running -= 1
                yield self.state
        finally:
            await tasks.close()  # only what a departed client left running
            await self._pages.aclose()  # one left part-way holds an origin response
        self.state.final = True
        yield self.state

    async def _start_fills(self, tasks: TaskGroup) -> AsyncIterator[Progress]:
        """Start a fill for each listed object that may be read, yielding as others end;
        a listing that fails midway ends here, its error recorded for the final line."""
        try:
            async for key, size in self._listing():
                self.state.objects_listed += 1
                self.state.bytes_listed += size
                if not self._may_read(key):
                    self._record("denied", size)
                    yield self.state
                    continue
                await self._slots.acquire()
                tasks.start(self._one(key, size), f"fill {key}")
                self._running += 1
                while not self._finished.empty():
                    self._finished.get_nowait()
                    self._running -= 1
                    yield self.state
            self.state.listing_done = True
        except (S3Error, OriginError) as exc:
            self._stopped(exc)
        except Exception as exc:  # a bug: still end the answer with a line that says so
            log.exception("warm of %s/%s failed", self._bucket, self._prefix)
            self._stopped(exc)

    async def _listing(self) -> AsyncIterator[tuple[str, int]]:
        assert self._first is not None, "start() first"
        for item in self._first:
            yield item
        async for page in self._pages:
            for item in page:
                yield item

    def _stopped(self, exc: Exception) -> None:
        if isinstance(exc, S3Error):
            code, message = exc.code, exc.message
        elif isinstance(exc, OriginError):
            code, message = "ServiceUnavailable", str(exc)
        else:
            code, message = "InternalError", MESSAGES["InternalError"]
        log.warning("warm of %s/%s stopped early: %s", self._bucket, self._prefix, exc)
        self.state.error = {"code": code, "message": message}

    async def _one(self, key: str, size: int) -> None:
        result: Result = "failed"
        try:
            result = await self._fill(key, size)
        except Exception:  # counted, and the warm goes on with the other objects
            log.warning("warming %s/%s failed", self._bucket, key, exc_info=True)
        finally:
            self._slots.release()
        self._record(result, size)
        self._finished.put_nowait(None)

    def _record(self, result: Result, size: int) -> None:
        self.state.count(result, size)
        self._metrics.warm_objects.labels(result).inc()
        if result == "filled":
            self._metrics.warm_filled_bytes.inc(size)

    async def _fill(self, key: str, size: int) -> Result:
        known = self._cache.lookup(self._bucket, key)
        warmed = await self._placement.warm(self._bucket, key, known, size)
        self.state.count_chunks(warmed)
        if warmed.failed:
            return "failed"
        return "filled" if warmed.fetched else "cached"
