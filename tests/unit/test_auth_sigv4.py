"""SigV4 verification against requests botocore really signs, and every way to break one."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from lota.auth.credentials import CredentialStore, Principal
from lota.auth.policy import Policy
from lota.auth.sigv4 import (
    UNSIGNED_PAYLOAD,
    RequestView,
    canonical_uri,
    sign_headers,
    signing_key,
    verify,
)
from lota.s3.addressing import split_target
from lota.s3.errors import S3Error

AK = "AKIATESTTESTTEST0001"
SECRET = "s3cr3t/with+slash=and+plus"
STORE = CredentialStore([Principal("tester", AK, SECRET, Policy.deny_all())])
ENDPOINT = "http://lota.test:9000"

TRICKY_KEYS = [
    "plain.txt",
    "with space.txt",
    "plus+sign",
    "percent%25literal%",
    "ünïcödé/ファイル/😀",
    "double//slash",
    "../../etc/passwd",
    "./dot/./segments/.",
    "trailing/",
    "~tilde-_.unreserved",
    "!*'()&$,;=:@ sub-delims",
    "question?mark#hash",
    "%2F-looks-encoded",
    "tab\tand\nnewline",
]


class Captured(Exception):
    def __init__(self, request: AWSPreparedRequest) -> None:
        super().__init__("captured")
        self.request = request


def client(region: str = "us-east-1", secret: str = SECRET, **config: Any) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        aws_access_key_id=AK,
        aws_secret_access_key=secret,
        region_name=region,
        config=Config(
            s3={"addressing_style": config.pop("style", "path")},
            retries={"total_max_attempts": 1},
            signature_version="s3v4",
            **config,
        ),
    )


def capture(call: Callable[[Any], object], **options: Any) -> AWSPreparedRequest:
    """The request boto3 signs for `call`, stopped before it is sent."""
    s3 = client(**options)

    def stop(request: AWSPreparedRequest, **_: object) -> None:
        raise Captured(request)

    s3.meta.events.register("before-send.s3", stop)
    try:
        call(s3)
    except Captured as captured:
        return captured.request
    raise AssertionError("boto3 sent nothing")


def view_of(url: str, method: str = "GET", headers: Any = None) -> RequestView:
    """What LOTA's server builds from the request line and headers."""
    parts = urlsplit(url)
    raw_path, query = split_target(parts.path + ("?" + parts.query if parts.query else ""))
    merged: CIMultiDict[str] = CIMultiDict()
    for name, value in (headers or {}).items():
        merged.add(name, value.decode() if isinstance(value, bytes) else value)
    if "host" not in merged:
        merged["Host"] = parts.netloc
    return RequestView(method, raw_path, query, CIMultiDictProxy(merged))


def view_of_request(request: AWSPreparedRequest) -> RequestView:
    assert request.method is not None
    return view_of(request.url, request.method, request.headers)


def request_time(view: RequestView) -> datetime:
    stamp = view.headers.get("x-amz-date") or dict(view.query)["X-Amz-Date"]
    return datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)


def error_code(view: RequestView, now: datetime | None = None, store: Any = STORE) -> str:
    with pytest.raises(S3Error) as info:
        verify(view, store, now or request_time(view), 900)
    return info.value.code


def with_headers(view: RequestView, **changes: str) -> RequestView:
    headers = CIMultiDict(view.headers)
    for name, value in changes.items():
        headers[name.replace("_", "-")] = value
    return replace(view, headers=CIMultiDictProxy(headers))


def presign(key: str, expires: int = 300, method: str = "get_object", **params: Any) -> str:
    url: str = client().generate_presigned_url(
        method, Params={"Bucket": "bkt", "Key": key, **params}, ExpiresIn=expires
    )
    return url


