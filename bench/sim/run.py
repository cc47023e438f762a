"""``python -m bench.sim run``: a multi-rack GPU cluster in a box, through real LOTA nodes.

Starts ``racks`` x ``nodes-per-rack`` real ``lota serve`` processes in one ``[cluster]``
(links between racks emulated, each node knowing its rack), two regions' origins behind
emulated WAN links, a LOTA node in the far region, and ``gpus-per-node`` simulated GPUs per
node reading through their own node with aiobotocore (see :mod:`bench.sim.run_topology`,
:mod:`bench.sim.run_gpus`). Then the workloads of :mod:`bench.sim.workloads`, step by step,
with a node killed (SIGKILL) and restarted in the middle of one step, and progress on the
terminal. The nodes' logs are copied to ``DIR/logs/``. The report (``DIR/report.json``,
``report.md`` and PNG plots) is made by
:mod:`bench.sim.report` and :mod:`bench.sim.plots` from what the GPUs saw and what the
nodes' own ``/_lota/metrics`` counted.

    python -m bench.sim run --out /tmp/sim                  # 2 racks x 3 nodes x 4 GPUs, mixed
    python -m bench.sim run --out /tmp/sim --quick          # the smoke test's size

Caveat: one machine runs every node, both origins, every link and every GPU; absolute rates
are a floor set by its cores, the ratios and the hit rates are what the run shows.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import math
import multiprocessing
import multiprocessing.queues
import os
import queue
import shutil
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvloop

import lota
from bench.sim import plots, report, run_gpus
from bench.sim.run_gpus import Fleet, Sample
from bench.sim.run_topology import Link, Shape, Topology, origin_client
from bench.sim.workloads import (
    DATA_BUCKET,
    FAR_BUCKET,
    PHASES,
    Catalogue,
    Op,
    Sizes,
    Step,
    agents_step,
    catalogue,
    direct_step,
    epoch_step,
    rank_shards,
    readback_step,
    restore_step,
    save_ops,
    save_step,
)
from lota.config import parse_size
from lota.testing.credentials import PRINCIPALS
from lota.testing.wan import parse_bandwidth, parse_latency

MIGRATION_TIMEOUT = 300.0


@dataclass
class Restart:
    """The node killed in the middle of a step, and when."""

    step: str
    node: int
    down: float
    killed_at: float = 0.0
    ready_at: float = 0.0


@dataclass
class StepResult:
    step: Step
    samples: list[Sample]
    started: float
    wall: float
    counters: list[dict[str, float]]  # per node, after minus before
    links: dict[str, int]  # bytes over each link during the step
    extra: dict[str, Any] = field(default_factory=dict)


KILL_AT = 0.25  # the share of a step done when its node is killed


class Driver:
    """Runs steps in the GPU process, prints progress, kills and restarts the node."""

    def __init__(self, topology: Topology, restart: Restart | None) -> None:
        self.topology = topology
        self.restart = restart
        self.queue: multiprocessing.queues.Queue[Any] = multiprocessing.get_context("spawn").Queue()
        self.totals: Counter[str] = Counter()
        self.moved = 0
        self.started = time.time()
        self._tty = sys.stdout.isatty()
        self._printed = 0.0

    async def step(self, pool: concurrent.futures.Executor, step: Step) -> StepResult:
        before, links = await asyncio.to_thread(self.topology.counters), self.topology.link_bytes()
        started = time.time()
        future = asyncio.get_running_loop().run_in_executor(pool, run_gpus.run_step, step)
        restarting = False
        async with asyncio.TaskGroup() as group:  # the restart, if it is in this step
            while not future.done():
                await asyncio.wait([future], timeout=0.25)
                last = self._drain()
                if last and not restarting and self._restart_due(step, last):
                    restarting = bool(group.create_task(self._restart()))
        samples = await future
        self._drain()
        self.totals.update(s.source or "FAILED" for s in samples if not s.write)
        self.moved += sum(s.size for s in samples)
        self._show(step.name, {"fraction": 1.0, "done": len(samples)}, end=True)
        after = await asyncio.to_thread(self.topology.counters)
        deltas = [
            {k: v - b.get(k, 0.0) for k, v in a.items()} for a, b in zip(after, before, strict=True)
        ]
        moved = self.topology.link_bytes()
        return StepResult(
            step,
            samples,
            started,
            time.time() - started,
            deltas,
            {k: v - links.get(k, 0) for k, v in moved.items()},
        )

    def _restart_due(self, step: Step, progress: dict[str, Any]) -> bool:
        r = self.restart
        # A quarter in: the node's counters are scraped before the SIGKILL, which takes a
        # moment on a busy machine, and the GPUs read in waves; at a half the kill could
        # land after the step's last read.
        return r is not None and r.step == step.name and progress["fraction"] >= KILL_AT

    async def _restart(self) -> None:
        """Kill the node (SIGKILL, its counters kept first), wait, start it again."""
        assert self.restart is not None and self.topology.cluster is not None
        r, cluster = self.restart, self.topology.cluster
        await asyncio.to_thread(self.topology.bank, r.node)
        cluster.kill(r.node)
        r.killed_at = time.time()
        print(f"\n-- killed node {r.node} (SIGKILL) in the middle of {r.step}", flush=True)
        await asyncio.sleep(r.down)
        await asyncio.to_thread(cluster.restart, r.node)
        r.ready_at = time.time()
        print(f"-- node {r.node} ready again after {r.ready_at - r.killed_at:.1f} s", flush=True)

    def _drain(self) -> dict[str, Any]:
        latest: dict[str, Any] = {}
        while True:
            try:
                latest = self.queue.get_nowait()
            except queue.Empty:
                break
        if latest:
            self._show(latest["step"], latest)
        return latest

    def _show(self, name: str, p: dict[str, Any], end: bool = False) -> None:
        """One progress line: the step, GPUs active, GB moved, hit rates so far."""
        now = time.time()
        if not (end or self._tty or now - self._printed >= 5):
            return
        self._printed = now
        sources = Counter(self.totals) + Counter(p.get("sources", {}))
        reads = sum(n for s, n in sources.items() if s not in ("LOTA", "ORIGIN")) or 1
        line = (
            f"[{now - self.started:6.1f}s] {name:<24} {p['fraction']:4.0%}"
            f"  GPUs active {p.get('gpus_active', 0):3d}  in flight {p.get('inflight', 0):3d}"
            f"  moved {(self.moved + p.get('bytes', 0)) / 1e9:6.2f} GB"
            f"  hit rate so far: HIT {sources['HIT'] / reads:4.0%}"
            f" PEER {sources['PEER'] / reads:4.0%} MISS {sources['MISS'] / reads:4.0%}"
        )
        print(
            ("\r" if self._tty else "") + line, end="\n" if end or not self._tty else "", flush=True
        )


def build_steps(args: argparse.Namespace, cat: Catalogue, world: int) -> list[Step | str]:
    """The steps of the run, in order; "migrate" is the wait for the migrator."""
    sizes, phases = cat.sizes, args.phases
    steps: list[Step | str] = []
    if "epochs" in phases:
        epochs = [epoch_step(cat, world, e) for e in range(1, sizes.epochs + 1)]
        steps += [*epochs, direct_step(epochs[-1], sizes.direct_reads)]
    if "restore" in phases:
        restore = restore_step(cat, world, rank_shards(sizes, world))
        steps += [restore, direct_step(restore, sizes.direct_reads)]
    if "agents" in phases:
        agents = agents_step(cat, world)
        steps += [agents, direct_step(agents, sizes.direct_reads)]
    if "xregion-save" in phases:
        far = list(range(world, world + args.far_gpus))
        back = [readback_step(sizes, world, args.gpus_per_node, far, n) for n in ("a", "b")]
        # Straight to the far origin first, on links and cores nothing else is using (no
        # migration in flight), then the same saves through LOTA.
        steps += [save_step(sizes, world, True), save_step(sizes, world, False)]
        steps += [_named(back[0], "read back (pending)"), "migrate"]
        steps += [_named(back[1], "read back (home)")]
    return steps


def _named(step: Step, name: str) -> Step:
    return Step(name, step.phase, step.jobs)


def upload(topology: Topology, cat: Catalogue, world: int) -> int:
    """Put every object the GPUs will read into the near origin (straight to moto)."""
    s3 = origin_client(topology.near.direct_endpoint)
    objects = list(cat.objects)
    if "ckpt/step-1000/.metadata" in cat.reads:
        objects += rank_shards(cat.sizes, world)

    def put(obj: Any) -> int:
        body = obj.body()
        if not obj.part_size:
            s3.put_object(Bucket=DATA_BUCKET, Key=obj.key, Body=body)
            return len(body)
        upload = s3.create_multipart_upload(Bucket=DATA_BUCKET, Key=obj.key)["UploadId"]
        parts = []
        for n, i in enumerate(range(0, len(body), obj.part_size), 1):
            got = s3.upload_part(
                Bucket=DATA_BUCKET,
                Key=obj.key,
                UploadId=upload,
                PartNumber=n,
                Body=body[i : i + obj.part_size],
            )
            parts.append({"PartNumber": n, "ETag": got["ETag"]})
        s3.complete_multipart_upload(
            Bucket=DATA_BUCKET, Key=obj.key, UploadId=upload, MultipartUpload={"Parts": parts}
        )
        return len(body)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return sum(pool.map(put, objects))


async def migrated(topology: Topology, keys: list[str], acked: float) -> dict[str, Any]:
    """Wait until every saved object is in the far origin itself (listed there); how long
    after the last save was acknowledged (`acked`, wall clock) that was."""
    s3 = origin_client(topology.far.direct_endpoint)
    home: set[str] = set()
    while time.time() - acked < MIGRATION_TIMEOUT:
        listed = await asyncio.to_thread(s3.list_objects_v2, Bucket=FAR_BUCKET, Prefix="lota/")
        home = {o["Key"] for o in listed.get("Contents", [])} & set(keys)
        if len(home) == len(keys):
            break
        await asyncio.sleep(0.25)
    done = {"objects": len(home), "of": len(keys), "complete": len(home) == len(keys)}
    return {"seconds_after_last_ack": time.time() - acked, **done}


async def wait_migration(
    topology: Topology, results: list[StepResult], saves: list[list[Op]]
) -> None:
    """The migration's figures go with the save step."""
    save = next(r for r in results if r.step.name == "save")
    acked = max(x.start + x.seconds for x in save.samples)
    keys = [op.key for ops in saves for op in ops]
    save.extra["migration"] = waited = await migrated(topology, keys, acked)
    print(
        f"{waited['objects']} of {waited['of']} saves home in the far origin"
        f" {waited['seconds_after_last_ack']:.1f} s after the last acknowledgement",
        flush=True,
    )


