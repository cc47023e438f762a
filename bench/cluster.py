"""The cluster-wide cache against per-node caches: a checkpoint-restore storm and dataset
epochs on N real LOTA nodes in front of one far origin.

N nodes (default 6) on loopback, each its own ``lota serve`` process with its own cache,
SigV4 on, in front of an embedded origin behind an emulated WAN (``--latency`` one way,
``--bandwidth``). Clients (``--clients-per-node`` per node, all in one load-generator
process) read through their own node with presigned SigV4 URLs:

- storm: every client reads every file of a checkpoint at once (nobody has read it yet);
- epoch 1, epoch 2: a sharded dataset, each epoch a new permutation of its shards split
  over all clients (as PyTorch's DistributedSampler does), so each shard is read once per
  epoch, by a different node each time.

The whole run is done twice, on fresh caches and fresh objects: with ``[cluster]`` (each
chunk has an owner node; a miss asks it before the origin) and with every node alone.
Printed: origin bytes against the unique bytes read, latency to the last byte by
``x-lota-cache`` (HIT, PEER, MISS), and the aggregate GB/s clients received.

    python -m bench.cluster                    # ~3 minutes
    python -m bench.cluster --quick            # smaller objects, for a quick look

Caveat: one 2-core machine runs every node, the origin, the WAN emulator and the clients;
the absolute rates are a floor, the ratios are what the run shows.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import random
import re
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import boto3

from bench.common import origin_client, percentiles, presigned_urls, save, stop_on_sigterm, table
from bench.loadgen import LoadClient, Request, Result, get_request
from lota.config import parse_duration, parse_size
from lota.embedded import EmbeddedOrigin
from lota.testing.cluster import LocalCluster
from lota.testing.credentials import write_credentials
from lota.testing.wan import parse_bandwidth

MiB = 1024 * 1024
BUCKET = "bench-cluster"
SOURCES = ("HIT", "PEER", "MISS")


def run_requests(requests: list[Request], concurrency: int) -> Result:
    """In the load-generator process: send them all, `concurrency` at a time."""

    async def go() -> Result:
        client = LoadClient(concurrency)
        try:
            return await client.run(requests)
        finally:
            client.close()

    return asyncio.run(go())


def node_totals(cluster: LocalCluster) -> dict[str, float]:
    """Counters summed over the nodes."""
    wanted = {
        "origin": r"lota_origin_bytes_in_total\{[^}]*\}",
        "peer_in": r"lota_peer_bytes_in_total",
        "served": r"lota_bytes_out_total",
    }
    totals = dict.fromkeys(wanted, 0.0)
    for node in cluster.nodes:
        text = node.metrics()
        for name, pattern in wanted.items():
            for found in re.finditer(rf"^{pattern} (\S+)$", text, re.MULTILINE):
                totals[name] += float(found.group(1))
    return totals


class Run:
    """One mode (cluster on or off): its nodes, its objects, its phases."""

    def __init__(self, cluster: LocalCluster, prefix: str, args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.args = args
        self.checkpoint = [f"{prefix}/ckpt/shard-{i}.pt" for i in range(args.ckpt_files)]
        self.dataset = [f"{prefix}/data/shard-{i:04d}.tar" for i in range(args.dataset_files)]
        self.urls: list[dict[str, str]] = []

    def prepare(self) -> None:
        keys = self.checkpoint + self.dataset
        self.urls = [
            dict(zip(keys, presigned_urls(url, BUCKET, keys), strict=True))
            for url in self.cluster.urls
        ]

    def clients(self) -> list[dict[str, str]]:
        """Each client's node URLs, clients spread over the nodes."""
        return [self.urls[c % len(self.urls)] for c in range(self.client_count)]

    @property
    def client_count(self) -> int:
        return int(self.args.clients_per_node) * len(self.cluster.nodes)

    def storm(self) -> list[Request]:
        """Every client reads every checkpoint file, all starting together."""
        return [get_request(urls[k]) for k in self.checkpoint for urls in self.clients()]

    def epoch(self, seed: int) -> list[Request]:
        """A permutation of the dataset's shards dealt out over the clients."""
        order = self.dataset[:]
        random.Random(seed).shuffle(order)
        clients = self.clients()
        return [get_request(clients[i % len(clients)][k]) for i, k in enumerate(order)]


async def phase(
    pool: ProcessPoolExecutor, run: Run, name: str, requests: list[Request], unique: int
) -> dict[str, Any]:
    before = await asyncio.to_thread(node_totals, run.cluster)
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    result: Result = await loop.run_in_executor(pool, run_requests, requests, run.client_count)
    wall = time.perf_counter() - started
    after = await asyncio.to_thread(node_totals, run.cluster)
    origin = after["origin"] - before["origin"]
    row = {
        "phase": name,
        "cluster": run.cluster.clustered,
        "requests": len(result.samples),
        "errors": dict(result.errors),
        "unique_bytes": unique,
        "origin_bytes": origin,
        "origin_over_unique": origin / unique if unique else 0.0,
        "peer_bytes": after["peer_in"] - before["peer_in"],
        "client_bytes": result.body_bytes,
        "wall_s": wall,
        "GBps": result.body_bytes / wall / 1e9,
        "sources": dict(result.sources),
        "latency_ms": {s: percentiles(v) for s, v in result.by_source.items()},
    }
    print(
        f"{'cluster' if run.cluster.clustered else 'alone':>7} {name:<8} "
        f"{row['GBps']:.2f} GB/s, origin/unique {row['origin_over_unique']:.2f}, "
        f"{row['sources']} {row['errors'] or ''}",
        flush=True,
    )
    return row


