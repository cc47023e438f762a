"""Write acceleration finished: writes cached on the node that took them, every multipart
call, fenced migrations, the orphan sweep, and the start-up check of staging. Two regions
(two moto servers behind recording proxies), two LOTA nodes, SQLite and PostgreSQL."""

from __future__ import annotations

import os
import shutil
import signal
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from boto3.s3.transfer import TransferConfig

from lota.embedded import moto_server
from lota.regions.uploads import decode_upload_id, encode_upload_id
from lota.testing.processes import LotaProcess
from tests.conftest import client_for
from tests.functional.conftest import FAR, STAGING_A, MiB, TwoRegions, _direct, _metric


def _source(response: Any) -> str:
    return str(response["ResponseMetadata"]["HTTPHeaders"].get("x-lota-cache", "-"))


def _gets(regions: TwoRegions) -> list[str]:
    """GETs of object bytes that reached either origin (staging or home), listings aside."""
    seen = regions.link_a.requests("GET") + regions.link_b.requests("GET")
    return [
        f"{s.path}?{s.query}" for s in seen if "uploadId" not in s.query and s.path.count("/") > 1
    ]


def test_a_write_read_back_through_its_node_is_a_hit_that_asks_neither_origin_nor_staging(
    regions: TwoRegions, tmp_path: Path
) -> None:
    s3a = client_for(regions.a.url)
    regions.link_b.down = True  # the home is away: no migration reads staging meanwhile
    data = os.urandom(3 * MiB + 7)
    s3a.put_object(Bucket=FAR, Key="rb/single.pt", Body=data, ContentType="application/x-pt")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(20 * MiB + 3))
    s3a.upload_file(str(big), FAR, "rb/multi.pt")  # 8 MiB parts
    regions.link_a.clear()
    got = s3a.get_object(Bucket=FAR, Key="rb/single.pt")
    assert got["Body"].read() == data and _source(got) == "HIT"
    assert got["ContentType"] == "application/x-pt"
    part = s3a.get_object(Bucket=FAR, Key="rb/single.pt", Range="bytes=100-199")
    assert part["Body"].read() == data[100:200] and _source(part) == "HIT"
    got = s3a.get_object(Bucket=FAR, Key="rb/multi.pt")
    assert got["Body"].read() == big.read_bytes() and _source(got) == "HIT"
    second = s3a.get_object(Bucket=FAR, Key="rb/multi.pt", PartNumber=2)
    assert second["Body"].read() == big.read_bytes()[8 * MiB : 16 * MiB]
    assert _gets(regions) == []
    written = _metric(regions.a.metrics(), "lota_cache_written_bytes_total")
    assert written == len(data) + big.stat().st_size
    # Through the other node: read from staging (and cached there).
    s3b = client_for(regions.b.url)
    assert s3b.get_object(Bucket=FAR, Key="rb/single.pt")["Body"].read() == data
    regions.link_b.down = False
    assert regions.wait_migrated("rb/multi.pt") == big.read_bytes()
    assert regions.wait_migrated("rb/single.pt") == data
    time.sleep(1.5)  # the catalog says migrated: reads go to caches and origins again
    regions.link_a.clear()
    regions.link_b.clear()
    for key in ("rb/single.pt", "rb/multi.pt"):
        got = s3a.get_object(Bucket=FAR, Key=key)
        assert _source(got) == "HIT" and len(got["Body"].read()) > 0
    assert _gets(regions) == []