async def simulate(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    sizes = Sizes.quick() if args.quick else Sizes()
    world = args.racks * args.nodes_per_rack * args.gpus_per_node
    cat = await asyncio.to_thread(catalogue, sizes, args.phases)
    for obj in rank_shards(sizes, world) if "restore" in args.phases else []:
        await asyncio.to_thread(cat.add, obj, "rank")
    shape = make_shape(args, cat)
    topology = Topology(root, shape)
    restart = pick_restart(args)
    steps = build_steps(args, cat, world)
    results: list[StepResult] = []
    try:
        began = time.time()
        await topology.start()
        print(
            f"started {shape.nodes} nodes in {shape.racks} racks, the far region's node"
            f" and {len(topology.links)} origin links in {time.time() - began:.1f} s",
            flush=True,
        )
        uploaded = await asyncio.to_thread(upload, topology, cat, world)
        print(f"uploaded {uploaded / 1e9:.2f} GB to the near origin", flush=True)
        driver = Driver(topology, restart)
        fleet = Fleet(
            tuple(topology.gpus(args.far_gpus)),
            PRINCIPALS["admin"][:2],
            (topology.near.access_key_id, topology.near.secret_access_key),
            topology.direct(),
        )
        context = multiprocessing.get_context("spawn")
        with concurrent.futures.ProcessPoolExecutor(
            1, mp_context=context, initializer=run_gpus.init, initargs=(fleet, driver.queue)
        ) as pool:
            for step in steps:
                if step == "migrate":
                    await wait_migration(topology, results, save_ops(sizes, world, False))
                    continue
                assert isinstance(step, Step)
                results.append(await driver.step(pool, step))
            await asyncio.get_running_loop().run_in_executor(pool, run_gpus.close)
        return report.build(args, shape, sizes, fleet, results, restart, uploaded)
    except BaseException:
        for node in topology.nodes if topology.far_node else []:
            print(f"--- {node.log_path.name}\n{node.log_tail(15)}", file=sys.stderr)
        raise
    finally:
        await topology.close()
        (args.out / "logs").mkdir(exist_ok=True)
        for log in root.glob("*.log"):
            shutil.copy(log, args.out / "logs" / log.name)


def make_shape(args: argparse.Namespace, cat: Catalogue) -> Shape:
    """Each node's cache: the dataset over the ratio, shared by the nodes (at least 4 chunks)."""
    nodes = args.racks * args.nodes_per_rack
    dataset = sum(op.size for op in cat.reads.values() if op.tag == "shard")
    chunk = parse_size(args.chunk_size)
    wanted = parse_size(args.cache_size) if args.cache_size else dataset / args.ratio / nodes
    return Shape(
        racks=args.racks,
        nodes_per_rack=args.nodes_per_rack,
        gpus_per_node=args.gpus_per_node,
        cache_size=max(4 * chunk, math.ceil(wanted)),
        chunk_size=args.chunk_size,
        near=Link(parse_latency(args.near_latency), parse_bandwidth(args.near_bandwidth)),
        far=Link(parse_latency(args.far_latency), parse_bandwidth(args.far_bandwidth)),
        rack=Link(parse_latency(args.rack_latency), parse_bandwidth(args.rack_bandwidth)),
    )


def pick_restart(args: argparse.Namespace) -> Restart | None:
    """The step a node is restarted in: the second epoch, else the phase's main step."""
    if args.restart == "none":
        return None
    if args.restart != "auto":
        step = args.restart
    elif "epochs" in args.phases:
        step = "epoch 2"
    else:
        step = {"restore": "restore", "agents": "agents", "xregion-save": "save"}[args.phases[0]]
    return Restart(
        step,
        min(args.restart_node, args.racks * args.nodes_per_rack - 1),
        parse_latency(args.restart_down),
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.sim run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--racks", type=int, default=2)
    p.add_argument("--nodes-per-rack", type=int, default=3)
    p.add_argument("--gpus-per-node", type=int, default=4)
    p.add_argument("--workload", choices=(*PHASES, "mixed"), default="mixed")
    p.add_argument("--out", type=Path, required=True, help="the report's directory")
    p.add_argument("--quick", action="store_true", help="small objects: the smoke test's size")
    p.add_argument(
        "--ratio",
        type=float,
        default=0.5,
        help="dataset bytes / the cluster's cache bytes (each node 1/N of it)",
    )
    p.add_argument("--cache-size", default="", help="per node, instead of --ratio")
    p.add_argument("--chunk-size", default="", help="8MiB (1MiB with --quick)")
    p.add_argument("--near-latency", default="10ms", help="to an origin in one's region")
    p.add_argument("--near-bandwidth", default="1Gbit", help="per connection")
    p.add_argument("--far-latency", default="30ms", help="between regions")
    p.add_argument("--far-bandwidth", default="100Mbit", help="per connection")
    p.add_argument("--rack-latency", default="500us", help="between two racks")
    p.add_argument("--rack-bandwidth", default="10Gbit", help="per connection")
    p.add_argument("--far-gpus", type=int, default=0, help="readers in the far region (G)")
    p.add_argument("--restart", default="auto", help="the step to restart a node in, or none")
    p.add_argument("--restart-node", type=int, default=1)
    p.add_argument("--restart-down", default="2s", help="how long the node stays down")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    args.phases = PHASES if args.workload == "mixed" else (args.workload,)
    args.chunk_size = args.chunk_size or ("1MiB" if args.quick else "8MiB")
    args.far_gpus = args.far_gpus or args.gpus_per_node
    args.out.mkdir(parents=True, exist_ok=True)
    began, load = time.time(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="lota-sim-") as tmp:
        figures = uvloop.run(simulate(args, Path(tmp)))
    figures["run"].update(
        seconds=time.time() - began,
        load_before=load,
        load_after=os.getloadavg(),
        lota_version=lota.__version__,
        command=" ".join(
            ["python -m bench.sim run", *(argv if argv is not None else sys.argv[1:])]
        ),
    )
    written = report.write(args.out, figures) + plots.draw(args.out, figures)
    print(report.summary(figures))
    print("wrote " + ", ".join(str(p) for p in written))
    return 0 if figures["checks"]["passed"] else 1
