"""Refusals and malformed requests: always an S3 XML error with the right status, never a
500, and nothing of a refused request reaches the origin."""

from __future__ import annotations

import base64
import hashlib
import socket
import time
import urllib.parse
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lota.testing.credentials import PRINCIPALS
from lota.testing.processes import LotaProcess
from tests.conftest import client_for


def raw(lota: LotaProcess, data: bytes, *, shut_write: bool = False) -> tuple[int, bytes]:
    """Send bytes as they are; return (status, body) of the response."""
    status, _, body = raw_response(lota, data, shut_write=shut_write)
    return status, body


def raw_response(
    lota: LotaProcess, data: bytes, *, shut_write: bool = False
) -> tuple[int, bytes, bytes]:
    """Send bytes as they are; return status, header block and body of the response."""
    with socket.create_connection(("127.0.0.1", lota.port), timeout=10) as sock:
        sock.sendall(data)
        if shut_write:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
            if _complete(received):
                break
    head, _, body = received.partition(b"\r\n\r\n")
    assert head, "no response at all"
    return int(head.split(b" ", 2)[1]), head, body


def _complete(received: bytes) -> bool:
    head, sep, body = received.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return False


def signed(
    lota: LotaProcess,
    method: str,
    path: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    principal: str = "admin",
    secret: str | None = None,
    host: str = "",
) -> bytes:
    """A request signed the way botocore signs it, serialised for `raw`; `host` is the Host
    it was meant for (default LOTA's own address)."""
    key, real_secret, _ = PRINCIPALS[principal]
    host = host or f"127.0.0.1:{lota.port}"
    url = f"http://{host}{path}"
    request = AWSRequest(method=method, url=url, data=body, headers=headers or {})
    request.headers["x-amz-content-sha256"] = hashlib.sha256(body).hexdigest()
    SigV4Auth(Credentials(key, secret or real_secret), "s3", "us-east-1").add_auth(request)
    prepared = request.prepare()
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [
        f"{k}: {v}"
        for k, v in prepared.headers.items()
        if k.lower() not in ("host", "content-length")
    ]
    lines += [f"Content-Length: {len(body)}", "Connection: close"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def error_code(body: bytes) -> str:
    root = ET.fromstring(body)
    assert root.tag == "Error"
    return root.findtext("Code") or ""


def test_wrong_secret_is_signature_does_not_match(
    lota: LotaProcess, bucket: str, origin_s3: Any
) -> None:
    status, body = raw(lota, signed(lota, "PUT", f"/{bucket}/k", b"x", secret="wrong-secret"))
    assert (status, error_code(body)) == (403, "SignatureDoesNotMatch")
    assert origin_s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_unknown_key_is_invalid_access_key_id(lota: LotaProcess, bucket: str) -> None:
    s3 = client_for(lota.url)
    s3._request_signer._credentials = Credentials("AKIANOBODY000000000", "whatever")
    with pytest.raises(s3.exceptions.ClientError) as err:
        s3.list_objects_v2(Bucket=bucket)
    assert err.value.response["Error"]["Code"] == "InvalidAccessKeyId"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403


def test_policy_denials_are_access_denied_and_never_reach_the_origin(
    lota: LotaProcess, bucket: str, origin_s3: Any
) -> None:
    reader = client_for(lota.url, "reader")
    guarded = client_for(lota.url, "guarded")
    for client, key in ((reader, "any"), (guarded, "protected/x")):
        with pytest.raises(client.exceptions.ClientError) as err:
            client.put_object(Bucket=bucket, Key=key, Body=b"no")
        assert err.value.response["Error"]["Code"] == "AccessDenied"
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    guarded.put_object(Bucket=bucket, Key="open/x", Body=b"yes")
    origin_s3.put_object(Bucket=bucket, Key="protected/y", Body=b"keep")
    # DeleteObjects is judged per key, as on AWS: the denied key is an error in a 200 answer.
    result = guarded.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "protected/y"}]})
    assert [(e["Key"], e["Code"]) for e in result["Errors"]] == [("protected/y", "AccessDenied")]
    assert sorted(o["Key"] for o in origin_s3.list_objects_v2(Bucket=bucket)["Contents"]) == [
        "open/x",
        "protected/y",
    ]


