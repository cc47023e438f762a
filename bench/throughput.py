"""Single-stream and multi-stream throughput of large GETs through LOTA, measured with curl.

One LOTA node (SigV4 auth, cache on) in front of an embedded origin behind an emulated WAN
(``--latency`` one way, 10 ms by default). The objects (``--size``, 1 GiB by default) are
created at the origin directly. The client is curl (C, so the client is not what limits),
``curl -s -o /dev/null`` on presigned SigV4 URLs, so LOTA checks SigV4 on every request.

Measured, each ``--runs`` times:

- MISS, 1 client: the first read of each object through LOTA (distinct cold objects;
  these reads also warm the cache for the HIT runs);
- HIT, 1 client and ``--clients`` (4) clients at once, each on its own cached object;
  the aggregate is total bytes over the wall time from first start to last finish;
- ORIGIN DIRECT, 1 client: straight to the origin's WAN endpoint, no LOTA;
- the loopback ceiling: curl from a minimal server that answers with one ``sendfile()``
  of a file of the same size (in its own process), run alternately with the HIT runs so
  both see the same load (the machine may be shared); and ``curl file://`` of that file.

GB/s are 10^9 bytes per second. One 2-core machine: curl, LOTA, the WAN emulator (in this
script's process) and moto share the cores.

    python -m bench.throughput
    python -m bench.throughput --size 256MiB --runs 1      # quick
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from botocore.config import Config

from bench.common import Setup, lota_with_origin, save, stop_on_sigterm, table
from bench.payload import (
    BLOCK,
    MiB,
    PatternReader,
    expected_digest,
    get_and_hash,
    human,
    load_average,
    parse_size,
)
from lota.config import parse_duration
from lota.testing.credentials import PRINCIPALS

BUCKET = "throughput-bench"
CURL_FORMAT = "%{http_code} %{size_download} %{speed_download} %{time_total}"


async def curl(url: str) -> dict[str, Any]:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-s", "-o", "/dev/null", "-w", CURL_FORMAT, url,
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, _ = await proc.communicate()
    status, size, speed, total = out.decode().split()
    return {"status": int(status), "bytes": int(size), "Bps": float(speed), "s": float(total)}


async def streams(urls: list[str], size: int) -> dict[str, Any]:
    """curl every URL at once; aggregate GB/s over the wall time."""
    started = time.perf_counter()
    results = await asyncio.gather(*(curl(u) for u in urls))
    wall = time.perf_counter() - started
    bad = [r for r in results if r["status"] != 200 or r["bytes"] != size]
    return {
        "clients": len(urls),
        # One client: curl's own speed_download; several: total bytes over the wall time.
        "GBps": results[0]["Bps"] / 1e9
        if len(urls) == 1
        else sum(r["bytes"] for r in results) / wall / 1e9,
        "per_client_GBps": [r["Bps"] / 1e9 for r in results],
        "wall_s": wall,
        "errors": [f"status {r['status']}, {r['bytes']} bytes" for r in bad],
    }


def client(endpoint: str, key: str, secret: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=Config(signature_version="s3v4"),
    )


def presign(s3: Any, key: str) -> str:
    params = {"Bucket": BUCKET, "Key": key}
    return str(s3.generate_presigned_url("get_object", Params=params, ExpiresIn=7200))


def create_objects(setup: Setup, count: int, size: int) -> list[str]:
    """Upload one object at the origin (no WAN), copy it at the origin for the others."""
    origin = setup.origin
    moto = client(origin.direct_endpoint, origin.access_key_id, origin.secret_access_key)
    moto.create_bucket(Bucket=BUCKET)
    keys = [f"big-{i}.bin" for i in range(count)]
    config = TransferConfig(multipart_chunksize=64 * MiB, max_concurrency=2)
    moto.upload_fileobj(PatternReader(0, size), BUCKET, keys[0], Config=config)
    for key in keys[1:]:
        moto.copy_object(Bucket=BUCKET, Key=key, CopySource={"Bucket": BUCKET, "Key": keys[0]})
    return keys


class SendfileServer:
    """The loopback ceiling: an HTTP/1.1 server answering every GET with one sendfile()."""

    SOURCE = r"""
