"""AWS Signature Version 4 for S3, both directions, without I/O.

:func:`verify` checks a client's request (``Authorization`` header or presigned query
string) against the credential store; :func:`sign_headers` signs LOTA's own requests to an
origin. Both build the same canonical request::

    METHOD \\n CanonicalURI \\n CanonicalQuery \\n CanonicalHeaders \\n SignedHeaders \\n
    PayloadHash

S3 quirks that matter here:

* The canonical URI is *not* normalised (``a//b`` and ``../`` stay as they are) and not
  double-encoded: the path is percent-decoded once and re-encoded with only RFC 3986
  unreserved characters and ``/`` left bare, which is what botocore and the other SDKs send
  for any key. A client that encoded its path differently but signed it verbatim is
  accepted too (both spellings decode to the same key, so nothing else can be smuggled).
* The canonical query sorts the *encoded* (name, value) pairs; blank values stay (``acl=``).
* For header auth the payload hash is the ``x-amz-content-sha256`` header, which S3
  requires; presigned URLs sign ``UNSIGNED-PAYLOAD``.
* Every ``x-amz-*`` header in the request must be signed, as S3 demands, so that nobody
  can add ``x-amz-copy-source`` or ``x-amz-acl`` to a request (or presigned URL) that was
  signed without them.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from functools import lru_cache
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from lota.auth.credentials import CredentialStore, Principal
from lota.s3.errors import S3Error

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
STREAMING_SIGNED = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_SIGNED_TRAILER = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
PAYLOAD_MODES = frozenset(
    {UNSIGNED_PAYLOAD, STREAMING_SIGNED, STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER}
)
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_PRESIGN_EXPIRES = 604800  # one week, S3's limit
TIMESTAMP_FORMAT = "%Y%m%dT%H%M%SZ"

_PRESIGN_PARAMS = (
    "X-Amz-Algorithm",
    "X-Amz-Credential",
    "X-Amz-Date",
    "X-Amz-Expires",
    "X-Amz-SignedHeaders",
    "X-Amz-Signature",
)
_TIMESTAMP_RE = re.compile(r"(\d{4})(\d\d)(\d\d)T(\d\d)(\d\d)(\d\d)Z", re.ASCII)
_UNRESERVED = re.compile(r"[A-Za-z0-9\-._~]*")
_UNRESERVED_PATH = re.compile(r"[A-Za-z0-9\-._~/]*")
_SIGNATURE_RE = re.compile(r"[0-9a-f]{64}")
_SHA256_RE = re.compile(r"[0-9a-fA-F]{64}")
_GENERATED = frozenset({"authorization", "x-amz-date", "x-amz-content-sha256"})
_SIGNED_BY_US = frozenset({"host", "content-type", "content-md5"})


@dataclass(frozen=True, slots=True)
class RequestView:
    """What the server hands to auth: the request as sent, decoded no further than stated."""

    method: str
    raw_path: str  # as sent, still percent-encoded, without the query
    query: tuple[tuple[str, str], ...]  # percent-decoded pairs in the order sent
    headers: Mapping[str, str]  # case-insensitive; a CIMultiDictProxy keeps repeated headers


@dataclass(frozen=True, slots=True)
class Verified:
    """A request whose signature checked out, and what its body decoder needs to go on."""

    principal: Principal
    region: str
    date: datetime
    signature: str  # the seed signature that signed chunks chain from
    scope: str  # "20130524/us-east-1/s3/aws4_request"
    payload_hash: str
    signing_key: bytes
    # The same request verifies again while the clock reads within [valid_from, valid_until]
    # (epoch seconds): a presigned URL until it expires, a signed header within the skew.
    valid_from: float
    valid_until: float

    @property
    def timestamp(self) -> str:
        """The request time as it appears in strings to sign (``20130524T000000Z``)."""
        return self.date.strftime(TIMESTAMP_FORMAT)


@dataclass(frozen=True, slots=True)
class _Claim:
    """What a request says about its own signature, before any of it is believed."""

    access_key_id: str
    scope_date: str
    region: str
    signed_headers: tuple[str, ...]
    signature: str
    timestamp: str
    date: datetime
    payload_hash: str
    expires: int | None  # presigned URLs only
    error: str  # the S3 code for a malformed claim of this kind

    @property
    def scope(self) -> str:
        return f"{self.scope_date}/{self.region}/s3/aws4_request"


@lru_cache(maxsize=256)
def signing_key(secret: str, date: str, region: str, service: str = "s3") -> bytes:
    """The derived SigV4 key; cached because it only changes once a day per principal."""
    key = _hmac(f"AWS4{secret}".encode(), date)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return key


def verify(view: RequestView, store: CredentialStore, now: datetime, max_skew: float) -> Verified:
    """Authenticate a request; raise the :class:`S3Error` S3 would answer if it fails."""
    claim = _claim(view)
    _check_time(claim, now, max_skew)
    principal = store.get(claim.access_key_id)
    if principal is None:
        raise S3Error(
            "InvalidAccessKeyId",
            "The AWS Access Key Id you provided does not exist in our records.",
            extra={"AWSAccessKeyId": claim.access_key_id},
        )
    key = signing_key(principal.secret_access_key, claim.scope_date, claim.region)
    _check_signature(view, claim, key)
    signed_at = claim.date.timestamp()
    return Verified(
        principal=principal,
        region=claim.region,
        date=claim.date,
        signature=claim.signature,
        scope=claim.scope,
        payload_hash=claim.payload_hash,
        signing_key=key,
        valid_from=signed_at - max_skew,
        valid_until=signed_at + (max_skew if claim.expires is None else claim.expires),
    )


def sign_headers(
    method: str,
    url: str,
    headers: Mapping[str, str],
    *,
    access_key_id: str,
    secret_access_key: str,
    region: str,
    payload_hash: str,
    now: datetime,
    service: str = "s3",
) -> dict[str, str]:
    """The headers to add to a request to an origin so that it is SigV4-signed.

    Signs ``host`` plus whichever of ``content-type``, ``content-md5`` and ``x-amz-*`` are
    in `headers`. The result holds ``authorization``, ``x-amz-date``,
    ``x-amz-content-sha256`` and, when `headers` has none, ``host``: send `headers` updated
    with it, dropping any ``authorization``/``x-amz-date``/``x-amz-content-sha256`` of
    `headers` (those are ignored here). `url` is sent exactly as given; its path and query
    must already be percent-encoded.
    """
    parts = urlsplit(url)
    lower = {k.lower(): v for k, v in headers.items() if k.lower() not in _GENERATED}
    timestamp = now.astimezone(UTC).strftime(TIMESTAMP_FORMAT)
    added = {"x-amz-date": timestamp, "x-amz-content-sha256": payload_hash}
    if "host" not in lower:
        added["host"] = _host_from_url(parts.scheme, parts.hostname or "", parts.port)
    lower.update(added)
    names = sorted(n for n in lower if n in _SIGNED_BY_US or n.startswith("x-amz-"))
    canonical = "\n".join(
        (
            method.upper(),
            canonical_uri(parts.path),
            canonical_query(_split_query(parts.query)),
            "".join(f"{n}:{_trim(lower[n])}\n" for n in names),
            ";".join(names),
            payload_hash,
        )
    )
    scope = f"{timestamp[:8]}/{region}/{service}/aws4_request"
    key = signing_key(secret_access_key, timestamp[:8], region, service)
    signature = _hmac(key, string_to_sign(timestamp, scope, canonical)).hex()
    added["authorization"] = (
        f"{ALGORITHM} Credential={access_key_id}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return added


# --- canonical request -------------------------------------------------------------------


def canonical_uri(raw_path: str) -> str:
    """S3's canonical URI: decoded once, re-encoded with unreserved characters and ``/``."""
    if _UNRESERVED_PATH.fullmatch(raw_path):  # the common case costs no decoding
        return raw_path or "/"
    return quote(unquote(raw_path), safe="/")


