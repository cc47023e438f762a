"""S3 errors as the client sees them: the one table of S3 error codes, and :class:`S3Error`.

Every error that reaches a client is an :class:`S3Error`, rendered as S3 XML with the
status the table below gives its code. Build them with :func:`s3_error` (or the named
helpers below) so that each S3 code has exactly one status. :class:`LotaError` and
:class:`OriginError` are in :mod:`lota.errors`, where the whole error tree is drawn.
"""

from __future__ import annotations

import re
from xml.sax.saxutils import escape

from lota.errors import LotaError

__all__ = [
    "STATUS",
    "S3Error",
    "access_denied",
    "invalid_argument",
    "invalid_request",
    "s3_error",
]

# S3 error code -> HTTP status, from the S3 API reference "List of error codes".
STATUS: dict[str, int] = {
    "AccessDenied": 403,
    "AuthorizationHeaderMalformed": 400,
    "AuthorizationQueryParametersError": 400,
    "BadDigest": 400,
    "EntityTooLarge": 400,
    "ExpiredToken": 400,
    "IncompleteBody": 400,
    "InternalError": 500,
    "InvalidAccessKeyId": 403,
    "InvalidArgument": 400,
    "InvalidBucketName": 400,
    "InvalidDigest": 400,
    "InvalidPartNumber": 416,
    "InvalidRange": 416,
    "InvalidRequest": 400,
    "InvalidURI": 400,
    "KeyTooLongError": 400,
    "MalformedTrailerError": 400,
    "MalformedXML": 400,
    "MethodNotAllowed": 405,
    "MissingContentLength": 411,
    "MissingSecurityHeader": 400,
    "NoSuchBucket": 404,
    "NoSuchKey": 404,
    "NoSuchUpload": 404,
    "NotImplemented": 501,
    "PreconditionFailed": 412,
    "RequestHeaderSectionTooLarge": 400,
    "RequestTimeTooSkewed": 403,
    "RequestTimeout": 400,
    "ServiceUnavailable": 503,
    "SignatureDoesNotMatch": 403,
    "SlowDown": 503,
    "XAmzContentSHA256Mismatch": 400,
}


# S3's own wording for the codes LOTA answers in more than one place: the message when
# none is given.
MESSAGES: dict[str, str] = {
    "AccessDenied": "Access Denied",
    "InternalError": "We encountered an internal error. Please try again.",
    "InvalidBucketName": "The specified bucket is not valid.",
    "NoSuchKey": "The specified key does not exist.",
    "NoSuchUpload": "The specified upload does not exist.",
}


class S3Error(LotaError):
    """An error answered to the client as S3 XML, with the status the table gives `code`
    and, without a `message`, S3's own wording for it (:data:`MESSAGES`)."""

    def __init__(
        self,
        code: str,
        message: str = "",
        *,
        status: int | None = None,
        resource: str = "",
        extra: dict[str, str] | None = None,
    ) -> None:
        message = message or MESSAGES.get(code, code)
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status if status is not None else STATUS.get(code, 400)
        self.resource = resource
        self.extra = extra or {}

    def to_xml(self, request_id: str = "") -> bytes:
        parts = [
            '<?xml version="1.0" encoding="UTF-8"?>\n<Error>',
            f"<Code>{_text(self.code)}</Code>",
            f"<Message>{_text(self.message)}</Message>",
        ]
        if self.resource:
            parts.append(f"<Resource>{_text(self.resource)}</Resource>")
        parts.extend(f"<{k}>{_text(v)}</{k}>" for k, v in self.extra.items())
        if request_id:
            parts.append(f"<RequestId>{_text(request_id)}</RequestId>")
        parts.append("</Error>")
        return "".join(parts).encode()


# Characters XML 1.0 cannot carry, not even as references: controls, lone surrogates (raw
# path bytes that are not UTF-8), U+FFFE and U+FFFF.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _text(value: str) -> str:
    """`value` as XML element text. What XML cannot carry is shown as the client sent it,
    percent-encoded (a control character, a byte that is not UTF-8), or else as U+FFFD:
    an error echoing a strange request path must still parse."""
    return escape(_NOT_XML.sub(_visible, value))


def _visible(match: re.Match[str]) -> str:
    code = ord(match[0])
    if code < 0x20:
        return f"%{code:02X}"
    if 0xDC80 <= code <= 0xDCFF:  # a byte decoded with surrogateescape
        return f"%{code - 0xDC00:02X}"
    return "\ufffd"


def s3_error(code: str, message: str, **kwargs: object) -> S3Error:
    """An :class:`S3Error` with the status S3 gives `code`."""
    return S3Error(code, message, **kwargs)  # type: ignore[arg-type]


def access_denied(message: str = "") -> S3Error:
    return S3Error("AccessDenied", message)


def invalid_request(message: str) -> S3Error:
    return S3Error("InvalidRequest", message)


def invalid_argument(message: str, name: str = "", value: str = "") -> S3Error:
    extra = {"ArgumentName": name, "ArgumentValue": value} if name else None
    return S3Error("InvalidArgument", message, extra=extra)
