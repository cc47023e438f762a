"""Replaying a sampled trace (:mod:`bench.sim.model_workload`) through LOTA's own code: the
chunk ownership (:class:`lota.cluster.ownership.Ownership`, built from the live member
list), each node's store decisions (:class:`lota.cache.eviction.S3FIFO` and
:class:`lota.cache.admission.Admission` over a byte budget with the store's watermarks,
driven as :class:`lota.cache.store.table.ChunkTable` drives them) and the hot-chunk copies
(:class:`lota.cluster.hot.HotChunks`, :class:`lota.cluster.hot.Copies`).

A read on a node is served from its own store (local), else from the chunk's owner's store
(owner), else the owner fills it from the origin and keeps it if its admission rule says
so. The reading node counts the chunks it relays, and keeps a copy of a chunk it read
from its owner ``hot_reads`` times within ``hot_window`` seconds, as a node of a cluster
does (:mod:`lota.cluster.placement`).

Also here: the same per-node streams of owner reads replayed through S3-FIFO alone (LOTA's
and libCacheSim's), and an upper bound on what LOTA's read path could do (every node's
cache unbounded: :func:`unbounded`).
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.sim.model_workload import KINDS, WARM, Trace
from lota.cache.admission import Admission
from lota.cache.eviction import S3FIFO
from lota.cluster.config import ClusterConfig
from lota.cluster.hot import Copies, HotChunks
from lota.cluster.ownership import Ownership
from lota.config import CacheConfig

STORE = CacheConfig()
CLUSTER = ClusterConfig()
LOCAL, OWNER, ORIGIN = range(3)
SOURCES = ("local", "owner", "origin")
GHOST = 1.0
LCS_TTL = 10 * 365 * 86400
WIPE = -1
"""In a recorded owner stream: the node's cache was lost (it failed)."""


class NodeCache:
    """One node's store: which chunks (ints) it keeps within `budget` bytes. LOTA's S3-FIFO
    and, unless `admission` is off, its admission rule, asked as the store asks them: a
    hit is an access; a fill is kept if the rule admits it (asked only at the high
    watermark), and keeping it evicts down to the low watermark. `ghost_min` is
    S3-FIFO's floor on the ghost queue (1,024 chunks in the store), scaled like the budget."""

    __slots__ = ("_admission", "_queues", "_sizes", "high", "low", "usage")

    def __init__(
        self, budget: int, sizes: list[int], ghost_min: int, admission: bool = True
    ) -> None:
        self.high = int(budget * STORE.high_watermark)
        self.low = int(budget * STORE.low_watermark)
        self.usage = 0
        self._sizes = sizes
        """Every chunk's size."""
        self._queues: S3FIFO[int] = S3FIFO(ghost_min=ghost_min)
        entries = budget // STORE.chunk_size
        self._admission = Admission(self._queues, int, entries) if admission else None

    def __contains__(self, chunk: int) -> bool:
        return chunk in self._queues

    def hit(self, chunk: int, size: int) -> None:
        self._queues.access(chunk)
        if self._admission is not None:
            self._admission.hit(chunk, size)

    def keeps(self, chunk: int, size: int) -> bool:
        """Whether a fill of `chunk` would be kept now (counts nothing)."""
        if self._admission is None:
            return True
        return self._admission.admits(chunk, full=self.usage + size > self.high)

    def count_read(self, chunk: int, size: int) -> None:
        """A read of `chunk` served without this store (relayed, or a fill not kept)."""
        if self._admission is not None:
            self._admission.read(chunk, size)

    def fill(self, chunk: int, size: int) -> bool:
        """A read of `chunk` filled from elsewhere: kept if the rule admits it."""
        kept = self.keeps(chunk, size)
        self.count_read(chunk, size)
        if kept:
            self.add(chunk, size)
        return kept

    def add(self, chunk: int, size: int) -> None:
        if self.usage + size > self.high:
            while self.usage + size > self.low:
                victim = self._queues.evict()
                if victim is None:
                    break
                self.usage -= self._sizes[victim]
                if self._admission is not None:
                    self._admission.removed(victim)
        self._queues.insert(chunk, size)
        self.usage += size
        if self._admission is not None:
            self._admission.added(chunk)

    def release(self, chunk: int) -> None:
        if chunk in self._queues:
            self.usage -= self._sizes[chunk]
            self._queues.remove(chunk)
            if self._admission is not None:
                self._admission.removed(chunk)