def test_every_multipart_call_on_an_accelerated_upload_answers_as_s3_and_migrates_the_etag(
    regions: TwoRegions,
) -> None:
    s3a, s3b = client_for(regions.a.url), client_for(regions.b.url)
    source = os.urandom(12 * MiB)
    regions.origin_b.put_object(Bucket=FAR, Key="src/home.bin", Body=source)
    upload = s3a.create_multipart_upload(Bucket=FAR, Key="mp/obj", Metadata={"m": "1"})
    uid = upload["UploadId"]
    listed = s3b.list_multipart_uploads(Bucket=FAR, Prefix="mp/")
    assert [(u["Key"], u["UploadId"]) for u in listed["Uploads"]] == [("mp/obj", uid)]
    first = os.urandom(5 * MiB)
    p1 = s3a.upload_part(Bucket=FAR, Key="mp/obj", UploadId=uid, PartNumber=1, Body=first)
    copy = {"Bucket": FAR, "Key": "src/home.bin"}
    p2 = s3b.upload_part_copy(  # through the other node: any node takes any part
        Bucket=FAR,
        Key="mp/obj",
        UploadId=uid,
        PartNumber=2,
        CopySource=copy,
        CopySourceRange=f"bytes={MiB}-{7 * MiB - 1}",
    )
    p3 = s3a.upload_part_copy(Bucket=FAR, Key="mp/obj", UploadId=uid, PartNumber=3, CopySource=copy)
    pages = s3a.get_paginator("list_parts").paginate(
        Bucket=FAR, Key="mp/obj", UploadId=uid, PaginationConfig={"PageSize": 2}
    )
    parts = [p for page in pages for p in page["Parts"]]
    assert [(p["PartNumber"], p["Size"]) for p in parts] == [
        (1, 5 * MiB),
        (2, 6 * MiB),
        (3, 12 * MiB),
    ]
    assert parts[1]["ETag"] == p2["CopyPartResult"]["ETag"]
    done = s3a.complete_multipart_upload(
        Bucket=FAR,
        Key="mp/obj",
        UploadId=uid,
        MultipartUpload={
            "Parts": [
                {"PartNumber": 1, "ETag": p1["ETag"]},
                {"PartNumber": 2, "ETag": p2["CopyPartResult"]["ETag"]},
                {"PartNumber": 3, "ETag": p3["CopyPartResult"]["ETag"]},
            ]
        },
    )
    assert done["ETag"].endswith('-3"')
    whole = first + source[MiB : 7 * MiB] + source
    assert s3b.get_object(Bucket=FAR, Key="mp/obj")["Body"].read() == whole
    # Gone from the list (the migrator's own upload at home may show there meanwhile).
    after = s3a.list_multipart_uploads(Bucket=FAR, Prefix="mp/").get("Uploads", [])
    assert uid not in [u["UploadId"] for u in after]
    assert regions.wait_migrated("mp/obj") == whole
    home = regions.origin_b.head_object(Bucket=FAR, Key="mp/obj")
    assert home["ETag"] == done["ETag"] and home["Metadata"] == {"m": "1"}
    # An aborted upload is gone, for S3's calls too.
    gone = s3a.create_multipart_upload(Bucket=FAR, Key="mp/aborted")["UploadId"]
    s3a.abort_multipart_upload(Bucket=FAR, Key="mp/aborted", UploadId=gone)
    with pytest.raises(s3a.exceptions.NoSuchUpload):
        s3a.list_parts(Bucket=FAR, Key="mp/aborted", UploadId=gone)


def _row(regions: TwoRegions, key: str) -> Any:
    return regions.catalog_rows([key])[0]


def test_a_migration_whose_lease_ran_out_mid_copy_never_lands_over_the_newer_version(
    regions: TwoRegions,
) -> None:
    """A migrator stalls mid-copy past its lease (SIGSTOP) while a newer version is written
    and migrated by the other node; when it wakes, its copy must not win at home."""
    nodes = {"node-us-east": regions.a, "node-eu-west": regions.b}
    regions.link_a.pace = 0.5  # the staged copy (the home PUT's body) streams slowly
    old = os.urandom(MiB)
    client_for(regions.a.url).put_object(Bucket=FAR, Key="race", Body=old)
    deadline = time.monotonic() + 20
    while (row := _row(regions, "race")) is None or row.state != "migrating":
        assert time.monotonic() < deadline, "nobody claimed the first version"
        time.sleep(0.05)
    time.sleep(0.5)  # its home PUT is under way
    stalled = nodes[row.lease_node]
    other = next(node for node in nodes.values() if node is not stalled)
    assert stalled.proc is not None
    os.kill(stalled.proc.pid, signal.SIGSTOP)
    try:
        # Written now, the newer version waits for the stalled lease to run out (3 s),
        # then the other node moves it; nobody takes the older one over: it is superseded.
        new = b"the newer version"
        client_for(other.url).put_object(Bucket=FAR, Key="race", Body=new)
        deadline = time.monotonic() + 20
        while (row := _row(regions, "race")) is None or row.pending:
            assert time.monotonic() < deadline, "the newer version did not migrate"
            time.sleep(0.1)
    finally:
        os.kill(stalled.proc.pid, signal.SIGCONT)
    regions.link_a.pace = 0
    time.sleep(6)  # the stalled copy ends, one way or the other
    assert regions.origin_b.get_object(Bucket=FAR, Key="race")["Body"].read() == new
    for node in nodes.values():
        assert client_for(node.url).get_object(Bucket=FAR, Key="race")["Body"].read() == new
    # The stalled node's lease was still its own when it woke: the home refused its write.
    assert _metric(stalled.metrics(), 'lota_migration_fenced_total{reason="conditional"}') == 1


