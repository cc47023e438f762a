"""AWS Signature Version 2 for S3 (verification only), without I/O.

boto3 in its default configuration still presigns S3 URLs with SigV2
(``?AWSAccessKeyId=AK&Signature=...&Expires=1796235500``), so LOTA accepts both SigV2
forms: that query string, and the ``Authorization: AWS AKID:signature`` header. The
signature is base64(HMAC-SHA1(secret, StringToSign))::

    VERB \\n Content-MD5 \\n Content-Type \\n Expires-or-Date \\n
    CanonicalizedAmzHeaders CanonicalizedResource

matching botocore's ``HmacV1Auth`` / ``HmacV1QueryAuth``:

* Content-MD5 and Content-Type are the request's *headers* (stripped), even for a
  presigned URL, which lists them in its query only as a reminder: a URL presigned with a
  ContentType needs a request with that Content-Type header.
* CanonicalizedAmzHeaders is every ``x-amz-*`` header, lowercased and sorted, as
  ``name:value\\n`` (repeated values joined by ``,``). botocore hoists the ``x-amz-*``
  headers of a presigned request into its query, so ``x-amz-*`` query parameters count as
  headers too (in both forms, so none can be added to a signed request unnoticed).
* CanonicalizedResource is ``/bucket`` + the path as sent (still percent-encoded; for a
  virtual-hosted request the bucket comes from the Host), ``/bucket/`` for a request on a
  bucket, then ``?`` + the sub-resources of :data:`SUBRESOURCES`, sorted by name, with
  decoded values and a bare name for an empty value (``?acl``, ``?uploads``).
* The time is ``Expires`` (absolute epoch seconds) for a presigned URL, else the ``Date``
  header; ``x-amz-date`` wins over ``Date`` for the clock-skew check.

SigV2 signs no payload, so a request's body is checked only against what its headers
promise (Content-MD5, ``x-amz-checksum-*``, an ``x-amz-content-sha256`` digest): the
:class:`~lota.auth.sigv4.Verified` of a SigV2 request carries ``UNSIGNED-PAYLOAD`` unless
the request sent a (signed, being ``x-amz-*``) ``x-amz-content-sha256``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import quote, unquote

from lota.auth.credentials import CredentialStore
from lota.auth.sigv4 import (
    STREAMING_SIGNED,
    STREAMING_SIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    RequestView,
    Verified,
    parse_payload_hash,
)
from lota.auth.sigv4 import _parse_http_date as parse_http_date
from lota.auth.sigv4 import _parse_timestamp as parse_timestamp
from lota.s3.errors import S3Error

# The query parameters that sign a SigV2 presigned URL.
QUERY_AUTH_PARAMS = frozenset({"AWSAccessKeyId", "Signature", "Expires"})
# What botocore's HmacV1QueryAuth also copies into a presigned URL's query besides the
# x-amz-* headers: reminders of the headers the request must send, not sub-resources.
HOISTED_PARAMS = frozenset({"content-type", "content-md5"})

# botocore's HmacV1Auth.QSAOfInterest: the query parameters that are signed.
SUBRESOURCES = frozenset(
    {
        "accelerate", "acl", "cors", "defaultObjectAcl", "location", "logging",
        "partNumber", "policy", "requestPayment", "torrent", "versioning", "versionId",
        "versions", "website", "uploads", "uploadId", "response-content-type",
        "response-content-language", "response-expires", "response-cache-control",
        "response-content-disposition", "response-content-encoding", "delete", "lifecycle",
        "tagging", "restore", "storageClass", "notification", "replication", "analytics",
        "metrics", "inventory", "select", "select-type", "object-lock",
    }
)  # fmt: skip

_AMZ_PREFIX = "x-amz-"
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
_MAX_EXPIRES_DIGITS = 12  # epoch seconds up to the year 33658


@dataclass(frozen=True, slots=True)
class _Claim:
    """What a SigV2 request says about its own signature, before any of it is believed."""

    access_key_id: str
    signature: str
    date_lines: tuple[str, ...]  # the Expires-or-Date line(s) the client may have signed
    date: datetime  # the request time (header form) or the expiry (presigned)
    expires: int | None  # presigned URLs only


def is_sigv2(view: RequestView) -> bool:
    """Whether a request claims SigV2 (``Authorization: AWS ...`` or v2 query parameters)."""
    authorization = view.headers.get("authorization")
    if authorization is not None:
        return authorization.strip().partition(" ")[0] == "AWS"
    names = {name for name, _ in view.query}
    return "X-Amz-Algorithm" not in names and ("AWSAccessKeyId" in names or "Signature" in names)


def is_presigned(view: RequestView) -> bool:
    """Whether a (SigV2) request carries its signature in the query string."""
    return view.headers.get("authorization") is None and any(
        name in ("AWSAccessKeyId", "Signature") for name, _ in view.query
    )


def operation_query(view: RequestView) -> tuple[tuple[str, str], ...]:
    """The query of a SigV2 request without its auth parameters, to name its operation."""
    if not is_presigned(view):
        return view.query
    drop = QUERY_AUTH_PARAMS | HOISTED_PARAMS
    return tuple(pair for pair in view.query if pair[0] not in drop)


def verify(
    view: RequestView,
    bucket: str,
    key: str,
    store: CredentialStore,
    now: datetime,
    max_skew: float,
) -> Verified:
    """Authenticate a SigV2 request; raise the :class:`S3Error` S3 would answer if it fails.

    `bucket` and `key` are the request's, as the server parsed them (``""`` when absent);
    they say whether the path is path-style or virtual-hosted.
    """
    claim = _claim(view)
    _check_time(view, claim, now, max_skew)
    principal = store.get(claim.access_key_id)
    if principal is None:
        raise S3Error(
            "InvalidAccessKeyId",
            "The AWS Access Key Id you provided does not exist in our records.",
            extra={"AWSAccessKeyId": _printable(claim.access_key_id[:128])},
        )
    payload_hash = _payload_hash(view.headers)
    _check_signature(view, bucket, key, claim, principal.secret_access_key)
    signed_at = claim.date.timestamp()
    return Verified(
        principal=principal,
        region="",
        date=claim.date if claim.expires is None else now,
        signature=claim.signature,
        scope="",
        payload_hash=payload_hash,
        signing_key=b"",
        valid_from=-math.inf if claim.expires is not None else signed_at - max_skew,
        valid_until=claim.expires if claim.expires is not None else signed_at + max_skew,
    )


def sign(secret: str, string_to_sign: str) -> str:
    """base64(HMAC-SHA1(secret, string_to_sign)), the SigV2 signature."""
    digest = hmac.new(secret.encode(), string_to_sign.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


# --- string to sign ----------------------------------------------------------------------


def strings_to_sign(view: RequestView, bucket: str, key: str, date_line: str) -> list[str]:
    """Every StringToSign a well-behaved client may have signed for this request.

    The first is botocore's spelling. The others differ only in spellings S3 treats alike
    (the path re-encoded as botocore would, ``/bucket`` without its ``/``, ``?name=`` for
    an empty sub-resource), so none of them can name another resource.
    """
    head = "\n".join(
        (
            view.method.upper(),
            _header(view.headers, "content-md5"),
            _header(view.headers, "content-type"),
            date_line,
            _canonical_amz_headers(view),
        )
    )
    return [
        f"{head}{path}{sub}"
        for path, sub in itertools.product(
            canonical_paths(view.raw_path, bucket, key), _subresource_variants(view.query)
        )
    ]


def canonical_paths(raw_path: str, bucket: str, key: str) -> list[str]:
    """The CanonicalizedResource without sub-resources: ``/bucket/key-as-sent``."""
    if not bucket:
        return [raw_path or "/"]
    decoded = unquote(raw_path)
    if key and decoded[1:] == key:  # virtual-hosted: the path is only the key
        paths = [f"/{bucket}{raw_path}"]
        reencoded = f"/{bucket}{_reencode(raw_path)}"
    elif not key and raw_path in ("", "/"):  # virtual-hosted, on the bucket
        return [f"/{bucket}/", f"/{bucket}"]
    else:  # path style: the path names the bucket
        paths = [raw_path]
        reencoded = _reencode(raw_path)
    if not key:
        bare = paths[0].rstrip("/")
        return [f"{bare}/", bare]
    if reencoded != paths[0]:
        paths.append(reencoded)
    return paths


def _reencode(raw_path: str) -> str:
    # botocore's percent_encode(key, safe="/~"): everything but unreserved characters and /.
    return quote(unquote(raw_path), safe="/")


def _subresource_variants(query: Iterable[tuple[str, str]]) -> list[str]:
    pairs = sorted(
        ((name, value) for name, value in query if name in SUBRESOURCES), key=lambda p: p[0]
    )
    if not pairs:
        return [""]
    bare = "?" + "&".join(f"{n}={v}" if v else n for n, v in pairs)
    if all(v for _, v in pairs):
        return [bare]
    return [bare, "?" + "&".join(f"{n}={v}" for n, v in pairs)]


def _canonical_amz_headers(view: RequestView) -> str:
    values: dict[str, list[str]] = {}
    for name, value in view.query:
        lower = name.lower()
        if lower.startswith(_AMZ_PREFIX):
            values.setdefault(lower, []).append(value.strip())
    headers = view.headers
    getall = getattr(headers, "getall", None)
    for name in sorted({n.lower() for n in headers if n.lower().startswith(_AMZ_PREFIX)}):
        found: list[str] = getall(name, []) if getall else _single(headers, name)
        values.setdefault(name, []).extend(v.strip() for v in found)
    return "".join(f"{name}:{','.join(values[name])}\n" for name in sorted(values))


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    return "" if value is None else value.strip()


def _single(headers: Mapping[str, str], name: str) -> list[str]:
    value = headers.get(name)
    return [] if value is None else [value]


# --- parsing what the request claims -----------------------------------------------------


def _claim(view: RequestView) -> _Claim:
    authorization = view.headers.get("authorization")
    presigned_params = [name for name, _ in view.query if name in QUERY_AUTH_PARAMS]
    if authorization is not None:
        if any(name in ("AWSAccessKeyId", "Signature") for name in presigned_params):
            raise S3Error(
                "InvalidArgument",
                "Only one auth mechanism allowed; only the Signature query parameter or the "
                "Authorization header should be specified.",
            )
        return _header_claim(view, authorization)
    return _query_claim(view, presigned_params)


def _header_claim(view: RequestView, authorization: str) -> _Claim:
    _, _, credentials = authorization.strip().partition(" ")
    access_key_id, colon, signature = credentials.strip().partition(":")
    if not colon or not access_key_id or not signature:
        raise S3Error(
            "InvalidArgument",
            "AWS authorization header is invalid.  Expected AwsAccessKeyId:signature",
            extra={
                "ArgumentName": "Authorization",
                "ArgumentValue": _printable(authorization[:100]),
            },
        )
    headers = view.headers
    date_header = headers.get("date")
    amz_date = headers.get("x-amz-date")
    date = _parse_any_date(amz_date) if amz_date is not None else _parse_any_date(date_header)
    if date is None:
        raise S3Error(
            "AccessDenied", "AWS authentication requires a valid Date or x-amz-date header"
        )
    date_lines = [date_header.strip() if date_header is not None else ""]
    if amz_date is not None and date_lines[0]:
        date_lines.append("")  # S3: with x-amz-date, the Date line may be left empty
    return _Claim(
        access_key_id=access_key_id,
        signature=signature.strip(),
        date_lines=tuple(date_lines),
        date=date,
        expires=None,
    )


def _query_claim(view: RequestView, presigned_params: list[str]) -> _Claim:
    if sorted(presigned_params) != sorted(QUERY_AUTH_PARAMS):
        raise S3Error(
            "AccessDenied",
            "Query-string authentication requires the Signature, Expires and "
            "AWSAccessKeyId parameters, each given once",
        )
    params = {name: value for name, value in view.query if name in QUERY_AUTH_PARAMS}
    expires = params["Expires"]
    if not expires.isascii() or not expires.isdigit() or len(expires) > _MAX_EXPIRES_DIGITS:
        raise S3Error("AccessDenied", "Invalid date (should be seconds since epoch)")
    return _Claim(
        access_key_id=params["AWSAccessKeyId"],
        signature=params["Signature"],
        date_lines=(expires,),
        date=datetime.fromtimestamp(int(expires), UTC),
        expires=int(expires),
    )


def _parse_any_date(value: str | None) -> datetime | None:
    """An RFC 7231 date, as SigV2 clients send, or SigV4's ``20130524T000000Z``."""
    if value is None:
        return None
    return parse_timestamp(value.strip()) or parse_http_date(value)