def ghost_floor(trace: Trace) -> int:
    """S3-FIFO's floor on its ghost queue (1,024 chunks by default, negligible next to a
    real node's millions), scaled by the sampling rate like the budget."""
    return max(1, round(1024 * trace.rate))


def slot_balance(nodes: int) -> float:
    """The most table slots a member holds over the mean, in LOTA's ownership of `nodes`
    members: how evenly chunks spread at full scale, where no single chunk weighs much."""
    slots = Ownership(f"node-{n:05d}:7070" for n in range(nodes)).slots().values()
    return max(slots) * len(slots) / sum(slots)


def owners(trace: Trace, progress: Any = None) -> list[np.ndarray]:
    """Each chunk's owner node under each membership of the trace (``trace.downs``): what
    :meth:`Ownership.owner` says over the live members."""
    names = [f"node-{n:05d}:7070" for n in range(trace.nodes)]
    index = {name: n for n, name in enumerate(names)}
    found: list[np.ndarray] = []
    for n, (_, down) in enumerate(trace.downs):
        ownership = Ownership(name for i, name in enumerate(names) if i not in down)
        owner = ownership.owner
        found.append(np.fromiter((index[owner(k)] for k in trace.keys), np.int32, len(trace.keys)))
        if progress is not None:
            progress(f"ownership {n + 1}/{len(trace.downs)}")
    return found


@dataclass
class Replay:
    """What one replay counted, in sampled bytes and reads (the week only, unless said)."""

    reads: list[int] = field(default_factory=lambda: [0, 0, 0])
    bytes: list[int] = field(default_factory=lambda: [0, 0, 0])
    by_kind: dict[str, list[int]] = field(default_factory=dict)
    """Kind -> [reads, bytes, hit reads, hit bytes]."""
    origin_bytes_all: int = 0
    """Including the warm-up."""
    served: np.ndarray | None = None
    """Bytes each node's store served (to its own readers and to others) or filled."""
    owner_hits: int = 0
    owner_reads: int = 0
    owner_hit_bytes: int = 0
    owner_bytes: int = 0
    stream: tuple[array[int], array[int], int] | None = None
    """Owner reads: (node, chunk) per read (chunk ``WIPE``: the node's cache was lost),
    and where the week starts in it."""


def _reads(trace: Trace, churn: bool, ingest: bool) -> Iterator[tuple[float, int, int, int]]:
    """(time, chunk, node, kind) of each read the scenario keeps, in blocks of lists."""
    keep = np.ones(len(trace.chunk), bool)
    if not churn:
        keep &= ~trace.failure
    if not ingest:
        keep &= ~trace.ingested[trace.chunk]
    picked = np.flatnonzero(keep)
    for start in range(0, len(picked), 1 << 20):
        rows = picked[start : start + (1 << 20)]
        yield from zip(
            trace.time[rows].tolist(),
            trace.chunk[rows].tolist(),
            trace.node[rows].tolist(),
            trace.kind[rows].tolist(),
            strict=True,
        )


