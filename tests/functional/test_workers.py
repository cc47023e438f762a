"""Worker processes, end to end: one `lota serve` with workers = 2 in front of moto, real
clients on many connections (the kernel spreads them over the workers)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import xxhash

from lota.testing.processes import LotaProcess
from tests.conftest import presigned_get
from tests.recorder import RecordingProxy

MiB = 1024 * 1024
CHUNK = 8 * MiB


def _workers_node(
    recorder: RecordingProxy, credentials_file: Path, tmp_path: Path, env: dict[str, str]
) -> LotaProcess:
    """A node of two workers, 1 GiB of cache between them (not started); of as many as
    `env`'s LOTA_WORKERS says, if it says (1: a node serving alone)."""
    config = tmp_path / "lota.toml"
    config.write_text(
        f'workers = 2\n[cache]\ndirs = ["{tmp_path / "cache"}"]\nsize = "1GiB"\n'
        f'[auth]\ncredentials = "{credentials_file}"\n'
        f'[regions.us-east]\nendpoint = "{recorder.url}"\n'
    )
    env = {"LOTA_WORKERS": "2", **env}
    return LotaProcess(["--config", str(config)], log_path=tmp_path / "lota.log", env=env)


@pytest.fixture
def node(recorder: RecordingProxy, credentials_file: Path, tmp_path: Path) -> Iterator[LotaProcess]:
    started = _workers_node(recorder, credentials_file, tmp_path, {}).start()
    yield started
    started.stop()


