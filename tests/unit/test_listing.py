"""Merged listings (lota.regions.listing) against a brute-force model, through real boto3.

The origin and the catalog are simulated in memory (with migrations moving pending writes
from one to the other between reads); the merger is driven by the loop its module docstring
prescribes; every response is rendered to XML and read back by botocore, whose paginators
and URL-decoding are what boto3 users see.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import boto3
import botocore.parsers
import botocore.session
import pytest
from botocore.awsrequest import AWSResponse
from botocore.config import Config
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lota.errors import OriginError
from lota.regions.listing import (
    MAX_KEY_BYTES,
    Entry,
    ListRequest,
    Merger,
    Override,
    Page,
    decode_token,
    encode_token,
    is_lota_token,
    parse_origin_page,
    render,
    skip_past,
)
from lota.s3.errors import S3Error

NS = "http://s3.amazonaws.com/doc/2006-03-01/"
WHEN = "2026-12-02T17:35:00.000Z"
# U+FF21 and U+1F600 sort one way as UTF-8 (and code points), the other way as UTF-16.
ALPHABET = "/-aäZ0+ \uff21\U0001f600"
KEYS = st.text(alphabet=ALPHABET, min_size=1, max_size=5)


def utf8(text: str) -> bytes:
    return text.encode()


def at_origin(key: str) -> Entry:
    return Entry(key, size=1, etag='"origin"', last_modified=WHEN)


def pending(key: str) -> Entry:
    return Entry(key, size=2, etag='"pending"', last_modified=WHEN, storage_class="STANDARD_IA")


# --- the simulated world: an origin bucket, a catalog, a migrator ------------------------------


@dataclass
class World:
    """One bucket's origin listing and catalog overrides; reads page like the real ones."""

    origin: dict[str, Entry] = field(default_factory=dict)
    catalog: dict[str, Override] = field(default_factory=dict)
    migrated: set[str] = field(default_factory=set)  # catalog keys the origin has too
    skip_migrated: bool = False  # whether the lead drops migrated rows before feeding
    origin_page: int = 1000
    catalog_page: int = 1000
    migration: list[tuple[str, str]] = field(default_factory=list)  # (step, key)
    gaps: list[int] = field(default_factory=list)  # migration steps run before each read
    origin_reads: list[str] = field(default_factory=list)  # start-after of each origin read
    catalog_reads: int = 0

    def visible(self) -> dict[str, Entry]:
        keys = dict(self.origin)
        for key, override in self.catalog.items():
            if key in self.migrated:
                continue
            if override.entry is None:
                keys.pop(key, None)
            else:
                keys[key] = override.entry
        return keys

    def plan_migration(self, order: list[str]) -> None:
        """Migrate `order`'s pending writes: copy to the origin, then mark them migrated."""
        self.migration = [(step, key) for key in order for step in ("copy", "forget")]

    def _migrate(self) -> None:
        for _ in range(self.gaps.pop(0) if self.gaps else 0):
            if not self.migration:
                return
            step, key = self.migration.pop(0)
            entry = self.catalog[key].entry
            if step == "forget":
                self.migrated.add(key)
            elif entry is None:
                self.origin.pop(key, None)
            else:
                self.origin[key] = Entry(key, entry.size, entry.etag, WHEN, entry.storage_class)

    def overrides(self, prefix: str, after: str) -> list[tuple[Override, bool]]:
        """The catalog's latest versions after `after`: (override, migrated)."""
        self._migrate()
        self.catalog_reads += 1
        keys = sorted((k for k in self.catalog if k.startswith(prefix) and k > after), key=utf8)
        return [(self.catalog[k], k in self.migrated) for k in keys[: self.catalog_page]]

    def origin_xml(self, prefix: str, after: str) -> bytes:
        """What S3 answers ``?list-type=2&prefix=..&start-after=..&encoding-type=url``."""
        self._migrate()
        self.origin_reads.append(after)
        keys = sorted(
            (k for k in self.origin if k.startswith(prefix) and utf8(k) > utf8(after)), key=utf8
        )
        page, more = keys[: self.origin_page], len(keys) > self.origin_page
        contents = "".join(
            f"<Contents><Key>{quote(k)}</Key><LastModified>{WHEN}</LastModified>"
            f"<ETag>&quot;{self.origin[k].etag.strip(chr(34))}&quot;</ETag>"
            f"<Size>{self.origin[k].size}</Size><StorageClass>"
            f"{self.origin[k].storage_class}</StorageClass></Contents>"
            for k in page
        )
        return (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<ListBucketResult xmlns="{NS}">'
            f"<Name>b</Name><Prefix>{quote(prefix)}</Prefix>"
            f"{f'<StartAfter>{quote(after)}</StartAfter>' if after else ''}"
            f"<KeyCount>{len(page)}</KeyCount><MaxKeys>{self.origin_page}</MaxKeys>"
            f"<EncodingType>url</EncodingType><IsTruncated>{str(more).lower()}</IsTruncated>"
            f"{contents}</ListBucketResult>"
        ).encode()


