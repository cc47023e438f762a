"""Other real clients through LOTA with sigv4: the Debian AWS CLI and s3fs (fsspec)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import s3fs

from lota.testing.credentials import PRINCIPALS
from lota.testing.processes import LotaProcess, aws_cli

MiB = 1024 * 1024


def aws(lota: LotaProcess, home: Path, *args: str) -> str:
    return aws_cli(lota.url, home, *args)[0]


def test_aws_cli_cp_sync_ls_rm(
    lota: LotaProcess, bucket: str, origin_s3: Any, tmp_path: Path
) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(20 * MiB))  # above the CLI's 8 MiB multipart threshold
    aws(lota, tmp_path, "s3", "cp", str(big), f"s3://{bucket}/big.bin")
    assert origin_s3.head_object(Bucket=bucket, Key="big.bin")["ContentLength"] == 20 * MiB
    back = tmp_path / "back.bin"
    aws(lota, tmp_path, "s3", "cp", f"s3://{bucket}/big.bin", str(back))
    assert back.read_bytes() == big.read_bytes()

    tree = tmp_path / "tree"
    for name in ("a.txt", "sub/b.txt", "sub/deeper/c.txt"):
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(name * 100)
    aws(lota, tmp_path, "s3", "sync", str(tree), f"s3://{bucket}/tree/")
    listing = aws(lota, tmp_path, "s3", "ls", "--recursive", f"s3://{bucket}/tree/")
    assert sorted(line.split()[-1] for line in listing.splitlines()) == [
        "tree/a.txt",
        "tree/sub/b.txt",
        "tree/sub/deeper/c.txt",
    ]
    assert "PRE sub/" in aws(lota, tmp_path, "s3", "ls", f"s3://{bucket}/tree/")
    copy = tmp_path / "copy"
    aws(lota, tmp_path, "s3", "sync", f"s3://{bucket}/tree/", str(copy))
    assert (copy / "sub/deeper/c.txt").read_text() == "sub/deeper/c.txt" * 100

    aws(lota, tmp_path, "s3", "rm", f"s3://{bucket}/big.bin")
    aws(lota, tmp_path, "s3", "rm", "--recursive", f"s3://{bucket}/tree/")
    assert origin_s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_s3fs_opens_and_reads_through_lota(lota: LotaProcess, bucket: str, origin_s3: Any) -> None:
    data = os.urandom(3 * MiB + 17)
    origin_s3.put_object(Bucket=bucket, Key="shards/000.tar", Body=data)
    key, secret, _ = PRINCIPALS["admin"]
    fs = s3fs.S3FileSystem(
        key=key,
        secret=secret,
        client_kwargs={"endpoint_url": lota.url, "region_name": "us-east-1"},
        skip_instance_cache=True,
    )
    assert fs.ls(f"{bucket}/shards") == [f"{bucket}/shards/000.tar"]
    with fs.open(f"{bucket}/shards/000.tar", "rb", block_size=MiB) as f:
        assert f.read(10) == data[:10]
        f.seek(2 * MiB)
        assert f.read(MiB) == data[2 * MiB : 3 * MiB]
        f.seek(0)
        assert f.read() == data
    with fs.open(f"{bucket}/written-by-s3fs", "wb") as f:
        f.write(b"hello from s3fs")
    assert fs.cat(f"{bucket}/written-by-s3fs") == b"hello from s3fs"
