"""Background upkeep of the store's files: the start-up sweep and the scrub.

The sweep reconciles the dirs with the index after a restart: temp files and files
without a row are deleted, rows whose file is missing or has the wrong length dropped. The
scrub verifies the digests of chunks idle for a while, at a bounded rate, and drops the
damaged ones.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import Counter
from collections.abc import Sequence
from functools import partial

from lota.cache.files import ChunkDamaged, ChunkFiles
from lota.cache.layout import is_temp, parse_final
from lota.cache.store.budget import Budget
from lota.cache.store.entries import Chunk
from lota.cache.store.pool import IOPool
from lota.cache.store.table import ChunkTable
from lota.cache.store.writer import Fills
from lota.clock import Clock

log = logging.getLogger("lota.cache")

_YIELD_EVERY = 20_000


class Sweeper:
    """Deletes what the index does not know, forgets what the dirs do not hold."""

    def __init__(
        self,
        dirs: Sequence[str],
        *,
        table: ChunkTable,
        fills: Fills,
        budget: Budget,
        io: IOPool,
        files: ChunkFiles,
        counts: Counter[str],
    ) -> None:
        self._dirs = tuple(dirs)
        self._table = table
        self._fills = fills
        self._budget = budget
        self._io = io
        self._files = files
        self._counts = counts
        self._lock = asyncio.Lock()

    async def sweep(self) -> dict[str, int]:
        """One pass over every dir; returns what it found (see the module docstring)."""
        async with self._lock:
            started = time.perf_counter()
            counts: Counter[str] = Counter()
            claimed = self._fills.claim()
            try:
                for d, root in enumerate(self._dirs):
                    await self._sweep_dir(d, root, claimed, counts)
                await self._drop_unseen(counts)
                await self._io.wait_running()  # the files of the chunks it dropped
            finally:
                self._fills.unclaim()
            self._counts.update({f"swept_{k}": v for k, v in counts.items()})
            log.info("cache sweep done in %.1fs: %s", time.perf_counter() - started, dict(counts))
            return dict(counts)

    async def _sweep_dir(
        self, d: int, root: str, claimed: set[tuple[str, int]], counts: Counter[str]
    ) -> None:
        try:
            for top in await self._io.call(self._files.tops, root):
                for leaf, entries in await self._io.call(self._files.scan, top):
                    await self._sweep_leaf(d, leaf, entries, claimed, counts)
        except OSError as exc:
            log.warning("cache sweep of %s failed: %s", root, exc)

    async def _sweep_leaf(
        self,
        d: int,
        leaf: str,
        entries: list[tuple[str, int]],
        claimed: set[tuple[str, int]],
        counts: Counter[str],
    ) -> None:
        strays: list[str] = []
        orphans: list[tuple[str, tuple[str, int]]] = []
        for name, size in entries:
            path = os.path.join(leaf, name)
            parsed = parse_final(name)
            if is_temp(name):
                if not self._fills.is_filling(path):
                    strays.append(path)
            elif parsed is None:
                counts["unknown"] += 1
            elif not self._sweep_known(d, parsed, size, counts):
                if self._table.by_stem(parsed[0]) is None:
                    strays.append(path)
                else:
                    orphans.append((path, parsed))
        counts["deleted"] += len(strays) + len(orphans)
        if strays:
            await self._io.background(self._files.unlink, strays, then=self._budget.dirs_removed)
        if orphans:
            job = partial(self._unlink_orphans, orphans, claimed)
            await self._io.background(job, then=self._budget.dirs_removed)

    def _sweep_known(self, d: int, name: tuple[str, int], size: int, counts: Counter[str]) -> bool:
        """Whether the file is a chunk the index knows (checking its length if not yet)."""
        obj = self._table.by_stem(name[0])
        chunk = obj.chunks.get(name[1]) if obj is not None else None
        if chunk is None or chunk.dir != d:
            return False
        if not chunk.checked:
            if size != chunk.length:
                self._table.drop(chunk, "corrupt")
                counts["wrong_length"] += 1
            chunk.checked = True
        return True

    def _unlink_orphans(
        self, orphans: list[tuple[str, tuple[str, int]]], claimed: set[tuple[str, int]]
    ) -> int:
        """Runs on an I/O thread: a fill that claimed the name since the scan keeps it."""
        return sum(
            self._files.unlink_orphan(path, partial(claimed.__contains__, key))
            for path, key in orphans
        )

    async def _drop_unseen(self, counts: Counter[str]) -> None:
        """Chunks loaded from the index whose file the sweep did not find are gone."""
        unseen = [c for c in self._table.all_chunks() if not c.checked]
        for n, chunk in enumerate(unseen):
            if not chunk.checked:
                self._table.drop(chunk, "missing")
                counts["missing"] += 1
            if n % _YIELD_EVERY == 0:
                await asyncio.sleep(0)


class Scrubber:
    """Verifies idle chunks' digests at a bounded rate."""

    def __init__(
        self,
        *,
        interval: float,
        rate: int,
        idle: float,
        table: ChunkTable,
        io: IOPool,
        files: ChunkFiles,
        clock: Clock,
        counts: Counter[str],
    ) -> None:
        self.interval = interval
        self._rate = rate
        self._idle = idle
        self._table = table
        self._io = io
        self._files = files
        self._clock = clock
        self._counts = counts

    async def scrub(self) -> int:
        """Verify every chunk idle for `idle` seconds, at most `rate` bytes per second;
        returns how many were damaged (and dropped)."""
        damaged = 0
        for chunk in self._table.all_chunks():
            idle = self._clock.time() - chunk.last_access >= self._idle
            if chunk.dead or chunk.readers or not idle:
                continue
            damaged += not await self._scrub_one(chunk)
            await asyncio.sleep(chunk.length / self._rate)
        return damaged

    async def run(self) -> None:
        """Scrub every `interval` seconds, until cancelled."""
        while True:
            await asyncio.sleep(self.interval)
            started = time.perf_counter()
            damaged = await self.scrub()
            log.info(
                "cache scrub done in %.0fs: %d damaged", time.perf_counter() - started, damaged
            )

    async def _scrub_one(self, chunk: Chunk) -> bool:
        path = self._table.path(chunk)
        self._table.ref(chunk)
        chunk.warm = None  # its pages may be read in from the drive now: not for a span
        try:
            await self._io.call(self._files.verify, path, chunk.length, chunk.digest)
        except (ChunkDamaged, OSError) as exc:
            log.warning("cache scrub: dropping chunk %s: %s", path, exc)
            self._table.drop(chunk, "corrupt" if isinstance(exc, ChunkDamaged) else "read_errors")
            return False
        finally:
            self._table.unref(chunk)
        chunk.verified = chunk.checked = True
        self._counts["scrubbed"] += 1
        return True