def run(world: World, request: ListRequest) -> Page:
    """The lead's loop: answer the merger, catalog first, until it has a page."""
    merger = Merger(request)
    for _ in range(100_000):
        if merger.page is not None:
            return merger.page
        overrides_after, origin_after = merger.needs_overrides_after(), merger.needs_origin_after()
        assert (overrides_after is None) != (origin_after is None)
        if overrides_after is not None:
            rows = world.overrides(request.prefix, overrides_after)
            complete = len(rows) < world.catalog_page
            if world.skip_migrated:
                last = rows[-1][0].key if rows else None
                kept = [o for o, migrated in rows if not migrated]
                merger.feed_overrides(kept, complete=complete, last_key=last)
            else:
                merger.feed_overrides([o for o, _ in rows], complete=complete)
        elif origin_after is not None:
            contents, prefixes, truncated, _ = parse_origin_page(
                world.origin_xml(request.prefix, origin_after)
            )
            assert prefixes == []
            merger.feed_origin(contents, truncated=truncated)
    raise AssertionError("the merger made no progress")


def expected(
    world: World, prefix: str, delimiter: str, after: str = ""
) -> list[tuple[str, Entry | None]]:
    """Brute force: (key, entry) or (common prefix, None), after `after`, in UTF-8 order."""
    items: dict[str, Entry | None] = {}
    for key, entry in world.visible().items():
        if not key.startswith(prefix):
            continue
        cut = key.find(delimiter, len(prefix)) if delimiter else -1
        if cut >= 0:
            items[key[: cut + len(delimiter)]] = None
        else:
            items[key] = entry
    return sorted(
        ((k, e) for k, e in items.items() if utf8(k) > utf8(after)), key=lambda i: utf8(i[0])
    )


# --- LOTA as boto3 sees it: requests answered in-process, no network ---------------------------


class Body:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.data


@dataclass
class FakeLota:
    """Answers boto3's ListObjects(V2) requests with the merger, in place of the network."""

    world: World = field(default_factory=World)

    def __call__(self, request: Any, **_: Any) -> AWSResponse:
        url = urlsplit(request.url)
        query = parse_qsl(url.query, keep_blank_values=True)
        try:
            list_request = ListRequest.from_query(unquote(url.path.strip("/")), query)
            page = run(self.world, list_request)
            body, status = render(list_request, *_fields(page)), 200
        except S3Error as exc:
            body, status = exc.to_xml(), exc.status
        return AWSResponse(request.url, status, {"Content-Type": "application/xml"}, Body(body))


def _fields(page: Page) -> tuple[list[Entry], list[str], bool, str]:
    return page.contents, page.prefixes, page.truncated, page.next_after


@pytest.fixture(scope="module")
def lota() -> FakeLota:
    return FakeLota()