def canonical_query(pairs: Iterable[tuple[str, str]]) -> str:
    """Decoded (name, value) pairs -> the canonical query string (sorted after encoding)."""
    encoded = sorted((_encode(k), _encode(v)) for k, v in pairs)
    return "&".join(f"{k}={v}" for k, v in encoded)


def _encode(text: str) -> str:
    return text if _UNRESERVED.fullmatch(text) else quote(text, safe="-_.~")


def string_to_sign(timestamp: str, scope: str, canonical_request: str) -> str:
    digest = hashlib.sha256(canonical_request.encode()).hexdigest()
    return f"{ALGORITHM}\n{timestamp}\n{scope}\n{digest}"


def _canonical_headers(headers: Mapping[str, str], names: Iterable[str]) -> str:
    getall = getattr(headers, "getall", None)
    lines = []
    for name in sorted(names):
        values: list[str] = getall(name, []) if getall else _single(headers, name)
        lines.append(f"{name}:{','.join(_trim(v) for v in values)}\n")
    return "".join(lines)


def _single(headers: Mapping[str, str], name: str) -> list[str]:
    value = headers.get(name)
    return [] if value is None else [value]


def _trim(value: str) -> str:
    return " ".join(value.split())


def _split_query(raw: str) -> list[tuple[str, str]]:
    pairs = []
    for item in raw.split("&"):
        if item:
            name, _, value = item.partition("=")
            pairs.append((unquote(name), unquote(value)))
    return pairs


