"""The Authenticator: signature, operation and policy together, as the server calls it."""

from __future__ import annotations

import gc
import io
import logging
import sys
import tracemalloc
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.awsrequest import AWSPreparedRequest
from botocore.config import Config
from multidict import CIMultiDict, CIMultiDictProxy

from lota.auth import Authenticator, Authorized, RecentlyVerified, Refused
from lota.auth.sigv4 import RequestView
from lota.clock import FakeClock
from lota.config import AuthConfig
from lota.errors import ConfigError
from lota.s3.addressing import parse_target
from lota.s3.errors import S3Error

PRINCIPALS = {
    "reader": '{"Statement":{"Effect":"Allow","Action":["s3:Get*","s3:List*"],"Resource":"*"}}',
    "guarded": (
        '{"Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"},'
        '{"Effect":"Deny","Action":"s3:PutObject","Resource":"arn:aws:s3:::*/protected/*"}]}'
    ),
    "copier": (
        '{"Statement":[{"Effect":"Allow","Action":"s3:PutObject","Resource":"arn:aws:s3:::dst/*"},'
        '{"Effect":"Allow","Action":"s3:GetObject","Resource":"arn:aws:s3:::src/public/*"}]}'
    ),
    "scratch": (
        '{"Statement":{"Effect":"Allow","Action":"s3:DeleteObject",'
        '"Resource":"arn:aws:s3:::bkt/scratch/*"}}'
    ),
    "nopolicy": None,
}


class Captured(Exception):
    def __init__(self, request: AWSPreparedRequest) -> None:
        super().__init__("captured")
        self.request = request


@pytest.fixture
def credentials(tmp_path: Path) -> Path:
    entries = []
    for name, policy in PRINCIPALS.items():
        entry = (
            f'[[principal]]\nname = "{name}"\naccess_key_id = "AK{name.upper()}"\n'
            f'secret_access_key = "{name}-secret"\n'
        )
        if policy is not None:
            entry += f"policy = '{policy}'\n"
        entries.append(entry)
    path = tmp_path / "credentials.toml"
    path.write_text("\n".join(entries))
    return path


