"""The DeleteObjects documents LOTA reads and writes: strict parsing, faithful rebuilding."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lota.s3.errors import S3Error
from lota.s3.xml import DeleteEntry, DeleteRequest, delete_result, merge_result, parse_delete

NS = "http://s3.amazonaws.com/doc/2006-03-01/"


def test_a_delete_body_names_its_keys_versions_and_quiet() -> None:
    body = (
        f'<?xml version="1.0" encoding="UTF-8"?><Delete xmlns="{NS}">'
        "<Object><Key>a &amp; b</Key></Object>"
        "<Object> <Key> spaced </Key>\n<VersionId>v1</VersionId> </Object>"
        "<Quiet> true </Quiet></Delete>"
    ).encode()
    assert parse_delete(body) == DeleteRequest(
        (DeleteEntry("a & b"), DeleteEntry(" spaced ", "v1")), quiet=True
    )
    plain = b"<Delete><Object><Key>k</Key></Object><Quiet>false</Quiet></Delete>"
    assert parse_delete(plain) == DeleteRequest((DeleteEntry("k"),), quiet=False)


@pytest.mark.parametrize(
    "body",
    [
        # Issue #10: a DTD (here with an undefined entity) hid the key from LOTA's parser.
        b'<!DOCTYPE Delete SYSTEM "http://127.0.0.1:1/x.dtd">'
        b"<Delete><Object><Key>k</Key></Object><Quiet>&undefined;</Quiet></Delete>",
        b'<!DOCTYPE Delete [<!ENTITY k "secret">]><Delete><Object><Key>&k;</Key></Object></Delete>',
        b"<Delete><Object><Key>&undefined;</Key></Object></Delete>",
        b"",
        b"not xml",
        b"<Delete></Delete>",
        b"<Delete><Object><Key>k</Key></Object>",
        b"<Remove><Object><Key>k</Key></Object></Remove>",
        b'<Delete xmlns="urn:other"><Object><Key>k</Key></Object></Delete>',
        b"<Delete><Object><Key></Key></Object></Delete>",
        b"<Delete><Object></Object></Delete>",
        b"<Delete><Object><Key>a</Key><Key>b</Key></Object></Delete>",
        b"<Delete><Object><Key>a</Key><VersionId>1</VersionId><VersionId>2</VersionId></Object>"
        b"</Delete>",
        b"<Delete><Object><Key>a<b/></Key></Object></Delete>",
        b"<Delete><Object><Key>a</Key><ETag>x</ETag></Object></Delete>",
        b"<Delete><Object><Key>a</Key></Object><Quiet>yes</Quiet></Delete>",
        b"<Delete><Object><Key>a</Key></Object><Quiet>true</Quiet><Quiet>true</Quiet></Delete>",
        b"<Delete>text<Object><Key>a</Key></Object></Delete>",
        b'<Delete><Object id="1"><Key>a</Key></Object></Delete>',
        b"<Delete>" + b"<Object><Key>k</Key></Object>" * 1001 + b"</Delete>",
    ],
)
def test_anything_but_a_plain_delete_document_is_malformed_xml(body: bytes) -> None:
    with pytest.raises(S3Error) as info:
        parse_delete(body)
    assert (info.value.code, info.value.status) == ("MalformedXML", 400)


xml_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1
).filter(lambda t: all(c in "\t\n\r" or ord(c) >= 0x20 for c in t))


@given(
    entries=st.lists(
        st.builds(DeleteEntry, xml_text, st.one_of(st.just(""), xml_text)), min_size=1
    ),
    quiet=st.booleans(),
)
def test_a_rebuilt_delete_body_parses_back_to_the_same_keys(
    entries: list[DeleteEntry], quiet: bool
) -> None:
    # `\r` in particular: written raw, an XML parser would read it back as `\n`, and the
    # origin would delete a key other than the one authorized.
    request = DeleteRequest(tuple(entries[:1000]), quiet)
    assert parse_delete(request.to_xml()) == request


def test_denied_keys_are_merged_into_an_origin_result_as_access_denied_errors() -> None:
    origin = (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult xmlns="{NS}">'
        "<Deleted><Key>a&amp;b</Key><DeleteMarker>true</DeleteMarker></Deleted>"
        "<Error><Key>c</Key><Code>InternalError</Code><Message>m</Message></Error>"
        "</DeleteResult>"
    ).encode()
    merged = ET.fromstring(merge_result(origin, [DeleteEntry("d<", "v1")], quiet=False))
    assert merged.tag == f"{{{NS}}}DeleteResult"
    assert [
        [(child.tag.removeprefix(f"{{{NS}}}"), child.text) for child in entry] for entry in merged
    ] == [
        [("Key", "a&b"), ("DeleteMarker", "true")],
        [("Key", "c"), ("Code", "InternalError"), ("Message", "m")],
        [
            ("Key", "d<"),
            ("VersionId", "v1"),
            ("Code", "AccessDenied"),
            ("Message", "Access Denied"),
        ],
    ]
    empty = f'<DeleteResult xmlns="{NS}"/>'.encode()
    assert len(ET.fromstring(merge_result(empty, [DeleteEntry("d")], quiet=False))) == 1
    quiet = ET.fromstring(merge_result(origin, [], quiet=True))
    assert [entry.tag.removeprefix(f"{{{NS}}}") for entry in quiet] == ["Error"]


def test_a_delete_result_lists_deleted_keys_and_errors() -> None:
    result = ET.fromstring(delete_result([DeleteEntry("a")], [DeleteEntry("b")]))
    assert [entry.tag.removeprefix(f"{{{NS}}}") for entry in result] == ["Deleted", "Error"]
