"""The simulated GPUs: one process of their own, an asyncio task per GPU, each with a real
async S3 client (aiobotocore, SigV4, path-style) to its own node's endpoint.

Why a process of its own: the simulator's main process carries the emulated links (the
WAN to each origin, the links between racks), whose timing must not wait behind the
clients' CPU. The main process hands this one a :class:`~bench.sim.workloads.Step` at a
time (:func:`run_step`) and gets back one :class:`Sample` per read or write; meanwhile
:func:`progress` snapshots go up a queue for the terminal and the node restart.

Every read is hashed as it streams (xxh3-128) and compared with the digest the plan
expected; every write's ETag is compared with the MD5 S3 would give. A client's own
retries are off: a read that fails (its node restarting, a body cut short, a 5xx) is
tried again here every 0.25 s for up to a minute, and its attempts are counted, so the
report says what a node restart cost the GPUs behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import multiprocessing.queues
import random
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp
import botocore.exceptions
import uvloop
import xxhash
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from bench.sim.workloads import Job, Loop, Op, Step, blob

RETRY_FOR = 60.0
RETRY_EVERY = 0.25
PROGRESS_EVERY = 0.5
READ_CHUNK = 1024 * 1024
RETRYABLE = (
    botocore.exceptions.BotoCoreError,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    ConnectionError,
)


@dataclass(frozen=True, slots=True)
class Gpu:
    name: str
    node: int  # index of its node in the cluster; -1: the far region's node
    rack: int  # -1 in the far region
    region: str
    endpoint: str  # its node's


@dataclass(frozen=True, slots=True)
class Fleet:
    """What the GPU process is told once: the GPUs, keys, and the origins' own endpoints."""

    gpus: tuple[Gpu, ...]
    key: tuple[str, str]  # a principal of the nodes' credentials file
    origin_key: tuple[str, str]
    direct: tuple[tuple[str, str], ...]  # bucket -> its origin, as a GPU reaches it


@dataclass(frozen=True, slots=True)
class Sample:
    """One read or write as the GPU saw it."""

    step: str
    gpu: int
    key: str
    first: int  # a range's first byte; -1: the whole object
    tag: str
    write: bool
    source: str  # x-lota-cache; ORIGIN: straight to the origin; LOTA: a write through LOTA
    size: int
    start: float  # wall clock (time.time())
    seconds: float  # to the last byte (reads) or the acknowledgement (writes)
    first_byte: float
    attempts: int
    ok: bool  # the bytes hashed right, the ETag was S3's
    error: str = ""


class _Process:
    """The GPU process's state across steps: its loop, its clients, the progress queue."""

    def __init__(self, fleet: Fleet, queue: multiprocessing.queues.Queue[Any]) -> None:
        self.fleet = fleet
        self.queue = queue
        self.loop = uvloop.new_event_loop()
        self.stack = contextlib.AsyncExitStack()
        self.clients: dict[str, Any] = {}

    async def client(self, endpoint: str, key: tuple[str, str]) -> Any:
        if endpoint not in self.clients:
            config = AioConfig(
                signature_version="s3v4",
                s3={"addressing_style": "path"},
                retries={"total_max_attempts": 1},
                connect_timeout=5,
                read_timeout=60,
                max_pool_connections=64,
            )
            made = get_session().create_client(
                "s3",
                endpoint_url=endpoint,
                region_name="us-east-1",
                aws_access_key_id=key[0],
                aws_secret_access_key=key[1],
                config=config,
            )
            self.clients[endpoint] = await self.stack.enter_async_context(made)
        return self.clients[endpoint]


_state: dict[str, _Process] = {}  # the GPU process's one _Process


def init(fleet: Fleet, queue: multiprocessing.queues.Queue[Any]) -> None:
    """The process pool's initializer."""
    _state["process"] = _Process(fleet, queue)


def run_step(step: Step) -> list[Sample]:
    """Carry out one step, every GPU starting at once; its samples."""
    process = _state["process"]
    return process.loop.run_until_complete(_Runner(process, step).run())


def close() -> None:
    process = _state.pop("process")
    process.loop.run_until_complete(process.stack.aclose())
    process.loop.close()