@pytest.fixture(scope="module")
def client(lota: FakeLota) -> Any:
    s3 = boto3.client(
        "s3",
        endpoint_url="http://lota.test",
        aws_access_key_id="k",
        aws_secret_access_key="s",
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    s3.meta.events.register("before-send.s3", lota)
    return s3


def botocore_parse(xml: bytes, operation: str = "ListObjectsV2") -> dict[str, Any]:
    """`xml` as botocore parses it (without boto3's URL-decoding step)."""
    service = botocore.session.get_session().get_service_model("s3")
    shape = service.operation_model(operation).output_shape
    parser = botocore.parsers.RestXMLParser()
    parsed: dict[str, Any] = parser.parse({"body": xml, "headers": {}, "status_code": 200}, shape)
    return parsed


def listed(response: dict[str, Any]) -> list[tuple[str, tuple[int, str, str] | None]]:
    items: list[tuple[str, tuple[int, str, str] | None]] = [
        (c["Key"], (c["Size"], c["ETag"], c["StorageClass"])) for c in response.get("Contents", [])
    ]
    items += [(p["Prefix"], None) for p in response.get("CommonPrefixes", [])]
    return sorted(items, key=lambda i: utf8(i[0]))


def shown(items: list[tuple[str, Entry | None]]) -> list[tuple[str, tuple[int, str, str] | None]]:
    return [(k, None if e is None else (e.size, e.etag, e.storage_class)) for k, e in items]


def list_pages(
    client: Any, version: int, start_after: str = "", **params: Any
) -> list[dict[str, Any]]:
    """Every page, following NextContinuationToken (v2) or NextMarker / the last key (v1)."""
    pages: list[dict[str, Any]] = []
    token = ""
    while True:
        if version == 2:
            args = {"ContinuationToken": token} if token else {}
            if start_after:
                args["StartAfter"] = start_after
            response = client.list_objects_v2(Bucket="b", **params, **args)
            token = response.get("NextContinuationToken", "")
        else:
            response = client.list_objects(Bucket="b", Marker=token or start_after, **params)
            contents = response.get("Contents", [{}])
            token = response.get("NextMarker") or contents[-1].get("Key", "")
        pages.append(response)
        if not response["IsTruncated"]:
            return pages
        assert token
        assert len(pages) < 500


# --- the reference model ---------------------------------------------------------------------


@st.composite
def worlds(draw: st.DrawFn) -> World:
    origin = draw(st.sets(KEYS, max_size=25))
    candidates = st.sampled_from(sorted(origin)) | KEYS if origin else KEYS
    kinds = st.sampled_from(["put", "put", "delete"])
    catalog = draw(st.dictionaries(candidates, kinds, max_size=12))
    world = World(
        origin={k: at_origin(k) for k in origin},
        catalog={
            k: Override(k, pending(k) if kind == "put" else None) for k, kind in catalog.items()
        },
        origin_page=draw(st.integers(1, 4)),
        catalog_page=draw(st.integers(1, 4)),
        gaps=draw(st.lists(st.integers(0, 2), max_size=30)),
        skip_migrated=draw(st.booleans()),
    )
    # Later keys migrating first is what races a listing: its catalog pages come later.
    newest_first = sorted(catalog, key=utf8, reverse=True)
    world.plan_migration(draw(st.just(newest_first) | st.permutations(newest_first)))
    return world


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    world=worlds(),
    prefix=st.sampled_from(["", "", "a", "a/", "ä", "Z-"]) | KEYS,
    delimiter=st.sampled_from(["", "/", "/", "-", "a/", "ä", "\U0001f600"]),
    max_keys=st.sampled_from([1, 2, 3, 5, 1000]),
    start_after=st.sampled_from(["", "", ""]) | KEYS,
    version=st.sampled_from([1, 2]),
)
def test_every_page_matches_the_reference_model_while_objects_migrate(
    client: Any,
    lota: FakeLota,
    world: World,
    prefix: str,
    delimiter: str,
    max_keys: int,
    start_after: str,
    version: int,
) -> None:
    want = expected(world, prefix, delimiter, start_after)
    lota.world = world
    params: dict[str, Any] = {"Prefix": prefix, "MaxKeys": max_keys}
    if delimiter:
        params["Delimiter"] = delimiter
    pages = list_pages(client, version, start_after, **params)
    done = 0
    for page in pages:
        got = listed(page)
        assert got == shown(want[done : done + max_keys])
        done += len(got)
        assert page["IsTruncated"] == (done < len(want))
        assert page["Prefix"] == prefix and page.get("Delimiter", "") == delimiter
        assert page["MaxKeys"] == max_keys
        if version == 2:
            assert page["KeyCount"] == len(got)
    assert done == len(want)


