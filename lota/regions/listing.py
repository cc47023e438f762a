"""Merged listings: the origin's keys plus the catalog's pending writes, as S3 lists them. No I/O.

A write to a bucket homed in a far region is acknowledged once the catalog holds it, before
the home bucket does (DESIGN.md, "Cross-region write acceleration"). From then on LIST must
show it, and a pending delete (a *tombstone*) must hide its key, although the origin's own
listing does not know about either yet. This module computes that listing; the caller does
the I/O and answers what the :class:`Merger` asks for, catalog first::

    request = ListRequest.from_query(bucket, query)        # S3Error on a bad argument
    merger = Merger(request)                               # S3Error on a bad token
    while (page := merger.page) is None:
        if (after := merger.needs_overrides_after()) is not None:
            rows = await catalog.list_objects(bucket, request.prefix, after, N)
            merger.feed_overrides([override(r) for r in rows if r.pending],
                                  complete=len(rows) < N, last_key=rows[-1].key if rows else None)
        elif (after := merger.needs_origin_after()) is not None:
            xml = await origin GET /bucket?list-type=2&prefix=<request.prefix>
                      &encoding-type=url&max-keys=1000[&start-after=<after> if after]
            contents, _, truncated, _ = parse_origin_page(xml)
            merger.feed_origin(contents, truncated=truncated)
    body = render(request, page.contents, page.prefixes, page.truncated, page.next_after)

While ``page`` is None exactly one of the two ``needs_*`` calls returns a key (``""`` means
"from the start"). Both sources are read as pages of keys strictly after that key, under the
request's prefix, ordered as S3 orders keys (in PostgreSQL: ``COLLATE "C"``). The catalog
gives the latest version of each key, tombstones included; versions already migrated may be
fed as well (they agree with the origin) or dropped, as above, so that the origin is the
truth for them.

Decisions, and why:

* Order. S3 orders keys by their UTF-8 bytes. For strings of Unicode scalar values that is
  code point order, which is how Python compares ``str``, so keys are compared as they are
  (not as UTF-16, where U+FF21 sorts after U+1F600).
* The origin is asked without a delimiter. Its CommonPrefixes would hide which keys a
  tombstone leaves standing under a prefix, so LOTA groups keys itself. To stay fast under a
  prefix holding millions of keys, once a CommonPrefix ``P`` is out the merger skips the rest
  of ``P``: both sources resume after :func:`skip_past` ``(P)``.
* The origin is asked with ``encoding-type=url``: keys may hold characters XML 1.0 cannot
  carry (U+0001), and :func:`parse_origin_page` decodes whatever the response says it encoded.
* Catalog first. A migrating object moves from the catalog to the origin (copied there, then
  marked migrated). If the origin were read before the catalog for the same keys,
  a migration in between would hide an object from both reads. So the merger asks the catalog
  first and keeps from an origin page only the keys the catalog had already been read through;
  the rest is read again later. Usually the catalog's first page is its last and nothing is
  dropped.
* ``start-after``, ``marker`` and continuation tokens mean the same thing: only entries (keys
  and CommonPrefixes) that sort after that string are listed. A CommonPrefix equal to the
  marker is thus not repeated, which is what makes v1's ``NextMarker`` work as the next
  ``marker`` (s3-tests ``test_bucket_list_delimiter_prefix``); a marker inside a CommonPrefix
  skips that prefix (moto does the same). LOTA's continuation token is the last entry listed,
  base64url-encoded behind a version tag.
* ``IsTruncated`` is exact: the merger looks one entry ahead before saying there is more.
  ``max-keys=0`` lists nothing and is not truncated (s3-tests ``test_bucket_list_maxkeys_zero``);
  pages hold at most 1000 entries, as S3's do, whatever ``max-keys`` asks for.
* ``fetch-owner`` is ignored; no ``Owner`` is listed, in v1 either.
"""

from __future__ import annotations

import base64
import binascii
import xml.etree.ElementTree as ET
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from urllib.parse import quote_plus, unquote_plus
from xml.sax.saxutils import escape

