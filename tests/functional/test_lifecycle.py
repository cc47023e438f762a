"""Lifecycle against a real S3 origin (moto): a bucket of 1,000 objects through 90 simulated
days, two engines (two nodes, one shared catalog: SQLite and PostgreSQL) at every step.

The weekly reads go through a real LOTA node with a cache, started each simulated week with
``LOTA_TIME_OFFSET`` set to that week: after the first week they are cache hits only, and
the node records them in the catalog; the engines decide at those times (``now``).
Every request the engines make to the origin goes through a :class:`RecordingProxy`, so
each CopyObject (a PUT: nothing else PUTs through it) is counted per key.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import aiohttp
import boto3
import pytest
from botocore.config import Config as BotoConfig

from lota.catalog import Catalog, open_catalog
from lota.clock import Clock
from lota.config import Config as LotaConfig
from lota.config import RegionConfig
from lota.embedded import moto_server
from lota.lifecycle.cli import open_engine, plan_command, run_command
from lota.lifecycle.origin import OriginMover
from lota.lifecycle.rules import DAY, Decision
from lota.lifecycle.state import LifecycleState
from lota.metrics import Metrics
from lota.regions.control import ControlPlane
from lota.testing.node import node_config, running_node
from lota.testing.processes import LotaProcess
from tests.recorder import RecordingProxy, recording_proxy

KiB = 1024
MiB = 1024 * KiB
BUCKET = "ckpt"
RUNS, STEPS = 5, 20
HOT = [f"data/hot-{i:04d}" for i in range(300)]  # read every week
COLD = [f"data/cold-{i:04d}" for i in range(296)]  # never read
SMALL = [f"small/{i:04d}" for i in range(200)]  # never read, 1 KiB
CLASS = {"hot": "STANDARD", "warm": "STANDARD_IA", "archive": "DEEP_ARCHIVE"}


def number(key: str) -> int:
    """Each object's metadata `n`; every tenth object is tagged too."""
    return 7 if "step-0020" in key else zlib.crc32(key.encode())


def model(run: int, step: int) -> str:
    return f"runs/r{run}/step-{step:04d}/model.pt"


def meta(run: int, step: int) -> str:
    return f"runs/r{run}/step-{step:04d}/meta.json"


@dataclass
class Setup:
    s3: Any  # boto3, straight to moto
    link: RecordingProxy  # moto as the engines reach it
    configs: tuple[Path, Path]  # one per node
    catalog: Catalog
    t0: float  # when the objects were written (real time: moto's LastModified)
    reader: Path  # a node with a cache, through which the weekly reads go

    def tags(self, key: str) -> dict[str, str]:
        tags = self.s3.get_object_tagging(Bucket=BUCKET, Key=key)["TagSet"]
        return {t["Key"]: t["Value"] for t in tags}

    def put(self, key: str, size: int, n: int | None = None) -> None:
        n = number(key) if n is None else n
        self.s3.put_object(
            Bucket=BUCKET,
            Key=key,
            Body=bytes([n % 251]) * size,
            Metadata={"n": str(n)},
            ContentType="application/x-test",
            **({"Tagging": f"team=ml&n={n}"} if n % 10 == 0 else {}),
        )

    def copies(self) -> Counter[str]:
        return Counter(s.path[len(BUCKET) + 2 :] for s in self.link.requests("PUT"))

    def storage_class(self, key: str) -> str:
        return str(self.s3.head_object(Bucket=BUCKET, Key=key).get("StorageClass", "STANDARD"))


def write_config(path: Path, node: str, catalog_url: str, endpoint: str, tmp: Path) -> Path:
    path.write_text(
        f'node = "{node}"\n'
        '[auth]\nmode = "none"\n'
        f'[catalog]\nurl = "{catalog_url}"\n'
        f'[regions.us-east]\nendpoint = "{endpoint}"\n'
        'access_key_id = "lota-origin"\nsecret_access_key = "lota-origin-secret"\n'
        '[lifecycle]\ninterval = "0"\nrate = 0\n'
        '[[lifecycle.rules]]\nbucket = "ckpt"\nprefix = "runs/*/"\nkeep_latest = 3\n'
        'transitions = [ { days_since_last_access = 60, tier = "archive" } ]\n'
        '[[lifecycle.rules]]\nbucket = "ckpt"\nprefix = ""\nmin_size = "128KiB"\n'
        'transitions = [ { days_since_last_access = 30, tier = "warm" },\n'
        '                { days_since_last_access = 60, tier = "archive" } ]\n'
    )
    return path