def replay(
    trace: Trace,
    owned: list[np.ndarray],
    budget: int,
    *,
    churn: bool = True,
    ingest: bool = True,
    record: bool = False,
) -> Replay:
    """Replay `trace` through a cluster of nodes with `budget` (sampled) bytes of cache each."""
    sizes = trace.sizes.tolist()
    ghost_min = ghost_floor(trace)
    n = trace.nodes
    caches = [NodeCache(budget, sizes, ghost_min) for _ in range(n)]
    hot = [HotChunks(CLUSTER.hot_reads, CLUSTER.hot_window) for _ in range(n)]
    copies: list[Copies[int]] = [Copies(int(budget * CLUSTER.hot_share)) for _ in range(n)]
    downs = trace.downs if churn else trace.downs[:1]
    version, down = 0, downs[0][1]
    owner_of = owned[0].tolist()
    next_change = downs[1][0] if len(downs) > 1 else float("inf")
    out = Replay(by_kind={k: [0, 0, 0, 0] for k in KINDS[1:]})
    served = [0] * n
    stream_node, stream_chunk, week_at = array("i"), array("i"), -1
    for t, chunk, asker, kind in _reads(trace, churn, ingest):
        while t >= next_change:
            version += 1
            gone = downs[version][1] - down
            down = downs[version][1]
            for node in gone:  # its cache is lost; it comes back empty
                caches[node] = NodeCache(budget, sizes, ghost_min)
                hot[node] = HotChunks(CLUSTER.hot_reads, CLUSTER.hot_window)
                copies[node] = Copies(int(budget * CLUSTER.hot_share))
                if record:
                    stream_node.append(node)
                    stream_chunk.append(WIPE)
            owner_of = owned[version].tolist()
            next_change = downs[version + 1][0] if version + 1 < len(downs) else float("inf")
        if record and week_at < 0 and t >= 0:
            week_at = len(stream_node)
        reader = asker
        while reader in down:  # its jobs moved to the next node up
            reader = (reader + 1) % n
        size = sizes[chunk]
        cache = caches[reader]
        owner = owner_of[chunk]
        if chunk in cache:
            cache.hit(chunk, size)
            source = LOCAL
        else:
            at_owner = caches[owner]
            if chunk in at_owner:
                at_owner.hit(chunk, size)
                source = OWNER
            else:
                at_owner.fill(chunk, size)
                source = ORIGIN
                out.origin_bytes_all += size
            if owner != reader:
                _relayed(cache, hot[reader], copies[reader], chunk, size, t)
        at_owner_tier = owner == reader or source != LOCAL  # not a hot copy's hit
        if record and at_owner_tier:
            stream_node.append(owner)
            stream_chunk.append(chunk)
        if kind == WARM:
            continue
        served[reader if source == LOCAL else owner] += size
        if at_owner_tier:
            out.owner_reads += 1
            out.owner_bytes += size
            if source != ORIGIN:
                out.owner_hits += 1
                out.owner_hit_bytes += size
        out.reads[source] += 1
        out.bytes[source] += size
        tally = out.by_kind[KINDS[kind]]
        tally[0] += 1
        tally[1] += size
        if source != ORIGIN:
            tally[2] += 1
            tally[3] += size
    out.served = np.array(served, np.int64)
    if record:
        out.stream = (stream_node, stream_chunk, max(0, week_at))
    return out


def _relayed(
    cache: NodeCache, hot: HotChunks, copies: Copies[int], chunk: int, size: int, now: float
) -> None:
    """The reading node relayed another node's chunk: it counts the read, or keeps a copy
    when the chunk is hot (``HotCopies.keep`` and the read path's fill)."""
    if hot.read(chunk, now) and chunk not in copies and cache.keeps(chunk, size):
        released = copies.add(chunk, size)
        if released is not None:
            for old in released:
                cache.release(old)
            cache.fill(chunk, size)
            return
    cache.count_read(chunk, size)


