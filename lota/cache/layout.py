"""Where chunk bytes live on disk, and how much disk they take: pure functions, no I/O.

A chunk of object *stem* with number *index* lives at
``<dir>/chunks/<stem[0:2]>/<stem[2:4]>/<stem>.<index>``. The stem is an xxh3-128 hex
digest of ``bucket\\0key\\0etag\\0version_id\\0salt`` with a random per-admission salt, so:

- no byte of an object key ever reaches a path (``../../etc/x`` is just hashed);
- every admission of an object gets new file names, so deleting the files of a replaced or
  invalidated entry can never race with the files of its successor, even when the
  successor has the same ETag (an identical re-upload).

A fill writes ``<stem>.<index>.<token>.tmp`` in the same directory and renames it to the
final name, so a final name only ever holds complete bytes.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Sequence

import xxhash

BLOCK = 4096
"""Disk allocation unit assumed for accounting: files are charged in whole 4 KiB blocks."""

DIR_BYTES = 4096
"""What one directory adds to ``du -sb`` on ext4/xfs (its own size while it holds few entries)."""

_FINAL = re.compile(r"([0-9a-f]{32})\.(\d{1,9})")
STEM = re.compile(r"[0-9a-f]{32}")


def new_stem(bucket: str, key: str, etag: str, version_id: str) -> str:
    """A fresh file stem for one admission of an object (see the module docstring)."""
    h = xxhash.xxh3_128()
    for part in (bucket, key, etag, version_id):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    h.update(secrets.token_bytes(16))
    return h.hexdigest()


def subdir(root: str, stem: str) -> str:
    """Where the chunks of stem `stem` are, under cache dir `root` (absolute, as the store
    holds its dirs). Joined by hand: a reopened chunk computes its path on every hit."""
    return f"{root.rstrip('/')}/chunks/{stem[0:2]}/{stem[2:4]}"


def chunk_path(root: str, stem: str, index: int) -> str:
    return f"{subdir(root, stem)}/{stem}.{index}"


def temp_name(stem: str, index: int) -> str:
    return f"{stem}.{index}.{secrets.token_hex(4)}.tmp"


def parse_final(name: str) -> tuple[str, int] | None:
    """``"<stem>.<index>"`` -> (stem, index); anything else (temp files included) -> None."""
    match = _FINAL.fullmatch(name)
    return (match.group(1), int(match.group(2))) if match else None


def is_temp(name: str) -> bool:
    return name.endswith(".tmp")


def blocks(length: int) -> int:
    """Bytes a file of `length` bytes is charged: rounded up to whole blocks."""
    return -(-length // BLOCK) * BLOCK


def chunk_count(size: int, chunk_size: int) -> int:
    return -(-size // chunk_size)


def chunk_length(size: int, chunk_size: int, index: int) -> int:
    """Chunk `index` covers ``[index*cs, min((index+1)*cs, size))``."""
    return max(0, min(chunk_size, size - index * chunk_size))


def rank_dirs(stem: str, index: int, dirs: Sequence[int]) -> list[int]:
    """Rendezvous (highest random weight) order of `dirs` for one chunk.

    Spreads chunks evenly, and when a directory drops out only its own chunks move.
    """
    name = f"{stem}.{index}/".encode()
    return sorted(
        dirs, key=lambda d: xxhash.xxh3_64_intdigest(name + str(d).encode()), reverse=True
    )
