"""A worker's event stream resumes where its cache left it: a write made through another
node while this one was down still drops the copy this one kept on disk."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from lota.catalog import EventKind, open_catalog
from lota.clock import Clock
from lota.node import invalidation
from lota.testing.node import node_config, running_node


async def _get(url: str) -> tuple[bytes, str]:
    async with aiohttp.ClientSession() as http, http.get(url) as answer:
        assert answer.status == 200
        return await answer.read(), answer.headers["x-lota-cache"]


async def _cached(url: str) -> bytes:
    """Read `url` until a HIT (a fill commits its chunks a moment after its answer)."""
    for _ in range(100):
        body, source = await _get(url)
        if source == "HIT":
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never came from the cache")


async def test_a_write_made_elsewhere_while_a_node_was_down_drops_its_copy_at_restart(
    origin: str,
    origin_s3: Any,
    bucket: str,
    catalog_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = {
        "origin": origin,
        "auth.mode": "none",
        "cache.dirs": [str(tmp_path / "cache")],
        "cache.revalidate_after": "1h",  # no revalidation to catch the new version
        "catalog.url": catalog_url,
    }
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=b"old")
    async with running_node(node_config(settings)) as node:
        assert await _cached(f"{node.url}/{bucket}/k") == b"old"
    # While the node is down, another node writes k (as a write through LOTA does: the
    # new version reaches the origin, the invalidation the catalog).
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=b"new")
    elsewhere = await open_catalog(catalog_url, clock=Clock(), node="elsewhere")
    try:
        await elsewhere.publish(EventKind.INVALIDATE, bucket, "k")
    finally:
        await elsewhere.close()
    real_follow = invalidation._follow

    async def slow_follow(*args: Any) -> None:  # the node must wait for it before serving
        await asyncio.sleep(0.3)
        await real_follow(*args)

    monkeypatch.setattr(invalidation, "_follow", slow_follow)
    async with running_node(node_config(settings)) as node:
        assert await _get(f"{node.url}/{bucket}/k") == (b"new", "MISS")


async def test_a_node_restarted_with_nothing_written_meanwhile_keeps_its_copies(
    origin: str, origin_s3: Any, bucket: str, catalog_url: str, tmp_path: Path
) -> None:
    settings = {
        "origin": origin,
        "auth.mode": "none",
        "cache.dirs": [str(tmp_path / "cache")],
        "cache.revalidate_after": "1h",
        "catalog.url": catalog_url,
    }
    await asyncio.to_thread(origin_s3.put_object, Bucket=bucket, Key="k", Body=b"v")
    async with running_node(node_config(settings)) as node:
        assert await _cached(f"{node.url}/{bucket}/k") == b"v"
    elsewhere = await open_catalog(catalog_url, clock=Clock(), node="elsewhere")
    try:
        await elsewhere.publish(EventKind.INVALIDATE, bucket, "another")
    finally:
        await elsewhere.close()
    async with running_node(node_config(settings)) as node:  # caught up before it serves
        assert await _get(f"{node.url}/{bucket}/k") == (b"v", "HIT")
