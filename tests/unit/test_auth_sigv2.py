"""SigV2, as boto3's default configuration presigns URLs with, and every way to break one."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import boto3
import pytest
from botocore.auth import HmacV1Auth
from botocore.awsrequest import AWSPreparedRequest, AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.utils import percent_encode
from multidict import CIMultiDict, CIMultiDictProxy

from lota.auth import Authenticator, Authorized, sigv2
from lota.auth.credentials import CredentialStore, Principal
from lota.auth.policy import Policy
from lota.auth.sigv4 import UNSIGNED_PAYLOAD, RequestView
from lota.clock import FakeClock
from lota.config import AuthConfig
from lota.s3.addressing import parse_target
from lota.s3.errors import S3Error

AK = "AKIATESTTESTTEST0002"
SECRET = "v2s3cr3t/with+slash=and+plus"
STORE = CredentialStore([Principal("tester", AK, SECRET, Policy.deny_all())])
DOMAIN = "lota.test"
ENDPOINT = f"http://{DOMAIN}:9000"
MAX_SKEW = 900.0

TRICKY_KEYS = [
    "plain.txt",
    "with space.txt",
    "plus+sign",
    "percent%25literal%",
    "%41-looks-encoded",
    "ünïcödé/ファイル/😀",
    "double//slash",
    "../../etc/passwd",
    "./dot/./segments/.",
    "trailing/",
    "~tilde-_.unreserved",
    "!*'()&$,;=:@ sub-delims",
    "question?mark#hash",
    "tab\tand\nnewline",
]


def boto_client(style: str | None = None, secret: str = SECRET, **config: Any) -> Any:
    """A boto3 client in its default configuration (which presigns with SigV2)."""
    s3_config = {"addressing_style": style} if style else None
    return boto3.client(
        "s3",
        endpoint_url=ENDPOINT,
        aws_access_key_id=AK,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(s3=s3_config, retries={"total_max_attempts": 1}, **config),
    )


def view_of(
    method: str, url: str, headers: dict[str, str] | None = None
) -> tuple[RequestView, str, str]:
    """A request for `url` as the server sees it: the view, bucket and key."""
    parts = urlsplit(url)
    raw_target = parts.path + ("?" + parts.query if parts.query else "")
    target = parse_target(parts.netloc, raw_target, DOMAIN)
    proxy = CIMultiDictProxy(CIMultiDict(headers or {}))
    return RequestView(method, target.raw_path, target.query, proxy), target.bucket, target.key


def presigned(
    operation: str, params: dict[str, Any], style: str = "path", **kwargs: Any
) -> tuple[str, int]:
    url: str = boto_client(style, **kwargs).generate_presigned_url(operation, Params=params)
    assert "AWSAccessKeyId=" in url and "X-Amz-" not in url  # really SigV2
    return url, int(dict(parse_qsl(urlsplit(url).query))["Expires"])


def check(
    method: str,
    url: str,
    headers: dict[str, str] | None = None,
    now: float | None = None,
    store: CredentialStore = STORE,
) -> Any:
    view, bucket, key = view_of(method, url, headers)
    assert sigv2.is_sigv2(view)
    when = datetime.now(UTC) if now is None else datetime.fromtimestamp(now, UTC)
    return sigv2.verify(view, bucket, key, store, when, MAX_SKEW)


def refused(
    method: str, url: str, headers: dict[str, str] | None = None, now: float | None = None
) -> S3Error:
    with pytest.raises(S3Error) as info:
        check(method, url, headers, now)
    return info.value


def with_query(url: str, **changes: str) -> str:
    parts = urlsplit(url)
    pairs = dict(parse_qsl(parts.query, keep_blank_values=True))
    pairs.update(changes)
    return parts._replace(query=urlencode(pairs)).geturl()


# --- presigned URLs -------------------------------------------------------------------------


def test_default_boto3_presigns_with_sigv2() -> None:
    assert boto_client().meta.config.signature_version in (None, "s3v4")  # the default
    url, _ = presigned("get_object", {"Bucket": "bkt", "Key": "k"})
    assert set(dict(parse_qsl(urlsplit(url).query))) == {"AWSAccessKeyId", "Signature", "Expires"}


@pytest.mark.parametrize("style", ["path", "virtual"])
@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_presigned_get_with_tricky_keys(style: str, key: str) -> None:
    url, expires = presigned("get_object", {"Bucket": "bkt", "Key": key}, style)
    if style == "virtual":
        assert urlsplit(url).hostname == f"bkt.{DOMAIN}"
    _, bucket, parsed_key = view_of("GET", url)
    assert (bucket, parsed_key) == ("bkt", key)
    verified = check("GET", url, now=expires - 1)
    assert verified.principal.name == "tester"
    assert verified.payload_hash == UNSIGNED_PAYLOAD
    assert check("GET", url, now=expires).principal.name == "tester"  # the last second


@pytest.mark.parametrize("style", ["path", "virtual"])
@pytest.mark.parametrize("key", ["with space.txt", "ünï/%41/../x//y", "plus+sign"])
def test_presigned_put_with_tricky_keys(style: str, key: str) -> None:
    url, _ = presigned("put_object", {"Bucket": "bkt", "Key": key}, style)
    assert check("PUT", url).principal.name == "tester"


def test_presigned_get_with_response_overrides() -> None:
    params = {
        "Bucket": "bkt",
        "Key": "dir/a b+c.txt",
        "ResponseContentType": "text/plain; charset=utf-8",
        "ResponseContentDisposition": 'attachment; filename="a&b=c.txt"',
        "ResponseCacheControl": "no-cache",
        "VersionId": "v+1/2",
    }
    for style in ("path", "virtual"):
        url, _ = presigned("get_object", params, style)
        assert check("GET", url).principal.name == "tester"
        changed = with_query(url, **{"response-content-type": "text/html"})
        assert refused("GET", changed).code == "SignatureDoesNotMatch"
        other_version = with_query(url, versionId="v2")
        assert refused("GET", other_version).code == "SignatureDoesNotMatch"


@pytest.mark.parametrize(
    ("operation", "params", "method"),
    [
        ("list_objects", {"Bucket": "bkt"}, "GET"),
        ("get_bucket_acl", {"Bucket": "bkt"}, "GET"),
        ("list_multipart_uploads", {"Bucket": "bkt"}, "GET"),
        ("head_object", {"Bucket": "bkt", "Key": "k"}, "HEAD"),
        ("delete_object", {"Bucket": "bkt", "Key": "k", "VersionId": "v1"}, "DELETE"),
        ("get_object_tagging", {"Bucket": "bkt", "Key": "k"}, "GET"),
        ("upload_part", {"Bucket": "bkt", "Key": "k", "UploadId": "u", "PartNumber": 3}, "PUT"),
        ("list_buckets", {}, "GET"),
    ],
)
@pytest.mark.parametrize("style", ["path", "virtual"])
def test_presigned_bucket_and_subresource_requests(
    operation: str, params: dict[str, Any], method: str, style: str
) -> None:
    url, _ = presigned(operation, params, style)
    assert check(method, url).principal.name == "tester"


def test_presigned_url_mutations_are_refused() -> None:
    url, expires = presigned("get_object", {"Bucket": "bkt", "Key": "dir/k"})
    assert check("GET", url, now=expires)

    wrong_secret, _ = presigned("get_object", {"Bucket": "bkt", "Key": "dir/k"}, secret="nope")
    assert refused("GET", wrong_secret).code == "SignatureDoesNotMatch"

    other_path = url.replace("/bkt/dir/k?", "/bkt/dir/other?")
    assert refused("GET", other_path).code == "SignatureDoesNotMatch"
    other_bucket = url.replace("/bkt/dir/k?", "/abc/dir/k?")
    assert refused("GET", other_bucket).code == "SignatureDoesNotMatch"

    expired = refused("GET", url, now=expires + 1)
    assert (expired.code, expired.status, expired.message) == (
        "AccessDenied",
        403,
        "Request has expired",
    )
    assert "Expires" in expired.extra and "ServerTime" in expired.extra

    for method in ("PUT", "DELETE", "HEAD"):
        assert refused(method, url).code == "SignatureDoesNotMatch"

    signature = dict(parse_qsl(urlsplit(url).query))["Signature"]
    flipped = ("B" if signature[0] == "A" else "A") + signature[1:]
    error = refused("GET", with_query(url, Signature=flipped))
    assert (error.code, error.status) == ("SignatureDoesNotMatch", 403)
    assert error.extra["StringToSign"].startswith("GET\n\n\n")
    assert refused("GET", with_query(url, Signature="")).code == "SignatureDoesNotMatch"
    assert refused("GET", with_query(url, Signature="\u00e9\x00")).code == "SignatureDoesNotMatch"

    extended = with_query(url, Expires=str(expires + 3600))
    assert refused("GET", extended).code == "SignatureDoesNotMatch"
    stranger = refused("GET", with_query(url, AWSAccessKeyId="AKIASTRANGER"))
    assert stranger.code == "InvalidAccessKeyId"
    not_a_time = refused("GET", with_query(url, Expires="soon"))
    assert not_a_time.code == "AccessDenied"
    smuggled = refused("GET", url, {"x-amz-copy-source": "/bkt/secret"})
    assert smuggled.code == "SignatureDoesNotMatch"
    hoisted = refused("GET", with_query(url, **{"x-amz-acl": "public-read"}))
    assert hoisted.code == "SignatureDoesNotMatch"
    subresource = refused("GET", with_query(url, acl=""))
    assert subresource.code == "SignatureDoesNotMatch"


def test_presigned_url_missing_or_repeated_parameters() -> None:
    url, _ = presigned("get_object", {"Bucket": "bkt", "Key": "k"})
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query)
    for name in ("Signature", "Expires", "AWSAccessKeyId"):
        kept = [pair for pair in pairs if pair[0] != name]
        error = refused("GET", parts._replace(query=urlencode(kept)).geturl())
        assert (error.code, error.status) == ("AccessDenied", 403), name
    signature = dict(pairs)["Signature"]
    doubled = parts._replace(query=urlencode([*pairs, ("Signature", signature)])).geturl()
    assert refused("GET", doubled).code == "AccessDenied"


def test_presigned_put_with_content_type_needs_that_header() -> None:
    params = {"Bucket": "bkt", "Key": "up/k", "ContentType": "text/plain"}
    url, _ = presigned("put_object", params)
    assert dict(parse_qsl(urlsplit(url).query))["content-type"] == "text/plain"
    assert check("PUT", url, {"Content-Type": "text/plain"}).principal.name == "tester"
    assert check("PUT", url, {"Content-Type": " text/plain "}).principal.name == "tester"
    assert refused("PUT", url).code == "SignatureDoesNotMatch"
    assert refused("PUT", url, {"Content-Type": "text/html"}).code == "SignatureDoesNotMatch"
    plain, _ = presigned("put_object", {"Bucket": "bkt", "Key": "up/k"})
    assert refused("PUT", plain, {"Content-Type": "text/plain"}).code == "SignatureDoesNotMatch"


def test_presigned_put_with_metadata_and_md5() -> None:
    body = b"hello, world"
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    params = {"Bucket": "bkt", "Key": "k", "Metadata": {"Owner": "me"}, "ContentMD5": md5}
    url, _ = presigned("put_object", params)
    assert "x-amz-meta-owner=me" in url  # botocore hoists x-amz-* headers into the query
    assert check("PUT", url, {"Content-MD5": md5})
    assert refused("PUT", url).code == "SignatureDoesNotMatch"
    tampered = with_query(url, **{"x-amz-meta-owner": "you"})
    assert refused("PUT", tampered, {"Content-MD5": md5}).code == "SignatureDoesNotMatch"


# --- the Authenticator: dispatch, operation naming, body checks --------------------------


@pytest.fixture
def authenticator(tmp_path: Path) -> Callable[[float], Authenticator]:
    path = tmp_path / "credentials.toml"
    policy = (
        '{"Statement":[{"Effect":"Allow","Action":"s3:*","Resource":"*"},'
        '{"Effect":"Deny","Action":"s3:PutObject","Resource":"arn:aws:s3:::*/protected/*"}]}'
    )
    path.write_text(
        f'[[principal]]\nname = "tester"\naccess_key_id = "{AK}"\n'
        f"secret_access_key = \"{SECRET}\"\npolicy = '{policy}'\n"
    )

    def make(now: float) -> Authenticator:
        return Authenticator(AuthConfig(mode="sigv4", credentials=str(path)), FakeClock(now))

    return make


def authenticate(
    make: Callable[[float], Authenticator],
    method: str,
    url: str,
    headers: dict[str, str] | None = None,
    now: float | None = None,
) -> tuple[Authorized, RequestView]:
    view, bucket, key = view_of(method, url, headers)
    auth = make(datetime.now(UTC).timestamp() if now is None else now)
    return auth.authenticate(view, bucket, key), view


@pytest.mark.parametrize(
    ("operation", "params", "method", "name"),
    [
        ("get_object", {"Bucket": "bkt", "Key": "a b"}, "GET", "GetObject"),
        ("head_object", {"Bucket": "bkt", "Key": "a b"}, "HEAD", "HeadObject"),
        ("put_object", {"Bucket": "bkt", "Key": "k", "ContentType": "a/b"}, "PUT", "PutObject"),
        ("list_objects", {"Bucket": "bkt"}, "GET", "ListObjects"),
        ("list_buckets", {}, "GET", "ListBuckets"),
    ],
)
@pytest.mark.parametrize("style", ["path", "virtual"])
def test_authenticator_accepts_presigned_sigv2(
    authenticator: Callable[[float], Authenticator],
    operation: str,
    params: dict[str, Any],
    method: str,
    name: str,
    style: str,
) -> None:
    url, _ = presigned(operation, params, style)
    headers = {"Content-Type": params["ContentType"]} if "ContentType" in params else None
    authorized, _ = authenticate(authenticator, method, url, headers)
    assert authorized.operation.name == name
    assert authorized.principal is not None and authorized.principal.name == "tester"


def test_authenticator_applies_policy_and_expiry(
    authenticator: Callable[[float], Authenticator],
) -> None:
    url, expires = presigned("put_object", {"Bucket": "bkt", "Key": "protected/k"})
    with pytest.raises(S3Error) as info:
        authenticate(authenticator, "PUT", url)
    assert (info.value.code, info.value.message) == ("AccessDenied", "Access Denied")
    url, expires = presigned("get_object", {"Bucket": "bkt", "Key": "k"})
    with pytest.raises(S3Error) as info:
        authenticate(authenticator, "GET", url, now=expires + 1)
    assert (info.value.code, info.value.message) == ("AccessDenied", "Request has expired")


def test_presigned_put_body_is_still_checked(
    authenticator: Callable[[float], Authenticator],
) -> None:
    body = b"payload" * 100
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    url, _ = presigned("put_object", {"Bucket": "bkt", "Key": "k", "ContentMD5": md5})
    headers = {"Content-MD5": md5, "Content-Length": str(len(body))}
    authorized, view = authenticate(authenticator, "PUT", url, headers)
    assert authorized.verified is not None
    assert authorized.verified.payload_hash == UNSIGNED_PAYLOAD
    auth = authenticator(datetime.now(UTC).timestamp())
    decoder = auth.decoder(view, authorized)
    assert decoder.feed(body) == body
    decoder.finish()
    decoder = auth.decoder(view, authorized)
    decoder.feed(body[:-1] + b"X")
    with pytest.raises(S3Error) as info:
        decoder.finish()
    assert info.value.code == "BadDigest"


# --- the Authorization header form ---------------------------------------------------------


class Captured(Exception):
    def __init__(self, request: AWSPreparedRequest) -> None:
        super().__init__("captured")
        self.request = request


def header_signed(
    call: Callable[[Any], object], style: str = "path"
) -> tuple[str, str, dict[str, str], bytes, float]:
    """A request boto3 signs with SigV2 headers: method, url, headers, body, Date."""
    client = boto_client(style, signature_version="s3")

    def stop(request: AWSPreparedRequest, **_: object) -> None:
        raise Captured(request)

    client.meta.events.register("before-send.s3", stop)
    try:
        call(client)
    except Captured as captured:
        request = captured.request
    headers = {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}
    assert headers["Authorization"].startswith(f"AWS {AK}:")
    body = request.body
    if hasattr(body, "read"):
        body = body.read()
    assert request.method is not None
    when = parsedate_to_datetime(headers["Date"]).timestamp()
    return request.method, request.url, headers, body or b"", when


@pytest.mark.parametrize("style", ["path", "virtual"])
@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda s3: s3.get_object(Bucket="bkt", Key="a b/ü+%"), "GetObject"),
        (
            lambda s3: s3.put_object(
                Bucket="bkt", Key="x//../y", Body=b"hello", ContentType="a/b", Metadata={"k": "v"}
            ),
            "PutObject",
        ),
        (lambda s3: s3.list_objects_v2(Bucket="bkt", Prefix="p/"), "ListObjectsV2"),
        (lambda s3: s3.get_bucket_acl(Bucket="bkt"), "GetBucketAcl"),
        (
            lambda s3: s3.delete_objects(Bucket="bkt", Delete={"Objects": [{"Key": "k"}]}),
            "DeleteObjects",
        ),
        (lambda s3: s3.list_buckets(), "ListBuckets"),
    ],
)
def test_boto3_header_sigv2_verifies(
    authenticator: Callable[[float], Authenticator],
    call: Callable[[Any], object],
    name: str,
    style: str,
) -> None:
    method, url, headers, body, when = header_signed(call, style)
    view, bucket, key = view_of(method, url, headers)
    auth = authenticator(when)
    authorized = auth.authenticate(view, bucket, key)
    assert authorized.operation.name == name
    decoder = auth.decoder(view, authorized)  # checks x-amz-checksum-crc32, Content-MD5
    assert decoder.feed(body) == body
    decoder.finish()
    if body:
        decoder = auth.decoder(view, authorized)
        decoder.feed(body[:-1] + b"?")
        with pytest.raises(S3Error):
            decoder.finish()


def test_header_sigv2_skew_and_mutations(authenticator: Callable[[float], Authenticator]) -> None:
    method, url, headers, _, when = header_signed(lambda s3: s3.get_object(Bucket="bkt", Key="k"))
    view, bucket, key = view_of(method, url, headers)
    for late in (when + MAX_SKEW + 1, when - MAX_SKEW - 1):
        with pytest.raises(S3Error) as info:
            authenticator(late).authenticate(view, bucket, key)
        assert (info.value.code, info.value.status) == ("RequestTimeTooSkewed", 403)
    assert authenticator(when + MAX_SKEW - 1).authenticate(view, bucket, key)

    def refused_header(changes: dict[str, str], path: str | None = None) -> str:
        changed = {**headers, **changes}
        v, b, k = view_of(method, url if path is None else url.replace("/bkt/k", path), changed)
        with pytest.raises(S3Error) as info:
            authenticator(when).authenticate(v, b, k)
        return info.value.code

    assert refused_header({"Date": formatdate(when + 1, usegmt=True)}) == "SignatureDoesNotMatch"
    assert refused_header({}, "/bkt/other") == "SignatureDoesNotMatch"
    assert refused_header({"x-amz-acl": "public-read"}) == "SignatureDoesNotMatch"
    assert refused_header({"Content-Type": "text/plain"}) == "SignatureDoesNotMatch"
    assert refused_header({"Authorization": "AWS AKIASTRANGER:abc="}) == "InvalidAccessKeyId"
    assert refused_header({"Authorization": f"AWS {AK}"}) == "InvalidArgument"
    assert refused_header({"Date": "yesterday"}) == "AccessDenied"
    assert (
        refused_header({"Authorization": headers["Authorization"][:-2] + "x="})
        == "SignatureDoesNotMatch"
    )


def test_header_and_query_signature_together_are_refused() -> None:
    url, _ = presigned("get_object", {"Bucket": "bkt", "Key": "k"})
    error = refused("GET", url, {"Authorization": f"AWS {AK}:abc=", "Date": formatdate()})
    assert error.code == "InvalidArgument"


def sign_v1(
    method: str, url: str, headers: dict[str, str], auth_path: str | None = None
) -> dict[str, str]:
    request = AWSRequest(method=method, url=url, headers=headers)
    request.auth_path = auth_path
    HmacV1Auth(Credentials(AK, SECRET)).add_auth(request)
    return dict(request.headers.items())


@pytest.mark.parametrize("key", TRICKY_KEYS)
def test_hmacv1auth_direct_both_styles(key: str) -> None:
    encoded = percent_encode(key, safe="/~")
    extra = {"Content-Type": "text/plain", "x-amz-meta-Note": " spaced  ", "X-Amz-Acl": "private"}
    # Path style: botocore signs the path as sent.
    url = f"{ENDPOINT}/bkt/{encoded}?versionId=v1&uploads"
    headers = sign_v1("PUT", url, dict(extra))
    assert check("PUT", url, headers).principal.name == "tester"
    # Virtual-hosted style: the canonical resource still names the bucket.
    vurl = f"http://bkt.{DOMAIN}:9000/{encoded}?versionId=v1&uploads"
    vheaders = sign_v1("PUT", vurl, dict(extra), auth_path=f"/bkt/{encoded}")
    assert check("PUT", vurl, vheaders).principal.name == "tester"
    # A virtual-hosted request whose client signed without the bucket is refused.
    bad = sign_v1("PUT", vurl, dict(extra))
    assert refused("PUT", vurl, bad).code == "SignatureDoesNotMatch"


def test_x_amz_date_is_the_request_time() -> None:
    now = datetime.now(UTC).timestamp()
    url = f"{ENDPOINT}/bkt/k"
    headers = sign_v1("GET", url, {"x-amz-date": formatdate(now, usegmt=True)})
    assert check("GET", url, headers).principal.name == "tester"
    # Date is signed too, but the skew check reads x-amz-date when there is one.
    error = refused("GET", url, headers, now=now + 2 * MAX_SKEW)
    assert error.code == "RequestTimeTooSkewed"
    stale = sign_v1("GET", url, {"x-amz-date": formatdate(now - 2 * MAX_SKEW, usegmt=True)})
    stale["Date"] = formatdate(now, usegmt=True)  # a fresh Date does not rescue it
    assert refused("GET", url, stale).code == "RequestTimeTooSkewed"
    # S3 lets a client leave the Date line empty when it sends x-amz-date.
    bare = AWSRequest(method="GET", url=url, headers={"x-amz-date": formatdate(now, usegmt=True)})
    string_to_sign = f"GET\n\n\n\nx-amz-date:{bare.headers['x-amz-date']}\n/bkt/k"
    bare.headers["Authorization"] = f"AWS {AK}:{sigv2.sign(SECRET, string_to_sign)}"
    bare.headers["Date"] = formatdate(now, usegmt=True)
    assert check("GET", url, dict(bare.headers.items())).principal.name == "tester"


def test_streaming_signed_payload_needs_sigv4() -> None:
    url = f"{ENDPOINT}/bkt/k"
    headers = sign_v1("PUT", url, {"x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"})
    assert refused("PUT", url, headers).code == "InvalidRequest"
    digest = hashlib.sha256(b"x").hexdigest()
    headers = sign_v1("PUT", url, {"x-amz-content-sha256": digest})
    assert check("PUT", url, headers).payload_hash == digest
