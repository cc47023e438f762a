"""Who is asking, and may they: SigV4 authentication and IAM-style authorization.

The server calls one object, :class:`Authenticator`, for every request (cache hits
included)::

    authorized = authenticator.authenticate(view, bucket, key)   # raises Refused, S3Error
    decoder = authenticator.decoder(view, authorized)            # for requests with a body

Modules: :mod:`.sigv4` (signatures, both directions), :mod:`.sigv2` (the SigV2 that
boto3's default configuration still presigns URLs with), :mod:`.policy` (IAM policy
evaluation), :mod:`.credentials` (the credentials file), :mod:`.body` (aws-chunked
decoding and payload checks). Operation naming lives in :mod:`lota.s3.operations`.
Nothing here does I/O except loading the credentials file once.
"""

from __future__ import annotations

import logging
import secrets
import sys
from dataclasses import dataclass
from datetime import datetime
from hashlib import blake2b
from itertools import chain

from lota.auth import sigv2
from lota.auth.body import BodyDecoder, make_decoder
from lota.auth.credentials import CredentialStore, Principal
from lota.auth.policy import Policy
from lota.auth.sigv4 import RequestView, Verified, sign_headers, verify
from lota.clock import Clock
from lota.config import AuthConfig
from lota.lru import SizedLru
from lota.s3.errors import S3Error
from lota.s3.operations import KNOWN, Op, Operation, classify, object_arn

__all__ = [
    "Authenticator",
    "Authorized",
    "BodyDecoder",
    "CredentialStore",
    "Policy",
    "Principal",
    "Refused",
    "RequestView",
    "Verified",
    "sign_headers",
]

logger = logging.getLogger("lota.auth")


@dataclass(frozen=True, slots=True)
class Authorized:
    """A request that may proceed: who sent it (None when auth is off) and what it does."""

    principal: Principal | None
    operation: Operation
    verified: Verified | None


class Refused(S3Error):
    """Authentication or authorization failed: the S3 error, and what the access log may say
    about the request: the operation it asked for (``Unknown`` when S3 has no such name) and
    who was refused (``-`` unless the signature checked out)."""

    def __init__(self, error: S3Error, operation: str, principal: str = "-") -> None:
        super().__init__(
            error.code,
            error.message,
            status=error.status,
            resource=error.resource,
            extra=error.extra,
        )
        self.operation = operation
        self.principal = principal


