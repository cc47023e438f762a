"""Cross-region write acceleration with two regions (two moto servers) and two LOTA nodes,
one per region, sharing one catalog: SQLite and a real PostgreSQL."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import client_for
from tests.functional.conftest import FAR, STAGING_A, MiB, TwoRegions, _metric
from tests.functional.test_errors import SMUGGLED_SOURCES, error_code, raw, signed


def test_a_write_into_a_far_bucket_is_visible_everywhere_at_once_then_migrates(
    regions: TwoRegions,
) -> None:
    s3a, s3b = client_for(regions.a.url), client_for(regions.b.url)
    data = os.urandom(3 * MiB + 5)
    put = s3a.put_object(
        Bucket=FAR,
        Key="ckpt/step-1.pt",
        Body=data,
        Metadata={"step": "1"},
        ContentType="application/x-pt",
    )
    assert put["ETag"] == f'"{hashlib.md5(data).hexdigest()}"'
    for s3 in (s3a, s3b):
        got = s3.get_object(Bucket=FAR, Key="ckpt/step-1.pt")
        assert got["Body"].read() == data
        assert got["ETag"] == put["ETag"] and got["Metadata"] == {"step": "1"}
        assert got["ContentType"] == "application/x-pt"
        assert (
            s3.get_object(Bucket=FAR, Key="ckpt/step-1.pt", Range="bytes=10-19")["Body"].read()
            == data[10:20]
        )
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=FAR, Prefix="ckpt/")["Contents"]]
        assert keys == ["ckpt/step-1.pt"]
    assert regions.wait_migrated("ckpt/step-1.pt") == data
    home = regions.origin_b.head_object(Bucket=FAR, Key="ckpt/step-1.pt")
    assert home["ETag"] == put["ETag"] and home["Metadata"] == {"step": "1"}
    deadline = time.monotonic() + 15
    while regions.staging_keys() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert regions.staging_keys() == []
    assert s3b.get_object(Bucket=FAR, Key="ckpt/step-1.pt")["Body"].read() == data


def test_multipart_upload_keeps_its_etag_and_part_boundaries(
    regions: TwoRegions, tmp_path: Path
) -> None:
    s3a = client_for(regions.a.url)
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(20 * MiB + 3))
    s3a.upload_file(str(source), FAR, "big.bin")  # 8 MiB parts
    etag = s3a.head_object(Bucket=FAR, Key="big.bin")["ETag"]
    assert etag.endswith('-3"')
    assert (
        client_for(regions.b.url).get_object(Bucket=FAR, Key="big.bin")["Body"].read()
        == source.read_bytes()
    )
    assert regions.wait_migrated("big.bin") == source.read_bytes()
    assert regions.origin_b.head_object(Bucket=FAR, Key="big.bin")["ETag"] == etag


def test_overwrites_and_deletes_order_by_commit(regions: TwoRegions) -> None:
    s3a, s3b = client_for(regions.a.url), client_for(regions.b.url)
    for i in range(5):
        s3a.put_object(Bucket=FAR, Key="k", Body=f"version {i}".encode())
    assert s3b.get_object(Bucket=FAR, Key="k")["Body"].read() == b"version 4"
    assert regions.wait_migrated("k") in {f"version {i}".encode() for i in range(5)}
    deadline = time.monotonic() + 20
    while regions.origin_b.get_object(Bucket=FAR, Key="k")["Body"].read() != b"version 4":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    s3a.delete_object(Bucket=FAR, Key="k")
    for s3 in (s3a, s3b):
        with pytest.raises(s3.exceptions.NoSuchKey):
            s3.get_object(Bucket=FAR, Key="k")
    deadline = time.monotonic() + 20
    while "Contents" in regions.origin_b.list_objects_v2(Bucket=FAR, Prefix="k"):
        assert time.monotonic() < deadline
        time.sleep(0.2)


def test_a_delete_objects_on_a_home_region_node_wins_over_a_pending_write(
    regions: TwoRegions,
) -> None:
    s3a, s3b = client_for(regions.a.url), client_for(regions.b.url)
    s3a.put_object(Bucket=FAR, Key="k", Body=os.urandom(1 << 20))
    s3a.put_object(Bucket=FAR, Key="other", Body=b"stays")
    deleted = s3b.delete_objects(Bucket=FAR, Delete={"Objects": [{"Key": "k"}]})
    assert [d["Key"] for d in deleted["Deleted"]] == ["k"]
    for s3 in (s3a, s3b):
        with pytest.raises(s3.exceptions.ClientError) as err:
            s3.head_object(Bucket=FAR, Key="k")
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert regions.wait_migrated("other") == b"stays"
    time.sleep(1)  # the migrator has had its turn at k too
    assert "Contents" not in regions.origin_b.list_objects_v2(Bucket=FAR, Prefix="k")


def test_a_listing_keeps_paging_when_a_write_lands_under_its_prefix_midway(
    regions: TwoRegions,
) -> None:
    s3a = client_for(regions.a.url)
    for i in range(3):
        regions.origin_b.put_object(Bucket=FAR, Key=f"p/{i}", Body=b"home")
    first = s3a.list_objects_v2(Bucket=FAR, Prefix="p/", MaxKeys=2)
    assert [o["Key"] for o in first["Contents"]] == ["p/0", "p/1"]
    s3a.put_object(Bucket=FAR, Key="p/new", Body=b"pending")  # the catalog now has p/
    rest = s3a.list_objects_v2(
        Bucket=FAR, Prefix="p/", MaxKeys=2, ContinuationToken=first["NextContinuationToken"]
    )
    assert rest["Contents"][0]["Key"] == "p/2"
    fresh = s3a.list_objects_v2(Bucket=FAR, Prefix="p/")
    assert [o["Key"] for o in fresh["Contents"]] == ["p/0", "p/1", "p/2", "p/new"]


def test_writes_are_accepted_while_the_home_region_is_down_and_catch_up(
    regions: TwoRegions,
) -> None:
    s3a = client_for(regions.a.url, retries={"max_attempts": 1})
    regions.link_b.down = True
    blobs = {f"outage/{i}": os.urandom(100_000 + i) for i in range(10)}
    for key, data in blobs.items():
        s3a.put_object(Bucket=FAR, Key=key, Body=data)
    for key, data in blobs.items():
        assert s3a.get_object(Bucket=FAR, Key=key)["Body"].read() == data
    deadline = time.monotonic() + 30  # each attempt retries its calls before it fails
    while not sum(
        _metric(n.metrics(), "lota_migration_failures_total") for n in (regions.a, regions.b)
    ):
        assert time.monotonic() < deadline, "the migrators did not try"  # then retry
        time.sleep(0.2)
    regions.link_b.down = False
    for key, data in blobs.items():
        assert regions.wait_migrated(key, timeout=60) == data


def test_kill_9_during_100_writes_loses_no_acknowledged_write(regions: TwoRegions) -> None:
    s3a = client_for(regions.a.url, retries={"max_attempts": 1}, connect_timeout=2, read_timeout=10)
    acknowledged: dict[str, bytes] = {}
    stop = threading.Event()

    def writer(worker: int) -> None:
        for i in range(25):
            if stop.is_set():
                return
            key, data = f"storm/{worker}-{i}", os.urandom(50_000 + i * 1000)
            try:
                s3a.put_object(Bucket=FAR, Key=key, Body=data)
            except Exception:
                continue
            acknowledged[key] = data

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    while len(acknowledged) < 40:
        time.sleep(0.01)
    regions.a.kill()
    stop.set()
    for t in threads:
        t.join()
    node = regions.start("us-east")
    s3a = client_for(node.url)
    s3b = client_for(regions.b.url)
    listed = {
        o["Key"]
        for p in s3b.get_paginator("list_objects_v2").paginate(Bucket=FAR, Prefix="storm/")
        for o in p.get("Contents", [])
    }
    assert set(acknowledged) <= listed
    for key, data in acknowledged.items():
        assert s3a.get_object(Bucket=FAR, Key=key)["Body"].read() == data
    for key in listed - set(acknowledged):  # committed but not acknowledged: whole, never half
        body = s3b.get_object(Bucket=FAR, Key=key)["Body"].read()
        assert len(body) >= 50_000
    for key, data in acknowledged.items():
        assert regions.wait_migrated(key, timeout=90) == data


def test_two_migrating_nodes_never_copy_an_object_twice_nor_lose_one(regions: TwoRegions) -> None:
    # Both nodes run a migrator on the shared catalog; every write is accelerated via A.
    s3a = client_for(regions.a.url)
    blobs = {f"twice/{i:02d}": os.urandom(20_000 + i) for i in range(40)}
    for key, data in blobs.items():
        s3a.put_object(Bucket=FAR, Key=key, Body=data)
    for key, data in blobs.items():
        assert regions.wait_migrated(key) == data
    puts = [s.path for s in regions.link_b.requests("PUT") if s.path.startswith(f"/{FAR}/twice/")]
    assert sorted(puts) == sorted(f"/{FAR}/{key}" for key in blobs)


def test_an_accelerated_overwrite_is_never_answered_with_old_cached_bytes(
    regions: TwoRegions,
) -> None:
    s3a, s3b = client_for(regions.a.url), client_for(regions.b.url)
    regions.origin_b.put_object(Bucket=FAR, Key="model.pt", Body=b"version 1")
    for s3 in (s3a, s3b):  # both nodes cache version 1
        assert s3.get_object(Bucket=FAR, Key="model.pt")["Body"].read() == b"version 1"
        assert s3.get_object(Bucket=FAR, Key="model.pt")["Body"].read() == b"version 1"
    s3a.put_object(Bucket=FAR, Key="model.pt", Body=b"version 2")
    for s3 in (s3a, s3b):
        assert s3.get_object(Bucket=FAR, Key="model.pt")["Body"].read() == b"version 2"
    deadline = time.monotonic() + 30
    while regions.origin_b.get_object(Bucket=FAR, Key="model.pt")["Body"].read() != b"version 2":
        assert time.monotonic() < deadline, "version 2 did not migrate"
        time.sleep(0.2)
    time.sleep(1.5)  # the catalog now says migrated: reads go back to caches and origins
    for s3 in (s3a, s3b):
        assert s3.get_object(Bucket=FAR, Key="model.pt")["Body"].read() == b"version 2"


def test_zero_byte_writes_to_a_far_bucket_migrate_with_their_etag_and_metadata(
    regions: TwoRegions,
) -> None:
    """Markers and ``_SUCCESS`` files are empty: S3 answers ``Range: bytes=0-`` on an empty
    object with 416, which once kept every one of them pending ("failing") for good."""
    s3a = client_for(regions.a.url)
    empty_etag = f'"{hashlib.md5(b"").hexdigest()}"'
    keys = [f"job/{i}/_SUCCESS" for i in range(6)] + [f"markers/{i}/" for i in range(6)]
    for key in keys:
        put = s3a.put_object(Bucket=FAR, Key=key, Body=b"", Metadata={"kind": "marker"})
        assert put["ETag"] == empty_etag
    # A copy of a pending empty object reads its staged copy too.
    source = {"Bucket": FAR, "Key": keys[0]}
    copied = s3a.copy_object(Bucket=FAR, Key="job/copy", CopySource=source)
    assert copied["CopyObjectResult"]["ETag"] == empty_etag
    for key in [*keys, "job/copy"]:
        assert regions.wait_migrated(key) == b""
        home = regions.origin_b.head_object(Bucket=FAR, Key=key)
        assert home["ETag"] == empty_etag and home["Metadata"] == {"kind": "marker"}
    deadline = time.monotonic() + 15
    while any(r is None or r.pending for r in regions.catalog_rows([*keys, "job/copy"])):
        assert time.monotonic() < deadline, "still pending in the catalog"
        time.sleep(0.2)
    logs = regions.a.log_tail(1000) + regions.b.log_tail(1000)
    ours = (f"{FAR}/job/", f"{FAR}/markers/")
    assert [
        line for line in logs.splitlines() if "failed" in line and any(k in line for k in ours)
    ] == []


def test_a_migration_whose_staging_copy_is_gone_says_so_not_that_the_home_is_unreachable(
    regions: TwoRegions,
) -> None:
    """The staged copy is the body of the home PUT: its read failing is no failure of the
    home origin, which used to be logged (and counted) as unreachable."""
    s3a = client_for(regions.a.url)
    regions.link_b.down = True  # hold the migration while the staging copy goes
    s3a.put_object(Bucket=FAR, Key="lost", Body=b"staged, then lost")
    for key in regions.staging_keys():
        regions.origin_a.delete_object(Bucket=STAGING_A, Key=key)
    regions.link_b.down = False
    deadline = time.monotonic() + 20
    while True:
        logs = (regions.a.log_tail(400) + "\n" + regions.b.log_tail(400)).splitlines()
        # Only this key's lines: a shared catalog may hold other tests' pending writes,
        # whose staging copies the loop above deleted too.
        failed = [
            line
            for line in logs
            if f"{FAR}/lost" in line and "staged object unreadable: 404" in line
        ]
        if failed:
            break
        assert time.monotonic() < deadline, "\n".join(logs[-20:])
        time.sleep(0.2)
    assert [line for line in failed if "unreachable" in line] == []


def test_an_accelerated_copy_reads_exactly_the_authorized_source_and_version(
    regions: TwoRegions,
) -> None:
    near = "near-bucket"
    regions.origin_a.put_bucket_versioning(
        Bucket=near, VersioningConfiguration={"Status": "Enabled"}
    )
    regions.origin_a.put_object(Bucket=near, Key="public/private.bin", Body=b"secret")
    key = "public/a b+ü;%.bin"
    first = regions.origin_a.put_object(Bucket=near, Key=key, Body=b"first")["VersionId"]
    regions.origin_a.put_object(Bucket=near, Key=key, Body=b"second")
    scoped = client_for(regions.a.url, "scoped")
    source = {"Bucket": near, "Key": key, "VersionId": first}
    scoped.copy_object(Bucket=FAR, Key="copy", CopySource=source)  # LOTA copies it itself
    assert client_for(regions.a.url).get_object(Bucket=FAR, Key="copy")["Body"].read() == b"first"
    for smuggled, status, code in SMUGGLED_SOURCES:
        headers = {"x-amz-copy-source": f"{near}/{smuggled}"}
        request = signed(regions.a, "PUT", f"/{FAR}/stolen", b"", headers, principal="scoped")
        answer_status, answer = raw(regions.a, request)
        assert (answer_status, error_code(answer)) == (status, code), smuggled
    with pytest.raises(scoped.exceptions.ClientError) as err:
        client_for(regions.a.url).head_object(Bucket=FAR, Key="stolen")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_an_accelerated_delete_objects_deletes_only_the_authorized_keys(
    regions: TwoRegions,
) -> None:
    admin = client_for(regions.a.url)
    for key in ("alpha/scratch/a", "alpha/important/model.bin"):
        admin.put_object(Bucket=FAR, Key=key, Body=b"x")
    result = client_for(regions.a.url, "scoped").delete_objects(
        Bucket=FAR,
        Delete={"Objects": [{"Key": "alpha/scratch/a"}, {"Key": "alpha/important/model.bin"}]},
    )
    assert [d["Key"] for d in result["Deleted"]] == ["alpha/scratch/a"]
    assert [(e["Key"], e["Code"]) for e in result["Errors"]] == [
        ("alpha/important/model.bin", "AccessDenied")
    ]
    assert admin.get_object(Bucket=FAR, Key="alpha/important/model.bin")["Body"].read() == b"x"
    with pytest.raises(admin.exceptions.NoSuchKey):
        admin.get_object(Bucket=FAR, Key="alpha/scratch/a")