# --- accepted ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_botocore_put_with_tricky_key_verifies(key: str) -> None:
    request = capture(
        lambda s3: s3.put_object(
            Bucket="bkt",
            Key=key,
            Body=b"hello",
            ContentType="text/x; a=b",
            Metadata={"m": " a  b "},
        )
    )
    view = view_of_request(request)
    verified = verify(view, STORE, request_time(view), 900)
    assert verified.principal.name == "tester"
    assert verified.region == "us-east-1"
    assert verified.scope.endswith("/us-east-1/s3/aws4_request")
    assert verified.payload_hash == view.headers["x-amz-content-sha256"]
    assert verified.signing_key == signing_key(SECRET, verified.scope[:8], "us-east-1")


@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_botocore_presigned_get_with_tricky_key_verifies(key: str) -> None:
    view = view_of(presign(key, ResponseContentDisposition="attachment; filename=x y"))
    verified = verify(view, STORE, request_time(view), 900)
    assert verified.payload_hash == UNSIGNED_PAYLOAD


@pytest.mark.parametrize(
    "call",
    [
        lambda s3: s3.list_objects_v2(Bucket="bkt", Prefix="a b/+c&d=e", Delimiter="/"),
        lambda s3: s3.list_object_versions(Bucket="bkt", KeyMarker="ü", Prefix=""),
        lambda s3: s3.get_object_acl(Bucket="bkt", Key="k"),
        lambda s3: s3.get_object(Bucket="bkt", Key="k", VersionId="a+b/c=", Range="bytes=0-9"),
        lambda s3: s3.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": "a"}]}),
        lambda s3: s3.copy_object(Bucket="bkt", Key="k", CopySource="src/a b?c"),
        lambda s3: s3.list_buckets(),
    ],
)
def test_botocore_requests_with_queries_verify(call: Callable[[Any], object]) -> None:
    view = view_of_request(capture(call))
    assert verify(view, STORE, request_time(view), 900).principal.name == "tester"


def test_any_region_in_the_scope_is_verified_with_that_region() -> None:
    view = view_of_request(capture(lambda s3: s3.get_object(Bucket="b", Key="k"), region="ap-x-9"))
    assert verify(view, STORE, request_time(view), 900).region == "ap-x-9"


def test_virtual_hosted_style_verifies() -> None:
    request = capture(lambda s3: s3.get_object(Bucket="bkt", Key="a b"), style="virtual")
    assert urlsplit(request.url).hostname == "bkt.lota.test"
    view = view_of_request(request)
    verify(view, STORE, request_time(view), 900)


def test_date_header_instead_of_x_amz_date() -> None:
    request = AWSRequest(
        method="GET", url=f"{ENDPOINT}/bkt/k", headers={"Date": "Mon, 01 Jan 2024 00:00:00 GMT"}
    )
    S3SigV4Auth(Credentials(AK, SECRET), "s3", "us-east-1").add_auth(request)
    assert "X-Amz-Date" not in request.headers
    view = view_of(request.url, "GET", dict(request.headers.items()))
    date = parsedate_to_datetime(view.headers["date"]).replace(tzinfo=UTC)
    assert verify(view, STORE, date, 900).date == date
    assert error_code(view, now=date + timedelta(hours=1)) == "RequestTimeTooSkewed"


def test_repeated_headers_are_joined_with_commas() -> None:
    request = AWSRequest(method="GET", url=f"{ENDPOINT}/bkt/k")
    # botocore's HTTPHeaders is an email.message.Message: assignment appends a repeat.
    request.headers["x-amz-meta-a"] = "one"
    request.headers["x-amz-meta-a"] = "  two   three "
    S3SigV4Auth(Credentials(AK, SECRET), "s3", "us-east-1").add_auth(request)
    signed = CIMultiDict[str]()
    for name, value in request.headers.items():
        signed.add(name, value)
    assert signed.getall("x-amz-meta-a") == ["one", "  two   three "]
    view = view_of(request.url, "GET", signed)
    verify(view, STORE, request_time(view), 900)
    reordered = CIMultiDict(signed)
    reordered.popall("x-amz-meta-a")
    reordered.extend([("x-amz-meta-a", "  two   three "), ("x-amz-meta-a", "one")])
    assert error_code(replace(view, headers=CIMultiDictProxy(reordered))) == (
        "SignatureDoesNotMatch"
    )


