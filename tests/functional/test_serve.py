"""The `lota serve` process: probes, metrics, HTTPS with trailing checksums, SIGTERM drain."""

from __future__ import annotations

import base64
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
import warnings
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.config import Config as BotoConfig

from lota import __version__
from lota.embedded import EmbeddedOrigin
from lota.testing.processes import LotaProcess
from tests.conftest import client_for

MiB = 1024 * 1024


def test_probes_and_prometheus_metrics(lota: LotaProcess, s3: Any, bucket: str) -> None:
    for path, body in (("/_lota/healthz", b"ok\n"), ("/_lota/readyz", b"ready\n")):
        with urllib.request.urlopen(lota.url + path) as r:
            assert (r.status, r.read()) == (200, body)
    s3.put_object(Bucket=bucket, Key="m", Body=b"x")
    metrics = lota.metrics()
    assert 'lota_requests_total{operation="PutObject",status="200"}' in metrics
    assert "lota_request_seconds_bucket" in metrics
    assert 'lota_origin_seconds_count{region="us-east"}' in metrics
    assert "lota_bytes_in_total" in metrics
    assert f'lota_build_info{{version="{__version__}"}} 1.0' in metrics.splitlines()
    assert "lota_ready 1.0" in metrics.splitlines()
    # Counters alerts take rate() of start at 0, so that their first event shows as a rise.
    for zero in (
        'lota_origin_errors_total{region="us-east"}',
        'lota_peer_fallbacks_total{to="origin"}',
        'lota_lifecycle_transitions_total{tier="archive"}',
    ):
        assert f"{zero} 0.0" in metrics.splitlines()
    assert not [line for line in metrics.splitlines() if "_created" in line]


@pytest.fixture
def tls_node(origin: str, credentials_file: Path, tmp_path: Path) -> Iterator[LotaProcess]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    node = LotaProcess(
        [
            "--origin",
            origin,
            "--credentials",
            str(credentials_file),
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
        ],
        log_path=tmp_path / "lota.log",
    )
    node.url = node.url.replace("http://", "https://")
    yield node.start()
    node.stop()


def test_https_with_boto3_default_trailing_checksums(
    tls_node: LotaProcess, bucket: str, origin_s3: Any, tmp_path: Path
) -> None:
    # Over HTTPS, boto3's defaults send aws-chunked bodies with unsigned payloads and a
    # trailing x-amz-checksum-crc32: LOTA decodes and checks them, and keeps the checksum.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # urllib3's InsecureRequestWarning for the test cert
        s3 = client_for(tls_node.url)
        s3._endpoint.http_session._verify = False
        sent: list[str] = []
        s3.meta.events.register(
            "before-send.s3.PutObject",
            lambda request, **_: sent.append(request.headers.get("x-amz-content-sha256", b"")),
        )
        data = b"trailing checksum " * 100_000
        s3.put_object(Bucket=bucket, Key="trailer", Body=data)
        big = tmp_path / "big"
        big.write_bytes(data * 10)
        s3.upload_file(str(big), bucket, "multipart")
        assert s3.get_object(Bucket=bucket, Key="trailer")["Body"].read() == data
    crc = base64.b64encode(zlib.crc32(data).to_bytes(4, "big")).decode()
    head = origin_s3.head_object(Bucket=bucket, Key="trailer", ChecksumMode="ENABLED")
    assert head.get("ChecksumCRC32") == crc
    assert origin_s3.head_object(Bucket=bucket, Key="multipart")["ContentLength"] == len(data) * 10
    assert sent and all(
        h in (b"STREAMING-UNSIGNED-PAYLOAD-TRAILER", "STREAMING-UNSIGNED-PAYLOAD-TRAILER")
        for h in sent
    )


