"""The chunk store on real files: fills, hits, identity, verification, budget, disk errors."""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import os
import random
import resource
import socket
import subprocess
import threading
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from lota import zerocopy
from lota.cache import layout
from lota.cache.files import LOCK_NAME, ChunkFiles
from lota.cache.index import Index
from lota.cache.layout import (
    blocks,
    chunk_count,
    chunk_length,
    chunk_path,
    new_stem,
    parse_final,
    rank_dirs,
)
from lota.cache.store import (
    CacheDirInUse,
    CachedObject,
    CacheError,
    CacheStore,
    CacheWriteError,
    ObjectMeta,
    fdcache,
)
from lota.cache.store import (
    reader as chunk_reader,
)
from lota.cache.store import (
    table as chunk_table,
)
from lota.cache.store.entries import chunk_id, fingerprint
from lota.cache.store.reader import WARM_FOR
from lota.clock import FakeClock
from lota.zerocopy import FileSpan

CS = 64 * 1024
MiB = 1024 * 1024
MakeStore = Callable[..., Awaitable[CacheStore]]


def meta(key: str = "k", etag: str = '"e1"', size: int = 3 * CS + 100, **kw: Any) -> ObjectMeta:
    return ObjectMeta(
        bucket=kw.pop("bucket", "b"),
        key=key,
        etag=etag,
        size=size,
        last_modified="Wed, 02 Dec 2026 10:00:00 GMT",
        headers=(("content-type", "application/octet-stream"), ("x-amz-meta-a", "1")),
        **kw,
    )


def content(m: ObjectMeta, index: int) -> bytes:
    length = max(0, min(CS, m.size - index * CS))
    return random.Random(f"{m.key}/{m.etag}/{index}").randbytes(length)


async def fill(store: CacheStore, obj: CachedObject, index: int, piece: int = 10_000) -> None:
    writer = await store.begin_chunk(obj, index)
    assert writer is not None
    data = content(obj.meta, index)
    for start in range(0, len(data), piece):
        await writer.write(data[start : start + piece])
    await writer.commit()


async def fill_all(store: CacheStore, obj: CachedObject) -> None:
    for index in range(obj.chunk_count(CS)):
        await fill(store, obj, index)


async def read(store: CacheStore, obj: CachedObject, index: int) -> bytes | None:
    reader = await store.open_chunk(obj, index)
    if reader is None:
        return None
    try:
        return os.pread(reader.fd, reader.length + 1, 0)
    finally:
        reader.close()


def files_under(*roots: Path) -> list[Path]:
    """The cache's files: chunks, temp files, the index (not the dirs' lock files)."""
    return sorted(
        p for root in roots for p in root.rglob("*") if p.is_file() and p.name != LOCK_NAME
    )


def du(*roots: Path) -> int:
    """What ``du -sb`` reports: apparent sizes of every file and directory."""
    return sum(p.lstat().st_size for root in roots for p in [root, *root.rglob("*")] if p.exists())


def flip_byte(path: str, offset: int = 100) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