class _Runner:
    """One step: the GPUs' tasks, their samples, and the progress reporter."""

    def __init__(self, process: _Process, step: Step) -> None:
        self.process = process
        self.step = step
        self.samples: list[Sample] = []
        self.sources: Counter[str] = Counter()
        self.inflight: Counter[int] = Counter()
        self.moved = 0
        self.started = time.monotonic()

    async def run(self) -> list[Sample]:
        async with asyncio.TaskGroup() as group:
            reporter = group.create_task(self._report())
            await asyncio.gather(*(self._job(job) for job in self.step.jobs))
            reporter.cancel()
        self._put()
        return self.samples

    async def _report(self) -> None:
        while True:
            self._put()
            await asyncio.sleep(PROGRESS_EVERY)

    def _put(self) -> None:
        elapsed = time.monotonic() - self.started
        if self.step.duration:
            fraction = min(1.0, elapsed / self.step.duration)
        else:
            fraction = len(self.samples) / max(1, self.step.planned)
        self.process.queue.put(
            {
                "step": self.step.name,
                "elapsed": elapsed,
                "fraction": fraction,
                "done": len(self.samples),
                "gpus_active": sum(1 for n in self.inflight.values() if n),
                "inflight": sum(self.inflight.values()),
                "bytes": self.moved,
                "sources": dict(self.sources),
            }
        )

    async def _job(self, job: Job) -> None:
        if job.loops:
            await asyncio.gather(*(self._agent(job.gpu, loop) for loop in job.loops))
            return
        gate = asyncio.Semaphore(job.inflight)

        async def one(op: Op) -> None:
            async with gate:
                await self._op(job.gpu, op)

        await asyncio.gather(*(one(op) for op in job.ops))

    async def _agent(self, gpu: int, loop: Loop) -> None:
        """Think, then a burst of reads at once, until the loop's time is up."""
        rng = random.Random(loop.seed)
        await asyncio.sleep(max(0.0, self.started + loop.start - time.monotonic()))
        end = self.started + loop.end
        while True:
            await asyncio.sleep(rng.expovariate(1 / loop.think))
            if time.monotonic() >= end:
                return
            burst = rng.choices(self.step.pool, self.step.weights, k=1 + _poisson(rng, loop.fanout))
            await asyncio.gather(*(self._op(gpu, op) for op in burst))

    async def _op(self, gpu: int, op: Op) -> None:
        """One read or write, tried again until it works or a minute has passed."""
        fleet = self.process.fleet
        if op.direct:
            endpoint, key = dict(fleet.direct)[op.bucket], fleet.origin_key
        else:
            endpoint, key = fleet.gpus[gpu].endpoint, fleet.key
        client = await self.process.client(endpoint, key)
        began, wall = time.monotonic(), time.time()
        attempts, error = 0, ""
        self.inflight[gpu] += 1
        try:
            while not error.startswith("4") and time.monotonic() - began < RETRY_FOR:
                attempts += 1
                try:
                    source, ok, first = await (_write if op.write else _read)(client, op)
                except RETRYABLE as exc:
                    error = f"{type(exc).__name__}: {exc}"[:300]
                    await asyncio.sleep(RETRY_EVERY)
                    continue
                except botocore.exceptions.ClientError as exc:  # 5xx: tried again
                    status = exc.response["ResponseMetadata"]["HTTPStatusCode"]
                    error = f"{status} {exc}"[:300]
                    await asyncio.sleep(RETRY_EVERY)
                    continue
                source = "ORIGIN" if op.direct else source
                self._record(self._sample(op, gpu, wall, source, began, first, attempts, ok))
                return
            self._record(self._sample(op, gpu, wall, "", began, 0.0, attempts, False, error))
        finally:
            self.inflight[gpu] -= 1

    def _sample(
        self,
        op: Op,
        gpu: int,
        wall: float,
        source: str,
        began: float,
        first: float,
        attempts: int,
        ok: bool,
        error: str = "",
    ) -> Sample:
        size = 0 if error else op.size
        return Sample(
            self.step.name,
            gpu,
            op.key,
            op.first,
            op.tag,
            op.write,
            source,
            size,
            wall,
            time.monotonic() - began,
            first,
            attempts,
            ok,
            error,
        )

    def _record(self, sample: Sample) -> None:
        self.samples.append(sample)
        self.sources[sample.source or "FAILED"] += 1
        self.moved += sample.size


async def _read(client: Any, op: Op) -> tuple[str, bool, float]:
    """GET (a range of) an object, hashing as it streams: (x-lota-cache, right, first byte)."""
    began = time.monotonic()
    extra = {"Range": op.range} if op.range else {}
    response = await client.get_object(Bucket=op.bucket, Key=op.key, **extra)
    first = time.monotonic() - began
    source = response["ResponseMetadata"]["HTTPHeaders"].get("x-lota-cache", "")
    digest, size = xxhash.xxh3_128(), 0
    async with response["Body"] as body:
        async for piece in body.iter_chunks(READ_CHUNK):
            digest.update(piece)
            size += len(piece)
    return source, size == op.size and digest.hexdigest() == op.digest, first


async def _write(client: Any, op: Op) -> tuple[str, bool, float]:
    """PUT (or a multipart upload): ("LOTA", the ETag is S3's, 0)."""
    body = blob(op.seed, op.size)
    if not op.part_size:
        done = await client.put_object(Bucket=op.bucket, Key=op.key, Body=body)
        return "LOTA", done["ETag"].strip('"') == hashlib.md5(body).hexdigest(), 0.0
    parts = [body[i : i + op.part_size] for i in range(0, len(body), op.part_size)]
    upload = await client.create_multipart_upload(Bucket=op.bucket, Key=op.key)
    sent = []
    for n, part in enumerate(parts, 1):
        answer = await client.upload_part(
            Bucket=op.bucket, Key=op.key, UploadId=upload["UploadId"], PartNumber=n, Body=part
        )
        sent.append({"PartNumber": n, "ETag": answer["ETag"]})
    done = await client.complete_multipart_upload(
        Bucket=op.bucket,
        Key=op.key,
        UploadId=upload["UploadId"],
        MultipartUpload={"Parts": sent},
    )
    md5s = b"".join(hashlib.md5(p).digest() for p in parts)
    expected = f"{hashlib.md5(md5s).hexdigest()}-{len(parts)}"
    return "LOTA", done["ETag"].strip('"') == expected, 0.0


def _poisson(rng: random.Random, mean: float) -> int:
    """Knuth's: count uniform draws until their product falls below e^-mean."""
    limit, count, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        count += 1
        product *= rng.random()
    return count