from lota.errors import OriginError
from lota.s3.errors import S3Error, invalid_argument

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
MAX_PAGE = 1000  # S3 never lists more entries in one response
MAX_KEY_BYTES = 1024  # S3's limit on the UTF-8 length of a key
_TOKEN_TAG = "L1"
_BAD_TOKEN = "The continuation token provided is incorrect"
_XML_ENTITIES = {'"': "&quot;", "\r": "&#13;"}

Encode = Callable[[str], str]


@dataclass(frozen=True, slots=True)
class Entry:
    """One object as a listing shows it; ``last_modified`` as S3 writes it (ISO 8601, UTC)."""

    key: str
    size: int
    etag: str
    last_modified: str
    storage_class: str = "STANDARD"


@dataclass(frozen=True, slots=True)
class Override:
    """What the catalog says about a key: a pending ``entry``, or None for a pending delete."""

    key: str
    entry: Entry | None

    def __post_init__(self) -> None:
        if self.entry is not None and self.entry.key != self.key:
            raise ValueError(f"override for {self.key!r} carries {self.entry.key!r}")


@dataclass(frozen=True, slots=True)
class ListRequest:
    """A ListObjects (``version=1``) or ListObjectsV2 request, as the client sent it.

    ``start_after`` is v2's ``start-after`` or v1's ``marker``. ``given`` names the query
    parameters present, since S3 echoes some (``StartAfter``, ``ContinuationToken``) exactly
    when they were sent, even empty.
    """

    bucket: str
    prefix: str = ""
    delimiter: str = ""
    max_keys: int = 1000
    start_after: str = ""
    continuation_token: str = ""
    encoding_type: str = ""
    version: int = 2
    given: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_query(cls, bucket: str, query: Sequence[tuple[str, str]]) -> ListRequest:
        """Parse the (already percent-decoded) query; the first of repeated parameters wins."""
        args: dict[str, str] = {}
        for name, value in query:
            args.setdefault(name, value)
        version = _parse_list_type(args.get("list-type"))
        encoding = args.get("encoding-type", "")
        if encoding not in ("", "url"):
            message = "Invalid Encoding Method specified in Request"
            raise invalid_argument(message, "encoding-type", encoding)
        return cls(
            bucket=bucket,
            prefix=args.get("prefix", ""),
            delimiter=args.get("delimiter", ""),
            max_keys=_parse_max_keys(args.get("max-keys")),
            start_after=args.get("start-after" if version == 2 else "marker", ""),
            continuation_token=args.get("continuation-token", "") if version == 2 else "",
            encoding_type=encoding,
            version=version,
            given=frozenset(args),
        )

    def resume_after(self) -> str:
        """The string after which entries are listed: the token's, else start-after/marker."""
        if self.version == 2 and self.continuation_token:
            return decode_token(self.continuation_token)
        return self.start_after


@dataclass(frozen=True, slots=True)
class Page:
    """One response's worth: what :func:`render` takes. ``next_after`` is the last entry."""

    contents: list[Entry]
    prefixes: list[str]
    truncated: bool
    next_after: str


def _parse_list_type(value: str | None) -> int:
    if value is None:
        return 1
    if value != "2":
        raise invalid_argument("Invalid List Type specified in Request", "list-type", value)
    return 2


def _parse_max_keys(value: str | None) -> int:
    if value is None:
        return MAX_PAGE
    if not (value.isascii() and value.isdigit()) or int(value) > 2**31 - 1:
        message = "Provided max-keys not an integer or within integer range"
        raise invalid_argument(message, "max-keys", value)
    return int(value)


def encode_token(after: str) -> str:
    """LOTA's continuation token: where the next page starts, opaque to clients."""
    return _TOKEN_TAG + base64.urlsafe_b64encode(after.encode()).decode().rstrip("=")


def is_lota_token(token: str) -> bool:
    """Whether a continuation token is one of LOTA's (else it is the origin's, passed
    through): it must decode and re-encode exactly, which an origin's token that merely
    starts with the tag does not."""
    try:
        decode_token(token)
    except S3Error:
        return False
    return True


