"""The store's byte budget: what it holds, per drive, against its size and watermarks.

``usage`` counts chunk files (in 4 KiB blocks), the chunk directories, the index's files
and the full size of every fill in progress (a :class:`Reservation`, taken before the fill
starts). A drive smaller than the budget lowers its own budget when a fill hits ENOSPC
(:meth:`Budget.dir_full`) and gets it back as its file system frees space
(:meth:`Budget.check_space`); the budget in force is the smaller of ``size`` and the sum of
the drives' budgets. A drive that fails otherwise is rested for ``dir_cooldown`` seconds.
"""

from __future__ import annotations

import errno
import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from lota.cache.files import ChunkFiles
from lota.cache.layout import DIR_BYTES
from lota.cache.store.pool import IOPool
from lota.clock import Clock

log = logging.getLogger("lota.cache")

_FULL = (errno.ENOSPC, errno.EDQUOT)


@dataclass(slots=True)
class Drive:
    """What the store knows of one cache dir (one drive, usually)."""

    root: str
    lock: int = -1
    """The descriptor holding its lock; -1: not ours (unusable since start), never used."""
    sick_until: float = 0.0
    """Rested after an error until then."""
    chunk_bytes: int = 0
    reserved: int = 0
    limit: int | None = None
    """The budget an ENOSPC set; None: the store's whole budget."""
    free: int = -1
    """The file system's free bytes at the last look; -1: not known yet."""


class Reservation:
    """The bytes of one fill in progress: held on the whole budget from the start, and on
    its drive once :meth:`place` chose one, until :meth:`release`."""

    __slots__ = ("_budget", "bytes", "dir")

    def __init__(self, budget: Budget, size: int) -> None:
        self._budget = budget
        self.bytes = size
        self.dir = -1

    def place(self, d: int) -> None:
        self.dir = d
        self._budget.drives[d].reserved += self.bytes

    def release(self) -> None:
        """Idempotent."""
        self._budget.reserved -= self.bytes
        if self.dir >= 0:
            self._budget.drives[self.dir].reserved -= self.bytes
        self.bytes = 0