@settings(max_examples=500, deadline=None)
@given(
    world=worlds(),
    catalog_page=st.integers(1, 2),
    gaps=st.lists(st.integers(0, 4), min_size=1, max_size=10),
    delimiter=st.sampled_from(["", "/"]),
)
def test_one_page_is_exact_however_migrations_interleave_with_the_reads(
    world: World, catalog_page: int, gaps: list[int], delimiter: str
) -> None:
    world.catalog_page, world.gaps, world.skip_migrated = catalog_page, gaps, True
    want = expected(world, "", delimiter)
    page = run(world, request(list_type="2", delimiter=delimiter))
    got = [(e.key, e) for e in page.contents] + [(p, None) for p in page.prefixes]
    assert sorted(got, key=lambda i: utf8(i[0])) == want and not page.truncated


@settings(max_examples=150, deadline=None)
@given(world=worlds(), delimiter=st.sampled_from(["", "/"]), page_size=st.integers(1, 4))
def test_boto3_paginators_list_everything(
    client: Any, lota: FakeLota, world: World, delimiter: str, page_size: int
) -> None:
    want = shown(expected(world, "", delimiter))
    lota.world = world
    args: dict[str, Any] = {"Bucket": "b", "PaginationConfig": {"PageSize": page_size}}
    if delimiter:
        args["Delimiter"] = delimiter
    for operation in ("list_objects_v2", "list_objects"):
        result = client.get_paginator(operation).paginate(**args)
        got = [item for page in result for item in listed(page)]
        assert sorted(got, key=lambda i: utf8(i[0])) == want


# --- cases -----------------------------------------------------------------------------------


def request(**query: str) -> ListRequest:
    return ListRequest.from_query("b", [(k.replace("_", "-"), v) for k, v in query.items()])


def test_empty_bucket_reads_each_source_once() -> None:
    world = World()
    page = run(world, request(list_type="2"))
    assert page == Page([], [], truncated=False, next_after="")
    assert world.catalog_reads == 1 and world.origin_reads == [""]
    parsed = botocore_parse(render(request(list_type="2"), *_fields(page)))
    assert parsed["KeyCount"] == 0 and parsed["IsTruncated"] is False
    assert "Contents" not in parsed and "CommonPrefixes" not in parsed


def test_max_keys_zero_lists_nothing_without_reading() -> None:
    world = World(origin={"a": at_origin("a")})
    page = run(world, request(list_type="2", max_keys="0"))
    assert page == Page([], [], truncated=False, next_after="")
    assert world.catalog_reads == 0 and world.origin_reads == []


def test_pending_write_and_tombstone_change_the_listing(client: Any, lota: FakeLota) -> None:
    lota.world = World(
        origin={k: at_origin(k) for k in ("a", "b", "c")},
        catalog={"b": Override("b", None), "bb": Override("bb", pending("bb"))},
    )
    response = client.list_objects_v2(Bucket="b")
    assert [(c["Key"], c["ETag"]) for c in response["Contents"]] == [
        ("a", '"origin"'),
        ("bb", '"pending"'),
        ("c", '"origin"'),
    ]


