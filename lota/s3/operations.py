"""Which S3 operation a request is, and which IAM action and resource authorize it. No I/O.

S3 names an operation by method, by whether a key is present, and by its *subresource*:
the one query parameter that is not an ordinary argument (``?tagging``, ``?uploads``,
``?acl``...). Actions follow AWS's "Actions, resources, and condition keys for Amazon S3"
(``HeadObject`` needs ``s3:GetObject``, ``ListObjectsV2`` needs ``s3:ListBucket``, a
request with ``versionId`` needs the ``...Version...`` action).

Unknown query parameters fail closed: they are treated as subresources, so the request
gets a generic name such as ``GetObjectFoo`` and the action ``s3:GetObjectFoo``, which
only broad grants (``s3:*``, ``s3:Get*``) allow. Otherwise a subresource this table does
not know would ride through to the origin under the permission of a plain ``GetObject``.
Several subresources at once are treated the same way.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import unquote

from lota.http import uri_encode
from lota.s3.addressing import is_valid_bucket_name
from lota.s3.errors import S3Error


class Op(StrEnum):
    """The operations LOTA's own code asks for by name.

    A :class:`~enum.StrEnum`, so each member equals its plain name: ``Operation.name`` and
    metric labels stay ``str`` (``classify`` also gives generic names for subresources S3
    has and this list does not, and for ones S3 does not have), and code that still compares
    bare strings keeps working while it moves over.
    """

    GET_OBJECT = "GetObject"
    HEAD_OBJECT = "HeadObject"
    PUT_OBJECT = "PutObject"
    COPY_OBJECT = "CopyObject"
    DELETE_OBJECT = "DeleteObject"
    DELETE_OBJECTS = "DeleteObjects"
    RESTORE_OBJECT = "RestoreObject"
    PUT_OBJECT_TAGGING = "PutObjectTagging"
    DELETE_OBJECT_TAGGING = "DeleteObjectTagging"
    PUT_OBJECT_ACL = "PutObjectAcl"
    LIST_BUCKETS = "ListBuckets"
    LIST_OBJECTS = "ListObjects"
    LIST_OBJECTS_V2 = "ListObjectsV2"
    CREATE_MULTIPART_UPLOAD = "CreateMultipartUpload"
    UPLOAD_PART = "UploadPart"
    UPLOAD_PART_COPY = "UploadPartCopy"
    COMPLETE_MULTIPART_UPLOAD = "CompleteMultipartUpload"
    ABORT_MULTIPART_UPLOAD = "AbortMultipartUpload"
    LIST_PARTS = "ListParts"
    LIST_MULTIPART_UPLOADS = "ListMultipartUploads"
    # Not S3's: LOTA's own /_lota/ calls, and a request that failed before it had a name.
    ADMIN = "Admin"
    PEER = "Peer"  # another node of the cluster asking (/_lota/peer/)
    SIBLING = "Sibling"  # another worker of this node asking (/_lota/peer/, Unix socket)
    UNKNOWN = "Unknown"


# Query parameters that are arguments of an operation, never its subresource.
_ARGUMENTS = frozenset(
    {
        "prefix", "delimiter", "marker", "max-keys", "encoding-type", "list-type",
        "continuation-token", "fetch-owner", "start-after", "key-marker",
        "version-id-marker", "upload-id-marker", "max-uploads", "part-number-marker",
        "max-parts", "max-buckets", "bucket-region", "max-directory-buckets",
        "allow-unordered", "versionId", "partNumber", "uploadId", "x-id", "id",
        "select-type", "response-content-type", "response-content-language",
        "response-expires", "response-cache-control", "response-content-disposition",
        "response-content-encoding",
    }
)  # fmt: skip

# (subresource, method) -> (operation, action) for requests on a bucket (no key).
_BUCKET: dict[tuple[str, str], tuple[str, str]] = {
    ("", "GET"): ("ListObjects", "s3:ListBucket"),
    ("", "HEAD"): ("HeadBucket", "s3:ListBucket"),
    ("", "PUT"): ("CreateBucket", "s3:CreateBucket"),
    ("", "DELETE"): ("DeleteBucket", "s3:DeleteBucket"),
    ("", "POST"): ("PostObject", "s3:PutObject"),
    ("delete", "POST"): ("DeleteObjects", "s3:DeleteObject"),
    ("versions", "GET"): ("ListObjectVersions", "s3:ListBucketVersions"),
    ("uploads", "GET"): ("ListMultipartUploads", "s3:ListBucketMultipartUploads"),
    ("location", "GET"): ("GetBucketLocation", "s3:GetBucketLocation"),
    ("versioning", "GET"): ("GetBucketVersioning", "s3:GetBucketVersioning"),
    ("versioning", "PUT"): ("PutBucketVersioning", "s3:PutBucketVersioning"),
    ("lifecycle", "GET"): ("GetBucketLifecycleConfiguration", "s3:GetLifecycleConfiguration"),
    ("lifecycle", "PUT"): ("PutBucketLifecycleConfiguration", "s3:PutLifecycleConfiguration"),
    ("lifecycle", "DELETE"): ("DeleteBucketLifecycle", "s3:PutLifecycleConfiguration"),
    ("acl", "GET"): ("GetBucketAcl", "s3:GetBucketAcl"),
    ("acl", "PUT"): ("PutBucketAcl", "s3:PutBucketAcl"),
    ("policy", "GET"): ("GetBucketPolicy", "s3:GetBucketPolicy"),
    ("policy", "PUT"): ("PutBucketPolicy", "s3:PutBucketPolicy"),
    ("policy", "DELETE"): ("DeleteBucketPolicy", "s3:DeleteBucketPolicy"),
    ("policyStatus", "GET"): ("GetBucketPolicyStatus", "s3:GetBucketPolicyStatus"),
    ("tagging", "GET"): ("GetBucketTagging", "s3:GetBucketTagging"),
    ("tagging", "PUT"): ("PutBucketTagging", "s3:PutBucketTagging"),
    ("tagging", "DELETE"): ("DeleteBucketTagging", "s3:PutBucketTagging"),
    ("cors", "GET"): ("GetBucketCors", "s3:GetBucketCORS"),
    ("cors", "PUT"): ("PutBucketCors", "s3:PutBucketCORS"),
    ("cors", "DELETE"): ("DeleteBucketCors", "s3:PutBucketCORS"),
    ("encryption", "GET"): ("GetBucketEncryption", "s3:GetEncryptionConfiguration"),
    ("encryption", "PUT"): ("PutBucketEncryption", "s3:PutEncryptionConfiguration"),
    ("encryption", "DELETE"): ("DeleteBucketEncryption", "s3:PutEncryptionConfiguration"),
    ("website", "GET"): ("GetBucketWebsite", "s3:GetBucketWebsite"),
    ("website", "PUT"): ("PutBucketWebsite", "s3:PutBucketWebsite"),
    ("website", "DELETE"): ("DeleteBucketWebsite", "s3:DeleteBucketWebsite"),
    ("logging", "GET"): ("GetBucketLogging", "s3:GetBucketLogging"),
    ("logging", "PUT"): ("PutBucketLogging", "s3:PutBucketLogging"),
    ("notification", "GET"): ("GetBucketNotificationConfiguration", "s3:GetBucketNotification"),
    ("notification", "PUT"): ("PutBucketNotificationConfiguration", "s3:PutBucketNotification"),
    ("replication", "GET"): ("GetBucketReplication", "s3:GetReplicationConfiguration"),
    ("replication", "PUT"): ("PutBucketReplication", "s3:PutReplicationConfiguration"),
    ("replication", "DELETE"): ("DeleteBucketReplication", "s3:PutReplicationConfiguration"),
    ("requestPayment", "GET"): ("GetBucketRequestPayment", "s3:GetBucketRequestPayment"),
    ("requestPayment", "PUT"): ("PutBucketRequestPayment", "s3:PutBucketRequestPayment"),
    ("object-lock", "GET"): (
        "GetObjectLockConfiguration", "s3:GetBucketObjectLockConfiguration"
    ),
    ("object-lock", "PUT"): (
        "PutObjectLockConfiguration", "s3:PutBucketObjectLockConfiguration"
    ),
    ("ownershipControls", "GET"): ("GetBucketOwnershipControls", "s3:GetBucketOwnershipControls"),
    ("ownershipControls", "PUT"): ("PutBucketOwnershipControls", "s3:PutBucketOwnershipControls"),
    ("ownershipControls", "DELETE"): (
        "DeleteBucketOwnershipControls", "s3:PutBucketOwnershipControls"
    ),
    ("publicAccessBlock", "GET"): ("GetPublicAccessBlock", "s3:GetBucketPublicAccessBlock"),
    ("publicAccessBlock", "PUT"): ("PutPublicAccessBlock", "s3:PutBucketPublicAccessBlock"),
    ("publicAccessBlock", "DELETE"): ("DeletePublicAccessBlock", "s3:PutBucketPublicAccessBlock"),
    ("accelerate", "GET"): ("GetBucketAccelerateConfiguration", "s3:GetAccelerateConfiguration"),
    ("accelerate", "PUT"): ("PutBucketAccelerateConfiguration", "s3:PutAccelerateConfiguration"),
    ("analytics", "GET"): ("GetBucketAnalyticsConfiguration", "s3:GetAnalyticsConfiguration"),
    ("analytics", "PUT"): ("PutBucketAnalyticsConfiguration", "s3:PutAnalyticsConfiguration"),
    ("analytics", "DELETE"): (
        "DeleteBucketAnalyticsConfiguration", "s3:PutAnalyticsConfiguration"
    ),
    ("metrics", "GET"): ("GetBucketMetricsConfiguration", "s3:GetMetricsConfiguration"),
    ("metrics", "PUT"): ("PutBucketMetricsConfiguration", "s3:PutMetricsConfiguration"),
    ("metrics", "DELETE"): ("DeleteBucketMetricsConfiguration", "s3:PutMetricsConfiguration"),
    ("inventory", "GET"): ("GetBucketInventoryConfiguration", "s3:GetInventoryConfiguration"),
    ("inventory", "PUT"): ("PutBucketInventoryConfiguration", "s3:PutInventoryConfiguration"),
    ("inventory", "DELETE"): (
        "DeleteBucketInventoryConfiguration", "s3:PutInventoryConfiguration"
    ),
    ("intelligent-tiering", "GET"): (
        "GetBucketIntelligentTieringConfiguration", "s3:GetIntelligentTieringConfiguration"
    ),
    ("intelligent-tiering", "PUT"): (
        "PutBucketIntelligentTieringConfiguration", "s3:PutIntelligentTieringConfiguration"
    ),
    ("intelligent-tiering", "DELETE"): (
        "DeleteBucketIntelligentTieringConfiguration", "s3:PutIntelligentTieringConfiguration"
    ),
    ("session", "GET"): ("CreateSession", "s3express:CreateSession"),
}  # fmt: skip

# (subresource, method) -> (operation, action, action when a versionId is given).
_OBJECT: dict[tuple[str, str], tuple[str, str, str]] = {
    ("", "GET"): ("GetObject", "s3:GetObject", "s3:GetObjectVersion"),
    ("", "HEAD"): ("HeadObject", "s3:GetObject", "s3:GetObjectVersion"),
    ("", "PUT"): ("PutObject", "s3:PutObject", "s3:PutObject"),
    ("", "DELETE"): ("DeleteObject", "s3:DeleteObject", "s3:DeleteObjectVersion"),
    ("uploads", "POST"): ("CreateMultipartUpload", "s3:PutObject", "s3:PutObject"),
    ("tagging", "GET"): ("GetObjectTagging", "s3:GetObjectTagging", "s3:GetObjectVersionTagging"),
    ("tagging", "PUT"): ("PutObjectTagging", "s3:PutObjectTagging", "s3:PutObjectVersionTagging"),
    ("tagging", "DELETE"): (
        "DeleteObjectTagging", "s3:DeleteObjectTagging", "s3:DeleteObjectVersionTagging"
    ),
    ("acl", "GET"): ("GetObjectAcl", "s3:GetObjectAcl", "s3:GetObjectVersionAcl"),
    ("acl", "PUT"): ("PutObjectAcl", "s3:PutObjectAcl", "s3:PutObjectVersionAcl"),
    ("retention", "GET"): ("GetObjectRetention", "s3:GetObjectRetention", "s3:GetObjectRetention"),
    ("retention", "PUT"): ("PutObjectRetention", "s3:PutObjectRetention", "s3:PutObjectRetention"),
    ("legal-hold", "GET"): (
        "GetObjectLegalHold", "s3:GetObjectLegalHold", "s3:GetObjectLegalHold"
    ),
    ("legal-hold", "PUT"): (
        "PutObjectLegalHold", "s3:PutObjectLegalHold", "s3:PutObjectLegalHold"
    ),
    ("attributes", "GET"): (
        "GetObjectAttributes", "s3:GetObjectAttributes", "s3:GetObjectVersionAttributes"
    ),
    ("torrent", "GET"): ("GetObjectTorrent", "s3:GetObjectTorrent", "s3:GetObjectVersionTorrent"),
    ("restore", "POST"): ("RestoreObject", "s3:RestoreObject", "s3:RestoreObject"),
    ("select", "POST"): ("SelectObjectContent", "s3:GetObject", "s3:GetObject"),
}  # fmt: skip

# Operations addressed with ?uploadId (and ?partNumber) on an object.
_UPLOAD: dict[str, tuple[str, str]] = {
    "GET": ("ListParts", "s3:ListMultipartUploadParts"),
    "PUT": ("UploadPart", "s3:PutObject"),
    "POST": ("CompleteMultipartUpload", "s3:PutObject"),
    "DELETE": ("AbortMultipartUpload", "s3:AbortMultipartUpload"),
}

_VERB = {"GET": "Get", "HEAD": "Head", "PUT": "Put", "POST": "Post", "DELETE": "Delete"}

# Every name `classify` gives that S3 has; the rest are generic names built from the request.
KNOWN = frozenset(
    {
        *(name for name, _ in _BUCKET.values()),
        *(name for name, _, _ in _OBJECT.values()),
        *(name for name, _ in _UPLOAD.values()),
        Op.LIST_BUCKETS,
        Op.LIST_OBJECTS_V2,
        Op.COPY_OBJECT,
        Op.UPLOAD_PART_COPY,
    }
)


@dataclass(frozen=True, slots=True)
class Operation:
    """An S3 operation and what authorizes it.

    ``copy_source`` is set for CopyObject and UploadPartCopy: the caller must also check
    ``copy_source_action`` (``s3:GetObject``, or ``s3:GetObjectVersion`` when the source
    names a version, ``copy_source_version``) on ``arn:aws:s3:::<bucket>/<key>`` of the
    source. What reaches the origin is :attr:`forwarded_copy_source`, rebuilt from exactly
    that, never the client's header: an origin that parses the header differently must not
    copy a key other than the one authorized.

    DeleteObjects is a bucket request (``resource`` is the bucket) whose keys travel in
    its XML body: ``per_key`` is set, ``action`` is not checked on ``resource`` (S3 asks
    no bucket-level permission), and the server must check ``s3:DeleteObject`` (or
    ``s3:DeleteObjectVersion``) on each key instead.
    """

    name: str
    action: str
    resource: str
    copy_source: tuple[str, str] | None = None
    copy_source_action: str = "s3:GetObject"
    copy_source_version: str = ""
    per_key: bool = False

    @property
    def forwarded_copy_source(self) -> str | None:
        """The ``x-amz-copy-source`` to send the origin (None: send none)."""
        if self.copy_source is None:
            return None
        return copy_source_header(*self.copy_source, self.copy_source_version)


def classify(
    method: str,
    bucket: str,
    key: str,
    query: Sequence[tuple[str, str]],
    headers: Mapping[str, str],
) -> Operation:
    """Name the operation a request performs. Raises :class:`S3Error` for a bad copy source."""
    method = method.upper()
    names = {name for name, _ in query}
    subresources = sorted(n for n in names if n not in _ARGUMENTS and not _is_amz(n))
    if not bucket:
        return _service(method, subresources)
    if not key:
        return _bucket_operation(method, bucket, subresources, names)
    copy_header = _copy_source_header(headers, query)
    return _object_operation(method, object_arn(bucket, key), subresources, names, copy_header)


def object_arn(bucket: str, key: str) -> str:
    return f"arn:aws:s3:::{bucket}/{key}"


def bucket_arn(bucket: str) -> str:
    return f"arn:aws:s3:::{bucket}"


def _is_amz(name: str) -> bool:
    # X-Amz-Signature & co. of presigned URLs, and x-amz-* headers hoisted into the query.
    return name[:6].lower() == "x-amz-"


def _service(method: str, subresources: list[str]) -> Operation:
    if method == "GET" and not subresources:
        return Operation(Op.LIST_BUCKETS, "s3:ListAllMyBuckets", "*")
    name = _generic(method, "Service", subresources)
    return Operation(name, f"s3:{name}", "*")


def _bucket_operation(
    method: str, bucket: str, subresources: list[str], names: set[str]
) -> Operation:
    resource = bucket_arn(bucket)
    sub = subresources[0] if len(subresources) == 1 else ""
    known = _BUCKET.get((sub, method)) if len(subresources) <= 1 else None
    if known is None:
        name = _generic(method, "Bucket", subresources)
        return Operation(name, f"s3:{name}", resource)
    name, action = known
    if name == Op.LIST_OBJECTS and "list-type" in names:
        name = Op.LIST_OBJECTS_V2
    return Operation(name, action, resource, per_key=name == Op.DELETE_OBJECTS)


def _object_operation(
    method: str, resource: str, subresources: list[str], names: set[str], copy_header: str | None
) -> Operation:
    if "uploadId" in names:
        if subresources or method not in _UPLOAD:
            # An upload id next to a subresource names no real operation: fail closed.
            name = _generic(method, "Object", [*subresources, "uploadId"])
            return Operation(name, f"s3:{name}", resource)
        if method == "PUT" and copy_header is not None:
            return _copy(Op.UPLOAD_PART_COPY, resource, copy_header)
        name, action = _UPLOAD[method]
        return Operation(name, action, resource)
    known = _OBJECT.get((subresources[0] if subresources else "", method))
    if known is None or len(subresources) > 1:
        name = _generic(method, "Object", subresources)
        return Operation(name, f"s3:{name}", resource)
    name, action, version_action = known
    if name == Op.PUT_OBJECT and copy_header is not None:
        return _copy(Op.COPY_OBJECT, resource, copy_header)
    return Operation(name, version_action if "versionId" in names else action, resource)


def _generic(method: str, level: str, subresources: list[str]) -> str:
    verb = _VERB.get(method, method.capitalize())
    words = "".join(_camel(s) for s in subresources)
    return f"{verb}{level}{words}"


def _camel(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.replace("_", "-").split("-"))


def _copy_source_header(headers: Mapping[str, str], query: Sequence[tuple[str, str]]) -> str | None:
    value = headers.get("x-amz-copy-source")
    if value is not None:
        return value
    # Some SDKs hoist x-amz-* headers of presigned requests into the query string.
    for name, query_value in query:
        if name.lower() == "x-amz-copy-source":
            return query_value
    return None


def _copy(name: str, resource: str, header: str) -> Operation:
    source_bucket, source_key, version = parse_copy_source(header)
    return Operation(
        name,
        "s3:PutObject",
        resource,
        copy_source=(source_bucket, source_key),
        copy_source_action="s3:GetObjectVersion" if version else "s3:GetObject",
        copy_source_version=version,
    )


# A `%` not followed by two hex digits: S3 refuses such a header, unquote() would keep it.
_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")


def parse_copy_source(header: str) -> tuple[str, str, str]:
    """``x-amz-copy-source`` -> (bucket, key, version id or "").

    The header is ``[/]bucket/key[?versionId=id]`` with the bucket and key URL-encoded:
    the one literal ``?`` starts the version suffix, which is the only query S3 takes; a
    ``?`` or ``#`` inside the key is encoded. ``;`` is a key character (S3 does not know
    RFC 3986 path parameters). Anything else is refused as S3 refuses it.
    """
    if "#" in header:
        raise _bad_copy_source(header)
    raw, question, query = header.partition("?")
    version = ""
    if question:
        name, equals, version = query.partition("=")
        if name != "versionId" or not equals or not version or "&" in version:
            raise _bad_copy_source(header)
        version = _unquote(version, header)
    bucket, slash, key = _unquote(raw.removeprefix("/"), header).partition("/")
    if not slash or not key or not is_valid_bucket_name(bucket):
        raise _bad_copy_source(header)
    return bucket, key, version


def copy_source_header(bucket: str, key: str, version_id: str = "") -> str:
    """The ``x-amz-copy-source`` naming exactly (bucket, key, version): everything but
    unreserved characters and the key's slashes percent-encoded, so that S3 (and any
    URL parser) decodes it back to the same key."""
    header = f"{uri_encode(bucket, keep_slash=False)}/{uri_encode(key, keep_slash=True)}"
    if version_id:
        header += f"?versionId={uri_encode(version_id, keep_slash=False)}"
    return header


def _unquote(text: str, header: str) -> str:
    if _BAD_PERCENT.search(text):
        raise _bad_copy_source(header)
    try:
        return unquote(text, errors="strict")
    except UnicodeDecodeError as exc:
        raise _bad_copy_source(header) from exc


def _bad_copy_source(header: str) -> S3Error:
    return S3Error(
        "InvalidArgument",
        "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
        extra={"ArgumentName": "x-amz-copy-source", "ArgumentValue": header},
    )