def test_a_client_that_signs_its_raw_path_verbatim_is_accepted() -> None:
    # botocore signs the path as sent; here it is one that is not canonically encoded.
    url = f"{ENDPOINT}/bkt/it's(1)!"
    request = AWSRequest(method="GET", url=url)
    S3SigV4Auth(Credentials(AK, SECRET), "s3", "us-east-1").add_auth(request)
    view = view_of(url, "GET", dict(request.headers.items()))
    assert canonical_uri(view.raw_path) != view.raw_path
    verify(view, STORE, request_time(view), 900)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(key=st.text(min_size=1, max_size=40).filter(lambda k: "\x00" not in k))
def test_any_key_botocore_signs_verifies(key: str) -> None:
    """Property: whatever the key, botocore's signature and ours agree."""
    try:
        key.encode()
    except UnicodeEncodeError:
        return  # lone surrogates cannot be sent at all
    view = view_of_request(capture(lambda s3: s3.head_object(Bucket="bkt", Key=key)))
    verify(view, STORE, request_time(view), 900)


# --- rejected: each single mutation ------------------------------------------------------


@pytest.fixture
def signed_put() -> RequestView:
    request = capture(
        lambda s3: s3.put_object(
            Bucket="bkt", Key="dir/a b+c", Body=b"hello", ContentType="text/plain"
        )
    )
    return view_of_request(request)


def test_wrong_secret(signed_put: RequestView) -> None:
    store = CredentialStore([Principal("tester", AK, SECRET + "x", Policy.deny_all())])
    assert error_code(signed_put, store=store) == "SignatureDoesNotMatch"


def test_unknown_access_key(signed_put: RequestView) -> None:
    store = CredentialStore([Principal("other", "AKIAOTHER", SECRET, Policy.deny_all())])
    assert error_code(signed_put, store=store) == "InvalidAccessKeyId"


@pytest.mark.parametrize(
    "change",
    [
        {"content_type": "text/html"},
        {"x_amz_content_sha256": "0" * 64},
        {"x_amz_date": "20200101T000000Z"},
        {"host": "evil.test:9000"},
    ],
)
def test_changed_signed_header(signed_put: RequestView, change: dict[str, str]) -> None:
    view = with_headers(signed_put, **change)
    code = error_code(view, now=request_time(signed_put))
    assert code in ("SignatureDoesNotMatch", "AuthorizationHeaderMalformed")


def test_changed_path(signed_put: RequestView) -> None:
    for raw_path in (
        "/bkt/dir/a%20b%2Bd",
        "/bkt/dir//a%20b%2Bc",
        "/bkt2/dir/a%20b%2Bc",
        "/bkt/dir/a%20b%2B",
    ):
        view = replace(signed_put, raw_path=raw_path)
        assert error_code(view) == "SignatureDoesNotMatch", raw_path


def test_another_spelling_of_the_same_key_is_the_same_request(signed_put: RequestView) -> None:
    # '+' is literal in a path: "a%20b+c" and "a%20b%2Bc" both decode to the key "dir/a b+c".
    verify(replace(signed_put, raw_path="/bkt/dir/a%20b+c"), STORE, request_time(signed_put), 900)


def test_changed_method(signed_put: RequestView) -> None:
    assert error_code(replace(signed_put, method="POST")) == "SignatureDoesNotMatch"


def test_added_or_changed_query(signed_put: RequestView) -> None:
    assert error_code(replace(signed_put, query=(("acl", ""),))) == "SignatureDoesNotMatch"
    listing = view_of_request(capture(lambda s3: s3.list_objects_v2(Bucket="bkt", Prefix="a")))
    changed = tuple((k, "b" if k == "prefix" else v) for k, v in listing.query)
    assert error_code(replace(listing, query=changed)) == "SignatureDoesNotMatch"


def test_tampered_signature(signed_put: RequestView) -> None:
    auth = signed_put.headers["authorization"]
    flipped = auth[:-1] + ("0" if auth[-1] != "0" else "1")
    assert error_code(with_headers(signed_put, authorization=flipped)) == "SignatureDoesNotMatch"