def _host_from_url(scheme: str, hostname: str, port: int | None) -> str:
    host = f"[{hostname}]" if ":" in hostname else hostname
    if port is not None and port != {"http": 80, "https": 443}.get(scheme):
        host = f"{host}:{port}"
    return host


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


# --- parsing what the request claims -----------------------------------------------------


def _claim(view: RequestView) -> _Claim:
    authorization = view.headers.get("authorization")
    presigned = any(name == "X-Amz-Algorithm" for name, _ in view.query)
    if authorization is not None and presigned:
        raise S3Error(
            "InvalidArgument", "Only one auth mechanism allowed; only the X-Amz-Algorithm "
            "query parameter or the Authorization header should be specified.",
        )  # fmt: skip
    if authorization is not None:
        return _header_claim(view, authorization)
    if presigned:
        return _query_claim(view)
    if any(name in ("X-Amz-Credential", "X-Amz-Signature") for name, _ in view.query):
        raise _malformed_query("the X-Amz-Algorithm parameter is missing")
    if any(name in ("AWSAccessKeyId", "Signature") for name, _ in view.query):
        raise _unsupported_v2()
    raise S3Error("AccessDenied", "Anonymous access is not allowed; sign requests with SigV4.")


def _header_claim(view: RequestView, authorization: str) -> _Claim:
    algorithm, _, rest = authorization.strip().partition(" ")
    if algorithm == "AWS":
        raise _unsupported_v2()
    if algorithm != ALGORITHM:
        raise S3Error(
            "InvalidRequest",
            f"Unsupported authorization algorithm {algorithm[:40]!r}; use {ALGORITHM}.",
        )
    fields = _authorization_fields(rest)
    timestamp, date = _header_time(view.headers)
    payload_hash = view.headers.get("x-amz-content-sha256")
    if payload_hash is None:
        raise S3Error(
            "InvalidRequest", "Missing required header for this request: x-amz-content-sha256"
        )
    return _build_claim(
        credential=fields["Credential"],
        signed_headers=fields["SignedHeaders"],
        signature=fields["Signature"],
        timestamp=timestamp,
        date=date,
        payload_hash=parse_payload_hash(payload_hash),
        expires=None,
        error="AuthorizationHeaderMalformed",
    )