def test_an_orphan_staging_object_is_swept_and_a_live_one_is_not(regions: TwoRegions) -> None:
    regions.link_b.down = True  # the live write stays pending, its staged copy needed
    client_for(regions.a.url).put_object(Bucket=FAR, Key="live", Body=b"still needed")
    live = set(regions.staging_keys())
    orphan = f"lota-staging/{FAR}/0123456789abcdef0123456789abcdef"
    regions.origin_a.put_object(Bucket=STAGING_A, Key=orphan, Body=b"never committed")
    deadline = time.monotonic() + 20
    while orphan in regions.staging_keys():
        assert time.monotonic() < deadline, regions.a.log_tail(20)
        time.sleep(0.2)
    assert live <= set(regions.staging_keys())
    assert _metric(regions.a.metrics(), "lota_staging_orphans_swept_total") >= 1
    regions.link_b.down = False
    assert regions.wait_migrated("live") == b"still needed"


def _node_with_staging(
    tmp_path: Path, credentials_file: Path, endpoint: str, create: bool
) -> LotaProcess:
    config = tmp_path / f"lota-{create}.toml"
    config.write_text(
        'region = "us-east"\nnode = "n1"\n'
        f'[auth]\nmode = "sigv4"\ncredentials = "{credentials_file}"\n'
        f'[catalog]\nurl = "sqlite:///{tmp_path}/catalog.db"\n'
        f"[write]\ncreate_staging = {str(create).lower()}\n"
        f'[regions.us-east]\nendpoint = "{endpoint}"\nstaging_bucket = "no-such-staging"\n'
        f'[regions.eu-west]\nendpoint = "{endpoint}"\n[buckets]\n"far" = "eu-west"\n'
    )
    return LotaProcess(["--config", str(config)], log_path=tmp_path / f"lota-{create}.log")


def test_a_node_whose_staging_bucket_is_missing_is_not_ready_and_says_why(
    credentials_file: Path, tmp_path: Path
) -> None:
    with moto_server() as endpoint:
        _direct(endpoint).create_bucket(Bucket="far")
        node = _node_with_staging(tmp_path, credentials_file, endpoint, create=False)
        node.start(ready=False)
        try:
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(node.url + "/_lota/readyz", timeout=5)
            reason = err.value.read().decode()
            assert err.value.code == 503 and "no-such-staging" in reason
            assert "does not exist" in reason
            lines = [line for line in node.log_tail(50).splitlines() if "no-such-staging" in line]
            assert len(lines) == 1 and "Traceback" not in node.log_tail(50)
            s3 = client_for(node.url, retries={"max_attempts": 1})
            with pytest.raises(s3.exceptions.ClientError) as failed:
                s3.put_object(Bucket="far", Key="k", Body=b"x")
            answer = failed.value.response
            assert answer["ResponseMetadata"]["HTTPStatusCode"] == 503
            assert "no-such-staging" in answer["Error"]["Message"]
        finally:
            node.kill()
        node = _node_with_staging(tmp_path, credentials_file, endpoint, create=True).start()
        try:
            s3 = client_for(node.url)
            s3.put_object(Bucket="far", Key="k", Body=b"x")
            assert s3.get_object(Bucket="far", Key="k")["Body"].read() == b"x"
            buckets = [b["Name"] for b in _direct(endpoint).list_buckets()["Buckets"]]
            assert "no-such-staging" in buckets
        finally:
            node.kill()


def _local_disk_node(tmp_path: Path, credentials_file: Path, near: str, far: str) -> LotaProcess:
    config = tmp_path / "lota.toml"
    config.write_text(
        f'region = "us-east"\nnode = "n1"\n'
        f'[cache]\ndirs = ["{tmp_path}/cache"]\nsize = "256MiB"\n'
        f'[auth]\nmode = "sigv4"\ncredentials = "{credentials_file}"\n'
        f'[catalog]\nurl = "sqlite:///{tmp_path}/catalog.db"\n'
        '[write]\nstaging = "local-disk"\n'
        f'staging_dir = "{tmp_path}/staging"\nstaging_grace = "0s"\n'
        'migrate_bandwidth = "2MiB"\n'
        f'[regions.us-east]\nendpoint = "{near}"\n[regions.eu-west]\nendpoint = "{far}"\n'
        '[buckets]\n"far" = "eu-west"\n"other" = "eu-west"\n'
    )
    return LotaProcess(["--config", str(config)], log_path=tmp_path / "lota.log")