def test_a_body_that_does_not_match_its_signed_hash_is_refused(
    lota: LotaProcess, bucket: str, origin_s3: Any
) -> None:
    request = signed(lota, "PUT", f"/{bucket}/tampered", b"original body")
    tampered = request.replace(b"original body", b"tampered body")
    status, body = raw(lota, tampered)
    assert (status, error_code(body)) == (400, "XAmzContentSHA256Mismatch")
    time.sleep(0.2)
    assert origin_s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_an_expired_presigned_url_is_refused(
    lota: LotaProcess, bucket: str, origin_s3: Any
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="k", Body=b"secret")
    for version in ("s3v4", "s3"):
        s3 = client_for(lota.url, signature_version=version)
        url = s3.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": "k"}, ExpiresIn=1
        )
        time.sleep(2.1)
        path = url.split(str(lota.port), 1)[1]
        status, body = raw(
            lota, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
        assert (status, error_code(body)) == (403, "AccessDenied")
        assert b"expired" in body


def test_an_unsigned_request_is_refused(lota: LotaProcess, bucket: str) -> None:
    status, body = raw(
        lota, f"GET /{bucket}/k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    )
    assert (status, error_code(body)) == (403, "AccessDenied")
    status, body = raw(
        lota, f"PUT /{bucket}/k HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\n\r\nx".encode()
    )
    assert (status, error_code(body)) == (403, "AccessDenied")


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (
            b"GET /bkt/k HTTP/1.1\r\nHost: x\r\nAuthorization: AWS4-HMAC-SHA256 garbage\r\n\r\n",
            400,
            "AuthorizationHeaderMalformed",
        ),
        (b"GET /Invalid_Bucket/k HTTP/1.1\r\nHost: x\r\n\r\n", 400, "InvalidBucketName"),
        (b"GET /bkt/" + b"k" * 1025 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 400, "KeyTooLongError"),
        (
            b"GET /bkt/k HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n",
            400,
            "RequestHeaderSectionTooLarge",
        ),
        (
            b"PUT /bkt/k HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            400,
            "InvalidRequest",
        ),
        (b"GARBAGE\r\n\r\n", 400, "InvalidRequest"),
    ],
    ids=[
        "garbage-authorization",
        "invalid-bucket",
        "key-over-1024-bytes",
        "oversized-header",
        "content-length-and-chunked",
        "not-http",
    ],
)
def test_malformed_requests_get_4xx_s3_xml(
    lota: LotaProcess, request_bytes: bytes, status: int, code: str
) -> None:
    got_status, body = raw(lota, request_bytes)
    assert (got_status, error_code(body)) == (status, code)


