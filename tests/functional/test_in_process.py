"""The in-process node harness (lota.testing.node): a node in the test's event loop serves
real requests against the real origin, and a node that cannot start says why."""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from lota.errors import StartupError
from lota.testing.node import node_config, running_node


async def test_an_in_process_node_caches_a_read_and_counts_it(
    origin: str, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=b"x" * 1000)
    config = node_config(
        {"origin": origin, "auth.mode": "none", "cache.dirs": [str(tmp_path / "cache")]}
    )
    async with running_node(config) as node, aiohttp.ClientSession() as http:
        sources = []
        for _ in range(40):
            async with http.get(f"{node.url}/{bucket}/k") as response:
                assert (response.status, await response.read()) == (200, b"x" * 1000)
                sources.append(response.headers["x-lota-cache"])
            if sources[-1] == "HIT":
                break
            await asyncio.sleep(0.05)  # the fill commits (fsync, rename) after the reply
        assert (sources[0], sources[-1]) == ("MISS", "HIT")
        assert 'lota_cache_requests_total{source="HIT"} 1.0' in await node.metrics()


async def test_an_in_process_node_that_cannot_listen_raises_startup_error(origin: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = node_config({"origin": origin, "auth.mode": "none", "listen": f"127.0.0.1:{port}"})
        with pytest.raises(StartupError, match="cannot listen on"):
            async with running_node(config):
                pytest.fail("the node started on a port in use")


async def test_a_node_served_in_process_gives_back_the_signal_handlers_it_took(
    origin: str, tmp_path: Path
) -> None:
    """While it serves, SIGTERM and SIGINT drain the node; then the process's own handlers
    (a bench's, which removes its temporary directory; a worker's) are back."""

    def ours(*_: object) -> None:
        raise AssertionError("not to be called")

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for sig in before:
            signal.signal(sig, ours)
        config = node_config({"origin": origin, "auth.mode": "none"})
        async with running_node(config):
            assert signal.getsignal(signal.SIGTERM) is not ours
        assert signal.getsignal(signal.SIGTERM) is ours
        assert signal.getsignal(signal.SIGINT) is ours
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