def test_unsigned_amz_header_is_refused(signed_put: RequestView) -> None:
    view = with_headers(signed_put, x_amz_copy_source="other/secret")
    with pytest.raises(S3Error) as info:
        verify(view, STORE, request_time(view), 900)
    assert info.value.code == "AccessDenied"
    assert info.value.extra["HeadersNotSigned"] == "x-amz-copy-source"


@pytest.mark.parametrize("offset", [901, -901, 86400])
def test_clock_skew(signed_put: RequestView, offset: int) -> None:
    now = request_time(signed_put) + timedelta(seconds=offset)
    assert error_code(signed_put, now=now) == "RequestTimeTooSkewed"


@pytest.mark.parametrize("offset", [899, -899])
def test_skew_within_limits(signed_put: RequestView, offset: int) -> None:
    verify(signed_put, STORE, request_time(signed_put) + timedelta(seconds=offset), 900)


# --- presigned URLs ----------------------------------------------------------------------


def test_presign_expiry() -> None:
    view = view_of(presign("k", expires=60))
    start = request_time(view)
    verify(view, STORE, start + timedelta(seconds=60), 900)
    with pytest.raises(S3Error) as info:
        verify(view, STORE, start + timedelta(seconds=61), 900)
    assert (info.value.code, info.value.message) == ("AccessDenied", "Request has expired")


def test_presign_from_the_future() -> None:
    view = view_of(presign("k"))
    with pytest.raises(S3Error) as info:
        verify(view, STORE, request_time(view) - timedelta(seconds=1000), 900)
    assert info.value.code == "AccessDenied"


def test_presign_longer_than_a_week_is_refused() -> None:
    view = view_of(presign("k", expires=604801))
    assert error_code(view) == "AuthorizationQueryParametersError"
    verify(view_of(presign("k", expires=604800)), STORE, request_time(view), 900)


def test_presign_tampered_query() -> None:
    view = view_of(presign("k", ResponseContentType="text/plain"))
    changed = tuple((k, "text/html" if k == "response-content-type" else v) for k, v in view.query)
    assert error_code(replace(view, query=changed)) == "SignatureDoesNotMatch"
    added = (*view.query, ("versionId", "old"))
    assert error_code(replace(view, query=added)) == "SignatureDoesNotMatch"
    longer = tuple((k, "3600" if k == "X-Amz-Expires" else v) for k, v in view.query)
    assert error_code(replace(view, query=longer)) == "SignatureDoesNotMatch"


def test_presign_for_another_key_does_not_open_this_one() -> None:
    view = view_of(presign("public/a"))
    assert error_code(replace(view, raw_path="/bkt/private/a")) == "SignatureDoesNotMatch"


def test_presign_with_an_injected_amz_header_is_refused() -> None:
    view = view_of(presign("k", method="put_object"), method="PUT")
    verify(view, STORE, request_time(view), 900)
    assert error_code(with_headers(view, x_amz_acl="public-read")) == "AccessDenied"


@pytest.mark.parametrize(
    ("drop", "code"),
    [
        ("X-Amz-Signature", "AuthorizationQueryParametersError"),
        ("X-Amz-Credential", "AuthorizationQueryParametersError"),
        ("X-Amz-Expires", "AuthorizationQueryParametersError"),
        ("X-Amz-Date", "AuthorizationQueryParametersError"),
        ("X-Amz-SignedHeaders", "AuthorizationQueryParametersError"),
    ],
)
def test_presign_missing_parameter(drop: str, code: str) -> None:
    view = view_of(presign("k"))
    view = replace(view, query=tuple(p for p in view.query if p[0] != drop))
    with pytest.raises(S3Error) as info:
        verify(view, STORE, datetime.now(UTC), 900)
    assert info.value.code == code


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA1"),
        ("X-Amz-Expires", "-1"),
        ("X-Amz-Expires", "1e3"),
        ("X-Amz-Date", "2024-01-01T00:00:00Z"),
        ("X-Amz-Credential", "AK/20240101/us-east-1/s3"),
        ("X-Amz-Credential", "AK/20240101/us-east-1/sqs/aws4_request"),
        ("X-Amz-SignedHeaders", "range"),
        ("X-Amz-Signature", "XYZ"),
    ],
)
def test_presign_malformed_parameter(name: str, value: str) -> None:
    view = view_of(presign("k"))
    view = replace(view, query=tuple((k, value if k == name else v) for k, v in view.query))
    assert error_code(view, now=datetime.now(UTC)) == "AuthorizationQueryParametersError"


