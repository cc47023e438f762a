"""Local-disk staging (``write.staging = "local-disk"``): accelerated writes wait in a
directory of this node; as durable as that one disk, and readable only here.

A staged object is one file, whole or absent: written to a temp name, fsynced, renamed,
its directories fsynced. A multipart upload keeps its parts as files of an upload
directory (``lota-uploads/UPLOAD/NUMBER.MD5``, the MD5 being the part's ETag) and its
completion joins the chosen parts into the object's file, checked as S3 checks them.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from lota.regions.location import Location
from lota.regions.multipart import (
    Part,
    PartsPage,
    check_parts,
    multipart_etag,
    parse_complete,
)
from lota.s3.errors import S3Error
from lota.threads import run_in_thread

READ_SIZE = 256 * 1024
UPLOADS = "lota-uploads"


def _no_such_upload() -> S3Error:
    return S3Error(
        "NoSuchUpload",
        "The specified upload does not exist. The upload ID may be invalid, or the upload"
        " may have been aborted or completed.",
    )


class DiskArea:
    """The staging directory of this node."""

    def __init__(self, node: str, directory: str, prefix: str) -> None:
        self._node = node
        self._dir = Path(directory)
        self._prefix = prefix
        self.where = f"staging directory {directory} of node {node}"

    def path(self, key: str) -> str:
        return str(self._file(key))

    def _file(self, key: str) -> Path:
        """The file of staging key `key`, which never leads out of the directory."""
        if not key or key.startswith("/") or ".." in Path(key).parts:
            raise _no_such_upload()
        return self._dir / key

    def location(self, key: str) -> Location:
        return Location("file", self._node, "", self.path(key) if key else f"{self._dir}/")

    async def put(self, key: str, body: AsyncIterator[bytes], length: int) -> None:
        await write_file(self._file(key), body)

    async def read(self, path: str, first: int, last: int | None) -> AsyncIterator[bytes]:
        async for piece in _read_file(Path(path), first, last):
            yield piece

    async def delete(self, path: str) -> None:
        await asyncio.to_thread(_unlink, Path(path))

    # -- multipart uploads ---------------------------------------------------------------

    def _upload_dir(self, upload: str) -> Path:
        if not upload.isalnum():
            raise _no_such_upload()
        return self._dir / UPLOADS / upload

    async def create_multipart(self, key: str) -> str:
        upload = uuid.uuid4().hex
        await asyncio.to_thread(_make_dirs, self._upload_dir(upload))
        return upload

    async def upload_part(
        self,
        key: str,
        upload: str,
        number: int,
        body: AsyncIterator[bytes],
        length: int,
        md5: Callable[[], str],
    ) -> None:
        directory = self._upload_dir(upload)
        if not await asyncio.to_thread(directory.is_dir):
            raise _no_such_upload()
        temp = directory / f"{number}.{uuid.uuid4().hex}.part"
        await write_file(temp, body)
        await asyncio.to_thread(_replace_part, directory, temp, f"{number}.{md5()}")

    async def list_parts(
        self, key: str, upload: str, marker: int = 0, limit: int = 1000
    ) -> PartsPage:
        parts = sorted((await self._parts(upload)).values(), key=lambda p: p.number)
        after = [p for p in parts if p.number > marker]
        page = after[:limit]
        return PartsPage(page, len(after) > limit, page[-1].number if page else 0)

    async def _parts(self, upload: str) -> dict[int, Part]:
        directory = self._upload_dir(upload)
        found = await asyncio.to_thread(_scan_parts, directory)
        if found is None:
            raise _no_such_upload()
        return found

    async def complete_multipart(self, key: str, upload: str, body: bytes) -> tuple[str, list[int]]:
        chosen = parse_complete(body)
        sizes = check_parts(chosen, await self._parts(upload))
        directory = self._upload_dir(upload)
        files = [directory / f"{number}.{etag.strip(chr(34))}" for number, etag in chosen]
        await write_file(self._file(key), _joined(files))
        await asyncio.to_thread(shutil.rmtree, directory, True)
        return multipart_etag([etag for _, etag in chosen]), sizes

    async def abort_multipart(self, key: str, upload: str) -> None:
        directory = self._upload_dir(upload)
        if not await asyncio.to_thread(directory.is_dir):
            raise _no_such_upload()
        await asyncio.to_thread(shutil.rmtree, directory, True)

    # -- the orphan sweep and the start-up check -------------------------------------------

    async def entries(self, after: str, limit: int) -> tuple[list[tuple[str, float]], str]:
        found = await asyncio.to_thread(_staged_files, self._dir, self._prefix, after, limit + 1)
        return found[:limit], found[limit - 1][0] if len(found) > limit else ""

    async def check(self, create: bool) -> str:
        probe = self._dir / self._prefix / ".lota-probe"

        async def nothing() -> AsyncIterator[bytes]:
            yield b""

        try:
            await write_file(probe, nothing())
            await asyncio.to_thread(_unlink, probe)
        except OSError as exc:
            return f"{self.where} cannot be written: {exc.strerror or exc}"
        return ""


def _scan_parts(directory: Path) -> dict[int, Part] | None:
    if not directory.is_dir():
        return None
    found: dict[int, Part] = {}
    for entry in os.scandir(directory):
        number, _, md5 = entry.name.partition(".")
        if number.isdigit() and md5.isalnum() and not entry.name.endswith(".part"):
            stat = entry.stat()
            modified = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(stat.st_mtime))
            found[int(number)] = Part(int(number), f'"{md5}"', stat.st_size, modified)
    return found


def _replace_part(directory: Path, temp: Path, name: str) -> None:
    """The part just written becomes the part of its number (an earlier one goes)."""
    number = name.partition(".")[0]
    os.rename(temp, directory / name)
    for entry in os.scandir(directory):
        same = entry.name.partition(".")[0] == number and entry.name != name
        if same and not entry.name.endswith(".part"):
            _unlink(Path(entry.path))
    _fsync_dir(directory)


def _staged_files(root: Path, prefix: str, after: str, limit: int) -> list[tuple[str, float]]:
    """Staged files under `root`/`prefix` (keys relative to `root`) after `after`, in
    order, at most `limit`; temp files are not staged objects yet."""
    found = []
    for directory, _, names in os.walk(root / prefix):
        for name in names:
            path = Path(directory) / name
            key = str(path.relative_to(root))
            if key > after and not name.endswith(".tmp"):
                found.append((key, path.stat().st_mtime))
    return sorted(found)[:limit]


async def _joined(files: list[Path]) -> AsyncIterator[bytes]:
    for path in files:
        async for piece in _read_file(path, 0, None):
            yield piece


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _unlink(path: Path) -> None:
    path.unlink(missing_ok=True)


async def write_file(path: Path, body: AsyncIterator[bytes]) -> None:
    """Write to a temp file, fsync, rename, fsync the directories: the staged file is whole
    or absent, and once this returns (the write is acknowledged) it survives power loss."""
    created = await asyncio.to_thread(_make_dirs, path.parent)
    # A temp name of its own: two writes of one path (a retried completion racing the
    # first) must not write into each other's file; the last rename wins, whole.
    temp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.tmp")
    # run_in_thread: a cancelled caller waits for the call to end, since it closes the
    # descriptor the call writes to (a number closed under a running write may be another
    # file's by then); on_orphan gets the descriptor the caller missed.
    fd = await run_in_thread(
        os.open, temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600, on_orphan=os.close
    )
    try:
        async for piece in body:
            await run_in_thread(_write_all, fd, piece)
        await run_in_thread(os.fsync, fd)
    except BaseException:
        os.close(fd)
        await asyncio.to_thread(_unlink, temp)
        raise
    os.close(fd)
    await asyncio.to_thread(os.rename, temp, path)
    for directory in (path.parent, *(d.parent for d in created)):
        await asyncio.to_thread(_fsync_dir, directory)


def _make_dirs(directory: Path) -> list[Path]:
    """mkdir -p; returns the directories it created, outermost first."""
    missing = [d for d in (directory, *directory.parents) if not d.exists()][::-1]
    directory.mkdir(parents=True, exist_ok=True)
    return missing


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _read_file(path: Path, first: int, last: int | None) -> AsyncIterator[bytes]:
    fd = await asyncio.to_thread(os.open, path, os.O_RDONLY)
    try:
        end = (os.fstat(fd).st_size - 1) if last is None else last
        offset = first
        while offset <= end:
            piece = await asyncio.to_thread(os.pread, fd, min(READ_SIZE, end - offset + 1), offset)
            if not piece:
                break
            offset += len(piece)
            yield piece
    finally:
        os.close(fd)
