"""The chunk store across crashes: kill -9 mid-fill, damaged leftovers, the start-up sweep,
the ordering of index rows after files, and start-up time."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import lota
from lota.cache.files import ChunkFiles
from lota.cache.index import Index
from lota.cache.layout import chunk_path, new_stem, subdir
from lota.cache.store import CachedObject, CacheStore, ObjectMeta
from lota.clock import Clock

CS = 64 * 1024
MakeStore = Callable[..., Awaitable[CacheStore]]
REPO = Path(lota.__file__).resolve().parent.parent

# The child fills chunks until it is killed; both sides derive chunk bytes from the same seed.
CHILD = textwrap.dedent(
    """
    import asyncio, itertools, random, sys
    from lota.cache.store import CacheStore, ObjectMeta
    from lota.clock import Clock

    CS = 64 * 1024

    async def main(root):
        store = CacheStore([root + "/d0", root + "/d1"], 40 * CS, CS, clock=Clock(),
                           scrub_interval=0, sweep_delay=3600)
        await store.open()
        for n in itertools.count():
            obj = await store.admit(ObjectMeta("b", f"k{n}", "e", 3 * CS + 7, "", ()))
            for i in range(4):
                length = min(CS, obj.meta.size - i * CS)
                data = random.Random(f"k{n}/{i}").randbytes(length)
                writer = await store.begin_chunk(obj, i)
                for start in range(0, length, 8192):
                    await writer.write(data[start:start + 8192])
                    await asyncio.sleep(0.0005)
                await writer.commit()
                print(n, i, flush=True)

    asyncio.run(main(sys.argv[1]))
    """
)


def expected(key: str, index: int, size: int) -> bytes:
    return random.Random(f"{key}/{index}").randbytes(min(CS, size - index * CS))


def chunk_files(*roots: Path) -> list[Path]:
    return sorted(p for r in roots for p in (r / "chunks").rglob("*") if p.is_file())


@pytest.fixture
def dirs(tmp_path: Path) -> list[Path]:
    return [tmp_path / "d0", tmp_path / "d1"]


@pytest.fixture
async def make_store(dirs: list[Path]) -> AsyncIterator[MakeStore]:
    stores: list[CacheStore] = []

    async def make(**kw: Any) -> CacheStore:
        kw.setdefault("sweep_delay", 3600)
        store = CacheStore(
            [str(d) for d in dirs],
            kw.pop("size", 40 * CS),
            CS,
            clock=Clock(),
            scrub_interval=0,
            **kw,
        )
        await store.open()
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


async def fill(store: CacheStore, obj: CachedObject, index: int) -> None:
    writer = await store.begin_chunk(obj, index)
    assert writer is not None
    await writer.write(expected(obj.meta.key, index, obj.meta.size))
    await writer.commit()


async def test_kill_9_mid_fill_serves_only_complete_chunks(
    tmp_path: Path, dirs: list[Path], make_store: MakeStore
) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CHILD, str(tmp_path), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert child.stdout is not None
    commits = 0
    while commits < 60:
        line = await asyncio.wait_for(child.stdout.readline(), 30)
        assert line, "the child died on its own"
        commits += 1
    child.send_signal(signal.SIGKILL)
    await child.communicate()
    assert child.returncode == -signal.SIGKILL

    store = await make_store()
    served = 0
    for n in range(commits // 4 + 2):
        obj = store.lookup("b", f"k{n}")
        for index in range(4 if obj else 0):
            assert obj is not None
            reader = await store.open_chunk(obj, index)
            if reader is not None:
                data = os.pread(reader.fd, CS + 1, 0)
                reader.close()
                assert data == expected(f"k{n}", index, obj.meta.size)
                served += 1
    assert served >= 8, "the index lost more than a few of the last commits"
    await store.sweep()
    leftovers = [p for p in chunk_files(*dirs) if p.name.endswith(".tmp")]
    assert leftovers == []
    assert len(chunk_files(*dirs)) == store.stats()["chunks"]


async def test_leftovers_of_a_crash_are_swept(dirs: list[Path], make_store: MakeStore) -> None:
    store = await make_store()
    obj = await store.admit(ObjectMeta("b", "k", "e", 5 * CS, "", ()))
    for index in range(3):
        await fill(store, obj, index)
    paths = [chunk_path(store.dirs[obj.chunks[i].dir], obj.stem, i) for i in range(3)]
    await store.close()

    os.truncate(paths[1], 10)  # a row whose file is too short
    os.unlink(paths[2])  # a row whose file is missing
    orphan_live = Path(chunk_path(str(dirs[0]), obj.stem, 4))  # no row, live object
    dead = new_stem("b", "gone", "e", "")
    orphan_dead = Path(chunk_path(str(dirs[1]), dead, 0))  # no row, no object
    temp = Path(subdir(str(dirs[0]), obj.stem)) / f"{obj.stem}.3.abcd1234.tmp"
    for path in (orphan_live, orphan_dead, temp):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\0" * 100)

    store = await make_store()
    obj = store.lookup("b", "k")
    assert obj is not None
    reader = await store.open_chunk(obj, 0)
    assert reader is not None
    reader.close()
    assert await store.open_chunk(obj, 1) is None
    counts = await store.sweep()
    assert counts == {"deleted": 3, "missing": 1}
    assert [store.has_chunk(obj, i) for i in range(5)] == [True, False, False, False, False]
    await store.flush()
    assert chunk_files(*dirs) == [Path(paths[0])]
    assert not orphan_dead.parent.exists()  # emptied directories are removed
    await store.close()

    store = await make_store()
    obj = store.lookup("b", "k")
    assert obj is not None and list(obj.chunks) == [0]


async def test_background_sweep_runs_after_open(dirs: list[Path], make_store: MakeStore) -> None:
    store = await make_store()
    await store.close()
    stray = dirs[1] / "chunks" / "ab" / "cd" / "whatever.0.0000.tmp"
    stray.parent.mkdir(parents=True)
    stray.write_bytes(b"x")
    store = await make_store(sweep_delay=0)
    for _ in range(100):
        if not stray.exists():
            break
        await asyncio.sleep(0.02)
    assert not stray.exists()
    assert store.stats()["swept_deleted"] == 1


async def test_index_row_is_committed_only_after_the_rename(
    dirs: list[Path], make_store: MakeStore
) -> None:
    gate = threading.Event()

    class SlowPublish(ChunkFiles):
        def publish(self, fd: int, temp: str, final: str, fsync: bool) -> None:
            gate.wait(10)
            super().publish(fd, temp, final, fsync)

    store = await make_store(files=SlowPublish())
    obj = await store.admit(ObjectMeta("b", "k", "e", CS, "", ()))
    writer = await store.begin_chunk(obj, 0)
    assert writer is not None
    await writer.write(expected("k", 0, CS))
    commit = asyncio.create_task(writer.commit())
    await asyncio.sleep(0.1)
    await store.flush()
    assert rows(dirs[0]) == 0
    gate.set()
    await commit
    await store.flush()
    assert rows(dirs[0]) == 1


async def test_a_commit_cancelled_before_its_publish_ran_leaves_no_descriptor_or_file(
    dirs: list[Path], make_store: MakeStore
) -> None:
    """A stop cancels fills mid-commit; the publish waiting for an I/O thread owns the temp
    file's descriptor, so it still runs, and the cleanup after it removes every file."""
    gate = threading.Event()

    class BusyWrites(ChunkFiles):
        def write(self, fd: int, data: bytes | bytearray | memoryview) -> None:
            if data[:1] == b"x":
                gate.wait(10)
            super().write(fd, data)

    store = await make_store(files=BusyWrites(), io_threads=1)
    obj = await store.admit(ObjectMeta("b", "k", "e", 2 * CS, "", ()))
    descriptors = len(os.listdir("/proc/self/fd"))
    first, second = await store.begin_chunk(obj, 0), await store.begin_chunk(obj, 1)
    assert first is not None and second is not None
    await first.write(expected("k", 0, 2 * CS))
    blocker = asyncio.create_task(second.write(b"x" * CS))  # holds the only I/O thread
    commit = asyncio.create_task(first.commit())
    await asyncio.sleep(0.05)
    commit.cancel()
    gate.set()
    await asyncio.gather(commit, return_exceptions=True)
    await blocker
    await second.commit()
    await store.flush()
    assert len(os.listdir("/proc/self/fd")) == descriptors
    assert sorted(obj.chunks) == [1]
    assert [p.name for p in chunk_files(*dirs)] == [Path(store.chunk_path(obj, 1)).name]
    assert store.stats()["reserved_bytes"] == 0


