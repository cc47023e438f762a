"""Multipart uploads as S3 words them: part lists in and out, the ETag of the whole. No I/O.

Accelerated uploads (:mod:`lota.regions.uploads`) stage part for part, in a bucket or on
disk; these are the rules and documents both share:

* :func:`parse_complete`: the client's CompleteMultipartUpload list, checked as S3 does
  (MalformedXML, InvalidPartOrder).
* :func:`multipart_etag`: MD5 of the parts' MD5s, ``-N``: the ETag S3 gives the object.
* :func:`parse_parts` / :func:`list_parts_result`: a ListParts answer read from staging,
  and written back to the client under its own bucket, key and upload id.
* :func:`list_uploads_result`: ListMultipartUploads from the uploads the catalog knows.
"""

from __future__ import annotations

import hashlib
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape

from lota.errors import OriginError
from lota.s3.errors import S3Error
from lota.s3.xml import S3_NS

MIN_PART_SIZE = 5 * 1024 * 1024  # every part but the last, as S3 insists
MAX_PARTS = 10_000


@dataclass(frozen=True, slots=True)
class Part:
    """One uploaded part, as ListParts shows it."""

    number: int
    etag: str
    """With its quotes."""
    size: int
    modified: str
    """ISO 8601, as S3's XML has it."""


@dataclass(frozen=True, slots=True)
class PartsPage:
    parts: list[Part]
    truncated: bool
    next_marker: int


@dataclass(frozen=True, slots=True)
class Upload:
    """One upload in progress, as ListMultipartUploads shows it."""

    key: str
    upload_id: str
    initiated: str
    """ISO 8601."""


def _name(element: ET.Element) -> str:
    return element.tag.rsplit("}", 1)[-1]


def _children(element: ET.Element, name: str) -> list[ET.Element]:
    return [child for child in element if _name(child) == name]


def _text(element: ET.Element, name: str) -> str:
    found = _children(element, name)
    return (found[0].text or "") if found else ""


def parse_complete(body: bytes) -> list[tuple[int, str]]:
    """(part number, ETag with quotes) of each part a CompleteMultipartUpload names."""
    try:
        root = ET.fromstring(body)
        chosen = [
            (int(_text(part, "PartNumber")), '"' + _text(part, "ETag").strip().strip('"') + '"')
            for part in _children(root, "Part")
        ]
    except (ET.ParseError, ValueError) as exc:
        raise S3Error("MalformedXML") from exc
    if _name(root) != "CompleteMultipartUpload" or not chosen:
        raise S3Error("MalformedXML")
    numbers = [number for number, _ in chosen]
    if numbers != sorted(set(numbers)) or not 1 <= numbers[0] <= numbers[-1] <= MAX_PARTS:
        raise S3Error("InvalidPartOrder", "The list of parts was not in ascending order.")
    return chosen


def check_parts(chosen: Sequence[tuple[int, str]], uploaded: dict[int, Part]) -> list[int]:
    """The sizes of the `chosen` parts, which must be `uploaded` with their ETag, each but
    the last at least 5 MiB (InvalidPart, EntityTooSmall as S3 answers)."""
    sizes = []
    for number, etag in chosen:
        part = uploaded.get(number)
        if part is None or part.etag != etag:
            raise S3Error(
                "InvalidPart",
                "One or more of the specified parts could not be found. The part may not have"
                " been uploaded, or the specified entity tag may not match the part's entity tag.",
            )
        sizes.append(part.size)
    if any(size < MIN_PART_SIZE for size in sizes[:-1]):
        raise S3Error("EntityTooSmall", "Your proposed upload is smaller than the minimum allowed")
    return sizes


def multipart_etag(part_etags: Sequence[str]) -> str:
    """The ETag S3 gives an object made of parts with these ETags (unquoted)."""
    digest = hashlib.md5(usedforsecurity=False)
    for etag in part_etags:
        digest.update(bytes.fromhex(etag.strip('"')))
    return f"{digest.hexdigest()}-{len(part_etags)}"


def parse_parts(body: bytes) -> PartsPage:
    """A ListParts answer (from a staging bucket)."""
    try:
        root = ET.fromstring(body)
        parts = [
            Part(
                int(_text(p, "PartNumber")),
                _text(p, "ETag"),
                int(_text(p, "Size")),
                _text(p, "LastModified"),
            )
            for p in _children(root, "Part")
        ]
        following = _text(root, "NextPartNumberMarker")
        marker = int(following) if following else (parts[-1].number if parts else 0)
    except (ET.ParseError, ValueError) as exc:
        raise OriginError(f"unreadable ListParts answer from staging: {body[:200]!r}") from exc
    return PartsPage(parts, _text(root, "IsTruncated") == "true", marker)


def list_parts_result(
    bucket: str, key: str, upload_id: str, page: PartsPage, marker: int, limit: int
) -> bytes:
    """ListPartsResult for the client, under its own bucket, key and upload id."""
    parts = "".join(
        f"<Part><PartNumber>{p.number}</PartNumber><LastModified>{p.modified}</LastModified>"
        f"<ETag>{escape(p.etag)}</ETag><Size>{p.size}</Size></Part>"
        for p in page.parts
    )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n<ListPartsResult xmlns="{S3_NS}">'
        f"<Bucket>{escape(bucket)}</Bucket><Key>{escape(key)}</Key>"
        f"<UploadId>{escape(upload_id)}</UploadId><StorageClass>STANDARD</StorageClass>"
        f"<PartNumberMarker>{marker}</PartNumberMarker>"
        f"<NextPartNumberMarker>{page.next_marker}</NextPartNumberMarker>"
        f"<MaxParts>{limit}</MaxParts><IsTruncated>{str(page.truncated).lower()}</IsTruncated>"
        f"{parts}</ListPartsResult>"
    ).encode()


def list_uploads_result(
    bucket: str, prefix: str, uploads: Sequence[Upload], truncated: bool, limit: int
) -> bytes:
    """ListMultipartUploadsResult for `uploads` (in key order)."""
    entries = "".join(
        f"<Upload><Key>{escape(u.key)}</Key><UploadId>{escape(u.upload_id)}</UploadId>"
        f"<StorageClass>STANDARD</StorageClass><Initiated>{u.initiated}</Initiated></Upload>"
        for u in uploads
    )
    following = ""
    if truncated and uploads:
        following = (
            f"<NextKeyMarker>{escape(uploads[-1].key)}</NextKeyMarker>"
            f"<NextUploadIdMarker>{escape(uploads[-1].upload_id)}</NextUploadIdMarker>"
        )
    return (
        f'<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<ListMultipartUploadsResult xmlns="{S3_NS}"><Bucket>{escape(bucket)}</Bucket>'
        f"<Prefix>{escape(prefix)}</Prefix>{following}<MaxUploads>{limit}</MaxUploads>"
        f"<IsTruncated>{str(truncated).lower()}</IsTruncated>{entries}"
        "</ListMultipartUploadsResult>"
    ).encode()


def parse_uploads(body: bytes) -> tuple[list[Upload], bool]:
    """A ListMultipartUploads answer (from an origin): its uploads, and whether there are
    more."""
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        raise OriginError(f"unreadable ListMultipartUploads answer: {body[:200]!r}") from exc
    uploads = [
        Upload(_text(u, "Key"), _text(u, "UploadId"), _text(u, "Initiated"))
        for u in _children(root, "Upload")
    ]
    return uploads, _text(root, "IsTruncated") == "true"
