"""The benches' load generator (bench/loadgen.py) frames responses by Content-Length however
the server cuts them into writes, and counts anything else as an error, never a sample."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from bench.loadgen import LoadClient, get_request, run_delay

BODY = bytes(range(256)) * 256  # 64 KiB
HEAD = f"HTTP/1.1 200 OK\r\nContent-Length: {len(BODY)}\r\nx-lota-cache: HIT\r\n\r\n".encode()

Writes = Callable[[bytes], list[bytes]]


@asynccontextmanager
async def _server(writes: Writes, *, cut: bool = False) -> AsyncIterator[str]:
    """A server answering each GET with HEAD + BODY, written as `writes` cuts it (with a
    pause between writes, so that they arrive apart); `cut`: the body's last 100 bytes
    are never sent and the connection is closed."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                response = HEAD + (BODY[:-100] if cut else BODY)
                for piece in writes(response):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(0.002)
                if cut:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/b/k"
    finally:
        server.close()
        await server.wait_closed()


WAYS: dict[str, Writes] = {
    "head and body in one write": lambda r: [r],
    "head alone, then the body": lambda r: [r[: len(HEAD)], r[len(HEAD) :]],
    "the head cut in two": lambda r: [r[:20], r[20:]],
    "the head's end cut in two": lambda r: [r[: len(HEAD) - 2], r[len(HEAD) - 2 :]],
    "the body in pieces": lambda r: [r[: len(HEAD) + 10], r[len(HEAD) + 10 : 30000], r[30000:]],
}


async def test_responses_are_framed_however_they_are_written() -> None:
    for way, writes in WAYS.items():
        async with _server(writes) as url:
            client = LoadClient(concurrency=2)
            try:
                result = await client.run([get_request(url)] * 6, expect_size=len(BODY))
            finally:
                client.close()
        assert (len(result.samples), dict(result.errors)) == (6, {}), way
        assert (result.body_bytes, dict(result.sources)) == (6 * len(BODY), {"HIT": 6}), way
        assert result.client_wait_s is not None and 0 <= result.client_wait_s < result.wall_s


async def test_a_body_cut_short_is_an_error_not_a_sample() -> None:
    async with _server(lambda r: [r], cut=True) as url:
        client = LoadClient(concurrency=1)
        try:
            result = await client.run([get_request(url)], expect_size=len(BODY))
        finally:
            client.close()
    assert (result.samples, dict(result.errors)) == ([], {"ConnectionResetError": 1})


def test_the_time_a_thread_waited_for_a_core_is_told() -> None:
    """Four busy loops on one core for half a second: this thread runs for about a quarter
    of it and waits for the rest, and says so (what bench.nginx prints as the load
    generator waiting for a core)."""
    before = run_delay()
    assert before is not None
    mine = os.sched_getaffinity(0)
    core = {min(mine)}
    spin = "import time\nend = time.monotonic() + 5\nwhile time.monotonic() < end: pass"
    rivals = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(3)]
    try:
        for rival in rivals:
            os.sched_setaffinity(rival.pid, core)
        os.sched_setaffinity(0, core)  # this thread
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            pass
    finally:
        os.sched_setaffinity(0, mine)
        for rival in rivals:
            rival.kill()
            rival.wait()
    waited = run_delay()
    assert waited is not None and 0.25 < waited - before < 5
