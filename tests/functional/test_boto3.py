"""boto3, default configuration, through LOTA with sigv4: the everyday S3 calls all work."""

from __future__ import annotations

import hashlib
import http.client
import os
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from lota.testing.processes import LotaProcess
from tests.conftest import client_for

MiB = 1024 * 1024


def test_create_bucket_upload_and_download_100mib_multipart(
    s3: Any, origin_s3: Any, tmp_path: Path
) -> None:
    s3.create_bucket(Bucket="big-files")
    source = tmp_path / "source.bin"
    with source.open("wb") as f:
        for _ in range(100):
            f.write(os.urandom(MiB))
    s3.upload_file(str(source), "big-files", "dir/blob.bin")  # 8 MiB parts: multipart
    head = origin_s3.head_object(Bucket="big-files", Key="dir/blob.bin")
    assert head["ContentLength"] == 100 * MiB
    assert head["ETag"].endswith('-13"'), "upload_file should have used multipart"
    target = tmp_path / "copy.bin"
    s3.download_file("big-files", "dir/blob.bin", str(target))
    assert _sha256(target) == _sha256(source)


def test_put_get_head_preserve_metadata_and_headers(s3: Any, bucket: str) -> None:
    s3.put_object(
        Bucket=bucket,
        Key="a/b.txt",
        Body=b"hello world",
        ContentType="text/plain",
        Metadata={"owner": "trainer", "epoch": "3"},
    )
    got = s3.get_object(Bucket=bucket, Key="a/b.txt")
    assert got["Body"].read() == b"hello world"
    assert got["ContentType"] == "text/plain"
    assert got["Metadata"] == {"owner": "trainer", "epoch": "3"}
    assert got["ETag"] == f'"{hashlib.md5(b"hello world").hexdigest()}"'
    head = s3.head_object(Bucket=bucket, Key="a/b.txt")
    assert head["ContentLength"] == 11
    assert head["LastModified"] == got["LastModified"]
    part = s3.get_object(Bucket=bucket, Key="a/b.txt", Range="bytes=6-")
    assert part["Body"].read() == b"world"
    assert part["ContentRange"] == "bytes 6-10/11"


def test_missing_key_is_the_origins_404_xml(s3: Any, bucket: str) -> None:
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=bucket, Key="nope")
    with pytest.raises(s3.exceptions.ClientError) as err:
        s3.head_object(Bucket=bucket, Key="nope")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_list_with_pagination_prefixes_and_delimiters(s3: Any, bucket: str) -> None:
    keys = [f"data/{d}/{i:03d}.tar" for d in ("train", "val") for i in range(12)] + ["top.txt"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    pages = list(
        s3.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, PaginationConfig={"PageSize": 5}
        )
    )
    assert len(pages) == 5
    assert sorted(o["Key"] for p in pages for o in p["Contents"]) == sorted(keys)
    listing = s3.list_objects_v2(Bucket=bucket, Prefix="data/", Delimiter="/")
    assert [p["Prefix"] for p in listing["CommonPrefixes"]] == ["data/train/", "data/val/"]
    v1 = list(
        s3.get_paginator("list_objects").paginate(
            Bucket=bucket, Prefix="data/val/", PaginationConfig={"PageSize": 7}
        )
    )
    assert [o["Key"] for p in v1 for o in p["Contents"]] == [
        f"data/val/{i:03d}.tar" for i in range(12)
    ]


def test_copy_and_delete_and_batch_delete(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="src", Body=b"payload", Metadata={"k": "v"})
    s3.copy_object(Bucket=bucket, Key="dst", CopySource={"Bucket": bucket, "Key": "src"})
    assert s3.get_object(Bucket=bucket, Key="dst")["Body"].read() == b"payload"
    s3.delete_object(Bucket=bucket, Key="src")
    with pytest.raises(s3.exceptions.NoSuchKey):
        s3.get_object(Bucket=bucket, Key="src")
    for i in range(3):
        s3.put_object(Bucket=bucket, Key=f"batch/{i}", Body=b"x")
    result = s3.delete_objects(
        Bucket=bucket, Delete={"Objects": [{"Key": f"batch/{i}"} for i in range(3)]}
    )
    assert len(result["Deleted"]) == 3
    assert s3.list_objects_v2(Bucket=bucket, Prefix="batch/")["KeyCount"] == 0


def test_bucket_calls_pass_through(s3: Any) -> None:
    s3.create_bucket(Bucket="pass-through-bucket")
    assert "pass-through-bucket" in [b["Name"] for b in s3.list_buckets()["Buckets"]]
    s3.head_bucket(Bucket="pass-through-bucket")
    s3.put_bucket_versioning(
        Bucket="pass-through-bucket", VersioningConfiguration={"Status": "Enabled"}
    )
    assert s3.get_bucket_versioning(Bucket="pass-through-bucket")["Status"] == "Enabled"
    first = s3.put_object(Bucket="pass-through-bucket", Key="v", Body=b"1")["VersionId"]
    s3.put_object(Bucket="pass-through-bucket", Key="v", Body=b"2")
    assert (
        s3.get_object(Bucket="pass-through-bucket", Key="v", VersionId=first)["Body"].read() == b"1"
    )
    s3.put_object_tagging(
        Bucket="pass-through-bucket", Key="v", Tagging={"TagSet": [{"Key": "t", "Value": "1"}]}
    )
    assert s3.get_object_tagging(Bucket="pass-through-bucket", Key="v")["TagSet"] == [
        {"Key": "t", "Value": "1"}
    ]
    lifecycle = {
        "Rules": [
            {
                "ID": "r",
                "Status": "Enabled",
                "Filter": {"Prefix": "tmp/"},
                "Expiration": {"Days": 3},
            }
        ]
    }
    s3.put_bucket_lifecycle_configuration(
        Bucket="pass-through-bucket", LifecycleConfiguration=lifecycle
    )
    assert (
        s3.get_bucket_lifecycle_configuration(Bucket="pass-through-bucket")["Rules"][0]["ID"] == "r"
    )