def unbounded(trace: Trace, owned: list[np.ndarray], *, churn: bool, ingest: bool) -> float:
    """An upper bound on the byte hit rate of :func:`replay` over the week, under the same
    ownership, the same readers and the same cache losses: every node's cache unbounded.

    A node holds every chunk it read, or was the owner of at a read, since it last lost
    its cache (failed); a read hits if the reading node or the chunk's owner holds it, and
    after it both hold it (the owner filled it from the origin on a miss).

    Why LOTA's hits are a subset of these: in :func:`replay` a chunk enters a node's store
    only at a read of it by that node (a hot copy) or at a read it owned (the owner's fill),
    and a store loses chunks to eviction or when its node fails, while here a node holds
    every such chunk until it fails, with the same failures at the same times. So at every
    read each node's store holds a subset of what it holds here, and a read LOTA serves
    from the reader's or the owner's store (local or owner) is a hit here too. It is the
    best any cache could do with LOTA's read path (the reader's store, then the owner's,
    then the origin); only a chunk read for the first time by both the reading node and
    its owner since they last lost their caches misses."""
    n = trace.nodes
    held: list[set[int]] = [set() for _ in range(n)]
    downs = trace.downs if churn else trace.downs[:1]
    sizes = trace.sizes.tolist()
    version, down, owner_of = 0, downs[0][1], owned[0].tolist()
    next_change = downs[1][0] if len(downs) > 1 else float("inf")
    miss = total = 0
    for t, chunk, asker, kind in _reads(trace, churn, ingest):
        while t >= next_change:
            version += 1
            for node in downs[version][1] - down:
                held[node] = set()
            down = downs[version][1]
            owner_of = owned[version].tolist()
            next_change = downs[version + 1][0] if version + 1 < len(downs) else float("inf")
        reader = asker
        while reader in down:  # as in replay(): its jobs moved to the next node up
            reader = (reader + 1) % n
        mine, owners_ = held[reader], held[owner_of[chunk]]
        if kind != WARM:
            size = sizes[chunk]
            total += size
            miss += 0 if chunk in mine or chunk in owners_ else size
        mine.add(chunk)
        owners_.add(chunk)
    return 1 - miss / total if total else 0.0  # as a replay's figure is reckoned


def replay_s3fifo(trace: Trace, stream: Any, budget: int) -> dict[str, float]:
    """The owner streams of a replay, each node's through S3-FIFO alone at `budget` bytes:
    LOTA's (:class:`NodeCache` without the admission rule) and libCacheSim's. Miss
    ratios over the week, by reads and by bytes. libCacheSim's cache holds the midpoint of
    LOTA's watermarks (LOTA's store fills to the high one, then evicts down to the low
    one, so it holds about that on average), with S3-FIFO's parameters set to LOTA's
    (a 10% small queue, a chunk read once there moves to main)."""
    import libcachesim
    from libcachesim.libcachesim_python import CommonCacheParams, S3FIFOv0_init

    nodes, chunks, week_at = stream
    sizes = trace.sizes.tolist()
    ghost_min = ghost_floor(trace)
    capacity = int(budget * (STORE.high_watermark + STORE.low_watermark) / 2)

    params = f"small-size-ratio=0.1,ghost-size-ratio={GHOST},move-to-main-threshold=1"

    def fresh_lcs() -> Any:
        common = CommonCacheParams(
            cache_size=capacity, default_ttl=LCS_TTL, hashpower=12, consider_obj_metadata=False
        )
        return libcachesim.CacheBase(_cache=S3FIFOv0_init(common, params))

    lota = [NodeCache(budget, sizes, ghost_min, admission=False) for _ in range(trace.nodes)]
    lcs = [fresh_lcs() for _ in range(trace.nodes)]
    req = libcachesim.Request()
    miss = {"lota": [0, 0], "libcachesim": [0, 0]}
    reads = total = 0
    for i, (node, chunk) in enumerate(zip(nodes, chunks, strict=True)):
        if chunk == WIPE:
            lota[node] = NodeCache(budget, sizes, ghost_min, admission=False)
            lcs[node] = fresh_lcs()
            continue
        size = sizes[chunk]
        cache = lota[node]
        lota_hit = chunk in cache
        if lota_hit:
            cache.hit(chunk, size)
        else:
            cache.fill(chunk, size)
        req.obj_id, req.obj_size = chunk, size
        lcs_hit = lcs[node].get(req)
        if i >= week_at:
            reads += 1
            total += size
            for name, was in (("lota", lota_hit), ("libcachesim", lcs_hit)):
                if not was:
                    miss[name][0] += 1
                    miss[name][1] += size
    return {
        f"{name}_{unit}": (counts[j] / d if d else 0.0)
        for name, counts in miss.items()
        for j, (unit, d) in enumerate((("miss_ratio", reads), ("byte_miss_ratio", total)))
    }