@pytest.mark.parametrize("key", ["k" * 10_000, "\u00e9" * 10_000], ids=["ascii", "utf-8"])
def test_a_10000_character_key_is_key_too_long_not_a_too_large_header(
    lota: LotaProcess, bucket: str, key: str
) -> None:
    # S3 answers 400 KeyTooLongError for keys over 1,024 bytes, whatever the request line's
    # length; "é" percent-encodes to six characters, a 60,000-character request line.
    s3 = client_for(lota.url, retries={"max_attempts": 1})
    with pytest.raises(s3.exceptions.ClientError) as err:
        s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    assert err.value.response["Error"]["Code"] == "KeyTooLongError"
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    encoded = urllib.parse.quote(key, safe="/").encode()
    status, body = raw(
        lota, b"GET /" + bucket.encode() + b"/" + encoded + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    assert (status, error_code(body)) == (400, "KeyTooLongError")


def test_a_request_line_over_64_kib_is_still_refused_as_too_large(lota: LotaProcess) -> None:
    status, body = raw(lota, b"GET /bkt/" + b"k" * 70_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (status, error_code(body)) == (400, "RequestHeaderSectionTooLarge")


MALFORMED_RANGES = ("bytes=5-2", "bytes=a-b", "bytes=abc", "items=0-1", "bytes=0-1,3-4")


def test_a_range_s3_cannot_read_is_ignored_and_the_whole_object_sent_like_s3(
    lota: LotaProcess, bucket: str, origin_s3: Any
) -> None:
    """S3 answers 200 with the whole object for these; LOTA used to answer 416."""
    origin_s3.put_object(Bucket=bucket, Key="k", Body=b"0123456789")
    s3 = client_for(lota.url)
    for bad in MALFORMED_RANGES:
        got = s3.get_object(Bucket=bucket, Key="k", Range=bad)
        assert got["ResponseMetadata"]["HTTPStatusCode"] == 200, bad
        assert got["Body"].read() == b"0123456789"
        assert "ContentRange" not in got
    for unsatisfiable in (f"bytes={10**30}-", "bytes=10-", "bytes=-0"):
        with pytest.raises(s3.exceptions.ClientError) as err:
            s3.get_object(Bucket=bucket, Key="k", Range=unsatisfiable)
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 416, unsatisfiable
    assert (
        s3.get_object(Bucket=bucket, Key="k", Range="bytes=8-99999999999999999999999")[
            "Body"
        ].read()
        == b"89"
    )


def test_a_truncated_upload_never_creates_an_object(
    lota: LotaProcess, bucket: str, origin_s3: Any
) -> None:
    full = signed(lota, "PUT", f"/{bucket}/truncated", b"x" * 100_000)
    head, _, body = full.partition(b"\r\n\r\n")
    # A client that stops sending: after the body timeout (2s for the test node), 400.
    status, answer = raw(lota, head + b"\r\n\r\n" + body[:50_000])
    assert (status, error_code(answer)) == (400, "RequestTimeout")
    for shut_write in (True, False):  # a client that half-closes, one that vanishes
        with socket.create_connection(("127.0.0.1", lota.port)) as sock:
            sock.sendall(head + b"\r\n\r\n" + body[:70_000])
            if shut_write:
                sock.shutdown(socket.SHUT_WR)
                sock.recv(100)
    time.sleep(0.5)
    assert origin_s3.list_objects_v2(Bucket=bucket)["KeyCount"] == 0


def test_keys_that_look_like_paths_never_touch_the_filesystem(
    lota: LotaProcess, bucket: str, tmp_path: Any
) -> None:
    s3 = client_for(lota.url, s3={"addressing_style": "path"})
    key = "../../../../../../tmp/lota-escape-check"
    s3.put_object(Bucket=bucket, Key=key, Body=b"inside s3 only")
    assert s3.get_object(Bucket=bucket, Key=key)["Body"].read() == b"inside s3 only"
    assert not __import__("os").path.exists("/tmp/lota-escape-check")


_methods = st.sampled_from(["GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "PATCH"])
_paths = st.one_of(
    st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-./_%?=&+~ ", max_size=60).map(
        lambda p: "/" + p
    ),
    st.sampled_from(
        [
            "/",
            "/bkt",
            "/bkt/k",
            "/bkt?list-type=2",
            "/bkt/k?uploads",
            "/bkt/k?partNumber=0",
            "/_lota/x",
        ]
    ),
)
_header_names = st.sampled_from(
    [
        "Range",
        "Content-MD5",
        "x-amz-content-sha256",
        "x-amz-date",
        "Content-Encoding",
        "x-amz-decoded-content-length",
        "x-amz-copy-source",
        "If-Match",
        "If-Modified-Since",
        "Expect",
        "x-amz-trailer",
        "Content-Type",
        "x-amz-checksum-crc32",
    ]
)
_header_values = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126), max_size=40)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    method=_methods,
    path=_paths,
    headers=st.dictionaries(_header_names, _header_values, max_size=4),
    body=st.binary(max_size=300),
    sign=st.booleans(),
)
# Found by CI: an error echoing a control character in the path was not well-formed XML.
@example(method="GET", path="/%00", headers={}, body=b"", sign=False)
@example(method="GET", path="/b/%ff%01", headers={}, body=b"", sign=False)
def test_random_requests_never_get_a_500(
    lota: LotaProcess, method: str, path: str, headers: dict[str, str], body: bytes, sign: bool
) -> None:
    path = path.replace(" ", "%20")
    if sign:
        try:
            data = signed(lota, method, path, body, headers)
        except (ValueError, UnicodeError):
            return
    else:
        lines = [f"{method} {path} HTTP/1.1", "Host: x", *(f"{k}: {v}" for k, v in headers.items())]
        lines += [f"Content-Length: {len(body)}", "Connection: close"]
        data = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
    status, head, answer = raw_response(lota, data)
    # LOTA itself never answers 5xx here; a pass-through relays whatever the origin (moto,
    # which has bugs of its own) says, marked BYPASS.
    assert status < 500 or b"x-lota-cache: BYPASS" in head, answer[:300]
    if status >= 400 and method != "HEAD" and b"x-lota-cache: BYPASS" not in head:
        error_code(answer)  # LOTA's own errors are well-formed S3 XML


