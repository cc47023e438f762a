"""Where the cache's bytes come from: the :class:`ChunkSource` protocol.

The cache asks a source two things about an object, and nothing else: its metadata (a
HEAD, optionally of one part, optionally conditional on the ETag the cache holds) and a
run of its bytes (a GET with a Range and ``If-Match`` on the version being filled). The
answer is a :class:`SourceReply`: status, headers, and the body as it arrives. A
:class:`ByteSource` answers only the second: fills and relays need no more, and a peer
node (which serves chunks, not metadata) is one.

The origin (:class:`lota.regions.source.OriginSource`) is the first source; a peer node
of the cluster is the next. A source says which kind it is (``kind``) and counts the body
bytes it receives under its own name (``name``), so the cache never learns how a source
reaches its bytes. This module imports nothing of the cache, nor of the origins.

A relayed body that breaks off raises :class:`SourceBroke` when another source may hold
the rest (a peer died: the next owner, or the origin, does); an origin that breaks off
raises :class:`~lota.errors.OriginError`, and the client's response is cut.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Literal, Protocol

from lota.errors import LotaError

SourceKind = Literal["origin", "peer", "sibling"]


# Said by a LOTA process answering metadata (a sibling worker, a peer): when it last
# checked its copy with the origin (seconds since the epoch). Whoever takes the metadata
# takes that time too, so a copy is never taken for fresher than it is.
VALIDATED_AT = "x-lota-validated-at"


class SourceBroke(LotaError):
    """A source's body broke off mid-stream in a way another source can make good (a
    peer node died or stalled): whoever relays it resumes from ``resume_at`` elsewhere."""

    def __init__(self, message: str, resume_at: int = 0) -> None:
        super().__init__(message)
        self.resume_at = resume_at


class SourceReply(Protocol):
    """One answer of a source, its body unread (it is released when the block ends)."""

    status: int
    headers: Mapping[str, str]
    """Case-insensitive, as the source sent them."""
    kind: SourceKind
    """Who answered (a source standing for several says which one did)."""

    async def read(self, count: int) -> bytes:
        """Up to `count` bytes of the body; ``b""`` at its end. A body that breaks off
        raises :class:`~lota.errors.OriginError`, or :class:`SourceBroke` when another
        source may have the rest."""
        ...

    def pieces(self, size: int) -> AsyncIterator[bytes]:
        """The rest of the body in pieces of up to `size` bytes."""
        ...


class ByteSource(Protocol):
    """Byte ranges of one bucket's objects: what fills and relays read from."""

    kind: SourceKind
    name: str
    """What the source's traffic is counted under (an origin: its region)."""

    def get(
        self, bucket: str, key: str, *, byte_range: str = "", if_match: str = ""
    ) -> AbstractAsyncContextManager[SourceReply]:
        """The object's bytes (those `byte_range` names, a Range header value), with its
        full metadata including checksums; 412 when `if_match` is not its ETag."""
        ...


class ChunkSource(ByteSource, Protocol):
    """Object metadata and byte ranges, for one bucket's objects."""

    def head(
        self, bucket: str, key: str, *, part: int | None = None, if_none_match: str = ""
    ) -> AbstractAsyncContextManager[SourceReply]:
        """The object's metadata (of part `part`, if given)."""
        ...
