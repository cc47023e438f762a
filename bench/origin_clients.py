"""The data path's origin client against aiobotocore: which one a GET through LOTA should use.

The control plane's calls (the migrator's, the lifecycle's) go through aiobotocore for its
retries, paginators and error parsing; the data path (misses, fills, relays) keeps LOTA's
own signed aiohttp client only if it is cheaper. This reads one object from moto (in its
own process, so that this process's CPU time is the client's alone) over and over with
each client and prints wall time and client CPU per request.

    python -m bench.origin_clients [--requests 300] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable

import aiohttp

from bench.common import origin_client, save, stop_on_sigterm, table
from lota.clock import Clock
from lota.config import Config, RegionConfig
from lota.embedded import EmbeddedOrigin
from lota.metrics import Metrics
from lota.regions.control import ControlPlane
from lota.regions.origin import OriginClient

SIZES = {"64 KiB": 64 * 1024, "8 MiB": 8 * 1024 * 1024}
Get = Callable[[str], Awaitable[int]]


async def measure(get: Get, key: str, requests: int, concurrency: int) -> dict[str, float]:
    """p50 wall ms per request, requests per second, and this process's CPU µs each."""
    for _ in range(5):  # connections made, models loaded
        await get(key)
    latencies: list[float] = []
    slots = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with slots:
            started = time.perf_counter()
            await get(key)
            latencies.append(time.perf_counter() - started)

    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one() for _ in range(requests)))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    return {
        "p50_ms": statistics.median(latencies) * 1000,
        "rps": requests / wall,
        "cpu_us": cpu / requests * 1e6,
    }


async def run(origin: EmbeddedOrigin, requests: int, concurrency: int) -> list[list[object]]:
    direct = origin_client(origin)
    direct.create_bucket(Bucket="bench")
    for name, size in SIZES.items():
        direct.put_object(Bucket="bench", Key=name, Body=b"x" * size)
    region = RegionConfig(
        name="r",
        endpoint=origin.endpoint,
        access_key_id=origin.access_key_id,
        secret_access_key=origin.secret_access_key,
    )
    config = Config(region="r", regions={"r": region})
    rows: list[list[object]] = []
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        lean = OriginClient(region, session, Metrics(), Clock())
        control = ControlPlane(config, Metrics())
        botocore = await control.region("r")

        async def get_lean(key: str) -> int:
            async with lean.request("GET", "bench", key) as reply:
                return len(await reply.read())

        async def get_boto(key: str) -> int:
            answer = await botocore.get_object(Bucket="bench", Key=key)
            async with answer["Body"] as body:
                return len(await body.read())

        try:
            for name, size in SIZES.items():
                count = requests if size < 2**20 else max(10, requests // 10)
                for label, get in (("LOTA aiohttp", get_lean), ("aiobotocore", get_boto)):
                    found = await measure(get, name, count, concurrency)
                    rows.append([name, label, found["p50_ms"], found["rps"], found["cpu_us"]])
        finally:
            await control.close()
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    async with EmbeddedOrigin() as origin:
        rows = await run(origin, args.requests, args.concurrency)
    print(f"\nGETs from moto, concurrency {args.concurrency}:\n")
    print(table(["object", "client", "p50 ms", "req/s", "client CPU µs/req"], rows))
    for name in SIZES:
        lean, boto = (row for row in rows if row[0] == name)
        ratio = float(boto[4]) / float(lean[4])  # type: ignore[arg-type]
        print(f"{name}: aiobotocore spent {ratio:.1f}x the client CPU per request of LOTA's")
    save("origin_clients", {"rows": rows})


if __name__ == "__main__":
    stop_on_sigterm()
    asyncio.run(main())
