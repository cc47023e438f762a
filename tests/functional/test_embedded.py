"""The embedded origin: moto in a subprocess, reached with boto3 directly and through a WAN link."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig

import lota
from lota.embedded import EmbeddedOrigin, OriginStartError, moto_server
from lota.testing.processes import free_port


def s3_client(endpoint: str, secret: str = EmbeddedOrigin.secret_access_key) -> Any:
    """A path-style client (``http://127.0.0.1:PORT/bucket/key``), as LOTA talks to origins."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=EmbeddedOrigin.access_key_id,
        aws_secret_access_key=secret,
        config=BotoConfig(s3={"addressing_style": "path"}),
    )


def put_and_get(endpoint: str, body: bytes) -> tuple[str, bytes, float]:
    """Create a bucket, put and get an object; also time one HEAD on the warm connection."""
    s3 = s3_client(endpoint)
    try:
        bucket = f"emb-{uuid.uuid4().hex[:12]}"
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="dir/object.bin", Body=body)
        got = s3.get_object(Bucket=bucket, Key="dir/object.bin")["Body"].read()
        started = time.perf_counter()
        s3.head_object(Bucket=bucket, Key="dir/object.bin")
        return bucket, got, time.perf_counter() - started
    finally:
        s3.close()


def assert_port_closed(port: int) -> None:
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))


def assert_process_gone(pid: int) -> None:
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_embedded_origin_serves_s3_through_a_wan_link() -> None:
    body = os.urandom(300_000)
    origin = EmbeddedOrigin(latency=0.02, bandwidth=100e6)
    async with origin:
        assert origin.wan is not None
        assert origin.endpoint == origin.wan.endpoint != origin.direct_endpoint
        # boto3 blocks; the link runs on this loop, so boto3 runs in a thread.
        _, got, head_seconds = await asyncio.to_thread(put_and_get, origin.endpoint, body)
        assert got == body
        assert head_seconds >= 2 * 0.02 * 0.9  # one round trip over the emulated WAN
        assert origin.wan.bytes_up > len(body) and origin.wan.bytes_down > len(body)
        pid, ports = origin.pid, (origin.port, origin.wan.port)
    assert pid is not None
    assert_process_gone(pid)
    for port in ports:
        assert_port_closed(port)


async def test_embedded_origin_without_wan_is_moto_itself() -> None:
    async with EmbeddedOrigin(port=free_port()) as origin:
        assert origin.wan is None
        assert origin.endpoint == origin.direct_endpoint == f"http://127.0.0.1:{origin.port}"
        _, got, _ = await asyncio.to_thread(put_and_get, origin.endpoint, b"direct")
        assert got == b"direct"
    with pytest.raises(RuntimeError, match="not started"):
        _ = origin.endpoint


async def test_embedded_origin_on_a_taken_port_fails_clearly() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        origin = EmbeddedOrigin(port=taken.getsockname()[1])
        with pytest.raises(OriginStartError, match=r"cannot listen on 127\.0\.0\.1"):
            await origin.start()
    assert origin.pid is None


async def test_embedded_origin_that_crashes_reports_its_log_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "moto"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit('moto is broken on purpose')\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    origin = EmbeddedOrigin()
    with pytest.raises(OriginStartError, match=r"(?s)exited with status 1.*broken on purpose"):
        await origin.start()
    assert origin.pid is None


def test_moto_server_serves_path_style_and_checks_no_signature() -> None:
    with moto_server() as endpoint:
        bucket, got, _ = put_and_get(endpoint, b"path style")
        stranger = s3_client(endpoint, secret="not-the-secret")
        try:
            body = stranger.get_object(Bucket=bucket, Key="dir/object.bin")["Body"].read()
        finally:
            stranger.close()
        port = int(endpoint.rsplit(":", 1)[1])
    assert got == body == b"path style"
    assert_port_closed(port)


def test_moto_exits_when_its_parent_is_killed() -> None:
    root = str(Path(lota.__file__).resolve().parents[1])
    script = (
        "import time\nfrom lota.embedded import moto_server\n"
        "with moto_server() as endpoint:\n    print(endpoint, flush=True)\n    time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": root},
    )
    try:
        assert parent.stdout is not None
        endpoint = parent.stdout.readline().decode().strip()
        assert endpoint.startswith("http://127.0.0.1:")
    finally:
        parent.kill()
        parent.wait()
        if parent.stdout:
            parent.stdout.close()
    port = int(endpoint.rsplit(":", 1)[1])
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            break
        assert time.monotonic() < deadline, "moto outlived its parent"
        time.sleep(0.05)