import os, socket, sys, threading
path, ready = sys.argv[1], sys.argv[2]
size = os.path.getsize(path)

def answer(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        data += conn.recv(65536)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % size)
    with open(path, "rb") as f:
        offset = 0
        while offset < size:
            offset += os.sendfile(conn.fileno(), f.fileno(), offset, size - offset)
    conn.close()

server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(16)
open(ready, "w").write(str(server.getsockname()[1]))
while True:
    threading.Thread(target=answer, args=(server.accept()[0],)).start()
"""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def __enter__(self) -> SendfileServer:
        ready = self.path.with_suffix(".port")
        command = [sys.executable, "-c", self.SOURCE, str(self.path), str(ready)]
        self.proc = subprocess.Popen(command)
        deadline = time.monotonic() + 10
        try:
            while not (ready.exists() and ready.read_text()):
                if time.monotonic() > deadline:
                    raise RuntimeError("sendfile server did not start")
                time.sleep(0.02)
        except BaseException:  # failed, or interrupted (SIGTERM): not left running
            self.__exit__()
            raise
        self.url = f"http://127.0.0.1:{int(ready.read_text())}/"
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def write_file(path: Path, size: int) -> None:
    reader = PatternReader(0, size)
    with path.open("wb") as f:
        while data := reader.read(16 * MiB):
            f.write(data)


async def paired(lota: list[str], ceiling: list[str], size: int, runs: int) -> tuple[Any, Any]:
    """Alternate LOTA and ceiling runs, so that both see the same load on this shared box."""
    await streams(lota, size)  # untimed: page cache and code paths warm
    await streams(ceiling, size)
    pairs = [(await streams(lota, size), await streams(ceiling, size)) for _ in range(runs)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def rows_for(name: str, runs: list[dict[str, Any]]) -> list[Any]:
    rates = [r["GBps"] for r in runs]
    errors = sum(len(r["errors"]) for r in runs)
    per_client = [x for r in runs for x in r["per_client_GBps"]]
    return [
        name,
        runs[0]["clients"],
        len(runs),
        max(rates),
        statistics.median(rates),
        min(per_client),
        errors,
    ]


async def measure(setup: Setup, args: argparse.Namespace, server: SendfileServer) -> Any:
    count = max(args.runs, args.clients)
    print(f"creating {count} objects of {human(args.size)} at the origin", flush=True)
    keys = await asyncio.to_thread(create_objects, setup, count, args.size)
    key, secret, _ = PRINCIPALS["admin"]
    lota = client(setup.node.url, key, secret)
    wan = client(setup.origin.endpoint, setup.origin.access_key_id, "x")
    via_lota = [presign(lota, k) for k in keys]
    direct = [presign(wan, k) for k in keys]
    out: dict[str, Any] = {}
    # Every read below is the first read of its object: a MISS (it fills the cache).
    out["MISS"] = [await streams([url], args.size) for url in via_lota]
    print(f"MISS runs: {rates(out['MISS'])} GB/s", flush=True)
    got = await asyncio.to_thread(get_and_hash, lota, BUCKET, keys[0])
    digest = await asyncio.to_thread(expected_digest, 0, args.size)
    if got[:2] != (args.size, digest):
        raise AssertionError(f"wrong bytes from LOTA for {keys[0]}: {got}")
    print(f"bytes verified ({got[2]}); HIT runs alternate with loopback-ceiling runs", flush=True)
    out["HIT"], out["CEILING"] = await paired(via_lota[:1], [server.url], args.size, args.runs)
    print(f"HIT 1 client: {rates(out['HIT'])}, ceiling {rates(out['CEILING'])}", flush=True)
    n = args.clients
    out["HIT multi"], out["CEILING multi"] = await paired(
        via_lota[:n], [server.url] * n, args.size, args.runs
    )
    print(f"HIT {n} clients: {rates(out['HIT multi'])}, ceiling {rates(out['CEILING multi'])}")
    out["ORIGIN DIRECT"] = [await streams([url], args.size) for url in direct[: args.runs]]
    print(f"ORIGIN DIRECT: {rates(out['ORIGIN DIRECT'])}", flush=True)
    return out


def rates(runs: list[dict[str, Any]]) -> list[float]:
    return [round(r["GBps"], 3) for r in runs]


def median(values: list[float]) -> float:
    return statistics.median(values)


def report(out: dict[str, Any], file_GBps: float, args: argparse.Namespace) -> dict[str, Any]:
    print(
        f"\n== {human(args.size)} GETs with curl, origin {args.latency_s * 1e3:g} ms one way,"
        " SigV4 presigned (curl, LOTA, WAN emulator and moto share 2 cores)"
    )
    rows = [
        rows_for("HIT", out["HIT"]),
        rows_for("HIT", out["HIT multi"]),
        rows_for("MISS", out["MISS"]),
        rows_for("ORIGIN DIRECT", out["ORIGIN DIRECT"]),
        rows_for("ceiling: sendfile server", out["CEILING"]),
        rows_for("ceiling: sendfile server", out["CEILING multi"]),
    ]
    headers = ["source", "clients", "runs", "best GB/s", "median GB/s", "slowest client GB/s"]
    print(table([*headers, "errors"], rows))
    ratio = median([h["GBps"] / c["GBps"] for h, c in zip(out["HIT"], out["CEILING"], strict=True)])
    best = max(r["GBps"] for r in out["HIT"])
    mid = median([r["GBps"] for r in out["HIT"]])
    print(
        f"\nceiling: a one-sendfile() server in its own process -> curl, run alternately with"
        f" LOTA; curl file:// of the same file {file_GBps:.2f} GB/s"
    )
    print(f"1-client HIT / ceiling (median of pairs): {ratio:.0%}")
    verdict = "met" if mid >= 1.5 else "MISSED"
    print(f"1-client HIT: median {mid:.2f}, best {best:.2f} GB/s (target >= 1.5 GB/s: {verdict})")
    return {"hit_1_median_GBps": mid, "hit_1_best_GBps": best, "hit_over_ceiling": ratio}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--latency", default="10ms", help="one-way latency to the origin")
    parser.add_argument("--size", type=parse_size, default=parse_size("1GiB"))
    parser.add_argument("--clients", type=int, default=4, help="clients in the multi HIT run")
    parser.add_argument("--runs", type=int, default=3, help="repetitions of each measurement")
    args = parser.parse_args()
    args.latency_s = parse_duration(args.latency)
    assert args.size % BLOCK == 0 or args.size < BLOCK
    print(load_average(), flush=True)
    with tempfile.TemporaryDirectory(prefix="lota-ceiling-") as tmp:
        path = Path(tmp) / "object.bin"
        await asyncio.to_thread(write_file, path, args.size)
        with SendfileServer(path) as server:
            async with lota_with_origin(latency=args.latency_s, cache_size="40GiB") as setup:
                try:
                    out = await measure(setup, args, server)
                except Exception:
                    print("LOTA's log ends with:\n" + setup.node.log_tail(60))
                    raise
        file_GBps = median([(await curl(f"file://{path}"))["Bps"] / 1e9 for _ in range(3)])
    summary = report(out, file_GBps, args)
    print(load_average())
    meta = {k: v for k, v in vars(args).items()}
    path = save("throughput", {"args": meta, "runs": out, "curl_file_GBps": file_GBps, **summary})
    print(f"\nsaved {path}")


if __name__ == "__main__":
    stop_on_sigterm()
    asyncio.run(main())