def test_common_prefix_left_empty_by_tombstones_disappears() -> None:
    world = World(
        origin={k: at_origin(k) for k in ("d/x", "d/y", "e")},
        catalog={"d/x": Override("d/x", None), "d/y": Override("d/y", None)},
    )
    page = run(world, request(list_type="2", delimiter="/"))
    assert page.prefixes == [] and [e.key for e in page.contents] == ["e"]


def test_v2_xml_shape() -> None:
    req = request(list_type="2", prefix="p/", delimiter="/", max_keys="2", start_after="p/")
    page = Page([at_origin("p/a&b")], ["p/c/"], truncated=True, next_after="p/c/")
    assert render(req, *_fields(page)).decode() == (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<ListBucketResult xmlns="{NS}"><Name>b</Name><Prefix>p/</Prefix>'
        "<StartAfter>p/</StartAfter>"
        f"<NextContinuationToken>{encode_token('p/c/')}</NextContinuationToken>"
        "<KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><Delimiter>/</Delimiter>"
        "<IsTruncated>true</IsTruncated><Contents><Key>p/a&amp;b</Key>"
        f"<LastModified>{WHEN}</LastModified><ETag>&quot;origin&quot;</ETag><Size>1</Size>"
        "<StorageClass>STANDARD</StorageClass></Contents>"
        "<CommonPrefixes><Prefix>p/c/</Prefix></CommonPrefixes></ListBucketResult>"
    )


def test_v1_xml_shape_has_marker_and_next_marker_only_with_a_delimiter() -> None:
    page = Page([at_origin("a")], [], truncated=True, next_after="a")
    plain = render(request(marker="0", max_keys="1"), *_fields(page)).decode()
    assert plain == (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<ListBucketResult xmlns="{NS}"><Name>b</Name><Prefix></Prefix><Marker>0</Marker>'
        "<MaxKeys>1</MaxKeys><IsTruncated>true</IsTruncated><Contents><Key>a</Key>"
        f"<LastModified>{WHEN}</LastModified><ETag>&quot;origin&quot;</ETag><Size>1</Size>"
        "<StorageClass>STANDARD</StorageClass></Contents></ListBucketResult>"
    )
    grouped = botocore_parse(
        render(request(delimiter="/", max_keys="1"), *_fields(page)), "ListObjects"
    )
    assert grouped["NextMarker"] == "a" and grouped["Marker"] == ""
    assert "KeyCount" not in grouped


def test_v2_echoes_continuation_token_and_start_after_when_sent() -> None:
    token = encode_token("a")
    req = request(list_type="2", continuation_token=token, start_after="")
    parsed = botocore_parse(render(req, [], [], False, ""))
    assert parsed["ContinuationToken"] == token and parsed["StartAfter"] == ""
    assert "NextContinuationToken" not in parsed
    assert "StartAfter" not in botocore_parse(render(request(list_type="2"), [], [], False, ""))


def test_encoding_type_url_encodes_names() -> None:
    key = "d ä+%/k\x01"
    req = request(list_type="2", prefix="d ä", delimiter="+", encoding_type="url", start_after="d")
    page = Page([at_origin(key)], ["d ä+"], truncated=False, next_after="")
    xml = render(req, *_fields(page))
    assert b"<Key>d+%C3%A4%2B%25/k%01</Key>" in xml
    assert b"<Prefix>d+%C3%A4</Prefix>" in xml and b"<Delimiter>%2B</Delimiter>" in xml
    assert b"<EncodingType>url</EncodingType>" in xml
    contents, prefixes, _, _ = parse_origin_page(xml)
    assert [e.key for e in contents] == [key] and prefixes == ["d ä+"]


