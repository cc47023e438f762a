"""The read path's decisions, as plain functions: no I/O, no ``await``, no aiohttp.

:mod:`lota.cache.reads` does the talking (to the store, the fills, the source, the
client); everything it *decides* is asked here, so each rule can be read, and tested, on
its own (``tests/unit/test_cache_plan.py``):

* :func:`cacheable`: whether the cache answers a read at all.
* :func:`revalidation_due`, :func:`may_serve_stale`: freshness of a cached copy.
* :func:`cold_fetch`: what a miss asks the source for, in one request: the chunks a range
  needs, the chunks ending a suffix range (the parquet-footer read), or only the metadata.
* :func:`answer_range`, :func:`pieces`: which bytes a response carries, chunk by chunk.
* :func:`answered_from`: what ``x-lota-cache`` says (HIT, PEER, MISS).
* :func:`response_headers`, :func:`not_modified_headers`: what the answer says.
* :class:`Sequential`: which chunks to fetch ahead for a reader moving through an object.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from lota.cache.layout import chunk_count
from lota.config import CacheConfig
from lota.s3.addressing import Target
from lota.s3.errors import S3Error
from lota.s3.ranges import content_range, parse_range

# Where a GET or HEAD was answered from: HIT | PEER | MISS | STALE | BYPASS (| PENDING).
CACHE_HEADER = "x-lota-cache"
# Query parameters that only rewrite response headers; applied locally on hits.
RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}
# Requests the cache does not answer: other versions, customer-key encryption.
_BYPASS_QUERY = frozenset({"versionId"})
_SSE_C_HEADERS = (
    "x-amz-server-side-encryption-customer-algorithm",
    "x-amz-server-side-encryption-customer-key",
    "x-amz-server-side-encryption-customer-key-md5",
)
_NOT_MODIFIED_HEADERS = ("etag", "last-modified", "cache-control", "expires")
Headers = tuple[tuple[str, str], ...]


def cacheable(target: Target, headers: Mapping[str, str]) -> bool:
    """Whether a GetObject/HeadObject may be answered from the cache."""
    if not target.key or not _BYPASS_QUERY.isdisjoint(target.names):
        return False
    return not any(name in headers for name in _SSE_C_HEADERS)


def part_number(target: Target) -> int | None:
    """The ``partNumber`` asked for, if any (InvalidArgument when it is no part number)."""
    if "partNumber" not in target.names:
        return None
    value = next(v for k, v in target.query if k == "partNumber")
    if not value.isdigit() or not 1 <= int(value) <= 10000:
        raise S3Error(
            "InvalidArgument", "Part number must be an integer between 1 and 10000, inclusive"
        )
    return int(value)


# -- freshness --------------------------------------------------------------------------


def revalidation_due(path: str, validated_at: float, config: CacheConfig, now: float) -> bool:
    """Whether the copy of `path` (``bucket/key``) last validated at `validated_at` must be
    checked with the origin before it is served: never under an ``immutable`` prefix, else
    after the first matching ``revalidate`` prefix's time, or ``revalidate_after``."""
    return now - validated_at > fresh_for(path, config)


def fresh_for(path: str, config: CacheConfig) -> float:
    """Seconds a copy of `path` is served after its last validation (see
    :func:`revalidation_due`); infinite under an ``immutable`` prefix."""
    limit = config.revalidate_after
    if config.immutable or config.revalidate:
        if path.startswith(config.immutable):
            return math.inf
        limit = next((s for prefix, s in config.revalidate if path.startswith(prefix)), limit)
    return limit


def may_serve_stale(validated_at: float, config: CacheConfig, now: float) -> bool:
    """Whether a copy the origin could not revalidate may still be served, as STALE."""
    return now - validated_at <= config.revalidate_after + config.stale_if_error


