"""Shared set-up for benchmarks and the demo: an embedded origin behind an emulated WAN,
LOTA nodes in front of it, and small helpers to measure and print."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import tempfile
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import boto3
from botocore.config import Config as BotoConfig

from lota.embedded import EmbeddedOrigin
from lota.testing.credentials import PRINCIPALS, write_credentials
from lota.testing.processes import LotaProcess

RESULTS = Path(__file__).parent / "results"
FAR_BUCKET = "checkpoints-eu"
STAGING_BUCKET = "lota-staging"


def stop_on_sigterm() -> None:
    """Have SIGTERM (``timeout``, ``kill``) end a bench as Ctrl-C does, by an exception:
    its temporary directories are removed and the servers it started are stopped, where
    the signal's default action would leave ``lota-bench-*`` and them behind."""
    signal.signal(signal.SIGTERM, _terminated)


def _terminated(signum: int, _frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def origin_client(origin: EmbeddedOrigin) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=origin.endpoint,
        aws_access_key_id=origin.access_key_id,
        aws_secret_access_key=origin.secret_access_key,
        region_name="us-east-1",
    )


def _create_buckets(near: EmbeddedOrigin, far: EmbeddedOrigin) -> None:
    origin_client(near).create_bucket(Bucket=STAGING_BUCKET)
    origin_client(far).create_bucket(Bucket=FAR_BUCKET)


@dataclass
class Setup:
    origin: EmbeddedOrigin
    node: LotaProcess
    workdir: Path
    far: EmbeddedOrigin | None = None

    def client(self, direct: bool = False) -> Any:
        if direct:
            return boto3.client(
                "s3",
                endpoint_url=self.origin.endpoint,
                aws_access_key_id=self.origin.access_key_id,
                aws_secret_access_key=self.origin.secret_access_key,
                region_name="us-east-1",
            )
        key, secret, _ = PRINCIPALS["admin"]
        return boto3.client(
            "s3",
            endpoint_url=self.node.url,
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name="us-east-1",
        )


@asynccontextmanager
async def lota_with_origin(
    *,
    latency: float = 0.010,
    bandwidth: float | None = None,
    cache_size: str = "20GiB",
    cache: bool = True,
    auth: str = "sigv4",
    far: EmbeddedOrigin | None = None,
    workers: int = 1,
) -> AsyncIterator[Setup]:
    """An embedded origin `latency` seconds away (one way) and one LOTA node in front of it.

    With `far`, a second region (eu-west) whose origin is `far`: bucket ``FAR_BUCKET`` is
    homed there and writes to it are accelerated (catalog in SQLite, staging bucket
    ``STAGING_BUCKET`` in the first origin). `workers`: the node's worker processes.
    """
    with tempfile.TemporaryDirectory(prefix="lota-bench-") as tmp:
        work = Path(tmp)
        async with EmbeddedOrigin(latency=latency, bandwidth=bandwidth) as origin:
            config = work / "lota.toml"
            lines = []
            if cache:
                lines += [
                    "[cache]",
                    f'dirs = ["{work / "cache"}"]',
                    f'size = "{cache_size}"',
                    'revalidate_after = "1h"',
                ]
            credentials = write_credentials(work / "credentials.toml")
            lines += ["[auth]", f'mode = "{auth}"', f'credentials = "{credentials}"']
            lines += ["[regions.us-east]", f'endpoint = "{origin.endpoint}"']
            if far is not None:
                lines += [f'staging_bucket = "{STAGING_BUCKET}"']
                lines += ["[regions.eu-west]", f'endpoint = "{far.endpoint}"']
                lines += ["[catalog]", f'url = "sqlite:///{work}/catalog.db"']
                lines += ["[write]", 'staging_grace = "0s"']
                lines += ["[buckets]", f'"{FAR_BUCKET}" = "eu-west"']
                lines += ["[lifecycle]", 'interval = "0"', "[[lifecycle.rules]]"]
                lines += ['bucket = "datasets"', 'prefix = "imagenet/"']
                lines += ['transitions = [{ days_since_last_access = 30, tier = "warm" },']
                lines += ['  { days_since_last_access = 60, tier = "archive" }]']
                await asyncio.to_thread(_create_buckets, origin, far)
            config.write_text("\n".join(lines) + "\n")
            env = {"LOTA_WORKERS": str(workers)}
            node = LotaProcess(["--config", str(config)], log_path=work / "lota.log", env=env)
            node.spawn()
            try:  # readiness in a thread: the WAN link runs on this loop; it checks the origin
                await asyncio.to_thread(node.wait_ready)
                yield Setup(origin, node, work, far)
            finally:
                node.stop()


def presigned_urls(endpoint: str, bucket: str, keys: Sequence[str]) -> list[str]:
    """A presigned SigV4 GET per key, through `endpoint`, as the admin principal (2 h)."""
    access, secret, _ = PRINCIPALS["admin"]
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=access,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=BotoConfig(signature_version="s3v4"),
    )
    params = [{"Bucket": bucket, "Key": key} for key in keys]
    return [str(s3.generate_presigned_url("get_object", p, 7200)) for p in params]


def percentiles(samples: Sequence[float]) -> dict[str, float]:
    """p50/p99/p99.9 in milliseconds."""
    ordered = sorted(samples)
    if not ordered:
        return {"p50": 0.0, "p99": 0.0, "p99.9": 0.0}

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {"p50": statistics.median(ordered) * 1000, "p99": at(0.99), "p99.9": at(0.999)}


def write_small_objects(root: Path, bucket: str, count: int, prefix: str = "") -> list[str]:
    """`count` distinct 64 KiB files under ``root/bucket/prefix`` (each a window of one
    random block, so writing them costs no more randomness than one); their keys."""
    folder = root / bucket / prefix
    folder.mkdir(parents=True)
    size = 64 * 1024
    block = os.urandom(size + count)
    keys = []
    for i in range(count):
        name = f"{i:06d}.bin"
        (folder / name).write_bytes(block[i : i + size])
        keys.append(f"{prefix}/{name}" if prefix else name)
    return keys


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table."""

    def fmt(v: Any) -> str:
        return f"{v:,.2f}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def save(name: str, data: Any) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(data, indent=2))
    return path


def peak_rss_mib(pid: int) -> float:
    """Peak resident set size of a process (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0
