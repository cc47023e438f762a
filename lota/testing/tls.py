"""A client TLS context for test nodes, which serve HTTPS with throw-away self-signed
certificates. Never use it against anything but a node a test started."""

from __future__ import annotations

import ssl


def unverified_context() -> ssl.SSLContext:
    """A client context that checks neither the certificate nor the host name."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
