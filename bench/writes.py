"""Cross-region write acceleration: acknowledged-PUT latency, far origin vs LOTA, and
reading a just-saved checkpoint back.

Region B's origin sits behind an emulated WAN link (30 ms one way, 100 Mbit/s: a single
stream across regions); region A's origin (the staging bucket) is on this machine. The
script PUTs one object straight to region B, then the same size through a LOTA node in
region A (with a cache) into a bucket homed in B, and prints how long each took to be
acknowledged. Right after the acknowledgement, while the migrator copies it home, it reads
the object back through the writing node (kept in its cache as it was written: a HIT) and
reads its staged copy straight from the staging bucket (what a read through LOTA cost
before writes were cached), and prints both; then how long the migrator took to land it
in B.

    python -m bench.writes [--size 256MiB] [--latency 30ms] [--bandwidth 100Mbit] [--no-cache]
                           [--staging-latency 1ms --staging-bandwidth 1Gbit]

``--no-cache`` runs the node without a cache: what keeping the written object costs the
acknowledgement, and the read back as it was before (from staging). By default the staging
bucket is a moto on this machine, read at memory speed; ``--staging-latency`` and
``--staging-bandwidth`` put it behind a link of its own, as a region's object store is.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig

from bench.common import save, stop_on_sigterm, table
from lota.config import parse_duration, parse_size
from lota.embedded import EmbeddedOrigin
from lota.testing.credentials import PRINCIPALS, write_credentials
from lota.testing.processes import LotaProcess
from lota.testing.wan import parse_bandwidth

# One stream, as the brief measures it (a single PUT; no parallel multipart).
SINGLE = TransferConfig(multipart_threshold=1 << 40, max_concurrency=1)


class Pattern:
    """`size` bytes of a repeating pattern, read like a file, without holding them."""

    def __init__(self, size: int) -> None:
        self.size, self.pos = size, 0
        self.block = bytes(range(256)) * 4096

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n < 0 else min(n, self.size - self.pos)
        out = (self.block * (n // len(self.block) + 1))[:n]
        self.pos += n
        return out

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.size + pos if whence == 2 else self.pos + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def close(self) -> None:
        pass


def client(endpoint: str, key: str, secret: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
    )


def timed_put(s3: Any, bucket: str, key: str, size: int) -> float:
    started = time.perf_counter()
    s3.upload_fileobj(Pattern(size), bucket, key, Config=SINGLE)
    return time.perf_counter() - started


def run(
    a: EmbeddedOrigin, b: EmbeddedOrigin, work: Path, size: int, cache: bool = True
) -> dict[str, float]:
    origin_a = client(a.endpoint, a.access_key_id, a.secret_access_key)
    origin_b = client(b.endpoint, b.access_key_id, b.secret_access_key)
    origin_a.create_bucket(Bucket="staging-a")
    origin_b.create_bucket(Bucket="far")
    credentials = write_credentials(work / "credentials.toml")
    config = work / "a.toml"
    config.write_text(
        'region = "us-east"\n'
        f'[auth]\ncredentials = "{credentials}"\n'
        f'[catalog]\nurl = "sqlite:///{work}/catalog.db"\n'
        + (f'[cache]\ndirs = ["{work}/cache"]\nsize = "2GiB"\n' if cache else "")
        + '[write]\nstaging_grace = "0s"\n'
        f'[regions.us-east]\nendpoint = "{a.endpoint}"\nstaging_bucket = "staging-a"\n'
        f'[regions.eu-west]\nendpoint = "{b.endpoint}"\n'
        '[buckets]\n"far" = "eu-west"\n'
    )
    node = LotaProcess(["--config", str(config)], log_path=work / "lota.log").start()
    try:
        direct = timed_put(origin_b, "far", "direct.bin", size)
        key, secret, _ = PRINCIPALS["admin"]
        lota = client(node.url, key, secret)
        accelerated = timed_put(lota, "far", "through-lota.bin", size)
        landed = time.perf_counter()
        read_back, source = timed_get(lota, "far", "through-lota.bin", size)
        [staged] = origin_a.list_objects_v2(Bucket="staging-a")["Contents"]
        from_staging, _ = timed_get(origin_a, "staging-a", staged["Key"], size)
        while True:
            try:
                origin_b.head_object(Bucket="far", Key="through-lota.bin")
                break
            except origin_b.exceptions.ClientError:
                time.sleep(0.2)
        migration = time.perf_counter() - landed
    finally:
        node.stop()
    return {
        "direct": direct,
        "lota": accelerated,
        "read_back": read_back,
        "read_back_hit": float(source == "HIT"),
        "read_from_staging": from_staging,
        "migration_after_ack": migration,
    }


def timed_get(s3: Any, bucket: str, key: str, size: int) -> tuple[float, str]:
    """Seconds to read the whole object, and where LOTA said it came from."""
    started = time.perf_counter()
    got = s3.get_object(Bucket=bucket, Key=key)
    count = sum(len(piece) for piece in got["Body"].iter_chunks(1 << 20))
    elapsed = time.perf_counter() - started
    assert count == size, (count, size)
    return elapsed, str(got["ResponseMetadata"]["HTTPHeaders"].get("x-lota-cache", "-"))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size", default="256MiB")
    parser.add_argument("--latency", default="30ms", help="region B one-way latency")
    parser.add_argument("--bandwidth", default="100Mbit", help="region B single-stream cap")
    parser.add_argument("--no-cache", action="store_true", help="the node without a cache")
    parser.add_argument("--staging-latency", default="0", help="region A one-way latency")
    parser.add_argument("--staging-bandwidth", default="", help="region A single-stream cap")
    args = parser.parse_args()
    size = parse_size(args.size)
    latency, bandwidth = parse_duration(args.latency), parse_bandwidth(args.bandwidth)
    with tempfile.TemporaryDirectory(prefix="lota-bench-writes-") as tmp:
        near_bandwidth = parse_bandwidth(args.staging_bandwidth) if args.staging_bandwidth else None
        async with (
            EmbeddedOrigin(
                latency=parse_duration(args.staging_latency), bandwidth=near_bandwidth
            ) as a,
            EmbeddedOrigin(latency=latency, bandwidth=bandwidth) as b,
        ):
            result = await asyncio.to_thread(run, a, b, Path(tmp), size, not args.no_cache)
    mib = size / 2**20
    print(
        f"\nAcknowledged PUT of {mib:.0f} MiB into a bucket homed in region B "
        f"({args.latency} one way, {args.bandwidth}); staging bucket in region A "
        f"({args.staging_latency} one way, {args.staging_bandwidth or 'no cap'}):\n"
    )
    print(
        table(
            ["path", "ack latency (s)", "MB/s"],
            [
                ["straight to region B", result["direct"], size / result["direct"] / 1e6],
                ["through LOTA in region A", result["lota"], size / result["lota"] / 1e6],
            ],
        )
    )
    print(
        f"\nLOTA acknowledged {result['direct'] / result['lota']:.1f}x sooner; the migrator "
        f"landed it in region B {result['migration_after_ack']:.1f}s after the ack.\n"
    )
    print(
        table(
            ["read of the just-saved object, while it migrates", "latency (s)", "MB/s"],
            [
                [
                    "through the writing node ("
                    + ("HIT" if result["read_back_hit"] else "no cache: from staging")
                    + ")",
                    result["read_back"],
                    size / result["read_back"] / 1e6,
                ],
                [
                    "its staged copy, from the staging bucket",
                    result["read_from_staging"],
                    size / result["read_from_staging"] / 1e6,
                ],
            ],
        )
    )
    print(
        f"\nThe read back through the writing node took "
        f"{result['read_back'] / result['read_from_staging']:.2f}x the time of the read "
        "from staging."
    )
    save("writes", {"size": size, "latency": latency, "bandwidth": bandwidth, **result})


if __name__ == "__main__":
    stop_on_sigterm()
    asyncio.run(main())
