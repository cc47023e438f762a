"""Pass-through: any S3 call LOTA does not handle itself goes to the bucket's home origin.

The request is re-signed with the region's service credentials; the body streams through
:func:`lota.relay.verified_body` (so it is checked before the origin can complete it); the
response streams back with its status, headers and XML errors as the origin sent them.
The client's ``x-amz-copy-source`` never travels on: the caller passes the one rebuilt
from the source it authorized (:attr:`lota.s3.operations.Operation.forwarded_copy_source`).
"""

from __future__ import annotations

import base64
import hashlib

from aiohttp import web

from lota.auth.body import BodyDecoder
from lota.http import PRESIGN_QUERY, forwardable_request_headers, forwardable_response_headers
from lota.regions.origin import Body
from lota.regions.origins import Origins
from lota.relay import (
    CHECKSUM_VALUE_LENGTH,
    aws_chunked,
    aws_chunked_length,
    relay_response,
    verified_body,
)
from lota.s3.addressing import Target
from lota.s3.errors import S3Error

STREAMING_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
BYPASS = {"x-lota-cache": "BYPASS"}
COPY_SOURCE = "x-amz-copy-source"
# Integrity headers that describe the client's body, wrong for one LOTA rebuilt.
CHECKSUM_HEADERS = ("x-amz-checksum-", "x-amz-sdk-checksum-")


class PassThrough:
    """Forwards requests to the origin of the addressed bucket's home region."""

    def __init__(self, origins: Origins, body_timeout: float = 60.0) -> None:
        self._body_timeout = body_timeout
        self._origins = origins

    async def forward(
        self,
        request: web.BaseRequest,
        target: Target,
        decoder: BodyDecoder,
        copy_source: str | None = None,
        *,
        body: bytes | None = None,
    ) -> web.StreamResponse:
        """Relay the request, streaming its body, or sending `body` when it was read already."""
        headers = forwardable_request_headers(request.headers)
        headers.pop(COPY_SOURCE, None)
        if copy_source is not None:
            headers[COPY_SOURCE] = copy_source
        # A copy source hoisted into a presigned URL's query was authorized as the header.
        query = [
            (k, v) for k, v in target.query if k not in PRESIGN_QUERY and k.lower() != COPY_SOURCE
        ]
        if body is None:
            data, payload_hash = self._body(request, decoder, headers)
        else:
            data, payload_hash = body, "UNSIGNED-PAYLOAD"
            headers["content-length"] = str(len(body))
            headers.update(decoder.trailers)
        async with self._origins.for_bucket(target.bucket).request(
            request.method,
            target.bucket,
            target.key,
            query=query,
            headers=headers,
            body=data,
            payload_hash=payload_hash,
        ) as origin:
            return await relay_response(request, origin, BYPASS)

    async def exchange(self, request: web.BaseRequest, target: Target, body: bytes) -> web.Response:
        """Send `body` in place of the client's (LOTA rebuilt it) and answer with the origin's
        response read whole, for the caller to amend. For small answers (DeleteObjects)."""
        headers = {
            k: v
            for k, v in forwardable_request_headers(request.headers).items()
            if k not in ("content-md5", "accept-encoding") and not k.startswith(CHECKSUM_HEADERS)
        }
        # S3 insists on an integrity header for DeleteObjects: one for the body it gets.
        headers["content-md5"] = base64.b64encode(hashlib.md5(body).digest()).decode()
        headers["content-length"] = str(len(body))
        query = [(k, v) for k, v in target.query if k not in PRESIGN_QUERY]
        async with self._origins.for_bucket(target.bucket).request(
            request.method, target.bucket, target.key, query=query, headers=headers, body=body
        ) as origin:
            answer = await origin.read()
            response = web.Response(status=origin.status, body=answer)
            for name, value in forwardable_response_headers(origin.headers.items()):
                if name.lower() not in ("content-length", "content-encoding"):
                    response.headers.add(name, value)
        response.headers.update(BYPASS)
        return response

    def _body(
        self, request: web.BaseRequest, decoder: BodyDecoder, headers: dict[str, str]
    ) -> tuple[Body, str]:
        """The body to send on and the payload hash to sign it with; sets its length headers."""
        length = decoder.expected_length
        if length is None:
            if request.body_exists:
                raise S3Error(
                    "MissingContentLength", "You must provide the Content-Length HTTP header."
                )
            return None, "UNSIGNED-PAYLOAD"
        payload = verified_body(request, decoder, self._body_timeout)
        trailer_names = _declared_trailers(request.headers.get("x-amz-trailer", ""))
        if not trailer_names:
            headers["content-length"] = str(length)
            return payload, "UNSIGNED-PAYLOAD"
        # Keep the client's trailing checksum: the origin stores it with the object.
        headers["content-encoding"] = ",".join(
            filter(None, ["aws-chunked", headers.get("content-encoding", "")])
        )
        headers["x-amz-decoded-content-length"] = str(length)
        headers["x-amz-trailer"] = ",".join(trailer_names)
        headers["content-length"] = str(aws_chunked_length(length, trailer_names))
        return aws_chunked(payload, lambda: decoder.trailers), STREAMING_TRAILER


def _declared_trailers(value: str) -> list[str]:
    names = [n.strip().lower() for n in value.split(",") if n.strip()]
    for name in names:
        if name not in CHECKSUM_VALUE_LENGTH:
            raise S3Error("InvalidRequest", f"Unsupported trailer {name!r}.")
    return names
