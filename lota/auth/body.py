"""Incremental, sans-io decoding and checking of S3 request bodies.

A body arrives in one of two shapes, chosen by ``x-amz-content-sha256``:

* plain bytes (a sha256 hex digest, or ``UNSIGNED-PAYLOAD``): passed through, hashed;
* ``aws-chunked`` (``STREAMING-*``): framed as ``hex-size[;chunk-signature=sig]\\r\\n`` +
  data + ``\\r\\n``, ended by a zero-size chunk, then optional trailer lines
  (``x-amz-checksum-crc32:...``, ``x-amz-trailer-signature:...``) and an empty line.
  Signed chunks chain: each chunk's signature covers the previous one, starting from the
  seed signature of the request (AWS "Transferring Payload in Multiple Chunks")::

      AWS4-HMAC-SHA256-PAYLOAD \\n timestamp \\n scope \\n previous-signature \\n
      sha256("") \\n sha256(chunk-data)

  and the trailer signature covers the canonical trailer lines ``name:value\\n``::

      AWS4-HMAC-SHA256-TRAILER \\n timestamp \\n scope \\n last-chunk-signature \\n
      sha256(trailer-lines)

Whatever the shape, the decoded payload is checked against everything the request
promised: its length (``Content-Length`` / ``x-amz-decoded-content-length``), the signed
sha256, ``Content-MD5`` and the ``x-amz-checksum-*`` headers or trailers (base64 of the
big-endian digest, as S3 computes them). Memory stays bounded: only a chunk-header or
trailer line is ever buffered, never chunk data.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from typing import Protocol

from awscrt import checksums  # type: ignore[import-untyped]

from lota.auth.sigv4 import (
    EMPTY_SHA256,
    STREAMING_SIGNED,
    STREAMING_SIGNED_TRAILER,
    STREAMING_UNSIGNED_TRAILER,
    UNSIGNED_PAYLOAD,
    RequestView,
    Verified,
    parse_payload_hash,
)
from lota.s3.errors import S3Error

MAX_LINE = 4096  # a chunk header is ~100 bytes, a checksum trailer ~80
MAX_TRAILER_BYTES = 16 * 1024
_CHUNK_SIZE_RE = re.compile(rb"[0-9a-fA-F]{1,16}")
_SIGNATURE_RE = re.compile(rb"[0-9a-f]{64}")
_DIGITS_RE = re.compile(r"[0-9]{1,19}")
_SIGNED_MODES = frozenset({STREAMING_SIGNED, STREAMING_SIGNED_TRAILER})
_TRAILER_MODES = frozenset({STREAMING_SIGNED_TRAILER, STREAMING_UNSIGNED_TRAILER})


class _Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def digest(self) -> bytes: ...


class _Crc:
    """A running CRC with a hashlib-like face; the digest is big-endian, as S3 encodes it."""

    __slots__ = ("_function", "_size", "_value")

    def __init__(self, function: Callable[[bytes, int], int], size: int) -> None:
        self._function = function
        self._size = size
        self._value = 0

    def update(self, data: bytes, /) -> None:
        self._value = self._function(data, self._value)

    def digest(self) -> bytes:
        return self._value.to_bytes(self._size, "big")


# x-amz-checksum-<name> -> (factory, digest size). CRC-32 uses awscrt's implementation
# too: it equals zlib.crc32 and is many times faster on large bodies.
CHECKSUMS: dict[str, tuple[Callable[[], _Hash], int]] = {
    "crc32": (lambda: _Crc(checksums.crc32, 4), 4),
    "crc32c": (lambda: _Crc(checksums.crc32c, 4), 4),
    "crc64nvme": (lambda: _Crc(checksums.crc64nvme, 8), 8),
    "sha1": (hashlib.sha1, 20),
    "sha256": (hashlib.sha256, 32),
}
_CHECKSUM_PREFIX = "x-amz-checksum-"


class BodyDecoder:
    """Turns the raw request body into the payload, checking it on the way.

    Use: for every piece of the body as it is received, ``out = decoder.feed(piece)`` and
    pass ``out`` on; at the end of the body call ``decoder.finish()``. Any call may raise
    an :class:`S3Error`; then the body is bad and whatever was passed on must be discarded.

    Contract: ``feed`` returns payload bytes *before* they are fully verified. A signed
    chunk's signature is checked when the chunk ends, and lengths, the signed sha256,
    Content-MD5 and checksums only in :meth:`finish`. So the caller must hold back the end
    of the body (the last write, the commit of the upload, the "200 OK") until
    :meth:`finish` has returned; a body that fails is never presented as complete.
    After :meth:`finish`, :attr:`trailers` holds the trailing headers that were sent.
    """

    def __init__(
        self,
        *,
        expected_length: int | None,
        sha256: str | None = None,
        content_md5: bytes | None = None,
        header_checksums: Mapping[str, bytes] | None = None,
        framing: _AwsChunked | None = None,
    ) -> None:
        self.expected_length = expected_length
        self.trailers: dict[str, str] = {}
        self._received = 0
        self._expected_sha256 = sha256
        self._expected_md5 = content_md5
        self._expected_checksums = dict(header_checksums or {})
        self._framing = framing
        self._hashes: dict[str, _Hash] = {}
        if sha256 is not None:
            self._hashes["sha256!"] = hashlib.sha256()
        if content_md5 is not None:
            self._hashes["md5!"] = hashlib.md5(usedforsecurity=False)
        names = set(self._expected_checksums) | (framing.declared if framing else set())
        for name in names:
            self._hashes[name] = CHECKSUMS[name][0]()
        self._finished = False

    def feed(self, data: bytes) -> bytes:
        """Raw body bytes in, payload bytes out (possibly ``b""``)."""
        payload = self._framing.feed(data) if self._framing is not None else data
        if payload:
            self._received += len(payload)
            if self.expected_length is not None and self._received > self.expected_length:
                raise S3Error(
                    "InvalidRequest",
                    f"The request body is longer than the {self.expected_length} bytes declared.",
                )
            for digest in self._hashes.values():
                digest.update(payload)
        return payload

    def finish(self) -> None:
        """At the end of the body: raise unless everything the request promised holds."""
        if self._finished:
            return
        if self._framing is not None:
            self.trailers = self._framing.finish()
        if self.expected_length is not None and self._received < self.expected_length:
            raise S3Error(
                "IncompleteBody",
                "You did not provide the number of bytes specified by the Content-Length "
                f"HTTP header ({self._received} of {self.expected_length}).",
            )
        self._check_sha256()
        self._check_md5()
        self._check_checksums()
        self._finished = True

    def _check_sha256(self) -> None:
        if self._expected_sha256 is None:
            return
        computed = self._hashes["sha256!"].digest().hex()
        if computed != self._expected_sha256:
            raise S3Error(
                "XAmzContentSHA256Mismatch",
                "The provided 'x-amz-content-sha256' header does not match what was computed.",
                extra={
                    "ClientComputedContentSHA256": self._expected_sha256,
                    "S3ComputedContentSHA256": computed,
                },
            )

    def _check_md5(self) -> None:
        if self._expected_md5 is None:
            return
        if not hmac.compare_digest(self._hashes["md5!"].digest(), self._expected_md5):
            raise S3Error(
                "BadDigest", "The Content-MD5 you specified did not match what we received."
            )

    def _check_checksums(self) -> None:
        expected = dict(self._expected_checksums)
        for name, value in self.trailers.items():
            if name.startswith(_CHECKSUM_PREFIX):
                algorithm = name.removeprefix(_CHECKSUM_PREFIX)
                expected[algorithm] = _decode_checksum(algorithm, value, "trailer")
        for algorithm, digest in expected.items():
            if not hmac.compare_digest(self._hashes[algorithm].digest(), digest):
                raise S3Error(
                    "BadDigest",
                    f"The {algorithm.upper()} you specified did not match the calculated checksum.",
                )


class _AwsChunked:
    """The aws-chunked framing: a line/data state machine that never buffers chunk data."""

    _HEADER, _DATA, _DATA_END, _TRAILER, _DONE = range(5)

    def __init__(
        self, *, signed: bool, verified: Verified | None, declared: set[str], trailer: bool
    ) -> None:
        self.declared = declared  # checksum algorithms announced in x-amz-trailer
        self._signed = signed
        self._trailer_mode = trailer
        self._chain = _SignatureChain(verified) if signed and verified is not None else None
        self._state = self._HEADER
        self._line = bytearray()
        self._remaining = 0
        self._crlf_seen = 0
        self._chunk_signature = ""
        self._chunk_hash = hashlib.sha256()
        self._trailers: dict[str, str] = {}
        self._trailer_signature: str | None = None
        self._trailer_bytes = 0

    def feed(self, data: bytes) -> bytes:
        out: list[bytes] = []
        position, end = 0, len(data)
        while position < end:
            if self._state == self._DATA:
                position = self._take_data(data, position, out)
            elif self._state == self._DATA_END:
                position = self._take_crlf(data, position)
            elif self._state == self._DONE:
                raise _framing_error("Data follows the end of the aws-chunked body.")
            else:
                position = self._take_line(data, position)
        return out[0] if len(out) == 1 else b"".join(out)

    def finish(self) -> dict[str, str]:
        if self._state == self._TRAILER and not self._line:
            # Some SDKs end the body after the last trailer line, without the empty line.
            self._end_trailers()
        if self._state != self._DONE:
            raise S3Error(
                "IncompleteBody",
                "The aws-chunked body ended before its final zero-length chunk and trailers.",
            )
        return self._trailers

    def _take_data(self, data: bytes, position: int, out: list[bytes]) -> int:
        take = min(self._remaining, len(data) - position)
        piece = data[position : position + take]
        if self._chain is not None:
            self._chunk_hash.update(piece)
        out.append(piece)
        self._remaining -= take
        if self._remaining == 0:
            if self._chain is not None:
                self._chain.check_chunk(self._chunk_hash.hexdigest(), self._chunk_signature)
            self._state = self._DATA_END
        return position + take

    def _take_crlf(self, data: bytes, position: int) -> int:
        wanted = b"\r\n"[self._crlf_seen :]
        got = data[position : position + len(wanted)]
        if not wanted.startswith(got):
            raise _framing_error("A chunk's data is not followed by CRLF.")
        self._crlf_seen += len(got)
        if self._crlf_seen == 2:
            self._crlf_seen = 0
            self._state = self._HEADER
        return position + len(got)

    def _take_line(self, data: bytes, position: int) -> int:
        # Never look further than a line may be long, so a line-less flood buffers nothing.
        limit = min(len(data), position + MAX_LINE + 1 - len(self._line))
        newline = data.find(b"\n", position, limit)
        stop = limit if newline < 0 else newline + 1
        self._line += data[position:stop]
        if len(self._line) > MAX_LINE:
            raise _framing_error("A chunk header or trailer line is too long.")
        if newline >= 0:
            if not self._line.endswith(b"\r\n"):
                raise _framing_error("Chunk header and trailer lines must end with CRLF.")
            line = bytes(self._line[:-2])
            self._line.clear()
            if self._state == self._HEADER:
                self._chunk_header(line)
            else:
                self._trailer_line(line)
        return stop

    def _chunk_header(self, line: bytes) -> None:
        size_text, has_extension, extension = line.partition(b";")
        if _CHUNK_SIZE_RE.fullmatch(size_text) is None:
            raise _framing_error(f"Invalid chunk size {size_text[:20]!r}.")
        size = int(size_text, 16)
        self._chunk_signature = self._signature_of(extension if has_extension else None)
        if size == 0:
            if self._chain is not None:
                self._chain.check_chunk(EMPTY_SHA256, self._chunk_signature)
            self._state = self._TRAILER
        else:
            self._remaining = size
            self._chunk_hash = hashlib.sha256()
            self._state = self._DATA

    def _signature_of(self, extension: bytes | None) -> str:
        if extension is None:
            if self._signed:
                raise S3Error("SignatureDoesNotMatch", "A signed chunk has no chunk-signature.")
            return ""
        name, _, value = extension.partition(b"=")
        if name.strip() != b"chunk-signature":
            if self._signed:
                raise _framing_error(f"Unexpected chunk extension {name[:40]!r}.")
            return ""  # chunk extensions carry nothing S3 uses; ignore them when unsigned
        if _SIGNATURE_RE.fullmatch(value) is None:
            raise _framing_error("A chunk-signature must be 64 lowercase hex digits.")
        return value.decode()

    def _trailer_line(self, line: bytes) -> None:
        if not line:
            self._end_trailers()
            return
        self._trailer_bytes += len(line)
        if self._trailer_bytes > MAX_TRAILER_BYTES:
            raise _trailer_error("The trailers are too large.")
        name_bytes, colon, value_bytes = line.partition(b":")
        try:
            name = name_bytes.decode("ascii").strip().lower()
            value = value_bytes.decode("ascii").strip()
        except UnicodeDecodeError as exc:
            raise _trailer_error("Trailers must be ASCII.") from exc
        if not colon or not name:
            raise _trailer_error("A trailer line is not name:value.")
        if name == "x-amz-trailer-signature" and self._signed and self._trailer_mode:
            if self._trailer_signature is not None:
                raise _trailer_error("x-amz-trailer-signature is given twice.")
            self._trailer_signature = value
            return
        if name.removeprefix(_CHECKSUM_PREFIX) not in self.declared or name in self._trailers:
            raise _trailer_error(f"Trailer {name[:60]!r} was not declared in x-amz-trailer.")
        self._trailers[name] = value

    def _end_trailers(self) -> None:
        missing = {f"{_CHECKSUM_PREFIX}{a}" for a in self.declared} - set(self._trailers)
        if missing:
            raise _trailer_error(f"The declared trailer {', '.join(sorted(missing))} is missing.")
        if self._chain is not None and self._trailer_mode and self._trailers:
            if self._trailer_signature is None:
                raise S3Error("SignatureDoesNotMatch", "The trailers are not signed.")
            canonical = "".join(f"{n}:{v}\n" for n, v in sorted(self._trailers.items()))
            self._chain.check_trailer(canonical, self._trailer_signature)
        self._state = self._DONE


class _SignatureChain:
    """The chunk signatures of a signed aws-chunked body, each chained to the previous one."""

    __slots__ = ("_key", "_prefix", "_previous")

    def __init__(self, verified: Verified) -> None:
        self._key = verified.signing_key
        self._prefix = f"{verified.timestamp}\n{verified.scope}\n"
        self._previous = verified.signature

    def check_chunk(self, data_sha256: str, claimed: str) -> None:
        message = (
            f"AWS4-HMAC-SHA256-PAYLOAD\n{self._prefix}{self._previous}\n"
            f"{EMPTY_SHA256}\n{data_sha256}"
        )
        self._check(message, claimed, "chunk")

    def check_trailer(self, canonical: str, claimed: str) -> None:
        digest = hashlib.sha256(canonical.encode()).hexdigest()
        message = f"AWS4-HMAC-SHA256-TRAILER\n{self._prefix}{self._previous}\n{digest}"
        self._check(message, claimed, "trailer")

    def _check(self, message: str, claimed: str, what: str) -> None:
        expected = hmac.new(self._key, message.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, claimed):
            raise S3Error(
                "SignatureDoesNotMatch",
                f"The {what} signature we calculated does not match the one you provided.",
            )
        self._previous = expected


def make_decoder(view: RequestView, verified: Verified | None) -> BodyDecoder:
    """The decoder for this request's body; `verified` is None when auth is off."""
    headers = view.headers
    if verified is not None:
        mode = verified.payload_hash
    else:
        mode = parse_payload_hash(headers.get("x-amz-content-sha256") or UNSIGNED_PAYLOAD)
    streaming = mode.startswith("STREAMING-")
    framing = None
    if streaming:
        expected_length = _length(headers, "x-amz-decoded-content-length")
        if expected_length is None:
            raise S3Error(
                "MissingContentLength",
                "An aws-chunked body needs the x-amz-decoded-content-length header.",
            )
        framing = _AwsChunked(
            signed=mode in _SIGNED_MODES,
            verified=verified,
            declared=_declared_trailers(headers) if mode in _TRAILER_MODES else set(),
            trailer=mode in _TRAILER_MODES,
        )
    else:
        expected_length = _length(headers, "content-length")
    return BodyDecoder(
        expected_length=expected_length,
        sha256=None if streaming or mode == UNSIGNED_PAYLOAD else mode.lower(),
        content_md5=_content_md5(headers),
        header_checksums=_header_checksums(view),
        framing=framing,
    )