async def test_sigterm_drains_in_flight_requests_then_exits_0(
    credentials_file: Path, tmp_path: Path
) -> None:
    # 16 MiB at 8 MB/s: a download that is still running when SIGTERM arrives.
    async with EmbeddedOrigin(bandwidth=8e6) as slow:
        import asyncio

        s3o = await asyncio.to_thread(_origin_client, slow)
        await asyncio.to_thread(s3o.create_bucket, Bucket="drain")
        data = b"d" * (16 * MiB)
        await asyncio.to_thread(s3o.put_object, Bucket="drain", Key="slow", Body=data)
        node = LotaProcess(
            ["--origin", slow.endpoint, "--credentials", str(credentials_file)],
            log_path=tmp_path / "lota.log",
        )
        await asyncio.to_thread(node.start)
        got: list[bytes] = []
        s3 = client_for(node.url, retries={"max_attempts": 1}, read_timeout=60)
        reader = threading.Thread(
            target=lambda: got.append(s3.get_object(Bucket="drain", Key="slow")["Body"].read())
        )
        reader.start()
        await asyncio.sleep(0.5)
        started = time.monotonic()
        code = await asyncio.to_thread(node.stop)
        await asyncio.to_thread(reader.join)
        assert code == 0
        assert got == [data]
        assert time.monotonic() - started > 0.5  # it waited for the download
        assert "draining" in node.log_tail(20)


async def test_after_sigterm_readyz_answers_503_while_a_slow_request_drains(
    credentials_file: Path, tmp_path: Path
) -> None:
    import asyncio

    # 24 MiB at 8 MB/s: three seconds of download still running after SIGTERM.
    async with EmbeddedOrigin(bandwidth=8e6) as slow:
        s3o = await asyncio.to_thread(_origin_client, slow)
        await asyncio.to_thread(s3o.create_bucket, Bucket="drain")
        data = b"d" * (24 * MiB)
        await asyncio.to_thread(s3o.put_object, Bucket="drain", Key="slow", Body=data)
        node = LotaProcess(
            ["--origin", slow.endpoint, "--credentials", str(credentials_file)],
            log_path=tmp_path / "lota.log",
        )
        await asyncio.to_thread(node.start)
        assert node.proc is not None
        s3 = client_for(node.url, retries={"max_attempts": 1}, read_timeout=60)
        got: list[bytes] = []
        reader = threading.Thread(
            target=lambda: got.append(s3.get_object(Bucket="drain", Key="slow")["Body"].read())
        )
        reader.start()
        await asyncio.sleep(0.5)
        node.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)
        probes = await asyncio.to_thread(_probe, node.url, "/_lota/readyz", "/_lota/healthz")
        assert probes == [(503, b"not ready: draining\n"), (200, b"ok\n")]
        assert "lota_ready 0.0" in (await asyncio.to_thread(node.metrics)).splitlines()
        # A new S3 request during the drain: 503, and the connection is not kept.
        with pytest.raises(s3.exceptions.ClientError) as err:
            await asyncio.to_thread(s3.list_objects_v2, Bucket="drain")
        meta = err.value.response["ResponseMetadata"]
        assert (meta["HTTPStatusCode"], err.value.response["Error"]["Code"]) == (
            503,
            "ServiceUnavailable",
        )
        assert meta["HTTPHeaders"].get("connection") == "close"
        await asyncio.to_thread(reader.join)
        assert got == [data]
        assert await asyncio.to_thread(node.proc.wait, 30) == 0


def _probe(url: str, *paths: str) -> list[tuple[int, bytes]]:
    answers = []
    for path in paths:
        try:
            with urllib.request.urlopen(url + path, timeout=5) as r:
                answers.append((r.status, r.read()))
        except urllib.error.HTTPError as exc:
            answers.append((exc.code, exc.read()))
    return answers


def _origin_client(origin: EmbeddedOrigin) -> Any:
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=origin.endpoint,
        aws_access_key_id=origin.access_key_id,
        aws_secret_access_key=origin.secret_access_key,
        region_name="us-east-1",
        config=BotoConfig(retries={"max_attempts": 1}),
    )


