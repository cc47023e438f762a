"""GET latency through LOTA (HIT, MISS) and straight to the origin, by size and concurrency.

One LOTA node (SigV4 auth, cache on) in front of an embedded origin behind an emulated WAN
(``--latency`` one way, 10 ms by default). For each object size (64 KiB and 4 MiB) and
each concurrency (1, 16, 64) it measures:

- HIT: GETs of objects pre-warmed through LOTA;
- MISS: every GET is for a distinct object that was created at the origin directly and
  never read, so LOTA fetches it from the origin (through the WAN);
- HIT signed: the same objects, each request signed afresh (see below);
- ORIGIN DIRECT: GETs straight to the origin's WAN endpoint, no LOTA.

The load generator (:mod:`bench.loadgen`, a lean keep-alive HTTP/1.1 client on uvloop)
runs in a separate process. HIT, MISS and ORIGIN DIRECT send presigned SigV4 URLs made
once per object before timing; LOTA authenticates every request, and for a URL it has
verified before it reuses the verdict while the signature is valid. HIT signed sends
requests each signed afresh in an Authorization header (no two alike), so every one is
verified from scratch. Each cell starts with an untimed warm-up that opens the
connections and sends each hot URL once. Latency is from sending the request to having
read the whole body.

Caveat: this is one 2-core machine. The load generator, LOTA, the WAN emulator (in this
script's own process) and moto share the cores; the numbers are a floor, not a ceiling.

    python -m bench.latency                           # ~3 minutes
    python -m bench.latency --hit 200 --miss 30 --direct 30 --concurrency 1,16   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from bench.common import Setup, lota_with_origin, percentiles, save, stop_on_sigterm, table
from bench.loadgen import LoadClient, Request, get_request
from bench.payload import human, load_average, parse_size
from lota.auth.sigv4 import UNSIGNED_PAYLOAD, sign_headers
from lota.config import parse_duration
from lota.testing.credentials import PRINCIPALS

BUCKET = "latency-bench"
KINDS = ("HIT", "HIT signed", "MISS", "ORIGIN DIRECT")


# -- the load generator (runs in a child process) ------------------------------------------


def run_cell(
    warm: list[Request], timed: list[Request], concurrency: int, size: int
) -> dict[str, Any]:
    """Send `warm` untimed (it opens the connections), then every request in `timed`,
    `concurrency` at a time."""
    import uvloop

    return uvloop.run(_cell(warm, timed, concurrency, size))


async def _cell(
    warm: list[Request], timed: list[Request], concurrency: int, size: int
) -> dict[str, Any]:
    client = LoadClient(concurrency)
    try:
        await client.run(warm)
        out = await client.run(timed, expect_size=size)
    finally:
        client.close()
    return {
        "samples": out.samples,
        "wall_s": out.wall_s,
        "client_cpu_s": out.client_cpu_s,
        "client_wait_s": out.client_wait_s,
        "sources": dict(out.sources),
        "errors": dict(out.errors),
    }


# -- set-up and orchestration --------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def presigner(endpoint: str, key: str, secret: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(signature_version="s3v4", max_pool_connections=16),
    )


def presign(client: Any, key: str) -> str:
    return str(
        client.generate_presigned_url(
            "get_object", Params={"Bucket": BUCKET, "Key": key}, ExpiresIn=3600
        )
    )


def requests_for(args: argparse.Namespace, kind: str, size: int) -> int:
    count: int = {"HIT": args.hit, "MISS": args.miss, "ORIGIN DIRECT": args.direct}.get(
        kind, args.hit
    )
    return max(1, round(count * (args.large_scale if size > 1024 * 1024 else 1)))


def prepare(setup: Setup, args: argparse.Namespace) -> dict[int, Any]:
    """Create hot and cold objects at the origin (bypassing the WAN), warm the hot ones."""
    origin = setup.origin
    moto = presigner(origin.direct_endpoint, origin.access_key_id, origin.secret_access_key)
    key, secret, _ = PRINCIPALS["admin"]
    lota = presigner(setup.node.url, key, secret)
    wan = presigner(origin.endpoint, origin.access_key_id, origin.secret_access_key)
    moto.create_bucket(Bucket=BUCKET)
    plan: dict[int, Any] = {}
    puts: list[tuple[str, bytes]] = []
    for size in args.sizes:
        body = os.urandom(size)
        hot = [f"hot/{size}/{i}" for i in range(args.hot_objects)]
        cold = {
            c: [f"cold/{size}/c{c}/{i}" for i in range(requests_for(args, "MISS", size))]
            for c in args.concurrency
        }
        puts += [(k, body) for k in hot + [k for keys in cold.values() for k in keys]]
        plan[size] = {
            "hot_keys": hot,
            "hot": [presign(lota, k) for k in hot],
            "direct": [presign(wan, k) for k in hot],
            "cold": {c: [presign(lota, k) for k in keys] for c, keys in cold.items()},
        }
    print(f"creating {len(puts)} objects at the origin", flush=True)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda kv: moto.put_object(Bucket=BUCKET, Key=kv[0], Body=kv[1]), puts))
        warm_keys = [f"hot/{size}/{i}" for size in args.sizes for i in range(args.hot_objects)]
        list(pool.map(lambda k: lota.get_object(Bucket=BUCKET, Key=k)["Body"].read(), warm_keys))
    check = lota.get_object(Bucket=BUCKET, Key=warm_keys[0])
    source = check["ResponseMetadata"]["HTTPHeaders"].get("x-lota-cache")
    print(f"warmed {len(warm_keys)} hot objects through LOTA (re-read: {source})", flush=True)
    return plan


def cell_requests(
    setup: Setup,
    plan: dict[int, Any],
    args: argparse.Namespace,
    kind: str,
    size: int,
    concurrency: int,
) -> tuple[list[Request], list[Request]]:
    """(warm-up requests, timed requests) of one cell."""
    count = requests_for(args, kind, size)
    hot = [get_request(u) for u in plan[size]["hot"]]
    direct = [get_request(u) for u in plan[size]["direct"]]
    # Every URL once (so each presigned URL's first verification is not timed: that cost
    # is what "HIT signed" measures), and at least two requests per connection.
    warm_count = max(2 * concurrency, len(hot))
    if kind == "HIT":
        return _cycle(hot, warm_count), _cycle(hot, count)
    if kind == "HIT signed":
        return _cycle(hot, warm_count), header_signed(setup.node.url, plan[size]["hot_keys"], count)
    if kind == "MISS":
        cold = [get_request(u) for u in plan[size]["cold"][concurrency][:count]]
        return _cycle(hot, warm_count), cold
    return _cycle(direct, warm_count), _cycle(direct, count)


def header_signed(endpoint: str, keys: list[str], count: int) -> list[Request]:
    """`count` GETs of `keys` in turn, each signed in an Authorization header as boto3 does,
    and no two alike: request i is signed i // len(keys) seconds in the past (well inside
    the 15-minute skew), so LOTA verifies every one of them from scratch."""
    access_key, secret, _ = PRINCIPALS["admin"]
    now = datetime.now(UTC)
    requests = []
    for i in range(count):
        url = f"{endpoint}/{BUCKET}/{keys[i % len(keys)]}"
        headers = sign_headers(
            "GET",
            url,
            {},
            access_key_id=access_key,
            secret_access_key=secret,
            region="us-east-1",
            payload_hash=UNSIGNED_PAYLOAD,
            now=now - timedelta(seconds=(i // len(keys)) % 600),
        )
        requests.append(get_request(url, headers))
    return requests


def _cycle(items: list[Request], count: int) -> list[Request]:
    return [items[i % len(items)] for i in range(count)]


async def measure(setup: Setup, args: argparse.Namespace) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    plan = await asyncio.to_thread(prepare, setup, args)
    assert setup.node.proc is not None
    pid = setup.node.proc.pid
    cells = []
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=context) as pool:
        for size in args.sizes:
            for kind in KINDS:
                for concurrency in args.concurrency:
                    warm, timed = cell_requests(setup, plan, args, kind, size, concurrency)
                    cpu = cpu_seconds(pid)
                    out = await loop.run_in_executor(pool, run_cell, warm, timed, concurrency, size)
                    lota_cpu = cpu_seconds(pid) - cpu
                    cell = summarize(kind, size, concurrency, out, lota_cpu)
                    cells.append(cell)
                    print(
                        f"{human(size):>7} {kind:<13} c={concurrency:<3} n={cell['n']:<5}"
                        f" p50={cell['p50']:7.2f} ms p99={cell['p99']:7.2f} ms"
                        f" {cell['req_per_s']:8.0f} req/s  {cell['sources']} {cell['errors']}",
                        flush=True,
                    )
    return cells


def summarize(
    kind: str, size: int, concurrency: int, out: dict[str, Any], lota_cpu: float
) -> dict[str, Any]:
    n = len(out["samples"])
    return {
        "kind": kind,
        "size": size,
        "concurrency": concurrency,
        "n": n,
        **percentiles(out["samples"]),
        "req_per_s": n / out["wall_s"] if out["wall_s"] else 0.0,
        "MB_per_s": n * size / out["wall_s"] / 1e6 if out["wall_s"] else 0.0,
        "lota_cpu_us_per_req": lota_cpu / n * 1e6 if n and kind != "ORIGIN DIRECT" else None,
        "client_cpu_us_per_req": out["client_cpu_s"] / n * 1e6 if n else None,
        "sources": out["sources"],
        "errors": out["errors"],
    }


def report(cells: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    rows = [
        [
            human(c["size"]),
            c["kind"],
            c["concurrency"],
            c["n"],
            c["p50"],
            c["p99"],
            c["p99.9"],
            f"{c['req_per_s']:,.0f}",
            f"{c['MB_per_s']:,.0f}",
            "-" if c["lota_cpu_us_per_req"] is None else f"{c['lota_cpu_us_per_req']:,.0f}",
            sum(c["errors"].values()),
        ]
        for c in cells
    ]
    print(
        f"\n== GET latency, origin {args.latency_s * 1e3:g} ms one way, SigV4 presigned URLs"
        " (load generator, LOTA, WAN emulator and moto share 2 cores)"
    )
    headers = ["size", "source", "conc", "n", "p50 ms", "p99 ms", "p99.9 ms", "req/s"]
    headers += ["MB/s", "LOTA CPU µs/req", "errors"]
    print(table(headers, rows))

    def find(kind: str, size: int, c: int) -> dict[str, Any] | None:
        hits = [x for x in cells if (x["kind"], x["size"], x["concurrency"]) == (kind, size, c)]
        return hits[0] if hits else None

    targets: dict[str, Any] = {}
    hit = find("HIT", 64 * 1024, 16)
    direct = find("ORIGIN DIRECT", 64 * 1024, 16)
    if hit:
        rate = hit["req_per_s"]
        targets["hit_64k_c16_req_per_s"] = rate
        print(
            f"\n64 KiB HIT at c=16: {rate:,.0f} req/s (target >= 3,000:"
            f" {'met' if rate >= 3000 else 'MISSED'})"
        )
    if hit and direct and hit["p99"]:
        ratio = direct["p99"] / hit["p99"]
        targets["p99_direct_over_hit_64k_c16"] = ratio
        print(
            f"p99 origin direct / p99 HIT, 64 KiB c=16: {direct['p99']:.2f} / {hit['p99']:.2f}"
            f" ms = {ratio:.1f}x (target >= 20x: {'met' if ratio >= 20 else 'MISSED'})"
        )
    small = [c for c in cells if c["n"] < 1000]
    if small:
        print("note: p99.9 of cells with fewer than 1,000 requests is their maximum or near it")
    return targets


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", default="10ms", help="one-way latency to the origin")
    parser.add_argument("--sizes", default="64KiB,4MiB")
    parser.add_argument("--concurrency", default="1,16,64")
    parser.add_argument(
        "--hit", type=int, default=10000, help="requests per HIT cell (p99 from >= 100 samples)"
    )
    parser.add_argument("--miss", type=int, default=400, help="requests per MISS cell")
    parser.add_argument("--direct", type=int, default=1000, help="requests per direct cell")
    parser.add_argument(
        "--large-scale", type=float, default=0.25, help="request-count factor for 4 MiB cells"
    )
    parser.add_argument("--hot-objects", type=int, default=64, help="distinct HIT objects")
    args = parser.parse_args()
    args.latency_s = parse_duration(args.latency)
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    started = time.perf_counter()
    load_before = load_average()
    print(load_before, flush=True)
    async with lota_with_origin(latency=args.latency_s) as setup:
        try:
            cells = await measure(setup, args)
        except Exception:
            print("LOTA's log ends with:\n" + setup.node.log_tail(60))
            raise
    targets = report(cells, args)
    load_after = load_average()
    print(load_after)
    meta = {k: v for k, v in vars(args).items()}
    loads = [load_before, load_after]
    path = save("latency", {"args": meta, "cells": cells, "targets": targets, "load": loads})
    print(f"\nsaved {path} ({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    stop_on_sigterm()
    asyncio.run(main())
