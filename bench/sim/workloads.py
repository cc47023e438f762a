"""What the simulated GPUs do: the objects of each workload and each GPU's reads and writes.

Everything here is plain data and arithmetic, no I/O, and deterministic from its seeds:
the simulator builds a step's plan here, the GPU process (:mod:`bench.sim.run_gpus`)
carries it out against real LOTA nodes, and the report compares what came back with what
the plan expected (every read's xxh3-128 digest is known in advance).

Workloads (``mixed`` runs them in this order):

- ``epochs``: a webdataset-style dataset (tar shards of samples); each epoch a new
  permutation of its shards, split over all GPUs as PyTorch's DistributedSampler does
  (padded to a multiple of the GPUs, rank r taking every world-th index from r), each GPU
  reading its shards in order with a DataLoader's prefetch.
- ``restore``: every GPU restores a sharded checkpoint at once: its own rank's shard
  (uploaded multipart) plus the files every rank reads (a small ``.metadata`` and a large
  weights file uploaded in one PUT).
- ``agents``: agent loops, each thinking (exponential) then reading a burst of small
  objects at once (1 + Poisson), the number of loops per GPU changing through the step;
  objects by Zipf popularity, some reads being the header range of a large file.
- ``xregion-save``: every GPU saves its checkpoint shard into a bucket homed in the far
  region (rank 0 also a multipart file), the same saves straight to that region's origin
  for comparison, then reads of them back from both regions.
"""

from __future__ import annotations

import io
import math
import random
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import xxhash

KiB = 1024
MiB = 1024 * KiB

DATA_BUCKET = "sim-data"  # homed in the near region: the datasets, checkpoints, agent files
FAR_BUCKET = "sim-ckpt-eu"  # homed in the far region: the checkpoint saves
STAGING_BUCKET = "sim-staging"  # in the near region: where accelerated writes wait
FAR_STAGING_BUCKET = "sim-staging-eu"  # the far region's (its node's writes; none here)
PHASES = ("epochs", "restore", "agents", "xregion-save")


@dataclass(frozen=True, slots=True)
class Obj:
    """An object the simulator puts in an origin before the GPUs read it."""

    key: str
    size: int
    seed: int
    tar: bool = False  # a webdataset shard (a tar of samples) rather than opaque bytes
    part_size: int = 0  # uploaded multipart in parts of this size; 0: one PUT

    def body(self) -> bytes:
        return shard_body(self.seed, self.size) if self.tar else blob(self.seed, self.size)


@dataclass(frozen=True, slots=True)
class Op:
    """One read or write by one GPU. A read's bytes must hash to `digest`."""

    key: str
    size: int  # bytes read (the range's length) or written
    digest: str = ""
    bucket: str = DATA_BUCKET
    write: bool = False
    seed: int = 0  # a write's body is blob(seed, size)
    part_size: int = 0  # a write in parts of this size (multipart); 0: one PUT
    first: int = -1  # a ranged read of first..last; -1: the whole object
    direct: bool = False  # straight to the bucket's origin, not through LOTA
    tag: str = ""  # what it is, for the report: shard, rank, shared, small, header, save

    @property
    def range(self) -> str:
        return f"bytes={self.first}-{self.first + self.size - 1}" if self.first >= 0 else ""


@dataclass(frozen=True, slots=True)
class Loop:
    """An agent loop, from `start` to `end` seconds into the step: think, then read a
    burst at once, again and again."""

    start: float
    end: float
    seed: int
    think: float  # mean think time, seconds
    fanout: float  # mean extra reads per burst (1 + Poisson)


@dataclass(frozen=True, slots=True)
class Job:
    """One GPU's share of a step: its ops, `inflight` at a time, or its agent loops."""

    gpu: int
    ops: tuple[Op, ...] = ()
    inflight: int = 1
    loops: tuple[Loop, ...] = ()


@dataclass(frozen=True, slots=True)
class Step:
    """What every GPU does between two barriers; the nodes' counters are read around it."""

    name: str
    phase: str
    jobs: tuple[Job, ...]
    pool: tuple[Op, ...] = ()  # agents draw their reads from these...
    weights: tuple[float, ...] = ()  # ...with these weights
    duration: float = 0.0  # agents: seconds of loops
    direct: bool = False  # reads straight from the origin, for comparison

    @property
    def planned(self) -> int:
        return sum(len(job.ops) for job in self.jobs)


