"""`make demo`: LOTA in front of a far-away S3 origin, end to end, in about a minute.

Starts an embedded S3 origin (moto) behind an emulated WAN link (10 ms each way, 1 Gbit/s
by default), starts a LOTA node with a cache in front of it, and drives an ML-style
workload with boto3: upload a dataset, read it twice (epoch 1 misses, epoch 2 hits),
read a parquet-style footer, restore a checkpoint with 8 readers at once, save a checkpoint
into a bucket homed in a far region (30 ms, 100 Mbit/s away) at local speed, and shows what
LOTA did. Nothing to install by hand; everything stops at the end.

    python -m bench.demo [--latency 10ms] [--bandwidth 1Gbit] [--quick]

Every figure comes with what it means: ratios against reading or writing the origin
directly, measured in the same run (``--quick``: objects a quarter of the size, for tests).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

from bench.common import FAR_BUCKET, Setup, lota_with_origin, origin_client, stop_on_sigterm, table
from lota.config import parse_duration
from lota.embedded import EmbeddedOrigin
from lota.testing.wan import parse_bandwidth

MiB = 1024 * 1024
SMALL = 64 * 1024  # the smallest shards: under the lifecycle rule's min_size (128 KiB)


def say(text: str) -> None:
    print(f"\n== {text}", flush=True)


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - started


def read(s3: Any, bucket: str, key: str, **kw: Any) -> tuple[bytes, str]:
    got = s3.get_object(Bucket=bucket, Key=key, **kw)
    return got["Body"].read(), got["ResponseMetadata"]["HTTPHeaders"].get("x-lota-cache", "-")


def ratio(slow: float, fast: float) -> str:
    return f"{slow / fast:.1f}x" if fast > 0 else "inf x"


def cross_region(setup: Setup, scale: int) -> None:
    """A checkpoint saved into a bucket homed in a far region (30 ms, 100 Mbit/s away)."""
    assert setup.far is not None
    s3, far = setup.client(), origin_client(setup.far)
    ckpt = os.urandom(32 * MiB // scale)
    say(
        f"cross-region write: a {len(ckpt) / MiB:g} MiB checkpoint into {FAR_BUCKET} "
        "(homed in eu-west)"
    )
    _, direct = timed(far.put_object, Bucket=FAR_BUCKET, Key="direct.pt", Body=ckpt)
    _, accelerated = timed(s3.put_object, Bucket=FAR_BUCKET, Key="step-2000.pt", Body=ckpt)
    (body, _), took = timed(read, s3, FAR_BUCKET, "step-2000.pt")
    assert body == ckpt
    print(
        table(
            ["write", "acknowledged after"],
            [
                ["straight to eu-west", f"{direct:.2f}s"],
                ["through LOTA (staged here, committed to the catalog)", f"{accelerated:.2f}s"],
            ],
        )
    )
    print(
        f"  acknowledged {ratio(direct, accelerated)} sooner through LOTA than straight to eu-west"
    )
    print(f"  readable at once through LOTA ({took * 1000:.0f} ms); migrating in the background...")
    started = time.perf_counter()
    while True:
        try:
            far.head_object(Bucket=FAR_BUCKET, Key="step-2000.pt")
            break
        except far.exceptions.ClientError:
            time.sleep(0.2)
    print(
        f"  landed in eu-west {time.perf_counter() - started:.1f}s later, same ETag:",
        far.head_object(Bucket=FAR_BUCKET, Key="step-2000.pt")["ETag"],
    )


def lifecycle_plan(setup: Setup) -> None:
    """What access-based tiering would do to the dataset 45 and 90 days from now."""
    config = setup.workdir / "lota.toml"
    for days in (45, 90):
        when = datetime.now(UTC) + timedelta(days=days)
        say(f"lota lifecycle plan, {days} days from now (nobody reads the dataset meanwhile)")
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "lota",
                "lifecycle",
                "plan",
                "--config",
                str(config),
                "--now",
                when.strftime("%Y-%m-%dT%H:%M:%SZ"),
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        print("\n".join(f"  {line}" for line in done.stdout.splitlines()))
        if done.returncode:
            print(done.stderr[-2000:])
    print(
        f"  not in the plan: the {SMALL // 1024} KiB shards (train-000, train-004); objects under "
        "a rule's min_size (128 KiB by default) never move, since a transition of a small "
        "object costs more than keeping it hot"
    )


def workload(setup: Setup, scale: int) -> None:
    """The demo's steps; objects are divided by `scale` (--quick: 4)."""
    s3, direct = setup.client(), setup.client(direct=True)
    say(f"LOTA {setup.node.url} in front of origin {setup.origin.endpoint} (emulated WAN)")
    s3.create_bucket(Bucket="datasets")
    shards = {
        f"imagenet/train-{i:03d}.tar": os.urandom(size)
        for i, size in enumerate([SMALL, 1 * MiB // scale, 4 * MiB // scale, 24 * MiB // scale] * 2)
    }
    _, took = timed(
        lambda: [s3.put_object(Bucket="datasets", Key=k, Body=v) for k, v in shards.items()]
    )
    say(
        f"uploaded {len(shards)} shards ({sum(map(len, shards.values())) / MiB:.1f} MiB)"
        f" through LOTA in {took:.2f}s"
    )

    rows, times = [], []
    for epoch in (1, 2):
        sources: dict[str, int] = {}
        started = time.perf_counter()
        for key, data in shards.items():
            body, source = read(s3, "datasets", key)
            assert body == data, f"wrong bytes for {key}"
            sources[source] = sources.get(source, 0) + 1
        times.append(time.perf_counter() - started)
        rows.append(
            [
                f"epoch {epoch} via LOTA",
                f"{times[-1]:.3f}s",
                ", ".join(f"{v} {k}" for k, v in sources.items()),
            ]
        )
    started = time.perf_counter()
    for key in shards:
        direct.get_object(Bucket="datasets", Key=key)["Body"].read()
    origin_time = time.perf_counter() - started
    rows.append(["epoch read from the origin directly", f"{origin_time:.3f}s", "-"])
    say("dataset epochs (every byte checked)")
    print(table(["read", "time", "x-lota-cache"], rows))
    print(
        f"  epoch 2 from the cache: {ratio(times[0], times[1])} faster than epoch 1, "
        f"{ratio(origin_time, times[1])} faster than reading the origin directly"
    )
    print(
        f"  epoch 1 (cold, filling the cache) took {ratio(times[0], origin_time)} "
        "the time of a direct read"
    )

    key = "imagenet/train-003.tar"
    (footer, source), took = timed(read, s3, "datasets", key, Range="bytes=-65536")
    assert footer == shards[key][-65536:]
    say(f"parquet-style footer read (last 64 KiB): {took * 1000:.1f} ms, {source}")

    ckpt = os.urandom(64 * MiB // scale)
    size = f"{len(ckpt) / MiB:g} MiB"
    say(f"checkpoint restore: 8 readers of one cold {size} checkpoint at once")
    s3.create_bucket(Bucket="ckpt")
    s3.put_object(Bucket="ckpt", Key="run-1/step-1000.safetensors", Body=ckpt)
    name = "run-1/step-1000.safetensors"
    with ThreadPoolExecutor(8) as pool:
        started = time.perf_counter()
        same = list(
            pool.map(
                lambda _: direct.get_object(Bucket="ckpt", Key=name)["Body"].read() == ckpt,
                range(8),
            )
        )
        baseline = time.perf_counter() - started
        before = origin_bytes(setup)
        started = time.perf_counter()
        same += list(pool.map(lambda _: read(s3, "ckpt", name)[0] == ckpt, range(8)))
        through = time.perf_counter() - started
    fetched = origin_bytes(setup) - before
    print(
        table(
            ["8 readers at once", "time", "origin bytes"],
            [
                ["from the origin directly", f"{baseline:.2f}s", f"{8 * len(ckpt) / MiB:g} MiB"],
                ["through LOTA, cold", f"{through:.2f}s", f"{fetched / MiB:g} MiB"],
            ],
        )
    )
    print(
        f"  every reader got identical bytes: {all(same)}; LOTA read the origin "
        f"{fetched / len(ckpt):.1f} times for 8 readers ({ratio(baseline, through)} the speed "
        "of 8 direct reads)"
    )

    cross_region(setup, scale)
    lifecycle_plan(setup)

    metrics = setup.node.metrics()
    say("what LOTA counted (/_lota/metrics; bytes in MiB)")
    for name in (
        "lota_cache_requests_total",
        "lota_cache_coalesced_total",
        "lota_cache_fill_bytes_total",
        "lota_cache_bytes_used",
        "lota_origin_bytes_in_total",
    ):
        for line in metrics.splitlines():
            if line.startswith(name):
                series, value = line.rsplit(" ", 1)
                number = float(value) / (MiB if "bytes" in name else 1)
                print(f"  {series} {number:.1f}" if "bytes" in name else f"  {series} {number:g}")


def origin_bytes(setup: Setup) -> float:
    """What the node has read from the origin so far (lota_origin_bytes_in_total)."""
    found = re.findall(r"^lota_origin_bytes_in_total\{[^}]*\} (\S+)$", setup.node.metrics(), re.M)
    return sum(float(v) for v in found)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", default="10ms", help="one-way latency to the origin")
    parser.add_argument("--bandwidth", default="1Gbit", help="origin link bandwidth")
    parser.add_argument("--quick", action="store_true", help="objects a quarter of the size")
    args = parser.parse_args()
    async with (
        EmbeddedOrigin(latency=0.030, bandwidth=12.5e6) as far,
        lota_with_origin(
            latency=parse_duration(args.latency),
            bandwidth=parse_bandwidth(args.bandwidth),
            far=far,
        ) as setup,
    ):
        await asyncio.to_thread(workload, setup, 4 if args.quick else 1)
    say("done: origin and LOTA stopped")


if __name__ == "__main__":
    stop_on_sigterm()
    asyncio.run(main())