def test_on_a_virtual_hosted_bucket_keys_under_lota_are_keys_not_admin_calls(
    lota: LotaProcess, bucket: str, origin_s3: Any
) -> None:
    """Admin calls live on the bare host; on BUCKET.domain, /_lota/metrics is a key."""
    host = f"{bucket}.lota.local:{lota.port}"
    status, _ = raw(lota, signed(lota, "PUT", "/_lota/metrics", b"not metrics", host=host))
    assert status == 200
    assert origin_s3.get_object(Bucket=bucket, Key="_lota/metrics")["Body"].read() == (
        b"not metrics"
    )
    status, body = raw(lota, signed(lota, "GET", "/_lota/metrics", host=host))
    assert (status, body) == (200, b"not metrics")
    status, body = raw(lota, signed(lota, "GET", "/_lota/healthz", host=host))
    assert (status, error_code(body)) == (404, "NoSuchKey")
    status, body = raw(lota, b"GET /_lota/healthz HTTP/1.1\r\nHost: lota.local\r\n\r\n")
    assert (status, body) == (200, b"ok\n")


# -- issue #10: copy sources authorize exactly what the origin acts on ------------------------


# -- issue #10: DeleteObjects and copy sources authorize exactly what the origin acts on ------

DOCTYPE_DELETE = (
    '<!DOCTYPE Delete SYSTEM "http://127.0.0.1:1/x.dtd">'
    "<Delete><Object><Key>{key}</Key></Object><Quiet>&undefined;</Quiet></Delete>"
)


def delete_request(lota: LotaProcess, bucket: str, body: bytes, principal: str) -> bytes:
    md5 = base64.b64encode(hashlib.md5(body).digest()).decode()
    headers = {"Content-MD5": md5, "Content-Type": "application/xml"}
    return signed(lota, "POST", f"/{bucket}?delete", body, headers, principal=principal)


def test_a_delete_objects_body_lota_cannot_parse_is_malformed_xml_and_deletes_nothing(
    lota: LotaProcess, bucket: str, origin_s3: Any
) -> None:
    # guarded may delete anything but protected/*; the DTD used to hide the key from LOTA's
    # parser while the origin's lenient one deleted it.
    origin_s3.put_object(Bucket=bucket, Key="protected/model.bin", Body=b"weights")
    body = DOCTYPE_DELETE.format(key="protected/model.bin").encode()
    status, answer = raw(lota, delete_request(lota, bucket, body, "guarded"))
    assert (status, error_code(answer)) == (400, "MalformedXML")
    assert origin_s3.get_object(Bucket=bucket, Key="protected/model.bin")["Body"].read() == (
        b"weights"
    )


