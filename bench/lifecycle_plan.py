"""Lifecycle: how long the plan takes over 1,000,000 catalog entries (target: under 60 s).

A SQLite catalog gets one access record per object (inserted in bulk, not timed); the
origin's listing is synthesized in memory, page by page, in key order, as ListObjectsV2
would return it. The timed part is :meth:`Engine.plan`: listing pages joined with catalog
pages, windows cut between checkpoint directories, rules evaluated, decisions produced.

The bucket: 800,000 dataset shards under ``data/`` (a third read lately) and 200,000
checkpoint shards under ``runs/<run>/step-<n>/`` (50 runs x 400 steps x 10 shards), with
the standard rules: checkpoints unread 60 days go to archive except the newest 3 steps of
each run; everything else goes warm after 30 days and archive after 60.

    python -m bench.lifecycle_plan [--objects 1000000]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from collections.abc import AsyncIterator, Iterator

from bench.common import stop_on_sigterm
from lota.catalog import open_catalog
from lota.clock import Clock, FakeClock
from lota.lifecycle.config import LifecycleConfig
from lota.lifecycle.engine import Engine
from lota.lifecycle.rules import DAY, Decision, ObjectInfo, Rule, Transition

NOW = 1_900_000_000.0
BUCKET = "ckpt"
RUNS, STEPS, SHARDS = 50, 400, 10
RULES = (
    Rule(bucket=BUCKET, prefix="runs/*/", keep_latest=3, transitions=(Transition(60, "archive"),)),
    Rule(bucket=BUCKET, prefix="", transitions=(Transition(30, "warm"), Transition(60, "archive"))),
)


def objects(total: int) -> Iterator[ObjectInfo]:
    """The bucket in key order: data/ shards, then runs/ checkpoints (a fifth of it)."""
    checkpoints = min(total // 5, RUNS * STEPS * SHARDS)
    for i in range(total - checkpoints):
        age = 10 + (i * 7919) % 200  # written 10..209 days ago
        yield ObjectInfo(BUCKET, f"data/{i:08d}", 1 << 20, NOW - age * DAY, "STANDARD", "e")
    per_run = STEPS * SHARDS
    for n in range(checkpoints):
        run, rest = divmod(n, per_run)
        step, shard = divmod(rest, SHARDS)
        key = f"runs/r{run:03d}/step-{step:05d}/shard-{shard:02d}"
        age = 400 - step  # newer steps were written later
        yield ObjectInfo(BUCKET, key, 64 << 20, NOW - age * DAY, "STANDARD", "e")


class Listing:
    """ListObjectsV2, in memory: pages of 1,000 keys."""

    def __init__(self, total: int) -> None:
        self.total = total

    async def pages(self, bucket: str, prefix: str) -> AsyncIterator[list[ObjectInfo]]:
        page: list[ObjectInfo] = []
        for obj in objects(self.total):
            page.append(obj)
            if len(page) == 1000:
                yield page
                page = []
        if page:
            yield page

    async def one(self, bucket: str, key: str) -> ObjectInfo | None:
        return next((o for o in objects(self.total) if o.key == key), None)


class NoMover:
    async def check(self, decision: Decision) -> str | None:
        raise AssertionError("plan only")

    async def copy(self, decision: Decision) -> str | None:
        raise AssertionError("plan only")


async def main(total: int) -> None:
    with tempfile.TemporaryDirectory() as work:
        catalog = await open_catalog(f"sqlite:///{work}/catalog.db", clock=Clock(), node="bench")
        try:
            started = time.perf_counter()
            batch: list[tuple[str, str, float]] = []
            for i, obj in enumerate(objects(total)):
                read = NOW - (3 + i % 5) * DAY if i % 3 == 0 else obj.last_modified
                batch.append((BUCKET, obj.key, read))
                if len(batch) == 100_000:
                    await catalog.record_accesses(batch)
                    batch = []
            await catalog.record_accesses(batch)
            print(f"catalog: {total:,} access records in {time.perf_counter() - started:.1f}s")

            config = LifecycleConfig(rules=RULES)
            engine = Engine(catalog, Listing(total), NoMover(), config, clock=FakeClock(NOW))
            started = time.perf_counter()
            moves: dict[str, int] = {}
            async for decision in engine.plan():
                moves[decision.to_tier] = moves.get(decision.to_tier, 0) + 1
            seconds = time.perf_counter() - started
        finally:
            await catalog.close()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"plan over {total:,} catalog entries: {sum(moves.values()):,} transitions "
        f"({', '.join(f'{n:,} to {tier}' for tier, n in sorted(moves.items()))}) "
        f"in {seconds:.1f}s ({total / seconds:,.0f} objects/s; target < 60s); "
        f"peak RSS {peak:.0f} MiB"
    )


if __name__ == "__main__":
    stop_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=1_000_000)
    asyncio.run(main(parser.parse_args().objects))