def decode_token(token: str) -> str:
    """The entry a token of :func:`encode_token` names; S3Error InvalidArgument if garbage."""
    body = token.removeprefix(_TOKEN_TAG)
    try:
        if body == token or not body:
            raise ValueError(token)
        raw = base64.b64decode(body + "=" * (-len(body) % 4), altchars=b"-_", validate=True)
        after = raw.decode()
    except (ValueError, binascii.Error):
        raise invalid_argument(_BAD_TOKEN, "continuation-token", token) from None
    if len(raw) > MAX_KEY_BYTES or encode_token(after) != token:
        raise invalid_argument(_BAD_TOKEN, "continuation-token", token)
    return after


def skip_past(prefix: str) -> str:
    """The greatest key S3 can hold that starts with `prefix`: the ``start-after`` that
    resumes a listing at the first key not under `prefix`.

    It is `prefix` padded with the highest characters that still fit ``MAX_KEY_BYTES``
    UTF-8 bytes: U+10FFFF (4 bytes) while 4 bytes are left, then U+FFFD, U+07FF or U+007F for
    the last 3, 2 or 1. (U+FFFD, not U+FFFF: origins echo ``StartAfter`` in XML, where U+FFFF
    is not allowed; a key under `prefix` that sorts after this one would have to be 1024
    bytes long and end in U+FFFE or U+FFFF, and the merger drops it anyway.)

    The successor of `prefix` (last character + 1) is not usable: ``start-after`` is
    exclusive, so the key equal to it, e.g. ``a0`` after the CommonPrefix ``a/``, would be
    skipped.
    """
    room = MAX_KEY_BYTES - len(prefix.encode())
    if room <= 0:
        return prefix
    tail = ("", "\x7f", "\u07ff", "\ufffd")[room % 4]
    return prefix + "\U0010ffff" * (room // 4) + tail


def _covers(through: str | None, key: str | None) -> bool:
    """Whether a source read `through` a key (None: to the end) knows all keys up to `key`."""
    return through is None or (key is not None and key <= through)


def _lower(a: str | None, b: str | None) -> str | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


_OVERRIDES, _ORIGIN = "overrides", "origin"


class Merger:
    """Merges the origin's listing with the catalog's overrides into one S3 page.

    See the module docstring for the loop that drives it. Both sources are fed in pages of
    ascending keys; ``through`` below is the key up to which a source has been read (None:
    entirely). Keys at or below ``floor`` are no longer wanted: they were listed, precede
    the resume point, or lie under a CommonPrefix already accounted for.
    """

    def __init__(self, request: ListRequest) -> None:
        self.request = request
        self.page: Page | None = None
        self._limit = min(request.max_keys, MAX_PAGE)
        self._last = request.resume_after()
        self._floor = self._resume_floor(self._last)
        self._origin: deque[Entry] = deque()
        self._overrides: deque[Override] = deque()
        self._origin_through: str | None = ""
        self._overrides_through: str | None = ""
        self._contents: list[Entry] = []
        self._prefixes: list[str] = []
        self._need: str | None = None
        if self._limit == 0:
            self.page = Page([], [], truncated=False, next_after="")
        self._advance()

    def needs_overrides_after(self) -> str | None:
        """The key after which the catalog is to be read next, or None if not now."""
        return self._after(self._overrides_through) if self._need == _OVERRIDES else None

    def needs_origin_after(self) -> str | None:
        """The origin's ``start-after`` for its next page (``""``: none), or None if not now."""
        return self._after(self._origin_through) if self._need == _ORIGIN else None

    def feed_overrides(
        self, overrides: Sequence[Override], *, complete: bool, last_key: str | None = None
    ) -> None:
        """The catalog's next overrides after :meth:`needs_overrides_after`, ascending.

        `complete`: the catalog has none after this batch. `last_key`: the last key the
        catalog query returned, when the caller dropped rows from the batch (migrated
        versions, say); by default the last override's. Raises ValueError on a batch out of
        order, an incomplete batch that does not advance, or a batch not asked for.
        """
        if self._need != _OVERRIDES:
            raise ValueError("overrides fed while not asked for")
        start = self._after(self._overrides_through)
        _check_order((o.key for o in overrides), ValueError, "catalog overrides")
        through = last_key if last_key is not None else overrides[-1].key if overrides else None
        if not complete and (through is None or through <= start):
            raise ValueError("an incomplete batch of overrides must advance")
        if overrides and through is not None and overrides[-1].key > through:
            raise ValueError(f"overrides after last_key {through!r}")
        self._overrides.extend(o for o in overrides if self._wanted(o.key, start))
        self._overrides_through = None if complete else through
        self._need = None
        self._advance()

    def feed_origin(self, contents: Sequence[Entry], *, truncated: bool) -> None:
        """The origin's page asked for by :meth:`needs_origin_after` (no delimiter).

        Raises OriginError on a page out of order or a truncated page that does not advance,
        ValueError on a page not asked for.
        """
        if self._need != _ORIGIN:
            raise ValueError("an origin page fed while not asked for")
        start = self._after(self._origin_through)
        _check_order((e.key for e in contents), OriginError, "origin listing")
        if truncated and (not contents or contents[-1].key <= start):
            raise OriginError("origin listing is truncated but did not advance")
        # Catalog first: keep only keys the catalog had been read through before this page.
        through = _lower(
            contents[-1].key if truncated else None, self._effective(self._overrides_through)
        )
        self._origin.extend(
            e for e in contents if self._wanted(e.key, start) and _covers(through, e.key)
        )
        self._origin_through = through
        self._need = None
        self._advance()

    def _after(self, through: str | None) -> str:
        return self._floor if through is None else max(through, self._floor)

    def _wanted(self, key: str, start: str) -> bool:
        return key > start and key.startswith(self.request.prefix)

    def _advance(self) -> None:
        while self.page is None and self._need is None:
            self._drop_floor()
            heads = [q[0].key for q in (self._origin, self._overrides) if q]
            key = min(heads) if heads else None
            if not _covers(self._effective(self._overrides_through), key):
                self._need = _OVERRIDES
            elif not _covers(self._effective(self._origin_through), key):
                self._need = _ORIGIN
            elif key is None:
                self._finish(truncated=False)
            elif (entry := self._pop(key)) is not None:
                self._take(entry)

    def _effective(self, through: str | None) -> str | None:
        return None if through is None else self._after(through)

    def _drop_floor(self) -> None:
        for queue in (self._origin, self._overrides):
            while queue and queue[0].key <= self._floor:
                queue.popleft()

    def _pop(self, key: str) -> Entry | None:
        """The entry listed for `key`: the catalog's override wins over the origin's."""
        entry = self._origin.popleft() if self._origin and self._origin[0].key == key else None
        if self._overrides and self._overrides[0].key == key:
            entry = self._overrides.popleft().entry
        return entry

    def _take(self, entry: Entry) -> None:
        item, grouped = self._group(entry.key)
        if grouped:
            self._floor = max(self._floor, skip_past(item))
        if item <= self._last:
            return
        if len(self._contents) + len(self._prefixes) == self._limit:
            self._finish(truncated=True)
            return
        if grouped:
            self._prefixes.append(item)
        else:
            self._contents.append(entry)
        self._last = item

    def _finish(self, *, truncated: bool) -> None:
        last = self._last if truncated else ""
        self.page = Page(self._contents, self._prefixes, truncated, next_after=last)

    def _group(self, key: str) -> tuple[str, bool]:
        """The entry `key` lists as: its CommonPrefix (True), or itself (False)."""
        prefix, delimiter = self.request.prefix, self.request.delimiter
        found = key.find(delimiter, len(prefix)) if delimiter and key.startswith(prefix) else -1
        return (key[: found + len(delimiter)], True) if found >= 0 else (key, False)

    def _resume_floor(self, after: str) -> str:
        item, grouped = self._group(after)
        return max(after, skip_past(item)) if grouped else after


def _check_order(keys: Iterable[str], error: type[Exception], what: str) -> None:
    previous: str | None = None
    for key in keys:
        if previous is not None and key <= previous:
            raise error(f"{what} out of order: {key!r} after {previous!r}")
        previous = key


def parse_origin_page(xml: bytes) -> tuple[list[Entry], list[str], bool, str]:
    """(contents, common prefixes, is truncated, next token or marker) of an origin's
    ListObjectsV2 or ListObjects response, keys decoded if its ``EncodingType`` is ``url``.

    The token is ``NextContinuationToken`` (v2) or ``NextMarker`` (v1), ``""`` if absent.
    Raises OriginError if the body is not a ListBucketResult.
    """
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise OriginError(f"origin listing is not XML: {exc}") from exc
    if _local(root.tag) != "ListBucketResult":
        raise OriginError(f"origin listing is a {_local(root.tag)}, not a ListBucketResult")
    fields = {_local(child.tag): child.text or "" for child in root if len(child) == 0}
    decode = unquote_plus if fields.get("EncodingType") == "url" else _same
    contents: list[Entry] = []
    prefixes: list[str] = []
    try:
        for child in root:
            sub = {_local(leaf.tag): leaf.text or "" for leaf in child}
            if _local(child.tag) == "Contents":
                contents.append(_entry(sub, decode))
            elif _local(child.tag) == "CommonPrefixes":
                prefixes.append(decode(sub.get("Prefix", "")))
    except (KeyError, ValueError) as exc:
        raise OriginError(f"origin listing has a malformed entry: {exc!r}") from exc
    truncated = fields.get("IsTruncated", "false") == "true"
    following = fields.get("NextContinuationToken") or decode(fields.get("NextMarker", ""))
    return contents, prefixes, truncated, following


def _local(tag: str) -> str:
    return tag.rpartition("}")[2]


def _same(text: str) -> str:
    return text


def _entry(fields: dict[str, str], decode: Encode) -> Entry:
    return Entry(
        key=decode(fields["Key"]),
        size=int(fields["Size"]),
        etag=fields.get("ETag", ""),
        last_modified=fields.get("LastModified", ""),
        storage_class=fields.get("StorageClass") or "STANDARD",
    )


def render(
    request: ListRequest,
    contents: list[Entry],
    prefixes: list[str],
    truncated: bool,
    next_after: str,
) -> bytes:
    """The ListBucketResult document S3 answers `request` with, for one page.

    With ``encoding-type=url`` the names S3 encodes are URL-encoded (as botocore decodes
    them): v2's Prefix, Delimiter, StartAfter and keys; v1's Delimiter, Marker, NextMarker
    and keys (v1's Prefix stays as it is, as botocore expects).
    """
    url = request.encoding_type == "url"
    name = _url if url else _same
    head = _v2_head if request.version == 2 else _v1_head
    parts = [
        f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{NS}">',
        _element("Name", request.bucket),
        *head(request, len(contents) + len(prefixes), truncated, next_after, name),
        _element("MaxKeys", str(request.max_keys)),
        _element("Delimiter", name(request.delimiter)) if request.delimiter else "",
        _element("EncodingType", "url") if url else "",
        _element("IsTruncated", "true" if truncated else "false"),
        *(_contents(entry, name) for entry in contents),
        *(f"<CommonPrefixes>{_element('Prefix', name(p))}</CommonPrefixes>" for p in prefixes),
        "</ListBucketResult>",
    ]
    return "".join(parts).encode()


def _v2_head(
    request: ListRequest, count: int, truncated: bool, next_after: str, name: Encode
) -> list[str]:
    given = request.given
    return [
        _element("Prefix", name(request.prefix)),
        _element("StartAfter", name(request.start_after)) if "start-after" in given else "",
        _element("ContinuationToken", request.continuation_token)
        if "continuation-token" in given
        else "",
        _element("NextContinuationToken", encode_token(next_after)) if truncated else "",
        _element("KeyCount", str(count)),
    ]


def _v1_head(
    request: ListRequest, count: int, truncated: bool, next_after: str, name: Encode
) -> list[str]:
    # S3 gives NextMarker only with a delimiter; without one the next marker is the last key.
    following = truncated and bool(request.delimiter)
    return [
        _element("Prefix", request.prefix),
        _element("Marker", name(request.start_after)),
        _element("NextMarker", name(next_after)) if following else "",
    ]


def _contents(entry: Entry, name: Encode) -> str:
    return (
        "<Contents>"
        + _element("Key", name(entry.key))
        + _element("LastModified", entry.last_modified)
        + _element("ETag", entry.etag)
        + _element("Size", str(entry.size))
        + _element("StorageClass", entry.storage_class)
        + "</Contents>"
    )


def _element(tag: str, text: str) -> str:
    return f"<{tag}>{escape(text, _XML_ENTITIES)}</{tag}>"


def _url(text: str) -> str:
    return quote_plus(text, safe="/")
