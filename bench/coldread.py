"""A cold read of a large object through LOTA against one direct stream from the origin.

The origin is :mod:`bench.origin` (files sent with sendfile, ranges, keep-alive) behind
the emulated WAN: ``--latency`` one way and ``--bandwidth`` per connection, as a TCP
window bounds one stream over a long link (1 MiB of window at 10 ms is ~100 MB/s). One
LOTA node with a cache and SigV4 in front of it; ``curl`` reads, its output checked by
``cksum`` (CRC-32 and length, ~4 GB/s here: ``sha256sum``'s 0.35 GB/s took a core from
the reads it checked and set the pace of a hit), in their own processes. For each run: a
direct read (one stream, as a client without LOTA gets), a cold read through LOTA (its
chunks fetched ``fill_concurrency`` at a time while the client streams in order), then a
hit.
Printed: seconds, GB/s, whether the bytes are right, and the bytes the origin sent LOTA
against the object's size.

    python -m bench.coldread                      # 1 GiB, ~1 minute
    python -m bench.coldread --size 256MiB --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import presigned_urls, save, stop_on_sigterm, table
from bench.origin import FileOrigin
from lota.config import parse_duration, parse_size
from lota.testing.credentials import write_credentials
from lota.testing.processes import LotaProcess
from lota.testing.wan import WanLink, parse_bandwidth

MiB = 1024 * 1024
BUCKET = "bench-cold"


def write_object(root: Path, size: int) -> tuple[str, str]:
    """A file of `size` random-looking bytes; (key, its ``cksum``)."""
    path = root / BUCKET / "big.bin"
    path.parent.mkdir(parents=True)
    block = os.urandom(16 * MiB)
    with path.open("wb") as f:
        left = size
        while left:
            piece = block[: min(left, len(block))]
            f.write(piece)
            left -= len(piece)
    with path.open("rb") as f:
        out = subprocess.run(["cksum"], stdin=f, capture_output=True, check=True).stdout
    return "big.bin", out.decode().strip()


async def curl(url: str) -> tuple[float, str]:
    """Seconds to read `url` whole, and the ``cksum`` (CRC and length) of what came."""
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_shell(
        f"curl -sf '{url}' | cksum", stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    return time.perf_counter() - started, out.decode().strip()


def origin_bytes(node: LotaProcess) -> float:
    found = re.search(r"^lota_origin_bytes_in_total\{[^}]*\} (\S+)$", node.metrics(), re.M)
    return float(found.group(1)) if found else 0.0


async def run(args: argparse.Namespace, work: Path, wan: WanLink) -> Any:
    key, expected = args.key, args.cksum
    rows = []
    for attempt in range(args.runs):
        cache = work / f"cache-{attempt}"  # a cold cache each run
        config = work / f"lota-{attempt}.toml"
        credentials = write_credentials(work / "credentials.toml")
        config.write_text(
            f'[cache]\ndirs = ["{cache}"]\nsize = "{args.size * 2}"\n'
            f"fill_concurrency = {args.fill_concurrency}\n"
            f'[auth]\ncredentials = "{credentials}"\n'
            f'[regions.us-east]\nendpoint = "{wan.endpoint}"\n'
        )
        node = LotaProcess(["--config", str(config)], log_path=work / "lota.log")
        node.spawn()
        try:  # readiness in a thread: the WAN link runs on this loop, and it checks the origin
            await asyncio.to_thread(node.wait_ready)
            direct = await curl(f"{wan.endpoint}/{BUCKET}/{key}")
            url = presigned_urls(node.url, BUCKET, [key])[0]
            cold = await curl(url)
            fetched = await asyncio.to_thread(origin_bytes, node)
            hit = await curl(url)
        finally:
            node.stop()
        for name, (seconds, digest) in (("direct", direct), ("cold", cold), ("hit", hit)):
            rows.append(
                {
                    "run": attempt,
                    "read": name,
                    "seconds": seconds,
                    "GBps": args.size / seconds / 1e9,
                    "correct": digest == expected,
                }
            )
        rows[-2]["origin_bytes_over_size"] = fetched / args.size
        print(
            f"run {attempt}: direct {direct[0]:.2f} s, cold {cold[0]:.2f} s "
            f"({cold[0] / direct[0]:.2f}x), hit {hit[0]:.2f} s; origin sent "
            f"{fetched / args.size:.3f}x the object",
            flush=True,
        )
    return rows


async def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.coldread", description=__doc__)
    parser.add_argument("--size", type=parse_size, default=parse_size("1GiB"))
    parser.add_argument("--latency", default="10ms", help="one way")
    parser.add_argument("--bandwidth", default="100MB/s", help="per connection (its window)")
    parser.add_argument("--fill-concurrency", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="lota-bench-cold-") as tmp:
        work = Path(tmp)
        root = work / "origin"
        args.key, args.cksum = write_object(root, args.size)
        with FileOrigin(root) as origin:
            link = WanLink(
                "127.0.0.1",
                origin.port,
                latency=parse_duration(args.latency),
                bandwidth=parse_bandwidth(args.bandwidth),
            )
            async with link as wan:
                rows = await run(args, work, wan)
    print()
    print(
        f"{args.size // MiB} MiB object, origin {args.latency} one way, {args.bandwidth} per"
        f" connection, fill_concurrency {args.fill_concurrency}"
    )
    print(
        table(
            ["run", "read", "seconds", "GB/s", "bytes right", "origin bytes / size"],
            [
                [
                    r["run"],
                    r["read"],
                    r["seconds"],
                    r["GBps"],
                    "yes" if r["correct"] else "NO",
                    r.get("origin_bytes_over_size", ""),
                ]
                for r in rows
            ],
        )
    )
    args.size = int(args.size)
    print(f"\nsaved {save('coldread', {'args': vars(args), 'rows': rows})}")


if __name__ == "__main__":
    stop_on_sigterm()
    asyncio.run(main())
