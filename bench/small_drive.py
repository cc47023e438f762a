"""Reading through a cache drive smaller than the cache budget (issue #10).

One LOTA node whose only cache dir is a real tmpfs of ``--drive`` bytes, in front of an
embedded origin behind an emulated WAN. It reads ``--total`` bytes of distinct objects
once each, in order, then the last one again, twice: with ``cache.size`` far larger than
the drive (``--size``, the case the issue is about) and with a budget that fits it. It
prints the time of the first pass, the bytes that crossed the WAN from the origin, the
origin GETs, and where the second read of the last object came from (HIT: still cached).

Needs root (it mounts the tmpfs).

    python -m bench.small_drive                     # 500 MB through a 64 MiB drive
    python -m bench.small_drive --total 200MB --latency 0
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import origin_client, stop_on_sigterm, table
from lota.config import parse_duration, parse_size
from lota.embedded import EmbeddedOrigin
from lota.testing.credentials import PRINCIPALS, write_credentials
from lota.testing.processes import LotaProcess
from lota.testing.wan import parse_bandwidth

BUCKET = "small-drive"
OBJECT = 20 * 1000**2


async def run(args: argparse.Namespace, origin: EmbeddedOrigin, size: str) -> list[Any]:
    """One pass through a fresh tmpfs with `size` as the budget: one row of the table."""
    with tempfile.TemporaryDirectory(prefix="lota-small-drive-") as tmp:
        work = Path(tmp)
        drive = work / "drive"
        drive.mkdir()
        mount = ["mount", "-t", "tmpfs", "-o", f"size={args.drive}", "tmpfs", str(drive)]
        subprocess.run(mount, check=True)
        try:
            return await asyncio.to_thread(_measure, args, origin, size, work, drive)
        finally:
            subprocess.run(["umount", "-l", str(drive)], check=False)


def _measure(
    args: argparse.Namespace, origin: EmbeddedOrigin, size: str, work: Path, drive: Path
) -> list[Any]:
    config = work / "lota.toml"
    config.write_text(
        f'[cache]\ndirs = ["{drive}"]\nsize = "{size}"\n'
        f'[auth]\nmode = "sigv4"\ncredentials = "{write_credentials(work / "creds.toml")}"\n'
        f'[regions.us-east]\nendpoint = "{origin.endpoint}"\n'
    )
    node = LotaProcess(["--config", str(config)], log_path=work / "lota.log").start()
    try:
        s3 = _client(node.url)
        keys = [f"k{i}" for i in range(parse_size(args.total) // OBJECT)]
        assert origin.wan is not None
        before, started = origin.wan.bytes_down, time.monotonic()
        for key in keys:
            s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        seconds = time.monotonic() - started
        down = origin.wan.bytes_down - before
        again = s3.get_object(Bucket=BUCKET, Key=keys[-1])
        source = again["ResponseMetadata"]["HTTPHeaders"].get("x-lota-cache", "")
        again["Body"].read()
        gets = _origin_gets(node.metrics())
    finally:
        node.stop()
    return [size, round(seconds, 1), round(down / 1e6), gets, source]


def _client(endpoint: str) -> Any:
    import boto3

    key, secret, _ = PRINCIPALS["admin"]
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
    )


def _origin_gets(metrics: str) -> int:
    return sum(
        int(float(line.split()[-1]))
        for line in metrics.splitlines()
        if line.startswith("lota_origin_requests_total{") and 'method="GET"' in line
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drive", default="64m", help="tmpfs size (mount's size=)")
    parser.add_argument("--size", default="1GiB", help="cache.size larger than the drive")
    parser.add_argument("--fits", default="48MiB", help="cache.size that fits the drive")
    parser.add_argument("--total", default="500MB", help="bytes read, in 20 MB objects")
    parser.add_argument("--latency", default="25ms", help="one-way WAN latency")
    parser.add_argument("--bandwidth", default="1Gbit", help="WAN bandwidth")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench.small_drive mounts a tmpfs: run it as root")
    latency, bandwidth = parse_duration(args.latency), parse_bandwidth(args.bandwidth)
    async with EmbeddedOrigin(latency=latency or 1e-6, bandwidth=bandwidth) as origin:
        s3 = origin_client(origin)
        await asyncio.to_thread(s3.create_bucket, Bucket=BUCKET)
        data = os.urandom(OBJECT)
        for i in range(parse_size(args.total) // OBJECT):
            await asyncio.to_thread(s3.put_object, Bucket=BUCKET, Key=f"k{i}", Body=data)
        rows = [await run(args, origin, size) for size in (args.size, args.fits)]
    print(f"{args.total} through a {args.drive} drive, WAN {args.latency} / {args.bandwidth}:")
    print(table(["cache.size", "seconds", "MB from origin", "origin GETs", "last again"], rows))


if __name__ == "__main__":
    stop_on_sigterm()
    asyncio.run(main())