# --- malformed or missing authentication -------------------------------------------------


def bare(headers: dict[str, str], query: tuple[tuple[str, str], ...] = ()) -> RequestView:
    return RequestView(
        "GET", "/bkt/k", query, CIMultiDictProxy(CIMultiDict({"Host": "h", **headers}))
    )


GOOD_AUTH = (
    f"AWS4-HMAC-SHA256 Credential={AK}/20240101/us-east-1/s3/aws4_request, "
    f"SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={'a' * 64}"
)
GOOD_HEADERS = {"x-amz-date": "20240101T000000Z", "x-amz-content-sha256": UNSIGNED_PAYLOAD}
JAN_1 = datetime(2024, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "AccessDenied"),
        ({"authorization": "AWS AKIDEXAMPLE:frJIUN8DYpKDtOLCwo//yllqDzg="}, "InvalidRequest"),
        ({"authorization": "AWS4-ECDSA-P256-SHA256 Credential=x"}, "InvalidRequest"),
        ({"authorization": "Bearer token"}, "InvalidRequest"),
        (
            {"authorization": "AWS4-HMAC-SHA256 garbage", **GOOD_HEADERS},
            "AuthorizationHeaderMalformed",
        ),
        ({"authorization": "AWS4-HMAC-SHA256", **GOOD_HEADERS}, "AuthorizationHeaderMalformed"),
        (
            {"authorization": GOOD_AUTH.replace(", Signature=" + "a" * 64, ""), **GOOD_HEADERS},
            "AuthorizationHeaderMalformed",
        ),
        (
            {"authorization": GOOD_AUTH.replace("/s3/", "/iam/"), **GOOD_HEADERS},
            "AuthorizationHeaderMalformed",
        ),
        (
            {"authorization": GOOD_AUTH.replace("aws4_request", "aws5_request"), **GOOD_HEADERS},
            "AuthorizationHeaderMalformed",
        ),
        (
            {"authorization": GOOD_AUTH.replace("20240101/", "20240102/"), **GOOD_HEADERS},
            "AuthorizationHeaderMalformed",
        ),
        (
            {"authorization": GOOD_AUTH.replace("host;", ""), **GOOD_HEADERS},
            "AuthorizationHeaderMalformed",
        ),
        (
            {"authorization": GOOD_AUTH.replace("a" * 64, "A" * 64), **GOOD_HEADERS},
            "AuthorizationHeaderMalformed",
        ),
        (
            {"authorization": GOOD_AUTH + ", Extra=1", **GOOD_HEADERS},
            "AuthorizationHeaderMalformed",
        ),
        ({"authorization": GOOD_AUTH, "x-amz-content-sha256": UNSIGNED_PAYLOAD}, "AccessDenied"),
        (
            {"authorization": GOOD_AUTH, **GOOD_HEADERS, "x-amz-date": "yesterday"},
            "AccessDenied",
        ),
        (
            {"authorization": GOOD_AUTH, **GOOD_HEADERS, "x-amz-date": "20241301T000000Z"},
            "AccessDenied",
        ),
        ({"authorization": GOOD_AUTH, "x-amz-date": "20240101T000000Z"}, "InvalidRequest"),
        (
            {"authorization": GOOD_AUTH, **GOOD_HEADERS, "x-amz-content-sha256": "abc"},
            "InvalidArgument",
        ),
        (
            {
                "authorization": GOOD_AUTH,
                **GOOD_HEADERS,
                "x-amz-content-sha256": "STREAMING-AWS4-ECDSA-P256-SHA256-PAYLOAD",
            },
            "NotImplemented",
        ),
        ({"authorization": GOOD_AUTH, **GOOD_HEADERS}, "SignatureDoesNotMatch"),
    ],
)
def test_malformed_authorization(headers: dict[str, str], code: str) -> None:
    assert error_code(bare(headers), now=JAN_1) == code