@pytest.fixture
def origin_link() -> Iterator[tuple[str, RecordingProxy]]:
    with moto_server() as endpoint, recording_proxy(endpoint) as link:
        yield endpoint, link


@pytest.fixture
async def setup(
    origin_link: tuple[str, RecordingProxy], catalog_url: str, tmp_path: Path
) -> AsyncIterator[Setup]:
    endpoint, link = origin_link
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="lota-origin",
        aws_secret_access_key="lota-origin-secret",
        region_name="us-east-1",
        config=BotoConfig(max_pool_connections=16),
    )
    s3.create_bucket(Bucket=BUCKET)
    configs = (
        write_config(tmp_path / "n1.toml", "n1", catalog_url, link.url, tmp_path),
        write_config(tmp_path / "n2.toml", "n2", catalog_url, link.url, tmp_path),
    )
    reader = tmp_path / "reader.toml"
    reader.write_text(
        configs[0].read_text().replace('node = "n1"', 'node = "reader"')
        + f'[cache]\ndirs = ["{tmp_path}/cache"]\nsize = "1GiB"\nrevalidate_after = "365d"\n'
    )
    catalog = await open_catalog(catalog_url, clock=Clock(), node="test")
    try:
        yield Setup(s3, link, configs, catalog, float(int(time.time())), reader)
    finally:
        await catalog.close()


def upload(setup: Setup) -> None:
    """996 objects now; 4 more (a newer step in two runs) on day 14: 1,000 in all."""
    batches: list[list[tuple[str, int]]] = [[(k, 128 * KiB) for k in HOT + COLD]]
    batches[0] += [(k, KiB) for k in SMALL]
    # One step after the other, oldest first: LastModified orders the steps (a step still
    # being written while the next one is would be the newer of the two).
    for step in range(STEPS):
        batches.append([(model(run, step), 128 * KiB) for run in range(RUNS)])
        batches[-1] += [(meta(run, step), KiB) for run in range(RUNS)]
    with ThreadPoolExecutor(16) as pool:
        for jobs in batches:
            list(pool.map(lambda job: setup.put(job[0], job[1]), jobs))


def iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat()


def hot_gets(setup: Setup) -> list[Any]:
    return [s for s in setup.link.requests("GET") if s.path.startswith(f"/{BUCKET}/data/hot-")]


def read_weekly(setup: Setup, now: float) -> list[str]:
    """Read the hot shards through a real LOTA node whose clock says `now`
    (LOTA_TIME_OFFSET); it records the reads, cache hits included, and flushes them to the
    catalog when it stops. Returns where each answer came from (x-lota-cache)."""
    node = LotaProcess(
        ["--config", str(setup.reader)],
        log_path=setup.reader.with_suffix(".log"),
        env={"LOTA_TIME_OFFSET": f"{now - time.time():.0f}"},
    ).start()
    s3 = boto3.client(
        "s3",
        endpoint_url=node.url,
        aws_access_key_id="any",
        aws_secret_access_key="any",
        region_name="us-east-1",
        config=BotoConfig(max_pool_connections=16),
    )

    def read(key: str) -> str:
        got = s3.get_object(Bucket=BUCKET, Key=key)
        got["Body"].read()
        return str(got["ResponseMetadata"]["HTTPHeaders"]["x-lota-cache"])

    try:
        with ThreadPoolExecutor(16) as pool:
            return list(pool.map(read, HOT))
    finally:
        assert node.stop() == 0


