"""Relaying bodies between a client and an origin without holding them in memory.

Two rules keep this path honest:

* A request body reaches the origin only as fast as it is verified, and its last piece
  is held back until the whole body has checked out (length, signed hash, chunk
  signatures, checksums). A body that fails, or a client that goes away, aborts the
  origin request before it is complete, so a truncated or forged upload never becomes
  an object.
* A response body that breaks off at the origin breaks off at the client too (the
  connection is aborted), so a truncated body is never presented as complete.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

import aiohttp
from aiohttp import web

from lota.auth.body import BodyDecoder
from lota.http import forwardable_response_headers
from lota.s3.errors import S3Error

log = logging.getLogger("lota.relay")

READ_SIZE = 256 * 1024
# Re-encoded aws-chunked bodies (see `aws_chunked`) use chunks of this size.
CHUNK = 64 * 1024
# Length of the base64 value of each checksum S3 supports, for aws-chunked trailer sizing.
CHECKSUM_VALUE_LENGTH = {
    "x-amz-checksum-crc32": 8,
    "x-amz-checksum-crc32c": 8,
    "x-amz-checksum-crc64nvme": 12,
    "x-amz-checksum-sha1": 28,
    "x-amz-checksum-sha256": 44,
}


async def verified_body(
    request: web.BaseRequest, decoder: BodyDecoder, idle_timeout: float
) -> AsyncIterator[bytes]:
    """Yield the decoded request body, holding the last piece until it all verified.

    A client that sends nothing for `idle_timeout` seconds gets RequestTimeout, as from S3.
    """
    held = b""
    try:
        while True:
            try:
                async with asyncio.timeout(idle_timeout):
                    data = await request.content.readany()
            except TimeoutError:
                raise S3Error(
                    "RequestTimeout",
                    "Your socket connection to the server was not read from or written to "
                    "within the timeout period.",
                ) from None
            if not data:
                break
            out = decoder.feed(data)
            if out:
                if held:
                    yield held
                held = out
    except aiohttp.ClientError as exc:
        # aiohttp reports a body cut short by the client as a payload error.
        raise S3Error(
            "IncompleteBody", "The request body ended before its declared length."
        ) from exc
    decoder.finish()
    if held:
        yield held


async def read_small_body(
    request: web.BaseRequest,
    decoder: BodyDecoder,
    limit: int,
    idle_timeout: float,
) -> bytes:
    """Read and verify a whole request body that LOTA must look into (DeleteObjects)."""
    body = bytearray()
    async for piece in verified_body(request, decoder, idle_timeout):
        body += piece
        if len(body) > limit:
            raise S3Error("MalformedXML", f"The request body is larger than {limit} bytes.")
    return bytes(body)


def aws_chunked_length(payload_length: int, trailer_names: list[str]) -> int:
    """Encoded length of `payload_length` bytes sent by :func:`aws_chunked`."""
    full, rest = divmod(payload_length, CHUNK)
    size = full * (len(f"{CHUNK:x}") + 4 + CHUNK)
    if rest:
        size += len(f"{rest:x}") + 4 + rest
    size += 3  # "0\r\n"
    size += sum(len(n) + 1 + CHECKSUM_VALUE_LENGTH[n] + 2 for n in trailer_names)
    return size + 2


async def aws_chunked(
    payload: AsyncIterator[bytes], trailers: Callable[[], dict[str, str]]
) -> AsyncIterator[bytes]:
    """Encode `payload` as unsigned aws-chunked with trailing checksums, in fixed chunks.

    Fixed chunk sizes make the encoded length computable up front (:func:`aws_chunked_length`),
    so the origin gets a Content-Length, as S3 requires.
    """
    buffer = bytearray()
    async for piece in payload:
        buffer += piece
        while len(buffer) >= CHUNK:
            yield b"%x\r\n" % CHUNK + bytes(buffer[:CHUNK]) + b"\r\n"
            del buffer[:CHUNK]
    if buffer:
        yield b"%x\r\n" % len(buffer) + bytes(buffer) + b"\r\n"
    tail = "".join(f"{name}:{value}\r\n" for name, value in trailers().items())
    yield b"0\r\n" + tail.encode() + b"\r\n"


async def relay_response(
    request: web.BaseRequest,
    origin: aiohttp.ClientResponse,
    extra_headers: dict[str, str] | None = None,
) -> web.StreamResponse:
    """Stream an origin response to the client: status, headers and body as they are."""
    response = web.StreamResponse(status=origin.status, reason=origin.reason)
    for name, value in forwardable_response_headers(origin.headers.items()):
        response.headers.add(name, value)
    for name, value in (extra_headers or {}).items():
        response.headers[name] = value
    await response.prepare(request)
    if request.method != "HEAD":
        try:
            async for piece in origin.content.iter_chunked(READ_SIZE):
                await response.write(piece)
        except aiohttp.ClientPayloadError:
            log.warning("origin body broke off: %s %s; aborting", request.method, request.path)
            abort(request)
            return response
    await response.write_eof()
    return response


def abort(request: web.BaseRequest) -> None:
    """Cut the client connection so a partial response cannot pass for a whole one."""
    if request.transport is not None:
        request.transport.abort()
