"""Workers' parts: who owns a chunk among a node's workers, the node's metrics added up
from its workers', and the hand-over of chunk descriptors."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shlex
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest
from prometheus_client import Counter as PromCounter
from prometheus_client.parser import text_string_to_metric_families

from lota.cache.deliver import Deliverer
from lota.cache.fill import Filler, checked_at
from lota.cache.route import Alone
from lota.cache.service import ChunkService
from lota.cache.source import VALIDATED_AT
from lota.cache.store import CacheStore, ObjectMeta
from lota.clock import Clock
from lota.cluster.ownership import chunk_key, object_key, worker_of
from lota.cluster.peers import PeerError
from lota.config import CacheConfig, Config
from lota.metrics import Metrics
from lota.node import build
from lota.tasks import TaskGroup
from lota.workers import fds, siblings
from lota.workers.metrics import merge
from lota.workers.news import MAX_BATCH, MAX_WAITING, News
from lota.workers.news import _reads_items as news_reads_items
from lota.workers.node import descriptor_server, is_sibling, worker_name
from lota.workers.placement import MetadataHome
from lota.workers.spec import WorkerSpec

MiB = 1024 * 1024


def _keys(count: int) -> list[bytes]:
    return [chunk_key("data", f"shard-{i // 10}", '"e"', i % 10) for i in range(count)]


def test_chunks_spread_evenly_over_workers_and_few_move_when_one_is_added() -> None:
    keys = _keys(40_000)
    four = [worker_of(k, 4) for k in keys]
    counts = Counter(four)
    assert set(counts) == {0, 1, 2, 3}
    assert max(counts.values()) / (len(keys) / 4) < 1.05
    five = [worker_of(k, 5) for k in keys]
    moved = sum(a != b for a, b in zip(four, five, strict=True)) / len(keys)
    assert 0.17 < moved < 0.23  # 1/5 of them: only those the new worker takes
    assert {worker_of(k, 1) for k in keys} == {0}


def _worker(served: int, dir_name: str, healthy: int, members: int) -> bytes:
    r = CollectorRegistry()
    PromCounter("lota_requests", "S3 requests", ["operation"], registry=r).labels("GetObject").inc(
        served
    )
    Gauge("lota_cluster_members", "members", ["state"], registry=r).labels("live").set(members)
    Gauge("lota_cache_dir_healthy", "healthy", ["dir"], registry=r).labels(dir_name).set(healthy)
    Histogram("lota_request_seconds", "latency", buckets=(0.1, 1.0), registry=r).observe(0.5)
    return generate_latest(r)


async def test_the_node_metrics_are_added_up_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Parsing the siblings' metrics takes milliseconds a worker (hundreds for 64): the
    scraped worker's loop serves meanwhile."""

    class Siblings:
        async def metrics(self) -> list[bytes]:
            return [b"sibling"]

    def merge(texts: list[bytes]) -> bytes:
        time.sleep(0.2)
        return b"+".join(texts)

    monkeypatch.setattr(build, "merge", merge)
    turns = 0

    async def turn() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0.001)

    async with asyncio.TaskGroup() as group:
        turning = group.create_task(turn())
        assert await build.node_metrics(Siblings())(b"own") == b"own+sibling"  # type: ignore[arg-type]
        turning.cancel()
    assert turns >= 20  # ~1 ms a turn for 200 ms, less what the thread takes of the GIL


def test_the_node_metrics_are_its_workers_added_up_except_the_ones_each_knows_whole() -> None:
    merged = merge(
        [_worker(3, "/nvme0/lota/worker-0", 1, 6), _worker(4, "/nvme0/lota/worker-1", 0, 6)]
    )
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(merged.decode())
        for s in family.samples
    }
    assert samples[("lota_requests_total", (("operation", "GetObject"),))] == 7
    assert samples[("lota_cluster_members", (("state", "live"),))] == 6  # not 12
    # One drive, whichever worker's directory on it: failing if any worker says so.
    assert samples[("lota_cache_dir_healthy", (("dir", "/nvme0/lota"),))] == 0
    assert samples[("lota_request_seconds_count", ())] == 2
    assert samples[("lota_request_seconds_bucket", (("le", "1.0"),))] == 2
    assert b"# TYPE lota_requests_total counter" in merged