# -- misses -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ColdFetch:
    """What a miss asks the source for, in one request.

    ``head``: only the metadata (a HEAD, a part, or a range that cannot be read).
    ``suffix``: the object's last ``suffix`` bytes, which hold every whole chunk a suffix
    range needs; which chunks those are is known once the answer gives the size
    (:func:`first_whole_chunk`). Otherwise: chunks ``first``..``last`` (None: to the end).
    """

    first: int = 0
    last: int | None = None
    suffix: int = 0
    head: bool = False
    whole: bool = False
    """The reader wants the whole object (no Range, or one S3 cannot read)."""

    def byte_range(self, chunk_size: int) -> str:
        """The Range header value of the GET ("" for the whole object)."""
        if self.suffix:
            return f"bytes=-{self.suffix}"
        start = self.first * chunk_size
        if self.last is not None:
            return f"bytes={start}-{(self.last + 1) * chunk_size - 1}"
        return f"bytes={start}-" if start else ""


def cold_fetch(
    method: str, range_header: str, part: int | None, chunk_size: int, *, spread: bool = False
) -> ColdFetch:
    """What a cold GET (or HEAD) of an object asks its origin for: the first chunk the
    reader needs (its answer says the object's size; the chunks after it are fetched in
    parallel, ``fill_concurrency`` at a time, as the reader goes), the whole chunks of a
    suffix range, or only the metadata. With chunks `spread` over workers or nodes, only the
    metadata: who owns a chunk depends on the object's version, and a GET here would read
    chunks from the origin that another process is meant to fill."""
    if method == "HEAD" or part is not None or spread:
        return ColdFetch(head=True)
    wanted = parse_range(range_header)
    if wanted is None:
        return ColdFetch(first=0, last=0, whole=True)
    if wanted.start is None:
        if wanted.suffix == 0:
            return ColdFetch(head=True)  # unsatisfiable whatever the size: the size says so
        # The last `suffix` bytes start at most chunk_size - 1 bytes into their chunk.
        return ColdFetch(suffix=wanted.suffix + chunk_size - 1)
    first = wanted.start // chunk_size
    return ColdFetch(first=first, last=first)


