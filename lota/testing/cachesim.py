"""The cache store's keep-and-evict decisions, simulated: the store's own S3-FIFO and
admission rule (:mod:`lota.cache.eviction`, :mod:`lota.cache.admission`) over a byte
budget with its watermarks, fed a trace of chunk reads. No disk, no clock: deterministic.
The unit tests and ``bench.admission`` run it; LRU is there to compare.

What it reproduces of the store (:class:`lota.cache.store.table.ChunkTable`): a hit
counts as a read of the chunk; a miss is a fill, kept if the rule admits it (asked only
when keeping it means evicting, at the high watermark), and keeping it evicts down to the
low watermark.
"""

from __future__ import annotations

import bisect
import random
from collections import Counter, OrderedDict
from collections.abc import Iterator
from typing import Literal

from lota.cache.admission import Admission
from lota.cache.eviction import S3FIFO

Policy = Literal["lru", "s3fifo", "admission"]
POLICIES: tuple[Policy, ...] = ("lru", "s3fifo", "admission")


class SimulatedCache:
    """Chunks (ints) of one size under a budget of `budget` chunks."""

    def __init__(
        self,
        budget: int,
        policy: Policy = "admission",
        high_watermark: float = 0.95,
        low_watermark: float = 0.90,
        workers: int = 1,
        told_every: int | None = None,
    ) -> None:
        """`workers`: the store is a chunk owner's among that many workers, each hit served
        by one of them drawn at random (fixed seed); the owner's own hits it hears of at
        once, its siblings' (from descriptors they keep, :mod:`lota.workers.siblings`) as
        they tell them, all at once every `told_every` reads (:mod:`lota.workers.news`),
        or never (None). Misses it always hears of: it fills them."""
        self.high = int(budget * high_watermark)
        self.low = int(budget * low_watermark)
        self.hits = self.reads = 0
        self._lru: OrderedDict[int, None] | None = OrderedDict() if policy == "lru" else None
        self._queues: S3FIFO[int] = S3FIFO()
        self._admission = Admission(self._queues, int, budget) if policy == "admission" else None
        self._workers = workers
        self._told_every = told_every
        self._untold: Counter[int] = Counter()
        self._rng = random.Random(3)

    def read(self, chunk: int) -> bool:
        """Read `chunk`; whether it was a hit."""
        self.reads += 1
        if self._lru is not None:
            hit = self._read_lru(self._lru, chunk)
        elif chunk in self._queues:
            if self._workers == 1 or self._rng.randrange(self._workers) == 0:
                self._queues.access(chunk)
                if self._admission is not None:
                    self._admission.hit(chunk, 1)
            elif self._told_every is not None:
                self._untold[chunk] += 1
            hit = True
        else:
            self._fill(chunk)
            hit = False
        self.hits += hit
        if self._told_every is not None and self.reads % self._told_every == 0:
            self._hear_told()
        return hit

    def _hear_told(self) -> None:
        """The siblings' hits since they last told, as the store takes them
        (:meth:`lota.cache.store.CacheStore.told_reads`)."""
        for chunk, times in self._untold.items():
            if chunk in self._queues:
                self._queues.access(chunk, times)
                if self._admission is not None:
                    self._admission.hits(chunk, 1, times)
            elif self._admission is not None:
                self._admission.read(chunk, 1, times)
        self._untold.clear()

    def _fill(self, chunk: int) -> None:
        full = len(self._queues) + 1 > self.high
        if self._admission is not None:
            kept = self._admission.admits(chunk, full=full)
            self._admission.read(chunk, 1)
            if not kept:
                return
        while full and len(self._queues) + 1 > self.low:
            victim = self._queues.evict()
            if victim is None:
                return
            if self._admission is not None:
                self._admission.removed(victim)
        self._queues.insert(chunk, 1)
        if self._admission is not None:
            self._admission.added(chunk)

    def _read_lru(self, lru: OrderedDict[int, None], chunk: int) -> bool:
        if chunk in lru:
            lru.move_to_end(chunk)
            return True
        while lru and len(lru) + 1 > self.high:
            lru.popitem(last=False)
        lru[chunk] = None
        return False


def epochs(chunks: int, count: int, seed: int = 1, first: int = 0) -> Iterator[tuple[int, int]]:
    """(epoch, chunk): chunks ``first .. first + chunks - 1`` read whole `count` times,
    each time in a new random order (the training pattern)."""
    rng = random.Random(seed)
    order = list(range(first, first + chunks))
    for epoch in range(count):
        rng.shuffle(order)
        for chunk in order:
            yield epoch, chunk


def zipf(chunks: int, reads: int, alpha: float, seed: int = 2) -> Iterator[int]:
    """`reads` reads of chunks ``0 .. chunks - 1``, the i-th most read with weight
    ``1 / i**alpha`` (which chunk has which rank is shuffled)."""
    rng = random.Random(seed)
    cumulative = []
    total = 0.0
    for rank in range(1, chunks + 1):
        total += rank**-alpha
        cumulative.append(total)
    names = list(range(chunks))
    rng.shuffle(names)
    for _ in range(reads):
        yield names[bisect.bisect_left(cumulative, rng.random() * total)]


STORE_WATERMARKS = (0.95, 0.90)
"""The store's default high and low watermarks."""


def epoch_hit_rate(
    policy: Policy,
    chunks: int,
    fraction: float,
    count: int = 5,
    watermarks: tuple[float, float] = STORE_WATERMARKS,
) -> float:
    """Hit rate from the second epoch on of `count` epochs over `chunks` chunks, with a
    budget of `fraction` of them."""
    cache = SimulatedCache(int(fraction * chunks), policy, *watermarks)
    hits = reads = 0
    for epoch, chunk in epochs(chunks, count):
        hit = cache.read(chunk)
        if epoch > 0:
            hits += hit
            reads += 1
    return hits / reads


def zipf_hit_rate(
    policy: Policy,
    chunks: int,
    fraction: float,
    alpha: float,
    reads: int,
    watermarks: tuple[float, float] = STORE_WATERMARKS,
) -> float:
    """Hit rate of the last 80% of `reads` Zipf reads over `chunks` chunks, with a budget
    of `fraction` of them (the first 20% warm the cache)."""
    cache = SimulatedCache(int(fraction * chunks), policy, *watermarks)
    warm = reads // 5
    hits = 0
    for n, chunk in enumerate(zipf(chunks, reads, alpha)):
        hit = cache.read(chunk)
        if n >= warm:
            hits += hit
    return hits / (reads - warm)