async def test_siblings_hand_over_descriptors_on_their_event_loops(tmp_path: Path) -> None:
    """Many askers at once over a few connections: each gets its own descriptor of the
    chunk held, "not held" for another, a bad request line is answered "not held" without
    breaking the connection, and nothing is left open on either side."""
    chunk = tmp_path / "chunk"
    chunk.write_bytes(b"y" * 100)
    released: list[int] = []

    async def opener(bucket: str, key: str, etag: str, index: int) -> fds.Opened | None:
        await asyncio.sleep(0)
        if key != "k":
            return None
        fd = os.open(chunk, os.O_RDONLY)
        return fd, 100, str(chunk), lambda: (os.close(fd), released.append(fd))[0]

    before = _open_descriptors()
    server = fds.FdServer(str(tmp_path / "w.fds"), opener, asyncio.get_running_loop())
    server.start()
    client = fds.FdClient(server.path)
    try:
        got = await asyncio.gather(*(client.open("b", "k", "e", 0) for _ in range(20)))
        assert all(found is not None and found[1:] == (100, str(chunk)) for found in got)
        for found in got:
            assert found is not None
            assert os.pread(found[0], 100, 0) == b"y" * 100
            os.close(found[0])
        assert len(released) == 20
        assert await client.open("b", "other", "e", 0) is None
        reader, writer = await asyncio.open_unix_connection(server.path)
        writer.write(b"not json\n" + json.dumps({"bucket": "b"}).encode() + b"\n")
        assert await reader.readline() == b'{"length": -1}\n'
        assert await reader.readline() == b'{"length": -1}\n'
        writer.close()
        # One that writes requests on and on without reading the answers is let go.
        reader, writer = await asyncio.open_unix_connection(server.path)
        writer.write(b"not json\n" * (fds.MAX_REQUEST // 4))
        try:
            rest = await asyncio.wait_for(reader.read(), 5)  # closed, not answered on
        except ConnectionResetError:
            rest = b""
        assert rest.count(b"\n") <= 1
        writer.close()
    finally:
        client.close()
        await server.close()
    with pytest.raises(OSError):
        await fds.FdClient(server.path).open("b", "k", "e", 0)
    await asyncio.sleep(0.01)
    assert len(os.listdir("/proc/self/fd")) == before


async def test_an_asker_outlives_its_sibling_and_the_sibling_a_failing_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sibling that restarted closed the connections the asker keeps: the next request
    is asked again on a new one, not failed. A release that raises does not leave the
    connection's next request unanswered. An asker closed while a request is out keeps
    no connection open after it."""
    monkeypatch.setattr(fds, "OPEN_TIMEOUT", 2.0)
    chunk = tmp_path / "chunk"
    chunk.write_bytes(b"z" * 10)

    async def opener(bucket: str, key: str, etag: str, index: int) -> fds.Opened | None:
        fd = os.open(chunk, os.O_RDONLY)

        def release() -> None:
            os.close(fd)
            if key == "fails":
                raise RuntimeError("a release that fails")

        return fd, 10, str(chunk), release

    loop = asyncio.get_running_loop()
    path = str(tmp_path / "w.fds")
    before = _open_descriptors()
    server = fds.FdServer(path, opener, loop)
    server.start()
    client = fds.FdClient(path)
    got = await client.open("b", "fails", "e", 0)  # the release raises after the answer
    assert got is not None
    os.close(got[0])
    got = await asyncio.wait_for(client.open("b", "k", "e", 0), 1)  # same connection
    assert got is not None
    os.close(got[0])
    await server.close()
    server = fds.FdServer(path, opener, loop)  # the sibling, restarted
    server.start()
    try:
        got = await client.open("b", "k", "e", 0)
        assert got is not None and os.pread(got[0], 10, 0) == b"z" * 10
        os.close(got[0])
        asking = asyncio.ensure_future(client.open("b", "k", "e", 0))
        await asyncio.sleep(0)
        client.close()
        got = await asking
        assert got is not None
        os.close(got[0])
    finally:
        client.close()
        await server.close()
    await asyncio.sleep(0.01)
    assert len(os.listdir("/proc/self/fd")) == before


async def test_a_chunk_that_opens_after_the_asker_gave_up_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner took longer than OPEN_TIMEOUT to open the chunk: the asker gives up
    (TimeoutError), and the descriptor the late open produced is released, not leaked."""
    monkeypatch.setattr(fds, "OPEN_TIMEOUT", 0.1)
    chunk = tmp_path / "chunk"
    chunk.write_bytes(b"x" * 100)
    released = asyncio.Event()

    async def slow_open(bucket: str, key: str, etag: str, index: int) -> fds.Opened:
        await asyncio.sleep(0.3)
        fd = os.open(chunk, os.O_RDONLY)
        return fd, 100, str(chunk), lambda: (os.close(fd), released.set())[1]

    server = fds.FdServer(str(tmp_path / "w.fds"), slow_open, asyncio.get_running_loop())
    server.start()
    client = fds.FdClient(server.path)
    try:
        with pytest.raises(TimeoutError):
            await client.open("b", "k", "e", 0)
        await asyncio.wait_for(released.wait(), 5)
    finally:
        client.close()
        await server.close()


class _SlowFds:
    """An FdClient that hands over a new descriptor of `path` for every request, slowly
    as a busy sibling does."""

    def __init__(self, path: Path) -> None:
        self.path = path

    async def open(self, bucket: str, key: str, etag: str, index: int) -> fds.Handed:
        await asyncio.sleep(0.05)
        return os.open(self.path, os.O_RDONLY), 8 * 1024 * 1024, str(self.path)

    def close(self) -> None:
        pass


async def test_readers_racing_for_one_sibling_chunk_all_get_an_open_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many readers ask for the same chunk at once, each handed a descriptor: one is kept
    and shared, the others closed, and none is closed while a reader holds it."""
    monkeypatch.setattr(siblings, "KEPT_BYTES", 16 * 1024 * 1024)  # two chunks' worth
    chunk = tmp_path / "chunk"
    chunk.write_bytes(b"x" * 100)
    source = siblings.SiblingSource(1, SimpleNamespace(name="worker-1"), _SlowFds(chunk))  # type: ignore[arg-type]
    meta = SimpleNamespace(bucket="b", key="k", etag='"e"')
    before = _open_descriptors()
    opened = await asyncio.gather(*(source.open(meta, 0) for _ in range(10)))  # type: ignore[arg-type]
    assert all(o is not None and o.fd >= 0 for o in opened)
    assert all(os.pread(o.fd, 1, 0) == b"x" for o in opened if o is not None)
    for o in opened:
        assert o is not None
        o.close()
    assert len(os.listdir("/proc/self/fd")) - before == 1  # the one kept
    source.close()
    assert len(os.listdir("/proc/self/fd")) == before


def _open_descriptors() -> int:
    """This process's open descriptors, once what earlier tests left to the cycle
    collector is collected: collected during a test, it closed sockets of theirs, and the
    count fell (21 against 25 in one CI run). Taken before a test's work only, so that
    what the test itself leaves to the collector still shows."""
    gc.collect()
    return len(os.listdir("/proc/self/fd"))


class _Handing:
    """A sibling's descriptor socket handing over one file per key, counting hand-overs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.asked: list[str] = []

    async def open(self, bucket: str, key: str, etag: str, index: int) -> fds.Handed:
        self.asked.append(key)
        path = self.root / key
        return os.open(path, os.O_RDONLY), path.stat().st_size, str(path)

    def close(self) -> None:
        pass


async def test_a_sibling_s_chunks_are_kept_open_or_reopened_from_their_path(
    tmp_path: Path,
) -> None:
    """The node keeps as many of its siblings' descriptors as the store keeps of its own
    (lota.node.cache), the least recently used beyond that closed; a chunk handed over
    before is opened again from its path without asking the sibling, unless its file is
    gone or changed length (then the sibling is asked)."""
    fds = _Handing(tmp_path)
    for i in range(5):
        (tmp_path / f"k{i}").write_bytes(bytes([i]) * (100 + i))
    source = siblings.SiblingSource(1, SimpleNamespace(name="worker-1"), fds, 3)  # type: ignore[arg-type]
    before = _open_descriptors()
    metas = [SimpleNamespace(bucket="b", key=f"k{i}", etag='"e"') for i in range(5)]
    for meta in metas:
        opened = await source.open(meta, 0)  # type: ignore[arg-type]
        assert opened is not None
        opened.close()
    assert len(os.listdir("/proc/self/fd")) - before == 3
    (tmp_path / "k1").unlink()
    (tmp_path / "k2").write_bytes(b"longer than it was")
    kept = [source.kept(m, 0) for m in metas]  # type: ignore[arg-type]
    assert [k is not None for k in kept] == [True, False, False, True, True]
    assert kept[0] is not None and os.pread(kept[0].fd, 200, 0) == bytes([0]) * 100
    assert fds.asked == ["k0", "k1", "k2", "k3", "k4"]  # k0 was reopened, not asked for
    for k in kept:
        if k is not None:
            k.close()
    assert len(os.listdir("/proc/self/fd")) - before == 3
    source.close()
    assert len(os.listdir("/proc/self/fd")) == before


async def test_what_is_known_in_memory_of_a_sibling_s_chunk_outlives_its_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk a sibling has just written is in memory (lota.cache.store.reader.Warm):
    sent from the page cache from its first hit here. What a read learns of it stays
    known when its descriptor is closed (more chunks than are kept) and it is reopened
    from its path, for a while (WARM_FOR); a new file for the chunk starts unknown."""
    for i in range(3):
        (tmp_path / f"k{i}").write_bytes(bytes([i]) * 100)
    source = siblings.SiblingSource(1, SimpleNamespace(name="worker-1"), _Handing(tmp_path), 1)  # type: ignore[arg-type]
    metas = [SimpleNamespace(bucket="b", key=f"k{i}", etag='"e"') for i in range(3)]
    ids = [(m.bucket, m.key, m.etag, 0) for m in metas]
    source.remember(ids[0], str(tmp_path / "k0"), 100, written=True)
    source.remember(ids[1], str(tmp_path / "k1"), 100)
    warm = []
    for meta in metas[:2]:
        opened = source.kept(meta, 0)  # type: ignore[arg-type]
        assert opened is not None
        warm.append(opened.warm)
        opened.warm = (0, 50)  # as a read of its first 50 bytes leaves it
        opened.close()
    assert warm == [(0, 100), None]
    again = source.kept(metas[0], 0)  # type: ignore[arg-type]  # k1's closed, k0 reopened
    assert again is not None and again.warm == (0, 50)
    again.close()
    source.remember(ids[1], str(tmp_path / "k1"), 100, written=True)  # known: stays so
    one = source.kept(metas[1], 0)  # type: ignore[arg-type]  # k0's closed
    assert one is not None and one.warm == (0, 50)
    one.close()
    source.remember(ids[0], str(tmp_path / "k2"), 100)  # filled again, in another file
    other = source.kept(metas[0], 0)  # type: ignore[arg-type]
    assert other is not None and other.warm is None and os.pread(other.fd, 1, 0) == b"\x02"
    other.warm = (0, 100)
    other.close()
    source.remember(ids[0], str(tmp_path / "k0"), 100)  # ...and back while k2's was kept
    assert source.kept(metas[1], 0) is not None  # k2's closed: what it knew is not k0's
    assert source._paths[ids[0]].warm is None
    # Trusted for WARM_FOR after the file's last read, no longer.
    source.remember(ids[2], str(tmp_path / "k2"), 100, written=True)
    later = time.monotonic() + siblings.WARM_FOR + 1
    monkeypatch.setattr(siblings, "time", SimpleNamespace(monotonic=lambda: later))
    stale = source.kept(metas[2], 0)  # type: ignore[arg-type]
    assert stale is not None and stale.warm is None
    stale.warm = (0, 100)
    stale.close()
    much_later = later + siblings.WARM_FOR + 1
    monkeypatch.setattr(siblings, "time", SimpleNamespace(monotonic=lambda: much_later))
    idle = source.kept(metas[2], 0)  # type: ignore[arg-type]  # its descriptor still kept
    assert idle is stale and idle.warm is None
    idle.close()
    source.close()


def test_a_sibling_s_chunk_larger_than_all_kept_may_pin_is_read_then_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(siblings, "KEPT_BYTES", 50)
    (tmp_path / "big").write_bytes(b"b" * 100)
    source = siblings.SiblingSource(1, SimpleNamespace(name="worker-1"), _Handing(tmp_path), 4)  # type: ignore[arg-type]
    source.remember(("b", "big", '"e"', 0), str(tmp_path / "big"), 100)
    opened = source.kept(SimpleNamespace(bucket="b", key="big", etag='"e"'), 0)  # type: ignore[arg-type]
    assert opened is not None and not opened.kept and os.pread(opened.fd, 1, 0) == b"b"
    opened.close()
    assert opened.fd == -1
    source.close()


def test_a_sibling_s_chunks_read_in_a_loop_keep_part_of_themselves_open(
    tmp_path: Path, opened_files: list[str]
) -> None:
    """As the store's own descriptors (fdcache.KEEP_EVERY): twice as many of a sibling's
    chunks as descriptors kept, read in a loop, are not each opened again for each read."""
    metas = [SimpleNamespace(bucket="b", key=f"k{i}", etag='"e"') for i in range(16)]
    source = siblings.SiblingSource(1, SimpleNamespace(name="worker-1"), _Handing(tmp_path), 8)  # type: ignore[arg-type]
    for i, meta in enumerate(metas):
        (tmp_path / meta.key).write_bytes(bytes([i]) * 100)
        source.remember((meta.bucket, meta.key, meta.etag, 0), str(tmp_path / meta.key), 100)
    opened = opened_files
    for rounds in (3, 10):
        opened.clear()
        for _ in range(rounds):
            for i, meta in enumerate(metas):
                got = source.kept(meta, 0)  # type: ignore[arg-type]
                assert got is not None and os.pread(got.fd, 1, 0) == bytes([i])
                got.close()
    assert len(opened) <= 0.75 * 10 * 16  # least recently used: all 160
    source.close()


def test_a_sibling_is_a_worker_of_this_node_never_a_host_named_like_one() -> None:
    assert is_sibling(worker_name(0)) and is_sibling(worker_name(12))
    for member in ("worker-12.gpu.internal:7070", "worker-3:9000", "10.0.0.5:9000", "worker-"):
        assert not is_sibling(member)


async def test_a_worker_is_ready_once_its_siblings_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from aiohttp import web

    from lota.workers.node import siblings as sibling_sessions
    from lota.workers.spec import WorkerSpec

    spec = WorkerSpec(index=0, count=3, listen_fd=-1, run_dir=str(tmp_path), secret="s")
    runners = []

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def answer(index: int) -> None:
        app = web.Application()
        app.router.add_get("/_lota/healthz", ok)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.UnixSite(runner, spec.http_socket(index)).start()
        runners.append(runner)

    try:
        async with sibling_sessions(spec) as found:
            await answer(1)
            await asyncio.sleep(0.3)
            # worker-2 is still starting: readyz says so
            assert found.waiting() == "waiting for sibling workers to answer: worker-2"
            await answer(2)
            for _ in range(100):
                if not found.waiting():
                    break
                await asyncio.sleep(0.02)
            assert found.waiting() == ""
        # A sibling that never answers holds a worker back for MEET_TIMEOUT only.
        monkeypatch.setattr("lota.workers.node.MEET_TIMEOUT", 0.2)
        alone = WorkerSpec(index=0, count=2, listen_fd=-1, run_dir=str(tmp_path / "x"), secret="")
        async with sibling_sessions(alone) as found:
            await asyncio.sleep(0.5)
            assert not found.waiting()
    finally:
        for runner in runners:
            await runner.cleanup()


def _abandoned_socket(path: Path) -> None:
    """A Unix socket file at `path` whose listener is gone (a worker killed)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))