def test_both_header_and_query_auth_is_refused() -> None:
    view = bare(
        {"authorization": GOOD_AUTH, **GOOD_HEADERS}, (("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),)
    )
    assert error_code(view, now=JAN_1) == "InvalidArgument"


def test_v2_presigned_url_is_refused() -> None:
    view = bare({}, (("AWSAccessKeyId", AK), ("Signature", "x"), ("Expires", "1")))
    assert error_code(view, now=JAN_1) == "InvalidRequest"


def test_anonymous_message() -> None:
    with pytest.raises(S3Error, match="Anonymous access is not allowed"):
        verify(bare({}), STORE, JAN_1, 900)


# --- signing LOTA's own requests ---------------------------------------------------------


def test_sign_headers_matches_botocore() -> None:
    url = "https://origin.example.com:8443/bkt/a%20b/%C3%BC%2B?list-type=2&prefix=a%2Fb%20c&acl="
    headers = {
        "Content-Type": "text/plain",
        "X-Amz-Meta-Note": "  two   spaces ",
        "range": "bytes=0-1",  # not signed: LOTA signs host, content-* and x-amz-*
        "user-agent": "lota",
    }
    now = datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    added = sign_headers(
        "GET", url, headers, access_key_id=AK, secret_access_key=SECRET,
        region="eu-west-1", payload_hash=UNSIGNED_PAYLOAD, now=now,
    )  # fmt: skip
    assert added["host"] == "origin.example.com:8443"
    assert added["x-amz-date"] == "20240102T030405Z"
    assert (
        "SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date;x-amz-meta-note,"
        in (added["authorization"])
    )
    botocore_request = AWSRequest(
        method="GET",
        url=url,
        headers={
            "Content-Type": headers["Content-Type"],
            "X-Amz-Meta-Note": headers["X-Amz-Meta-Note"],
            "host": added["host"],
            "x-amz-date": added["x-amz-date"],
            "X-Amz-Content-SHA256": UNSIGNED_PAYLOAD,
        },
    )
    botocore_request.context["timestamp"] = "20240102T030405Z"
    signer = S3SigV4Auth(Credentials(AK, SECRET), "s3", "eu-west-1")
    expected = signer.signature(
        signer.string_to_sign(botocore_request, signer.canonical_request(botocore_request)),
        botocore_request,
    )
    assert added["authorization"].endswith(f"Signature={expected}")


@pytest.mark.parametrize(
    "url",
    [
        "http://origin:9000/bkt/k",
        "http://origin/bkt/ü%20x?prefix=a/b&delimiter=/",  # non-canonical query encoding
        "https://origin:443/bkt/a//b/../c?uploads",
        "http://[::1]:9000/bkt/k?versionId=a%2Bb",
    ],
)
def test_sign_headers_round_trips_through_verify(url: str) -> None:
    now = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    headers = {"x-amz-copy-source": "src/k", "content-md5": "1B2M2Y8AsgTpgAmY7PhCfg=="}
    added = sign_headers(
        "PUT", url, headers, access_key_id=AK, secret_access_key=SECRET,
        region="us-east-1", payload_hash=hashlib.sha256(b"").hexdigest(), now=now,
    )  # fmt: skip
    view = view_of(url, "PUT", {**headers, **added})
    verify(view, STORE, now, 900)


def test_sign_headers_ignores_stale_auth_headers() -> None:
    now = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
    stale = {"Authorization": "old", "X-Amz-Date": "19990101T000000Z", "host": "origin"}
    added = sign_headers(
        "GET", "http://origin/b/k", stale, access_key_id=AK, secret_access_key=SECRET,
        region="us-east-1", payload_hash=UNSIGNED_PAYLOAD, now=now,
    )  # fmt: skip
    assert "host" not in added  # the caller's own host header is kept and signed
    sent = {"host": "origin", **added}
    verify(view_of("http://origin/b/k", "GET", sent), STORE, now, 900)