class FaultyFiles(ChunkFiles):
    """Real file operations, except that fills in `failing` dirs hit ENOSPC (or `error`)."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: set[str] = set()
        self.fail_create = False
        self.error = errno.ENOSPC
        self.gate: threading.Event | None = None
        self._fds: dict[int, str] = {}

    def create(self, directory: str, name: str) -> tuple[int, int]:
        if self.fail_create and self._in_failing(directory):
            raise OSError(self.error, os.strerror(self.error), directory)
        fd, made = super().create(directory, name)
        self._fds[fd] = directory
        return fd, made

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        if self._in_failing(self._fds.get(fd, "")):
            raise OSError(self.error, os.strerror(self.error))
        super().write(fd, data)

    def _in_failing(self, path: str) -> bool:
        return any(path.startswith(root + os.sep) for root in self.failing)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / "nvme0", tmp_path / "nvme1"]


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """Mount real tmpfs file systems of a given size ("4m"), to fill up for real; they are
    unmounted at the end. Ask for it before ``make_store``, so stores close first."""
    mounts: list[Path] = []

    def mount(size: str) -> Path:
        path = tmp_path / f"tmpfs{len(mounts)}"
        path.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], check=True)
        mounts.append(path)
        return path

    yield mount
    for path in mounts:
        subprocess.run(["umount", "-l", path], check=False)


@pytest.fixture
async def make_store(dirs: list[Path], clock: FakeClock) -> AsyncIterator[MakeStore]:
    stores: list[CacheStore] = []

    async def make(**kw: Any) -> CacheStore:
        kw.setdefault("scrub_interval", 0)
        kw.setdefault("sweep_delay", 3600)
        store = CacheStore(
            [str(d) for d in kw.pop("dirs", dirs)], kw.pop("size", 64 * CS), CS, clock=clock, **kw
        )
        await store.open()
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


# Fills and hits


async def test_filled_chunks_read_back_exactly(make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    await fill_all(store, obj)
    for index in range(4):
        assert store.has_chunk(obj, index)
        assert await read(store, obj, index) == content(obj.meta, index)
    stats = store.stats()
    assert (stats["fills"], stats["hits"], stats["chunks"], stats["reserved_bytes"]) == (4, 4, 4, 0)


async def test_a_chunk_is_counted_under_its_id_on_every_path(make_store: MakeStore) -> None:
    """The admission rule counts a cached chunk's hits by `fingerprint` and a fill's reads
    by `chunk_id`: the same number, or a chunk read both ways would count as two."""
    store = await make_store()
    obj = await store.admit(meta())
    await fill_all(store, obj)
    before = [fingerprint(obj.chunks[index]) for index in range(4)]
    assert before == [chunk_id(obj, index) for index in range(4)]
    # Adopted under another name (a write come home), its chunks are counted under it.
    assert store.adopt(obj, meta(key="home")) is obj
    after = [fingerprint(obj.chunks[index]) for index in range(4)]
    assert after == [chunk_id(obj, index) for index in range(4)]
    assert not set(before) & set(after)


async def test_reopened_store_serves_the_same_chunks_and_metadata(make_store: MakeStore) -> None:
    store = await make_store()
    m = meta(version_id="v1", validated_at=123.5, parts=((1, 0, CS - 1), (2, CS, 3 * CS + 99)))
    obj = await store.admit(m)
    await fill_all(store, obj)
    await store.close()

    store = await make_store()
    again = store.lookup("b", "k")
    assert again is not None
    assert again.meta == m
    assert [await read(store, again, i) for i in range(4)] == [content(m, i) for i in range(4)]
    assert store.stats()["verified"] == 4  # after-restart: each chunk's first read checked it
    await read(store, again, 0)
    assert store.stats()["verified"] == 4


async def test_object_keys_never_reach_file_names(make_store: MakeStore, dirs: list[Path]) -> None:
    store = await make_store()
    for key in ("../../etc/passwd", "/abs/../..", "a\0b", "ünï/cødé", "x" * 1024):
        obj = await store.admit(meta(key=key, size=100))
        await fill(store, obj, 0)
    await store.flush()
    chunk_files = [p for p in files_under(*dirs) if not p.name.startswith("index.sqlite")]
    assert len(chunk_files) == 5
    for path in chunk_files:
        assert path.parent.parent.parent.name == "chunks"
        assert path.name.split(".")[0].isalnum() and len(path.name.split(".")[0]) == 32


async def test_empty_object_is_an_entry_without_chunks(make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(meta(size=0))
    assert obj.chunk_count(CS) == 0
    assert store.lookup("b", "k") is obj
    with pytest.raises(ValueError, match="outside"):
        await store.begin_chunk(obj, 0)


# Identity: ETags, invalidation, fills racing them


async def test_new_etag_drops_the_old_chunks(make_store: MakeStore, dirs: list[Path]) -> None:
    store = await make_store()
    old = await store.admit(meta(etag='"e1"'))
    await fill_all(store, old)
    new = await store.admit(meta(etag='"e2"'))
    assert new is not old and store.lookup("b", "k") is new
    assert not old.alive and not store.has_chunk(old, 0)
    assert await read(store, old, 0) is None
    assert not any(store.has_chunk(new, i) for i in range(4))
    await store.flush()
    assert [p.name for p in files_under(*dirs)] == [
        "index.sqlite",
        "index.sqlite-shm",
        "index.sqlite-wal",
    ]
    await fill(store, new, 0)
    assert await read(store, new, 0) == content(new.meta, 0)


async def test_same_etag_keeps_chunks_and_takes_new_metadata(make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    await fill(store, obj, 1)
    refreshed = await store.admit(meta(validated_at=99.0, parts=((1, 0, 5),)))
    assert refreshed is obj
    assert obj.meta.validated_at == 99.0 and obj.meta.parts == ((1, 0, 5),)
    assert await read(store, obj, 1) == content(obj.meta, 1)


async def test_new_version_with_same_etag_is_a_new_object(make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(meta(version_id="v1"))
    await fill(store, obj, 0)
    other = await store.admit(meta(version_id="v2"))
    assert other is not obj and not store.has_chunk(other, 0)


async def test_invalidate_drops_the_entry_and_its_chunks(make_store: MakeStore) -> None:
    store = await make_store()
    for key in ("logs/a", "logs/b", "data/c"):
        await fill(store, await store.admit(meta(key=key)), 0)
    await store.invalidate("b", "data/c")
    await store.invalidate("b", "never-cached")
    assert store.lookup("b", "data/c") is None
    await store.invalidate("b", "logs/a")
    await store.invalidate("b", "logs/b")
    assert store.stats()["objects"] == 0 and store.stats()["chunks"] == 0


async def test_commit_after_invalidate_is_not_servable(
    make_store: MakeStore, dirs: list[Path]
) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    writer = await store.begin_chunk(obj, 0)
    assert writer is not None
    await writer.write(content(obj.meta, 0))
    await store.invalidate("b", "k")
    await writer.commit()
    again = await store.admit(meta())
    assert not store.has_chunk(again, 0) and await read(store, again, 0) is None
    await store.flush()
    assert [p for p in files_under(*dirs) if ".sqlite" not in p.name] == []
    assert store.stats()["discarded_commits"] == 1
    assert store.stats()["reserved_bytes"] == 0


async def test_publish_racing_a_replacement_is_discarded(make_store: MakeStore) -> None:
    files = FaultyFiles()
    store = await make_store(files=files)
    obj = await store.admit(meta())
    writer = await store.begin_chunk(obj, 0)
    assert writer is not None
    await writer.write(content(obj.meta, 0))
    real_publish = files.publish

    def slow_publish(*args: Any) -> None:
        gate.wait(10)
        real_publish(*args)

    gate = threading.Event()
    files.publish = slow_publish  # type: ignore[method-assign]
    commit = asyncio.create_task(writer.commit())
    await asyncio.sleep(0.05)
    new = await store.admit(meta(etag='"e2"'))
    gate.set()
    await commit
    assert not store.has_chunk(obj, 0) and not store.has_chunk(new, 0)
    await store.flush()
    assert not os.path.exists(chunk_path(str(store.dirs[writer.dir]), obj.stem, 0))


# Writers


async def test_writer_rejects_wrong_lengths_and_cleans_up(make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    short = await store.begin_chunk(obj, 0)
    assert short is not None
    await short.write(b"x" * 10)
    with pytest.raises(CacheWriteError):
        await short.commit()
    assert not os.path.exists(short.path)

    long = await store.begin_chunk(obj, 3)
    assert long is not None
    with pytest.raises(CacheWriteError):
        await long.write(b"x" * (long.length + 1))
    with pytest.raises(CacheWriteError):
        await long.write(b"x")
    await long.abort()
    await store.flush()
    assert not os.path.exists(long.path)
    assert store.stats()["reserved_bytes"] == 0 and store.stats()["writers"] == 0


async def test_one_writer_per_chunk(make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    first = await store.begin_chunk(obj, 0)
    assert first is not None
    assert await store.begin_chunk(obj, 0) is None
    await first.abort()
    await store.flush()
    await fill(store, obj, 0)
    assert await store.begin_chunk(obj, 0) is None


async def test_readers_can_follow_a_fill_through_its_temp_file(make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    writer = await store.begin_chunk(obj, 0)
    assert writer is not None
    data = content(obj.meta, 0)
    await writer.write(data[:1000])
    fd = os.open(writer.path, os.O_RDONLY)
    try:
        assert os.pread(fd, writer.written, 0) == data[:1000]
        await writer.write(data[1000:])
        await writer.commit()
        assert os.pread(fd, CS, 0) == data
    finally:
        os.close(fd)


async def test_cancelled_write_releases_everything(make_store: MakeStore) -> None:
    files = FaultyFiles()
    store = await make_store(files=files)
    obj = await store.admit(meta())
    writer = await store.begin_chunk(obj, 0)
    assert writer is not None
    files.gate = threading.Event()
    task = asyncio.create_task(writer.write(b"x" * 1000))
    await asyncio.sleep(0.05)
    task.cancel()
    files.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    await writer.abort()
    assert not os.path.exists(writer.path)
    assert store.stats()["reserved_bytes"] == 0
    assert await store.begin_chunk(obj, 0) is not None


async def test_close_aborts_fills_in_progress(make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    writer = await store.begin_chunk(obj, 0)
    assert writer is not None
    await writer.write(b"x" * 100)
    await store.close()
    assert not os.path.exists(writer.path)
    with pytest.raises(CacheWriteError):
        await writer.write(b"y")
    assert await store.begin_chunk(obj, 1) is None


# Verification


async def test_flipped_byte_found_after_restart_drops_the_chunk(
    make_store: MakeStore,
) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    await fill_all(store, obj)
    path = chunk_path(store.dirs[obj.chunks[1].dir], obj.stem, 1)
    await store.close()
    flip_byte(path)

    store = await make_store()
    obj2 = store.lookup("b", "k")
    assert obj2 is not None
    assert await read(store, obj2, 1) is None
    assert not store.has_chunk(obj2, 1)
    assert store.stats()["corrupt"] == 1
    await store.flush()
    assert not os.path.exists(path)
    assert await read(store, obj2, 0) == content(obj2.meta, 0)
    await fill(store, obj2, 1)
    assert await read(store, obj2, 1) == content(obj2.meta, 1)


@pytest.mark.parametrize(("verify", "served"), [("after-restart", True), ("always", False)])
async def test_damage_after_a_fill_in_this_process(
    make_store: MakeStore, verify: str, served: bool
) -> None:
    """after-restart trusts what this process wrote; always checks every read."""
    store = await make_store(verify=verify)
    obj = await store.admit(meta())
    await fill(store, obj, 0)
    flip_byte(chunk_path(store.dirs[obj.chunks[0].dir], obj.stem, 0))
    assert (await read(store, obj, 0) is not None) is served


async def test_truncated_chunk_is_never_served_even_without_verification(
    make_store: MakeStore,
) -> None:
    store = await make_store(verify="never")
    obj = await store.admit(meta())
    await fill(store, obj, 0)
    os.truncate(chunk_path(store.dirs[obj.chunks[0].dir], obj.stem, 0), 100)
    assert await read(store, obj, 0) is None
    assert not store.has_chunk(obj, 0)


async def test_hot_chunks_are_read_inline_and_short_ones_dropped(make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    await fill_all(store, obj)
    data = content(obj.meta, 1)
    assert await read(store, obj, 1) == data
    hits = store.stats()["hits"]
    assert store.read_hot(obj, 1, 10, 100) == data[10:110]
    assert store.stats()["hits"] == hits + 1
    os.truncate(chunk_path(store.dirs[obj.chunks[1].dir], obj.stem, 1), 50)
    assert store.read_hot(obj, 1, 10, 100) is None
    assert not store.has_chunk(obj, 1)
    assert await read(store, obj, 0) == content(obj.meta, 0)
    await store.invalidate("b", "k")
    assert store.read_hot(obj, 0, 0, 10) is None


async def test_checked_chunks_beyond_the_kept_descriptors_are_reopened_inline(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A hot set larger than the descriptors kept open is still read inline: a chunk
    written or opened and checked since start-up is opened again on the loop; one not
    opened since start-up is left to a thread, and so is one whose file went missing."""
    monkeypatch.setattr(fdcache, "open_chunk_limit", lambda: 1)
    store = await make_store()
    obj = await store.admit(meta())
    await fill_all(store, obj)
    for index in range(3):
        assert await read(store, obj, index) == content(obj.meta, index)
    for _ in range(2):
        for index in range(3):
            assert store.read_hot(obj, index, 5, 50) == content(obj.meta, index)[5:55]
    os.unlink(chunk_path(store.dirs[obj.chunks[0].dir], obj.stem, 0))
    assert store.read_hot(obj, 1, 0, 10) is not None  # chunk 0's descriptor closed
    assert store.read_hot(obj, 0, 0, 10) is None
    assert await read(store, obj, 0) is None
    assert not store.has_chunk(obj, 0)
    await store.close()
    again = await make_store()
    restarted = again.lookup("b", "k")
    assert restarted is not None
    assert again.read_hot(restarted, 1, 0, 10) is None  # not opened since start-up
    assert await read(again, restarted, 1) == content(obj.meta, 1)
    assert again.read_hot(restarted, 1, 0, 10) == content(obj.meta, 1)[:10]


