"""Request-body decoding: AWS's published aws-chunked vectors, trailers, checksums, framing."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import itertools
import zlib
from collections.abc import Iterable
from datetime import UTC, datetime

import boto3
import pytest
from awscrt import checksums  # type: ignore[import-untyped]
from botocore.config import Config
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy

from lota.auth.body import BodyDecoder, make_decoder
from lota.auth.credentials import CredentialStore, Principal
from lota.auth.policy import Policy
from lota.auth.sigv4 import RequestView, Verified, verify
from lota.s3.errors import S3Error

# AWS's example credentials and request time, used by every published SigV4 example.
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
AWS_SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
AWS_TIME = datetime(2013, 5, 24, tzinfo=UTC)
AWS_STORE = CredentialStore([Principal("example", AWS_KEY, AWS_SECRET, Policy.deny_all())])
EMPTY = hashlib.sha256(b"").hexdigest()


def view(
    headers: dict[str, str], method: str = "PUT", query: Iterable[tuple[str, str]] = ()
) -> RequestView:
    return RequestView(
        method,
        "/examplebucket/chunkObject.txt",
        tuple(query),
        CIMultiDictProxy(CIMultiDict(headers)),
    )


def decode(decoder: BodyDecoder, pieces: Iterable[bytes]) -> bytes:
    out = b"".join(decoder.feed(piece) for piece in pieces)
    decoder.finish()
    return out


def error_of(decoder: BodyDecoder, pieces: Iterable[bytes]) -> str:
    with pytest.raises(S3Error) as info:
        decode(decoder, pieces)
    return info.value.code


def chunks(body: bytes, size: int) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)] or [b""]


def b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


def crc32(data: bytes) -> str:
    return b64(zlib.crc32(data).to_bytes(4, "big"))


# --- AWS "Example: PUT Object" in "Transferring Payload in Multiple Chunks" --------------

SEED = "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9"
CHUNK_SIGNATURES = [
    "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648",
    "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497",
    "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9",
]
STREAMING_HEADERS = {
    "Host": "s3.amazonaws.com",
    "x-amz-date": "20130524T000000Z",
    "x-amz-storage-class": "REDUCED_REDUNDANCY",
    "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD",
    "Content-Encoding": "aws-chunked",
    "x-amz-decoded-content-length": "66560",
    "Content-Length": "66824",
    "Authorization": (
        f"AWS4-HMAC-SHA256 Credential={AWS_KEY}/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=content-encoding;content-length;host;x-amz-content-sha256;x-amz-date;"
        f"x-amz-decoded-content-length;x-amz-storage-class,Signature={SEED}"
    ),
}


def signed_body(sizes: Iterable[int], signatures: Iterable[str], data: bytes = b"a") -> bytes:
    return b"".join(
        f"{size:x};chunk-signature={sig}\r\n".encode() + data * size + b"\r\n"
        for size, sig in zip(sizes, signatures, strict=True)
    )


AWS_BODY = signed_body([65536, 1024, 0], CHUNK_SIGNATURES)


def aws_verified() -> tuple[RequestView, Verified]:
    request = view(STREAMING_HEADERS)
    return request, verify(request, AWS_STORE, AWS_TIME, 900)


def test_aws_example_seed_signature_verifies() -> None:
    _, verified = aws_verified()
    assert verified.signature == SEED
    assert verified.payload_hash == "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    assert verified.timestamp == "20130524T000000Z"
    assert len(AWS_BODY) == 66824  # the example's Content-Length


@pytest.mark.parametrize("piece", [1 << 20, 65536, 8192, 1000, 97, 7])
def test_aws_example_body_decodes_to_66560_a(piece: int) -> None:
    request, verified = aws_verified()
    decoder = make_decoder(request, verified)
    assert decoder.expected_length == 66560
    assert decode(decoder, chunks(AWS_BODY, piece)) == b"a" * 66560
    assert decoder.trailers == {}


def test_aws_example_one_byte_at_a_time() -> None:
    request, verified = aws_verified()
    decoder = make_decoder(request, verified)
    assert decode(decoder, (AWS_BODY[i : i + 1] for i in range(len(AWS_BODY)))) == b"a" * 66560


def test_aws_example_with_a_changed_byte_fails_its_chunk_signature() -> None:
    request, verified = aws_verified()
    corrupt = bytearray(AWS_BODY)
    corrupt[len(AWS_BODY) - 500] = ord("b")  # inside the 1024-byte chunk
    assert error_of(make_decoder(request, verified), [bytes(corrupt)]) == "SignatureDoesNotMatch"


def test_aws_example_chunk_signatures_must_chain() -> None:
    request, verified = aws_verified()
    swapped = signed_body(
        [65536, 1024, 0], [CHUNK_SIGNATURES[1], CHUNK_SIGNATURES[0], CHUNK_SIGNATURES[2]]
    )
    assert error_of(make_decoder(request, verified), [swapped]) == "SignatureDoesNotMatch"
    # Dropping a chunk breaks the chain too, even with the right total length elsewhere.
    dropped = signed_body([1024, 0], CHUNK_SIGNATURES[1:])
    assert error_of(make_decoder(request, verified), [dropped]) == "SignatureDoesNotMatch"


def test_aws_example_final_chunk_signature_is_checked() -> None:
    request, verified = aws_verified()
    body = AWS_BODY.replace(CHUNK_SIGNATURES[2].encode(), b"0" * 64)
    assert error_of(make_decoder(request, verified), [body]) == "SignatureDoesNotMatch"


def test_aws_example_without_signatures_is_refused() -> None:
    request, verified = aws_verified()
    body = b"10000\r\n" + b"a" * 65536 + b"\r\n400\r\n" + b"a" * 1024 + b"\r\n0\r\n\r\n"
    assert error_of(make_decoder(request, verified), [body]) == "SignatureDoesNotMatch"


def test_aws_example_truncated_before_the_final_chunk() -> None:
    request, verified = aws_verified()
    body = signed_body([65536, 1024], CHUNK_SIGNATURES[:2])
    assert error_of(make_decoder(request, verified), [body]) == "IncompleteBody"


def test_aws_example_with_auth_off_checks_framing_only() -> None:
    request, _ = aws_verified()
    body = AWS_BODY.replace(CHUNK_SIGNATURES[0].encode(), b"0" * 64)
    assert decode(make_decoder(request, None), [body]) == b"a" * 66560
    short = signed_body([65536, 0], [CHUNK_SIGNATURES[0], CHUNK_SIGNATURES[2]])
    assert error_of(make_decoder(request, None), [short]) == "IncompleteBody"


# --- AWS "Signature calculations for trailing headers" example ----------------------------

TRAILER_SEED = "106e2a8a18243abcf37539882f36619c00e2dfc72633413f02d3b74544bfeb8e"
TRAILER_CHUNKS = [
    "b474d8862b1487a5145d686f57f013e54db672cee1c953b3010fb58501ef5aa2",
    "1c1344b170168f8e65b41376b44b20fe354e373826ccbbe2c1d40a8cae51e5c7",
    "2ca2aba2005185cf7159c6277faf83795951dd77a3a99e6e65d5c9f85863f992",
]
TRAILER_HEADERS = {
    "Host": "s3.amazonaws.com",
    "x-amz-date": "20130524T000000Z",
    "x-amz-storage-class": "REDUCED_REDUNDANCY",
    "x-amz-content-sha256": "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER",
    "Content-Encoding": "aws-chunked",
    "x-amz-decoded-content-length": "66560",
    "x-amz-trailer": "x-amz-checksum-crc32c",
    "Authorization": (
        f"AWS4-HMAC-SHA256 Credential={AWS_KEY}/20130524/us-east-1/s3/aws4_request,"
        "SignedHeaders=content-encoding;host;x-amz-content-sha256;x-amz-date;"
        "x-amz-decoded-content-length;x-amz-storage-class;x-amz-trailer,"
        f"Signature={TRAILER_SEED}"
    ),
}


def trailer_signature(verified: Verified, previous: str, canonical: str) -> str:
    """The trailer signature, written out from the AWS page (its own sample value does not
    reproduce with any reading of the page, so the data-chunk vectors anchor the chain)."""
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256-TRAILER",
            "20130524T000000Z",
            "20130524/us-east-1/s3/aws4_request",
            previous,
            hashlib.sha256(canonical.encode()).hexdigest(),
        ]
    )
    return hmac.new(verified.signing_key, to_sign.encode(), hashlib.sha256).hexdigest()


def trailer_example(
    checksum: str = "sOO8/Q==", *, signature: str | None = None
) -> tuple[RequestView, Verified, bytes]:
    request = view(TRAILER_HEADERS)
    verified = verify(request, AWS_STORE, AWS_TIME, 900)
    canonical = f"x-amz-checksum-crc32c:{checksum}\n"
    signature = signature or trailer_signature(verified, TRAILER_CHUNKS[2], canonical)
    body = (
        signed_body([65536, 1024, 0], TRAILER_CHUNKS)[:-2]  # the 0-chunk has no data CRLF
        + canonical.replace("\n", "\r\n").encode()
        + f"x-amz-trailer-signature:{signature}\r\n\r\n".encode()
    )
    return request, verified, body


def test_aws_trailer_example_seed_and_chunk_signatures_verify() -> None:
    request, verified, body = trailer_example()
    assert verified.signature == TRAILER_SEED
    assert b64(checksums.crc32c(b"a" * 66560).to_bytes(4, "big")) == "sOO8/Q=="
    decoder = make_decoder(request, verified)
    assert decode(decoder, chunks(body, 4096)) == b"a" * 66560
    assert decoder.trailers == {"x-amz-checksum-crc32c": "sOO8/Q=="}


def test_aws_trailer_example_with_wrong_checksum_fails_even_when_signed() -> None:
    request, verified, body = trailer_example("AAAAAA==")
    assert error_of(make_decoder(request, verified), [body]) == "BadDigest"


def test_aws_trailer_example_with_a_forged_trailer_signature() -> None:
    request, verified, body = trailer_example(signature="0" * 64)
    assert error_of(make_decoder(request, verified), [body]) == "SignatureDoesNotMatch"


def test_aws_trailer_example_with_an_unsigned_trailer() -> None:
    request, verified, body = trailer_example()
    unsigned = body[: body.index(b"x-amz-trailer-signature")] + b"\r\n"
    assert error_of(make_decoder(request, verified), [unsigned]) == "SignatureDoesNotMatch"


@pytest.mark.parametrize("split", range(-160, 0))
def test_aws_trailer_example_split_anywhere_in_the_tail(split: int) -> None:
    request, verified, body = trailer_example()
    out = decode(make_decoder(request, verified), [body[:split], body[split:]])
    assert out == b"a" * 66560


# --- STREAMING-UNSIGNED-PAYLOAD-TRAILER, as botocore sends it -----------------------------

PAYLOAD = b"hello, trailer world\r\n0\r\n" * 3  # framing-like bytes inside the data


def unsigned_trailer_headers(trailer: str = "x-amz-checksum-crc32") -> dict[str, str]:
    return {
        "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
        "content-encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(PAYLOAD)),
        "x-amz-trailer": trailer,
    }


def unsigned_body(payload: bytes, trailer_lines: bytes, size: int = 16) -> bytes:
    body = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks(payload, size) if c)
    return body + b"0\r\n" + trailer_lines + b"\r\n"


GOOD_TRAILER = f"x-amz-checksum-crc32:{crc32(PAYLOAD)}\r\n".encode()
UNSIGNED_BODY = unsigned_body(PAYLOAD, GOOD_TRAILER)


def test_unsigned_trailer_with_correct_crc32() -> None:
    decoder = make_decoder(view(unsigned_trailer_headers()), None)
    assert decode(decoder, [UNSIGNED_BODY]) == PAYLOAD
    assert decoder.trailers == {"x-amz-checksum-crc32": crc32(PAYLOAD)}


def test_unsigned_trailer_with_wrong_crc32() -> None:
    body = unsigned_body(PAYLOAD, f"x-amz-checksum-crc32:{crc32(PAYLOAD + b'!')}\r\n".encode())
    assert error_of(make_decoder(view(unsigned_trailer_headers()), None), [body]) == "BadDigest"


@pytest.mark.parametrize("split", range(1, len(UNSIGNED_BODY)))
def test_unsigned_trailer_split_at_every_boundary(split: int) -> None:
    decoder = make_decoder(view(unsigned_trailer_headers()), None)
    assert decode(decoder, [UNSIGNED_BODY[:split], UNSIGNED_BODY[split:]]) == PAYLOAD


def test_unsigned_trailer_one_byte_at_a_time() -> None:
    decoder = make_decoder(view(unsigned_trailer_headers()), None)
    pieces = (UNSIGNED_BODY[i : i + 1] for i in range(len(UNSIGNED_BODY)))
    assert decode(decoder, pieces) == PAYLOAD


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(UNSIGNED_BODY)), max_size=20))
def test_any_split_of_a_chunked_body_decodes_the_same(cuts: list[int]) -> None:
    """Property: however the wire bytes are cut up, the payload and verdict are the same."""
    bounds = [0, *sorted(cuts), len(UNSIGNED_BODY)]
    pieces = [UNSIGNED_BODY[a:b] for a, b in itertools.pairwise(bounds)]
    decoder = make_decoder(view(unsigned_trailer_headers()), None)
    assert decode(decoder, pieces) == PAYLOAD


@settings(max_examples=100, deadline=None)
@given(payload=st.binary(max_size=300), size=st.integers(min_value=1, max_value=64))
def test_any_payload_and_chunking_round_trips(payload: bytes, size: int) -> None:
    headers = {**unsigned_trailer_headers(), "x-amz-decoded-content-length": str(len(payload))}
    body = unsigned_body(payload, f"x-amz-checksum-crc32:{crc32(payload)}\r\n".encode(), size)
    assert decode(make_decoder(view(headers), None), [body]) == payload


def test_botocore_streaming_upload_verifies_and_decodes() -> None:
    """End to end: boto3's own aws-chunked PUT (https => unsigned payload + crc32 trailer)."""
    store = CredentialStore([Principal("p", "AKID", "SECRET", Policy.deny_all())])
    client = boto3.client(
        "s3",
        endpoint_url="https://lota.test:9000",
        aws_access_key_id="AKID",
        aws_secret_access_key="SECRET",
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"total_max_attempts": 1}),
    )
    sent: dict[str, object] = {}

    def stop(request: object, **_: object) -> None:
        sent["request"] = request
        raise RuntimeError("captured")

    client.meta.events.register("before-send.s3", stop)
    payload = bytes(range(256)) * 5000
    with pytest.raises(RuntimeError, match="captured"):
        client.put_object(Bucket="bkt", Key="k", Body=io.BytesIO(payload))
    request = sent["request"]
    headers = CIMultiDict(
        (k, v.decode() if isinstance(v, bytes) else v)
        for k, v in request.headers.items()  # type: ignore[attr-defined]
    )
    wire = request.body.read()  # type: ignore[attr-defined]
    assert headers["x-amz-content-sha256"] == "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    incoming = RequestView("PUT", "/bkt/k", (), CIMultiDictProxy(headers))
    stamp = datetime.strptime(headers["x-amz-date"], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    verified = verify(incoming, store, stamp, 900)
    decoder = make_decoder(incoming, verified)
    assert decode(decoder, chunks(wire, 65536)) == payload
    assert decoder.trailers == {"x-amz-checksum-crc32": crc32(payload)}


@pytest.mark.parametrize(
    ("trailer_lines", "declared", "code"),
    [
        (b"", "x-amz-checksum-crc32", "MalformedTrailerError"),  # declared, never sent
        (GOOD_TRAILER, "", "MalformedTrailerError"),  # sent, never declared
        (
            f"x-amz-checksum-sha1:{b64(hashlib.sha1(PAYLOAD).digest())}\r\n".encode(),
            "x-amz-checksum-crc32",
            "MalformedTrailerError",
        ),
        (GOOD_TRAILER + GOOD_TRAILER, "x-amz-checksum-crc32", "MalformedTrailerError"),
        (b"no-colon-here\r\n", "x-amz-checksum-crc32", "MalformedTrailerError"),
        (b"x-amz-checksum-crc32:not base64!\r\n", "x-amz-checksum-crc32", "InvalidRequest"),
        (b"x-amz-checksum-crc32:AAAAAAAA\r\n", "x-amz-checksum-crc32", "InvalidRequest"),
        (b"x-amz-trailer-signature:" + b"0" * 64 + b"\r\n", "", "MalformedTrailerError"),
    ],
)
def test_bad_trailers(trailer_lines: bytes, declared: str, code: str) -> None:
    body = unsigned_body(PAYLOAD, trailer_lines)
    assert error_of(make_decoder(view(unsigned_trailer_headers(declared)), None), [body]) == code


def test_unsupported_trailer_declaration() -> None:
    with pytest.raises(S3Error) as info:
        make_decoder(view(unsigned_trailer_headers("x-amz-meta-foo")), None)
    assert info.value.code == "InvalidRequest"


def test_trailers_may_end_without_the_final_empty_line() -> None:
    body = unsigned_body(PAYLOAD, GOOD_TRAILER)[:-2]
    assert decode(make_decoder(view(unsigned_trailer_headers()), None), [body]) == PAYLOAD


@pytest.mark.parametrize(
    ("algorithm", "digest"),
    [
        ("crc32", lambda d: zlib.crc32(d).to_bytes(4, "big")),
        ("crc32c", lambda d: checksums.crc32c(d).to_bytes(4, "big")),
        ("crc64nvme", lambda d: checksums.crc64nvme(d).to_bytes(8, "big")),
        ("sha1", lambda d: hashlib.sha1(d).digest()),
        ("sha256", lambda d: hashlib.sha256(d).digest()),
    ],
)
def test_every_checksum_algorithm_as_trailer_and_header(algorithm: str, digest: object) -> None:
    value = b64(digest(PAYLOAD))  # type: ignore[operator]
    name = f"x-amz-checksum-{algorithm}"
    body = unsigned_body(PAYLOAD, f"{name}:{value}\r\n".encode(), size=5)
    assert decode(make_decoder(view(unsigned_trailer_headers(name)), None), [body]) == PAYLOAD
    plain = {"content-length": str(len(PAYLOAD)), name: value}
    assert decode(make_decoder(view(plain), None), chunks(PAYLOAD, 7)) == PAYLOAD
    wrong = {**plain, name: b64(digest(PAYLOAD[:-1]))}  # type: ignore[operator]
    assert error_of(make_decoder(view(wrong), None), [PAYLOAD]) == "BadDigest"


# --- framing errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"1" + b"0" * 16 + b"\r\n", "InvalidRequest"),  # 17 hex digits
        (b"zz\r\nab\r\n0\r\n\r\n", "InvalidRequest"),
        (b"-1\r\n", "InvalidRequest"),
        (b" 5\r\nhello\r\n0\r\n\r\n", "InvalidRequest"),
        (b"\r\n", "InvalidRequest"),
        (b"5\nhello\r\n0\r\n\r\n", "InvalidRequest"),  # bare LF
        (b"5\r\nhelloXX0\r\n\r\n", "InvalidRequest"),  # data not followed by CRLF
        (b"5\r\nhello\r\n0\r\n\r\nmore", "InvalidRequest"),  # bytes after the end
        (b"9" * 5000, "InvalidRequest"),  # a chunk-size line that never ends
        (b"5\r\nhello\r\n", "IncompleteBody"),  # no final chunk
        (b"5\r\nhel", "IncompleteBody"),
        (b"", "IncompleteBody"),
        (b"5\r\nhello\r\n0\r\nx-amz-checksum-crc32:AAAA", "IncompleteBody"),
        (b"6\r\nhello!\r\n0\r\n\r\n", "InvalidRequest"),  # more than the declared 5 bytes
        (b"4\r\nhell\r\n0\r\n\r\n", "IncompleteBody"),  # less than declared
        (b"5;chunk-signature=" + b"A" * 64 + b"\r\nhello\r\n0\r\n\r\n", "InvalidRequest"),
    ],
)
def test_malformed_chunked_bodies(body: bytes, code: str) -> None:
    headers = {**unsigned_trailer_headers(""), "x-amz-decoded-content-length": "5"}
    assert error_of(make_decoder(view(headers), None), [body]) == code