def test_boto3_sees_decoded_names(client: Any, lota: FakeLota) -> None:
    keys = ["dir ä/a+b c", "dir ä/x%y", "top\x01"]
    lota.world = World(origin={k: at_origin(k) for k in keys})
    v2 = client.list_objects_v2(Bucket="b", Delimiter="/", StartAfter="dir")
    assert v2["EncodingType"] == "url" and v2["StartAfter"] == "dir"
    assert [p["Prefix"] for p in v2["CommonPrefixes"]] == ["dir ä/"]
    assert [c["Key"] for c in v2["Contents"]] == ["top\x01"]
    v1 = client.list_objects(Bucket="b", Prefix="dir ä/", MaxKeys=1)
    assert [c["Key"] for c in v1["Contents"]] == ["dir ä/a+b c"] and v1["Prefix"] == "dir ä/"


def test_marker_equal_to_a_common_prefix_does_not_repeat_it() -> None:
    world = World(origin={k: at_origin(k) for k in ("asdf", "boo/bar", "boo/baz/x", "cquux/a")})
    page = run(world, request(delimiter="/", marker="boo/"))
    assert page.prefixes == ["cquux/"] and page.contents == []


def test_start_after_inside_a_common_prefix_skips_that_prefix() -> None:
    world = World(origin={k: at_origin(k) for k in ("a/1", "a/2", "a0", "b")})
    page = run(world, request(list_type="2", delimiter="/", start_after="a/1"))
    assert [e.key for e in page.contents] == ["a0", "b"] and page.prefixes == []
    assert world.origin_reads == [skip_past("a/")]


def test_common_prefix_with_many_keys_is_skipped_at_the_origin() -> None:
    keys = [f"big/{i:05}" for i in range(5000)] + ["a", "big0", "c/1", "c/2"]
    world = World(origin={k: at_origin(k) for k in keys})
    page = run(world, request(list_type="2", delimiter="/"))
    assert [e.key for e in page.contents] == ["a", "big0"] and page.prefixes == ["big/", "c/"]
    assert world.origin_reads == ["", skip_past("big/")]


def test_object_migrating_after_the_origin_read_stays_listed() -> None:
    # Catalog pages of one key; the lead drops migrated rows. "m" is still pending when the
    # origin is read, then migrates (copied to the origin, marked migrated) before the catalog
    # page holding it is read: neither read shows it, unless the origin page is kept only up
    # to the key the catalog had been read through ("b").
    world = World(
        origin={"a": at_origin("a")},
        catalog={"b": Override("b", pending("b")), "m": Override("m", pending("m"))},
        catalog_page=1,
        gaps=[0, 0, 2],
        skip_migrated=True,
    )
    world.plan_migration(["m"])
    page = run(world, request(list_type="2"))
    assert [(e.key, e.etag) for e in page.contents] == [
        ("a", '"origin"'),
        ("b", '"pending"'),
        ("m", '"pending"'),
    ]
    assert world.origin_reads[:2] == ["", "b"]


def test_key_under_a_common_prefix_past_skip_past_is_still_grouped() -> None:
    # 1024 bytes, under "/", and after skip_past("/") (which ends in U+FFFD, not U+FFFF).
    odd = "/" + "\U0010ffff" * 255 + "\uffff"
    world = World(origin={k: at_origin(k) for k in ("/a", odd, "z")}, origin_page=1)
    page = run(world, request(list_type="2", delimiter="/"))
    assert page.prefixes == ["/"] and [e.key for e in page.contents] == ["z"]
    assert world.origin_reads[:2] == ["", skip_past("/")]


def test_truncation_is_exact_when_the_page_ends_with_the_listing() -> None:
    world = World(origin={k: at_origin(k) for k in ("a", "b")}, catalog={"c": Override("c", None)})
    assert run(world, request(list_type="2", max_keys="2")).truncated is False
    world.catalog["c"] = Override("c", pending("c"))
    page = run(world, request(list_type="2", max_keys="2"))
    assert page.truncated is True and page.next_after == "b"