def _length(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    if value is None:
        return None
    if _DIGITS_RE.fullmatch(value.strip()) is None:
        raise S3Error("InvalidArgument", f"The {name} header is not a byte count.")
    return int(value)


def _content_md5(headers: Mapping[str, str]) -> bytes | None:
    value = headers.get("content-md5")
    if value is None:
        return None
    try:
        digest = base64.b64decode(value.strip(), validate=True)
    except binascii.Error:
        digest = b""
    if len(digest) != 16:
        raise S3Error("InvalidDigest", "The Content-MD5 you specified is not valid.")
    return digest


def _header_checksums(view: RequestView) -> dict[str, bytes]:
    """The x-amz-checksum-* headers that describe this body.

    CompleteMultipartUpload's checksum headers describe the whole object, not its XML
    body, and a copy has no body they could describe; those are left to the origin.
    """
    names = {name for name, _ in view.query}
    if view.headers.get("x-amz-copy-source") is not None:
        return {}
    if view.method.upper() == "POST" and "uploadId" in names:
        return {}
    found = {}
    for algorithm in CHECKSUMS:
        value = view.headers.get(_CHECKSUM_PREFIX + algorithm)
        if value is not None:
            found[algorithm] = _decode_checksum(algorithm, value, "header")
    return found


def _declared_trailers(headers: Mapping[str, str]) -> set[str]:
    declared = set()
    for item in (headers.get("x-amz-trailer") or "").split(","):
        name = item.strip().lower()
        if not name:
            continue
        algorithm = name.removeprefix(_CHECKSUM_PREFIX)
        if not name.startswith(_CHECKSUM_PREFIX) or algorithm not in CHECKSUMS:
            raise S3Error("InvalidRequest", f"Unsupported x-amz-trailer {name[:60]!r}.")
        declared.add(algorithm)
    return declared


def _decode_checksum(algorithm: str, value: str, where: str) -> bytes:
    try:
        digest = base64.b64decode(value.strip(), validate=True)
    except binascii.Error:
        digest = b""
    if len(digest) != CHECKSUMS[algorithm][1]:
        raise S3Error("InvalidRequest", f"Value for x-amz-checksum-{algorithm} {where} is invalid.")
    return digest


def _framing_error(message: str) -> S3Error:
    return S3Error("InvalidRequest", f"Malformed aws-chunked body: {message}")


def _trailer_error(message: str) -> S3Error:
    return S3Error("MalformedTrailerError", message)