def test_presigned_get_and_put_urls(s3: Any, bucket: str) -> None:
    put_url = s3.generate_presigned_url(
        "put_object", Params={"Bucket": bucket, "Key": "pre/signed"}, ExpiresIn=300
    )
    # http.client, not urllib: urllib adds a form Content-Type the URL was not signed for.
    parts = urllib.parse.urlsplit(put_url)
    connection = http.client.HTTPConnection(parts.netloc, timeout=30)
    connection.request("PUT", f"{parts.path}?{parts.query}", body=b"via presigned put")
    assert connection.getresponse().status == 200
    connection.close()
    get_url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "pre/signed"}, ExpiresIn=300
    )
    with urllib.request.urlopen(get_url) as r:
        assert r.read() == b"via presigned put"


def test_virtual_hosted_style_through_a_proxy_setting(lota: LotaProcess, bucket: str) -> None:
    # bucket.lota.local does not resolve here; botocore's proxy setting sends the request to
    # LOTA with the virtual-hosted Host header, just as DNS would.
    port = lota.port
    s3v = client_for(
        f"http://lota.local:{port}",
        s3={"addressing_style": "virtual"},
        proxies={"http": lota.url},
    )
    s3v.put_object(Bucket=bucket, Key="virtual/key", Body=b"vh")
    assert s3v.get_object(Bucket=bucket, Key="virtual/key")["Body"].read() == b"vh"
    assert [o["Key"] for o in s3v.list_objects_v2(Bucket=bucket)["Contents"]] == ["virtual/key"]


@pytest.mark.parametrize(
    "key",
    ["../../etc/x", "a//b", "spaces and+plus", "ünïcødé/ключ", "100%25/%2F", "trailing/", "?q=1&x"],
)
def test_tricky_keys_round_trip_unchanged(s3: Any, origin_s3: Any, bucket: str, key: str) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=key.encode())
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == key.encode()
    assert [o["Key"] for o in origin_s3.list_objects_v2(Bucket=bucket)["Contents"]] == [key]


def test_checksums_are_kept(s3: Any, bucket: str) -> None:
    s3.put_object(Bucket=bucket, Key="crc", Body=b"checked", ChecksumAlgorithm="SHA256")
    got = s3.get_object(Bucket=bucket, Key="crc", ChecksumMode="ENABLED")
    assert got["Body"].read() == b"checked"
    assert got["ChecksumSHA256"] == "5ho9eMZRM8cmDEPnGdl8RuFr1Qxk7ngAU2zxTGQHphc="


def test_path_style_with_explicit_config(lota: LotaProcess, bucket: str) -> None:
    s3p = client_for(lota.url, s3={"addressing_style": "path"}, retries={"max_attempts": 1})
    s3p.put_object(Bucket=bucket, Key="p", Body=b"path")
    assert s3p.get_object(Bucket=bucket, Key="p")["Body"].read() == b"path"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(MiB):
            h.update(chunk)
    return h.hexdigest()


ODD_KEYS = ["dir/a b+c%20d", "ünï/cödé ✓", "semi;colon?q=1#frag&x", "100%/+/ /~"]


@pytest.mark.parametrize("source", ODD_KEYS)
def test_copy_object_and_upload_part_copy_reach_the_key_they_name(
    s3: Any, bucket: str, source: str
) -> None:
    # LOTA forwards a copy source it rebuilt from the authorized key: it must decode back
    # to the same key at the origin, whatever the key holds.
    body = os.urandom(6 * 1024 * 1024)
    s3.put_object(Bucket=bucket, Key=source, Body=body)
    s3.copy_object(Bucket=bucket, Key="copy", CopySource={"Bucket": bucket, "Key": source})
    assert s3.get_object(Bucket=bucket, Key="copy")["Body"].read() == body
    upload = s3.create_multipart_upload(Bucket=bucket, Key="parts")["UploadId"]
    part = s3.upload_part_copy(
        Bucket=bucket,
        Key="parts",
        UploadId=upload,
        PartNumber=1,
        CopySource={"Bucket": bucket, "Key": source},
    )
    s3.complete_multipart_upload(
        Bucket=bucket,
        Key="parts",
        UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": part["CopyPartResult"]["ETag"]}]},
    )
    assert s3.get_object(Bucket=bucket, Key="parts")["Body"].read() == body


def test_a_copy_of_an_older_version_copies_that_version(s3: Any, bucket: str) -> None:
    s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    first = s3.put_object(Bucket=bucket, Key="a b+ü", Body=b"first")["VersionId"]
    s3.put_object(Bucket=bucket, Key="a b+ü", Body=b"second")
    source = {"Bucket": bucket, "Key": "a b+ü", "VersionId": first}
    s3.copy_object(Bucket=bucket, Key="copy", CopySource=source)
    assert s3.get_object(Bucket=bucket, Key="copy")["Body"].read() == b"first"


def test_delete_objects_of_keys_xml_must_escape_deletes_exactly_those(s3: Any, bucket: str) -> None:
    # LOTA forwards a body it rebuilt from the parsed keys: escaping must give them back.
    keys = ["a&b<c>\"d'e", "ünï/ ✓ ", "]]>", "keep"]
    for key in keys:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    result = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[:3]]})
    assert sorted(d["Key"] for d in result["Deleted"]) == sorted(keys[:3])
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["keep"]
