"""Local-disk staging of accelerated writes: a file is whole or absent, whatever stops it."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from lota.regions import staging_disk as staging


async def test_a_cancelled_write_closes_its_file_only_after_the_write_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stop cancels a PUT while a thread is writing its body. Closing the descriptor
    under that write would let the rest of it land in whatever file takes the number."""
    halfway, go_on, written = threading.Event(), threading.Event(), threading.Event()

    def write_in_two(fd: int, data: bytes) -> None:  # a write the kernel cut in two
        os.write(fd, data[: len(data) // 2])
        halfway.set()
        go_on.wait(10)
        os.write(fd, data[len(data) // 2 :])
        written.set()

    monkeypatch.setattr(staging, "_write_all", write_in_two)

    async def body() -> AsyncIterator[bytes]:
        yield b"A" * 8 + b"B" * 8

    staged = tmp_path / "bucket" / "staged"
    task = asyncio.create_task(staging.write_file(staged, body()))
    await asyncio.to_thread(halfway.wait, 10)
    task.cancel()
    await asyncio.sleep(0.05)
    other = os.open(tmp_path / "other", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        go_on.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.to_thread(written.wait, 10)
    finally:
        os.close(other)
    assert (tmp_path / "other").read_bytes() == b""
    assert list(staged.parent.iterdir()) == []


async def test_two_writes_of_one_path_at_once_leave_one_of_them_whole(tmp_path: Path) -> None:
    """A completion retried while the first is still joining the parts writes the same
    staged file: each write has its own temp file, and the last rename wins, whole."""

    async def body(letter: bytes) -> AsyncIterator[bytes]:
        for _ in range(20):
            yield letter * 1000
            await asyncio.sleep(0.001)

    staged = tmp_path / "bucket" / "staged"
    await asyncio.gather(
        staging.write_file(staged, body(b"A")), staging.write_file(staged, body(b"B"))
    )
    assert staged.read_bytes() in (b"A" * 20_000, b"B" * 20_000)
    assert [p.name for p in staged.parent.iterdir()] == ["staged"]  # no temp file left