class Budget:
    """Bytes held against the budget, overall and per drive, and the drives' health."""

    def __init__(
        self,
        dirs: Sequence[str],
        size: int,
        *,
        chunk_size: int,
        high_watermark: float,
        low_watermark: float,
        wal_limit: int,
        index_bytes: Callable[[], int],
        dir_cooldown: float,
        clock: Clock,
        counts: Counter[str],
        io: IOPool,
        files: ChunkFiles,
    ) -> None:
        if not 0.0 < low_watermark < high_watermark <= 1.0:
            raise ValueError("watermarks must satisfy 0 < low < high <= 1")
        self.size = size
        self.drives = [Drive(root) for root in dirs]
        self.chunk_bytes = 0
        self.reserved = 0
        self.dir_bytes = 0
        self._chunk_size = chunk_size
        self._high_ratio = high_watermark
        self._low_ratio = low_watermark
        self._wal_limit = wal_limit
        self._index_bytes = index_bytes
        self._dir_cooldown = dir_cooldown
        self._clock = clock
        self._counts = counts
        self._io = io
        self._files = files

    @property
    def usage(self) -> int:
        """Bytes under the cache dirs, as ``du -sb`` would count them, plus fills reserved."""
        return self.chunk_bytes + self.reserved + self.dir_bytes + self._index_bytes()

    @property
    def effective(self) -> int:
        """The budget, or less when the drives cannot hold it (see dir_full)."""
        return min(self.size, sum(self.dir_budget(d) for d in range(len(self.drives))))

    @property
    def high(self) -> int:
        return int(self.effective * self._high_ratio)

    @property
    def low(self) -> int:
        return int(self.effective * self._low_ratio)

    def reserve(self, size: int) -> Reservation | None:
        """Hold `size` bytes for a fill, if the budget in force has room for them."""
        if self.usage + size > self.effective:
            return None
        self.reserved += size
        return Reservation(self, size)

    def add_chunk(self, d: int, size: int) -> None:
        self.chunk_bytes += size
        self.drives[d].chunk_bytes += size

    def remove_chunk(self, d: int, size: int) -> None:
        self.chunk_bytes -= size
        self.drives[d].chunk_bytes -= size

    def loaded(self, per_dir: Sequence[int]) -> None:
        """Chunk bytes per dir found in the index at start-up."""
        for drive, size in zip(self.drives, per_dir, strict=True):
            drive.chunk_bytes += size
        self.chunk_bytes += sum(per_dir)

    def dirs_made(self, count: int) -> None:
        self.dir_bytes += count * DIR_BYTES

    def dirs_removed(self, count: int | None) -> None:
        self.dir_bytes -= (count or 0) * DIR_BYTES

    # Per drive

    def dir_budget(self, d: int) -> int:
        """What dir `d` may hold: the budget, unless its file system filled up first."""
        drive = self.drives[d]
        if drive.lock < 0:
            return 0
        return self.size if drive.limit is None else min(drive.limit, self.size)

    def held(self, d: int) -> int:
        """Bytes of dir `d` that LOTA holds and that are on the disk: its chunks (and the
        index, on the first dir). Not counted: directories, and fills in progress."""
        return self.drives[d].chunk_bytes + (self._index_bytes() if d == 0 else 0)

    def dir_usage(self, d: int) -> int:
        return self.held(d) + self.drives[d].reserved

    def healthy_dirs(self) -> list[int]:
        now = self._clock.time()
        return [d for d, v in enumerate(self.drives) if v.sick_until <= now and v.lock >= 0]

    def dir_failed(self, d: int, exc: OSError) -> None:
        """A write to dir `d` failed: a full drive gets a lower budget, another is rested."""
        if exc.errno in _FULL:
            self.dir_full(d)
            return
        self._counts["write_errors"] += 1
        now = self._clock.time()
        if self.drives[d].sick_until <= now:
            log.warning(
                "cache dir %s failed (%s): not writing to it for %.0fs",
                self.drives[d].root,
                exc,
                self._dir_cooldown,
            )
        self.drives[d].sick_until = now + self._dir_cooldown

    def _margin(self, d: int) -> int:
        """Free space a full dir's budget leaves: a chunk, and room for the index's
        write-ahead log to grow, on the dir that holds it."""
        return self._chunk_size + (self._wal_limit if d == 0 else 0)

    def dir_full(self, d: int) -> None:
        """ENOSPC: the drive holds less than the budget assumed. Its budget becomes what
        LOTA holds there now, less a margin; the next fill evicts down to that. Resting the
        drive instead would make the cache pass-through while the drive stays full."""
        self._counts["disk_full"] += 1
        limit = max(0, self.held(d) - self._margin(d))
        drive = self.drives[d]
        if drive.limit is not None and drive.limit <= limit:
            return
        drive.limit = limit
        log.warning(
            "cache dir %s is full: its budget is now %d bytes (LOTA holds %d there; "
            "cache.size is %d)",
            drive.root,
            limit,
            self.held(d),
            self.size,
        )

    async def check_space(self) -> dict[int, int]:
        """Look at each dir's free space (the maintenance task does every second): a dir
        whose budget an ENOSPC lowered gets back what its file system has freed since.
        Returns the free bytes of each file system, by device id."""
        free_by_device: dict[int, int] = {}
        for d, drive in enumerate(self.drives):
            if drive.lock < 0:
                continue
            try:
                free, device = await self._io.call(self._files.space, drive.root)
            except OSError as exc:
                log.debug("cannot stat the file system of %s: %s", drive.root, exc)
                continue
            drive.free = free_by_device[device] = free
            self._regain(d, free)
        return free_by_device

    def _regain(self, d: int, free: int) -> None:
        limit = self.drives[d].limit
        room = self.held(d) + free - self._margin(d)
        if limit is None or room <= limit:
            return
        self.drives[d].limit = None if room >= self.size else room
        if room - limit >= self._chunk_size:
            log.info(
                "cache dir %s has room again: its budget is now %d bytes",
                self.drives[d].root,
                self.dir_budget(d),
            )

    async def check_size(self) -> None:
        """Warn when the budget is more than the dirs can hold: their free space plus what
        LOTA holds in them already (dirs sharing a file system share its free space)."""
        free = sum((await self.check_space()).values())
        if self.size > free + self.usage:
            log.warning(
                "cache.size (%d bytes) is more than the cache dirs can hold: %d bytes free "
                "+ %d held by LOTA = %d; a drive that fills up gets a budget of what it holds",
                self.size,
                free,
                self.usage,
                free + self.usage,
            )

    def dir_stats(self) -> dict[str, dict[str, int]]:
        """Per cache dir: bytes LOTA holds there (fills in progress included), the file
        system's free bytes at the last look (-1: unknown), the dir's budget (lowered by
        an ENOSPC) and whether it takes fills (1) or is resting after an error (0)."""
        healthy = set(self.healthy_dirs())
        return {
            drive.root: {
                "bytes_used": self.dir_usage(d),
                "free_bytes": drive.free,
                "budget": self.dir_budget(d),
                "healthy": int(d in healthy),
            }
            for d, drive in enumerate(self.drives)
        }
