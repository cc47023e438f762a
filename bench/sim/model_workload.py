"""The workload of the trace model (``python -m bench.sim model``): a week of a 15,000-GPU
cluster, as plain data, and the sampled trace of chunk reads it makes.

The mix, at 15,000 GPUs (1,875 nodes of 8 GPUs); another ``--gpus`` scales every job's
GPUs and every byte figure (datasets, ingest, checkpoints, weights) in proportion, so
the cache per GPU means the same thing at every size:

- **Datasets** (:data:`DATASETS`): 8.2 PB of training data in shards, two of them
  growing by new-data ingest (70 TB a day in all), plus a 5 TB evaluation set.
- **Training jobs** (:data:`JOBS`, :func:`sweep_jobs`): four long jobs (6,144, 3,072,
  2,048 and 1,024 GPUs), each reading its dataset epoch after epoch, every epoch in a new
  order (a new permutation of the shards, each shard read whole by one GPU, as a
  DistributedSampler over a webdataset does), evaluating on the eval set every 6 hours
  and saving a checkpoint every 1-3 hours; and eight slots of 64-GPU fine-tuning sweeps,
  each a new 24-hour job that starts by loading a shared base model's weights.
- **Checkpoint restores**: a job restarts from its latest checkpoint 10 minutes after one
  of its nodes fails, and once a day on average on purpose (a new config, a fix); every
  GPU then reads its rank's shard, and every GPU reads the files all ranks share. Saves
  go to the bucket's origin (a write through LOTA is not kept in the cache), so the first
  restore of a checkpoint reads it from there.
- **Shared model weights** (:data:`MODELS`): 1,536 GPUs (192 nodes) serve three models;
  each serving node loads its model's weights again every 8 hours on average (reschedules,
  roll-outs); each sweep node loads its base model at the job's start.
- **Node churn** (:data:`CHURN`): 8 node failures a day (Llama 3's paper counts about
  that many unexpected interruptions a day on 16,384 GPUs), in pairs every 6 hours; a
  failed node leaves the members for 12 hours and comes back with an empty cache
  (a swapped drive, a reimaged node). LOTA's ownership follows the live member list.
- **Warm-up**: the day before the week, every dataset, the eval set and every model is
  read once, so that the week starts from caches a running cluster would have, not cold;
  the hit rates are the week's.

The trace is spatially sampled as in SHARDS (Waldspurger et al., FAST '15): a chunk is
kept iff ``hash(chunk) mod P < T``, a rate ``R = T / P``; every read of a kept chunk stays
and every read of another is dropped, so a cache of ``R`` times the bytes sees what the
full cache would. Chunks are named by a 64-bit id (family, object, chunk index), hashed with
a splitmix64 finaliser (numpy, so the billions of chunk ids of the datasets are hashed in
seconds); the kept chunks get real LOTA chunk keys (:func:`lota.cluster.ownership.chunk_key`)
for the ownership code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np
import xxhash

from lota.cluster.ownership import chunk_key
from lota.config import CacheConfig

MB = 10**6
GB = 10**9
TB = 10**12
PB = 10**15
HOUR = 3600.0
DAY = 24 * HOUR

CHUNK = CacheConfig().chunk_size
GPUS_PER_NODE = 8
REFERENCE_GPUS = 15_000
"""The mix below is written for this many GPUs."""
WARMUP = DAY
"""The warm-up pass runs over the day before the week."""
P = 1 << 24
"""SHARDS: keep a chunk iff its hash modulo P is below T = rate * P."""


@dataclass(frozen=True, slots=True)
class Dataset:
    name: str
    size: float
    """Bytes at the start of the week."""
    object_size: int
    """Bytes per object (shard)."""
    ingest_per_day: float = 0.0
    """New bytes a day (new shards, read from the next epoch on)."""


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    size: float
    file_size: int = 5 * GB
    """Weights come in safetensors files of this size."""


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    gpus: int
    dataset: str
    epoch_hours: float
    checkpoint_every_hours: float
    checkpoint_size: float
    """Bytes of one checkpoint, in one shard per rank."""
    checkpoint_shared: float = GB
    """Bytes of the checkpoint's files every rank reads (metadata, config, tokenizer)."""
    start_hour: float = -7 * 24.0
    """Started before the week by default."""
    hours: float = math.inf
    base_model: str = ""
    """Weights each of its nodes loads at the job's start."""
    eval_every_hours: float = 6.0
    restarts_per_day: float = 1.0
    """Planned restarts from the latest checkpoint (a new config, a code fix), at random."""
    node_range: tuple[int, int] = (0, 0)
    """Set by :func:`place`."""