def signed(
    principal: str, call: Callable[[Any], object], endpoint: str = "http://lota.test:9000"
) -> tuple[RequestView, str, str, float, AWSPreparedRequest]:
    """A boto3 request from `principal`, as the server sees it: view, bucket, key, time."""
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=f"AK{principal.upper()}",
        aws_secret_access_key=f"{principal}-secret",
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )

    def stop(request: AWSPreparedRequest, **_: object) -> None:
        raise Captured(request)

    client.meta.events.register("before-send.s3", stop)
    try:
        call(client)
    except Captured as captured:
        request = captured.request
    parts = urlsplit(request.url)
    target = parse_target(parts.netloc, parts.path + ("?" + parts.query if parts.query else ""), "")
    headers = CIMultiDict(
        (k, v.decode() if isinstance(v, bytes) else v) for k, v in request.headers.items()
    )
    assert request.method is not None
    view = RequestView(request.method, target.raw_path, target.query, CIMultiDictProxy(headers))
    stamp = datetime.strptime(headers["x-amz-date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    return view, target.bucket, target.key, stamp.timestamp(), request


def authenticate(credentials: Path, principal: str, call: Callable[[Any], object]) -> Authorized:
    view, bucket, key, when, _ = signed(principal, call)
    auth = Authenticator(AuthConfig(mode="sigv4", credentials=str(credentials)), FakeClock(when))
    return auth.authenticate(view, bucket, key)


def denied(credentials: Path, principal: str, call: Callable[[Any], object]) -> S3Error:
    with pytest.raises(S3Error) as info:
        authenticate(credentials, principal, call)
    return info.value


def test_reader_may_read_and_list(credentials: Path) -> None:
    authorized = authenticate(
        credentials, "reader", lambda s3: s3.get_object(Bucket="bkt", Key="k")
    )
    assert authorized.principal is not None
    assert authorized.principal.name == "reader"
    assert authorized.operation.name == "GetObject"
    assert authorized.verified is not None
    assert (
        authenticate(
            credentials, "reader", lambda s3: s3.list_objects_v2(Bucket="bkt")
        ).operation.name
        == "ListObjectsV2"
    )


def test_reader_may_not_write(credentials: Path) -> None:
    error = denied(
        credentials, "reader", lambda s3: s3.put_object(Bucket="bkt", Key="k", Body=b"x")
    )
    assert (error.code, error.status) == ("AccessDenied", 403)


def test_explicit_deny_under_protected_prefix(credentials: Path) -> None:
    assert authenticate(
        credentials, "guarded", lambda s3: s3.put_object(Bucket="bkt", Key="free/k", Body=b"x")
    )
    error = denied(
        credentials, "guarded", lambda s3: s3.put_object(Bucket="bkt", Key="protected/k", Body=b"x")
    )
    assert error.code == "AccessDenied"
    assert authenticate(
        credentials, "guarded", lambda s3: s3.get_object(Bucket="bkt", Key="protected/k")
    )


def test_multipart_upload_parts_are_puts(credentials: Path) -> None:
    error = denied(
        credentials,
        "guarded",
        lambda s3: s3.upload_part(
            Bucket="bkt", Key="protected/k", UploadId="u", PartNumber=1, Body=b"x"
        ),
    )
    assert error.code == "AccessDenied"


def test_principal_without_policy_is_denied(credentials: Path) -> None:
    assert denied(credentials, "nopolicy", lambda s3: s3.list_buckets()).code == "AccessDenied"


def test_copy_needs_read_permission_on_the_source(credentials: Path) -> None:
    ok = authenticate(
        credentials,
        "copier",
        lambda s3: s3.copy_object(Bucket="dst", Key="k", CopySource="src/public/a"),
    )
    assert ok.operation.copy_source == ("src", "public/a")
    error = denied(
        credentials,
        "copier",
        lambda s3: s3.copy_object(Bucket="dst", Key="k", CopySource="src/private/a"),
    )
    assert error.code == "AccessDenied"
    versioned = denied(
        credentials,
        "copier",
        lambda s3: s3.copy_object(
            Bucket="dst", Key="k", CopySource={"Bucket": "src", "Key": "public/a", "VersionId": "v"}
        ),
    )
    assert versioned.code == "AccessDenied"  # needs s3:GetObjectVersion, not granted


def test_bad_signature_is_refused_before_policy(credentials: Path) -> None:
    view, bucket, key, when, _ = signed("reader", lambda s3: s3.get_object(Bucket="bkt", Key="k"))
    auth = Authenticator(AuthConfig(mode="sigv4", credentials=str(credentials)), FakeClock(when))
    tampered = RequestView(view.method, "/bkt/other", view.query, view.headers)
    with pytest.raises(S3Error) as info:
        auth.authenticate(tampered, bucket, "other")
    assert info.value.code == "SignatureDoesNotMatch"
    late = Authenticator(
        AuthConfig(mode="sigv4", credentials=str(credentials)), FakeClock(when + 3600)
    )
    with pytest.raises(S3Error) as info:
        late.authenticate(view, bucket, key)
    assert info.value.code == "RequestTimeTooSkewed"


def test_a_refusal_says_which_operation_was_asked_for_and_who_was_refused(
    credentials: Path,
) -> None:
    # For the access log: a failed login is not an "Unknown" operation.
    error = denied(
        credentials, "reader", lambda s3: s3.put_object(Bucket="bkt", Key="k", Body=b"x")
    )
    assert isinstance(error, Refused)
    assert (error.code, error.operation, error.principal) == ("AccessDenied", "PutObject", "reader")
    view, bucket, key, when, _ = signed("reader", lambda s3: s3.get_object(Bucket="bkt", Key="k"))
    auth = Authenticator(AuthConfig(mode="sigv4", credentials=str(credentials)), FakeClock(when))
    forged = RequestView(view.method, "/bkt/other", view.query, view.headers)
    with pytest.raises(Refused) as info:
        auth.authenticate(forged, bucket, "other")
    assert (info.value.code, info.value.operation, info.value.principal) == (
        "SignatureDoesNotMatch",
        "GetObject",
        "-",
    )
    # A stranger's made-up subresource is not repeated: it would be a new metric label.
    odd = RequestView(view.method, f"/{bucket}/{key}?made-up", (("made-up", ""),), view.headers)
    with pytest.raises(Refused) as info:
        auth.authenticate(odd, bucket, key)
    assert (info.value.code, info.value.operation) == ("SignatureDoesNotMatch", "Unknown")


def test_per_key_checks_for_delete_objects(credentials: Path) -> None:
    view, bucket, key, when, _ = signed(
        "guarded", lambda s3: s3.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": "a"}]})
    )
    auth = Authenticator(AuthConfig(mode="sigv4", credentials=str(credentials)), FakeClock(when))
    authorized = auth.authenticate(view, bucket, key)
    assert authorized.operation.name == "DeleteObjects"
    assert auth.allows(authorized, "s3:DeleteObject", "arn:aws:s3:::bkt/a")
    assert not auth.allows(authorized, "s3:PutObject", "arn:aws:s3:::bkt/protected/a")


def test_delete_objects_needs_no_bucket_permission_only_delete_object_on_each_key(
    credentials: Path,
) -> None:
    view, bucket, key, when, _ = signed(
        "scratch",
        lambda s3: s3.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": "scratch/a"}]}),
    )
    auth = Authenticator(AuthConfig(mode="sigv4", credentials=str(credentials)), FakeClock(when))
    authorized = auth.authenticate(view, bucket, key)  # as on AWS: no check on the bucket
    assert authorized.operation.per_key
    assert auth.allows(authorized, "s3:DeleteObject", "arn:aws:s3:::bkt/scratch/a")
    assert not auth.allows(authorized, "s3:DeleteObject", "arn:aws:s3:::bkt/important/model.bin")
    assert not auth.allows(authorized, "s3:DeleteObjectVersion", "arn:aws:s3:::bkt/scratch/a")


def test_decoder_for_a_streaming_upload(credentials: Path) -> None:
    payload = b"0123456789" * 10000
    view, bucket, key, when, request = signed(
        "guarded",
        lambda s3: s3.put_object(Bucket="bkt", Key="k", Body=io.BytesIO(payload)),
        endpoint="https://lota.test:9000",
    )
    auth = Authenticator(AuthConfig(mode="sigv4", credentials=str(credentials)), FakeClock(when))
    authorized = auth.authenticate(view, bucket, key)
    decoder = auth.decoder(view, authorized)
    wire = request.body.read()  # type: ignore[union-attr]
    out = b"".join(decoder.feed(wire[i : i + 1000]) for i in range(0, len(wire), 1000))
    decoder.finish()
    assert out == payload
    assert set(decoder.trailers) == {"x-amz-checksum-crc32"}


def test_auth_off_accepts_anyone_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="lota.auth"):
        auth = Authenticator(AuthConfig(mode="none"), FakeClock())
    assert any(
        r.levelno == logging.WARNING and "AUTHENTICATION IS OFF" in r.getMessage()
        for r in caplog.records
    )
    anonymous = RequestView(
        "PUT", "/b/k", (), CIMultiDictProxy(CIMultiDict({"content-length": "3"}))
    )
    authorized = auth.authenticate(anonymous, "b", "k")
    assert (authorized.principal, authorized.verified) == (None, None)
    assert authorized.operation.name == "PutObject"
    assert auth.allows(authorized, "s3:DeleteBucket", "arn:aws:s3:::bkt")
    decoder = auth.decoder(anonymous, authorized)
    decoder.feed(b"ab")
    with pytest.raises(S3Error) as info:
        decoder.finish()
    assert info.value.code == "IncompleteBody"


def test_sigv4_mode_needs_a_readable_credentials_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        Authenticator(AuthConfig(mode="sigv4", credentials=str(tmp_path / "missing")), FakeClock())


def presigned_view(url: str, headers: dict[str, str] | None = None) -> tuple[RequestView, str, str]:
    parts = urlsplit(url)
    target = parse_target(parts.netloc, f"{parts.path}?{parts.query}", "")
    fields = CIMultiDictProxy(CIMultiDict({"Host": parts.netloc, **(headers or {})}))
    return RequestView("GET", target.raw_path, target.query, fields), target.bucket, target.key


def presign(principal: str, key: str, expires: int, version: str = "s3v4") -> str:
    client = boto3.client(
        "s3",
        endpoint_url="http://lota.test:9000",
        aws_access_key_id=f"AK{principal.upper()}",
        aws_secret_access_key=f"{principal}-secret",
        region_name="us-east-1",
        config=Config(signature_version=version, s3={"addressing_style": "path"}),
    )
    return str(
        client.generate_presigned_url(
            "get_object", Params={"Bucket": "bkt", "Key": key}, ExpiresIn=expires
        )
    )


@pytest.mark.parametrize("version", ["s3v4", "s3"])
def test_a_repeated_presigned_get_is_verified_once_and_only_while_valid(
    credentials: Path, monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    clock = FakeClock(datetime.now(UTC).timestamp())
    auth = Authenticator(AuthConfig(mode="sigv4", credentials=str(credentials)), clock)
    checks: list[str] = []
    real = auth._verify
    monkeypatch.setattr(auth, "_verify", lambda *a: checks.append("verify") or real(*a))
    view, bucket, key = presigned_view(presign("reader", "data/0", expires=60, version=version))
    first = auth.authenticate(view, bucket, key)
    for _ in range(3):
        assert auth.authenticate(view, bucket, key) is first
    assert checks == ["verify"]
    # The same URL once it has expired: verified again, and refused as S3 would.
    clock.advance(120)
    with pytest.raises(S3Error) as info:
        auth.authenticate(view, bucket, key)
    assert info.value.code == "AccessDenied" and "expired" in info.value.message
    assert checks == ["verify", "verify"]


def _presigned_views(count: int, key: str = "data/{}") -> list[tuple[RequestView, str, str]]:
    client = boto3.client(
        "s3",
        endpoint_url="http://lota.test:9000",
        aws_access_key_id="AKREADER",
        aws_secret_access_key="reader-secret",
        region_name="us-east-1",
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )
    return [
        presigned_view(
            client.generate_presigned_url("get_object", {"Bucket": "bkt", "Key": key.format(i)})
        )
        for i in range(count)
    ]


def test_verdicts_are_remembered_for_a_working_set_of_urls_bounded_by_their_memory(
    credentials: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of presigned URLs read round after round are verified once each (the
    cache is not sized to a handful of them); a cache bounded to less memory forgets the
    least recently used first and keeps within its bound."""
    views = _presigned_views(3000)
    for bound, remembered in ((RecentlyVerified.MAX_BYTES, 3000), (300_000, None)):
        clock = FakeClock(datetime.now(UTC).timestamp())
        auth = Authenticator(AuthConfig(mode="sigv4", credentials=str(credentials)), clock)
        auth._recent = RecentlyVerified(max_bytes=bound)
        checks: list[str] = []

        def counted(*args: Any, real: Any = auth._verify, checks: list[str] = checks) -> Any:
            checks.append("verify")
            return real(*args)

        monkeypatch.setattr(auth, "_verify", counted)
        for _ in range(2):
            for view, bucket, key in views:
                auth.authenticate(view, bucket, key)
        if remembered is not None:
            assert (len(auth._recent), len(checks)) == (remembered, 3000)
        else:  # each round pushes out the URLs it will ask for next: verified every time
            entry = RecentlyVerified.ENTRY_BYTES + sys.getsizeof("arn:aws:s3:::bkt/data/1000")
            assert bound // entry == len(auth._recent)
            assert len(checks) == 6000


@pytest.mark.parametrize(
    "key", ["data/{}", "data/{}/" + "long-name/" * 90, "data/{}/" + "\U0001f600" * 250]
)
def test_a_remembered_verdict_takes_the_memory_counted_for_it_whatever_the_url(
    credentials: Path, key: str
) -> None:
    """What the memory of verdicts counts per verdict (ENTRY_BYTES and the resource, which
    names the key) is what one holds, to within half (traced over 2,000 presigned URLs),
    for short keys, keys of ~1,000 characters and keys of emoji alike: the bound is on
    memory, not on the request's characters."""
    views = _presigned_views(2000, key)
    clock = FakeClock(datetime.now(UTC).timestamp())
    auth = Authenticator(AuthConfig(mode="sigv4", credentials=str(credentials)), clock)
    auth.authenticate(*_presigned_views(1, "warm-up")[0])  # the signing key, once a day
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for view, bucket, name in views:
            auth.authenticate(view, bucket, name)
        gc.collect()
        per_verdict = (tracemalloc.get_traced_memory()[0] - before) / len(views)
    finally:
        tracemalloc.stop()
    assert len(auth._recent) == 2001
    counted = RecentlyVerified.ENTRY_BYTES + sys.getsizeof(f"arn:aws:s3:::bkt/{views[1000][2]}")
    assert counted / 2 <= per_verdict <= counted


def test_a_remembered_verdict_never_covers_a_different_request(credentials: Path) -> None:
    clock = FakeClock(datetime.now(UTC).timestamp())
    auth = Authenticator(AuthConfig(mode="sigv4", credentials=str(credentials)), clock)
    url = presign("reader", "data/0", expires=60)
    view, bucket, key = presigned_view(url)
    auth.authenticate(view, bucket, key)
    # Another key under the same signature, or another Host (signed): refused.
    other = RequestView("GET", "/bkt/data/1", view.query, view.headers)
    with pytest.raises(S3Error) as info:
        auth.authenticate(other, bucket, "data/1")
    assert info.value.code == "SignatureDoesNotMatch"
    moved, bucket, key = presigned_view(url, {"Host": "elsewhere.test:9000"})
    with pytest.raises(S3Error) as info:
        auth.authenticate(moved, bucket, key)
    assert info.value.code == "SignatureDoesNotMatch"
    # An unsigned x-amz-* header added to the remembered request: refused.
    extra, bucket, key = presigned_view(url, {"x-amz-meta-smuggled": "1"})
    with pytest.raises(S3Error) as info:
        auth.authenticate(extra, bucket, key)
    assert info.value.code == "AccessDenied"


def test_reads_signed_in_a_header_are_not_remembered(
    credentials: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client signs each header-signed request afresh (boto3 does): remembering its
    verdicts would only push presigned URLs out, so a repeat is verified again."""
    checks, auth = _sent_twice(
        credentials, monkeypatch, "reader", lambda s3: s3.get_object(Bucket="bkt", Key="k")
    )
    assert (checks, len(auth._recent)) == (["verify", "verify"], 0)


def test_writes_are_verified_every_time(credentials: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checks, _ = _sent_twice(
        credentials,
        monkeypatch,
        "guarded",
        lambda s3: s3.put_object(Bucket="bkt", Key="k", Body=b"x"),
    )
    assert checks == ["verify", "verify"]


def _sent_twice(
    credentials: Path,
    monkeypatch: pytest.MonkeyPatch,
    principal: str,
    call: Callable[[Any], object],
) -> tuple[list[str], Authenticator]:
    """The same boto3 request from `principal` authenticated twice: a "verify" per full
    signature check, and the authenticator."""
    view, bucket, key, when, _ = signed(principal, call)
    auth = Authenticator(AuthConfig(mode="sigv4", credentials=str(credentials)), FakeClock(when))
    checks: list[str] = []
    real = auth._verify
    monkeypatch.setattr(auth, "_verify", lambda *a: checks.append("verify") or real(*a))
    for _ in range(2):
        auth.authenticate(view, bucket, key)
    return checks, auth