def _metric(node: LotaProcess, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", node.metrics(), re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _workers_answering(node: LotaProcess) -> float:
    """``lota_workers``, or 0 while the node is too busy to say (a worker is starting)."""
    try:
        return _metric(node, "lota_workers")
    except OSError:  # urllib's timeout included
        return 0


def _both_serving(node: LotaProcess) -> None:
    """Wait until both workers answer: a node is started once one of them does."""
    deadline = time.monotonic() + 30
    while len(_workers(node)) < 2 or _workers_answering(node) < 2:
        assert time.monotonic() < deadline, node.log_tail()
        time.sleep(0.1)


def _workers(node: LotaProcess) -> list[int]:
    """The supervisor's children: the worker processes."""
    assert node.proc is not None
    pid = node.proc.pid
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _read(url: str) -> tuple[str, str]:
    """(xxh3 of the body, x-lota-cache) of a GET on a connection of its own; raises if the
    body is cut short."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.netloc, timeout=60)
    try:
        connection.request("GET", f"{parts.path}?{parts.query}")
        response = connection.getresponse()
        assert response.status == 200, response.read()[:300]
        digest, got = xxhash.xxh3_128(), 0
        while piece := response.read(MiB):
            digest.update(piece)
            got += len(piece)
        # http.client's read(n) returns b"" at a premature end instead of raising.
        assert got == int(response.getheader("content-length", "-1")), "body cut short"
        return digest.hexdigest(), response.getheader("x-lota-cache", "")
    finally:
        connection.close()


def test_two_workers_serve_one_cache_under_one_budget(
    node: LotaProcess, recorder: RecordingProxy, origin_s3: Any, bucket: str
) -> None:
    blobs = {f"o{i}": os.urandom(size) for i, size in enumerate([1000, 300_000, 3 * CHUNK + 5])}
    for key, blob in blobs.items():
        origin_s3.put_object(Bucket=bucket, Key=key, Body=blob)
    want = {key: xxhash.xxh3_128(blob).hexdigest() for key, blob in blobs.items()}
    urls = {key: presigned_get(node.url, bucket, key) for key in blobs}
    with ThreadPoolExecutor(16) as pool:  # 16 connections: both workers get some
        for _ in range(3):
            got = list(pool.map(lambda k: (k, _read(urls[k])), [*blobs] * 8))
            assert all(digest == want[key] for key, (digest, _) in got)
    fetched = {key: recorder.bytes_sent(f"/{bucket}/{key}") for key in blobs}
    assert fetched == {key: len(blob) for key, blob in blobs.items()}  # once for the node
    # Both workers hold a share of the chunks, each in its own directory.
    shares = [
        sum(len(files) for _, _, files in os.walk(Path(node.log_path).parent / "cache" / w))
        for w in ("worker-0", "worker-1")
    ]
    assert all(shares), shares
    assert _metric(node, "lota_workers") == 2
    assert _metric(node, "lota_cache_budget_bytes") == 1024**3  # the two halves, summed
    assert {source for _, source in _read_all(urls, list(blobs) * 4)} == {"HIT"}
    # What clients were sent, all of it counted once, whichever worker sent it.
    text = node.metrics()
    sent = sum(float(v) for v in re.findall(r"^lota_cache_bytes_total\{[^}]*\} (\S+)$", text, re.M))
    assert sent == 28 * sum(len(blob) for blob in blobs.values())
    assert {key: recorder.bytes_sent(f"/{bucket}/{key}") for key in blobs} == fetched


def test_the_node_asks_the_origin_what_an_object_is_once_whichever_workers_read_it(
    node: LotaProcess, recorder: RecordingProxy, origin_s3: Any, bucket: str
) -> None:
    """An object's metadata lives with one worker: the others ask it, not the origin, so
    the origin gets one HEAD for the node however many workers read the object (16 reads,
    each on a connection of its own, reach both)."""
    keys = [f"k{i}" for i in range(8)]
    blobs = {key: os.urandom(MiB + i) for i, key in enumerate(keys)}
    for key, blob in blobs.items():
        origin_s3.put_object(Bucket=bucket, Key=key, Body=blob)
    urls = {key: presigned_get(node.url, bucket, key) for key in keys}
    recorder.clear()
    for key in keys:
        got = {_read(urls[key]) for _ in range(16)}
        assert {digest for digest, _ in got} == {xxhash.xxh3_128(blobs[key]).hexdigest()}
    assert {key: len(recorder.requests("HEAD", f"/{bucket}/{key}")) for key in keys} == {
        key: 1 for key in keys
    }
    assert {key: recorder.bytes_sent(f"/{bucket}/{key}") for key in keys} == {
        key: len(blob) for key, blob in blobs.items()
    }
    # A copy taken from a sibling is as fresh as the sibling's: revalidation keeps time.
    assert _metric(node, "lota_cache_revalidations_total") == 0


def _total(node: LotaProcess, family: str, labels: str = "") -> float:
    """The sum of a family's samples (those whose labels include `labels`)."""
    found = re.findall(rf"^{re.escape(family)}\{{([^}}]*)\}} (\S+)$", node.metrics(), re.M)
    return sum(float(value) for got, value in found if labels in got)


def test_both_workers_say_how_late_their_event_loops_run(node: LotaProcess) -> None:
    """lota_event_loop_lag_seconds (lota.node.lag): each worker looks every 20 ms, and
    /_lota/metrics sums both. Each look lasts 20 ms and its lateness, so a worker's looks
    and lateness add up to the time that passed, however loaded the machine: two workers'
    to twice that."""

    def looked() -> tuple[float, float]:
        return (
            _metric(node, "lota_event_loop_lag_seconds_count"),
            _metric(node, "lota_event_loop_lag_seconds_sum"),
        )

    started = time.monotonic()
    looks, late = looked()
    time.sleep(1.0)
    more, later = looked()
    elapsed = time.monotonic() - started
    assert _metric(node, "lota_workers") == 2
    covered = (more - looks) * 0.02 + (later - late)
    assert 1.5 * elapsed < covered < 2.5 * elapsed  # one worker alone covers `elapsed`


def test_a_worker_tells_the_others_what_it_learns_so_none_asks_again(
    node: LotaProcess, recorder: RecordingProxy, origin_s3: Any, bucket: str
) -> None:
    """Once an object has been read through the node, a read reaching any worker is
    answered from that worker's own entry and the chunk file its sibling published, asking
    neither the origin nor a sibling (lota.workers.news)."""
    keys = [f"n{i}" for i in range(8)]
    blobs = {key: os.urandom(1000 + i) for i, key in enumerate(keys)}
    for key, blob in blobs.items():
        origin_s3.put_object(Bucket=bucket, Key=key, Body=blob)
    urls = {key: presigned_get(node.url, bucket, key) for key in keys}
    for key in keys:
        _read(urls[key])
    deadline = time.monotonic() + 10
    while True:
        sent = _total(node, "lota_worker_news_total", 'result="sent"')
        heard = _total(node, "lota_worker_news_total", 'result="heard"')
        if (sent >= 2 * len(keys) and heard == sent) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sent >= 2 * len(keys) and heard == sent  # each object's metadata and its chunk
    recorder.clear()
    asked = _total(node, "lota_worker_requests_total")
    got = _read_all(urls, keys * 16)  # 16 connections each: both workers read every key
    assert got == [(xxhash.xxh3_128(blobs[key]).hexdigest(), "HIT") for key in keys * 16]
    assert recorder.requests() == []
    assert _total(node, "lota_worker_requests_total") == asked


def test_a_worker_tells_each_chunk_s_owner_of_the_reads_it_served(
    node: LotaProcess, origin_s3: Any, bucket: str
) -> None:
    """Each read of a chunk the node holds is counted once, by the chunk's owner: as its
    own hit when it served the read, or told by the worker that did, from its own
    descriptor, in a batch a second or so later (lota.workers.news). Every read told is
    heard, none of an unknown version. Small objects are answered as their requests are
    parsed, larger ones (300 KB) the usual way."""
    sizes = {f"r{i}": 1000 if i < 12 else 300_000 for i in range(16)}
    keys = list(sizes)
    for key, size in sizes.items():
        origin_s3.put_object(Bucket=bucket, Key=key, Body=os.urandom(size))
    urls = {key: presigned_get(node.url, bucket, key) for key in keys}
    for key in keys:
        _read(urls[key])
    assert {source for _, source in _read_all(urls, keys * 16)} == {"HIT"}

    def reads(result: str) -> float:
        return _total(node, "lota_worker_sibling_reads_total", f'result="{result}"')

    hits = 16 * len(keys)
    deadline = time.monotonic() + 10
    while True:  # the last batch is told within a second or so
        told, heard = reads("told"), reads("heard")
        own = _metric(node, "lota_cache_hits_total")
        if (told + own == hits and heard == told) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert _total(node, "lota_cache_bytes_total", 'source="hit"') == 16 * sum(sizes.values())
    assert told + own == hits and told > 0 and own > 0
    assert heard == told and reads("unknown") == 0


def test_a_request_one_worker_remembers_by_its_bytes_is_told_to_the_other(
    node: LotaProcess, origin_s3: Any, bucket: str
) -> None:
    """A GET that came whole (one write) is remembered by its bytes once answered, and
    told to the other worker, which takes it in (lota.node.at_once, lota.workers.news):
    news for each object's metadata, its chunk and the request, all heard."""
    keys = [f"t{i}" for i in range(4)]
    for key in keys:
        origin_s3.put_object(Bucket=bucket, Key=key, Body=os.urandom(1000))
    urls = [presigned_get(node.url, bucket, key) for key in keys]

    def news(result: str) -> float:
        return _total(node, "lota_worker_news_total", f'result="{result}"')

    sent_before, heard_before = news("sent"), news("heard")
    for url in urls:
        parts = urllib.parse.urlsplit(url)
        head = f"GET {parts.path}?{parts.query} HTTP/1.1\r\nhost: {parts.netloc}\r\n\r\n"
        with socket.create_connection((parts.hostname, parts.port), 10) as conn:
            conn.sendall(head.encode())
            reply = conn.makefile("rb").readline()
            assert reply.startswith(b"HTTP/1.1 200"), reply
    deadline = time.monotonic() + 10
    while True:
        sent, heard = news("sent") - sent_before, news("heard") - heard_before
        if (sent >= 3 * len(keys) and heard == sent) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert sent >= 3 * len(keys) and heard == sent
    assert news("refused") == 0


def test_hits_pipelined_over_both_workers_come_back_whole_and_in_order(
    node: LotaProcess, origin_s3: Any, bucket: str
) -> None:
    """The node as it runs (uvloop, two workers): hits answered at once, sent from the page
    cache (each worker's own chunks and its sibling's), from bytes, or through the
    transport where the socket is full; hundreds written before any answer is read, over
    several connections (so both workers answer), each answer whole and in its place."""
    objects = {f"p{i}": os.urandom(64 * 1024 - i) for i in range(6)}
    for key, data in objects.items():
        origin_s3.put_object(Bucket=bucket, Key=key, Body=data)
    urls = {key: presigned_get(node.url, bucket, key) for key in objects}
    heads = {}
    for key, url in urls.items():
        parts = urllib.parse.urlsplit(url)
        heads[key] = f"GET {parts.path}?{parts.query} HTTP/1.1\r\nhost: {parts.netloc}\r\n\r\n"
        for _ in range(3):  # a miss, then hits: read whole from memory, then sent as spans
            assert _read(url)[0] == xxhash.xxh3_128(objects[key]).hexdigest()
    keys = [f"p{i % len(objects)}" for i in range(200)]
    host = urllib.parse.urlsplit(node.url)

    def pipelined(_: int) -> None:
        with socket.create_connection((host.hostname, host.port), 10) as conn:
            conn.sendall("".join(heads[key] for key in keys).encode())
            time.sleep(0.3)  # the socket fills before anything is read
            replies = conn.makefile("rb")
            for n, key in enumerate(keys):
                status = replies.readline()
                assert status.startswith(b"HTTP/1.1 200"), (n, status)
                length = -1
                while (line := replies.readline()) != b"\r\n":
                    name, _, value = line.decode().partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                assert replies.read(length) == objects[key], (n, key)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(pipelined, range(6)))