@pytest.mark.parametrize(
    "token", ["", "garbage", "L1", "L1!!!", "L1_w", "X1YQ", encode_token("a") + "=", "L1gA"]
)
def test_garbage_continuation_token_is_rejected(token: str) -> None:
    with pytest.raises(S3Error) as caught:
        decode_token(token)
    assert caught.value.code == "InvalidArgument"
    assert caught.value.message == "The continuation token provided is incorrect"


def test_garbage_continuation_token_reaches_boto3_as_invalid_argument(
    client: Any, lota: FakeLota
) -> None:
    lota.world = World()
    with pytest.raises(ClientError) as caught:
        client.list_objects_v2(Bucket="b", ContinuationToken="nonsense")
    assert caught.value.response["Error"]["Code"] == "InvalidArgument"


@given(st.text(alphabet=ALPHABET + "\x00\U0010ffff", min_size=1, max_size=20))
def test_token_round_trips(after: str) -> None:
    assert decode_token(encode_token(after)) == after


@pytest.mark.parametrize("value", ["", "-1", "1.5", "abc", "2147483648", "\u0661"])
def test_bad_max_keys_is_invalid_argument(value: str) -> None:
    with pytest.raises(S3Error) as caught:
        request(list_type="2", max_keys=value)
    assert caught.value.code == "InvalidArgument" and caught.value.status == 400


def test_from_query() -> None:
    v1 = ListRequest.from_query(
        "b", [("prefix", "p"), ("marker", "m"), ("prefix", "ignored"), ("continuation-token", "x")]
    )
    assert (v1.version, v1.prefix, v1.start_after, v1.continuation_token) == (1, "p", "m", "")
    assert v1.resume_after() == "m" and v1.max_keys == 1000
    v2 = request(list_type="2", start_after="s", fetch_owner="true", max_keys="5000")
    assert (v2.version, v2.start_after, v2.max_keys, v2.resume_after()) == (2, "s", 5000, "s")
    with_token = request(list_type="2", start_after="s", continuation_token=encode_token("t"))
    assert with_token.resume_after() == "t"
    for bad in ({"encoding_type": "base64"}, {"list_type": "3"}):
        with pytest.raises(S3Error, match="InvalidArgument"):
            request(**bad)


def test_more_than_1000_keys_asked_still_pages_by_1000() -> None:
    world = World(origin={f"{i:04}": at_origin(f"{i:04}") for i in range(1001)})
    page = run(world, request(list_type="2", max_keys="5000"))
    assert len(page.contents) == 1000 and page.truncated


# --- skip_past ---------------------------------------------------------------------------------

WIDE = "a/\x7f\u07ff\u0800\ufffd\U00010000\U0010ffff"


def test_skip_past_fills_exactly_the_key_limit() -> None:
    for prefix in ("", "a", "ab", "abc", "abcd", "ä", "x" * 1023, "x" * 1024):
        after = skip_past(prefix)
        assert after.startswith(prefix) and len(utf8(after)) == max(1024, len(utf8(prefix)))
    assert skip_past("a/") < "a0"


@given(
    prefix=st.text(alphabet=WIDE, max_size=6),
    tail=st.text(alphabet=WIDE + "\uffff", max_size=300),
    other=st.text(alphabet=WIDE + "\uffff", min_size=1, max_size=8),
)
def test_skip_past_separates_keys_under_a_prefix_from_those_after(
    prefix: str, tail: str, other: str
) -> None:
    after = skip_past(prefix)
    under = (prefix + tail).encode()[:MAX_KEY_BYTES].decode(errors="ignore")
    if under.startswith(prefix) and "\uffff" not in under:
        assert under <= after
    if not other.startswith(prefix) and len(utf8(other)) <= MAX_KEY_BYTES:
        assert (other > after) == (other > prefix)


# --- origin pages ------------------------------------------------------------------------------