def test_unsigned_chunks_may_carry_extensions() -> None:
    headers = {**unsigned_trailer_headers(""), "x-amz-decoded-content-length": "5"}
    body = b"5;name=value\r\nhello\r\n0\r\n\r\n"
    assert decode(make_decoder(view(headers), None), [body]) == b"hello"


def test_aws_chunked_needs_its_decoded_length() -> None:
    headers = unsigned_trailer_headers()
    del headers["x-amz-decoded-content-length"]
    with pytest.raises(S3Error) as info:
        make_decoder(view(headers), None)
    assert info.value.code == "MissingContentLength"


def test_huge_chunk_sizes_do_not_allocate() -> None:
    headers = {**unsigned_trailer_headers(""), "x-amz-decoded-content-length": str(2**63)}
    decoder = make_decoder(view(headers), None)
    assert decoder.feed(b"ffffffffffffffff\r\nabc") == b"abc"
    with pytest.raises(S3Error) as info:
        decoder.finish()
    assert info.value.code == "IncompleteBody"


# --- plain bodies ------------------------------------------------------------------------

BODY = b"the quick brown fox" * 1000
SHA = hashlib.sha256(BODY).hexdigest()


def test_signed_sha256_body() -> None:
    decoder = make_decoder(
        view({"x-amz-content-sha256": SHA, "content-length": str(len(BODY))}), None
    )
    assert decoder.expected_length == len(BODY)
    assert decode(decoder, chunks(BODY, 1000)) == BODY