def cache_notes(setup: Setup) -> list[str]:
    """What the reader node's log says about its cache: opens, sweeps, warnings."""
    log = setup.reader.with_suffix(".log").read_text(errors="replace").splitlines()
    return [line for line in log if "lota.cache" in line and " DEBUG " not in line]


async def two_nodes_run(setup: Setup, now: float) -> int:
    """Both nodes run the engine at once; returns how many of them got the lease."""
    async with AsyncExitStack() as stack:
        engines = [(await stack.enter_async_context(open_engine(str(c))))[0] for c in setup.configs]
        reports = await asyncio.gather(*(engine.run(now) for engine in engines))
    ran = [r for r in reports if r is not None]
    assert ran and all((r.failed, r.lease_lost) == (0, False) for r in ran)
    return len(ran)


async def plan_then_run(setup: Setup, now: float) -> list[dict[str, Any]]:
    """`lota lifecycle plan --json`, then `lota lifecycle run`: the run copies exactly
    the planned objects into the planned classes."""
    out = io.StringIO()
    assert await plan_command(str(setup.configs[0]), None, iso(now), True, out) == 0
    planned = [json.loads(line) for line in out.getvalue().splitlines()]
    before = setup.copies()
    assert await run_command(str(setup.configs[1]), iso(now)) == 0
    done = setup.copies() - before
    assert done == Counter(p["key"] for p in planned)
    for p in planned[:: max(1, len(planned) // 25)]:
        assert setup.storage_class(p["key"]) == p["storage_class"] == CLASS[p["to"]]
    return planned


# PostgreSQL only: the catalog backends answer alike (tests/functional/test_catalog_backends.py),
# and the 90 days take most of a minute.
@pytest.mark.parametrize("catalog_url", ["postgresql"], indirect=True)
async def test_90_days_hot_stays_unread_archives_newest_checkpoints_stay(setup: Setup) -> None:
    started = time.monotonic()
    upload(setup)
    t0 = setup.t0
    planned_on: dict[int, list[dict[str, Any]]] = {}
    ran: list[int] = []
    for day in [*range(0, 85, 7), 90]:
        now = t0 + day * DAY + 3600
        if day <= 84:
            sources = await asyncio.to_thread(read_weekly, setup, now)
            want = {"MISS"} if day == 0 else {"HIT"}
            assert set(sources) == want, (day, set(sources), cache_notes(setup))
            if day == 0:
                cold_reads = len(hot_gets(setup))
        if day == 14:
            for run in (0, 1):
                setup.put(model(run, STEPS), 128 * KiB)
                setup.put(meta(run, STEPS), KiB)
        if day in (35, 63):
            planned_on[day] = await plan_then_run(setup, now)
        ran.append(await two_nodes_run(setup, now))
        if day == 35:  # the shards were copied to STANDARD_IA with their tags
            tags_after_35_days = [setup.tags(k) for k in COLD if number(k) % 10 == 0]
            assert tags_after_35_days == [
                {"team": "ml", "n": str(number(k))} for k in COLD if number(k) % 10 == 0
            ]

    # The origin sent each hot shard once, in week 0; after that the reads were hits only.
    assert len(hot_gets(setup)) == cold_reads == len(HOT)
    # Day 35: the unread shards went warm (checkpoints have no warm step); day 63: archive.
    assert {(p["key"], p["to"]) for p in planned_on[35]} == {(k, "warm") for k in COLD}
    assert {p["reason"] for p in planned_on[35]} == {
        "unread for 35 days (rule ckpt/ -> warm after 30)"
    }
    archived_models = {
        model(run, step)
        for run in range(RUNS)
        for step in range(STEPS + 1 if run < 2 else STEPS)
        if step < (STEPS + 1 if run < 2 else STEPS) - 3
    }
    assert {p["key"] for p in planned_on[63]} == set(COLD) | archived_models
    assert all(p["to"] == "archive" for p in planned_on[63])

    # Every transition happened exactly once, although two nodes ran at every step (and
    # the lease kept the second out while the first ran).
    assert 1 in ran, ran
    copies = setup.copies()
    assert copies == Counter({k: 2 for k in COLD} | {k: 1 for k in archived_models})

    # The final state at the origin, metadata, content type and tags intact.
    expected = {k: "STANDARD" for k in HOT + SMALL}
    expected |= {k: "DEEP_ARCHIVE" for k in COLD}
    for run in range(RUNS):
        last = STEPS + 1 if run < 2 else STEPS
        for step in range(last):
            expected[model(run, step)] = "DEEP_ARCHIVE" if step < last - 3 else "STANDARD"
            expected[meta(run, step)] = "STANDARD"
    assert len(expected) == 1000
    listed = {
        o["Key"]: o.get("StorageClass", "STANDARD")
        for page in setup.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        for o in page["Contents"]
    }
    assert listed == expected
    for key in [*COLD[:40], *sorted(archived_models)[:10], *HOT[:10]]:
        head = setup.s3.head_object(Bucket=BUCKET, Key=key)
        assert head["Metadata"] == {"n": str(number(key))}
        assert head["ContentType"] == "application/x-test"
    assert tags_after_35_days  # moto refuses GetObjectTagging in archive classes: see day 35
    assert await setup.catalog.get_tier(BUCKET, COLD[0]) == ("archive", t0 + 63 * DAY + 3600)

    # A second run (and a plan) at the end change nothing.
    before = setup.copies()
    out = io.StringIO()
    await plan_command(str(setup.configs[0]), BUCKET, iso(t0 + 90 * DAY + 3600), False, out)
    assert out.getvalue().startswith(f"lota lifecycle: nothing would move in {BUCKET} (")
    assert await run_command(str(setup.configs[0]), iso(t0 + 90 * DAY + 3600)) == 0
    assert setup.copies() == before
    assert time.monotonic() - started < 120


async def test_objects_over_the_copy_limit_move_by_multipart_copy_with_metadata_and_tags(
    origin_link: tuple[str, RecordingProxy],
) -> None:
    endpoint, link = origin_link
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
    )
    s3.create_bucket(Bucket=BUCKET)
    body = bytes(range(256)) * (11 * MiB // 256)
    s3.put_object(
        Bucket=BUCKET,
        Key="big/ckpt.pt",
        Body=body,
        Metadata={"step": "9"},
        ContentType="application/x-pt",
        CacheControl="no-transform",
        Tagging="team=ml&kind=ckpt",
    )
    etag = s3.head_object(Bucket=BUCKET, Key="big/ckpt.pt")["ETag"]
    region = RegionConfig(name="r", endpoint=link.url, access_key_id="k", secret_access_key="s")
    control = ControlPlane(LotaConfig(region="r", regions={"r": region}), Metrics())
    try:
        mover = OriginMover(control, copy_limit=8 * MiB, part_size=5 * MiB)
        decision = Decision(
            bucket=BUCKET,
            key="big/ckpt.pt",
            size=len(body),
            from_tier="hot",
            to_tier="archive",
            storage_class="GLACIER_IR",
            reason="test",
            etag=etag,
        )
        assert await mover.check(decision) is None
        assert await mover.copy(decision) is None
    finally:
        await control.close()
    head = s3.head_object(Bucket=BUCKET, Key="big/ckpt.pt")
    assert head["StorageClass"] == "GLACIER_IR" and head["ETag"].endswith('-3"')
    assert head["Metadata"] == {"step": "9"} and head["ContentType"] == "application/x-pt"
    assert head["CacheControl"] == "no-transform"
    tags = s3.get_object_tagging(Bucket=BUCKET, Key="big/ckpt.pt")["TagSet"]
    assert {t["Key"]: t["Value"] for t in tags} == {"team": "ml", "kind": "ckpt"}
    assert s3.get_object(Bucket=BUCKET, Key="big/ckpt.pt")["Body"].read() == body
    puts = link.requests("PUT")  # three UploadPartCopy, no CopyObject
    numbers = [dict(parse_qsl(s.query)).get("partNumber") for s in puts]
    assert sorted(numbers) == ["1", "2", "3"]


def test_reads_served_by_a_node_cache_hits_included_count_as_accesses_head_and_list_do_not(
    origin: str, origin_s3: Any, credentials_file: Path, tmp_path: Path
) -> None:
    from lota.testing.processes import LotaProcess
    from tests.conftest import client_for

    direct = origin_s3
    direct.create_bucket(Bucket="accessed")
    for key in ("read-me", "head-me"):
        direct.put_object(Bucket="accessed", Key=key, Body=b"x" * 1000)
    catalog_url = f"sqlite:///{tmp_path}/catalog.db"
    config = tmp_path / "node.toml"
    config.write_text(
        f'[cache]\ndirs = ["{tmp_path}/cache"]\nsize = "1GiB"\nrevalidate_after = "1h"\n'
        f'[auth]\ncredentials = "{credentials_file}"\n'
        f'[catalog]\nurl = "{catalog_url}"\n'
        f'[lifecycle]\ninterval = "0"\n'
        f'[regions.us-east]\nendpoint = "{origin}"\n'
    )
    node = LotaProcess(["--config", str(config)], log_path=tmp_path / "lota.log").start()
    s3 = client_for(node.url)
    sources = []
    for _ in range(3):
        got = s3.get_object(Bucket="accessed", Key="read-me")
        got["Body"].read()
        sources.append(got["ResponseMetadata"]["HTTPHeaders"]["x-lota-cache"])
        time.sleep(0.1)
    assert sources[0] == "MISS" and sources[-1] == "HIT"
    s3.head_object(Bucket="accessed", Key="head-me")
    s3.list_objects_v2(Bucket="accessed")
    before_stop = time.time()
    assert node.stop() == 0  # a clean shutdown flushes the recorded accesses

    async def check() -> None:
        catalog = await open_catalog(catalog_url, clock=Clock(), node="check")
        try:
            read_at = await catalog.last_access("accessed", "read-me")
            assert read_at is not None and before_stop - 30 < read_at <= before_stop
            assert await catalog.last_access("accessed", "head-me") is None
        finally:
            await catalog.close()

    asyncio.run(check())


def test_a_single_region_node_with_a_catalog_and_rules_but_no_staging_bucket_serves_and_plans(
    origin: str, origin_s3: Any, credentials_file: Path, tmp_path: Path
) -> None:
    """Issue #11: the catalog is its own section. Lifecycle alone (one region, no staging
    bucket, default bucket staging) used to be refused at start for want of a staging
    bucket; now the node starts, writes go home directly, and `lota lifecycle plan` runs."""
    import subprocess
    import sys

    from tests.conftest import client_for

    origin_s3.create_bucket(Bucket="tiered")
    config = tmp_path / "node.toml"
    config.write_text(
        f'[auth]\ncredentials = "{credentials_file}"\n'
        f'[catalog]\nurl = "sqlite:///{tmp_path}/catalog.db"\n'
        '[lifecycle]\ninterval = "0"\n'
        '[[lifecycle.rules]]\nbucket = "tiered"\nmin_size = "0"\n'
        'transitions = [ { days_since_last_access = 60, tier = "archive" } ]\n'
        f'[regions.us-east]\nendpoint = "{origin}"\n'
    )
    node = LotaProcess(["--config", str(config)], log_path=tmp_path / "lota.log").start()
    try:
        s3 = client_for(node.url)
        s3.put_object(Bucket="tiered", Key="model.pt", Body=b"w" * 1000)
        assert s3.get_object(Bucket="tiered", Key="model.pt")["Body"].read() == b"w" * 1000
        # Not accelerated: the write is at the origin already, nothing waits to migrate.
        assert origin_s3.head_object(Bucket="tiered", Key="model.pt")["ContentLength"] == 1000
    finally:
        assert node.stop() == 0

    def lota(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "lota", *args, "--config", str(config)],
            capture_output=True,
            text=True,
            timeout=60,
            env=node.env,
            check=False,
        )

    pending = lota("migrations")
    assert (pending.returncode, pending.stdout.split(";")[0]) == (0, "pending: 0 versions, 0 bytes")
    soon, later = (iso(time.time() + days * DAY) for days in (30, 90))
    assert "nothing would move" in lota("lifecycle", "plan", "--now", soon).stdout
    plan = lota("lifecycle", "plan", "--now", later)
    assert plan.returncode == 0, plan.stderr
    assert plan.stdout.startswith("tiered\tmodel.pt\thot\tarchive\t"), plan.stdout
    assert len(plan.stdout.splitlines()) == 1


@pytest.mark.parametrize("restore_on_read", [False, True])
def test_reading_an_archived_object_relays_invalid_object_state_or_starts_the_restore(
    origin: str, origin_s3: Any, credentials_file: Path, tmp_path: Path, restore_on_read: bool
) -> None:
    from lota.testing.processes import LotaProcess
    from tests.conftest import client_for

    direct = origin_s3
    bucket = f"archived-{int(restore_on_read)}"
    direct.create_bucket(Bucket=bucket)
    direct.put_object(Bucket=bucket, Key="old.pt", Body=b"frozen", StorageClass="DEEP_ARCHIVE")
    glacier = direct.put_object(
        Bucket=bucket, Key="ir.pt", Body=b"instant", StorageClass="GLACIER_IR"
    )
    config = tmp_path / "node.toml"
    config.write_text(
        f'[cache]\ndirs = ["{tmp_path}/cache"]\nsize = "1GiB"\n'
        f'[auth]\ncredentials = "{credentials_file}"\n'
        f"[lifecycle]\nrestore_on_read = {'true' if restore_on_read else 'false'}\n"
        f'[regions.us-east]\nendpoint = "{origin}"\n'
    )
    node = LotaProcess(["--config", str(config)], log_path=tmp_path / "lota.log").start()
    try:
        s3 = client_for(node.url, retries={"max_attempts": 1})
        # A class the origin reads directly is served, and cached.
        assert s3.get_object(Bucket=bucket, Key="ir.pt")["Body"].read() == b"instant"
        assert glacier["ETag"]
        with pytest.raises(s3.exceptions.InvalidObjectState):
            s3.get_object(Bucket=bucket, Key="old.pt")
        deadline = time.monotonic() + 10
        restored = None
        while time.monotonic() < deadline:
            restored = direct.head_object(Bucket=bucket, Key="old.pt").get("Restore")
            if restored or not restore_on_read:
                break
            time.sleep(0.1)
        assert bool(restored) == restore_on_read
        if restore_on_read:
            assert s3.get_object(Bucket=bucket, Key="old.pt")["Body"].read() == b"frozen"
    finally:
        node.stop()


def _rules(node: LotaProcess, body: bytes | None = None) -> dict[str, Any]:
    """GET (or, with a body, PUT) /_lota/lifecycle/rules of a node."""
    import urllib.request

    request = urllib.request.Request(
        node.url + "/_lota/lifecycle/rules", data=body, method="PUT" if body else "GET"
    )
    with urllib.request.urlopen(request, timeout=5) as answer:
        return dict(json.loads(answer.read()))


def test_rules_put_through_one_node_apply_on_every_node_and_tags_pick_what_moves(
    origin_link: tuple[str, RecordingProxy], catalog_url: str, tmp_path: Path
) -> None:
    import subprocess
    import sys

    endpoint, _ = origin_link
    s3 = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="lota-origin",
        aws_secret_access_key="lota-origin-secret",
        region_name="us-east-1",
    )
    s3.create_bucket(Bucket="tagged")
    for key, tagging in (
        ("final.pt", "stage=final&team=a"),
        ("draft.pt", "stage=draft"),
        ("x", ""),
    ):
        s3.put_object(Bucket="tagged", Key=key, Body=b"t" * 1000, Tagging=tagging)
    configs = [
        write_config(tmp_path / f"{n}.toml", n, catalog_url, endpoint, tmp_path)
        for n in ("n1", "n2")
    ]
    nodes = [LotaProcess(["--config", str(c)], log_path=c.with_suffix(".log")) for c in configs]
    for node in nodes:
        node.spawn()
    try:
        for node in nodes:
            node.wait_ready()
        assert _rules(nodes[1])["version"] == 0  # the config's seed
        rules = {
            "rules": [
                {
                    "bucket": "tagged",
                    "min_size": "0",
                    "tags": {"stage": "final"},
                    "transitions": [{"days_since_last_access": 30, "tier": "archive"}],
                }
            ]
        }
        put = _rules(nodes[0], json.dumps(rules).encode())
        assert put["version"] == 1 and put["rules"][0]["tags"] == {"stage": "final"}
        replaced = time.monotonic()
        # Within the catalog's event delay (SQLite polls every 0.5 s, PostgreSQL notifies,
        # and polls every 5 s besides), with room for a loaded machine. (A failure here at
        # 5 s was no delay: node 2 opened its event stream after it said ready and read the
        # rules, and never heard of these. It now opens the stream first; the test
        # below makes that interleaving happen.)
        while _rules(nodes[1])["version"] != 1:
            assert time.monotonic() - replaced < 8.0, "node 2 did not take the new rules"
            time.sleep(0.02)
        assert _rules(nodes[1])["rules"] == put["rules"]
    finally:
        codes = [node.stop() for node in nodes]  # every node stopped, whichever fails
    assert codes == [0, 0], "\n".join(n.log_tail() for n, c in zip(nodes, codes, strict=True) if c)

    def lota(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "lota", "lifecycle", *args, "--config", str(configs[1])],
            capture_output=True,
            text=True,
            timeout=60,
            env=nodes[1].env,
            check=False,
        )

    later = iso(time.time() + 40 * DAY)
    plan = lota("plan", "--now", later)
    assert plan.stdout.splitlines() == [
        line for line in plan.stdout.splitlines() if line.startswith("tagged\tfinal.pt\t")
    ]
    assert len(plan.stdout.splitlines()) == 1, plan.stdout + plan.stderr
    status = lota("status", "s3://tagged/final.pt", "--now", iso(time.time()))
    assert status.returncode == 0, status.stderr
    assert "rule:         tagged/" in status.stdout and "moves to:     archive at" in status.stdout
    draft = json.loads(lota("status", "s3://tagged/draft.pt", "--json").stdout)
    assert (draft["tier"], draft["rule"], draft["note"]) == (
        "hot",
        None,
        "no rule matches it: it never moves",
    )
    assert lota("status", "s3://tagged/nothing-here").returncode == 1
    assert lota("run", "--now", later).returncode == 0
    classes = {
        key: s3.head_object(Bucket="tagged", Key=key).get("StorageClass", "STANDARD")
        for key in ("final.pt", "draft.pt", "x")
    }
    assert classes == {"final.pt": "DEEP_ARCHIVE", "draft.pt": "STANDARD", "x": "STANDARD"}