def _authorization_fields(rest: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for item in rest.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or name in fields or name not in ("Credential", "SignedHeaders", "Signature"):
            raise _malformed_header(f"unexpected component {name[:40]!r}")
        fields[name] = value.strip()
    missing = {"Credential", "SignedHeaders", "Signature"} - set(fields)
    if missing:
        raise _malformed_header(f"missing {', '.join(sorted(missing))}")
    return fields


def _query_claim(view: RequestView) -> _Claim:
    params: dict[str, str] = {}
    for name, value in view.query:
        if name in _PRESIGN_PARAMS:
            if name in params:
                raise _malformed_query(f"{name} is given more than once")
            params[name] = value
    missing = [name for name in _PRESIGN_PARAMS if name not in params]
    if missing:
        raise _malformed_query(
            "Query-string authentication version 4 requires the X-Amz-Algorithm, "
            "X-Amz-Credential, X-Amz-Signature, X-Amz-Date, X-Amz-SignedHeaders, and "
            f"X-Amz-Expires parameters (missing {', '.join(missing)})."
        )
    if params["X-Amz-Algorithm"] != ALGORITHM:
        raise _malformed_query(f'X-Amz-Algorithm only supports "{ALGORITHM}"')
    expires = params["X-Amz-Expires"]
    if not expires.isascii() or not expires.isdigit() or len(expires) > 7:
        raise _malformed_query("X-Amz-Expires should be a number")
    if int(expires) > MAX_PRESIGN_EXPIRES:
        raise _malformed_query("X-Amz-Expires must be less than a week (in seconds) that is 604800")
    timestamp = params["X-Amz-Date"]
    date = _parse_timestamp(timestamp)
    if date is None:
        raise _malformed_query(
            "X-Amz-Date must be in the ISO8601 Long Format \"yyyyMMdd'T'HHmmss'Z'\""
        )
    header_hash = view.headers.get("x-amz-content-sha256")
    return _build_claim(
        credential=params["X-Amz-Credential"],
        signed_headers=params["X-Amz-SignedHeaders"],
        signature=params["X-Amz-Signature"],
        timestamp=timestamp,
        date=date,
        payload_hash=UNSIGNED_PAYLOAD if header_hash is None else parse_payload_hash(header_hash),
        expires=int(expires),
        error="AuthorizationQueryParametersError",
    )


def _build_claim(
    *,
    credential: str,
    signed_headers: str,
    signature: str,
    timestamp: str,
    date: datetime,
    payload_hash: str,
    expires: int | None,
    error: str,
) -> _Claim:
    parts = credential.split("/")
    if len(parts) != 5 or not parts[0] or not parts[2] or parts[4] != "aws4_request":
        raise S3Error(
            error,
            "The credential is malformed; expecting "
            '"<YOUR-AKID>/YYYYMMDD/REGION/SERVICE/aws4_request".',
        )
    access_key_id, scope_date, region, service, _ = parts
    if service != "s3":
        raise S3Error(error, f'Wrong service {service[:40]!r} in the credential; expecting "s3".')
    if scope_date != timestamp[:8]:
        raise S3Error(error, "Invalid credential date. Date is not the same as X-Amz-Date.")
    names = tuple(signed_headers.split(";"))
    if "host" not in names or not all(n and n == n.lower() for n in names):
        raise S3Error(
            error, "SignedHeaders must be lowercase names separated by ';' and include host."
        )
    if _SIGNATURE_RE.fullmatch(signature) is None:
        raise S3Error(error, "The signature must be 64 lowercase hexadecimal digits.")
    return _Claim(
        access_key_id=access_key_id,
        scope_date=scope_date,
        region=region,
        signed_headers=names,
        signature=signature,
        timestamp=timestamp,
        date=date,
        payload_hash=payload_hash,
        expires=expires,
        error=error,
    )


def _header_time(headers: Mapping[str, str]) -> tuple[str, datetime]:
    """The request time from x-amz-date, or failing that from Date (RFC 7231)."""
    amz_date = headers.get("x-amz-date")
    if amz_date is not None:
        date = _parse_timestamp(amz_date)
    else:
        date = _parse_http_date(headers.get("date"))
    if date is None:
        raise S3Error(
            "AccessDenied", "AWS authentication requires a valid Date or x-amz-date header"
        )
    return amz_date or date.strftime(TIMESTAMP_FORMAT), date


def _parse_timestamp(value: str) -> datetime | None:
    """``20130524T000000Z`` -> datetime; by hand, because strptime costs ~10 µs a call."""
    match = _TIMESTAMP_RE.fullmatch(value)
    if match is None:
        return None
    try:
        year, month, day, hour, minute, second = map(int, match.groups())
        return datetime(year, month, day, hour, minute, second, tzinfo=UTC)
    except ValueError:
        return None


def _parse_http_date(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        date = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return date.astimezone(UTC) if date.tzinfo else date.replace(tzinfo=UTC)


def parse_payload_hash(value: str) -> str:
    """Validate an ``x-amz-content-sha256`` value: a sha256 hex digest or a payload mode."""
    if value in PAYLOAD_MODES or _SHA256_RE.fullmatch(value):
        return value
    if value.startswith("STREAMING-"):
        raise S3Error("NotImplemented", f"{value[:60]} is not supported (only SigV4 HMAC).")
    raise S3Error(
        "InvalidArgument",
        "x-amz-content-sha256 must be UNSIGNED-PAYLOAD, STREAMING-UNSIGNED-PAYLOAD-TRAILER, "
        "STREAMING-AWS4-HMAC-SHA256-PAYLOAD(-TRAILER), or a valid sha256 value.",
        extra={"ArgumentName": "x-amz-content-sha256", "ArgumentValue": value[:100]},
    )


# --- checks ------------------------------------------------------------------------------


def _check_time(claim: _Claim, now: datetime, max_skew: float) -> None:
    if claim.expires is not None:
        _check_presign_window(claim, now, max_skew, claim.expires)
        return
    if abs((now - claim.date).total_seconds()) > max_skew:
        raise S3Error(
            "RequestTimeTooSkewed",
            "The difference between the request time and the current time is too large.",
            extra={
                "RequestTime": claim.timestamp,
                "ServerTime": _iso(now),
                "MaxAllowedSkewMilliseconds": str(int(max_skew * 1000)),
            },
        )


def _check_presign_window(claim: _Claim, now: datetime, max_skew: float, expires: int) -> None:
    if (claim.date - now).total_seconds() > max_skew:
        raise S3Error("AccessDenied", "Request is not valid yet")
    expiry = claim.date + timedelta(seconds=expires)
    if now > expiry:
        raise S3Error(
            "AccessDenied",
            "Request has expired",
            extra={
                "X-Amz-Expires": str(expires),
                "Expires": _iso(expiry),
                "ServerTime": _iso(now),
            },
        )


def _check_signature(view: RequestView, claim: _Claim, key: bytes) -> None:
    _check_all_amz_signed(view.headers, claim)
    query = view.query
    if claim.expires is not None:
        query = tuple(pair for pair in query if pair[0] != "X-Amz-Signature")
    head = f"{view.method.upper()}\n"
    tail = "\n".join(
        (
            canonical_query(query),
            _canonical_headers(view.headers, claim.signed_headers),
            ";".join(claim.signed_headers),
            claim.payload_hash,
        )
    )
    uri = canonical_uri(view.raw_path)
    for path in (uri, view.raw_path) if view.raw_path != uri else (uri,):
        canonical = f"{head}{path}\n{tail}"
        expected = _hmac(key, string_to_sign(claim.timestamp, claim.scope, canonical)).hex()
        if hmac.compare_digest(expected, claim.signature):
            return
    raise S3Error(
        "SignatureDoesNotMatch",
        "The request signature we calculated does not match the signature you provided. "
        "Check your key and signing method.",
        extra={"AWSAccessKeyId": claim.access_key_id},
    )


def _check_all_amz_signed(headers: Mapping[str, Any], claim: _Claim) -> None:
    signed = set(claim.signed_headers)
    unsigned = sorted({n.lower() for n in headers if n.lower().startswith("x-amz-")} - signed)
    if unsigned:
        raise S3Error(
            "AccessDenied",
            "There were headers present in the request which were not signed",
            extra={"HeadersNotSigned": ", ".join(unsigned)},
        )


# --- errors ------------------------------------------------------------------------------


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _malformed_header(detail: str) -> S3Error:
    return S3Error(
        "AuthorizationHeaderMalformed",
        f"The authorization header is malformed; {detail}. Expected "
        f'"{ALGORITHM} Credential=..., SignedHeaders=..., Signature=...".',
    )


def _malformed_query(detail: str) -> S3Error:
    return S3Error("AuthorizationQueryParametersError", detail)


def _unsupported_v2() -> S3Error:
    return S3Error(
        "InvalidRequest",
        "Signature Version 2 is not supported; sign requests with AWS4-HMAC-SHA256 (SigV4).",
    )
