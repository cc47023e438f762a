"""Range header arithmetic for GetObject (RFC 9110 section 14, as S3 implements it). No I/O.

S3 serves one range per request: ``bytes=a-b``, ``bytes=a-`` and ``bytes=-n``. LOTA
refuses a Range header it cannot read with 416 InvalidRange rather than silently sending
the whole object, which a client asking for a footer would not expect.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lota.s3.errors import S3Error

_RANGE_RE = re.compile(r"bytes=(\d{0,19})-(\d{0,19})")


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


def parse_range(header: str) -> ByteRange:
    """Parse a Range header value; raise 416 InvalidRange when it is not one S3 accepts."""
    match = _RANGE_RE.fullmatch(header.strip().replace(" ", ""))
    if not match or match.group(1) == match.group(2) == "":
        raise S3Error(
            "InvalidRange", "The requested range is not valid.", extra={"RangeRequested": header}
        )
    first, last = match.group(1), match.group(2)
    if first == "":
        return ByteRange(None, None, suffix=int(last))
    start = int(first)
    end = int(last) if last else None
    if end is not None and end < start:
        raise S3Error(
            "InvalidRange", "The requested range is not valid.", extra={"RangeRequested": header}
        )
    return ByteRange(start, end)


def content_range(first: int, last: int, size: int) -> str:
    return f"bytes {first}-{last}/{size}"


def invalid_range(size: int) -> S3Error:
    return S3Error(
        "InvalidRange",
        "The requested range is not satisfiable",
        extra={"ActualObjectSize": str(size)},
    )