async def test_a_chunk_is_sent_from_the_page_cache_from_its_first_hit_and_after_a_reopen(
    make_store: MakeStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A span is made only of bytes known to be in memory (lota.cache.store.reader.Warm):
    a fill's are, it has just written them; and what is known is the file's, not one
    descriptor's, so a hot set larger than the descriptors kept is still sent from the
    page cache, each chunk reopened for its hit, while it is read often (WARM_FOR)."""
    monkeypatch.setattr(fdcache, "open_chunk_limit", lambda: 1)
    store = await make_store()
    obj = await store.admit(meta())
    await fill_all(store, obj)
    assert [obj.chunks[i].warm for i in range(3)] == [(0, CS)] * 3
    for _ in range(2):
        for index in range(3):
            got = store.read_hot(obj, index, 5, 50, True)
            assert isinstance(got, FileSpan) == zerocopy.AVAILABLE  # else copied
            assert (got.read() if isinstance(got, FileSpan) else got) == content(obj.meta, index)[
                5:55
            ]
    assert store.stats()["hits"] == 6
    # Once idle for longer than WARM_FOR, a chunk proves its bytes again by reading them
    # whole from memory, whatever cachestat says, its descriptor still open (chunk 2, read
    # last) or opened again (chunk 0); so after a clock step back.
    clock.advance(WARM_FOR + 1)
    with monkeypatch.context() as held_not_whole:
        held_not_whole.setattr(chunk_reader, "resident", lambda *args: True)
        held_not_whole.setattr(chunk_reader, "_read_whole", lambda *args: False)
        assert [store.read_hot(obj, i, 5, 50, True) for i in (2, 0)] == [None, None]
    for index in (2, 0):
        got = store.read_hot(obj, index, 5, 50, True)  # read whole: sent from memory
        assert isinstance(got, FileSpan) == zerocopy.AVAILABLE
        assert (got.read() if isinstance(got, FileSpan) else got) == content(obj.meta, index)[5:55]
    clock.advance(-3600)
    with monkeypatch.context() as held_not_whole:
        held_not_whole.setattr(chunk_reader, "resident", lambda *args: True)
        held_not_whole.setattr(chunk_reader, "_read_whole", lambda *args: False)
        assert store.read_hot(obj, 0, 5, 50, True) is None


def test_descriptors_held_by_readers_never_keep_idle_ones_open_past_the_limit() -> None:
    """A descriptor in use is never closed; the idle ones behind it still are, so that
    what is kept stays within the limit (a reopened chunk kept as the next to close,
    then held by a reader, once stopped every eviction)."""

    class Held:  # what FdCache asks of a chunk
        fd = -1
        readers = 0

    cache = fdcache.FdCache(4)
    chunks = [Held() for _ in range(6)]
    for chunk in chunks[:4]:
        cache.keep(chunk, os.open("/dev/null", os.O_RDONLY))  # type: ignore[arg-type]
    chunks[4].readers = 1
    cache.keep(chunks[4], os.open("/dev/null", os.O_RDONLY), again=True)  # type: ignore[arg-type]
    cache.keep(chunks[5], os.open("/dev/null", os.O_RDONLY), again=True)  # type: ignore[arg-type]
    assert [chunk.fd >= 0 for chunk in chunks] == [False, False, True, True, True, True]
    cache.close_all()


async def test_a_hot_set_read_in_a_loop_keeps_part_of_itself_open(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch, opened_files: list[str]
) -> None:
    """Twice as many chunks as descriptors kept, read in a loop (epochs): least recently
    used order would close each before its next read and open every one again; a part of
    them stays open instead (fdcache.KEEP_EVERY). A chunk read often amid them gets its
    descriptor kept after a few reads."""
    monkeypatch.setattr(fdcache, "open_chunk_limit", lambda: 8)
    store = await make_store()
    objs = []
    for i in range(16):
        obj = await store.admit(meta(key=f"k{i}", size=1000))
        await fill_all(store, obj)
        objs.append(obj)
    opened = opened_files
    for _ in range(3):  # settle
        for obj in objs:
            assert store.read_hot(obj, 0, 0, 10) == content(obj.meta, 0)[:10]
    opened.clear()
    for _ in range(10):
        for obj in objs:
            assert store.read_hot(obj, 0, 0, 10) == content(obj.meta, 0)[:10]
    assert len(opened) <= 0.75 * 10 * 16  # least recently used: all 160
    hot, cold = objs[0], objs[1:]
    opened.clear()
    for _ in range(5):
        for obj in cold:
            store.read_hot(hot, 0, 0, 10)
            store.read_hot(obj, 0, 0, 10)
    assert sum(1 for path in opened if hot.stem in path) <= fdcache.KEEP_EVERY


async def test_a_chunk_being_scrubbed_is_not_sent_from_the_page_cache(
    make_store: MakeStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scrubber's read may bring a chunk's pages in from the drive: a hit meanwhile
    reads them (without waiting) rather than sending them (sendfile would wait)."""
    store = await make_store(scrub_rate=1 << 40, scrub_idle=60)
    obj = await store.admit(meta())
    await fill_all(store, obj)
    clock.advance(61)
    paths = {store.chunk_path(obj, i): chunk for i, chunk in obj.chunks.items()}
    while_verified: list[object] = []
    verify = ChunkFiles.verify

    def seen(files: ChunkFiles, path: str, length: int, digest: int) -> None:
        while_verified.append(paths[path].warm)
        verify(files, path, length, digest)

    monkeypatch.setattr(ChunkFiles, "verify", seen)
    assert await store.scrub() == 0  # none damaged
    assert while_verified == [None] * 4


async def test_an_open_of_a_checked_chunk_beyond_the_kept_descriptors_stays_on_the_loop(
    make_store: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a sibling worker asks for, too: a checked chunk whose descriptor was closed is
    opened again on the loop, not through the store's thread pool (a hand-off each way);
    one that is not of its length is left to the thread, which drops it."""
    monkeypatch.setattr(fdcache, "open_chunk_limit", lambda: 1)
    store = await make_store(verify="never")
    obj = await store.admit(meta())
    await fill_all(store, obj)
    for index in range(3):
        assert await read(store, obj, index) == content(obj.meta, index)
    on_threads: list[str] = []
    opened_on_a_thread = ChunkFiles.open_chunk

    def counted(files: ChunkFiles, path: str, length: int, digest: int | None) -> int:
        on_threads.append(path)
        return opened_on_a_thread(files, path, length, digest)

    monkeypatch.setattr(ChunkFiles, "open_chunk", counted)
    for index in range(3):
        assert await read(store, obj, index) == content(obj.meta, index)
    assert on_threads == []
    os.truncate(chunk_path(store.dirs[obj.chunks[0].dir], obj.stem, 0), 100)
    assert await read(store, obj, 0) is None
    assert len(on_threads) == 1 and not store.has_chunk(obj, 0)


async def test_bytes_not_in_the_page_cache_are_not_read_inline(make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    await fill_all(store, obj)
    assert await read(store, obj, 2) == content(obj.meta, 2)
    assert store.read_hot(obj, 2, 0, 100) is not None
    fd = os.open(chunk_path(store.dirs[obj.chunks[2].dir], obj.stem, 2), os.O_RDONLY)
    try:
        # Evicted as if by other reads, read_hot leaves the drive read to a thread. The
        # kernel may keep pages it holds for a moment (per-CPU LRU batches), and those
        # are rightly read inline: evict again until they are gone.
        for _ in range(100):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            if store.read_hot(obj, 2, 0, 100) is None:
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("read_hot read the chunk inline after each of 100 evictions")
    finally:
        os.close(fd)
    assert await read(store, obj, 2) == content(obj.meta, 2)


async def test_concurrent_first_reads_share_one_verification(make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    await fill(store, obj, 0)
    await store.close()
    store = await make_store()
    obj = store.lookup("b", "k")
    assert obj is not None
    readers = await asyncio.gather(*(store.open_chunk(obj, 0) for _ in range(10)))
    for reader in readers:
        assert reader is not None
        reader.close()
    assert store.stats()["verified"] == 1


async def test_scrub_drops_damaged_idle_chunks(make_store: MakeStore, clock: FakeClock) -> None:
    store = await make_store(scrub_rate=1 << 40, scrub_idle=60)
    obj = await store.admit(meta())
    await fill_all(store, obj)
    flip_byte(chunk_path(store.dirs[obj.chunks[2].dir], obj.stem, 2))
    assert await store.scrub() == 0  # nothing idle yet
    clock.advance(61)
    assert await store.scrub() == 1
    assert [store.has_chunk(obj, i) for i in range(4)] == [True, True, False, True]
    assert store.stats()["scrubbed"] == 3


# Budget, eviction, pinning


async def test_writing_three_budgets_stays_under_budget_on_disk(
    make_store: MakeStore, dirs: list[Path]
) -> None:
    budget = 48 * CS
    store = await make_store(size=budget)
    written = 0
    n = 0
    while written < 3 * budget:
        obj = await store.admit(meta(key=f"obj{n}", size=6 * CS))
        n += 1
        for index in range(6):
            await fill(store, obj, index)
            written += CS
            assert store.usage <= budget
            assert du(*dirs) <= 1.05 * budget, store.stats()
    await store.flush()
    assert du(*dirs) <= 1.05 * budget
    stats = store.stats()
    assert stats["evictions"] > 0 and stats["bypassed_writes"] == 0
    assert stats["bytes_used"] >= du(*dirs) - 3 * 4096  # usage does not undercount the disk


async def test_hot_object_survives_a_scan(make_store: MakeStore) -> None:
    store = await make_store(size=48 * CS)
    hot = await store.admit(meta(key="hot", size=8 * CS))
    await fill_all(store, hot)
    for index in range(8):
        assert await read(store, hot, index) is not None
    for n in range(40):
        cold = await store.admit(meta(key=f"cold{n}", size=4 * CS))
        await fill_all(store, cold)
    assert all(store.has_chunk(hot, i) for i in range(8))
    assert store.stats()["evictions"] > 100


async def test_reads_a_sibling_tells_of_count_as_hits_and_a_hand_over_is_not_one(
    make_store: MakeStore, clock: FakeClock
) -> None:
    """A chunk a sibling worker read from its own descriptor, and told this store of
    (told_reads), survives a scan as a chunk read here does; a chunk only handed over to
    siblings (open_chunk(read=False)) was not read here, and the scan evicts it. Neither
    counts as this store's hits: they are the sibling's."""
    store = await make_store(size=48 * CS)
    told = await store.admit(meta(key="told", size=8 * CS))
    handed = await store.admit(meta(key="handed", size=8 * CS))
    await fill_all(store, told)
    await fill_all(store, handed)
    clock.advance(60)
    for index in range(8):
        store.told_reads(told, index, 2)
        assert told.chunks[index].last_access == clock.time()  # not idle: the scrubber waits
        reader = await store.open_chunk(handed, index, read=False)
        assert reader is not None
        reader.close()
    with pytest.raises(ValueError):
        store.told_reads(told, 8, 1)  # not one of its chunks
    assert store.stats()["hits"] == 0
    for n in range(40):
        cold = await store.admit(meta(key=f"cold{n}", size=4 * CS))
        await fill_all(store, cold)
    assert all(store.has_chunk(told, i) for i in range(8))
    assert not any(store.has_chunk(handed, i) for i in range(8))
    assert store.stats()["hits"] == 0


async def test_hits_applied_in_groups_decide_as_hits_told_one_by_one(
    make_store: MakeStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hits reach the eviction policy and the admission rule a group at a time
    (``HITS_HELD``), each group before anything else asks or tells either: a store doing
    so keeps, evicts and declines exactly the chunks a store telling each hit as it comes
    does, and its policy and rule learn the same, through fills (asked for or not),
    misses counted, reads a sibling tells of and invalidations."""
    # What else moves the store's decisions run to run is taken out: the index file's
    # size (SQLite's page use) and the directories its random file stems make.
    monkeypatch.setattr(Index, "bytes", property(lambda _: 0, lambda _, __: None), raising=False)
    group = chunk_table.HITS_HELD
    assert group > 1

    async def run(held: int, where: Path) -> tuple[Any, ...]:
        stems = itertools.count()
        made = types.SimpleNamespace(
            token_bytes=lambda n: next(stems).to_bytes(n, "big"),
            token_hex=lambda n: next(stems).to_bytes(n, "big").hex(),
        )
        monkeypatch.setattr(layout, "secrets", made)
        monkeypatch.setattr(chunk_table, "HITS_HELD", held)
        store = await make_store(dirs=[where], size=24 * CS)
        rng = random.Random(7)
        objs: dict[str, CachedObject] = {}
        for _ in range(1500):
            roll = rng.random()
            if objs and roll < 0.72:  # reads of chunks of objects known, a few in a row
                for _ in range(rng.randint(1, 40)):
                    obj = rng.choice(list(objs.values()))
                    index = rng.randrange(obj.chunk_count(CS))
                    if roll < 0.7 and await read(store, obj, index) is not None:
                        continue  # a hit
                    if roll >= 0.7 and store.has_chunk(obj, index):
                        store.told_reads(obj, index, rng.randint(1, 3))  # a sibling's hits
                        continue
                    if rng.random() < 0.2:  # relayed from another node, not kept here
                        store.count_read(obj, index)
                        continue
                    # A miss, as the cache's service has it; or a fill no read asked for
                    # (a warm-up's, a read-ahead's), which the admission rule is not asked.
                    asked = rng.random() < 0.8
                    if asked and not store.keeps(obj, index):
                        store.count_read(obj, index)
                        continue
                    writer = await store.begin_chunk(obj, index)
                    if writer is not None:
                        await writer.write(content(obj.meta, index))
                        await writer.commit()
                    if asked:
                        store.count_read(obj, index)
            elif objs and roll < 0.74:
                key = rng.choice(list(objs))
                await store.invalidate("b", key)
                del objs[key]
            else:
                key = f"k{rng.randrange(30)}"
                objs[key] = await store.admit(meta(key=key, size=rng.randint(1, 4) * CS))
            await store.flush()  # deletions done: the same budget at each step
        cached = sorted(
            (key, index)
            for key, obj in objs.items()
            for index in range(obj.chunk_count(CS))
            if store.has_chunk(obj, index)
        )
        # Hits with nothing between them: fewer than HITS_HELD held at any time.
        obj, index = objs[cached[0][0]], cached[0][1]
        for _ in range(3 * group):
            assert await read(store, obj, index) is not None
            assert len(store._table._hits) < held
        # What the two have learnt, every hit held now applied (asking applies them).
        store.keeps(obj, index)
        table = store._table
        admission, policy = table._admission, table._policy
        names = {chunk: (chunk.obj.meta.key, chunk.index) for chunk in policy._freq}
        learnt = (
            admission._sketch._table,
            admission._clock,
            admission._intervals,
            sorted((names[c], at) for c, at in admission._read_at.items() if c in names),
            sorted((names[c], f) for c, f in policy._freq.items()),
        )
        return cached, store.stats(), learnt

    one_by_one = await run(1, tmp_path / "one")
    in_groups = await run(group, tmp_path / "groups")
    assert one_by_one == in_groups
    stats = in_groups[1]
    assert stats["hits"] > 5000 and stats["evictions"] > 500 and stats["declined_fills"] > 1000


async def test_pinned_prefix_is_never_evicted(make_store: MakeStore) -> None:
    store = await make_store(size=48 * CS, pinned=("b/ckpt/",))
    pinned = await store.admit(meta(key="ckpt/step100", size=10 * CS))
    await fill_all(store, pinned)
    for n in range(40):
        await fill_all(store, await store.admit(meta(key=f"data{n}", size=4 * CS)))
    assert all(store.has_chunk(pinned, i) for i in range(10))
    assert store.stats()["pinned_bytes"] == 10 * CS


async def test_no_room_when_everything_is_pinned_means_pass_through(
    make_store: MakeStore,
) -> None:
    store = await make_store(size=16 * CS, pinned=("b",))
    obj = await store.admit(meta(size=40 * CS))
    filled = 0
    for index in range(40):
        writer = await store.begin_chunk(obj, index)
        if writer is None:
            break
        await writer.write(content(obj.meta, index))
        await writer.commit()
        filled += 1
    assert 0 < filled < 16
    assert store.stats()["bypassed_writes"] == 1
    assert store.usage <= store.budget


async def test_chunks_being_read_are_not_evicted(make_store: MakeStore) -> None:
    store = await make_store(size=32 * CS)
    first = await store.admit(meta(key="first", size=2 * CS))
    await fill_all(store, first)
    reader = await store.open_chunk(first, 0)
    assert reader is not None
    try:
        for n in range(30):
            await fill_all(store, await store.admit(meta(key=f"x{n}", size=2 * CS)))
        assert store.has_chunk(first, 0) and not store.has_chunk(first, 1)
    finally:
        reader.close()


async def test_invalidated_chunk_stays_readable_and_counted_until_closed(
    make_store: MakeStore,
) -> None:
    store = await make_store()
    obj = await store.admit(meta())
    await fill(store, obj, 0)
    reader = await store.open_chunk(obj, 0)
    assert reader is not None
    await store.invalidate("b", "k")
    await store.flush()
    assert store.stats()["chunk_bytes"] == CS
    assert os.pread(reader.fd, CS, 0) == content(obj.meta, 0)
    reader.close()
    assert store.stats()["chunk_bytes"] == 0


# Failing disks


async def test_an_io_error_aborts_the_fill_and_rests_the_dir(
    make_store: MakeStore, dirs: list[Path], clock: FakeClock
) -> None:
    files = FaultyFiles()
    files.error = errno.EIO
    store = await make_store(files=files)
    files.failing = {str(dirs[0])}
    obj = await store.admit(meta(size=20 * CS))
    failed_on = None
    for index in range(20):
        writer = await store.begin_chunk(obj, index)
        assert writer is not None
        try:
            await writer.write(content(obj.meta, index))
            await writer.commit()
        except CacheWriteError:
            failed_on = index
            assert writer.dir == 0 and not os.path.exists(writer.path)
    assert failed_on is not None
    assert sum(store.has_chunk(obj, i) for i in range(20)) == 19
    assert {c.dir for c in obj.chunks.values()} == {1}
    stats = store.stats()
    assert (stats["write_errors"], stats["dirs_unhealthy"], stats["reserved_bytes"]) == (1, 1, 0)

    files.failing = set()
    clock.advance(61)
    await fill(store, obj, failed_on)
    assert store.stats()["dirs_unhealthy"] == 0


async def _fill_counting_failures(store: CacheStore, keys: range, chunks: int = 4) -> int:
    """Fill objects o<n> of `chunks` chunks each; returns how many fills hit a full disk.
    A failed fill holds nothing any more: no reservation, no temp file."""
    failed = 0
    for n in keys:
        obj = await store.admit(meta(key=f"o{n}", size=chunks * CS))
        for index in range(chunks):
            writer = await store.begin_chunk(obj, index)
            assert writer is not None, (n, index, store.stats(), store.dir_stats())
            try:
                await writer.write(content(obj.meta, index))
                await writer.commit()
            except CacheWriteError:
                failed += 1
                assert store.stats()["reserved_bytes"] == 0
                assert not os.path.exists(writer.path)
    return failed


async def test_a_drive_full_before_the_budget_lowers_its_budget_evicts_and_keeps_caching(
    tmpfs: Callable[[str], Path], make_store: MakeStore
) -> None:
    """A 4 MiB drive under a 16 MiB budget: its first ENOSPC sets that drive's budget to
    what it holds, eviction gets under it, and every later fill fits (none is refused)."""
    disk = tmpfs("4m")
    store = await make_store(dirs=[disk], size=256 * CS)
    assert await _fill_counting_failures(store, range(40)) == 1  # 10 MiB through 4 MiB
    drive = store.dir_stats()[str(disk)]
    assert drive["budget"] < 4 * MiB and drive["bytes_used"] <= drive["budget"]
    assert drive["healthy"] == 1  # full, not failing: no rest, the next fill goes ahead
    last = store.lookup("b", "o39")
    assert last is not None
    assert [await read(store, last, i) for i in range(4)] == [
        content(last.meta, i) for i in range(4)
    ]
    await store.flush()
    stats = store.stats()
    assert stats["evictions"] > 0 and stats["disk_full"] == 1 and stats["write_errors"] == 0
    assert stats["bypassed_writes"] == 0 and stats["index_errors"] == 0
    assert du(disk) <= drive["budget"] + CS


async def test_a_full_drive_gets_its_budget_back_when_its_file_system_frees_space(
    tmpfs: Callable[[str], Path], make_store: MakeStore
) -> None:
    disk = tmpfs("4m")
    tenant = disk / "another-tenant"
    tenant.write_bytes(os.urandom(2 * MiB))
    store = await make_store(dirs=[disk], size=256 * CS)
    assert await _fill_counting_failures(store, range(10)) >= 1
    lowered = store.dir_stats()[str(disk)]["budget"]
    assert lowered < 2 * MiB
    tenant.unlink()
    await store.check_space()  # what the store's maintenance does every second
    raised = store.dir_stats()[str(disk)]["budget"]
    assert raised >= lowered + 2 * MiB - CS
    assert await _fill_counting_failures(store, range(10, 30)) == 0
    assert lowered < store.usage <= raised


async def test_a_full_drive_sends_its_chunks_to_the_other_drives(
    tmpfs: Callable[[str], Path], make_store: MakeStore, tmp_path: Path
) -> None:
    small, big = tmpfs("1m"), tmp_path / "big"
    store = await make_store(dirs=[small, big], size=256 * CS)
    assert await _fill_counting_failures(store, range(20)) == 1  # 5 MiB; the budget holds it
    assert store.stats()["evictions"] == 0
    cached = [
        store.has_chunk(obj, i)
        for n in range(20)
        if (obj := store.lookup("b", f"o{n}"))
        for i in range(4)
    ]
    assert sum(cached) == 80 - 1  # all but the one whose fill hit ENOSPC
    dirs = store.dir_stats()
    assert dirs[str(small)]["budget"] < MiB and dirs[str(big)]["budget"] == 256 * CS


async def test_a_budget_larger_than_the_drives_is_a_warning_at_open(
    tmpfs: Callable[[str], Path], make_store: MakeStore, caplog: pytest.LogCaptureFixture
) -> None:
    disk = tmpfs("4m")
    with caplog.at_level(logging.WARNING, logger="lota.cache"):
        store = await make_store(dirs=[disk], size=256 * CS)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    free = store.dir_stats()[str(disk)]["free_bytes"]
    assert 3 * MiB < free <= 4 * MiB
    assert len(warnings) == 1 and f"cache.size ({256 * CS} bytes)" in warnings[0]
    assert f"{free} bytes free" in warnings[0], warnings
    await store.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="lota.cache"):
        await make_store(dirs=[disk], size=48 * CS)
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []


async def test_every_dir_failing_means_pass_through(
    make_store: MakeStore, dirs: list[Path]
) -> None:
    files = FaultyFiles()
    store = await make_store(files=files)
    files.failing = {str(d) for d in dirs}
    files.fail_create = True
    files.error = errno.EROFS
    obj = await store.admit(meta())
    assert await store.begin_chunk(obj, 0) is None
    assert store.stats()["bypassed_writes"] == 1 and store.stats()["reserved_bytes"] == 0


async def test_a_broken_dir_is_skipped(make_store: MakeStore, dirs: list[Path]) -> None:
    """A real failure, no injection: the chunks directory of one drive is now a file."""
    store = await make_store()
    (dirs[1] / "chunks").rmdir()
    (dirs[1] / "chunks").write_bytes(b"not a directory")
    # 30 chunks: each ranks the broken drive first by even odds (rendezvous hashing of a
    # random stem), so one tries it but once in 2**30 runs (10 failed once in ~1,000).
    obj = await store.admit(meta(size=30 * CS))
    await fill_all(store, obj)
    assert {c.dir for c in obj.chunks.values()} == {0}
    assert store.stats()["write_errors"] == 1


async def test_a_second_store_on_a_locked_dir_is_refused_until_the_first_closes(
    make_store: MakeStore, dirs: list[Path], clock: FakeClock
) -> None:
    first = await make_store()
    holder = f"pid {os.getpid()} on host {socket.gethostname()}"
    assert (dirs[1] / "lota.lock").read_text() == holder + "\n"
    for order in (dirs, dirs[::-1]):  # the first dir or another one: refused either way
        second = CacheStore([str(d) for d in order], 64 * CS, CS, clock=clock, scrub_interval=0)
        with pytest.raises(CacheDirInUse, match=f"in use by {holder}"):
            await second.open()
    await first.close()
    again = await make_store()  # nothing of the refused ones stayed locked
    assert again.stats()["dirs_unhealthy"] == 0


async def test_a_second_dir_unusable_at_start_is_never_used_unlocked_when_it_comes_back(
    make_store: MakeStore, tmp_path: Path, clock: FakeClock
) -> None:
    (tmp_path / "file").write_bytes(b"x")
    store = await make_store(dirs=[tmp_path / "nvme0", tmp_path / "file" / "nvme1"])
    assert store.stats()["dirs_unhealthy"] == 1
    (tmp_path / "file").unlink()  # the drive is back, but this process holds no lock on it
    (tmp_path / "file" / "nvme1" / "chunks").mkdir(parents=True)
    clock.advance(3600)
    obj = await store.admit(meta(size=10 * CS))
    await fill_all(store, obj)
    assert {c.dir for c in obj.chunks.values()} == {0}
    assert store.stats()["dirs_unhealthy"] == 1


async def test_a_first_dir_unusable_at_start_is_an_error(
    make_store: MakeStore, tmp_path: Path
) -> None:
    """The first dir holds the index: without it there is no cache to open."""
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(CacheError, match=r"cannot use cache directory .*Not a directory"):
        await make_store(dirs=[tmp_path / "file" / "nvme0", tmp_path / "nvme1"])


async def test_entries_without_chunks_are_bounded(make_store: MakeStore) -> None:
    store = await make_store(max_bare_objects=5)
    filled = await store.admit(meta(key="filled"))
    await fill(store, filled, 0)
    for n in range(10):
        await store.admit(meta(key=f"head-only-{n}", size=0))
    assert store.lookup("b", "filled") is filled
    assert [store.lookup("b", f"head-only-{n}") is not None for n in range(10)] == [False] * 5 + [
        True
    ] * 5


# Layout (pure)


def test_rendezvous_moves_only_the_chunks_of_a_lost_dir() -> None:
    stem = new_stem("b", "k", "e", "")
    before = {i: rank_dirs(stem, i, [0, 1, 2])[0] for i in range(300)}
    after = {i: rank_dirs(stem, i, [0, 2])[0] for i in range(300)}
    assert all(after[i] == before[i] for i in range(300) if before[i] != 1)
    assert 60 < sum(1 for d in before.values() if d == 1) < 140


def test_chunk_arithmetic_and_names() -> None:
    assert [chunk_length(2 * CS + 5, CS, i) for i in range(4)] == [CS, CS, 5, 0]
    assert chunk_count(2 * CS + 5, CS) == 3 and chunk_count(0, CS) == 0
    assert blocks(1) == 4096 and blocks(4096) == 4096 and blocks(0) == 0
    stem = new_stem("b", "../../etc/x", "e", "")
    assert new_stem("b", "../../etc/x", "e", "") != stem  # fresh names per admission
    assert parse_final(f"{stem}.12") == (stem, 12)
    for name in (f"{stem}.1.abcd.tmp", "../x.1", f"{stem}.-1", f"{stem.upper()}.1", f"{stem}.1.x"):
        assert parse_final(name) is None


async def test_an_answer_older_than_an_invalidation_is_admitted_for_revalidation(
    make_store: MakeStore, tmp_path: Path
) -> None:
    store = await make_store()
    asked = time.monotonic()  # the origin is asked; meanwhile a write through LOTA lands
    await store.invalidate("b", "k")
    late = await store.admit(meta(validated_at=1000.0), since=asked)
    assert late.meta.validated_at == 0.0  # checked with the origin before its next use
    fresh = await store.admit(meta(key="k2", validated_at=1000.0), since=time.monotonic())
    assert fresh.meta.validated_at == 1000.0
    # Asked (by another worker) before this store opened: it may have missed a write.
    asked = time.monotonic()
    restarted = await make_store(dirs=[tmp_path / "restarted"])
    before = await restarted.admit(meta(validated_at=1000.0), since=asked)
    assert before.meta.validated_at == 0.0


@pytest.mark.parametrize(
    ("soft", "workers", "room", "kept"),
    [
        (256, 1, None, 512),
        (1024, 1, None, 972),
        (20_000, 1, None, 19_000),
        (20_000, 2, None, 9_500),
        (20_000, 2, 10_000, 5_000),
        (20_000, 64, None, 296),
        (1 << 18, 1, None, 131_072),
        (1 << 20, 8, None, 124_518),
        (resource.RLIM_INFINITY, 2, None, 131_072),
    ],
)
def test_chunk_descriptors_kept_open_follow_the_descriptor_limit(
    monkeypatch: pytest.MonkeyPatch, soft: int, workers: int, room: int | None, kept: int
) -> None:
    """95% of the process's descriptors (or the room left if less), shared equally by the
    node's workers' chunks (its own, each sibling's), 512 in all at least and 131,072 a
    share at most: a hot set of 20,000 small objects stays mostly open under a 20,000
    limit with two workers instead of reopening a file per hit, and one of 100,000 under
    the 1,048,576 limit containers commonly get."""
    monkeypatch.setattr(resource, "getrlimit", lambda _: (soft, soft))
    assert fdcache.open_chunk_limit(workers, room) == kept
    assert fdcache.FdCache(kept)._limit == kept
    if workers == 1 and room is None:
        assert fdcache.FdCache()._limit == kept
