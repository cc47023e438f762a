"""Warming: fill the cache with every object under a prefix before anyone asks.

``lota warm s3://bucket/prefix`` and the admin call ``POST /_lota/warm`` both use
:class:`Warm`, which lists the prefix at the origin and fills objects with bounded
concurrency, reporting progress as it goes.

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
import xml.etree.ElementTree as ET
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Literal

from lota.cache.fill import Filler
from lota.cache.store import CachedObject
from lota.metrics import Metrics
from lota.regions.origin import OriginClient
from lota.s3.errors import LotaError, OriginError, S3Error, invalid_argument
from lota.tasks import TaskGroup

log = logging.getLogger("lota.cache")

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
DEFAULT_CONCURRENCY = 8
MAX_CONCURRENCY = 64
_WHOLE_NUMBER = re.compile(r"[0-9]{1,6}")

Result = Literal["filled", "cached", "denied", "failed"]
Page = tuple[list[tuple[str, int]], str]


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


async def list_page(origin: OriginClient, bucket: str, prefix: str, token: str) -> Page:
    """One ListObjectsV2 page: its (key, size) pairs and the next token ("" at the end)."""
    query = [("list-type", "2"), ("prefix", prefix)]
    if token:
        query.append(("continuation-token", token))
    async with origin.request("GET", bucket, "", query=query) as reply:
        body = await reply.read()
        status = reply.status
    if status != 200:
        raise _refusal(f"listing {bucket}/{prefix}", status, body)
    try:
        root = ET.fromstring(body)
        items = [
            (item.findtext(f"{_NS}Key", ""), int(item.findtext(f"{_NS}Size", "0")))
            for item in root.iter(f"{_NS}Contents")
        ]
    except (ET.ParseError, ValueError) as exc:
        raise OriginError(f"listing {bucket}/{prefix}: unreadable answer") from exc
    token = root.findtext(f"{_NS}NextContinuationToken", "")
    more = root.findtext(f"{_NS}IsTruncated", "false") == "true"
    return items, token if more else ""


def _refusal(what: str, status: int, body: bytes) -> LotaError:
    """The origin's 4xx S3 error as ours (NoSuchBucket stays a 404); anything else,
    a 5xx or a body that is no S3 error, means the origin is not working."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        root = ET.Element("none")
    code = root.findtext("Code") if root.tag == "Error" else None
    if code and 400 <= status < 500:
        return S3Error(code, root.findtext("Message") or code, status=status)
    return OriginError(f"{what}: origin answered {status} {body[:200]!r}")


class Warm:
    """One warm of one prefix. Call :meth:`start`, then iterate :meth:`progress`."""

    def __init__(
        self,
        filler: Filler,
        origin: OriginClient,
        bucket: str,
        prefix: str,
        *,
        may_read: Callable[[str], bool],
        metrics: Metrics,
        concurrency: int = DEFAULT_CONCURRENCY,
    ) -> None:
        self._filler = filler
        self._origin = origin
        self._bucket = bucket
        self._prefix = prefix
        self._may_read = may_read
        self._metrics = metrics
        self._slots = asyncio.Semaphore(concurrency)
        self._finished: asyncio.Queue[None] = asyncio.Queue()
        self._first: Page | None = None
        self._running = 0  # fills started and not yet reported
        self.state = Progress()

    async def start(self) -> None:
        """List the first page; raises the S3Error (or OriginError) if the origin refuses."""
        self._first = await list_page(self._origin, self._bucket, self._prefix, "")

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
        items, token = self._first
        while True:
            for item in items:
                yield item
            if not token:
                return
            items, token = await list_page(self._origin, self._bucket, self._prefix, token)

    def _stopped(self, exc: Exception) -> None:
        if isinstance(exc, S3Error):
            code, message = exc.code, exc.message
        elif isinstance(exc, OriginError):
            code, message = "ServiceUnavailable", str(exc)
        else:
            code, message = "InternalError", "We encountered an internal error."
        log.warning("warm of %s/%s stopped early: %s", self._bucket, self._prefix, exc)
        self.state.error = {"code": code, "message": message}

    async def _one(self, key: str, size: int) -> None:
        result: Result = "failed"
        try:
            result = await self._fill(key)
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

    async def _fill(self, key: str) -> Result:
        obj = self._filler.store.lookup(self._bucket, key)
        if obj is not None and self._held(obj, in_flight=False):
            return "cached"
        job = self._filler.start(self._origin, self._bucket, key, 0, None, obj)
        await job.done.wait()
        if not job.result.done() or job.result.exception() is not None:
            return "failed"
        # An OriginReply (the object went away since the listing, 403...) fills nothing,
        # and a chunk the store could not take (no room, disk error) is not filled either.
        filled = job.result.result()
        if isinstance(filled, CachedObject) and self._held(filled, in_flight=True):
            return "filled"
        return "failed"

    def _held(self, obj: CachedObject, *, in_flight: bool) -> bool:
        """Whether every chunk of `obj` is cached (or, with `in_flight`, being filled by
        another job that shared the work)."""
        filler = self._filler
        return all(
            filler.store.has_chunk(obj, i) or (in_flight and filler.fill_for(obj, i) is not None)
            for i in range(-(-obj.meta.size // filler.chunk_size))
        )
