"""The cluster, end to end: real LOTA processes on loopback with static members and SigV4
on, a real moto origin behind a recorder, real clients."""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import xxhash

from lota.cluster.ownership import Ownership, chunk_key
from lota.cluster.signing import sign
from lota.testing.cluster import CLUSTER_SECRET, LocalCluster
from lota.testing.credentials import PRINCIPALS
from tests.conftest import client_for, presigned_get
from tests.recorder import RecordingProxy

MiB = 1024 * 1024
GiB = 1024 * MiB
CHUNK = 8 * MiB

ClusterFactory = Callable[..., LocalCluster]


@pytest.fixture
def cluster_of(
    recorder: RecordingProxy, credentials_file: Path, tmp_path: Path
) -> Iterator[ClusterFactory]:
    """Start clusters of N nodes in front of the recorder; all stopped at the end."""
    started: list[LocalCluster] = []

    def start(size: int, **settings: dict[str, Any]) -> LocalCluster:
        root = tmp_path / f"cluster-{len(started)}"
        root.mkdir()
        cluster = LocalCluster(root, recorder.url, credentials_file, size, settings=settings)
        started.append(cluster)
        return cluster.start()

    yield start
    for cluster in started:
        cluster.stop()


def _metric(node_metrics: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", node_metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


class Reader:
    """One client reading a whole object through one node, hashing as it goes."""

    def __init__(self, url: str, progress: list[int], lock: threading.Lock) -> None:
        self.url = url
        self.digest = ""
        self.source = ""
        self.error: BaseException | None = None
        self._progress = progress
        self._lock = lock

    def read(self) -> None:
        parts = urllib.parse.urlsplit(self.url)
        connection = http.client.HTTPConnection(parts.netloc, timeout=120)
        try:
            connection.request("GET", f"{parts.path}?{parts.query}")
            response = connection.getresponse()
            assert response.status == 200, response.read()[:500]
            self.source = response.getheader("x-lota-cache", "")
            digest = xxhash.xxh3_128()
            while piece := response.read(MiB):
                digest.update(piece)
                with self._lock:
                    self._progress[0] += len(piece)
            self.digest = digest.hexdigest()
        except BaseException as exc:  # the test decides which readers may fail
            self.error = exc
        finally:
            connection.close()


def _read_everywhere(urls: list[str], kill: Callable[[int], None] | None = None) -> list[Reader]:
    """All readers at once; `kill(bytes so far)` is called as bytes come in."""
    progress, lock = [0], threading.Lock()
    readers = [Reader(url, progress, lock) for url in urls]
    threads = [threading.Thread(target=r.read) for r in readers]
    for thread in threads:
        thread.start()
    while kill is not None and any(t.is_alive() for t in threads):
        kill(progress[0])
        time.sleep(0.02)
    for thread in threads:
        thread.join(300)
    return readers


def test_24_clients_on_6_nodes_read_a_cold_gib_once_from_the_origin_and_outlive_a_node(
    cluster_of: ClusterFactory, recorder: RecordingProxy, origin_s3: Any, bucket: str
) -> None:
    """The checkpoint-restore storm: the origin is read about once per cluster, a second
    round reads it not at all, a node killed mid-round fails only its own clients, and it
    comes back with its chunks."""
    data = os.urandom(GiB)
    expected = xxhash.xxh3_128(data).hexdigest()
    origin_s3.put_object(Bucket=bucket, Key="ckpt/model.pt", Body=data)
    del data
    cluster = cluster_of(6, cache={"size": "3GiB"})
    recorder.clear()
    path = f"/{bucket}/ckpt/model.pt"
    urls = [presigned_get(u, bucket, "ckpt/model.pt") for u in cluster.urls for _ in range(4)]

    cold = _read_everywhere(urls)
    assert [(r.error, r.digest) for r in cold] == [(None, expected)] * 24
    assert recorder.bytes_sent(path) <= 1.02 * GiB, recorder.bytes_sent(path) / GiB

    # The later rounds: one client per node (the suite's time; the storm was the first).
    ones = urls[::4]
    read_once = recorder.bytes_sent(path)
    warm = _read_everywhere(ones)
    assert [(r.error, r.digest) for r in warm] == [(None, expected)] * 6
    assert recorder.bytes_sent(path) == read_once  # no origin byte in the second round

    def kill_node_5(received: int) -> None:
        if received > GiB and cluster.nodes[5].proc and cluster.nodes[5].proc.poll() is None:
            cluster.kill(5)

    dying = _read_everywhere(ones, kill=kill_node_5)
    assert cluster.nodes[5].proc is not None and cluster.nodes[5].proc.poll() is not None
    survivors = [(r.error, r.digest) for r in dying[:5]]
    assert survivors == [(None, expected)] * 5

    cluster.restart(5)
    deadline = time.monotonic() + 90
    suspected = 'lota_cluster_members{state="suspected"}'
    # Until every other node asks node 5 again (its back-off ended, a probe answered).
    while any(_metric(node.metrics(), suspected) for node in cluster.nodes[:5]):
        assert time.monotonic() < deadline, [n.metrics() for n in cluster.nodes[:5]]
        time.sleep(0.5)
    served = 'lota_peer_served_total{source="HIT"}'
    before = _metric(cluster.nodes[5].metrics(), served)
    origin_before = recorder.bytes_sent(path)
    again = _read_everywhere(ones)
    assert [(r.error, r.digest) for r in again] == [(None, expected)] * 6
    assert _metric(cluster.nodes[5].metrics(), served) > before  # it serves its chunks...
    assert recorder.bytes_sent(path) == origin_before  # ...from its disk


def test_the_peer_endpoint_refuses_every_request_not_signed_with_the_cluster_secret(
    cluster_of: ClusterFactory, recorder: RecordingProxy, origin_s3: Any, bucket: str
) -> None:
    cluster = cluster_of(2)
    origin_s3.put_object(Bucket=bucket, Key="secret.bin", Body=b"x" * 1000)
    etag = origin_s3.head_object(Bucket=bucket, Key="secret.bin")["ETag"]
    recorder.clear()
    node = cluster.nodes[1]
    target = f"/_lota/peer/object?bucket={bucket}&key=secret.bin"
    wanted = {"if-match": etag, "range": "bytes=0-999"}

    def send(path: str, headers: dict[str, str]) -> int:
        connection = http.client.HTTPConnection(f"127.0.0.1:{node.port}", timeout=10)
        try:
            connection.request("GET", path, headers=headers)
            response = connection.getresponse()
            response.read()
            return response.status
        finally:
            connection.close()

    wrong = sign(b"not-the-cluster-secret-at-all!!", "GET", target, "x:1", time.time(), wanted)
    stale = sign(CLUSTER_SECRET.encode(), "GET", target, "x:1", time.time() - 120, wanted)
    presigned = presigned_get(node.url, "_lota", "peer/object")  # client SigV4 credentials
    client_signed = urllib.parse.urlsplit(presigned)
    assert send(target, wanted) == 403  # unsigned
    assert send(target, wrong) == 403
    assert send(target, stale) == 403
    assert send(f"{client_signed.path}?{client_signed.query}", wanted) == 403
    assert recorder.requests(path=f"/{bucket}/secret.bin") == []  # nothing fetched...
    assert _metric(node.metrics(), "lota_cache_objects") == 0  # ...nor cached
    valid = sign(CLUSTER_SECRET.encode(), "GET", target, "x:1", time.time(), wanted)
    assert send(target, valid) == 206
    assert send(target, valid) == 403  # the same request again: a replay
    refused = node.metrics()
    for reason, count in (("unsigned", 2), ("signature", 1), ("date", 1), ("replay", 1)):
        assert _metric(refused, f'lota_peer_refused_total{{reason="{reason}"}}') == count
    # And the cluster secret means nothing on the S3 endpoint.
    s3_path = f"/{bucket}/secret.bin"
    peer_signed = sign(CLUSTER_SECRET.encode(), "GET", s3_path, "x:1", time.time(), {})
    assert send(s3_path, peer_signed) == 403


def test_a_write_through_one_node_is_read_at_once_through_every_other_without_a_catalog(
    cluster_of: ClusterFactory, bucket: str
) -> None:
    cluster = cluster_of(3, cache={"revalidate_after": "1h"})
    writer, *readers = (client_for(url) for url in cluster.urls)
    for version in range(3):
        data = os.urandom(CHUNK + 1000 * version)
        writer.put_object(Bucket=bucket, Key="ckpt/latest", Body=data)
        for s3 in readers:
            for _ in range(2):  # the second read is from the cache
                assert s3.get_object(Bucket=bucket, Key="ckpt/latest")["Body"].read() == data
    writer.delete_object(Bucket=bucket, Key="ckpt/latest")
    for s3 in readers:
        with pytest.raises(s3.exceptions.NoSuchKey):
            s3.get_object(Bucket=bucket, Key="ckpt/latest")


def test_a_write_through_one_node_reaches_every_worker_of_the_others(
    recorder: RecordingProxy, credentials_file: Path, tmp_path: Path, bucket: str
) -> None:
    """Another node's invalidation lands on one worker of this node (whichever the kernel
    gives the connection); every worker must drop its copy, or some clients read the
    old version until it is revalidated."""
    settings = {"cache": {"revalidate_after": "1h"}}
    with LocalCluster(
        tmp_path, recorder.url, credentials_file, 2, settings=settings, env={"LOTA_WORKERS": "2"}
    ) as cluster:
        writer, reader = cluster.urls
        s3 = client_for(writer)
        for version in range(3):
            data = os.urandom(1000 + version)
            s3.put_object(Bucket=bucket, Key="ckpt/small", Body=data)
            url = presigned_get(reader, bucket, "ckpt/small")
            with ThreadPoolExecutor(8) as pool:  # 8 connections: both workers answer some
                got = list(pool.map(_body, [url] * 32))
            assert all(body == data for body in got), f"version {version}: a stale copy served"


def _body(url: str) -> bytes:
    """The body of a GET on a connection of its own (urllib keeps none open)."""
    with urllib.request.urlopen(url, timeout=60) as response:
        return bytes(response.read())


def test_lota_warm_fills_each_chunk_on_its_owner_once_for_the_whole_cluster(
    cluster_of: ClusterFactory, recorder: RecordingProxy, origin_s3: Any, bucket: str
) -> None:
    cluster = cluster_of(3)
    sizes = [3 * CHUNK + 5, CHUNK, 1000, 0]
    blobs = {f"ds/{i}": os.urandom(size) for i, size in enumerate(sizes)}
    for key, blob in blobs.items():
        origin_s3.put_object(Bucket=bucket, Key=key, Body=blob)
    recorder.clear()
    key_id, secret, _ = PRINCIPALS["admin"]
    warm = subprocess.run(
        [sys.executable, "-m", "lota", "warm", f"s3://{bucket}/ds/", "--endpoint", cluster.urls[0]],
        env={**os.environ, "AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": secret},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert warm.returncode == 0, warm.stderr
    assert "4 filled" in warm.stdout and "0 failed" in warm.stdout, warm.stdout
    fetched = sum(recorder.bytes_sent(f"/{bucket}/{key}") for key in blobs)
    assert fetched == sum(sizes)  # each byte once, on its owner
    # Each chunk was filled on its owner, not all on the node asked to warm.
    owned = Ownership(cluster.members)
    expected = dict.fromkeys(cluster.members, 0)
    for key, blob in blobs.items():
        etag = origin_s3.head_object(Bucket=bucket, Key=key)["ETag"]
        for first in range(0, len(blob), CHUNK):
            owner = owned.owner(chunk_key(bucket, key, etag, first // CHUNK))
            expected[owner] += len(blob[first : first + CHUNK])
    filled = {
        member: _metric(node.metrics(), "lota_cache_fill_bytes_total")
        for member, node in zip(cluster.members, cluster.nodes, strict=True)
    }
    assert filled == expected
    recorder.clear()
    for url in cluster.urls:
        s3 = client_for(url)
        for key, blob in blobs.items():
            got = s3.get_object(Bucket=bucket, Key=key)
            assert got["Body"].read() == blob
            if blob:
                assert got["ResponseMetadata"]["HTTPHeaders"]["x-lota-cache"] in ("HIT", "PEER")
    assert recorder.requests("GET") == []


def test_a_hot_chunk_is_kept_by_the_node_that_reads_it_from_its_owner_often(
    cluster_of: ClusterFactory, origin_s3: Any, bucket: str
) -> None:
    cluster = cluster_of(2, cluster={"hot_reads": 2})
    reader, owner = cluster.nodes
    owned = Ownership(cluster.members)
    for i in range(100):  # a key whose one chunk node 1 owns
        key = f"tokenizer-{i}.json"
        origin_s3.put_object(Bucket=bucket, Key=key, Body=b"{}" * 500)
        etag = origin_s3.head_object(Bucket=bucket, Key=key)["ETag"]
        if owned.owner(chunk_key(bucket, key, etag, 0)) == cluster.members[1]:
            break
    s3 = client_for(reader.url)

    def source() -> str:
        got = s3.get_object(Bucket=bucket, Key=key)
        assert got["Body"].read() == b"{}" * 500
        return str(got["ResponseMetadata"]["HTTPHeaders"]["x-lota-cache"])

    assert [source(), source()] == ["PEER", "PEER"]  # the second read keeps a copy...
    deadline = time.monotonic() + 30  # a loaded machine's fsync can take seconds
    while source() != "HIT":  # ...and, once it is committed, the next ones are read here
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _metric(reader.metrics(), "lota_cluster_copies_total") == 1
    served = owner.metrics()
    hit, miss = (
        _metric(served, f'lota_peer_served_total{{source="{s}"}}') for s in ("HIT", "MISS")
    )
    assert hit + miss == 2  # the first read, relayed, and the copy: then no more