def test_serve_with_nothing_configured_starts_an_embedded_origin_and_prints_credentials(
    tmp_path: Path,
) -> None:
    import os
    import re
    import sys

    import boto3

    from lota.testing.processes import free_port

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "LOTA_"))}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lota",
            "serve",
            "--embedded-origin",
            "--listen",
            f"127.0.0.1:{port}",
            "--cache-dir",
            str(tmp_path / "cache"),
            "--cache-size",
            "1GiB",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    try:
        printed = ""
        assert proc.stdout is not None
        for line in proc.stdout:
            printed += line
            if line.startswith("Try:"):
                break
        assert "The embedded origin keeps objects in memory" in printed
        key = re.search(r"AWS_ACCESS_KEY_ID=(\S+)", printed)
        secret = re.search(r"AWS_SECRET_ACCESS_KEY=(\S+)", printed)
        assert key and secret, printed
        s3 = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id=key.group(1),
            aws_secret_access_key=secret.group(1),
        )
        s3.create_bucket(Bucket="first-bucket")
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["first-bucket"]
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        if proc.stdout is not None:
            proc.stdout.close()


def _serve_refused(origin: str, credentials: Path, *cache_dirs: Path) -> tuple[int, list[str]]:
    """Run ``lota serve`` expecting it to refuse to start: (exit code, stderr lines). Logs
    go to stderr too: at WARNING level, a clean start-up logs nothing before the cache."""
    import os
    import sys

    dirs = [arg for d in cache_dirs for arg in ("--cache-dir", str(d))]
    serve = [sys.executable, "-m", "lota", "serve", "--listen", "127.0.0.1:0"]
    done = subprocess.run(
        [*serve, "--origin", origin, "--credentials", str(credentials), *dirs],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LOTA_LOG_LEVEL": "WARNING"},
    )
    return done.returncode, done.stderr.splitlines()


def test_a_second_lota_serve_on_a_cache_dir_in_use_refuses_to_start_naming_the_holder(
    origin: str, credentials_file: Path, tmp_path: Path
) -> None:
    """Two processes on one cache directory evict each other's chunks and serve bytes
    they no longer have: the second one must not start."""
    import socket

    held, spare = tmp_path / "cache", tmp_path / "spare"
    first = LotaProcess(
        ["--origin", origin, "--credentials", str(credentials_file), "--cache-dir", str(held)],
        log_path=tmp_path / "lota.log",
    ).start()
    try:
        assert first.proc is not None
        holder = f"pid {first.proc.pid} on host {socket.gethostname()}"
        expected = f"lota: cache directory {held} is in use by {holder} (lock {held}/lota.lock)"
        assert _serve_refused(origin, credentials_file, held) == (2, [expected])
        # Also when it is not the first of the dirs; the ones locked before it are let go.
        assert _serve_refused(origin, credentials_file, spare, held) == (2, [expected])
        with urllib.request.urlopen(first.url + "/_lota/readyz") as r:
            assert r.status == 200
    finally:
        first.stop()
    both = ["--cache-dir", str(spare), "--cache-dir", str(held)]
    second = LotaProcess(
        ["--origin", origin, "--credentials", str(credentials_file), *both],
        log_path=tmp_path / "lota-2.log",
    ).start()
    second.stop()


@pytest.mark.parametrize("kind", ["under a regular file", "on a read-only file system"])
def test_a_cache_dir_that_cannot_be_created_or_written_is_one_line_and_exit_2(
    kind: str, origin: str, credentials_file: Path, tmp_path: Path
) -> None:
    if kind == "under a regular file":
        (tmp_path / "file").write_bytes(b"x")
        cache = tmp_path / "file" / "cache"
    else:
        cache = tmp_path / "ro"
        cache.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(cache)], check=True
        )
    try:
        code, lines = _serve_refused(origin, credentials_file, cache)
    finally:
        if kind != "under a regular file":
            subprocess.run(["umount", "-l", str(cache)], check=False)
    assert code == 2
    assert len(lines) == 1 and lines[0].startswith(f"lota: cannot use cache directory {cache}: ")