async def test_rules_replaced_while_a_node_opens_its_event_stream_reach_that_node(
    origin: str, catalog_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node follows the catalog's events from the moment it reads the rules: rules
    replaced elsewhere in between (here: while its event stream opens, as a loaded machine
    or a slow catalog connection lets happen after the node says ready) still reach it."""
    other = await open_catalog(catalog_url, clock=Clock(), node="elsewhere")
    real_events = Catalog.events
    replaced: list[int] = []

    async def events(self: Catalog, after: int | None = None) -> Any:
        if after is None and not replaced:
            await LifecycleState(documents=other).replace(
                '[{"bucket": "ckpt", "transitions": [{"days_since_last_access": 1, "tier": "warm"}]}]'
            )
            replaced.append(1)
        return await real_events(self, after)

    monkeypatch.setattr(Catalog, "events", events)
    config = node_config({"origin": origin, "auth.mode": "none", "catalog.url": catalog_url})
    try:
        async with running_node(config) as node, aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 8.0  # PostgreSQL's 5 s poll, and room
            while True:
                async with http.get(f"{node.url}/_lota/lifecycle/rules") as answer:
                    version = (await answer.json())["version"]
                if version == 1 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert replaced
            assert version == 1, "the node never took the rules replaced as it started"
    finally:
        await other.close()