def test_delete_objects_is_authorized_per_key_and_denied_keys_are_reported_and_kept(
    lota: LotaProcess, bucket: str, origin_s3: Any
) -> None:
    for key in ("alpha/scratch/a", "alpha/scratch/b", "alpha/important/model.bin"):
        origin_s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    scoped = client_for(lota.url, "scoped")
    result = scoped.delete_objects(
        Bucket=bucket,
        Delete={
            "Objects": [
                {"Key": "alpha/scratch/a"},
                {"Key": "alpha/important/model.bin"},
                {"Key": "alpha/scratch/b", "VersionId": "null"},  # needs DeleteObjectVersion
            ]
        },
    )
    assert [d["Key"] for d in result["Deleted"]] == ["alpha/scratch/a"]
    errors = {(e["Key"], e.get("VersionId"), e["Code"]) for e in result["Errors"]}
    assert errors == {
        ("alpha/important/model.bin", None, "AccessDenied"),
        ("alpha/scratch/b", "null", "AccessDenied"),
    }
    left = [o["Key"] for o in origin_s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert sorted(left) == ["alpha/important/model.bin", "alpha/scratch/b"]


def test_quiet_delete_objects_reports_only_the_denied_keys(
    lota: LotaProcess, bucket: str, origin_s3: Any
) -> None:
    for key in ("alpha/scratch/a", "alpha/important/model.bin"):
        origin_s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    scoped = client_for(lota.url, "scoped")
    result = scoped.delete_objects(
        Bucket=bucket,
        Delete={
            "Objects": [{"Key": "alpha/scratch/a"}, {"Key": "alpha/important/model.bin"}],
            "Quiet": True,
        },
    )
    assert "Deleted" not in result
    assert [(e["Key"], e["Code"]) for e in result["Errors"]] == [
        ("alpha/important/model.bin", "AccessDenied")
    ]
    assert [o["Key"] for o in origin_s3.list_objects_v2(Bucket=bucket)["Contents"]] == [
        "alpha/important/model.bin"
    ]


# What `public/private.bin` becomes when a client hides it from the check: S3 reads the whole
# string as the key (`;` is a key character) or refuses it (a fragment, a foreign query).
SMUGGLED_SOURCES = [
    ("public/private.bin;x", 404, "NoSuchKey"),
    ("public/private.bin#x", 400, "InvalidArgument"),
    ("public/private.bin?x=1", 400, "InvalidArgument"),
]


@pytest.mark.parametrize(("source", "status", "code"), SMUGGLED_SOURCES)
def test_copy_object_never_copies_a_denied_key_hidden_in_the_copy_source(
    lota: LotaProcess, bucket: str, origin_s3: Any, source: str, status: int, code: str
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="public/private.bin", Body=b"secret")
    headers = {"x-amz-copy-source": f"{bucket}/{source}"}
    request = signed(lota, "PUT", f"/{bucket}/stolen", b"", headers, principal="scoped")
    answer_status, answer = raw(lota, request)
    assert (answer_status, error_code(answer)) == (status, code)
    assert [o["Key"] for o in origin_s3.list_objects_v2(Bucket=bucket)["Contents"]] == [
        "public/private.bin"
    ]


@pytest.mark.parametrize(("source", "status", "code"), SMUGGLED_SOURCES)
def test_upload_part_copy_never_copies_a_denied_key_hidden_in_the_copy_source(
    lota: LotaProcess, bucket: str, origin_s3: Any, source: str, status: int, code: str
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="public/private.bin", Body=b"secret")
    upload = origin_s3.create_multipart_upload(Bucket=bucket, Key="stolen")["UploadId"]
    headers = {"x-amz-copy-source": f"{bucket}/{source}"}
    path = f"/{bucket}/stolen?partNumber=1&uploadId={upload}"
    answer_status, answer = raw(lota, signed(lota, "PUT", path, b"", headers, principal="scoped"))
    assert answer_status == status
    if status == 400:  # LOTA's own refusal; moto answers a missing part source with no body
        assert error_code(answer) == code
    parts = origin_s3.list_parts(Bucket=bucket, Key="stolen", UploadId=upload)
    assert parts.get("Parts", []) == []
    origin_s3.abort_multipart_upload(Bucket=bucket, Key="stolen", UploadId=upload)


def test_a_copy_of_the_denied_key_itself_is_access_denied(
    lota: LotaProcess, bucket: str, origin_s3: Any
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="public/private.bin", Body=b"secret")
    origin_s3.put_object(Bucket=bucket, Key="public/open.bin", Body=b"open")
    scoped = client_for(lota.url, "scoped")
    with pytest.raises(scoped.exceptions.ClientError) as err:
        scoped.copy_object(
            Bucket=bucket, Key="stolen", CopySource={"Bucket": bucket, "Key": "public/private.bin"}
        )
    assert err.value.response["Error"]["Code"] == "AccessDenied"
    scoped.copy_object(
        Bucket=bucket, Key="copied", CopySource={"Bucket": bucket, "Key": "public/open.bin"}
    )
    assert origin_s3.get_object(Bucket=bucket, Key="copied")["Body"].read() == b"open"
