"""The few S3 XML documents LOTA reads itself. No I/O."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from xml.sax.saxutils import escape


def deleted_keys(body: bytes) -> list[str]:
    """The keys named in a DeleteObjects request body (``<Delete><Object><Key>``)."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return []
    return [
        element.text or "" for element in root.iter() if element.tag.rsplit("}", 1)[-1] == "Key"
    ]


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


def delete_result(keys: list[str]) -> bytes:
    """A DeleteObjects answer reporting `keys` deleted."""
    deleted = "".join(f"<Deleted><Key>{escape(k)}</Key></Deleted>" for k in keys)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{deleted}</DeleteResult>'
    ).encode()