def _payload_hash(headers: Mapping[str, str]) -> str:
    value = headers.get("x-amz-content-sha256")
    if value is None:
        return UNSIGNED_PAYLOAD
    mode = parse_payload_hash(value)
    if mode in (STREAMING_SIGNED, STREAMING_SIGNED_TRAILER):
        raise S3Error(
            "InvalidRequest", f"{mode} needs a SigV4 seed signature; this request uses SigV2."
        )
    return mode


# --- checks ------------------------------------------------------------------------------


def _check_time(view: RequestView, claim: _Claim, now: datetime, max_skew: float) -> None:
    if claim.expires is not None:
        if now.timestamp() > claim.expires:
            raise S3Error(
                "AccessDenied",
                "Request has expired",
                extra={"Expires": _iso(claim.date), "ServerTime": _iso(now)},
            )
        return
    if abs((now - claim.date).total_seconds()) > max_skew:
        sent = view.headers.get("x-amz-date") or view.headers.get("date") or ""
        raise S3Error(
            "RequestTimeTooSkewed",
            "The difference between the request time and the current time is too large.",
            extra={
                "RequestTime": _printable(sent[:64]),
                "ServerTime": _iso(now),
                "MaxAllowedSkewMilliseconds": str(int(max_skew * 1000)),
            },
        )


def _check_signature(view: RequestView, bucket: str, key: str, claim: _Claim, secret: str) -> None:
    provided = claim.signature.encode("utf-8", "backslashreplace")
    first = ""
    for date_line in claim.date_lines:
        for candidate in strings_to_sign(view, bucket, key, date_line):
            first = first or candidate
            if hmac.compare_digest(sign(secret, candidate).encode(), provided):
                return
    raise S3Error(
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. "
        "Check your key and signing method.",
        extra={
            "AWSAccessKeyId": _printable(claim.access_key_id[:128]),
            "StringToSign": _printable(first),
            "SignatureProvided": _printable(claim.signature[:64]),
        },
    )


def _printable(text: str) -> str:
    """`text` fit for an XML error body: characters XML 1.0 forbids become ``?``."""
    return _CONTROL_RE.sub("?", text)


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
