"""Peer requests are signed with the cluster secret: :func:`sign` and :class:`Verifier`.

A node asking another for chunks signs, with HMAC-SHA256 under the secret every member
shares, one line per field::

    method                  GET
    target                  /_lota/peer/object?bucket=data&key=shard-0.tar
    if-match                "9b2cf535f27731c974343645a3985328"   (the version it expects)
    range                   bytes=8388608-16777215
    date                    1733320000.25        (x-lota-peer-date, seconds since the epoch)
    nonce                   4f9c...              (x-lota-peer-nonce, 16 random bytes, hex)
    from                    10.0.0.5:9000        (x-lota-peer-from, the asking member)
    hop                     1                    (x-lota-peer-hop: never forwarded again)

and sends the hex digest as ``x-lota-peer-signature``. The receiving node recomputes it;
a request whose date is more than :data:`WINDOW` seconds off, or whose nonce it has seen
within the window (a replay), is refused. Client credentials mean nothing here (no
``Authorization`` header is looked at), and these headers mean nothing on the S3 endpoint.

No I/O: the clock is passed in.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import OrderedDict
from collections.abc import Mapping

from lota.s3.errors import S3Error

# Seconds a signed request stays valid either side of the receiver's clock.
WINDOW = 30.0
# Nonces remembered (one per request within the window): past this, the oldest go early,
# and a request that old is refused by its date anyway only once the window has passed.
MAX_NONCES = 1_000_000

DATE = "x-lota-peer-date"
NONCE = "x-lota-peer-nonce"
FROM = "x-lota-peer-from"
HOP = "x-lota-peer-hop"
SIGNATURE = "x-lota-peer-signature"


def _digest(secret: bytes, method: str, target: str, headers: Mapping[str, str]) -> str:
    lines = (
        method.upper(),
        target,
        headers.get("if-match", ""),
        headers.get("range", ""),
        headers.get(DATE, ""),
        headers.get(NONCE, ""),
        headers.get(FROM, ""),
        headers.get(HOP, ""),
    )
    message = "\n".join(lines).encode("utf-8", "surrogateescape")
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def sign(
    secret: bytes, method: str, target: str, sender: str, now: float, headers: Mapping[str, str]
) -> dict[str, str]:
    """The headers that sign a peer request for `target` (path and query, as sent) with
    `headers` (``if-match``, ``range``) from member `sender`."""
    signed = {
        **{k.lower(): v for k, v in headers.items()},
        DATE: f"{now:.3f}",
        NONCE: secrets.token_hex(16),
        FROM: sender,
        HOP: "1",
    }
    signed[SIGNATURE] = _digest(secret, method, target, signed)
    return signed


class PeerRefused(S3Error):
    """A peer request failed its signature check; ``reason`` says which part (metrics)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__("AccessDenied", message)
        self.reason = reason


class Verifier:
    """Checks the signature, date and nonce of peer requests (one per node)."""

    def __init__(self, secret: bytes, window: float = WINDOW, max_nonces: int = MAX_NONCES):
        self._secret = secret
        self._window = window
        self._max = max_nonces
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> when it expires

    def verify(self, method: str, target: str, headers: Mapping[str, str], now: float) -> str:
        """The member that signed the request; :class:`S3Error` ``AccessDenied`` (403) if
        it is unsigned, wrongly signed, out of its time window or a replay. Nothing is
        remembered of a refused request."""
        claimed = headers.get(SIGNATURE, "")
        if not claimed:
            raise PeerRefused("unsigned", "Peer requests must be signed with the cluster secret.")
        expected = _digest(self._secret, method, target, headers)
        if not hmac.compare_digest(expected, claimed):
            raise PeerRefused("signature", "The peer signature does not match the cluster secret.")
        try:
            sent = float(headers.get(DATE, ""))
        except ValueError:
            raise PeerRefused("date", "The peer request has no valid date.") from None
        if abs(now - sent) > self._window:
            raise PeerRefused("date", "The peer request is too old or too far in the future.")
        if headers.get(HOP) != "1":
            raise PeerRefused("hop", "A peer request goes one hop only.")
        self._forget(now)
        nonce = headers.get(NONCE, "")
        if len(nonce) < 16 or nonce in self._seen:
            raise PeerRefused("replay", "The peer request was seen before (a replay).")
        self._seen[nonce] = sent + self._window
        return headers.get(FROM, "")

    def _forget(self, now: float) -> None:
        """Drop the nonces whose requests are outside the window by now."""
        seen = self._seen
        while seen and (len(seen) >= self._max or next(iter(seen.values())) < now):
            seen.popitem(last=False)
