"""The two-region harness of the write-acceleration tests: two moto servers (regions A
and B) behind recording proxies, two LOTA nodes (one per region) sharing one catalog,
SQLite or a real PostgreSQL."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from lota.catalog import CatalogObject, open_catalog
from lota.clock import Clock
from lota.embedded import moto_servers
from lota.testing.processes import LotaProcess
from tests.recorder import RecordingProxy, recording_proxy

MiB = 1024 * 1024
FAR = "far-bucket"  # homed in eu-west (region B)
STAGING_A = "lota-staging-a"
STAGING_B = "lota-staging-b"


def _direct(endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="lota-origin",
        aws_secret_access_key="lota-origin-secret",
        region_name="us-east-1",
    )


@dataclass
class TwoRegions:
    a: LotaProcess  # node in us-east (region A)
    b: LotaProcess  # node in eu-west (region B), the far bucket's home
    origin_a: Any
    origin_b: Any
    link_b: RecordingProxy  # region B's origin, as both nodes reach it
    start: Callable[[str], LotaProcess]
    link_a: RecordingProxy  # region A's origin (staging A), as both nodes reach it
    catalog: str = ""  # the shared catalog's URL, to read it as an observer

    def catalog_rows(self, keys: list[str]) -> list[CatalogObject | None]:
        async def read() -> list[CatalogObject | None]:
            catalog = await open_catalog(self.catalog, clock=Clock(), node="test")
            try:
                return [await catalog.get_object(FAR, key) for key in keys]
            finally:
                await catalog.close()

        return asyncio.run(read())

    def wait_migrated(self, key: str, timeout: float = 30.0) -> bytes:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                return bytes(self.origin_b.get_object(Bucket=FAR, Key=key)["Body"].read())
            except self.origin_b.exceptions.NoSuchKey:
                time.sleep(0.2)
        logs = "\n".join(n.log_tail(15) for n in (self.a, self.b))
        raise AssertionError(f"{key} did not reach region B in {timeout}s; logs:\n{logs}")

    def staging_keys(self) -> list[str]:
        listing = self.origin_a.list_objects_v2(Bucket=STAGING_A)
        return [o["Key"] for o in listing.get("Contents", [])]


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_for_regions(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/catalog.db"
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def regions(
    catalog_for_regions: str, credentials_file: Path, tmp_path: Path
) -> Iterator[TwoRegions]:
    with (
        moto_servers(2) as (endpoint_a, endpoint_b),
        recording_proxy(endpoint_a) as link_a,
        recording_proxy(endpoint_b) as link_b,
    ):
        origin_a, origin_b = _direct(endpoint_a), _direct(endpoint_b)
        origin_a.create_bucket(Bucket=STAGING_A)
        origin_b.create_bucket(Bucket=STAGING_B)
        origin_b.create_bucket(Bucket=FAR)
        origin_a.create_bucket(Bucket="near-bucket")
        nodes: list[LotaProcess] = []
        ports: dict[str, int] = {}

        def spawn(region: str) -> LotaProcess:
            config = tmp_path / f"{region}.toml"
            config.write_text(
                f'region = "{region}"\nnode = "node-{region}"\n'
                f'[cache]\ndirs = ["{tmp_path}/cache-{region}"]\nsize = "1GiB"\n'
                f'[auth]\nmode = "sigv4"\ncredentials = "{credentials_file}"\n'
                f'[catalog]\nurl = "{catalog_for_regions}"\n'
                '[write]\nstaging_grace = "0s"\nlease = "3s"\n'
                f'[regions.us-east]\nendpoint = "{link_a.url}"\nstaging_bucket = "{STAGING_A}"\n'
                f'[regions.eu-west]\nendpoint = "{link_b.url}"\nstaging_bucket = "{STAGING_B}"\n'
                f'[buckets]\ndefault_region = "us-east"\n"{FAR}" = "eu-west"\n'
            )
            node = LotaProcess(["--config", str(config)], log_path=tmp_path / f"{region}.log")
            if region in ports:
                node.port = ports[region]
                node.url = f"http://127.0.0.1:{node.port}"
                node.args = ["--listen", f"127.0.0.1:{node.port}", "--config", str(config)]
            ports[region] = node.port
            nodes.append(node.spawn())
            return node

        def start(region: str) -> LotaProcess:
            return spawn(region).wait_ready()

        try:
            a, b = spawn("us-east"), spawn("eu-west")
            a.wait_ready(), b.wait_ready()
            yield TwoRegions(a, b, origin_a, origin_b, link_b, start, link_a, catalog_for_regions)
        finally:
            for node in nodes:
                node.kill()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0
