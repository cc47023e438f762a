"""Shared fixtures: a real moto S3 origin, a real ``lota serve`` in front of it, real clients."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config as BotoConfig

from lota.embedded import moto_server
from lota.testing.credentials import PRINCIPALS, write_credentials
from lota.testing.processes import LotaProcess
from tests.postgres import PostgresServer, PostgresUnavailable
from tests.recorder import RecordingProxy, recording_proxy


@pytest.fixture(scope="session")
def origin() -> Iterator[str]:
    """The endpoint of a moto S3 server in its own process."""
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture(scope="session")
def credentials_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_credentials(tmp_path_factory.mktemp("auth") / "credentials.toml")


@pytest.fixture(scope="session")
def lota(
    origin: str, credentials_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LotaProcess]:
    """One LOTA node with sigv4 auth in front of the origin, shared by the session."""
    work = tmp_path_factory.mktemp("lota")
    node = LotaProcess(
        ["--origin", origin, "--auth", "sigv4", "--credentials", str(credentials_file)],
        log_path=work / "lota.log",
        env={"LOTA_BODY_TIMEOUT": "2s"},
    ).start()
    yield node
    node.stop()


def client_for(endpoint: str, principal: str = "admin", **config: Any) -> Any:
    key, secret, _ = PRINCIPALS[principal]
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=BotoConfig(**config) if config else None,
    )


def presigned_get(endpoint: str, bucket: str, key: str, principal: str = "admin") -> str:
    """A presigned SigV4 GET of the object through `endpoint`, valid ten minutes."""
    s3 = client_for(endpoint, principal, signature_version="s3v4")
    return str(s3.generate_presigned_url("get_object", {"Bucket": bucket, "Key": key}, 600))


@pytest.fixture
def recorder(origin: str) -> Iterator[RecordingProxy]:
    """A proxy in front of the origin that records what reaches it (tests/recorder.py)."""
    with recording_proxy(origin) as proxy:
        yield proxy


@pytest.fixture
def s3(lota: LotaProcess) -> Any:
    """A boto3 client with its default configuration, pointed at LOTA as admin."""
    return client_for(lota.url)


@pytest.fixture
def origin_s3(origin: str) -> Any:
    """A boto3 client talking to the origin directly (to see what really reached it)."""
    return boto3.client(
        "s3",
        endpoint_url=origin,
        aws_access_key_id="lota-origin",
        aws_secret_access_key="lota-origin-secret",
        region_name="us-east-1",
    )


@pytest.fixture
def make_bucket(origin_s3: Any) -> Callable[[], str]:
    def make() -> str:
        name = f"t-{uuid.uuid4().hex[:12]}"
        origin_s3.create_bucket(Bucket=name)
        return name

    return make


@pytest.fixture
def bucket(make_bucket: Callable[[], str]) -> str:
    return make_bucket()


# -- catalog: a real PostgreSQL server, and a catalog URL per backend -----------------------


@pytest.fixture
def opened_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``os.open`` opens from here on, in order: a test clears it to count."""
    opened: list[str] = []
    real_open = os.open

    def counted(path: str, flags: int, *args: Any) -> int:
        opened.append(path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", counted)
    return opened


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A throw-away PostgreSQL server (initdb + pg_ctl), started on first use. Fails, never
    skips, when PostgreSQL is not installed."""
    try:
        server = PostgresServer.start()
    except PostgresUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """The URL of a database on the session's PostgreSQL server."""
    return postgres_server.create_database("lota")


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty catalog URL: once an SQLite file, once a new PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.db'}"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database(f"catalog_{uuid.uuid4().hex[:12]}")
