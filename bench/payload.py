"""Large benchmark payloads that never sit in memory whole.

:class:`PatternReader` is a read-only file-like object producing ``size`` bytes of a
deterministic pattern (a pseudo-random 1 MiB block, each copy stamped with the object's
seed and its block number, so misplaced or repeated blocks change the hash). boto3's
``upload_fileobj`` streams from it in parts; :func:`expected_digest` gives the digest a
correct download must have; :func:`drain` hashes a streaming body without keeping it.
"""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterable
from typing import Any

import xxhash

BLOCK = 1024 * 1024
_STAMP = struct.Struct("<QQ")

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


def parse_size(text: str) -> int:
    """``"1GiB"``, ``"64KiB"``, ``"4MiB"`` or a plain byte count."""
    units = {"GiB": GiB, "MiB": MiB, "KiB": KiB, "G": GiB, "M": MiB, "K": KiB, "B": 1}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(text)


def human(size: int) -> str:
    for unit, factor in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if size >= factor:
            whole = size % factor == 0
            return f"{size // factor} {unit}" if whole else f"{size / factor:.2f} {unit}"
    return f"{size} B"


class PatternReader:
    """A non-seekable file-like object of ``size`` patterned bytes (hashes what it hands out)."""

    def __init__(self, seed: int, size: int) -> None:
        self.seed = seed
        self.size = size
        self.pos = 0
        self.digest = xxhash.xxh3_128()
        self._base = random.Random(seed).randbytes(BLOCK)

    def _block(self, index: int) -> bytes:
        return _STAMP.pack(self.seed, index) + self._base[_STAMP.size :]

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        pieces = []
        while self.pos < end:
            index, offset = divmod(self.pos, BLOCK)
            take = min(BLOCK - offset, end - self.pos)
            pieces.append(self._block(index)[offset : offset + take])
            self.pos += take
        data = b"".join(pieces)
        self.digest.update(data)
        return data

    def readable(self) -> bool:
        return True


def expected_digest(seed: int, size: int) -> str:
    reader = PatternReader(seed, size)
    while reader.read(8 * MiB):
        pass
    return reader.digest.hexdigest()


def drain(chunks: Iterable[bytes]) -> tuple[int, str]:
    """Consume a streaming body; return (bytes seen, digest)."""
    digest = xxhash.xxh3_128()
    count = 0
    for chunk in chunks:
        digest.update(chunk)
        count += len(chunk)
    return count, digest.hexdigest()


def get_and_hash(s3: Any, bucket: str, key: str) -> tuple[int, str, str]:
    """GET an object streaming; return (bytes, digest, x-lota-cache)."""
    got = s3.get_object(Bucket=bucket, Key=key)
    source = got["ResponseMetadata"]["HTTPHeaders"].get("x-lota-cache", "-")
    count, digest = drain(got["Body"].iter_chunks(BLOCK))
    return count, digest, source


def load_average() -> str:
    """The 1-minute load average and core count: this machine is shared, say how busy it was."""
    return f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