def _gone_pid() -> int:
    """The id of a process that has exited (a supervisor killed)."""
    probe = subprocess.Popen(["true"])
    probe.wait()
    return probe.pid


def test_a_worker_leaving_after_its_supervisor_takes_the_run_directory_with_the_last_one(
    tmp_path: Path,
) -> None:
    """A worker that leaves once its supervisor was killed removes its own sockets, its
    killed siblings' (nobody listens on them), and the run directory once no living
    sibling's sockets are left in it; under a living supervisor, only its own."""
    from lota.workers.spec import WorkerSpec

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for name in ("worker-0.http", "worker-0.fds", "worker-1.http", "worker-1.fds"):
        _abandoned_socket(run_dir / name)
    (run_dir / "notes").write_text("not a socket: not ours to judge")
    living = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    living.bind(str(run_dir / "worker-2.fds"))
    living.listen(1)
    try:
        spec = WorkerSpec(index=0, count=3, listen_fd=-1, run_dir=str(run_dir), secret="s")
        served = replace(spec, supervisor=os.getppid())  # still there
        served.leave()
        assert sorted(p.name for p in run_dir.iterdir()) == [
            "notes", "worker-1.fds", "worker-1.http", "worker-2.fds"
        ]  # fmt: skip
        orphan = replace(spec, supervisor=_gone_pid())
        orphan.leave()
        assert sorted(p.name for p in run_dir.iterdir()) == ["notes", "worker-2.fds"]
    finally:
        living.close()
    (run_dir / "notes").unlink()
    replace(orphan, index=2).leave()  # worker 2, the last one out
    assert not run_dir.exists()


