"""The few S3 XML documents LOTA reads itself. No I/O.

A DeleteObjects body decides which keys are deleted, so LOTA parses it strictly
(:func:`parse_delete`): no DTD, hence no entity of any kind beyond XML's five and character
references, and nothing but the documented ``<Delete>`` shape. What it forwards is rebuilt
from what it parsed (:meth:`DeleteRequest.to_xml`), never the client's bytes: an origin
whose parser reads the original differently must not see keys LOTA did not authorize.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from xml.parsers import expat
from xml.sax.saxutils import escape

from lota.s3.errors import S3Error

S3_NS = "http://s3.amazonaws.com/doc/2006-03-01/"  # the one place it is spelled out
S3_NS_PREFIX = "{" + S3_NS + "}"  # how ElementTree names S3's elements: f"{S3_NS_PREFIX}Key"
MAX_DELETE_KEYS = 1000  # S3's limit per DeleteObjects
# Written raw, `\r` would come back as `\n` (XML 1.0 section 2.11), tabs and newlines
# survive only by luck of context: char references are read back exactly.
_TEXT_ENTITIES = {"\r": "&#13;", "\n": "&#10;", "\t": "&#9;"}


@dataclass(frozen=True, slots=True)
class DeleteEntry:
    """One ``<Object>`` of a DeleteObjects body; ``version_id`` is "" when none is named."""

    key: str
    version_id: str = ""

    def fields(self) -> str:
        version = f"<VersionId>{_text(self.version_id)}</VersionId>" if self.version_id else ""
        return f"<Key>{_text(self.key)}</Key>{version}"


@dataclass(frozen=True, slots=True)
class DeleteRequest:
    """A parsed DeleteObjects body."""

    entries: tuple[DeleteEntry, ...]
    quiet: bool = False

    def to_xml(self) -> bytes:
        """The body to forward: exactly these entries, escaped so they parse back the same."""
        objects = "".join(f"<Object>{entry.fields()}</Object>" for entry in self.entries)
        quiet = "<Quiet>true</Quiet>" if self.quiet else ""
        return (
            f'<?xml version="1.0" encoding="UTF-8"?>\n<Delete xmlns="{S3_NS}">{objects}{quiet}'
            "</Delete>"
        ).encode()


def parse_delete(body: bytes) -> DeleteRequest:
    """The DeleteObjects body: ``<Delete>`` (S3 namespace or none) holding 1 to 1,000
    ``<Object><Key>K</Key>[<VersionId>V</VersionId>]</Object>`` and at most one
    ``<Quiet>true|false</Quiet>``. Anything else raises MalformedXML, as S3 does."""
    root = _strict_tree(body)
    if _name(root) != "Delete" or root.attrib or _has_text(root.text):
        raise _malformed()
    entries: list[DeleteEntry] = []
    quiets: list[bool] = []
    for child in root:
        _require_bare(child)
        if _name(child) == "Object":
            entries.append(_entry(child))
        elif _name(child) == "Quiet":
            quiets.append(_boolean(child))
        else:
            raise _malformed()
    if not 1 <= len(entries) <= MAX_DELETE_KEYS or len(quiets) > 1:
        raise _malformed()
    return DeleteRequest(tuple(entries), quiet=bool(quiets and quiets[0]))


def delete_result(deleted: Iterable[DeleteEntry], denied: Iterable[DeleteEntry] = ()) -> bytes:
    """A DeleteObjects answer: `deleted` as deleted, `denied` as AccessDenied errors."""
    entries = [f"<Deleted>{entry.fields()}</Deleted>" for entry in deleted]
    return _result(entries + _denied(denied))


def merge_result(result: bytes, denied: Iterable[DeleteEntry], *, quiet: bool) -> bytes:
    """A DeleteResult (the origin's) with an AccessDenied ``<Error>`` for each entry LOTA
    refused itself and so never sent, and, when `quiet`, errors only (as S3's quiet mode
    answers, whether or not the origin honours it). Raises MalformedXML if `result` is no
    DeleteResult."""
    root = _strict_tree(result)
    if _name(root) != "DeleteResult":
        raise _malformed()
    entries = []
    for entry in root:
        if quiet and _name(entry) == "Deleted":
            continue
        fields = "".join(f"<{_name(f)}>{_text(f.text or '')}</{_name(f)}>" for f in entry)
        entries.append(f"<{_name(entry)}>{fields}</{_name(entry)}>")
    return _result(entries + _denied(denied))


def xml_text(body: bytes, tag: str) -> str:
    """The text of the first element named `tag` (any namespace), or ""."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return ""
    for element in root.iter():
        if element.tag.rsplit("}", 1)[-1] == tag:
            return element.text or ""
    return ""


# -- helpers ------------------------------------------------------------------------------


class _Refused(Exception):
    """A document type declaration: refused before its internal subset is even read."""


def _refuse(*_: object) -> None:
    raise _Refused()


def _strict_tree(body: bytes) -> ET.Element:
    """Parse with expat, refusing any DOCTYPE (no DTD, no entity declarations, nothing
    fetched); undefined entities are then parse errors. Raises MalformedXML."""
    builder = ET.TreeBuilder()
    parser = expat.ParserCreate(namespace_separator="}")
    parser.StartDoctypeDeclHandler = _refuse
    parser.EntityDeclHandler = _refuse
    parser.StartElementHandler = lambda tag, attrs: builder.start(_clark(tag), attrs)
    parser.EndElementHandler = lambda tag: builder.end(_clark(tag))
    parser.CharacterDataHandler = builder.data
    try:
        parser.Parse(body, True)
    except (expat.ExpatError, _Refused, ValueError) as exc:
        raise _malformed() from exc
    return builder.close()


def _clark(tag: str) -> str:
    # expat gives "namespace}local"; ElementTree spells it "{namespace}local".
    return "{" + tag if "}" in tag else tag


def _name(element: ET.Element) -> str:
    """The local name of an element in the S3 namespace or none; "" for any other."""
    namespace, _, local = element.tag.rpartition("}")
    return local if namespace in ("", "{" + S3_NS) else ""


def _entry(element: ET.Element) -> DeleteEntry:
    fields: dict[str, str] = {}
    for child in element:
        _require_bare(child)
        name = _name(child)
        if name not in ("Key", "VersionId") or name in fields or len(child):
            raise _malformed()
        fields[name] = child.text or ""
    if not fields.get("Key") or fields.get("VersionId") == "":
        raise _malformed()
    return DeleteEntry(fields["Key"], fields.get("VersionId", ""))


def _boolean(element: ET.Element) -> bool:
    value = (element.text or "").strip().lower()
    if value not in ("true", "false") or len(element):
        raise _malformed()
    return value == "true"


def _require_bare(element: ET.Element) -> None:
    """No attributes, and no text between it and its next sibling."""
    if element.attrib or _has_text(element.tail):
        raise _malformed()
    if len(element) and _has_text(element.text):
        raise _malformed()


def _has_text(text: str | None) -> bool:
    return bool(text and text.strip())


def _text(value: str) -> str:
    return escape(value, _TEXT_ENTITIES)


def _denied(entries: Iterable[DeleteEntry]) -> list[str]:
    return [
        f"<Error>{entry.fields()}<Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
        for entry in entries
    ]


def _result(entries: list[str]) -> bytes:
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<DeleteResult xmlns="{S3_NS}">'
        f"{''.join(entries)}</DeleteResult>"
    ).encode()


def _malformed() -> S3Error:
    return S3Error(
        "MalformedXML",
        "The XML you provided was not well-formed or did not validate against our "
        "published schema.",
    )