def test_signed_sha256_mismatch() -> None:
    headers = {"x-amz-content-sha256": SHA, "content-length": str(len(BODY))}
    changed = BODY[:-1] + b"!"
    with pytest.raises(S3Error) as info:
        decode(make_decoder(view(headers), None), [changed])
    assert info.value.code == "XAmzContentSHA256Mismatch"
    assert info.value.extra["ClientComputedContentSHA256"] == SHA


def test_uppercase_sha256_is_accepted() -> None:
    headers = {"x-amz-content-sha256": SHA.upper(), "content-length": str(len(BODY))}
    assert decode(make_decoder(view(headers), None), [BODY]) == BODY


def test_content_md5() -> None:
    md5 = b64(hashlib.md5(BODY).digest())
    good = {"content-md5": md5, "content-length": str(len(BODY))}
    assert decode(make_decoder(view(good), None), [BODY]) == BODY
    bad = {"content-md5": b64(hashlib.md5(b"x").digest()), "content-length": str(len(BODY))}
    assert error_of(make_decoder(view(bad), None), [BODY]) == "BadDigest"


@pytest.mark.parametrize("value", ["nonsense", b64(b"short"), ""])
def test_invalid_content_md5(value: str) -> None:
    with pytest.raises(S3Error) as info:
        make_decoder(view({"content-md5": value}), None)
    assert info.value.code == "InvalidDigest"