class Authenticator:
    """Verifies signatures and applies each principal's policy, per :class:`AuthConfig`."""

    def __init__(self, config: AuthConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._store: CredentialStore | None = None
        self._recent = RecentlyVerified()
        if config.mode == "sigv4":
            self._store = CredentialStore.load(config.credentials)
            logger.info(
                "SigV4 authentication on: %d principal(s) from %s",
                len(self._store),
                config.credentials,
            )
        else:
            logger.warning(
                'AUTHENTICATION IS OFF (auth.mode = "none"): every request is accepted '
                "from anyone and no policy is applied. Use this for local experiments only."
            )

    def authenticate(self, view: RequestView, bucket: str, key: str) -> Authorized:
        """Verify the request, name its operation and check the policy. Raises Refused when
        the signature or the policy says no, S3Error when the request is malformed."""
        if self._store is None:
            operation = classify(view.method, bucket, key, view.query, view.headers)
            return Authorized(principal=None, operation=operation, verified=None)
        repeat = self._recent.key(view, bucket, key)
        if repeat is not None:
            known = self._recent.get(repeat, self._clock.time())
            if known is not None:
                return known
        now = self._clock.now()
        # Who is asking comes first: nothing about the request is judged for a stranger.
        try:
            verified, query = self._verify(self._store, view, bucket, key, now)
        except S3Error as exc:
            raise Refused(exc, _asked_for(view, bucket, key)) from exc
        operation = classify(view.method, bucket, key, query, view.headers)
        principal = verified.principal
        if not operation.per_key:  # DeleteObjects: the caller checks each key (see allows)
            self._require(principal, operation.action, operation.resource, operation.name)
        if operation.copy_source is not None:
            source = object_arn(*operation.copy_source)
            self._require(principal, operation.copy_source_action, source, operation.name)
        authorized = Authorized(principal=principal, operation=operation, verified=verified)
        if repeat is not None:
            self._recent.put(repeat, authorized)
        return authorized

    def holds(self, valid: Window | None) -> bool:
        """Whether a verdict this authenticator gave, valid within `valid` (its
        :func:`window`), holds now (always, when it has no window: auth is off)."""
        # within(), written out: this runs for every hit answered again.
        return valid is None or valid[0] <= self._clock.time() <= valid[1]

    def authorize(self, view: RequestView, action: str, resource: str) -> Principal | None:
        """Verify a request that is not an S3 operation (LOTA's admin calls) and require
        `action` on `resource`; returns the principal (None when auth is off)."""
        if self._store is None:
            return None
        verified = verify(view, self._store, self._clock.now(), self._config.max_skew)
        self._require(verified.principal, action, resource, "admin call")
        return verified.principal

    def allows(self, authorized: Authorized, action: str, resource: str) -> bool:
        """Whether the request's principal may also do `action` on `resource`.

        For checks :meth:`authenticate` cannot make alone, such as ``s3:DeleteObject`` on
        each key named in a DeleteObjects body. Always true when auth is off.
        """
        principal = authorized.principal
        return principal is None or principal.policy.allows(action, resource)

    def decoder(self, view: RequestView, authorized: Authorized) -> BodyDecoder:
        """The body decoder for an authorized request (see :class:`BodyDecoder`)."""
        return make_decoder(view, authorized.verified)

    def _verify(
        self, store: CredentialStore, view: RequestView, bucket: str, key: str, now: datetime
    ) -> tuple[Verified, tuple[tuple[str, str], ...]]:
        """Check the signature (SigV4, or SigV2 for boto3's default presigned URLs).

        Also returns the query that names the operation: a SigV2 presigned URL's own
        parameters (``AWSAccessKeyId``, ``Signature``, ``Expires``...) are not sub-resources.
        """
        if sigv2.is_sigv2(view):
            verified = sigv2.verify(view, bucket, key, store, now, self._config.max_skew)
            return verified, sigv2.operation_query(view)
        return verify(view, store, now, self._config.max_skew), view.query

    @staticmethod
    def _require(principal: Principal, action: str, resource: str, operation: str) -> None:
        if not principal.policy.allows(action, resource):
            logger.info("denied %s: %s needs %s on %s", principal.name, operation, action, resource)
            raise Refused(S3Error("AccessDenied"), operation, principal.name)


def _asked_for(view: RequestView, bucket: str, key: str) -> str:
    """The operation a request that failed verification asked for, for the log only.
    Names S3 does not have are ``Unknown``: a stranger must not mint metric labels."""
    query = sigv2.operation_query(view) if sigv2.is_sigv2(view) else view.query
    try:
        name = classify(view.method, bucket, key, query, view.headers).name
    except S3Error:
        return Op.UNKNOWN
    return name if name in KNOWN else Op.UNKNOWN


class RecentlyVerified:
    """GET and HEAD requests verified lately, remembered so that an identical one is not
    verified again: a presigned URL read over and over (data loaders, HTTP range readers)
    costs one signature check, not one per read.

    Sound because a verdict depends on nothing but the request's bytes, the credentials
    (fixed for the life of the process), the policies (no conditions) and the time: the key
    is the whole request line and header section, and a remembered verdict is only used
    while the clock is inside the window in which the signature would verify again.
    Repeating a request is no new power: S3 accepts the same presigned URL, or the same
    signed headers within the allowed skew, as many times as it is sent.

    A request is remembered by a 128-bit keyed BLAKE2b digest of it (the key drawn at
    random when the process starts, so that no one outside it can look for two requests
    with one digest), not by its hundreds of characters: a verdict then costs the same
    memory whatever the request's length: about :data:`ENTRY_BYTES`, and the operation's
    resource string, which names the key (measured by a test; its size as CPython holds
    it, four bytes a character when one is outside the Basic Multilingual Plane).

    Requests signed in an Authorization header are not remembered (see :meth:`key`): a
    client signs each one afresh. Sized to the requests a node serves over and over, not
    to a handful: a data loader reading 20,000 objects through 20,000 presigned URLs must
    not verify each read again. Bounded by memory (`max_bytes`: some 32,000 verdicts in
    32 MiB), the least recently used forgotten first.
    """

    ENTRY_BYTES = 1024
    MAX_BYTES = 32 * 1024 * 1024

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._entries: SizedLru[bytes, Authorized] = SizedLru(max_bytes)
        self._secret = secrets.token_bytes(32)

    def __len__(self) -> int:
        return len(self._entries)

    def key(self, view: RequestView, bucket: str, key: str) -> bytes | None:
        """What identifies the request here; None for one not to remember: not a read, or
        signed in an Authorization header (a client signs each such request afresh, as
        boto3 does, so none comes again: remembered, they would only push presigned URLs
        out), or with a NUL in a part (which the digest's input separates them by)."""
        if view.method not in ("GET", "HEAD") or "authorization" in view.headers:
            return None
        query = view.query
        fields = chain.from_iterable((*query, *view.headers.items()))
        joined = "\0".join((view.method, view.raw_path, bucket, key, str(len(query)), *fields))
        if joined.count("\0") != 4 + 2 * (len(query) + len(view.headers)):
            return None
        text = joined.encode("utf-8", "surrogatepass")
        return blake2b(text, key=self._secret, digest_size=16).digest()

    def get(self, request: bytes, now: float) -> Authorized | None:
        authorized = self._entries.get(request)
        if authorized is None or authorized.verified is None:
            return None
        if not holds(authorized, now):
            self._entries.pop(request)
            return None
        return authorized

    def put(self, request: bytes, authorized: Authorized) -> None:
        size = self.ENTRY_BYTES + sys.getsizeof(authorized.operation.resource)
        self._entries.put(request, authorized, size)


def holds(authorized: Authorized, now: float) -> bool:
    """Whether a verdict given earlier holds at `now` (Unix time): while the same request
    would verify again (always, when auth is off)."""
    return within(window(authorized), now)


# When a verdict holds: from, until (Unix time), the window in which its request verifies.
Window = tuple[float, float]


def within(valid: Window | None, now: float) -> bool:
    """Whether `now` is inside `valid` (always, for no window: auth is off)."""
    return valid is None or valid[0] <= now <= valid[1]


def window(authorized: Authorized) -> Window | None:
    """When `authorized` holds (see :func:`holds`); None: always (auth is off)."""
    verified = authorized.verified
    return None if verified is None else (verified.valid_from, verified.valid_until)