_WORKER_STARTING = """
import os, sys, time
from lota.workers.spec import WorkerSpec
spec = WorkerSpec(index=0, count=2, listen_fd=-1, run_dir=sys.argv[1], secret="s",
                  supervisor=int(sys.argv[2]) or os.getppid())
spec.stop_with_supervisor()
print(os.getpid(), flush=True)
time.sleep(60)  # its configuration loading, say
print("served", flush=True)
"""


def test_a_worker_whose_supervisor_is_gone_before_it_serves_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    """Its supervisor dead already as it starts, or killed while it loads its settings (the
    kernel's SIGTERM before the event loop handles it): the worker stops at once, and the
    run directory goes with it (its killed sibling's socket included)."""
    dead = tmp_path / "dead"
    dead.mkdir()
    _abandoned_socket(dead / "worker-1.http")
    started = subprocess.run(
        [sys.executable, "-c", _WORKER_STARTING, str(dead), str(_gone_pid())],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert started.returncode == 143, started.stderr
    assert "served" not in started.stdout
    assert not dead.exists()

    killed = tmp_path / "killed"
    killed.mkdir()
    _abandoned_socket(killed / "worker-1.fds")
    script = shlex.join([sys.executable, "-c", _WORKER_STARTING, str(killed), "0"])
    with subprocess.Popen(["sh", "-c", f"{script} & wait"], stdout=subprocess.PIPE) as supervisor:
        try:
            assert supervisor.stdout is not None
            worker = int(supervisor.stdout.readline())
        finally:
            supervisor.kill()
    deadline = time.monotonic() + 20
    while _running(worker):
        assert time.monotonic() < deadline, "the worker outlived its supervisor"
        time.sleep(0.05)
    assert not killed.exists()


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class _Answers:
    """A source whose HEADs answer `status` (or raise `fails`), recording what was asked."""

    kind = "origin"
    name = "us-east"

    def __init__(self, status: int = 200, fails: Exception | None = None) -> None:
        self.status, self.fails, self.asked = status, fails, []

    @asynccontextmanager
    async def head(self, bucket: str, key: str, **given: object) -> AsyncIterator[SimpleNamespace]:
        self.asked.append((key, given))
        if self.fails is not None:
            raise self.fails
        yield SimpleNamespace(status=self.status, headers={})


def _home_elsewhere(count: int = 2) -> str:
    """A key whose metadata lives with worker 1 of `count`, not worker 0."""
    return next(
        k for k in (f"k{i}" for i in range(100)) if worker_of(object_key("b", k), count) == 1
    )


@pytest.mark.parametrize(
    ("sibling", "usable", "from_sibling"),
    [
        (_Answers(200), True, True),
        (_Answers(404), True, True),  # the origin's refusal, as the sibling heard it
        (_Answers(503), True, False),  # draining: the origin
        (_Answers(fails=PeerError("gone")), True, False),  # restarting: the origin
        (_Answers(200), False, False),  # in its back-off: not even asked
    ],
)
async def test_a_worker_learns_an_object_from_its_home_sibling_else_from_the_origin(
    sibling: _Answers, usable: bool, from_sibling: bool
) -> None:
    origin = _Answers(200)
    home = MetadataHome(origin, 0, {1: sibling}, lambda name: usable)  # type: ignore[dict-item]
    key = _home_elsewhere()
    async with home.head("b", key) as reply:
        assert reply.status == (sibling.status if from_sibling else 200)
    assert len(origin.asked) == (0 if from_sibling else 1)
    assert len(sibling.asked) == (1 if usable else 0)


async def test_revalidations_and_parts_ask_the_origin_never_a_sibling() -> None:
    origin, sibling = _Answers(200), _Answers(200)
    home = MetadataHome(origin, 0, {1: sibling}, lambda name: True)  # type: ignore[dict-item]
    key = _home_elsewhere()
    async with home.head("b", key, if_none_match='"e"'):
        pass
    async with home.head("b", key, part=2):
        pass
    assert sibling.asked == []
    assert [given for _, given in origin.asked] == [
        {"part": None, "if_none_match": '"e"'},
        {"part": 2, "if_none_match": ""},
    ]


@pytest.mark.parametrize(
    ("said", "taken"),
    [(None, 1000.0), ("900.5", 900.5), ("1200", 1000.0), ("soon", 1000.0), ("nan", 1000.0)],
)
def test_metadata_from_another_lota_is_as_old_as_its_last_check_never_younger(
    said: str | None, taken: float
) -> None:
    headers = {} if said is None else {VALIDATED_AT: said}
    assert checked_at(SimpleNamespace(headers=headers), now=1000.0) == taken  # type: ignore[arg-type]


@asynccontextmanager
async def _worker_store(root: Path) -> AsyncIterator[ChunkService]:
    clock = Clock()
    store = CacheStore([str(root)], 64 * MiB, MiB, clock=clock, scrub_interval=0, sweep_delay=3600)
    await store.open()
    tasks = TaskGroup("fills")
    try:
        yield ChunkService(store, Filler(store, MiB, Metrics(), clock, tasks, 2))
    finally:
        await tasks.close()
        await store.close()


def _meta(key: str, validated_at: float, etag: str = '"e"') -> ObjectMeta:
    return ObjectMeta("b", key, etag, 100, "Sun, 06 Dec 2026 05:00:00 GMT",
                      (("content-type", "text/plain"),), validated_at=validated_at)  # fmt: skip


async def test_news_waiting_for_a_sibling_that_does_not_take_it_is_bounded_by_bytes(
    tmp_path: Path,
) -> None:
    """A sibling that takes no line (stuck, restarting) gets at most MAX_WAITING bytes of
    news waiting for it, however large the items: the rest is dropped and counted."""

    class Stuck:
        async def tell(self, line: bytes) -> None:
            await asyncio.Event().wait()

    async with _worker_store(tmp_path / "w0") as cache:
        metrics = Metrics()
        news = News(0, cache, {}, {1: Stuck()}, metrics, [str(tmp_path / "w0")])  # type: ignore[dict-item]
        told = {"raw": "x" * 20_000}
        size = len(json.dumps({"answer": told}, separators=(",", ":")))
        for _ in range(1000):
            news.answered(told)
        await asyncio.sleep(0)
        dropped = metrics.worker_news.labels("dropped")._value.get()
        # One batch is on its way; what waits behind it stays within the bound.
        assert 1000 - dropped <= MAX_BATCH // size + MAX_WAITING // size + 1
        assert dropped >= 1000 - (MAX_BATCH + MAX_WAITING) // size - 2
        await news.close()


async def test_a_worker_hears_what_its_siblings_learn_unless_it_knows_better(
    tmp_path: Path,
) -> None:
    """Worker 0 tells worker 1 what its store learns from the origin (metadata, admitted
    there as asked at the same moment) and the chunks it publishes (opened there from
    their path, without asking, known to be in memory). Metadata asked before worker 1 dropped an entry (a write)
    is let pass; what worker 1 checked more recently stands; a copy's metadata (not the
    origin's answer) is not told; a path outside the node's cache is refused."""
    async with _worker_store(tmp_path / "w0") as cache0, _worker_store(tmp_path / "w1") as cache1:
        metrics0, metrics1 = Metrics(), Metrics()
        client = fds.FdClient(str(tmp_path / "w1.fds"))
        handing = _Handing(tmp_path)
        source = siblings.SiblingSource(0, SimpleNamespace(name="worker-0"), handing)  # type: ignore[arg-type]
        news0 = News(0, cache0, {}, {1: client}, metrics0, [str(tmp_path / "w0")])
        news1 = News(1, cache1, {0: source}, {}, metrics1, [str(tmp_path / "w1")])
        cache0.watch(news0)

        async def unopenable(*asked: object) -> None:
            return None

        loop = asyncio.get_running_loop()
        server = fds.FdServer(str(tmp_path / "w1.fds"), unopenable, loop, news1.hear)
        server.start()
        try:
            await cache1.admit(_meta("newer-here", 2000.0))
            asked = time.monotonic()
            await cache1.invalidate("b", "raced")  # a write landed after worker 0 asked
            await cache0.admit(_meta("raced", 1000.0), since=asked, tell=True)
            await cache0.admit(_meta("k", 1000.0), since=time.monotonic(), tell=True)
            await cache0.admit(_meta("newer-here", 1500.0), since=time.monotonic(), tell=True)
            await cache0.admit(_meta("a-copy", 1000.0), since=time.monotonic())  # not told
            chunk = tmp_path / "chunk"
            chunk.write_bytes(b"z" * 100)
            news0.published(_meta("k", 1000.0), 0, str(chunk), 100)
            news0.published(_meta("k", 1000.0), 1, "/etc/passwd", 100)
            for _ in range(200):
                if _counted(metrics1, "lota_worker_news_total", result="refused") == 1:
                    break
                await asyncio.sleep(0.01)
            validated = {
                key: found.meta.validated_at if (found := cache1.lookup("b", key)) else None
                for key in ("k", "raced", "newer-here", "a-copy")
            }
            assert validated == {"k": 1000.0, "raced": None, "newer-here": 2000.0, "a-copy": None}
            opened = source.kept(_meta("k", 1000.0), 0)
            assert opened is not None and os.pread(opened.fd, 100, 0) == b"z" * 100
            assert opened.warm == (0, 100)  # just written: sent from the page cache at once
            opened.close()
            assert source.kept(_meta("k", 1000.0), 1) is None
            assert handing.asked == []  # opened from its path, not handed over
            results = ("sent", "heard", "stale", "refused")
            assert [_counted(metrics0, "lota_worker_news_total", result=r) for r in results] == [
                5,
                0,
                0,
                0,
            ]
            # Told nothing back: what worker 1 heard is not news from it.
            assert [_counted(metrics1, "lota_worker_news_total", result=r) for r in results] == [
                0,
                3,
                1,
                1,
            ]
        finally:
            await news0.close()
            await news1.close()
            client.close()
            source.close()
            await server.close()


@asynccontextmanager
async def _telling(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    known: Callable[[str], bool] = lambda name: True,
) -> AsyncIterator[SimpleNamespace]:
    """Two workers' news over a real descriptor socket: worker 0 serves worker 1's chunks
    (`source`, handed over by `handing`) and tells it of their reads (`news0`); worker 1
    hears them (`news1`), its store's told_reads spied on (`told`, by chunk file name;
    `known(name)`: what it answers)."""
    async with _worker_store(tmp_path / "w0") as cache0, _worker_store(tmp_path / "w1") as cache1:
        told: Counter[str] = Counter()

        def spy(name: str, times: int) -> bool:
            told[name] += times
            return known(name)

        monkeypatch.setattr(cache1, "told_reads", spy)
        metrics0, metrics1 = Metrics(), Metrics()
        client = fds.FdClient(str(tmp_path / "w1.fds"))
        handing = _Handing(tmp_path)
        source = siblings.SiblingSource(1, SimpleNamespace(name="worker-1"), handing, 2)  # type: ignore[arg-type]
        news0 = News(0, cache0, {1: source}, {1: client}, metrics0, [str(tmp_path / "w0")])
        news1 = News(1, cache1, {}, {}, metrics1, [str(tmp_path / "w1")])

        async def unopenable(*asked: object) -> None:
            return None

        server = fds.FdServer(
            str(tmp_path / "w1.fds"), unopenable, asyncio.get_running_loop(), news1.hear
        )
        server.start()
        try:
            yield SimpleNamespace(
                source=source,
                handing=handing,
                news0=news0,
                news1=news1,
                told=told,
                metrics0=metrics0,
                metrics1=metrics1,
            )
        finally:
            await news0.close()
            await news1.close()
            client.close()
            source.close()
            await server.close()


async def test_a_worker_tells_each_sibling_how_often_it_read_its_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker counts the reads of a sibling's chunks it serves, from a descriptor handed
    over, kept or opened again from its path, and tells the sibling, which counts them as
    its own hits (CacheStore.told_reads). Opening a chunk is not a read: asking whether the
    sibling holds it, or bringing it to hand for a read counted later. Reads told wrong are
    refused."""
    # As if k2's object were no longer there.
    async with _telling(tmp_path, monkeypatch, lambda name: name != "k2") as pair:
        source, handing, news0, news1, told = (
            pair.source,
            pair.handing,
            pair.news0,
            pair.news1,
            pair.told,
        )
        metrics0, metrics1 = pair.metrics0, pair.metrics1
        metas = [_meta(f"k{i}", 1000.0) for i in range(3)]
        for meta in metas:
            (tmp_path / meta.key).write_bytes(b"x" * 100)

        async def read(meta: ObjectMeta, *, for_a_client: bool = True) -> None:
            opened = await source.open(meta, 0)
            assert opened is not None
            if for_a_client:
                opened.read()
            opened.close()

        await read(metas[0])  # handed over
        for _ in range(3):
            await read(metas[0])  # kept
        await read(metas[1], for_a_client=False)  # handed over, to see whether it is held
        await read(metas[1])  # kept
        await read(metas[2])  # handed over: k0's descriptor is closed (2 kept)
        await read(metas[0])  # opened again from its path
        await read(metas[2], for_a_client=False)  # brought to hand: read later, or not
        assert handing.asked == ["k0", "k1", "k2"]
        await news0.tell_reads()
        assert source.take_reads() == {}
        await read(metas[1])
        assert source.take_reads() == {"k1": 1}  # counted again since
        for _ in range(200):
            if _counted(metrics1, "lota_worker_news_total", result="heard"):
                break
            await asyncio.sleep(0.01)
        assert told == {
            "k0": 5,
            "k1": 1,
            "k2": 1,
        }
        for wrong in (
            ["k0", 0],
            ["k0"],
            ["k0", 1 << 30],
            ["k0", float("inf")],  # JSON's Infinity
        ):
            await news1.hear({"from": 0, "news": [{"reads": [wrong]}]})
        assert _counted(metrics1, "lota_worker_news_total", result="refused") == 4
        reads = "lota_worker_sibling_reads_total"
        assert _counted(metrics0, reads, result="told") == 7
        assert _counted(metrics1, reads, result="heard") == 6
        assert _counted(metrics1, reads, result="unknown") == 1


async def test_the_reads_of_many_chunks_are_told_and_heard_a_group_at_a_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second's reads of thousands of a sibling's chunks, taken, encoded and counted all
    at once, held both workers' loops for milliseconds: they are taken and told, and
    heard, a group at a time with the loop serving in between, each read told once."""
    async with _telling(tmp_path, monkeypatch) as pair:
        source, news0, news1, told = pair.source, pair.news0, pair.news1, pair.told
        turns = 0
        waiting: set[int] = set()  # what was left to take each time the loop turned

        async def turn() -> None:
            nonlocal turns
            while True:
                turns += 1
                waiting.add(source.reads_waiting)
                await asyncio.sleep(0)

        async with asyncio.TaskGroup() as group:
            turning = group.create_task(turn())
            files = [f"{i:032x}.0" for i in range(1000)]
            opened = [siblings.OpenChunk(-1, 100, f"/c/{n}", None, source._told) for n in files]
            for i, chunk in enumerate(opened):
                for _ in range(1 + i % 3):
                    chunk.read()
            assert source.reads_waiting == 1000
            before = turns
            await news0.tell_reads()
            assert turns - before >= 1000 // 256  # the loop turned between two groups
            assert {744, 488, 232} <= waiting  # each time with a group taken, not all
            assert source.reads_waiting == 0
            expected = {name: 1 + i % 3 for i, name in enumerate(files)}
            for _ in range(500):
                if told == expected:
                    break
                await asyncio.sleep(0.01)
            assert told == expected
            told.clear()
            before = turns
            await news1.hear({"from": 0, "news": [{"reads": [[n, 1] for n in files[:200]]}]})
            assert turns - before >= 200 // 64
            assert told == dict.fromkeys(files[:200], 1)
            opened[0].read()
            opened[1].read()
            opened[1].read()
            assert source.take_reads(1) == {files[0]: 1}  # the first read, the rest wait
            assert source.reads_waiting == 1
            assert source.take_reads() == {files[1]: 2}
            turning.cancel()


async def test_reads_beyond_the_chunks_a_worker_keeps_count_of_are_counted_untold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More of a sibling's chunks read between two news than MAX_TOLD: the reads of the
    others go untold, and are counted so (lota_worker_sibling_reads_total{result="untold"})."""
    monkeypatch.setattr(siblings, "MAX_TOLD", 2)
    async with _worker_store(tmp_path / "w0") as cache:
        metrics = Metrics()
        source = siblings.SiblingSource(1, SimpleNamespace(name="worker-1"), _Handing(tmp_path), 2)  # type: ignore[arg-type]
        news = News(0, cache, {1: source}, {}, metrics, [str(tmp_path / "w0")])
        try:
            opened = [
                siblings.OpenChunk(-1, 100, f"/c/{i}.0", None, source._told) for i in range(4)
            ]
            for chunk in opened:
                chunk.read()
            opened[0].read()  # in the list already: counted
            opened[3].read()
            assert source.reads_waiting == 2
            await news.tell_reads()
            reads = "lota_worker_sibling_reads_total"
            assert _counted(metrics, reads, result="untold") == 3
            assert source.take_untold() == 0  # taken by the news
            opened[2].read()  # room again
            assert source.take_reads() == {"2.0": 1}
        finally:
            await news.close()
            source.close()


async def test_handing_a_chunk_to_a_sibling_is_not_a_read_of_it(tmp_path: Path) -> None:
    """The owner hands a chunk's descriptor over without counting a hit (or, for a chunk
    it does not hold, a miss): the sibling tells of its reads itself, naming the chunk by
    its file. Nor is bringing a chunk's bytes to hand for an answer a read: the answer is
    (one hit)."""
    async with _worker_store(tmp_path / "w0") as cache:
        store = cache._store
        obj = await store.admit(_meta("k", 1000.0))
        writer = await store.begin_chunk(obj, 0)
        assert writer is not None
        await writer.write(b"z" * 100)
        await writer.commit()
        spec = WorkerSpec(index=0, count=2, listen_fd=-1, run_dir=str(tmp_path), secret="s")

        async def hear(told: dict[str, object]) -> None:
            pass

        async with descriptor_server(spec, cache, hear):
            client = fds.FdClient(spec.fd_socket(0))
            try:
                for _ in range(3):
                    handed = await client.open("b", "k", '"e"', 0)
                    assert handed is not None and os.pread(handed[0], 200, 0) == b"z" * 100
                    os.close(handed[0])
                assert await client.open("b", "other", '"e"', 0) is None
            finally:
                client.close()
        assert (store.stats()["hits"], store.stats()["misses"]) == (0, 0)
        assert cache.told_reads(os.path.basename(cache.chunk_path(obj, 0)), 3)
        assert not cache.told_reads("0" * 32 + ".0", 1)  # no such admission here
        for wrong in (f"{obj.stem}.9", f"{obj.stem}", "k.x"):  # not one of its chunks' files
            with pytest.raises(ValueError):
                cache.told_reads(wrong, 1)
        assert store.stats()["hits"] == 0  # the sibling's
        deliverer = Deliverer(cache, Metrics(), 1)
        try:
            here = Alone(cache, None)  # type: ignore[arg-type]
            assert await deliverer.bring_to_hand(here, obj, 0, 99)
            assert store.stats()["hits"] == 0
            assert deliverer.read_now(here, obj, 0, 99) == b"z" * 100
            assert store.stats()["hits"] == 1
        finally:
            deliverer.close()


class _NotHere:
    """A worker's cache holding none of its sibling's chunks (chunks of 1,000 bytes)."""

    chunk_size = 1000

    def read_hot(self, *args: object) -> None:
        return None

    def has_chunk(self, *args: object) -> bool:
        return False


class _Elsewhere:
    """A placement whose chunks are all `source`'s, a sibling's."""

    def __init__(self, source: siblings.SiblingSource) -> None:
        self._source = source

    def kept_elsewhere(self, obj: SimpleNamespace, index: int) -> siblings.OpenChunk | None:
        return self._source.kept(obj.meta, index)

    async def open_elsewhere(self, obj: SimpleNamespace, index: int) -> siblings.OpenChunk | None:
        return await self._source.open(obj.meta, index)


async def test_a_read_of_a_sibling_s_chunk_counts_once_wherever_its_bytes_came_from(
    tmp_path: Path,
) -> None:
    """A GET answered at once from a sibling's chunk counts one read, told to the sibling:
    when its bytes were first brought to hand (handed over, read on a thread), and when
    its descriptor was kept but its pages were gone (read_now finds nothing and the read
    is served the slow way). Nothing is counted for bytes not read."""

    (tmp_path / "k").write_bytes(b"x" * 1000)
    obj = SimpleNamespace(meta=SimpleNamespace(bucket="b", key="k", etag='"e"'), alive=True)
    chunk = "k"  # its file's name
    source = siblings.SiblingSource(1, SimpleNamespace(name="worker-1"), _Handing(tmp_path), 8)  # type: ignore[arg-type]

    deliverer = Deliverer(_NotHere(), Metrics(), 1)  # type: ignore[arg-type]
    placement: Any = _Elsewhere(source)
    try:
        assert deliverer.read_now(placement, obj, 0, 99) is None  # type: ignore[arg-type]
        assert await deliverer.bring_to_hand(placement, obj, 0, 99)  # type: ignore[arg-type]
        assert source.take_reads() == {}
        assert deliverer.read_now(placement, obj, 0, 99) == b"x" * 100  # type: ignore[arg-type]
        assert source.take_reads() == {chunk: 1}
        with mock.patch("lota.cache.deliver.read_or_span", return_value=None):
            assert deliverer.read_now(placement, obj, 0, 99) is None  # type: ignore[arg-type]
        assert source.take_reads() == {}
        assert await deliverer.read_cached(placement, obj, 0, 99) == b"x" * 100  # type: ignore[arg-type]
        assert source.take_reads() == {chunk: 1}
    finally:
        deliverer.close()
        source.close()


async def test_a_read_of_several_chunks_counts_each_once_when_all_are_found(
    tmp_path: Path,
) -> None:
    """A small range across two of a sibling's chunks, the first at hand and the second
    not: nothing is counted until both are found (else the first would count again when
    the read is tried anew)."""

    class ByIndex(_Handing):
        async def open(self, bucket: str, key: str, etag: str, index: int) -> fds.Handed:
            return await super().open(bucket, f"{key}.{index}", etag, index)

    for index in range(2):
        (tmp_path / f"k.{index}").write_bytes(b"x" * 1000)
    meta = SimpleNamespace(bucket="b", key="k", etag='"e"')
    obj = SimpleNamespace(meta=meta, alive=True)
    source = siblings.SiblingSource(1, SimpleNamespace(name="worker-1"), ByIndex(tmp_path), 8)  # type: ignore[arg-type]

    deliverer = Deliverer(_NotHere(), Metrics(), 1)  # type: ignore[arg-type]
    placement: Any = _Elsewhere(source)
    try:
        first = await source.open(meta, 0)  # type: ignore[arg-type]
        assert first is not None
        first.close()  # chunk 0 kept here, chunk 1 not yet
        for _ in range(2):
            assert deliverer.read_now(placement, obj, 900, 1099) is None  # type: ignore[arg-type]
        assert await deliverer.bring_to_hand(placement, obj, 900, 1099)  # type: ignore[arg-type]
        assert deliverer.read_now(placement, obj, 900, 1099) == b"x" * 200  # type: ignore[arg-type]
        assert source.take_reads() == {"k.0": 1, "k.1": 1}
        opened_before = source.open

        async def chunk_2_not_held(meta: Any, index: int) -> siblings.OpenChunk | None:
            return None if index == 2 else await opened_before(meta, index)

        with mock.patch.object(source, "open", chunk_2_not_held):
            assert await deliverer.read_cached(placement, obj, 1900, 2099) is None  # type: ignore[arg-type]
        assert source.take_reads() == {}  # chunk 1 was read, chunk 2 not held: none counted
        assert await deliverer.read_cached(placement, obj, 900, 1099) == b"x" * 200  # type: ignore[arg-type]
        assert source.take_reads() == {"k.0": 1, "k.1": 1}
    finally:
        deliverer.close()
        source.close()


def test_reads_told_at_once_are_split_into_items_that_fit_a_line() -> None:
    entries = [["b", "k" * 900 + str(i), '"e"', i % 7, i + 1] for i in range(200)]
    items = list(news_reads_items(entries))
    assert len(items) > 1 and all(len(item) <= MAX_BATCH for item, _ in items)
    assert [e for item, _ in items for e in json.loads(item)["reads"]] == entries
    assert [times for _, times in items] == [
        sum(e[-1] for e in json.loads(item)["reads"]) for item, _ in items
    ]


def _counted(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_supervisor_imports_none_of_what_serves() -> None:
    """A supervisor of workers serves nothing: the node's modules (a third of a worker's
    memory) stay out of it, whatever `lota serve` imports to become one."""
    code = (
        "import sys, lota.cli, lota.node.serve, lota.workers.supervisor; "
        "print(sorted(m for m in ('lota.node.build', 'lota.cache.reads', 'prometheus_client') "
        "if m in sys.modules))"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"


def test_a_worker_runs_as_one_of_its_supervisors_count(tmp_path: Path) -> None:
    """A worker's settings: its share of the budget, its own directory in each cache
    directory, and its supervisor's count of workers, not one per CPU of its own (what
    the workers share, descriptors included, is split by that count)."""
    from lota.workers.spec import WorkerSpec

    spec = WorkerSpec(index=1, count=3, listen_fd=-1, run_dir=str(tmp_path), secret="s")
    config = spec.configure(Config(cache=CacheConfig(dirs=("/a", "/b"), size=3 * 1024**3)))
    assert config.workers == 3 and config.worker_count == 3
    assert config.cache.dirs == ("/a/worker-1", "/b/worker-1")
    assert config.cache.size == 1024**3