@dataclass(frozen=True, slots=True)
class Sizes:
    """How big each workload is; `quick` is the smoke test's."""

    shards: int = 120
    shard_size: int = 4 * MiB
    epochs: int = 3
    prefetch: int = 2
    rank_size: int = 12 * MiB
    shared_size: int = 48 * MiB
    part_size: int = 8 * MiB
    small_objects: int = 300
    small_max: int = 256 * KiB
    header_files: int = 6
    header_file_size: int = 4 * MiB
    agent_seconds: float = 24.0
    agent_loops: tuple[int, ...] = (1, 4, 2)
    save_size: int = 8 * MiB
    direct_reads: int = 2  # per GPU, after each read phase

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            shards=24,
            shard_size=256 * KiB,
            epochs=2,
            rank_size=512 * KiB,
            shared_size=3 * MiB,
            part_size=5 * MiB,
            small_objects=40,
            small_max=64 * KiB,
            header_files=2,
            header_file_size=1 * MiB,
            agent_seconds=4.0,
            save_size=512 * KiB,
            direct_reads=1,
        )


def blob(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def digest(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def shard_body(seed: int, size: int) -> bytes:
    """A webdataset shard of about `size` bytes: a tar of (jpg, cls) samples."""
    rng = random.Random(seed)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        sample = 0
        while out.tell() < size - 3 * 1024:
            image = rng.randbytes(rng.randint(size // 64, size // 16))
            _add(tar, f"{seed:08d}/{sample:05d}.jpg", image)
            _add(tar, f"{seed:08d}/{sample:05d}.cls", str(rng.randrange(1000)).encode())
            sample += 1
    return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def read_of(obj: Obj, body: bytes, tag: str, first: int = -1, length: int = 0) -> Op:
    """The read of `obj` (or of `length` bytes from `first`), with its expected digest."""
    if first < 0:
        return Op(obj.key, len(body), digest(body), tag=tag)
    part = body[first : first + length]
    return Op(obj.key, len(part), digest(part), first=first, tag=tag)


@dataclass
class Catalogue:
    """The objects of every workload and their whole-object reads, built once."""

    sizes: Sizes
    objects: list[Obj] = field(default_factory=list)
    reads: dict[str, Op] = field(default_factory=dict)  # whole-object reads by key
    headers: list[Op] = field(default_factory=list)  # ranged reads of header files

    def add(self, obj: Obj, tag: str) -> None:
        body = obj.body()
        self.objects.append(obj)
        self.reads[obj.key] = read_of(obj, body, tag)
        if tag == "header-file":
            self.headers.append(read_of(obj, body, "header", 0, 64 * KiB))
            self.headers.append(read_of(obj, body, "header", len(body) - 16 * KiB, 16 * KiB))


def catalogue(sizes: Sizes, phases: Iterable[str]) -> Catalogue:
    """Every object the phases read, with its content's digest (the content is made here
    and again at upload: it is a pure function of its seed)."""
    cat = Catalogue(sizes)
    wanted = set(phases)
    if "epochs" in wanted:
        for i in range(sizes.shards):
            cat.add(Obj(f"train/shard-{i:06d}.tar", sizes.shard_size, 1000 + i, tar=True), "shard")
    if "restore" in wanted:
        for name, size, seed in restore_shared(sizes):
            cat.add(Obj(name, size, seed), "shared")
    if "agents" in wanted:
        rng = random.Random(7)
        for i in range(sizes.small_objects):
            size = int(math.exp(rng.uniform(math.log(2 * KiB), math.log(sizes.small_max))))
            cat.add(Obj(f"agents/kv/{i:05d}.bin", size, 300_000 + i), "small")
        for i in range(sizes.header_files):
            key = f"agents/models/m{i}.safetensors"
            cat.add(Obj(key, sizes.header_file_size, 400_000 + i), "header-file")
    return cat


def restore_shared(sizes: Sizes) -> list[tuple[str, int, int]]:
    """The checkpoint files every rank reads: (key, size, seed)."""
    return [
        ("ckpt/step-1000/.metadata", 64 * KiB, 500_001),
        ("ckpt/step-1000/model-shared.safetensors", sizes.shared_size, 500_002),
    ]


def rank_shards(sizes: Sizes, world: int) -> list[Obj]:
    """Each rank's own checkpoint shard, uploaded multipart when bigger than a part."""
    part = sizes.part_size if sizes.rank_size > sizes.part_size else 0
    return [
        Obj(f"ckpt/step-1000/rank-{r:05d}.distcp", sizes.rank_size, 600_000 + r, part_size=part)
        for r in range(world)
    ]


def distributed_sampler(n: int, world: int, epoch: int, seed: int = 0) -> list[list[int]]:
    """The indices each rank reads in `epoch`, as torch.utils.data.DistributedSampler
    (shuffle=True, drop_last=False): a permutation, padded to a multiple of `world` with
    its own first indices, rank r taking every world-th from r."""
    order = list(range(n))
    random.Random(seed + epoch).shuffle(order)
    total = math.ceil(n / world) * world
    order += (order * math.ceil(total / n))[: total - n]
    return [order[r:total:world] for r in range(world)]


def epoch_step(cat: Catalogue, world: int, epoch: int) -> Step:
    shards = [o for o in cat.objects if o.key.startswith("train/")]
    split = distributed_sampler(len(shards), world, epoch)
    jobs = tuple(
        Job(r, tuple(cat.reads[shards[i].key] for i in mine), cat.sizes.prefetch)
        for r, mine in enumerate(split)
    )
    return Step(f"epoch {epoch}", "epochs", jobs)


def restore_step(cat: Catalogue, world: int, ranks: Sequence[Obj]) -> Step:
    """Every rank at once: the metadata, its own shard, the shared weights."""
    meta, shared = (cat.reads[k] for k, _, _ in restore_shared(cat.sizes))
    jobs = tuple(Job(r, (meta, cat.reads[ranks[r].key], shared), inflight=3) for r in range(world))
    return Step("restore", "restore", jobs)


def agents_step(cat: Catalogue, world: int) -> Step:
    """Agent loops on every GPU; the number of loops changes with each third of the step."""
    sizes = cat.sizes
    pool = tuple(op for op in cat.reads.values() if op.tag == "small") + tuple(cat.headers)
    # Zipf (s = 1.1) over a fixed random order of the pool: a few objects are read often.
    order = list(range(len(pool)))
    random.Random(11).shuffle(order)
    weights = [0.0] * len(pool)
    for rank, i in enumerate(order):
        weights[i] = 1 / (rank + 1) ** 1.1
    span = sizes.agent_seconds / len(sizes.agent_loops)
    jobs = []
    for g in range(world):
        loops = tuple(
            Loop(s * span, (s + 1) * span, 10_000 * g + 100 * s + n, think=0.25, fanout=3.0)
            for s, count in enumerate(sizes.agent_loops)
            for n in range(count)
        )
        jobs.append(Job(g, loops=loops))
    return Step("agents", "agents", tuple(jobs), pool, tuple(weights), sizes.agent_seconds)


def direct_step(step: Step, per_gpu: int) -> Step:
    """A few of a step's reads, each GPU its own, straight from the origin."""
    rng = random.Random(step.name)
    ops = [op for job in step.jobs for op in job.ops] or list(step.pool)
    jobs = tuple(
        Job(job.gpu, tuple(replace(op, direct=True) for op in rng.sample(ops, per_gpu)), per_gpu)
        for job in step.jobs
    )
    return Step(f"{step.name}: origin direct", step.phase, jobs, direct=True)


def save_ops(sizes: Sizes, world: int, direct: bool) -> list[list[Op]]:
    """Each rank's checkpoint saves into the far bucket; rank 0 also saves a multipart file."""
    prefix = "direct" if direct else "lota"
    plans = []
    for r in range(world):
        seed = 700_000 + r
        body = blob(seed, sizes.save_size)
        ops = [
            Op(
                f"{prefix}/step-2000/rank-{r:05d}.pt",
                sizes.save_size,
                digest(body),
                FAR_BUCKET,
                write=True,
                seed=seed,
                direct=direct,
                tag="save",
            )
        ]
        if r == 0:
            size = sizes.part_size + sizes.part_size // 2
            big = blob(799_999, size)
            ops.append(
                Op(
                    f"{prefix}/step-2000/optim-00000.pt",
                    size,
                    digest(big),
                    FAR_BUCKET,
                    write=True,
                    seed=799_999,
                    part_size=sizes.part_size,
                    direct=direct,
                    tag="save-multipart",
                )
            )
        plans.append(ops)
    return plans


def save_step(sizes: Sizes, world: int, direct: bool) -> Step:
    jobs = tuple(Job(r, tuple(ops), 2) for r, ops in enumerate(save_ops(sizes, world, direct)))
    name = "save: origin direct" if direct else "save"
    return Step(name, "xregion-save", jobs, direct=direct)


def readback_step(sizes: Sizes, world: int, shift: int, far_gpus: Sequence[int], name: str) -> Step:
    """Reads of the saved checkpoint: each near GPU reads the file `shift` ranks on (a GPU
    of another node saved it), and the far region's GPUs read every file between them."""
    saved = [op for ops in save_ops(sizes, world, direct=False) for op in ops]
    reads = [replace(op, write=False, seed=0, part_size=0, tag="readback") for op in saved]
    shards = reads[: world + 1]  # rank 0's two files first
    jobs = [Job(r, (shards[(r + shift) % len(shards)],)) for r in range(world)]
    for i, gpu in enumerate(far_gpus):
        jobs.append(Job(gpu, tuple(shards[i :: len(far_gpus)]), 2))
    return Step(name, "xregion-save", tuple(jobs))
