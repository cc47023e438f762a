"""Who is asking, and may they: SigV4 authentication and IAM-style authorization.

The server calls one object, :class:`Authenticator`, for every request (cache hits
included)::

    authorized = authenticator.authenticate(view, bucket, key)   # raises S3Error
    decoder = authenticator.decoder(view, authorized)            # for requests with a body

Modules: :mod:`.sigv4` (signatures, both directions), :mod:`.sigv2` (the SigV2 that
boto3's default configuration still presigns URLs with), :mod:`.policy` (IAM policy
evaluation), :mod:`.credentials` (the credentials file), :mod:`.body` (aws-chunked
decoding and payload checks). Operation naming lives in :mod:`lota.s3.operations`.
Nothing here does I/O except loading the credentials file once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from lota.auth import sigv2
from lota.auth.body import BodyDecoder, make_decoder
from lota.auth.credentials import CredentialStore, Principal
from lota.auth.policy import Policy
from lota.auth.sigv4 import RequestView, Verified, sign_headers, verify
from lota.clock import Clock
from lota.config import AuthConfig
from lota.s3.errors import S3Error
from lota.s3.operations import Operation, classify, object_arn

__all__ = [
    "Authenticator",
    "Authorized",
    "BodyDecoder",
    "CredentialStore",
    "Policy",
    "Principal",
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


class Authenticator:
    """Verifies signatures and applies each principal's policy, per :class:`AuthConfig`."""

    def __init__(self, config: AuthConfig, clock: Clock) -> None:
        self._config = config
        self._clock = clock
        self._store: CredentialStore | None = None
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
        """Verify the request, name its operation and check the policy; raise S3Error if not."""
        if self._store is None:
            operation = classify(view.method, bucket, key, view.query, view.headers)
            return Authorized(principal=None, operation=operation, verified=None)
        # Who is asking comes first: nothing about the request is judged for a stranger.
        verified, query = self._verify(self._store, view, bucket, key)
        operation = classify(view.method, bucket, key, query, view.headers)
        principal = verified.principal
        self._require(principal, operation.action, operation.resource, operation.name)
        if operation.copy_source is not None:
            source = object_arn(*operation.copy_source)
            self._require(principal, operation.copy_source_action, source, operation.name)
        return Authorized(principal=principal, operation=operation, verified=verified)

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
        self, store: CredentialStore, view: RequestView, bucket: str, key: str
    ) -> tuple[Verified, tuple[tuple[str, str], ...]]:
        """Check the signature (SigV4, or SigV2 for boto3's default presigned URLs).

        Also returns the query that names the operation: a SigV2 presigned URL's own
        parameters (``AWSAccessKeyId``, ``Signature``, ``Expires``...) are not sub-resources.
        """
        now = self._clock.now()
        if sigv2.is_sigv2(view):
            verified = sigv2.verify(view, bucket, key, store, now, self._config.max_skew)
            return verified, sigv2.operation_query(view)
        return verify(view, store, now, self._config.max_skew), view.query

    @staticmethod
    def _require(principal: Principal, action: str, resource: str, operation: str) -> None:
        if not principal.policy.allows(action, resource):
            logger.info("denied %s: %s needs %s on %s", principal.name, operation, action, resource)
            raise S3Error("AccessDenied", "Access Denied")
