"""The few S3 XML documents LOTA reads itself. No I/O."""

from __future__ import annotations

import xml.etree.ElementTree as ET


def deleted_keys(body: bytes) -> list[str]:
    """The keys named in a DeleteObjects request body (``<Delete><Object><Key>``)."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return []
    return [
        element.text or "" for element in root.iter() if element.tag.rsplit("}", 1)[-1] == "Key"
    ]
