"""Peer request signatures: what the receiving node accepts, and everything it refuses."""

from __future__ import annotations

import pytest

from lota.cluster.signing import NONCE, SIGNATURE, PeerRefused, Verifier, sign

SECRET = b"0123456789abcdef0123456789abcdef"
TARGET = "/_lota/peer/object?bucket=data&key=shard-0.tar"
NOW = 1_733_320_000.0


def _signed(**headers: str) -> dict[str, str]:
    wanted = {"if-match": '"abc"', "range": "bytes=0-99", **headers}
    return sign(SECRET, "GET", TARGET, "10.0.0.5:9000", NOW, wanted)


def _refusal(verifier: Verifier, headers: dict[str, str], **kw: object) -> str:
    with pytest.raises(PeerRefused) as refused:
        verifier.verify(str(kw.get("method", "GET")), str(kw.get("target", TARGET)), headers, NOW)
    assert refused.value.status == 403 and refused.value.code == "AccessDenied"
    return refused.value.reason


def test_a_signed_request_names_its_sender_once_and_never_twice() -> None:
    verifier = Verifier(SECRET)
    headers = _signed()
    assert verifier.verify("GET", TARGET, headers, NOW + 1) == "10.0.0.5:9000"
    assert _refusal(verifier, headers) == "replay"


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"range": "bytes=0-999999"}, "signature"),  # a wider range than signed
        ({"if-match": '"other"'}, "signature"),  # another version
        ({"x-lota-peer-from": "10.0.0.9:9000"}, "signature"),
        ({"x-lota-peer-hop": "2"}, "signature"),
        ({SIGNATURE: ""}, "unsigned"),
    ],
)
def test_a_request_changed_after_signing_is_refused(change: dict[str, str], reason: str) -> None:
    headers = {**_signed(), **change}
    assert _refusal(Verifier(SECRET), headers) == reason


def test_another_path_method_or_secret_does_not_match() -> None:
    headers = _signed()
    assert _refusal(Verifier(SECRET), headers, target=TARGET + "x") == "signature"
    assert _refusal(Verifier(SECRET), headers, method="POST") == "signature"
    assert _refusal(Verifier(b"another-secret-of-32-bytes......"), headers) == "signature"


def test_a_request_outside_the_time_window_is_refused_even_if_never_seen() -> None:
    old = sign(SECRET, "GET", TARGET, "a:1", NOW - 31, {})
    ahead = sign(SECRET, "GET", TARGET, "a:1", NOW + 31, {})
    assert _refusal(Verifier(SECRET), old) == "date"
    assert _refusal(Verifier(SECRET), ahead) == "date"


def test_client_sigv4_credentials_mean_nothing_to_the_peer_endpoint() -> None:
    client = {
        "authorization": "AWS4-HMAC-SHA256 Credential=AKIA/20261204/us-east-1/s3/aws4_request, "
        "SignedHeaders=host, Signature=" + "0" * 64,
        "x-amz-date": "20261204T000000Z",
    }
    assert _refusal(Verifier(SECRET), client) == "unsigned"


def test_the_nonces_remembered_stay_bounded() -> None:
    verifier = Verifier(SECRET, max_nonces=100)
    for _ in range(1000):
        verifier.verify("GET", TARGET, sign(SECRET, "GET", TARGET, "a:1", NOW, {}), NOW)
    assert len(verifier._seen) <= 100
    # Past the window, every nonce is forgotten: their requests fail on their date anyway.
    late = sign(SECRET, "GET", TARGET, "a:1", NOW + 100, {})
    verifier.verify("GET", TARGET, late, NOW + 100)
    assert len(verifier._seen) == 1 and late[NONCE] in verifier._seen