def first_whole_chunk(start: int, chunk_size: int) -> int:
    """The first chunk that begins at or after byte `start` of an answer's body."""
    return -(-start // chunk_size)


def body_start(status: int, content_range_header: str) -> int:
    """Where an answer's body begins in the object: a 206's Content-Range start, else 0."""
    span = parse_content_range(content_range_header) if status == 206 else None
    return 0 if span is None else span[0]


def parse_content_range(value: str) -> tuple[int, int, int] | None:
    """``bytes 0-99/1000`` -> (0, 99, 1000); None when absent or unreadable."""
    try:
        span, total = value.split(" ", 1)[1].split("/", 1)
        first, last = span.split("-", 1)
        return int(first), int(last), int(total)
    except (IndexError, ValueError):
        return None


# -- answers ----------------------------------------------------------------------------


def answer_range(range_header: str, size: int) -> tuple[int, int, int]:
    """(first byte, last byte, status) of the answer to a GET with this Range header;
    raises InvalidRange (416) for a range past the end."""
    wanted = parse_range(range_header)
    if wanted is None:
        return 0, size - 1, 200
    first, last = wanted.resolve(size)
    return first, last, 206


def answered_from(answered: str, missing_remote: Sequence[bool]) -> str:
    """The ``x-lota-cache`` of a GET, decided before its body: for each chunk of the range
    this node does not hold, whether another node of the cluster would send it. HIT only
    when every chunk is here; PEER when the others all come from peers; else MISS (this
    node fetches from the origin). A read that was a MISS (the object was not known) stays
    one unless peers send all of it; STALE stays STALE."""
    if answered not in ("HIT", "MISS") or not missing_remote:
        return answered
    return "PEER" if all(missing_remote) else "MISS"


def chunk_span(first: int, last: int, chunk_size: int) -> range:
    """The chunks holding bytes first..last (none when the range is empty)."""
    return range(first // chunk_size, last // chunk_size + 1) if last >= first else range(0)


def pieces(first: int, last: int, chunk_size: int) -> Iterator[tuple[int, int, int]]:
    """Bytes first..last as (chunk index, offset in the chunk, end offset in the chunk)."""
    for index in chunk_span(first, last, chunk_size):
        base = index * chunk_size
        yield index, max(first, base) - base, min(last + 1, base + chunk_size) - base


def response_headers(
    object_headers: Headers,
    *,
    status: int,
    checksums: bool,
    part: bool,
    overrides: Sequence[tuple[str, str]],
    source: str,
    first: int,
    last: int,
    size: int,
) -> list[tuple[str, str]]:
    """The headers of a 200/206 answer, all but Content-Length (which the kind of response
    decides): the object's (checksums only on a whole-object 200 that asked for them, the
    parts count only for a part), the query's overrides, the range and the source."""
    if status == 200 and checksums:
        headers = list(_without_parts_count(object_headers))  # a 200 is never a part
    else:
        headers = list(_plain_headers(object_headers, part))
    if overrides:
        replaced = {name.lower() for name, _ in overrides}
        headers = [(name, value) for name, value in headers if name not in replaced]
        headers.extend(overrides)
    headers.append(("Accept-Ranges", "bytes"))
    headers.append((CACHE_HEADER, source))
    if status == 206:
        headers.append(("Content-Range", content_range(first, last, size)))
    return headers


def overrides(target: Target) -> list[tuple[str, str]]:
    """The ``response-*`` query parameters as the headers they set."""
    if target.names.isdisjoint(RESPONSE_OVERRIDES):
        return []
    found = {}
    for name, value in target.query:
        header = RESPONSE_OVERRIDES.get(name)
        if header is not None:
            found[header] = value
    return list(found.items())


def not_modified_headers(object_headers: Headers, source: str) -> list[tuple[str, str]]:
    """The headers of a 304: the validators and caching headers only."""
    kept = [
        (name, value)
        for wanted in _NOT_MODIFIED_HEADERS
        for name, value in object_headers
        if name == wanted
    ]
    return [*kept, (CACHE_HEADER, source)]


_LEFT_OUT = ("x-amz-checksum-", "x-amz-mp-parts-count")


def _plain_headers(headers: Headers, with_parts_count: bool) -> Headers:
    """An object's headers as sent without ``x-amz-checksum-mode: ENABLED`` (no checksums),
    and without the parts count unless a part was asked for: the object's own tuple when
    it has none of those (most have none), found without building anything."""
    if not any(name.startswith(_LEFT_OUT) for name, _ in headers):
        return headers
    return tuple(
        (name, value)
        for name, value in headers
        if not (name.startswith("x-amz-checksum-") and name != "x-amz-checksum-type")
        and (with_parts_count or name != "x-amz-mp-parts-count")
    )


def _without_parts_count(headers: Headers) -> Headers:
    return tuple((name, value) for name, value in headers if name != "x-amz-mp-parts-count")


# -- read-ahead -------------------------------------------------------------------------


class Sequential:
    """Spots readers moving through an object range after range, and says which chunks to
    fetch ahead of them: a range that starts in (or right after) the chunk where the last
    range of the same version ended is sequential; then up to ``readahead`` chunks after
    it are wanted. Remembers the last ``memory`` versions read."""

    def __init__(self, readahead: int, chunk_size: int, memory: int = 4096) -> None:
        self._readahead = readahead
        self._cs = chunk_size
        self._memory = memory
        self._last_chunk: OrderedDict[tuple[str, str, str], int] = OrderedDict()

    def ahead(self, ident: tuple[str, str, str], first: int, last: int, size: int) -> range:
        """Chunks to have ready after bytes first..last of `ident` (bucket, key, etag)."""
        if first == 0 and last == size - 1:
            return range(0)  # the whole object: nothing is ahead
        previous = self._last_chunk.pop(ident, None)
        first_chunk, last_chunk = first // self._cs, last // self._cs
        self._last_chunk[ident] = last_chunk
        if len(self._last_chunk) > self._memory:
            self._last_chunk.popitem(last=False)
        if previous is None or not previous <= first_chunk <= previous + 1:
            return range(0)
        count = max(1, chunk_count(size, self._cs))
        return range(last_chunk + 1, min(count, last_chunk + 1 + self._readahead))
