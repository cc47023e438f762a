"""Where a staged object is: a :class:`Location`, named by a string any node can parse.

``s3://REGION/BUCKET/KEY`` for bucket staging, ``file://NODE/PATH`` for local disk.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Location:
    """Where a staged object's bytes are."""

    scheme: str  # "s3" or "file"
    region_or_node: str
    bucket: str  # "" for file
    key: str  # staging key, or absolute path for file

    def __str__(self) -> str:
        if self.scheme == "s3":
            return f"s3://{self.region_or_node}/{self.bucket}/{self.key}"
        return f"file://{self.region_or_node}{self.key}"

    @classmethod
    def parse(cls, text: str) -> Location:
        scheme, _, rest = text.partition("://")
        if scheme == "s3":
            region, bucket, key = rest.split("/", 2)
            return cls("s3", region, bucket, key)
        if scheme == "file":
            node, slash, path = rest.partition("/")
            return cls("file", node, "", slash + path)
        raise ValueError(f"not a staging location: {text!r}")

    @property
    def name(self) -> str:
        """What the catalog names this copy by: the staging key, or the whole file URL
        (its ``staging_key`` or ``local_path``)."""
        return self.key if self.scheme == "s3" else str(self)
