"""Operation naming and IAM actions, checked on the requests boto3 really sends."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import boto3
import pytest
from botocore.awsrequest import AWSPreparedRequest
from botocore.config import Config
from hypothesis import given
from hypothesis import strategies as st

from lota.s3.addressing import parse_query, parse_target
from lota.s3.errors import S3Error
from lota.s3.operations import Operation, classify, copy_source_header, parse_copy_source


class Captured(Exception):
    def __init__(self, request: AWSPreparedRequest) -> None:
        super().__init__("captured")
        self.request = request


def capture(call: Callable[[Any], object]) -> AWSPreparedRequest:
    """The request boto3 would send for `call`, stopped before it leaves the process."""
    client = boto3.client(
        "s3",
        endpoint_url="http://lota.test:9000",
        aws_access_key_id="AKID",
        aws_secret_access_key="secret",
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )

    def stop(request: AWSPreparedRequest, **_: object) -> None:
        raise Captured(request)

    client.meta.events.register("before-send.s3", stop)
    try:
        call(client)
    except Captured as captured:
        return captured.request
    raise AssertionError("boto3 sent nothing")


def classify_boto(call: Callable[[Any], object]) -> Operation:
    request = capture(call)
    parts = urlsplit(request.url)
    target = parse_target(
        "lota.test:9000", parts.path + ("?" + parts.query if parts.query else ""), ""
    )
    headers = {
        k.lower(): v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()
    }
    assert request.method is not None
    return classify(request.method, target.bucket, target.key, target.query, headers)


B = {"Bucket": "bkt"}
K = {"Bucket": "bkt", "Key": "dir/a b+c.txt"}
U = {**K, "UploadId": "up1"}
OBJ = "arn:aws:s3:::bkt/dir/a b+c.txt"
BKT = "arn:aws:s3:::bkt"


@pytest.mark.parametrize(
    ("call", "name", "action", "resource"),
    [
        (lambda c: c.list_buckets(), "ListBuckets", "s3:ListAllMyBuckets", "*"),
        (lambda c: c.get_object(**K), "GetObject", "s3:GetObject", OBJ),
        (lambda c: c.get_object(**K, VersionId="v1"), "GetObject", "s3:GetObjectVersion", OBJ),
        (lambda c: c.get_object(**K, PartNumber=2), "GetObject", "s3:GetObject", OBJ),
        (
            lambda c: c.get_object(**K, ResponseContentType="text/plain"),
            "GetObject",
            "s3:GetObject",
            OBJ,
        ),
        (lambda c: c.head_object(**K), "HeadObject", "s3:GetObject", OBJ),
        (lambda c: c.head_object(**K, VersionId="v"), "HeadObject", "s3:GetObjectVersion", OBJ),
        (lambda c: c.put_object(**K, Body=b"x"), "PutObject", "s3:PutObject", OBJ),
        (
            lambda c: c.copy_object(**K, CopySource={"Bucket": "src", "Key": "s/k"}),
            "CopyObject",
            "s3:PutObject",
            OBJ,
        ),
        (lambda c: c.delete_object(**K), "DeleteObject", "s3:DeleteObject", OBJ),
        (
            lambda c: c.delete_object(**K, VersionId="v"),
            "DeleteObject",
            "s3:DeleteObjectVersion",
            OBJ,
        ),
        (
            lambda c: c.delete_objects(**B, Delete={"Objects": [{"Key": "a"}]}),
            "DeleteObjects",
            "s3:DeleteObject",
            BKT,
        ),
        (lambda c: c.list_objects(**B), "ListObjects", "s3:ListBucket", BKT),
        (lambda c: c.list_objects_v2(**B, Prefix="a/"), "ListObjectsV2", "s3:ListBucket", BKT),
        (
            lambda c: c.list_object_versions(**B),
            "ListObjectVersions",
            "s3:ListBucketVersions",
            BKT,
        ),
        (lambda c: c.create_bucket(**B), "CreateBucket", "s3:CreateBucket", BKT),
        (lambda c: c.delete_bucket(**B), "DeleteBucket", "s3:DeleteBucket", BKT),
        (lambda c: c.head_bucket(**B), "HeadBucket", "s3:ListBucket", BKT),
        (
            lambda c: c.create_multipart_upload(**K),
            "CreateMultipartUpload",
            "s3:PutObject",
            OBJ,
        ),
        (
            lambda c: c.upload_part(**U, PartNumber=1, Body=b"x"),
            "UploadPart",
            "s3:PutObject",
            OBJ,
        ),
        (
            lambda c: c.upload_part_copy(**U, PartNumber=1, CopySource="src/k"),
            "UploadPartCopy",
            "s3:PutObject",
            OBJ,
        ),
        (
            lambda c: c.complete_multipart_upload(
                **U, MultipartUpload={"Parts": [{"ETag": "e", "PartNumber": 1}]}
            ),
            "CompleteMultipartUpload",
            "s3:PutObject",
            OBJ,
        ),
        (
            lambda c: c.abort_multipart_upload(**U),
            "AbortMultipartUpload",
            "s3:AbortMultipartUpload",
            OBJ,
        ),
        (lambda c: c.list_parts(**U), "ListParts", "s3:ListMultipartUploadParts", OBJ),
        (
            lambda c: c.list_multipart_uploads(**B),
            "ListMultipartUploads",
            "s3:ListBucketMultipartUploads",
            BKT,
        ),
        (lambda c: c.get_object_tagging(**K), "GetObjectTagging", "s3:GetObjectTagging", OBJ),
        (
            lambda c: c.get_object_tagging(**K, VersionId="v"),
            "GetObjectTagging",
            "s3:GetObjectVersionTagging",
            OBJ,
        ),
        (
            lambda c: c.put_object_tagging(**K, Tagging={"TagSet": []}),
            "PutObjectTagging",
            "s3:PutObjectTagging",
            OBJ,
        ),
        (
            lambda c: c.delete_object_tagging(**K),
            "DeleteObjectTagging",
            "s3:DeleteObjectTagging",
            OBJ,
        ),
        (
            lambda c: c.get_bucket_versioning(**B),
            "GetBucketVersioning",
            "s3:GetBucketVersioning",
            BKT,
        ),
        (
            lambda c: c.put_bucket_versioning(**B, VersioningConfiguration={"Status": "Enabled"}),
            "PutBucketVersioning",
            "s3:PutBucketVersioning",
            BKT,
        ),
        (
            lambda c: c.get_bucket_lifecycle_configuration(**B),
            "GetBucketLifecycleConfiguration",
            "s3:GetLifecycleConfiguration",
            BKT,
        ),
        (
            lambda c: c.put_bucket_lifecycle_configuration(
                **B, LifecycleConfiguration={"Rules": []}
            ),
            "PutBucketLifecycleConfiguration",
            "s3:PutLifecycleConfiguration",
            BKT,
        ),
        (
            lambda c: c.delete_bucket_lifecycle(**B),
            "DeleteBucketLifecycle",
            "s3:PutLifecycleConfiguration",
            BKT,
        ),
        (lambda c: c.get_bucket_acl(**B), "GetBucketAcl", "s3:GetBucketAcl", BKT),
        (lambda c: c.put_bucket_acl(**B, ACL="private"), "PutBucketAcl", "s3:PutBucketAcl", BKT),
        (lambda c: c.get_object_acl(**K), "GetObjectAcl", "s3:GetObjectAcl", OBJ),
        (lambda c: c.put_object_acl(**K, ACL="private"), "PutObjectAcl", "s3:PutObjectAcl", OBJ),
        (
            lambda c: c.get_bucket_location(**B),
            "GetBucketLocation",
            "s3:GetBucketLocation",
            BKT,
        ),
        (lambda c: c.get_bucket_policy(**B), "GetBucketPolicy", "s3:GetBucketPolicy", BKT),
        (
            lambda c: c.put_bucket_policy(**B, Policy="{}"),
            "PutBucketPolicy",
            "s3:PutBucketPolicy",
            BKT,
        ),
        (
            lambda c: c.delete_bucket_policy(**B),
            "DeleteBucketPolicy",
            "s3:DeleteBucketPolicy",
            BKT,
        ),
        (lambda c: c.get_bucket_tagging(**B), "GetBucketTagging", "s3:GetBucketTagging", BKT),
        (lambda c: c.get_bucket_cors(**B), "GetBucketCors", "s3:GetBucketCORS", BKT),
        (
            lambda c: c.get_bucket_encryption(**B),
            "GetBucketEncryption",
            "s3:GetEncryptionConfiguration",
            BKT,
        ),
        (
            lambda c: c.get_object_attributes(**K, ObjectAttributes=["ETag"]),
            "GetObjectAttributes",
            "s3:GetObjectAttributes",
            OBJ,
        ),
        (
            lambda c: c.restore_object(**K, RestoreRequest={"Days": 1}),
            "RestoreObject",
            "s3:RestoreObject",
            OBJ,
        ),
        (
            lambda c: c.get_object_retention(**K),
            "GetObjectRetention",
            "s3:GetObjectRetention",
            OBJ,
        ),
        (
            lambda c: c.get_public_access_block(**B),
            "GetPublicAccessBlock",
            "s3:GetBucketPublicAccessBlock",
            BKT,
        ),
    ],
)
def test_boto3_requests_are_named_and_authorized_like_aws(
    call: Callable[[Any], object], name: str, action: str, resource: str
) -> None:
    operation = classify_boto(call)
    assert (operation.name, operation.action, operation.resource) == (name, action, resource)


def test_copy_object_names_its_source_for_a_read_check() -> None:
    operation = classify_boto(
        lambda c: c.copy_object(**K, CopySource={"Bucket": "src", "Key": "a b/ü+%?x"})
    )
    assert operation.copy_source == ("src", "a b/ü+%?x")
    assert operation.copy_source_action == "s3:GetObject"


def test_copy_of_a_version_needs_get_object_version_on_the_source() -> None:
    operation = classify_boto(
        lambda c: c.upload_part_copy(
            **U, PartNumber=1, CopySource={"Bucket": "src", "Key": "k", "VersionId": "v7"}
        )
    )
    assert operation.name == "UploadPartCopy"
    assert operation.copy_source == ("src", "k")
    assert operation.copy_source_action == "s3:GetObjectVersion"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("src/key", ("src", "key", "")),
        ("/src/key", ("src", "key", "")),
        ("src/dir/a%20b%2Bc", ("src", "dir/a b+c", "")),
        ("src/q%3Fx?versionId=abc", ("src", "q?x", "abc")),
        ("src/a//b/../c", ("src", "a//b/../c", "")),
        ("src/%E2%9C%93", ("src", "✓", "")),
        # `;` is an ordinary key character to S3, not the start of RFC 3986 path parameters.
        ("src/public/private.bin;x", ("src", "public/private.bin;x", "")),
        ("src/a+b", ("src", "a+b", "")),
        ("src/k?versionId=v%2B1", ("src", "k", "v+1")),
    ],
)
def test_parse_copy_source(header: str, expected: tuple[str, str, str]) -> None:
    assert parse_copy_source(header) == expected


@pytest.mark.parametrize(
    "header",
    [
        "src",
        "src/",
        "/src",
        "",
        "/",
        "arn:aws:s3:us-east-1:1:accesspoint/ap/object/k",
        "src/%FF",
        # What made an origin copy a key other than the one authorized (issue #10).
        "src/public/private.bin#x",
        "src/public/private.bin?x=1",
        "src/k?versionId=v&x=1",
        "src/k?versionId=",
        "src/k?",
        "src/k?versionid=v",
        "src/bad%zzkey",
        "src/bad%4",
        "Not_A_Bucket/k",
        "ab/k",
    ],
)
def test_bad_copy_sources_are_invalid_argument(header: str) -> None:
    with pytest.raises(S3Error) as info:
        classify("PUT", "bkt", "k", (), {"x-amz-copy-source": header})
    assert (info.value.code, info.value.status) == ("InvalidArgument", 400)


@given(
    key=st.text(min_size=1, max_size=64),
    version=st.sampled_from(["", "null", "3/L4kqtJl+cB=", "v 1?&#%"]),
)
def test_the_forwarded_copy_source_decodes_back_to_the_authorized_source(
    key: str, version: str
) -> None:
    header = copy_source_header("src-bucket", key, version)
    assert parse_copy_source(header) == ("src-bucket", key, version)
    # What an origin sees: no character a URL parser would take for a delimiter.
    assert not set(header.partition("?")[0]) & set(";#?&+ ")


def test_a_copy_operation_forwards_a_copy_source_rebuilt_from_what_was_authorized() -> None:
    operation = classify(
        "PUT", "bkt", "k", (), {"x-amz-copy-source": "/src/a%20b;c%2B?versionId=v1"}
    )
    assert operation.copy_source == ("src", "a b;c+")
    assert operation.copy_source_version == "v1"
    assert operation.forwarded_copy_source == "src/a%20b%3Bc%2B?versionId=v1"
    assert classify("PUT", "bkt", "k", (), {}).forwarded_copy_source is None


def test_copy_source_hoisted_into_a_presigned_query_is_still_checked() -> None:
    operation = classify("PUT", "bkt", "k", (("x-amz-copy-source", "src/secret"),), {})
    assert operation.name == "CopyObject"
    assert operation.copy_source == ("src", "secret")


def test_presign_and_sdk_parameters_are_not_subresources() -> None:
    query = (
        ("x-id", "GetObject"),
        ("X-Amz-Algorithm", "AWS4-HMAC-SHA256"),
        ("X-Amz-Credential", "AK/20240101/us-east-1/s3/aws4_request"),
        ("X-Amz-Date", "20240101T000000Z"),
        ("X-Amz-Expires", "60"),
        ("X-Amz-SignedHeaders", "host"),
        ("X-Amz-Signature", "0" * 64),
        ("response-content-disposition", "attachment"),
    )
    assert classify("GET", "bkt", "k", query, {}).name == "GetObject"


@pytest.mark.parametrize(
    ("method", "key", "query", "name"),
    [
        # An unknown subresource must not ride through under GetObject's permission.
        ("GET", "k", (("frobnicate", ""),), "GetObjectFrobnicate"),
        ("PUT", "", (("new-thing", ""),), "PutBucketNewThing"),
        ("DELETE", "", (("gizmo", ""),), "DeleteBucketGizmo"),
        # Two subresources at once name no real operation.
        ("PUT", "k", (("tagging", ""), ("acl", "")), "PutObjectAclTagging"),
        ("GET", "", (("acl", ""), ("policy", "")), "GetBucketAclPolicy"),
        ("PUT", "k", (("uploadId", "u"), ("tagging", "")), "PutObjectTaggingUploadId"),
        ("PATCH", "k", (), "PatchObject"),
    ],
)
def test_unknown_requests_get_generic_names_and_actions(
    method: str, key: str, query: tuple[tuple[str, str], ...], name: str
) -> None:
    operation = classify(method, "bkt", key, query, {})
    assert operation.name == name
    assert operation.action == f"s3:{name}"


def test_requests_without_a_bucket() -> None:
    assert classify("GET", "", "", (), {}).name == "ListBuckets"
    other = classify("PUT", "", "", (), {})
    assert (other.name, other.action, other.resource) == ("PutService", "s3:PutService", "*")


def test_keys_keep_their_exact_spelling_in_the_resource() -> None:
    raw = "/bkt/" + "%2E%2E/a%2F%2Fb/%2A?"
    target = parse_target("h", raw, "")
    operation = classify("GET", target.bucket, target.key, target.query, {})
    assert operation.resource == "arn:aws:s3:::bkt/" + unquote("%2E%2E/a%2F%2Fb/%2A")


@given(st.text(alphabet="ab=&+%2FzZé;", max_size=30))
def test_query_parsing_matches_parse_qsl(raw: str) -> None:
    assert parse_query(raw) == tuple(parse_qsl(raw, keep_blank_values=True))
