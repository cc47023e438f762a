"""A loader's epochs over small objects, LOTA in this process: what each pass costs.

One node (one worker, as ``lota serve`` with ``workers = 1``; SigV4 on) in front of
:mod:`bench.origin`, and in the same event loop `--concurrency` keep-alive clients that
read `--objects` 64 KiB objects, each through its own presigned URL, each request written
whole (as HTTP clients write a GET). Three passes, as three epochs: the first fills the
cache (every read a miss), the second and third are hits. Printed for each pass: req/s
and CPU µs per request, the clients' included (they are a small share: a request written,
a head and a body read). No sockets to another process, so the figures move less with the
machine than :mod:`bench.nginx`'s.

The second pass is what a URL's second read costs: answered from what was remembered of
its first read, when the miss the front end answered was learnt (lota.node.at_once);
each request parsed, verified (from the verdict cache), planned and remembered, when not.

    python -m bench.epochs                     # 20,000 objects, ~1 minute
    python -m bench.epochs --objects 1000 --concurrency 64
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

import uvloop

from bench.common import presigned_urls, save, stop_on_sigterm, table, write_small_objects
from bench.origin import FileOrigin
from lota.testing.credentials import write_credentials
from lota.testing.node import node_config, running_node

BUCKET = "bench-epochs"
PASSES = ("fill (misses)", "second (hits)", "third (hits)")


def _request(url: str) -> bytes:
    parts = urlsplit(url)
    return f"GET {parts.path}?{parts.query} HTTP/1.1\r\nhost: {parts.netloc}\r\n\r\n".encode()


async def _client(host: str, port: int, requests: list[bytes]) -> None:
    """Read each of `requests` in turn on one connection, whole bodies, 200s only."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for request in requests:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200 "):
                raise RuntimeError(f"not a 200: {head[:200]!r}")
            at = head.lower().index(b"\r\ncontent-length: ") + 18
            await reader.readexactly(int(head[at : head.index(b"\r\n", at)]))
    finally:
        writer.close()


async def _pass(host: str, port: int, requests: list[bytes], concurrency: int) -> dict[str, float]:
    shares = [requests[i::concurrency] for i in range(concurrency)]
    wall, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(_client(host, port, share) for share in shares))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"req_per_s": len(requests) / wall, "cpu_us_per_req": cpu / len(requests) * 1e6}


async def run(objects: int, concurrency: int) -> list[dict[str, float | str]]:
    with tempfile.TemporaryDirectory(prefix="lota-epochs-") as tmp:
        work = Path(tmp)
        keys = write_small_objects(work / "origin", BUCKET, objects)
        with FileOrigin(work / "origin") as origin:
            settings = {
                "origin": origin.endpoint,
                "cache.dirs": [str(work / "cache")],
                "cache.size": "20GiB",
                "cache.revalidate_after": "1h",
                "auth.mode": "sigv4",
                "auth.credentials": str(write_credentials(work / "credentials.toml")),
            }
            async with running_node(node_config(settings)) as node:
                urls = await asyncio.to_thread(presigned_urls, node.url, BUCKET, keys)
                parts = urlsplit(node.url)
                assert parts.hostname is not None and parts.port is not None
                requests = [_request(url) for url in urls]
                rows: list[dict[str, float | str]] = []
                for name in PASSES:
                    got = await _pass(parts.hostname, parts.port, requests, concurrency)
                    rows.append({"pass": name, **got})
                return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    rows = uvloop.run(run(args.objects, args.concurrency))
    print(f"\n{args.objects:,} objects of 64 KiB, concurrency {args.concurrency}, 1 worker")
    print(
        table(
            ["pass", "req/s", "CPU µs/req (clients included)"],
            [(r["pass"], f"{r['req_per_s']:,.0f}", f"{r['cpu_us_per_req']:.0f}") for r in rows],
        )
    )
    save("epochs", {"objects": args.objects, "concurrency": args.concurrency, "passes": rows})


if __name__ == "__main__":
    stop_on_sigterm()
    main()