def test_invalid_checksum_header() -> None:
    with pytest.raises(S3Error) as info:
        make_decoder(view({"x-amz-checksum-crc32": "AAAAAAAAAAA="}), None)
    assert info.value.code == "InvalidRequest"


def test_short_and_long_plain_bodies() -> None:
    headers = {"content-length": "10"}
    assert error_of(make_decoder(view(headers), None), [b"123456789"]) == "IncompleteBody"
    assert error_of(make_decoder(view(headers), None), [b"12345678901"]) == "InvalidRequest"
    assert decode(make_decoder(view({}), None), [b"any", b" length"]) == b"any length"


def test_complete_multipart_upload_checksum_headers_describe_the_object() -> None:
    xml = b"<CompleteMultipartUpload/>"
    headers = {"x-amz-checksum-crc32": crc32(b"the whole object"), "content-length": str(len(xml))}
    complete = view(headers, method="POST", query=[("uploadId", "u1")])
    assert decode(make_decoder(complete, None), [xml]) == xml
    # The same header on a DeleteObjects body does describe the body.
    delete = view(headers, method="POST", query=[("delete", "")])
    assert error_of(make_decoder(delete, None), [xml]) == "BadDigest"


def test_presigned_put_body_is_unsigned_and_unchecked_beyond_its_length() -> None:
    headers = {"content-length": "5"}
    _, verified = aws_verified()
    presigned = Verified(
        principal=verified.principal,
        region="us-east-1",
        date=AWS_TIME,
        signature=SEED,
        scope=verified.scope,
        payload_hash="UNSIGNED-PAYLOAD",
        signing_key=verified.signing_key,
        valid_from=verified.valid_from,
        valid_until=verified.valid_until,
    )
    assert decode(make_decoder(view(headers), presigned), [b"he", b"llo"]) == b"hello"


@given(data=st.binary(max_size=2000))
def test_awscrt_crc32_equals_zlib(data: bytes) -> None:
    assert checksums.crc32(data) == zlib.crc32(data)