def test_with_local_disk_staging_multipart_uploads_are_staged_and_land_in_commit_order(
    credentials_file: Path, tmp_path: Path
) -> None:
    with moto_server() as near, moto_server() as far:
        home = _direct(far)
        home.create_bucket(Bucket="far")
        node = _local_disk_node(tmp_path, credentials_file, near, far).start()
        try:
            s3 = client_for(node.url)
            s3.put_object(Bucket="far", Key="ckpt", Body=b"OLD" * 1_400_000)  # ~2 s to migrate
            data = tmp_path / "new.bin"
            data.write_bytes(os.urandom(11 * MiB))
            s3.upload_file(
                str(data), "far", "ckpt", Config=TransferConfig(multipart_chunksize=5 * MiB)
            )
            got = s3.get_object(Bucket="far", Key="ckpt")
            assert got["Body"].read() == data.read_bytes() and _source(got) == "HIT"
            etag = got["ETag"]
            assert etag.endswith('-3"')
            deadline = time.monotonic() + 30
            while True:
                try:
                    landed = home.head_object(Bucket="far", Key="ckpt")
                    if landed["ETag"] == etag:
                        break
                except home.exceptions.ClientError:
                    pass
                assert time.monotonic() < deadline, node.log_tail(20)
                time.sleep(0.3)
            assert home.get_object(Bucket="far", Key="ckpt")["Body"].read() == data.read_bytes()
        finally:
            node.kill()


def test_an_upload_id_is_believed_only_for_the_upload_the_catalog_has_on_record(
    credentials_file: Path, tmp_path: Path
) -> None:
    """An UploadId is the client's to send: a forged one (a staging key out of the staging
    directory, another bucket's staging) or a real one sent for another key or bucket is
    NoSuchUpload, and nothing is written."""
    with moto_server() as near, moto_server() as far:
        for bucket in ("far", "other"):
            _direct(far).create_bucket(Bucket=bucket)
        node = _local_disk_node(tmp_path, credentials_file, near, far).start()
        try:
            s3 = client_for(node.url, retries={"max_attempts": 1})
            real = s3.create_multipart_upload(Bucket="far", Key="mp/real")["UploadId"]
            _, upload, headers, root = decode_upload_id(real)
            escape = tmp_path / "escaped"
            forged = [
                encode_upload_id(f"lota-staging/far/../../../{escape.name}", upload, headers, root),
                encode_upload_id(str(escape), upload, headers, root),
                encode_upload_id("lota-staging/other/" + "0" * 32, upload, headers, root),
            ]
            calls = [(uid, "far", "mp/real") for uid in forged]
            calls += [(real, "far", "mp/other-key"), (real, "other", "mp/real")]
            for uid, bucket, key in calls:
                with pytest.raises(s3.exceptions.NoSuchUpload):
                    s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=1, Body=b"x")
                with pytest.raises(s3.exceptions.NoSuchUpload):
                    s3.list_parts(Bucket=bucket, Key=key, UploadId=uid)
                with pytest.raises(s3.exceptions.ClientError) as failed:
                    s3.complete_multipart_upload(
                        Bucket=bucket,
                        Key=key,
                        UploadId=uid,
                        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": '"x"'}]},
                    )
                assert failed.value.response["Error"]["Code"] == "NoSuchUpload"
                with pytest.raises(s3.exceptions.ClientError) as failed:
                    s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=uid)
                assert failed.value.response["Error"]["Code"] == "NoSuchUpload"
            assert not escape.exists()
            # The real upload, sent for its own key, still works, whole.
            part = s3.upload_part(
                Bucket="far", Key="mp/real", UploadId=real, PartNumber=1, Body=b"ok"
            )
            s3.complete_multipart_upload(
                Bucket="far",
                Key="mp/real",
                UploadId=real,
                MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["ETag"]}]},
            )
            assert s3.get_object(Bucket="far", Key="mp/real")["Body"].read() == b"ok"
            # An upload whose staged parts are gone (a completion that failed after joining
            # them) can still be aborted: nothing of it stays listed.
            lost = s3.create_multipart_upload(Bucket="far", Key="mp/lost")["UploadId"]
            shutil.rmtree(tmp_path / "staging" / "lota-uploads" / decode_upload_id(lost)[1])
            s3.abort_multipart_upload(Bucket="far", Key="mp/lost", UploadId=lost)
            listed = s3.list_multipart_uploads(Bucket="far", Prefix="mp/").get("Uploads", [])
            assert lost not in [u["UploadId"] for u in listed]
        finally:
            node.kill()