def test_parse_origin_v1_page_with_next_marker() -> None:
    xml = (
        f'<ListBucketResult xmlns="{NS}"><Name>b</Name><Marker></Marker>'
        "<NextMarker>n%C3%A4</NextMarker><EncodingType>url</EncodingType>"
        "<IsTruncated>true</IsTruncated><Contents><Key>a%20b</Key><Size>3</Size>"
        "<ETag>&quot;e&quot;</ETag><LastModified>L</LastModified></Contents>"
        "<CommonPrefixes><Prefix>c+d/</Prefix></CommonPrefixes></ListBucketResult>"
    ).encode()
    assert parse_origin_page(xml) == ([Entry("a b", 3, '"e"', "L")], ["c d/"], True, "nä")


@pytest.mark.parametrize(
    "xml",
    [
        b"not xml",
        b"<Error><Code>AccessDenied</Code></Error>",
        f'<ListBucketResult xmlns="{NS}"><Contents><Key>a</Key></Contents></ListBucketResult>',
        f'<ListBucketResult xmlns="{NS}"><Contents><Size>x</Size></Contents></ListBucketResult>',
    ],
)
def test_unusable_origin_page_is_an_origin_error(xml: bytes | str) -> None:
    with pytest.raises(OriginError):
        parse_origin_page(xml.encode() if isinstance(xml, str) else xml)


def test_origin_page_out_of_order_or_stuck_is_an_origin_error() -> None:
    merger = Merger(request(list_type="2"))
    merger.feed_overrides([], complete=True)
    assert merger.needs_origin_after() == ""
    with pytest.raises(OriginError, match="out of order"):
        merger.feed_origin([at_origin("b"), at_origin("a")], truncated=False)
    with pytest.raises(OriginError, match="did not advance"):
        merger.feed_origin([], truncated=True)
    merger.feed_origin([], truncated=False)
    assert merger.page is not None
    with pytest.raises(ValueError, match="not asked for"):
        merger.feed_origin([at_origin("c")], truncated=False)
    with pytest.raises(ValueError, match="not asked for"):
        merger.feed_overrides([], complete=True)


def test_catalog_batch_out_of_order_is_a_value_error() -> None:
    merger = Merger(request(list_type="2"))
    with pytest.raises(ValueError, match="out of order"):
        merger.feed_overrides([Override("b", None), Override("a", None)], complete=True)
    with pytest.raises(ValueError, match="must advance"):
        merger.feed_overrides([], complete=False)
    with pytest.raises(ValueError, match="carries"):
        Override("a", pending("b"))


def test_real_origin_pages_and_skip_start_after(origin_s3: Any, bucket: str) -> None:
    """moto's own XML: URL-encoded keys decode, and a skip_past start-after is accepted."""
    keys = ["a b+c", "big/1", "big/2", "big/3", "big0", "zä\x01"]
    for key in keys:
        origin_s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    bodies: list[bytes] = []

    def keep(response_dict: dict[str, Any], **_: Any) -> None:
        bodies.append(response_dict["body"])

    origin_s3.meta.events.register("before-parse.s3.ListObjectsV2", keep)
    merger = Merger(request(list_type="2", delimiter="/"))
    merger.feed_overrides([], complete=True)
    while merger.page is None:
        after = merger.needs_origin_after()
        assert after is not None
        args = {"StartAfter": after} if after else {}
        origin_s3.list_objects_v2(Bucket=bucket, EncodingType="url", MaxKeys=2, **args)
        contents, _, truncated, _ = parse_origin_page(bodies[-1])
        merger.feed_origin(contents, truncated=truncated)
    page = merger.page
    assert [e.key for e in page.contents] == ["a b+c", "big0", "zä\x01"]
    assert page.prefixes == ["big/"]
    assert page.contents[0].size == 1 and page.contents[0].etag.startswith('"')


def test_only_tokens_lota_made_are_taken_for_lota_s() -> None:
    assert is_lota_token(encode_token("photos/2026/a.jpg"))
    for origin_token in ("1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=", "L1nope!", "L1", ""):
        assert not is_lota_token(origin_token)