def upload(origin: EmbeddedOrigin, keys: list[str], size: int) -> None:
    s3 = boto3.client(
        "s3",
        endpoint_url=origin.direct_endpoint,
        aws_access_key_id=origin.access_key_id,
        aws_secret_access_key=origin.secret_access_key,
        region_name="us-east-1",
    )
    blob = random.randbytes(size)
    for i, key in enumerate(keys):
        s3.put_object(Bucket=BUCKET, Key=key, Body=blob[i % 97 :] + blob[: i % 97])


async def mode(
    pool: ProcessPoolExecutor,
    origin: EmbeddedOrigin,
    work: Path,
    clustered: bool,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    prefix = "on" if clustered else "off"
    root = work / prefix
    root.mkdir()
    credentials = write_credentials(root / "credentials.toml")
    cluster = LocalCluster(
        root,
        origin.endpoint,
        credentials,
        args.nodes,
        cache_size=args.cache_size,
        settings={"cache": {"revalidate_after": "1h"}},
        clustered=clustered,
    )
    run = Run(cluster, prefix, args)
    await asyncio.to_thread(upload, origin, run.checkpoint, args.ckpt_size)
    await asyncio.to_thread(upload, origin, run.dataset, args.shard_size)
    with cluster:
        await asyncio.to_thread(run.prepare)
        ckpt = args.ckpt_files * args.ckpt_size
        data = args.dataset_files * args.shard_size
        return [
            await phase(pool, run, "storm", run.storm(), ckpt),
            await phase(pool, run, "epoch 1", run.epoch(1), data),
            await phase(pool, run, "epoch 2", run.epoch(2), data),
        ]


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    lines = []
    for row in rows:
        cells: list[Any] = [
            "on" if row["cluster"] else "off",
            row["phase"],
            f"{row['unique_bytes'] / MiB:,.0f}",
            f"{row['origin_bytes'] / MiB:,.0f}",
            row["origin_over_unique"],
            row["GBps"],
        ]
        for source in SOURCES:
            p = row["latency_ms"].get(source)
            count = row["sources"].get(source, 0)
            cells.append(f"{p['p50']:.0f} / {p['p99']:.0f} ({count})" if p else "-")
        lines.append(cells)
    print()
    print(
        f"{args.nodes} nodes x {args.clients_per_node} clients, origin {args.latency} one way"
        f" at {args.bandwidth}; checkpoint {args.ckpt_files} x {args.ckpt_size // MiB} MiB,"
        f" dataset {args.dataset_files} x {args.shard_size // MiB} MiB"
    )
    print(
        table(
            [
                "cluster",
                "phase",
                "unique MiB",
                "origin MiB",
                "origin / unique",
                "GB/s to clients",
                "HIT p50 / p99 ms (n)",
                "PEER p50 / p99 ms (n)",
                "MISS p50 / p99 ms (n)",
            ],
            lines,
        )
    )
    on = {r["phase"]: r for r in rows if r["cluster"]}
    off = {r["phase"]: r for r in rows if not r["cluster"]}
    storm_on, storm_off = on["storm"], off["storm"]
    saved = storm_off["origin_bytes"] / max(storm_on["origin_bytes"], 1)
    faster = storm_on["GBps"] / max(storm_off["GBps"], 1e-9)
    print(
        f"\nstorm: the origin served {saved:.1f}x less with [cluster];"
        f" clients got {faster:.2f}x the GB/s"
    )
    for name in ("epoch 2",):
        hits_on = on[name]["sources"].get("HIT", 0) + on[name]["sources"].get("PEER", 0)
        hits_off = off[name]["sources"].get("HIT", 0)
        total = max(on[name]["requests"], 1)
        print(
            f"{name}: served from the cluster's caches {hits_on / total:.0%} with [cluster],"
            f" from the node's own cache {hits_off / max(off[name]['requests'], 1):.0%} alone"
        )


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster", description=__doc__)
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--clients-per-node", type=int, default=4)
    parser.add_argument("--latency", default="10ms", help="one way, to the origin")
    parser.add_argument("--bandwidth", default="1Gbit", help="of the WAN link to the origin")
    parser.add_argument("--ckpt-files", type=int, default=4)
    parser.add_argument("--ckpt-size", type=parse_size, default=parse_size("64MiB"))
    parser.add_argument("--dataset-files", type=int, default=96)
    parser.add_argument("--shard-size", type=parse_size, default=parse_size("4MiB"))
    parser.add_argument("--cache-size", default="4GiB")
    parser.add_argument("--quick", action="store_true", help="a quarter of the bytes")
    args = parser.parse_args()
    if args.quick:
        args.ckpt_size //= 4
        args.dataset_files //= 4
    latency = parse_duration(args.latency)
    with tempfile.TemporaryDirectory(prefix="lota-bench-cluster-") as tmp:
        async with EmbeddedOrigin(
            latency=latency, bandwidth=parse_bandwidth(args.bandwidth)
        ) as origin:
            await asyncio.to_thread(origin_client(origin).create_bucket, Bucket=BUCKET)
            context = multiprocessing.get_context("spawn")
            with ProcessPoolExecutor(1, mp_context=context) as pool:
                rows = await mode(pool, origin, Path(tmp), True, args)
                rows += await mode(pool, origin, Path(tmp), False, args)
    report(rows, args)
    print(f"\nsaved {save('cluster', {'args': vars(args), 'phases': rows})}")


if __name__ == "__main__":
    stop_on_sigterm()
    asyncio.run(main())