@dataclass(frozen=True, slots=True)
class Serving:
    gpus: int
    models: tuple[str, ...]
    reload_every_hours: float
    node_range: tuple[int, int] = (0, 0)


@dataclass(frozen=True, slots=True)
class Churn:
    every_hours: float
    failures_per_day: float
    """At 15,000 GPUs; scaled with the node count."""
    down_hours: float
    restart_minutes: float = 10.0


DATASETS = (
    Dataset("pretrain-text", 3.0 * PB, GB, ingest_per_day=40 * TB),
    Dataset("image-text", 2.2 * PB, GB, ingest_per_day=30 * TB),
    Dataset("video", 2.5 * PB, 4 * GB),
    Dataset("code", 0.45 * PB, GB // 2),
    Dataset("sft", 60 * TB, GB // 4),
    Dataset("eval", 5 * TB, 3 * MB),
)
MODELS = (
    Model("llm-8b", 16e9),
    Model("llm-70b", 141e9),
    Model("llm-405b", 810e9),
)
JOBS = (
    Job("pretrain", 6144, "pretrain-text", 60, 3, 2.0 * PB / 1000),
    Job("multimodal", 3072, "image-text", 30, 2, 0.4 * PB / 1000),
    Job("video", 2048, "video", 48, 2, 0.3 * PB / 1000),
    Job("code", 1024, "code", 10, 1, 0.1 * PB / 1000),
)
SWEEP_SLOTS, SWEEP_GPUS, SWEEP_HOURS = 8, 64, 24.0
SWEEP = Job(
    "sweep", SWEEP_GPUS, "sft", 4, 2, 128e9,
    base_model="llm-8b", hours=SWEEP_HOURS, restarts_per_day=0,
)  # fmt: skip
SERVING = Serving(1536, ("llm-8b", "llm-70b", "llm-405b"), reload_every_hours=8)
CHURN = Churn(every_hours=6, failures_per_day=8, down_hours=12)
KINDS = ("warm-up", "epoch", "eval", "restore", "restore (shared files)", "weights")
WARM, EPOCH, EVAL, RESTORE, SHARED, WEIGHTS = range(len(KINDS))


def sweep_jobs(days: float) -> list[Job]:
    """The fine-tuning sweeps: each slot runs 24-hour jobs back to back, the slots'
    starts staggered over the day."""
    jobs = []
    for slot in range(SWEEP_SLOTS):
        start = -slot * SWEEP_HOURS / SWEEP_SLOTS
        while start < days * 24:
            jobs.append(replace(SWEEP, name=f"sweep-{slot}@{start:+.0f}h", start_hour=start))
            start += SWEEP_HOURS
    return jobs


# Sampling


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a bijection of uint64 that spreads every input bit."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    mixed: np.ndarray = x ^ (x >> np.uint64(31))
    return mixed


def sampled(family: int, objects: int, chunks: int, rate: float) -> tuple[np.ndarray, np.ndarray]:
    """The kept chunks of `objects` objects of `chunks` chunks each: (object, chunk index)
    arrays, in id order. Chunk (o, i) of a family is kept iff ``hash(id) mod P < T``: the
    same chunks whatever else is sampled, and a lower rate keeps a subset of a higher one."""
    threshold = np.uint64(round(rate * P))
    base = np.uint64(family) << np.uint64(44)
    kept_o, kept_i = [], []
    total = objects * chunks
    step = 1 << 22
    with np.errstate(over="ignore"):
        for start in range(0, total, step):
            flat = np.arange(start, min(start + step, total), dtype=np.uint64)
            keep = flat[(_mix(base | flat) % np.uint64(P)) < threshold]
            kept_o.append(keep // np.uint64(chunks))
            kept_i.append(keep % np.uint64(chunks))
    if not kept_o:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(kept_o).astype(np.int64), np.concatenate(kept_i).astype(np.int64)


@dataclass
class Family:
    """The kept chunks of a set of objects of one size: their rows in the chunk table."""

    name: str
    objects: np.ndarray
    indices: np.ndarray
    chunks: int
    """Chunks per object."""
    first: int
    """Row of the first of them in the chunk table."""

    @property
    def rows(self) -> np.ndarray:
        return np.arange(self.first, self.first + len(self.objects))


@dataclass
class ChunkTable:
    """Every kept chunk: its size, its LOTA chunk key, and whether it is new (ingested)."""

    rate: float
    keys: list[bytes] = field(default_factory=list)
    sizes: list[np.ndarray] = field(default_factory=list)
    ingested: list[np.ndarray] = field(default_factory=list)
    families: int = 0

    def add(
        self, name: str, objects: int, object_size: float, *, new_from: int | None = None
    ) -> Family:
        """Sample `objects` objects of `object_size` bytes named ``name/NNN``."""
        size = max(1, int(object_size))
        chunks = -(-size // CHUNK)
        self.families += 1
        obj, idx = sampled(self.families, objects, chunks, self.rate)
        family = Family(name, obj, idx, chunks, len(self.keys))
        bucket, _, prefix = name.partition("/")
        for o, i in zip(obj.tolist(), idx.tolist(), strict=True):
            key = f"{prefix}/{o:09d}"
            etag = xxhash.xxh64_hexdigest(key.encode())
            self.keys.append(chunk_key(bucket, key, etag, i))
        self.sizes.append(np.minimum(CHUNK, size - idx * CHUNK).astype(np.int64))
        new = obj >= new_from if new_from is not None else np.zeros(len(obj), bool)
        self.ingested.append(new)
        return family


# The trace


@dataclass
class Trace:
    """The sampled reads, in time order, and the cluster's membership through the week."""

    nodes: int
    rate: float
    days: float
    time: np.ndarray
    chunk: np.ndarray
    node: np.ndarray
    kind: np.ndarray
    failure: np.ndarray
    """Reads of restores that a node failure caused (gone without churn)."""
    sizes: np.ndarray
    ingested: np.ndarray
    keys: list[bytes]
    downs: list[tuple[float, frozenset[int]]]
    """(from when, the nodes down then), in time order; the first from the start."""


@dataclass
class _Reads:
    parts: list[tuple[np.ndarray, ...]] = field(default_factory=list)

    def add(
        self, t: np.ndarray, rows: np.ndarray, nodes: np.ndarray, kind: int, failure: bool = False
    ) -> None:
        n = len(rows)
        if n:
            k, f = np.full(n, kind, np.int8), np.full(n, failure, bool)
            self.parts.append((t.astype(np.float64), rows.astype(np.int32), nodes, k, f))


class Builder:
    """Builds the :class:`Trace` of the mix at `gpus` GPUs over `days` days."""

    def __init__(self, gpus: int, days: float, rate: float, seed: int = 14) -> None:
        self.scale = gpus / REFERENCE_GPUS
        self.nodes = max(1, gpus // GPUS_PER_NODE)
        self.days = days
        self.end = days * DAY
        self.rng = np.random.default_rng(seed)
        self.table = ChunkTable(rate)
        self.reads = _Reads()
        self.jobs, self.serving = self._place([*JOBS, *sweep_jobs(days)])
        self._families: dict[str, Family] = {}

    def _nodes_of(self, gpus: int) -> int:
        return max(1, round(gpus * self.scale / GPUS_PER_NODE))

    def _place(self, jobs: list[Job]) -> tuple[list[Job], Serving]:
        """Each job a range of nodes: the long jobs, then one range per sweep slot (its
        jobs follow each other there), then the serving nodes."""
        placed, first, slots = [], 0, {}
        for job in jobs:
            if job.name.startswith("sweep-"):
                slot = job.name.split("@")[0]
                if slot not in slots:
                    slots[slot] = (first, first + self._nodes_of(job.gpus))
                    first = slots[slot][1]
                placed.append(replace(job, node_range=slots[slot]))
            else:
                count = self._nodes_of(job.gpus)
                placed.append(replace(job, node_range=(first, first + count)))
                first += count
        serving = Serving(
            SERVING.gpus, SERVING.models, SERVING.reload_every_hours,
            (first, first + self._nodes_of(SERVING.gpus)),
        )  # fmt: skip
        if serving.node_range[1] > self.nodes:
            raise ValueError(f"the mix needs {serving.node_range[1]} nodes, there are {self.nodes}")
        return placed, serving

    def build(self) -> Trace:
        datasets = {d.name: self._dataset(d) for d in DATASETS}
        for family, counts in datasets.values():
            self._warm(family.rows[family.objects < counts[0]])
        for model in MODELS:
            self._warm(self._model(model.name).rows)
        downs, failures = self._churn()
        for job in self.jobs:
            self._job(job, datasets)
            self._restores(job, failures)
        self._serving()
        return self._trace(downs)

    def _dataset(self, d: Dataset) -> tuple[Family, np.ndarray]:
        """The dataset's kept chunks, and how many objects it has at each hour."""
        per_hour = d.ingest_per_day * self.scale / 24 / d.object_size
        start = max(1, round(d.size * self.scale / d.object_size))
        hours = np.arange(math.ceil(self.days * 24) + 1)
        counts = start + np.floor(per_hour * hours).astype(np.int64)
        family = self.table.add(f"data/{d.name}", int(counts[-1]), d.object_size, new_from=start)
        return family, counts

    def _model(self, name: str) -> Family:
        if name not in self._families:
            m = next(m for m in MODELS if m.name == name)
            files = max(1, math.ceil(m.size * self.scale / m.file_size))
            self._families[name] = self.table.add(f"models/{name}", files, m.file_size)
        return self._families[name]

    def _warm(self, rows: np.ndarray) -> None:
        """One read of each of `rows`, by any node, during the warm-up day."""
        t = self.rng.uniform(-WARMUP, 0.0, len(rows))
        self.reads.add(t, rows, self.rng.integers(0, self.nodes, len(rows)), WARM)

    def _job(self, job: Job, datasets: dict[str, tuple[Family, np.ndarray]]) -> None:
        begin = job.start_hour * HOUR
        end = min(self.end, begin + job.hours * HOUR)
        family, counts = datasets[job.dataset]
        length = job.epoch_hours * HOUR
        epoch = begin
        while epoch < end:
            if epoch + length > 0:
                objects = int(counts[min(max(0, int(epoch // HOUR)), len(counts) - 1)])
                self._epoch(job, family, objects, epoch, end)
            epoch += length
        first, last = job.node_range
        if job.base_model and begin >= 0:
            weights = self._model(job.base_model).rows
            for node in range(first, last):
                t = begin + self.rng.uniform(0, 120, len(weights))
                self.reads.add(t, weights, np.full(len(weights), node), WEIGHTS)
        evals = datasets["eval"][0].rows
        at = max(begin, 0.0) + job.eval_every_hours * HOUR
        while at < end:
            nodes = self.rng.integers(first, last, len(evals))
            self.reads.add(at + self.rng.uniform(0, 1200, len(evals)), evals, nodes, EVAL)
            at += job.eval_every_hours * HOUR

    def _epoch(self, job: Job, family: Family, objects: int, start: float, end: float) -> None:
        """One epoch over the first `objects` objects: a new permutation of them, each
        object read whole, in order, by one node of the job, at the point of the epoch
        its place in the permutation says."""
        rank = self.rng.permutation(objects)
        keep = family.objects < objects
        obj, idx, rows = family.objects[keep], family.indices[keep], family.rows[keep]
        t = start + job.epoch_hours * HOUR * (rank[obj] + idx / family.chunks) / objects
        first, last = job.node_range
        nodes = first + rank[obj] % (last - first)
        live = (t >= 0) & (t < end)
        self.reads.add(t[live], rows[live], nodes[live], EPOCH)

    def _churn(self) -> tuple[list[tuple[float, frozenset[int]]], list[tuple[float, int]]]:
        """Which nodes are down when, and each failure as (time, node)."""
        per_event = CHURN.failures_per_day * self.nodes / (REFERENCE_GPUS / GPUS_PER_NODE)
        per_event *= CHURN.every_hours / 24
        downs: list[tuple[float, frozenset[int]]] = [(-math.inf, frozenset())]
        failures: list[tuple[float, int]] = []
        back: dict[int, float] = {}
        owed = 0.0
        t = CHURN.every_hours * HOUR
        while t < self.end:
            owed += per_event
            down = {n for n, when in back.items() if when > t}
            up = [n for n in range(self.nodes) if n not in down]
            count = min(int(owed), len(up) - 1)
            owed -= count
            for node in self.rng.choice(up, count, replace=False).tolist():
                back[node] = t + CHURN.down_hours * HOUR
                down.add(node)
                failures.append((t, node))
            downs.append((t, frozenset(down)))
            t += CHURN.every_hours * HOUR
        return downs, failures

    def _restores(self, job: Job, failures: list[tuple[float, int]]) -> None:
        """A restore from the latest checkpoint after each failure of one of its nodes, and
        at each planned restart: every rank reads the shared files (in the first minute),
        then its own shard."""
        first, last = job.node_range
        begin = job.start_hour * HOUR
        end = min(self.end, begin + job.hours * HOUR)
        ranks = max(1, round(job.gpus * self.scale))
        rank_node = first + np.arange(ranks) * (last - first) // ranks
        planned = self.rng.uniform(0, self.end, self.rng.poisson(job.restarts_per_day * self.days))
        restarts = [(t, True) for t, node in failures if first <= node < last]
        restarts += [(t, False) for t in planned.tolist()]
        for t, failure in restarts:
            if not begin <= t < end:
                continue
            at = t + CHURN.restart_minutes * 60
            step = math.floor((t - begin) / (job.checkpoint_every_hours * HOUR))
            shards, shared = self._checkpoint(job, step, ranks)
            when = at + self.rng.uniform(60, 600, len(shards.rows))
            self.reads.add(when, shards.rows, rank_node[shards.objects], RESTORE, failure)
            rows = np.tile(shared.rows, ranks)
            nodes = np.repeat(rank_node, len(shared.rows))
            when = at + self.rng.uniform(0, 60, len(rows))
            self.reads.add(when, rows, nodes, SHARED, failure)

    def _checkpoint(self, job: Job, step: int, ranks: int) -> tuple[Family, Family]:
        """Checkpoint `step` of `job`: one shard per rank, and the files every rank reads."""
        name = f"ckpt/{job.name}/step-{step}"
        if name not in self._families:
            size = job.checkpoint_size * self.scale / ranks
            self._families[name] = self.table.add(f"{name}/shards", ranks, size)
            self._families[name + "/"] = self.table.add(f"{name}/shared", 1, job.checkpoint_shared)
        return self._families[name], self._families[name + "/"]

    def _serving(self) -> None:
        """Each serving node loads its model's weights again every few hours (a Poisson
        process), reading every file of them."""
        first, last = self.serving.node_range
        for node in range(first, last):
            weights = self._model(self.serving.models[node % len(self.serving.models)])
            t = self.rng.exponential(self.serving.reload_every_hours * HOUR)
            while t < self.end:
                at = t + self.rng.uniform(0, 120, len(weights.rows))
                self.reads.add(at, weights.rows, np.full(len(weights.rows), node), WEIGHTS)
                t += self.rng.exponential(self.serving.reload_every_hours * HOUR)

    def _trace(self, downs: list[tuple[float, frozenset[int]]]) -> Trace:
        t, rows, nodes, kind, failure = (
            np.concatenate(c) for c in zip(*self.reads.parts, strict=True)
        )
        order = np.argsort(t, kind="stable")
        return Trace(
            nodes=self.nodes,
            rate=self.table.rate,
            days=self.days,
            time=t[order],
            chunk=rows[order],
            node=nodes[order].astype(np.int32),
            kind=kind[order],
            failure=failure[order],
            sizes=np.concatenate(self.table.sizes),
            ingested=np.concatenate(self.table.ingested),
            keys=self.table.keys,
            downs=downs,
        )
