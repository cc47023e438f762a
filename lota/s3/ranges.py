"""Range header arithmetic for GetObject (RFC 9110 section 14, as S3 implements it). No I/O.

S3 serves one range per request: ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n``. A Range
header it cannot read (``bytes=5-2``, ``bytes=a-b``, several ranges) it ignores, as RFC
9110 allows, and answers 200 with the whole object; so does LOTA, since clients rely on
what S3 does. A range that reads but starts past the end is 416 InvalidRange.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lota.s3.errors import S3Error

_RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)")
# Positions past any object's size (S3's limit is 5 TiB) stay this, not a huge integer.
_FAR = 2**63


@dataclass(frozen=True, slots=True)
class ByteRange:
    """One requested range; ``start is None`` means a suffix of ``suffix`` bytes."""

    start: int | None
    end: int | None
    suffix: int = 0

    def resolve(self, size: int) -> tuple[int, int]:
        """The inclusive ``(first, last)`` byte positions within an object of `size` bytes."""
        if self.start is None:
            if self.suffix == 0 or size == 0:
                raise invalid_range(size)
            return max(0, size - self.suffix), size - 1
        if self.start >= size:
            raise invalid_range(size)
        last = size - 1 if self.end is None else min(self.end, size - 1)
        return self.start, last


def parse_range(header: str) -> ByteRange | None:
    """The range a Range header asks for; None when S3 would ignore the header."""
    match = _RANGE_RE.fullmatch(header.strip().replace(" ", ""))
    if not match or match.group(1) == match.group(2) == "":
        return None
    first, last = match.group(1), match.group(2)
    if first == "":
        return ByteRange(None, None, suffix=_position(last))
    start = _position(first)
    end = _position(last) if last else None
    if end is not None and end < start:
        return None
    return ByteRange(start, end)


def _position(digits: str) -> int:
    return int(digits) if len(digits) < 19 else _FAR


def content_range(first: int, last: int, size: int) -> str:
    return f"bytes {first}-{last}/{size}"


def invalid_range(size: int) -> S3Error:
    return S3Error(
        "InvalidRange",
        "The requested range is not satisfiable",
        extra={"ActualObjectSize": str(size)},
    )