def _worker_1_late(tmp_path: Path, seconds: float) -> dict[str, str]:
    """The environment in which worker 1 sleeps `seconds` before it starts (a
    sitecustomize); worker 0 starts at once."""
    late = tmp_path / "late"
    late.mkdir()
    (late / "sitecustomize.py").write_text(
        "import json, os, time\n"
        "spec = os.environ.get('LOTA_WORKER')\n"
        "if spec and json.loads(spec)['index'] == 1:\n"
        f"    time.sleep({seconds})\n"
    )
    path = os.pathsep.join(p for p in (str(late), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path}


def test_a_node_is_ready_only_once_every_worker_is(
    recorder: RecordingProxy, credentials_file: Path, tmp_path: Path, origin_s3: Any, bucket: str
) -> None:
    """Worker 1 starts 3 s after worker 0 (a sitecustomize that sleeps in it): the node is
    not ready meanwhile, so the first reads find both workers serving and the origin sends
    each chunk once, not once more for each read that found worker 1 still starting."""
    env = _worker_1_late(tmp_path, seconds=3)
    node = _workers_node(recorder, credentials_file, tmp_path, env).start()
    try:
        data = os.urandom(3 * CHUNK + 5)
        origin_s3.put_object(Bucket=bucket, Key="o", Body=data)
        url = presigned_get(node.url, bucket, "o")
        want = xxhash.xxh3_128(data).hexdigest()
        assert {digest for digest, _ in _read_all({"o": url}, ["o"] * 16)} == {want}
        assert recorder.bytes_sent(f"/{bucket}/o") == len(data)
    finally:
        node.stop()


def test_a_node_told_to_stop_before_it_is_ready_stops_at_once(
    recorder: RecordingProxy, credentials_file: Path, tmp_path: Path
) -> None:
    """Worker 1 takes a minute to start: readiness probes that land in its socket's queue
    get no answer. SIGTERM meanwhile stops the node in seconds (it once waited out a probe
    for five minutes)."""
    env = _worker_1_late(tmp_path, seconds=60)
    node = _workers_node(recorder, credentials_file, tmp_path, env).start(ready=False)
    deadline = time.monotonic() + 20
    while not _unaccepted(node.port):  # a probe (each its own connection) waits in a queue
        assert time.monotonic() < deadline, "no readiness probe reached worker 1's queue"
        time.sleep(0.05)
    started = time.monotonic()
    assert node.stop(timeout=60) == 0, node.log_tail()
    assert time.monotonic() - started < 15, node.log_tail()


def test_workers_stop_when_their_supervisor_is_killed(node: LotaProcess) -> None:
    """SIGKILL (the OOM killer) gives the supervisor no chance to stop its workers: they
    stop themselves, rather than serve on as orphans."""
    _both_serving(node)
    workers = _workers(node)
    assert len(workers) == 2
    run_dir = Path(_spec(workers[0])["run_dir"])
    assert sorted(p.name for p in run_dir.iterdir()) == [
        "worker-0.fds", "worker-0.http", "worker-1.fds", "worker-1.http"
    ]  # fmt: skip
    node.kill()
    deadline = time.monotonic() + 20
    while alive := [pid for pid in workers if _running(pid)]:
        assert time.monotonic() < deadline, f"workers {alive} outlived their supervisor"
        time.sleep(0.05)
    assert not run_dir.exists()  # the last worker out removed it: no supervisor will


def test_a_supervisor_killed_while_restarting_a_worker_leaves_no_run_directory(
    node: LotaProcess,
) -> None:
    """A worker killed, then its supervisor killed before the restart (its back-off): the
    surviving worker, the last one out, removes the killed one's sockets with its own."""
    _both_serving(node)
    workers = _workers(node)
    run_dir = Path(_spec(workers[0])["run_dir"])
    os.kill(workers[0], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while _running(workers[0]):
        assert time.monotonic() < deadline, "worker 0 outlived SIGKILL"
        time.sleep(0.01)
    # Left by the killed worker; the survivor removes the directory soon after node.kill().
    assert sorted(p.name for p in run_dir.iterdir())[:2] == ["worker-0.fds", "worker-0.http"]
    node.kill()  # within the supervisor's back-off (2 s for a worker dead young): no restart
    while _running(workers[1]):
        assert time.monotonic() < deadline + 10, "worker 1 outlived its supervisor"
        time.sleep(0.05)
    assert not run_dir.exists()


def _spec(pid: int) -> dict[str, Any]:
    """What worker `pid` was told by its supervisor (lota.workers.spec)."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    told = next(v for v in environ if v.startswith(b"LOTA_WORKER="))
    return dict(json.loads(told.split(b"=", 1)[1]))


def _running(pid: int) -> bool:
    """Whether process `pid` runs (an exited one its new parent has not reaped does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _unaccepted(port: int) -> int:
    """Connections to `port` that wait in a listening socket's queue: established, no
    process holds them yet (inode 0 in /proc/net/tcp)."""
    waiting = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port and fields[3] == "01" and fields[9] == "0":
            waiting += 1
    return waiting


def _read_all(urls: dict[str, str], keys: list[str]) -> list[tuple[str, str]]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda k: _read(urls[k]), keys))


def test_32_cold_readers_across_workers_make_one_origin_request_per_chunk(
    node: LotaProcess, recorder: RecordingProxy, origin_s3: Any, bucket: str
) -> None:
    data = os.urandom(8 * CHUNK + 1234)
    origin_s3.put_object(Bucket=bucket, Key="ckpt", Body=data)
    want = xxhash.xxh3_128(data).hexdigest()
    url = presigned_get(node.url, bucket, "ckpt")
    start = threading.Barrier(32)

    def read(_: int) -> str:
        start.wait()
        return _read(url)[0]

    with ThreadPoolExecutor(32) as pool:
        assert list(pool.map(read, range(32))) == [want] * 32
    gets = recorder.requests("GET", f"/{bucket}/ckpt")
    assert len(gets) == 9  # one per chunk, whichever worker owns it
    assert recorder.bytes_sent(f"/{bucket}/ckpt") == len(data)


def _policies(pid: int) -> set[int]:
    """The scheduling policies of the threads of process `pid`."""
    found = set()
    for thread in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(ProcessLookupError):
            found.add(os.sched_getscheduler(int(thread)))
    return found


def _started_under_default_policy() -> None:
    """What these tests take for granted: pytest runs under the default policy, which the
    nodes it starts begin with (CI's does)."""
    started = os.sched_getscheduler(0) & ~getattr(os, "SCHED_RESET_ON_FORK", 0)
    assert started == os.SCHED_OTHER, "run these tests under the default policy (SCHED_OTHER)"


@pytest.mark.parametrize("workers", [2, 1])
def test_every_thread_of_every_serving_process_runs_as_batch_work_by_default(
    recorder: RecordingProxy,
    credentials_file: Path,
    tmp_path: Path,
    origin_s3: Any,
    bucket: str,
    workers: int,
) -> None:
    """scheduling = "batch" (lota.node.serve.schedule): a worker a request wakes takes its
    turn on a busy core; threads started after (the store's readers) included. A
    supervisor serves nothing and keeps the policy it started with."""
    _started_under_default_policy()
    env = {"LOTA_WORKERS": str(workers), "LOTA_SCHEDULING": ""}  # "": the default
    started = _workers_node(recorder, credentials_file, tmp_path, env).start()
    try:
        origin_s3.put_object(Bucket=bucket, Key="k", Body=b"x" * 1000)
        assert _read(presigned_get(started.url, bucket, "k"))[1] == "MISS"
        assert started.proc is not None
        if workers > 1:
            _both_serving(started)
        serving = _workers(started) if workers > 1 else [started.proc.pid]
        assert len(serving) == workers
        for pid in serving:
            assert len(os.listdir(f"/proc/{pid}/task")) > 1
            assert _policies(pid) == {os.SCHED_BATCH}
        if workers > 1:
            assert _policies(started.proc.pid) == {os.SCHED_OTHER}
    finally:
        started.stop()


def test_scheduling_normal_leaves_the_workers_as_they_were_started(
    recorder: RecordingProxy, credentials_file: Path, tmp_path: Path
) -> None:
    _started_under_default_policy()
    env = {"LOTA_SCHEDULING": "normal"}
    started = _workers_node(recorder, credentials_file, tmp_path, env).start()
    try:
        _both_serving(started)
        workers = _workers(started)
        assert len(workers) == 2
        for pid in workers:
            assert _policies(pid) == {os.SCHED_OTHER}
    finally:
        started.stop()


def test_a_worker_killed_mid_stream_fails_only_its_connections_and_comes_back(
    node: LotaProcess, origin_s3: Any, bucket: str
) -> None:
    data = os.urandom(4 * CHUNK)
    origin_s3.put_object(Bucket=bucket, Key="big", Body=data)
    want = xxhash.xxh3_128(data).hexdigest()
    url = presigned_get(node.url, bucket, "big")
    assert _read(url)[0] == want  # cached
    workers = _workers(node)
    assert len(workers) == 2
    results: list[str | BaseException] = []

    def slow(_: int) -> None:
        parts = urllib.parse.urlsplit(url)
        connection = http.client.HTTPConnection(parts.netloc, timeout=60)
        try:
            connection.request("GET", f"{parts.path}?{parts.query}")
            response = connection.getresponse()
            digest, got = xxhash.xxh3_128(), 0
            while piece := response.read(256 * 1024):
                digest.update(piece)
                got += len(piece)
                time.sleep(0.01)  # a slow client: still reading when the worker dies
            if got != int(response.getheader("content-length", "-1")):
                # http.client's read(n) returns b"" at a premature end instead of raising.
                raise http.client.IncompleteRead(
                    b"", int(response.getheader("content-length", "0")) - got
                )
            results.append(digest.hexdigest())
        except (OSError, http.client.HTTPException) as exc:
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=slow, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    os.kill(workers[1], signal.SIGKILL)
    for thread in threads:
        thread.join(120)
    failed = [r for r in results if not isinstance(r, str)]
    assert [r for r in results if isinstance(r, str)] == [want] * (12 - len(failed))
    assert failed and len(failed) < 12  # only the dead worker's connections failed
    # The supervisor starts it again; the node serves from both once more.
    deadline = time.monotonic() + 30
    while len(_workers(node)) < 2 or _workers_answering(node) < 2:
        assert time.monotonic() < deadline, node.log_tail()
        time.sleep(0.2)
    assert workers[1] not in _workers(node)
    assert _read_all({"big": url}, ["big"] * 16) == [(want, "HIT")] * 16


def test_a_worker_that_cannot_start_stops_the_node_with_one_line(
    credentials_file: Path, tmp_path: Path, origin: str
) -> None:
    cache = tmp_path / "cache"
    alone = LotaProcess(
        ["--origin", origin, "--cache-dir", str(cache), "--credentials", str(credentials_file)],
        log_path=tmp_path / "alone.log",
    ).start()
    try:
        node = LotaProcess(
            ["--origin", origin, "--cache-dir", str(cache), "--credentials", str(credentials_file)],
            log_path=tmp_path / "workers.log",
            env={"LOTA_WORKERS": "2"},
        )
        with pytest.raises(RuntimeError, match="exited 2"):
            node.start(timeout=20)
        assert f"cache directory {cache} is in use by pid" in node.log_tail()
        assert "Traceback" not in node.log_tail()
    finally:
        alone.stop()
