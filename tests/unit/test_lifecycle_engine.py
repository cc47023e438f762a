"""The lifecycle engine and the access recorder over a real SQLite catalog, with an origin
held in memory (a listing source and a mover over a dict): windows, leases, resumption."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from lota.catalog import Catalog, open_catalog
from lota.clock import Clock, FakeClock
from lota.errors import CatalogError, OriginError
from lota.lifecycle.access import AccessRecorder
from lota.lifecycle.config import LifecycleConfig
from lota.lifecycle.engine import LEASE, Engine
from lota.lifecycle.rules import DAY, Decision, ObjectInfo, Rule, Tiers, Transition, plan

START = 1_900_000_000.0
KiB = 1024
ARCHIVE_60 = (Transition(60, "archive"),)


class MemoryOrigin:
    """A bucket in memory: a listing source (pages of `page` keys) and a mover."""

    def __init__(self, objects: list[ObjectInfo], page: int = 7) -> None:
        self.objects = {o.key: o for o in objects}
        self.page = page
        self.copies: list[str] = []
        self.fail: set[str] = set()
        self.copy_time = START
        # Called before a check and after a copy: races and stalls happen here.
        self.before_check: Callable[[Decision], None] = lambda d: None
        self.after_copy: Callable[[Decision], Awaitable[None]] | None = None

    async def pages(self, bucket: str, prefix: str) -> AsyncIterator[list[ObjectInfo]]:
        keys = sorted(k for k, o in self.objects.items() if o.bucket == bucket)
        keys = [k for k in keys if k.startswith(prefix)]
        for start in range(0, len(keys), self.page):
            yield [self.objects[k] for k in keys[start : start + self.page]]

    async def check(self, decision: Decision) -> str | None:
        self.before_check(decision)
        now = self.objects.get(decision.key)
        if now is None:
            return "deleted since listed"
        return None if now.storage_class == decision.from_class else "changed since listed"

    async def copy(self, decision: Decision) -> str | None:
        if decision.key in self.fail:
            raise OriginError("origin unreachable")
        self.copies.append(decision.key)
        self.objects[decision.key] = dataclasses.replace(
            self.objects[decision.key],
            storage_class=decision.storage_class,
            last_modified=self.copy_time,
        )
        if self.after_copy is not None:
            await self.after_copy(decision)
        return None


def obj(key: str, age: float, size: int = 128 * KiB) -> ObjectInfo:
    return ObjectInfo("ckpt", key, size, START - age * DAY, "STANDARD", f'"{key}"')


@pytest.fixture
async def catalog(tmp_path: Path) -> AsyncIterator[Catalog]:
    catalog = await open_catalog(f"sqlite:///{tmp_path}/c.db", clock=Clock(), node="n1")
    yield catalog
    await catalog.close()


def engine(
    catalog: Catalog,
    origin: MemoryOrigin,
    rules: list[Rule],
    window: int = 1000,
    max_window: int = 250_000,
) -> tuple[Engine, FakeClock]:
    clock = FakeClock(START)
    config = LifecycleConfig(rules=tuple(rules), rate=0)
    eng = Engine(catalog, origin, origin, config, clock=clock, window=window, max_window=max_window)
    return eng, clock


def checkpoints(runs: int, steps: int, age: float = 100) -> list[ObjectInfo]:
    return [
        obj(f"runs/{r}/step-{s:03d}/{f}", age=age - s)
        for r in range(runs)
        for s in range(steps)
        for f in ("a", "b", "c")
    ]


async def test_windows_never_split_a_directory_so_the_plan_matches_one_over_everything(
    catalog: Catalog,
) -> None:
    objects = [*checkpoints(runs=6, steps=9), *[obj(f"z/{i}", age=90) for i in range(20)]]
    rules = [
        Rule(bucket="ckpt", prefix="runs/*/", keep_latest=3, transitions=ARCHIVE_60),
        Rule(bucket="ckpt", prefix="", transitions=ARCHIVE_60),
    ]
    origin = MemoryOrigin(objects, page=7)
    eng, _ = engine(catalog, origin, rules, window=5)
    planned = [d async for d in eng.plan()]
    assert planned == plan(sorted(objects, key=lambda o: o.key), {}, rules, Tiers(), START)
    kept = {o.key for o in objects} - {d.key for d in planned}
    assert kept == {
        f"runs/{r}/step-{s:03d}/{f}" for r in range(6) for s in (6, 7, 8) for f in "abc"
    }


async def test_a_directory_too_big_to_rank_is_left_alone_and_counted(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    objects = [obj(f"runs/big/step-{s:03d}/m", age=100) for s in range(30)]
    objects += [obj(f"runs/small/step-{s}/m", age=100) for s in range(4)]
    rules = [Rule(bucket="ckpt", prefix="runs/*/", keep_latest=1, transitions=ARCHIVE_60)]
    eng, _ = engine(catalog, MemoryOrigin(objects), rules, window=5, max_window=10)
    with caplog.at_level(logging.WARNING, "lota.lifecycle"):
        report = await eng.run()
    assert report is not None and report.too_large == 30
    assert report.moved == 3  # runs/small/ keeps its newest step only
    assert "runs/big/" in caplog.text


async def test_run_moves_records_and_a_second_run_changes_nothing(catalog: Catalog) -> None:
    objects = [obj("cold", 70), obj("read", 70), obj("small", 70, size=10)]
    origin = MemoryOrigin(objects)
    rules = [Rule(bucket="ckpt", prefix="", transitions=ARCHIVE_60)]
    await catalog.record_accesses([("ckpt", "read", START - 3 * DAY)])
    eng, clock = engine(catalog, origin, rules)
    planned = [d.key async for d in eng.plan()]
    report = await eng.run()
    assert planned == origin.copies == ["cold"]
    assert report is not None and (report.moved, report.moved_bytes) == (1, 128 * KiB)
    assert await catalog.get_tier("ckpt", "cold") == ("archive", START)
    assert await catalog.last_access("ckpt", "cold") == START - 70 * DAY
    again = await eng.run()
    assert again is not None and again.moved == 0 and origin.copies == ["cold"]
    clock.advance(60 * DAY)
    origin.copy_time = clock.time()
    later = await eng.run()
    assert later is not None and later.moved == 1 and origin.copies == ["cold", "read"]


async def test_moving_through_tiers_keeps_counting_from_the_last_access(catalog: Catalog) -> None:
    # The copy to warm rewrites LastModified; archive must still follow 60 days after the
    # last access, not 60 days after the copy.
    origin = MemoryOrigin([obj("k", 0)])
    rules = [
        Rule(
            bucket="ckpt",
            prefix="",
            transitions=(Transition(30, "warm"), Transition(60, "archive")),
        )
    ]
    eng, clock = engine(catalog, origin, rules)
    tiers = []
    for _ in range(10):
        clock.advance(7 * DAY)
        origin.copy_time = clock.time()
        await eng.run()
        tiers.append(origin.objects["k"].storage_class)
    assert tiers == ["STANDARD"] * 4 + ["STANDARD_IA"] * 4 + ["DEEP_ARCHIVE"] * 2


async def test_a_failed_copy_is_counted_and_the_next_run_resumes(catalog: Catalog) -> None:
    origin = MemoryOrigin([obj(f"k{i}", 70) for i in range(5)])
    origin.fail = {"k2"}
    rules = [Rule(bucket="ckpt", prefix="", transitions=ARCHIVE_60)]
    eng, _ = engine(catalog, origin, rules)
    report = await eng.run()
    assert report is not None and (report.moved, report.failed) == (4, 1)
    # The catalog already says archive, the origin does not: the plan believes the origin.
    assert await catalog.get_tier("ckpt", "k2") == ("archive", START)
    origin.fail = set()
    assert [d.key async for d in eng.plan()] == ["k2"]
    report = await eng.run()
    assert (
        report is not None
        and report.moved == 1
        and sorted(origin.copies) == [f"k{i}" for i in range(5)]
    )


async def test_an_object_changed_since_listed_is_skipped(catalog: Catalog) -> None:
    origin = MemoryOrigin([obj("a", 70), obj("b", 70)])

    def rewrite_b(decision: Decision) -> None:
        if decision.key == "b":  # someone rewrote b in another class meanwhile
            origin.objects["b"] = dataclasses.replace(origin.objects["b"], storage_class="X")

    origin.before_check = rewrite_b
    config = LifecycleConfig(rules=(Rule(bucket="ckpt", transitions=ARCHIVE_60),), rate=0)
    eng = Engine(catalog, origin, origin, config, clock=FakeClock(START))
    report = await eng.run()
    assert report is not None and (report.moved, report.skipped) == (1, 1)
    assert await catalog.get_tier("ckpt", "b") is None


async def test_only_the_lease_holder_runs(catalog: Catalog, tmp_path: Path) -> None:
    other = await open_catalog(f"sqlite:///{tmp_path}/c.db", clock=Clock(), node="n2")
    try:
        assert await other.acquire_lease(LEASE, 60)
        origin = MemoryOrigin([obj("k", 70)])
        eng, _ = engine(catalog, origin, [Rule(bucket="ckpt", transitions=ARCHIVE_60)])
        assert await eng.run() is None and origin.copies == []
        await other.release_lease(LEASE)
        report = await eng.run()
        assert report is not None and report.moved == 1
        assert await catalog.lease_holder(LEASE) is None  # released after the run
    finally:
        await other.close()


async def test_a_run_that_loses_its_lease_stops_at_once(tmp_path: Path) -> None:
    clock = FakeClock(START)
    ticks = [0.0]
    shared = await open_catalog(f"sqlite:///{tmp_path}/l.db", clock=clock, node="n1")
    thief = await open_catalog(f"sqlite:///{tmp_path}/l.db", clock=clock, node="n2")
    try:
        origin = MemoryOrigin([obj(f"k{i}", 70) for i in range(6)])

        async def stall(decision: Decision) -> None:
            if len(origin.copies) == 2:  # this node stalls past its lease; n2 takes over
                ticks[0] += 50
                clock.advance(61)
                assert await thief.acquire_lease(LEASE, 60)

        origin.after_copy = stall
        config = LifecycleConfig(rules=(Rule(bucket="ckpt", transitions=ARCHIVE_60),), rate=0)
        eng = Engine(
            shared,
            origin,
            origin,
            config,
            clock=clock,
            monotonic=lambda: ticks[0],
        )
        report = await eng.run()
        assert report is not None and report.lease_lost and report.moved == 2
        assert await thief.lease_holder(LEASE) == ("n2", START + 61 + 60)  # not released by n1
    finally:
        await shared.close()
        await thief.close()


# -- the access recorder ----------------------------------------------------------------------


async def test_recorder_flushes_the_latest_time_per_object(catalog: Catalog) -> None:
    clock = FakeClock(START)
    recorder = AccessRecorder(catalog, clock)
    recorder.record("b", "k")
    clock.advance(10)
    recorder.record("b", "k")
    recorder.record("b", "j", at=START - 5)
    assert len(recorder) == 2
    await recorder.flush()
    assert len(recorder) == 0 and recorder.flushed == 2
    assert await catalog.last_access("b", "k") == START + 10
    recorder.record("b", "k", at=START)  # an older time never wins
    await recorder.close()
    assert await catalog.last_access("b", "k") == START + 10


async def test_recorder_memory_is_bounded_and_drops_the_least_recent(catalog: Catalog) -> None:
    recorder = AccessRecorder(catalog, FakeClock(START), max_pending=3)
    for key in ("a", "b", "c"):
        recorder.record("b", key)
    recorder.record("b", "a")  # a is now the most recent
    recorder.record("b", "d")
    assert len(recorder) == 3 and recorder.dropped == 1
    await recorder.flush()
    assert [r.key for r in await catalog.list_accesses("b")] == ["a", "c", "d"]


async def test_recorder_keeps_a_batch_the_catalog_refused(tmp_path: Path) -> None:
    broken = await open_catalog(f"sqlite:///{tmp_path}/x.db", clock=Clock(), node="n")
    await broken.close()
    recorder = AccessRecorder(broken, FakeClock(START), max_pending=10)
    recorder.record("b", "old")
    with pytest.raises(CatalogError):
        await recorder.flush()
    recorder.record("b", "new")
    assert len(recorder) == 2


async def test_recorder_loop_flushes_when_full(catalog: Catalog) -> None:
    from lota.tasks import TaskGroup

    tasks = TaskGroup("test")
    recorder = AccessRecorder(catalog, FakeClock(START), flush_interval=3600, max_pending=2)
    recorder.start(tasks)
    recorder.record("b", "x")
    recorder.record("b", "y")
    for _ in range(100):
        if await catalog.last_access("b", "y") is not None:
            break
        import asyncio

        await asyncio.sleep(0.01)
    assert await catalog.last_access("b", "x") == START
    recorder.record("b", "z")
    await recorder.close()
    assert await catalog.last_access("b", "z") == START
    await tasks.close()