async def test_a_batch_whose_commit_a_stop_cancels_is_still_committed(dirs: list[Path]) -> None:
    """At close the store cancels the index's commit task; a batch already taken off the
    queue, its commit waiting for the index thread, must not be lost with it."""
    dirs[0].mkdir()
    index = Index(str(dirs[0] / "index.sqlite"), chunk_size=CS, dirs=[str(dirs[0])], batch_delay=0)
    await index.open()
    gate = threading.Event()
    busy = index._call(gate.wait, 10)  # the index thread is busy: the next commit waits
    committer = asyncio.create_task(index.run())
    index.put_chunk(new_stem("b", "k", "e", ""), 0, 0, CS, 1)
    await asyncio.sleep(0.05)
    assert index.pending == 0  # taken off the queue
    committer.cancel()
    gate.set()
    await asyncio.gather(committer, busy, return_exceptions=True)
    await index.close()
    assert rows(dirs[0]) == 1


async def test_a_commit_failing_after_its_caller_was_cancelled_is_counted(
    dirs: list[Path],
) -> None:
    class Failing(Index):
        def _commit(self, ops: list[Any]) -> tuple[int, sqlite3.Error | None]:
            if ops:
                raise OSError("disk gone")
            return super()._commit(ops)

    dirs[0].mkdir()
    index = Failing(str(dirs[0] / "index.sqlite"), chunk_size=CS, dirs=[str(dirs[0])])
    await index.open()
    gate = threading.Event()
    busy = index._call(gate.wait, 10)
    index.put_chunk(new_stem("b", "k", "e", ""), 0, 0, CS, 1)
    flush = asyncio.create_task(index.flush())
    await asyncio.sleep(0.05)
    flush.cancel()
    gate.set()
    await asyncio.gather(flush, busy, return_exceptions=True)
    await asyncio.sleep(0.05)
    assert index.errors == 1
    await index.close()


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, to fill up for real; unmounted at the end."""
    disk = tmp_path / "tmpfs"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", disk], check=True)
    yield disk
    subprocess.run(["umount", "-l", disk], check=False)


def fill_up(disk: Path) -> Path:
    filler = disk / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as f:
        while f.write(b"x" * 4096):
            pass
    return filler


async def test_a_commit_that_finds_the_disk_full_is_tried_again_once_there_is_room(
    small_fs: Path,
) -> None:
    """A drive filled before the budget knew of it: the index's commit fails with
    SQLITE_FULL. Its changes go back in front of those queued since (order kept), and
    commit once there is room; nothing is counted as lost."""
    index = Index(str(small_fs / "index.sqlite"), chunk_size=CS, dirs=[str(small_fs)])
    await index.open()
    stems = [new_stem("b", f"k{n}", "e", "") for n in range(2000)]
    for stem in stems[:1000]:
        index.put_chunk(stem, 0, 0, CS, 1)
    filler = fill_up(small_fs)
    gate = threading.Event()
    busy = index._call(gate.wait, 10)  # the commit waits for the index thread
    flush = asyncio.create_task(index.flush())
    await asyncio.sleep(0.05)
    index.delete_chunk(stems[0], 0)  # queued during the failing commit: applies after it
    for stem in stems[1000:]:
        index.put_chunk(stem, 0, 0, CS, 1)
    gate.set()
    await busy
    assert not await flush
    assert index.pending == 2001
    filler.unlink()
    assert await index.flush()
    assert (index.pending, index.errors) == (0, 0)
    await index.close()
    assert rows(small_fs) == 1999


async def test_two_flushes_refused_by_a_full_disk_keep_their_changes_in_order(
    small_fs: Path,
) -> None:
    """A fill's backpressure can flush while the commit task's flush is in progress: the
    second waits for the first, so a row and its deletion stay in that order."""
    index = Index(str(small_fs / "index.sqlite"), chunk_size=CS, dirs=[str(small_fs)])
    await index.open()
    stem = new_stem("b", "k", "e", "")
    index.put_chunk(stem, 0, 0, CS, 1)
    filler = fill_up(small_fs)
    gate = threading.Event()
    busy = index._call(gate.wait, 10)
    first = asyncio.create_task(index.flush())
    await asyncio.sleep(0.05)
    index.delete_chunk(stem, 0)
    second = asyncio.create_task(index.flush())
    await asyncio.sleep(0.05)
    gate.set()
    await busy
    assert [await first, await second] == [False, False]
    filler.unlink()
    assert await index.flush()
    await index.close()
    assert (rows(small_fs), index.errors) == (0, 0)


async def test_a_full_disk_past_the_queue_bound_drops_new_rows_keeps_deletions_and_counts(
    small_fs: Path,
) -> None:
    index = Index(str(small_fs / "index.sqlite"), chunk_size=CS, dirs=[str(small_fs)], batch_ops=50)
    await index.open()
    old = new_stem("b", "old", "e", "")
    index.put_chunk(old, 0, 0, CS, 1)
    assert await index.flush()
    for n in range(1001):  # past 20 batches
        index.put_chunk(new_stem("b", f"k{n}", "e", ""), 0, 0, CS, 1)
    index.delete_chunk(old, 0)
    filler = fill_up(small_fs)
    assert not await index.flush()
    assert (index.pending, index.errors) == (1, 1)  # the deletion
    filler.unlink()
    await index.close()
    assert rows(small_fs) == 0


async def test_changes_a_full_disk_refuses_at_close_are_counted_lost(small_fs: Path) -> None:
    index = Index(str(small_fs / "index.sqlite"), chunk_size=CS, dirs=[str(small_fs)])
    await index.open()
    fill_up(small_fs)
    for n in range(1000):
        index.put_chunk(new_stem("b", f"k{n}", "e", ""), 0, 0, CS, 1)
    await index.close()
    assert index.errors == 1


def rows(root: Path) -> int:
    with sqlite3.connect(root / "index.sqlite") as conn:
        count: int = conn.execute("SELECT count(*) FROM chunks").fetchone()[0]
    conn.close()
    return count


async def test_changed_chunk_size_starts_empty(dirs: list[Path], make_store: MakeStore) -> None:
    store = await make_store()
    await fill(store, await store.admit(ObjectMeta("b", "k", "e", CS, "", ())), 0)
    await store.close()
    other = CacheStore([str(d) for d in dirs], 40 * CS, 2 * CS, clock=Clock(), scrub_interval=0)
    await other.open()
    try:
        assert other.lookup("b", "k") is None
        await other.sweep()
        assert chunk_files(*dirs) == []
    finally:
        await other.close()


async def test_dropped_dir_keeps_the_others_chunks(tmp_path: Path, dirs: list[Path]) -> None:
    first = CacheStore([str(d) for d in dirs], 40 * CS, CS, clock=Clock(), scrub_interval=0)
    await first.open()
    obj = await first.admit(ObjectMeta("b", "k", "e", 20 * CS, "", ()))
    for index in range(20):
        await fill(first, obj, index)
    on_d0 = sorted(i for i, c in obj.chunks.items() if c.dir == 0)
    await first.close()

    second = CacheStore([str(dirs[0])], 40 * CS, CS, clock=Clock(), scrub_interval=0)
    await second.open()
    try:
        again = second.lookup("b", "k")
        assert again is not None and sorted(again.chunks) == on_d0
        for index in on_d0:
            reader = await second.open_chunk(again, index)
            assert reader is not None
            reader.close()
    finally:
        await second.close()


async def test_start_up_time_for_200k_chunk_rows(dirs: list[Path]) -> None:
    """Not a timed assertion: prints how long open() takes over a large index."""
    dirs[0].mkdir()
    index = Index(str(dirs[0] / "index.sqlite"), chunk_size=CS, dirs=[str(d) for d in dirs])
    await index.open()
    for n in range(20_000):
        stem = new_stem("bucket", f"shard-{n:06d}.tar", '"etag"', "")
        index.put_object((stem, "bucket", f"shard-{n:06d}.tar", '"etag"', "", 10 * CS, "",
                          '[["content-type", "application/x-tar"]]', 0.0, "[]"))  # fmt: skip
        for i in range(10):
            index.put_chunk(stem, i, i % 2, CS, random.getrandbits(64))
    await index.close()

    store = CacheStore([str(d) for d in dirs], 1 << 40, CS, clock=Clock(), scrub_interval=0)
    started = time.perf_counter()
    await store.open()
    elapsed = time.perf_counter() - started
    try:
        assert store.stats()["chunks"] == 200_000
        print(f"\ncache start-up with 200,000 chunk rows: {elapsed:.2f}s")
    finally:
        await store.close()


async def test_unreadable_index_starts_an_empty_cache(
    dirs: list[Path], make_store: MakeStore
) -> None:
    store = await make_store()
    await fill(store, await store.admit(ObjectMeta("b", "k", "e", CS, "", ())), 0)
    await store.close()
    for suffix in ("-wal", "-shm"):
        (dirs[0] / f"index.sqlite{suffix}").unlink(missing_ok=True)
    (dirs[0] / "index.sqlite").write_bytes(b"this is not a database" * 1000)
    store = await make_store()
    assert store.lookup("b", "k") is None
    await store.sweep()
    assert chunk_files(*dirs) == []
    await fill(store, await store.admit(ObjectMeta("b", "k", "e", CS, "", ())), 0)


async def test_the_event_position_is_saved_with_the_changes_before_it_and_read_at_open(
    dirs: list[Path],
) -> None:
    dirs[0].mkdir()
    path = str(dirs[0] / "index.sqlite")
    index = Index(path, chunk_size=CS, dirs=[str(dirs[0])])
    await index.open()
    assert index.event_position is None
    index.put_chunk(new_stem("b", "k", "e", ""), 0, 0, CS, 1)
    index.save_event_position(7)
    index.save_event_position(9)  # the batch's one position is the last
    await index.close()
    index = Index(path, chunk_size=CS, dirs=[str(dirs[0])])
    await index.open()
    assert index.event_position == 9
    await index.close()
    index = Index(path, chunk_size=2 * CS, dirs=[str(dirs[0])])  # the layout changed
    await index.open()
    assert index.event_position is None  # nothing cached is left to be stale
    await index.close()


async def test_once_changes_are_lost_no_later_event_position_is_saved(dirs: list[Path]) -> None:
    """A deletion lost with a failed commit would bring its row back at the next start;
    the position saved before it then replays the event that made it."""

    class FailingOnce(Index):
        fail = True

        def _commit(self, ops: list[Any]) -> tuple[int, sqlite3.Error | None]:
            if ops and self.fail:
                self.fail = False
                return 0, sqlite3.OperationalError("disk I/O gone wrong")
            return super()._commit(ops)

    dirs[0].mkdir()
    path = str(dirs[0] / "index.sqlite")
    index = FailingOnce(path, chunk_size=CS, dirs=[str(dirs[0])])
    index.fail = False
    await index.open()
    stem = new_stem("b", "k", "e", "")
    index.put_chunk(stem, 0, 0, CS, 1)
    index.save_event_position(3)
    assert await index.flush()
    index.fail = True
    index.delete_chunk(stem, 0)
    index.save_event_position(4)
    assert not await index.flush()  # the deletion and position 4 are lost
    index.save_event_position(5)
    await index.close()
    assert index.errors == 1
    index = Index(path, chunk_size=CS, dirs=[str(dirs[0])])
    await index.open()
    assert index.event_position == 3
    await index.close()
